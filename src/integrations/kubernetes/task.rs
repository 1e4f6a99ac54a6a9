//! The Kubernetes API mode's loop for one engine (I/O only; the rules are
//! [`crate::integrations`]'): every second it reads the engine's facts, keeps the readiness-gate
//! condition on its pod in step with `/readyz` (patched when it changes, and again every
//! `resync_period`), and at a held `evict` tries an eviction through the gate
//! ([`super::eviction`]). The pod is looked up at start, every `resync_period`, and
//! at once when the API server says it is gone.
//!
//! Each action on the pod (the condition's status changing, an eviction or annotation tried,
//! the engine escalating into a restart loop) is also an Event on it ([`super::events`]),
//! recorded without waiting.
//!
//! An API server that is down, slow, refuses or answers garbage costs this loop a bounded
//! wait (`request_timeout`) and a log line at most once a minute per kind of failure; the
//! failure is counted in the engine's record. It never touches the verdict.

use super::api::{ApiError, KubeApi, PodInfo};
use super::events::{EngineEvents, Reason};
use super::eviction;
use super::eviction_ground;
use super::memory;
use super::pods::{self, EngineAddr};
use super::shared::next_resync;
use super::told::{Attempt, ConditionSet, Outcome, PodAction};
use crate::clock::unix_ms;
use crate::integrations::answers::config::NotReadyList;
use crate::integrations::answers::{Readiness, readiness};
use crate::integrations::facts::ActionInputs;
use crate::integrations::kubernetes::config::{
    EvictionMode, KubernetesConfig, MINDCLUSTER_ANNOTATION, MINDCLUSTER_POD_LABEL,
    MINDCLUSTER_VALUE, PodSelector,
};
use crate::monitor::Monitor;
use k8s_openapi::api::core::v1::PodCondition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How often the loop looks at the engine.
pub(crate) const TICK: Duration = Duration::from_secs(1);
/// The same failure is logged at most this often.
const LOG_EVERY: Duration = Duration::from_secs(60);
/// Back-off of condition patches after a failure: from this (or `resync_period` if shorter),
/// doubling, to `resync_period` (the condition is set again that often anyway).
const CONDITION_RETRY: Duration = Duration::from_secs(2);

/// The condition for a readiness decision: `(status, reason, message)`. The reason is one
/// CamelCase word, as the API conventions ask.
pub(crate) fn condition_of(
    f: &ActionInputs,
    r: &Readiness,
) -> (&'static str, &'static str, String) {
    use crate::monitor::verdict::Status;
    let reason = match (f.status, f.level) {
        (Status::Initial, _) => "EngineNotAnswering",
        (Status::Abnormal, _) if !r.ready => "EngineAbnormal",
        (_, l) => match l {
            crate::qos::score::Level::Normal => "QosNormal",
            crate::qos::score::Level::Throttle => "QosThrottle",
            crate::qos::score::Level::Degrade => "QosDegrade",
            crate::qos::score::Level::Evict => "QosEvict",
        },
    };
    (
        if r.ready { "True" } else { "False" },
        reason,
        r.reason.clone(),
    )
}

/// Logs a failure of one kind at most once a [`LOG_EVERY`], and its recovery.
#[derive(Debug, Default)]
struct Quiet {
    last: Vec<(&'static str, Instant)>,
}

impl Quiet {
    fn fail(&mut self, engine: &str, kind: &'static str, msg: &str) {
        let now = Instant::now();
        match self.last.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, at)) if now < *at + LOG_EVERY => {}
            Some((_, at)) => {
                *at = now;
                tracing::warn!(engine, "Kubernetes API: {msg}");
            }
            None => {
                self.last.push((kind, now));
                tracing::warn!(engine, "Kubernetes API: {msg}");
            }
        }
    }

    fn ok(&mut self, engine: &str, kind: &'static str) {
        if let Some(i) = self.last.iter().position(|(k, _)| *k == kind) {
            self.last.remove(i);
            tracing::info!(engine, "Kubernetes API: {kind} works again");
        }
    }
}

/// The loop's own state.
struct Loop<'a, A> {
    api: &'a A,
    cfg: &'a KubernetesConfig,
    node: Option<&'a str>,
    m: &'a Monitor,
    pod: Option<PodInfo>,
    next_lookup: Instant,
    /// The mode's start: the resyncs' schedule.
    origin: Instant,
    next_resync: Instant,
    /// `(status, reason)` as last set, and when the status last changed.
    sent: Option<(&'static str, &'static str)>,
    transition: Time,
    condition_retry_at: Option<Instant>,
    condition_backoff: Duration,
    gate: eviction::EvictionGate,
    quiet: Quiet,
    events: Option<EngineEvents>,
    /// The engine was escalated (a restart loop) at the last look.
    escalated: bool,
}

/// Runs until `cancel`. `api` is the engine's client; `m` its monitor; `origin` the mode's
/// start, from which every engine's resyncs fall on one schedule
/// ([`super::shared::next_resync`]), so their pod lists are one.
pub(crate) async fn run(
    api: impl KubeApi,
    cfg: KubernetesConfig,
    node: Option<String>,
    m: Arc<Monitor>,
    origin: Instant,
    events: Option<EngineEvents>,
    cancel: CancellationToken,
) {
    let now = Instant::now();
    let mut l = Loop {
        api: &api,
        cfg: &cfg,
        node: node.as_deref(),
        m: &m,
        pod: None,
        next_lookup: now,
        origin,
        next_resync: next_resync(origin, now, cfg.resync_period),
        sent: None,
        transition: Time(k8s_openapi::jiff::Timestamp::now()),
        condition_retry_at: None,
        condition_backoff: CONDITION_RETRY.min(cfg.resync_period),
        // A restarted agent keeps the cooldown and back-off its predecessor saved.
        gate: match memory::gate(&m) {
            Some(g) => eviction::EvictionGate::remembering(cfg.eviction_cooldown, g),
            None => eviction::EvictionGate::new(cfg.eviction_cooldown),
        },
        quiet: Quiet::default(),
        events,
        escalated: false,
    };
    memory::update(&m, |r| {
        r.eviction = cfg.eviction.as_str().to_owned();
        r.eviction_cooldown_s = cfg.eviction_cooldown.as_secs_f64();
    });
    loop {
        l.tick().await;
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(TICK) => {}
        }
    }
}

/// Records that the mode cannot act for `m` at all, and why.
pub(crate) fn inactive(m: &Monitor, cfg: &KubernetesConfig, why: &str) {
    memory::update(m, |r| {
        r.inactive = Some(why.to_owned());
        r.eviction = cfg.eviction.as_str().to_owned();
        r.eviction_cooldown_s = cfg.eviction_cooldown.as_secs_f64();
    });
}

impl<A: KubeApi> Loop<'_, A> {
    fn engine(&self) -> &str {
        &self.m.spec().name
    }

    async fn tick(&mut self) {
        let now = Instant::now();
        let resync = now >= self.next_resync;
        if resync {
            self.next_resync = next_resync(self.origin, now, self.cfg.resync_period);
        }
        if resync || (self.pod.is_none() && now >= self.next_lookup) {
            self.lookup().await;
        }
        if self.pod.is_none() {
            return;
        }
        // The mode polls the verdict as Node Manager does: the first healthy look starts
        // virtual inference where nothing else polls.
        self.m.status();
        let facts = ActionInputs::of(self.m);
        self.escalation(&facts);
        if self.cfg.readiness_gate {
            self.condition(&facts, resync).await;
        }
        if self.cfg.eviction != EvictionMode::Off && self.pod.is_some() {
            self.evict(&facts).await;
        }
    }

    /// The engine's other loops post their Events on the pod as last found.
    fn pod_seen(&self) {
        if let Some(ev) = &self.events {
            ev.set_pod(self.pod.as_ref());
        }
    }

    /// An Event on the pod, when Events are on.
    fn event(&self, pod: &PodInfo, reason: Reason, note: &str) {
        if let Some(rec) = &self.events {
            rec.record(pod, reason, note);
        }
    }

    /// The engine escalating into a restart loop is an Event on its pod. Read from the
    /// episode memory here, once a tick, rather than in every rule's facts: only this loop
    /// needs it.
    fn escalation(&mut self, facts: &ActionInputs) {
        let now = self.m.episode_summary().escalated;
        if now
            && !self.escalated
            && let Some(pod) = self.pod.clone()
        {
            self.event(
                &pod,
                Reason::RestartLoop,
                &format!("escalated: {}", facts.reason),
            );
        }
        self.escalated = now;
    }

    /// Finds the engine's pod; on failure keeps the old one only if the API could not be
    /// asked (a lookup that answered "none" or "several" drops it).
    async fn lookup(&mut self) {
        let sel = PodSelector::of(self.m.spec());
        let found: Result<PodInfo, (String, bool)> = match sel.named() {
            Some((ns, name)) => match self.api.get_pod(ns, name).await {
                Ok(p) => pods::check_named(&p, self.node).map(|()| p).map_err(|e| (e, false)),
                Err(e) if e.code() == Some(404) => {
                    Err((format!("pod {ns}/{name} does not exist"), false))
                }
                Err(e) => Err((format!("reading pod {ns}/{name}: {e}"), true)),
            },
            None => match self.node {
                None => Err((
                    "no node name: set [agent.kubernetes] node_name, or NODE_NAME in the agent's environment (the shipped DaemonSet sets it from spec.nodeName)".to_owned(),
                    false,
                )),
                Some(node) => match self
                    .api
                    .list_pods(Some(node), sel.namespace.as_deref(), sel.pod_selector.as_deref())
                    .await
                {
                    Ok(list) => pods::pick(
                        &list,
                        sel,
                        &EngineAddr {
                            host: &self.m.spec().host,
                            port: self.m.spec().port,
                        },
                    )
                    .cloned()
                    .map_err(|e| (e, false)),
                    Err(e) => Err((format!("listing the pods of node {node}: {e}"), true)),
                },
            },
        };
        let engine = self.m.spec().name.clone();
        match found {
            Ok(p) => {
                self.quiet.ok(&engine, "pod lookup");
                if self.pod.as_ref().map(PodInfo::key) != Some(p.key()) {
                    tracing::info!(engine = %engine, pod = %p.key(), "Kubernetes API: the engine's pod is {}", p.key());
                    // A new pod has no condition of ours yet.
                    self.sent = None;
                }
                let key = p.key();
                self.pod = Some(p);
                self.pod_seen();
                memory::update(self.m, |r| {
                    r.pod = Some(key);
                    r.pod_error = None;
                });
            }
            Err((why, api_failed)) => {
                self.quiet.fail(&engine, "pod lookup", &why);
                if !api_failed {
                    self.pod = None;
                    self.pod_seen();
                }
                let pod = self.pod.as_ref().map(PodInfo::key);
                memory::update(self.m, |r| {
                    r.pod = pod;
                    r.pod_error = Some(why.clone());
                    if api_failed {
                        r.api_error(why, unix_ms());
                    }
                });
                self.next_lookup = Instant::now() + self.cfg.resync_period;
            }
        }
    }

    /// The pod is gone (a 404 on it): forget it and look again at the next tick.
    fn pod_gone(&mut self) {
        self.api.pod_gone();
        self.pod = None;
        self.pod_seen();
        self.sent = None;
        self.next_lookup = Instant::now();
    }

    async fn condition(&mut self, facts: &ActionInputs, resync: bool) {
        let r = readiness(facts, NotReadyList::of(self.m.spec()));
        let (status, reason, message) = condition_of(facts, &r);
        let changed = self.sent != Some((status, reason));
        let now = Instant::now();
        if !(changed || resync) || self.condition_retry_at.is_some_and(|t| now < t) {
            return;
        }
        let Some(pod) = self.pod.clone() else { return };
        if self.sent.map(|(s, _)| s) != Some(status) {
            self.transition = Time(k8s_openapi::jiff::Timestamp::now());
        }
        let c = PodCondition {
            type_: self.cfg.condition_type.clone(),
            status: status.to_owned(),
            reason: Some(reason.to_owned()),
            message: Some(message.clone()),
            last_transition_time: Some(self.transition.clone()),
            last_probe_time: None,
            observed_generation: None,
        };
        let engine = self.engine().to_owned();
        match self.api.set_condition(&pod.namespace, &pod.name, &c).await {
            Ok(()) => {
                self.quiet.ok(&engine, "condition");
                self.condition_retry_at = None;
                self.condition_backoff = CONDITION_RETRY.min(self.cfg.resync_period);
                let status_changed = self.sent.map(|(s, _)| s) != Some(status);
                if changed {
                    tracing::info!(engine = %engine, pod = %pod.key(), "Kubernetes API: condition {} = {status} ({reason}): {message}", self.cfg.condition_type);
                }
                self.sent = Some((status, reason));
                let set = ConditionSet {
                    type_: self.cfg.condition_type.clone(),
                    status: status.to_owned(),
                    reason: reason.to_owned(),
                    message: message.clone(),
                    set_at_unix_ms: unix_ms(),
                };
                let detail = format!("{status} ({reason}): {message}");
                memory::update(self.m, |rec| {
                    rec.condition = Some(set);
                    if status_changed {
                        rec.push(Attempt {
                            at_unix_ms: unix_ms(),
                            action: PodAction::Condition,
                            pod: pod.key(),
                            outcome: Outcome::Done,
                            detail: detail.clone(),
                        });
                    }
                });
                if status_changed {
                    let reason = if status == "True" {
                        Reason::EngineReady
                    } else {
                        Reason::EngineNotReady
                    };
                    self.event(
                        &pod,
                        reason,
                        &format!("condition {} = {detail}", self.cfg.condition_type),
                    );
                    self.m.note(
                        super::told_call(PodAction::Condition, Outcome::Done),
                        None,
                        &format!("{}: {detail}", pod.key()),
                    );
                }
            }
            Err(e) if e.code() == Some(404) => {
                memory::update(self.m, |rec| {
                    rec.api_error(
                        format!("setting the condition: pod {} is gone", pod.key()),
                        unix_ms(),
                    )
                });
                self.pod_gone();
            }
            Err(e) => {
                let why = format!(
                    "setting condition {} on pod {}: {e}",
                    self.cfg.condition_type,
                    pod.key()
                );
                self.quiet.fail(&engine, "condition", &why);
                self.condition_retry_at = Some(now + self.condition_backoff);
                self.condition_backoff = (self.condition_backoff * 2).min(self.cfg.resync_period);
                memory::update(self.m, |rec| rec.api_error(why, unix_ms()));
            }
        }
    }

    async fn evict(&mut self, facts: &ActionInputs) {
        let ground = eviction_ground(facts);
        let now = Instant::now();
        match self.gate.step(now, ground.is_some()) {
            eviction::Step::Idle => memory::update(self.m, |r| {
                r.eviction_blocked_until_unix_ms = None;
                r.eviction_blocked_why = None;
            }),
            eviction::Step::Wait { until, cooldown } => {
                let at = unix_ms() + until.saturating_duration_since(now).as_millis() as u64;
                memory::update(self.m, |r| {
                    r.eviction_blocked_until_unix_ms = Some(at);
                    r.eviction_blocked_why = Some(if cooldown {
                        format!(
                            "eviction_cooldown ({:?}) since the last eviction",
                            self.cfg.eviction_cooldown
                        )
                    } else {
                        "back-off after a refused or failed attempt".to_owned()
                    });
                });
            }
            eviction::Step::Try => {
                let Some(pod) = self.pod.clone() else { return };
                let ground = ground.unwrap_or_default();
                let (action, result) = match self.cfg.eviction {
                    EvictionMode::Api => (
                        PodAction::Eviction,
                        self.api.evict(&pod.namespace, &pod.name).await,
                    ),
                    EvictionMode::Mindcluster => {
                        (PodAction::MindclusterAnnotation, self.annotate(&pod).await)
                    }
                    EvictionMode::Off => return,
                };
                let engine = self.engine().to_owned();
                let (outcome, attempted, detail) = match &result {
                    Ok(()) => (Outcome::Done, eviction::Attempted::Done, ground.clone()),
                    Err(e) if e.code() == Some(404) => {
                        (Outcome::PodGone, eviction::Attempted::Failed, e.to_string())
                    }
                    Err(e) if e.too_many_requests() => (
                        Outcome::Refused,
                        eviction::Attempted::Refused,
                        e.to_string(),
                    ),
                    Err(e) => (Outcome::Failed, eviction::Attempted::Failed, e.to_string()),
                };
                let backoff = self.gate.record(now, attempted);
                memory::set_gate(self.m, self.gate.memory());
                match (&result, backoff) {
                    (Ok(()), _) => {
                        tracing::warn!(engine = %engine, pod = %pod.key(), "Kubernetes API: {action} of pod {} done: {ground}", pod.key())
                    }
                    (Err(_), Some(wait)) => {
                        let msg = format!(
                            "{action} of pod {} {outcome}: {detail}; next try in {wait:?} if the ground holds",
                            pod.key()
                        );
                        if outcome == Outcome::Refused {
                            tracing::warn!(engine = %engine, "Kubernetes API: {msg}");
                        } else {
                            self.quiet.fail(&engine, "eviction", &msg);
                        }
                    }
                    (Err(_), None) => {}
                }
                self.m.note(
                    super::told_call(action, outcome),
                    None,
                    &format!("{}: {detail}", pod.key()),
                );
                self.event(
                    &pod,
                    eviction::event_reason(action, outcome),
                    &eviction::event_note(action, outcome, &detail, backoff),
                );
                memory::update(self.m, |r| {
                    r.push(Attempt {
                        at_unix_ms: unix_ms(),
                        action,
                        pod: pod.key(),
                        outcome,
                        detail: detail.clone(),
                    });
                    if result.is_err() {
                        r.api_error(
                            format!("{action} of pod {}: {detail}", pod.key()),
                            unix_ms(),
                        );
                    }
                });
                if outcome == Outcome::PodGone {
                    self.pod_gone();
                }
            }
        }
    }

    /// MindCluster's fault annotation, only on a pod its infer-operator manages (anything
    /// else would ignore it).
    async fn annotate(&self, pod: &PodInfo) -> Result<(), ApiError> {
        if pod.labels.get(MINDCLUSTER_POD_LABEL).map(String::as_str) != Some("true") {
            return Err(ApiError::Status {
                code: 0,
                reason: "NotManagedByInferOperator".to_owned(),
                message: format!(
                    "pod {} lacks the label {MINDCLUSTER_POD_LABEL}=true: MindCluster's infer-operator would not act on {MINDCLUSTER_ANNOTATION}",
                    pod.key()
                ),
            });
        }
        self.api
            .annotate(
                &pod.namespace,
                &pod.name,
                MINDCLUSTER_ANNOTATION,
                MINDCLUSTER_VALUE,
            )
            .await
    }
}

//! The public-fault loop of one engine (I/O only; the plan is [`super::plan`]): every
//! second it reads the verdict and the episode, plans, and writes the engine's ConfigMap
//! (an update, a create when there is none). A write that fails is retried with back-off
//! (2 s doubling to a minute), counted in the engine's Kubernetes record and logged once per
//! failure run; what was written is kept in the engine's state file first thing after the
//! write. Nothing here touches the verdict, and `/status` never waits on it.

use super::message::{self, Message};
use super::{Assertion, Desired, FaultSent, Kind, Pace, Plan};
use crate::clock::unix_ms;
use crate::integrations::kubernetes::api::{ApiError, FIELD_MANAGER, KubeClient, OBJECT_LIMIT};
use crate::integrations::kubernetes::config::KubernetesConfig;
use crate::integrations::kubernetes::events::{EngineEvents, Reason};
use crate::integrations::kubernetes::{ID, memory};
use crate::integrations::seam::EngineNpu;
use crate::monitor::Monitor;
use crate::monitor::journal::Told;
use crate::monitor::verdict::Status;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How often the loop looks at the engine.
const TICK: Duration = Duration::from_secs(1);
/// The first back-off after a failed write, doubled to [`MAX_BACKOFF_MS`].
const FIRST_BACKOFF_MS: u64 = 2_000;
const MAX_BACKOFF_MS: u64 = 60_000;

/// The ConfigMap calls the loop makes.
pub(crate) trait ConfigMapApi: Send + Sync {
    /// Replaces the ConfigMap `name` (an update without a resourceVersion: the agent is its
    /// only writer).
    fn replace(
        &self,
        namespace: &str,
        name: &str,
        body: &serde_json::Value,
    ) -> impl Future<Output = Result<(), ApiError>> + Send;
    /// Creates it.
    fn create(
        &self,
        namespace: &str,
        body: &serde_json::Value,
    ) -> impl Future<Output = Result<(), ApiError>> + Send;
    /// Its message (the `PublicFault` data); `None` when there is no ConfigMap or no message.
    fn read(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<String>, ApiError>> + Send;
}

/// Sends `body` as JSON with `method` to `path` (the agent's field manager named); the
/// answer is read within [`OBJECT_LIMIT`] and dropped.
async fn send_json(
    c: &KubeClient,
    method: http::Method,
    path: &str,
    body: &serde_json::Value,
) -> Result<(), ApiError> {
    let bytes = serde_json::to_vec(body).map_err(|e| ApiError::Transport(e.to_string()))?;
    let req = http::Request::builder()
        .method(method)
        .uri(format!("{path}?fieldManager={FIELD_MANAGER}"))
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(bytes)
        .map_err(|e| ApiError::Transport(e.to_string()))?;
    c.call(Ok(req), OBJECT_LIMIT).await.map(drop)
}

impl ConfigMapApi for KubeClient {
    async fn replace(
        &self,
        namespace: &str,
        name: &str,
        body: &serde_json::Value,
    ) -> Result<(), ApiError> {
        let path = format!("/api/v1/namespaces/{namespace}/configmaps/{name}");
        send_json(self, http::Method::PUT, &path, body).await
    }

    async fn create(&self, namespace: &str, body: &serde_json::Value) -> Result<(), ApiError> {
        let path = format!("/api/v1/namespaces/{namespace}/configmaps");
        send_json(self, http::Method::POST, &path, body).await
    }

    async fn read(&self, namespace: &str, name: &str) -> Result<Option<String>, ApiError> {
        let req = http::Request::get(format!("/api/v1/namespaces/{namespace}/configmaps/{name}"))
            .body(Vec::new())
            .map_err(|e| ApiError::Transport(e.to_string()))?;
        let body = match self.call(Ok(req), OBJECT_LIMIT).await {
            Err(e) if e.code() == Some(404) => return Ok(None),
            other => other?,
        };
        let cm: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_slice(&body)
            .map_err(|e| ApiError::Transport(format!("the answer is not a ConfigMap: {e}")))?;
        Ok(cm.data.and_then(|mut d| d.remove(message::DATA_KEY)))
    }
}

/// What one engine's loop publishes with.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub namespace: String,
    pub prefix: String,
    pub resource: String,
    pub abnormal_code: String,
    pub loop_code: String,
    pub pace: Pace,
}

impl Settings {
    /// From `[agent.kubernetes]`; `None` while `public_faults` is off.
    pub(crate) fn of(cfg: &KubernetesConfig) -> Option<Settings> {
        cfg.public_faults.then(|| Settings {
            namespace: cfg.public_fault_namespace.clone(),
            prefix: cfg.public_fault_name_prefix.clone(),
            resource: cfg.public_fault_resource.clone(),
            abnormal_code: cfg.public_fault_code.clone(),
            loop_code: cfg.public_fault_loop_code.clone(),
            pace: Pace {
                min_interval_ms: cfg.public_fault_min_interval.as_millis() as u64,
                refresh_ms: cfg.public_fault_refresh.as_millis() as u64,
            },
        })
    }
}

/// A message written: the one point where a publish succeeded (the journal's entry and the
/// pod's Event are made of it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Written {
    pub configmap: String,
    pub message: Message,
}

impl Written {
    /// The journal's entry: `kubernetes_api public_fault occur` (or `recover`: the last
    /// fault's assertion, an `occur` replacing another coming last).
    pub(crate) fn told(&self) -> Told {
        let last = self.message.faults.last().map(|f| f.assertion);
        Told::call(
            ID,
            "public_fault",
            last.unwrap_or(Assertion::Occur).as_str(),
        )
    }

    /// Its Event's reason: a recover when the message left no fault open.
    pub(crate) fn reason(&self) -> Reason {
        match self.message.faults.last().map(|f| f.assertion) {
            Some(Assertion::Recover) => Reason::PublicFaultRecovered,
            _ => Reason::PublicFaultPublished,
        }
    }

    /// In words: `occur 010019001 nha-…-1 on NPUs [5, 7] (configmap ns/name)`.
    pub(crate) fn words(&self) -> String {
        let faults: Vec<String> = self
            .message
            .faults
            .iter()
            .map(|f| {
                format!(
                    "{} {} {} on NPUs {:?}",
                    f.assertion.as_str(),
                    f.fault_code,
                    f.fault_id,
                    f.influence
                        .first()
                        .map(|i| &i.device_ids[..])
                        .unwrap_or(&[])
                )
            })
            .collect();
        format!("{} (ConfigMap {})", faults.join(", "), self.configmap)
    }
}

/// One engine's loop and what it keeps between ticks.
struct Loop<A> {
    api: A,
    s: Settings,
    node: String,
    key: String,
    configmap: String,
    device_ids: Vec<u32>,
    m: Arc<Monitor>,
    events: Option<EngineEvents>,
    retry_at_ms: u64,
    backoff_ms: u64,
    failing: bool,
    /// What the ConfigMap holds was read (or the state file said what was published).
    known: bool,
}

/// Where an engine's public faults go: its node and NPUs, and its pod's Events.
pub(crate) struct Reach {
    pub node: Option<String>,
    /// The engine's NPUs as the driver named them.
    pub npus: Vec<EngineNpu>,
    /// A published message is also an Event on the engine's pod (`events = true`).
    pub events: Option<EngineEvents>,
}

/// Runs until `cancel`.
pub(crate) async fn run(
    api: impl ConfigMapApi,
    s: Settings,
    to: Reach,
    m: Arc<Monitor>,
    cancel: CancellationToken,
) {
    let Reach { node, npus, events } = to;
    let engine = m.spec().name.clone();
    let Some(node) = node else {
        let why = "public faults: no node name ([agent.kubernetes] node_name or NODE_NAME); nothing is published";
        tracing::warn!(engine = %engine, "{why}");
        memory::update(&m, |r| r.api_error(why.to_owned(), unix_ms()));
        return;
    };
    let phy: Vec<Option<u32>> = npus.iter().map(|n| n.phy_id).collect();
    let (device_ids, left) = message::device_ids(&phy);
    if !left.is_empty() {
        tracing::warn!(engine = %engine, "public faults: left out of the engine's NPUs: {}", left.join("; "));
    }
    if device_ids.is_empty() {
        let why = "public faults: none of the engine's NPUs has a physical id ClusterD takes (0 to 31); nothing is published";
        tracing::warn!(engine = %engine, "{why}");
        memory::update(&m, |r| r.api_error(why.to_owned(), unix_ms()));
        return;
    }
    let key = super::engine_key(&node, &engine);
    let configmap = message::configmap_name(&s.prefix, &node, &engine, &key);
    tracing::info!(engine = %engine, "public faults: published in ConfigMap {}/{configmap} as {} on NPUs {device_ids:?}", s.namespace, s.resource);
    let mut l = Loop {
        api,
        s,
        node,
        key,
        configmap,
        device_ids,
        m,
        events,
        retry_at_ms: 0,
        backoff_ms: FIRST_BACKOFF_MS,
        failing: false,
        known: false,
    };
    loop {
        l.tick().await;
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(TICK) => {}
        }
    }
}

/// The fault a message left open: its last `occur` not recovered in it (`None` for a message
/// that is not the agent's or holds none).
fn open_in(text: &str, loop_code: &str) -> Option<FaultSent> {
    let m: Message = serde_json::from_str(text).ok()?;
    let last = m.faults.into_iter().last()?;
    (last.assertion == Assertion::Occur).then(|| FaultSent {
        kind: if last.fault_code == loop_code {
            Kind::RestartLoop
        } else {
            Kind::Abnormal
        },
        fault_id: last.fault_id,
        code: last.fault_code,
        fault_time_unix_ms: last.fault_time,
        device_ids: last
            .influence
            .into_iter()
            .flat_map(|i| i.device_ids)
            .collect(),
        description: last.description,
        sent_unix_ms: m.timestamp,
    })
}

/// What the verdict of `m` wants published now.
pub(crate) fn desired(m: &Monitor) -> Desired {
    let verdict = m.verdict();
    match verdict.status {
        Status::Initial => Desired::Unknown,
        Status::Normal => Desired::Clear,
        Status::Abnormal => {
            let e = m.episode_summary();
            let kind = if e.escalated {
                Kind::RestartLoop
            } else {
                Kind::Abnormal
            };
            // The episode's start names the fault; the verdict notes the episode, so it is
            // there (now is the fallback for an episode pruned from the memory).
            let since = e
                .saved
                .starts_unix_ms
                .last()
                .copied()
                .unwrap_or_else(unix_ms);
            Desired::Fault {
                kind,
                since_unix_ms: since,
            }
        }
    }
}

impl<A: ConfigMapApi> Loop<A> {
    fn engine(&self) -> &str {
        &self.m.spec().name
    }

    fn fresh(&self, kind: Kind, since_ms: u64) -> FaultSent {
        let code = match kind {
            Kind::Abnormal => &self.s.abnormal_code,
            Kind::RestartLoop => &self.s.loop_code,
        };
        let reason = self.m.verdict().reason;
        FaultSent {
            fault_id: super::fault_id(&self.key, kind, since_ms),
            kind,
            code: code.clone(),
            fault_time_unix_ms: since_ms,
            device_ids: self.device_ids.clone(),
            description: message::description(&format!(
                "npu-health-agent: engine {} {}: {reason}",
                self.engine(),
                kind.words()
            )),
            sent_unix_ms: 0,
        }
    }

    async fn tick(&mut self) {
        let now = unix_ms();
        if now < self.retry_at_ms {
            return;
        }
        if !self.known {
            self.read_back(now).await;
            if !self.known {
                return;
            }
        }
        let published = memory::public_fault(&self.m).unwrap_or_default();
        let want = desired(&self.m);
        let faults = match super::plan(&published, &want, now, self.s.pace, |k, t| self.fresh(k, t))
        {
            Plan::Idle | Plan::Wait { .. } => return,
            Plan::Write(f) => f,
        };
        let msg = message::message(&self.key, &self.node, &self.s.resource, &faults, now);
        if let Err(why) = message::check(&msg) {
            self.failed(format!("not written, ClusterD would drop it: {why}"), now);
            return;
        }
        let body = message::configmap(
            &self.s.namespace,
            &self.configmap,
            self.engine(),
            &self.node,
            &msg,
        );
        match self.write(&body).await {
            Ok(()) => {
                memory::set_public_fault(&self.m, super::after(&published, &faults, now));
                self.published(&Written {
                    configmap: format!("{}/{}", self.s.namespace, self.configmap),
                    message: msg,
                });
            }
            Err(e) => self.failed(
                format!(
                    "writing ConfigMap {}/{}: {e}",
                    self.s.namespace, self.configmap
                ),
                now,
            ),
        }
    }

    /// Without a record in the state file (none, older than its hour, or another agent's),
    /// what the engine's ConfigMap last said is what was published: an `occur` there is the
    /// open fault, so the agent neither raises it again nor forgets its `recover`.
    async fn read_back(&mut self, now: u64) {
        if memory::public_fault(&self.m).is_some() {
            self.known = true;
            return;
        }
        match self.api.read(&self.s.namespace, &self.configmap).await {
            Ok(text) => {
                self.known = true;
                let open = text.and_then(|t| open_in(&t, &self.s.loop_code));
                if let Some(o) = open {
                    tracing::info!(engine = %self.engine(), "public faults: ConfigMap {}/{} holds the open fault {} of an agent before", self.s.namespace, self.configmap, o.fault_id);
                    memory::set_public_fault(
                        &self.m,
                        super::Published {
                            open: Some(o),
                            ..super::Published::default()
                        },
                    );
                }
            }
            Err(e) => self.failed(
                format!(
                    "reading ConfigMap {}/{}: {e}",
                    self.s.namespace, self.configmap
                ),
                now,
            ),
        }
    }

    /// An update; a create if there is no ConfigMap yet.
    async fn write(&self, body: &serde_json::Value) -> Result<(), ApiError> {
        match self
            .api
            .replace(&self.s.namespace, &self.configmap, body)
            .await
        {
            Err(e) if e.code() == Some(404) => self.api.create(&self.s.namespace, body).await,
            other => other,
        }
    }

    /// A message was written: the journal, the log, the back-off reset.
    fn published(&mut self, w: &Written) {
        if self.failing {
            self.failing = false;
            tracing::info!(engine = %self.engine(), "public faults: writing works again");
        }
        self.backoff_ms = FIRST_BACKOFF_MS;
        let words = w.words();
        tracing::warn!(engine = %self.engine(), "public fault published: {words}");
        self.m.note(w.told(), None, &words);
        if let Some(ev) = &self.events {
            ev.record_on_pod(w.reason(), &format!("MindCluster public fault: {words}"));
        }
    }

    fn failed(&mut self, why: String, now: u64) {
        if !self.failing || self.backoff_ms >= MAX_BACKOFF_MS {
            tracing::warn!(engine = %self.engine(), "public faults: {why}; next try in {} s", self.backoff_ms / 1000);
        }
        self.failing = true;
        self.retry_at_ms = now + self.backoff_ms;
        self.backoff_ms = (self.backoff_ms * 2).min(MAX_BACKOFF_MS);
        self.m
            .note(Told::call(ID, "public_fault", "failed"), None, &why);
        memory::update(&self.m, |r| {
            r.api_error(format!("public faults: {why}"), now)
        });
    }
}

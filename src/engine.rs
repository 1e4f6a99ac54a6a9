//! One monitored engine: its `/health` state, its virtual inference, and the verdict that
//! `/status` serves (reference §3.3).
//!
//! The verdict is computed from atomics, so `/status` never waits on the engine: a background
//! task probes `/health` every `health_period` (the reference probes inside every `/status`
//! request, so a `/health` that takes 30 s under load makes Node Manager's 5 s poll time out).
//!
//! - `/health` never answered → `initial`;
//! - answered once, failing now (or answering `false`) → `abnormal`;
//! - healthy: the first such `/status` starts virtual inference (one-shot, as the reference);
//!   `abnormal` if virtual inference is, else `normal`.
//!
//! Re-arm (not in the reference, which dies with its engine): after virtual inference went
//! `abnormal`, once `/health` cannot be reached at all (connection refused: the engine process
//! is gone) and then answers again — the engine restarted — virtual inference goes back to its
//! initial state and the next healthy `/status` starts a new warm-up. Timeouts and HTTP errors
//! are not a restart. While the engine is down `/status` stays `abnormal` (it answered
//! before), so a crashed engine that never comes back is still reported.
//!
//! QoS ([`crate::qos`]): a background task scrapes the engine's `/metrics` and evaluates the
//! score and level; `/status` is unchanged by it unless `qos.eviction` is on, in which case
//! a held `evict` level answers `abnormal` too.

use crate::config::EngineSpec;
use crate::probe::gates::{self, Condition};
use crate::probe::health::{HealthCollector, HealthOutcome, HealthTransport, Transport};
use crate::probe::virtual_inference::{
    self, CapacityWaiting, EngineSignals, LoopConfig, PeakSource, Phase, Prober, ViState,
};
use crate::qos::score::Level;
use crate::qos::{MetricsSource, QosState};
use crate::ring::Ring;
use crate::sampler::Shared;
use crate::window;
use serde::Serialize;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// What `/status` answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Initial,
    Normal,
    Abnormal,
}

impl Status {
    /// The exact body MindIE's engine server returns.
    pub fn body(self) -> &'static str {
        match self {
            Status::Initial => r#"{"status":"initial"}"#,
            Status::Normal => r#"{"status":"normal"}"#,
            Status::Abnormal => r#"{"status":"abnormal"}"#,
        }
    }

    /// `initial`, `normal` or `abnormal`.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Initial => "initial",
            Status::Normal => "normal",
            Status::Abnormal => "abnormal",
        }
    }
}

const NEVER: u8 = 0;
const HEALTHY: u8 = 1;
const UNHEALTHY: u8 = 2;

/// `/health` as last seen.
#[derive(Debug, Clone, Default, Serialize)]
pub struct HealthDetail {
    /// `never_answered`, `healthy`, `slow` (timing out while the engine demonstrably
    /// serves: not abnormal), `agent_error` (the agent could not make the request, e.g. out
    /// of file descriptors: not abnormal) or `unhealthy`.
    pub state: &'static str,
    pub has_connected: bool,
    /// Unix milliseconds of the last healthy probe.
    pub last_ok_unix_ms: Option<u64>,
    pub last_error: Option<String>,
    /// Class of the last failure without a usable answer (`refused`, `reset`, `protocol`,
    /// `body_too_large`, `tls`, `local`, `connect`, `other`); only `refused` can be the
    /// "down" half of a restart.
    pub last_transport_error: Option<&'static str>,
    pub consecutive_failures: u64,
    pub probes: u64,
    /// `/health` timeouts not taken as abnormal because the engine was serving.
    pub excused_timeouts: u64,
}

/// Shared state of one engine.
#[derive(Debug)]
pub struct EngineState {
    pub spec: EngineSpec,
    /// Ring indices of the engine's NPUs.
    pub devices: Vec<u16>,
    health: AtomicU8,
    health_detail: Mutex<HealthDetail>,
    /// The one-shot start latch of the reference's `/status`.
    started: AtomicBool,
    start: Notify,
    /// `/health` could not be reached after virtual inference went abnormal (restart detection).
    down_after_abnormal: AtomicBool,
    /// Bumped at every re-arm; a loop still running from before stops.
    rearm_tx: tokio::sync::watch::Sender<u64>,
    pub vi: ViState,
    pub qos: QosState,
    conditions: Mutex<Vec<Condition>>,
    rearms: AtomicU64,
}

impl EngineState {
    /// A fresh engine: `/health` never answered, virtual inference not started.
    pub fn new(spec: EngineSpec, devices: Vec<u16>) -> EngineState {
        let conditions = gates::static_conditions(&spec);
        let vi = ViState::new(spec.timing.interval);
        let qos = QosState::new(&spec.qos);
        EngineState {
            spec,
            devices,
            health: AtomicU8::new(NEVER),
            health_detail: Mutex::new(HealthDetail {
                state: "never_answered",
                ..HealthDetail::default()
            }),
            started: AtomicBool::new(false),
            start: Notify::new(),
            down_after_abnormal: AtomicBool::new(false),
            rearm_tx: tokio::sync::watch::Sender::new(0),
            vi,
            qos,
            conditions: Mutex::new(conditions),
            rearms: AtomicU64::new(0),
        }
    }

    /// The verdict for `/status`; the first healthy call starts virtual inference.
    pub fn status(&self) -> Status {
        match self.health.load(Ordering::Acquire) {
            NEVER => Status::Initial,
            UNHEALTHY => Status::Abnormal,
            _ => {
                if !self.started.swap(true, Ordering::AcqRel) {
                    self.start.notify_one();
                }
                if self.vi.abnormal() || self.qos_evicts() {
                    Status::Abnormal
                } else {
                    Status::Normal
                }
            }
        }
    }

    /// `qos.eviction` is on and the QoS level is a held `evict`.
    pub fn qos_evicts(&self) -> bool {
        let q = &self.spec.qos;
        q.enabled && q.eviction && self.qos.level() == Level::Evict
    }

    /// The verdict without side effects (for `/status/detail`, logs and metrics).
    pub fn peek_status(&self) -> Status {
        match self.health.load(Ordering::Acquire) {
            NEVER => Status::Initial,
            UNHEALTHY => Status::Abnormal,
            _ if self.vi.abnormal() || self.qos_evicts() => Status::Abnormal,
            _ => Status::Normal,
        }
    }

    /// Why the verdict is what it is.
    pub fn reason(&self) -> String {
        let h = self.health_detail();
        match self.peek_status() {
            Status::Initial => format!(
                "the engine's /health has not answered yet{}",
                h.last_error.map(|e| format!(" ({e})")).unwrap_or_default()
            ),
            Status::Abnormal if h.state == "unhealthy" => format!(
                "/health answered before and fails now: {}",
                h.last_error.unwrap_or_default()
            ),
            Status::Abnormal if self.vi.abnormal() => format!(
                "virtual inference is abnormal: {}",
                self.vi.abnormal_reason().unwrap_or_default()
            ),
            Status::Abnormal => format!(
                "the QoS level is evict (score {}, below 0.3 for {} evaluations) and qos.eviction is on",
                self.qos
                    .score()
                    .map_or_else(|| "none".to_owned(), |s| format!("{s:.3}")),
                self.qos.below_evict()
            ),
            Status::Normal => match self.vi.phase() {
                Phase::Disabled => {
                    "/health answers; virtual inference is disabled (see conditions)".to_owned()
                }
                Phase::NotStarted => {
                    "/health answers; virtual inference starts at the next /status".to_owned()
                }
                _ => "/health answers and virtual inference is not abnormal".to_owned(),
            },
        }
    }

    /// Copy of the `/health` details.
    pub fn health_detail(&self) -> HealthDetail {
        self.health_detail
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The enabling conditions as last evaluated.
    pub fn conditions(&self) -> Vec<Condition> {
        self.conditions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// How many times virtual inference was re-armed after an engine restart.
    pub fn rearms(&self) -> u64 {
        self.rearms.load(Ordering::Relaxed)
    }

    fn set_condition(&self, c: Condition) {
        let mut all = self.conditions.lock().unwrap_or_else(|p| p.into_inner());
        match all.iter_mut().find(|x| x.name == c.name) {
            Some(slot) => *slot = c,
            None => all.push(c),
        }
    }

    /// Evidence that the engine serves requests right now: a periodic virtual probe that
    /// succeeded within `timing.serving_evidence_max_age` (two busy intervals, 40 s, by
    /// default), or token counters advancing in the latest `/metrics` scrape. `None` when the
    /// rule is off (max age zero).
    pub fn serving_evidence(&self) -> Option<String> {
        let fresh = self.spec.timing.serving_evidence_max_age();
        if fresh.is_zero() {
            return None;
        }
        if let Some(p) = self.vi.last_probe()
            && p.success
            && !p.warmup
        {
            let age = tokio::time::Instant::now().saturating_duration_since(p.at);
            if age <= fresh {
                return Some(format!(
                    "a virtual request succeeded {:.1} s ago",
                    age.as_secs_f64()
                ));
            }
        }
        (self.qos.progress() == crate::qos::progress::State::Advancing)
            .then(|| "its token counters advance".to_owned())
    }

    /// Applies one `/health` outcome. A `/health` that only timed out while the engine
    /// demonstrably serves ([`EngineState::serving_evidence`]) is slow, not broken: it is not
    /// abnormal (the reference would say abnormal; that is how a busy engine gets killed).
    pub fn record_health(&self, outcome: &HealthOutcome, has_connected: bool) {
        let name = &self.spec.name;
        let before = self.health.load(Ordering::Acquire);
        let excuse = match outcome {
            HealthOutcome::Unhealthy {
                timed_out: true, ..
            } => self.serving_evidence(),
            // The agent's own shortage (out of file descriptors) says nothing about the
            // engine; the reference policy (no serving evidence) still counts it, as MindIE would.
            HealthOutcome::Unhealthy {
                transport: Some(Transport::Local),
                ..
            } if !self.spec.timing.serving_evidence_max_age().is_zero() => Some(
                "the agent itself could not make the request (out of file descriptors)".to_owned(),
            ),
            _ => None,
        };
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let mut d = self.health_detail.lock().unwrap_or_else(|p| p.into_inner());
        d.probes += 1;
        d.has_connected = has_connected;
        d.last_transport_error = match outcome {
            HealthOutcome::Unhealthy {
                transport: Some(t), ..
            } => Some(t.as_str()),
            _ => None,
        };
        let after = match outcome {
            HealthOutcome::Healthy => {
                d.state = "healthy";
                d.last_ok_unix_ms = Some(now_ms);
                d.consecutive_failures = 0;
                d.last_error = None;
                HEALTHY
            }
            HealthOutcome::Unhealthy {
                reason, timed_out, ..
            } => match &excuse {
                Some(why) => {
                    // `slow`: timing out while serving; `agent_error`: the agent's own failure.
                    let state = if *timed_out { "slow" } else { "agent_error" };
                    if d.state != state {
                        tracing::warn!(engine = %name, "{reason}, but {why}: not abnormal");
                    }
                    d.state = state;
                    d.consecutive_failures += 1;
                    d.excused_timeouts += 1;
                    d.last_error = Some(format!("{reason} (not abnormal: {why})"));
                    HEALTHY
                }
                None => {
                    d.state = "unhealthy";
                    d.consecutive_failures += 1;
                    d.last_error = Some(reason.clone());
                    UNHEALTHY
                }
            },
            HealthOutcome::NeverConnected(e) => {
                d.consecutive_failures += 1;
                d.last_error = Some(e.clone());
                NEVER
            }
        };
        drop(d);
        self.set_condition(gates::health_condition(
            has_connected,
            self.health_detail().last_error.as_deref(),
        ));
        self.health.store(after, Ordering::Release);
        if after != before {
            match after {
                HEALTHY => tracing::info!(
                    engine = %name,
                    verdict = self.peek_status().as_str(),
                    "/health answers"
                ),
                UNHEALTHY => {
                    tracing::warn!(
                        engine = %name,
                        verdict = "abnormal",
                        "/health fails: {}",
                        self.health_detail().last_error.unwrap_or_default()
                    )
                }
                _ => {}
            }
        }
        if matches!(
            outcome,
            HealthOutcome::Unhealthy {
                unreachable: true,
                ..
            }
        ) && self.vi.abnormal()
        {
            self.down_after_abnormal.store(true, Ordering::Release);
        }
        // A restart shows as a real answer: an excused timeout is not one.
        if matches!(outcome, HealthOutcome::Healthy)
            && self.down_after_abnormal.swap(false, Ordering::AcqRel)
            && self.vi.abnormal()
        {
            tracing::warn!(engine = %name, "the engine restarted (/health down, then up); virtual inference is re-armed");
            self.vi.rearm();
            self.rearms.fetch_add(1, Ordering::Relaxed);
            self.rearm_tx.send_modify(|g| *g += 1);
            self.started.store(false, Ordering::Release);
        }
    }

    /// Evaluates the start gates when the first healthy `/status` arrives; true if virtual
    /// inference may run. `cube` lists (logic id, backend) of the engine's NPUs.
    pub fn decide_start(&self, cube: &[(u32, &'static str)]) -> bool {
        // Evaluated now, as the reference does at start (the agent's own environment may
        // have changed since the configuration was read).
        for c in gates::static_conditions(&self.spec) {
            self.set_condition(c);
        }
        self.set_condition(gates::cube_condition(cube));
        let conditions = self.conditions();
        let blocking: Vec<&Condition> = conditions
            .iter()
            .filter(|c| c.name != "health" && c.ok == Some(false))
            .collect();
        if let Some(first) = blocking.first() {
            tracing::warn!(engine = %self.spec.name, condition = first.name, "virtual inference does not run: {}", first.note);
            self.vi.set_phase(Phase::Disabled);
            return false;
        }
        true
    }
}

/// Peak AI Cube usage of an engine's NPUs, from the ring.
#[derive(Debug, Clone)]
pub struct RingPeaks {
    pub shared: Arc<Shared>,
    pub devices: Vec<u16>,
}

impl PeakSource for RingPeaks {
    fn peak(&self, window: Duration) -> Option<f64> {
        window::query(&self.shared.ring, &self.devices, window)
            .combined
            .peak
            .map(f64::from)
    }
}

impl RingPeaks {
    /// The ring itself.
    pub fn ring(&self) -> &Ring {
        &self.shared.ring
    }
}

/// Probes `/health` every `health_period` until cancelled.
pub async fn health_task<T: HealthTransport>(
    state: Arc<EngineState>,
    transport: T,
    cancel: CancellationToken,
) {
    let hc = &state.spec.health_check_config;
    let timeout = state
        .spec
        .timing
        .health_timeout
        .unwrap_or(Duration::from_secs(hc.health_collector_timeout));
    let mut collector = HealthCollector::new(
        transport,
        timeout,
        hc.health_collector_timeout_retry_attempts,
    );
    let period = state.spec.timing.health_period;
    loop {
        let outcome = tokio::select! {
            _ = cancel.cancelled() => return,
            o = collector.probe() => o,
        };
        state.record_health(&outcome, collector.has_connected());
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(period) => {}
        }
    }
}

/// Waits for the start latch, checks the gates, runs virtual inference; repeats after a
/// re-arm. `cube` reports the NPUs' backends at start time.
pub async fn virtual_inference_task<P: Prober, S: PeakSource, G: EngineSignals>(
    state: Arc<EngineState>,
    prober: P,
    peaks: S,
    signals: G,
    cube: impl Fn() -> Vec<(u32, &'static str)>,
    cancel: CancellationToken,
) {
    let spec = &state.spec;
    let cfg = LoopConfig {
        engine: spec.name.clone(),
        npu_usage_threshold: spec.health_check_config.npu_usage_threshold,
        max_failure_count: spec.health_check_config.max_failure_count,
        timing: spec.timing.clone(),
        stall_window: spec.qos.stall_detection.then_some(spec.qos.stall_window),
        skip_when_capacity_waiting: spec.qos.skip_when_capacity_waiting,
    };
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = state.start.notified() => {}
        }
        if !state.decide_start(&cube()) {
            // One-shot as in the reference: a refused start is not retried until a re-arm.
            continue;
        }
        tracing::info!(engine = %spec.name, "virtual inference starts (warm-up request)");
        let mut rearmed = state.rearm_tx.subscribe();
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = virtual_inference::run(&cfg, &prober, &peaks, &signals, &state.vi) => {}
            // A loop that went abnormal is still in its last sleep: it must not go on after
            // the state was re-armed under it.
            _ = rearmed.changed() => {}
        }
    }
}

/// The engine signals of the opt-in accounting rules: progress from the QoS scrapes, and a
/// fresh `/metrics` read for the V6 capacity rule.
#[derive(Debug, Clone)]
pub struct Signals<M> {
    pub state: Arc<EngineState>,
    pub metrics: M,
}

impl<M: MetricsSource + Sync> EngineSignals for Signals<M> {
    fn stalled_for(&self) -> Option<Duration> {
        self.state.qos.stalled_for()
    }

    async fn waiting_for_capacity(&self) -> CapacityWaiting {
        let timeout = self.state.spec.timing.request_timeout;
        match self.metrics.scrape(timeout).await {
            Ok(m) => match (m.waiting_for_capacity, m.sources.waiting_for_capacity) {
                (Some(w), _) => CapacityWaiting::Waiting(w),
                (None, None) => CapacityWaiting::NotExported,
                (None, Some(name)) => CapacityWaiting::Unknown(format!("{name} is not a number")),
            },
            Err(e) => {
                tracing::info!(engine = %self.state.spec.name, "cannot read requests waiting for capacity: {e}");
                CapacityWaiting::Unknown(e)
            }
        }
    }
}

/// Scrapes the engine's `/metrics` every `qos.metrics_period` and evaluates the QoS score
/// every `qos.period`, logging each level change, until cancelled. Does nothing when
/// neither the score nor stall detection is on.
pub async fn qos_task<M: MetricsSource>(
    state: Arc<EngineState>,
    metrics: M,
    cancel: CancellationToken,
) {
    let q = &state.spec.qos;
    if !q.scrapes() {
        return;
    }
    let name = &state.spec.name;
    // At least 1 s even with a short period (tests), at most 5 s.
    let timeout = q
        .metrics_period
        .clamp(Duration::from_secs(1), Duration::from_secs(5));
    let mut scrape = tokio::time::interval(q.metrics_period);
    scrape.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut evaluate = tokio::time::interval(q.period);
    evaluate.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Evaluations start one period in, once there is a scrape to read.
    evaluate.reset();
    let mut failing = false;
    loop {
        tokio::select! {
            // A scrape due at the same time as an evaluation goes first: evaluate fresh data.
            biased;
            _ = cancel.cancelled() => return,
            _ = scrape.tick() => {
                let r = tokio::select! {
                    _ = cancel.cancelled() => return,
                    r = metrics.scrape(timeout) => r,
                };
                match (&r, failing) {
                    (Err(e), false) => tracing::info!(engine = %name, "cannot scrape the engine's /metrics (QoS inputs unknown until it answers): {e}"),
                    (Ok(_), true) => tracing::info!(engine = %name, "the engine's /metrics answers again"),
                    _ => {}
                }
                failing = r.is_err();
                state.qos.record_scrape(r);
            }
            _ = evaluate.tick(), if q.enabled => {
                let probe = state.vi.last_probe().filter(|p| !p.warmup);
                let (score, _, transition) = state.qos.evaluate(q, probe.as_ref());
                if let Some(t) = transition {
                    let score = score.map_or_else(|| "none".to_owned(), |s| format!("{s:.3}"));
                    let msg = format!("QoS level {} -> {} (score {score})", t.from.as_str(), t.to.as_str());
                    if t.to > t.from {
                        tracing::warn!(engine = %name, "{msg}");
                    } else {
                        tracing::info!(engine = %name, "{msg}");
                    }
                    if t.to == Level::Evict && q.eviction {
                        tracing::error!(engine = %name, "QoS level evict is held and qos.eviction is on: /status answers abnormal");
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::file;
    use crate::probe::health::Fetch;
    use crate::probe::virtual_inference::{Failure, ProbeResult};
    use std::collections::VecDeque;
    use std::path::Path;

    fn spec(hc: &str) -> EngineSpec {
        let text = format!(
            "[[engine]]\nengine_type = \"vllm\"\nserved_model_name = \"m\"\nhost = \"127.0.0.1\"\nport = 8000\nmgmt_port = 9001\nengine_env = {{}}\n[engine.timing]\nhealth_period = \"1s\"\n[engine.health_check_config]\n{hc}"
        );
        file::parse(&text, Path::new("/x/agent.toml"))
            .unwrap()
            .engines
            .remove(0)
    }

    fn outcome(o: &str) -> HealthOutcome {
        match o {
            "ok" => HealthOutcome::Healthy,
            "down" => HealthOutcome::Unhealthy {
                reason: "refused".into(),
                unreachable: true,
                timed_out: false,
                transport: Some(Transport::Refused),
            },
            "slow" => HealthOutcome::Unhealthy {
                reason: "timed out".into(),
                unreachable: false,
                timed_out: true,
                transport: None,
            },
            "503" => HealthOutcome::Unhealthy {
                reason: "/health answered HTTP 503".into(),
                unreachable: false,
                timed_out: false,
                transport: None,
            },
            _ => HealthOutcome::NeverConnected("refused".into()),
        }
    }

    // test_mgmt_endpoint_bootstrap.py: /status is initial before the engine answers.
    #[test]
    fn initial_until_health_answers_then_normal() {
        let st = EngineState::new(spec("enable_virtual_inference = true"), vec![0]);
        assert_eq!(st.status(), Status::Initial);
        assert_eq!(Status::Initial.body(), r#"{"status":"initial"}"#);
        st.record_health(&outcome("never"), false);
        assert_eq!(st.status(), Status::Initial);
        assert!(
            !st.started.load(Ordering::Acquire),
            "initial does not start the loop"
        );
        st.record_health(&outcome("ok"), true);
        assert_eq!(st.status(), Status::Normal);
        assert!(
            st.started.load(Ordering::Acquire),
            "the first healthy /status starts it"
        );
        st.record_health(&outcome("down"), true);
        assert_eq!(st.status(), Status::Abnormal, "connected then failed");
        assert!(st.reason().contains("refused"));
    }

    #[test]
    fn status_bodies_are_exact() {
        assert_eq!(Status::Normal.body(), r#"{"status":"normal"}"#);
        assert_eq!(Status::Abnormal.body(), r#"{"status":"abnormal"}"#);
    }

    #[test]
    fn gates_block_the_start_and_name_the_condition() {
        let st = EngineState::new(spec("enable_virtual_inference = false"), vec![0]);
        assert!(!st.decide_start(&[(0, "dcmi")]));
        assert_eq!(st.vi.phase(), Phase::Disabled);
        let st = EngineState::new(spec("enable_virtual_inference = true"), vec![0]);
        assert!(!st.decide_start(&[(0, "none")]));
        let st = EngineState::new(spec("enable_virtual_inference = true"), vec![0]);
        assert!(st.decide_start(&[(0, "dcmi")]));
    }

    struct Scripted(Mutex<VecDeque<Fetch>>);
    impl HealthTransport for Arc<Scripted> {
        async fn get(&self, _t: Duration) -> Fetch {
            self.0
                .lock()
                .unwrap()
                .pop_front()
                .unwrap_or(Fetch::Error(Transport::Other, "script over".into()))
        }
    }

    struct AlwaysFail;
    impl Prober for AlwaysFail {
        async fn send(&self, _t: Duration) -> ProbeResult {
            ProbeResult::new(
                Err(Failure::Transport("refused".into())),
                Duration::from_millis(1),
            )
        }
    }

    struct Idle;
    impl PeakSource for Idle {
        fn peak(&self, _w: Duration) -> Option<f64> {
            Some(0.0)
        }
    }

    /// Lets spawned tasks run up to `d` of paused time.
    async fn advance(d: Duration) {
        tokio::time::sleep(d).await;
    }

    /// Starts `st`'s virtual inference loop with `prober`, an idle NPU and no engine
    /// signals; returns the task and its cancellation.
    fn spawn_idle_vi<P: Prober + Send + Sync + 'static>(
        st: &Arc<EngineState>,
        prober: P,
    ) -> (tokio::task::JoinHandle<()>, CancellationToken) {
        let cancel = CancellationToken::new();
        let vi = tokio::spawn(virtual_inference_task(
            st.clone(),
            prober,
            Idle,
            crate::probe::virtual_inference::NoSignals,
            || vec![(0, "dcmi")],
            cancel.clone(),
        ));
        (vi, cancel)
    }

    /// An engine whose /health answers and whose warm-up fails: abnormal, with its virtual
    /// inference loop (every probe fails, the NPU idle).
    async fn abnormal_after_a_failed_warmup() -> (
        Arc<EngineState>,
        tokio::task::JoinHandle<()>,
        CancellationToken,
    ) {
        let st = Arc::new(EngineState::new(
            spec("enable_virtual_inference = true"),
            vec![0],
        ));
        let (vi, cancel) = spawn_idle_vi(&st, AlwaysFail);
        st.record_health(&outcome("ok"), true);
        assert_eq!(st.status(), Status::Normal);
        advance(Duration::from_secs(1)).await;
        assert!(st.vi.abnormal(), "the failed warm-up is abnormal");
        assert_eq!(st.status(), Status::Abnormal);
        (st, vi, cancel)
    }

    // Warm-up fails → abnormal; the engine restarts (/health down then up) → re-armed →
    // initial state, and the next healthy /status starts a new warm-up.
    #[tokio::test(start_paused = true)]
    async fn abnormal_then_engine_restart_rearms() {
        let (st, vi, cancel) = abnormal_after_a_failed_warmup().await;
        // Without a restart, abnormal stays.
        st.record_health(&outcome("ok"), true);
        assert_eq!(st.status(), Status::Abnormal);
        st.record_health(&outcome("down"), true);
        st.record_health(&outcome("ok"), true);
        assert_eq!(st.rearms(), 1);
        assert!(!st.vi.abnormal());
        assert_eq!(st.vi.phase(), Phase::NotStarted);
        // The next /status starts a new warm-up (which fails again with this prober).
        assert_eq!(st.status(), Status::Normal);
        advance(Duration::from_secs(1)).await;
        assert!(st.vi.abnormal());
        let (_, failures) = st.vi.outcomes();
        assert_eq!(failures, 2, "two warm-ups");
        cancel.cancel();
        vi.await.unwrap();
        // Stopping keeps abnormal (reference: stop does not reset it).
        assert!(st.vi.abnormal());
        assert_eq!(st.status(), Status::Abnormal);
    }

    // Issue 11, defect 2: on a wedged engine already abnormal, a garbled /health answer (or
    // the agent's own EMFILE) followed by a normal one is not a restart: only a refused
    // connection is the "down" half. The class is named in /status/detail.
    #[tokio::test(start_paused = true)]
    async fn garbled_health_answer_is_not_an_engine_restart() {
        for class in Transport::NOT_DOWN {
            let (st, vi, cancel) = abnormal_after_a_failed_warmup().await;
            st.record_health(
                &HealthOutcome::Unhealthy {
                    reason: format!("/health: {}", class.as_str()),
                    unreachable: false,
                    timed_out: false,
                    transport: Some(class),
                },
                true,
            );
            assert_eq!(
                st.health_detail().last_transport_error,
                Some(class.as_str())
            );
            st.record_health(&outcome("ok"), true);
            assert_eq!(st.rearms(), 0, "{class:?} is not a restart");
            assert_eq!(st.status(), Status::Abnormal, "{class:?}");
            assert_eq!(st.health_detail().last_transport_error, None);
            cancel.cancel();
            vi.await.unwrap();
        }
    }

    // The agent's own EMFILE says nothing about the engine: not unhealthy under the agent's
    // policy; the reference policy counts it as MindIE would.
    #[test]
    fn the_agents_own_shortage_is_not_an_unhealthy_engine() {
        let local = HealthOutcome::Unhealthy {
            reason: "/health: local (Too many open files)".into(),
            unreachable: false,
            timed_out: false,
            transport: Some(Transport::Local),
        };
        let st = EngineState::new(spec("enable_virtual_inference = true"), vec![0]);
        st.record_health(&outcome("ok"), true);
        st.record_health(&local, true);
        assert_eq!(st.health_detail().state, "agent_error");
        assert_eq!(st.status(), Status::Normal);
    }

    /// Warm-up succeeds, the first periodic probe fails, everything after succeeds.
    struct FailSecond(std::sync::atomic::AtomicU32);
    impl Prober for FailSecond {
        async fn send(&self, _t: Duration) -> ProbeResult {
            let n = self.0.fetch_add(1, Ordering::SeqCst);
            ProbeResult::new(
                if n == 1 {
                    Err(Failure::Timeout)
                } else {
                    Ok(())
                },
                Duration::from_millis(1),
            )
        }
    }

    // Timeouts and HTTP errors after abnormal are not a restart: no re-arm.
    #[tokio::test(start_paused = true)]
    async fn slow_health_after_abnormal_does_not_rearm() {
        let st = Arc::new(EngineState::new(
            spec("enable_virtual_inference = true"),
            vec![0],
        ));
        let (vi, cancel) = spawn_idle_vi(&st, AlwaysFail);
        st.record_health(&outcome("ok"), true);
        st.status();
        advance(Duration::from_secs(1)).await;
        assert!(st.vi.abnormal());
        st.record_health(&outcome("slow"), true);
        st.record_health(&outcome("ok"), true);
        assert_eq!(st.rearms(), 0);
        assert_eq!(st.status(), Status::Abnormal);
        cancel.cancel();
        vi.await.unwrap();
    }

    // A loop that went abnormal is still sleeping when the engine restarts: it must stop, and
    // only the next /status starts a new warm-up.
    #[tokio::test(start_paused = true)]
    async fn a_rearm_stops_the_loop_still_sleeping_from_before() {
        let st = Arc::new(EngineState::new(
            spec("enable_virtual_inference = true\nmax_failure_count = 1"),
            vec![0],
        ));
        let prober = Arc::new(FailSecond(std::sync::atomic::AtomicU32::new(0)));
        struct Shared(Arc<FailSecond>);
        impl Prober for Shared {
            async fn send(&self, t: Duration) -> ProbeResult {
                self.0.send(t).await
            }
        }
        let (vi, cancel) = spawn_idle_vi(&st, Shared(prober.clone()));
        st.record_health(&outcome("ok"), true);
        st.status();
        advance(Duration::from_millis(100)).await;
        assert!(
            st.vi.abnormal(),
            "warm-up ok, then one idle failure with max 1"
        );
        assert_eq!(prober.0.load(Ordering::SeqCst), 2);
        // Restart while the loop sleeps its 5 s interval.
        st.record_health(&outcome("down"), true);
        st.record_health(&outcome("ok"), true);
        assert_eq!(st.rearms(), 1);
        advance(Duration::from_secs(30)).await;
        assert_eq!(
            prober.0.load(Ordering::SeqCst),
            2,
            "the old loop sent nothing after the re-arm"
        );
        assert_eq!(st.vi.phase(), Phase::NotStarted);
        assert_eq!(st.status(), Status::Normal);
        advance(Duration::from_millis(100)).await;
        assert_eq!(
            prober.0.load(Ordering::SeqCst),
            4,
            "a new warm-up and its first probe"
        );
        assert_eq!(st.vi.phase(), Phase::Running);
        assert!(st.vi.warmup_done());
        cancel.cancel();
        vi.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn health_task_probes_periodically_and_stops_on_cancel() {
        let st = Arc::new(EngineState::new(
            spec("health_collector_timeout_retry_attempts = 1"),
            vec![0],
        ));
        let script = Arc::new(Scripted(Mutex::new(
            vec![
                Fetch::Error(Transport::Refused, "refused".into()),
                Fetch::Response {
                    status: 200,
                    body: "true".into(),
                },
                Fetch::Response {
                    status: 200,
                    body: "false".into(),
                },
            ]
            .into(),
        )));
        let cancel = CancellationToken::new();
        let task = tokio::spawn(health_task(st.clone(), script, cancel.clone()));
        advance(Duration::from_millis(10)).await;
        assert_eq!(st.peek_status(), Status::Initial);
        advance(Duration::from_secs(1)).await;
        assert_eq!(st.peek_status(), Status::Normal);
        advance(Duration::from_secs(1)).await;
        assert_eq!(
            st.peek_status(),
            Status::Abnormal,
            "body false after connecting"
        );
        assert_eq!(st.health_detail().probes, 3);
        cancel.cancel();
        task.await.unwrap();
    }

    /// Scripted `/metrics`: the same answer every time, settable.
    #[derive(Clone)]
    struct ScriptedMetrics(Arc<Mutex<Result<crate::qos::engine_metrics::EngineMetrics, String>>>);
    impl MetricsSource for ScriptedMetrics {
        async fn scrape(
            &self,
            _t: Duration,
        ) -> Result<crate::qos::engine_metrics::EngineMetrics, String> {
            self.0.lock().unwrap().clone()
        }
    }

    fn stuck_metrics(kv: f64) -> crate::qos::engine_metrics::EngineMetrics {
        crate::qos::engine_metrics::EngineMetrics {
            running: Some(4.0),
            prompt_tokens: Some(100.0),
            generation_tokens: Some(10.0),
            kv_cache_usage: Some(kv),
            ..Default::default()
        }
    }

    fn qos_spec(eviction: bool) -> EngineSpec {
        let mut s = spec("enable_virtual_inference = true");
        s.qos.eviction = eviction;
        s
    }

    // The QoS task scrapes and evaluates on its periods; a stuck engine (no progress, KV
    // full, failed probe) goes to evict after 3 evaluations below 0.3. /status follows only
    // with qos.eviction on.
    #[tokio::test(start_paused = true)]
    async fn held_evict_answers_abnormal_only_with_qos_eviction() {
        for eviction in [false, true] {
            let st = Arc::new(EngineState::new(qos_spec(eviction), vec![0]));
            st.record_health(&outcome("ok"), true);
            // A failed periodic probe is the latency input.
            st.vi.record(
                &ProbeResult::new(Err(Failure::Timeout), Duration::from_secs(5)),
                false,
                Some(95.0),
                virtual_inference::Accounting::Reset,
            );
            let metrics = ScriptedMetrics(Arc::new(Mutex::new(Ok(stuck_metrics(1.0)))));
            let cancel = CancellationToken::new();
            let task = tokio::spawn(qos_task(st.clone(), metrics.clone(), cancel.clone()));
            // Scrapes at 0 s, 5 s, …; evaluations at 5 s, 10 s, 15 s, … (score 0: latency 0,
            // memory 0, progress 0 from the second scrape on).
            advance(Duration::from_millis(10_100)).await;
            assert_eq!(st.qos.level(), Level::Degrade, "2 evaluations below 0.3");
            assert_eq!(st.peek_status(), Status::Normal);
            advance(Duration::from_secs(5)).await;
            assert_eq!(st.qos.level(), Level::Evict);
            assert_eq!(st.qos_evicts(), eviction);
            let want = if eviction {
                Status::Abnormal
            } else {
                Status::Normal
            };
            assert_eq!(st.status(), want, "eviction {eviction}");
            if eviction {
                assert!(
                    st.reason().contains("QoS level is evict"),
                    "{}",
                    st.reason()
                );
            }
            // Recovery: tokens advance again, KV frees up; the level climbs back and /status
            // with it.
            *metrics.0.lock().unwrap() = Ok(crate::qos::engine_metrics::EngineMetrics {
                generation_tokens: Some(1e6),
                ..stuck_metrics(0.2)
            });
            st.vi.record(
                &ProbeResult::new(Ok(()), Duration::from_millis(100)),
                false,
                Some(95.0),
                virtual_inference::Accounting::Reset,
            );
            advance(Duration::from_secs(5)).await;
            assert_eq!(st.qos.level(), Level::Normal);
            assert_eq!(st.status(), Status::Normal);
            cancel.cancel();
            task.await.unwrap();
        }
    }

    // A failed scrape is unknown: no score from missing inputs, no level change.
    #[tokio::test(start_paused = true)]
    async fn failed_scrapes_are_unknown_not_bad() {
        let st = Arc::new(EngineState::new(qos_spec(true), vec![0]));
        st.record_health(&outcome("ok"), true);
        let metrics = ScriptedMetrics(Arc::new(Mutex::new(Err("connection refused".into()))));
        let cancel = CancellationToken::new();
        let task = tokio::spawn(qos_task(st.clone(), metrics, cancel.clone()));
        advance(Duration::from_secs(60)).await;
        assert_eq!(st.qos.score(), None);
        assert_eq!(st.qos.level(), Level::Normal);
        assert_eq!(st.status(), Status::Normal);
        let r = st.qos.report(&st.spec.qos);
        assert!(r["scrape_failures"].as_u64().unwrap() >= 10, "{r}");
        assert!(
            r["components"][1]["input"]
                .as_str()
                .unwrap()
                .contains("connection refused"),
            "{r}"
        );
        cancel.cancel();
        task.await.unwrap();
    }

    // The V6 rule reads /metrics at the moment of the failure: the capacity figure when the
    // scrape works, "not exported" when the scrape has no such series (vLLM 0.18), unknown
    // when the scrape fails or the value is not a number.
    #[tokio::test(start_paused = true)]
    async fn signals_read_capacity_now_and_progress_from_the_qos_scrapes() {
        let st = Arc::new(EngineState::new(qos_spec(false), vec![0]));
        let metrics = ScriptedMetrics(Arc::new(Mutex::new(Ok(
            crate::qos::engine_metrics::EngineMetrics {
                waiting_for_capacity: Some(2.0),
                ..stuck_metrics(0.5)
            },
        ))));
        let signals = Signals {
            state: st.clone(),
            metrics: metrics.clone(),
        };
        assert_eq!(
            signals.waiting_for_capacity().await,
            CapacityWaiting::Waiting(2.0)
        );
        *metrics.0.lock().unwrap() = Ok(stuck_metrics(0.5));
        assert_eq!(
            signals.waiting_for_capacity().await,
            CapacityWaiting::NotExported,
            "series absent"
        );
        *metrics.0.lock().unwrap() = Ok(crate::qos::engine_metrics::parse(
            "vllm:num_requests_waiting_by_reason{reason=\"capacity\"} NaN\n",
        ));
        assert!(matches!(
            signals.waiting_for_capacity().await,
            CapacityWaiting::Unknown(why) if why.contains("not a number")
        ));
        *metrics.0.lock().unwrap() = Err("refused".into());
        assert_eq!(
            signals.waiting_for_capacity().await,
            CapacityWaiting::Unknown("refused".into()),
            "scrape failed"
        );
        // Progress comes from the QoS task's scrapes.
        assert_eq!(signals.stalled_for(), None);
        st.qos.record_scrape(Ok(stuck_metrics(0.5)));
        advance(Duration::from_secs(5)).await;
        st.qos.record_scrape(Ok(stuck_metrics(0.5)));
        assert_eq!(signals.stalled_for(), Some(Duration::from_secs(5)));
    }

    // A /health that times out while the engine demonstrably serves (a periodic virtual
    // request succeeded recently, or tokens advance) is slow, not abnormal; without that
    // evidence, or for an HTTP error, it is abnormal as in the reference.
    #[tokio::test(start_paused = true)]
    async fn slow_health_is_excused_only_while_the_engine_serves() {
        let st = EngineState::new(spec("enable_virtual_inference = true"), vec![0]);
        st.record_health(&outcome("ok"), true);
        st.record_health(&outcome("slow"), true);
        assert_eq!(
            st.status(),
            Status::Abnormal,
            "no evidence yet: the reference's verdict"
        );
        st.record_health(&outcome("ok"), true);
        st.vi.record(
            &ProbeResult::new(Ok(()), Duration::from_millis(100)),
            false,
            Some(90.0),
            virtual_inference::Accounting::Reset,
        );
        st.record_health(&outcome("slow"), true);
        assert_eq!(st.status(), Status::Normal);
        let h = st.health_detail();
        assert_eq!((h.state, h.excused_timeouts), ("slow", 1));
        assert!(h.last_error.unwrap().contains("virtual request succeeded"));
        st.record_health(&outcome("503"), true);
        assert_eq!(st.status(), Status::Abnormal, "only timeouts are excused");
        st.record_health(&outcome("ok"), true);
        // The evidence goes stale after two busy intervals (40 s).
        advance(Duration::from_secs(41)).await;
        st.record_health(&outcome("slow"), true);
        assert_eq!(st.status(), Status::Abnormal);
        // An excused timeout after the engine was down is not a restart: no re-arm.
        st.vi.set_abnormal("test");
        st.record_health(&outcome("down"), true);
        st.vi.record(
            &ProbeResult::new(Ok(()), Duration::from_millis(100)),
            false,
            Some(90.0),
            virtual_inference::Accounting::Reset,
        );
        st.record_health(&outcome("slow"), true);
        assert_eq!(st.rearms(), 0, "an excused timeout does not re-arm");
        st.record_health(&outcome("ok"), true);
        assert_eq!(st.rearms(), 1, "a real answer does");
        advance(Duration::from_secs(41)).await;
        // Tokens advancing are evidence too.
        st.record_health(&outcome("ok"), true);
        st.qos.record_scrape(Ok(stuck_metrics(0.5)));
        st.qos
            .record_scrape(Ok(crate::qos::engine_metrics::EngineMetrics {
                generation_tokens: Some(11.0),
                ..stuck_metrics(0.5)
            }));
        st.record_health(&outcome("slow"), true);
        assert_eq!(st.status(), Status::Normal);
        assert!(
            st.health_detail()
                .last_error
                .unwrap()
                .contains("token counters")
        );
    }
}

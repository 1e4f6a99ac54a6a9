//! The peers: the health checks operators run instead of the agent, each as its own source
//! decides a kill, so that the runner compares them with the agent on the same stack
//! (docs/chaos.md, "The peers"). One file per peer:
//!
//! - `k8s-liveness` ([`k8s`]): the kubelet's liveness probe with the API defaults on the
//!   engine's `/health`;
//! - `dynamo-canary` ([`dynamo`]): Dynamo's idle canary, and the operator's probe on its
//!   status;
//! - `sglang-health-generate` ([`sglang`]): a liveness probe on SGLang's `/health_generate`;
//! - `token-heartbeat` ([`heartbeat`]): gonka's step-counter heartbeat on `/metrics`;
//! - `engine-ping` ([`ping`]): vllm-ascend's health ping behind `/health`, probed by the
//!   kubelet with the API defaults.
//!
//! A peer's row runs the agent exactly as under `reference` (nobody reads its `/status`);
//! instead of the Node Manager emulator the peer's *decider* runs on its own thread at
//! real-time priority and sends its kill time on the channel Node Manager's kill takes, so
//! the runner kills the engine as after Node Manager's decision and every verdict and figure
//! is computed as for Node Manager. Every interval and timeout of a peer is multiplied by
//! the run's time scale (they time the engine, whose speed is scaled), a timeout at least
//! [`TIMEOUT_FLOOR`].

mod dynamo;
mod heartbeat;
mod k8s;
mod ping;
mod probe;
mod sglang;

use crate::kubelet::ProbeSpec;
use crate::load::LoadStats;
use crate::timescale::scaled;
use probe::ProbeLog;
pub(crate) use probe::ProbeRecord;
use serde::Serialize;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// A peer health check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Peer {
    K8sLiveness,
    DynamoCanary,
    SglangHealthGenerate,
    TokenHeartbeat,
    EnginePing,
}

/// The least timeout of a peer, whatever the scale: a scaled timeout bounds the engine's
/// answer, but also a loopback round trip and a scheduler's wake-up on a loaded machine,
/// which compressing the experiment does not shorten (1 s at 0.05 would be 50 ms).
pub(crate) const TIMEOUT_FLOOR: Duration = Duration::from_millis(100);

/// An interval of a peer, scaled.
pub(super) fn interval(d: Duration, s: f64) -> Duration {
    scaled(d, s)
}

/// A timeout of a peer, scaled, at least [`TIMEOUT_FLOOR`].
pub(super) fn timeout(d: Duration, s: f64) -> Duration {
    scaled(d, s).max(TIMEOUT_FLOOR)
}

/// A probe's settings scaled: the period as an interval, the timeout as a timeout.
pub(super) fn scaled_spec(p: ProbeSpec, s: f64) -> ProbeSpec {
    ProbeSpec {
        period: interval(p.period, s),
        timeout: timeout(p.timeout, s),
        ..p
    }
}

/// What a decider reaches: the engine (through the latency proxy, as the agent and the load
/// do), the model it serves, and the load's counters (Dynamo's real traffic).
#[derive(Debug, Clone)]
pub(crate) struct Targets {
    /// `http://127.0.0.1:<port>`.
    pub(crate) base: String,
    pub(crate) model: String,
    pub(crate) load: Option<Arc<LoadStats>>,
}

/// What a peer did in an experiment: every call, and its kill decision.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct PeerReport {
    pub(crate) peer: Option<Peer>,
    pub(crate) probes: Vec<ProbeRecord>,
    /// Milliseconds from the decider's start to its kill decision.
    pub(crate) killed_at_ms: Option<u64>,
}

impl Peer {
    /// The fake engine's extra flags under this peer (what the peer calls must be served).
    pub(crate) fn engine_args(self, s: f64) -> Vec<String> {
        match self {
            Peer::SglangHealthGenerate => sglang::engine_args(s),
            Peer::EnginePing => ping::engine_args(s),
            _ => Vec::new(),
        }
    }

    /// Why this peer cannot run against a real vLLM, if it cannot.
    pub(crate) fn not_on_vllm(self) -> Option<&'static str> {
        match self {
            Peer::SglangHealthGenerate => Some(
                "vLLM serves no /health_generate (SGLang's route; the fake engine serves it in every profile)",
            ),
            Peer::EnginePing => Some(
                "the health ping is an unmerged patch of vLLM's internals (vllm-ascend PR #14240); the fake engine does it, a real vLLM cannot",
            ),
            _ => None,
        }
    }

    /// Decides until the kill; its time.
    async fn decide(self, t: Targets, s: f64, log: ProbeLog) -> Instant {
        let health = format!("{}/health", t.base);
        match self {
            Peer::K8sLiveness | Peer::EnginePing => {
                k8s::http_liveness(scaled_spec(k8s::DEFAULTS, s), health, "/health", log).await
            }
            Peer::SglangHealthGenerate => {
                let url = format!("{}/health_generate", t.base);
                let spec = scaled_spec(sglang::PROBE, s);
                k8s::http_liveness(spec, url, "/health_generate", log).await
            }
            Peer::TokenHeartbeat => heartbeat::decide(t.base, s, log).await,
            Peer::DynamoCanary => dynamo::decide(t, s, log).await,
        }
    }
}

/// Runs `peer`'s decider on its own thread and runtime, at real-time priority when
/// permitted (as the Node Manager emulator: it stands for a process elsewhere, which the
/// CPU stress of this machine must not starve), until `cancel`; sends its kill time on
/// `kill_tx`.
pub(crate) fn start(
    peer: Peer,
    targets: Targets,
    s: f64,
    cancel: CancellationToken,
    kill_tx: tokio::sync::oneshot::Sender<Instant>,
) -> std::io::Result<std::thread::JoinHandle<PeerReport>> {
    std::thread::Builder::new()
        .name("peer".to_owned())
        .spawn(move || {
            let _ = npu_health_agent::sampler::priority::make_current_thread_realtime();
            let mut report = PeerReport {
                peer: Some(peer),
                ..PeerReport::default()
            };
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return report;
            };
            rt.block_on(async {
                let log = ProbeLog::new();
                tokio::select! {
                    () = cancel.cancelled() => {}
                    at = peer.decide(targets, s, log.clone()) => {
                        report.killed_at_ms = Some(log.ms(at));
                        let _ = kill_tx.send(at);
                    }
                }
                report.probes = log.records();
            });
            report
        })
}

/// Calls before the kill that [`kill_evidence`] quotes.
const EVIDENCE_PROBES: usize = 12;

/// Why the peer killed: its last calls up to its decision (seconds before it, what it
/// called, what it made of it, the error, the time taken). Empty with no kill.
pub(crate) fn kill_evidence(r: &PeerReport) -> Vec<String> {
    let Some(kill) = r.killed_at_ms else {
        return Vec::new();
    };
    let before: Vec<&ProbeRecord> = r.probes.iter().filter(|p| p.at_ms <= kill).collect();
    let from = before.len().saturating_sub(EVIDENCE_PROBES);
    before[from..]
        .iter()
        .map(|p| {
            format!(
                "probe {:+.2} s: {} {}{} ({:.0} ms)",
                -((kill - p.at_ms) as f64) / 1000.0,
                p.what,
                p.result,
                p.error
                    .as_deref()
                    .map(|e| format!(", {e}"))
                    .unwrap_or_default(),
                p.latency_ms
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    // Every interval and timeout is scaled; a timeout never below the floor.
    #[test]
    fn peer_timings_are_scaled_and_timeouts_floored() {
        let spec = scaled_spec(k8s::DEFAULTS, 0.05);
        assert_eq!(spec.period, Duration::from_millis(500));
        assert_eq!(spec.timeout, TIMEOUT_FLOOR, "1 s at 0.05 is 50 ms: floored");
        assert_eq!(spec.failure_threshold, 3);
        let spec = scaled_spec(k8s::DEFAULTS, 0.5);
        assert_eq!(spec.timeout, Duration::from_millis(500));
    }

    // A kill quotes the calls up to the decision, newest last, in seconds before it.
    #[test]
    fn kill_evidence_quotes_the_calls_before_the_decision() {
        let rec = |at_ms, result: &str, error: Option<&str>| ProbeRecord {
            at_ms,
            what: "/health",
            result: result.to_owned(),
            error: error.map(str::to_owned),
            latency_ms: 100.0,
        };
        let mut r = PeerReport {
            peer: Some(Peer::K8sLiveness),
            probes: (0..20).map(|i| rec(i * 100, "ok", None)).collect(),
            killed_at_ms: None,
        };
        assert!(kill_evidence(&r).is_empty(), "no kill, no evidence");
        r.probes.push(rec(2_500, "failed", Some("timeout")));
        r.probes.push(rec(9_000, "ok", None));
        r.killed_at_ms = Some(2_600);
        let lines = kill_evidence(&r);
        assert_eq!(lines.len(), EVIDENCE_PROBES, "{lines:#?}");
        assert_eq!(
            lines.last().unwrap(),
            "probe -0.10 s: /health failed, timeout (100 ms)"
        );
    }
}

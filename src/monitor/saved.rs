//! What of one engine's state outlives the agent process: everything the verdict and the
//! levels depend on, so that an agent restart (or a reload that changes the engine's table)
//! neither forgets a hung engine nor warms up a warm one again.
//!
//! Kept: the restart-loop memory ([`super::episodes`]), the `/health` state (answered before, failing since, for the agent policy's grace),
//! the start latch and the restart bookkeeping, virtual inference (the latched `abnormal`
//! and why, the failure count, warm-up sent, the last probe), the QoS level and its hold,
//! the progress tracking behind stall detection, and what each integration keeps of the
//! engine under its own keys ([`super::acted::Kept`]: the Kubernetes API mode's record and
//! eviction gate, its cooldown and back-off). Times are wall-clock milliseconds ([`crate::clock`]).
//! Counters and histograms start again from zero (they are Prometheus counters: a reset is
//! what a scraper expects of a new process).
//!
//! A saved state belongs to one engine: the same name and address, and, when the engine
//! shows it on `/metrics`, the same process start time. `continuity` checks the name and
//! address before [`Monitor::restore`]; the agent checks the process at its first scrape and
//! calls [`Monitor::forget`] on a mismatch.

use super::verdict::HealthState;
use super::{Monitor, acted, episodes, vi_state};
use crate::config::EngineSpec;
use npu_health_wire::ShadowHistory;
use serde::{Deserialize, Serialize};
use std::sync::atomic::Ordering;

/// The longest `/health` error or abnormal reason kept (a bounded file).
const TEXT_MAX: usize = 512;

/// One engine's saved state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct EngineState {
    pub name: String,
    /// The engine's base URL ([`EngineSpec::engine_url`]).
    pub engine: String,
    /// The engine process's start time from its `/metrics` (Unix seconds), if it shows one.
    pub engine_started_at: Option<f64>,
    pub health: SavedHealth,
    /// The reference's one-shot start latch: a healthy `/status` already started virtual
    /// inference.
    pub started: bool,
    /// `/health` went down after `abnormal` (the first half of an engine restart).
    pub down_after_abnormal: bool,
    pub rearms: u64,
    pub vi: vi_state::Saved,
    pub qos: crate::qos::Saved,
    /// The `abnormal` episodes of the last day ([`super::episodes`]); absent while empty, so
    /// a file written before reads as before.
    #[serde(default, skip_serializing_if = "episodes::Saved::is_empty")]
    pub episodes: episodes::Saved,
    /// The shadow's turns and disagreements ([`super::shadow`]); absent while empty.
    #[serde(default, skip_serializing_if = "ShadowHistory::is_empty")]
    pub shadow: ShadowHistory,
    /// What each integration keeps, under its own keys, after the monitor's (the Kubernetes
    /// API mode: `kubernetes`, `eviction_gate`).
    #[serde(flatten)]
    pub kept: acted::Kept,
}

/// The `/health` state as saved (not the time of the last healthy answer: it changes at
/// every probe, and nothing decides on it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct SavedHealth {
    pub state: HealthState,
    pub has_connected: bool,
    pub failing_since_unix_ms: Option<u64>,
    pub last_failure_unix_ms: Option<u64>,
    pub last_error: Option<String>,
    pub consecutive_failures: u64,
}

/// Which parts of a saved state still mean something for the engine as now configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Carry {
    /// The verdict's inputs: `/health`, the start latch, restart bookkeeping.
    pub health: bool,
    /// Virtual inference: `abnormal`, the failure count, warm-up.
    pub virtual_inference: bool,
    /// The QoS level, its hold, and the progress tracking.
    pub qos: bool,
}

impl Carry {
    /// Everything (an agent restart with the same settings).
    pub(crate) const ALL: Carry = Carry {
        health: true,
        virtual_inference: true,
        qos: true,
    };

    /// Nothing at all.
    pub(crate) fn none(self) -> bool {
        !self.health && !self.virtual_inference && !self.qos
    }
}

/// What of `old`'s state still applies under `new`, and why the rest does not: the rules of a
/// reload (or a restart with a changed configuration).
///
/// - Another engine address (`host`, `port`, `infer_tls_config`): another engine, nothing.
/// - `health_check_config.enable_virtual_inference` changed: virtual inference's state
///   (`abnormal`, the count, warm-up) starts over.
/// - Any key of `[engine.qos]` changed: the score means something else; the level and its
///   hold start over.
/// - Everything else (timing, policy, thresholds, devices, the mgmt listener, actions): all
///   kept. A count kept under a new `max_failure_count` goes on toward the new maximum.
pub(crate) fn carry(old: &EngineSpec, new: &EngineSpec) -> (Carry, Vec<&'static str>) {
    let mut why = Vec::new();
    if old.engine_url() != new.engine_url() {
        why.push("the engine's address (host, port, infer_tls_config)");
        return (
            Carry {
                health: false,
                virtual_inference: false,
                qos: false,
            },
            why,
        );
    }
    let mut c = Carry::ALL;
    if old.health_check_config.enable_virtual_inference
        != new.health_check_config.enable_virtual_inference
    {
        c.virtual_inference = false;
        why.push("health_check_config.enable_virtual_inference");
    }
    if old.qos != new.qos {
        c.qos = false;
        why.push("[engine.qos]");
    }
    (c, why)
}

/// How far two readings of one process's start time may differ (prometheus_client derives
/// it from `/proc`'s start ticks and the boot time, both fixed for a process).
const SAME_PROCESS: f64 = 1.0;

/// Why the engine is not the process a state was saved from: `saved` and `now` are its
/// `process_start_time_seconds` then and now; `None` when it is the same process, or cannot
/// be told (the engine does not show it).
pub(crate) fn other_process(saved: f64, now: Option<f64>) -> Option<String> {
    let now = now?;
    ((now - saved).abs() > SAME_PROCESS).then(|| {
        format!(
            "the engine's process started at {now:.0} (Unix seconds), the saved state's at {saved:.0}: it restarted while no agent watched it"
        )
    })
}

fn bounded(s: Option<String>) -> Option<String> {
    s.map(|mut s| {
        if s.len() > TEXT_MAX {
            let mut end = TEXT_MAX;
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            s.truncate(end);
            s.push('…');
        }
        s
    })
}

impl Monitor {
    /// The state to save now.
    pub(crate) fn saved(&self) -> EngineState {
        let seen = self
            .health_detail
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let h = seen.detail;
        let mut vi = self.vi.saved();
        vi.abnormal_reason = bounded(vi.abnormal_reason);
        if let Some(p) = vi.last_probe.as_mut() {
            p.outcome = bounded(Some(std::mem::take(&mut p.outcome))).unwrap_or_default();
        }
        EngineState {
            name: self.spec.name.clone(),
            engine: self.spec.engine_url(),
            engine_started_at: self.engine_started_at(),
            health: SavedHealth {
                state: h.state,
                has_connected: h.has_connected,
                failing_since_unix_ms: seen.failing_since.map(crate::clock::unix_ms_of),
                last_failure_unix_ms: seen.last_failure_at.map(crate::clock::unix_ms_of),
                last_error: bounded(h.last_error),
                consecutive_failures: h.consecutive_failures,
            },
            started: self.started.load(Ordering::Acquire),
            down_after_abnormal: self.down_after_abnormal.load(Ordering::Acquire),
            rearms: self.rearms(),
            vi,
            qos: self.qos.saved(),
            episodes: self.episodes_saved(),
            shadow: self.records_saved(),
            kept: self.acted.saved(),
        }
    }

    /// Takes back the parts of `s` that `carry` keeps. Call before the engine's tasks start:
    /// a loop that was running resumes without a new warm-up, and an abnormal one stays
    /// stopped until the engine restarts.
    pub(crate) fn restore(&self, s: &EngineState, carry: Carry) {
        if carry.health {
            {
                let mut seen = self.health_detail.lock().unwrap_or_else(|p| p.into_inner());
                seen.failing_since = s.health.failing_since_unix_ms.map(crate::clock::instant_of);
                seen.last_failure_at = s.health.last_failure_unix_ms.map(crate::clock::instant_of);
                let d = &mut seen.detail;
                d.state = s.health.state;
                d.has_connected = s.health.has_connected;
                d.last_error = s.health.last_error.clone();
                d.consecutive_failures = s.health.consecutive_failures;
            }
            self.health.store(s.health.state.to_u8(), Ordering::Release);
            self.down_after_abnormal
                .store(s.down_after_abnormal, Ordering::Release);
            self.rearms.store(s.rearms, Ordering::Relaxed);
            self.record_engine_start(s.engine_started_at);
        }
        if carry.health && carry.virtual_inference {
            self.vi.restore(&s.vi);
            self.started.store(s.started, Ordering::Release);
            // The loop resumes at once, as it ran before; it did not run while abnormal.
            if s.started && !s.vi.abnormal {
                self.start.notify_one();
            }
        }
        if carry.qos {
            self.qos.restore(&s.qos);
        }
        self.acted.restore(&s.kept);
        // The restart-loop memory is the engine's, not one process's nor one setting's: kept
        // whatever `carry` says.
        self.restore_episodes(&s.episodes);
        self.restore_records(&s.shadow);
    }

    /// Forgets a restored state that turned out to belong to another engine process (it
    /// restarted while the agent was down): virtual inference back to its initial state,
    /// the QoS level and history cleared. `/health` is live and kept.
    pub(crate) fn forget(&self, why: &str) {
        tracing::warn!(engine = %self.spec.name, "the saved state is not this engine's: {why}; it is discarded and the engine is watched from its initial state");
        self.vi.rearm();
        self.down_after_abnormal.store(false, Ordering::Release);
        self.started.store(false, Ordering::Release);
        self.rearm_tx.send_modify(|g| *g += 1);
        self.qos.reset(&self.spec.qos);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_is_told_by_its_start_time() {
        assert_eq!(other_process(1.7e9, Some(1.7e9 + 0.01)), None);
        assert_eq!(other_process(1.7e9, None), None, "not shown: cannot tell");
        let why = other_process(1.7e9, Some(1.7e9 + 120.0)).unwrap();
        assert!(why.contains("restarted"), "{why}");
    }

    fn spec() -> EngineSpec {
        let text = "[[engine]]\nengine_type = \"vllm\"\nserved_model_name = \"m\"\nhost = \"127.0.0.1\"\nport = 8000\nmgmt_port = 9001\nengine_env = {}\n";
        crate::config::file::parse(text, std::path::Path::new("/x/agent.toml"))
            .unwrap()
            .engines
            .remove(0)
    }

    #[test]
    fn what_a_changed_table_keeps() {
        let a = spec();
        let (c, why) = carry(&a, &a);
        assert_eq!(c, Carry::ALL);
        assert!(why.is_empty());
        let mut b = a.clone();
        b.timing.window = std::time::Duration::from_secs(9);
        b.health_check_config.max_failure_count = 9;
        assert_eq!(
            carry(&a, &b).0,
            Carry::ALL,
            "timing and thresholds keep everything"
        );
        let mut b = a.clone();
        b.port += 1;
        let (c, why) = carry(&a, &b);
        assert!(c.none(), "another address is another engine");
        assert_eq!(
            why,
            vec!["the engine's address (host, port, infer_tls_config)"]
        );
        let mut b = a.clone();
        b.health_check_config.enable_virtual_inference =
            !a.health_check_config.enable_virtual_inference;
        let (c, _) = carry(&a, &b);
        assert!(c.health && !c.virtual_inference && c.qos);
        let mut b = a.clone();
        b.qos.ttft_budget = std::time::Duration::from_secs(9);
        let (c, why) = carry(&a, &b);
        assert!(c.health && c.virtual_inference && !c.qos);
        assert_eq!(why, vec!["[engine.qos]"]);
    }
}

//! The detection policy: `policy = "reference" | "agent"` in `[agent]`, overridable per
//! `[[engine]]`, and the agent policy's own settings (`[engine.agent_policy]`).
//!
//! - `reference` is MindIE V5's virtual inference exactly (the opt-in QoS rules stay as
//!   configured, off by default).
//! - `agent` changes the defaults of three `[engine.qos]` keys (`stall_detection = true`,
//!   `eviction = true`, `stall_window = "30s"`; a key written in the file keeps its value) and
//!   turns on the rules of [`AgentPolicy`]: a grace for `/health` failures that are not a
//!   dead engine, and fast confirmation of a failed probe. The rules, the scenario behind
//!   each and the test that pins it: `docs/policy.md`.

use super::qos::QosConfig;
use serde::{Deserialize, Serialize};
use std::time::Duration;

pub use npu_health_wire::Policy;

/// `stall_window` under `agent` when the file does not set it.
pub const AGENT_STALL_WINDOW: Duration = Duration::from_secs(30);

/// `[engine.agent_policy]`: used only under `policy = "agent"`. A key left out keeps its
/// default; the defaults come from the chaos suite's measurements (`docs/policy.md`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentPolicy {
    /// A `/health` that fails without the engine being gone (an HTTP error, `false`, a
    /// timeout, a reset) is `abnormal` only once it has failed this long without a healthy
    /// answer. A refused connection (the engine's port is closed) is `abnormal` at once.
    /// Default 15 s: the 12 s hot reload, plus a 3 s margin for the probe period.
    #[serde(with = "super::duration")]
    pub health_failure_grace: Duration,
    /// Counted probe failures that make the engine abnormal when each was confirmed (the NPU
    /// idle over the whole time since the first, the token counters not advancing, or the
    /// engine stalled by stall detection). Default 2: the failure and one re-probe.
    pub confirm_failures: u32,
    /// Sleep before a confirming re-probe. Default 1 s.
    #[serde(with = "super::duration")]
    pub confirm_interval: Duration,
    /// Timeout of a re-probe confirming a failure on an idle NPU (an idle engine answers a
    /// one-token request in milliseconds). Default 2 s.
    #[serde(with = "super::duration")]
    pub confirm_timeout: Duration,
    /// The engine's process (the one listening on its port, or one of its children such as
    /// vLLM's `EngineCore`) stopped this long (`T` in `/proc/<pid>/stat`: SIGSTOP, a
    /// debugger's stop) makes the engine `abnormal`: a stopped process answers nothing.
    /// Default 2 s; `0s` turns the rule off. Needs the engine's processes in sight
    /// (`/proc`, docs/policy.md).
    #[serde(with = "super::duration")]
    pub stopped_process_grace: Duration,
    /// No sign of life (docs/policy.md, rule 11): requests running, the NPU busy, and none of
    /// the engine's scheduler signals (prompt and generation token counters, KV-cache usage,
    /// running and waiting counts) moved for this long, and a virtual request sent meanwhile
    /// went unanswered: `abnormal`. Default 8 s; `0s` turns the rule off. With chunked prefill
    /// off, one prefill step longer than this reads as no sign of life (docs/policy.md).
    #[serde(with = "super::duration")]
    pub progress_window: Duration,
    /// The floor of a probe's timeout learned from the engine's own answers (docs/policy.md,
    /// rule 12): a periodic probe sent to an idle NPU times out after ten times the slowest
    /// of the engine's last 8 answers, at least this, at most the request timeout. Default
    /// 500 ms; `0s` turns the rule off (the request timeout, as the reference).
    #[serde(with = "super::duration")]
    pub learned_timeout_floor: Duration,
    /// The restart loop (docs/runbook.md, "NpuHealthEngineRestartLoop"): this many `abnormal`
    /// episodes within `escalate_window` escalate the engine (the reason says so, a metric and
    /// an alert fire; `/status` answers as before). Read under both policies. Default 3; `0`
    /// never escalates.
    pub escalate_after: u32,
    /// The window of `escalate_after`, and the clean period that clears an escalation.
    /// Default 1 h; at most 24 h (the memory's reach).
    #[serde(with = "super::duration")]
    pub escalate_window: Duration,
}

impl Default for AgentPolicy {
    fn default() -> Self {
        AgentPolicy {
            health_failure_grace: Duration::from_secs(15),
            confirm_failures: 2,
            confirm_interval: Duration::from_secs(1),
            confirm_timeout: Duration::from_secs(2),
            stopped_process_grace: Duration::from_secs(2),
            progress_window: Duration::from_secs(8),
            learned_timeout_floor: Duration::from_millis(500),
            escalate_after: 3,
            escalate_window: Duration::from_secs(3600),
        }
    }
}

impl AgentPolicy {
    /// Checks every value against its bound; `Err((key, message))`.
    pub(crate) fn validate(&self) -> Result<(), super::KeyError> {
        use bounds::{
            CONFIRM_FAILURES, CONFIRM_INTERVAL, CONFIRM_TIMEOUT, ESCALATE_AFTER, ESCALATE_WINDOW,
            HEALTH_FAILURE_GRACE, LEARNED_TIMEOUT_FLOOR, PROGRESS_WINDOW, STOPPED_PROCESS_GRACE,
        };
        HEALTH_FAILURE_GRACE.check("health_failure_grace", self.health_failure_grace)?;
        STOPPED_PROCESS_GRACE.check("stopped_process_grace", self.stopped_process_grace)?;
        CONFIRM_FAILURES.check("confirm_failures", self.confirm_failures)?;
        CONFIRM_INTERVAL.check("confirm_interval", self.confirm_interval)?;
        CONFIRM_TIMEOUT.check("confirm_timeout", self.confirm_timeout)?;
        PROGRESS_WINDOW.check("progress_window", self.progress_window)?;
        LEARNED_TIMEOUT_FLOOR.check("learned_timeout_floor", self.learned_timeout_floor)?;
        ESCALATE_AFTER.check("escalate_after", self.escalate_after)?;
        ESCALATE_WINDOW.check("escalate_window", self.escalate_window)?;
        Ok(())
    }
}

/// The `[engine.qos]` keys a preset may change, by every name the file may use.
const PRESET_KEYS: [(&str, &[&str]); 3] = [
    ("stall_detection", &["stall_detection"]),
    ("eviction", &["eviction", "qos_eviction"]),
    ("stall_window", &["stall_window"]),
];

/// Applies `policy`'s defaults to the `[engine.qos]` keys the file did not write (`written`:
/// the keys of that table as written).
pub(crate) fn apply_preset(policy: Policy, qos: &mut QosConfig, written: &[String]) {
    if policy != Policy::Agent {
        return;
    }
    let set = |names: &[&str]| names.iter().any(|n| written.iter().any(|w| w == n));
    for (key, names) in PRESET_KEYS {
        if set(names) {
            continue;
        }
        match key {
            "stall_detection" => qos.stall_detection = true,
            "eviction" => qos.eviction = true,
            _ => qos.stall_window = AGENT_STALL_WINDOW,
        }
    }
}

/// `[engine.agent_policy]` bounds (checked by [`AgentPolicy::validate`]).
pub mod bounds {
    use crate::config::bounds::{Within, ms, secs};
    use std::time::Duration;

    /// `0s` reports every failure at once, as the reference does.
    pub const HEALTH_FAILURE_GRACE: Within<Duration> = Within::new(ms(0), secs(600));
    pub(crate) const CONFIRM_FAILURES: Within<u32> = Within::new(1, 100);
    pub const CONFIRM_INTERVAL: Within<Duration> = Within::new(ms(10), secs(600));
    pub const CONFIRM_TIMEOUT: Within<Duration> = Within::new(ms(50), secs(600));
    /// `0s` turns the rule off.
    pub(crate) const STOPPED_PROCESS_GRACE: Within<Duration> = Within::new(ms(0), secs(600));
    /// `0s` turns the rule off.
    pub const PROGRESS_WINDOW: Within<Duration> = Within::new(ms(0), secs(600));
    /// `0s` turns the rule off.
    pub(crate) const LEARNED_TIMEOUT_FLOOR: Within<Duration> = Within::new(ms(0), secs(600));
    /// `0` never escalates; 1000 is far beyond what a day can hold.
    pub(crate) const ESCALATE_AFTER: Within<u32> = Within::new(0, 1000);
    /// At least a minute (a shorter one cannot hold two engine restarts); at most a day, the
    /// memory's reach.
    pub(crate) const ESCALATE_WINDOW: Within<Duration> = Within::new(secs(60), secs(24 * 3600));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agent_preset_fills_only_the_keys_left_out() {
        let mut q = QosConfig::default();
        apply_preset(Policy::Reference, &mut q, &[]);
        assert_eq!(q, QosConfig::default(), "reference changes nothing");
        apply_preset(Policy::Agent, &mut q, &[]);
        assert!(q.stall_detection && q.eviction);
        assert_eq!(q.stall_window, AGENT_STALL_WINDOW);
        let mut q = QosConfig::default();
        apply_preset(
            Policy::Agent,
            &mut q,
            &["qos_eviction".to_owned(), "stall_window".to_owned()],
        );
        assert!(q.stall_detection, "left out: the preset's");
        assert!(!q.eviction, "written (by its alias): the file's");
        assert_eq!(q.stall_window, QosConfig::default().stall_window);
    }

    #[test]
    fn bounds_name_the_key() {
        let bad = AgentPolicy {
            confirm_failures: 0,
            ..AgentPolicy::default()
        };
        let (k, m) = bad.validate().unwrap_err();
        assert_eq!(k, "confirm_failures");
        assert!(m.contains("outside"), "{m}");
        assert!(AgentPolicy::default().validate().is_ok());
        let bad = AgentPolicy {
            escalate_window: Duration::from_secs(25 * 3600),
            ..AgentPolicy::default()
        };
        let (k, m) = bad.validate().unwrap_err();
        assert_eq!(k, "escalate_window");
        assert!(m.contains("outside"), "{m}");
    }
}

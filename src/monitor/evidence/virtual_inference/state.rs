//! Virtual inference's loop as data: its settings ([`LoopConfig`]), its states ([`State`]),
//! what the periodic loop carries from one probe to the next ([`Periodic`]), and what each
//! step reads and writes ([`Io`]). The steps themselves are in [`super`].

use super::pause::{Pending, Sent};
use crate::config::policy::Judging;
use crate::config::{EngineSpec, Timing};
use crate::monitor::Monitor;
use crate::monitor::account::{self, Rules};
use crate::monitor::evidence::driver_faults::Checked;
use crate::monitor::vi_state::ViState;
use crate::sampler::faults::NpuFault;
use std::time::Duration;

/// The virtual inference loop's settings.
#[derive(Debug, Clone)]
pub(crate) struct LoopConfig {
    /// Engine name for logs.
    pub engine: String,
    /// The rules of the policy in force: they decide, and they time the probes.
    pub rules: Rules,
    /// The shadow's rules (rules in `observe`, or `shadow_policy`): they count the same
    /// probes and decide nothing.
    pub shadow: Option<Rules>,
    pub timing: Timing,
}

impl LoopConfig {
    /// The settings of `monitor`'s engine.
    pub(crate) fn of(monitor: &Monitor) -> LoopConfig {
        let spec = &monitor.spec;
        let rules = rules_of(spec, &spec.judging.in_force);
        let shadow = spec.judging.shadow.as_ref().map(|j| rules_of(spec, j));
        LoopConfig {
            engine: spec.name.clone(),
            rules,
            shadow,
            timing: spec.timing.clone(),
        }
    }

    /// What the loop reads beside a probe: what the policy in force or the shadow needs.
    pub(crate) fn reads(&self) -> Rules {
        self.shadow
            .as_ref()
            .map_or_else(|| self.rules.clone(), |s| either(&self.rules, s))
    }
}

/// The accounting rules of `spec` as `j` judges.
fn rules_of(spec: &EngineSpec, j: &Judging) -> Rules {
    let a = &spec.agent_policy;
    Rules {
        npu_usage_threshold: spec.health_check_config.npu_usage_threshold,
        max_failure_count: spec.health_check_config.max_failure_count,
        stall_window: j.stall_window,
        skip_when_capacity_waiting: spec.qos.skip_when_capacity_waiting,
        agent: j.agent().then(|| account::AgentRules {
            rules: j.rules,
            confirm_failures: i64::from(a.confirm_failures),
            confirm_interval: a.confirm_interval,
            confirm_timeout: a.confirm_timeout,
            progress_window: j.applies(11).then_some(a.progress_window),
            learned_timeout_floor: j.applies(12).then_some(a.learned_timeout_floor),
        }),
    }
}

/// Rules that read what `a` or `b` reads (for the loop's reads, never for a decision).
fn either(a: &Rules, b: &Rules) -> Rules {
    let agent = match (a.agent, b.agent) {
        (Some(x), Some(y)) => Some(account::AgentRules {
            rules: x.rules.union(y.rules),
            progress_window: x.progress_window.or(y.progress_window),
            learned_timeout_floor: x.learned_timeout_floor.or(y.learned_timeout_floor),
            ..x
        }),
        (x, y) => x.or(y),
    };
    Rules {
        stall_window: a.stall_window.or(b.stall_window),
        agent,
        ..a.clone()
    }
}

/// Where the virtual inference loop is (reference §1.4–§1.5). Each state is one
/// [`step`]: the I/O of one phase, then the next state.
#[derive(Debug)]
pub(super) enum State<'a> {
    /// The one warm-up request (skipped when it was sent before the agent restarted).
    WarmUp,
    /// The periodic loop begins: the regular cadence, phase `running`.
    Begin,
    /// One periodic probe: the request, the evidence beside it, its accounting.
    Probe(Periodic<'a>),
    /// A request's outcome to account: a probe's, or a pending request's late answer.
    Settle(Periodic<'a>, Sent),
    /// The sleep before the next probe (cut short under the agent policy).
    Pause(Periodic<'a>, Pause),
    /// Abnormal, or the warm-up failed: the loop is over.
    Stopped,
}

/// What the periodic loop carries from one probe to the next.
#[derive(Debug)]
pub(super) struct Periodic<'a> {
    pub(super) cadence: account::Cadence,
    /// When a virtual request was last served (stall detection's evidence of life).
    pub(super) last_served: tokio::time::Instant,
    /// Agent policy: the open streak of counted failures.
    pub(super) streak: Option<account::Streak<tokio::time::Instant>>,
    /// The next probe's timeout.
    pub(super) timeout: Duration,
    /// The last successful periodic probe's latency: the engine's pace when it answers.
    pub(super) last_ok: Option<Duration>,
    /// The latencies of the last successful periodic probes, newest last (rule 12).
    pub(super) recent_ok: std::collections::VecDeque<Duration>,
    /// Agent policy: when a quiet engine last woke the loop (rule 11: at most once a window).
    pub(super) quiet_woke: Option<tokio::time::Instant>,
    /// When the last periodic probe ended (rule 12 reads the NPU since then).
    pub(super) probe_ended: Option<tokio::time::Instant>,
    /// Agent policy: the driver fault that woke the loop for this probe.
    pub(super) woke_for: Option<NpuFault>,
    /// Agent policy: the faults at the confirming level a virtual request was answered beside
    /// (they no longer explain a failure while they stay: a chip can report a code for weeks
    /// and work).
    pub(super) answered: Checked,
    /// Agent policy: the request that missed a timeout shorter than the request timeout,
    /// still waiting for its answer.
    pub(super) pending: Option<Pending<'a>>,
}

impl Periodic<'_> {
    /// What a probe's accounting reads of it.
    pub(super) fn known(&self) -> Known<'_> {
        Known {
            answered: &self.answered,
            last_served: self.last_served,
            streak_tokens: self.streak.and_then(|s| s.tokens),
            last_ok: self.last_ok,
        }
    }
}

/// What the loop knew before a probe that its accounting reads (apart from the pending
/// request, which the evidence reads need not wait on).
pub(super) struct Known<'p> {
    pub(super) answered: &'p Checked,
    pub(super) last_served: tokio::time::Instant,
    /// The token counters when the open streak began.
    pub(super) streak_tokens: Option<f64>,
    pub(super) last_ok: Option<Duration>,
}

/// The sleep after a probe.
#[derive(Debug)]
pub(super) struct Pause {
    pub(super) next: account::NextProbe,
    /// The faults at the confirming level this probe checked; any other wakes the loop.
    pub(super) checked: Checked,
}

/// What the steps read and write.
pub(super) struct Io<'a, P, S, G> {
    pub(super) cfg: &'a LoopConfig,
    pub(super) prober: &'a P,
    pub(super) peaks: &'a S,
    pub(super) signals: &'a G,
    pub(super) state: &'a ViState,
}

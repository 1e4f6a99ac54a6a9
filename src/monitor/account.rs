//! The rules of virtual inference as plain functions (virtual-inference-reference §1.4–§1.5):
//! what one probe does to the failure count, and how long to sleep before the next. The
//! loop in [`super::evidence::virtual_inference`] gathers an [`Observation`], calls [`account`] and
//! [`next_cadence`], and applies what they return; every rule is a row of the tables below.
//!
//! Failure accounting, in the reference's order:
//! 1. peak available, below the threshold, request failed → count + 1; abnormal at max;
//! 2. request failed, peak unavailable → unchanged;
//! 3. request succeeded, or peak at or above the threshold → reset to 0.
//!
//! Two opt-in rules change that accounting (off by default, for V5 parity):
//! - stall detection (`stall_window`): in case 3, a *failed* request on a busy NPU counts
//!   (+ 1) when the engine has shown no sign of life for `stall_window`: requests running
//!   and neither the prompt nor the generation token counter advancing, *and* no virtual
//!   request served in that time. vLLM adds a prompt to its counter only when the request's
//!   first token comes out, so a long prefill with nothing else decoding leaves both
//!   counters flat; but chunked prefill schedules the 1-token probe beside the prefill's
//!   chunks, and a served probe is evidence of life. Unknown progress (no scrape) never
//!   counts;
//! - the reference V6 rule (`skip_when_capacity_waiting`): in case 1, the engine's `/metrics`
//!   is read at once; the failure is not counted while requests wait for KV-cache capacity,
//!   or when that figure cannot be read (the scrape failed, or the value is not a number: the
//!   reference skips then too). An engine that does not export the series at all (vLLM
//!   0.18.0, SGLang) is counted as V5 counts: the rule cannot apply to it, and skipping
//!   would never count an idle failure again. (The reference skips there too, so on vLLM
//!   0.18 it never detects an idle hang; docs/qos.md.)
//!
//! The agent policy (`policy = "agent"`, [`AgentRules`]) adds, in this order:
//! - a failure while the engine's `/health` failed too is not counted: the `/health` grace
//!   decides (a hot reload answers 503 and holds completions);
//! - a failure while the engine reports itself asleep (`vllm:engine_sleep_state`) is not
//!   counted;
//! - a driver fault: a failure while the driver reports a fault at [`CONFIRM_LEVEL`]
//!   (MindCluster's `RestartBusiness`) or worse on one of the engine's NPUs makes the engine
//!   abnormal at once — the driver has explained the failure, there is nothing left to
//!   confirm. A fault alone never does: the loop probes at once when one appears
//!   ([`fault_effect`]), and a probe that succeeds leaves the engine `normal`;
//! - no sign of life (rule 11): a failure on a busy NPU while the engine has shown no sign of
//!   life for `progress_window` — requests running, and not one of its scheduler's figures
//!   (both token counters, the KV-cache usage, the running and waiting counts) moved, and no
//!   virtual request served meanwhile — makes the engine abnormal at once: the failed probe
//!   confirms the quiet, and the quiet the failure. The loop probes as soon as a quiet shows
//!   ([`quiet_probe`]), with a timeout that reaches the window;
//! - fast confirmation: a counted failure makes the engine abnormal from `confirm_failures`
//!   on (instead of `max_failure_count`) when it is confirmed: for an idle failure, the NPU
//!   stayed idle over the whole streak (the ring, not only each probe's window) and the
//!   token counters did not advance since its first failure; a stall-detection failure is
//!   confirmed by the stall itself. The loop re-probes after `confirm_interval` while a
//!   streak is open ([`next_sleep`]).
//!
//! Interval: the busy interval (20 s) after a peak at or above `high_load_threshold` (80),
//! back to the base interval (5 s) only after a peak below the usage threshold; otherwise,
//! and when the peak is unavailable, unchanged.

use super::inputs::CapacityWaiting;
use crate::config::Timing;
use crate::config::policy::RuleSet;
use crate::driver::fault_levels::FaultLevel;
use crate::probe::outcome::{Accounting, ProbeFailure};
use crate::sampler::faults::NpuFault;
use std::time::Duration;

/// The level from which a driver fault confirms a failed probe, and makes the loop probe at
/// once when it appears (agent policy). The accounting's constant: the driver-fault source
/// ([`super::evidence::driver_faults`]) reads it from here.
pub(crate) const CONFIRM_LEVEL: FaultLevel = FaultLevel::RestartBusiness;

/// The accounting rules of one engine.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Rules {
    /// AI Cube peak (percent) below which the NPU is idle. Reference: 3.
    pub npu_usage_threshold: f64,
    /// Counted failures that make the engine abnormal. Reference: 6.
    pub max_failure_count: i64,
    /// Stall detection: count a busy failure once the engine is stalled this long.
    pub stall_window: Option<Duration>,
    /// The V6 rule: do not count an idle failure while requests wait for capacity.
    pub skip_when_capacity_waiting: bool,
    /// The agent policy's rules (`None`: the reference's).
    pub agent: Option<AgentRules>,
}

/// The agent policy's accounting settings (`[engine.agent_policy]`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct AgentRules {
    /// The rules of docs/policy.md it applies (those in `enforce` for the policy in force;
    /// with those in `observe` too for the shadow).
    pub rules: RuleSet,
    /// Confirmed counted failures that make the engine abnormal.
    pub confirm_failures: i64,
    /// Sleep before a confirming re-probe.
    pub confirm_interval: Duration,
    /// Timeout of a re-probe after an idle failure.
    pub confirm_timeout: Duration,
    /// No sign of life for this long on a busy NPU, and a failed probe: abnormal (`None`:
    /// the rule is off).
    pub progress_window: Option<Duration>,
    /// The floor of the learned timeout of a probe to an idle NPU (`None`: off, the request
    /// timeout).
    pub learned_timeout_floor: Option<Duration>,
}

/// Which request of the loop a probe was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    /// The one warm-up request (180 s timeout; no AI Cube reading).
    WarmUp,
    /// A periodic request.
    Periodic,
}

/// What the loop saw for one probe.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Observation {
    pub stage: Stage,
    /// Why the request failed; `None` when it succeeded.
    pub failure: Option<ProbeFailure>,
    /// AI Cube peak of the engine's NPUs over the window; `None` when unavailable.
    pub peak: Option<f64>,
    /// How long the engine has made no progress by its `/metrics` (`None`: not stalled, or
    /// unknown). Read only when stall detection is on.
    pub stalled_for: Option<Duration>,
    /// Agent policy: how long the engine has shown no sign of life with requests running
    /// (read fresh, for a failure on a busy NPU with rule 11 on); `None`: not quiet, or
    /// unknown.
    pub quiet_for: Option<Duration>,
    /// Time since a virtual request was last served.
    pub since_served: Duration,
    /// The V6 read of requests waiting for capacity; `None` when not read
    /// ([`needs_capacity`] said no).
    pub capacity: Option<CapacityWaiting>,
    /// The failure count before this probe.
    pub count: i64,
    /// Agent policy: the engine's `/health` failed while this probe ran.
    pub health_failed: bool,
    /// Agent policy: the engine reported itself asleep when the failure was checked.
    pub asleep: bool,
    /// Agent policy: the NPU stayed below the usage threshold over the whole streak (from
    /// the start of its first failed probe to now); `None` when unknown.
    pub idle_throughout: Option<bool>,
    /// Agent policy: the engine's token counters advanced since the streak's first failure;
    /// `None` when unknown.
    pub tokens_advanced: Option<bool>,
    /// How long the last successful periodic probe took (the engine's own pace when it
    /// answers); `None` before one succeeded.
    pub last_ok_latency: Option<Duration>,
    /// Agent policy: the most severe fault the driver reported on the engine's NPUs when
    /// the failure was checked; `None` when there is none, or the probe succeeded.
    pub driver_fault: Option<NpuFault>,
}

/// What one probe did to the failure count.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Accounted {
    pub accounting: Accounting,
    /// The failure count after this probe.
    pub count: i64,
    /// Set when this probe made the engine abnormal: why.
    pub abnormal: Option<String>,
    /// For a counted failure, what was counted; for a skipped one, why it was skipped.
    pub why: Option<String>,
    /// How long the engine had been stalled, for a failure counted by stall detection.
    pub stalled: Option<Duration>,
}

/// Whether the V6 rule needs a fresh read of requests waiting for capacity for this probe:
/// only for a failure on an idle NPU, with the rule on.
pub(crate) fn needs_capacity(rules: &Rules, failed: bool, peak: Option<f64>) -> bool {
    rules.skip_when_capacity_waiting
        && failed
        && peak.is_some_and(|p| p < rules.npu_usage_threshold)
}

/// Applies the accounting rules to one probe.
pub(crate) fn account(rules: &Rules, obs: &Observation) -> Accounted {
    let keep = |accounting, why: Option<String>| Accounted {
        accounting,
        count: obs.count,
        abnormal: None,
        why,
        stalled: None,
    };
    if obs.stage == Stage::WarmUp {
        // Not counted; a failed warm-up is abnormal at once and the loop never starts.
        return Accounted {
            abnormal: obs
                .failure
                .as_ref()
                .map(|e| format!("warm-up request failed: {e}")),
            ..keep(Accounting::WarmUp, None)
        };
    }
    let failed = obs.failure.is_some();
    let threshold = rules.npu_usage_threshold;
    if failed
        && rules.agent.is_some()
        && let Some(a) = agent_first(rules, obs)
    {
        return a;
    }
    match obs.peak {
        Some(p) if p < threshold && failed => {
            let skip = match &obs.capacity {
                Some(CapacityWaiting::Waiting(w)) if *w > 0.0 => {
                    Some(format!("{w} requests wait for KV-cache capacity"))
                }
                Some(CapacityWaiting::Unknown(why)) => {
                    Some(format!("requests waiting for capacity are unknown ({why})"))
                }
                _ => None,
            };
            match skip {
                Some(why) => keep(Accounting::UnchangedCapacityWaiting, Some(why)),
                None => counted(
                    rules,
                    obs.count,
                    Accounting::Incremented,
                    format!("AI Cube peak {p} below {threshold}"),
                    None,
                    obs.idle_throughout == Some(true) && obs.tokens_advanced != Some(true),
                ),
            }
        }
        None if failed => keep(Accounting::Unchanged, None),
        Some(p) => match stalled(rules, obs, p) {
            Some(s) => counted(
                rules,
                obs.count,
                Accounting::IncrementedStalled,
                format!(
                    "AI Cube peak {p} (busy) but no token advanced for {:.0} s with requests running",
                    s.as_secs_f64()
                ),
                Some(s),
                true,
            ),
            None => reset(),
        },
        None => reset(),
    }
}

/// The agent policy's rules that come before the reference's for a failed probe, in order:
/// `/health` failing, asleep, a driver fault, no sign of life (rule 11). `None`: none applies.
fn agent_first(rules: &Rules, obs: &Observation) -> Option<Accounted> {
    let keep = |accounting, why: &str| Accounted {
        accounting,
        count: obs.count,
        abnormal: None,
        why: Some(why.to_owned()),
        stalled: None,
    };
    let on = |id| rules.agent.is_some_and(|a| a.rules.has(id));
    if obs.health_failed && on(3) {
        return Some(keep(
            Accounting::UnchangedHealthFailing,
            "the engine's /health fails too; its grace decides",
        ));
    }
    if obs.asleep && on(4) {
        return Some(keep(
            Accounting::UnchangedAsleep,
            "the engine is asleep (vllm:engine_sleep_state)",
        ));
    }
    let e = obs.failure.as_ref()?;
    if let Some(f) = &obs.driver_fault
        && f.level >= CONFIRM_LEVEL
        && on(8)
    {
        return Some(Accounted {
            accounting: Accounting::DriverFault,
            count: obs.count + 1,
            abnormal: Some(format!(
                "{}: the driver explains why a virtual request failed: {e}",
                f.describe()
            )),
            why: Some(f.describe()),
            stalled: None,
        });
    }
    let quiet = no_sign_of_life(rules, obs)?;
    let why = format!(
        "no sign of life for {:.1} s: the engine should be working (its NPU busy, AI Cube peak {}), and no token, KV-cache usage, running or waiting count moved",
        quiet.as_secs_f64(),
        obs.peak.unwrap_or_default()
    );
    Some(Accounted {
        accounting: Accounting::NoSignOfLife,
        count: obs.count + 1,
        abnormal: Some(format!("{why}; a virtual request failed: {e}")),
        why: Some(why),
        stalled: Some(quiet),
    })
}

fn reset() -> Accounted {
    Accounted {
        accounting: Accounting::Reset,
        count: 0,
        abnormal: None,
        why: None,
        stalled: None,
    }
}

/// Rule 11: how long a busy, failed probe's engine has shown no sign of life (no virtual
/// request served either), when that reaches `progress_window`.
fn no_sign_of_life(rules: &Rules, obs: &Observation) -> Option<Duration> {
    let window = rules.agent?.progress_window?;
    if obs.failure.is_none() || obs.peak? < rules.npu_usage_threshold {
        return None;
    }
    obs.quiet_for
        .map(|q| q.min(obs.since_served))
        .filter(|q| *q >= window)
}

/// Rule 11: a failure on a busy NPU whose engine is quiet, but not yet for the window: how
/// long until the window is reached.
fn quiet_below_window(rules: &Rules, obs: &Observation) -> Option<Duration> {
    let window = rules.agent?.progress_window?;
    let quiet = obs.quiet_for?;
    (obs.failure.is_some() && quiet < window && obs.peak? >= rules.npu_usage_threshold)
        .then(|| window - quiet)
}

/// Rule 11's probe: when the engine has been quiet for `quiet` with the rule on, the timeout
/// of a probe sent now — long enough to reach the window (a failure before it would prove
/// nothing), at least the quick probe's. `None`: the rule is off.
pub(crate) fn quiet_probe(
    agent: &AgentRules,
    timing: &Timing,
    quiet: Duration,
    last_ok: Option<Duration>,
) -> Option<Duration> {
    let window = agent.progress_window?;
    Some(confirm_timeout(agent, timing, last_ok).max(window.saturating_sub(quiet)))
}

/// Rule 12: the timeout of a periodic probe to an idle NPU, learned from the engine's own
/// answers: ten times the slowest of `recent` (the last successful probes), at least
/// `learned_timeout_floor`, at most the request timeout. `None` (the request timeout): the
/// rule is off, or no answer has been seen yet.
pub(crate) fn learned_timeout(
    agent: &AgentRules,
    timing: &Timing,
    recent: &[Duration],
) -> Option<Duration> {
    let floor = agent.learned_timeout_floor?;
    let slowest = recent.iter().max()?;
    Some(
        slowest
            .saturating_mul(LEARNED_FACTOR)
            .max(floor)
            .min(timing.request_timeout),
    )
}

/// How many times the slowest recent answer a learned timeout waits (rule 12).
pub(crate) const LEARNED_FACTOR: u32 = 10;
/// How many recent answers a learned timeout remembers (rule 12).
pub(crate) const LEARNED_ANSWERS: usize = 8;

/// The timeout of the next periodic probe: `planned` (the request timeout, or a confirming
/// probe's), except that a regular probe to an idle NPU takes the learned timeout
/// ([`learned_timeout`]) under the agent policy.
pub(crate) fn probe_timeout(
    rules: &Rules,
    timing: &Timing,
    planned: Duration,
    idle_now: bool,
    recent: &[Duration],
) -> Duration {
    match rules.agent {
        Some(a) if idle_now && planned == timing.request_timeout => {
            learned_timeout(&a, timing, recent).unwrap_or(planned)
        }
        _ => planned,
    }
}

/// Rule 12: whether a request sent with `timeout` goes on waiting for its answer after that
/// timeout passes, until the request timeout: under the agent policy, whenever `timeout` is
/// shorter (the learned one, or a quick probe's). The shorter timeout decides when the loop
/// counts the failure and confirms; an answer within the request timeout is still an answer.
pub(crate) fn keeps_waiting(rules: &Rules, timing: &Timing, timeout: Duration) -> bool {
    rules.agent.is_some() && timeout < timing.request_timeout
}

/// Rule 12: the timeout of a probe sent while an earlier request still waits for its answer
/// for `pending_left` ([`keeps_waiting`]): at least that long, so the failure this probe may
/// confirm is never decided while the first request could still answer.
pub(crate) fn reaching_pending(planned: Duration, pending_left: Option<Duration>) -> Duration {
    pending_left.map_or(planned, |left| planned.max(left))
}

/// Stall detection: how long a busy, failed probe's engine has shown no sign of life, when
/// that reaches the window; the stall ends at the last served probe.
fn stalled(rules: &Rules, obs: &Observation, peak: f64) -> Option<Duration> {
    let window = rules.stall_window?;
    if obs.failure.is_none() || peak < rules.npu_usage_threshold {
        return None;
    }
    obs.stalled_for
        .map(|s| s.min(obs.since_served))
        .filter(|s| *s >= window)
}

/// One more counted failure; abnormal at `max_failure_count`, or under the agent policy at
/// `confirm_failures` when the failure is `confirmed`.
fn counted(
    rules: &Rules,
    before: i64,
    accounting: Accounting,
    why: String,
    stalled: Option<Duration>,
    confirmed: bool,
) -> Accounted {
    let count = before + 1;
    let fast = rules.agent.is_some_and(|a| {
        a.rules.has(5)
            && confirmed
            && count >= a.confirm_failures
            && count < rules.max_failure_count
    });
    Accounted {
        accounting,
        count,
        abnormal: if fast {
            Some(format!(
                "{count} consecutive virtual requests failed and were counted, confirmed (last: {why}{})",
                if stalled.is_some() {
                    ""
                } else {
                    "; the NPU stayed idle and no token advanced since the first"
                }
            ))
        } else {
            (count >= rules.max_failure_count).then(|| {
                format!(
                    "{count} consecutive virtual requests failed and were counted (last: {why})"
                )
            })
        },
        why: Some(why),
        stalled,
    }
}

/// The agent policy's sleep and timeout for the next probe, after `a`: a counted failure
/// opens (or continues) a streak, confirmed by a re-probe after `confirm_interval` — with
/// `confirm_timeout` after an idle failure, the request timeout after a stalled one. `None`:
/// the reference's interval and timeout.
///
/// A failure on a busy NPU whose engine is stalled (but not yet for `stall_window`) waits the
/// base interval, not the busy one: a busy NPU that produces nothing is no load to spare.
pub(crate) fn next_sleep(
    rules: &Rules,
    timing: &Timing,
    obs: &Observation,
    a: &Accounted,
) -> Option<(Duration, Option<Duration>)> {
    let agent = rules.agent?;
    match a.accounting {
        // Rule 5's re-probe.
        Accounting::Incremented | Accounting::IncrementedStalled if !agent.rules.has(5) => None,
        Accounting::Incremented => Some((
            agent.confirm_interval,
            Some(confirm_timeout(&agent, timing, obs.last_ok_latency)),
        )),
        Accounting::IncrementedStalled => Some((agent.confirm_interval, None)),
        // Rule 11: quiet, but not yet for the window: probe again when it is reached.
        Accounting::Reset | Accounting::Unchanged if quiet_below_window(rules, obs).is_some() => {
            Some((
                quiet_below_window(rules, obs).unwrap_or_default(),
                Some(confirm_timeout(&agent, timing, obs.last_ok_latency)),
            ))
        }
        // Stall detection in force (the shadow may have read the stall when it is not).
        Accounting::Reset
            if obs.failure.is_some()
                && obs.stalled_for.is_some()
                && rules.stall_window.is_some() =>
        {
            Some((timing.interval, None))
        }
        _ => None,
    }
}

/// What the loop does after a probe: how long it sleeps, the next probe's timeout, and
/// whether it sleeps the busy cadence (which the agent policy cuts short when the NPU falls
/// idle).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NextProbe {
    pub sleep: Duration,
    pub timeout: Duration,
    pub busy: bool,
}

/// After a probe: a confirming or re-arming sleep ([`next_sleep`]), else the cadence's, with
/// the request timeout unless the confirming one applies.
pub(crate) fn next_probe(
    rules: &Rules,
    timing: &Timing,
    obs: &Observation,
    a: &Accounted,
    cadence: Cadence,
) -> NextProbe {
    match next_sleep(rules, timing, obs, a) {
        Some((sleep, timeout)) => NextProbe {
            sleep,
            timeout: timeout.unwrap_or(timing.request_timeout),
            busy: false,
        },
        None => NextProbe {
            sleep: cadence.interval(timing),
            timeout: timing.request_timeout,
            busy: cadence == Cadence::Busy,
        },
    }
}

/// An open streak of counted failures (agent policy): when its first probe started, and the
/// engine's token counters then.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Streak<I> {
    pub since: I,
    pub tokens: Option<f64>,
}

/// The streak after a probe that left the count at `count`: closed at 0, else the open one
/// kept, else one opened by this probe (started at `started`, with `tokens`).
pub(crate) fn next_streak<I>(
    count: i64,
    open: Option<Streak<I>>,
    started: I,
    tokens: Option<f64>,
) -> Option<Streak<I>> {
    match (count, open) {
        (0, _) => None,
        (_, Some(open)) => Some(open),
        (_, None) => Some(Streak {
            since: started,
            tokens,
        }),
    }
}

/// The timeout of a quick probe on an idle NPU (a confirming re-probe, or the probe when a
/// busy NPU falls idle): `confirm_timeout`, or twice the engine's last successful answer
/// when that was slower (a degraded engine that still answers must not time out for being
/// slow), at most the request timeout.
pub(crate) fn confirm_timeout(
    agent: &AgentRules,
    timing: &Timing,
    last_ok: Option<Duration>,
) -> Duration {
    agent
        .confirm_timeout
        .max(last_ok.map_or(Duration::ZERO, |l| l.saturating_mul(2)))
        .min(timing.request_timeout.max(agent.confirm_timeout))
}

/// The periodic probes' cadence: `interval` (the reference's 5 s), or `high_load_interval`
/// (20 s) while the NPU is busy. A state of its own, not read back from the sleep: the two
/// intervals may be configured equal, and a confirming re-probe sleeps yet another time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cadence {
    Regular,
    Busy,
}

impl Cadence {
    /// The sleep between periodic probes at this cadence.
    pub(crate) fn interval(self, timing: &Timing) -> Duration {
        match self {
            Cadence::Regular => timing.interval,
            Cadence::Busy => timing.high_load_interval,
        }
    }
}

/// The cadence after a probe whose window peak was `peak`: busy at or above
/// `high_load_threshold`, regular below the usage threshold, else unchanged.
pub(crate) fn next_cadence(
    timing: &Timing,
    npu_usage_threshold: f64,
    current: Cadence,
    peak: Option<f64>,
) -> Cadence {
    match peak {
        Some(p) if p >= timing.high_load_threshold => Cadence::Busy,
        Some(p) if p < npu_usage_threshold => Cadence::Regular,
        _ => current,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::fault_levels::FaultLevel;
    use crate::monitor::evidence::driver_faults::{FaultEffect, fault_effect, worst};

    const S: fn(u64) -> Duration = Duration::from_secs;

    fn v5() -> Rules {
        Rules {
            npu_usage_threshold: 3.0,
            max_failure_count: 6,
            stall_window: None,
            skip_when_capacity_waiting: false,
            agent: None,
        }
    }
    fn agent() -> Rules {
        Rules {
            stall_window: Some(S(30)),
            agent: Some(AgentRules {
                rules: (1..=12).fold(RuleSet::NONE, RuleSet::with),
                confirm_failures: 2,
                confirm_interval: S(1),
                confirm_timeout: S(2),
                progress_window: Some(S(8)),
                learned_timeout_floor: Some(Duration::from_millis(500)),
            }),
            ..v5()
        }
    }
    fn stall() -> Rules {
        Rules {
            stall_window: Some(S(60)),
            ..v5()
        }
    }
    fn v6() -> Rules {
        Rules {
            skip_when_capacity_waiting: true,
            ..v5()
        }
    }

    /// A periodic probe: failed or not, at `peak`, with the count before it.
    fn probe(failed: bool, peak: Option<f64>, count: i64) -> Observation {
        Observation {
            stage: Stage::Periodic,
            failure: failed.then_some(ProbeFailure::Timeout(S(5))),
            peak,
            stalled_for: None,
            quiet_for: None,
            since_served: S(3600),
            capacity: None,
            count,
            health_failed: false,
            asleep: false,
            idle_throughout: None,
            tokens_advanced: None,
            last_ok_latency: None,
            driver_fault: None,
        }
    }
    fn stalled_for(o: Observation, stalled: Option<u64>, since_served: u64) -> Observation {
        Observation {
            stalled_for: stalled.map(S),
            since_served: S(since_served),
            ..o
        }
    }
    fn capacity(o: Observation, c: CapacityWaiting) -> Observation {
        Observation {
            capacity: Some(c),
            ..o
        }
    }

    use Accounting::*;

    // Every rule of the reference and of the two options, one row each: (what, rules,
    // observation) → (accounting, count after, abnormal).
    #[test]
    fn accounting_table() {
        let waiting = |w| CapacityWaiting::Waiting(w);
        let unknown = || CapacityWaiting::Unknown("scrape failed".into());
        let rows: Vec<(&str, Rules, Observation, Accounting, i64, bool)> = vec![
            // V5 rule 1: idle failure counts; abnormal at max.
            (
                "idle failure counts",
                v5(),
                probe(true, Some(0.0), 0),
                Incremented,
                1,
                false,
            ),
            (
                "idle failure below the threshold",
                v5(),
                probe(true, Some(2.9), 2),
                Incremented,
                3,
                false,
            ),
            (
                "the sixth idle failure is abnormal",
                v5(),
                probe(true, Some(0.0), 5),
                Incremented,
                6,
                true,
            ),
            (
                "max 1: the first idle failure is abnormal",
                Rules {
                    max_failure_count: 1,
                    ..v5()
                },
                probe(true, Some(0.0), 0),
                Incremented,
                1,
                true,
            ),
            // V5 rule 2: usage unavailable leaves the count as it was.
            (
                "failure with usage unavailable",
                v5(),
                probe(true, None, 4),
                Unchanged,
                4,
                false,
            ),
            // V5 rule 3: success, or a busy NPU, resets.
            (
                "success while idle resets",
                v5(),
                probe(false, Some(0.0), 5),
                Reset,
                0,
                false,
            ),
            (
                "success with usage unavailable resets",
                v5(),
                probe(false, None, 5),
                Reset,
                0,
                false,
            ),
            (
                "busy failure resets",
                v5(),
                probe(true, Some(95.0), 5),
                Reset,
                0,
                false,
            ),
            (
                "a failure at the threshold is busy",
                v5(),
                probe(true, Some(3.0), 5),
                Reset,
                0,
                false,
            ),
            // Stall detection.
            (
                "stall off: a stalled busy failure still resets",
                v5(),
                stalled_for(probe(true, Some(95.0), 2), Some(600), 600),
                Reset,
                0,
                false,
            ),
            (
                "stalled for the window, nothing served: counts",
                stall(),
                stalled_for(probe(true, Some(95.0), 2), Some(60), 600),
                IncrementedStalled,
                3,
                false,
            ),
            (
                "stalled: abnormal at max",
                stall(),
                stalled_for(probe(true, Some(95.0), 5), Some(600), 600),
                IncrementedStalled,
                6,
                true,
            ),
            (
                "stalled, but a probe was served within the window",
                stall(),
                stalled_for(probe(true, Some(95.0), 2), Some(600), 59),
                Reset,
                0,
                false,
            ),
            (
                "stalled for less than the window",
                stall(),
                stalled_for(probe(true, Some(95.0), 2), Some(59), 600),
                Reset,
                0,
                false,
            ),
            (
                "progress unknown never counts",
                stall(),
                stalled_for(probe(true, Some(95.0), 2), None, 600),
                Reset,
                0,
                false,
            ),
            (
                "a served probe on a stalled engine resets",
                stall(),
                stalled_for(probe(false, Some(95.0), 2), Some(600), 600),
                Reset,
                0,
                false,
            ),
            (
                "stall on: an idle failure counts as V5",
                stall(),
                stalled_for(probe(true, Some(0.0), 2), Some(600), 600),
                Incremented,
                3,
                false,
            ),
            (
                "stall on: usage unavailable is unchanged",
                stall(),
                stalled_for(probe(true, None, 2), Some(600), 600),
                Unchanged,
                2,
                false,
            ),
            // The V6 capacity rule.
            (
                "V6: requests wait for capacity, skipped",
                v6(),
                capacity(probe(true, Some(0.0), 2), waiting(2.0)),
                UnchangedCapacityWaiting,
                2,
                false,
            ),
            (
                "V6: the figure unknown, skipped",
                v6(),
                capacity(probe(true, Some(0.0), 2), unknown()),
                UnchangedCapacityWaiting,
                2,
                false,
            ),
            (
                "V6: nothing waits, counted",
                v6(),
                capacity(probe(true, Some(0.0), 2), waiting(0.0)),
                Incremented,
                3,
                false,
            ),
            (
                "V6: not exported (vLLM 0.18), counted as V5",
                v6(),
                capacity(probe(true, Some(0.0), 5), CapacityWaiting::NotExported),
                Incremented,
                6,
                true,
            ),
            (
                "V6: usage unavailable is unchanged",
                v6(),
                probe(true, None, 2),
                Unchanged,
                2,
                false,
            ),
            (
                "V6: a busy failure resets",
                v6(),
                probe(true, Some(95.0), 2),
                Reset,
                0,
                false,
            ),
        ];
        for (what, rules, obs, accounting, count, abnormal) in rows {
            let a = account(&rules, &obs);
            assert_eq!(
                (a.accounting, a.count, a.abnormal.is_some()),
                (accounting, count, abnormal),
                "{what}: {a:?}"
            );
            assert_eq!(
                a.stalled.is_some(),
                accounting == IncrementedStalled,
                "{what}: the stall is reported with the stall rule only"
            );
        }
    }

    // The agent policy's rules, one row each (docs/policy.md names the scenario behind each):
    // (what, observation) → (accounting, count after, abnormal).
    #[test]
    fn agent_policy_table() {
        let with = |o: Observation, f: &dyn Fn(&mut Observation)| {
            let mut o = o;
            f(&mut o);
            o
        };
        let idle = |count| probe(true, Some(0.0), count);
        let rows: Vec<(&str, Observation, Accounting, i64, bool)> = vec![
            (
                "hot reload: /health failed beside the probe → not counted",
                with(idle(1), &|o| o.health_failed = true),
                UnchangedHealthFailing,
                1,
                false,
            ),
            (
                "sleep: the engine is asleep → not counted",
                with(idle(1), &|o| o.asleep = true),
                UnchangedAsleep,
                1,
                false,
            ),
            (
                "a success while /health fails still resets",
                with(probe(false, Some(0.0), 1), &|o| o.health_failed = true),
                Reset,
                0,
                false,
            ),
            (
                "hang: the first idle failure opens a streak",
                with(idle(0), &|o| o.idle_throughout = Some(true)),
                Incremented,
                1,
                false,
            ),
            (
                "hang: the re-probe fails, idle throughout, no token → abnormal at 2",
                with(idle(1), &|o| {
                    o.idle_throughout = Some(true);
                    o.tokens_advanced = Some(false);
                }),
                Incremented,
                2,
                true,
            ),
            (
                "counters unknown do not block the confirmation",
                with(idle(1), &|o| o.idle_throughout = Some(true)),
                Incremented,
                2,
                true,
            ),
            (
                "the NPU worked between the two failures → counted, not confirmed",
                with(idle(1), &|o| o.idle_throughout = Some(false)),
                Incremented,
                2,
                false,
            ),
            (
                "ring unknown over the streak → counted, not confirmed",
                idle(1),
                Incremented,
                2,
                false,
            ),
            (
                "tokens advanced since the first failure → counted, not confirmed",
                with(idle(1), &|o| {
                    o.idle_throughout = Some(true);
                    o.tokens_advanced = Some(true);
                }),
                Incremented,
                2,
                false,
            ),
            (
                "unconfirmed failures still reach the reference's maximum",
                idle(5),
                Incremented,
                6,
                true,
            ),
            (
                "busy but stuck: a stalled failure is confirmed by the stall → abnormal at 2",
                stalled_for(probe(true, Some(95.0), 1), Some(31), 31),
                IncrementedStalled,
                2,
                true,
            ),
            (
                "busy and stalled below the window → reset, as without the policy",
                stalled_for(probe(true, Some(95.0), 0), Some(20), 20),
                Reset,
                0,
                false,
            ),
            (
                "a SeparateNPU fault explains a failure on a busy NPU → abnormal at once",
                with(probe(true, Some(95.0), 0), &|o| {
                    o.driver_fault = Some(fault(FaultLevel::SeparateNPU))
                }),
                DriverFault,
                1,
                true,
            ),
            (
                "a RestartBusiness fault explains an idle failure → abnormal at once",
                with(idle(0), &|o| {
                    o.driver_fault = Some(fault(FaultLevel::RestartBusiness))
                }),
                DriverFault,
                1,
                true,
            ),
            (
                "a fault with usage unavailable still explains the failure",
                with(probe(true, None, 0), &|o| {
                    o.driver_fault = Some(fault(FaultLevel::RestartNPU))
                }),
                DriverFault,
                1,
                true,
            ),
            (
                "a RestartRequest fault is below the level: counted as without it",
                with(idle(0), &|o| {
                    o.driver_fault = Some(fault(FaultLevel::RestartRequest))
                }),
                Incremented,
                1,
                false,
            ),
            (
                "a SubHealthFault on a busy NPU: reset as without it",
                with(probe(true, Some(95.0), 0), &|o| {
                    o.driver_fault = Some(fault(FaultLevel::SubHealthFault))
                }),
                Reset,
                0,
                false,
            ),
            (
                "a fault and a success: reset, the engine stays normal",
                with(probe(false, Some(0.0), 1), &|o| {
                    o.driver_fault = Some(fault(FaultLevel::SeparateNPU))
                }),
                Reset,
                0,
                false,
            ),
            // Rule 11: no sign of life.
            (
                "busy but stuck: quiet for the window, the probe failed → abnormal at once",
                with(probe(true, Some(95.0), 0), &|o| {
                    o.quiet_for = Some(S(8));
                    o.since_served = S(30);
                }),
                NoSignOfLife,
                1,
                true,
            ),
            (
                "quiet below the window → reset, as without the rule",
                with(probe(true, Some(95.0), 0), &|o| {
                    o.quiet_for = Some(S(7));
                    o.since_served = S(30);
                }),
                Reset,
                0,
                false,
            ),
            (
                "a probe served during the quiet is a sign of life",
                with(probe(true, Some(95.0), 0), &|o| {
                    o.quiet_for = Some(S(20));
                    o.since_served = S(5);
                }),
                Reset,
                0,
                false,
            ),
            (
                "quiet on an idle NPU: the idle rules decide",
                with(idle(0), &|o| o.quiet_for = Some(S(20))),
                Incremented,
                1,
                false,
            ),
            (
                "quiet during a hot reload: /health's grace decides",
                with(probe(true, Some(95.0), 0), &|o| {
                    o.quiet_for = Some(S(20));
                    o.health_failed = true;
                }),
                UnchangedHealthFailing,
                0,
                false,
            ),
            (
                "quiet while asleep: not counted",
                with(probe(true, Some(95.0), 0), &|o| {
                    o.quiet_for = Some(S(20));
                    o.asleep = true;
                }),
                UnchangedAsleep,
                0,
                false,
            ),
            (
                "quiet with usage unavailable: unchanged",
                with(probe(true, None, 0), &|o| o.quiet_for = Some(S(20))),
                Unchanged,
                0,
                false,
            ),
            (
                "a fault during a hot reload: /health's grace still decides",
                with(idle(0), &|o| {
                    o.health_failed = true;
                    o.driver_fault = Some(fault(FaultLevel::SeparateNPU));
                }),
                UnchangedHealthFailing,
                0,
                false,
            ),
        ];
        for (what, obs, accounting, count, abnormal) in rows {
            let a = account(&agent(), &obs);
            assert_eq!(
                (a.accounting, a.count, a.abnormal.is_some()),
                (accounting, count, abnormal),
                "{what}: {a:?}"
            );
        }
        // The same observations under the reference: none of the agent's rules apply.
        let a = account(&v5(), &with(idle(1), &|o| o.health_failed = true));
        assert_eq!((a.accounting, a.count), (Incremented, 2));
        let a = account(&v5(), &with(idle(1), &|o| o.asleep = true));
        assert_eq!((a.accounting, a.count), (Incremented, 2));
        let a = account(
            &v5(),
            &with(idle(1), &|o| {
                o.idle_throughout = Some(true);
                o.tokens_advanced = Some(false);
            }),
        );
        assert_eq!((a.count, a.abnormal), (2, None));
        let a = account(
            &v5(),
            &with(probe(true, Some(95.0), 0), &|o| {
                o.driver_fault = Some(fault(FaultLevel::SeparateNPU))
            }),
        );
        assert_eq!(
            (a.accounting, a.count, a.abnormal),
            (Reset, 0, None),
            "MindIE V5 has no driver-fault rule"
        );
        let quiet = with(probe(true, Some(95.0), 0), &|o| o.quiet_for = Some(S(60)));
        let a = account(&v5(), &quiet);
        assert_eq!(
            (a.accounting, a.count),
            (Reset, 0),
            "MindIE V5 has no rule 11"
        );
        let off = Rules {
            agent: agent().agent.map(|a| AgentRules {
                progress_window: None,
                ..a
            }),
            ..agent()
        };
        let a = account(&off, &quiet);
        assert_eq!(
            (a.accounting, a.count),
            (Reset, 0),
            "progress_window = 0s: off"
        );
        let why = account(&agent(), &quiet).abnormal.unwrap();
        assert!(
            why.contains("no sign of life for 60.0 s") && why.contains("KV-cache"),
            "the reason says what stayed still and for how long: {why}"
        );
        assert!(
            why.ends_with("; a virtual request failed: timed out after 5s"),
            "the probe's own error comes last (issue 48): {why}"
        );
        let a = account(
            &agent(),
            &with(idle(0), &|o| {
                o.driver_fault = Some(fault(FaultLevel::SeparateNPU))
            }),
        );
        let why = a.abnormal.unwrap();
        assert!(
            why.contains("0x80E18402") && why.contains("HBM rows") && why.contains("SeparateNPU"),
            "the reason names the code, its text and its level: {why}"
        );
        assert!(
            why.ends_with("a virtual request failed: timed out after 5s"),
            "the probe's own error comes last (issue 48): {why}"
        );
    }

    fn fault(level: FaultLevel) -> NpuFault {
        NpuFault {
            npu: 0,
            code: 0x80E1_8402,
            hex: "0x80E18402".into(),
            text: Some("HBM rows".into()),
            level,
        }
    }

    // What each level does under each policy, and the worst of several.
    #[test]
    fn fault_effects() {
        use FaultLevel::*;
        for (level, agent_effect) in [
            (Unclassified, FaultEffect::Published),
            (NotHandleFault, FaultEffect::Published),
            (SubHealthFault, FaultEffect::LowersQos),
            (RestartRequest, FaultEffect::Published),
            (RestartBusiness, FaultEffect::Confirms),
            (FreeRestartNPU, FaultEffect::Confirms),
            (RestartNPU, FaultEffect::Confirms),
            (PreSeparateNPU, FaultEffect::Confirms),
            (SeparateNPU, FaultEffect::Confirms),
        ] {
            assert_eq!(fault_effect(true, level), agent_effect, "{level}");
            assert_eq!(
                fault_effect(false, level),
                FaultEffect::Published,
                "{level}"
            );
        }
        let fs = [
            fault(SubHealthFault),
            fault(RestartNPU),
            fault(NotHandleFault),
        ];
        assert_eq!(worst(&fs).map(|f| f.level), Some(RestartNPU));
        assert_eq!(worst(&[]), None);
    }

    // The agent policy re-probes quickly while a streak is open; the reference never does.
    #[test]
    fn agent_policy_sleeps() {
        let t = Timing::default();
        let rules = agent();
        let run = |rules: &Rules, obs: Observation| {
            let a = account(rules, &obs);
            next_sleep(rules, &t, &obs, &a)
        };
        assert_eq!(
            run(&rules, probe(true, Some(0.0), 0)),
            Some((S(1), Some(S(2))))
        );
        assert_eq!(
            run(
                &rules,
                stalled_for(probe(true, Some(95.0), 0), Some(40), 40)
            ),
            Some((S(1), None))
        );
        assert_eq!(
            run(
                &rules,
                stalled_for(probe(true, Some(95.0), 0), Some(10), 10)
            ),
            Some((t.interval, None)),
            "stalled below the window: the base interval, not the busy one"
        );
        assert_eq!(run(&rules, probe(false, Some(0.0), 0)), None);
        assert_eq!(run(&rules, probe(true, None, 0)), None);
        assert_eq!(run(&v5(), probe(true, Some(0.0), 0)), None);
        let mut quiet = probe(true, Some(95.0), 0);
        quiet.quiet_for = Some(S(5));
        assert_eq!(
            run(&rules, quiet),
            Some((S(3), Some(S(2)))),
            "quiet below the window: probe again when the window is reached"
        );
    }

    // Rule 11's probe reaches the window; rule 12's timeout is learned from the engine's
    // answers, within its floor and the request timeout, and only for a regular probe to an
    // idle NPU.
    #[test]
    fn quiet_and_learned_timeouts() {
        let t = Timing::default();
        let a = agent().agent.unwrap();
        let ms = Duration::from_millis;
        assert_eq!(quiet_probe(&a, &t, S(5), None), Some(S(3)), "to the window");
        assert_eq!(
            quiet_probe(&a, &t, S(7), None),
            Some(S(2)),
            "the quick probe's floor"
        );
        assert_eq!(
            quiet_probe(&a, &t, S(7), Some(S(2))),
            Some(S(4)),
            "twice the engine's known pace"
        );
        let off = AgentRules {
            progress_window: None,
            learned_timeout_floor: None,
            ..a
        };
        assert_eq!(quiet_probe(&off, &t, S(5), None), None);
        let rows: [(&str, &[Duration], Option<Duration>); 5] = [
            ("no answer yet: the request timeout", &[], None),
            (
                "tens of milliseconds: the floor",
                &[ms(20), ms(40)],
                Some(ms(500)),
            ),
            (
                "ten times the slowest",
                &[ms(20), ms(120), ms(60)],
                Some(ms(1200)),
            ),
            (
                "at most the request timeout",
                &[ms(900)],
                Some(t.request_timeout),
            ),
            ("one slow answer counts", &[ms(10), ms(300)], Some(S(3))),
        ];
        for (what, recent, want) in rows {
            assert_eq!(learned_timeout(&a, &t, recent), want, "{what}");
        }
        assert_eq!(learned_timeout(&off, &t, &[ms(20)]), None, "off");
        let rules = agent();
        let recent = [ms(20)];
        assert_eq!(
            probe_timeout(&rules, &t, t.request_timeout, true, &recent),
            ms(500)
        );
        assert_eq!(
            probe_timeout(&rules, &t, t.request_timeout, false, &recent),
            t.request_timeout,
            "a busy NPU: the request timeout"
        );
        assert_eq!(
            probe_timeout(&rules, &t, S(2), true, &recent),
            S(2),
            "a confirming probe keeps its own"
        );
        assert_eq!(
            probe_timeout(&v5(), &t, t.request_timeout, true, &recent),
            t.request_timeout,
            "the reference: 5 s"
        );
    }

    // Issue 48, R2: under the agent policy a timeout shorter than the request timeout ends the
    // wait, not the request (it may still answer until the request timeout); the next probe
    // waits at least until then. The reference never shortens a timeout.
    #[test]
    fn a_shorter_timeout_ends_the_wait_not_the_request() {
        let t = Timing::default();
        let ms = Duration::from_millis;
        for (what, rules, timeout, keeps) in [
            ("agent, learned 500 ms", agent(), ms(500), true),
            ("agent, quick 2 s", agent(), S(2), true),
            ("agent, the request timeout", agent(), S(5), false),
            ("agent, rule 11's probe past it", agent(), S(8), false),
            ("reference", v5(), S(5), false),
        ] {
            assert_eq!(keeps_waiting(&rules, &t, timeout), keeps, "{what}");
        }
        for (what, planned, left, want) in [
            ("nothing pending", S(2), None, S(2)),
            (
                "the re-probe 1.5 s after a learned failure",
                S(2),
                Some(ms(3500)),
                ms(3500),
            ),
            (
                "the re-probe outlasts what is left",
                S(2),
                Some(ms(1000)),
                S(2),
            ),
            ("a pending request at its end", S(5), Some(S(0)), S(5)),
        ] {
            assert_eq!(reaching_pending(planned, left), want, "{what}");
        }
    }

    // After a probe: the confirming sleep and timeout while a streak is open, else the
    // cadence's interval with the request timeout; only the busy cadence's sleep is `busy`.
    #[test]
    fn next_probe_table() {
        let t = Timing::default();
        let rows: Vec<(&str, Rules, Observation, Cadence, NextProbe)> = vec![
            (
                "reference, idle success",
                v5(),
                probe(false, Some(0.0), 0),
                Cadence::Regular,
                NextProbe {
                    sleep: t.interval,
                    timeout: t.request_timeout,
                    busy: false,
                },
            ),
            (
                "reference, busy cadence",
                v5(),
                probe(false, Some(95.0), 0),
                Cadence::Busy,
                NextProbe {
                    sleep: t.high_load_interval,
                    timeout: t.request_timeout,
                    busy: true,
                },
            ),
            (
                "reference, idle failure: no confirming probe",
                v5(),
                probe(true, Some(0.0), 0),
                Cadence::Regular,
                NextProbe {
                    sleep: t.interval,
                    timeout: t.request_timeout,
                    busy: false,
                },
            ),
            (
                "agent, idle failure: confirm quickly",
                agent(),
                probe(true, Some(0.0), 0),
                Cadence::Regular,
                NextProbe {
                    sleep: S(1),
                    timeout: S(2),
                    busy: false,
                },
            ),
            (
                "agent, stalled busy failure: confirm with the request timeout",
                agent(),
                stalled_for(probe(true, Some(95.0), 0), Some(40), 40),
                Cadence::Busy,
                NextProbe {
                    sleep: S(1),
                    timeout: t.request_timeout,
                    busy: false,
                },
            ),
            (
                "agent, busy success",
                agent(),
                probe(false, Some(95.0), 0),
                Cadence::Busy,
                NextProbe {
                    sleep: t.high_load_interval,
                    timeout: t.request_timeout,
                    busy: true,
                },
            ),
        ];
        for (what, rules, obs, cadence, want) in rows {
            let a = account(&rules, &obs);
            assert_eq!(next_probe(&rules, &t, &obs, &a, cadence), want, "{what}");
        }
    }

    // A streak opens at the first counted failure, keeps its start while the count stays
    // above 0, and closes at 0.
    #[test]
    fn streak_table() {
        let open = Some(Streak {
            since: 1u32,
            tokens: Some(10.0),
        });
        let opened = Some(Streak {
            since: 2u32,
            tokens: Some(20.0),
        });
        for (count, before, want) in [
            (0, None, None),
            (0, open, None),
            (1, None, opened),
            (3, open, open),
        ] {
            assert_eq!(
                next_streak(count, before, 2u32, Some(20.0)),
                want,
                "{count} {before:?}"
            );
        }
    }

    // The warm-up is never counted; a failed one is abnormal at once, whatever the count
    // and the usage.
    #[test]
    fn warm_up_table() {
        for (failed, abnormal) in [(false, false), (true, true)] {
            let obs = Observation {
                stage: Stage::WarmUp,
                ..probe(failed, Some(0.0), 0)
            };
            let a = account(&v5(), &obs);
            assert_eq!((a.accounting, a.count), (WarmUp, 0));
            assert_eq!(a.abnormal.is_some(), abnormal, "{a:?}");
        }
        let a = account(
            &v5(),
            &Observation {
                stage: Stage::WarmUp,
                ..probe(true, None, 0)
            },
        );
        assert_eq!(
            a.abnormal.as_deref(),
            Some("warm-up request failed: timed out after 5s")
        );
    }

    // What a counted failure says: the peak and threshold for an idle one, the stall for a
    // stalled one; abnormal names the count and the last counted failure.
    #[test]
    fn counted_failures_say_why() {
        let a = account(&v5(), &probe(true, Some(1.5), 5));
        assert_eq!(a.why.as_deref(), Some("AI Cube peak 1.5 below 3"));
        assert_eq!(
            a.abnormal.as_deref(),
            Some(
                "6 consecutive virtual requests failed and were counted (last: AI Cube peak 1.5 below 3)"
            )
        );
        let a = account(
            &stall(),
            &stalled_for(probe(true, Some(95.0), 0), Some(90), 75),
        );
        assert_eq!(
            a.stalled,
            Some(S(75)),
            "the stall ends at the last served probe"
        );
        assert!(a.why.unwrap().contains("no token advanced for 75 s"));
        let a = account(
            &v6(),
            &capacity(probe(true, Some(0.0), 0), CapacityWaiting::Waiting(2.0)),
        );
        assert_eq!(
            a.why.as_deref(),
            Some("2 requests wait for KV-cache capacity")
        );
    }

    // The capacity figure is read only for an idle failure with the rule on.
    #[test]
    fn capacity_is_read_only_for_an_idle_failure_under_v6() {
        let rows = [
            (v6(), true, Some(0.0), true),
            (v6(), true, Some(3.0), false),
            (v6(), true, None, false),
            (v6(), false, Some(0.0), false),
            (v5(), true, Some(0.0), false),
        ];
        for (rules, failed, peak, want) in rows {
            assert_eq!(
                needs_capacity(&rules, failed, peak),
                want,
                "{failed} {peak:?}"
            );
        }
    }

    // The cadence: busy (20 s) at or above 80, regular (5 s) below the usage threshold,
    // else unchanged.
    #[test]
    fn cadence_table() {
        use Cadence::{Busy, Regular};
        let t = Timing::default();
        let rows = [
            (Regular, Some(85.0), Busy),
            (Regular, Some(80.0), Busy),
            (Regular, Some(50.0), Regular),
            (Busy, Some(50.0), Busy),
            (Busy, Some(2.9), Regular),
            (Busy, Some(3.0), Busy),
            (Busy, None, Busy),
            (Regular, None, Regular),
        ];
        for (current, peak, want) in rows {
            assert_eq!(
                next_cadence(&t, 3.0, current, peak),
                want,
                "{current:?} {peak:?}"
            );
        }
        assert_eq!((Regular.interval(&t), Busy.interval(&t)), (S(5), S(20)));
    }
}

//! Virtual inference (virtual-inference-reference §1.4–§1.5): the warm-up request, then a
//! periodic request and its accounting, as a loop of explicit states ([`step`]). The loop does
//! the I/O, gathers what it saw, and hands it to the pure rules
//! ([`crate::monitor::account`]); it holds no policy of its own. Rules 5, 6 and 12 of
//! docs/policy.md are its own; the accounting reads the other sources' evidence too.
//!
//! After each periodic request the AI Cube peak of the last 5 s is read from the ring,
//! instantly, instead of the reference's 4 `npu-smi` spawns that run while the request is in
//! flight; the window covers the request itself. Abnormal is never cleared by the loop; the
//! loop stops at the next check.
//!
//! Its finding: virtual inference went abnormal (the warm-up failed, or the count reached its
//! maximum, or an agent-policy rule confirmed a failure).

mod lines;
mod observe;
mod pause;
mod state;

use super::driver_faults::{Checked, EXPLAINS, remember_answered, serious};
use super::progress::{NO_SIGN_OF_LIFE, STALL, quiet_words};
use super::{Finding, Kind, Loops, Rule, RuleId, Side, Source, Task};
use crate::config::Timing;
use crate::monitor::Monitor;
use crate::monitor::account::{self, Observation, Stage};
use crate::monitor::inputs::{EngineSignals, PeakSource, RingPeaks, ScrapeSignals};
use crate::monitor::vi_state::{Phase, ViState};
use crate::probe::Prober;
use crate::probe::outcome::{ProbeFailure, ProbeResult};
use lines::log_accounting;
use observe::observe;
use pause::{Pending, Sent, Wake, first_answer};
pub(crate) use state::LoopConfig;
use state::{Io, Pause, Periodic, State};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Virtual inference.
pub(crate) struct VirtualInference;

/// Rule 5: fast confirmation of an idle failure.
const FAST_CONFIRMATION: Rule = Rule {
    id: RuleId(5),
    name: "fast_confirmation",
    doc: "counted failures on an NPU idle throughout, with no token advanced, are abnormal at confirm_failures",
    keys: &[
        "agent_policy.confirm_failures",
        "agent_policy.confirm_interval",
        "agent_policy.confirm_timeout",
    ],
};

/// Rule 6: a busy NPU that falls idle is probed at once.
const FALLS_IDLE: Rule = Rule {
    id: RuleId(6),
    name: "busy_npu_falls_idle",
    doc: "a busy NPU idle over a whole window during the busy interval is probed at once, at the engine's known pace",
    keys: &["agent_policy.confirm_timeout"],
};

/// Rule 12: a probe timeout learned from the engine's own answers.
const LEARNED_TIMEOUT: Rule = Rule {
    id: RuleId(12),
    name: "learned_timeout",
    doc: "a probe to an idle NPU times out after ten times the slowest recent answer; an answer within the request timeout is an answer",
    keys: &["agent_policy.learned_timeout_floor"],
};

impl Source for VirtualInference {
    fn name(&self) -> &'static str {
        "virtual_inference"
    }

    fn rules(&self) -> &'static [Rule] {
        &[FAST_CONFIRMATION, FALLS_IDLE, LEARNED_TIMEOUT]
    }

    fn finding(&self, m: &Monitor, side: Side) -> Option<Finding> {
        match side {
            Side::InForce => m.vi.abnormal().then(|| Finding {
                kind: Kind::VirtualInference,
                rule: m.vi.abnormal_rule().map(RuleId),
            }),
            Side::Shadow => m.vi.shadow().abnormal.map(|(_, rule)| Finding {
                kind: Kind::VirtualInference,
                rule: rule.map(RuleId),
            }),
        }
    }

    fn reason(&self, m: &Monitor, _: &Finding) -> String {
        format!(
            "virtual inference is abnormal: {}",
            m.vi.abnormal_reason().unwrap_or_default()
        )
    }

    fn reason_on(&self, m: &Monitor, f: &Finding, side: Side) -> String {
        match (side, m.vi.shadow().abnormal) {
            (Side::Shadow, Some((why, _))) => format!("virtual inference is abnormal: {why}"),
            _ => self.reason(m, f),
        }
    }

    fn task(&self, m: &Arc<Monitor>, with: &Loops<'_>, cancel: &CancellationToken) -> Option<Task> {
        let peaks = RingPeaks {
            shared: with.shared.clone(),
            devices: m.devices.clone(),
        };
        let (cube_shared, cube_devices) = (with.shared.clone(), m.devices.clone());
        let cube = move || {
            cube_devices
                .iter()
                .map(|&i| {
                    let d = &cube_shared.devices[usize::from(i)];
                    (d.info.id, d.source().backend())
                })
                .collect()
        };
        Some(Box::pin(virtual_inference_task(
            m.clone(),
            with.client.prober(&m.spec),
            peaks,
            ScrapeSignals {
                state: m.clone(),
                metrics: with.client.metrics(),
            },
            cube,
            cancel.clone(),
        )))
    }
}

/// The rule of docs/policy.md that made the probe accounted in `a` abnormal: the driver's
/// fault (8), no sign of life (11), a stalled failure counted by stall detection (7), fast
/// confirmation below the reference's count (5); `None` for the reference's own count (and
/// the warm-up, which never comes here).
fn fired(rules: &account::Rules, a: &account::Accounted) -> Option<RuleId> {
    use crate::probe::outcome::Accounting;
    match a.accounting {
        Accounting::DriverFault => Some(EXPLAINS.id),
        Accounting::NoSignOfLife => Some(NO_SIGN_OF_LIFE.id),
        Accounting::IncrementedStalled => Some(STALL.id),
        Accounting::Incremented if a.count < rules.max_failure_count => Some(FAST_CONFIRMATION.id),
        _ => None,
    }
}

/// The shadow's accounting of the probe the policy in force just accounted (`obs`): its own
/// count, the rule that made it abnormal, or the one that kept the failure out of its count.
fn count_in_shadow(state: &ViState, shadow: &account::Rules, obs: &Observation) {
    use crate::probe::outcome::Accounting;
    let obs = Observation {
        count: state.shadow().count,
        ..obs.clone()
    };
    let a = account::account(shadow, &obs);
    let held_by = match a.accounting {
        Accounting::UnchangedHealthFailing => Some(3),
        Accounting::UnchangedAsleep => Some(4),
        _ => None,
    };
    let rule = a
        .abnormal
        .as_ref()
        .and_then(|_| fired(shadow, &a))
        .map(|r| r.0);
    state.apply_shadow(&a, rule, held_by);
}

/// Runs warm-up and the periodic loop until abnormal. Cancellation is the caller's: it drops
/// the future ([`virtual_inference_task`]).
pub(crate) async fn run_virtual_inference(
    cfg: &LoopConfig,
    prober: &impl Prober,
    peaks: &impl PeakSource,
    signals: &impl EngineSignals,
    state: &ViState,
) {
    let io = Io {
        cfg,
        prober,
        peaks,
        signals,
        state,
    };
    let mut s = if state.warmup_done() {
        State::Begin
    } else {
        State::WarmUp
    };
    while !matches!(s, State::Stopped) {
        s = step(&io, s).await;
    }
    state.set_phase(Phase::Stopped);
}

/// One phase of the loop.
async fn step<'a>(
    io: &Io<'a, impl Prober, impl PeakSource, impl EngineSignals>,
    s: State<'a>,
) -> State<'a> {
    match s {
        State::WarmUp => warm_up(io).await,
        State::Begin => begin(io),
        State::Probe(p) => probe(io, p).await,
        State::Settle(p, sent) => settle(io, p, sent).await,
        State::Pause(p, pause) => sleep(io, p, pause).await,
        State::Stopped => State::Stopped,
    }
}

/// The reference's loop condition, checked before every periodic probe: not abnormal.
fn next_probe<'a>(state: &ViState, p: Periodic<'a>) -> State<'a> {
    if state.abnormal() {
        State::Stopped
    } else {
        State::Probe(p)
    }
}

/// Sends the warm-up request; a failure is abnormal and ends the loop.
async fn warm_up<'a>(io: &Io<'a, impl Prober, impl PeakSource, impl EngineSignals>) -> State<'a> {
    let (engine, state) = (io.cfg.engine.as_str(), io.state);
    state.set_phase(Phase::WarmingUp);
    // No AI Cube reading during warm-up (reference): only the request.
    let r = io.prober.send(io.cfg.timing.warmup_timeout).await;
    state.set_warmup_done();
    let a = account::account(
        &io.cfg.rules,
        &Observation {
            stage: Stage::WarmUp,
            failure: r.outcome.clone().err(),
            peak: None,
            stalled_for: None,
            quiet_for: None,
            since_served: Duration::ZERO,
            capacity: None,
            count: 0,
            health_failed: false,
            asleep: false,
            idle_throughout: None,
            tokens_advanced: None,
            last_ok_latency: None,
            driver_fault: None,
        },
    );
    state.apply(&a);
    if a.abnormal.is_some() {
        state.record_detection(r.latency);
    }
    if io.cfg.shadow.is_some() {
        // A failed warm-up is abnormal under every policy.
        state.apply_shadow(&a, None, None);
    }
    state.record(&r, true, None, a.accounting);
    if let Err(e) = &r.outcome {
        tracing::warn!(
            engine,
            "warmup request failed ({e}), set abnormal status and stop health check"
        );
        return State::Stopped;
    }
    tracing::info!(engine, latency = ?r.latency, "warm-up request succeeded, virtual inference starts");
    State::Begin
}

/// Enters the periodic loop at the regular cadence.
fn begin<'a>(io: &Io<'a, impl Prober, impl PeakSource, impl EngineSignals>) -> State<'a> {
    let t = &io.cfg.timing;
    let cadence = account::Cadence::Regular;
    io.state.set_interval(cadence.interval(t));
    io.state.set_phase(Phase::Running);
    let p = Periodic {
        cadence,
        last_served: tokio::time::Instant::now(),
        streak: None,
        timeout: t.request_timeout,
        last_ok: None,
        recent_ok: std::collections::VecDeque::with_capacity(account::LEARNED_ANSWERS),
        quiet_woke: None,
        probe_ended: None,
        woke_for: None,
        answered: Checked::new(),
        pending: None,
    };
    next_probe(io.state, p)
}

/// Sends one periodic request, then accounts for its outcome ([`settle`]).
async fn probe<'a>(
    io: &Io<'a, impl Prober, impl PeakSource, impl EngineSignals>,
    mut p: Periodic<'a>,
) -> State<'a> {
    let before = if io.cfg.reads().agent.is_some() {
        serious(&io.peaks.faults())
    } else {
        Checked::new()
    };
    let timeout = probe_timeout(io, &p);
    let sent = send(io, &mut p, timeout, before).await;
    settle(io, p, sent).await
}

/// The timeout of the next periodic probe. Rule 12: a regular probe to an idle NPU waits as
/// long as the engine's own answers say. The NPU is idle since the last probe's own work
/// faded ([`PROBE_SETTLE`] after it ended; the whole window would see that work); the ring is
/// read only with the rule on. While an earlier request still waits for its answer, the
/// probe waits at least as long ([`account::reaching_pending`]).
fn probe_timeout(
    io: &Io<'_, impl Prober, impl PeakSource, impl EngineSignals>,
    p: &Periodic<'_>,
) -> Duration {
    let (t, rules) = (&io.cfg.timing, &io.cfg.rules);
    let timeout = if rules
        .agent
        .is_some_and(|a| a.learned_timeout_floor.is_some())
    {
        let since = p.probe_ended.map_or(t.window, |e| {
            e.elapsed().saturating_sub(PROBE_SETTLE).min(t.window)
        });
        let idle_now = !since.is_zero()
            && io
                .peaks
                .peak(since)
                .is_some_and(|u| u < rules.npu_usage_threshold);
        let recent: Vec<Duration> = p.recent_ok.iter().copied().collect();
        account::probe_timeout(rules, t, p.timeout, idle_now, &recent)
    } else {
        p.timeout
    };
    account::reaching_pending(
        timeout,
        p.pending.as_ref().map(|l| l.left(t.request_timeout)),
    )
}

/// Sends one request with `timeout`; an earlier request still pending may answer first, and
/// its answer is then the outcome. Under the agent policy a timeout shorter than the request
/// timeout ends only the wait ([`account::keeps_waiting`]): the request goes on to the
/// request timeout, kept in `p.pending`.
async fn send<'a>(
    io: &Io<'a, impl Prober, impl PeakSource, impl EngineSignals>,
    p: &mut Periodic<'a>,
    timeout: Duration,
    before: Checked,
) -> Sent {
    let (engine, full) = (io.cfg.engine.as_str(), io.cfg.timing.request_timeout);
    let at = tokio::time::Instant::now();
    let pending = p.pending.take();
    if !account::keeps_waiting(&io.cfg.rules, &io.cfg.timing, timeout) {
        return first_answer(io.prober.send(timeout), pending, at, before).await;
    }
    let mut request: Pin<Box<dyn Future<Output = ProbeResult> + Send + 'a>> =
        Box::pin(io.prober.send(full));
    let raced = tokio::time::timeout(
        timeout,
        first_answer(&mut request, pending, at, before.clone()),
    )
    .await;
    if let Ok(sent) = raced {
        return sent;
    }
    tracing::info!(
        engine,
        "no answer to the virtual request within {:.2} s; it waits for its answer up to the request timeout ({:.2} s)",
        timeout.as_secs_f64(),
        full.as_secs_f64()
    );
    p.pending = Some(Pending {
        answer: request,
        sent: at,
        before: before.clone(),
        missed: timeout,
    });
    Sent {
        r: ProbeResult::new(Err(ProbeFailure::Timeout(timeout)), timeout),
        at,
        before,
        late: None,
    }
}

/// Accounts for one request's outcome: reads the evidence beside it, applies its
/// accounting and plans the pause.
async fn settle<'a>(
    io: &Io<'a, impl Prober, impl PeakSource, impl EngineSignals>,
    mut p: Periodic<'a>,
    sent: Sent,
) -> State<'a> {
    let (cfg, state) = (io.cfg, io.state);
    let (t, rules) = (&cfg.timing, &cfg.rules);
    let Sent {
        r,
        at: started,
        before,
        late,
    } = sent;
    if let Some(missed) = late {
        tracing::info!(
            engine = cfg.engine.as_str(),
            latency_s = r.latency.as_secs_f64(),
            "the virtual request answered after {:.2} s, past its {:.2} s timeout and within the request timeout: the engine is slow, not hung",
            r.latency.as_secs_f64(),
            missed.as_secs_f64()
        );
    }
    p.probe_ended = Some(tokio::time::Instant::now());
    let peak = io.peaks.peak(t.window);
    p.cadence = account::next_cadence(t, rules.npu_usage_threshold, p.cadence, peak);
    state.set_interval(p.cadence.interval(t));
    let failed = r.outcome.is_err();
    let since = p.streak.map_or(started, |s| s.since);
    let seen = observe(io, p.known(), &r, peak, started, since).await;
    if !failed {
        p.last_served = tokio::time::Instant::now();
        p.last_ok = Some(r.latency);
        if p.recent_ok.len() == account::LEARNED_ANSWERS {
            p.recent_ok.pop_front();
        }
        p.recent_ok.push_back(r.latency);
    }
    let a = account::account(rules, &seen.obs);
    log_accounting(&cfg.engine, &cfg.rules, &seen.obs, &a);
    state.apply(&a);
    if a.abnormal.is_some() {
        state.set_abnormal_rule(fired(rules, &a).map(|r| r.0));
        state.record_detection(since.elapsed());
    }
    if let Some(shadow) = &cfg.shadow {
        count_in_shadow(state, shadow, &seen.obs);
    }
    state.record(&r, false, peak, a.accounting);
    p.streak = account::next_streak(a.count, p.streak, started, seen.tokens);
    let next = account::next_probe(rules, t, &seen.obs, &a, p.cadence);
    p.timeout = next.timeout;
    let checked = remember_answered(&mut p.answered, &before, &seen.faults_after, failed);
    if let Some(f) = p.woke_for.take()
        && !failed
    {
        tracing::info!(
            engine = cfg.engine.as_str(),
            npu = f.npu,
            code = %f.hex,
            "{}: the confirming virtual request succeeded; the fault is published, the engine stays normal",
            f.describe()
        );
    }
    State::Pause(p, Pause { next, checked })
}

/// Sleeps until the next probe. Under the agent policy a busy NPU that falls idle (over a
/// whole window) during the busy interval is probed at once, with the confirming timeout —
/// the load ended, or the engine stopped; and so is a new driver fault at the confirming
/// level.
async fn sleep<'a>(
    io: &Io<'a, impl Prober, impl PeakSource, impl EngineSignals>,
    mut p: Periodic<'a>,
    pause: Pause,
) -> State<'a> {
    let (engine, t, rules) = (io.cfg.engine.as_str(), &io.cfg.timing, &io.cfg.rules);
    let Some(agent) = rules.agent else {
        tokio::time::sleep(pause.next.sleep).await;
        return next_probe(io.state, p);
    };
    // Rule 6: a busy NPU that falls idle is probed at once.
    let idle = (pause.next.busy && agent.rules.has(FALLS_IDLE.id.0))
        .then_some((t.window, rules.npu_usage_threshold));
    // Rule 8: a new driver fault is probed at once.
    let faults = agent.rules.has(EXPLAINS.id.0);
    // Rule 11: a quiet engine is probed at once, at most once a window.
    let quiet = || match agent.progress_window {
        Some(w) if p.quiet_woke.is_none_or(|at| at.elapsed() >= w) => io.signals.quiet_for(),
        _ => None,
    };
    let woke = pause::pause(
        pause.next.sleep,
        io.peaks,
        idle,
        faults.then_some(&pause.checked),
        quiet,
        &mut p.pending,
    )
    .await;
    match woke {
        Wake::Elapsed => {}
        Wake::Answered(sent) => return State::Settle(p, sent),
        Wake::Quiet(q) => {
            p.quiet_woke = Some(tokio::time::Instant::now());
            // On a busy NPU the probe must reach the window (rule 11); on an idle one the
            // idle rules decide, and the quick (or learned) timeout is enough.
            let idle = io
                .peaks
                .peak(t.window)
                .is_some_and(|u| u < rules.npu_usage_threshold);
            tracing::info!(
                engine,
                quiet_s = q.as_secs_f64(),
                "{}",
                quiet_words(q, io.signals.requests_running(), idle)
            );
            p.timeout = if idle {
                quick_timeout(&agent, t, &p)
            } else {
                account::quiet_probe(&agent, t, q, p.last_ok).unwrap_or(p.timeout)
            };
        }
        Wake::Idle => {
            tracing::info!(
                engine,
                "the NPU fell idle during the busy interval; probing now"
            );
            p.timeout = quick_timeout(&agent, t, &p);
        }
        Wake::Fault(f) => {
            tracing::warn!(
                engine,
                npu = f.npu,
                code = %f.hex,
                level = %f.level,
                "{}; probing now to confirm (a failed virtual request makes the engine abnormal at once)",
                f.describe()
            );
            p.timeout = account::confirm_timeout(&agent, t, p.last_ok);
            p.woke_for = Some(f);
        }
    }
    next_probe(io.state, p)
}

/// The timeout of a probe the loop sends early to an idle NPU: the quick one, or the
/// learned one (rule 12) when the engine's answers say less.
fn quick_timeout(agent: &account::AgentRules, t: &Timing, p: &Periodic<'_>) -> Duration {
    let recent: Vec<Duration> = p.recent_ok.iter().copied().collect();
    let quick = account::confirm_timeout(agent, t, p.last_ok);
    account::learned_timeout(agent, t, &recent).map_or(quick, |l| l.min(quick))
}

/// How long after a probe ended its own work may still show in the ring (the sampler's
/// period and the driver's refresh), which rule 12's idle reading leaves out.
const PROBE_SETTLE: Duration = Duration::from_millis(100);

/// Waits for the start latch, checks the gates, runs virtual inference; repeats after a
/// re-arm. `cube` reports the NPUs' backends at start time.
pub(crate) async fn virtual_inference_task<P: Prober, S: PeakSource, G: EngineSignals>(
    state: Arc<Monitor>,
    prober: P,
    peaks: S,
    signals: G,
    cube: impl Fn() -> Vec<(u32, crate::driver::Backend)>,
    cancel: CancellationToken,
) {
    let spec = &state.spec;
    let cfg = LoopConfig::of(&state);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = state.start.notified() => {}
        }
        if !state.decide_start(&cube()) {
            // One-shot as in the reference: a refused start is not retried until a re-arm.
            continue;
        }
        if state.vi.warmup_done() {
            tracing::info!(engine = %spec.name, "virtual inference resumes (the warm-up was sent before the agent restarted)");
        } else {
            tracing::info!(engine = %spec.name, "virtual inference starts (warm-up request)");
        }
        let mut rearmed = state.rearm_tx.subscribe();
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = run_virtual_inference(&cfg, &prober, &peaks, &signals, &state.vi) => {}
            // A loop that went abnormal is still in its last sleep: it must not go on after
            // the state was re-armed under it.
            _ = rearmed.changed() => {}
        }
    }
}

#[cfg(test)]
mod tests;

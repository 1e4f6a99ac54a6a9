//! The background loops of one engine: `/health` every `health_period`, virtual inference
//! (the reference's warm-up and periodic requests), and the QoS scrapes and evaluations.
//! They do the I/O, gather what they saw, and hand it to the pure rules
//! ([`super::account`], [`super::verdict`], [`crate::qos`]); they hold no policy of their own.
//!
//! After each periodic request the AI Cube peak of the last 5 s is read from the ring,
//! instantly, instead of the reference's 4 `npu-smi` spawns that run while the request is in
//! flight; the window covers the request itself. Abnormal is never cleared by the loop; the
//! loop stops at the next check.

// Long because: five loops, until issue 49's evidence wing (engineer A) gives each its file.
use super::Monitor;
use super::account::{self, Observation, Rules, Stage};
use super::inputs::{CapacityWaiting, EngineSignals, FreshMetrics, PeakSource};
use super::vi_state::{Phase, ViState};
use crate::config::Timing;
use crate::probe::MetricsSource;
use crate::probe::Prober;
use crate::probe::health::{HealthCollector, HealthTransport};
use crate::probe::outcome::{Accounting, ProbeFailure, ProbeResult};
use crate::qos::score::Level;
use crate::sampler::faults::NpuFault;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The virtual inference loop's settings.
#[derive(Debug, Clone)]
pub struct LoopConfig {
    /// Engine name for logs.
    pub engine: String,
    pub rules: Rules,
    pub timing: Timing,
}

impl LoopConfig {
    /// The settings of `monitor`'s engine.
    pub fn of(monitor: &Monitor) -> LoopConfig {
        let spec = &monitor.spec;
        LoopConfig {
            engine: spec.name.clone(),
            rules: Rules {
                npu_usage_threshold: spec.health_check_config.npu_usage_threshold,
                max_failure_count: spec.health_check_config.max_failure_count,
                stall_window: spec.qos.stall_detection.then_some(spec.qos.stall_window),
                skip_when_capacity_waiting: spec.qos.skip_when_capacity_waiting,
                agent: spec.agent_policy_in_force().map(|a| account::AgentRules {
                    confirm_failures: i64::from(a.confirm_failures),
                    confirm_interval: a.confirm_interval,
                    confirm_timeout: a.confirm_timeout,
                    progress_window: (!a.progress_window.is_zero()).then_some(a.progress_window),
                    learned_timeout_floor: (!a.learned_timeout_floor.is_zero())
                        .then_some(a.learned_timeout_floor),
                }),
            },
            timing: spec.timing.clone(),
        }
    }
}

/// Where the virtual inference loop is (reference §1.4–§1.5). Each state is one
/// [`step`]: the I/O of one phase, then the next state.
#[derive(Debug)]
enum State<'a> {
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
struct Periodic<'a> {
    cadence: account::Cadence,
    /// When a virtual request was last served (stall detection's evidence of life).
    last_served: tokio::time::Instant,
    /// Agent policy: the open streak of counted failures.
    streak: Option<account::Streak<tokio::time::Instant>>,
    /// The next probe's timeout.
    timeout: Duration,
    /// The last successful periodic probe's latency: the engine's pace when it answers.
    last_ok: Option<Duration>,
    /// The latencies of the last successful periodic probes, newest last (rule 12).
    recent_ok: std::collections::VecDeque<Duration>,
    /// Agent policy: when a quiet engine last woke the loop (rule 11: at most once a window).
    quiet_woke: Option<tokio::time::Instant>,
    /// When the last periodic probe ended (rule 12 reads the NPU since then).
    probe_ended: Option<tokio::time::Instant>,
    /// Agent policy: the driver fault that woke the loop for this probe.
    woke_for: Option<NpuFault>,
    /// Agent policy: the faults at the confirming level a virtual request was answered beside
    /// (they no longer explain a failure while they stay: a chip can report a code for weeks
    /// and work).
    answered: Checked,
    /// Agent policy: the request that missed a timeout shorter than the request timeout,
    /// still waiting for its answer.
    pending: Option<Pending<'a>>,
}

impl Periodic<'_> {
    /// What a probe's accounting reads of it.
    fn known(&self) -> Known<'_> {
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
struct Known<'p> {
    answered: &'p Checked,
    last_served: tokio::time::Instant,
    /// The token counters when the open streak began.
    streak_tokens: Option<f64>,
    last_ok: Option<Duration>,
}

/// A request sent with a timeout shorter than the request timeout (the learned one, rule 12,
/// or a quick probe's) that passed without an answer. The loop counted the failure and went
/// on, but the request waits for its answer until the request timeout: an answer by then is
/// an answer (a slow engine, not a hung one), and the next probe waits at least that long.
struct Pending<'a> {
    /// The request itself, sent with the request timeout.
    answer: Pin<Box<dyn Future<Output = ProbeResult> + Send + 'a>>,
    sent: tokio::time::Instant,
    /// The faults at the confirming level when it was sent.
    before: Checked,
    /// The shorter timeout it missed.
    missed: Duration,
}

impl std::fmt::Debug for Pending<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending")
            .field("sent", &self.sent)
            .field("missed", &self.missed)
            .finish_non_exhaustive()
    }
}

impl Pending<'_> {
    /// How long it may still answer, with `request_timeout`.
    fn left(&self, request_timeout: Duration) -> Duration {
        (self.sent + request_timeout).saturating_duration_since(tokio::time::Instant::now())
    }

    /// Its late answer, as an outcome to account.
    fn answered(self, r: ProbeResult) -> Sent {
        Sent {
            r,
            at: self.sent,
            before: self.before,
            late: Some(self.missed),
        }
    }
}

/// A request's outcome as the loop accounts it.
#[derive(Debug)]
struct Sent {
    r: ProbeResult,
    /// When the request was sent.
    at: tokio::time::Instant,
    /// The faults at the confirming level then (agent policy; empty under the reference).
    before: Checked,
    /// Set for a late answer: the shorter timeout the request had missed.
    late: Option<Duration>,
}

/// The sleep after a probe.
#[derive(Debug)]
struct Pause {
    next: account::NextProbe,
    /// The faults at the confirming level this probe checked; any other wakes the loop.
    checked: Checked,
}

/// What the steps read and write.
struct Io<'a, P, S, G> {
    cfg: &'a LoopConfig,
    prober: &'a P,
    peaks: &'a S,
    signals: &'a G,
    state: &'a ViState,
}

/// Runs warm-up and the periodic loop until abnormal. Cancellation is the caller's: it drops
/// the future ([`virtual_inference_task`]).
pub async fn run_virtual_inference(
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
    let before = if io.cfg.rules.agent.is_some() {
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

/// The outcome of `request`, unless `pending` answers first: the engine answered, and that
/// answer is the outcome. A pending request that fails is dropped: its failure was counted
/// when its shorter timeout passed.
async fn first_answer(
    request: impl Future<Output = ProbeResult>,
    pending: Option<Pending<'_>>,
    at: tokio::time::Instant,
    before: Checked,
) -> Sent {
    let own = |r| Sent {
        r,
        at,
        before,
        late: None,
    };
    let Some(mut pending) = pending else {
        return own(request.await);
    };
    let mut request = std::pin::pin!(request);
    let late = tokio::select! {
        biased;
        r = &mut pending.answer => r,
        r = &mut request => return own(r),
    };
    if late.outcome.is_ok() {
        pending.answered(late)
    } else {
        own(request.await)
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
    log_accounting(cfg, &seen.obs, &a);
    state.apply(&a);
    if a.abnormal.is_some() {
        state.record_detection(since.elapsed());
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

/// What one periodic probe saw besides its own outcome.
struct Seen {
    obs: Observation,
    /// The driver's faults after the probe (agent policy; empty under the reference).
    faults_after: Vec<NpuFault>,
    /// The engine's token counters, when they were read.
    tokens: Option<f64>,
}

/// Reads the evidence a probe's accounting needs, and only that: the agent policy's for a
/// failure (the V6 capacity figure comes from the same read when there is one), the V6
/// capacity figure for an idle failure, the stall for a busy failure.
async fn observe(
    io: &Io<'_, impl Prober, impl PeakSource, impl EngineSignals>,
    p: Known<'_>,
    r: &ProbeResult,
    peak: Option<f64>,
    started: tokio::time::Instant,
    since: tokio::time::Instant,
) -> Seen {
    let (t, rules) = (&io.cfg.timing, &io.cfg.rules);
    let failed = r.outcome.is_err();
    let agent_read = rules.agent.is_some() && failed;
    // The driver's faults after the probe, read once (the reference has no use for them).
    let faults_after = if rules.agent.is_some() {
        io.peaks.faults()
    } else {
        Vec::new()
    };
    let driver_fault = if agent_read {
        unanswered_worst(&faults_after, p.answered)
    } else {
        None
    };
    let fresh = if agent_read {
        io.signals.fresh().await
    } else {
        FreshMetrics::default()
    };
    let capacity = if account::needs_capacity(rules, failed, peak) {
        Some(match fresh.capacity.clone() {
            Some(c) => c,
            None => io.signals.waiting_for_capacity().await,
        })
    } else {
        None
    };
    let obs = Observation {
        stage: Stage::Periodic,
        failure: r.outcome.clone().err(),
        peak,
        // Read only when it matters: a failure on a busy NPU.
        stalled_for: (rules.stall_window.is_some()
            && failed
            && peak.is_some_and(|p| p >= rules.npu_usage_threshold))
        .then(|| io.signals.stalled_for())
        .flatten(),
        // After the fresh read: the signs of life as they are now.
        quiet_for: (agent_read
            && rules.agent.is_some_and(|a| a.progress_window.is_some())
            && peak.is_some_and(|p| p >= rules.npu_usage_threshold))
        .then(|| io.signals.quiet_for())
        .flatten(),
        since_served: p.last_served.elapsed(),
        capacity,
        count: io.state.failure_count(),
        health_failed: agent_read && io.signals.health_failed_since(started),
        asleep: fresh.asleep == Some(true),
        idle_throughout: if agent_read {
            io.peaks
                .peak(since.elapsed().max(t.window))
                .map(|p| p < rules.npu_usage_threshold)
        } else {
            None
        },
        tokens_advanced: match (p.streak_tokens, fresh.tokens) {
            (Some(before), Some(now)) => Some(now > before),
            _ => None,
        },
        last_ok_latency: p.last_ok,
        driver_fault,
    };
    Seen {
        obs,
        faults_after,
        tokens: fresh.tokens,
    }
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
    let idle = pause
        .next
        .busy
        .then_some((t.window, rules.npu_usage_threshold));
    // Rule 11: a quiet engine is probed at once, at most once a window.
    let quiet = || match agent.progress_window {
        Some(w) if p.quiet_woke.is_none_or(|at| at.elapsed() >= w) => io.signals.quiet_for(),
        _ => None,
    };
    let woke = self::pause(
        pause.next.sleep,
        io.peaks,
        idle,
        &pause.checked,
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

/// Why a quiet engine woke the loop (rule 11), for the log: "requests running" only when the
/// engine's own count says so, since an engine with none running is quiet too when its NPU
/// was busy; `idle_now`: the NPU has been idle over the last window since.
fn quiet_words(quiet: Duration, running: Option<f64>, idle_now: bool) -> String {
    let working = match running {
        Some(1.0) => "1 request running".to_owned(),
        Some(n) if n > 0.0 => format!("{n} requests running"),
        _ => "no request running by the engine's count but its NPU was busy".to_owned(),
    };
    format!(
        "{working}, and no sign of life for {:.1} s (no token, KV-cache usage, running or waiting count moved); probing now{}",
        quiet.as_secs_f64(),
        if idle_now {
            " (the NPU is idle now: the idle rules decide)"
        } else {
            ""
        }
    )
}

/// The timeout of a probe the loop sends early to an idle NPU: the quick one, or the
/// learned one (rule 12) when the engine's answers say less.
fn quick_timeout(agent: &account::AgentRules, t: &Timing, p: &Periodic<'_>) -> Duration {
    let recent: Vec<Duration> = p.recent_ok.iter().copied().collect();
    let quick = account::confirm_timeout(agent, t, p.last_ok);
    account::learned_timeout(agent, t, &recent).map_or(quick, |l| l.min(quick))
}

/// The most severe of `faults` that no answered request was seen beside.
fn unanswered_worst(faults: &[NpuFault], answered: &Checked) -> Option<NpuFault> {
    let unanswered: Vec<_> = faults
        .iter()
        .filter(|f| !answered.contains(&(f.npu, f.code)))
        .cloned()
        .collect();
    account::worst(&unanswered).cloned()
}

/// After a probe: what it checked (the faults at the confirming level that were there before
/// it started and still are), and `answered` updated — a fault that cleared is forgotten (it
/// is new again when it comes back), and the checked ones join it when the probe succeeded.
fn remember_answered(
    answered: &mut Checked,
    before: &Checked,
    faults_after: &[NpuFault],
    failed: bool,
) -> Checked {
    let now_serious = serious(faults_after);
    let checked: Checked = before.intersection(&now_serious).copied().collect();
    answered.retain(|k| now_serious.contains(k));
    if !failed {
        answered.extend(checked.iter().copied());
    }
    checked
}

/// Why the engine's QoS level is one band lower: the `SubHealthFault`s among `faults`, under
/// the agent policy (the reference has no such rule).
fn sub_health(state: &Monitor, faults: &[NpuFault]) -> Option<String> {
    let agent = state.spec.agent_policy_in_force().is_some();
    let lowering: Vec<String> = faults
        .iter()
        .filter(|f| account::fault_effect(agent, f.level) == account::FaultEffect::LowersQos)
        .map(|f| f.describe())
        .collect();
    (!lowering.is_empty()).then(|| lowering.join("; "))
}

/// Driver faults at the confirming level, by (NPU, code).
type Checked = std::collections::BTreeSet<(u32, u32)>;

/// The faults of `faults` at the confirming level.
fn serious(faults: &[NpuFault]) -> Checked {
    faults
        .iter()
        .filter(|f| f.level >= account::CONFIRM_LEVEL)
        .map(|f| (f.npu, f.code))
        .collect()
}

/// How long after a probe ended its own work may still show in the ring (the sampler's
/// period and the driver's refresh), which rule 12's idle reading leaves out.
const PROBE_SETTLE: Duration = Duration::from_millis(100);

/// Why a [`pause`] ended.
#[derive(Debug)]
enum Wake {
    /// It slept the whole time.
    Elapsed,
    /// The NPU fell idle over a whole window.
    Idle,
    /// The driver reports a fault at the confirming level that no probe has checked.
    Fault(NpuFault),
    /// The engine has shown no sign of life for this long while it should be working (rule
    /// 11).
    Quiet(Duration),
    /// A pending request answered: the engine is slow, not hung.
    Answered(Sent),
}

/// How often a pause looks at the driver's faults (the sampler reads them every
/// `fault_period`, 1 s by default, at least 5 s through `npu-smi`; a new one is acted on
/// within this of being read).
const FAULT_POLL: Duration = Duration::from_millis(100);

/// Sleeps `sleep`, or less: when `idle` is `(window, threshold)` and the NPU stays below
/// `threshold` over a whole `window`, or when a driver fault at the confirming level that is
/// not in `checked` appears, or when `quiet` says the engine has gone quiet, or when the
/// `pending` request answers (one that fails is dropped).
async fn pause(
    sleep: Duration,
    peaks: &impl PeakSource,
    idle: Option<(Duration, f64)>,
    checked: &Checked,
    quiet: impl Fn() -> Option<Duration>,
    pending: &mut Option<Pending<'_>>,
) -> Wake {
    let end = tokio::time::Instant::now() + sleep;
    // The window must not reach back before the sleep: the probe itself was busy.
    let start = tokio::time::Instant::now();
    loop {
        let new: Vec<_> = peaks
            .faults()
            .into_iter()
            .filter(|f| f.level >= account::CONFIRM_LEVEL && !checked.contains(&(f.npu, f.code)))
            .collect();
        if let Some(f) = account::worst(&new) {
            return Wake::Fault(f.clone());
        }
        let now = tokio::time::Instant::now();
        if now >= end {
            return Wake::Elapsed;
        }
        if let Some((window, threshold)) = idle
            && now.duration_since(start) >= window
            && peaks.peak(window).is_some_and(|p| p < threshold)
        {
            return Wake::Idle;
        }
        if let Some(q) = quiet() {
            return Wake::Quiet(q);
        }
        let tick = tokio::time::sleep(FAULT_POLL.min(end - now));
        let answer = match pending.as_mut() {
            Some(l) => tokio::select! {
                biased;
                r = &mut l.answer => Some(r),
                _ = tick => None,
            },
            None => {
                tick.await;
                None
            }
        };
        if let Some(r) = answer
            && let Some(l) = pending.take()
            && r.outcome.is_ok()
        {
            return Wake::Answered(l.answered(r));
        }
    }
}

/// The reference's log line for each accounting outcome (its wording, for operators who
/// grep for it).
fn log_accounting(cfg: &LoopConfig, obs: &Observation, a: &account::Accounted) {
    let engine = cfg.engine.as_str();
    let peak = obs.peak.unwrap_or_default();
    let why = a.why.as_deref().unwrap_or_default();
    match a.accounting {
        Accounting::Incremented => {
            if obs.capacity == Some(CapacityWaiting::NotExported) {
                tracing::info!(
                    engine,
                    "skip_when_capacity_waiting: the engine does not export vllm:num_requests_waiting_by_reason; counting as V5 does"
                );
            }
            tracing::warn!(
                engine,
                peak,
                "virtual inference failed while the NPU is idle. Current failure count: {}",
                count_words(&cfg.rules, a.count)
            );
        }
        Accounting::IncrementedStalled => {
            let stalled = a.stalled.unwrap_or_default().as_secs_f64();
            tracing::warn!(
                engine,
                peak,
                stalled_s = stalled,
                "virtual inference failed while the NPU is busy and the engine has made no progress for {stalled:.0} s (stall detection). Current failure count: {}",
                count_words(&cfg.rules, a.count)
            );
        }
        Accounting::UnchangedCapacityWaiting => tracing::info!(
            engine,
            peak,
            "virtual inference failed while the NPU is idle, but {why}; skip failure count"
        ),
        Accounting::DriverFault => tracing::error!(
            engine,
            peak,
            "virtual inference failed while {why}; the driver explains the failure"
        ),
        Accounting::NoSignOfLife => {
            tracing::error!(engine, peak, "virtual inference failed with {why}")
        }
        Accounting::UnchangedHealthFailing | Accounting::UnchangedAsleep => tracing::info!(
            engine,
            peak,
            "virtual inference failed, but {why}; skip failure count"
        ),
        Accounting::Unchanged => tracing::info!(
            engine,
            "virtual inference failed but AI Cube usage unavailable, skip failure count"
        ),
        // Why it reset (a success, or a failure on a busy NPU), so a reset can be explained.
        Accounting::Reset if obs.count > 0 => tracing::info!(
            engine,
            peak = obs.peak,
            "failure count reset from {} ({})",
            obs.count,
            if obs.failure.is_none() {
                "the request succeeded"
            } else {
                "the NPU is busy"
            }
        ),
        Accounting::Reset | Accounting::WarmUp => {}
    }
    if a.abnormal.is_some() {
        tracing::error!(
            engine,
            verdict = "abnormal",
            "{}",
            abnormal_words(&cfg.rules, a)
        );
    }
}

/// The failure count as the log shows it: the reference's `count/max`, and under the agent
/// policy the count that makes the engine abnormal when its failures are confirmed, so a
/// line saying `1/6` is not followed by an abnormal verdict at 2 unexplained.
fn count_words(rules: &Rules, count: i64) -> String {
    let max = rules.max_failure_count;
    match rules.agent {
        Some(a) if a.confirm_failures < max => format!(
            "{count}/{max} (agent policy: abnormal at {} when confirmed)",
            a.confirm_failures
        ),
        _ => format!("{count}/{max}"),
    }
}

/// The line that says a probe made the engine abnormal: the reference's wording when the
/// count reached its maximum; else what made it abnormal sooner (agent policy).
fn abnormal_words(rules: &Rules, a: &account::Accounted) -> String {
    if a.count >= rules.max_failure_count || rules.agent.is_none() {
        return format!(
            "Reach maximum failure count ({}); status is abnormal",
            a.count
        );
    }
    match a.accounting {
        Accounting::DriverFault | Accounting::NoSignOfLife => format!(
            "Abnormal at failure count {} ({}); status is abnormal",
            a.count,
            a.why.as_deref().unwrap_or_default()
        ),
        _ => format!(
            "Reach confirmed failure count ({}, agent policy: confirm_failures); status is abnormal",
            a.count
        ),
    }
}

/// Probes `/health` every `health_period` until cancelled.
pub async fn health_task<T: HealthTransport>(
    state: Arc<Monitor>,
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
    )
    .answered_before(state.health_detail().has_connected);
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

/// Time between two looks at the engine's processes (the stopped-process rule's sample).
pub const PROCESS_PERIOD: Duration = Duration::from_millis(500);

/// Looks at the engine's processes (`/proc` under `root`) every [`PROCESS_PERIOD`] until
/// cancelled: the agent policy's stopped-process rule reads it. The look runs on a blocking
/// thread (a look-up reads processes' open files, a bounded number per look).
pub async fn process_task(
    state: Arc<Monitor>,
    root: crate::proc_sockets::ProcRoot,
    cancel: CancellationToken,
) {
    let spec = &state.spec;
    let mut watch = Some(crate::probe::process::Watch::new(
        root, &spec.host, spec.port,
    ));
    let mut tick = tokio::time::interval(PROCESS_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let Some(mut w) = watch.take() else { return };
        let looked = tokio::task::spawn_blocking(move || {
            let found = w.sample();
            (w, found)
        });
        let Ok((w, found)) = looked.await else { return };
        state.record_process(&found, tokio::time::Instant::now());
        watch = Some(w);
    }
}

/// How long the identity check waits for the engine's `/metrics` at most.
const IDENTITY_PATIENCE: Duration = Duration::from_secs(600);

/// After a restored state: scrapes the engine's `/metrics` until it answers (for at most
/// [`IDENTITY_PATIENCE`]) and forgets the state if the engine is another process than the one
/// it was saved from ([`super::saved::other_process`]).
pub async fn identity_task<M: MetricsSource>(
    state: Arc<Monitor>,
    metrics: M,
    saved_start: f64,
    cancel: CancellationToken,
) {
    let until = tokio::time::Instant::now() + IDENTITY_PATIENCE;
    let mut pause = Duration::from_secs(1);
    while tokio::time::Instant::now() < until {
        let r = tokio::select! {
            _ = cancel.cancelled() => return,
            r = metrics.scrape(Duration::from_secs(2)) => r,
        };
        if let Ok(m) = r {
            match super::saved::other_process(saved_start, m.process_start_time) {
                Some(why) => state.forget(&why),
                None => state.record_engine_start(m.process_start_time),
            }
            return;
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(Duration::from_secs(5));
    }
}

/// Waits for the start latch, checks the gates, runs virtual inference; repeats after a
/// re-arm. `cube` reports the NPUs' backends at start time.
pub async fn virtual_inference_task<P: Prober, S: PeakSource, G: EngineSignals>(
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

/// Scrapes the engine's `/metrics` every `qos.metrics_period` and evaluates the QoS score
/// every `qos.period`, logging each level change, until cancelled. Does nothing when
/// neither the score nor stall detection is on.
pub async fn qos_task<M: MetricsSource>(
    state: Arc<Monitor>,
    metrics: M,
    npus: impl PeakSource,
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
                if let Ok(m) = &r {
                    state.record_engine_start(m.process_start_time);
                }
                // Whether the NPU worked since the previous scrape: the signs of life hold
                // an engine that should be working to them.
                let busy = npus
                    .peak(q.metrics_period)
                    .map(|p| p >= state.spec.health_check_config.npu_usage_threshold);
                state.qos.record_scrape_beside(r, busy);
            }
            _ = evaluate.tick(), if q.enabled => {
                let probe = state.vi.last_probe().filter(|p| !p.warmup);
                let lowered = sub_health(&state, &npus.faults());
                let (score, _, transition) = state.qos.evaluate(q, probe.as_ref(), lowered);
                if let Some(t) = transition {
                    let score = score.map_or_else(|| "none".to_owned(), |s| format!("{s:.3}"));
                    let msg = format!("QoS level {} -> {} (score {score}: {})", t.from.as_str(), t.to.as_str(), t.why);
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
    use crate::monitor::inputs::NoSignals;
    use crate::probe::outcome::{ProbeFailure, ProbeResult};
    use std::collections::VecDeque;
    use std::sync::Mutex;
    use tokio::time::Instant;

    /// Scripted prober: each call takes `delay` of (paused) time and returns the next outcome.
    struct FakeProber {
        script: Mutex<VecDeque<(Duration, Result<(), ProbeFailure>)>>,
        calls: Mutex<Vec<(Instant, Duration)>>,
    }

    impl FakeProber {
        fn new(script: Vec<(Duration, Result<(), ProbeFailure>)>) -> FakeProber {
            FakeProber {
                script: Mutex::new(script.into()),
                calls: Mutex::new(Vec::new()),
            }
        }
        fn ok() -> Result<(), ProbeFailure> {
            Ok(())
        }
        fn fail() -> Result<(), ProbeFailure> {
            Err(ProbeFailure::Timeout(Duration::from_secs(5)))
        }
        fn calls(&self) -> Vec<(Instant, Duration)> {
            self.calls.lock().unwrap().clone()
        }
    }

    impl Prober for FakeProber {
        async fn send(&self, timeout: Duration) -> ProbeResult {
            self.calls.lock().unwrap().push((Instant::now(), timeout));
            let next = self.script.lock().unwrap().pop_front();
            let Some((delay, outcome)) = next else {
                // Script exhausted: park forever (the test ends the loop by dropping it).
                std::future::pending::<()>().await;
                unreachable!()
            };
            if delay > timeout {
                tokio::time::sleep(timeout).await;
                return ProbeResult::new(Err(ProbeFailure::Timeout(timeout)), timeout);
            }
            tokio::time::sleep(delay).await;
            ProbeResult::new(outcome, delay)
        }
    }

    /// Scripted peaks; counts reads.
    struct Peaks(Mutex<VecDeque<Option<f64>>>, Mutex<u32>);
    impl Peaks {
        fn new(v: Vec<Option<f64>>) -> Peaks {
            Peaks(Mutex::new(v.into()), Mutex::new(0))
        }
        fn reads(&self) -> u32 {
            *self.1.lock().unwrap()
        }
    }
    impl PeakSource for Peaks {
        fn peak(&self, window: Duration) -> Option<f64> {
            assert_eq!(window, Duration::from_secs(5));
            *self.1.lock().unwrap() += 1;
            self.0.lock().unwrap().pop_front().flatten()
        }
    }

    fn cfg(max: i64) -> LoopConfig {
        LoopConfig {
            engine: "test".into(),
            rules: Rules {
                npu_usage_threshold: 3.0,
                max_failure_count: max,
                stall_window: None,
                skip_when_capacity_waiting: false,
                agent: None,
            },
            timing: Timing::default(),
        }
    }

    const MS: Duration = Duration::from_millis(1);

    /// Runs the loop until it returns or `limit` of paused time passes.
    async fn run_for(
        cfg: &LoopConfig,
        p: &FakeProber,
        peaks: &Peaks,
        st: &ViState,
        limit: Duration,
    ) -> bool {
        run_with(cfg, p, peaks, &NoSignals, st, limit).await
    }

    async fn run_with(
        cfg: &LoopConfig,
        p: &FakeProber,
        peaks: &impl PeakSource,
        signals: &impl EngineSignals,
        st: &ViState,
        limit: Duration,
    ) -> bool {
        tokio::time::timeout(limit, run_virtual_inference(cfg, p, peaks, signals, st))
            .await
            .is_ok()
    }

    // Warm-up uses 180 s; failure → abnormal, loop never starts, no sampling.
    #[tokio::test(start_paused = true)]
    async fn failed_warmup_is_abnormal_and_never_samples() {
        let p = FakeProber::new(vec![(Duration::from_secs(200), FakeProber::ok())]);
        let peaks = Peaks::new(vec![]);
        let st = ViState::default();
        assert!(run_for(&cfg(6), &p, &peaks, &st, Duration::from_secs(3600)).await);
        let calls = p.calls();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].1, Duration::from_secs(180));
        assert!(st.abnormal() && st.warmup_done());
        assert_eq!(peaks.reads(), 0);
        assert_eq!(st.phase(), Phase::Stopped);
        assert_eq!(st.last_probe().unwrap().accounting, Accounting::WarmUp);
    }

    // A successful warm-up does no sampling; the periodic loop then uses the 5 s timeout.
    #[tokio::test(start_paused = true)]
    async fn warmup_then_periodic_requests_with_5s_timeout() {
        let p = FakeProber::new(vec![
            (MS, FakeProber::ok()),
            (MS, FakeProber::ok()),
            (MS, FakeProber::ok()),
        ]);
        let peaks = Peaks::new(vec![Some(1.0), Some(1.0)]);
        let st = ViState::default();
        assert!(!run_for(&cfg(6), &p, &peaks, &st, Duration::from_secs(60)).await);
        let calls = p.calls();
        assert_eq!(calls[0].1, Duration::from_secs(180));
        assert!(calls[1..].iter().all(|c| c.1 == Duration::from_secs(5)));
        assert_eq!(peaks.reads(), 2);
        assert!(!st.abnormal());
        assert_eq!(st.phase(), Phase::Running);
        // 5 s between the periodic requests (plus the 1 ms request itself).
        assert_eq!(calls[2].0 - calls[1].0, Duration::from_secs(5) + MS);
    }

    // After a successful warm-up, the first low-usage failure already counts (no prior loop
    // success needed: V5 dropped count_failure_flag); max 1 → 1 request, 1 sleep, return.
    #[tokio::test(start_paused = true)]
    async fn abnormal_with_max_one_after_one_request_and_one_sleep() {
        let p = FakeProber::new(vec![(MS, FakeProber::ok()), (MS, FakeProber::fail())]);
        let peaks = Peaks::new(vec![Some(0.0)]);
        let st = ViState::default();
        let start = Instant::now();
        assert!(run_for(&cfg(1), &p, &peaks, &st, Duration::from_secs(3600)).await);
        assert_eq!(
            p.calls().len(),
            2,
            "warm-up and exactly one periodic request"
        );
        assert!(st.abnormal());
        assert_eq!(st.failure_count(), 1);
        // 1 ms warm-up + 1 ms request + one 5 s sleep, then the loop condition ends it.
        assert_eq!(start.elapsed(), Duration::from_secs(5) + 2 * MS);
        assert_eq!(st.phase(), Phase::Stopped);
    }

    // Exits after max failures: six idle failures with the default max of 6.
    #[tokio::test(start_paused = true)]
    async fn six_idle_failures_make_it_abnormal() {
        let mut script = vec![(MS, FakeProber::ok())];
        script.extend((0..6).map(|_| (Duration::from_secs(5), FakeProber::fail())));
        let p = FakeProber::new(script);
        let peaks = Peaks::new(vec![Some(0.0); 6]);
        let st = ViState::default();
        assert!(run_for(&cfg(6), &p, &peaks, &st, Duration::from_secs(3600)).await);
        assert_eq!(p.calls().len(), 7);
        assert_eq!(st.failure_count(), 6);
        assert!(st.abnormal());
        let (ok, failed) = st.outcomes();
        assert_eq!((ok, failed), (1, 6));
    }

    // No work if already abnormal before the loop.
    #[tokio::test(start_paused = true)]
    async fn no_work_if_already_abnormal() {
        let p = FakeProber::new(vec![]);
        let peaks = Peaks::new(vec![]);
        let st = ViState::default();
        st.set_warmup_done();
        st.set_abnormal("before");
        let start = Instant::now();
        assert!(run_for(&cfg(6), &p, &peaks, &st, Duration::from_secs(60)).await);
        assert!(p.calls().is_empty());
        assert_eq!(start.elapsed(), Duration::ZERO, "no sleep either");
        assert!(st.abnormal());
    }

    // Failure with usage unavailable is not counted (and does not reset).
    #[tokio::test(start_paused = true)]
    async fn failure_with_unavailable_usage_is_not_counted() {
        let p = FakeProber::new(vec![
            (MS, FakeProber::ok()),
            (MS, FakeProber::fail()),
            (MS, FakeProber::fail()),
            (MS, FakeProber::fail()),
        ]);
        let peaks = Peaks::new(vec![Some(0.0), None, None]);
        let st = ViState::default();
        run_for(&cfg(6), &p, &peaks, &st, Duration::from_secs(14)).await;
        assert_eq!(p.calls().len(), 4);
        assert_eq!(st.failure_count(), 1, "counted once, then unchanged twice");
        assert_eq!(st.last_probe().unwrap().accounting, Accounting::Unchanged);
    }

    // A failure while the NPU is busy resets the count, and so does a success (rule 3).
    #[tokio::test(start_paused = true)]
    async fn busy_failure_resets_and_success_resets() {
        // fail idle (1), fail idle (2), fail at the threshold → reset (0).
        let p = FakeProber::new(vec![
            (MS, FakeProber::ok()),
            (MS, FakeProber::fail()),
            (MS, FakeProber::fail()),
            (MS, FakeProber::fail()),
        ]);
        // 0 % is an available reading and counts as idle.
        let peaks = Peaks::new(vec![Some(0.0), Some(0.0), Some(3.0)]);
        let st = ViState::default();
        run_for(&cfg(6), &p, &peaks, &st, Duration::from_secs(9)).await;
        assert_eq!(p.calls().len(), 3);
        assert_eq!(st.failure_count(), 2, "two idle failures counted");
        run_for(&cfg(6), &p, &peaks, &st, Duration::from_secs(30)).await;
        assert_eq!(st.failure_count(), 0, "a busy failure resets");
        assert_eq!(st.last_probe().unwrap().accounting, Accounting::Reset);
        // fail idle (1), fail idle (2), success while idle → reset (0).
        let p2 = FakeProber::new(vec![
            (MS, FakeProber::ok()),
            (MS, FakeProber::fail()),
            (MS, FakeProber::fail()),
            (MS, FakeProber::ok()),
        ]);
        let peaks2 = Peaks::new(vec![Some(0.0), Some(0.0), Some(0.0)]);
        let st2 = ViState::default();
        run_for(&cfg(6), &p2, &peaks2, &st2, Duration::from_secs(9)).await;
        assert_eq!(st2.failure_count(), 2);
        run_for(&cfg(6), &p2, &peaks2, &st2, Duration::from_secs(30)).await;
        assert_eq!(st2.failure_count(), 0, "a success resets");
        assert_eq!(st2.last_probe().unwrap().accounting, Accounting::Reset);
    }

    /// Interval after a sequence of peaks (each probe succeeds).
    async fn interval_after(peaks: Vec<Option<f64>>) -> Duration {
        let n = peaks.len();
        let mut script = vec![(MS, FakeProber::ok())];
        script.extend((0..n).map(|_| (MS, FakeProber::ok())));
        let p = FakeProber::new(script);
        let peaks = Peaks::new(peaks);
        let st = ViState::default();
        // The script ends after warm-up and n probes; the next call parks forever, so the
        // interval read afterwards is the one set by the last peak.
        run_for(&cfg(6), &p, &peaks, &st, Duration::from_secs(1000)).await;
        assert_eq!(p.calls().len(), n + 2);
        st.interval()
    }

    // Interval cases: 85 → 20, 50 → 5, 85 then 50 → 20, 85 then 1 (threshold 3) → 5.
    #[tokio::test(start_paused = true)]
    async fn interval_rules() {
        assert_eq!(
            interval_after(vec![Some(85.0)]).await,
            Duration::from_secs(20)
        );
        assert_eq!(
            interval_after(vec![Some(50.0)]).await,
            Duration::from_secs(5)
        );
        assert_eq!(
            interval_after(vec![Some(85.0), Some(50.0)]).await,
            Duration::from_secs(20)
        );
        assert_eq!(
            interval_after(vec![Some(85.0), Some(1.0)]).await,
            Duration::from_secs(5)
        );
        assert_eq!(
            interval_after(vec![Some(80.0)]).await,
            Duration::from_secs(20),
            "80 is >="
        );
        assert_eq!(
            interval_after(vec![Some(85.0), None]).await,
            Duration::from_secs(20),
            "unavailable: unchanged"
        );
    }

    // The window is read as soon as the request completes: an iteration lasts the request
    // plus the sleep, not request + a separate 5 s sampling wait.
    #[tokio::test(start_paused = true)]
    async fn no_extra_wait_for_sampling() {
        let p = FakeProber::new(vec![
            (MS, FakeProber::ok()),
            (Duration::from_millis(200), FakeProber::ok()),
            (MS, FakeProber::ok()),
        ]);
        let peaks = Peaks::new(vec![Some(1.0), Some(1.0)]);
        let st = ViState::default();
        run_for(&cfg(6), &p, &peaks, &st, Duration::from_secs(6)).await;
        let c = p.calls();
        assert_eq!(
            c[2].0 - c[1].0,
            Duration::from_millis(200) + Duration::from_secs(5)
        );
    }

    // A timed-out request fails at the timeout.
    #[tokio::test(start_paused = true)]
    async fn a_hung_request_fails_at_the_timeout() {
        let p = FakeProber::new(vec![
            (MS, FakeProber::ok()),
            (Duration::from_secs(3600), FakeProber::fail()),
        ]);
        let peaks = Peaks::new(vec![Some(0.0)]);
        let st = ViState::default();
        run_for(&cfg(6), &p, &peaks, &st, Duration::from_secs(6)).await;
        let last = st.last_probe().unwrap();
        assert_eq!(last.latency_ms, 5000.0);
        assert_eq!(st.failure_count(), 1);
    }

    /// Engine signals under paused time: the engine stalls from `stalled_from` on (requests
    /// running, no counter advancing), unless it is a long prefill (the prompt counter
    /// advances, so it is never stalled); `capacity` is what the V6 read returns.
    struct ScriptedSignals {
        stalled_from: Option<Instant>,
        capacity: Mutex<VecDeque<CapacityWaiting>>,
        capacity_reads: Mutex<u32>,
    }

    impl ScriptedSignals {
        fn stalled_from(at: Option<Instant>) -> ScriptedSignals {
            ScriptedSignals {
                stalled_from: at,
                capacity: Mutex::new(VecDeque::new()),
                capacity_reads: Mutex::new(0),
            }
        }
        fn capacity(v: Vec<CapacityWaiting>) -> ScriptedSignals {
            ScriptedSignals {
                stalled_from: None,
                capacity: Mutex::new(v.into()),
                capacity_reads: Mutex::new(0),
            }
        }
    }

    impl EngineSignals for ScriptedSignals {
        fn stalled_for(&self) -> Option<Duration> {
            self.stalled_from
                .map(|t| Instant::now().saturating_duration_since(t))
        }
        async fn waiting_for_capacity(&self) -> CapacityWaiting {
            *self.capacity_reads.lock().unwrap() += 1;
            self.capacity
                .lock()
                .unwrap()
                .pop_front()
                .unwrap_or(CapacityWaiting::Unknown("script ended".into()))
        }
    }

    fn stall_cfg(max: i64, window: Duration) -> LoopConfig {
        let mut c = cfg(max);
        c.rules.stall_window = Some(window);
        c
    }

    /// Warm-up, then `n` failed probes (timing out at 5 s) on a busy NPU (95 %), for at most
    /// an hour of paused time: (prober, state, whether the loop ended, i.e. went abnormal).
    async fn busy_run(
        cfg: &LoopConfig,
        n: usize,
        signals: &impl EngineSignals,
    ) -> (FakeProber, ViState, bool) {
        let mut script = vec![(MS, FakeProber::ok())];
        script.extend((0..n).map(|_| (Duration::from_secs(10), FakeProber::fail())));
        let (p, peaks) = (FakeProber::new(script), Peaks::new(vec![Some(95.0); n]));
        let st = ViState::default();
        let ended = run_with(cfg, &p, &peaks, signals, &st, Duration::from_secs(3600)).await;
        (p, st, ended)
    }

    // Stall detection off (the reference): a busy NPU resets the count however long the
    // engine is stuck.
    #[tokio::test(start_paused = true)]
    async fn busy_failures_never_count_without_stall_detection() {
        let stalled = ScriptedSignals::stalled_from(Some(Instant::now()));
        let (_, st, ended) = busy_run(&cfg(6), 50, &stalled).await;
        assert!(!ended);
        assert_eq!(
            st.outcomes(),
            (1, 50),
            "50 busy failures at 5 s + 20 s, no verdict"
        );
        assert!(!st.abnormal());
        assert_eq!(st.failure_count(), 0);
        assert_eq!(st.last_probe().unwrap().accounting, Accounting::Reset);
    }

    // Stall detection on: busy failures reset until the engine has been stalled for the
    // window, then count; abnormal after max_failure_count counted probes.
    #[tokio::test(start_paused = true)]
    async fn stalled_busy_failures_count_after_the_stall_window() {
        let start = Instant::now();
        let stalled = ScriptedSignals::stalled_from(Some(start));
        let window = Duration::from_secs(60);
        let (p, st, ended) = busy_run(&stall_cfg(3, window), 20, &stalled).await;
        assert!(ended && st.abnormal());
        // Probe k (1-based) ends at 1 ms + k·5 s + (k−1)·20 s: probes ending before 60 s of
        // stall reset (k = 1, 2: 5 s, 30 s), k = 3 ends at 55 s (reset), k = 4 at 80 s counts.
        assert_eq!(
            p.calls().len(),
            1 + 3 + 3,
            "3 resetting probes, then 3 counted"
        );
        let reason = st.abnormal_reason().unwrap();
        assert!(reason.contains("no token advanced"), "{reason}");
        assert_eq!(
            st.last_probe().unwrap().accounting,
            Accounting::IncrementedStalled
        );
        // Within stall_window + max_failure_count probes (each 5 s + 20 s busy interval), on
        // the paused clock.
        assert!(start.elapsed() <= window + 3 * Duration::from_secs(25) + Duration::from_secs(25));
    }

    /// Progress fed as the scraper would, one scrape per failed busy probe: one request
    /// running and both token counters flat, as vLLM shows a long prefill (it reports a
    /// prompt only when its first token comes out) and a stuck engine alike.
    #[derive(Default)]
    struct FlatCounters(Mutex<crate::qos::progress::Progress>);

    impl EngineSignals for FlatCounters {
        fn stalled_for(&self) -> Option<Duration> {
            let mut g = self.0.lock().unwrap();
            let m = crate::probe::engine_metrics::EngineMetrics {
                running: Some(1.0),
                prompt_tokens: Some(0.0),
                generation_tokens: Some(0.0),
                ..Default::default()
            };
            g.observe(Some(&m), Instant::now());
            g.stalled_for(Instant::now(), Duration::from_secs(60))
        }
        async fn waiting_for_capacity(&self) -> CapacityWaiting {
            CapacityWaiting::NotExported
        }
    }

    // A long prefill with nothing else decoding, on vLLM: the counters are flat, but chunked
    // prefill still serves some probes beside the prefill's chunks (here one in four; the
    // rest time out on the busy NPU). A served probe is evidence of life, so with stall
    // detection on the engine is never abnormal. The same counters with no probe served (a
    // stuck engine) are abnormal.
    #[tokio::test(start_paused = true)]
    async fn long_prefill_is_not_a_stall() {
        let cfg = stall_cfg(3, Duration::from_secs(60));
        let mut script = vec![(MS, FakeProber::ok())];
        for i in 0..40 {
            script.push(if i % 4 == 0 {
                (Duration::from_secs(2), FakeProber::ok())
            } else {
                (Duration::from_secs(10), FakeProber::fail())
            });
        }
        let (p, peaks) = (FakeProber::new(script), Peaks::new(vec![Some(95.0); 40]));
        let st = ViState::default();
        let signals = FlatCounters::default();
        let ended = run_with(&cfg, &p, &peaks, &signals, &st, Duration::from_secs(3600)).await;
        assert!(!ended && !st.abnormal(), "{:?}", st.abnormal_reason());
        assert!(st.failure_count() <= 1, "{}", st.failure_count());
        assert!(
            signals.stalled_for().unwrap() >= Duration::from_secs(600),
            "the counters alone say stalled"
        );
        let (_, st, ended) = busy_run(&cfg, 30, &FlatCounters::default()).await;
        assert!(ended && st.abnormal());
    }

    // Unknown progress (no scrape) never counts, even with stall detection on.
    #[tokio::test(start_paused = true)]
    async fn unknown_progress_never_counts() {
        let unknown = ScriptedSignals::stalled_from(None);
        let (_, st, ended) = busy_run(&stall_cfg(3, Duration::from_secs(60)), 20, &unknown).await;
        assert!(!ended);
        assert_eq!(st.failure_count(), 0);
    }

    // V6 rule: an idle failure is skipped while requests wait for capacity or the figure is
    // unknown; counted at 0 and when the engine does not export the series. Off by default:
    // never read.
    #[tokio::test(start_paused = true)]
    async fn capacity_waiting_rule() {
        let mut script = vec![(MS, FakeProber::ok())];
        script.extend((0..4).map(|_| (MS, FakeProber::fail())));
        let p = FakeProber::new(script);
        let peaks = Peaks::new(vec![Some(0.0); 4]);
        let st = ViState::default();
        let signals = ScriptedSignals::capacity(vec![
            CapacityWaiting::Waiting(2.0),
            CapacityWaiting::Unknown("scrape failed".into()),
            CapacityWaiting::Waiting(0.0),
            CapacityWaiting::NotExported,
        ]);
        let mut v6 = cfg(6);
        v6.rules.skip_when_capacity_waiting = true;
        run_with(&v6, &p, &peaks, &signals, &st, Duration::from_secs(30)).await;
        assert_eq!(*signals.capacity_reads.lock().unwrap(), 4);
        assert_eq!(
            st.failure_count(),
            2,
            "2 waiting, unknown: skipped; 0 waiting, series not exported (vLLM 0.18): counted"
        );
        let p = FakeProber::new(vec![(MS, FakeProber::ok()), (MS, FakeProber::fail())]);
        let peaks = Peaks::new(vec![Some(0.0)]);
        let st = ViState::default();
        let signals = ScriptedSignals::capacity(vec![CapacityWaiting::Waiting(2.0)]);
        run_with(&cfg(6), &p, &peaks, &signals, &st, Duration::from_secs(4)).await;
        assert_eq!(*signals.capacity_reads.lock().unwrap(), 0, "V5: not read");
        assert_eq!(st.failure_count(), 1);
    }

    /// The same peak over any window.
    struct ConstPeak(f64);
    impl PeakSource for ConstPeak {
        fn peak(&self, _: Duration) -> Option<f64> {
            Some(self.0)
        }
    }

    /// The agent policy's signals, fixed.
    struct AgentSignals {
        health_failed: bool,
        fresh: crate::monitor::inputs::FreshMetrics,
    }
    impl EngineSignals for AgentSignals {
        fn stalled_for(&self) -> Option<Duration> {
            None
        }
        async fn waiting_for_capacity(&self) -> CapacityWaiting {
            CapacityWaiting::NotExported
        }
        fn health_failed_since(&self, _: Instant) -> bool {
            self.health_failed
        }
        async fn fresh(&self) -> crate::monitor::inputs::FreshMetrics {
            self.fresh.clone()
        }
    }

    fn agent_signals(health_failed: bool, asleep: bool, tokens: f64) -> AgentSignals {
        AgentSignals {
            health_failed,
            fresh: crate::monitor::inputs::FreshMetrics {
                asleep: Some(asleep),
                tokens: Some(tokens),
                capacity: None,
            },
        }
    }

    /// The agent policy's loop on an idle NPU, for at most `limit`; true when it ended.
    async fn run_agent(
        p: &FakeProber,
        signals: &impl EngineSignals,
        st: &ViState,
        limit: Duration,
    ) -> bool {
        run_with(&agent_cfg(), p, &ConstPeak(0.0), signals, st, limit).await
    }

    fn agent_cfg() -> LoopConfig {
        let mut c = cfg(6);
        c.rules.agent = Some(account::AgentRules {
            confirm_failures: 2,
            confirm_interval: Duration::from_secs(1),
            confirm_timeout: Duration::from_secs(2),
            progress_window: None,
            learned_timeout_floor: None,
        });
        c
    }

    /// The agent policy with issue 40's evidence at its defaults (rules 11 and 12).
    fn evidence_cfg() -> LoopConfig {
        let mut c = agent_cfg();
        if let Some(a) = c.rules.agent.as_mut() {
            a.progress_window = Some(Duration::from_secs(8));
            a.learned_timeout_floor = Some(Duration::from_millis(500));
        }
        c
    }

    // Issue 42: under the agent policy the log says at which count a confirmed failure is
    // abnormal, and the abnormal line says why it came before the reference's maximum; the
    // reference keeps MindIE's wording.
    #[test]
    fn the_failure_count_lines_say_what_makes_the_engine_abnormal() {
        let (reference, agent) = (cfg(6).rules, agent_cfg().rules);
        assert_eq!(count_words(&reference, 1), "1/6");
        assert_eq!(
            count_words(&agent, 1),
            "1/6 (agent policy: abnormal at 2 when confirmed)"
        );
        let at = |count, accounting| account::Accounted {
            accounting,
            count,
            abnormal: Some(String::new()),
            why: Some("no sign of life for 8.0 s".to_owned()),
            stalled: None,
        };
        assert_eq!(
            abnormal_words(&reference, &at(6, Accounting::Incremented)),
            "Reach maximum failure count (6); status is abnormal"
        );
        assert_eq!(
            abnormal_words(&agent, &at(6, Accounting::Incremented)),
            "Reach maximum failure count (6); status is abnormal"
        );
        assert_eq!(
            abnormal_words(&agent, &at(2, Accounting::Incremented)),
            "Reach confirmed failure count (2, agent policy: confirm_failures); status is abnormal"
        );
        assert_eq!(
            abnormal_words(&agent, &at(1, Accounting::NoSignOfLife)),
            "Abnormal at failure count 1 (no sign of life for 8.0 s); status is abnormal"
        );
    }

    // Rule 12: an idle engine that answered in 20 ms is given 500 ms (the floor), not 5 s,
    // before the loop counts the failure and re-probes; the request itself waits on to the
    // request timeout, and so does the confirming re-probe, which is sent 1.5 s in: the hang
    // is abnormal 5 s after the first failing probe was sent (8 s without the rule).
    #[tokio::test(start_paused = true)]
    async fn agent_policy_learns_the_probe_timeout_from_the_engines_answers() {
        let mut script = vec![(MS, FakeProber::ok())];
        script.extend((0..3).map(|_| (Duration::from_millis(20), FakeProber::ok())));
        script.extend((0..5).map(|_| (Duration::from_secs(600), FakeProber::ok())));
        let p = FakeProber::new(script);
        let st = ViState::default();
        let signals = agent_signals(false, false, 100.0);
        let ended = run_with(
            &evidence_cfg(),
            &p,
            &ConstPeak(0.0),
            &signals,
            &st,
            Duration::from_secs(3600),
        )
        .await;
        assert!(ended && st.abnormal());
        let calls = p.calls();
        assert_eq!(
            calls.len(),
            6,
            "warm-up, 3 answers, the failure, one re-probe"
        );
        assert!(
            calls[1..].iter().all(|c| c.1 == Duration::from_secs(5)),
            "every request may answer until the request timeout: {calls:?}"
        );
        assert_eq!(
            calls[5].0 - calls[4].0,
            Duration::from_millis(500 + 1000),
            "learned: the floor, then the confirming interval"
        );
        let last = st.last_probe().unwrap();
        assert_eq!(
            (last.failure_count, last.latency_ms),
            (2, 3500.0),
            "the re-probe waited until the first request's request timeout"
        );
        // A busy NPU keeps the request timeout: its answers are slow for a reason.
        let p = FakeProber::new(vec![
            (MS, FakeProber::ok()),
            (Duration::from_millis(20), FakeProber::ok()),
            (Duration::from_millis(20), FakeProber::ok()),
        ]);
        let st = ViState::default();
        run_with(
            &evidence_cfg(),
            &p,
            &ConstPeak(95.0),
            &signals,
            &st,
            Duration::from_secs(30),
        )
        .await;
        assert_eq!(p.calls()[2].1, Duration::from_secs(5));
    }

    /// Warm-up, three answers in 20 ms (the engine's fast past), then every answer after
    /// `then` (`None`: never), on an idle NPU under the agent policy with issue 40's evidence,
    /// for a minute: (abnormal, how long its detection took, the failure count at the end).
    async fn after_a_fast_past(then: Option<Duration>) -> (bool, Option<Duration>, i64) {
        let mut script = vec![(MS, FakeProber::ok())];
        script.extend((0..3).map(|_| (Duration::from_millis(20), FakeProber::ok())));
        let then = then.unwrap_or(Duration::from_secs(600));
        script.extend((0..30).map(|_| (then, FakeProber::ok())));
        let p = FakeProber::new(script);
        let st = ViState::default();
        let signals = agent_signals(false, false, 100.0);
        let limit = Duration::from_secs(60);
        run_with(&evidence_cfg(), &p, &ConstPeak(0.0), &signals, &st, limit).await;
        let (_, n, took) = st.detection_histogram();
        let took = (n > 0).then(|| Duration::from_secs_f64(took));
        (st.abnormal(), took, st.failure_count())
    }

    // Issue 48, R2: an idle engine whose answers turn slow after a fast past. The learned
    // timeout (500 ms) passes and the failure counts, but the request waits on to the request
    // timeout and the confirming re-probe waits until then too: an answer within the request
    // timeout is an answer, the count goes back to 0, and the slow pace widens the learned
    // timeout. Only an engine that leaves a request unanswered for the whole request timeout
    // is confirmed hung, 5 s after that request was sent. (Before: 2.1 s answers were
    // confirmed a hang 3.5 s in, as the attack found; 1.5 s ones were not.)
    #[tokio::test(start_paused = true)]
    async fn a_slow_engine_that_still_answers_is_never_confirmed_hung() {
        let ms = |n| Some(Duration::from_millis(n));
        let rows: [(&str, Option<Duration>, bool, Option<Duration>); 6] = [
            ("1.5 s answers", ms(1500), false, None),
            ("2.1 s answers (the attack's least)", ms(2100), false, None),
            ("3 s answers (the attack's most)", ms(3000), false, None),
            (
                "4.9 s answers: within the request timeout",
                ms(4900),
                false,
                None,
            ),
            (
                "6 s answers: past the request timeout (a failure by the reference's measure too)",
                ms(6000),
                true,
                Some(Duration::from_secs(5)),
            ),
            (
                "no answer: a hang",
                None,
                true,
                Some(Duration::from_secs(5)),
            ),
        ];
        for (what, then, abnormal, took) in rows {
            let (was, detected, count) = after_a_fast_past(then).await;
            assert_eq!((was, detected), (abnormal, took), "{what}");
            if !abnormal {
                assert_eq!(count, 0, "{what}: the last answer reset the count");
            }
        }
    }

    // A late answer comes while the loop pauses before its re-probe: it ends the pause and
    // is accounted as the answer it is (the count back to 0, the learned timeout widened to
    // the request timeout), so no re-probe is sent for it.
    #[tokio::test(start_paused = true)]
    async fn a_late_answer_during_the_pause_resets_the_count_and_widens_the_timeout() {
        let mut script = vec![(MS, FakeProber::ok())];
        script.extend((0..3).map(|_| (Duration::from_millis(20), FakeProber::ok())));
        script.push((Duration::from_millis(1200), FakeProber::ok()));
        script.extend((0..3).map(|_| (Duration::from_millis(1200), FakeProber::ok())));
        let p = FakeProber::new(script);
        let st = ViState::default();
        let signals = agent_signals(false, false, 100.0);
        let limit = Duration::from_secs(30);
        run_with(&evidence_cfg(), &p, &ConstPeak(0.0), &signals, &st, limit).await;
        let calls = p.calls();
        assert!(calls.len() >= 6, "{calls:?}");
        assert_eq!(
            calls[5].0 - calls[4].0,
            Duration::from_millis(1200) + Duration::from_secs(5),
            "answered 1.2 s in (during the 1 s confirming pause that began at 0.5 s), then the regular interval: no re-probe"
        );
        assert!(!st.abnormal());
        let (ok, failed) = st.outcomes();
        assert!(
            failed == 1 && ok >= 5,
            "{ok} answers, {failed} missed timeout"
        );
        assert_eq!(
            calls[6].0 - calls[5].0,
            Duration::from_millis(1200) + Duration::from_secs(5),
            "the learned timeout now waits for the slow pace: no failure"
        );
    }

    /// The log lines the code under test writes on this thread while the guard lives.
    #[derive(Clone, Default)]
    struct Lines(Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Lines {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    impl Lines {
        fn capture(&self) -> tracing::subscriber::DefaultGuard {
            let w = self.clone();
            tracing::subscriber::set_default(
                tracing_subscriber::fmt()
                    .with_writer(move || w.clone())
                    .with_ansi(false)
                    .finish(),
            )
        }
        fn text(&self) -> String {
            String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
        }
    }

    /// Quiet from the instant it holds (for 5 s already then), with `running` requests by the
    /// engine's count.
    struct QuietWith(Instant, f64);
    impl EngineSignals for QuietWith {
        fn stalled_for(&self) -> Option<Duration> {
            None
        }
        fn quiet_for(&self) -> Option<Duration> {
            let now = Instant::now();
            (now >= self.0).then(|| now - self.0 + Duration::from_secs(5))
        }
        fn requests_running(&self) -> Option<f64> {
            Some(self.1)
        }
        async fn waiting_for_capacity(&self) -> CapacityWaiting {
            CapacityWaiting::NotExported
        }
    }

    // Issue 48: the line that says why a quiet engine woke the loop says "requests running"
    // only when the engine counts some; one quiet with none running (its NPU busy, or the
    // engine idle after a busy blip) says so.
    #[tokio::test(start_paused = true)]
    async fn the_quiet_line_says_requests_running_only_when_the_engine_counts_them() {
        for (running, npu, says, never) in [
            (
                0.0,
                95.0,
                "no request running by the engine's count but its NPU was busy, and no sign of life",
                "requests running",
            ),
            (
                2.0,
                95.0,
                "2 requests running, and no sign of life",
                "no request",
            ),
            (
                0.0,
                0.0,
                "(the NPU is idle now: the idle rules decide)",
                "requests running",
            ),
        ] {
            let lines = Lines::default();
            let _guard = lines.capture();
            let p = FakeProber::new(vec![(MS, FakeProber::ok()), (MS, FakeProber::ok())]);
            let signals = QuietWith(Instant::now() + Duration::from_secs(3), running);
            let st = ViState::default();
            let limit = Duration::from_secs(8);
            run_with(&evidence_cfg(), &p, &ConstPeak(npu), &signals, &st, limit).await;
            let text = lines.text();
            let line = text
                .lines()
                .find(|l| l.contains("probing now"))
                .unwrap_or_else(|| panic!("no wake line: {text}"));
            assert!(
                line.contains(says) && !line.contains(never),
                "{running} running: {line}"
            );
        }
    }

    /// An engine that goes quiet at `from` (its last scrape before then counted: the quiet
    /// reads 5 s at once, as the first flat scrape shows it), and comes back to life at
    /// `until`.
    struct Quiet {
        from: Instant,
        until: Option<Instant>,
    }
    impl EngineSignals for Quiet {
        fn stalled_for(&self) -> Option<Duration> {
            self.quiet_for()
        }
        fn quiet_for(&self) -> Option<Duration> {
            let now = Instant::now();
            (now >= self.from && self.until.is_none_or(|u| now < u))
                .then(|| now - self.from + Duration::from_secs(5))
        }
        async fn waiting_for_capacity(&self) -> CapacityWaiting {
            CapacityWaiting::NotExported
        }
    }

    // Rule 11, busy but stuck: the loop sleeps the busy interval (20 s), the engine shows
    // quiet 10 s in (since 5 s in); the loop probes at once with a timeout that reaches the 8 s window (3 s),
    // and the failure is abnormal: no sign of life. 6 s after the quiet began, not ~50 s.
    #[tokio::test(start_paused = true)]
    async fn agent_policy_probes_a_quiet_engine_and_finds_no_sign_of_life() {
        let start = Instant::now();
        let p = FakeProber::new(vec![
            (MS, FakeProber::ok()),
            (Duration::from_millis(200), FakeProber::ok()),
            (Duration::from_secs(600), FakeProber::ok()),
        ]);
        let st = ViState::default();
        let signals = Quiet {
            from: start + Duration::from_secs(10),
            until: None,
        };
        let ended = run_with(
            &evidence_cfg(),
            &p,
            &ConstPeak(95.0),
            &signals,
            &st,
            Duration::from_secs(3600),
        )
        .await;
        assert!(ended && st.abnormal());
        let calls = p.calls();
        assert_eq!(calls.len(), 3, "{calls:?}");
        let waited = st.last_probe().unwrap().latency_ms;
        assert!(
            waited > 2900.0 && waited <= 3000.0,
            "to the window: 8 s - 5 s and the time since the quiet showed: {waited} ms"
        );
        let woke = calls[2].0 - start;
        assert!(
            woke >= Duration::from_secs(10) && woke < Duration::from_millis(10200),
            "probed within a pause poll of the quiet: {woke:?}"
        );
        let why = st.abnormal_reason().unwrap();
        assert!(why.contains("no sign of life for 8.0 s"), "{why}");
        assert_eq!(st.failure_count(), 1);
        // Off (progress_window = 0s): the busy interval runs its course, no abnormal.
        let p = FakeProber::new(vec![
            (MS, FakeProber::ok()),
            (Duration::from_millis(200), FakeProber::ok()),
            (Duration::from_secs(600), FakeProber::ok()),
        ]);
        let st = ViState::default();
        let signals = Quiet {
            from: Instant::now() + Duration::from_secs(3),
            until: None,
        };
        run_with(
            &agent_cfg(),
            &p,
            &ConstPeak(95.0),
            &signals,
            &st,
            Duration::from_secs(15),
        )
        .await;
        assert!(!st.abnormal());
        assert_eq!(p.calls().len(), 2, "no wake: the busy interval runs");
    }

    // A long prefill with chunked prefill off, within the window: one flat step. The quiet
    // wakes the loop once; the probe waits for the step and is answered: never abnormal, and
    // no second wake within the window.
    #[tokio::test(start_paused = true)]
    async fn a_quiet_step_that_ends_within_the_window_is_not_abnormal() {
        let start = Instant::now();
        let p = FakeProber::new(vec![
            (MS, FakeProber::ok()),
            (Duration::from_millis(200), FakeProber::ok()),
            (Duration::from_millis(2500), FakeProber::ok()),
            (Duration::from_millis(200), FakeProber::ok()),
        ]);
        let st = ViState::default();
        let signals = Quiet {
            from: start + Duration::from_secs(3),
            until: Some(start + Duration::from_secs(7)),
        };
        run_with(
            &evidence_cfg(),
            &p,
            &ConstPeak(95.0),
            &signals,
            &st,
            Duration::from_secs(30),
        )
        .await;
        assert!(!st.abnormal());
        let calls = p.calls();
        assert!(calls.len() >= 3, "{calls:?}");
        assert!(
            calls.len() == 3 || calls[3].0 - start >= Duration::from_secs(20),
            "one wake, then the busy interval: {calls:?}"
        );
    }

    /// Warm-up, then probes that never answer, on an idle NPU.
    fn hung() -> FakeProber {
        let mut script = vec![(MS, FakeProber::ok())];
        script.extend((0..10).map(|_| (Duration::from_secs(600), FakeProber::ok())));
        FakeProber::new(script)
    }

    // Idle hang under the agent policy: the first failure (5 s timeout) is re-probed after
    // 1 s with a 2 s timeout; idle throughout and no token advancing, it confirms.
    #[tokio::test(start_paused = true)]
    async fn agent_policy_confirms_an_idle_hang_with_one_quick_reprobe() {
        let p = hung();
        let st = ViState::default();
        let signals = agent_signals(false, false, 100.0);
        let start = Instant::now();
        let ended = run_agent(&p, &signals, &st, Duration::from_secs(3600)).await;
        assert!(ended && st.abnormal());
        let calls = p.calls();
        assert_eq!(calls.len(), 3, "warm-up, the failure, one re-probe");
        assert_eq!(calls[1].1, Duration::from_secs(5));
        assert_eq!(
            calls[2].1,
            Duration::from_secs(5),
            "sent to wait up to the request timeout"
        );
        assert_eq!(
            st.last_probe().unwrap().latency_ms,
            2000.0,
            "the confirming timeout: the first request had its whole 5 s"
        );
        assert_eq!(calls[2].0 - calls[1].0, Duration::from_secs(5 + 1));
        assert_eq!(st.failure_count(), 2);
        assert!(
            st.abnormal_reason().unwrap().contains("confirmed"),
            "{:?}",
            st.abnormal_reason()
        );
        // 1 ms warm-up, 5 s, 1 s, 2 s, then the last sleep (1 s) before the loop sees it.
        assert_eq!(start.elapsed(), Duration::from_secs(9) + MS);
        // The reference, same engine: six failures 10 s apart.
        let p = hung();
        let st = ViState::default();
        let start = Instant::now();
        assert!(
            run_with(
                &cfg(6),
                &p,
                &ConstPeak(0.0),
                &signals,
                &st,
                Duration::from_secs(3600)
            )
            .await
        );
        assert_eq!(p.calls().len(), 7);
        assert_eq!(start.elapsed(), Duration::from_secs(60) + MS);
    }

    // Tokens advancing between the failures: counted, not confirmed; the reference's six
    // still apply.
    #[tokio::test(start_paused = true)]
    async fn agent_policy_does_not_confirm_while_tokens_advance() {
        struct Advancing(Mutex<f64>);
        impl EngineSignals for Advancing {
            fn stalled_for(&self) -> Option<Duration> {
                None
            }
            async fn waiting_for_capacity(&self) -> CapacityWaiting {
                CapacityWaiting::NotExported
            }
            async fn fresh(&self) -> crate::monitor::inputs::FreshMetrics {
                let mut t = self.0.lock().unwrap();
                *t += 10.0;
                crate::monitor::inputs::FreshMetrics {
                    asleep: Some(false),
                    tokens: Some(*t),
                    capacity: None,
                }
            }
        }
        let p = hung();
        let st = ViState::default();
        let ended = run_agent(
            &p,
            &Advancing(Mutex::new(0.0)),
            &st,
            Duration::from_secs(3600),
        )
        .await;
        assert!(ended && st.abnormal());
        assert_eq!(p.calls().len(), 7, "six failures: never confirmed");
        assert!(!st.abnormal_reason().unwrap().contains("confirmed"));
    }

    // The agent policy with the V6 rule on: a failed probe on an idle NPU needs both the
    // agent's evidence and the capacity figure, and takes both from one read of the engine
    // (the separate capacity read is not made). The figure read is the one applied: 2
    // requests waiting skip the failure.
    #[tokio::test(start_paused = true)]
    async fn agent_policy_with_the_v6_rule_reads_the_engine_once_per_failure() {
        struct OneRead {
            fresh: Mutex<u32>,
            capacity: Mutex<u32>,
        }
        impl EngineSignals for OneRead {
            fn stalled_for(&self) -> Option<Duration> {
                None
            }
            async fn waiting_for_capacity(&self) -> CapacityWaiting {
                *self.capacity.lock().unwrap() += 1;
                CapacityWaiting::NotExported
            }
            async fn fresh(&self) -> FreshMetrics {
                *self.fresh.lock().unwrap() += 1;
                FreshMetrics {
                    asleep: Some(false),
                    tokens: Some(1.0),
                    capacity: Some(CapacityWaiting::Waiting(2.0)),
                }
            }
        }
        let mut c = agent_cfg();
        c.rules.skip_when_capacity_waiting = true;
        let mut script = vec![(MS, FakeProber::ok())];
        script.extend((0..3).map(|_| (MS, FakeProber::fail())));
        let p = FakeProber::new(script);
        let st = ViState::default();
        let signals = OneRead {
            fresh: Mutex::new(0),
            capacity: Mutex::new(0),
        };
        run_with(
            &c,
            &p,
            &ConstPeak(0.0),
            &signals,
            &st,
            Duration::from_secs(30),
        )
        .await;
        assert_eq!(*signals.fresh.lock().unwrap(), 3, "one read per failure");
        assert_eq!(*signals.capacity.lock().unwrap(), 0, "no second read");
        assert_eq!(st.failure_count(), 0, "requests wait for capacity: skipped");
    }

    // Hot reload and sleep under the agent policy: failures beside a failing /health, or
    // while the engine is asleep, are not counted at all.
    #[tokio::test(start_paused = true)]
    async fn agent_policy_does_not_count_beside_a_failing_health_or_asleep() {
        for (health_failed, asleep) in [(true, false), (false, true)] {
            let p = hung();
            let st = ViState::default();
            let signals = agent_signals(health_failed, asleep, 1.0);
            let ended = run_agent(&p, &signals, &st, Duration::from_secs(100)).await;
            assert!(
                !ended && !st.abnormal(),
                "health {health_failed} asleep {asleep}"
            );
            assert_eq!(st.failure_count(), 0);
            let want = if health_failed {
                Accounting::UnchangedHealthFailing
            } else {
                Accounting::UnchangedAsleep
            };
            assert_eq!(st.last_probe().unwrap().accounting, want);
            assert!(
                p.calls()
                    .iter()
                    .skip(1)
                    .all(|c| c.1 == Duration::from_secs(5))
            );
        }
    }

    // Agent policy: a busy NPU that falls idle during the busy interval is probed once it has
    // been idle a whole window, with the confirming timeout; the reference sleeps it out.
    // A degraded engine (every answer 3 s late, within the 5 s request timeout) whose load
    // ends: its busy NPU falls idle, and the quick probe must not time out for the engine's
    // known pace. Its timeout is twice the last successful answer (6 s, capped at the 5 s
    // request timeout), not the 2 s confirming timeout; so the engine is never abnormal.
    #[tokio::test(start_paused = true)]
    async fn agent_policy_quick_probes_wait_for_a_slow_engines_known_pace() {
        struct Drop(Instant);
        impl PeakSource for Drop {
            fn peak(&self, _: Duration) -> Option<f64> {
                Some(if Instant::now() < self.0 { 95.0 } else { 0.0 })
            }
        }
        let slow = Duration::from_secs(3);
        let p = FakeProber::new(vec![
            (MS, FakeProber::ok()),
            (slow, FakeProber::ok()),
            (slow, FakeProber::ok()),
            (slow, FakeProber::ok()),
            (slow, FakeProber::ok()),
        ]);
        let st = ViState::default();
        let start = Instant::now();
        let peaks = Drop(start + Duration::from_secs(4));
        run_with(
            &agent_cfg(),
            &p,
            &peaks,
            &NoSignals,
            &st,
            Duration::from_secs(60),
        )
        .await;
        let calls = p.calls();
        assert!(calls.len() >= 4, "{calls:?}");
        assert_eq!(
            calls[2].1,
            Duration::from_secs(5),
            "twice 3 s, capped at the request timeout"
        );
        assert!(!st.abnormal() && st.failure_count() == 0);
        let agent = account::AgentRules {
            confirm_failures: 2,
            confirm_interval: Duration::from_secs(1),
            confirm_timeout: Duration::from_secs(2),
            progress_window: None,
            learned_timeout_floor: None,
        };
        let t = Timing::default();
        for (last_ok, want) in [
            (None, 2000),
            (Some(20), 2000),
            (Some(1500), 3000),
            (Some(3000), 5000),
        ] {
            assert_eq!(
                account::confirm_timeout(&agent, &t, last_ok.map(Duration::from_millis)),
                Duration::from_millis(want),
                "{last_ok:?}"
            );
        }
    }

    // The busy cadence is a state, not read back from the sleep: with `interval` configured
    // equal to `high_load_interval` (10 s) and a 2 s window, an NPU that never was busy is
    // probed every 10 s. Read from the sleep, the regular cadence looked busy, and every
    // pause ended "the NPU fell idle" after 2 s: a probe every ~2 s.
    #[tokio::test(start_paused = true)]
    async fn equal_intervals_do_not_make_an_idle_npu_look_busy() {
        let mut c = agent_cfg();
        c.timing.interval = Duration::from_secs(10);
        c.timing.high_load_interval = Duration::from_secs(10);
        c.timing.window = Duration::from_secs(2);
        let mut script = vec![(MS, FakeProber::ok())];
        script.extend((0..100).map(|_| (MS, FakeProber::ok())));
        let p = FakeProber::new(script);
        let st = ViState::default();
        run_with(
            &c,
            &p,
            &ConstPeak(0.0),
            &NoSignals,
            &st,
            Duration::from_secs(60),
        )
        .await;
        let periodic = p.calls().len() - 1;
        assert!(
            (5..=7).contains(&periodic),
            "{periodic} periodic probes in 60 s at a 10 s cadence"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn agent_policy_probes_when_a_busy_npu_falls_idle() {
        /// 95 % until `idle_from`, then 0.
        struct Drop(Instant);
        impl PeakSource for Drop {
            fn peak(&self, _: Duration) -> Option<f64> {
                Some(if Instant::now() < self.0 { 95.0 } else { 0.0 })
            }
        }
        // The engine answers twice, then (under the agent policy) no more: the probe when the
        // NPU falls idle counts a failure after its quick timeout, and the re-probe follows.
        let hung = (Duration::from_secs(600), FakeProber::ok());
        for agent in [true, false] {
            let mut script = vec![(MS, FakeProber::ok()), (MS, FakeProber::ok())];
            script.extend(if agent {
                [hung.clone(), hung.clone()]
            } else {
                [(MS, FakeProber::ok()), (MS, FakeProber::ok())]
            });
            let p = FakeProber::new(script);
            let st = ViState::default();
            let c = if agent { agent_cfg() } else { cfg(6) };
            let start = Instant::now();
            let peaks = Drop(start + Duration::from_secs(3));
            run_with(&c, &p, &peaks, &NoSignals, &st, Duration::from_secs(30)).await;
            let calls = p.calls();
            let gap = calls[2].0 - calls[1].0;
            if agent {
                // Busy at the first probe: the 20 s interval, cut once a whole 5 s window of
                // it was idle (the NPU idle from 3 s, checked every 0.5 s).
                assert!(
                    gap >= Duration::from_secs(5) && gap < Duration::from_secs(6),
                    "{gap:?}"
                );
                assert_eq!(
                    calls[3].0 - calls[2].0,
                    Duration::from_secs(2 + 1),
                    "the confirming timeout, then the confirming interval"
                );
            } else {
                assert_eq!(gap, Duration::from_secs(20) + MS);
            }
            assert_eq!(
                calls[2].1,
                Duration::from_secs(5),
                "answers count until 5 s"
            );
        }
        // Rule 12: the engine answered in 1 ms, so the probe when the NPU falls idle counts
        // its failure after the learned 500 ms (the floor), not the quick 2 s.
        let p = FakeProber::new(vec![
            (MS, FakeProber::ok()),
            (MS, FakeProber::ok()),
            hung.clone(),
            hung,
        ]);
        let st = ViState::default();
        let peaks = Drop(Instant::now() + Duration::from_secs(3));
        let c = evidence_cfg();
        run_with(&c, &p, &peaks, &NoSignals, &st, Duration::from_secs(30)).await;
        let calls = p.calls();
        assert_eq!(calls[3].0 - calls[2].0, Duration::from_millis(500 + 1000));
    }
    // The faults a request was answered beside: a probe checks those present before and
    // after it; a success remembers them, a failure does not; a cleared fault is forgotten.
    #[test]
    fn answered_faults_table() {
        use crate::driver::fault_levels::FaultLevel;
        let f = |npu: u32, level: FaultLevel| NpuFault {
            npu,
            code: 0x80C9_8001,
            hex: "0x80C98001".into(),
            text: None,
            level,
        };
        let key = |npu: u32| (npu, 0x80C9_8001u32);
        let set = |npus: &[u32]| -> Checked { npus.iter().map(|n| key(*n)).collect() };
        let serious_level = FaultLevel::RestartNPU;
        /// (what, answered before, faults before the probe, faults after, failed) →
        /// (checked, answered after)
        type Row = (
            &'static str,
            Checked,
            Checked,
            Vec<NpuFault>,
            bool,
            Checked,
            Checked,
        );
        let rows: Vec<Row> = vec![
            (
                "a success beside a standing fault remembers it",
                set(&[]),
                set(&[1]),
                vec![f(1, serious_level)],
                false,
                set(&[1]),
                set(&[1]),
            ),
            (
                "a failure does not",
                set(&[]),
                set(&[1]),
                vec![f(1, serious_level)],
                true,
                set(&[1]),
                set(&[]),
            ),
            (
                "a fault that appeared during the probe was not checked",
                set(&[]),
                set(&[]),
                vec![f(1, serious_level)],
                false,
                set(&[]),
                set(&[]),
            ),
            (
                "a cleared fault is forgotten",
                set(&[1, 2]),
                set(&[1, 2]),
                vec![f(2, serious_level)],
                true,
                set(&[2]),
                set(&[2]),
            ),
            (
                "below the confirming level nothing is checked",
                set(&[]),
                set(&[]),
                vec![f(1, FaultLevel::SubHealthFault)],
                false,
                set(&[]),
                set(&[]),
            ),
        ];
        for (what, mut answered, before, after, failed, checked, answered_after) in rows {
            assert_eq!(
                remember_answered(&mut answered, &before, &after, failed),
                checked,
                "{what}"
            );
            assert_eq!(answered, answered_after, "{what}");
        }
        // A remembered fault no longer explains a failure; another one does.
        let faults = [f(1, FaultLevel::SeparateNPU), f(2, serious_level)];
        assert_eq!(
            unanswered_worst(&faults, &set(&[1])).map(|f| f.npu),
            Some(2)
        );
        assert_eq!(unanswered_worst(&faults, &set(&[])).map(|f| f.npu), Some(1));
        assert_eq!(unanswered_worst(&faults, &set(&[1, 2])), None);
    }

    /// A busy NPU (95 %) whose driver reports `fault` (at `level`) from `from` on.
    struct FaultAt {
        from: Instant,
        level: crate::driver::fault_levels::FaultLevel,
    }
    impl PeakSource for FaultAt {
        fn peak(&self, _: Duration) -> Option<f64> {
            Some(95.0)
        }
        fn faults(&self) -> Vec<NpuFault> {
            if Instant::now() < self.from {
                return Vec::new();
            }
            vec![NpuFault {
                npu: 3,
                code: 0x80C9_8001,
                hex: "0x80C98001".into(),
                text: Some("AI Core reset failed".into()),
                level: self.level,
            }]
        }
    }

    // Under load (the 20 s busy interval), a driver fault at RestartBusiness or worse makes
    // the loop probe at once with the confirming timeout; the engine hangs, so the failure
    // is abnormal at once, naming the fault. The reference sleeps on.
    #[tokio::test(start_paused = true)]
    async fn agent_policy_confirms_a_driver_fault_with_an_immediate_probe() {
        use crate::driver::fault_levels::FaultLevel;
        let hung_after_first = || {
            FakeProber::new(vec![
                (MS, FakeProber::ok()),
                (MS, FakeProber::ok()),
                (Duration::from_secs(600), FakeProber::ok()),
                (Duration::from_secs(600), FakeProber::ok()),
            ])
        };
        let p = hung_after_first();
        let st = ViState::default();
        let start = Instant::now();
        let peaks = FaultAt {
            from: start + Duration::from_secs(7),
            level: FaultLevel::RestartNPU,
        };
        let ended = run_with(
            &agent_cfg(),
            &p,
            &peaks,
            &NoSignals,
            &st,
            Duration::from_secs(60),
        )
        .await;
        assert!(ended && st.abnormal());
        let calls = p.calls();
        assert_eq!(
            calls.len(),
            3,
            "warm-up, a busy success, the confirming probe"
        );
        let woke = calls[2].0 - start;
        assert!(
            woke >= Duration::from_secs(7) && woke <= Duration::from_secs(7) + FAULT_POLL,
            "probed {woke:?} after the start, the fault came at 7 s"
        );
        assert_eq!(
            st.last_probe().unwrap().latency_ms,
            2000.0,
            "the confirming timeout"
        );
        assert_eq!(st.failure_count(), 1);
        assert_eq!(st.last_probe().unwrap().accounting, Accounting::DriverFault);
        let why = st.abnormal_reason().unwrap();
        assert!(
            why.contains("NPU 3 reports 0x80C98001 (AI Core reset failed), level RestartNPU"),
            "{why}"
        );
        // The reference: no wake; the busy failure resets.
        let p = hung_after_first();
        let st = ViState::default();
        let start = Instant::now();
        let peaks = FaultAt {
            from: start + Duration::from_secs(7),
            level: FaultLevel::SeparateNPU,
        };
        assert!(
            !run_with(
                &cfg(6),
                &p,
                &peaks,
                &NoSignals,
                &st,
                Duration::from_secs(60)
            )
            .await
        );
        let calls = p.calls();
        assert_eq!(calls[2].0 - calls[1].0, Duration::from_secs(20) + MS);
        assert!(!st.abnormal());
    }

    // A confirming probe that succeeds leaves the engine normal, and the same fault does not
    // wake the loop again; a SubHealthFault never wakes it.
    #[tokio::test(start_paused = true)]
    async fn a_driver_fault_on_an_engine_that_answers_is_published_only() {
        use crate::driver::fault_levels::FaultLevel;
        for (level, wakes) in [
            (FaultLevel::SeparateNPU, true),
            (FaultLevel::SubHealthFault, false),
            (FaultLevel::RestartRequest, false),
        ] {
            // The fourth periodic probe fails (a timeout under load) with the fault still
            // reported: once a request was answered beside it, the fault no longer explains
            // a failure, and a busy failure resets as without it.
            let mut script: Vec<_> = (0..4).map(|_| (MS, FakeProber::ok())).collect();
            script.push((Duration::from_secs(600), FakeProber::ok()));
            script.push((MS, FakeProber::ok()));
            let p = FakeProber::new(script);
            let st = ViState::default();
            let start = Instant::now();
            let peaks = FaultAt {
                from: start + Duration::from_secs(3),
                level,
            };
            run_with(
                &agent_cfg(),
                &p,
                &peaks,
                &NoSignals,
                &st,
                Duration::from_secs(100),
            )
            .await;
            let at: Vec<Duration> = p.calls().iter().map(|c| c.0 - start).collect();
            assert!(!st.abnormal(), "{level}: {:?}", st.abnormal_reason());
            assert!(
                at.len() >= 6,
                "{level}: the failed probe and one after it: {at:?}"
            );
            assert_eq!(st.failure_count(), 0, "{level}");
            if wakes {
                assert!(
                    at[2] >= Duration::from_secs(3) && at[2] <= Duration::from_secs(3) + FAULT_POLL,
                    "{level}: {at:?}"
                );
                assert_eq!(
                    at[3] - at[2],
                    Duration::from_secs(20) + MS,
                    "{level}: no second wake for the same fault"
                );
            } else {
                assert_eq!(
                    at[2] - at[1],
                    Duration::from_secs(20) + MS,
                    "{level}: {at:?}"
                );
            }
        }
    }
}

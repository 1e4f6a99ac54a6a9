//! The observation loop's decisions, with no I/O: a [`State`] of the fault and one [`step`]
//! per sample that says what the sample means (the guards' events, whether to inject or take
//! the fault out, detection, the end of the loop). The loop in `mod.rs` reads the stack,
//! calls [`step`] and carries out its [`Action`]; each rule here reads and tests alone.

use crate::experiment::{Expect, Experiment, Fault, Guard, KubeletExpect};
use crate::kubelet::Action as KubeletAction;
use crate::run::outcome::GuardEvent;
use crate::timescale::scaled;
use std::time::Duration;
use tokio::time::Instant;

use super::LATE_KILL_TAIL;

/// What stays fixed over one observation: the experiment's rules with their times scaled.
#[derive(Debug, Clone, Copy)]
pub(super) struct Plan<'a> {
    pub(super) fault: Fault,
    pub(super) expect: Expect,
    pub(super) guards: &'a [Guard],
    /// The scheduled injection.
    pub(super) t0: Instant,
    /// The end of the fault's window.
    pub(super) fault_end: Instant,
    /// `detect_within`, scaled (`None`: a benign experiment).
    pub(super) detect_within: Option<Duration>,
    /// What the kubelet emulator must do (`None`: a Node Manager row).
    pub(super) kubelet: Option<KubeletExpect>,
    /// When the loop stops at the latest.
    pub(super) observe_end: Instant,
}

impl<'a> Plan<'a> {
    /// The plan of `e` at time scale `s`, injected at `t0`.
    pub(super) fn new(
        e: &'a Experiment,
        s: f64,
        t0: Instant,
        kubelet: Option<KubeletExpect>,
    ) -> Self {
        let sc = |d: Duration| scaled(d, s);
        let fault_end = t0 + sc(e.duration);
        let observe_end = match e.expect {
            // Detection counts within `detect_within` of the first injection (guards may
            // delay it); a driver fault is watched longer, since killing the healthy engine
            // for it would be a false kill. (The loop stops earlier, at the deadline counted
            // from the first injection.)
            Expect::DetectWithin(d) if !e.fault.is_driver_fault() => fault_end + sc(d),
            _ => fault_end + sc(LATE_KILL_TAIL),
        };
        let detect_within = match e.expect {
            Expect::DetectWithin(d) => Some(sc(d)),
            Expect::Healthy => None,
        };
        Plan {
            fault: e.fault,
            expect: e.expect,
            guards: &e.guards,
            t0,
            fault_end,
            detect_within,
            kubelet,
            observe_end,
        }
    }

    /// Milliseconds since `t0` (negative before it).
    pub(super) fn rel(&self, t: Instant) -> i64 {
        if t >= self.t0 {
            (t - self.t0).as_millis() as i64
        } else {
            -((self.t0 - t).as_millis() as i64)
        }
    }

    /// Whether the loop goes on after a detection: a driver fault is watched on, and so is
    /// an engine taken out of the load (a restart would still be a false one).
    pub(super) fn watches_on(&self) -> bool {
        self.fault.is_driver_fault() || self.kubelet.is_some_and(|k| k != KubeletExpect::Restart)
    }

    /// Whether the load goes on for [`super::AFTER_KILL_TAIL`] after a loop that ended well
    /// with Node Manager's kill of a faulty engine (so that a router row and a Node Manager
    /// row count what clients saw after the kill over the same time).
    pub(super) fn wants_after_kill_tail(&self, ended_well: bool, killed: bool) -> bool {
        ended_well
            && killed
            && self.kubelet.is_none()
            && self.detect_within.is_some()
            && !self.fault.is_driver_fault()
    }
}

/// Where the fault stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// Not injected yet: the baseline, or a guard holding the first injection back.
    Waiting,
    /// In place since `since`; first injected at `first`.
    Injected { first: Instant, since: Instant },
    /// Taken out again (a skip guard, or the window's end); back in if a skip guard clears
    /// within the window.
    Removed { first: Instant },
    /// Stopped for good by a guard.
    Aborted { first: Instant },
}

impl Phase {
    /// The first injection, if there was one.
    pub(super) fn first(self) -> Option<Instant> {
        match self {
            Phase::Waiting => None,
            Phase::Injected { first, .. } | Phase::Removed { first } | Phase::Aborted { first } => {
                Some(first)
            }
        }
    }

    pub(super) fn is_injected(self) -> bool {
        matches!(self, Phase::Injected { .. })
    }
}

/// What the loop remembers from one sample to the next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct State {
    pub(super) phase: Phase,
    /// A skip guard holds the fault back (its `resumed` event is due when it clears).
    pub(super) skipping: bool,
    /// How long the fault was in place before its current injection.
    pub(super) injected: Duration,
    /// Milliseconds from the first injection to detection, once detected.
    pub(super) detected_after_ms: Option<u64>,
}

impl State {
    pub(super) const START: State = State {
        phase: Phase::Waiting,
        skipping: false,
        injected: Duration::ZERO,
        detected_after_ms: None,
    };

    /// How long the fault was in place in all, up to `now`.
    pub(super) fn injected_until(&self, now: Instant) -> Duration {
        match self.phase {
            Phase::Injected { since, .. } => self.injected + (now - since),
            _ => self.injected,
        }
    }
}

/// What one sample saw (read by the loop before the step).
#[derive(Debug, Clone, Copy)]
pub(super) struct Sample<'a> {
    pub(super) now: Instant,
    /// The engine's queue depth.
    pub(super) depth: Option<f64>,
    /// The agent's QoS score.
    pub(super) score: Option<f64>,
    /// The agent reports an NPU as failing.
    pub(super) flagged: bool,
    /// Tokens the load produced under the fault so far.
    pub(super) tokens_under_fault: u64,
    /// Node Manager's kill, once it came.
    pub(super) killed: Option<Instant>,
    /// What the kubelet emulator did so far (empty in a Node Manager row).
    pub(super) kubelet_log: &'a [(Instant, KubeletAction)],
}

/// What the loop does to the fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Action {
    Leave,
    /// Inject it (`first`: for the first time).
    Inject {
        first: bool,
    },
    /// Take it out.
    Remove,
}

/// What one sample means.
#[derive(Debug)]
pub(super) enum Output {
    /// The experiment cannot go on (the reason).
    Fail(String),
    /// The guards' events, what to do to the fault, and whether the loop ends after this
    /// sample.
    Go {
        events: Vec<GuardEvent>,
        action: Action,
        end: bool,
    },
}

/// One sample's decisions, and the state after them (as if the action succeeds).
pub(super) fn step(state: State, sample: &Sample<'_>, plan: &Plan<'_>) -> (Output, State) {
    let now = sample.now;
    if sample.flagged && state.phase.first().is_none() && plan.fault.is_driver_fault() {
        let why = "an NPU was already reported failing before the driver fault was injected";
        return (Output::Fail(why.to_owned()), state);
    }
    let in_window = now >= plan.t0 && now < plan.fault_end;
    let guarded = guards(state, sample, plan);
    let want = in_window && !guarded.aborted && !guarded.held_back;
    let (action, phase, injected) = transition(state, want, guarded.aborted, sample);
    let mut next = State {
        phase,
        skipping: guarded.skipping,
        injected,
        detected_after_ms: state.detected_after_ms,
    };
    if let (Some(first), None) = (phase.first(), next.detected_after_ms) {
        next.detected_after_ms = detected_at(plan, first, phase.is_injected(), sample)
            .map(|at| (at - first).as_millis() as u64);
    }
    let end = ends(plan, &next, now);
    let events = guarded.events;
    (
        Output::Go {
            events,
            action,
            end,
        },
        next,
    )
}

/// The guards' verdict on one sample.
struct Guarded {
    skipping: bool,
    /// A skip guard held the fault back at this sample.
    held_back: bool,
    aborted: bool,
    events: Vec<GuardEvent>,
}

/// Evaluates every guard, in the file's order: a skip guard holds the fault back while the
/// queue is deep; an abort guard stops an injected fault for good.
fn guards(state: State, sample: &Sample<'_>, plan: &Plan<'_>) -> Guarded {
    let active = state.phase.is_injected();
    let mut g = Guarded {
        skipping: state.skipping,
        held_back: false,
        aborted: matches!(state.phase, Phase::Aborted { .. }),
        events: Vec::new(),
    };
    for guard in plan.guards {
        let mut event = |action: &'static str, detail: String| {
            g.events.push(GuardEvent {
                t_ms: plan.rel(sample.now),
                guard: guard.to_string(),
                action,
                detail,
            })
        };
        match *guard {
            Guard::SkipIfQueueDepth(n) => {
                let deep = sample.depth.is_some_and(|d| d > n as f64);
                let d = sample.depth.unwrap_or_default();
                if deep && !g.skipping {
                    g.skipping = true;
                    event("skipped", format!("queue depth {d} > {n}"));
                } else if !deep && g.skipping {
                    g.skipping = false;
                    event("resumed", format!("queue depth {d} <= {n}"));
                }
                g.held_back |= g.skipping;
            }
            Guard::AbortIfHealth(x) if active && !g.aborted => {
                if let Some(sc) = sample.score.filter(|sc| *sc < x) {
                    g.aborted = true;
                    event("aborted", format!("QoS score {sc:.3} < {x}"));
                }
            }
            Guard::LimitAffectedTokens(n) if active && !g.aborted => {
                let affected = sample.tokens_under_fault;
                if affected > n {
                    g.aborted = true;
                    event(
                        "aborted",
                        format!("{affected} tokens produced under the fault > {n}"),
                    );
                }
            }
            _ => {}
        }
    }
    g
}

/// The fault's next phase: injected when wanted and not in place (never after Node
/// Manager's kill), taken out when in place and not wanted.
fn transition(
    state: State,
    want: bool,
    aborted: bool,
    sample: &Sample<'_>,
) -> (Action, Phase, Duration) {
    let now = sample.now;
    match state.phase {
        Phase::Injected { first, since } if !want => {
            let phase = if aborted {
                Phase::Aborted { first }
            } else {
                Phase::Removed { first }
            };
            (Action::Remove, phase, state.injected + (now - since))
        }
        Phase::Waiting | Phase::Removed { .. } if want && sample.killed.is_none() => {
            let first = state.phase.first();
            let phase = Phase::Injected {
                first: first.unwrap_or(now),
                since: now,
            };
            let action = Action::Inject {
                first: first.is_none(),
            };
            (action, phase, state.injected)
        }
        phase => (Action::Leave, phase, state.injected),
    }
}

/// When the fault counts as detected, within `detect_within` of the first injection (a
/// benign experiment's expected not-ready: while the fault lasts).
fn detected_at(
    plan: &Plan<'_>,
    first: Instant,
    active: bool,
    sample: &Sample<'_>,
) -> Option<Instant> {
    let deadline = plan.detect_within.map_or(plan.fault_end, |d| first + d);
    let kubelet_first = |kinds: &[KubeletAction]| {
        sample
            .kubelet_log
            .iter()
            .find(|(at, a)| *at >= first && kinds.contains(a))
            .map(|(at, _)| *at)
    };
    let at = match (plan.expect, plan.kubelet) {
        (Expect::DetectWithin(_), _) if plan.fault.is_driver_fault() => {
            (sample.flagged && active).then_some(sample.now)
        }
        (Expect::DetectWithin(_), None) => sample.killed.filter(|k| *k >= first),
        (_, Some(k)) => match k {
            KubeletExpect::Restart => {
                kubelet_first(&[KubeletAction::RestartLiveness, KubeletAction::RestartExited])
            }
            KubeletExpect::NotReady => kubelet_first(&[KubeletAction::NotReady]),
            KubeletExpect::NoRestart => None,
        },
        (Expect::Healthy, None) => None,
    };
    at.filter(|at| *at <= deadline)
}

/// Whether the loop ends after this sample: a detected engine fault ends it, and so does an
/// engine fault that can no longer be detected in time (a kubelet run that expects the
/// engine out of the load watches to the end for a restart).
fn ends(plan: &Plan<'_>, next: &State, now: Instant) -> bool {
    if plan.watches_on() {
        return false;
    }
    let too_late = match (plan.detect_within, next.phase.first()) {
        (Some(d), Some(first)) => now > first + d,
        _ => false,
    };
    next.detected_after_ms.is_some() || too_late
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Duration = Duration::from_secs(1);

    /// An experiment of `fault`: 10 s of fault, `expect`, `guards`.
    fn experiment(fault: Fault, expect: Expect, guards: Vec<Guard>) -> Experiment {
        Experiment {
            name: "x".into(),
            target: crate::experiment::Target::Engine,
            fault,
            duration: 10 * SEC,
            load: Default::default(),
            guards,
            expect,
            agent_policy_only: false,
            max_nm_heartbeat_s: None,
            known_false_kills: Vec::new(),
            kubelet: KubeletExpect::Restart,
            driver_codes: Vec::new(),
            repeat: 1,
        }
    }

    fn sample(now: Instant) -> Sample<'static> {
        Sample {
            now,
            depth: Some(0.0),
            score: Some(1.0),
            flagged: false,
            tokens_under_fault: 0,
            killed: None,
            kubelet_log: &[],
        }
    }

    /// The step's events (as `action` words), action and end; panics on `Fail`.
    fn go(output: Output) -> (Vec<&'static str>, Action, bool) {
        match output {
            Output::Go {
                events,
                action,
                end,
            } => (events.iter().map(|e| e.action).collect(), action, end),
            Output::Fail(why) => panic!("failed: {why}"),
        }
    }

    const DETECT: Expect = Expect::DetectWithin(Duration::from_secs(5));

    #[test]
    fn the_baseline_waits_and_the_window_injects_once() {
        let e = experiment(Fault::EngineHang, DETECT, Vec::new());
        let t0 = Instant::now() + SEC;
        let plan = Plan::new(&e, 1.0, t0, None);
        let (out, s) = step(State::START, &sample(t0 - SEC), &plan);
        assert_eq!(go(out), (vec![], Action::Leave, false));
        assert_eq!(s.phase, Phase::Waiting);
        let (out, s) = step(s, &sample(t0), &plan);
        assert_eq!(go(out).1, Action::Inject { first: true });
        assert_eq!(
            s.phase,
            Phase::Injected {
                first: t0,
                since: t0
            }
        );
        let (out, s) = step(s, &sample(t0 + SEC), &plan);
        assert_eq!(go(out).1, Action::Leave, "already in place");
        // The window's end takes it out, and counts the time it was in.
        let (out, s) = step(s, &sample(t0 + 10 * SEC), &plan);
        assert_eq!(go(out).1, Action::Remove);
        assert_eq!(s.phase, Phase::Removed { first: t0 });
        assert_eq!(s.injected, 10 * SEC);
        assert_eq!(s.injected_until(t0 + 20 * SEC), 10 * SEC);
    }

    #[test]
    fn a_skip_guard_holds_the_fault_back_and_lets_it_go() {
        let e = experiment(Fault::EngineHang, DETECT, vec![Guard::SkipIfQueueDepth(10)]);
        let t0 = Instant::now();
        let plan = Plan::new(&e, 1.0, t0, None);
        let deep = |now| Sample {
            depth: Some(11.0),
            ..sample(now)
        };
        let (out, s) = step(State::START, &deep(t0), &plan);
        assert_eq!(go(out), (vec!["skipped"], Action::Leave, false));
        assert!(s.skipping);
        let (out, s) = step(s, &deep(t0 + SEC), &plan);
        assert_eq!(
            go(out),
            (vec![], Action::Leave, false),
            "one event a change"
        );
        let (out, s) = step(s, &sample(t0 + 2 * SEC), &plan);
        assert_eq!(
            go(out),
            (vec!["resumed"], Action::Inject { first: true }, false)
        );
        // Deep again: taken out, and back in (not a first injection) once it clears.
        let (out, s) = step(s, &deep(t0 + 3 * SEC), &plan);
        assert_eq!(go(out), (vec!["skipped"], Action::Remove, false));
        assert_eq!(s.injected, SEC);
        let (out, s) = step(s, &sample(t0 + 4 * SEC), &plan);
        assert_eq!(go(out).1, Action::Inject { first: false });
        assert_eq!(
            s.phase,
            Phase::Injected {
                first: t0 + 2 * SEC,
                since: t0 + 4 * SEC
            }
        );
    }

    #[test]
    fn an_abort_guard_stops_an_injected_fault_for_good() {
        let e = experiment(
            Fault::EngineHang,
            DETECT,
            vec![Guard::AbortIfHealth(0.5), Guard::LimitAffectedTokens(100)],
        );
        let t0 = Instant::now();
        let plan = Plan::new(&e, 1.0, t0, None);
        let sick = |now| Sample {
            score: Some(0.2),
            tokens_under_fault: 500,
            ..sample(now)
        };
        // Not injected yet: nothing to abort.
        let (out, s) = step(
            State::START,
            &Sample {
                now: t0 - SEC,
                ..sick(t0)
            },
            &plan,
        );
        assert_eq!(go(out), (vec![], Action::Leave, false));
        let (_, s) = step(s, &sample(t0), &plan);
        // Both guards would trip; the first one aborts, once.
        let (out, s) = step(s, &sick(t0 + SEC), &plan);
        assert_eq!(go(out), (vec!["aborted"], Action::Remove, false));
        assert_eq!(s.phase, Phase::Aborted { first: t0 });
        let (out, s) = step(s, &sample(t0 + 2 * SEC), &plan);
        assert_eq!(go(out), (vec![], Action::Leave, false), "not again");
        assert_eq!(s.phase, Phase::Aborted { first: t0 });
    }

    #[test]
    fn the_token_limit_aborts_above_its_figure_only() {
        let e = experiment(
            Fault::EngineHang,
            DETECT,
            vec![Guard::LimitAffectedTokens(100)],
        );
        let t0 = Instant::now();
        let plan = Plan::new(&e, 1.0, t0, None);
        let (_, s) = step(State::START, &sample(t0), &plan);
        let tokens = |n, now| Sample {
            tokens_under_fault: n,
            ..sample(now)
        };
        let (out, s) = step(s, &tokens(100, t0 + SEC), &plan);
        assert_eq!(go(out).1, Action::Leave);
        let (out, _) = step(s, &tokens(101, t0 + 2 * SEC), &plan);
        assert_eq!(go(out), (vec!["aborted"], Action::Remove, false));
    }

    #[test]
    fn no_injection_after_node_managers_kill() {
        let e = experiment(Fault::EngineHang, Expect::Healthy, Vec::new());
        let t0 = Instant::now();
        let plan = Plan::new(&e, 1.0, t0, None);
        let killed = Sample {
            killed: Some(t0 - SEC),
            ..sample(t0)
        };
        let (out, s) = step(State::START, &killed, &plan);
        assert_eq!(go(out).1, Action::Leave);
        assert_eq!(s.phase, Phase::Waiting);
    }

    #[test]
    fn a_kill_after_the_injection_and_in_time_is_a_detection_that_ends_the_loop() {
        let e = experiment(Fault::EngineHang, DETECT, Vec::new());
        let t0 = Instant::now();
        let plan = Plan::new(&e, 1.0, t0, None);
        let (_, s) = step(State::START, &sample(t0), &plan);
        let kill = |at, now| Sample {
            killed: Some(at),
            ..sample(now)
        };
        let (out, late) = step(s, &kill(t0 + 6 * SEC, t0 + 6 * SEC), &plan);
        assert_eq!(late.detected_after_ms, None, "after detect_within");
        assert!(go(out).2, "no longer detectable: the loop ends");
        let (out, s) = step(s, &kill(t0 + 2 * SEC, t0 + 3 * SEC), &plan);
        assert_eq!(s.detected_after_ms, Some(2000));
        assert!(go(out).2);
    }

    #[test]
    fn an_engine_fault_ends_the_loop_once_it_can_no_longer_be_detected() {
        let e = experiment(Fault::EngineHang, DETECT, Vec::new());
        let t0 = Instant::now();
        let plan = Plan::new(&e, 1.0, t0, None);
        let (_, s) = step(State::START, &sample(t0), &plan);
        let (out, s) = step(s, &sample(t0 + 5 * SEC), &plan);
        assert!(!go(out).2, "the deadline itself still counts");
        let (out, _) = step(s, &sample(t0 + 5 * SEC + Duration::from_millis(1)), &plan);
        assert!(go(out).2);
        // A benign experiment runs to the end of observation.
        let e = experiment(Fault::EngineHang, Expect::Healthy, Vec::new());
        let plan = Plan::new(&e, 1.0, t0, None);
        let (_, s) = step(State::START, &sample(t0), &plan);
        let (out, _) = step(s, &sample(t0 + 9 * SEC), &plan);
        assert!(!go(out).2);
        assert_eq!(plan.observe_end, t0 + 10 * SEC + LATE_KILL_TAIL);
    }

    #[test]
    fn a_driver_fault_is_detected_by_the_flag_and_watched_on() {
        let e = experiment(Fault::DriverError, DETECT, Vec::new());
        let t0 = Instant::now();
        let plan = Plan::new(&e, 1.0, t0, None);
        assert_eq!(plan.observe_end, t0 + 10 * SEC + LATE_KILL_TAIL);
        let flagged = |now| Sample {
            flagged: true,
            ..sample(now)
        };
        let (out, s) = step(State::START, &flagged(t0 - SEC), &plan);
        assert!(
            matches!(out, Output::Fail(ref why) if why.contains("already reported failing")),
            "{out:?}"
        );
        assert_eq!(s, State::START);
        let (_, s) = step(State::START, &sample(t0), &plan);
        let (out, s) = step(s, &flagged(t0 + SEC), &plan);
        assert_eq!(s.detected_after_ms, Some(1000));
        assert!(!go(out).2, "a driver fault is watched on for a false kill");
        assert!(
            !plan.wants_after_kill_tail(true, true),
            "its kill is a false one"
        );
    }

    #[test]
    fn a_kubelet_row_detects_the_restart_it_expects() {
        let e = experiment(Fault::EngineHang, DETECT, Vec::new());
        let t0 = Instant::now();
        let plan = Plan::new(&e, 1.0, t0, Some(KubeletExpect::Restart));
        assert!(!plan.wants_after_kill_tail(true, true), "no Node Manager");
        let (_, s) = step(State::START, &sample(t0), &plan);
        let log = [
            (t0 - SEC, KubeletAction::RestartLiveness),
            (t0 + SEC, KubeletAction::NotReady),
            (t0 + 2 * SEC, KubeletAction::RestartExited),
        ];
        let seen = Sample {
            kubelet_log: &log,
            ..sample(t0 + 3 * SEC)
        };
        let (out, next) = step(s, &seen, &plan);
        assert_eq!(next.detected_after_ms, Some(2000), "not the restart before");
        assert!(go(out).2);
        // Expecting the engine out of the load: the not-ready, and the loop goes on.
        let plan = Plan {
            kubelet: Some(KubeletExpect::NotReady),
            ..plan
        };
        let (out, next) = step(s, &seen, &plan);
        assert_eq!(next.detected_after_ms, Some(1000));
        assert!(!go(out).2);
    }

    #[test]
    fn the_load_runs_on_after_a_kill_for_a_faulty_engine_only() {
        let t0 = Instant::now();
        let e = experiment(Fault::EngineHang, DETECT, Vec::new());
        let plan = Plan::new(&e, 1.0, t0, None);
        assert!(plan.wants_after_kill_tail(true, true));
        assert!(!plan.wants_after_kill_tail(false, true), "an error");
        assert!(!plan.wants_after_kill_tail(true, false), "no kill");
        let e = experiment(Fault::EngineHang, Expect::Healthy, Vec::new());
        assert!(!Plan::new(&e, 1.0, t0, None).wants_after_kill_tail(true, true));
    }
}

//! A repeated fault (`repeat:`; issue 50's `repeated_hang`): the hang, Node Manager's kill
//! decision, the engine killed and started again (as Node Manager's daemon restarts
//! MindIE's), healthy again, and the hang once more, `repeat` times on one stack and one
//! agent. At each kill decision the runner reads what the agent says of its `abnormal`
//! episodes; [`judge_rounds`] then holds them to the restart-loop rule: no escalation before
//! the agent's `escalate_after`-th episode, escalation from it on, the reason saying so.
//!
//! Each hang has its own Node Manager emulator (a real one's count of abnormal heartbeats
//! starts again with the restarted engine), polling from the baseline before the hang.

use super::emulator::start_node_manager;
use super::inject::{Injected, inject, remove};
use super::options::{Cadence, EngineKind, Policy, Row, RunOptions};
use super::outcome::{Outcome, Round, TimelinePoint, Verdict};
use super::stack::Stack;
use crate::experiment::Experiment;
use crate::load::LoadGen;
use crate::timescale::scaled;
use npu_health_wire::{AbnormalEpisodes, EngineDetail, EngineQos, Transport};
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The load with no fault before each hang (scaled), as long as a single experiment's.
const BASELINE: Duration = Duration::from_secs(10);

/// How long the agent may take to see the killed engine's port closed (scaled, plus 5 s of
/// real time): a few `/health` periods. It re-arms on "down, then up", so the engine is
/// started again only once the agent has seen it down.
const SEES_DOWN_WITHIN: Duration = Duration::from_secs(30);

/// The rounds' shared parts: the experiment, the stack under it, and the run's clock.
pub(super) struct Rounds<'a> {
    pub(super) e: &'a Experiment,
    pub(super) opts: &'a RunOptions,
    pub(super) stack: &'a mut Stack,
    pub(super) load: &'a LoadGen,
    pub(super) cancel: &'a CancellationToken,
    /// The first hang's injection (scheduled): the origin of every time in the outcome.
    t0: Instant,
}

impl<'a> Rounds<'a> {
    /// The rounds of `e` on `stack`, the first hang after a baseline from now.
    pub(super) fn new(
        e: &'a Experiment,
        opts: &'a RunOptions,
        stack: &'a mut Stack,
        load: &'a LoadGen,
        cancel: &'a CancellationToken,
    ) -> Self {
        let t0 = Instant::now() + scaled(BASELINE, opts.time_scale);
        Rounds {
            e,
            opts,
            stack,
            load,
            cancel,
            t0,
        }
    }

    /// Every hang in turn, until one is not killed in time; the outcome gets the rounds and
    /// the figures the summary reads (the worst time to a kill as the time to detect).
    pub(super) async fn run(mut self, out: &mut Outcome) -> Result<(), String> {
        for hang in 1..=self.e.repeat {
            let round = self.one(hang, out).await?;
            let killed = round.killed_after_ms.is_some();
            out.rounds.push(round);
            if !killed || hang == self.e.repeat {
                break;
            }
            self.restart(hang).await?;
        }
        out.first_injected_ms = out.rounds.first().map(|r| r.injected_at_ms);
        let all_killed = out.rounds.iter().all(|r| r.killed_after_ms.is_some());
        out.detected_after_ms = all_killed
            .then(|| out.rounds.iter().filter_map(|r| r.killed_after_ms).max())
            .flatten();
        let kill_at = |r: &Round| r.killed_after_ms.map(|k| r.injected_at_ms + k as i64);
        out.killed_at_ms = out.rounds.iter().rev().find_map(kill_at);
        out.escalated_at_ms = out
            .rounds
            .iter()
            .filter(|r| r.episodes.as_ref().is_some_and(|e| e.escalated))
            .find_map(kill_at);
        Ok(())
    }

    /// One hang: Node Manager polling through a baseline, the hang injected, then watched
    /// until the kill decision (the agent's episodes read at once, the engine killed) or
    /// `detect_within`.
    async fn one(&mut self, hang: u32, out: &mut Outcome) -> Result<Round, String> {
        let s = self.opts.time_scale;
        let c = self.opts.row.cadence().unwrap_or(Cadence::PYMOTOR);
        let nm = c.nm_options(vec![format!("{}/status", self.stack.mgmt)], s);
        let nm_cancel = self.cancel.child_token();
        let (tx, mut kill_rx) = tokio::sync::oneshot::channel::<Instant>();
        let thread = start_node_manager(nm, nm_cancel.clone(), tx)
            .map_err(|e| format!("starting the Node Manager emulator: {e}"))?;
        let inject_at = if hang == 1 {
            self.t0
        } else {
            Instant::now() + scaled(BASELINE, s)
        };
        let early = self.watch(inject_at, false, &mut kill_rx, out).await;
        let result = match early {
            Some(_) => Err(format!(
                "hang {hang}: Node Manager decided to kill the engine in the baseline, before the hang was injected (a false kill)"
            )),
            None => self.hang(hang, &mut kill_rx, out).await,
        };
        nm_cancel.cancel();
        self.keep_report(thread, hang).await;
        result
    }

    /// Injects the hang and watches it to the kill decision or the deadline.
    async fn hang(
        &mut self,
        hang: u32,
        kill_rx: &mut tokio::sync::oneshot::Receiver<Instant>,
        out: &mut Outcome,
    ) -> Result<Round, String> {
        let (e, s) = (self.e, self.opts.time_scale);
        let mut held = Injected::default();
        let completed_before = self.load.stats.snapshot().completed;
        inject(self.stack, self.load, e.fault, s, &mut held).await?;
        let at = Instant::now();
        let detect_within = match e.expect {
            crate::experiment::Expect::DetectWithin(d) => scaled(d, s),
            crate::experiment::Expect::Healthy => scaled(e.duration, s),
        };
        let mut round = Round {
            hang,
            injected_at_ms: self.rel(at),
            completed_before,
            killed_after_ms: None,
            episodes: None,
            reason: None,
        };
        match self.watch(at + detect_within, true, kill_rx, out).await {
            Some(kill) => {
                // What the agent says at the decision, before the kill changes it.
                let detail: Option<EngineDetail> = self
                    .stack
                    .get_json(&format!("{}/status/detail", self.stack.mgmt))
                    .await;
                self.stack.kill_engine().await;
                round.killed_after_ms = Some(kill.saturating_duration_since(at).as_millis() as u64);
                round.reason = detail.as_ref().map(|d| d.reason.clone());
                round.episodes = detail.map(|d| d.episodes);
            }
            None => remove(self.stack, self.load, e.fault, s, &mut held).await,
        }
        out.injected_ms += Instant::now().saturating_duration_since(at).as_millis() as u64;
        eprintln!("npu-chaos:   {}", round_line(&round, s));
        Ok(round)
    }

    /// Samples the agent every (scaled) second until `until` or Node Manager's kill
    /// decision, which it returns; the timeline gets each sample.
    async fn watch(
        &mut self,
        until: Instant,
        fault_active: bool,
        kill_rx: &mut tokio::sync::oneshot::Receiver<Instant>,
        out: &mut Outcome,
    ) -> Option<Instant> {
        let every =
            scaled(Duration::from_secs(1), self.opts.time_scale).max(Duration::from_millis(20));
        loop {
            if let Ok(kill) = kill_rx.try_recv() {
                return Some(kill);
            }
            let now = Instant::now();
            if now >= until {
                return None;
            }
            let status = self.stack.status().await;
            let qos: Option<EngineQos> = self
                .stack
                .get_json(&format!("{}/qos", self.stack.mgmt))
                .await;
            out.timeline.push(TimelinePoint {
                t_ms: self.rel(now),
                status,
                qos_score: qos.as_ref().and_then(|q| q.state.score),
                qos_level: qos.as_ref().map(|q| q.state.level.as_str().to_owned()),
                ai_cube_peak: qos
                    .as_ref()
                    .and_then(|q| q.device.ai_cube_peak.map(f64::from)),
                fault_active,
                driver_flagged: false,
                queue_depth: None,
            });
            tokio::time::sleep(every.min(until.saturating_duration_since(Instant::now()))).await;
        }
    }

    /// After hang `hang`'s kill: waits until the agent has seen the engine's port closed,
    /// starts the engine again, and waits until the agent says `normal` with virtual
    /// inference running (re-armed: the episode is over).
    async fn restart(&mut self, hang: u32) -> Result<(), String> {
        let s = self.opts.time_scale;
        let url = format!("{}/status/detail", self.stack.mgmt);
        let end = Instant::now() + scaled(SEES_DOWN_WITHIN, s) + Duration::from_secs(5);
        loop {
            let seen: Option<EngineDetail> = self.stack.get_json(&url).await;
            if seen.is_some_and(|d| {
                d.health.failing_for_ms.is_some()
                    && d.health.last_transport_error == Some(Transport::Refused)
            }) {
                break;
            }
            if Instant::now() >= end {
                return Err(format!(
                    "after hang {hang}'s kill the agent did not see the engine's port closed within {:?}",
                    scaled(SEES_DOWN_WITHIN, s) + Duration::from_secs(5)
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.stack.restart_engine().await?;
        let limit = scaled(Duration::from_secs(180), s) + Duration::from_secs(10);
        self.stack
            .wait_ready(limit)
            .await
            .map_err(|e| format!("after hang {hang}, the restarted engine: {e}"))
    }

    /// Keeps hang `hang`'s Node Manager report beside the logs (`node-manager-hang<N>.json`).
    async fn keep_report(
        &self,
        thread: std::thread::JoinHandle<fake_engine::node_manager::NmReport>,
        hang: u32,
    ) {
        let report = tokio::task::spawn_blocking(move || thread.join().ok())
            .await
            .ok()
            .flatten();
        let path = self.stack.dir.join(format!("node-manager-hang{hang}.json"));
        if let Some(r) = report
            && let Err(e) = std::fs::write(&path, serde_json::to_vec_pretty(&r).unwrap_or_default())
        {
            eprintln!("npu-chaos:   {}: {e}", path.display());
        }
    }

    /// Milliseconds from the first hang's scheduled injection (negative before it).
    fn rel(&self, t: Instant) -> i64 {
        if t >= self.t0 {
            (t - self.t0).as_millis() as i64
        } else {
            -((self.t0 - t).as_millis() as i64)
        }
    }
}

/// One hang in words, times unscaled: `hang 2: killed after 15.1 s; episode 2 in the window,
/// not escalated; 81 requests completed before it`.
pub(crate) fn round_line(r: &Round, s: f64) -> String {
    let killed = r.killed_after_ms.map_or_else(
        || "not killed".to_owned(),
        |k| format!("killed after {:.1} s", k as f64 / 1000.0 / s),
    );
    let episodes = r.episodes.as_ref().map_or_else(
        || "no /status/detail".to_owned(),
        |e| {
            format!(
                "episode {} in the window, {}",
                e.in_window,
                if e.escalated {
                    "escalated"
                } else {
                    "not escalated"
                }
            )
        },
    );
    format!(
        "hang {}: {killed}; {episodes}; {} requests completed before it",
        r.hang, r.completed_before
    )
}

/// Why a repeated fault cannot run in this row, if so: only the Node Manager emulator's rows
/// on the fake engine, under the agent's own policies (the runner restarts the fake engine
/// after each kill, and reads the agent's episodes).
pub(super) fn not_applicable(e: &Experiment, policy: Policy, opts: &RunOptions) -> Option<String> {
    let emulator = matches!(opts.row, Row::NodeManager(_)) && opts.pymotor_nm.is_none();
    (e.repeat > 1
        && (!emulator
            || opts.engine != EngineKind::Fake
            || policy == Policy::Mindie
            || policy.peer().is_some()))
        .then(|| {
            "a repeated fault runs in the Node Manager emulator's rows on the fake engine, under the agent's own policies: the runner restarts the fake engine after each kill, and reads the agent's episodes"
                .to_owned()
        })
}

/// The verdict of a repeated fault's run that ended well, and its reason ([`judge_rounds`];
/// a miss the policy cannot help is not detectable by design).
pub(super) fn verdict(
    e: &Experiment,
    out: &Outcome,
    not_by_design: bool,
) -> (Verdict, Option<String>) {
    match judge_rounds(&out.rounds, e.repeat) {
        Ok(()) => (Verdict::Pass, None),
        Err((Verdict::Missed, _)) if not_by_design => (Verdict::NotDetectableByDesign, None),
        Err((v, why)) => (v, Some(why)),
    }
}

/// Holds a repeated fault's rounds to the restart-loop rule: each of the `hangs` hangs was
/// killed, each was one more episode in the agent's window, none was escalated before the
/// agent's `escalate_after`-th episode, each from it on was, with "restart loop" in the
/// reason. `Err` has the verdict and the reason, naming the hang.
pub fn judge_rounds(rounds: &[Round], hangs: u32) -> Result<(), (Verdict, String)> {
    for (i, r) in rounds.iter().enumerate() {
        let k = i as u32 + 1;
        if r.killed_after_ms.is_none() {
            let why = format!("hang {k} of {hangs} was not killed within detect_within");
            return Err((Verdict::Missed, why));
        }
        let wrong = |why: String| Err((Verdict::WrongEscalation, format!("hang {k}: {why}")));
        let Some(ep) = &r.episodes else {
            return wrong("/status/detail did not answer at the kill decision".to_owned());
        };
        judge_episode(k, hangs, ep, r.reason.as_deref().unwrap_or_default()).or_else(wrong)?;
    }
    if rounds.len() < hangs as usize {
        let why = format!("only {} of {hangs} hangs ran", rounds.len());
        return Err((Verdict::Error, why));
    }
    Ok(())
}

/// What is wrong with the `k`-th hang's episodes and reason at its kill decision, if
/// anything.
fn judge_episode(k: u32, hangs: u32, ep: &AbnormalEpisodes, reason: &str) -> Result<(), String> {
    let after = ep.escalate_after;
    if after == 0 || after > hangs {
        return Err(format!(
            "the agent escalates after {after} episodes (agent_policy.escalate_after), which {hangs} hangs cannot show"
        ));
    }
    if ep.in_window != k {
        return Err(format!(
            "the agent counted {} abnormal episodes in its escalate_window, not {k} (one per hang)",
            ep.in_window
        ));
    }
    match (k >= after, ep.escalated) {
        (false, true) => Err(format!(
            "episode {k} was escalated as a restart loop, before episode {after} (escalate_after)"
        )),
        (true, false) => Err(format!(
            "episode {k} was not escalated (escalate_after = {after}); the reason: {reason}"
        )),
        (true, true) if !reason.contains("restart loop") => Err(format!(
            "episode {k} was escalated, but the reason does not say \"restart loop\": {reason}"
        )),
        _ => Ok(()),
    }
}

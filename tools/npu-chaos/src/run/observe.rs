//! Observation: the sampling loop from the baseline to detection (or the deadline), the
//! guards, the injection and its removal, and the kubelet emulator's link to the engine.

use super::inject::{
    AGENT_OP_LIMIT, Injected, codes_patch, driver_flagged, inject, is_driver_fault, record_op,
    remove,
};
use super::outcome::{GuardEvent, KubeletOutcome, Outcome, REAL_ENGINE_DIED, TimelinePoint};
use super::stack::Stack;
use crate::agent::{self, AgentOp};
use crate::experiment::{Expect, Experiment, Fault, Guard};
use crate::load::LoadGen;
use crate::timescale::scaled;
use npu_health_agent::server::wire::{EngineDetail, EngineQos};
use std::time::Duration;
use tokio::time::Instant;

/// Now, as unix milliseconds (the clock of the agent's probe records).
fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// How long after a fault a late kill is still watched for: a busy probe cycle (20 s + 5 s),
/// three QoS evaluations (15 s) and Node Manager's five heartbeats (15 s).
pub(super) const LATE_KILL_TAIL: Duration = Duration::from_secs(55);

/// How long the load goes on after Node Manager's kill of a faulty engine (scaled), in a
/// Node Manager row and a router row alike: what clients see once the engine is gone (with
/// a router, the draft answering; without, nothing), over the same time in both rows.
pub const AFTER_KILL_TAIL: Duration = Duration::from_secs(10);

/// The kubelet emulator's side of a run, as the runner sees it: the actions it decided, the
/// container generation the runner bumps at every restart, and what happened.
pub(super) struct KubeletLink {
    pub(super) actions: tokio::sync::mpsc::UnboundedReceiver<(crate::kubelet::Action, Instant)>,
    pub(super) generation: tokio::sync::watch::Sender<u64>,
    pub(super) exit_backoff: Duration,
    pub(super) expect: crate::experiment::KubeletExpect,
    pub(super) log: Vec<(Instant, crate::kubelet::Action)>,
    /// When the container was found gone, awaiting its restart.
    pub(super) exited_at: Option<Instant>,
    pub(super) not_ready_since: Option<Instant>,
    pub(super) not_ready_total: Duration,
}

impl KubeletLink {
    /// Takes the emulator's actions and restarts the engine for them, and restarts a
    /// container that exited once the back-off has passed.
    pub(super) async fn act(&mut self, stack: &mut Stack, now: Instant) -> Result<(), String> {
        use crate::kubelet::Action;
        while let Ok((a, at)) = self.actions.try_recv() {
            self.log.push((at, a));
            match a {
                Action::NotReady => self.not_ready_since = self.not_ready_since.or(Some(at)),
                Action::Ready => {
                    if let Some(t) = self.not_ready_since.take() {
                        self.not_ready_total += at.saturating_duration_since(t);
                    }
                }
                Action::RestartLiveness => {
                    stack.restart_engine().await?;
                    self.exited_at = None;
                    self.generation.send_modify(|g| *g += 1);
                }
                Action::RestartExited => {}
            }
        }
        if self.exited_at.is_none() && stack.engine_exited() {
            self.exited_at = Some(now);
        }
        if let Some(t) = self.exited_at
            && now >= t + self.exit_backoff
        {
            stack.restart_engine().await?;
            self.exited_at = None;
            self.log.push((now, Action::RestartExited));
            self.generation.send_modify(|g| *g += 1);
        }
        Ok(())
    }

    /// The first action of a kind at or after `from`.
    pub(super) fn first(&self, from: Instant, kinds: &[crate::kubelet::Action]) -> Option<Instant> {
        self.log
            .iter()
            .find(|(at, a)| *at >= from && kinds.contains(a))
            .map(|(at, _)| *at)
    }

    pub(super) fn outcome(
        &self,
        first: Option<Instant>,
        end: Instant,
        rel: impl Fn(Instant) -> i64,
    ) -> KubeletOutcome {
        use crate::kubelet::Action;
        let count = |k: Action| self.log.iter().filter(|(_, a)| *a == k).count() as u32;
        let after = |kinds: &[Action]| {
            first.and_then(|f| self.first(f, kinds).map(|t| (t - f).as_millis() as u64))
        };
        KubeletOutcome {
            expect: self.expect,
            actions: self.log.iter().map(|(t, a)| (rel(*t), *a)).collect(),
            liveness_restarts: count(Action::RestartLiveness),
            exit_restarts: count(Action::RestartExited),
            not_ready_after_ms: after(&[Action::NotReady]),
            restart_after_ms: after(&[Action::RestartLiveness, Action::RestartExited]),
            not_ready_ms: (self.not_ready_total
                + self
                    .not_ready_since
                    .map_or(Duration::ZERO, |t| end.saturating_duration_since(t)))
            .as_millis() as u64,
        }
    }
}

/// The experiment's timeline: baseline, fault (with guards), observation.
#[allow(clippy::too_many_arguments)]
pub(super) async fn observe(
    e: &Experiment,
    stack: &mut Stack,
    load: &LoadGen,
    kill_rx: &mut tokio::sync::oneshot::Receiver<Instant>,
    mut kubelet: Option<&mut KubeletLink>,
    sample_every: Duration,
    s: f64,
    t0: Instant,
    out: &mut Outcome,
) -> Result<(), String> {
    let sc = |d: Duration| scaled(d, s);
    let fault_end = t0 + sc(e.duration);
    let observe_end = match e.expect {
        // Detection counts within `detect_within` of the first injection (guards may delay
        // it); a driver fault is watched longer, since killing the healthy engine for it
        // would be a false kill.
        // (The loop stops earlier, at the deadline counted from the first injection.)
        Expect::DetectWithin(d) if !is_driver_fault(e.fault) => fault_end + sc(d),
        _ => fault_end + sc(LATE_KILL_TAIL),
    };
    let rel = |t: Instant| -> i64 {
        if t >= t0 {
            (t - t0).as_millis() as i64
        } else {
            -((t0 - t).as_millis() as i64)
        }
    };
    let mut held = Injected::default();
    let mut active = false;
    let mut aborted = false;
    let mut skipping = false;
    let mut first_injected: Option<Instant> = None;
    let mut injected_since: Option<Instant> = None;
    let mut injected = Duration::ZERO;
    let mut killed: Option<Instant> = None;
    // Unix time of the first injection: the agent's own probe times are unix times.
    let mut first_injected_unix_ms: Option<u64> = None;
    // The scheduled injection on the agent's clock (its journal's times are unix times).
    let t0_unix_ms = {
        let now = Instant::now();
        unix_ms() as i64 + t0.saturating_duration_since(now).as_millis() as i64
            - now.saturating_duration_since(t0).as_millis() as i64
    };
    let result = loop {
        let now = Instant::now();
        if now >= observe_end {
            break Ok(());
        }
        // A real engine that died by itself (not by a crash fault, not by Node Manager's
        // kill) ends the experiment as an error: whatever the agent concluded after that is
        // about a dead engine, so it is neither a false kill nor a detection. Checked before
        // a kill that arrived meanwhile is taken: at a short Node Manager cadence the death
        // and the kill can fall between two samples.
        let died_by_itself = |stack: &Stack| {
            stack.real.as_ref().is_some_and(|(r, _)| {
                let by_the_fault = e.fault == Fault::EngineCrash && first_injected.is_some();
                !(by_the_fault || r.alive())
            })
        };
        if killed.is_none()
            && !died_by_itself(stack)
            && let Ok(at) = kill_rx.try_recv()
        {
            killed = Some(at);
            out.killed_at_ms = Some(rel(at));
            // What Node Manager's daemon does: the engine process goes.
            stack.kill_engine().await;
        }
        if let Some((r, _)) = &stack.real
            && killed.is_none()
            && died_by_itself(stack)
        {
            r.save_log(&stack.dir.join("vllm.log"));
            break Err(format!(
                "{REAL_ENGINE_DIED} {:.1} s into the experiment (unscaled), not killed by the fault or Node Manager; its log: {}",
                rel(now) as f64 / 1000.0 / s,
                stack.dir.join("vllm.log").display()
            ));
        }
        if let Some(k) = kubelet.as_deref_mut()
            && let Err(err) = k.act(stack, now).await
        {
            break Err(err);
        }
        let in_window = now >= t0 && now < fault_end;
        let status = stack.status().await;
        let qos: Option<EngineQos> = stack.get_json(&format!("{}/qos", stack.mgmt)).await;
        let detail: Option<EngineDetail> = stack
            .get_json(&format!("{}/status/detail", stack.mgmt))
            .await;
        let depth = stack.queue_depth().await;
        let flagged = detail.as_ref().is_some_and(driver_flagged);
        // When the agent itself concluded `abnormal`: the probe that decided it (its
        // completion, on the agent's clock), else when this sample saw it.
        if let (None, Some(first), Some(d)) = (
            out.abnormal_after_ms,
            first_injected_unix_ms,
            detail.as_ref(),
        ) && d.status == npu_health_agent::monitor::Status::Abnormal
        {
            let at = d
                .virtual_inference
                .last_probe
                .as_ref()
                .filter(|_| d.virtual_inference.abnormal)
                .map_or_else(unix_ms, |p| p.at_unix_ms);
            out.abnormal_after_ms = Some(at.saturating_sub(first));
            load.mark();
        }
        if let Some(d) = &detail {
            crate::router::note_actions(&mut out.router_actions, &d.actions, t0_unix_ms);
        }
        if flagged && first_injected.is_none() && is_driver_fault(e.fault) {
            break Err(
                "an NPU was already reported failing before the driver fault was injected"
                    .to_owned(),
            );
        }
        let score = qos.as_ref().and_then(|q| q.state.score);
        // Guards, evaluated at every sample.
        let mut want = in_window && !aborted;
        for g in &e.guards {
            let mut event = |action: &'static str, detail: String| {
                out.guard_events.push(GuardEvent {
                    t_ms: rel(now),
                    guard: g.to_string(),
                    action,
                    detail,
                })
            };
            match *g {
                Guard::SkipIfQueueDepth(n) => {
                    let deep = depth.is_some_and(|d| d > n as f64);
                    let d = depth.unwrap_or_default();
                    if deep && !skipping {
                        skipping = true;
                        event("skipped", format!("queue depth {d} > {n}"));
                    } else if !deep && skipping {
                        skipping = false;
                        event("resumed", format!("queue depth {d} <= {n}"));
                    }
                    if skipping {
                        want = false;
                    }
                }
                Guard::AbortIfHealth(x) if active && !aborted => {
                    if let Some(sc) = score.filter(|sc| *sc < x) {
                        aborted = true;
                        want = false;
                        event("aborted", format!("QoS score {sc:.3} < {x}"));
                    }
                }
                Guard::LimitAffectedTokens(n) if active && !aborted => {
                    let affected = load.stats.snapshot().tokens_under_fault;
                    if affected > n {
                        aborted = true;
                        want = false;
                        event(
                            "aborted",
                            format!("{affected} tokens produced under the fault > {n}"),
                        );
                    }
                }
                _ => {}
            }
        }
        if let Some(op) = held.agent_op.take_if(|t| t.is_finished()) {
            record_op(out, op.finish().await, s);
        }
        if want && !active && killed.is_none() {
            if e.fault.is_agent_fault() {
                // Once: an operation on the agent cannot be taken back, so a guard that
                // held it back and let it go again must not start a second one.
                if first_injected.is_none() {
                    held.agent_op = Some(agent::start_op(
                        stack.agent.clone(),
                        e.fault,
                        s,
                        format!("{}/status", stack.mgmt),
                        t0,
                    ));
                    load.set_under_fault(true);
                }
            } else if let Err(err) = inject(stack, load, e.fault, s, &mut held).await {
                break Err(err);
            }
            if !e.driver_codes.is_empty()
                && let Err(err) = stack.faults(codes_patch(&e.driver_codes)).await
            {
                break Err(err);
            }
            if first_injected.is_none() {
                first_injected_unix_ms = Some(unix_ms());
            }
            active = true;
            injected_since = Some(now);
            if first_injected.is_none() {
                first_injected = Some(now);
                out.first_injected_ms = Some(rel(now));
            }
        } else if !want && active {
            remove(stack, load, e.fault, s, &mut held).await;
            if !e.driver_codes.is_empty() {
                let _ = stack.faults(codes_patch(&[])).await;
            }
            active = false;
            injected += injected_since.take().map_or(Duration::ZERO, |t| now - t);
        }
        // Detection, within `detect_within` of the first injection (a benign experiment's
        // expected not-ready: while the fault lasts).
        if let (Some(first), None) = (first_injected, out.detected_after_ms) {
            use crate::experiment::KubeletExpect;
            let deadline = match e.expect {
                Expect::DetectWithin(d) => first + sc(d),
                Expect::Healthy => fault_end,
            };
            let at = match (e.expect, kubelet.as_deref()) {
                (Expect::DetectWithin(_), _) if is_driver_fault(e.fault) => {
                    (flagged && active).then_some(now)
                }
                (Expect::DetectWithin(_), None) => killed.filter(|k| *k >= first),
                (_, Some(k)) => match k.expect {
                    KubeletExpect::Restart => k.first(
                        first,
                        &[
                            crate::kubelet::Action::RestartLiveness,
                            crate::kubelet::Action::RestartExited,
                        ],
                    ),
                    KubeletExpect::NotReady => k.first(first, &[crate::kubelet::Action::NotReady]),
                    KubeletExpect::NoRestart => None,
                },
                (Expect::Healthy, None) => None,
            };
            if let Some(at) = at.filter(|at| *at <= deadline) {
                out.detected_after_ms = Some((at - first).as_millis() as u64);
            }
        }
        out.timeline.push(TimelinePoint {
            t_ms: rel(now),
            status,
            qos_score: score,
            qos_level: qos.as_ref().map(|q| q.state.level.as_str().to_owned()),
            ai_cube_peak: qos
                .as_ref()
                .and_then(|q| q.device.ai_cube_peak.map(f64::from)),
            fault_active: active,
            driver_flagged: flagged,
            queue_depth: depth,
        });
        // A detected engine fault ends the experiment; a driver fault is watched on, and so
        // is an engine taken out of the load (a restart would still be a false one).
        let watch_on = is_driver_fault(e.fault)
            || kubelet
                .as_deref()
                .is_some_and(|k| k.expect != crate::experiment::KubeletExpect::Restart);
        if out.detected_after_ms.is_some() && !watch_on {
            break Ok(());
        }
        // An engine fault that can no longer be detected in time ends it too (a kubelet run
        // that expects the engine out of the load watches to the end for a restart).
        if let (Expect::DetectWithin(d), Some(first)) = (e.expect, first_injected)
            && !watch_on
            && now > first + sc(d)
        {
            break Ok(());
        }
        tokio::time::sleep(sample_every).await;
    };
    if active {
        let now = Instant::now();
        remove(stack, load, e.fault, s, &mut held).await;
        injected += injected_since.map_or(Duration::ZERO, |t| now - t);
    }
    // A fault Node Manager killed the engine for: the load goes on for the same time with
    // a router or without, so that both rows count what clients saw after the kill.
    if result.is_ok()
        && killed.is_some()
        && kubelet.is_none()
        && matches!(e.expect, Expect::DetectWithin(_))
        && !is_driver_fault(e.fault)
    {
        tokio::time::sleep(sc(AFTER_KILL_TAIL)).await;
        let detail: Option<EngineDetail> = stack
            .get_json(&format!("{}/status/detail", stack.mgmt))
            .await;
        if let Some(d) = &detail {
            crate::router::note_actions(&mut out.router_actions, &d.actions, t0_unix_ms);
        }
    }
    out.load_after_abnormal = load.stats.after_mark();
    // An agent operation still under way is waited for (each of its steps is bounded).
    if let Some(op) = held.agent_op.take() {
        match tokio::time::timeout(AGENT_OP_LIMIT, op.finish()).await {
            Ok(done) => record_op(out, done, s),
            Err(_) => {
                out.agent_ops.push(AgentOp {
                    error: Some(format!(
                        "{}: the operation did not end within {AGENT_OP_LIMIT:?}",
                        e.fault
                    )),
                    ..AgentOp::unfinished(e.fault, stack.supervisor)
                });
            }
        }
    }
    // The experiment ran, but the fault did not happen as meant (an upgrade whose second
    // agent could not take over, an agent that did not come back): an error, with the
    // figures kept.
    let result = match (result, out.agent_ops.iter().find_map(|o| o.error.clone())) {
        (Ok(()), Some(err)) => Err(err),
        (r, _) => r,
    };
    out.injected_ms = injected.as_millis() as u64;
    if let Some(k) = kubelet {
        out.kubelet = Some(k.outcome(first_injected, Instant::now(), rel));
    }
    result
}

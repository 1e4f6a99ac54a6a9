//! Observation: the sampling loop from the baseline to detection (or the deadline), and the
//! wrap-up after it. The loop does the I/O (reads the stack, injects and removes the fault,
//! records the timeline); every decision is [`machine::step`]'s, on a [`machine::State`].

use super::inject::{
    AGENT_OP_LIMIT, Injected, codes_patch, driver_flagged, inject, record_op, remove,
};
use super::outcome::{Outcome, REAL_ENGINE_DIED, TimelinePoint};
use super::stack::Stack;
use crate::agent::{self, AgentOp};
use crate::experiment::{Experiment, Fault, Guard};
use crate::load::LoadGen;
use crate::timescale::scaled;
use machine::{Action, Output, Plan, Sample, State, step};
use npu_health_wire::{EngineDetail, EngineQos};
use std::time::Duration;
use tokio::time::Instant;

mod kubelet_link;
mod machine;

pub(super) use kubelet_link::KubeletLink;

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

/// What an observation works on: the experiment, the running stack and the channels to
/// whoever acts on the agent's answers.
pub(super) struct Observation<'a> {
    pub(super) e: &'a Experiment,
    pub(super) stack: &'a mut Stack,
    pub(super) load: &'a LoadGen,
    /// Node Manager's kill (its time), when it comes.
    pub(super) kill_rx: &'a mut tokio::sync::oneshot::Receiver<Instant>,
    pub(super) kubelet: Option<&'a mut KubeletLink>,
    pub(super) sample_every: Duration,
    /// The time scale.
    pub(super) s: f64,
    /// The scheduled injection, after the baseline.
    pub(super) t0: Instant,
}

/// The loop's I/O side: the observation, the machine's state, and what the machine does
/// not decide (the kill taken, the fault's undo handles, the agent's clock).
struct Run<'a> {
    o: Observation<'a>,
    plan: Plan<'a>,
    state: State,
    held: Injected,
    killed: Option<Instant>,
    /// The scheduled injection on the agent's clock (its journal's times are unix times).
    t0_unix_ms: i64,
    /// Unix time of the first injection: the agent's own probe times are unix times.
    first_injected_unix_ms: Option<u64>,
}

/// What the agent and the engine answered at one sample.
struct Readings {
    status: String,
    qos: Option<EngineQos>,
    detail: Option<EngineDetail>,
    depth: Option<f64>,
}

/// The experiment's timeline: baseline, fault (with guards), observation; then the fault is
/// taken out and the figures are completed.
pub(super) async fn observe(o: Observation<'_>, out: &mut Outcome) -> Result<(), String> {
    let plan = Plan::new(o.e, o.s, o.t0, o.kubelet.as_deref().map(|k| k.expect));
    let now = Instant::now();
    let t0_unix_ms = unix_ms() as i64 + o.t0.saturating_duration_since(now).as_millis() as i64
        - now.saturating_duration_since(o.t0).as_millis() as i64;
    let mut run = Run {
        o,
        plan,
        state: State::START,
        held: Injected::default(),
        killed: None,
        t0_unix_ms,
        first_injected_unix_ms: None,
    };
    let result = loop {
        match run.sample(out).await {
            Ok(true) => tokio::time::sleep(run.o.sample_every).await,
            Ok(false) => break Ok(()),
            Err(err) => break Err(err),
        }
    };
    run.wrap_up(result, out).await
}

impl Run<'_> {
    /// One sample: read, decide, act, record. `Ok(false)`: the loop is over.
    async fn sample(&mut self, out: &mut Outcome) -> Result<bool, String> {
        let now = Instant::now();
        if now >= self.plan.observe_end {
            return Ok(false);
        }
        self.take_kill(out).await;
        self.check_engine_alive(now)?;
        if let Some(k) = self.o.kubelet.as_deref_mut() {
            k.act(self.o.stack, now).await?;
        }
        let r = self.read().await;
        let flagged = r.detail.as_ref().is_some_and(driver_flagged);
        self.note_agent_view(r.detail.as_ref(), out);
        let score = r.qos.as_ref().and_then(|q| q.state.score);
        let sample = Sample {
            now,
            depth: r.depth,
            score,
            flagged,
            tokens_under_fault: self.tokens_under_fault(),
            killed: self.killed,
            kubelet_log: self.o.kubelet.as_deref().map_or(&[], |k| k.log.as_slice()),
        };
        let (output, next) = step(self.state, &sample, &self.plan);
        let (events, action, end) = match output {
            Output::Fail(why) => return Err(why),
            Output::Go {
                events,
                action,
                end,
            } => (events, action, end),
        };
        out.guard_events.extend(events);
        if let Some(op) = self.held.agent_op.take_if(|t| t.is_finished()) {
            record_op(out, op.finish().await, self.o.s);
        }
        self.act(action).await?;
        if action == (Action::Inject { first: true }) {
            self.first_injected_unix_ms = Some(unix_ms());
            out.first_injected_ms = Some(self.plan.rel(now));
        }
        self.state = next;
        out.detected_after_ms = next.detected_after_ms;
        out.timeline.push(TimelinePoint {
            t_ms: self.plan.rel(now),
            status: r.status,
            qos_score: score,
            qos_level: r.qos.as_ref().map(|q| q.state.level.as_str().to_owned()),
            ai_cube_peak: r
                .qos
                .as_ref()
                .and_then(|q| q.device.ai_cube_peak.map(f64::from)),
            fault_active: next.phase.is_injected(),
            driver_flagged: flagged,
            queue_depth: r.depth,
        });
        Ok(!end)
    }

    /// Whether a real engine died by itself: not by a crash fault, not by Node Manager's
    /// kill (checked by the caller).
    fn died_by_itself(&self) -> bool {
        self.o.stack.real.as_ref().is_some_and(|(r, _)| {
            let by_the_fault =
                self.o.e.fault == Fault::EngineCrash && self.state.phase.first().is_some();
            !(by_the_fault || r.alive())
        })
    }

    /// Takes Node Manager's kill if it came, and kills the engine for it, as Node Manager's
    /// daemon does. Not when the real engine died by itself first: at a short Node Manager
    /// cadence the death and the kill can fall between two samples.
    async fn take_kill(&mut self, out: &mut Outcome) {
        if self.killed.is_none()
            && !self.died_by_itself()
            && let Ok(at) = self.o.kill_rx.try_recv()
        {
            self.killed = Some(at);
            out.killed_at_ms = Some(self.plan.rel(at));
            self.o.stack.kill_engine().await;
        }
    }

    /// A real engine that died by itself ends the experiment as an error: whatever the agent
    /// concluded after that is about a dead engine, so it is neither a false kill nor a
    /// detection.
    fn check_engine_alive(&self, now: Instant) -> Result<(), String> {
        let stack = &*self.o.stack;
        if let Some((r, _)) = &stack.real
            && self.killed.is_none()
            && self.died_by_itself()
        {
            r.save_log(&stack.dir.join("vllm.log"));
            return Err(format!(
                "{REAL_ENGINE_DIED} {:.1} s into the experiment (unscaled), not killed by the fault or Node Manager; its log: {}",
                self.plan.rel(now) as f64 / 1000.0 / self.o.s,
                stack.dir.join("vllm.log").display()
            ));
        }
        Ok(())
    }

    async fn read(&self) -> Readings {
        let stack = &*self.o.stack;
        let status = stack.status().await;
        let qos = stack.get_json(&format!("{}/qos", stack.mgmt)).await;
        let detail = stack
            .get_json(&format!("{}/status/detail", stack.mgmt))
            .await;
        let depth = stack.queue_depth().await;
        Readings {
            status,
            qos,
            detail,
            depth,
        }
    }

    /// Records when the agent itself concluded `abnormal` (the probe that decided it, its
    /// completion on the agent's clock, else when this sample saw it), and what it told the
    /// router.
    fn note_agent_view(&self, detail: Option<&EngineDetail>, out: &mut Outcome) {
        if let (None, Some(first), Some(d)) =
            (out.abnormal_after_ms, self.first_injected_unix_ms, detail)
            && d.status == npu_health_wire::Status::Abnormal
        {
            let at = d
                .virtual_inference
                .last_probe
                .as_ref()
                .filter(|_| d.virtual_inference.abnormal)
                .map_or_else(unix_ms, |p| p.at_unix_ms);
            out.abnormal_after_ms = Some(at.saturating_sub(first));
            self.o.load.mark();
        }
        if let Some(d) = detail {
            super::ShadowSeen::note(&mut out.shadow, d, self.t0_unix_ms);
            crate::router::note_actions(&mut out.router_actions, &d.actions, self.t0_unix_ms);
            if out.escalated_at_ms.is_none() && d.episodes.escalated {
                out.escalated_at_ms = Some(unix_ms() as i64 - self.t0_unix_ms);
            }
        }
    }

    /// The tokens produced under the fault, read only where a guard limits them.
    fn tokens_under_fault(&self) -> u64 {
        let limited = self
            .plan
            .guards
            .iter()
            .any(|g| matches!(g, Guard::LimitAffectedTokens(_)));
        if limited && self.state.phase.is_injected() {
            self.o.load.stats.snapshot().tokens_under_fault
        } else {
            0
        }
    }

    /// Carries out the machine's action on the fault (and the experiment's NPU fault codes).
    async fn act(&mut self, action: Action) -> Result<(), String> {
        let (e, s) = (self.o.e, self.o.s);
        match action {
            Action::Leave => return Ok(()),
            // Once: an operation on the agent cannot be taken back, so a guard that held it
            // back and let it go again must not start a second one.
            Action::Inject { first } if e.fault.is_agent_fault() => {
                if first {
                    let stack = &*self.o.stack;
                    self.held.agent_op = Some(agent::start_op(
                        stack.agent.clone(),
                        e.fault,
                        s,
                        format!("{}/status", stack.mgmt),
                        self.o.t0,
                    ));
                    self.o.load.set_under_fault(true);
                }
            }
            Action::Inject { .. } => {
                inject(self.o.stack, self.o.load, e.fault, s, &mut self.held).await?;
            }
            Action::Remove => {
                remove(self.o.stack, self.o.load, e.fault, s, &mut self.held).await;
                if !e.driver_codes.is_empty() {
                    let _ = self.o.stack.faults(codes_patch(&[])).await;
                }
                return Ok(());
            }
        }
        if !e.driver_codes.is_empty() {
            self.o.stack.faults(codes_patch(&e.driver_codes)).await?;
        }
        Ok(())
    }

    /// After the loop: the fault comes out, the load runs on after a kill, an agent
    /// operation under way is awaited, and the outcome's figures are completed.
    async fn wrap_up(
        mut self,
        result: Result<(), String>,
        out: &mut Outcome,
    ) -> Result<(), String> {
        let (e, s) = (self.o.e, self.o.s);
        let now = Instant::now();
        if self.state.phase.is_injected() {
            remove(self.o.stack, self.o.load, e.fault, s, &mut self.held).await;
        }
        let injected = self.state.injected_until(now);
        if self
            .plan
            .wants_after_kill_tail(result.is_ok(), self.killed.is_some())
        {
            tokio::time::sleep(scaled(AFTER_KILL_TAIL, s)).await;
            let stack = &*self.o.stack;
            let detail: Option<EngineDetail> = stack
                .get_json(&format!("{}/status/detail", stack.mgmt))
                .await;
            if let Some(d) = &detail {
                super::ShadowSeen::note(&mut out.shadow, d, self.t0_unix_ms);
                crate::router::note_actions(&mut out.router_actions, &d.actions, self.t0_unix_ms);
            }
        }
        out.load_after_abnormal = self.o.load.stats.after_mark();
        self.await_agent_op(out).await;
        out.injected_ms = injected.as_millis() as u64;
        if let Some(k) = self.o.kubelet {
            let plan = self.plan;
            out.kubelet =
                Some(k.outcome(self.state.phase.first(), Instant::now(), |t| plan.rel(t)));
        }
        // The experiment ran, but the fault did not happen as meant (an upgrade whose second
        // agent could not take over, an agent that did not come back): an error, with the
        // figures kept.
        match (result, out.agent_ops.iter().find_map(|o| o.error.clone())) {
            (Ok(()), Some(err)) => Err(err),
            (r, _) => r,
        }
    }

    /// Waits for an agent operation still under way (each of its steps is bounded).
    async fn await_agent_op(&mut self, out: &mut Outcome) {
        let Some(op) = self.held.agent_op.take() else {
            return;
        };
        match tokio::time::timeout(AGENT_OP_LIMIT, op.finish()).await {
            Ok(done) => record_op(out, done, self.o.s),
            Err(_) => out.agent_ops.push(AgentOp {
                error: Some(format!(
                    "{}: the operation did not end within {AGENT_OP_LIMIT:?}",
                    self.o.e.fault
                )),
                ..AgentOp::unfinished(self.o.e.fault, self.o.stack.supervisor)
            }),
        }
    }
}

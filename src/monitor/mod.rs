//! One monitored engine: what the agent knows of it, and the verdict `/status` serves.
//!
//! The verdict is computed from atomics, so `/status` never waits on the engine: a background
//! task probes `/health` every `health_period` (the reference probes inside every `/status`
//! request, so a `/health` that takes 30 s under load makes Node Manager's 5 s poll time out).
//! The first healthy `/status` starts virtual inference (one-shot, as the reference); so does
//! the first healthy `/readyz` or `/livez`, or the Kubernetes API mode's first look, where
//! the kubelet or the API mode polls the agent instead of Node Manager.
//!
//! Re-arm (not in the reference, which dies with its engine): after virtual inference went
//! `abnormal`, once `/health` cannot be reached at all (connection refused: the engine process
//! is gone) and then answers again — the engine restarted — virtual inference goes back to its
//! initial state and the next healthy `/status` starts a new warm-up. While the engine is down
//! `/status` stays `abnormal` (it answered before), so a crashed engine that never comes back
//! is still reported.
//!
//! QoS ([`crate::qos`]): a background task scrapes the engine's `/metrics` and evaluates the
//! score and level; `/status` is unchanged by it unless `qos.eviction` is on, in which case
//! a held `evict` level answers `abnormal` too.
//!
//! The parts: [`tasks`] (the loops: I/O only), [`account`] and [`verdict`] (the rules, as
//! plain functions), [`vi_state`] (virtual inference's shared state), [`inputs`] (what the
//! loops read besides the probe), [`gates`] (the conditions for virtual inference to run).

pub mod account;
pub mod acted;
pub mod gates;
pub mod inputs;
pub mod journal;
pub mod saved;
pub mod tasks;
pub mod verdict;
pub mod vi_state;

use crate::config::EngineSpec;
use crate::probe::health::HealthOutcome;
use crate::qos::QosState;
use crate::qos::score::Level;
use gates::Condition;
use serde::{Deserialize, Serialize};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::sync::Notify;
use verdict::HealthState;
pub use verdict::Status;
use vi_state::{Phase, ViState};

/// `/health` as last seen.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HealthDetail {
    pub state: HealthState,
    pub has_connected: bool,
    /// Unix milliseconds of the last healthy probe.
    pub last_ok_unix_ms: Option<u64>,
    pub last_error: Option<String>,
    /// Class of the last failure without a usable answer (`refused`, `reset`, `protocol`,
    /// `body_too_large`, `tls`, `local`, `connect`, `other`); only `refused` can be the
    /// "down" half of a restart.
    pub last_transport_error: Option<crate::probe::health::Transport>,
    pub consecutive_failures: u64,
    pub probes: u64,
    /// `/health` timeouts not taken as abnormal because the engine was serving.
    pub excused_timeouts: u64,
    /// How long `/health` has failed without a healthy answer (`None`: it answers).
    pub failing_for_ms: Option<u64>,
    /// Since when `/health` fails without a healthy answer (the agent policy's grace).
    #[serde(skip)]
    pub failing_since: Option<tokio::time::Instant>,
    /// When `/health` last failed, excused or not (the agent policy does not count a probe
    /// failure that `/health` failed beside).
    #[serde(skip)]
    pub last_failure_at: Option<tokio::time::Instant>,
}

/// Shared state of one engine.
#[derive(Debug)]
pub struct Monitor {
    pub spec: EngineSpec,
    /// Ring indices of the engine's NPUs.
    pub devices: Vec<u16>,
    /// [`HealthState`] as a `u8`, read by every `/status`.
    health: AtomicU8,
    health_detail: Mutex<HealthDetail>,
    /// The one-shot start latch of the reference's `/status`.
    started: AtomicBool,
    start: Notify,
    /// `/health` could not be reached after virtual inference went abnormal (restart detection).
    down_after_abnormal: AtomicBool,
    /// Bumped at every re-arm; a loop still running from before stops.
    rearm_tx: tokio::sync::watch::Sender<u64>,
    pub vi: ViState,
    pub qos: QosState,
    conditions: Mutex<Vec<Condition>>,
    rearms: AtomicU64,
    /// What the Kubernetes API mode did about the engine, and what each router was told.
    pub acted: acted::ActionMemory,
    /// Every action for every integration, and when ([`journal`]): `/status/detail`'s
    /// `actions`, and the operator views.
    pub journal: journal::Journal,
    /// The engine process's start time as its `/metrics` last showed it (Unix seconds): the
    /// identity a saved state is checked against ([`saved`]).
    engine_started_at: Mutex<Option<f64>>,
    /// The engine's process seen stopped at every sample since: its pid, its CPU ticks then,
    /// and when (the agent policy's stopped-process rule).
    stopped: Mutex<Option<(u32, u64, tokio::time::Instant)>>,
}

impl Monitor {
    /// A fresh engine: `/health` never answered, virtual inference not started.
    pub fn new(spec: EngineSpec, devices: Vec<u16>) -> Monitor {
        let conditions = gates::static_conditions(&spec);
        let vi = ViState::new(spec.timing.interval);
        let qos = QosState::new(&spec.qos);
        Monitor {
            spec,
            devices,
            health: AtomicU8::new(HealthState::NeverAnswered.to_u8()),
            health_detail: Mutex::new(HealthDetail::default()),
            started: AtomicBool::new(false),
            start: Notify::new(),
            down_after_abnormal: AtomicBool::new(false),
            rearm_tx: tokio::sync::watch::Sender::new(0),
            vi,
            qos,
            conditions: Mutex::new(conditions),
            rearms: AtomicU64::new(0),
            acted: acted::ActionMemory::default(),
            journal: journal::Journal::default(),
            engine_started_at: Mutex::new(None),
            stopped: Mutex::new(None),
        }
    }

    /// Adds what an integration was told (and what it was told before) to the record, with
    /// the level now.
    pub fn note(&self, told: journal::Told, before: Option<journal::Told>, reason: &str) {
        self.journal.push(journal::Entry {
            at_unix_ms: crate::clock::unix_ms(),
            told,
            before,
            level: self.qos.level(),
            reason: reason.to_owned(),
        });
    }

    /// Notes what a router polling the agent was told: in the router's state
    /// ([`acted::ActionMemory::router_saw`]), and in the record when it changed.
    pub fn told_router(&self, told: journal::Told, reason: &str) {
        if let Some(before) = self.acted.router_saw(told, reason) {
            tracing::info!(
                engine = %self.spec.name,
                "{} now reads {}: {reason}",
                told.integration().as_str(),
                told.word()
            );
            self.note(told, before, reason);
        }
    }

    /// Notes the engine process's start time seen on its `/metrics`.
    pub fn record_engine_start(&self, at: Option<f64>) {
        if let Some(at) = at {
            *self
                .engine_started_at
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = Some(at);
        }
    }

    /// The engine process's start time as last seen (Unix seconds).
    pub fn engine_started_at(&self) -> Option<f64> {
        *self
            .engine_started_at
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    fn health(&self) -> HealthState {
        HealthState::from_u8(self.health.load(Ordering::Acquire))
    }

    /// The verdict for `/status`; the first healthy call starts virtual inference.
    pub fn status(&self) -> Status {
        let health = self.health();
        if health.answers() && !self.started.swap(true, Ordering::AcqRel) {
            self.start.notify_one();
        }
        verdict::status(
            health,
            self.vi.abnormal(),
            self.qos_evicts(),
            self.engine_stopped(),
        )
    }

    /// Notes what `/proc` showed of the engine's processes at `now`.
    pub fn record_process(&self, found: &crate::probe::process::Lookup, now: tokio::time::Instant) {
        self.record_sight(found);
        let mut stopped = self.stopped.lock().unwrap_or_else(|p| p.into_inner());
        let before = *stopped;
        // Stopped all along: the same process, seen stopped at each sample, and no CPU time
        // spent in between (one stopped and continued between two samples has run, so its
        // stop starts again). Nothing in sight is nothing stopped.
        *stopped = match (found.stopped(), before) {
            (Some(s), Some(b)) if (s.0, s.1) == (b.0, b.1) => Some(b),
            (Some((pid, ticks)), _) => Some((pid, ticks, now)),
            (None, _) => None,
        };
        match (before, *stopped) {
            (None, Some((pid, ..))) => tracing::warn!(
                engine = %self.spec.name,
                "the engine's process {pid} is stopped (SIGSTOP or a debugger): it answers nothing"
            ),
            (Some((pid, ..)), None) => tracing::info!(
                engine = %self.spec.name,
                "the engine's process {pid} is no longer stopped"
            ),
            _ => {}
        }
    }

    /// Whether the engine's processes are in sight, as the condition `engine_processes`
    /// (informational: it never blocks virtual inference), so an operator can tell when the
    /// stopped-process rule is silent (another PID namespace, another user's processes).
    /// Logged when it changes between in sight and not.
    fn record_sight(&self, found: &crate::probe::process::Lookup) {
        use crate::probe::process::Lookup;
        let (value, note, seen) = match found {
            Lookup::Found { pid, states } => (
                format!("pid {pid}: {} process(es) in sight", states.len()),
                String::new(),
                true,
            ),
            Lookup::NotFound(why) => (
                format!("not in sight: {why}"),
                "the stopped-process rule cannot see the engine (on Kubernetes: the pod needs the host's PID namespace, docs/policy.md rule 10)".to_owned(),
                false,
            ),
        };
        let before = self
            .conditions()
            .into_iter()
            .find(|c| c.name == "engine_processes");
        if before.as_ref().is_some_and(|c| c.value == value) {
            return;
        }
        let was_seen = before.map(|c| c.note.is_empty());
        if was_seen != Some(seen) {
            if seen {
                tracing::info!(engine = %self.spec.name, "engine processes: {value}");
            } else {
                tracing::info!(engine = %self.spec.name, "engine processes {value}; {note}");
            }
        }
        self.set_condition(gates::Condition {
            name: "engine_processes".into(),
            value,
            ok: Some(true),
            note,
        });
    }

    /// The stopped process and how long it has been stopped, if one is.
    pub fn stopped_for(&self) -> Option<(u32, std::time::Duration)> {
        let stopped = self.stopped.lock().unwrap_or_else(|p| p.into_inner());
        stopped.map(|(pid, _, since)| (pid, since.elapsed()))
    }

    /// The agent policy's stopped-process rule holds now (off under the reference policy).
    pub fn engine_stopped(&self) -> bool {
        let grace = self
            .spec
            .agent_policy_in_force()
            .map(|a| a.stopped_process_grace);
        verdict::stopped(self.stopped_for().map(|(_, d)| d), grace)
    }

    /// `qos.eviction` is on and the QoS level is a held `evict`.
    pub fn qos_evicts(&self) -> bool {
        let q = &self.spec.qos;
        q.enabled && q.eviction && self.qos.level() == Level::Evict
    }

    /// The verdict without side effects (for `/status/detail`, logs and metrics).
    pub fn peek_status(&self) -> Status {
        verdict::status(
            self.health(),
            self.vi.abnormal(),
            self.qos_evicts(),
            self.engine_stopped(),
        )
    }

    /// Why the verdict is what it is.
    pub fn reason(&self) -> String {
        let h = self.health_detail();
        match self.peek_status() {
            Status::Initial => format!(
                "the engine's /health has not answered yet{}",
                h.last_error.map(|e| format!(" ({e})")).unwrap_or_default()
            ),
            Status::Abnormal if h.state == HealthState::Unhealthy => format!(
                "/health answered before and fails now: {}",
                h.last_error.unwrap_or_default()
            ),
            Status::Abnormal if self.engine_stopped() => {
                let (pid, d) = self.stopped_for().unwrap_or_default();
                format!(
                    "the engine's process {pid} is stopped (SIGSTOP or a debugger) for {:.1} s, past agent_policy.stopped_process_grace ({:?})",
                    d.as_secs_f64(),
                    self.spec.agent_policy.stopped_process_grace
                )
            }
            Status::Abnormal if self.vi.abnormal() => format!(
                "virtual inference is abnormal: {}",
                self.vi.abnormal_reason().unwrap_or_default()
            ),
            Status::Abnormal => format!(
                "the QoS level is evict (score {}, below 0.3 for {} evaluations) and qos.eviction is on",
                self.qos
                    .score()
                    .map_or_else(|| "none".to_owned(), |s| format!("{s:.3}")),
                self.qos.below_evict()
            ),
            Status::Normal if h.state == HealthState::Failing => format!(
                "/health fails for {:.1} s, within agent_policy.health_failure_grace ({:?}): {}",
                h.failing_for_ms.unwrap_or_default() as f64 / 1e3,
                self.spec.agent_policy.health_failure_grace,
                h.last_error.unwrap_or_default()
            ),
            Status::Normal => match self.vi.phase() {
                Phase::Disabled => {
                    "/health answers; virtual inference is disabled (see conditions)".to_owned()
                }
                Phase::NotStarted => {
                    "/health answers; virtual inference starts at the next /status".to_owned()
                }
                _ => "/health answers and virtual inference is not abnormal".to_owned(),
            },
        }
    }

    /// Whether `/health` failed at or after `since` (the agent policy's accounting).
    pub fn health_failed_since(&self, since: tokio::time::Instant) -> bool {
        self.health_detail
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .last_failure_at
            .is_some_and(|t| t >= since)
    }

    /// Copy of the `/health` details.
    pub fn health_detail(&self) -> HealthDetail {
        self.health_detail
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The enabling conditions as last evaluated.
    pub fn conditions(&self) -> Vec<Condition> {
        self.conditions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// How many times virtual inference was re-armed after an engine restart.
    pub fn rearms(&self) -> u64 {
        self.rearms.load(Ordering::Relaxed)
    }

    fn set_condition(&self, c: Condition) {
        let mut all = self.conditions.lock().unwrap_or_else(|p| p.into_inner());
        match all.iter_mut().find(|x| x.name == c.name) {
            Some(slot) => *slot = c,
            None => all.push(c),
        }
    }

    /// Evidence that the engine serves requests right now: a periodic virtual probe that
    /// succeeded within `timing.serving_evidence_max_age` (two busy intervals, 40 s, by
    /// default), or token counters advancing in the latest `/metrics` scrape. `None` when the
    /// rule is off (max age zero).
    pub fn serving_evidence(&self) -> Option<String> {
        let fresh = self.spec.timing.serving_evidence_max_age();
        if fresh.is_zero() {
            return None;
        }
        if let Some(p) = self.vi.last_probe()
            && p.success
            && !p.warmup
        {
            let age = tokio::time::Instant::now().saturating_duration_since(p.at);
            if age <= fresh {
                return Some(format!(
                    "a virtual request succeeded {:.1} s ago",
                    age.as_secs_f64()
                ));
            }
        }
        (self.qos.progress() == crate::qos::progress::State::Advancing)
            .then(|| "its token counters advance".to_owned())
    }

    /// Applies one `/health` outcome ([`verdict`] has the rules).
    pub fn record_health(&self, outcome: &HealthOutcome, has_connected: bool) {
        let before = self.health();
        let (after, last_error) = self.update_health_detail(outcome, has_connected);
        self.set_condition(gates::health_condition(
            has_connected,
            last_error.as_deref(),
        ));
        self.health.store(after.to_u8(), Ordering::Release);
        self.log_health_change(before, after, last_error);
        self.rearm_after_restart(outcome);
    }

    /// Judges `outcome` and records it in the `/health` details; returns the new state and
    /// the last error.
    fn update_health_detail(
        &self,
        outcome: &HealthOutcome,
        has_connected: bool,
    ) -> (HealthState, Option<String>) {
        let evidence_rule = !self.spec.timing.serving_evidence_max_age().is_zero();
        let excuse = verdict::excuse(outcome, evidence_rule, || self.serving_evidence());
        let now = tokio::time::Instant::now();
        let mut d = self.health_detail.lock().unwrap_or_else(|p| p.into_inner());
        let failed = matches!(outcome, HealthOutcome::Unhealthy { .. });
        d.failing_since = failed.then(|| d.failing_since.unwrap_or(now));
        if failed {
            d.last_failure_at = Some(now);
        }
        let failing_for = d.failing_since.map(|t| now.saturating_duration_since(t));
        d.failing_for_ms = failing_for.map(|f| f.as_millis() as u64);
        let grace = self.spec.agent_policy_in_force().map(|a| verdict::Grace {
            grace: a.health_failure_grace,
            failing_for: failing_for.unwrap_or_default(),
        });
        let after = verdict::judge(outcome, excuse.is_some(), grace);
        d.probes += 1;
        d.has_connected = has_connected;
        d.last_transport_error = match outcome {
            HealthOutcome::Unhealthy {
                transport: Some(t), ..
            } => Some(*t),
            _ => None,
        };
        self.note_outcome(&mut d, outcome, excuse, after);
        d.state = after;
        (after, d.last_error.clone())
    }

    /// The outcome's counters and last error in `d` (an excused failure says why).
    fn note_outcome(
        &self,
        d: &mut HealthDetail,
        outcome: &HealthOutcome,
        excuse: Option<String>,
        after: HealthState,
    ) {
        match outcome {
            HealthOutcome::Healthy => {
                let now_ms = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as u64);
                d.last_ok_unix_ms = Some(now_ms);
                d.consecutive_failures = 0;
                d.last_error = None;
            }
            HealthOutcome::Unhealthy { reason, .. } => {
                d.consecutive_failures += 1;
                match &excuse {
                    Some(why) => {
                        if d.state != after {
                            tracing::warn!(engine = %self.spec.name, "{reason}, but {why}: not abnormal");
                        }
                        d.excused_timeouts += 1;
                        d.last_error = Some(format!("{reason} (not abnormal: {why})"));
                    }
                    None => d.last_error = Some(reason.clone()),
                }
            }
            HealthOutcome::NeverConnected(e) => {
                d.consecutive_failures += 1;
                d.last_error = Some(e.clone());
            }
        }
    }

    /// Logs when the verdict's view of `/health` changes (an excused failure still answers).
    fn log_health_change(
        &self,
        before: HealthState,
        after: HealthState,
        last_error: Option<String>,
    ) {
        let name = &self.spec.name;
        let class = |h: HealthState| {
            (
                h.answers() && h != HealthState::Failing,
                h == HealthState::Unhealthy,
                h == HealthState::Failing,
            )
        };
        if class(after) == class(before) {
            return;
        }
        match after {
            HealthState::Failing => tracing::warn!(
                engine = %name,
                verdict = self.peek_status().as_str(),
                "/health fails; abnormal if it still fails after {:?} (agent_policy.health_failure_grace): {}",
                self.spec.agent_policy.health_failure_grace,
                last_error.unwrap_or_default()
            ),
            HealthState::Unhealthy => tracing::warn!(
                engine = %name,
                verdict = "abnormal",
                "/health fails: {}",
                last_error.unwrap_or_default()
            ),
            h if h.answers() => tracing::info!(
                engine = %name,
                verdict = self.peek_status().as_str(),
                "/health answers"
            ),
            _ => {}
        }
    }

    /// Re-arms virtual inference when `/health` was down after abnormal and answers again
    /// (the engine restarted).
    fn rearm_after_restart(&self, outcome: &HealthOutcome) {
        let (down, rearm) = verdict::restart(
            self.down_after_abnormal.load(Ordering::Acquire),
            outcome,
            self.vi.abnormal(),
        );
        self.down_after_abnormal.store(down, Ordering::Release);
        if rearm {
            tracing::warn!(engine = %self.spec.name, "the engine restarted (/health down, then up); virtual inference is re-armed");
            self.vi.rearm();
            self.rearms.fetch_add(1, Ordering::Relaxed);
            self.rearm_tx.send_modify(|g| *g += 1);
            self.started.store(false, Ordering::Release);
        }
    }

    /// Evaluates the start gates now (the configuration's and AI Cube readability of `cube`)
    /// and returns every condition; `doctor` reads them the same way.
    pub fn evaluate_gates(&self, cube: &[(u32, crate::driver::Backend)]) -> Vec<Condition> {
        // Evaluated now, as the reference does at start (the agent's own environment may
        // have changed since the configuration was read).
        for c in gates::static_conditions(&self.spec) {
            self.set_condition(c);
        }
        self.set_condition(gates::cube_condition(cube));
        self.conditions()
    }

    /// Evaluates the start gates when the first healthy `/status` arrives; true if virtual
    /// inference may run. `cube` lists (logic id, backend) of the engine's NPUs.
    pub fn decide_start(&self, cube: &[(u32, crate::driver::Backend)]) -> bool {
        let conditions = self.evaluate_gates(cube);
        let blocking: Vec<&Condition> = conditions
            .iter()
            .filter(|c| c.name != "health" && c.ok == Some(false))
            .collect();
        if let Some(first) = blocking.first() {
            tracing::warn!(engine = %self.spec.name, condition = first.name.as_ref(), "virtual inference does not run: {}", first.note);
            self.vi.set_phase(Phase::Disabled);
            return false;
        }
        true
    }
}

#[cfg(test)]
mod tests;

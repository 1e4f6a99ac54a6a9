//! The engine's processes, read through `/proc` every [`PROCESS_PERIOD`]: which process holds
//! the engine's listening socket and whether it or a descendant is stopped (rule 10 of
//! docs/policy.md), and whether they are in sight at all (the condition `engine_processes`).
//!
//! Its finding: one of them stopped past `agent_policy.stopped_process_grace`.

use super::{Finding, Kind, Loops, Rule, RuleId, Side, Source, Task};
use crate::monitor::Monitor;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The engine's processes.
pub(crate) struct Processes;

/// Rule 10: a stopped engine process is reported in seconds.
const STOPPED: Rule = Rule {
    id: RuleId(10),
    name: "stopped_process",
    doc: "a process of the engine's (the holder of its socket, or a descendant) stopped for the grace is abnormal",
    keys: &["agent_policy.stopped_process_grace"],
};

impl Source for Processes {
    fn name(&self) -> &'static str {
        "processes"
    }

    fn rules(&self) -> &'static [Rule] {
        &[STOPPED]
    }

    fn finding(&self, m: &Monitor, side: Side) -> Option<Finding> {
        m.engine_stopped_on(side).then_some(Finding {
            kind: Kind::EngineStopped,
            rule: Some(STOPPED.id),
        })
    }

    fn reason(&self, m: &Monitor, _: &Finding) -> String {
        let (pid, d) = m.stopped_for().unwrap_or_default();
        format!(
            "the engine's process {pid} is stopped (SIGSTOP or a debugger) for {:.1} s, past agent_policy.stopped_process_grace ({:?})",
            d.as_secs_f64(),
            m.spec.agent_policy.stopped_process_grace
        )
    }

    /// When the policy in force or the shadow applies the rule.
    fn task(&self, m: &Arc<Monitor>, _: &Loops<'_>, cancel: &CancellationToken) -> Option<Task> {
        [Side::InForce, Side::Shadow]
            .into_iter()
            .filter_map(|side| m.spec.judging(side))
            .any(|j| j.applies(STOPPED.id.0))
            .then(|| -> Task {
                Box::pin(process_task(
                    m.clone(),
                    crate::proc_sockets::ProcRoot::default(),
                    cancel.clone(),
                ))
            })
    }
}

/// Time between two looks at the engine's processes (the stopped-process rule's sample).
pub const PROCESS_PERIOD: Duration = Duration::from_millis(500);

/// Looks at the engine's processes (`/proc` under `root`) every [`PROCESS_PERIOD`] until
/// cancelled: the agent policy's stopped-process rule reads it. The look runs on a blocking
/// thread (a look-up reads processes' open files, a bounded number per look).
pub(crate) async fn process_task(
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

impl Monitor {
    /// Notes what `/proc` showed of the engine's processes at `now`.
    pub(crate) fn record_process(
        &self,
        found: &crate::probe::process::Lookup,
        now: tokio::time::Instant,
    ) {
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
        self.set_condition(crate::monitor::gates::Condition {
            name: "engine_processes".into(),
            value,
            ok: Some(true),
            note,
        });
    }

    /// The stopped process and how long it has been stopped, if one is.
    pub(crate) fn stopped_for(&self) -> Option<(u32, std::time::Duration)> {
        let stopped = self.stopped.lock().unwrap_or_else(|p| p.into_inner());
        stopped.map(|(pid, _, since)| (pid, since.elapsed()))
    }

    /// The stopped-process rule holds now, as `side` applies it.
    pub(crate) fn engine_stopped_on(&self, side: Side) -> bool {
        let grace = self
            .spec
            .judging(side)
            .filter(|j| j.applies(STOPPED.id.0))
            .map(|_| self.spec.agent_policy.stopped_process_grace);
        stopped(self.stopped_for().map(|(_, d)| d), grace)
    }
}

/// The agent policy's stopped-process rule: one of the engine's processes has been stopped
/// (`T`: SIGSTOP, a debugger) for `grace` or longer. A `grace` of zero turns it off; the
/// reference policy has no such rule (its caller passes `None`).
pub(crate) fn stopped(
    stopped_for: Option<std::time::Duration>,
    grace: Option<std::time::Duration>,
) -> bool {
    match (stopped_for, grace) {
        (Some(d), Some(g)) => !g.is_zero() && d >= g,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The stopped-process rule (agent policy): stopped for the grace or longer; a zero grace
    // or the reference policy (no grace at all) never fires.
    #[test]
    fn stopped_table() {
        let s = std::time::Duration::from_secs;
        let ms = std::time::Duration::from_millis;
        let rows = [
            (None, Some(s(2)), false),
            (Some(ms(1999)), Some(s(2)), false),
            (Some(s(2)), Some(s(2)), true),
            (Some(s(60)), Some(s(2)), true),
            (Some(s(60)), Some(s(0)), false),
            (Some(s(60)), None, false),
        ];
        for (stopped_for, grace, want) in rows {
            assert_eq!(
                stopped(stopped_for, grace),
                want,
                "{stopped_for:?} {grace:?}"
            );
        }
    }
}

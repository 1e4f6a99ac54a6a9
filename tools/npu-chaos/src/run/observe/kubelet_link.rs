//! The kubelet emulator's link to the run: the runner restarts the engine for the actions the
//! emulator decided, and keeps their log for detection and the outcome.

use crate::run::outcome::KubeletOutcome;
use crate::run::stack::Stack;
use std::time::Duration;
use tokio::time::Instant;

/// The kubelet emulator's side of a run, as the runner sees it: the actions it decided, the
/// container generation the runner bumps at every restart, and what happened.
pub(in crate::run) struct KubeletLink {
    pub(in crate::run) actions:
        tokio::sync::mpsc::UnboundedReceiver<(crate::kubelet::Action, Instant)>,
    pub(in crate::run) generation: tokio::sync::watch::Sender<u64>,
    pub(in crate::run) exit_backoff: Duration,
    pub(in crate::run) expect: crate::experiment::KubeletExpect,
    pub(in crate::run) log: Vec<(Instant, crate::kubelet::Action)>,
    /// When the container was found gone, awaiting its restart.
    pub(in crate::run) exited_at: Option<Instant>,
    pub(in crate::run) not_ready_since: Option<Instant>,
    pub(in crate::run) not_ready_total: Duration,
}

impl KubeletLink {
    /// Takes the emulator's actions and restarts the engine for them, and restarts a
    /// container that exited once the back-off has passed.
    pub(in crate::run) async fn act(
        &mut self,
        stack: &mut Stack,
        now: Instant,
    ) -> Result<(), String> {
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
    pub(in crate::run) fn first(
        &self,
        from: Instant,
        kinds: &[crate::kubelet::Action],
    ) -> Option<Instant> {
        self.log
            .iter()
            .find(|(at, a)| *at >= from && kinds.contains(a))
            .map(|(at, _)| *at)
    }

    pub(in crate::run) fn outcome(
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

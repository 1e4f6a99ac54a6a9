//! The engine's identity: after a restored state, the engine process's start time on its
//! `/metrics` against the one the state was saved with ([`crate::monitor::saved`]). No rule of
//! docs/policy.md reads it and it never makes the engine abnormal: it decides whether a saved
//! state is this engine's.

use super::{Loops, Source, Task};
use crate::monitor::Monitor;
use crate::probe::MetricsSource;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The engine process's identity.
pub(crate) struct Identity;

impl Source for Identity {
    fn name(&self) -> &'static str {
        "identity"
    }

    /// Only after a restored `/health` state that names the engine's start time.
    fn task(&self, m: &Arc<Monitor>, with: &Loops<'_>, cancel: &CancellationToken) -> Option<Task> {
        let at = with.saved_start?;
        Some(Box::pin(identity_task(
            m.clone(),
            with.client.metrics(),
            at,
            cancel.clone(),
        )))
    }
}

/// How long the identity check waits for the engine's `/metrics` at most.
const IDENTITY_PATIENCE: Duration = Duration::from_secs(600);

/// After a restored state: scrapes the engine's `/metrics` until it answers (for at most
/// [`IDENTITY_PATIENCE`]) and forgets the state if the engine is another process than the one
/// it was saved from ([`crate::monitor::saved::other_process`]).
pub(crate) async fn identity_task<M: MetricsSource>(
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
            match crate::monitor::saved::other_process(saved_start, m.process_start_time) {
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

impl Monitor {
    /// Notes the engine process's start time seen on its `/metrics`.
    pub(crate) fn record_engine_start(&self, at: Option<f64>) {
        if let Some(at) = at {
            *self
                .engine_started_at
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = Some(at);
        }
    }

    /// The engine process's start time as last seen (Unix seconds).
    pub(crate) fn engine_started_at(&self) -> Option<f64> {
        *self
            .engine_started_at
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }
}

//! Writes the Events to the API server: the calls ([`EventSink`], for [`KubeClient`]: a
//! `POST` of an events.k8s.io/v1 Event, a strategic-merge `PATCH` of its `series`) and the
//! writer ([`run`]) that takes them from the recorder's queue one at a time, and finishes and
//! refreshes the series on their schedule ([`super::series`]).
//!
//! Failures as client-go's `recordEvent` and `attemptRecording` treat them
//! (`tools/events/event_broadcaster.go`): no answer (refused, timed out) is tried again after
//! 10 s (±25 %), at most [`MAX_TRIES`] times in all, and the queue waits meanwhile (what
//! arrives past its bound is dropped and counted); an answer that refuses (any HTTP error) is
//! final, except a create that finds the Event of a series already there. A PATCH answered
//! 404 creates the Event again.

use super::series::{FINISH, REFRESH, Write};
use super::{Counts, Recorder};
use crate::integrations::kubernetes::api::{ApiError, KubeClient, OBJECT_LIMIT};
use k8s_openapi::api::events::v1::{Event, EventSeries};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Tries per Event (client-go's `maxTriesPerEvent`).
pub(crate) const MAX_TRIES: u32 = 12;
/// The wait between two tries, before its jitter (client-go's `defaultSleepDuration`).
pub(crate) const RETRY_SLEEP: Duration = Duration::from_secs(10);
/// A failure to write is logged at most this often.
const LOG_EVERY: Duration = Duration::from_secs(60);

/// The two calls the writer makes.
pub(crate) trait EventSink: Send + Sync {
    /// Creates `event` in its namespace.
    fn create(&self, event: &Event) -> impl Future<Output = Result<(), ApiError>> + Send;
    /// Sets the `series` of the Event `namespace/name`.
    fn patch_series(
        &self,
        namespace: &str,
        name: &str,
        series: &EventSeries,
    ) -> impl Future<Output = Result<(), ApiError>> + Send;
}

impl EventSink for KubeClient {
    async fn create(&self, event: &Event) -> Result<(), ApiError> {
        let ns = event.metadata.namespace.as_deref().unwrap_or("default");
        let body = serde_json::to_vec(event).map_err(|e| ApiError::Transport(e.to_string()))?;
        let req = http::Request::post(format!("/apis/events.k8s.io/v1/namespaces/{ns}/events"))
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(body)
            .map_err(|e| ApiError::Transport(e.to_string()));
        self.send(req?, OBJECT_LIMIT).await.map(drop)
    }

    async fn patch_series(
        &self,
        namespace: &str,
        name: &str,
        series: &EventSeries,
    ) -> Result<(), ApiError> {
        // The two-way merge patch client-go computes between the Event without and with its
        // series: the series alone.
        let body = serde_json::to_vec(&serde_json::json!({ "series": series }))
            .map_err(|e| ApiError::Transport(e.to_string()))?;
        let req = http::Request::patch(format!(
            "/apis/events.k8s.io/v1/namespaces/{namespace}/events/{name}"
        ))
        .header(
            http::header::CONTENT_TYPE,
            "application/strategic-merge-patch+json",
        )
        .body(body)
        .map_err(|e| ApiError::Transport(e.to_string()));
        self.send(req?, OBJECT_LIMIT).await.map(drop)
    }
}

/// How one try ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Tried {
    Created,
    Patched,
    /// Refused for good (an HTTP error): not tried again.
    Refused(String),
    /// No usable answer: try again.
    Again(String),
}

/// One try of `w`.
pub(crate) async fn write_once(sink: &impl EventSink, w: &Write) -> Tried {
    let event = w.event();
    let series = match w {
        Write::Create(_) => None,
        Write::Series(e) => e.series.as_ref(),
    };
    if let Some(s) = series {
        let ns = event.metadata.namespace.as_deref().unwrap_or("default");
        let name = event.metadata.name.as_deref().unwrap_or_default();
        match sink.patch_series(ns, name, s).await {
            Ok(()) => return Tried::Patched,
            Err(e) if e.code() == Some(404) => {}
            Err(e) => return judge(&e, false),
        }
    }
    match sink.create(event).await {
        Ok(()) => Tried::Created,
        Err(e) => judge(&e, series.is_some()),
    }
}

/// Whether a failure is worth another try (client-go's `recordEvent`): an error answer is
/// final, but for a series' Event created meanwhile by another try (409).
fn judge(e: &ApiError, series: bool) -> Tried {
    match e.code() {
        Some(409) if series => Tried::Again(e.to_string()),
        Some(_) => Tried::Refused(e.to_string()),
        None => Tried::Again(e.to_string()),
    }
}

/// Counts one try's outcome; `final_try`: no other will follow.
fn count(counts: &Counts, t: &Tried, final_try: bool) {
    use std::sync::atomic::Ordering::Relaxed;
    match t {
        Tried::Created => counts.created.fetch_add(1, Relaxed),
        Tried::Patched => counts.patched.fetch_add(1, Relaxed),
        Tried::Refused(_) => counts.failed.fetch_add(1, Relaxed),
        Tried::Again(_) if final_try => counts.failed.fetch_add(1, Relaxed),
        Tried::Again(_) => 0,
    };
}

/// The wait before try `n + 1`: [`RETRY_SLEEP`] and up to a quarter more, so that agents
/// that lost the API server together do not come back together.
fn jittered(n: u32) -> Duration {
    let spread = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos())
        .wrapping_mul(2_654_435_761)
        .wrapping_add(n);
    RETRY_SLEEP + RETRY_SLEEP.mul_f64(f64::from(spread % 1000) / 4000.0)
}

/// Logs a failure at most once a [`LOG_EVERY`].
#[derive(Default)]
struct Quiet(Option<Instant>);

impl Quiet {
    fn warn(&mut self, msg: &str) {
        let now = Instant::now();
        if self.0.is_none_or(|at| now >= at + LOG_EVERY) {
            self.0 = Some(now);
            tracing::warn!("Kubernetes Events: {msg}");
        }
    }
}

/// Writes `w` with up to [`MAX_TRIES`] tries; `false` when cancelled meanwhile.
async fn attempt(
    sink: &impl EventSink,
    w: &Write,
    counts: &Counts,
    quiet: &mut Quiet,
    cancel: &CancellationToken,
) -> bool {
    for n in 1..=MAX_TRIES {
        let t = write_once(sink, w).await;
        count(counts, &t, n == MAX_TRIES);
        match t {
            Tried::Created | Tried::Patched => return true,
            Tried::Refused(why) => {
                quiet.warn(&format!("{} refused: {why}", about(w)));
                return true;
            }
            Tried::Again(why) if n == MAX_TRIES => {
                quiet.warn(&format!("{} not written after {n} tries: {why}", about(w)));
            }
            Tried::Again(why) => {
                quiet.warn(&format!(
                    "{} not written ({why}); trying again, at most {MAX_TRIES} tries",
                    about(w)
                ));
                tokio::select! {
                    () = cancel.cancelled() => return false,
                    () = tokio::time::sleep(jittered(n)) => {}
                }
            }
        }
    }
    true
}

/// The Event in a log line: `Warning EngineNotReady on inference/vllm-0`.
fn about(w: &Write) -> String {
    let e = w.event();
    let r = e.regarding.as_ref();
    format!(
        "Event {} {} on {}/{}",
        e.type_.as_deref().unwrap_or_default(),
        e.reason.as_deref().unwrap_or_default(),
        r.and_then(|r| r.namespace.as_deref()).unwrap_or_default(),
        r.and_then(|r| r.name.as_deref()).unwrap_or_default()
    )
}

/// The writer: takes each write from `queue` and writes it, finishes the series every
/// [`FINISH`] and refreshes them every [`REFRESH`], until `cancel`.
pub(crate) async fn run(
    sink: impl EventSink,
    mut queue: mpsc::Receiver<Write>,
    rec: Recorder,
    cancel: CancellationToken,
) {
    let counts: Arc<Counts> = rec.counts();
    let mut quiet = Quiet::default();
    let start = Instant::now();
    let mut finish = tokio::time::interval_at(start + FINISH, FINISH);
    let mut refresh = tokio::time::interval_at(start + REFRESH, REFRESH);
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            w = queue.recv() => {
                let Some(w) = w else { return };
                if !attempt(&sink, &w, &counts, &mut quiet, &cancel).await {
                    return;
                }
            }
            _ = finish.tick() => {
                // One try each, as client-go's finishSeries: a series whose count could not be
                // written stays for the next round.
                for (key, w) in rec.finish(Instant::now()) {
                    let t = write_once(&sink, &w).await;
                    count(&counts, &t, false);
                    if !matches!(t, Tried::Again(_)) {
                        rec.finished(&key, Instant::now());
                    }
                }
            }
            _ = refresh.tick() => {
                for w in rec.refresh() {
                    let t = write_once(&sink, &w).await;
                    count(&counts, &t, false);
                }
            }
        }
    }
}

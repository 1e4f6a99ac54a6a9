//! The admin listener's live views: `GET /` (the page, [`crate::view::PAGE`]) and
//! `GET /events` (its server-sent event stream, [`crate::view`] says what is in it).
//!
//! Bounded on every side, so a browser never slows the sampler or `/status`:
//! - **rate:** one `samples` frame per [`view::FRAME_INTERVAL`] per subscriber, built from the
//!   lock-free ring when the frame is due (the sampler is never waited on);
//! - **subscribers:** at most [`MAX_SUBSCRIBERS`] streams at once; one more is answered 503;
//! - **backpressure:** a frame is built only when the previous one was handed to the socket,
//!   so a slow reader holds one frame, not a queue; one that stops reading is closed by the
//!   listener's idle timeout. Missed ticks are not caught up: the next frame carries every
//!   sample since the last one sent (bounded by the ring's history);
//! - **stop:** a stream ends as soon as its listener stops (a stop, a reload that restarts the
//!   admin listener, a handover), so it never holds one up; the client reconnects to
//!   whichever agent accepts next.

use super::AdminView;
use super::conn::Stopping;
use crate::view;
use axum::Extension;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio_util::sync::CancellationToken;

/// Most `/events` streams at once on one admin listener.
pub(crate) const MAX_SUBSCRIBERS: usize = 8;

/// The subscriber count of one admin listener.
#[derive(Debug, Default)]
pub(crate) struct Hub {
    subscribers: AtomicUsize,
}

impl Hub {
    fn join(self: &Arc<Hub>) -> Option<Subscriber> {
        self.subscribers
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_SUBSCRIBERS).then_some(n + 1)
            })
            .ok()
            .map(|_| Subscriber(self.clone()))
    }
}

/// One open stream; leaves the count when the stream is dropped (the client went away).
#[derive(Debug)]
struct Subscriber(Arc<Hub>);

impl Drop for Subscriber {
    fn drop(&mut self) {
        self.0.subscribers.fetch_sub(1, Ordering::AcqRel);
    }
}

/// `GET /`: the page.
pub(crate) async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src data:",
            ),
        ],
        view::PAGE,
    )
        .into_response()
}

/// What one stream holds between frames.
struct Stream {
    view: AdminView,
    after_ns: u64,
    frames: u32,
    tick: tokio::time::Interval,
    pending: VecDeque<Event>,
    /// The listener's stop (`None`: served without [`crate::server::serve`], as in a unit
    /// test; the stream then ends with its client only).
    stop: Option<CancellationToken>,
    _subscriber: Subscriber,
}

/// Fires when `stop` does; never without one.
async fn stopped(stop: &Option<CancellationToken>) {
    match stop {
        Some(t) => t.cancelled().await,
        None => std::future::pending().await,
    }
}

fn event<T: serde::Serialize>(name: &str, data: &T) -> Event {
    Event::default()
        .event(name)
        .data(serde_json::to_string(data).unwrap_or_else(|_| "null".to_owned()))
}

impl Stream {
    async fn next(mut self) -> Option<(Result<Event, Infallible>, Stream)> {
        if self.pending.is_empty() {
            tokio::select! {
                biased;
                () = stopped(&self.stop) => return None,
                _ = self.tick.tick() => {}
            }
            let s = &self.view.metrics;
            self.pending.push_back(event(
                "samples",
                &view::samples_since(&s.shared, &mut self.after_ns),
            ));
            if self.frames.is_multiple_of(view::ENGINES_EVERY) {
                self.pending
                    .push_back(event("engines", &view::engines(&s.shared, &s.engines)));
            }
            self.frames = self.frames.wrapping_add(1);
        }
        let e = self.pending.pop_front()?;
        Some((Ok(e), self))
    }
}

/// `GET /events`: the stream, or 503 past [`MAX_SUBSCRIBERS`]. It ends when its listener
/// stops ([`Stopping`]).
pub(crate) async fn events(
    State(v): State<AdminView>,
    stop: Option<Extension<Stopping>>,
) -> Response {
    let Some(subscriber) = v.hub.join() else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "5")],
            format!("too many /events subscribers (at most {MAX_SUBSCRIBERS})\n"),
        )
            .into_response();
    };
    let s = &v.metrics;
    let hello = event("hello", &view::hello(&s.shared, &s.engines, &v.node));
    let mut tick = tokio::time::interval(view::FRAME_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let stream = Stream {
        after_ns: view::history_start(&s.shared),
        view: v.clone(),
        frames: 0,
        tick,
        pending: VecDeque::from([hello]),
        stop: stop.map(|Extension(Stopping(t))| t),
        _subscriber: subscriber,
    };
    let body = futures_util::stream::unfold(stream, Stream::next);
    Sse::new(body)
        .keep_alive(KeepAlive::default())
        .into_response()
}

//! Virtual inference's sleep between two probes, and what cuts it short under the agent
//! policy: a busy NPU fallen idle (rule 6), a new driver fault (rule 8), a quiet engine (rule
//! 11), or the late answer of a request still pending (rule 12).

use crate::monitor::evidence::driver_faults::{CONFIRM_LEVEL, Checked, worst};
use crate::monitor::inputs::PeakSource;
use crate::probe::outcome::ProbeResult;
use crate::sampler::faults::NpuFault;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

/// A request sent with a timeout shorter than the request timeout (the learned one, rule 12,
/// or a quick probe's) that passed without an answer. The loop counted the failure and went
/// on, but the request waits for its answer until the request timeout: an answer by then is
/// an answer (a slow engine, not a hung one), and the next probe waits at least that long.
pub(super) struct Pending<'a> {
    /// The request itself, sent with the request timeout.
    pub(super) answer: Pin<Box<dyn Future<Output = ProbeResult> + Send + 'a>>,
    pub(super) sent: tokio::time::Instant,
    /// The faults at the confirming level when it was sent.
    pub(super) before: Checked,
    /// The shorter timeout it missed.
    pub(super) missed: Duration,
}

impl std::fmt::Debug for Pending<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending")
            .field("sent", &self.sent)
            .field("missed", &self.missed)
            .finish_non_exhaustive()
    }
}

impl Pending<'_> {
    /// How long it may still answer, with `request_timeout`.
    pub(super) fn left(&self, request_timeout: Duration) -> Duration {
        (self.sent + request_timeout).saturating_duration_since(tokio::time::Instant::now())
    }

    /// Its late answer, as an outcome to account.
    pub(super) fn answered(self, r: ProbeResult) -> Sent {
        Sent {
            r,
            at: self.sent,
            before: self.before,
            late: Some(self.missed),
        }
    }
}

/// A request's outcome as the loop accounts it.
#[derive(Debug)]
pub(super) struct Sent {
    pub(super) r: ProbeResult,
    /// When the request was sent.
    pub(super) at: tokio::time::Instant,
    /// The faults at the confirming level then (agent policy; empty under the reference).
    pub(super) before: Checked,
    /// Set for a late answer: the shorter timeout the request had missed.
    pub(super) late: Option<Duration>,
}

/// Why a [`pause`] ended.
#[derive(Debug)]
pub(super) enum Wake {
    /// It slept the whole time.
    Elapsed,
    /// The NPU fell idle over a whole window.
    Idle,
    /// The driver reports a fault at the confirming level that no probe has checked.
    Fault(NpuFault),
    /// The engine has shown no sign of life for this long while it should be working (rule
    /// 11).
    Quiet(Duration),
    /// A pending request answered: the engine is slow, not hung.
    Answered(Sent),
}

/// How often a pause looks at the driver's faults (the sampler reads them every
/// `fault_period`, 1 s by default, at least 5 s through `npu-smi`; a new one is acted on
/// within this of being read).
pub(super) const FAULT_POLL: Duration = Duration::from_millis(100);

/// Sleeps `sleep`, or less: when `idle` is `(window, threshold)` and the NPU stays below
/// `threshold` over a whole `window`, or (with `checked`, rule 8 on) when a driver fault at
/// the confirming level that is not in `checked` appears, or when `quiet` says the engine has gone quiet, or when the
/// `pending` request answers (one that fails is dropped).
pub(super) async fn pause(
    sleep: Duration,
    peaks: &impl PeakSource,
    idle: Option<(Duration, f64)>,
    checked: Option<&Checked>,
    quiet: impl Fn() -> Option<Duration>,
    pending: &mut Option<Pending<'_>>,
) -> Wake {
    let end = tokio::time::Instant::now() + sleep;
    // The window must not reach back before the sleep: the probe itself was busy.
    let start = tokio::time::Instant::now();
    loop {
        let new: Vec<_> = match checked {
            Some(checked) => peaks
                .faults()
                .into_iter()
                .filter(|f| f.level >= CONFIRM_LEVEL && !checked.contains(&(f.npu, f.code)))
                .collect(),
            None => Vec::new(),
        };
        if let Some(f) = worst(&new) {
            return Wake::Fault(f.clone());
        }
        let now = tokio::time::Instant::now();
        if now >= end {
            return Wake::Elapsed;
        }
        if let Some((window, threshold)) = idle
            && now.duration_since(start) >= window
            && peaks.peak(window).is_some_and(|p| p < threshold)
        {
            return Wake::Idle;
        }
        if let Some(q) = quiet() {
            return Wake::Quiet(q);
        }
        let tick = tokio::time::sleep(FAULT_POLL.min(end - now));
        let answer = match pending.as_mut() {
            Some(l) => tokio::select! {
                biased;
                r = &mut l.answer => Some(r),
                _ = tick => None,
            },
            None => {
                tick.await;
                None
            }
        };
        if let Some(r) = answer
            && let Some(l) = pending.take()
            && r.outcome.is_ok()
        {
            return Wake::Answered(l.answered(r));
        }
    }
}

/// The outcome of `request`, unless `pending` answers first: the engine answered, and that
/// answer is the outcome. A pending request that fails is dropped: its failure was counted
/// when its shorter timeout passed.
pub(super) async fn first_answer(
    request: impl Future<Output = ProbeResult>,
    pending: Option<Pending<'_>>,
    at: tokio::time::Instant,
    before: Checked,
) -> Sent {
    let own = |r| Sent {
        r,
        at,
        before,
        late: None,
    };
    let Some(mut pending) = pending else {
        return own(request.await);
    };
    let mut request = std::pin::pin!(request);
    let late = tokio::select! {
        biased;
        r = &mut pending.answer => r,
        r = &mut request => return own(r),
    };
    if late.outcome.is_ok() {
        pending.answered(late)
    } else {
        own(request.await)
    }
}

//! `dynamo-canary`: NVIDIA Dynamo's canary health check, and the operator's liveness probe
//! that turns its status into a restart.
//!
//! - The canary (ai-dynamo/dynamo `lib/runtime/src/health_check.rs` @
//!   01a13f01234baca1417fe6695b94fb2cb6a30d2e): after `DYN_CANARY_WAIT_TIME` (10 s) with no
//!   activity, one request with the backend's payload (the vLLM backend's: one token,
//!   temperature 0), bounded by `DYN_HEALTH_CHECK_REQUEST_TIMEOUT` (3 s). Only its first
//!   streamed item counts: an item makes the endpoint Ready, an error, an empty stream or the
//!   timeout NotReady; the rest of the stream is drained apart. Any non-error chunk of real
//!   traffic makes it Ready and starts the idle time again, so a busy engine is never sent a
//!   canary. There is no failure counter.
//! - Real traffic here is the load generator's: it is the frontend's traffic to this worker.
//!   The runner watches the tokens it receives (a look every [`ACTIVITY_LOOK`] scaled).
//! - The kill: the operator's worker liveness probe on the system port's `/live`
//!   (`deploy/operator/internal/dynamo/component_worker.go` @
//!   015d780ba9c3d32c293ad67b786fe9af0d8a4d22: period 5 s, timeout 4 s), with
//!   `failureThreshold` 3 for runtimes from 1.5.0 (PR #13512; 1 before). `/live` answers the
//!   endpoint's status from memory (`DYN_SYSTEM_USE_ENDPOINT_HEALTH_STATUS=["generate"]`), so
//!   the probe here reads the status; its timeout never binds.

use super::Targets;
use super::k8s::liveness;
use super::probe::{self, Failure, ProbeLog};
use crate::kubelet::ProbeSpec;
use std::future::Future;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// `DYN_CANARY_WAIT_TIME`'s default.
pub(super) const CANARY_WAIT: Duration = Duration::from_secs(10);
/// `DYN_HEALTH_CHECK_REQUEST_TIMEOUT`'s default.
pub(super) const CANARY_TIMEOUT: Duration = Duration::from_secs(3);
/// How often the runner looks for new tokens at the load (unscaled): Dynamo is told of each
/// chunk at once; a 200 ms look moves the idle time by at most that.
pub(super) const ACTIVITY_LOOK: Duration = Duration::from_millis(200);

/// The operator's worker liveness probe on `/live` (runtime ≥ 1.5.0).
pub(super) const LIVE: ProbeSpec = ProbeSpec {
    period: Duration::from_secs(5),
    timeout: Duration::from_secs(4),
    failure_threshold: 3,
    success_threshold: 1,
};

/// The canary's timing, scaled.
#[derive(Debug, Clone, Copy)]
pub(super) struct Timing {
    pub(super) wait: Duration,
    pub(super) timeout: Duration,
    pub(super) look: Duration,
}

/// The canary loop: sends `canary` after `wait` with no activity (`activity` counts the
/// tokens of real traffic) and keeps the endpoint's status in `status`; runs until dropped.
pub(super) async fn canary_loop<C, Fut>(
    t: Timing,
    mut canary: C,
    activity: impl Fn() -> u64,
    status: watch::Sender<bool>,
) where
    C: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let mut seen = activity();
    let mut idle_since = Instant::now();
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(idle_since + t.wait) => {
                let ok = tokio::time::timeout(t.timeout, canary()).await.unwrap_or(false);
                status.send_replace(ok);
                idle_since = Instant::now();
            }
            () = tokio::time::sleep(t.look) => {
                let now = activity();
                if now != seen {
                    seen = now;
                    status.send_replace(true);
                    idle_since = Instant::now();
                }
            }
        }
    }
}

/// One canary over HTTP: the vLLM backend's payload as a streamed completion; true when its
/// first item is a chunk (not an error event, not the end). The rest is drained apart.
async fn send_canary(
    client: &reqwest::Client,
    targets: &Targets,
    timeout: Duration,
    log: &ProbeLog,
) -> bool {
    let started = Instant::now();
    let body = serde_json::json!({
        "model": targets.model,
        "prompt": "Test",
        "max_tokens": 1,
        "temperature": 0.0,
        "stream": true,
    });
    let first = async {
        let mut r = client
            .post(format!("{}/v1/completions", targets.base))
            .json(&body)
            .send()
            .await
            .map_err(probe::sort)?;
        if !r.status().is_success() {
            return Err(Failure::Other(format!("HTTP {}", r.status().as_u16())));
        }
        let mut buf = Vec::new();
        loop {
            match r.chunk().await.map_err(probe::sort)? {
                None => return Err(Failure::Other("the stream ended with no item".into())),
                Some(c) => buf.extend_from_slice(&c),
            }
            if let Some(nl) = buf.iter().position(|b| *b == b'\n') {
                let line = String::from_utf8_lossy(&buf[..nl]).into_owned();
                tokio::spawn(async move { while let Ok(Some(_)) = r.chunk().await {} });
                return if line.starts_with("data: {") && !line.contains("\"error\"") {
                    Ok(())
                } else {
                    Err(Failure::Other(format!("first item: {line}")))
                };
            }
        }
    };
    let result = tokio::time::timeout(timeout, first)
        .await
        .unwrap_or(Err(Failure::Timeout));
    let ok = result.is_ok();
    let error = result.err().map(|f| f.text());
    log.push(
        "canary",
        if ok { "ready" } else { "not ready" },
        error,
        started.elapsed(),
    );
    ok
}

/// The decider: the canary against the engine, the operator's liveness probe on its status.
pub(super) async fn decide(targets: Targets, s: f64, log: ProbeLog) -> Instant {
    let t = Timing {
        wait: super::interval(CANARY_WAIT, s),
        timeout: super::timeout(CANARY_TIMEOUT, s),
        look: super::interval(ACTIVITY_LOOK, s),
    };
    let live = super::scaled_spec(LIVE, s);
    let (tx, rx) = watch::channel(true);
    let client = probe::client();
    let load = targets.load.clone();
    let canary = canary_loop(
        t,
        || send_canary(&client, &targets, t.timeout, &log),
        move || load.as_ref().map_or(0, |l| l.tokens()),
        tx,
    );
    let probe = liveness(live, || {
        let ready = *rx.borrow();
        log.push(
            "/live",
            if ready { "ok" } else { "failed" },
            (!ready).then(|| "HTTP 503 (endpoint not ready)".to_owned()),
            Duration::ZERO,
        );
        async move { ready }
    });
    tokio::select! {
        () = canary => unreachable!("the canary loop runs until dropped"),
        at = probe => at,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    const T: Timing = Timing {
        wait: CANARY_WAIT,
        timeout: CANARY_TIMEOUT,
        look: ACTIVITY_LOOK,
    };

    // While real traffic flows the canary is never sent; once idle it is sent after the
    // wait, and every wait after that.
    #[tokio::test(start_paused = true)]
    async fn the_canary_is_never_sent_while_traffic_flows() {
        let sent = Arc::new(AtomicU64::new(0));
        let tokens = Arc::new(AtomicU64::new(0));
        let (tx, rx) = watch::channel(true);
        let (s, t) = (sent.clone(), tokens.clone());
        let task = tokio::spawn(canary_loop(
            T,
            move || {
                s.fetch_add(1, Ordering::SeqCst);
                async { true }
            },
            move || t.load(Ordering::SeqCst),
            tx,
        ));
        // 60 s of traffic, a token every second.
        for _ in 0..60 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            tokens.fetch_add(1, Ordering::SeqCst);
        }
        assert_eq!(sent.load(Ordering::SeqCst), 0, "never while traffic flows");
        // Idle: one canary 10 s after the last token, then one every 10 s.
        tokio::time::sleep(Duration::from_millis(9_500)).await;
        assert_eq!(sent.load(Ordering::SeqCst), 0);
        tokio::time::sleep(Duration::from_secs(21)).await;
        assert_eq!(sent.load(Ordering::SeqCst), 3);
        assert!(*rx.borrow());
        task.abort();
    }

    // One failed (or timed-out) canary makes the endpoint not ready at once, with no
    // counter; the next chunk of real traffic makes it ready again.
    #[tokio::test(start_paused = true)]
    async fn one_failed_canary_flips_not_ready_and_traffic_flips_it_back() {
        let tokens = Arc::new(AtomicU64::new(0));
        let (tx, rx) = watch::channel(true);
        let t = tokens.clone();
        let task = tokio::spawn(canary_loop(
            T,
            // Never answers: the 3 s timeout decides.
            std::future::pending::<bool>,
            move || t.load(Ordering::SeqCst),
            tx,
        ));
        tokio::time::sleep(Duration::from_millis(12_900)).await;
        assert!(*rx.borrow(), "the canary's 3 s are not over");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!*rx.borrow(), "one timed-out canary: not ready");
        tokens.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(T.look * 2).await;
        assert!(*rx.borrow(), "a chunk of traffic: ready again");
        task.abort();
    }

    // The operator's probe restarts on the third not-ready read in a row (runtime ≥ 1.5.0):
    // a hung engine with no traffic is killed 10 + 3 s (the canary) + up to 3 periods of
    // 5 s after its last token.
    #[tokio::test(start_paused = true)]
    async fn the_operator_kills_on_the_third_not_ready_read() {
        let (tx, rx) = watch::channel(true);
        let start = Instant::now();
        let canary = tokio::spawn(canary_loop(T, std::future::pending::<bool>, || 0, tx));
        let at = liveness(LIVE, || {
            let ready = *rx.borrow();
            async move { ready }
        })
        .await;
        canary.abort();
        // Not ready from 13 s; reads at 15, 20, 25 s fail: killed at 25 s.
        assert_eq!(at - start, Duration::from_secs(25));
    }
}

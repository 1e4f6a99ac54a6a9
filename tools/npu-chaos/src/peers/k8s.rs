//! `k8s-liveness` (and the liveness probe the other peers end in): the kubelet's liveness
//! worker on an HTTP endpoint, as kubernetes/kubernetes decides.
//!
//! - Defaults (`pkg/apis/core/v1/defaults.go`, `SetDefaults_Probe`): period 10 s, timeout
//!   1 s, `failureThreshold` 3, `successThreshold` 1.
//! - The worker (`pkg/kubelet/prober/worker.go` @ 00421113e1c655426f1954d9865726f491265bcd):
//!   probes at once, then every period; liveness starts as success; its result changes only
//!   after the threshold of identical results in a row; on a liveness failure the container
//!   is restarted and the worker holds until the new one. The thresholds are the runner's
//!   kubelet emulator's [`Worker`] (one worker logic for both).
//! - The HTTP probe (`pkg/probe/http/http.go`): a status in 200..400 succeeds; anything else,
//!   a timeout or a refused connection included, is an ordinary failure.

use super::probe::{self, ProbeLog};
use crate::kubelet::{ProbeSpec, Worker};
use std::future::Future;
use std::time::Duration;
use tokio::time::{Instant, MissedTickBehavior};

/// The API's probe defaults (unscaled).
pub(super) const DEFAULTS: ProbeSpec = ProbeSpec {
    period: Duration::from_secs(10),
    timeout: Duration::from_secs(1),
    failure_threshold: 3,
    success_threshold: 1,
};

/// Runs a liveness worker with `spec` until its result turns to failure; the time of that
/// decision (the kill). `probe` makes one probe and says whether it succeeded.
pub(super) async fn liveness<F, Fut>(spec: ProbeSpec, mut probe: F) -> Instant
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let mut worker = Worker::new(spec, true);
    let mut tick = tokio::time::interval(spec.period);
    // Go's ticker keeps its phase and holds one missed tick: a probe longer than the period
    // is followed by the next at once, then on the old phase.
    tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        if worker.record(probe().await) == Some(false) {
            return Instant::now();
        }
    }
}

/// A liveness probe of `url` with `spec`, each probe recorded in `log` as `what`.
pub(super) async fn http_liveness(
    spec: ProbeSpec,
    url: String,
    what: &'static str,
    log: ProbeLog,
) -> Instant {
    let client = probe::client();
    liveness(spec, || {
        let (client, url, log) = (&client, &url, &log);
        async move {
            let a = probe::get(client, url, spec.timeout, false).await;
            let ok = a.kubelet_ok();
            log.push(what, if ok { "ok" } else { "failed" }, a.error(), a.latency);
            ok
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// Runs a liveness worker (paused time) on scripted results; when it decided, from the
    /// start, and how many probes it made. Past the script every probe succeeds.
    async fn decide(spec: ProbeSpec, script: &[bool]) -> (Duration, usize) {
        let calls = Arc::new(Mutex::new(0usize));
        let start = Instant::now();
        let c = calls.clone();
        let script = script.to_vec();
        let at = tokio::time::timeout(spec.period * 100, async move {
            liveness(spec, move || {
                let c = c.clone();
                let script = script.clone();
                async move {
                    let mut n = c.lock().unwrap();
                    *n += 1;
                    script.get(*n - 1).copied().unwrap_or(true)
                }
            })
            .await
        })
        .await;
        let n = *calls.lock().unwrap();
        (at.map_or(Duration::MAX, |at| at - start), n)
    }

    // The kubelet kills on the third failure in a row, not the second; a success between
    // starts the count again; the first probe is at once, the others a period apart.
    #[tokio::test(start_paused = true)]
    async fn liveness_kills_on_the_third_failure_in_a_row_not_the_second() {
        let p = DEFAULTS.period;
        let (at, n) = decide(DEFAULTS, &[false, false, true, false, false, false]).await;
        assert_eq!(n, 6);
        assert_eq!(at, p * 5, "the sixth probe, five periods after the first");
        let (at, _) = decide(DEFAULTS, &[false, false, true, false, false, true]).await;
        assert_eq!(at, Duration::MAX, "two failures in a row never kill");
        let (at, n) = decide(DEFAULTS, &[false, false, false]).await;
        assert_eq!((at, n), (p * 2, 3));
    }

    // A probe longer than the period (SGLang's check behind a 30 s timeout) is followed by
    // the next at once, as Go's ticker does, not a whole period later.
    #[tokio::test(start_paused = true)]
    async fn a_probe_longer_than_the_period_is_followed_at_once() {
        let spec = ProbeSpec {
            timeout: Duration::from_secs(30),
            ..DEFAULTS
        };
        let start = Instant::now();
        let at = liveness(spec, || async {
            tokio::time::sleep(Duration::from_secs(25)).await;
            false
        })
        .await;
        // Probes end at 25, 50 and 75 s: each starts as the last ends.
        assert_eq!(at - start, Duration::from_secs(75));
    }
}

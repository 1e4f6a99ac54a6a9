//! A Node Manager emulator with the reference's heartbeat rules (virtual-inference-reference
//! §5): poll `GET /status` every second with a 5 s timeout and `Connection: close`; anything
//! but a JSON object with a known `status` is `abnormal`; inside the grace period a detected
//! `abnormal` keeps the old status; every heartbeat (3 s) counts consecutive heartbeats with
//! an abnormal endpoint, resets on none, and at 5 decides to kill. Every interval scales with
//! `time_scale` so tests fit in seconds.

use serde::Serialize;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// An endpoint status as Node Manager parses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NmStatus {
    Initial,
    Normal,
    Abnormal,
    Paused,
    Wait2start,
}

impl NmStatus {
    fn parse(body: &[u8]) -> NmStatus {
        let v: serde_json::Value = match serde_json::from_slice(body) {
            Ok(v) => v,
            Err(_) => return NmStatus::Abnormal,
        };
        match v.get("status").and_then(|s| s.as_str()) {
            Some("initial") => NmStatus::Initial,
            Some("normal") => NmStatus::Normal,
            Some("abnormal") => NmStatus::Abnormal,
            Some("paused") => NmStatus::Paused,
            Some("wait2start") => NmStatus::Wait2start,
            _ => NmStatus::Abnormal,
        }
    }
}

/// Settings; the defaults are the reference's, `time_scale` multiplies every interval.
#[derive(Debug, Clone)]
pub struct NmOptions {
    /// `/status` URLs of the endpoints.
    pub status_urls: Vec<String>,
    pub poll_interval: Duration,
    pub poll_timeout: Duration,
    pub heartbeat_interval: Duration,
    /// Consecutive abnormal heartbeats that trigger the kill.
    pub threshold: u32,
    pub grace_period: Duration,
}

impl NmOptions {
    /// The reference's constants, scaled.
    pub fn reference(status_urls: Vec<String>, time_scale: f64) -> NmOptions {
        let s = |secs: f64| Duration::from_secs_f64(secs * time_scale);
        NmOptions {
            status_urls,
            poll_interval: s(1.0),
            poll_timeout: s(5.0),
            heartbeat_interval: s(3.0),
            threshold: 5,
            grace_period: s(120.0),
        }
    }
}

/// One poll as Node Manager saw it.
#[derive(Debug, Clone, Serialize)]
pub struct Poll {
    /// Milliseconds since the emulator started.
    pub at_ms: u64,
    pub endpoint: usize,
    pub detected: NmStatus,
    /// Status kept after the grace-period rule.
    pub kept: NmStatus,
    /// The poll failed (timeout, refused, non-2xx): detected as abnormal.
    pub error: Option<String>,
    pub latency_ms: f64,
}

/// What happened during a run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct NmReport {
    pub polls: Vec<Poll>,
    /// Milliseconds since start when the kill decision was taken.
    pub killed_at_ms: Option<u64>,
    pub max_consecutive_abnormal: u32,
    pub heartbeats: u32,
}

impl NmReport {
    /// Polls that timed out or failed.
    pub fn failed_polls(&self) -> usize {
        self.polls.iter().filter(|p| p.error.is_some()).count()
    }
}

/// Runs until `cancel` or the kill decision; calls `on_kill` once when it decides to kill.
pub async fn run(
    opts: NmOptions,
    cancel: CancellationToken,
    on_kill: impl FnOnce() + Send,
) -> NmReport {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("plain HTTP client builds");
    let nm = Nm {
        start: Instant::now(),
        statuses: Mutex::new(vec![NmStatus::Initial; opts.status_urls.len()]),
        report: Mutex::new(NmReport::default()),
        opts,
    };
    let poller = nm.poll_loop(&client, &cancel);
    tokio::pin!(poller);
    tokio::select! {
        _ = &mut poller => {}
        _ = nm.heartbeat_loop(&cancel) => {
            if nm.report().killed_at_ms.is_some() {
                on_kill();
            }
        }
    }
    nm.report().clone()
}

/// The emulator's state, shared by its poll loop and its heartbeat loop.
struct Nm {
    opts: NmOptions,
    start: Instant,
    /// The status kept for each endpoint.
    statuses: Mutex<Vec<NmStatus>>,
    report: Mutex<NmReport>,
}

impl Nm {
    fn report(&self) -> std::sync::MutexGuard<'_, NmReport> {
        self.report.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn elapsed_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// Polls every endpoint once a poll interval until `cancel`.
    async fn poll_loop(&self, client: &reqwest::Client, cancel: &CancellationToken) {
        loop {
            for (i, url) in self.opts.status_urls.iter().enumerate() {
                let t0 = Instant::now();
                let (detected, error) = poll(client, url, self.opts.poll_timeout).await;
                let in_grace = self.start.elapsed() < self.opts.grace_period;
                let kept = {
                    let mut st = self.statuses.lock().unwrap_or_else(|p| p.into_inner());
                    st[i] = kept_status(st[i], detected, in_grace);
                    st[i]
                };
                self.report().polls.push(Poll {
                    at_ms: self.elapsed_ms(),
                    endpoint: i,
                    detected,
                    kept,
                    error,
                    latency_ms: t0.elapsed().as_secs_f64() * 1e3,
                });
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(self.opts.poll_interval) => {}
            }
        }
    }

    /// Counts the heartbeats with an abnormal endpoint until `cancel` or the kill decision
    /// (then in the report).
    async fn heartbeat_loop(&self, cancel: &CancellationToken) {
        let mut consecutive = 0u32;
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(self.opts.heartbeat_interval) => {}
            }
            let any_abnormal = self
                .statuses
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(&NmStatus::Abnormal);
            consecutive = if any_abnormal { consecutive + 1 } else { 0 };
            let mut r = self.report();
            r.heartbeats += 1;
            r.max_consecutive_abnormal = r.max_consecutive_abnormal.max(consecutive);
            if consecutive >= self.opts.threshold {
                r.killed_at_ms = Some(self.elapsed_ms());
                return;
            }
        }
    }
}

/// One `GET /status`: the status detected, and why the poll failed (then abnormal).
async fn poll(
    client: &reqwest::Client,
    url: &str,
    timeout: Duration,
) -> (NmStatus, Option<String>) {
    let res = tokio::time::timeout(timeout, async {
        let r = client
            .get(url)
            .header("Connection", "close")
            .header("Accept", "application/json")
            .send()
            .await
            .map_err(|e| e.to_string())?;
        if !r.status().is_success() {
            return Err(format!("HTTP {}", r.status()));
        }
        r.bytes().await.map_err(|e| e.to_string())
    })
    .await;
    match res {
        Err(_) => (NmStatus::Abnormal, Some("timeout".to_owned())),
        Ok(Err(e)) => (NmStatus::Abnormal, Some(e)),
        Ok(Ok(body)) => (NmStatus::parse(&body), None),
    }
}

/// The status Node Manager keeps after a poll: inside the grace period a detected
/// `abnormal` keeps the old status, and a `paused` endpoint stays paused.
fn kept_status(old: NmStatus, detected: NmStatus, in_grace: bool) -> NmStatus {
    if (in_grace && detected == NmStatus::Abnormal) || old == NmStatus::Paused {
        old
    } else {
        detected
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU8, Ordering};

    /// Serves `/status` with whatever `status` holds: 0 normal, 1 abnormal.
    async fn endpoint(status: Arc<AtomicU8>) -> String {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/status", l.local_addr().unwrap());
        let app = axum::Router::new().route(
            "/status",
            axum::routing::get(move || {
                let s = status.clone();
                async move {
                    if s.load(Ordering::Relaxed) == 1 {
                        r#"{"status":"abnormal"}"#
                    } else {
                        r#"{"status":"normal"}"#
                    }
                }
            }),
        );
        tokio::spawn(async move { axum::serve(l, app).await });
        url
    }

    fn fast(urls: Vec<String>) -> NmOptions {
        let mut o = NmOptions::reference(urls, 0.02);
        o.grace_period = Duration::ZERO;
        o
    }

    // test_heartbeat_manager.py: 5 consecutive abnormal heartbeats → the flag, exactly at 5.
    #[tokio::test]
    async fn kill_after_exactly_five_abnormal_heartbeats() {
        let url = endpoint(Arc::new(AtomicU8::new(1))).await;
        let killed = Arc::new(AtomicU8::new(0));
        let k = killed.clone();
        let r = run(fast(vec![url]), CancellationToken::new(), move || {
            k.store(1, Ordering::Relaxed)
        })
        .await;
        assert_eq!(killed.load(Ordering::Relaxed), 1);
        assert!(r.killed_at_ms.is_some());
        assert_eq!(r.max_consecutive_abnormal, 5);
        assert!(r.heartbeats == 5 || r.heartbeats == 6, "{}", r.heartbeats);
    }

    // Inside the grace period a detected abnormal keeps the old status (initial here), so no
    // heartbeat counts; after it, they do.
    #[tokio::test]
    async fn grace_period_keeps_the_old_status() {
        let url = endpoint(Arc::new(AtomicU8::new(1))).await;
        let mut o = fast(vec![url]);
        o.grace_period = Duration::from_millis(300);
        let r = run(o, CancellationToken::new(), || {}).await;
        let early: Vec<&Poll> = r.polls.iter().filter(|p| p.at_ms < 250).collect();
        assert!(!early.is_empty());
        assert!(
            early
                .iter()
                .all(|p| p.detected == NmStatus::Abnormal && p.kept == NmStatus::Initial)
        );
        assert!(
            r.polls
                .iter()
                .any(|p| p.at_ms > 350 && p.kept == NmStatus::Abnormal)
        );
        // Five heartbeats after the grace period ended: the kill comes later than without it.
        assert!(
            r.killed_at_ms.unwrap() >= 300 + 4 * 60,
            "{:?}",
            r.killed_at_ms
        );
    }

    // Any one abnormal endpoint counts; a normal heartbeat resets the count.
    #[tokio::test]
    async fn one_abnormal_endpoint_counts_and_normal_resets() {
        let a = Arc::new(AtomicU8::new(0));
        let b = Arc::new(AtomicU8::new(1));
        let urls = vec![endpoint(a.clone()).await, endpoint(b.clone()).await];
        let cancel = CancellationToken::new();
        let stop = cancel.clone();
        let flip = b.clone();
        tokio::spawn(async move {
            // Abnormal for about 3 heartbeats (60 ms each), then normal, then stop.
            tokio::time::sleep(Duration::from_millis(190)).await;
            flip.store(0, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(400)).await;
            stop.cancel();
        });
        let r = run(fast(urls), cancel, || panic!("must not kill")).await;
        assert_eq!(r.killed_at_ms, None);
        assert!(
            (1..5).contains(&r.max_consecutive_abnormal),
            "{}",
            r.max_consecutive_abnormal
        );
    }

    #[test]
    fn grace_keeps_the_old_status_on_abnormal_and_paused_stays_paused() {
        use NmStatus::{Abnormal, Initial, Normal, Paused};
        // (old, detected, in grace, kept)
        let rows = [
            (Initial, Abnormal, true, Initial),
            (Initial, Abnormal, false, Abnormal),
            (Initial, Normal, true, Normal),
            (Normal, Abnormal, true, Normal),
            (Abnormal, Normal, false, Normal),
            (Paused, Normal, false, Paused),
            (Paused, Abnormal, false, Paused),
        ];
        for (old, detected, in_grace, kept) in rows {
            assert_eq!(
                kept_status(old, detected, in_grace),
                kept,
                "{old:?} {detected:?} {in_grace}"
            );
        }
    }

    #[test]
    fn parsing_is_strict() {
        assert_eq!(NmStatus::parse(br#"{"status":"normal"}"#), NmStatus::Normal);
        assert_eq!(
            NmStatus::parse(br#"{"status":"initial"}"#),
            NmStatus::Initial
        );
        assert_eq!(
            NmStatus::parse(br#"{"status":"weird"}"#),
            NmStatus::Abnormal
        );
        assert_eq!(NmStatus::parse(br#"["normal"]"#), NmStatus::Abnormal);
        assert_eq!(NmStatus::parse(b"normal"), NmStatus::Abnormal);
    }
}

//! The one HTTP call every peer makes: a GET (or a POST) with a timeout, its answer sorted
//! the way the peers' sources sort it (a status, a timeout, a refused connection, another
//! error), and the record of it that a kill quotes as evidence.

use serde::Serialize;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// Why a call got no status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Failure {
    /// No answer within the timeout (the kubelet: a failure; the heartbeat: unknown).
    Timeout,
    /// The connection was refused (the heartbeat: dead at once).
    Refused,
    /// Anything else (a reset, a broken body).
    Other(String),
}

impl Failure {
    /// The words in a probe record.
    pub(super) fn text(&self) -> String {
        match self {
            Failure::Timeout => "timeout".to_owned(),
            Failure::Refused => "connection refused".to_owned(),
            Failure::Other(e) => e.clone(),
        }
    }
}

/// What one call got: a status and its body, or a failure; and how long it took.
#[derive(Debug, Clone)]
pub(super) struct Answer {
    pub(super) status: Result<u16, Failure>,
    pub(super) body: String,
    pub(super) latency: Duration,
}

impl Answer {
    /// An HTTP probe's success as the kubelet counts it (`pkg/probe/http/http.go`): a status
    /// in 200..400.
    pub(super) fn kubelet_ok(&self) -> bool {
        matches!(self.status, Ok(s) if (200..400).contains(&s))
    }

    /// The failure's words, or the status when it is not a kubelet success.
    pub(super) fn error(&self) -> Option<String> {
        match &self.status {
            Err(f) => Some(f.text()),
            Ok(s) if !(200..400).contains(s) => Some(format!("HTTP {s}")),
            Ok(_) => None,
        }
    }
}

/// A plain HTTP client with no proxy and no pooled connection (each probe connects afresh,
/// as the kubelet's does).
pub(super) fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap_or_default()
}

/// `GET url` within `timeout`, its body read too (`body`: keep it).
pub(super) async fn get(
    client: &reqwest::Client,
    url: &str,
    timeout: Duration,
    body: bool,
) -> Answer {
    let started = Instant::now();
    let call = async {
        let r = client.get(url).send().await.map_err(sort)?;
        let status = r.status().as_u16();
        let text = if body {
            r.text().await.map_err(sort)?
        } else {
            String::new()
        };
        Ok::<_, Failure>((status, text))
    };
    let result = tokio::time::timeout(timeout, call)
        .await
        .unwrap_or(Err(Failure::Timeout));
    let latency = started.elapsed();
    match result {
        Ok((status, body)) => Answer {
            status: Ok(status),
            body,
            latency,
        },
        Err(f) => Answer {
            status: Err(f),
            body: String::new(),
            latency,
        },
    }
}

/// A reqwest error as a [`Failure`].
pub(super) fn sort(e: reqwest::Error) -> Failure {
    if e.is_timeout() {
        Failure::Timeout
    } else if e.is_connect() {
        Failure::Refused
    } else {
        Failure::Other(e.to_string())
    }
}

/// One call of a peer, as the report and the kill's evidence show it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ProbeRecord {
    /// Milliseconds since the peer started.
    pub(crate) at_ms: u64,
    /// What was called: `/health`, `canary`, `/live`, `/metrics` …
    pub(crate) what: &'static str,
    /// What the peer made of it: `ok`, `failed`, `alive`, `hung 1/3`, `dead` …
    pub(crate) result: String,
    pub(crate) error: Option<String>,
    pub(crate) latency_ms: f64,
}

/// Every call of a peer, shared by its tasks.
#[derive(Debug, Clone)]
pub(super) struct ProbeLog {
    started: Instant,
    records: Arc<Mutex<Vec<ProbeRecord>>>,
}

impl ProbeLog {
    /// A log whose times count from now.
    pub(super) fn new() -> ProbeLog {
        ProbeLog {
            started: Instant::now(),
            records: Arc::default(),
        }
    }

    /// Milliseconds since the log started, at `at`.
    pub(super) fn ms(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.started).as_millis() as u64
    }

    /// Records one call that ended now.
    pub(super) fn push(
        &self,
        what: &'static str,
        result: impl Into<String>,
        error: Option<String>,
        latency: Duration,
    ) {
        let record = ProbeRecord {
            at_ms: self.ms(Instant::now()),
            what,
            result: result.into(),
            error,
            latency_ms: latency.as_secs_f64() * 1000.0,
        };
        self.records
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(record);
    }

    /// The calls so far.
    pub(super) fn records(&self) -> Vec<ProbeRecord> {
        self.records
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

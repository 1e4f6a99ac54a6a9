//! The fleet brake's API calls: read and write its ConfigMap with the resourceVersion
//! (optimistic concurrency: a write on a stale version is refused with 409 and retried on a
//! fresh read, with jittered, bounded back-off), and count the fleet's engines as pods.
//!
//! Counting: without a label selector, one `limit=1` list of the namespace's pods, whose
//! `metadata.remainingItemCount` says the rest (the API server leaves that count out when a
//! label selector is set); with one, pages of [`PAGE`] pods, counted. Either is made only by
//! the agent that writes when the count in the state is older than `count_every`, so the
//! fleet counts once per `count_every`, not once per agent.

use super::config::BrakeConfig;
use super::state::{Decision, Fleet};
use crate::integrations::kubernetes::api::{ApiError, KubeClient};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

/// Pods per page when a label selector makes the count page through the fleet.
pub(crate) const PAGE: u32 = 500;
/// Most bytes read of the ConfigMap (a ConfigMap holds at most 1 MiB).
const CM_LIMIT: usize = 2 << 20;
/// Most bytes read of one page of pods (500 large pods).
const PAGE_LIMIT: usize = 16 << 20;

/// A failed consult.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum BrakeError {
    #[error("{0}")]
    Api(#[from] ApiError),
    #[error("every write lost to another agent's ({0} tries): the state is too busy")]
    Conflicts(u32),
    #[error("the ConfigMap is not a brake's state: {0}")]
    Unreadable(String),
}

/// What the calls of one consult cost (the simulation adds them up).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Tally {
    pub requests: u64,
    /// Writes refused with 409 (another agent wrote first).
    pub conflicts: u64,
}

/// A consult's answer: the decision and the state as written.
#[derive(Debug, Clone)]
pub(crate) struct Consulted {
    pub decision: Decision,
    pub fleet: Fleet,
}

/// Where the state lives: the ConfigMap's namespace and name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Home {
    pub namespace: String,
    pub name: String,
}

impl Home {
    fn path(&self) -> String {
        format!(
            "/api/v1/namespaces/{}/configmaps/{}",
            self.namespace, self.name
        )
    }
}

fn json_request(method: http::Method, uri: String, body: Vec<u8>) -> http::Request<Vec<u8>> {
    http::Request::builder()
        .method(method)
        .uri(uri)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(body)
        .unwrap_or_default()
}

/// Reads the state: `None` when the ConfigMap does not exist yet; else the state, its
/// resourceVersion, and what of it did not read.
pub(crate) async fn read(
    c: &KubeClient,
    home: &Home,
    t: &mut Tally,
) -> Result<Option<(Fleet, String, Option<String>)>, BrakeError> {
    t.requests += 1;
    let req = json_request(http::Method::GET, home.path(), Vec::new());
    let body = match c.call(Ok(req), CM_LIMIT).await {
        Ok(b) => b,
        Err(e) if e.code() == Some(404) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let cm: ConfigMap = serde_json::from_slice(&body)
        .map_err(|e| BrakeError::Unreadable(crate::logging::clip(&e.to_string())))?;
    let rv = cm.metadata.resource_version.clone().unwrap_or_default();
    let (fleet, bad) = Fleet::of_data(&cm.data.unwrap_or_default());
    Ok(Some((fleet, rv, bad)))
}

/// Writes the state: a create when `rv` is `None`, else a replace on `rv`. A 409 (a create
/// beaten by another, a replace on a stale version) is `Ok(false)`.
async fn write(
    c: &KubeClient,
    home: &Home,
    rv: Option<&str>,
    f: &Fleet,
    t: &mut Tally,
) -> Result<bool, BrakeError> {
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(home.name.clone()),
            namespace: Some(home.namespace.clone()),
            resource_version: rv.map(str::to_owned),
            labels: Some(
                [(
                    "app.kubernetes.io/name".to_owned(),
                    "npu-health-agent".to_owned(),
                )]
                .into(),
            ),
            ..ObjectMeta::default()
        },
        data: Some(f.to_data()),
        ..ConfigMap::default()
    };
    let body = serde_json::to_vec(&cm).map_err(|e| BrakeError::Unreadable(e.to_string()))?;
    let req = match rv {
        None => json_request(
            http::Method::POST,
            format!("/api/v1/namespaces/{}/configmaps", home.namespace),
            body,
        ),
        Some(_) => json_request(http::Method::PUT, home.path(), body),
    };
    t.requests += 1;
    match c.call(Ok(req), CM_LIMIT).await {
        Ok(_) => Ok(true),
        Err(e) if e.code() == Some(409) => {
            t.conflicts += 1;
            Ok(false)
        }
        Err(e) => Err(e.into()),
    }
}

/// Counts the fleet's engines: its pods.
pub(crate) async fn count(
    c: &KubeClient,
    cfg: &BrakeConfig,
    t: &mut Tally,
) -> Result<u64, BrakeError> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Meta {
        remaining_item_count: Option<u64>,
        #[serde(rename = "continue")]
        next: Option<String>,
    }
    #[derive(serde::Deserialize)]
    struct Page {
        metadata: Meta,
        #[serde(default)]
        items: Vec<serde::de::IgnoredAny>,
    }
    let base = match &cfg.fleet.namespace {
        Some(ns) => format!("/api/v1/namespaces/{ns}/pods"),
        None => "/api/v1/pods".to_owned(),
    };
    let selector = cfg.fleet.selector.as_deref();
    let mut total = 0u64;
    let mut next: Option<String> = None;
    loop {
        let mut q = format!("limit={}", if selector.is_some() { PAGE } else { 1 });
        if let Some(s) = selector {
            q += &format!("&labelSelector={}", encode(s));
        }
        if let Some(n) = &next {
            q += &format!("&continue={}", encode(n));
        }
        t.requests += 1;
        let req = json_request(http::Method::GET, format!("{base}?{q}"), Vec::new());
        let body = c.call(Ok(req), PAGE_LIMIT).await?;
        let page: Page = serde_json::from_slice(&body).map_err(|e| {
            BrakeError::Unreadable(format!(
                "the pod list: {}",
                crate::logging::clip(&e.to_string())
            ))
        })?;
        total += page.items.len() as u64;
        if selector.is_none() {
            return Ok(total + page.metadata.remaining_item_count.unwrap_or(0));
        }
        match page.metadata.next.filter(|n| !n.is_empty()) {
            Some(n) => next = Some(n),
            None => return Ok(total),
        }
    }
}

/// Percent-encodes a query value.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A wait in `[0, base × 2^attempt)` (full jitter), from std's randomly keyed hasher: no
/// random-number crate for one jitter.
pub(crate) fn jitter(base: Duration, attempt: u32) -> Duration {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(attempt);
    let cap = base.saturating_mul(1 << attempt.min(16));
    let frac = (h.finish() >> 11) as f64 / (1u64 << 53) as f64;
    cap.mul_f64(frac)
}

/// Records `engine`'s new agent-rule verdict at `now` (Unix seconds) in the shared state and
/// decides it: read, count the fleet when its count is stale, decide, write on the version
/// read; a conflict reads again, after a jittered wait, at most `retries` times.
pub(crate) async fn consult(
    c: &KubeClient,
    cfg: &BrakeConfig,
    home: &Home,
    engine: &str,
    now: u64,
    t: &mut Tally,
) -> Result<Consulted, BrakeError> {
    let window = cfg.window.as_secs();
    for attempt in 0..=cfg.retries {
        if attempt > 0 {
            tokio::time::sleep(jitter(cfg.retry_backoff, attempt - 1)).await;
        }
        let (mut fleet, rv) = match read(c, home, t).await? {
            Some((f, rv, _)) => (f, Some(rv)),
            None => (Fleet::default(), None),
        };
        if fleet.engines == 0 || now.saturating_sub(fleet.counted) >= cfg.count_every.as_secs() {
            match count(c, cfg, t).await {
                Ok(n) => (fleet.engines, fleet.counted) = (n, now),
                // A stale count beats none: keep it, and try again at the next write.
                Err(e) if fleet.engines > 0 => {
                    tracing::warn!(
                        "the fleet brake could not count the fleet's engines ({e}); it keeps the count of {}",
                        fleet.engines
                    );
                }
                Err(e) => return Err(e),
            }
        }
        let decision = fleet.decide(engine, now, window, cfg.max_fraction);
        if write(c, home, rv.as_deref(), &fleet, t).await? {
            return Ok(Consulted { decision, fleet });
        }
    }
    Err(BrakeError::Conflicts(cfg.retries + 1))
}

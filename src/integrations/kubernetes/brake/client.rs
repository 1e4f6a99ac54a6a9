//! The fleet brake's API calls on its ConfigMap, none of which two agents can lose to each
//! other:
//! - a trip is a JSON merge patch of the engine's own key (no resourceVersion): the API server
//!   applies it to the object as stored, retrying inside on a concurrent write (the etcd3
//!   store's `GuaranteedUpdate`, kubernetes/kubernetes
//!   `staging/src/k8s.io/apiserver/pkg/storage/etcd3/store.go`), and answers the object after
//!   it: every trip applied before, and this one;
//! - the right to count the fleet is a JSON patch whose `test` on `counted` fails with 422 for
//!   every agent but the first (`staging/src/k8s.io/apiserver/pkg/endpoints/handlers/patch.go`:
//!   a JSON patch that does not apply is `422 Unprocessable Entity`).
//!
//! A 409 can still come (releases that bounded the server's own retries at 5,
//! `MaxRetryWhenPatchConflicts`): retried with jittered, bounded back-off.
//!
//! Counting: without a label selector, one `limit=1` list of the namespace's pods, whose
//! `metadata.remainingItemCount` says the rest (the API server leaves that count out when a
//! label selector is set); with one, pages of [`PAGE`] pods, counted. Either is made only by
//! the agent that claimed the count when it was older than `count_every`, so the fleet counts
//! once per `count_every`, not once per agent.

use super::config::BrakeConfig;
use super::state::{self, Decision, Fleet, Trip};
use crate::integrations::kubernetes::api::{ApiError, KubeClient};
use serde_json::{Value, json};
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
    #[error("every patch refused for a conflict ({0} tries): the API server is too busy")]
    Conflicts(u32),
    #[error("the ConfigMap is not a brake's state: {0}")]
    Unreadable(String),
}

/// What the calls of one consult cost (the simulation adds them up).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Tally {
    pub requests: u64,
    /// Patches refused with 409.
    pub conflicts: u64,
    /// Bytes of the answers read.
    pub bytes: u64,
}

/// A consult's answer: the decision and the state as last answered.
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

fn request(method: http::Method, uri: String, kind: &str, body: Vec<u8>) -> http::Request<Vec<u8>> {
    http::Request::builder()
        .method(method)
        .uri(uri)
        .header(http::header::CONTENT_TYPE, kind)
        .body(body)
        .unwrap_or_default()
}

const JSON: &str = "application/json";
const MERGE_PATCH: &str = "application/merge-patch+json";
const JSON_PATCH: &str = "application/json-patch+json";

/// The state of a ConfigMap's JSON.
fn fleet_of(body: &[u8]) -> Result<(Fleet, Option<String>), BrakeError> {
    #[derive(serde::Deserialize)]
    struct Cm {
        #[serde(default)]
        data: Option<std::collections::BTreeMap<String, String>>,
    }
    let cm: Cm = serde_json::from_slice(body)
        .map_err(|e| BrakeError::Unreadable(crate::logging::clip(&e.to_string())))?;
    Ok(Fleet::of_data(&cm.data.unwrap_or_default()))
}

/// Reads the state: `None` when the ConfigMap does not exist yet; else the state, and what of
/// it did not read.
pub(crate) async fn read(
    c: &KubeClient,
    home: &Home,
    t: &mut Tally,
) -> Result<Option<(Fleet, Option<String>)>, BrakeError> {
    t.requests += 1;
    let req = request(http::Method::GET, home.path(), JSON, Vec::new());
    match c.call(Ok(req), CM_LIMIT).await {
        Ok(b) => {
            t.bytes += b.len() as u64;
            fleet_of(&b).map(Some)
        }
        Err(e) if e.code() == Some(404) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Creates the ConfigMap, empty but for a `counted` of 0 (the count's claim tests it); one
/// that exists already (another agent's) is as good.
async fn create(c: &KubeClient, home: &Home, t: &mut Tally) -> Result<(), BrakeError> {
    let cm = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": home.name,
            "namespace": home.namespace,
            "labels": {"app.kubernetes.io/name": "npu-health-agent"},
        },
        "data": {"engines": "0", "counted": "0"},
    });
    t.requests += 1;
    let req = request(
        http::Method::POST,
        format!("/api/v1/namespaces/{}/configmaps", home.namespace),
        JSON,
        cm.to_string().into_bytes(),
    );
    match c.call(Ok(req), CM_LIMIT).await {
        Ok(_) => Ok(()),
        Err(e) if e.code() == Some(409) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// A JSON merge patch of `data` (a `null` removes a key): the state after it, or `None` when
/// the ConfigMap does not exist. A 409 is retried, jittered, at most `retries` times.
async fn merge(
    c: &KubeClient,
    cfg: &BrakeConfig,
    home: &Home,
    data: serde_json::Map<String, Value>,
    t: &mut Tally,
) -> Result<Option<Fleet>, BrakeError> {
    let body = json!({ "data": data }).to_string().into_bytes();
    for attempt in 0..=cfg.retries {
        if attempt > 0 {
            tokio::time::sleep(jitter(cfg.retry_backoff, attempt - 1)).await;
        }
        t.requests += 1;
        let req = request(http::Method::PATCH, home.path(), MERGE_PATCH, body.clone());
        match c.call(Ok(req), CM_LIMIT).await {
            Ok(b) => {
                t.bytes += b.len() as u64;
                let (f, bad) = fleet_of(&b)?;
                if let Some(bad) = bad {
                    tracing::warn!(
                        "the fleet brake's ConfigMap {}: {bad}; read as far as it goes",
                        home.name
                    );
                }
                return Ok(Some(f));
            }
            Err(e) if e.code() == Some(404) => return Ok(None),
            Err(e) if e.code() == Some(409) => t.conflicts += 1,
            Err(e) => return Err(e.into()),
        }
    }
    Err(BrakeError::Conflicts(cfg.retries + 1))
}

/// A JSON patch (`ops`): the state after it, or `None` when it does not apply (a `test`
/// failed: 422; or a conflict the server gave up on: 409).
async fn json_patch(
    c: &KubeClient,
    home: &Home,
    ops: Vec<Value>,
    t: &mut Tally,
) -> Result<Option<Fleet>, BrakeError> {
    t.requests += 1;
    let req = request(
        http::Method::PATCH,
        home.path(),
        JSON_PATCH,
        Value::Array(ops).to_string().into_bytes(),
    );
    match c.call(Ok(req), CM_LIMIT).await {
        Ok(b) => {
            t.bytes += b.len() as u64;
            Ok(Some(fleet_of(&b)?.0))
        }
        Err(e) if matches!(e.code(), Some(422 | 409)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

fn add(key: &str, value: String) -> Value {
    json!({"op": "add", "path": format!("/data/{key}"), "value": value})
}

/// Claims the fleet's count, counted at `was` (`None`: the key is missing), for `now`: `true`
/// for the one agent whose JSON patch's `test` held.
pub(crate) async fn claim(
    c: &KubeClient,
    home: &Home,
    was: Option<u64>,
    now: u64,
    t: &mut Tally,
) -> Result<bool, BrakeError> {
    let mut ops = Vec::new();
    if let Some(w) = was {
        ops.push(json!({"op": "test", "path": "/data/counted", "value": w.to_string()}));
    }
    ops.push(add("counted", now.to_string()));
    Ok(json_patch(c, home, ops, t).await?.is_some())
}

/// Writes `ops` with the removal of the trips of `f` that left the window, each on the
/// condition that it is still the trip seen (a `test` of its value: an engine that tripped
/// again since keeps its new trip). When one changed, `ops` alone.
pub(crate) async fn write_pruning(
    c: &KubeClient,
    home: &Home,
    f: &Fleet,
    ops: Vec<Value>,
    now: u64,
    window: u64,
    t: &mut Tally,
) -> Result<Option<Fleet>, BrakeError> {
    let mut pruning = ops.clone();
    for k in f.expired(now, window) {
        let was = f.trips[&k].value();
        pruning.push(json!({"op": "test", "path": format!("/data/{k}"), "value": was}));
        pruning.push(json!({"op": "remove", "path": format!("/data/{k}")}));
    }
    if pruning.len() > ops.len()
        && let Some(f) = json_patch(c, home, pruning, t).await?
    {
        return Ok(Some(f));
    }
    json_patch(c, home, ops, t).await
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
        let req = request(http::Method::GET, format!("{base}?{q}"), JSON, Vec::new());
        let body = c.call(Ok(req), PAGE_LIMIT).await?;
        t.bytes += body.len() as u64;
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
/// decides it. `known` is the state as last seen (`None`: never seen; it is read first).
/// - Its trip in the window acted already (an agent restarted): it acts, no write.
/// - Else one merge patch adds its trip; the state answered holds every trip applied before:
///   it acts while they are within the allowed.
/// - The fleet's count older than `count_every`: the agent that claims it counts.
/// - A verdict that acts, or a new count, is written by a JSON patch, which also removes the
///   trips that left the window.
pub(crate) async fn consult(
    c: &KubeClient,
    cfg: &BrakeConfig,
    home: &Home,
    engine: &str,
    now: u64,
    known: Option<&Fleet>,
    t: &mut Tally,
) -> Result<Consulted, BrakeError> {
    let window = cfg.window.as_secs();
    let key = state::key(engine);
    let read_now;
    let known = match known {
        Some(k) => Some(k),
        None => {
            read_now = read(c, home, t).await?.map(|(f, _)| f);
            read_now.as_ref()
        }
    };
    if let Some(k) = known.filter(|k| k.acted(&key, now, window)) {
        return Ok(Consulted {
            decision: Decision::Act,
            fleet: k.clone(),
        });
    }
    let mut trip = serde_json::Map::new();
    trip.insert(
        key.clone(),
        Trip {
            at: now,
            acted: false,
        }
        .value()
        .into(),
    );
    let mut fleet = match merge(c, cfg, home, trip.clone(), t).await? {
        Some(f) => f,
        None => {
            create(c, home, t).await?;
            merge(c, cfg, home, trip, t).await?.ok_or_else(|| {
                BrakeError::Unreadable("the ConfigMap was deleted as it was created".to_owned())
            })?
        }
    };
    let counted = recount(c, cfg, home, &mut fleet, now, t).await?;
    let decision = fleet.decide(now, window, cfg.max_fraction);
    let mut after = Vec::new();
    if decision == Decision::Act {
        after.push(add(
            &key,
            Trip {
                at: now,
                acted: true,
            }
            .value(),
        ));
    }
    if let Some(n) = counted {
        after.push(add("engines", n.to_string()));
    }
    if !after.is_empty() {
        // The decision stands on the state the trip was applied to; a failure to write it
        // loses only what a restarted agent would know of it.
        match write_pruning(c, home, &fleet, after, now, window, t).await {
            Ok(Some(f)) => fleet = f,
            Ok(None) => tracing::warn!("the fleet brake's decision was not written: a conflict"),
            Err(e) => tracing::warn!("the fleet brake could not record its decision: {e}"),
        }
    }
    Ok(Consulted { decision, fleet })
}

/// Counts the fleet into `fleet` when its count is older than `count_every` and this agent
/// claims it (or when it was never counted): the new count, to be written, if taken.
async fn recount(
    c: &KubeClient,
    cfg: &BrakeConfig,
    home: &Home,
    fleet: &mut Fleet,
    now: u64,
    t: &mut Tally,
) -> Result<Option<u64>, BrakeError> {
    let stale = now.saturating_sub(fleet.counted.unwrap_or(0)) >= cfg.count_every.as_secs();
    let mut counted = None;
    let claimed = (fleet.engines == 0 || stale) && claim(c, home, fleet.counted, now, t).await?;
    if fleet.engines == 0 && !claimed {
        // Never counted, and another agent is counting: count too rather than act blind
        // (once in the state's life), without writing it.
        fleet.engines = count(c, cfg, t).await?;
    }
    if claimed {
        match count(c, cfg, t).await {
            Ok(n) => (fleet.engines, counted) = (n, Some(n)),
            // A stale count beats none: keep it; the claim is given back for the next one.
            Err(e) => {
                tracing::warn!(
                    "the fleet brake could not count the fleet's engines ({e}); it keeps the count of {}",
                    fleet.engines
                );
                let back = fleet.counted.unwrap_or(0).to_string();
                merge(
                    c,
                    cfg,
                    home,
                    [("counted".to_owned(), back.into())].into_iter().collect(),
                    t,
                )
                .await?;
                if fleet.engines == 0 {
                    return Err(e);
                }
            }
        }
    }
    Ok(counted)
}

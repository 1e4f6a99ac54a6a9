//! The stand-in's ConfigMaps with resourceVersion: the fleet brake's shared state and the
//! public faults' messages. GET, create (POST; 409 `AlreadyExists` when it exists), replace
//! (PUT; 409 `Conflict` when the body carries a resourceVersion that is not the stored one,
//! as the API server's optimistic concurrency answers; without one the update is
//! unconditional, as the API server allows for ConfigMaps; 422 when the data is over 1 MiB, a
//! ConfigMap's limit). A failure scripted for [`Route::ConfigMap`] answers first. Its own
//! counters; no request body is kept in the stand-in's `seen` (a simulation writes
//! gigabytes), but every accepted write of a ConfigMap labelled `mc-consumer-publicfault=true`
//! is kept in order, as ClusterD's informer (which selects that label) sees each one.

use super::{Failure, KubeApi, Route, TOKEN, status};
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use k8s_openapi::api::core::v1::ConfigMap;
use std::collections::BTreeMap;

/// A ConfigMap's most bytes of data.
const DATA_LIMIT: usize = 1 << 20;

/// What the ConfigMap routes served.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub gets: u64,
    pub creates: u64,
    pub replaces: u64,
    /// Writes refused with 409.
    pub conflicts: u64,
    /// Writes refused for over 1 MiB of data.
    pub too_large: u64,
}

/// ClusterD's label on the ConfigMaps it reads (`PubFaultCMLabelKey`).
const PUBLIC_FAULT_LABEL: &str = "mc-consumer-publicfault";

/// The stored ConfigMaps, by (namespace, name), with their resourceVersion.
#[derive(Default)]
pub struct Store {
    maps: BTreeMap<(String, String), ConfigMap>,
    last_rv: u64,
    counts: Counts,
    /// Every accepted write of a public-fault ConfigMap, in order, with its arrival.
    public_fault_writes: Vec<(std::time::Instant, ConfigMap)>,
}

impl Store {
    /// Stores `cm` (namespace `ns`) under a new resourceVersion; returns it as stored.
    fn put(&mut self, ns: String, mut cm: ConfigMap) -> ConfigMap {
        self.last_rv += 1;
        cm.metadata.namespace = Some(ns.clone());
        cm.metadata.resource_version = Some(self.last_rv.to_string());
        let labelled = cm
            .metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.get(PUBLIC_FAULT_LABEL).map(String::as_str) == Some("true"));
        if labelled {
            self.public_fault_writes
                .push((std::time::Instant::now(), cm.clone()));
        }
        let name = cm.metadata.name.clone().unwrap_or_default();
        self.maps.insert((ns, name), cm.clone());
        cm
    }
}

/// The routes, merged into the stand-in's router.
pub(super) fn routes() -> Router<KubeApi> {
    Router::new()
        .route("/api/v1/namespaces/{ns}/configmaps", post(create))
        .route(
            "/api/v1/namespaces/{ns}/configmaps/{name}",
            get(read).put(replace),
        )
}

impl KubeApi {
    /// A stored ConfigMap.
    pub fn config_map(&self, ns: &str, name: &str) -> Option<ConfigMap> {
        let i = self.0.lock().unwrap();
        i.brake.maps.get(&(ns.to_owned(), name.to_owned())).cloned()
    }

    /// What the ConfigMap routes served so far.
    pub fn config_map_counts(&self) -> Counts {
        self.0.lock().unwrap().brake.counts
    }

    /// Every public-fault ConfigMap write accepted so far, in order, with when it arrived.
    pub fn configmap_writes(&self) -> Vec<(std::time::Instant, ConfigMap)> {
        self.0.lock().unwrap().brake.public_fault_writes.clone()
    }
}

/// The request's refusal before any work: a wrong token, or a failure scripted for the
/// ConfigMap routes.
fn refused(api: &KubeApi, h: &HeaderMap) -> Option<Response> {
    if h.get("authorization").and_then(|v| v.to_str().ok()) != Some(&format!("Bearer {TOKEN}")) {
        return Some(status(401, "Unauthorized", "no or wrong bearer token"));
    }
    let scripted = api
        .0
        .lock()
        .unwrap()
        .fail
        .get_mut(&Route::ConfigMap)
        .and_then(std::collections::VecDeque::pop_front);
    match scripted {
        Some(Failure::Status(code, reason)) => {
            Some(status(code, reason, &format!("scripted {code} {reason}")))
        }
        Some(other) => Some(status(
            500,
            "InternalError",
            &format!("the ConfigMap routes script statuses only, not {other:?}"),
        )),
        None => None,
    }
}

async fn read(
    State(api): State<KubeApi>,
    Path((ns, name)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    if let Some(r) = refused(&api, &headers) {
        return r;
    }
    let mut i = api.0.lock().unwrap();
    i.brake.counts.gets += 1;
    match i.brake.maps.get(&(ns, name.clone())) {
        Some(cm) => axum::Json(cm.clone()).into_response(),
        None => status(404, "NotFound", &format!("configmaps \"{name}\" not found")),
    }
}

/// The body as a ConfigMap of this namespace and, for a replace, this name; its data within
/// the limit.
fn parsed(body: &Bytes, ns: &str, name: Option<&str>) -> Result<ConfigMap, Box<Response>> {
    let v: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| Box::new(status(400, "BadRequest", &format!("not JSON: {e}"))))?;
    if v["apiVersion"] != "v1" || v["kind"] != "ConfigMap" {
        return Err(Box::new(status(400, "BadRequest", "not a v1 ConfigMap")));
    }
    let cm: ConfigMap = serde_json::from_value(v)
        .map_err(|e| Box::new(status(400, "BadRequest", &format!("not a ConfigMap: {e}"))))?;
    let m = &cm.metadata;
    if m.name
        .as_deref()
        .is_some_and(|n| n.is_empty() || n.len() > 253)
    {
        return Err(Box::new(status(422, "Invalid", "metadata.name")));
    }
    if m.namespace.as_deref().is_some_and(|n| n != ns)
        || m.name.is_none()
        || name.is_some_and(|n| m.name.as_deref() != Some(n))
    {
        return Err(Box::new(status(
            400,
            "BadRequest",
            "the ConfigMap names another object",
        )));
    }
    let bytes: usize = cm
        .data
        .iter()
        .flatten()
        .map(|(k, v)| k.len() + v.len())
        .sum();
    if bytes > DATA_LIMIT {
        return Err(Box::new(status(
            422,
            "Invalid",
            &format!("data is {bytes} bytes, over 1 MiB"),
        )));
    }
    Ok(cm)
}

async fn create(
    State(api): State<KubeApi>,
    Path(ns): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Some(r) = refused(&api, &headers) {
        return r;
    }
    let cm = match parsed(&body, &ns, None) {
        Ok(cm) => cm,
        Err(r) => {
            api.0.lock().unwrap().brake.counts.too_large += 1;
            return *r;
        }
    };
    let name = cm.metadata.name.clone().unwrap_or_default();
    let mut i = api.0.lock().unwrap();
    let s = &mut i.brake;
    s.counts.creates += 1;
    if s.maps.contains_key(&(ns.clone(), name.clone())) {
        s.counts.conflicts += 1;
        return status(
            409,
            "AlreadyExists",
            &format!("configmaps \"{name}\" already exists"),
        );
    }
    let cm = s.put(ns, cm);
    (axum::http::StatusCode::CREATED, axum::Json(cm)).into_response()
}

async fn replace(
    State(api): State<KubeApi>,
    Path((ns, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Some(r) = refused(&api, &headers) {
        return r;
    }
    let cm = match parsed(&body, &ns, Some(&name)) {
        Ok(cm) => cm,
        Err(r) => {
            api.0.lock().unwrap().brake.counts.too_large += 1;
            return *r;
        }
    };
    let mut i = api.0.lock().unwrap();
    let s = &mut i.brake;
    s.counts.replaces += 1;
    let Some(stored) = s.maps.get(&(ns.clone(), name.clone())) else {
        return status(404, "NotFound", &format!("configmaps \"{name}\" not found"));
    };
    if cm
        .metadata
        .resource_version
        .as_ref()
        .is_some_and(|rv| Some(rv) != stored.metadata.resource_version.as_ref())
    {
        s.counts.conflicts += 1;
        return status(
            409,
            "Conflict",
            &format!(
                "Operation cannot be fulfilled on configmaps \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
            ),
        );
    }
    let cm = s.put(ns, cm);
    axum::Json(cm).into_response()
}

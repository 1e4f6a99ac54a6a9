//! The stand-in's ConfigMaps with resourceVersion: the fleet brake's shared state and the
//! public faults' messages. GET, create (POST; 409 `AlreadyExists` when it exists), replace
//! (PUT; 409 `Conflict` when the body carries a resourceVersion that is not the stored one,
//! as the API server's optimistic concurrency answers; without one the update is
//! unconditional, as the API server allows for ConfigMaps; 422 when the data is over 1 MiB, a
//! ConfigMap's limit), and patch (PATCH), applied to the object as stored, one at a time, as
//! the API server's `GuaranteedUpdate` does for a patch without a resourceVersion: a JSON
//! merge patch (RFC 7386, `application/merge-patch+json`), or a JSON patch (RFC 6902,
//! `application/json-patch+json`: `test`, `add`, `replace`, `remove`; one that does not apply
//! is 422, as `handlers/patch.go` answers). A failure scripted for [`Route::ConfigMap`]
//! answers first. Its own
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
    /// Patches applied (merge or JSON).
    pub patches: u64,
    /// JSON patches that did not apply (422).
    pub patch_refused: u64,
    /// Writes refused with 409.
    pub conflicts: u64,
    /// Writes refused for over 1 MiB of data.
    pub too_large: u64,
}

/// The bytes of a ConfigMap's data, as its 1 MiB limit counts them (keys and values).
pub fn data_bytes(cm: &ConfigMap) -> usize {
    cm.data
        .iter()
        .flatten()
        .map(|(k, v)| k.len() + v.len())
        .sum()
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
            get(read).put(replace).patch(patch),
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
    let bytes = data_bytes(&cm);
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

/// RFC 7386: `patch` merged into `target`.
fn merge_patch(target: &mut serde_json::Value, patch: &serde_json::Value) {
    use serde_json::Value;
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(serde_json::Map::new());
    }
    let t = target.as_object_mut().unwrap();
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

/// RFC 6902 on objects only (what a ConfigMap's `data` needs): `Err` names the operation that
/// does not apply.
fn json_patch(target: &mut serde_json::Value, ops: &serde_json::Value) -> Result<(), String> {
    let ops = ops.as_array().ok_or("a JSON patch is an array")?;
    for op in ops {
        let path = op["path"].as_str().ok_or("an operation without a path")?;
        let mut parts: Vec<String> = path
            .split('/')
            .skip(1)
            .map(|p| p.replace("~1", "/").replace("~0", "~"))
            .collect();
        let last = parts.pop().ok_or("the root cannot be patched here")?;
        let mut at = &mut *target;
        for p in &parts {
            at = at
                .get_mut(p)
                .ok_or_else(|| format!("doc is missing path: {path}"))?;
        }
        let parent = at
            .as_object_mut()
            .ok_or_else(|| format!("{path}: not an object"))?;
        match op["op"].as_str() {
            Some("test") if parent.get(&last) == Some(&op["value"]) => {}
            Some("test") => {
                return Err(format!(
                    "testing value {path} failed: is {}, expected {}",
                    parent.get(&last).unwrap_or(&serde_json::Value::Null),
                    op["value"]
                ));
            }
            Some("add") => {
                parent.insert(last, op["value"].clone());
            }
            Some("replace") if parent.contains_key(&last) => {
                parent.insert(last, op["value"].clone());
            }
            Some("remove") if parent.remove(&last).is_some() => {}
            other => return Err(format!("{other:?} does not apply to {path}")),
        }
    }
    Ok(())
}

async fn patch(
    State(api): State<KubeApi>,
    Path((ns, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Some(r) = refused(&api, &headers) {
        return r;
    }
    let kind = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let Ok(p) = serde_json::from_slice::<serde_json::Value>(&body) else {
        return status(400, "BadRequest", "the patch is not JSON");
    };
    let mut i = api.0.lock().unwrap();
    let s = &mut i.brake;
    let Some(stored) = s.maps.get(&(ns.clone(), name.clone())) else {
        return status(404, "NotFound", &format!("configmaps \"{name}\" not found"));
    };
    // A merge patch of `data` alone, applied in place (a simulation's patches, on an object of
    // half a megabyte); the same as the general path below.
    let data_only = p
        .as_object()
        .filter(|o| o.len() == 1)
        .and_then(|o| o.get("data")?.as_object());
    if kind == "application/merge-patch+json"
        && let Some(d) = data_only
        && d.values().all(|v| v.is_null() || v.is_string())
    {
        let mut cm = stored.clone();
        let data = cm.data.get_or_insert_with(Default::default);
        for (k, v) in d {
            match v.as_str() {
                Some(v) => data.insert(k.clone(), v.to_owned()),
                None => data.remove(k),
            };
        }
        return applied(s, ns, cm);
    }
    let mut doc = serde_json::to_value(stored).unwrap();
    match kind.as_str() {
        "application/merge-patch+json" => merge_patch(&mut doc, &p),
        "application/json-patch+json" => {
            if let Err(e) = json_patch(&mut doc, &p) {
                s.counts.patch_refused += 1;
                return status(422, "", &e);
            }
        }
        other => {
            return status(
                415,
                "UnsupportedMediaType",
                &format!(
                    "the stand-in patches ConfigMaps with a merge or JSON patch, not {other:?}"
                ),
            );
        }
    }
    match serde_json::from_value(doc) {
        Ok(cm) => applied(s, ns, cm),
        Err(e) => status(422, "Invalid", &format!("the patched object: {e}")),
    }
}

/// Stores a patched ConfigMap within the data limit.
fn applied(s: &mut Store, ns: String, cm: ConfigMap) -> Response {
    let bytes = data_bytes(&cm);
    if bytes > DATA_LIMIT {
        s.counts.too_large += 1;
        return status(
            422,
            "Invalid",
            &format!("data is {bytes} bytes, over 1 MiB"),
        );
    }
    s.counts.patches += 1;
    let cm = s.put(ns, cm);
    axum::Json(cm).into_response()
}

//! A stand-in Kubernetes API server for the tests: real HTTP on loopback, the real request
//! paths and verbs of the calls the agent makes, and bodies parsed with the `k8s-openapi`
//! types, so a malformed patch or Eviction is a 400 here and a failed test. It keeps a few
//! pods, applies condition patches (merged by type, as a strategic merge patch does) and
//! annotations to them, takes evictions, records every request, and answers from a script
//! of failures when one is queued for a route.
//!
//! It also takes events.k8s.io/v1 Events (create, and a PATCH of a series), validated as the
//! API server validates them (kubernetes `pkg/apis/core/validation/events.go`): a malformed
//! Event is a 422 here as there ([`validate_event`]); [`KubeApi::describe_events`] renders a
//! pod's Events as `kubectl describe pod` lists them.
//!
//! What it does not do: authentication beyond checking the bearer token, admission,
//! PodDisruptionBudgets (a 429 is scripted), watches. resourceVersion conflicts only on
//! ConfigMaps ([`kube_brake`]).

use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, patch, post};
use k8s_openapi::api::core::v1::{Container, ContainerPort, Pod, PodCondition, PodSpec, PodStatus};
use k8s_openapi::api::policy::v1::Eviction;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Status};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The token the stand-in requires (`Authorization: Bearer …`).
pub const TOKEN: &str = "stand-in-token-0123456789";

#[path = "kube_brake.rs"]
pub mod kube_brake;

/// The routes a failure can be scripted for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Route {
    List,
    Get,
    PatchStatus,
    Evict,
    PatchPod,
    /// `POST .../events` (events.k8s.io/v1).
    EventCreate,
    /// `PATCH .../events/{name}`.
    EventPatch,
    /// A ConfigMap's update (PUT) or create (POST).
    ConfigMap,
}

/// A scripted answer.
#[derive(Debug, Clone)]
pub enum Failure {
    /// An error Status with this HTTP code and reason.
    Status(u16, &'static str),
    /// 200 with a body that is not JSON.
    Garbage,
    /// Answers (normally) after this long.
    Slow(Duration),
    /// This HTTP code with a body of this many bytes, streamed in chunks without a
    /// Content-Length: a `Status` whose message is that long for an error code, a body that
    /// is not JSON for a 2xx.
    Huge(u16, usize),
}

/// One request as received.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub query: String,
    pub content_type: String,
    pub body: String,
}

#[derive(Default)]
struct Inner {
    pods: Vec<Pod>,
    fail: HashMap<Route, VecDeque<Failure>>,
    seen: Vec<Seen>,
    /// Events as stored (JSON, as the API server keeps them).
    events: Vec<serde_json::Value>,
    /// The ConfigMaps ([`kube_brake`]: the fleet brake's and the public faults').
    brake: kube_brake::Store,
}

/// The server's state, shared with the test.
#[derive(Clone, Default)]
pub struct KubeApi(Arc<Mutex<Inner>>);

/// A running stand-in; stops when dropped.
pub struct StandIn {
    pub api: KubeApi,
    pub url: String,
    _rt: tokio::runtime::Runtime,
}

/// A pod on `node` with the given container ports `(containerPort, hostPort)`.
pub fn pod(
    ns: &str,
    name: &str,
    node: &str,
    host_network: bool,
    ports: &[(u16, Option<u16>)],
) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            uid: Some(format!("uid-{ns}-{name}")),
            labels: Some(BTreeMap::from([("app".to_owned(), "vllm".to_owned())])),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.into()),
            host_network: Some(host_network),
            containers: vec![Container {
                name: "vllm".into(),
                ports: Some(
                    ports
                        .iter()
                        .map(|&(c, h)| ContainerPort {
                            container_port: i32::from(c),
                            host_port: h.map(i32::from),
                            ..ContainerPort::default()
                        })
                        .collect(),
                ),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        status: Some(PodStatus {
            phase: Some("Running".into()),
            pod_ip: Some("10.0.0.5".into()),
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: "True".into(),
                ..PodCondition::default()
            }]),
            ..PodStatus::default()
        }),
    }
}

impl StandIn {
    /// Starts on a free loopback port with `pods`.
    pub fn start(pods: Vec<Pod>) -> StandIn {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let api = KubeApi::default();
        api.0.lock().unwrap().pods = pods;
        let router = axum::Router::new()
            .route("/api/v1/pods", get(list))
            .route("/api/v1/namespaces/{ns}/pods", get(list_ns))
            .route(
                "/api/v1/namespaces/{ns}/pods/{name}",
                get(get_pod).patch(patch_pod),
            )
            .route(
                "/api/v1/namespaces/{ns}/pods/{name}/status",
                patch(patch_status),
            )
            .route("/api/v1/namespaces/{ns}/pods/{name}/eviction", post(evict))
            .merge(event_routes())
            .merge(kube_brake::routes())
            .fallback(unknown)
            .with_state(api.clone());
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().unwrap());
        rt.spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        StandIn { api, url, _rt: rt }
    }
}

impl KubeApi {
    /// Queues failures for a route, answered before anything else.
    pub fn fail(&self, route: Route, f: &[Failure]) {
        self.0
            .lock()
            .unwrap()
            .fail
            .entry(route)
            .or_default()
            .extend(f.iter().cloned());
    }

    /// Every request so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.0.lock().unwrap().seen.clone()
    }

    /// Requests of `method` whose path ends with `suffix`.
    pub fn seen_where(&self, method: &str, suffix: &str) -> Vec<Seen> {
        self.seen()
            .into_iter()
            .filter(|s| s.method == method && s.path.ends_with(suffix))
            .collect()
    }

    /// The pod as stored now.
    pub fn pod(&self, ns: &str, name: &str) -> Option<Pod> {
        self.0
            .lock()
            .unwrap()
            .pods
            .iter()
            .find(|p| is(p, ns, name))
            .cloned()
    }

    /// A condition of a stored pod.
    pub fn condition(&self, ns: &str, name: &str, type_: &str) -> Option<PodCondition> {
        self.pod(ns, name)?
            .status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == type_)
    }

    /// Replaces the pods.
    pub fn set_pods(&self, pods: Vec<Pod>) {
        self.0.lock().unwrap().pods = pods;
    }
}

fn is(p: &Pod, ns: &str, name: &str) -> bool {
    p.metadata.namespace.as_deref() == Some(ns) && p.metadata.name.as_deref() == Some(name)
}

fn status(code: u16, reason: &str, message: &str) -> Response {
    let s = Status {
        code: Some(i32::from(code)),
        reason: Some(reason.into()),
        message: Some(message.into()),
        status: Some(if code < 400 { "Success" } else { "Failure" }.into()),
        ..Status::default()
    };
    (
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        axum::Json(s),
    )
        .into_response()
}

/// Records the request, checks the token, and answers a queued failure if there is one.
async fn front(
    api: &KubeApi,
    route: Route,
    method: &Method,
    path: String,
    query: Option<String>,
    headers: &HeaderMap,
    body: &Bytes,
) -> Option<Response> {
    let fail = {
        let mut i = api.0.lock().unwrap();
        i.seen.push(Seen {
            method: method.to_string(),
            path,
            query: query.unwrap_or_default(),
            content_type: headers
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned(),
            body: String::from_utf8_lossy(body).into_owned(),
        });
        i.fail.get_mut(&route).and_then(VecDeque::pop_front)
    };
    let auth = headers.get("authorization").and_then(|v| v.to_str().ok());
    if auth != Some(&format!("Bearer {TOKEN}")) {
        return Some(status(401, "Unauthorized", "no or wrong bearer token"));
    }
    match fail {
        Some(Failure::Status(code, reason)) => {
            Some(status(code, reason, &format!("scripted {code} {reason}")))
        }
        Some(Failure::Garbage) => Some((StatusCode::OK, "<html>not json").into_response()),
        Some(Failure::Huge(code, bytes)) => Some(huge(code, bytes)),
        Some(Failure::Slow(d)) => {
            tokio::time::sleep(d).await;
            None
        }
        None => None,
    }
}

/// A streamed body of `bytes` bytes (see [`Failure::Huge`]).
fn huge(code: u16, bytes: usize) -> Response {
    const CHUNK: usize = 64 << 10;
    let (head, tail): (&'static str, &'static str) = if code >= 400 {
        (
            r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"InternalError","message":""#,
            r#""}"#,
        )
    } else {
        ("<html>", "</html>")
    };
    let fill = bytes.saturating_sub(head.len() + tail.len());
    let chunks = std::iter::once(Bytes::from_static(head.as_bytes()))
        .chain((0..fill / CHUNK).map(|_| Bytes::from(vec![b'x'; CHUNK])))
        .chain(std::iter::once(Bytes::from(vec![b'x'; fill % CHUNK])))
        .chain(std::iter::once(Bytes::from_static(tail.as_bytes())))
        .map(Ok::<_, std::convert::Infallible>);
    (
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        [("content-type", "application/json")],
        axum::body::Body::from_stream(futures_util::stream::iter(chunks)),
    )
        .into_response()
}

fn query_param(q: &Option<String>, key: &str) -> Option<String> {
    q.as_deref()?
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| percent_decode(v))
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16)
        {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether `p` matches a label selector of `k=v` terms (all the tests use).
fn labels_match(p: &Pod, selector: &str) -> bool {
    let labels = p.metadata.labels.clone().unwrap_or_default();
    selector.split(',').all(|term| match term.split_once('=') {
        Some((k, v)) => labels.get(k.trim()).map(String::as_str) == Some(v.trim()),
        None => labels.contains_key(term.trim()),
    })
}

fn listing(api: &KubeApi, ns: Option<&str>, q: &Option<String>) -> Response {
    let node = query_param(q, "fieldSelector").map(|f| {
        f.strip_prefix("spec.nodeName=")
            .map(str::to_owned)
            .unwrap_or_else(|| panic!("unexpected field selector {f:?}"))
    });
    let labels = query_param(q, "labelSelector");
    let i = api.0.lock().unwrap();
    let items: Vec<&Pod> = i
        .pods
        .iter()
        .filter(|p| ns.is_none_or(|ns| p.metadata.namespace.as_deref() == Some(ns)))
        .filter(|p| {
            node.as_deref()
                .is_none_or(|n| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(n))
        })
        .filter(|p| labels.as_deref().is_none_or(|l| labels_match(p, l)))
        .collect();
    // `limit` and `continue` (an offset here), and `remainingItemCount`, which the API
    // server leaves out when a label selector is set (the fleet brake's count reads it).
    let from: usize = query_param(q, "continue")
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let limit: Option<usize> = query_param(q, "limit").and_then(|l| l.parse().ok());
    let end = limit.map_or(items.len(), |l| (from + l).min(items.len()));
    let mut meta = serde_json::json!({"resourceVersion": "1"});
    if end < items.len() {
        meta["continue"] = end.to_string().into();
        if labels.is_none() {
            meta["remainingItemCount"] = (items.len() - end).into();
        }
    }
    axum::Json(serde_json::json!({
        "apiVersion": "v1",
        "kind": "PodList",
        "metadata": meta,
        "items": &items[from.min(end)..end],
    }))
    .into_response()
}

async fn list(
    State(api): State<KubeApi>,
    RawQuery(q): RawQuery,
    method: Method,
    headers: HeaderMap,
) -> Response {
    if let Some(r) = front(
        &api,
        Route::List,
        &method,
        "/api/v1/pods".into(),
        q.clone(),
        &headers,
        &Bytes::new(),
    )
    .await
    {
        return r;
    }
    listing(&api, None, &q)
}

async fn list_ns(
    State(api): State<KubeApi>,
    Path(ns): Path<String>,
    RawQuery(q): RawQuery,
    method: Method,
    headers: HeaderMap,
) -> Response {
    let path = format!("/api/v1/namespaces/{ns}/pods");
    if let Some(r) = front(
        &api,
        Route::List,
        &method,
        path,
        q.clone(),
        &headers,
        &Bytes::new(),
    )
    .await
    {
        return r;
    }
    listing(&api, Some(&ns), &q)
}

async fn get_pod(
    State(api): State<KubeApi>,
    Path((ns, name)): Path<(String, String)>,
    RawQuery(q): RawQuery,
    method: Method,
    headers: HeaderMap,
) -> Response {
    let path = format!("/api/v1/namespaces/{ns}/pods/{name}");
    if let Some(r) = front(&api, Route::Get, &method, path, q, &headers, &Bytes::new()).await {
        return r;
    }
    match api.pod(&ns, &name) {
        Some(p) => axum::Json(p).into_response(),
        None => status(404, "NotFound", &format!("pods \"{name}\" not found")),
    }
}

/// A 415 unless the request is a strategic merge patch (as a pod's and an Event's patches
/// must be).
fn not_strategic_merge(headers: &HeaderMap) -> Option<Response> {
    let ct = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    (ct != "application/strategic-merge-patch+json")
        .then(|| status(415, "UnsupportedMediaType", &format!("content type {ct:?}")))
}

/// A strategic merge patch of `status.conditions`: each entry must be a PodCondition; merged
/// into the pod's conditions by type.
async fn patch_status(
    State(api): State<KubeApi>,
    Path((ns, name)): Path<(String, String)>,
    RawQuery(q): RawQuery,
    method: Method,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = format!("/api/v1/namespaces/{ns}/pods/{name}/status");
    if let Some(r) = front(&api, Route::PatchStatus, &method, path, q, &headers, &body).await {
        return r;
    }
    if let Some(r) = not_strategic_merge(&headers) {
        return r;
    }
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Patch {
        status: PatchStatus,
    }
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct PatchStatus {
        conditions: Vec<PodCondition>,
    }
    let p: Patch = match serde_json::from_slice(&body) {
        Ok(p) => p,
        Err(e) => {
            return status(
                400,
                "BadRequest",
                &format!("not a status conditions patch: {e}"),
            );
        }
    };
    for c in &p.status.conditions {
        if !matches!(c.status.as_str(), "True" | "False" | "Unknown") {
            return status(422, "Invalid", &format!("condition status {:?}", c.status));
        }
    }
    let mut i = api.0.lock().unwrap();
    let Some(pod) = i.pods.iter_mut().find(|p| is(p, &ns, &name)) else {
        return status(404, "NotFound", &format!("pods \"{name}\" not found"));
    };
    let conds = pod
        .status
        .get_or_insert_with(PodStatus::default)
        .conditions
        .get_or_insert_with(Vec::new);
    for c in p.status.conditions {
        match conds.iter_mut().find(|x| x.type_ == c.type_) {
            Some(x) => *x = c,
            None => conds.push(c),
        }
    }
    axum::Json(pod.clone()).into_response()
}

/// A policy/v1 Eviction: apiVersion, kind and the pod's name and namespace must be right.
async fn evict(
    State(api): State<KubeApi>,
    Path((ns, name)): Path<(String, String)>,
    RawQuery(q): RawQuery,
    method: Method,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = format!("/api/v1/namespaces/{ns}/pods/{name}/eviction");
    if let Some(r) = front(&api, Route::Evict, &method, path, q, &headers, &body).await {
        return r;
    }
    let v: serde_json::Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return status(400, "BadRequest", &format!("not JSON: {e}")),
    };
    if v["apiVersion"] != "policy/v1" || v["kind"] != "Eviction" {
        return status(400, "BadRequest", &format!("not a policy/v1 Eviction: {v}"));
    }
    let ev: Eviction = match serde_json::from_value(v) {
        Ok(e) => e,
        Err(e) => return status(400, "BadRequest", &format!("not an Eviction: {e}")),
    };
    if ev.metadata.name.as_deref() != Some(name.as_str())
        || ev.metadata.namespace.as_deref().is_some_and(|n| n != ns)
    {
        return status(400, "BadRequest", "the Eviction names another pod");
    }
    let mut i = api.0.lock().unwrap();
    let Some(pod) = i.pods.iter_mut().find(|p| is(p, &ns, &name)) else {
        return status(404, "NotFound", &format!("pods \"{name}\" not found"));
    };
    pod.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::now(),
    ));
    status(201, "", "")
}

/// A strategic merge patch of the pod's annotations.
async fn patch_pod(
    State(api): State<KubeApi>,
    Path((ns, name)): Path<(String, String)>,
    RawQuery(q): RawQuery,
    method: Method,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = format!("/api/v1/namespaces/{ns}/pods/{name}");
    if let Some(r) = front(&api, Route::PatchPod, &method, path, q, &headers, &body).await {
        return r;
    }
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Patch {
        metadata: Meta,
    }
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Meta {
        annotations: BTreeMap<String, String>,
    }
    let p: Patch = match serde_json::from_slice(&body) {
        Ok(p) => p,
        Err(e) => return status(400, "BadRequest", &format!("not an annotations patch: {e}")),
    };
    let mut i = api.0.lock().unwrap();
    let Some(pod) = i.pods.iter_mut().find(|p| is(p, &ns, &name)) else {
        return status(404, "NotFound", &format!("pods \"{name}\" not found"));
    };
    pod.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .extend(p.metadata.annotations);
    axum::Json(pod.clone()).into_response()
}

async fn unknown(method: Method, uri: axum::http::Uri) -> Response {
    status(
        404,
        "NotFound",
        &format!("the stand-in has no route for {method} {uri}"),
    )
}

// --- events.k8s.io/v1 Events -------------------------------------------------------------

/// The API server's limits on an Event (`events.go`).
const EVENT_LIMIT_128: usize = 128;
const NOTE_LIMIT: usize = 1024;

fn event_routes() -> axum::Router<KubeApi> {
    axum::Router::new()
        .route(
            "/apis/events.k8s.io/v1/namespaces/{ns}/events",
            post(create_event),
        )
        .route(
            "/apis/events.k8s.io/v1/namespaces/{ns}/events/{name}",
            patch(patch_event),
        )
}

impl KubeApi {
    /// The Events stored, as the API server keeps them.
    pub fn events(&self) -> Vec<k8s_openapi::api::events::v1::Event> {
        let i = self.0.lock().unwrap();
        i.events
            .iter()
            .map(|v| serde_json::from_value(v.clone()).expect("a stored Event"))
            .collect()
    }

    /// The Events regarding the pod `ns/name`, as `kubectl describe pod` lists them (Type,
    /// Reason, Age, From, Message; a series as `<last> (xN over <first>)`), oldest first.
    pub fn describe_events(&self, ns: &str, name: &str) -> String {
        let now = k8s_openapi::jiff::Timestamp::now();
        let age = |t: k8s_openapi::jiff::Timestamp| {
            let s = (now - t).get_seconds().max(0);
            if s < 120 {
                format!("{s}s")
            } else {
                format!("{}m", s / 60)
            }
        };
        let mut evs: Vec<_> = self
            .events()
            .into_iter()
            .filter(|e| {
                e.regarding.as_ref().is_some_and(|r| {
                    r.kind.as_deref() == Some("Pod")
                        && r.namespace.as_deref() == Some(ns)
                        && r.name.as_deref() == Some(name)
                })
            })
            .collect();
        evs.sort_by_key(|e| e.event_time.as_ref().map(|t| t.0));
        let mut rows = vec![[
            "Type".to_owned(),
            "Reason".to_owned(),
            "Age".to_owned(),
            "From".to_owned(),
            "Message".to_owned(),
        ]];
        rows.push(rows[0].clone().map(|h| "-".repeat(h.len())));
        for e in &evs {
            let first = e.event_time.as_ref().map(|t| t.0).unwrap_or(now);
            let shown_age = match &e.series {
                Some(s) => format!(
                    "{} (x{} over {})",
                    age(s.last_observed_time.0),
                    s.count,
                    age(first)
                ),
                None => age(first),
            };
            rows.push([
                e.type_.clone().unwrap_or_default(),
                e.reason.clone().unwrap_or_default(),
                shown_age,
                format!(
                    "{}, {}",
                    e.reporting_controller.as_deref().unwrap_or_default(),
                    e.reporting_instance.as_deref().unwrap_or_default()
                ),
                e.note.clone().unwrap_or_default(),
            ]);
        }
        let width = |c: usize| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0);
        let widths: Vec<usize> = (0..4).map(width).collect();
        let mut out = String::from("Events:\n");
        for r in &rows {
            out.push_str("  ");
            for (c, w) in widths.iter().enumerate() {
                out.push_str(&format!("{:<w$}  ", r[c], w = *w));
            }
            out.push_str(&r[4]);
            out.push('\n');
        }
        out
    }
}

/// Whether `s` is a DNS-1123 subdomain (at most 253 bytes of dot-separated lower-case
/// alphanumeric labels, `-` inside).
fn dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

/// Whether `s` is a qualified name (`[prefix/]name`: a DNS subdomain prefix, a name of at
/// most 63 alphanumerics, `-`, `_`, `.`, alphanumeric at both ends).
fn qualified_name(s: &str) -> bool {
    let (prefix, name) = match s.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    prefix.is_none_or(dns_subdomain)
        && !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
}

/// A string field of `v`, `""` when absent.
fn text<'a>(v: &'a serde_json::Value, key: &str) -> &'a str {
    v.get(key).and_then(serde_json::Value::as_str).unwrap_or("")
}

/// A series as `validateV1EventSeries` checks it: count at least 2, lastObservedTime set.
fn validate_series(series: &serde_json::Value, errs: &mut Vec<String>) {
    if series.is_null() {
        return;
    }
    if series
        .get("count")
        .and_then(serde_json::Value::as_i64)
        .unwrap_or(0)
        < 2
    {
        errs.push("series.count: Invalid value: should be at least 2".into());
    }
    if text(series, "lastObservedTime").is_empty() {
        errs.push("series.lastObservedTime: Required value".into());
    }
}

/// An events.k8s.io/v1 Event created in namespace `ns`, checked as `ValidateEventCreate`
/// and `legacyValidateEvent` check it (`pkg/apis/core/validation/events.go`), the field
/// names those of events.k8s.io/v1. Every failure, as the 422's causes.
pub fn validate_event(ns: &str, v: &serde_json::Value) -> Vec<String> {
    let mut errs = Vec::new();
    let meta = &v["metadata"];
    if !dns_subdomain(text(meta, "name")) {
        errs.push(format!(
            "metadata.name: Invalid value: {:?}",
            text(meta, "name")
        ));
    }
    if !text(meta, "namespace").is_empty() && text(meta, "namespace") != ns {
        errs.push("metadata.namespace: does not match the request's namespace".into());
    }
    validate_series(&v["series"], &mut errs);
    if text(v, "eventTime").is_empty() {
        errs.push("eventTime: Required value".into());
    }
    if !matches!(text(v, "type"), "Normal" | "Warning") {
        errs.push(format!("type: Invalid value: {:?}", text(v, "type")));
    }
    for legacy in [
        "deprecatedFirstTimestamp",
        "deprecatedLastTimestamp",
        "deprecatedCount",
        "deprecatedSource",
    ] {
        if v.get(legacy).is_some_and(|x| !x.is_null()) {
            errs.push(format!("{legacy}: Invalid value: needs to be unset"));
        }
    }
    let regarding_ns = text(&v["regarding"], "namespace");
    if regarding_ns.is_empty() && !matches!(ns, "default" | "kube-system") {
        errs.push("regarding.namespace: does not match event.namespace".into());
    }
    let controller = text(v, "reportingController");
    if controller.is_empty() {
        errs.push("reportingController: Required value".into());
    } else if !qualified_name(controller) {
        errs.push(format!(
            "reportingController: Invalid value: {controller:?}"
        ));
    }
    for (key, limit) in [
        ("reportingInstance", EVENT_LIMIT_128),
        ("action", EVENT_LIMIT_128),
        ("reason", EVENT_LIMIT_128),
    ] {
        match text(v, key).len() {
            0 => errs.push(format!("{key}: Required value")),
            n if n > limit => errs.push(format!(
                "{key}: Invalid value: can have at most {limit} characters"
            )),
            _ => {}
        }
    }
    if text(v, "note").len() > NOTE_LIMIT {
        errs.push(format!(
            "note: Invalid value: can have at most {NOTE_LIMIT} characters"
        ));
    }
    if !dns_subdomain(ns) {
        errs.push(format!("namespace: Invalid value: {ns:?}"));
    }
    errs
}

fn invalid(errs: &[String]) -> Response {
    status(
        422,
        "Invalid",
        &format!("Event is invalid: {}", errs.join(", ")),
    )
}

async fn create_event(
    State(api): State<KubeApi>,
    Path(ns): Path<String>,
    RawQuery(q): RawQuery,
    method: Method,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = format!("/apis/events.k8s.io/v1/namespaces/{ns}/events");
    if let Some(r) = front(&api, Route::EventCreate, &method, path, q, &headers, &body).await {
        return r;
    }
    let mut v: serde_json::Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return status(400, "BadRequest", &format!("not JSON: {e}")),
    };
    if v["apiVersion"] != "events.k8s.io/v1" || v["kind"] != "Event" {
        return status(400, "BadRequest", "not an events.k8s.io/v1 Event");
    }
    if let Err(e) = serde_json::from_value::<k8s_openapi::api::events::v1::Event>(v.clone()) {
        return status(400, "BadRequest", &format!("not an Event: {e}"));
    }
    let errs = validate_event(&ns, &v);
    if !errs.is_empty() {
        return invalid(&errs);
    }
    v["metadata"]["namespace"] = serde_json::Value::String(ns.clone());
    let name = text(&v["metadata"], "name").to_owned();
    let mut i = api.0.lock().unwrap();
    if i.events
        .iter()
        .any(|e| text(&e["metadata"], "name") == name && text(&e["metadata"], "namespace") == ns)
    {
        return status(
            409,
            "AlreadyExists",
            &format!("events {name:?} already exists"),
        );
    }
    i.events.push(v.clone());
    (StatusCode::CREATED, axum::Json(v)).into_response()
}

/// A strategic merge patch of an Event: only `series` may change (every other field is
/// immutable, `ValidateEventUpdate`), and a changed series is validated again.
async fn patch_event(
    State(api): State<KubeApi>,
    Path((ns, name)): Path<(String, String)>,
    RawQuery(q): RawQuery,
    method: Method,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = format!("/apis/events.k8s.io/v1/namespaces/{ns}/events/{name}");
    if let Some(r) = front(&api, Route::EventPatch, &method, path, q, &headers, &body).await {
        return r;
    }
    if let Some(r) = not_strategic_merge(&headers) {
        return r;
    }
    let p: serde_json::Map<String, serde_json::Value> = match serde_json::from_slice(&body) {
        Ok(p) => p,
        Err(e) => return status(400, "BadRequest", &format!("not a JSON object: {e}")),
    };
    let mut i = api.0.lock().unwrap();
    let Some(stored) = i
        .events
        .iter_mut()
        .find(|e| text(&e["metadata"], "name") == name && text(&e["metadata"], "namespace") == ns)
    else {
        return status(404, "NotFound", &format!("events {name:?} not found"));
    };
    let mut errs = Vec::new();
    for (k, val) in &p {
        if k != "series" && stored.get(k) != Some(val) {
            errs.push(format!("{k}: Invalid value: field is immutable"));
        }
    }
    if let Some(s) = p.get("series") {
        validate_series(s, &mut errs);
    }
    if !errs.is_empty() {
        return invalid(&errs);
    }
    if let Some(s) = p.get("series") {
        stored["series"] = s.clone();
    }
    axum::Json(stored.clone()).into_response()
}

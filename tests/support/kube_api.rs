//! A stand-in Kubernetes API server for the tests: real HTTP on loopback, the real request
//! paths and verbs of the calls the agent makes, and bodies parsed with the `k8s-openapi`
//! types, so a malformed patch or Eviction is a 400 here and a failed test. It keeps a few
//! pods, applies condition patches (merged by type, as a strategic merge patch does) and
//! annotations to them, takes evictions, records every request, and answers from a script
//! of failures when one is queued for a route.
//!
//! What it does not do: authentication beyond checking the bearer token, admission,
//! PodDisruptionBudgets (a 429 is scripted), watches. resourceVersion conflicts only on the
//! fleet brake's ConfigMaps ([`kube_brake`]).

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
    /// The fleet brake's ConfigMaps ([`kube_brake`]).
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
    let ct = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if ct != "application/strategic-merge-patch+json" {
        return status(415, "UnsupportedMediaType", &format!("content type {ct:?}"));
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

//! The management surface: one listener per engine (what Node Manager polls) and an optional
//! admin listener for the whole host.
//!
//! Per engine: `GET /status` (always 200, body exactly `{"status":"initial"|"normal"|
//! "abnormal"}`, as MindIE's engine server), `GET /status/detail` (why, conditions, last probe,
//! current window per NPU, QoS), `GET /qos` (the QoS object alone, for routers), `GET /metrics`
//! (this engine and its NPUs), `GET /readyz` and `GET /livez` (the kubelet's probes,
//! [`crate::integrations`]). Admin: `GET /metrics` (everything), `GET /status/detail` (every
//! engine), `GET /qos` (every engine), `GET /events` (the live views' stream, [`live`]),
//! `GET /healthz` (the agent itself), and, open like `/healthz` because the kubelet's probes
//! carry no credentials, `GET /engines/<name>/readyz` and `GET /engines/<name>/livez`, and
//! `GET /` (the live page: static, it holds no data; its stream is guarded).
//! Handlers only read shared state; none waits on the engine or the driver.

pub(crate) mod auth;
pub(crate) mod compress;
pub(crate) mod conn;
pub(crate) mod live;
pub(crate) mod metrics;
pub(crate) mod wire;

pub(crate) use conn::serve;

use crate::integrations::routes;
use crate::monitor::Monitor;
use crate::sampler::Shared;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// State of an engine's listener.
#[derive(Debug, Clone)]
pub(crate) struct EngineView {
    pub engine: Arc<Monitor>,
    pub metrics: Arc<metrics::Exposition>,
}

/// State of the admin listener.
#[derive(Debug, Clone)]
pub(crate) struct AdminView {
    pub metrics: Arc<metrics::Exposition>,
    /// `/healthz` fails when the sampler is stuck this long (see `Shared::liveness`).
    pub stuck_after: Duration,
    /// The `/events` subscribers.
    pub hub: Arc<live::Hub>,
    /// The node's name, as the live views show it ([`crate::view::node_name`]).
    pub node: Arc<str>,
}

/// Router of one engine's mgmt listener: the agent's own routes, then every integration's
/// ([`Integration::routes`]).
pub(crate) fn engine_router(view: EngineView) -> Router {
    let own = Router::new()
        .route("/status/detail", get(engine_detail))
        .route("/qos", get(engine_qos))
        .route("/metrics", get(engine_metrics));
    let routes = routes::all().fold(own, |r, route| {
        let answer = route.answer;
        r.route(
            route.path,
            get(
                move |State(v): State<EngineView>, headers: HeaderMap| async move {
                    answer(&v.engine, &headers)
                },
            ),
        )
    });
    with_fallbacks(routes).with_state(view)
}

/// Both listeners' answers to a path no route serves and to a method no route takes.
fn with_fallbacks<S: Clone + Send + Sync + 'static>(r: Router<S>) -> Router<S> {
    r.fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
}

/// A path no route serves: a 404 that says so in one line (an empty body left a user
/// guessing whether the agent or something in front of it answered).
async fn not_found(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    (
        StatusCode::NOT_FOUND,
        format!(
            "npu-health-agent: no route {method} {} on this listener (docs/endpoints.md lists them)\n",
            crate::logging::quote(uri.path())
        ),
    )
        .into_response()
}

/// A route asked with another method than GET: a 405 that says which it takes.
async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    (
        StatusCode::METHOD_NOT_ALLOWED,
        [(header::ALLOW, "GET, HEAD")],
        format!(
            "npu-health-agent: {} answers GET only, not {method}\n",
            crate::logging::quote(uri.path())
        ),
    )
        .into_response()
}

/// Router of the admin listener; every route but `/healthz` behind `access`.
pub(crate) fn admin_router(view: AdminView, access: Arc<auth::AdminAccess>) -> Router {
    let guarded = Router::new()
        .route("/metrics", get(admin_metrics))
        .route("/status/detail", get(admin_detail))
        .route("/qos", get(admin_qos))
        .route("/events", get(live::events));
    let guarded = if access.required() {
        guarded.route_layer(axum::middleware::from_fn_with_state(access, auth::require))
    } else {
        guarded
    };
    let open = guarded
        .route("/healthz", get(healthz))
        .route("/", get(live::page));
    let routes = routes::all().filter(|r| r.on_admin).fold(open, |r, route| {
        let (answer, path) = (route.answer, route.path);
        r.route(
                &format!("/engines/{{name}}{path}"),
                get(
                    move |State(v): State<AdminView>,
                          Path(name): Path<String>,
                          headers: HeaderMap| async move {
                        named(&v, &name, path, |e| answer(e, &headers))
                    },
                ),
            )
    });
    with_fallbacks(routes).with_state(view)
}

/// The engine named `name` on the admin listener: `f` of it, or the open routes' answer to a
/// name no engine has ([`routes::unknown_engine`]: a fixed 404, what was asked in the log).
fn named(v: &AdminView, name: &str, route: &str, f: impl Fn(&Monitor) -> Response) -> Response {
    let engines = &v.metrics.engines;
    match engines.iter().find(|e| e.spec().name == name) {
        Some(e) => f(e),
        None => {
            let known: Vec<&str> = engines.iter().map(|e| e.spec().name.as_str()).collect();
            routes::unknown_engine(name, route, &known)
        }
    }
}

async fn engine_detail(State(v): State<EngineView>) -> Response {
    axum::Json(wire::to_json(&detail(
        &v.engine,
        &v.metrics.shared,
        v.metrics.window,
    )))
    .into_response()
}

async fn engine_qos(State(v): State<EngineView>) -> Response {
    axum::Json(wire::to_json(&qos(
        &v.engine,
        &v.metrics.shared,
        v.metrics.window,
    )))
    .into_response()
}

async fn admin_qos(State(v): State<AdminView>) -> Response {
    every_engine(&v, qos)
}

/// `{"engines": [...]}` with `f` of every engine.
fn every_engine<T: serde::Serialize>(
    v: &AdminView,
    f: fn(&Monitor, &Shared, Duration) -> T,
) -> Response {
    let engines = v
        .metrics
        .engines
        .iter()
        .map(|e| f(e, &v.metrics.shared, v.metrics.window))
        .collect();
    axum::Json(wire::to_json(&npu_health_wire::Engines { engines })).into_response()
}

async fn engine_metrics(State(v): State<EngineView>, headers: HeaderMap) -> Response {
    metrics_answer(metrics::render(&v.metrics), &headers)
}

async fn admin_metrics(State(v): State<AdminView>, headers: HeaderMap) -> Response {
    metrics_answer(metrics::render(&v.metrics), &headers)
}

/// The exposition, gzipped when the request accepts it (Prometheus asks for gzip at every
/// scrape: 13 % of the bytes, BENCHMARKS.md). `Vary` tells caches the answer depends on it.
fn metrics_answer(text: String, headers: &HeaderMap) -> Response {
    let vary = (header::VARY, "Accept-Encoding");
    if compress::accepts_gzip(headers.get_all(header::ACCEPT_ENCODING)) {
        match compress::gzip(text.as_bytes()) {
            Ok(body) => {
                return (
                    [
                        (header::CONTENT_TYPE, metrics::CONTENT_TYPE),
                        (header::CONTENT_ENCODING, "gzip"),
                        vary,
                    ],
                    body,
                )
                    .into_response();
            }
            Err(e) => tracing::warn!("/metrics: gzip failed ({e}); answering plain text"),
        }
    }
    ([(header::CONTENT_TYPE, metrics::CONTENT_TYPE), vary], text).into_response()
}

async fn admin_detail(State(v): State<AdminView>) -> Response {
    every_engine(&v, detail)
}

/// The agent is alive if its sampler threads are alive and ticking (`Shared::liveness`, the
/// same test that gates the systemd watchdog pings).
async fn healthz(State(v): State<AdminView>) -> Response {
    match v.metrics.shared.liveness(v.stuck_after) {
        Ok(()) => (StatusCode::OK, "ok\n").into_response(),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")).into_response(),
    }
}

/// `/status/detail` of one engine: the monitor's snapshot, with what the Kubernetes API mode
/// keeps of the engine (an integration's memory, which the monitor cannot name).
fn detail(e: &Monitor, shared: &Shared, win: Duration) -> npu_health_wire::EngineDetail {
    e.snapshot(
        shared,
        win,
        crate::integrations::kubernetes::memory::record(e),
    )
}

/// The QoS object of one engine (`GET /qos`): the monitor's.
fn qos(e: &Monitor, shared: &Shared, win: Duration) -> npu_health_wire::EngineQos {
    e.qos_snapshot(shared, win)
}

/// The listen backlog of every listener: connections the kernel completes before the agent
/// accepts them. std's 128 filled in a connection flood on a loaded host, and the kernel then
/// dropped every new handshake whoever sent it, so Node Manager's poll waited for a SYN
/// retransmission (1 s, then 3 s), before the connection cap could tell it from the flood
/// (issue 41). The kernel caps it at `net.core.somaxconn` (4096 by default).
pub(crate) const LISTEN_BACKLOG: i32 = 4096;

/// Binds a listener, naming the address on failure. A std socket, so the agent can keep a
/// duplicate of it and hand the same socket to a new server on reload (no refused polls).
pub(crate) fn bind(addr: SocketAddr) -> Result<std::net::TcpListener, String> {
    let fail = |e: std::io::Error| format!("cannot listen on {addr}: {e}");
    let l = std::net::TcpListener::bind(addr).map_err(fail)?;
    // A second listen() on a listening socket only sets its backlog.
    rustix::net::listen(&l, LISTEN_BACKLOG).map_err(|e| fail(e.into()))?;
    l.set_nonblocking(true).map_err(fail)?;
    Ok(l)
}

/// A tokio listener on a duplicate of `socket`'s descriptor (the same listening socket).
pub(crate) fn listener_on(socket: &std::net::TcpListener) -> Result<TcpListener, String> {
    let dup = socket
        .try_clone()
        .map_err(|e| format!("cannot duplicate the listening socket: {e}"))?;
    TcpListener::from_std(dup).map_err(|e| format!("cannot register the listening socket: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt;

    async fn ask(router: Router, method: &str, path: &str) -> (StatusCode, Option<String>, String) {
        let req = axum::http::Request::builder()
            .method(method)
            .uri(path)
            .body(axum::body::Body::empty())
            .unwrap();
        let r = router.oneshot(req).await.unwrap();
        let allow = r
            .headers()
            .get(header::ALLOW)
            .map(|v| v.to_str().unwrap().to_owned());
        let status = r.status();
        let body = axum::body::to_bytes(r.into_body(), 1 << 16).await.unwrap();
        (status, allow, String::from_utf8_lossy(&body).into_owned())
    }

    // Issue 42: a 404 or a 405 says what happened in its body (both listeners' routers end
    // with these fallbacks).
    #[tokio::test]
    async fn unknown_paths_and_methods_answer_with_a_line_that_says_so() {
        let router = with_fallbacks(Router::new().route("/status", get(|| async { "ok" })));
        let (code, _, body) = ask(router.clone(), "GET", "/nope").await;
        assert_eq!(code, StatusCode::NOT_FOUND);
        assert_eq!(
            body,
            "npu-health-agent: no route GET \"/nope\" on this listener (docs/endpoints.md lists them)\n"
        );
        let (code, allow, body) = ask(router.clone(), "POST", "/status").await;
        assert_eq!(code, StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(allow.as_deref(), Some("GET, HEAD"));
        assert_eq!(
            body,
            "npu-health-agent: \"/status\" answers GET only, not POST\n"
        );
        assert_eq!(ask(router, "GET", "/status").await.2, "ok");
    }

    // Issue 41: a flood the agent has not accepted yet does not fill the backlog, so a new
    // handshake still completes (std's backlog of 128 dropped the handshakes past it, and a
    // poll waited for a SYN retransmission).
    #[test]
    fn the_kernel_completes_far_more_handshakes_than_std_backlog_before_an_accept() {
        let l = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = l.local_addr().unwrap();
        let held: Vec<std::net::TcpStream> = (0..400)
            .map_while(|_| {
                std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(2)).ok()
            })
            .collect();
        assert_eq!(held.len(), 400, "handshakes completed before any accept");
    }
}

//! A fake OpenAI-compatible inference engine that behaves like vLLM where the agent looks, per
//! [`Profile`] (a vLLM release, or MindIE's engine server in front of vLLM): `GET /health`,
//! `POST /v1/completions` (plain and streaming SSE), `GET /metrics` with that release's metric
//! names and labels, and uvicorn's 5 s keep-alive idle close. While it serves requests it writes an AI Cube
//! figure into files the fake `libdcmi.so` reads (`aicube = { file = … }` in the scenario), so
//! load raises NPU usage and idle reads 0 %.
//!
//! Faults are set at run time on a separate control listener (it keeps answering when the
//! engine stops listening): `GET /fake/faults`, `POST /fake/faults` (a JSON patch of
//! [`Faults`]), `POST /fake/reset`, `GET /fake/stats`. See `docs/fake-driver.md`.

use crate::profile::Profile;
use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;

/// Faults, all off by default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Faults {
    /// Completions are accepted and never answered, nothing runs on the NPU; `/health` is
    /// unaffected (a silent hang with the NPU idle).
    pub hang: bool,
    /// Completions answer HTTP 500.
    pub http_5xx: bool,
    /// `/health` answers after this long.
    pub slow_health_ms: u64,
    /// `/health` answers 200 with body `false`: MindIE's engine server only (profile
    /// `mindie`); plain vLLM has no such answer, and the patch is refused there.
    pub health_false: bool,
    /// The engine core is dead (vLLM's `EngineDeadError`): `/health` answers the profile's
    /// dead answer (500 or 503 with an empty body; 200 on 0.8), completions answer 500.
    pub engine_dead: bool,
    /// A streamed completion sends one token, then an error event and `[DONE]`, as vLLM does
    /// when a request fails after its stream started.
    pub stream_error: bool,
    /// `/health` answers this status (e.g. 503).
    pub health_status: Option<u16>,
    /// Completions answer 200 with a body that is not JSON.
    pub garbage_body: bool,
    /// Added to every completion.
    pub latency_ms: u64,
    /// Random extra latency per decoded token, up to this (batch jitter).
    pub jitter_ms: u64,
    /// False closes the inference listener (connections refused); true opens it again.
    pub listening: bool,
    /// Completions hang with the NPU busy (AI Cube ≥ 90 %) and requests running: busy but stuck.
    pub npu_busy_stuck: bool,
    /// Forces the AI Cube figure written for the NPUs.
    pub npu_usage: Option<u8>,
    /// Writes `NA` instead of a figure: the fake driver then has no reading.
    pub npu_na: bool,
    /// Forces the KV-cache usage reported in `/metrics` (0..1).
    pub kv_cache_usage: Option<f64>,
    /// Added to the KV-cache usage reported in `/metrics` (memory pressure, 0..1).
    pub kv_cache_pressure: f64,
    /// The fake driver answers this DCMI return code for the NPUs' AI Cube reads.
    pub driver_error: Option<i32>,
    /// The fake driver's AI Cube reads block for as long as this is set.
    pub driver_hang: bool,
    /// HBM in use the fake driver reports for the NPUs, MB.
    pub hbm_used_mb: Option<u64>,
    /// Health word the fake driver reports for the NPUs (e.g. 4294967295, `0xFFFFFFFF`:
    /// the device does not exist).
    pub npu_health: Option<u32>,
    /// Fault codes the fake driver reports for the NPUs (`dcmi_get_device_errorcode_v2`),
    /// e.g. `[2162787330]` (0x80E18402); empty: none.
    pub npu_fault_codes: Vec<u32>,
    /// vLLM's sleep mode (level 1, `POST /sleep`): `vllm:engine_sleep_state` says
    /// `weights_offloaded`, `/health` answers 200, completions wait until it is cleared (the
    /// wake-up), nothing runs on the NPU.
    pub asleep: bool,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            hang: false,
            http_5xx: false,
            slow_health_ms: 0,
            health_false: false,
            engine_dead: false,
            stream_error: false,
            health_status: None,
            garbage_body: false,
            latency_ms: 0,
            jitter_ms: 0,
            listening: true,
            npu_busy_stuck: false,
            npu_usage: None,
            npu_fault_codes: Vec::new(),
            npu_na: false,
            kv_cache_usage: None,
            kv_cache_pressure: 0.0,
            driver_error: None,
            driver_hang: false,
            hbm_used_mb: None,
            npu_health: None,
            asleep: false,
        }
    }
}

/// How the fake engine runs.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// Inference surface.
    pub listen: SocketAddr,
    /// Control surface.
    pub control: SocketAddr,
    /// Model name the engine serves (requests naming another model get 404, as in vLLM):
    /// the first of vLLM's `--served-model-name`, which every answer's `model` and the
    /// `model_name` label carry.
    pub model: String,
    /// More names requests may ask for (the rest of vLLM's `--served-model-name`): a main
    /// and a draft engine both served under the name clients ask for.
    pub aliases: Vec<String>,
    /// Files to write the AI Cube figure into (one per fake NPU).
    pub npu_files: Vec<PathBuf>,
    /// AI Cube usage with one request running; each further request adds 5 (max 95).
    pub busy_usage: u8,
    /// Time to first token.
    pub ttft: Duration,
    /// Time per output token.
    pub tpot: Duration,
    /// Requests decoded at once; more wait (vLLM's `max_num_seqs`).
    pub max_running: usize,
    /// The engine imitated.
    pub profile: Profile,
    /// Data-parallel engines in the process: `/metrics` has one `engine` label value each.
    pub data_parallel: u32,
    /// A keep-alive connection with no request for this long is closed (uvicorn's
    /// `timeout_keep_alive`, 5 s in vLLM and MindIE's engine server).
    pub keep_alive: Duration,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            listen: "127.0.0.1:8000".parse().expect("literal address"),
            control: "127.0.0.1:8100".parse().expect("literal address"),
            model: "fake-model".to_owned(),
            aliases: Vec::new(),
            npu_files: Vec::new(),
            busy_usage: 60,
            ttft: Duration::from_millis(20),
            tpot: Duration::from_millis(5),
            max_running: 64,
            profile: Profile::default(),
            data_parallel: 1,
            keep_alive: Duration::from_secs(5),
        }
    }
}

/// Counters kept for tests and `/fake/stats`.
#[derive(Debug, Default, Serialize)]
struct Stats {
    completions: u64,
    virtual_completions: u64,
    health: u64,
    last_request_id: Option<String>,
    last_content_type: Option<String>,
    last_body: Option<Value>,
}

#[derive(Debug)]
struct Engine {
    opts: EngineOptions,
    faults: Mutex<Faults>,
    pause_until: Mutex<Option<Instant>>,
    running: AtomicU64,
    waiting: AtomicU64,
    prompt_tokens: AtomicU64,
    generation_tokens: AtomicU64,
    /// Finished requests (`vllm:request_success_total{finished_reason="length"}`).
    finished: AtomicU64,
    /// Unix time the counters were created (their `_created` lines).
    created: f64,
    /// Unix time the process started (`process_start_time_seconds`, which prometheus_client's
    /// process collector exports and vLLM keeps); an in-place restart (`restart_ms`) is a
    /// new process.
    process_start: Mutex<f64>,
    slots: Arc<Semaphore>,
    stats: Mutex<Stats>,
    listening: watch::Sender<bool>,
    rng: AtomicU64,
}

impl Engine {
    fn faults(&self) -> Faults {
        self.faults
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn paused(&self) -> Option<Instant> {
        let until = *self.pause_until.lock().unwrap_or_else(|p| p.into_inner());
        until.filter(|u| *u > Instant::now())
    }

    fn usage(&self) -> u8 {
        let f = self.faults();
        if let Some(u) = f.npu_usage {
            return u;
        }
        if f.npu_busy_stuck {
            return 95;
        }
        match self.running.load(Ordering::Acquire) {
            0 => 0,
            n => (u64::from(self.opts.busy_usage) + 5 * (n - 1)).min(95) as u8,
        }
    }

    fn jitter(&self, max_ms: u64) -> Duration {
        if max_ms == 0 {
            return Duration::ZERO;
        }
        Duration::from_millis(self.rng_u64() % (max_ms + 1))
    }

    /// xorshift: deterministic enough for a fake.
    fn rng_u64(&self) -> u64 {
        let mut x = self.rng.load(Ordering::Relaxed) | 1;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng.store(x, Ordering::Relaxed);
        x
    }
}

/// Decrements a gauge when a request ends, however it ends (client gone included).
struct Gauge<'a>(&'a AtomicU64);
impl<'a> Gauge<'a> {
    fn enter(g: &'a AtomicU64) -> Gauge<'a> {
        g.fetch_add(1, Ordering::AcqRel);
        Gauge(g)
    }
}
impl Drop for Gauge<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Runs the fake engine until `cancel`.
pub async fn run(opts: EngineOptions, cancel: CancellationToken) -> std::io::Result<()> {
    let (listening, _) = watch::channel(true);
    let engine = Arc::new(Engine {
        slots: Arc::new(Semaphore::new(opts.max_running.max(1))),
        opts,
        faults: Mutex::new(Faults::default()),
        pause_until: Mutex::new(None),
        running: AtomicU64::new(0),
        waiting: AtomicU64::new(0),
        prompt_tokens: AtomicU64::new(0),
        generation_tokens: AtomicU64::new(0),
        finished: AtomicU64::new(0),
        created: unix_now(),
        process_start: Mutex::new(unix_now()),
        stats: Mutex::new(Stats::default()),
        listening,
        rng: AtomicU64::new(0x9e37_79b9),
    });
    let control = TcpListener::bind(engine.opts.control).await?;
    let control_router = Router::new()
        .route("/fake/faults", get(get_faults).post(patch_faults))
        .route("/fake/reset", post(reset))
        .route("/fake/stats", get(stats))
        .with_state(engine.clone());
    let c = cancel.clone();
    let control_task = tokio::spawn(async move {
        let _ = axum::serve(control, control_router)
            .with_graceful_shutdown(async move { c.cancelled().await })
            .await;
    });
    let usage_task = tokio::spawn(write_usage(engine.clone(), cancel.clone()));
    let result = serve_inference(engine.clone(), cancel.clone()).await;
    cancel.cancel();
    let _ = control_task.await;
    let _ = usage_task.await;
    result
}

async fn serve_inference(engine: Arc<Engine>, cancel: CancellationToken) -> std::io::Result<()> {
    let router = Router::new()
        .route("/health", get(health))
        .route("/v1/completions", post(completions))
        .route("/metrics", get(metrics))
        .with_state(engine.clone());
    let mut rx = engine.listening.subscribe();
    loop {
        if !*rx.borrow_and_update() {
            tokio::select! {
                _ = cancel.cancelled() => return Ok(()),
                r = rx.changed() => if r.is_err() { return Ok(()) },
            }
            continue;
        }
        let listener = TcpListener::bind(engine.opts.listen).await?;
        let stop = async {
            loop {
                if rx.changed().await.is_err() || !*rx.borrow() {
                    return;
                }
            }
        };
        tokio::select! {
            _ = cancel.cancelled() => return Ok(()),
            _ = serve_until(listener, router.clone(), engine.opts.keep_alive, stop) => {}
        }
    }
}

/// Serves until `stop`, then drops the listener and every open connection (in-flight requests
/// included), as a process that dies would.
async fn serve_until(
    listener: TcpListener,
    router: Router,
    keep_alive: Duration,
    stop: impl std::future::Future<Output = ()>,
) {
    use hyper_util::rt::{TokioIo, TokioTimer};
    use hyper_util::service::TowerToHyperService;
    let mut conns = tokio::task::JoinSet::new();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let service = TowerToHyperService::new(router.clone());
                conns.spawn(async move {
                    // HTTP/1.1 only, as uvicorn. hyper's header-read timer starts when the
                    // connection waits for its next request, so it is uvicorn's keep-alive
                    // idle close (tests: keep_alive_idle_close_as_uvicorn).
                    let _ = hyper::server::conn::http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(keep_alive)
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    conns.abort_all();
    while conns.join_next().await.is_some() {}
}

async fn write_usage(engine: Arc<Engine>, cancel: CancellationToken) {
    let mut last = None;
    loop {
        let text = npu_file_text(&engine.faults(), engine.usage());
        if last.as_ref() != Some(&text) {
            for f in &engine.opts.npu_files {
                let tmp = f.with_extension("tmp");
                if std::fs::write(&tmp, &text).is_ok() {
                    let _ = std::fs::rename(&tmp, f);
                }
            }
            last = Some(text);
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
    }
}

/// What the fake driver reads for the NPUs (`npu_fake::scenario::file_reading`): the AI Cube
/// figure, `NA`, `error:<code>` or `hang`, then `hbm_used_mb=<n>`, `health=<n>` and
/// `errors=<codes>` when set.
fn npu_file_text(f: &Faults, usage: u8) -> String {
    let reading = if f.driver_hang {
        "hang".to_owned()
    } else if let Some(code) = f.driver_error {
        format!("error:{code}")
    } else if f.npu_na {
        "NA".to_owned()
    } else {
        usage.to_string()
    };
    let mut text = reading;
    if let Some(mb) = f.hbm_used_mb {
        text.push_str(&format!(" hbm_used_mb={mb}"));
    }
    if let Some(h) = f.npu_health {
        text.push_str(&format!(" health={h}"));
    }
    if !f.npu_fault_codes.is_empty() {
        let codes: Vec<String> = f
            .npu_fault_codes
            .iter()
            .map(|c| format!("0x{c:08X}"))
            .collect();
        text.push_str(&format!(" errors={}", codes.join(",")));
    }
    text.push('\n');
    text
}

/// A response with `status`, `body` and, if given, its content type (vLLM's empty `/health`
/// has none).
fn raw(status: u16, body: &'static str, content_type: Option<&'static str>) -> Response {
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut r = (code, body).into_response();
    match content_type {
        Some(ct) => {
            r.headers_mut()
                .insert(header::CONTENT_TYPE, header::HeaderValue::from_static(ct));
        }
        None => {
            r.headers_mut().remove(header::CONTENT_TYPE);
        }
    }
    r
}

async fn health(State(e): State<Arc<Engine>>) -> Response {
    e.stats.lock().unwrap_or_else(|p| p.into_inner()).health += 1;
    let f = e.faults();
    let profile = e.opts.profile;
    if e.paused().is_some() {
        return raw(503, "", None);
    }
    if f.slow_health_ms > 0 {
        tokio::time::sleep(Duration::from_millis(f.slow_health_ms)).await;
    }
    if let Some(s) = f.health_status {
        return raw(s, "", None);
    }
    if f.engine_dead || f.health_false {
        let (status, body, ct) = profile.health_dead();
        return raw(status, body, ct);
    }
    let (status, body, ct) = profile.health_ok();
    raw(status, body, ct)
}

#[derive(Debug, Deserialize)]
struct CompletionRequest {
    model: Option<String>,
    #[serde(default)]
    prompt: Value,
    max_tokens: Option<u64>,
    #[serde(default)]
    stream: bool,
}

fn prompt_tokens(p: &Value) -> u64 {
    let chars = match p {
        Value::String(s) => s.len(),
        Value::Array(a) => a.iter().map(|v| v.as_str().map_or(1, str::len)).sum(),
        _ => 1,
    };
    (chars as u64 / 4).max(1)
}

async fn completions(
    State(e): State<Arc<Engine>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let id = headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let parsed: Result<CompletionRequest, _> = serde_json::from_slice(&body);
    {
        let mut s = e.stats.lock().unwrap_or_else(|p| p.into_inner());
        s.completions += 1;
        if id.as_deref().is_some_and(|i| i.contains("_virtual")) {
            s.virtual_completions += 1;
        }
        s.last_request_id = id.clone();
        s.last_content_type = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        s.last_body = serde_json::from_slice(&body).ok();
    }
    let req = match parsed {
        Ok(r) => r,
        Err(err) => {
            return (
                StatusCode::BAD_REQUEST,
                axum::Json(json!({"object": "error", "message": err.to_string()})),
            )
                .into_response();
        }
    };
    // vLLM accepts a missing or empty model and answers for the served one.
    if req.model.as_deref().is_some_and(|m| {
        !m.is_empty() && m != e.opts.model && !e.opts.aliases.iter().any(|a| a == m)
    }) {
        return (
            StatusCode::NOT_FOUND,
            axum::Json(json!({"object": "error", "message": format!("The model `{}` does not exist.", req.model.unwrap_or_default())})),
        )
            .into_response();
    }
    if let Some(until) = e.paused() {
        tokio::time::sleep_until(until.into()).await;
    }
    while e.faults().asleep {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let f = e.faults();
    if f.latency_ms > 0 {
        tokio::time::sleep(Duration::from_millis(f.latency_ms)).await;
    }
    if f.npu_busy_stuck {
        // Requests are running (scheduled) but produce nothing, with the NPU spinning.
        let _running = Gauge::enter(&e.running);
        std::future::pending::<()>().await;
    }
    if f.hang {
        // Accepted and never answered, nothing scheduled: the NPU stays idle.
        std::future::pending::<()>().await;
    }
    if f.http_5xx {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            axum::Json(json!({"object": "error", "message": "injected failure"})),
        )
            .into_response();
    }
    if f.engine_dead {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            axum::Json(json!({"error": {"message": "The server had an error while processing your request.", "type": "InternalServerError", "param": null, "code": 500}})),
        )
            .into_response();
    }
    // vLLM echoes the caller's id; without one it makes a random one.
    let id = id.unwrap_or_else(|| format!("{:016x}", e.rng_u64()));
    let waiting = Gauge::enter(&e.waiting);
    let Ok(permit) = e.slots.clone().acquire_owned().await else {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    };
    drop(waiting);
    let n_prompt = prompt_tokens(&req.prompt);
    let max_tokens = req.max_tokens.unwrap_or(16).clamp(1, 4096);
    let engine = e.clone();
    if req.stream {
        let stream = async_stream(engine, permit, n_prompt, max_tokens, &f, id);
        return Response::builder()
            .header(header::CONTENT_TYPE, "text/event-stream; charset=utf-8")
            .body(Body::from_stream(stream))
            .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response());
    }
    let _running = Gauge::enter(&e.running);
    tokio::time::sleep(e.opts.ttft).await;
    // vLLM reports no partial prefill: the prompt counts when its first token comes out.
    e.prompt_tokens.fetch_add(n_prompt, Ordering::Relaxed);
    e.generation_tokens.fetch_add(1, Ordering::Relaxed);
    for _ in 1..max_tokens {
        tokio::time::sleep(e.opts.tpot + e.jitter(f.jitter_ms)).await;
        e.generation_tokens.fetch_add(1, Ordering::Relaxed);
    }
    e.finished.fetch_add(1, Ordering::Relaxed);
    drop(permit);
    if f.garbage_body {
        return (StatusCode::OK, "<html>upstream error</html>").into_response();
    }
    axum::Json(json!({
        "id": format!("cmpl-{id}"),
        "object": "text_completion",
        "model": e.opts.model,
        "choices": [{"index": 0, "text": " x".repeat(max_tokens as usize), "finish_reason": "length"}],
        "usage": {"prompt_tokens": n_prompt, "completion_tokens": max_tokens, "total_tokens": n_prompt + max_tokens},
    }))
    .into_response()
}

fn async_stream(
    e: Arc<Engine>,
    permit: tokio::sync::OwnedSemaphorePermit,
    n_prompt: u64,
    max_tokens: u64,
    f: &Faults,
    id: String,
) -> impl futures_util::Stream<Item = Result<String, std::convert::Infallible>> + Send + 'static {
    let model = e.opts.model.clone();
    let (garbage, jitter_ms, error_after_first) = (f.garbage_body, f.jitter_ms, f.stream_error);
    let (tx, rx) = tokio::sync::mpsc::channel::<String>(4);
    tokio::spawn(async move {
        let _permit = permit;
        let _running = RunningOwned::enter(e.clone());
        tokio::time::sleep(e.opts.ttft).await;
        // vLLM reports no partial prefill: the prompt counts when its first token comes out.
        e.prompt_tokens.fetch_add(n_prompt, Ordering::Relaxed);
        for i in 0..max_tokens {
            if i > 0 {
                tokio::time::sleep(e.opts.tpot + e.jitter(jitter_ms)).await;
            }
            e.generation_tokens.fetch_add(1, Ordering::Relaxed);
            if i == 1 && error_after_first {
                let err = e
                    .opts
                    .profile
                    .stream_error("injected failure after the first token");
                let _ = tx.send(format!("data: {err}\n\n")).await;
                let _ = tx.send("data: [DONE]\n\n".to_owned()).await;
                return;
            }
            let chunk = if garbage {
                "data: not json\n\n".to_owned()
            } else {
                let finish = if i + 1 == max_tokens {
                    json!("length")
                } else {
                    Value::Null
                };
                format!(
                    "data: {}\n\n",
                    json!({"id": format!("cmpl-{id}"), "object": "text_completion", "model": model, "choices": [{"index": 0, "text": " x", "finish_reason": finish}]})
                )
            };
            if tx.send(chunk).await.is_err() {
                return; // client gone: vLLM aborts the request
            }
        }
        e.finished.fetch_add(1, Ordering::Relaxed);
        let _ = tx.send("data: [DONE]\n\n".to_owned()).await;
    });
    futures_util::stream::unfold(
        rx,
        |mut rx| async move { rx.recv().await.map(|c| (Ok(c), rx)) },
    )
}

/// `running` gauge held by an owned engine handle.
struct RunningOwned(Arc<Engine>);
impl RunningOwned {
    fn enter(e: Arc<Engine>) -> RunningOwned {
        e.running.fetch_add(1, Ordering::AcqRel);
        RunningOwned(e)
    }
}
impl Drop for RunningOwned {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::AcqRel);
    }
}

async fn metrics(State(e): State<Arc<Engine>>) -> Response {
    if !e.opts.profile.serves_metrics() {
        return (
            StatusCode::NOT_FOUND,
            axum::Json(json!({"detail": "Not Found"})),
        )
            .into_response();
    }
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        metrics_text(&e),
    )
        .into_response()
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// `/metrics` as the profile's vLLM writes it: the series the agent reads, with that
/// release's names, HELP texts, labels (`engine` per data-parallel engine, `model_name`) and
/// the `_created` line of every counter. The queue, the tokens and the KV cache live on
/// engine 0; the other engines read 0.
fn metrics_text(e: &Engine) -> String {
    use std::fmt::Write;
    let f = e.faults();
    let p = e.opts.profile;
    let running = e.running.load(Ordering::Acquire) as f64;
    let waiting = e.waiting.load(Ordering::Acquire) as f64;
    let kv = (f
        .kv_cache_usage
        .unwrap_or_else(|| running / e.opts.max_running.max(1) as f64)
        + f.kv_cache_pressure)
        .clamp(0.0, 1.0);
    let m = &e.opts.model;
    let engines = e.opts.data_parallel.max(1);
    let mut out = String::new();
    // prometheus_client's process collector, first as it writes it (vLLM 0.32's fixture).
    let started = *e.process_start.lock().unwrap_or_else(|p| p.into_inner());
    let _ = writeln!(
        out,
        "# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.\n# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds {started:?}"
    );
    // One series for every engine: `value` on engine 0, 0 elsewhere (a `_created` timestamp
    // on all). `extra` is one `key="value"` label, placed in name order among `engine` and
    // `model_name` as prometheus_client writes vLLM's labels.
    let mut series = |name: &str, kind: &str, help: &str, rows: &[(&str, f64)]| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        let everywhere = name.ends_with("_created");
        for i in 0..engines {
            for (extra, v) in rows {
                let v = if i == 0 || everywhere { *v } else { 0.0 };
                let labels = match *extra {
                    "" => format!("engine=\"{i}\",model_name=\"{m}\""),
                    x if x < "model_name" => format!("engine=\"{i}\",{x},model_name=\"{m}\""),
                    x => format!("engine=\"{i}\",model_name=\"{m}\",{x}"),
                };
                let _ = writeln!(out, "{name}{{{labels}}} {v:?}");
            }
        }
    };
    series(
        "vllm:num_requests_running",
        "gauge",
        "Number of requests in model execution batches.",
        &[("", running)],
    );
    series(
        "vllm:num_requests_waiting",
        "gauge",
        "Number of requests waiting to be processed.",
        &[("", waiting)],
    );
    if p.waiting_by_reason() {
        series(
            "vllm:num_requests_waiting_by_reason",
            "gauge",
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting.",
            &[
                ("reason=\"capacity\"", waiting),
                ("reason=\"deferred\"", 0.0),
            ],
        );
    }
    if p.sleep_state() {
        let asleep = f.asleep;
        series(
            "vllm:engine_sleep_state",
            "gauge",
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
            &[
                ("sleep_state=\"awake\"", f64::from(u8::from(!asleep))),
                (
                    "sleep_state=\"weights_offloaded\"",
                    f64::from(u8::from(asleep)),
                ),
                ("sleep_state=\"discard_all\"", 0.0),
            ],
        );
    }
    for name in p.kv_cache_names() {
        let help = if *name == "vllm:gpu_cache_usage_perc" {
            "GPU KV-cache usage. 1 means 100 percent usage."
        } else {
            "KV-cache usage. 1 means 100 percent usage."
        };
        series(name, "gauge", help, &[("", kv)]);
    }
    let created = e.created;
    let prompt = e.prompt_tokens.load(Ordering::Relaxed) as f64;
    let generation = e.generation_tokens.load(Ordering::Relaxed) as f64;
    let finished = e.finished.load(Ordering::Relaxed) as f64;
    let success: Vec<(&str, f64)> = [
        ("finished_reason=\"stop\"", 0.0),
        ("finished_reason=\"length\"", finished),
        ("finished_reason=\"abort\"", 0.0),
        ("finished_reason=\"error\"", 0.0),
        ("finished_reason=\"repetition\"", 0.0),
    ]
    .to_vec();
    for (base, help, rows) in [
        (
            "vllm:prompt_tokens",
            "Number of prefill tokens processed.",
            vec![("", prompt)],
        ),
        (
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
            vec![("", generation)],
        ),
        (
            "vllm:request_success",
            "Count of successfully processed requests.",
            success,
        ),
    ] {
        series(&format!("{base}_total"), "counter", help, &rows);
        let created_rows: Vec<(&str, f64)> = rows.iter().map(|(l, _)| (*l, created)).collect();
        series(&format!("{base}_created"), "gauge", help, &created_rows);
    }
    out
}

async fn get_faults(State(e): State<Arc<Engine>>) -> Response {
    axum::Json(e.faults()).into_response()
}

/// A patch: any subset of [`Faults`], plus `pause_ms` (hot reload: completions wait and
/// `/health` answers 503 for that long), `long_prefill_ms` (one request prefills a long prompt
/// for that long with nothing else decoding: running, the NPU busy, both token counters flat
/// until its first token, as vLLM counts them) and `restart_ms` (the engine restarts under its
/// own supervisor: the listener closes, open connections drop, the counters start again from
/// 0, and it listens again after that long).
async fn patch_faults(State(e): State<Arc<Engine>>, body: axum::body::Bytes) -> Response {
    let patch: Value = match serde_json::from_slice(&body) {
        Ok(Value::Object(o)) => Value::Object(o),
        _ => return (StatusCode::BAD_REQUEST, "expected a JSON object\n").into_response(),
    };
    let mut patch = patch;
    if let Some(ms) = patch.as_object_mut().and_then(|o| o.remove("pause_ms")) {
        let Some(ms) = ms.as_u64() else {
            return (StatusCode::BAD_REQUEST, "pause_ms must be an integer\n").into_response();
        };
        *e.pause_until.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(Instant::now() + Duration::from_millis(ms));
    }
    let mut restarting = false;
    for key in ["long_prefill_ms", "restart_ms"] {
        let Some(v) = patch.as_object_mut().and_then(|o| o.remove(key)) else {
            continue;
        };
        let Some(ms) = v.as_u64() else {
            return (
                StatusCode::BAD_REQUEST,
                format!("{key} must be an integer\n"),
            )
                .into_response();
        };
        let d = Duration::from_millis(ms);
        let engine = e.clone();
        if key == "long_prefill_ms" {
            tokio::spawn(async move {
                let _running = RunningOwned::enter(engine.clone());
                tokio::time::sleep(d).await;
                engine.prompt_tokens.fetch_add(32_768, Ordering::Relaxed);
                engine.generation_tokens.fetch_add(1, Ordering::Relaxed);
                engine.finished.fetch_add(1, Ordering::Relaxed);
            });
        } else {
            restarting = true;
            *e.process_start.lock().unwrap_or_else(|p| p.into_inner()) =
                unix_now() + d.as_secs_f64();
            e.listening.send_replace(false);
            e.prompt_tokens.store(0, Ordering::Relaxed);
            e.generation_tokens.store(0, Ordering::Relaxed);
            tokio::spawn(async move {
                tokio::time::sleep(d).await;
                if engine.faults().listening {
                    engine.listening.send_replace(true);
                }
            });
        }
    }
    let mut current = serde_json::to_value(e.faults()).unwrap_or(Value::Null);
    if let (Some(c), Some(p)) = (current.as_object_mut(), patch.as_object()) {
        for (k, v) in p {
            c.insert(k.clone(), v.clone());
        }
    }
    let next: Faults = match serde_json::from_value(current) {
        Ok(f) => f,
        Err(err) => return (StatusCode::BAD_REQUEST, format!("{err}\n")).into_response(),
    };
    if next.health_false && e.opts.profile.is_vllm() {
        return (
            StatusCode::BAD_REQUEST,
            format!(
                "health_false: vLLM {} never answers /health with false (only MindIE's engine server does: profile mindie); use engine_dead or health_status\n",
                e.opts.profile
            ),
        )
            .into_response();
    }
    let listening = next.listening;
    *e.faults.lock().unwrap_or_else(|p| p.into_inner()) = next.clone();
    if !restarting {
        e.listening.send_replace(listening);
    }
    axum::Json(next).into_response()
}

async fn reset(State(e): State<Arc<Engine>>) -> Response {
    *e.faults.lock().unwrap_or_else(|p| p.into_inner()) = Faults::default();
    *e.pause_until.lock().unwrap_or_else(|p| p.into_inner()) = None;
    e.listening.send_replace(true);
    axum::Json(Faults::default()).into_response()
}

async fn stats(State(e): State<Arc<Engine>>) -> Response {
    let s = e.stats.lock().unwrap_or_else(|p| p.into_inner());
    axum::Json(json!({
        "completions": s.completions,
        "virtual_completions": s.virtual_completions,
        "health": s.health,
        "last_request_id": s.last_request_id,
        "last_content_type": s.last_content_type,
        "last_body": s.last_body,
        "running": e.running.load(Ordering::Acquire),
        "waiting": e.waiting.load(Ordering::Acquire),
        "npu_usage": e.usage(),
    }))
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    struct Running {
        base: String,
        control: String,
        npu: PathBuf,
        client: reqwest::Client,
        cancel: CancellationToken,
        _dir: std::path::PathBuf,
    }

    impl Drop for Running {
        fn drop(&mut self) {
            self.cancel.cancel();
            let _ = std::fs::remove_dir_all(&self._dir);
        }
    }

    async fn start() -> Running {
        start_with(Profile::default()).await
    }

    async fn start_with(profile: Profile) -> Running {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let (p, c) = (free_port(), free_port());
        let dir = std::env::temp_dir().join(format!("fake-engine-test-{p}"));
        std::fs::create_dir_all(&dir).unwrap();
        let npu = dir.join("npu0");
        let opts = EngineOptions {
            listen: format!("127.0.0.1:{p}").parse().unwrap(),
            control: format!("127.0.0.1:{c}").parse().unwrap(),
            model: "m".into(),
            aliases: vec!["served-as".into()],
            npu_files: vec![npu.clone()],
            ttft: Duration::from_millis(5),
            tpot: Duration::from_millis(1),
            profile,
            ..EngineOptions::default()
        };
        let cancel = CancellationToken::new();
        tokio::spawn(run(opts, cancel.clone()));
        let r = Running {
            base: format!("http://127.0.0.1:{p}"),
            control: format!("http://127.0.0.1:{c}"),
            npu,
            client: reqwest::Client::builder().no_proxy().build().unwrap(),
            cancel,
            _dir: dir,
        };
        for _ in 0..200 {
            if r.client
                .get(format!("{}/health", r.base))
                .send()
                .await
                .is_ok()
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        r
    }

    impl Running {
        async fn faults(&self, patch: Value) {
            let r = self
                .client
                .post(format!("{}/fake/faults", self.control))
                .json(&patch)
                .send()
                .await
                .unwrap();
            assert!(r.status().is_success(), "{patch}");
        }
        async fn complete(&self, body: Value) -> reqwest::Response {
            self.client
                .post(format!("{}/v1/completions", self.base))
                .json(&body)
                .send()
                .await
                .unwrap()
        }
        async fn npu(&self) -> String {
            tokio::time::sleep(Duration::from_millis(80)).await;
            std::fs::read_to_string(&self.npu)
                .unwrap_or_default()
                .trim()
                .to_owned()
        }
        async fn metric(&self, name: &str) -> f64 {
            let text = self
                .client
                .get(format!("{}/metrics", self.base))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            text.lines()
                .find(|l| l.starts_with(&format!("{name}{{")))
                .and_then(|l| l.rsplit(' ').next()?.parse().ok())
                .unwrap_or_else(|| panic!("{name} missing from\n{text}"))
        }
    }

    #[tokio::test]
    async fn plain_and_streaming_completions_and_vllm_metrics() {
        let e = start().await;
        let r = e
            .complete(json!({"model": "m", "prompt": "hello world", "max_tokens": 3}))
            .await;
        assert_eq!(r.status(), 200);
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["usage"]["completion_tokens"], 3);
        let r = e
            .complete(json!({"model": "m", "prompt": "x", "max_tokens": 4, "stream": true}))
            .await;
        assert_eq!(
            r.headers()["content-type"],
            "text/event-stream; charset=utf-8"
        );
        let body = r.text().await.unwrap();
        let chunks: Vec<&str> = body.split("\n\n").filter(|c| !c.is_empty()).collect();
        assert_eq!(chunks.len(), 5, "{body}");
        assert!(
            chunks[..4].iter().all(|c| c.starts_with("data: {")),
            "{body}"
        );
        assert_eq!(chunks[4], "data: [DONE]");
        assert_eq!(e.metric("vllm:generation_tokens_total").await, 7.0);
        assert!(e.metric("vllm:prompt_tokens_total").await >= 2.0);
        assert_eq!(e.metric("vllm:num_requests_running").await, 0.0);
        assert_eq!(e.metric("vllm:num_requests_waiting_by_reason").await, 0.0);
        assert_eq!(e.metric("vllm:kv_cache_usage_perc").await, 0.0);
        let r = e.complete(json!({"model": "other", "prompt": "x"})).await;
        assert_eq!(r.status(), 404, "unknown model, as vLLM");
        // Another served name is taken; the answer names the first (as vLLM's does).
        let r = e
            .complete(json!({"model": "served-as", "prompt": "x", "max_tokens": 1}))
            .await;
        assert_eq!(r.status(), 200);
        assert_eq!(r.json::<Value>().await.unwrap()["model"], "m");
    }

    #[tokio::test]
    async fn faults_change_what_the_engine_answers() {
        let e = start().await;
        let body = json!({"model": "m", "prompt": "1", "max_tokens": 1});
        e.faults(json!({"garbage_body": true})).await;
        let r = e.complete(body.clone()).await;
        assert_eq!(r.status(), 200);
        assert!(serde_json::from_str::<Value>(&r.text().await.unwrap()).is_err());
        e.faults(json!({"garbage_body": false, "http_5xx": true}))
            .await;
        assert_eq!(e.complete(body.clone()).await.status(), 500);
        e.faults(json!({"http_5xx": false, "latency_ms": 150}))
            .await;
        let t = Instant::now();
        assert_eq!(e.complete(body.clone()).await.status(), 200);
        assert!(t.elapsed() >= Duration::from_millis(150));
        let refused = e
            .client
            .post(format!("{}/fake/faults", e.control))
            .json(&json!({"latency_ms": 0, "health_false": true}))
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status(), 400, "plain vLLM never answers false");
        assert!(refused.text().await.unwrap().contains("mindie"));
        e.faults(json!({"latency_ms": 0, "engine_dead": true}))
            .await;
        let h = e
            .client
            .get(format!("{}/health", e.base))
            .send()
            .await
            .unwrap();
        assert_eq!(
            (h.status().as_u16(), h.text().await.unwrap()),
            (503, String::new()),
            "vLLM 0.33's dead engine"
        );
        assert_eq!(e.complete(body.clone()).await.status(), 500);
        let mindie = start_with(Profile::Mindie).await;
        mindie.faults(json!({"health_false": true})).await;
        let h = mindie
            .client
            .get(format!("{}/health", mindie.base))
            .send()
            .await
            .unwrap();
        assert_eq!(
            (h.status().as_u16(), h.text().await.unwrap()),
            (200, "false".to_owned())
        );
        e.faults(json!({"engine_dead": false, "pause_ms": 300}))
            .await;
        assert_eq!(
            e.client
                .get(format!("{}/health", e.base))
                .send()
                .await
                .unwrap()
                .status(),
            503
        );
        let t = Instant::now();
        assert_eq!(
            e.complete(body.clone()).await.status(),
            200,
            "completions wait out the pause"
        );
        assert!(t.elapsed() >= Duration::from_millis(200));
        assert_eq!(
            e.client
                .get(format!("{}/health", e.base))
                .send()
                .await
                .unwrap()
                .status(),
            200
        );
        let r = e
            .client
            .post(format!("{}/fake/faults", e.control))
            .body("{\"nope\": 1}")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "unknown fault keys are refused");
    }

    // Sleep mode: the gauge says weights_offloaded, /health stays 200, completions wait for
    // the wake-up.
    #[tokio::test]
    async fn asleep_holds_completions_and_says_so_in_the_gauge() {
        let e = start().await;
        let body = json!({"model": "m", "prompt": "1", "max_tokens": 1});
        let text = |e: &Running| {
            let c = e.client.clone();
            let url = format!("{}/metrics", e.base);
            async move { c.get(url).send().await.unwrap().text().await.unwrap() }
        };
        assert!(text(&e).await.contains("sleep_state=\"awake\"} 1"));
        e.faults(json!({"asleep": true})).await;
        let m = text(&e).await;
        assert!(m.contains("sleep_state=\"awake\"} 0"), "{m}");
        assert!(m.contains("sleep_state=\"weights_offloaded\"} 1"), "{m}");
        let health = e
            .client
            .get(format!("{}/health", e.base))
            .send()
            .await
            .unwrap();
        assert_eq!(health.status(), 200);
        let waiting =
            tokio::time::timeout(Duration::from_millis(300), e.complete(body.clone())).await;
        assert!(waiting.is_err(), "a completion waits while asleep");
        e.faults(json!({"asleep": false})).await;
        assert_eq!(e.complete(body).await.status(), 200);
    }

    // A long prefill: running, the NPU busy, both counters flat until its first token.
    // A restart: refused, counters from 0, listening again after the time given.
    #[tokio::test]
    async fn long_prefill_and_supervisor_restart() {
        let e = start().await;
        let body = json!({"model": "m", "prompt": "1", "max_tokens": 1});
        assert_eq!(e.complete(body.clone()).await.status(), 200);
        let before = e.metric("vllm:prompt_tokens_total").await;
        e.faults(json!({"long_prefill_ms": 400})).await;
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert_eq!(e.metric("vllm:num_requests_running").await, 1.0);
        assert_eq!(e.metric("vllm:prompt_tokens_total").await, before);
        assert_ne!(e.npu().await, "0", "the NPU works on the prefill");
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(e.metric("vllm:num_requests_running").await, 0.0);
        assert_eq!(e.metric("vllm:prompt_tokens_total").await, before + 32768.0);
        e.faults(json!({"restart_ms": 400})).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let down = e.client.get(format!("{}/health", e.base)).send().await;
        assert!(down.is_err(), "refused while restarting");
        tokio::time::sleep(Duration::from_millis(500)).await;
        let up = e
            .client
            .get(format!("{}/health", e.base))
            .send()
            .await
            .unwrap();
        assert_eq!(up.status(), 200, "back after the restart");
        assert_eq!(
            e.metric("vllm:prompt_tokens_total").await,
            0.0,
            "counters start again"
        );
    }

    #[tokio::test]
    async fn hang_keeps_the_npu_idle_and_busy_stuck_spins_it() {
        let e = start().await;
        let body = json!({"model": "m", "prompt": "1", "max_tokens": 1});
        assert_eq!(e.npu().await, "0");
        e.faults(json!({"hang": true})).await;
        let c = e.client.clone();
        let url = format!("{}/v1/completions", e.base);
        let b = body.clone();
        let hung = tokio::spawn(async move {
            c.post(&url)
                .json(&b)
                .timeout(Duration::from_millis(500))
                .send()
                .await
        });
        assert_eq!(e.npu().await, "0", "a hung request does not run on the NPU");
        assert!(hung.await.unwrap().is_err(), "never answered");
        e.faults(json!({"hang": false, "npu_busy_stuck": true}))
            .await;
        let c = e.client.clone();
        let url = format!("{}/v1/completions", e.base);
        let stuck = tokio::spawn(async move {
            c.post(&url)
                .json(&body)
                .timeout(Duration::from_millis(500))
                .send()
                .await
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(e.metric("vllm:num_requests_running").await, 1.0);
        assert_eq!(e.npu().await, "95");
        assert!(stuck.await.unwrap().is_err());
        e.faults(json!({"npu_busy_stuck": false, "npu_na": true}))
            .await;
        assert_eq!(e.npu().await, "NA");
    }

    #[tokio::test]
    async fn stop_listening_refuses_and_drops_open_connections() {
        let e = start().await;
        e.faults(json!({"hang": true})).await;
        let c = e.client.clone();
        let url = format!("{}/v1/completions", e.base);
        let t = Instant::now();
        let hung = tokio::spawn(async move {
            c.post(&url)
                .json(&json!({"model": "m", "prompt": "1"}))
                .timeout(Duration::from_secs(20))
                .send()
                .await
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        e.faults(json!({"listening": false})).await;
        let r = hung.await.unwrap();
        assert!(
            r.is_err() && t.elapsed() < Duration::from_secs(15),
            "the open connection was dropped"
        );
        assert!(
            e.client
                .get(format!("{}/health", e.base))
                .send()
                .await
                .is_err(),
            "refused"
        );
        e.faults(json!({"listening": true, "hang": false})).await;
        let mut ok = false;
        for _ in 0..100 {
            if e.client
                .get(format!("{}/health", e.base))
                .send()
                .await
                .is_ok()
            {
                ok = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(ok, "listening again");
    }

    #[test]
    fn npu_file_text_carries_driver_faults() {
        let f = Faults::default();
        assert_eq!(npu_file_text(&f, 60), "60\n");
        let hang = Faults {
            driver_hang: true,
            driver_error: Some(-8005),
            ..Faults::default()
        };
        assert_eq!(npu_file_text(&hang, 60), "hang\n", "a hang wins");
        let err = Faults {
            driver_error: Some(-8005),
            hbm_used_mb: Some(65536),
            ..Faults::default()
        };
        assert_eq!(npu_file_text(&err, 0), "error:-8005 hbm_used_mb=65536\n");
        let na = Faults {
            npu_na: true,
            ..Faults::default()
        };
        assert_eq!(npu_file_text(&na, 0), "NA\n");
        let gone = Faults {
            npu_health: Some(u32::MAX),
            ..Faults::default()
        };
        assert_eq!(npu_file_text(&gone, 0), "0 health=4294967295\n");
        let faulty = Faults {
            npu_fault_codes: vec![0x80E1_8402, 0x8107_8605],
            ..Faults::default()
        };
        assert_eq!(
            npu_file_text(&faulty, 7),
            "7 errors=0x80E18402,0x81078605\n"
        );
    }
}

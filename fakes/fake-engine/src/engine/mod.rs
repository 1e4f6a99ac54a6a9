//! A fake OpenAI-compatible inference engine that behaves like vLLM where the agent looks, per
//! [`Profile`] (a vLLM release, MindIE's engine server in front of vLLM, or SGLang's server,
//! whose own routes are in `sglang.rs`): `GET /health` (with vllm-ascend's health ping when
//! asked), `GET /health_generate` (SGLang's check, in every profile: the chaos runner's peer
//! probes it), `POST /v1/completions` (plain and streaming SSE), `GET /metrics` with that release's metric
//! names and labels, and uvicorn's 5 s keep-alive idle close. While it serves requests it writes an AI Cube
//! figure into files the fake `libdcmi.so` reads (`aicube = { file = … }` in the scenario), so
//! load raises NPU usage and idle reads 0 %.
//!
//! Faults are set at run time on a separate control listener (it keeps answering when the
//! engine stops listening): `GET /fake/faults`, `POST /fake/faults` (a JSON patch of
//! [`Faults`]), `POST /fake/reset`, `GET /fake/stats`. See `docs/fake-driver.md`.

use crate::profile::Profile;
use axum::Router;
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;

mod control;
mod inference;
mod metrics;
mod sglang;
use control::{get_faults, patch_faults, reset, stats};
use inference::{completions, health};
use metrics::{metrics, unix_now};

/// Faults, all off by default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Faults {
    /// Completions are accepted and never answered, nothing runs on the NPU; `/health` is
    /// unaffected (a silent hang with the NPU idle). Requests already decoding stop too, and
    /// `/metrics` repeats the scheduler's figures as they were (a stopped vLLM engine core).
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
    /// Added to every completion, before it runs (nothing is running meanwhile: the NPU
    /// stays idle).
    pub latency_ms: u64,
    /// Random extra delay before every completion runs, up to this, on top of `latency_ms`
    /// (an engine slow to answer for a while, its NPU idle).
    pub latency_spread_ms: u64,
    /// Random extra latency per decoded token, up to this (batch jitter).
    pub jitter_ms: u64,
    /// False closes the inference listener (connections refused); true opens it again.
    pub listening: bool,
    /// Completions hang with the NPU busy (AI Cube ≥ 90 %) and requests running: busy but stuck.
    /// As a stuck vLLM step does, it freezes the scheduler's figures in `/metrics` (running,
    /// waiting, KV-cache usage) at their values when the step stuck: vLLM's API server only
    /// repeats what its engine core last sent.
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
            latency_spread_ms: 0,
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
    /// Profile `sglang`: how often its `/health` looks for an output (1 s in SGLang).
    pub health_poll: Duration,
    /// Profile `sglang`: how long its `/health` waits for one before 503
    /// (`SGLANG_HEALTH_CHECK_TIMEOUT`, 20 s).
    pub health_budget: Duration,
    /// vllm-ascend PR #14240's health ping: `/health` first pings the engine core, which
    /// answers between steps; no answer within this long marks the engine dead for good
    /// (`/health` answers the profile's dead answer from then on). `None`: no ping, as
    /// released vLLM (`VLLM_HEALTH_CHECK_TIMEOUT_S`, 10 s, in the patch).
    pub health_ping_timeout: Option<Duration>,
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
            health_poll: Duration::from_secs(1),
            health_budget: Duration::from_secs(20),
            health_ping_timeout: None,
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
    /// One engine step in progress until then (an unchunked long prefill): nothing else is
    /// scheduled, no token comes out, new requests are not yet seen by the scheduler.
    step_until: Mutex<Option<Instant>>,
    /// A compile of a new shape in progress until then (`compile_stall_ms`): the step above
    /// holds the scheduler, and the NPU is idle (the compiler runs on the host's CPU).
    compiling_until: Mutex<Option<Instant>>,
    /// The scheduler's figures frozen by a stuck step (`npu_busy_stuck`).
    frozen: Mutex<Option<Frozen>>,
    /// KV-cache share held by long prefills in progress, in 1/10,000.
    prefill_kv: AtomicU64,
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
    /// `vllm:iteration_tokens_total` (see [`metrics::Iterations`]).
    iterations: Mutex<metrics::Iterations>,
    /// A health ping went unanswered: the engine is dead for the rest of the process
    /// (`EngineOptions::health_ping_timeout`).
    ping_dead: std::sync::atomic::AtomicBool,
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
        if f.hang || self.compiling() {
            // Requests held, nothing computed.
            return 0;
        }
        match self.running.load(Ordering::Acquire) {
            0 => 0,
            n => (u64::from(self.opts.busy_usage) + 5 * (n - 1)).min(95) as u8,
        }
    }

    /// How long a completion waits before it runs: `latency_ms`, plus up to
    /// `latency_spread_ms` at random.
    fn delay_before_run(&self, f: &Faults) -> Duration {
        Duration::from_millis(f.latency_ms) + self.jitter(f.latency_spread_ms)
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

/// The scheduler's figures as a stuck step left them.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Frozen {
    running: f64,
    waiting: f64,
    kv: f64,
}

impl Engine {
    /// Whether a compile stall is in progress.
    fn compiling(&self) -> bool {
        let until = *self
            .compiling_until
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        until.is_some_and(|u| u > Instant::now())
    }

    /// The step in progress, if one holds the scheduler.
    fn step_held(&self) -> Option<Instant> {
        let until = *self.step_until.lock().unwrap_or_else(|p| p.into_inner());
        until.filter(|u| *u > Instant::now())
    }

    /// One engine step that computed `tokens` tokens (`vllm:iteration_tokens_total`).
    fn step(&self, tokens: u64) {
        self.iterations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .observe(tokens);
    }

    /// Whether the engine core's loop is between steps now, so that a request sent to it
    /// (SGLang's one-token health generation, vllm-ascend's health ping) is taken: not while
    /// it hangs, is stuck in a step, is dead, or one step holds it.
    fn between_steps(&self, f: &Faults) -> bool {
        !(f.hang || f.npu_busy_stuck || f.engine_dead) && self.step_held().is_none()
    }

    /// Waits out a step in progress (a new request waits for the step to end).
    async fn after_step(&self) {
        while let Some(u) = self.step_held() {
            tokio::time::sleep_until(u.into()).await;
        }
    }

    /// Waits until the next token of a request already decoding may come out: after a step
    /// in progress, and never while the engine hangs or is stuck (a stuck vLLM step holds
    /// every request in the batch, not only the new ones).
    async fn next_token(&self) {
        loop {
            self.after_step().await;
            let f = self.faults();
            if !(f.hang || f.npu_busy_stuck) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The scheduler's running and waiting counts and KV-cache usage as `/metrics` shows
    /// them: frozen by a stuck step, else live.
    fn scheduler(&self, f: &Faults) -> Frozen {
        if let Some(frozen) = *self.frozen.lock().unwrap_or_else(|p| p.into_inner()) {
            return frozen;
        }
        let running = self.running.load(Ordering::Acquire) as f64;
        let prefill = self.prefill_kv.load(Ordering::Acquire) as f64 / 10_000.0;
        Frozen {
            running,
            waiting: self.waiting.load(Ordering::Acquire) as f64,
            kv: (metrics::kv_cache_usage(f, running, self.opts.max_running) + prefill)
                .clamp(0.0, 1.0),
        }
    }

    /// Freezes the scheduler's figures as they are now, once: a hung engine at once, a stuck
    /// step only with a request running (a step runs only with work scheduled).
    fn freeze(&self) {
        let f = self.faults();
        let now = self.scheduler(&f);
        let mut frozen = self.frozen.lock().unwrap_or_else(|p| p.into_inner());
        if frozen.is_none() && (f.hang || now.running > 0.0) {
            *frozen = Some(now);
        }
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
        step_until: Mutex::new(None),
        compiling_until: Mutex::new(None),
        frozen: Mutex::new(None),
        prefill_kv: AtomicU64::new(0),
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
        iterations: Mutex::new(metrics::Iterations::default()),
        ping_dead: std::sync::atomic::AtomicBool::new(false),
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
    let router = if engine.opts.profile.is_sglang() {
        sglang::router()
    } else {
        Router::new()
            .route("/health", get(health))
            .route("/health_generate", get(sglang::health_generate))
            .route("/v1/completions", post(completions))
            .route("/metrics", get(metrics))
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
        // Below the ephemeral range, never twice in this process: a port taken from `:0` and
        // released can be another test's listener by the time the engine binds it.
        let [p, c] = crate::launch::free_ports::<2>().unwrap();
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
        async fn metrics_text(&self) -> String {
            self.client
                .get(format!("{}/metrics", self.base))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap()
        }
        async fn metric(&self, name: &str) -> f64 {
            let text = self.metrics_text().await;
            text.lines()
                .find(|l| l.starts_with(&format!("{name}{{")))
                .and_then(|l| l.rsplit(' ').next()?.parse().ok())
                .unwrap_or_else(|| panic!("{name} missing from\n{text}"))
        }
    }

    // vLLM's `vllm:iteration_tokens_total`: a step per token out (the first carrying its
    // prompt), the count and the sum moving with them and frozen by a hang.
    #[tokio::test]
    async fn the_step_histogram_moves_with_tokens_and_freezes_in_a_hang() {
        let r = start().await;
        let count = "vllm:iteration_tokens_total_count";
        assert_eq!(r.metric(count).await, 0.0);
        let a = r
            .complete(json!({"model": "m", "prompt": "12345678", "max_tokens": 3}))
            .await;
        assert_eq!(a.status(), 200);
        assert_eq!(r.metric(count).await, 3.0, "three steps for three tokens");
        assert_eq!(r.metric("vllm:iteration_tokens_total_sum").await, 2.0 + 3.0);
        let text = r.metrics_text().await;
        let le1 =
            "vllm:iteration_tokens_total_bucket{engine=\"0\",le=\"1.0\",model_name=\"m\"} 2.0";
        assert!(
            text.contains(le1),
            "the two decode steps of one token in\n{text}"
        );
        assert!(text.contains("# TYPE vllm:iteration_tokens_total histogram"));
        r.faults(json!({"hang": true})).await;
        let stuck = r
            .client
            .post(format!("{}/v1/completions", r.base))
            .json(&json!({"model": "m", "prompt": "1", "max_tokens": 3}));
        let pending = tokio::spawn(stuck.send());
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(r.metric(count).await, 3.0, "no step in a hang");
        pending.abort();
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
        // An engine slow to answer for a while: the wait comes before the request runs, so
        // nothing is running and the NPU stays idle meanwhile.
        e.faults(json!({"latency_ms": 150, "latency_spread_ms": 100}))
            .await;
        let t = Instant::now();
        let slow = tokio::spawn({
            let (client, url) = (e.client.clone(), format!("{}/v1/completions", e.base));
            let body = body.clone();
            async move { client.post(url).json(&body).send().await.unwrap().status() }
        });
        let waiting = loop {
            let s: Value = e
                .client
                .get(format!("{}/fake/stats", e.control))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            if s["completions"] == 4 {
                break s;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        assert_eq!(
            (&waiting["running"], &waiting["npu_usage"]),
            (&json!(0), &json!(0)),
            "{waiting}"
        );
        assert_eq!(slow.await.unwrap(), 200);
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
        assert_eq!(
            e.metric("vllm:iteration_tokens_total_count").await,
            0.0,
            "the step histogram starts again"
        );
    }

    // The signs of life as vLLM shows them: a chunked long prefill moves the KV-cache usage
    // chunk by chunk and serves a request beside it; an unchunked one takes its blocks at once
    // and then nothing moves, a request beside it waiting for the step; a stuck step freezes
    // running, waiting and the KV-cache usage while requests keep arriving.
    #[tokio::test]
    async fn signs_of_life_move_as_vllm_moves_them() {
        let e = start().await;
        let body = json!({"model": "m", "prompt": "1", "max_tokens": 1});
        let kv = "vllm:kv_cache_usage_perc";
        e.faults(json!({"long_prefill_ms": 800})).await;
        let mut seen = Vec::new();
        for _ in 0..6 {
            seen.push(e.metric(kv).await);
            tokio::time::sleep(Duration::from_millis(110)).await;
        }
        seen.dedup();
        assert!(
            seen.len() >= 4,
            "the KV-cache usage grows chunk by chunk: {seen:?}"
        );
        let t = Instant::now();
        assert_eq!(e.complete(body.clone()).await.status(), 200);
        assert!(
            t.elapsed() < Duration::from_millis(200),
            "served beside the chunks"
        );
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(e.metric(kv).await, 0.0, "its blocks freed when it finished");
        e.faults(json!({"long_prefill_unchunked_ms": 600})).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let first = e.metric(kv).await;
        assert!(
            first >= 0.49,
            "one step takes the prompt's blocks at once: {first}"
        );
        let t = Instant::now();
        assert_eq!(e.complete(body.clone()).await.status(), 200);
        assert!(
            t.elapsed() >= Duration::from_millis(450),
            "a request waits for the step: {:?}",
            t.elapsed()
        );
        // Busy but stuck: frozen with one request running, however many arrive.
        e.faults(json!({"npu_busy_stuck": true})).await;
        let c = e.client.clone();
        let url = format!("{}/v1/completions", e.base);
        for _ in 0..3 {
            let (c, url, b) = (c.clone(), url.clone(), body.clone());
            tokio::spawn(async move { c.post(&url).json(&b).send().await });
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let frozen = (
            e.metric("vllm:num_requests_running").await,
            e.metric("vllm:num_requests_waiting").await,
            e.metric(kv).await,
        );
        assert_eq!(frozen.0, 1.0, "frozen when the first request stuck");
        tokio::time::sleep(Duration::from_millis(200)).await;
        let later = (
            e.metric("vllm:num_requests_running").await,
            e.metric("vllm:num_requests_waiting").await,
            e.metric(kv).await,
        );
        assert_eq!(frozen, later, "nothing moves");
        e.faults(json!({"npu_busy_stuck": false})).await;
        assert_ne!(
            e.metric("vllm:num_requests_running").await,
            1.0,
            "live again: the stuck requests are counted"
        );
    }

    // A compile stall (ai-dynamo/dynamo PR #14735) as vLLM shows it: /health 200, no token,
    // the scheduler's figures as they were, the NPU idle with a request running, a host core
    // busy (a thread named `compile`), then the held request carries on to its end.
    #[tokio::test]
    async fn a_compile_stall_holds_every_token_with_the_npu_idle_and_a_core_busy() {
        let e = start().await;
        let tokens = "vllm:generation_tokens_total";
        let (c, url) = (e.client.clone(), format!("{}/v1/completions", e.base));
        let long = tokio::spawn(async move {
            let body = json!({"model": "m", "prompt": "1", "max_tokens": 1000});
            c.post(&url)
                .json(&body)
                .send()
                .await
                .map(|r| r.status().as_u16())
        });
        while e.metric(tokens).await < 5.0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        e.faults(json!({"compile_stall_ms": 1500})).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let before = (
            e.metric(tokens).await,
            e.metric("vllm:num_requests_running").await,
            e.metric("vllm:kv_cache_usage_perc").await,
        );
        let health = e.client.get(format!("{}/health", e.base)).send().await;
        assert_eq!(health.map(|r| r.status().as_u16()).ok(), Some(200));
        assert_eq!(e.npu().await, "0", "the NPU idle while it compiles");
        let compiling = std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .any(|c| c.trim() == "compile");
        assert!(compiling, "a host core busy compiling");
        let after = (
            e.metric(tokens).await,
            e.metric("vllm:num_requests_running").await,
            e.metric("vllm:kv_cache_usage_perc").await,
        );
        assert_eq!(before, after, "no token, the figures as they were");
        assert_eq!(before.1, 1.0, "the request still running");
        assert_eq!(long.await.unwrap().ok(), Some(200), "it carries on");
        assert!(e.metric(tokens).await >= 1000.0);
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

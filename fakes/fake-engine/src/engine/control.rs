//! The control surface the tests and the chaos runner drive: read and patch the faults,
//! reset them, and the request counters.

use super::inference::RunningOwned;
use super::metrics::unix_now;
use super::{Engine, Faults};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

pub(super) async fn get_faults(State(e): State<Arc<Engine>>) -> Response {
    axum::Json(e.faults()).into_response()
}

/// A patch: any subset of [`Faults`], plus `pause_ms` (hot reload: completions wait and
/// `/health` answers 503 for that long), `long_prefill_ms` (one request prefills a long prompt
/// for that long with chunked prefill, vLLM's default: running, the NPU busy, both token
/// counters flat until its first token, as vLLM counts them, and the KV-cache usage growing
/// chunk by chunk, 16 chunks, while other requests are served beside it),
/// `long_prefill_unchunked_ms` (the same prompt in one step, chunked prefill off: its KV-cache
/// blocks taken at once, then nothing moves — no token, no new request scheduled — until the
/// step ends) and `restart_ms` (the engine restarts under its
/// own supervisor: the listener closes, open connections drop, the counters start again from
/// 0, and it listens again after that long), and `compile_stall_ms` (the engine compiles a
/// new shape for that long, as vLLM does on a shape it has not seen: see [`compile_stall`]).
pub(super) async fn patch_faults(
    State(e): State<Arc<Engine>>,
    body: axum::body::Bytes,
) -> Response {
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
    for key in [
        "long_prefill_ms",
        "long_prefill_unchunked_ms",
        "restart_ms",
        "compile_stall_ms",
    ] {
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
        if key == "compile_stall_ms" {
            compile_stall(engine, d);
        } else if key == "long_prefill_ms" || key == "long_prefill_unchunked_ms" {
            let chunks = if key == "long_prefill_ms" {
                PREFILL_CHUNKS
            } else {
                *e.step_until.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now() + d);
                1
            };
            tokio::spawn(long_prefill(engine, d, chunks));
        } else {
            restarting = true;
            restart(engine, d);
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
    if next.health_false && !e.opts.profile.answers_false() {
        let who = if e.opts.profile.is_vllm() {
            format!("vLLM {}", e.opts.profile)
        } else {
            "SGLang".to_owned()
        };
        return (
            StatusCode::BAD_REQUEST,
            format!(
                "health_false: {who} never answers /health with false (only MindIE's engine server does: profile mindie); use engine_dead or health_status\n"
            ),
        )
            .into_response();
    }
    let listening = next.listening;
    let before = e.faults();
    *e.faults.lock().unwrap_or_else(|p| p.into_inner()) = next.clone();
    // A new hang or stuck step freezes the figures afresh; none leaves them live.
    if (before.hang, before.npu_busy_stuck) != (next.hang, next.npu_busy_stuck) {
        *e.frozen.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
    if next.hang || next.npu_busy_stuck {
        e.freeze();
    }
    if !restarting {
        e.listening.send_replace(listening);
    }
    axum::Json(next).into_response()
}

/// The engine restarts under its own supervisor (`restart_ms`): its port closed for `d`, then
/// a new process's figures (counters at zero, the step histogram empty, the health ping
/// alive).
fn restart(e: Arc<Engine>, d: Duration) {
    *e.process_start.lock().unwrap_or_else(|p| p.into_inner()) = unix_now() + d.as_secs_f64();
    e.listening.send_replace(false);
    e.prompt_tokens.store(0, Ordering::Relaxed);
    e.generation_tokens.store(0, Ordering::Relaxed);
    *e.iterations.lock().unwrap_or_else(|p| p.into_inner()) = Default::default();
    e.ping_dead.store(false, Ordering::Relaxed);
    tokio::spawn(async move {
        tokio::time::sleep(d).await;
        if e.faults().listening {
            e.listening.send_replace(true);
        }
    });
}

/// Chunks of a chunked long prefill.
const PREFILL_CHUNKS: u64 = 16;
/// KV-cache share a long prefill's prompt takes, in 1/10,000.
const PREFILL_KV: u64 = 5_000;

/// One request prefilling a 32,768-token prompt for `d` in `chunks` steps: its KV-cache
/// blocks are taken chunk by chunk (all at once for one chunk), its prompt is counted with
/// its first token, and its blocks are freed when it finishes.
async fn long_prefill(e: Arc<Engine>, d: Duration, chunks: u64) {
    let running = RunningOwned::enter(e.clone());
    for _ in 0..chunks {
        e.prefill_kv
            .fetch_add(PREFILL_KV / chunks, Ordering::AcqRel);
        tokio::time::sleep(d / chunks as u32).await;
    }
    e.prompt_tokens.fetch_add(32_768, Ordering::Relaxed);
    e.generation_tokens.fetch_add(1, Ordering::Relaxed);
    e.finished.fetch_add(1, Ordering::Relaxed);
    e.prefill_kv
        .fetch_sub(PREFILL_KV / chunks * chunks, Ordering::AcqRel);
    drop(running);
}

/// A compile stall of `d` (ai-dynamo/dynamo PR #14735: vLLM JIT-compiles kernels on the first
/// sight of a new prompt shape, 30–70 s): the step holds every running request at its next
/// token and new requests wait for it, so no token comes out and the step counter stays; the
/// scheduler's figures in `/metrics` stay as they were (the API server hears nothing from its
/// engine core meanwhile), KV cache included; `/health` answers 200 (the engine core is busy,
/// not dead); the NPU is idle while one host core is busy, here a thread of this process
/// spinning until the compile ends. Then the engine serves the held requests again.
fn compile_stall(e: Arc<Engine>, d: Duration) {
    let until = Instant::now() + d;
    *e.step_until.lock().unwrap_or_else(|p| p.into_inner()) = Some(until);
    *e.compiling_until.lock().unwrap_or_else(|p| p.into_inner()) = Some(until);
    {
        let now = e.scheduler(&e.faults());
        let mut frozen = e.frozen.lock().unwrap_or_else(|p| p.into_inner());
        frozen.get_or_insert(now);
    }
    // The compiler's core: a plain thread, so that the engine's own runtime keeps serving; it
    // stops when the compile ends (or a reset ends it).
    let compiler = e.clone();
    let spawned = std::thread::Builder::new()
        .name("compile".to_owned())
        .spawn(move || {
            while compiler.compiling() {
                let slice = Instant::now() + Duration::from_millis(1);
                while Instant::now() < slice {
                    std::hint::spin_loop();
                }
            }
        });
    if let Err(err) = spawned {
        eprintln!(
            "fake-engine: compile_stall: no thread to burn a core ({err}); the stall holds the engine without it"
        );
    }
    tokio::spawn(async move {
        tokio::time::sleep_until(until.into()).await;
        let f = e.faults();
        // A hang or a stuck step set meanwhile keeps its own frozen figures, a later compile
        // its own.
        if !(f.hang || f.npu_busy_stuck || e.compiling()) {
            *e.frozen.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
    });
}

pub(super) async fn reset(State(e): State<Arc<Engine>>) -> Response {
    *e.faults.lock().unwrap_or_else(|p| p.into_inner()) = Faults::default();
    *e.pause_until.lock().unwrap_or_else(|p| p.into_inner()) = None;
    *e.frozen.lock().unwrap_or_else(|p| p.into_inner()) = None;
    *e.step_until.lock().unwrap_or_else(|p| p.into_inner()) = None;
    *e.compiling_until.lock().unwrap_or_else(|p| p.into_inner()) = None;
    e.listening.send_replace(true);
    axum::Json(Faults::default()).into_response()
}

pub(super) async fn stats(State(e): State<Arc<Engine>>) -> Response {
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

//! The `sglang` profile's own surface, modelled on sgl-project/sglang's source:
//! `python/sglang/srt/entrypoints/http_server.py` (its routes and its `/health`) and
//! `python/sglang/srt/metrics/collector.py` (its metric names and labels).
//!
//! - `GET /health` and `GET /health_generate` are one handler: 503 while the server starts
//!   (here: a `pause_ms` hot reload); else it submits a one-token generation and polls every
//!   [`EngineOptions::health_poll`](super::EngineOptions) (1 s) whether *any* output came out
//!   since it began, for up to `health_budget` (`SGLANG_HEALTH_CHECK_TIMEOUT`, 20 s): 200 with
//!   an empty body if so, else 503. Its quiet lies, kept: a healthy answer takes a poll; an
//!   engine that produces nothing (a hang, a stuck step, a dead scheduler, one unchunked
//!   prefill step longer than the budget) is told only after the budget; and any other
//!   request's output makes it 200, whatever its own generation does.
//! - `POST /v1/completions` (OpenAI's, shared with the vLLM profiles; the id is the body's
//!   `rid`) and `POST /generate` (SGLang's native API: `text`, `sampling_params`,
//!   `stream`, `rid`; the answer's `text` and `meta_info`).
//! - `GET /metrics`: the scheduler's gauges `sglang:num_running_reqs`, `sglang:num_queue_reqs`,
//!   `sglang:token_usage`, `sglang:gen_throughput` (labels `engine_type`, `model_name`,
//!   `moe_ep_rank`, `pp_rank`, `tp_rank`) and the tokenizer's counters
//!   `sglang:prompt_tokens_total`, `sglang:generation_tokens_total` (labels `engine_type`,
//!   `is_streaming`, `model_name`; the fake counts every token under `is_streaming="false"`),
//!   through prometheus_client's multiprocess collector: no `_created` lines and no process
//!   series (so no `process_start_time_seconds`). A stuck scheduler freezes the gauges, as a
//!   vLLM engine core does.

use super::inference::{completions, generate, raw};
use super::metrics::metrics;
use super::{Engine, Faults};
use axum::Router;
use axum::extract::State;
use axum::response::Response;
use axum::routing::{get, post};
use std::fmt::Write;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// The routes of SGLang's HTTP server the fake serves.
pub(super) fn router() -> Router<Arc<Engine>> {
    Router::new()
        .route("/health", get(health))
        .route("/health_generate", get(health))
        .route("/v1/completions", post(completions))
        .route("/generate", post(generate).put(generate))
        .route("/metrics", get(metrics))
}

/// Tokens that came out so far (prompt and generation): a change is an output.
fn outputs(e: &Engine) -> u64 {
    e.prompt_tokens.load(Ordering::Relaxed) + e.generation_tokens.load(Ordering::Relaxed)
}

/// Whether the health check's own one-token generation would come out now: the scheduler
/// runs (no hang, no stuck step, no dead scheduler) and no step holds it.
fn scheduler_runs(e: &Engine, f: &Faults) -> bool {
    !(f.hang || f.npu_busy_stuck || f.engine_dead) && e.step_held().is_none()
}

/// `/health` and `/health_generate`: see the module doc.
async fn health(State(e): State<Arc<Engine>>) -> Response {
    e.stats.lock().unwrap_or_else(|p| p.into_inner()).health += 1;
    if e.paused().is_some() {
        return raw(503, "", None);
    }
    let f = e.faults();
    if f.slow_health_ms > 0 {
        tokio::time::sleep(Duration::from_millis(f.slow_health_ms)).await;
    }
    if let Some(s) = f.health_status {
        return raw(s, "", None);
    }
    let (before, tic) = (outputs(&e), Instant::now());
    loop {
        tokio::time::sleep(e.opts.health_poll).await;
        // Its own generation runs only on an idle scheduler; any output counts.
        if scheduler_runs(&e, &e.faults()) || outputs(&e) != before {
            return raw(200, "", None);
        }
        if tic.elapsed() >= e.opts.health_budget {
            return raw(503, "", None);
        }
    }
}

/// `/metrics` as SGLang writes it (see the module doc).
pub(super) fn metrics_text(e: &Engine) -> String {
    let f = e.faults();
    let s = e.scheduler(&f);
    let model = &e.opts.model;
    let gauge_labels = format!(
        "engine_type=\"unified\",model_name=\"{model}\",moe_ep_rank=\"0\",pp_rank=\"0\",tp_rank=\"0\""
    );
    // The generation throughput the scheduler last logged: its running requests' rate.
    let throughput = s.running / e.opts.tpot.as_secs_f64().max(1e-3);
    let mut out = String::new();
    for (name, help, v) in [
        (
            "sglang:num_running_reqs",
            "The number of running requests.",
            s.running,
        ),
        ("sglang:token_usage", "The token usage.", s.kv),
        (
            "sglang:gen_throughput",
            "The generation throughput (token/s).",
            throughput,
        ),
        (
            "sglang:num_queue_reqs",
            "The number of requests in the waiting queue.",
            s.waiting,
        ),
    ] {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{{{gauge_labels}}} {v:?}"
        );
    }
    for (name, help, counter) in [
        (
            "sglang:prompt_tokens_total",
            "Number of prefill tokens processed.",
            &e.prompt_tokens,
        ),
        (
            "sglang:generation_tokens_total",
            "Number of generation tokens processed.",
            &e.generation_tokens,
        ),
    ] {
        let v = counter.load(Ordering::Relaxed) as f64;
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} counter\n{name}{{engine_type=\"unified\",is_streaming=\"false\",model_name=\"{model}\"}} {v:?}"
        );
    }
    out
}

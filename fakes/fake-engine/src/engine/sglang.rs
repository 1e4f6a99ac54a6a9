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

use super::Engine;
use super::inference::{completions, generate, raw};
use super::metrics::exposition;
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

/// `GET /metrics`: SGLang's names and labels ([`metrics_text`]).
async fn metrics(State(e): State<Arc<Engine>>) -> Response {
    exposition(&e, metrics_text)
}

/// Tokens that came out so far (prompt and generation): a change is an output.
fn outputs(e: &Engine) -> u64 {
    e.prompt_tokens.load(Ordering::Relaxed) + e.generation_tokens.load(Ordering::Relaxed)
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
    generate_check(&e).await
}

/// `GET /health_generate` of the other profiles: SGLang's check (the fake's own addition:
/// vLLM and MindIE's engine server have no such route; the chaos runner's
/// `sglang-health-generate` peer probes it). The `/health` faults (`slow_health_ms`,
/// `health_status`) are `/health`'s and leave it alone; a hot reload (`pause_ms`) is
/// SGLang's "starting", 503.
pub(super) async fn health_generate(State(e): State<Arc<Engine>>) -> Response {
    if e.paused().is_some() {
        return raw(503, "", None);
    }
    generate_check(&e).await
}

/// SGLang's one-token generation check: polls every `health_poll` whether any output came
/// out since it began (its own generation comes out when the engine is between steps), 200
/// if so, 503 after `health_budget` with none.
async fn generate_check(e: &Engine) -> Response {
    let (before, tic) = (outputs(e), Instant::now());
    loop {
        tokio::time::sleep(e.opts.health_poll).await;
        // Its own generation runs only on an idle scheduler; any output counts.
        if e.between_steps(&e.faults()) || outputs(e) != before {
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

#[cfg(test)]
mod tests {
    use super::super::{EngineOptions, run};
    use crate::profile::Profile;
    use serde_json::{Value, json};
    use std::time::{Duration, Instant};
    use tokio_util::sync::CancellationToken;

    /// The fake at profile `sglang`, its /health polling every 50 ms for up to 300 ms; its
    /// inference and control bases.
    async fn start() -> (String, String, CancellationToken) {
        start_with(Profile::Sglang, None).await
    }

    /// The fake at `profile` (SGLang's check polling every 50 ms for up to 300 ms), with the
    /// health ping's timeout if given.
    async fn start_with(
        profile: Profile,
        ping: Option<Duration>,
    ) -> (String, String, CancellationToken) {
        let [p, c] = crate::launch::free_ports::<2>().unwrap();
        let opts = EngineOptions {
            listen: format!("127.0.0.1:{p}").parse().unwrap(),
            control: format!("127.0.0.1:{c}").parse().unwrap(),
            model: "m".into(),
            profile,
            ttft: Duration::from_millis(5),
            tpot: Duration::from_millis(1),
            health_poll: Duration::from_millis(50),
            health_budget: Duration::from_millis(300),
            health_ping_timeout: ping,
            ..EngineOptions::default()
        };
        let cancel = CancellationToken::new();
        tokio::spawn(run(opts, cancel.clone()));
        let base = format!("http://127.0.0.1:{p}");
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        for _ in 0..200 {
            if client.get(format!("{base}/metrics")).send().await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        (base, format!("http://127.0.0.1:{c}"), cancel)
    }

    // SGLang's /health: 200 empty after a poll when the scheduler runs; under a hang, 503
    // only once its budget is spent; /health_generate the same handler.
    #[tokio::test]
    async fn health_waits_a_poll_when_fine_and_its_budget_when_nothing_comes_out() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let (base, control, cancel) = start().await;
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        let get = |path: &str| client.get(format!("{base}{path}")).send();
        let t = Instant::now();
        let h = get("/health").await.unwrap();
        assert_eq!(h.status(), 200);
        assert!(t.elapsed() >= Duration::from_millis(50), "one poll first");
        assert_eq!(h.text().await.unwrap(), "");
        assert_eq!(get("/health_generate").await.unwrap().status(), 200);
        let r = client
            .post(format!("{control}/fake/faults"))
            .json(&json!({"hang": true}))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success());
        let t = Instant::now();
        assert_eq!(get("/health").await.unwrap().status(), 503);
        assert!(
            t.elapsed() >= Duration::from_millis(300),
            "after the budget"
        );
        let refused = client
            .post(format!("{control}/fake/faults"))
            .json(&json!({"hang": false, "health_false": true}))
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status(), 400, "SGLang never answers false");
        cancel.cancel();
    }

    /// Patches the fake's faults.
    async fn patch(client: &reqwest::Client, control: &str, patch: Value) {
        let r = client
            .post(format!("{control}/fake/faults"))
            .json(&patch)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{patch}");
    }

    // Every profile serves SGLang's /health_generate (the fake's addition outside SGLang):
    // 200 on a healthy engine, 503 on a hung one once the budget is spent, while vLLM's own
    // /health still says 200 (its hang is silent).
    #[tokio::test]
    async fn health_generate_is_200_when_healthy_and_503_after_its_budget_when_hung() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        for profile in [Profile::V0_33, Profile::Mindie] {
            let (base, control, cancel) = start_with(profile, None).await;
            let get = |path: &str| client.get(format!("{base}{path}")).send();
            assert_eq!(
                get("/health_generate").await.unwrap().status(),
                200,
                "{profile}"
            );
            patch(&client, &control, json!({"hang": true})).await;
            let t = Instant::now();
            assert_eq!(
                get("/health_generate").await.unwrap().status(),
                503,
                "{profile}"
            );
            assert!(
                t.elapsed() >= Duration::from_millis(300),
                "after the budget"
            );
            assert_eq!(get("/health").await.unwrap().status(), 200, "{profile}");
            cancel.cancel();
        }
    }

    // vllm-ascend's health ping: a long step shorter than the timeout is waited out (the
    // ping is answered between steps); a hang leaves it unanswered and the engine is dead
    // for good, its /health 503 after the hang is gone.
    #[tokio::test]
    async fn a_missed_ping_marks_the_engine_dead_for_good() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        let (base, control, cancel) =
            start_with(Profile::V0_33, Some(Duration::from_millis(400))).await;
        let health = || async {
            client
                .get(format!("{base}/health"))
                .send()
                .await
                .unwrap()
                .status()
        };
        assert_eq!(health().await, 200);
        patch(&client, &control, json!({"long_prefill_unchunked_ms": 150})).await;
        let t = Instant::now();
        assert_eq!(health().await, 200, "answered at the step's end");
        assert!(
            t.elapsed() >= Duration::from_millis(100),
            "{:?}",
            t.elapsed()
        );
        patch(&client, &control, json!({"hang": true})).await;
        let t = Instant::now();
        assert_eq!(health().await, 503);
        assert!(
            t.elapsed() >= Duration::from_millis(400),
            "after the timeout"
        );
        patch(&client, &control, json!({"hang": false})).await;
        assert_eq!(health().await, 503, "dead for good");
        cancel.cancel();
        // A prober that gives up before the ping's timeout leaves it running to its end.
        let (base, control, cancel) =
            start_with(Profile::V0_33, Some(Duration::from_millis(300))).await;
        patch(&client, &control, json!({"hang": true})).await;
        let impatient = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_millis(50))
            .build()
            .unwrap();
        assert!(
            impatient
                .get(format!("{base}/health"))
                .send()
                .await
                .is_err()
        );
        tokio::time::sleep(Duration::from_millis(400)).await;
        patch(&client, &control, json!({"hang": false})).await;
        let r = client.get(format!("{base}/health")).send().await.unwrap();
        assert_eq!(r.status(), 503, "the abandoned ping marked the engine dead");
        cancel.cancel();
        // Without the option /health never pings: a hang leaves it 200.
        let (base, control, cancel) = start_with(Profile::V0_33, None).await;
        patch(&client, &control, json!({"hang": true})).await;
        let r = client.get(format!("{base}/health")).send().await.unwrap();
        assert_eq!(r.status(), 200);
        cancel.cancel();
    }

    // /generate and /v1/completions take the id from `rid`; the series are SGLang's.
    #[tokio::test]
    async fn generate_completions_and_sglang_metrics() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let (base, control, cancel) = start().await;
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        let r: Value = client
            .post(format!("{base}/generate"))
            .json(&json!({"text": "hello", "sampling_params": {"max_new_tokens": 3}, "rid": "g1"}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(r["meta_info"]["completion_tokens"], 3, "{r}");
        assert_eq!(r["meta_info"]["id"], "g1");
        let r = client
            .post(format!("{base}/v1/completions"))
            .json(&json!({"model": "any", "prompt": "1", "max_tokens": 1, "rid": "1_virtual"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "another model name is taken");
        let stats: Value = client
            .get(format!("{control}/fake/stats"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(stats["last_request_id"], "1_virtual", "{stats}");
        assert_eq!(stats["virtual_completions"], 1);
        let m = client
            .get(format!("{base}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        for name in [
            "sglang:num_running_reqs{",
            "sglang:num_queue_reqs{",
            "sglang:token_usage{",
            "sglang:gen_throughput{",
            "sglang:generation_tokens_total{engine_type=\"unified\",is_streaming=\"false\",model_name=\"m\"} 4.0",
        ] {
            assert!(m.contains(name), "{name} in\n{m}");
        }
        assert!(!m.contains("vllm:") && !m.contains("_created"), "{m}");
        cancel.cancel();
    }
}

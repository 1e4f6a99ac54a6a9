//! SGLang's HTTP server (`python -m sglang.launch_server`), which runs on Ascend NPUs too.
//! Read from sgl-project/sglang's own source:
//!
//! - **Metrics** (behind `--enable-metrics`): the scheduler's gauges
//!   `sglang:num_running_reqs`, `sglang:num_queue_reqs` and `sglang:token_usage` (a 0..1
//!   fraction of the KV pool), written when the scheduler logs its stats, and the tokenizer's
//!   counters `sglang:prompt_tokens_total` and `sglang:generation_tokens_total`, split by
//!   `is_streaming` (summed here), all labelled with `model_name`, `engine_type` and the
//!   ranks (`tp_rank`, `pp_rank`, `moe_ep_rank`), served through prometheus_client's
//!   multiprocess collector (`python/sglang/srt/metrics/collector.py`; from v0.5.23
//!   `python/sglang/srt/observability/metrics_collector.py`). `sglang:gen_throughput` is
//!   not read: the token counters give the rate, and a stuck scheduler freezes that gauge at
//!   its last figure. SGLang has no waiting-for-capacity series and no sleep gauge.
//! - **Virtual request**: its OpenAI server's `POST /v1/completions`
//!   (`python/sglang/srt/entrypoints/http_server.py`, `openai/serving_completions.py`) with
//!   `{"prompt": "1", "max_tokens": 1}`, the model only when one is configured (its
//!   `CompletionRequest.model` defaults to `default`, `openai/protocol.py`), and the request id
//!   in `rid` as well as `X-Request-Id`: SGLang takes the caller's id from `rid`
//!   (`openai/serving_base.py`, `_generate_request_id`), so its logs name the probe
//!   `<unix µs>_virtual`. `/generate` (its native API) and `/v1/chat/completions` exist too;
//!   `/v1/completions` answers in the shape the agent times, streamed or not.
//! - **Virtual inference** applies under the `agent` policy. Under `reference` it does not,
//!   as in MindIE V5, which disables it for `engine_type == "sglang"` (reference §1.2).
//! - **`/health`** (and `/health_generate`, the same handler): 503 while the server starts or
//!   shuts down; otherwise it submits a one-token generation (`rid` `HEALTH_CHECK_<time>`,
//!   `log_metrics=False`) and polls every second, for up to `SGLANG_HEALTH_CHECK_TIMEOUT`
//!   (20 s), whether *any* output reached the tokenizer since it began: 200 with an empty body
//!   if so, else 503. So a healthy answer takes about a second; a stuck scheduler is answered
//!   503 only after 20 s (the agent's `health_collector_timeout`, 5 s, times out first, and a
//!   timed-out `/health` is unhealthy as for every kind); and a busy engine whose other
//!   requests still produce output says 200 whatever becomes of the probe (sgl-project/sglang
//!   issue 6624: 200 for over an hour after its scheduler crashed under load). Its body is
//!   never read.

use super::{EngineKind, MetricNames, VirtualRequest, openai_completion};
use crate::config::EngineSpec;

/// SGLang.
pub(super) struct Sglang;

/// SGLang's names.
static NAMES: MetricNames = MetricNames {
    prefix: "sglang:",
    running: &["sglang:num_running_reqs"],
    waiting: &["sglang:num_queue_reqs"],
    waiting_for_capacity: None,
    prompt_tokens: &["sglang:prompt_tokens_total"],
    generation_tokens: &["sglang:generation_tokens_total"],
    kv_cache_usage: &["sglang:token_usage"],
    asleep: None,
};

impl EngineKind for Sglang {
    fn metric_names(&self) -> &'static MetricNames {
        &NAMES
    }

    fn virtual_request(&self, spec: &EngineSpec) -> VirtualRequest {
        let mut r = openai_completion(spec.model.as_deref(), spec.qos.probe_max_tokens);
        r.id_field = Some("rid");
        r
    }

    fn virtual_inference(&self, spec: &EngineSpec) -> Result<(), &'static str> {
        match spec.agent_policy_in_force() {
            Some(_) => Ok(()),
            None => Err("virtual inference is not supported for SGLang engines; disabled"),
        }
    }

    fn healthy_body(&self, _body: &str) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// An inline SGLang engine under `policy`, `extra` appended to its table.
    fn spec(policy: &str, extra: &str) -> EngineSpec {
        let text = format!(
            "[[engine]]\nengine_type = \"sglang\"\npolicy = \"{policy}\"\nhost = \"127.0.0.1\"\nport = 30000\nmgmt_port = 9001\n{extra}"
        );
        crate::config::file::parse(&text, std::path::Path::new("/x/a.toml"))
            .unwrap()
            .engines
            .remove(0)
    }

    #[test]
    fn the_request_carries_its_id_in_rid_and_the_model_only_when_configured() {
        let r = Sglang.virtual_request(&spec("agent", ""));
        assert_eq!(
            (r.path, r.stream, r.id_field),
            ("/v1/completions", false, Some("rid"))
        );
        assert_eq!(r.body, json!({"prompt": "1", "max_tokens": 1}));
        let r = Sglang.virtual_request(&spec(
            "agent",
            "served_model_name = \"qwen\"\n[engine.qos]\nprobe_max_tokens = 4\n",
        ));
        assert_eq!(
            r.body,
            json!({"model": "qwen", "prompt": "1", "max_tokens": 4, "stream": true})
        );
        assert!(r.stream);
    }

    // MindIE V5 refuses SGLang (reference §1.2); the agent policy probes it.
    #[test]
    fn virtual_inference_applies_under_the_agent_policy_only() {
        assert_eq!(Sglang.virtual_inference(&spec("agent", "")), Ok(()));
        let refused = Sglang.virtual_inference(&spec("reference", ""));
        assert_eq!(
            refused,
            Err("virtual inference is not supported for SGLang engines; disabled")
        );
    }

    // SGLang v0.5.23's names and labels (shape from its metrics collector, served through
    // prometheus_client's multiprocess collector: labels sorted, no `_created` lines); the
    // token counters are split by `is_streaming` and summed.
    const SGLANG: &str = r#"
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 3.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 1.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 0.12
# HELP sglang:gen_throughput The generation throughput (token/s).
# TYPE sglang:gen_throughput gauge
sglang:gen_throughput{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 41.5
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{engine_type="unified",is_streaming="false",model_name="m"} 1234.0
sglang:prompt_tokens_total{engine_type="unified",is_streaming="true",model_name="m"} 66.0
# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{engine_type="unified",is_streaming="true",model_name="m"} 56.0
sglang:time_to_first_token_seconds_count{engine_type="unified",is_streaming="true",model_name="m"} 1.0
vllm:num_requests_running{engine="0",model_name="m"} 9.0
"#;

    // Its series map into the neutral figures the rules read; a vLLM name is not its own.
    #[test]
    fn its_series_map_into_the_neutral_metrics() {
        use crate::probe::engine_metrics::{Sources, parse_as};
        let m = parse_as(SGLANG, &[&NAMES]);
        assert_eq!(m.running, Some(3.0), "vLLM's 9 is another kind's series");
        assert_eq!(m.waiting, Some(1.0));
        assert_eq!(m.kv_cache_usage, Some(0.12));
        assert_eq!(m.prompt_tokens, Some(1300.0), "both is_streaming values");
        assert_eq!(m.generation_tokens, Some(56.0));
        assert_eq!(m.waiting_for_capacity, None, "SGLang has no such series");
        assert_eq!(m.asleep, None);
        assert_eq!(
            m.sources,
            Sources {
                running: Some("sglang:num_running_reqs"),
                waiting: Some("sglang:num_queue_reqs"),
                waiting_for_capacity: None,
                prompt_tokens: Some("sglang:prompt_tokens_total"),
                generation_tokens: Some("sglang:generation_tokens_total"),
                kv_cache_usage: Some("sglang:token_usage"),
            }
        );
    }

    #[test]
    fn any_2xx_health_is_healthy() {
        assert!(Sglang.healthy_body(""));
        assert!(Sglang.healthy_body("false"), "SGLang never answers a body");
    }
}

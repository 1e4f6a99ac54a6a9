//! vLLM's OpenAI server (`vllm serve`), every release from 0.8.5: the kind the reference
//! (MindIE V5) probes.
//!
//! - **Metrics** (docs/real-vllm.md has the table per release): `vllm:kv_cache_usage_perc`
//!   from 0.11 (0.9.2–0.10.2 export it beside `vllm:gpu_cache_usage_perc`, 0.8.5 only the old
//!   name); the token counters as `_total` (older exporters without the suffix);
//!   `vllm:num_requests_waiting_by_reason{reason="capacity"}` from 0.20.2 (absent in 0.18.0);
//!   `vllm:engine_sleep_state` from 0.18. Every series carries `engine` (one value per
//!   data-parallel engine) and `model_name`.
//! - **Virtual request**: the reference's (§1.8), `POST /v1/completions` with
//!   `{"model", "prompt": "1", "max_tokens": 1}` and `X-Request-Id: <unix µs>_virtual`, plus
//!   `kv_transfer_params` with `do_virtual: true` for a layerwise (trigger) decode engine,
//!   which vllm-ascend's layerwise connector honours from v0.18.0rc1.
//! - **Virtual inference** applies (the reference's own kind).
//! - **`/health`**: 200 with an empty body; a dead engine core answers 503 (500 up to 0.10.2;
//!   200 on 0.8.5, whose V1 `check_health` never raises). A hung engine core keeps answering
//!   200: the gap virtual inference fills. The body is read with the reference's rule (not
//!   exactly `false`), because in MindIE's `user_config.json` `engine_type = "vllm"` names the
//!   engine behind MindIE's engine server, which answers JSON `true`/`false` on the same
//!   surface ([`super::mindie`]).

use super::{EngineKind, Labelled, MetricNames, VirtualRequest, not_false, openai_completion};
use crate::config::EngineSpec;
use crate::config::mindie::{DispatchProfile, Role};
use serde_json::json;

/// vLLM.
pub(super) struct Vllm;

/// vLLM's names, current first.
pub(super) static NAMES: MetricNames = MetricNames {
    prefix: "vllm:",
    running: &["vllm:num_requests_running"],
    waiting: &["vllm:num_requests_waiting"],
    waiting_for_capacity: Some(Labelled {
        name: "vllm:num_requests_waiting_by_reason",
        label: "reason",
        value: "capacity",
    }),
    prompt_tokens: &["vllm:prompt_tokens_total", "vllm:prompt_tokens"],
    generation_tokens: &["vllm:generation_tokens_total", "vllm:generation_tokens"],
    kv_cache_usage: &["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"],
    asleep: Some(Labelled {
        name: "vllm:engine_sleep_state",
        label: "sleep_state",
        value: "awake",
    }),
};

impl EngineKind for Vllm {
    fn metric_names(&self) -> &'static MetricNames {
        &NAMES
    }

    fn virtual_request(&self, spec: &EngineSpec) -> VirtualRequest {
        vllm_request(spec)
    }

    fn virtual_inference(&self, _spec: &EngineSpec) -> Result<(), &'static str> {
        Ok(())
    }

    fn healthy_body(&self, body: &str) -> bool {
        not_false(body)
    }
}

/// The reference's request to vLLM (also what MindIE's engine server forwards to it): the
/// model always named (empty when none is configured), `kv_transfer_params` for a layerwise
/// decode engine.
pub(super) fn vllm_request(spec: &EngineSpec) -> VirtualRequest {
    let model = spec.model.clone().unwrap_or_default();
    let mut r = openai_completion(Some(&model), spec.qos.probe_max_tokens);
    if spec.role == Role::Decode && spec.dispatch_profile == DispatchProfile::Trigger {
        r.body["kv_transfer_params"] = json!({
            "do_remote_decode": false,
            "do_remote_prefill": true,
            "do_virtual": true,
        });
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    /// An inline vLLM engine serving `m`, `extra` appended to its table.
    fn spec(extra: &str) -> EngineSpec {
        let text = format!(
            "[[engine]]\nengine_type = \"vllm\"\nserved_model_name = \"m\"\nhost = \"127.0.0.1\"\nport = 8000\nmgmt_port = 9001\n{extra}"
        );
        crate::config::file::parse(&text, std::path::Path::new("/x/a.toml"))
            .unwrap()
            .engines
            .remove(0)
    }

    fn body(role: Role, profile: DispatchProfile) -> Value {
        let mut s = spec("");
        (s.role, s.dispatch_profile) = (role, profile);
        Vllm.virtual_request(&s).body
    }

    // test_sim_inference.py: the body per role and profile.
    #[test]
    fn layerwise_decode_body_is_exact() {
        assert_eq!(
            body(Role::Decode, DispatchProfile::Trigger),
            json!({"model": "m", "prompt": "1", "max_tokens": 1,
                   "kv_transfer_params": {"do_remote_decode": false, "do_remote_prefill": true, "do_virtual": true}})
        );
    }

    #[test]
    fn other_roles_and_handoff_decode_send_the_plain_body() {
        let plain = json!({"model": "m", "prompt": "1", "max_tokens": 1});
        for (role, profile) in [
            (Role::Decode, DispatchProfile::Handoff),
            (Role::Decode, DispatchProfile::Unknown),
            (Role::Prefill, DispatchProfile::Trigger),
            (Role::Union, DispatchProfile::Handoff),
        ] {
            assert_eq!(body(role, profile), plain, "{role:?} {profile:?}");
        }
    }

    // probe_max_tokens > 1 asks for that many tokens, streamed; 1 keeps the reference body.
    #[test]
    fn probe_max_tokens_streams_that_many_tokens() {
        let r = Vllm.virtual_request(&spec("[engine.qos]\nprobe_max_tokens = 8\n"));
        assert_eq!(
            (r.path, r.stream, r.id_field),
            ("/v1/completions", true, None)
        );
        assert_eq!(
            r.body,
            json!({"model": "m", "prompt": "1", "max_tokens": 8, "stream": true})
        );
    }

    // Both bodies a vLLM /health answers are healthy; `false` (MindIE's engine server in
    // front of it) is not.
    #[test]
    fn health_reads_the_empty_body_and_the_references_false() {
        assert!(Vllm.healthy_body(""));
        assert!(Vllm.healthy_body("true"));
        assert!(!Vllm.healthy_body("FALSE"));
        assert!(
            Vllm.healthy_body("false\n"),
            "not trimmed, as the reference"
        );
        assert_eq!(Vllm.virtual_inference(&spec("")), Ok(()));
    }
}

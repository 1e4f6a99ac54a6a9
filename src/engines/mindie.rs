//! MindIE's engine server (mindie-motor 3.0.0b2, `motor/engine_server/core/http_server.py`):
//! MindIE's own HTTP server in front of vLLM's engine client, on the engine's inference port
//! (`engine_type = "mindie"` inline; in MindIE's `user_config.json` the same deployment is
//! `engine_type = "vllm"`, naming the engine behind it, which [`super::vllm`] reads the same
//! way).
//!
//! - **Metrics**: none on its inference surface (`GET /metrics` answers 404, so each scrape is
//!   "unknown" and the QoS score rests on the probe's latency). The names are vLLM's, the
//!   engine behind it, should a release forward them.
//! - **Virtual request**: vLLM's ([`super::vllm::vllm_request`]): the engine server forwards
//!   the OpenAI completion to vLLM's engine client, `kv_transfer_params` included.
//! - **Virtual inference** applies: this is the server MindIE V5's own virtual inference
//!   probes (reference §1).
//! - **`/health`**: 200 with JSON `true` while vLLM's engine client is healthy, 200 with JSON
//!   `false` once it is not; the reference's HealthCollector (§3.4) reads `false` (lower-cased,
//!   not trimmed) as unhealthy.

use super::{EngineKind, MetricNames, VirtualRequest, not_false};
use crate::config::EngineSpec;

/// MindIE's engine server.
pub(super) struct EngineServer;

impl EngineKind for EngineServer {
    fn metric_names(&self) -> &'static MetricNames {
        &super::vllm::NAMES
    }

    fn virtual_request(&self, spec: &EngineSpec) -> VirtualRequest {
        super::vllm::vllm_request(spec)
    }

    fn virtual_inference(&self, _spec: &EngineSpec) -> Result<(), &'static str> {
        Ok(())
    }

    fn healthy_body(&self, body: &str) -> bool {
        not_false(body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // test_health_collector.py: `true` healthy, `false` (any case) not.
    #[test]
    fn health_is_a_json_boolean() {
        assert!(EngineServer.healthy_body("true"));
        assert!(!EngineServer.healthy_body("false"));
        assert!(!EngineServer.healthy_body("False"));
    }
}

//! The engines wing: what the agent knows of each kind of inference engine, behind one trait
//! ([`EngineKind`]) and listed once ([`of`]).
//!
//! A kind is one file: the Prometheus names of the series the agent reads ([`MetricNames`],
//! which the probe's `engine_metrics` maps into the one neutral `EngineMetrics` the
//! rules read), its virtual request ([`VirtualRequest`]), whether virtual inference applies to
//! it (and why not), and what its `/health` answer means. The rest of the agent never asks
//! which kind it has: the HTTP client (the probe's `EngineClient`) sends the kind's
//! request, scrapes with its names and reads `/health` its way, and the virtual-inference gate
//! (the monitor's `gates`) asks it. The kinds hold data and pure functions; they name the
//! configuration and nothing that runs.

mod mindie;
mod sglang;
mod vllm;

use crate::config::EngineSpec;
use crate::config::engine_type::EngineType;
use serde_json::{Value, json};

/// One kind of inference engine, as the agent talks to it.
///
/// The virtual request must be answered in OpenAI's completion shape (a JSON body, or, when
/// it asks to stream, server-sent events whose tokens are `choices` and which end with
/// `[DONE]`): that is what the probe's HTTP client times and checks.
pub trait EngineKind: Send + Sync + 'static {
    /// The names of the series the agent reads from the engine's `/metrics`.
    fn metric_names(&self) -> &'static MetricNames;

    /// The virtual request for `spec` (its role, model and `probe_max_tokens`).
    fn virtual_request(&self, spec: &EngineSpec) -> VirtualRequest;

    /// Whether virtual inference applies to `spec` of this kind; `Err` says why not (shown
    /// as the `engine_type` condition's note).
    fn virtual_inference(&self, spec: &EngineSpec) -> Result<(), &'static str>;

    /// Whether a 2xx `/health` answer with `body` says the engine is healthy (a non-2xx
    /// answer is unhealthy for every kind).
    fn healthy_body(&self, body: &str) -> bool;
}

/// The kind of `engine_type`: the list of kinds (a `match`, so the compiler holds it whole).
pub fn of(engine_type: EngineType) -> &'static dyn EngineKind {
    match engine_type {
        EngineType::Vllm => &vllm::Vllm,
        EngineType::Sglang => &sglang::Sglang,
        EngineType::Mindie => &mindie::EngineServer,
    }
}

/// The names one kind exports for each series the agent reads. Where a series has several
/// names (one per release), the first present in a scrape is read.
#[derive(Debug)]
pub struct MetricNames {
    /// What every name below starts with (`vllm:`): a line without it is skipped unread.
    pub prefix: &'static str,
    /// Requests in the running batch (a gauge).
    pub running: &'static [&'static str],
    /// Requests waiting to be scheduled (a gauge).
    pub waiting: &'static [&'static str],
    /// Requests waiting because KV-cache capacity is short: the gauge and its label value.
    pub waiting_for_capacity: Option<Labelled>,
    /// Prefill tokens processed since start (a counter).
    pub prompt_tokens: &'static [&'static str],
    /// Generated tokens since start (a counter).
    pub generation_tokens: &'static [&'static str],
    /// KV-cache usage, 0..1 (a gauge).
    pub kv_cache_usage: &'static [&'static str],
    /// Sleep mode: one series per state, 1 on the current one; `value` is the awake state.
    pub asleep: Option<Labelled>,
}

/// A series whose samples are told apart by one label.
#[derive(Debug)]
pub struct Labelled {
    /// The metric name.
    pub name: &'static str,
    /// The label.
    pub label: &'static str,
    /// The label value that matters.
    pub value: &'static str,
}

/// The virtual request of one engine: where it goes and what it carries.
#[derive(Debug, Clone, PartialEq)]
pub struct VirtualRequest {
    /// Path on the inference surface (`/v1/completions`).
    pub path: &'static str,
    /// The JSON body, without the request id.
    pub body: Value,
    /// The answer streams (`probe_max_tokens` > 1): its tokens are timed.
    pub stream: bool,
    /// A body key that carries the request's id too (`X-Request-Id` always does), for an
    /// engine that takes its id from the body.
    pub id_field: Option<&'static str>,
}

/// The OpenAI completion every kind here sends: prompt `1`, one token (the reference's), or
/// `tokens` streamed when `probe_max_tokens` asks for more; `model` when given.
fn openai_completion(model: Option<&str>, tokens: u32) -> VirtualRequest {
    let mut body = json!({ "prompt": "1", "max_tokens": 1 });
    if let Some(m) = model {
        body["model"] = json!(m);
    }
    if tokens > 1 {
        body["max_tokens"] = json!(tokens);
        body["stream"] = json!(true);
    }
    VirtualRequest {
        path: "/v1/completions",
        body,
        stream: tokens > 1,
        id_field: None,
    }
}

/// The reference's reading of a 2xx `/health` body (§3.4): healthy unless it is exactly
/// `false` after lower-casing (not trimmed).
fn not_false(body: &str) -> bool {
    body.to_lowercase() != "false"
}

#[cfg(test)]
mod tests;

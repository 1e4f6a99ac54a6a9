//! The fake engine held against a real vLLM, and the agent on a real vLLM (`scripts/real-vllm`):
//! the real-engine tests run with `NPU_HEALTH_REAL_VLLM=1` and `--test-threads 1`; without it
//! they skip, and the fake engine's side of the conformance runs.
//! One test binary for the area (docs/ci.md, "Test binaries"); each file is a module.

#[path = "../support/mod.rs"]
mod support;

mod engine_conformance;
mod real_vllm;
mod real_vllm_bundle;
mod real_vllm_script;

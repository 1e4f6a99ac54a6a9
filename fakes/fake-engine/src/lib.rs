//! Fakes for the services around the agent: a vLLM-like inference engine with injectable
//! faults ([`engine`]) and Node Manager's heartbeat logic ([`node_manager`]). Used by tests,
//! the chaos suite and `npu-health-agent demo` (feature `fake-driver`).

pub mod engine;
pub mod launch;
pub mod node_manager;
pub mod profile;

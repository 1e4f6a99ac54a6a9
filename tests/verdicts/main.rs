//! The agent's verdicts end to end: the fake engine and the agent binary on the fake driver as
//! real processes, read by a Node Manager emulator, the kubelet's probes, the QoS surfaces and
//! the Kubernetes API stand-in over real sockets.
//! One test binary for the area (docs/ci.md, "Test binaries"); each file is a module.

#[path = "../support/mod.rs"]
mod support;

mod agent_e2e;
mod evidence_bundle;
mod kube_api;
mod kubelet_probes;
mod probe_keepalive;
mod public_fault;
mod qos_e2e;
mod sglang_e2e;
mod shadow_e2e;
mod wire_shapes;

//! The NPU driver through the real dlopen path and the agent binary: the CLI's discovery and
//! sampling on the fake `libdcmi.so` and the fake `npu-smi`, the driver's quiet lies, the
//! fault-code calls and the fault codes as evidence, and the sampler's dedicated thread.
//! One test binary for the area (docs/ci.md, "Test binaries"); each file is a module.

#[path = "../support/mod.rs"]
mod support;

mod dcmi_faults;
mod driver_cli;
mod driver_lies;
mod fault_evidence;
mod sampler_threads;

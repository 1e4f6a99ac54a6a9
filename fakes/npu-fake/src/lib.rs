//! Fakes for hardware we do not have: the scenario model shared by the fake `libdcmi.so`
//! (built by the `fake-dcmi` and `fake-dcmi-legacy` crates through [`export_dcmi!`]) and the
//! fake `npu-smi` ([`npu_smi::run`]). Used only by tests, benchmarks and fake-driver builds.

pub mod dcmi;
pub mod follow;
pub mod npu_smi;
pub mod scenario;

pub use scenario::{Programme, Reading, SCENARIO_ENV, Scenario};

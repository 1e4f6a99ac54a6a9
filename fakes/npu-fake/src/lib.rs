//! Fakes for hardware we do not have: the scenario model shared by the fake `libdcmi.so`
//! (built by the three `fake-dcmi*` crates, current, legacy and pre-release, through
//! [`export_dcmi!`]) and the
//! fake `npu-smi` ([`npu_smi::run`]). Used only by tests, benchmarks and fake-driver builds.

pub mod dcmi;
mod export;
pub mod follow;
pub mod npu_smi;
pub mod scenario;

pub use scenario::{Programme, Reading, SCENARIO_ENV, Scenario};

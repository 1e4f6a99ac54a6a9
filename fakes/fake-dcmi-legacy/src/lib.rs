//! Fake `libdcmi.so` of an older driver: the multi-utilization symbols are absent and
//! utilization type 14 (AI Cube) answers "not supported", so the agent must fall back to
//! `npu-smi`. Behaviour otherwise comes from the scenario named by `FAKE_NPU_SCENARIO`.

npu_fake::export_dcmi!(legacy);

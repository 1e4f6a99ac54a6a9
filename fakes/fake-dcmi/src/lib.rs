//! Fake `libdcmi.so` of a current driver (26.0.RC1 or later): exports every symbol the agent
//! binds, including the AI Cube calls. Behaviour comes from the scenario named by
//! `FAKE_NPU_SCENARIO` (see `docs/fake-driver.md`).

npu_fake::export_dcmi!(current);

//! Fake `libdcmi.so` of a pre-release driver: the multi-utilization call is exported only
//! under its pre-release name `dcmi_get_device_utilization_rate_v2` (MindCluster renamed it
//! to `dcmi_get_device_multi_utilization_rate` in 2026-04). Behaviour otherwise comes from
//! the scenario named by `FAKE_NPU_SCENARIO`.

npu_fake::export_dcmi!(prerelease);

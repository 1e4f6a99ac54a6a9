//! The NPU families of `/metrics`: each chip's figures (under one prefix or both, see
//! [`super::CHIP_PREFIXES`]), its driver faults, its AI Cube window, where each figure comes
//! from, the driver's errors, and the sampler's own health.

use super::{
    CHIP_PREFIXES, ERROR_CODE_FAMILIES, Exposition, HEALTH_GONE, Labels, Pods, family, flag, with,
};
use crate::driver::fault_levels::FaultLevel;
use crate::sampler::DeviceSnapshot;
use crate::sampler::faults::NpuFault;
use crate::window;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;

impl Exposition {
    /// The NPU families, in the order dashboards and tests expect them.
    pub(super) fn encode_npus(
        &self,
        enc: &mut DescriptorEncoder,
        pods: &Pods,
    ) -> Result<(), std::fmt::Error> {
        let now = self.shared.ring.now_ns();
        let snaps: Vec<DeviceSnapshot> = self
            .devices
            .iter()
            .map(|&i| self.shared.devices[usize::from(i)].snapshot(now))
            .collect();
        let prefixes = if self.npu_exporter_names {
            &CHIP_PREFIXES[..]
        } else {
            &CHIP_PREFIXES[..1]
        };
        for prefix in prefixes {
            encode_chip_info(enc, prefix, &snaps, pods)?;
        }
        self.encode_device_faults(enc, &snaps, pods)?;
        self.encode_cube_window(enc, &snaps, pods)?;
        encode_device_sources(enc, &snaps, pods)?;
        self.encode_driver_errors(enc)
    }

    /// The driver's current fault codes by handling level, and whether the device is gone.
    fn encode_device_faults(
        &self,
        enc: &mut DescriptorEncoder,
        snaps: &[DeviceSnapshot],
        pods: &Pods,
    ) -> Result<(), std::fmt::Error> {
        family(
            enc,
            "npu_health_agent_device_fault_level",
            "The driver's current fault codes on the NPU by MindCluster handling level (faultCode.json; unclassified: in no table); only the levels with a code (a healthy NPU has none of these series)",
            MetricType::Gauge,
            snaps
                .iter()
                .zip(&self.devices)
                .filter(|(s, _)| s.faults_age_ms.is_some())
                .flat_map(|(s, &i)| fault_level_rows(s, &self.shared.faults_of(i), pods)),
        )?;
        family(
            enc,
            "npu_health_agent_device_gone",
            "1 while the driver reports the NPU does not exist (health 0xFFFFFFFF); its AI Cube windows are unavailable",
            MetricType::Gauge,
            snaps
                .iter()
                .map(|s| (device_labels(s, pods), flag(s.device_gone))),
        )
    }

    /// The AI Cube figures over the probe window: peak, mean and sample counts.
    fn encode_cube_window(
        &self,
        enc: &mut DescriptorEncoder,
        snaps: &[DeviceSnapshot],
        pods: &Pods,
    ) -> Result<(), std::fmt::Error> {
        let report = window::query(&self.shared.ring, &self.devices, self.window);
        family(
            enc,
            "npu_health_agent_cube_window_peak",
            "Peak AI Cube utilization over the probe window, percent (absent when unavailable)",
            MetricType::Gauge,
            snaps
                .iter()
                .zip(&report.devices)
                .filter_map(|(s, w)| w.peak.map(|p| (device_labels(s, pods), f64::from(p)))),
        )?;
        family(
            enc,
            "npu_health_agent_cube_window_mean",
            "Mean AI Cube utilization over the probe window, percent (absent when unavailable)",
            MetricType::Gauge,
            snaps.iter().zip(&report.devices).filter_map(|(s, w)| {
                w.mean
                    .map(|m| (device_labels(s, pods), round_hundredths(m)))
            }),
        )?;
        family(
            enc,
            "npu_health_agent_cube_window_samples",
            "Samples in the probe window, by validity",
            MetricType::Gauge,
            snaps.iter().zip(&report.devices).flat_map(|(s, w)| {
                [
                    (
                        with(device_labels(s, pods), "valid", "true"),
                        f64::from(w.valid),
                    ),
                    (
                        with(device_labels(s, pods), "valid", "false"),
                        f64::from(w.invalid),
                    ),
                ]
            }),
        )
    }

    /// Failed AI Cube reads of each exposed NPU, by return code.
    fn encode_driver_errors(&self, enc: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        family(
            enc,
            "npu_health_agent_driver_errors",
            "Failed AI Cube reads, by DCMI return code (or agent pseudo code; other = unlisted)",
            MetricType::Counter,
            self.devices.iter().flat_map(|&i| {
                let d = &self.shared.devices[usize::from(i)];
                let base: Labels = vec![("id", d.info.id.to_string())];
                d.errors_by_code().into_iter().map(move |(code, n)| {
                    (
                        with(base.clone(), "code", &error_code_label(code)),
                        n as f64,
                    )
                })
            }),
        )
    }

    pub(super) fn encode_sampler(
        &self,
        enc: &mut DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        let s = &self.shared.sampler;
        family(
            enc,
            "npu_health_agent_sampler_passes",
            "Completed DCMI sampling passes",
            MetricType::Counter,
            [(Labels::new(), s.passes() as f64)],
        )?;
        family(
            enc,
            "npu_health_agent_sampler_overruns",
            "Sampling passes that started more than one period late",
            MetricType::Counter,
            [(Labels::new(), s.overruns() as f64)],
        )?;
        family(
            enc,
            "npu_health_agent_sampler_period_seconds",
            "Configured sampling period",
            MetricType::Gauge,
            [(Labels::new(), self.shared.sampler.period().as_secs_f64())],
        )?;
        family(
            enc,
            "npu_health_agent_samples_written",
            "Samples written to the ring (all NPUs, valid and invalid)",
            MetricType::Counter,
            [(Labels::new(), self.shared.ring.written() as f64)],
        )?;
        let (buckets, count, sum) = s.lateness_histogram();
        enc.encode_descriptor(
            "npu_health_agent_sampler_tick_lateness_seconds",
            "How late each sampling pass started after its deadline (tick jitter)",
            None,
            MetricType::Histogram,
        )?
        .encode_histogram::<NoLabelSet>(sum, count, &buckets, None)?;
        let stale = self.shared.devices.iter().filter(|d| d.is_stale()).count();
        family(
            enc,
            "npu_health_agent_stale_devices",
            "NPUs without a fresh reading",
            MetricType::Gauge,
            [(Labels::new(), stale as f64)],
        )
    }
}

/// The labels of every NPU series: the logic id, the chip name, and its pod's.
fn device_labels(s: &DeviceSnapshot, pods: &Pods) -> Labels {
    let mut l = vec![("id", s.id.to_string()), ("model_name", s.name.clone())];
    l.extend(pods.of_npu(s.id));
    l
}

/// A window mean as exported: two decimals.
fn round_hundredths(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

/// `npu_chip_info_health_status` of a chip: npu-exporter's 1 for health 0, 0 for an alarm,
/// [`HEALTH_GONE`] for a gone device; none when the health is unknown.
fn chip_health_status(s: &DeviceSnapshot) -> Option<f64> {
    if s.device_gone {
        return Some(HEALTH_GONE);
    }
    s.health.map(|h| flag(h == 0))
}

/// npu-exporter's name of the `k`-th error-code family after `prefix`: `error_code`, then
/// `_1` … `_9`.
fn error_code_family(prefix: &str, k: usize) -> String {
    if k == 0 {
        format!("{prefix}error_code")
    } else {
        format!("{prefix}error_code_{k}")
    }
}

/// The `code` label of a driver error count (`other` for the unlisted codes).
fn error_code_label(code: Option<i32>) -> String {
    code.map_or_else(|| "other".to_owned(), |c| c.to_string())
}

/// One row per handling level that has a code among `faults`, with how many it has.
fn fault_level_rows(s: &DeviceSnapshot, faults: &[NpuFault], pods: &Pods) -> Vec<(Labels, f64)> {
    FaultLevel::ALL
        .into_iter()
        .filter_map(|level| {
            let n = faults.iter().filter(|f| f.level == level).count();
            (n > 0).then(|| {
                (
                    with(device_labels(s, pods), "level", level.as_str()),
                    n as f64,
                )
            })
        })
        .collect()
}

/// npu-exporter's families under `prefix` ([`CHIP_PREFIXES`]): utilization, HBM, health and
/// the error codes; the agent's own health code once, with its own prefix.
fn encode_chip_info(
    enc: &mut DescriptorEncoder,
    prefix: &str,
    snaps: &[DeviceSnapshot],
    pods: &Pods,
) -> Result<(), std::fmt::Error> {
    family(
        enc,
        &format!("{prefix}cube_utilization"),
        "AI Cube utilization of the NPU chip, percent (last valid reading)",
        MetricType::Gauge,
        snaps
            .iter()
            .filter_map(|s| s.last_value.map(|v| (device_labels(s, pods), f64::from(v)))),
    )?;
    family(
        enc,
        &format!("{prefix}hbm_used_memory"),
        "HBM in use, MB",
        MetricType::Gauge,
        snaps
            .iter()
            .filter_map(|s| s.hbm_used_mb.map(|v| (device_labels(s, pods), v as f64))),
    )?;
    family(
        enc,
        &format!("{prefix}hbm_total_memory"),
        "HBM total, MB",
        MetricType::Gauge,
        snaps
            .iter()
            .filter_map(|s| s.hbm_total_mb.map(|v| (device_labels(s, pods), v as f64))),
    )?;
    family(
        enc,
        &format!("{prefix}health_status"),
        "1 when the driver reports the chip healthy (health code 0), 0 for an alarm (1-3), 2147483647 when the driver reports the device does not exist (npu-exporter's value for a health it cannot read)",
        MetricType::Gauge,
        snaps
            .iter()
            .filter_map(|s| chip_health_status(s).map(|v| (device_labels(s, pods), v))),
    )?;
    if prefix == CHIP_PREFIXES[0] {
        family(
            enc,
            "npu_health_agent_device_health_code",
            "The driver's health code of the chip: 0 normal, 1 minor, 2 major, 3 critical alarm (absent when unknown or gone)",
            MetricType::Gauge,
            snaps
                .iter()
                .filter(|s| !s.device_gone)
                .filter_map(|s| s.health.map(|h| (device_labels(s, pods), f64::from(h)))),
        )?;
    }
    // npu-exporter's error-code gauges: the chip's first ten codes, one family per
    // position, each the code in decimal; none when the chip reports no code
    // (collector_for_npu.go, MaxErrorCodeLen = 10).
    for k in 0..ERROR_CODE_FAMILIES {
        family(
            enc,
            &error_code_family(prefix, k),
            "the npu error code (npu-exporter's name: the k-th of the chip's current fault codes, in decimal)",
            MetricType::Gauge,
            snaps.iter().filter(|s| !s.device_gone).filter_map(|s| {
                s.faults
                    .get(k)
                    .map(|f| (device_labels(s, pods), f64::from(f.code)))
            }),
        )?;
    }
    Ok(())
}

/// Which backend and call serve each NPU's AI Cube figures, and whether they are fresh.
fn encode_device_sources(
    enc: &mut DescriptorEncoder,
    snaps: &[DeviceSnapshot],
    pods: &Pods,
) -> Result<(), std::fmt::Error> {
    family(
        enc,
        "npu_health_agent_device_backend",
        "1 for the backend serving the NPU's AI Cube figures (dcmi, npu-smi, none)",
        MetricType::Gauge,
        snaps.iter().map(|s| {
            (
                with(device_labels(s, pods), "backend", s.backend.as_str()),
                1.0,
            )
        }),
    )?;
    family(
        enc,
        "npu_health_agent_device_source",
        "1 for the call serving the NPU's AI Cube figures (source) and why (reason); see docs/fake-driver.md and docs/driver.md (the fallback chain)",
        MetricType::Gauge,
        snaps.iter().map(|s| {
            let l = with(device_labels(s, pods), "source", &s.source.name());
            (with(l, "reason", s.source_reason.as_str()), 1.0)
        }),
    )?;
    family(
        enc,
        "npu_health_agent_device_stale",
        "1 while the NPU has no fresh reading (hung driver call or silent npu-smi)",
        MetricType::Gauge,
        snaps
            .iter()
            .map(|s| (device_labels(s, pods), flag(s.stale))),
    )
}

//! The monitor's snapshot: what `/status/detail` and `/qos` send of one engine, built here
//! from the monitor's own state, the shared NPU state and the AI Cube window, so the server
//! only serialises what it is handed and the live views render the same pieces
//! ([`Monitor::virtual_inference`]). `/status` does not come here: it reads
//! [`Monitor::verdict`] alone, with no copy per poll.

use super::Monitor;
use crate::config::EngineSpec;
use crate::sampler::Shared;
use crate::sampler::faults::NpuFault;
use crate::window;
use npu_health_wire::{
    DeviceFault, EngineDetail, EngineQos, KubeRecord, QosDevice, StallDetection, VirtualInference,
    Window, WindowDevice,
};
use std::time::Duration;

impl Monitor {
    /// `/status/detail` of the engine over the window `win`. `kubernetes` is what the
    /// Kubernetes API mode keeps of it (an integration's memory, which the monitor holds but
    /// cannot name: the server reads it through the integration).
    pub(crate) fn snapshot(
        &self,
        shared: &Shared,
        win: Duration,
        kubernetes: Option<KubeRecord>,
    ) -> EngineDetail {
        // The devices' state is read at the instant the window ends.
        let now = shared.ring.now_ns();
        let report = window::query(&shared.ring, self.devices(), win);
        let spec = self.spec();
        let verdict = self.verdict();
        EngineDetail {
            engine: spec.name.clone(),
            status: verdict.status,
            reason: verdict.reason,
            role: spec.role,
            policy: spec.policy.value,
            policy_source: spec.policy.source.clone(),
            inference: spec.infer_authority(),
            conditions: self.conditions(),
            health: self.health_detail(),
            virtual_inference: self.virtual_inference(),
            qos: self.qos_from(shared, &report, win),
            window: Window {
                seconds: win.as_secs_f64(),
                peak: report.combined.peak,
                valid: report.combined.valid,
                invalid: report.combined.invalid,
                truncated: report.truncated,
                devices: self.window_devices(shared, &report, now),
            },
            kubernetes,
            routers: self.acted().routers(),
            actions: self.actions(),
            episodes: self.episode_summary().into(),
            evidence: self.evidence(),
            rules: self.rule_records(),
            shadow: self.shadow_record(),
            brake: self.brake_record(),
        }
    }

    /// The QoS object of the engine (`GET /qos`, and `qos` in `/status/detail`): score,
    /// level, components with their inputs and ages, stall detection, and the device signals
    /// (AI Cube peak and mean over the window, HBM over the engine's NPUs). HBM is shown, not
    /// scored: vLLM preallocates the KV cache, so HBM near 90 % is normal (see `docs/qos.md`).
    pub(crate) fn qos_snapshot(&self, shared: &Shared, win: Duration) -> EngineQos {
        let report = window::query(&shared.ring, self.devices(), win);
        self.qos_from(shared, &report, win)
    }

    /// Virtual inference as `/status/detail` shows it, and the live views' failures and last
    /// probe.
    pub(crate) fn virtual_inference(&self) -> VirtualInference {
        let spec = self.spec();
        let hc = &spec.health_check_config;
        let vi = self.vi();
        VirtualInference {
            phase: vi.phase(),
            abnormal: vi.abnormal(),
            abnormal_reason: vi.abnormal_reason(),
            warmup_done: vi.warmup_done(),
            failure_count: vi.failure_count(),
            max_failure_count: hc.max_failure_count,
            failure_limit: failure_limit(spec),
            npu_usage_threshold: hc.npu_usage_threshold,
            interval_s: vi.interval().as_secs_f64(),
            last_probe: vi.last_probe().map(|p| p.record),
            rearms: self.rearms(),
        }
    }

    fn qos_from(&self, shared: &Shared, report: &window::WindowReport, win: Duration) -> EngineQos {
        let q = &self.spec().qos;
        let now = shared.ring.now_ns();
        let (mut used, mut total, mut hbm_devices) = (0u64, 0u64, 0usize);
        for &i in self.devices() {
            let s = shared.devices[usize::from(i)].snapshot(now);
            if let (Some(u), Some(t)) = (s.hbm_used_mb, s.hbm_total_mb) {
                used += u;
                total += t;
                hbm_devices += 1;
            }
        }
        let means: Vec<f64> = report.devices.iter().filter_map(|d| d.mean).collect();
        let mean = (!means.is_empty()).then(|| means.iter().sum::<f64>() / means.len() as f64);
        EngineQos {
            engine: self.spec().name.clone(),
            model: self.spec().model.clone(),
            evicting: self.qos_evicts(),
            stall_detection: StallDetection {
                enabled: q.stall_detection,
                window_s: q.stall_window.as_secs_f64(),
                skip_when_capacity_waiting: q.skip_when_capacity_waiting,
            },
            device: QosDevice {
                window_s: win.as_secs_f64(),
                ai_cube_peak: report.combined.peak,
                ai_cube_mean: mean.map(round2),
                hbm_used_mb: (hbm_devices > 0).then_some(used),
                hbm_total_mb: (hbm_devices > 0).then_some(total),
                hbm_ratio: (hbm_devices > 0 && total > 0)
                    .then(|| ((used as f64 / total as f64) * 1000.0).round() / 1000.0),
                scored: false,
            },
            state: self.qos().report(q),
        }
    }

    /// Each of the engine's NPUs: its window figures beside its sampler state and faults.
    fn window_devices(
        &self,
        shared: &Shared,
        report: &window::WindowReport,
        now: u64,
    ) -> Vec<WindowDevice> {
        let agent = self.spec().agent_policy_in_force().is_some();
        self.devices()
            .iter()
            .zip(&report.devices)
            .map(|(&i, w)| {
                let s = shared.devices[usize::from(i)].snapshot(now);
                WindowDevice {
                    id: s.id,
                    backend: s.backend.as_str().into(),
                    method: s.method.into(),
                    source: s.source.name(),
                    source_reason: s.source_reason,
                    source_note: s.source_note,
                    device_gone: s.device_gone,
                    peak: w.peak,
                    mean: w.mean.map(round2),
                    valid: w.valid,
                    invalid: w.invalid,
                    stale: s.stale,
                    hung: s.hung,
                    last_error: s.last_error,
                    hbm_used_mb: s.hbm_used_mb,
                    hbm_total_mb: s.hbm_total_mb,
                    health: s.health,
                    faults: shared
                        .fault_levels
                        .classify(s.id, &s.faults)
                        .into_iter()
                        .map(|f| device_fault(f, agent))
                        .collect(),
                    faults_age_ms: s.faults_age_ms,
                    faults_error: s.faults_error,
                }
            })
            .collect()
    }
}

/// `f` as an engine under the agent policy (`agent`) or the reference sees it.
pub(crate) fn device_fault(f: NpuFault, agent: bool) -> DeviceFault {
    let effect = super::evidence::driver_faults::fault_effect(agent, f.level);
    DeviceFault {
        code: f.code,
        hex: f.hex,
        text: f.text,
        level: f.level,
        effect,
        note: effect.describe().to_owned(),
    }
}

fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

/// The counted failures that make `spec`'s engine abnormal under its policy: the agent
/// policy's `confirm_failures` when lower than `max_failure_count` (a confirmed failure
/// reaches it; an unconfirmed one still counts toward `max_failure_count`), else
/// `max_failure_count`, the reference's.
pub(crate) fn failure_limit(spec: &EngineSpec) -> i64 {
    let max = spec.health_check_config.max_failure_count;
    spec.agent_policy_in_force()
        .map_or(max, |a| max.min(i64::from(a.confirm_failures)))
}

#[cfg(test)]
mod tests {
    use super::failure_limit;

    // Issue 48: the page read "failures 2/6" at `abnormal` under the agent policy, whose
    // limit is 2 (`confirm_failures`); 6 is the reference's `max_failure_count`.
    #[test]
    fn the_failure_limit_is_the_policy_in_force() {
        let spec = |policy: &str, extra: &str| {
            let text = format!(
                "[agent]\npolicy = \"{policy}\"\n[[engine]]\nname = \"a\"\nengine_type = \"vllm\"\nserved_model_name = \"m\"\nhost = \"127.0.0.1\"\nport = 8000\nmgmt_port = 9001\n{extra}"
            );
            crate::config::file::parse(&text, std::path::Path::new("/x/agent.toml"))
                .unwrap()
                .engines
                .remove(0)
        };
        let hc = "[engine.health_check_config]\nmax_failure_count = 1\n";
        let rows = [
            (spec("agent", ""), 2),
            (spec("reference", ""), 6),
            (spec("agent", hc), 1),
            (
                spec("agent", "[engine.agent_policy]\nconfirm_failures = 4\n"),
                4,
            ),
        ];
        for (spec, want) in rows {
            assert_eq!(failure_limit(&spec), want, "{:?}", spec.policy);
        }
    }
}

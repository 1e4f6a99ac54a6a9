//! The restart-loop families of `/metrics`: each engine's `abnormal` episodes of the last hour
//! and day and whether they escalated, and the same per NPU through the engines that run on
//! it (docs/runbook.md, "NpuHealthEngineRestartLoop"); and each rule's firings, in force and
//! from the shadow (docs/policy.md, "Modes").

use super::engines::engine_labels;
use super::{Exposition, Labels, Pods, family, flag, with};
use crate::monitor::episodes::Summary;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;
use std::collections::BTreeMap;

impl Exposition {
    /// Each rule's firings per engine: in force (`mode="enforce"`) and from the shadow
    /// (`mode="observe"`: it would have changed the verdict); `rule="reference"` for the
    /// reference's own rules (docs/policy.md, "Modes").
    pub(super) fn encode_rules(
        &self,
        enc: &mut DescriptorEncoder,
        pods: &Pods,
    ) -> Result<(), std::fmt::Error> {
        let mut rows = Vec::new();
        for e in &self.engines {
            let labels = engine_labels(e, pods);
            let rule = |id: &str, mode: &str| with(with(labels.clone(), "rule", id), "mode", mode);
            for r in e.rule_records().iter().filter(|r| r.mode != "off") {
                let id = r.id.to_string();
                rows.push((rule(&id, "enforce"), r.fired as f64));
                if r.mode == "observe" || e.spec().judging.shadow.is_some() {
                    rows.push((rule(&id, "observe"), r.would_have as f64));
                }
            }
            let (fired, would) = e.reference_fired();
            rows.push((rule("reference", "enforce"), fired as f64));
            if e.spec().judging.shadow.is_some() {
                rows.push((rule("reference", "observe"), would as f64));
            }
        }
        family(
            enc,
            "npu_health_agent_rule_fired",
            "times a rule of docs/policy.md turned the engine abnormal (mode=enforce), or would have changed /status from the shadow (mode=observe: a rule in observe, or shadow_policy); rule is its number, or reference",
            MetricType::Counter,
            rows,
        )
    }

    /// Episodes and escalation, per engine and per NPU.
    pub(super) fn encode_episodes(
        &self,
        enc: &mut DescriptorEncoder,
        pods: &Pods,
    ) -> Result<(), std::fmt::Error> {
        let engines: Vec<(Labels, Summary, &[u16])> = self
            .engines
            .iter()
            .map(|e| (engine_labels(e, pods), e.episode_summary(), e.devices()))
            .collect();
        family(
            enc,
            "npu_health_agent_engine_abnormal_episodes",
            "abnormal episodes of the engine begun in the last hour (window=1h) and day (window=1d); the memory survives agent restarts",
            MetricType::Gauge,
            engines.iter().flat_map(|(l, s, _)| windows(l, s)),
        )?;
        family(
            enc,
            "npu_health_agent_engine_escalated",
            "1 while the engine is in a restart loop: agent_policy.escalate_after abnormal episodes within escalate_window, and no clean window since",
            MetricType::Gauge,
            engines
                .iter()
                .map(|(l, s, _)| (l.clone(), flag(s.escalated))),
        )?;
        // Per NPU: the episodes of every engine that runs on it, by the NPU's logic id.
        let mut npus: BTreeMap<u16, (usize, usize, bool)> = BTreeMap::new();
        for (_, s, devices) in &engines {
            for d in devices.iter().filter(|d| self.devices.contains(d)) {
                let n = npus.entry(*d).or_default();
                n.0 += s.last_hour;
                n.1 += s.last_day;
                n.2 |= s.escalated;
            }
        }
        let npu = |ring: u16| {
            let id = pods
                .ids
                .get(usize::from(ring))
                .copied()
                .unwrap_or(ring.into());
            let mut l = vec![("id", id.to_string())];
            l.extend(pods.of_npu(id));
            l
        };
        family(
            enc,
            "npu_health_agent_npu_abnormal_episodes",
            "abnormal episodes of the engines on the NPU begun in the last hour (window=1h) and day (window=1d)",
            MetricType::Gauge,
            npus.iter().flat_map(|(&d, &(hour, day, _))| {
                [
                    (with(npu(d), "window", "1h"), hour as f64),
                    (with(npu(d), "window", "1d"), day as f64),
                ]
            }),
        )?;
        family(
            enc,
            "npu_health_agent_npu_escalated",
            "1 while an engine on the NPU is in a restart loop",
            MetricType::Gauge,
            npus.iter().map(|(&d, &(_, _, esc))| (npu(d), flag(esc))),
        )
    }
}

/// The engine's two windows as rows.
fn windows(l: &Labels, s: &Summary) -> [(Labels, f64); 2] {
    [
        (with(l.clone(), "window", "1h"), s.last_hour as f64),
        (with(l.clone(), "window", "1d"), s.last_day as f64),
    ]
}

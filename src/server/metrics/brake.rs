//! The fleet brake's families of `/metrics` (docs/kubernetes.md, "The fleet brake"): per
//! braked engine, whether the fleet's brake was engaged at the agent's last look, and the
//! agent-rule verdicts it held and let through. Absent for engines without the brake.

use super::engines::engine_labels;
use super::{Exposition, Pods, family, flag};
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;

impl Exposition {
    /// The brake's gauge and counters, per braked engine.
    pub(super) fn encode_brake(
        &self,
        enc: &mut DescriptorEncoder,
        pods: &Pods,
    ) -> Result<(), std::fmt::Error> {
        let rows: Vec<_> = self
            .engines
            .iter()
            .filter_map(|e| Some((engine_labels(e, pods), e.brake_record()?)))
            .collect();
        if rows.is_empty() {
            return Ok(());
        }
        family(
            enc,
            "npu_health_agent_brake_engaged",
            "1 while the fleet brake was engaged at the agent's last look at its shared state: more than max_fraction of the fleet's engines went abnormal through the agent's rules within window",
            MetricType::Gauge,
            rows.iter().map(|(l, r)| (l.clone(), flag(r.engaged))),
        )?;
        family(
            enc,
            "npu_health_agent_brake_holds",
            "agent-rule verdicts the fleet brake held (engaged, or the shared state unreachable): /status answered as the reference",
            MetricType::Counter,
            rows.iter().map(|(l, r)| (l.clone(), r.holds as f64)),
        )?;
        family(
            enc,
            "npu_health_agent_brake_acted",
            "agent-rule verdicts the fleet brake let through",
            MetricType::Counter,
            rows.iter().map(|(l, r)| (l.clone(), r.acted as f64)),
        )
    }
}

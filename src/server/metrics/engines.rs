//! The engine families of `/metrics`: each engine's verdict and state, the answers its
//! integrations gave, the actions they took, its probes, its QoS score and level, and its
//! histograms.

use super::{COUNTED_FAILURES, Exposition, Labels, Pods, family, flag, with};
use crate::integrations::Answers;
use crate::integrations::kubernetes::told::{Outcome, PodAction};
use crate::monitor::journal::Told;
use crate::monitor::verdict::HealthState;
use crate::monitor::vi_state::ViState;
use crate::monitor::{Monitor, Status};
use npu_health_wire::Level;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use std::collections::BTreeMap;

impl Exposition {
    /// The engine families, in the order dashboards and tests expect them.
    pub(super) fn encode_engines(
        &self,
        enc: &mut DescriptorEncoder,
        pods: &Pods,
    ) -> Result<(), std::fmt::Error> {
        self.encode_answers(enc, pods)?;
        self.encode_actions(enc, pods)?;
        self.encode_evidence(enc, pods)?;
        self.encode_probes(enc, pods)?;
        self.encode_qos(enc, pods)?;
        self.encode_episodes(enc, pods)?;
        self.encode_rules(enc, pods)?;
        self.encode_brake(enc, pods)?;
        self.encode_engine_histograms(enc, pods)
    }

    /// What the agent answers about each engine: the verdict, `/readyz` and `/livez`.
    fn encode_answers(
        &self,
        enc: &mut DescriptorEncoder,
        pods: &Pods,
    ) -> Result<(), std::fmt::Error> {
        family(
            enc,
            "npu_health_agent_status",
            "1 for the verdict /status serves (initial, normal, abnormal)",
            MetricType::Gauge,
            self.engines.iter().flat_map(|e| {
                let current = e.peek_status();
                [Status::Initial, Status::Normal, Status::Abnormal].map(|st| {
                    (
                        with(engine_labels(e, pods), "status", st.as_str()),
                        flag(st == current),
                    )
                })
            }),
        )?;
        let answers: Vec<(Labels, Answers)> = self
            .engines
            .iter()
            .map(|e| (engine_labels(e, pods), Answers::of(e)))
            .collect();
        family(
            enc,
            "npu_health_agent_ready",
            "1 while /readyz answers 200 (the engine should take new requests), 0 while it answers 503",
            MetricType::Gauge,
            answers
                .iter()
                .map(|(l, a)| (l.clone(), flag(a.readiness.ready))),
        )?;
        family(
            enc,
            "npu_health_agent_live",
            "1 while /livez answers 200, 0 while it answers 503 (the kubelet restarts the engine's container)",
            MetricType::Gauge,
            answers
                .iter()
                .map(|(l, a)| (l.clone(), flag(a.liveness.live))),
        )
    }

    /// What the integrations did or were told: Kubernetes API calls and router states.
    fn encode_actions(
        &self,
        enc: &mut DescriptorEncoder,
        pods: &Pods,
    ) -> Result<(), std::fmt::Error> {
        family(
            enc,
            "npu_health_agent_kubernetes_actions",
            "Kubernetes API calls that act on the engine's pod, by action (condition, eviction, mindcluster_annotation) and outcome (done, refused, failed, pod_gone); present with [agent.kubernetes] only",
            MetricType::Counter,
            self.engines.iter().flat_map(|e| {
                crate::integrations::kubernetes::memory::record(e)
                    .map(|k| kubernetes_action_rows(&engine_labels(e, pods), &k.totals))
                    .unwrap_or_default()
            }),
        )?;
        // The agent's Events, mode-wide: present once an engine has the mode's record.
        let mode_on = self
            .engines
            .iter()
            .any(|e| crate::integrations::kubernetes::memory::record(e).is_some());
        family(
            enc,
            "npu_health_agent_kubernetes_events",
            "Kubernetes Events the agent wrote about its engines' pods, by outcome (created, patched: a series count, failed: refused or unanswered after 12 tries, dropped: the queue was full); present with [agent.kubernetes] only",
            MetricType::Counter,
            mode_on
                .then(|| crate::integrations::kubernetes::events::Counts::global().rows())
                .into_iter()
                .flatten()
                .map(|(outcome, n)| (vec![("outcome", outcome.to_owned())], n as f64)),
        )?;
        family(
            enc,
            "npu_health_agent_router_state",
            "1 for the state the agent last told each router that polls it about the engine (haproxy: ready, queue, drain, maint, down; envoy: healthy, degraded, unhealthy); absent until the router polls",
            MetricType::Gauge,
            self.engines.iter().flat_map(|e| {
                let seen = e.acted().routers_told();
                crate::integrations::REGISTRY
                    .iter()
                    .filter_map(|router| {
                        let now = seen.get(&router.id())?.told;
                        let l = with(engine_labels(e, pods), "router", router.id().as_str());
                        Some(one_hot(
                            &l,
                            "state",
                            router.router_states(),
                            now,
                            Told::word,
                        ))
                    })
                    .flatten()
                    .collect::<Vec<_>>()
            }),
        )
    }

    /// The evidence bundles kept at the engine's verdicts (`crate::bundles`).
    fn encode_evidence(
        &self,
        enc: &mut DescriptorEncoder,
        pods: &Pods,
    ) -> Result<(), std::fmt::Error> {
        let kept: Vec<(Labels, npu_health_wire::EvidenceRecord)> = self
            .engines
            .iter()
            .map(|e| (engine_labels(e, pods), e.evidence()))
            .collect();
        family(
            enc,
            "npu_health_agent_evidence_bundles",
            "evidence bundles of the engine's verdicts, by outcome: written, failed (the directory is a file, cannot be written, read-only), skipped (free space below evidence_min_free)",
            MetricType::Counter,
            kept.iter().flat_map(|(l, r)| {
                [
                    ("written", r.written),
                    ("failed", r.failed),
                    ("skipped", r.skipped),
                ]
                .map(|(o, n)| (with(l.clone(), "outcome", o), n as f64))
            }),
        )?;
        family(
            enc,
            "npu_health_agent_evidence_last_bundle_bytes",
            "the size of the engine's last evidence bundle written (its path is /status/detail's evidence.last_path); 0 until one is",
            MetricType::Gauge,
            kept.iter().map(|(l, r)| (l.clone(), r.last_bytes as f64)),
        )
    }

    /// The engine's own health and the virtual inference probes.
    fn encode_probes(
        &self,
        enc: &mut DescriptorEncoder,
        pods: &Pods,
    ) -> Result<(), std::fmt::Error> {
        family(
            enc,
            "npu_health_agent_engine_reachable",
            "1 while the engine's /health answers healthy (or is slow while the engine serves)",
            MetricType::Gauge,
            self.engines.iter().map(|e| {
                (
                    engine_labels(e, pods),
                    flag(reachable(e.health_detail().state)),
                )
            }),
        )?;
        family(
            enc,
            "npu_health_agent_virtual_probes",
            "Virtual inference requests (warm-up included), by outcome",
            MetricType::Counter,
            self.engines.iter().flat_map(|e| {
                let (ok, failed) = e.vi().outcomes();
                [
                    (
                        with(engine_labels(e, pods), "outcome", "success"),
                        ok as f64,
                    ),
                    (
                        with(engine_labels(e, pods), "outcome", "failure"),
                        failed as f64,
                    ),
                ]
            }),
        )?;
        family(
            enc,
            COUNTED_FAILURES,
            "Current virtual inference failure count (abnormal at max_failure_count)",
            MetricType::Gauge,
            self.engines
                .iter()
                .map(|e| (engine_labels(e, pods), e.vi().failure_count() as f64)),
        )
    }

    /// The QoS score, its level and components, and how long the engine has stalled.
    fn encode_qos(&self, enc: &mut DescriptorEncoder, pods: &Pods) -> Result<(), std::fmt::Error> {
        family(
            enc,
            "inference_node_health",
            "QoS score of the engine in [0, 1] (absent until there is one); see docs/qos.md",
            MetricType::Gauge,
            self.engines.iter().filter_map(|e| {
                let mut l: Labels = vec![
                    ("model", e.spec().model.clone().unwrap_or_default()),
                    ("engine", e.spec().name.clone()),
                ];
                l.extend(pods.of_engine(e));
                Some((l, e.qos().score()?))
            }),
        )?;
        family(
            enc,
            "npu_health_agent_qos_level",
            "1 for the engine's QoS level (normal, throttle, degrade, evict)",
            MetricType::Gauge,
            self.engines
                .iter()
                .filter(|e| e.spec().qos.enabled)
                .flat_map(|e| {
                    one_hot(
                        &engine_labels(e, pods),
                        "level",
                        Level::ALL,
                        e.qos().level(),
                        Level::as_str,
                    )
                }),
        )?;
        family(
            enc,
            "npu_health_agent_qos_component",
            "Score of each QoS component in [0, 1] (absent when its input is missing)",
            MetricType::Gauge,
            self.engines.iter().flat_map(|e| {
                e.qos().components().into_iter().filter_map(|c| {
                    Some((with(engine_labels(e, pods), "component", &c.name), c.score?))
                })
            }),
        )?;
        family(
            enc,
            "npu_health_agent_engine_stalled_seconds",
            "How long the engine has had requests running and no token advancing (0 when not stalled)",
            MetricType::Gauge,
            self.engines
                .iter()
                .filter(|e| e.spec().qos.scrapes())
                .map(|e| {
                    (
                        engine_labels(e, pods),
                        e.qos().stalled_for().map_or(0.0, |d| d.as_secs_f64()),
                    )
                }),
        )
    }

    /// The per-engine histograms: probe latency and detection time.
    fn encode_engine_histograms(
        &self,
        enc: &mut DescriptorEncoder,
        pods: &Pods,
    ) -> Result<(), std::fmt::Error> {
        type Read = fn(&ViState) -> (Vec<(f64, u64)>, u64, f64);
        let histograms: [(&str, &str, Read); 2] = [
            (
                "npu_health_agent_virtual_probe_duration_seconds",
                "Latency of virtual inference requests",
                |vi| vi.latency_histogram(),
            ),
            (
                "npu_health_agent_detection_seconds",
                "For each abnormal verdict, the time from the start of the first failed virtual request that led to it (since this agent started)",
                |vi| vi.detection_histogram(),
            ),
        ];
        // Like `family`, no descriptor without a series.
        if self.engines.is_empty() {
            return Ok(());
        }
        for (metric, help, read) in histograms {
            let mut m = enc.encode_descriptor(metric, help, None, MetricType::Histogram)?;
            for e in &self.engines {
                let (buckets, count, sum) = read(e.vi());
                m.encode_family(&engine_labels(e, pods))?
                    .encode_histogram::<NoLabelSet>(sum, count, &buckets, None)?;
            }
        }
        Ok(())
    }
}

/// The labels of every engine series: its name, and its pod's.
pub(super) fn engine_labels(e: &Monitor, pods: &Pods) -> Labels {
    let mut l = vec![("engine", e.spec().name.clone())];
    l.extend(pods.of_engine(e));
    l
}

/// One row per state in `states`, labelled `key` = its word: 1 for `current`, 0 for the rest.
fn one_hot<T: PartialEq + Copy>(
    base: &Labels,
    key: &'static str,
    states: impl IntoIterator<Item = T>,
    current: T,
    word: fn(T) -> &'static str,
) -> Vec<(Labels, f64)> {
    states
        .into_iter()
        .map(|st| (with(base.clone(), key, word(st)), flag(st == current)))
        .collect()
}

/// Every action × outcome pair, with its count in `totals` (0 when absent).
fn kubernetes_action_rows(
    base: &Labels,
    totals: &BTreeMap<PodAction, BTreeMap<Outcome, u64>>,
) -> Vec<(Labels, f64)> {
    PodAction::ALL
        .into_iter()
        .flat_map(|a| {
            Outcome::ALL.into_iter().map(move |o| {
                let l = with(
                    with(base.clone(), "action", a.as_str()),
                    "outcome",
                    o.as_str(),
                );
                let n = totals.get(&a).and_then(|m| m.get(&o)).copied().unwrap_or(0);
                (l, n as f64)
            })
        })
        .collect()
}

/// Whether `/health` counts as reachable: healthy, or slow while the engine serves.
fn reachable(state: HealthState) -> bool {
    matches!(state, HealthState::Healthy | HealthState::Slow)
}

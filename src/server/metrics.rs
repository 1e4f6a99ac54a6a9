//! Prometheus metrics, encoded at scrape time from the shared state (nothing on the sampling
//! or probing path updates a metric object).
//!
//! Every family is prefixed `npu_health_agent_`. The NPU families whose meaning matches Huawei
//! npu-exporter's keep its names after the prefix `npu_health_agent_chip_` (`cube_utilization`,
//! `hbm_used_memory`, `hbm_total_memory`, `health_status`, `error_code` and `_1` … `_9`), and
//! with `[agent] npu_exporter_names` are also exported under npu-exporter's own names
//! (`npu_chip_info_*`) for dashboards written for it, on nodes that do not run it (where it
//! runs, each series would exist twice and a sum would double).

use crate::driver::fault_levels::FaultLevel;
use crate::integrations::Answers;
use crate::integrations::kubernetes::told::{Outcome, PodAction};
use crate::monitor::journal::Told;
use crate::monitor::verdict::HealthState;
use crate::monitor::vi_state::ViState;
use crate::monitor::{Monitor, Status};
use crate::pod_resources::{Assignment, Holder, PodLabels};
use crate::qos::score::Level;
use crate::sampler::faults::NpuFault;
use crate::sampler::{DeviceSnapshot, Shared};
use crate::window;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use strum::IntoEnumIterator;

/// Prometheus text content type.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// `npu_chip_info_health_status` of a device the driver reports gone: npu-exporter's
/// `FailedValue` (`math.MaxInt32`), which it exports when MindCluster's `DcGetDeviceHealth`
/// rejects a health word at or above `MaxInt32`, as `0xFFFFFFFF` is.
pub const HEALTH_GONE: f64 = 2_147_483_647.0;

/// npu-exporter's error-code families per chip (`MaxErrorCodeLen`).
pub const ERROR_CODE_FAMILIES: usize = 10;

/// The counted failures of each engine (the reference's `failure_count`).
pub const COUNTED_FAILURES: &str = "npu_health_agent_counted_failures";

/// Families renamed, `(old, new)`: the old name is still exported for one release, untyped,
/// with the same samples (docs/operator-views.md, "Renamed metrics").
pub const DEPRECATED: [(&str, &str); 1] = [("npu_health_agent_failure_count", COUNTED_FAILURES)];

/// What one `/metrics` endpoint exposes.
#[derive(Debug, Clone)]
pub struct Exposition {
    pub shared: Arc<Shared>,
    pub engines: Vec<Arc<Monitor>>,
    /// Ring indices of the NPUs to expose.
    pub devices: Vec<u16>,
    /// Window of the peak gauge.
    pub window: Duration,
    /// Also npu-exporter's names for the chip families ([`CHIP_PREFIXES`]).
    pub npu_exporter_names: bool,
    /// Who holds each NPU (`[agent] pod_resources_socket`); `None`: no pod labels.
    pub pods: Option<Arc<PodLabels>>,
}

/// The prefixes of the chip families: the agent's own, then npu-exporter's.
pub const CHIP_PREFIXES: [&str; 2] = ["npu_health_agent_chip_", "npu_chip_info_"];

impl Collector for Exposition {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        // One reading of the pod labels for the whole scrape.
        let pods = Pods::of(self);
        self.encode_npus(&mut enc, &pods)?;
        self.encode_sampler(&mut enc)?;
        self.encode_engines(&mut enc, &pods)
    }
}

type Labels = Vec<(&'static str, String)>;

fn family<L: EncodeLabelSet>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    rows: impl IntoIterator<Item = (L, f64)>,
) -> Result<(), std::fmt::Error> {
    let rows: Vec<(L, f64)> = rows.into_iter().collect();
    if rows.is_empty() {
        return Ok(());
    }
    let mut m = enc.encode_descriptor(name, help, None, kind)?;
    for (labels, v) in &rows {
        let mut f = m.encode_family(labels)?;
        match kind {
            MetricType::Counter => f.encode_counter::<NoLabelSet, _, u64>(&(*v as u64), None)?,
            _ => f.encode_gauge(v)?,
        }
    }
    Ok(())
}

impl Exposition {
    /// The NPU families, in the order dashboards and tests expect them.
    fn encode_npus(&self, enc: &mut DescriptorEncoder, pods: &Pods) -> Result<(), std::fmt::Error> {
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

    fn encode_sampler(&self, enc: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
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

    /// The engine families, in the order dashboards and tests expect them.
    fn encode_engines(
        &self,
        enc: &mut DescriptorEncoder,
        pods: &Pods,
    ) -> Result<(), std::fmt::Error> {
        self.encode_answers(enc, pods)?;
        self.encode_actions(enc, pods)?;
        self.encode_probes(enc, pods)?;
        self.encode_qos(enc, pods)?;
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
        family(
            enc,
            "npu_health_agent_router_state",
            "1 for the state the agent last told each router that polls it about the engine (haproxy: ready, queue, drain, maint, down; envoy: healthy, degraded, unhealthy); absent until the router polls",
            MetricType::Gauge,
            self.engines.iter().flat_map(|e| {
                let seen = e.acted.routers_told();
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
                let (ok, failed) = e.vi.outcomes();
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
                .map(|e| (engine_labels(e, pods), e.vi.failure_count() as f64)),
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
                    ("model", e.spec.model.clone().unwrap_or_default()),
                    ("engine", e.spec.name.clone()),
                ];
                l.extend(pods.of_engine(e));
                Some((l, e.qos.score()?))
            }),
        )?;
        family(
            enc,
            "npu_health_agent_qos_level",
            "1 for the engine's QoS level (normal, throttle, degrade, evict)",
            MetricType::Gauge,
            self.engines
                .iter()
                .filter(|e| e.spec.qos.enabled)
                .flat_map(|e| {
                    one_hot(
                        &engine_labels(e, pods),
                        "level",
                        Level::iter(),
                        e.qos.level(),
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
                e.qos.components().into_iter().filter_map(|c| {
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
                .filter(|e| e.spec.qos.scrapes())
                .map(|e| {
                    (
                        engine_labels(e, pods),
                        e.qos.stalled_for().map_or(0.0, |d| d.as_secs_f64()),
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
                let (buckets, count, sum) = read(&e.vi);
                m.encode_family(&engine_labels(e, pods))?
                    .encode_histogram::<NoLabelSet>(sum, count, &buckets, None)?;
            }
        }
        Ok(())
    }

    /// Renamed families under their old names, for one release ([`DEPRECATED`]). Written
    /// by hand: `untyped` (the classic text format's word) keeps `promtool check metrics`
    /// quiet about a non-counter named `_count`, and prometheus-client writes only
    /// OpenMetrics' `unknown`, which Prometheus's classic parser refuses.
    fn encode_deprecated(&self, out: &mut String) {
        use std::fmt::Write;
        if self.engines.is_empty() {
            return;
        }
        let (old, new) = DEPRECATED[0];
        let _ = writeln!(
            out,
            "# HELP {old} Deprecated: renamed {new} (a gauge may not end in _count); this name goes in the next release\n# TYPE {old} untyped"
        );
        for e in &self.engines {
            let _ = writeln!(
                out,
                "{old}{{engine=\"{}\"}} {}",
                escape_label(&e.spec.name),
                e.vi.failure_count()
            );
        }
    }
}

/// The labels of every engine series: its name, and its pod's.
fn engine_labels(e: &Monitor, pods: &Pods) -> Labels {
    let mut l = vec![("engine", e.spec.name.clone())];
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
    PodAction::iter()
        .flat_map(|a| {
            Outcome::iter().map(move |o| {
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

/// The labels of every NPU series: the logic id, the chip name, and its pod's.
fn device_labels(s: &DeviceSnapshot, pods: &Pods) -> Labels {
    let mut l = vec![("id", s.id.to_string()), ("model_name", s.name.clone())];
    l.extend(pods.of_npu(s.id));
    l
}

/// The pod labels of one scrape (issue 42; docs/kubernetes.md, "Pod labels on the NPU
/// series"). Off (`[agent] pod_resources_socket` unset), the series carry none. On, every
/// NPU and engine series carries `namespace`, `pod` and `container`, empty where no pod
/// holds the NPU (or the engine's NPUs are not all one pod's), as npu-exporter writes its
/// own (`namespace`, `pod_name`, `container_name`). The labels' names are written in
/// [`pod_labels`] only.
struct Pods {
    /// The holders in force; `None`: off.
    held: Option<Arc<Assignment>>,
    /// Each ring index's logic id (an engine names its NPUs by ring index).
    ids: Vec<u32>,
}

impl Pods {
    fn of(x: &Exposition) -> Pods {
        Pods {
            held: x.pods.as_ref().map(|p| p.now()),
            ids: x.shared.devices.iter().map(|d| d.info.id).collect(),
        }
    }

    /// The pod labels of the NPU with logic id `id`.
    fn of_npu(&self, id: u32) -> Labels {
        match &self.held {
            None => Labels::new(),
            Some(a) => pod_labels(a.npu(id)),
        }
    }

    /// The pod labels of engine `e`: those of the pod that holds all its NPUs.
    fn of_engine(&self, e: &Monitor) -> Labels {
        let Some(a) = &self.held else {
            return Labels::new();
        };
        let ids: Vec<u32> = e
            .devices
            .iter()
            .filter_map(|&i| self.ids.get(usize::from(i)).copied())
            .collect();
        pod_labels(a.engine(&ids).as_ref())
    }
}

/// `namespace`, `pod`, `container` of `held`, empty when no pod holds it.
fn pod_labels(held: Option<&Holder>) -> Labels {
    let (namespace, pod, container) = held.map_or_else(Default::default, |h| {
        (h.namespace.clone(), h.pod.clone(), h.container.clone())
    });
    vec![
        ("namespace", namespace),
        ("pod", pod),
        ("container", container),
    ]
}

/// `labels` with one more label.
fn with(mut labels: Labels, key: &'static str, value: &str) -> Labels {
    labels.push((key, value.to_owned()));
    labels
}

/// A condition as a gauge value.
fn flag(on: bool) -> f64 {
    if on { 1.0 } else { 0.0 }
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
    FaultLevel::iter()
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

/// A label value in the text format: backslash, double quote and newline escaped.
fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Renders the metrics of `scope` as Prometheus text.
pub fn render(scope: &Exposition) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(scope.clone()));
    let mut out = String::new();
    if let Err(e) = prometheus_client::encoding::prometheus_text::encode(&mut out, &registry) {
        tracing::warn!("metrics encoding failed: {e}");
    }
    scope.encode_deprecated(&mut out);
    out
}

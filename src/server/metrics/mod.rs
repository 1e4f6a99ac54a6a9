//! Prometheus metrics, encoded at scrape time from the shared state (nothing on the sampling
//! or probing path updates a metric object).
//!
//! Every family is prefixed `npu_health_agent_`. The NPU families whose meaning matches Huawei
//! npu-exporter's keep its names after the prefix `npu_health_agent_chip_` (`cube_utilization`,
//! `hbm_used_memory`, `hbm_total_memory`, `health_status`, `error_code` and `_1` … `_9`), and
//! with `[agent] npu_exporter_names` are also exported under npu-exporter's own names
//! (`npu_chip_info_*`) for dashboards written for it, on nodes that do not run it (where it
//! runs, each series would exist twice and a sum would double).

mod brake;
mod engines;
mod episodes;
mod npus;

use crate::monitor::Monitor;
use crate::pod_resources::{Assignment, Holder, PodLabels};
use crate::sampler::Shared;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::sync::Arc;
use std::time::Duration;

/// Prometheus text content type.
pub(crate) const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// `npu_chip_info_health_status` of a device the driver reports gone: npu-exporter's
/// `FailedValue` (`math.MaxInt32`), which it exports when MindCluster's `DcGetDeviceHealth`
/// rejects a health word at or above `MaxInt32`, as `0xFFFFFFFF` is.
pub(crate) const HEALTH_GONE: f64 = 2_147_483_647.0;

/// npu-exporter's error-code families per chip (`MaxErrorCodeLen`).
pub(crate) const ERROR_CODE_FAMILIES: usize = 10;

/// The counted failures of each engine (the reference's `failure_count`).
pub(crate) const COUNTED_FAILURES: &str = "npu_health_agent_counted_failures";

/// Families renamed, `(old, new)`: the old name is still exported for one release, untyped,
/// with the same samples (docs/operator-views.md, "Renamed metrics").
pub(crate) const DEPRECATED: [(&str, &str); 1] =
    [("npu_health_agent_failure_count", COUNTED_FAILURES)];

/// What one `/metrics` endpoint exposes.
#[derive(Debug, Clone)]
pub(crate) struct Exposition {
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
pub(crate) const CHIP_PREFIXES: [&str; 2] = ["npu_health_agent_chip_", "npu_chip_info_"];

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
                escape_label(&e.spec().name),
                e.vi().failure_count()
            );
        }
    }
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
            .devices()
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

/// A label value in the text format: backslash, double quote and newline escaped.
fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Renders the metrics of `scope` as Prometheus text.
pub(crate) fn render(scope: &Exposition) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(scope.clone()));
    let mut out = String::new();
    if let Err(e) = prometheus_client::encoding::prometheus_text::encode(&mut out, &registry) {
        tracing::warn!("metrics encoding failed: {e}");
    }
    scope.encode_deprecated(&mut out);
    out
}

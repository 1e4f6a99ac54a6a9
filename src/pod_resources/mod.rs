//! Which pod holds each NPU, from the kubelet's PodResources API, for the `namespace`, `pod`
//! and `container` labels of the NPU and engine series (issue 42; dcgm-exporter and
//! npu-exporter label theirs the same way).
//!
//! [`grpc`] calls `List` on the kubelet's Unix socket ([`config`'s
//! `pod_resources_socket`](crate::config::PodResourcesSettings)), [`proto`] decodes the
//! answer, keeping at most its bounds of it, [`devices`] maps the Ascend device plugin's
//! device ids to the agent's NPUs, and [`task`] polls, off every request's path, keeping the
//! labels in force in [`PodLabels`] for `/metrics` to read. A hostile socket costs bounded
//! memory and log (issue 48): every step is bounded, not only the answer's bytes.

pub(crate) mod devices;
pub(crate) mod grpc;
pub(crate) mod proto;
mod protowire;
pub(crate) mod task;

pub(crate) use devices::{Assignment, Holder};

use std::sync::{Arc, RwLock};

/// The holders in force: written by the poll, read by each scrape.
#[derive(Debug, Default)]
pub(crate) struct PodLabels {
    current: RwLock<Arc<Assignment>>,
}

impl PodLabels {
    /// The assignment in force now (the readers never wait on the poll).
    pub(crate) fn now(&self) -> Arc<Assignment> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn set(&self, a: Assignment) {
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(a);
    }
}

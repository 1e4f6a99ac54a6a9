//! The Kubernetes API calls the mode makes, behind a trait ([`KubeApi`]) so the loop runs
//! the same against the API server ([`KubeClient`], the `kube` crate) and the tests' scripts:
//! list this node's pods, read one, set one condition on a pod's status (a strategic merge
//! patch of `status.conditions`, merged by `type`, so the kubelet's own conditions stay),
//! create an Eviction (policy/v1), and set one annotation (MindCluster's).
//!
//! Every request has `request_timeout`; kube's own retries are off (they would resend a
//! PDB-refused eviction up to 15 times over minutes): the loop retries, with its back-off.

use crate::config::kubernetes::KubernetesConfig;
use k8s_openapi::api::core::v1::{Pod, PodCondition};
use k8s_openapi::api::policy::v1::Eviction;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;
use std::collections::BTreeMap;
use std::future::Future;

/// A failed API call, classified.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// The API server answered with an error status (`reason`, `message` from its Status).
    #[error("HTTP {code} {reason}: {message}")]
    Status {
        code: u16,
        reason: String,
        message: String,
    },
    /// No usable answer: refused, timed out, TLS, garbage.
    #[error("{0}")]
    Transport(String),
}

impl ApiError {
    /// The HTTP status, when the server answered one.
    pub fn code(&self) -> Option<u16> {
        match self {
            ApiError::Status { code, .. } => Some(*code),
            ApiError::Transport(_) => None,
        }
    }

    /// A PodDisruptionBudget (or the API server's rate limit) refused: try again later.
    pub fn too_many_requests(&self) -> bool {
        matches!(self, ApiError::Status { code: 429, .. })
            || matches!(self, ApiError::Status { reason, .. } if reason == "TooManyRequests")
    }

    fn from_kube(e: kube::Error) -> ApiError {
        match e {
            kube::Error::Api(s) => ApiError::Status {
                code: s.code,
                reason: s.reason.clone(),
                message: s.message.clone(),
            },
            other => ApiError::Transport(one_line(&other)),
        }
    }
}

/// The error and its sources on one line.
fn one_line(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        let more = c.to_string();
        if !s.contains(&more) {
            s.push_str(": ");
            s.push_str(&more);
        }
        src = c.source();
    }
    s
}

/// What the mode needs of a pod.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodInfo {
    pub namespace: String,
    pub name: String,
    pub node: Option<String>,
    pub host_network: bool,
    pub pod_ip: Option<String>,
    /// `(containerPort, hostPort)` of every container.
    pub ports: Vec<(u16, Option<u16>)>,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// Being deleted (`metadata.deletionTimestamp`).
    pub deleting: bool,
    pub phase: Option<String>,
    /// The pod's conditions as `(type, status)`.
    pub conditions: Vec<(String, String)>,
}

impl PodInfo {
    /// From the API's Pod.
    pub fn of(p: &Pod) -> PodInfo {
        let spec = p.spec.as_ref();
        let status = p.status.as_ref();
        let port = |n: i32| u16::try_from(n).ok();
        PodInfo {
            namespace: p.metadata.namespace.clone().unwrap_or_default(),
            name: p.metadata.name.clone().unwrap_or_default(),
            node: spec.and_then(|s| s.node_name.clone()),
            host_network: spec.and_then(|s| s.host_network).unwrap_or(false),
            pod_ip: status.and_then(|s| s.pod_ip.clone()),
            ports: spec
                .map(|s| {
                    s.containers
                        .iter()
                        .flat_map(|c| c.ports.iter().flatten())
                        .filter_map(|cp| {
                            Some((port(cp.container_port)?, cp.host_port.and_then(port)))
                        })
                        .collect()
                })
                .unwrap_or_default(),
            labels: p.metadata.labels.clone().unwrap_or_default(),
            annotations: p.metadata.annotations.clone().unwrap_or_default(),
            deleting: p.metadata.deletion_timestamp.is_some(),
            phase: status.and_then(|s| s.phase.clone()),
            conditions: status
                .and_then(|s| s.conditions.as_ref())
                .map(|cs| {
                    cs.iter()
                        .map(|c| (c.type_.clone(), c.status.clone()))
                        .collect()
                })
                .unwrap_or_default(),
        }
    }

    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// The calls, as the loop makes them.
pub trait KubeApi: Send + Sync {
    /// Pods on `node` (every node when `None`), in `namespace` (every namespace when
    /// `None`), matching `labels` (a label selector) when given.
    fn list_pods(
        &self,
        node: Option<&str>,
        namespace: Option<&str>,
        labels: Option<&str>,
    ) -> impl Future<Output = Result<Vec<PodInfo>, ApiError>> + Send;
    fn get_pod(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<PodInfo, ApiError>> + Send;
    /// Sets one condition in the pod's `status.conditions` (merged by type).
    fn set_condition(
        &self,
        namespace: &str,
        name: &str,
        condition: &PodCondition,
    ) -> impl Future<Output = Result<(), ApiError>> + Send;
    /// Creates an Eviction for the pod.
    fn evict(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<(), ApiError>> + Send;
    /// Sets one annotation on the pod.
    fn annotate(
        &self,
        namespace: &str,
        name: &str,
        key: &str,
        value: &str,
    ) -> impl Future<Output = Result<(), ApiError>> + Send;
}

/// The API server, through `kube`.
#[derive(Clone)]
pub struct KubeClient {
    client: kube::Client,
}

impl std::fmt::Debug for KubeClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KubeClient")
    }
}

/// Field manager named in the agent's patches.
pub const FIELD_MANAGER: &str = "npu-health-agent";

/// The agent's patches: strategic merge, its field manager named.
fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    }
}

impl KubeClient {
    /// A client for `cfg`: its `api_server` (with `token_file`, `ca_file`), else in-cluster.
    /// Fails with a sentence naming what is missing.
    pub fn new(cfg: &KubernetesConfig) -> Result<KubeClient, String> {
        let mut kc = match &cfg.api_server {
            None => kube::Config::incluster().map_err(|e| {
                format!(
                    "no in-cluster Kubernetes config ({}); run in a pod with a service account, or set [agent.kubernetes] api_server",
                    one_line(&e)
                )
            })?,
            Some(url) => {
                let uri = url
                    .parse()
                    .map_err(|e| format!("api_server {url:?}: {e}"))?;
                let mut kc = kube::Config::new(uri);
                if let Some(t) = &cfg.token_file {
                    let text = std::fs::read_to_string(t)
                        .map_err(|e| format!("token_file {}: {e}", t.display()))?;
                    // kube sends the file as it is, and a header cannot hold a newline.
                    if text.trim() != text || text.is_empty() {
                        return Err(format!(
                            "token_file {}: the token must be the file's whole content, without surrounding whitespace or a final newline",
                            t.display()
                        ));
                    }
                    kc.auth_info.token_file = Some(t.display().to_string());
                }
                if let Some(ca) = &cfg.ca_file {
                    let pem = std::fs::read(ca).map_err(|e| format!("ca_file {}: {e}", ca.display()))?;
                    let ders: Vec<Vec<u8>> = rustls_pki_types::pem::PemObject::pem_slice_iter(&pem)
                        .map(|c: Result<rustls_pki_types::CertificateDer<'_>, _>| c.map(|c| c.to_vec()))
                        .collect::<Result<_, _>>()
                        .map_err(|e| format!("ca_file {}: not PEM certificates: {e}", ca.display()))?;
                    if ders.is_empty() {
                        return Err(format!("ca_file {}: no certificate in it", ca.display()));
                    }
                    kc.root_cert = Some(ders);
                }
                kc
            }
        };
        kc.connect_timeout = Some(cfg.request_timeout);
        kc.read_timeout = Some(cfg.request_timeout);
        kc.write_timeout = Some(cfg.request_timeout);
        kc.reset_reader_on_write = true;
        kc.default_retry = false;
        let client = kube::Client::try_from(kc)
            .map_err(|e| format!("Kubernetes client: {}", one_line(&e)))?;
        Ok(KubeClient { client })
    }

    fn pods(&self, namespace: &str) -> Api<Pod> {
        Api::namespaced(self.client.clone(), namespace)
    }
}

impl KubeApi for KubeClient {
    async fn list_pods(
        &self,
        node: Option<&str>,
        namespace: Option<&str>,
        labels: Option<&str>,
    ) -> Result<Vec<PodInfo>, ApiError> {
        let api: Api<Pod> = match namespace {
            Some(ns) => self.pods(ns),
            None => Api::all(self.client.clone()),
        };
        let mut lp = ListParams::default();
        if let Some(n) = node {
            lp = lp.fields(&format!("spec.nodeName={n}"));
        }
        if let Some(l) = labels {
            lp = lp.labels(l);
        }
        let list = api.list(&lp).await.map_err(ApiError::from_kube)?;
        Ok(list.items.iter().map(PodInfo::of).collect())
    }

    async fn get_pod(&self, namespace: &str, name: &str) -> Result<PodInfo, ApiError> {
        self.pods(namespace)
            .get(name)
            .await
            .map(|p| PodInfo::of(&p))
            .map_err(ApiError::from_kube)
    }

    async fn set_condition(
        &self,
        namespace: &str,
        name: &str,
        condition: &PodCondition,
    ) -> Result<(), ApiError> {
        let body = json!({ "status": { "conditions": [condition] } });
        self.pods(namespace)
            .patch_status(name, &patch_params(), &Patch::Strategic(&body))
            .await
            .map(drop)
            .map_err(ApiError::from_kube)
    }

    async fn evict(&self, namespace: &str, name: &str) -> Result<(), ApiError> {
        // Built here rather than with `Api::evict`, which leaves out apiVersion and kind.
        let eviction = Eviction {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(namespace.to_owned()),
                ..ObjectMeta::default()
            },
            delete_options: None,
        };
        let body = serde_json::to_vec(&eviction).map_err(|e| ApiError::Transport(e.to_string()))?;
        let req = http::Request::post(format!(
            "/api/v1/namespaces/{namespace}/pods/{name}/eviction"
        ))
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(body)
        .map_err(|e| ApiError::Transport(e.to_string()))?;
        self.client
            .request::<kube::core::Status>(req)
            .await
            .map(drop)
            .map_err(ApiError::from_kube)
    }

    async fn annotate(
        &self,
        namespace: &str,
        name: &str,
        key: &str,
        value: &str,
    ) -> Result<(), ApiError> {
        let body = json!({ "metadata": { "annotations": { key: value } } });
        self.pods(namespace)
            .patch(name, &patch_params(), &Patch::Strategic(&body))
            .await
            .map(drop)
            .map_err(ApiError::from_kube)
    }
}

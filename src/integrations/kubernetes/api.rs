//! The Kubernetes API calls the mode makes, behind a trait ([`KubeApi`]) so the loop runs
//! the same against the API server ([`KubeClient`], the `kube` crate) and the tests' scripts:
//! list this node's pods, read one, set one condition on a pod's status (a strategic merge
//! patch of `status.conditions`, merged by `type`, so the kubelet's own conditions stay),
//! create an Eviction (policy/v1), and set one annotation (MindCluster's).
//!
//! Every request has `request_timeout`, for the whole exchange, body included; kube's own
//! retries are off (they would resend a PDB-refused eviction up to 15 times over minutes):
//! the loop retries, with its back-off.
//!
//! kube builds the requests and carries them (authentication, TLS, in-cluster config), but
//! the answers are read here, never by kube's typed calls, which read a body whole however
//! large and log an unparsable one whole at WARN: a body is read to at most [`LIST_LIMIT`]
//! (a list), [`OBJECT_LIMIT`] (one object) or [`ERROR_LIMIT`] (an error status), and
//! anything from the answer that an error quotes is cut at [`crate::logging::QUOTE_MAX`].
//! A redirect is refused, never followed.

use crate::integrations::kubernetes::config::KubernetesConfig;
use crate::logging::{clip, quote};
use k8s_openapi::api::core::v1::{Pod, PodCondition};
use k8s_openapi::api::policy::v1::Eviction;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::api::{GetParams, ListParams, Patch, PatchParams};
use kube::core::{ObjectList, Request};
use serde_json::json;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// Most bytes read of an answer that lists this node's pods: about a hundred times a large
/// pod. A node runs at most 110 pods by the kubelet's default.
pub const LIST_LIMIT: usize = 16 << 20;
/// Most bytes read of an answer that is one object (a pod; the answer to a patch or an
/// Eviction). etcd refuses objects over 1.5 MiB by default.
pub(crate) const OBJECT_LIMIT: usize = 2 << 20;
/// Most bytes read of an error answer (a `Status` is a few hundred bytes).
pub(crate) const ERROR_LIMIT: usize = 64 << 10;

/// A failed API call, classified.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ApiError {
    /// The API server answered with an error status (`reason`, `message` from its Status).
    #[error("HTTP {code}{}: {message}", if reason.is_empty() { "" } else { " " }.to_owned() + reason)]
    Status {
        code: u16,
        reason: String,
        message: String,
    },
    /// No usable answer: refused, timed out, TLS, garbage.
    #[error("{0}")]
    Transport(String),
    /// The answer's body was over the limit for its kind; it was not read further.
    #[error("HTTP {code}: the answer's body is over {limit} bytes; not read further")]
    TooLarge { code: u16, limit: usize },
}

impl ApiError {
    /// The HTTP status, when the server answered one.
    pub(crate) fn code(&self) -> Option<u16> {
        match self {
            ApiError::Status { code, .. } => Some(*code),
            // An error answer too large to read still said what it was (a 404, a 429).
            ApiError::TooLarge { code, .. } if *code >= 300 => Some(*code),
            ApiError::Transport(_) | ApiError::TooLarge { .. } => None,
        }
    }

    /// A PodDisruptionBudget (or the API server's rate limit) refused: try again later.
    pub(crate) fn too_many_requests(&self) -> bool {
        self.code() == Some(429)
            || matches!(self, ApiError::Status { reason, .. } if reason == "TooManyRequests")
    }

    /// An error answer (4xx, 5xx) with at most [`ERROR_LIMIT`] bytes of body: its `Status`
    /// when the body is one, else the body's start as the message.
    fn of_answer(code: u16, body: &[u8]) -> ApiError {
        #[derive(serde::Deserialize)]
        struct StatusBody {
            #[serde(default)]
            reason: String,
            #[serde(default)]
            message: String,
        }
        match serde_json::from_slice::<StatusBody>(body) {
            Ok(s) => ApiError::Status {
                code,
                reason: clip(&s.reason),
                message: quote(&s.message),
            },
            Err(_) => ApiError::Status {
                code,
                reason: String::new(),
                message: format!(
                    "not a Status: {}",
                    quote(String::from_utf8_lossy(body).trim())
                ),
            },
        }
    }
}

/// The error and its sources on one line, clipped.
fn one_line(e: &dyn std::error::Error) -> String {
    clip(&sources(e))
}

fn sources(e: &dyn std::error::Error) -> String {
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
pub(crate) struct PodInfo {
    pub namespace: String,
    pub name: String,
    /// `metadata.uid` (an Event names it: `kubectl describe` finds a pod's Events by it).
    pub uid: Option<String>,
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
    pub(crate) fn of(p: &Pod) -> PodInfo {
        let spec = p.spec.as_ref();
        let status = p.status.as_ref();
        let port = |n: i32| u16::try_from(n).ok();
        PodInfo {
            namespace: p.metadata.namespace.clone().unwrap_or_default(),
            name: p.metadata.name.clone().unwrap_or_default(),
            uid: p.metadata.uid.clone(),
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
    pub(crate) fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// The calls, as the loop makes them.
pub(crate) trait KubeApi: Send + Sync {
    /// Pods on `node` (every node when `None`), in `namespace` (every namespace when
    /// `None`), matching `labels` (a label selector) when given.
    fn list_pods(
        &self,
        node: Option<&str>,
        namespace: Option<&str>,
        labels: Option<&str>,
    ) -> impl Future<Output = Result<Arc<[PodInfo]>, ApiError>> + Send;
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
    /// A pod the loop knew is gone (a 404 on it): lists answered before are stale
    /// ([`super::shared::SharedLists`]).
    fn pod_gone(&self) {}
}

/// The files `[agent.kubernetes]` names with `api_server`, read as the client reads them;
/// also `check-config`'s and a reload's check ([`crate::agent::preflight`]).
pub(crate) struct Files {
    /// `token_file`, read as `admin_token_file` is ([`crate::config::read::token`]).
    pub token: Option<Arc<TokenFile>>,
    /// `ca_file`'s certificates (DER).
    pub ca: Option<Vec<Vec<u8>>>,
}

impl Files {
    /// Reads `token_file` and `ca_file`; `Err((key, message))` naming the file.
    pub(crate) fn read(cfg: &KubernetesConfig) -> Result<Files, (&'static str, String)> {
        let token = match &cfg.token_file {
            None => None,
            Some(t) => Some(Arc::new(TokenFile::open(t).map_err(|m| ("token_file", m))?)),
        };
        let ca = match &cfg.ca_file {
            None => None,
            Some(ca) => {
                let pem = crate::config::read::bytes(ca)
                    .map_err(|e| ("ca_file", format!("{} {e}", ca.display())))?;
                let ders: Vec<Vec<u8>> = rustls_pki_types::pem::PemObject::pem_slice_iter(&pem)
                    .map(|c: Result<rustls_pki_types::CertificateDer<'_>, _>| c.map(|c| c.to_vec()))
                    .collect::<Result<_, _>>()
                    .map_err(|e| {
                        (
                            "ca_file",
                            format!("{}: not PEM certificates: {e}", ca.display()),
                        )
                    })?;
                if ders.is_empty() {
                    return Err(("ca_file", format!("{}: no certificate in it", ca.display())));
                }
                Some(ders)
            }
        };
        Ok(Files { token, ca })
    }
}

/// How often `token_file` is read again: a projected service account token is rotated
/// well before it expires (kube re-reads its own token file at the same period).
const TOKEN_REREAD: Duration = Duration::from_secs(60);

/// `token_file`: its `Authorization` header, read again every [`TOKEN_REREAD`]; a read that
/// fails keeps the token it had (and says so in the log once per failure run).
#[derive(Debug)]
pub(crate) struct TokenFile {
    path: std::path::PathBuf,
    cached: std::sync::Mutex<(std::time::Instant, http::HeaderValue, bool)>,
}

impl TokenFile {
    fn open(path: &std::path::Path) -> Result<TokenFile, String> {
        let header = Self::header_of(path)?;
        Ok(TokenFile {
            path: path.to_owned(),
            cached: std::sync::Mutex::new((std::time::Instant::now(), header, false)),
        })
    }

    fn header_of(path: &std::path::Path) -> Result<http::HeaderValue, String> {
        let token = crate::config::read::token(path)?;
        let mut v = http::HeaderValue::from_bytes(&[b"Bearer ".as_slice(), &token].concat())
            .map_err(|e| format!("{}: {e}", path.display()))?;
        v.set_sensitive(true);
        Ok(v)
    }

    /// The header to send now.
    fn header(&self) -> http::HeaderValue {
        let mut c = self.cached.lock().unwrap_or_else(|p| p.into_inner());
        if c.0.elapsed() >= TOKEN_REREAD {
            c.0 = std::time::Instant::now();
            match Self::header_of(&self.path) {
                Ok(h) => {
                    c.1 = h;
                    c.2 = false;
                }
                Err(e) if !c.2 => {
                    c.2 = true;
                    tracing::warn!(
                        "Kubernetes API: [agent.kubernetes] token_file: {e}; the token read before is sent meanwhile"
                    );
                }
                Err(_) => {}
            }
        }
        c.1.clone()
    }
}

/// The API server, through `kube`.
#[derive(Clone)]
pub(crate) struct KubeClient {
    client: kube::Client,
    /// The whole exchange's limit, the body's reading included.
    timeout: Duration,
}

impl std::fmt::Debug for KubeClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KubeClient")
    }
}

/// Field manager named in the agent's patches.
pub(crate) const FIELD_MANAGER: &str = "npu-health-agent";

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
    pub(crate) fn new(cfg: &KubernetesConfig) -> Result<KubeClient, String> {
        let mut token = None;
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
                let files = Files::read(cfg).map_err(|(key, m)| format!("{key}: {m}"))?;
                token = files.token;
                kc.root_cert = files.ca;
                kc
            }
        };
        kc.connect_timeout = Some(cfg.request_timeout);
        kc.read_timeout = Some(cfg.request_timeout);
        kc.write_timeout = Some(cfg.request_timeout);
        kc.reset_reader_on_write = true;
        kc.default_retry = false;
        let builder = kube::client::ClientBuilder::try_from(kc)
            .map_err(|e| format!("Kubernetes client: {}", one_line(&e)))?;
        let client = match token {
            None => builder.build(),
            Some(t) => builder
                .with_layer(&tower::util::MapRequestLayer::new(
                    move |mut req: http::Request<kube::client::Body>| {
                        req.headers_mut()
                            .insert(http::header::AUTHORIZATION, t.header());
                        req
                    },
                ))
                .build(),
        };
        Ok(KubeClient {
            client,
            timeout: cfg.request_timeout,
        })
    }

    /// Sends `req` and reads its answer's body, at most `limit` bytes of it, all within
    /// `request_timeout`. A 3xx, 4xx or 5xx answer is an [`ApiError`]. (The fleet brake
    /// makes its own calls through it.)
    pub(crate) async fn call(
        &self,
        req: Result<http::Request<Vec<u8>>, kube::core::request::Error>,
        limit: usize,
    ) -> Result<Vec<u8>, ApiError> {
        let req = req
            .map_err(|e| ApiError::Transport(format!("building the request: {}", one_line(&e))))?;
        tokio::time::timeout(self.timeout, self.exchange(req, limit))
            .await
            .unwrap_or_else(|_| {
                Err(ApiError::Transport(format!(
                    "no complete answer within request_timeout ({})",
                    humantime::format_duration(self.timeout)
                )))
            })
    }

    async fn exchange(
        &self,
        req: http::Request<Vec<u8>>,
        limit: usize,
    ) -> Result<Vec<u8>, ApiError> {
        let res = self
            .client
            .send(req.map(kube::client::Body::from))
            .await
            .map_err(|e| ApiError::Transport(one_line(&e)))?;
        let code = res.status().as_u16();
        if res.status().is_redirection() {
            let to = res
                .headers()
                .get(http::header::LOCATION)
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                .unwrap_or_default();
            return Err(ApiError::Status {
                code,
                reason: "Redirect".to_owned(),
                message: format!("a redirect to {}, not followed", quote(&to)),
            });
        }
        let ok = res.status().is_success();
        let limit = if ok { limit } else { ERROR_LIMIT };
        let declared = res
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if declared.is_some_and(|n| n > limit as u64) {
            return Err(ApiError::TooLarge { code, limit });
        }
        let body = read_body(res.into_body(), code, limit).await?;
        if ok {
            Ok(body)
        } else {
            Err(ApiError::of_answer(code, &body))
        }
    }

    /// Sends `req` as [`KubeClient::call`] does: for the mode's other calls (its Events,
    /// [`super::events`]).
    pub(crate) async fn send(
        &self,
        req: http::Request<Vec<u8>>,
        limit: usize,
    ) -> Result<Vec<u8>, ApiError> {
        self.call(Ok(req), limit).await
    }

    /// `call`, then the body as a `T` (`what` names it in the error).
    async fn call_for<T: serde::de::DeserializeOwned>(
        &self,
        req: Result<http::Request<Vec<u8>>, kube::core::request::Error>,
        limit: usize,
        what: &str,
    ) -> Result<T, ApiError> {
        let body = self.call(req, limit).await?;
        serde_json::from_slice(&body).map_err(|e| {
            ApiError::Transport(format!(
                "the answer is not {what}: {}",
                clip(&e.to_string())
            ))
        })
    }
}

/// At most `limit` bytes of `body`; [`ApiError::TooLarge`] as soon as there are more.
async fn read_body(
    mut body: kube::client::Body,
    code: u16,
    limit: usize,
) -> Result<Vec<u8>, ApiError> {
    use http_body_util::BodyExt;
    // The frames are kept as they came and joined once at the end: growing one buffer would
    // hold its old and new copies at once, twice the limit.
    let mut frames = Vec::new();
    let mut len = 0;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            ApiError::Transport(format!("HTTP {code}: reading the answer: {}", one_line(&e)))
        })?;
        if let Ok(data) = frame.into_data() {
            len += data.len();
            if len > limit {
                return Err(ApiError::TooLarge { code, limit });
            }
            frames.push(data);
        }
    }
    let mut buf = Vec::with_capacity(len);
    for f in frames {
        buf.extend_from_slice(&f);
    }
    Ok(buf)
}

/// Requests on pods in `namespace` (every namespace when `None`).
fn pods(namespace: Option<&str>) -> Request {
    Request::new(Pod::url_path(&(), namespace))
}

impl KubeApi for KubeClient {
    async fn list_pods(
        &self,
        node: Option<&str>,
        namespace: Option<&str>,
        labels: Option<&str>,
    ) -> Result<Arc<[PodInfo]>, ApiError> {
        let mut lp = ListParams::default();
        if let Some(n) = node {
            lp = lp.fields(&format!("spec.nodeName={n}"));
        }
        if let Some(l) = labels {
            lp = lp.labels(l);
        }
        let list: ObjectList<Pod> = self
            .call_for(pods(namespace).list(&lp), LIST_LIMIT, "a list of pods")
            .await?;
        Ok(list
            .items
            .iter()
            .map(PodInfo::of)
            .collect::<Vec<_>>()
            .into())
    }

    async fn get_pod(&self, namespace: &str, name: &str) -> Result<PodInfo, ApiError> {
        let req = pods(Some(namespace)).get(name, &GetParams::default());
        let pod: Pod = self.call_for(req, OBJECT_LIMIT, "a pod").await?;
        Ok(PodInfo::of(&pod))
    }

    async fn set_condition(
        &self,
        namespace: &str,
        name: &str,
        condition: &PodCondition,
    ) -> Result<(), ApiError> {
        let body = json!({ "status": { "conditions": [condition] } });
        let req = pods(Some(namespace)).patch_subresource(
            "status",
            name,
            &patch_params(),
            &Patch::Strategic(&body),
        );
        self.call(req, OBJECT_LIMIT).await.map(drop)
    }

    async fn evict(&self, namespace: &str, name: &str) -> Result<(), ApiError> {
        // Built here rather than with kube's `evict`, which leaves out apiVersion and kind.
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
        self.call(Ok(req), OBJECT_LIMIT).await.map(drop)
    }

    async fn annotate(
        &self,
        namespace: &str,
        name: &str,
        key: &str,
        value: &str,
    ) -> Result<(), ApiError> {
        let body = json!({ "metadata": { "annotations": { key: value } } });
        let req = pods(Some(namespace)).patch(name, &patch_params(), &Patch::Strategic(&body));
        self.call(req, OBJECT_LIMIT).await.map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_status_keeps_its_reason_and_a_cut_escaped_message() {
        let body = serde_json::to_vec(&json!({
            "kind": "Status",
            "reason": "Internal\nError",
            "message": format!("\u{1b}[31m{}", "x".repeat(5000)),
        }))
        .unwrap();
        let ApiError::Status {
            code,
            reason,
            message,
        } = ApiError::of_answer(500, &body)
        else {
            panic!("a Status")
        };
        assert_eq!((code, reason.as_str()), (500, "Internal\\nError"));
        assert!(message.starts_with("\"\\u{1b}[31mxxx"), "{message}");
        assert!(message.ends_with("… (4493 more bytes)"), "{message}");
        assert!(!message.contains(char::is_control));
    }

    #[test]
    fn an_error_body_that_is_no_status_is_quoted_short() {
        let body = format!("<html>\n{}</html>", "y".repeat(3000));
        let e = ApiError::of_answer(502, body.as_bytes()).to_string();
        assert!(
            e.starts_with("HTTP 502: not a Status: \"<html>\\nyyy"),
            "{e}"
        );
        assert!(e.len() < 600, "{} bytes", e.len());
    }

    // The token file is read again after a minute (a rotated token is sent); a read that
    // fails keeps the token read before.
    #[test]
    fn the_token_file_is_read_again_and_a_bad_read_keeps_the_last_token() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("token");
        let a = "token-a-0123456789abcdef";
        let b = "token-b-0123456789abcdef";
        std::fs::write(&p, format!("{a}\n")).unwrap();
        let t = TokenFile::open(&p).unwrap();
        let age = |t: &TokenFile| {
            let mut c = t.cached.lock().unwrap();
            c.0 -= TOKEN_REREAD + Duration::from_secs(1);
        };
        assert_eq!(t.header(), format!("Bearer {a}").as_str());
        std::fs::write(&p, b).unwrap();
        assert_eq!(
            t.header(),
            format!("Bearer {a}").as_str(),
            "not before a minute"
        );
        age(&t);
        assert_eq!(
            t.header(),
            format!("Bearer {b}").as_str(),
            "the rotated token"
        );
        std::fs::write(&p, "short").unwrap();
        age(&t);
        assert_eq!(t.header(), format!("Bearer {b}").as_str(), "kept");
        assert!(t.header().is_sensitive());
    }

    // An error answer too large to read keeps its code: a 404 is still a pod gone, a 429 a
    // refusal to retry; a 2xx over the limit has no error code.
    #[test]
    fn an_error_answer_over_the_limit_keeps_its_code() {
        let big = |code| ApiError::TooLarge {
            code,
            limit: ERROR_LIMIT,
        };
        assert_eq!(big(404).code(), Some(404));
        assert!(big(429).too_many_requests());
        assert_eq!(big(200).code(), None);
        assert!(!big(500).too_many_requests());
    }

    #[test]
    fn clip_cuts_on_a_char_boundary_and_says_how_much() {
        let s = "é".repeat(400);
        let c = clip(&s);
        assert!(
            c.starts_with("éé") && c.ends_with("… (288 more bytes)"),
            "{c}"
        );
        assert_eq!(clip("short"), "short");
    }
}

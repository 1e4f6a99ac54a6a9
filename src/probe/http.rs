//! HTTP to the engine's inference surface: `GET /health` for the HealthCollector, the
//! virtual request, and `GET /metrics` for the QoS score, each as the engine's kind has it
//! ([`crate::engines`]: the request's path and body, the metric names, what a `/health` body
//! means). The client never asks which kind it has.
//!
//! The virtual request carries `Content-Type: application/json` and
//! `X-Request-Id: <unix µs>_virtual` (the reference's, §1.8), and the same id in the body
//! where the kind takes it from there. Success is a 2xx status and a JSON body; with one
//! token the answer is the first token, so its latency is the time to first token. When the
//! kind's request streams (`qos.probe_max_tokens` N > 1), the server-sent events are timed:
//! the first event carrying a choice is the first token, the spacing of the rest gives the
//! time per output token (arrival times: events that arrive in one read share a time);
//! success is a 2xx status, every event JSON and none an error, at least one token, and the
//! closing `[DONE]`. Every request runs under a timeout; a request that times out is
//! dropped, which closes its connection, so the engine aborts it instead of keeping it
//! queued.
//!
//! Pooled connections and the server's idle timeout: uvicorn (vLLM, SGLang, MindIE's engine
//! server) closes a keep-alive connection after 5 s without a request, the same as the probe
//! interval. A request written on a connection the server is closing at that moment fails
//! before any response byte, although the engine is fine. Two defences, at the transport:
//! idle pooled connections are dropped after [`POOL_IDLE`] (below uvicorn's 5 s), and the
//! virtual request is sent once more, within its own timeout, when the connection closed or
//! reset before any response byte arrived ([`closed_before_response`]). A refused connection
//! is not retried (nothing listens: the engine is down).

use super::Prober;
use super::cause;
use super::health::{Fetch, HealthTransport, Transport};
use super::outcome::{ProbeFailure, ProbeResult};
use super::sse::Stream;
use crate::config::EngineSpec;
use crate::engines::{self, EngineKind, MetricNames};
use crate::tls::{TlsError, client_config};
use serde_json::Value;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Largest response body read (a broken engine must not make the agent buffer without limit).
const MAX_BODY: usize = 1 << 20;
/// Largest `/metrics` body read (vLLM's histograms per model and LoRA can be large).
const MAX_METRICS_BODY: usize = 16 << 20;
/// Idle pooled connections older than this are not reused: below uvicorn's 5 s keep-alive
/// timeout, so the pool does not hand out a connection the server is about to close.
pub(crate) const POOL_IDLE: Duration = Duration::from_secs(2);

/// `X-Request-Id` of a virtual request sent at `now`: Unix microseconds and `_virtual`.
pub(crate) fn request_id(now: SystemTime) -> String {
    let us = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros());
    format!("{us}_virtual")
}

/// A client for one engine's inference surface (HTTP, or HTTPS per `infer_tls_config`), as
/// its kind talks.
#[derive(Clone)]
pub struct EngineClient {
    client: reqwest::Client,
    base: String,
    kind: &'static dyn EngineKind,
}

impl std::fmt::Debug for EngineClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineClient")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

impl EngineClient {
    /// Builds the client for `spec`'s kind (its `engine_type`); TLS files are read now so a
    /// bad config fails at start.
    pub fn new(spec: &EngineSpec) -> Result<EngineClient, TlsError> {
        EngineClient::of_kind(spec, engines::of(spec.engine_type))
    }

    /// Builds the client for `kind`, whatever `spec.engine_type` says (a kind outside the
    /// list: the seam's test kind).
    pub(crate) fn of_kind(
        spec: &EngineSpec,
        kind: &'static dyn EngineKind,
    ) -> Result<EngineClient, TlsError> {
        let tls = spec.infer_tls_config.enable_tls;
        let cfg = if tls {
            client_config(&spec.infer_tls_config)?
        } else {
            // Never used for http://, but the client needs a TLS stack with our provider.
            rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError {
                config: "infer_tls_config",
                message: e.to_string(),
            })?
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth()
        };
        let client = reqwest::Client::builder()
            .use_preconfigured_tls(cfg)
            .no_proxy()
            .pool_idle_timeout(POOL_IDLE)
            .build()
            .map_err(|e| TlsError {
                config: "infer_tls_config",
                message: format!("cannot build the HTTP client: {e}"),
            })?;
        Ok(EngineClient {
            client,
            base: spec.engine_url(),
            kind,
        })
    }

    /// `GET /health` transport for the HealthCollector, read as the kind reads it.
    pub(crate) fn health(&self) -> HttpHealth {
        HttpHealth {
            client: self.client.clone(),
            url: format!("{}/health", self.base),
            kind: self.kind,
        }
    }

    /// The kind's virtual request for `spec`'s role, model and `probe_max_tokens`.
    pub fn prober(&self, spec: &EngineSpec) -> HttpProber {
        let r = self.kind.virtual_request(spec);
        HttpProber {
            client: self.client.clone(),
            url: format!("{}{}", self.base, r.path),
            body: r.body.to_string(),
            template: r.id_field.map(|f| (r.body, f)),
            stream: r.stream,
        }
    }

    /// `GET /metrics` of the engine, read with the kind's names.
    pub fn metrics(&self) -> HttpMetrics {
        HttpMetrics {
            client: self.client.clone(),
            url: format!("{}/metrics", self.base),
            names: self.kind.metric_names(),
        }
    }

    /// The engine's `/metrics` as it answers, at most 16 MiB, under `timeout` (the evidence
    /// bundles keep it whole); `Err` says why not.
    pub(crate) async fn metrics_text(&self, timeout: Duration) -> Result<String, String> {
        let body = self.metrics().body(timeout).await?;
        Ok(String::from_utf8_lossy(&body).into_owned())
    }

    /// Base URL (`http://host:port`).
    pub(crate) fn base(&self) -> &str {
        &self.base
    }
}

/// Whether a request failed because its connection closed or reset before any response
/// byte: the server's idle close racing our write, never a refused connection or a timeout.
fn closed_before_response(e: &reqwest::Error) -> bool {
    if e.is_connect() || e.is_timeout() {
        return false;
    }
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cur {
        if let Some(h) = c.downcast_ref::<hyper::Error>()
            && (h.is_incomplete_message() || h.is_canceled())
        {
            return true;
        }
        if let Some(io) = c.downcast_ref::<std::io::Error>()
            && matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::ConnectionAborted
                    | std::io::ErrorKind::BrokenPipe
                    | std::io::ErrorKind::UnexpectedEof
            )
        {
            return true;
        }
        cur = c.source();
    }
    false
}

async fn read_limited(resp: reqwest::Response) -> Result<Vec<u8>, ProbeFailure> {
    read_up_to(resp, MAX_BODY).await
}

async fn read_up_to(mut resp: reqwest::Response, limit: usize) -> Result<Vec<u8>, ProbeFailure> {
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| cause::of(&e))? {
        if body.len() + chunk.len() > limit {
            return Err(ProbeFailure::Transport(
                Transport::BodyTooLarge,
                format!("body larger than {limit} bytes"),
            ));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// `GET url` under `timeout`: the status and at most `limit` bytes of body, or why not (a
/// timeout, a transport error, a larger body).
async fn get(
    client: &reqwest::Client,
    url: &str,
    timeout: Duration,
    limit: usize,
) -> Result<(u16, Vec<u8>), ProbeFailure> {
    let fut = async {
        let resp = client.get(url).send().await.map_err(|e| cause::of(&e))?;
        let status = resp.status().as_u16();
        Ok((status, read_up_to(resp, limit).await?))
    };
    tokio::time::timeout(timeout, fut)
        .await
        .unwrap_or(Err(ProbeFailure::Timeout(timeout)))
}

/// `GET /health` over HTTP.
#[derive(Clone)]
pub(crate) struct HttpHealth {
    client: reqwest::Client,
    url: String,
    kind: &'static dyn EngineKind,
}

impl std::fmt::Debug for HttpHealth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpHealth")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl HealthTransport for HttpHealth {
    fn healthy_body(&self, body: &str) -> bool {
        self.kind.healthy_body(body)
    }

    async fn get(&self, timeout: Duration) -> Fetch {
        match get(&self.client, &self.url, timeout, MAX_BODY).await {
            Ok((status, body)) => Fetch::Response {
                status,
                body: String::from_utf8_lossy(&body).into_owned(),
            },
            Err(ProbeFailure::Transport(class, e)) => Fetch::Error(class, e),
            // `get` fails otherwise only by its timeout.
            Err(_) => Fetch::Timeout,
        }
    }
}

/// `GET /metrics` of the engine, parsed into the series the QoS score reads.
#[derive(Debug, Clone)]
pub struct HttpMetrics {
    client: reqwest::Client,
    url: String,
    names: &'static MetricNames,
}

impl HttpMetrics {
    /// The answer's body, at most 16 MiB, under `timeout`; `Err` says why not.
    async fn body(&self, timeout: Duration) -> Result<Vec<u8>, String> {
        let failed = |f: ProbeFailure| format!("GET /metrics: {f}");
        match get(&self.client, &self.url, timeout, MAX_METRICS_BODY).await {
            Err(f) => Err(failed(f)),
            Ok((status, _)) if !(200..300).contains(&status) => {
                Err(failed(ProbeFailure::Status(status)))
            }
            Ok((_, body)) => Ok(body),
        }
    }
}

impl crate::probe::MetricsSource for HttpMetrics {
    async fn scrape(
        &self,
        timeout: Duration,
    ) -> Result<crate::probe::engine_metrics::EngineMetrics, String> {
        let body = self.body(timeout).await?;
        Ok(crate::probe::engine_metrics::parse_as(
            &String::from_utf8_lossy(&body),
            &[self.names],
        ))
    }
}

/// The virtual request (`POST /v1/completions` for every kind in the list).
#[derive(Debug, Clone)]
pub struct HttpProber {
    client: reqwest::Client,
    url: String,
    /// The JSON body sent, when it does not carry the request id.
    body: String,
    /// The body and its key for the request id, when the kind takes the id from the body.
    template: Option<(Value, &'static str)>,
    /// Stream the answer and time the tokens (`probe_max_tokens` > 1).
    stream: bool,
}

impl HttpProber {
    #[cfg(test)]
    /// The JSON body sent (without its request id, when it carries one).
    pub(crate) fn body(&self) -> &str {
        &self.body
    }

    /// The body of the request whose id is `id`.
    fn body_for(&self, id: &str) -> String {
        match &self.template {
            None => self.body.clone(),
            Some((body, field)) => {
                let mut body = body.clone();
                body[*field] = Value::from(id);
                body.to_string()
            }
        }
    }
}

impl HttpProber {
    async fn streamed(
        &self,
        mut resp: reqwest::Response,
        started: Instant,
    ) -> Result<(Duration, Option<Duration>), ProbeFailure> {
        let mut st = Stream::default();
        while let Some(chunk) = resp.chunk().await.map_err(|e| cause::of(&e))? {
            st.feed(&chunk, Instant::now())
                .map_err(ProbeFailure::BadStream)?;
        }
        st.finish(started, Instant::now())
            .map_err(ProbeFailure::BadStream)
    }
}

impl HttpProber {
    /// Posts the request; once more if the first connection closed before any response
    /// byte (the server's idle close, see the module doc). Same request id both times.
    async fn post(&self) -> Result<reqwest::Response, reqwest::Error> {
        let id = request_id(SystemTime::now());
        let body = self.body_for(&id);
        let attempt = || {
            self.client
                .post(&self.url)
                .header("Content-Type", "application/json")
                .header("X-Request-Id", &id)
                .body(body.clone())
                .send()
        };
        match attempt().await {
            Ok(r) => Ok(r),
            Err(e) if closed_before_response(&e) => {
                tracing::debug!(
                    "virtual request: the connection closed before any response byte ({}); sending it again",
                    cause::raw(&e)
                );
                attempt().await
            }
            Err(e) => Err(e),
        }
    }
}

impl Prober for HttpProber {
    async fn send(&self, timeout: Duration) -> ProbeResult {
        let started = Instant::now();
        let fut = async {
            let resp = self.post().await.map_err(|e| cause::of(&e))?;
            let status = resp.status();
            if self.stream && status.is_success() {
                return self.streamed(resp, started).await.map(Some);
            }
            let body = read_limited(resp).await?;
            if !status.is_success() {
                return Err(ProbeFailure::Status(status.as_u16()));
            }
            serde_json::from_slice::<serde::de::IgnoredAny>(&body)
                .map_err(|e| ProbeFailure::BadBody(e.to_string()))?;
            Ok(None)
        };
        let (outcome, timing) = match tokio::time::timeout(timeout, fut).await {
            Err(_) => (Err(ProbeFailure::Timeout(timeout)), None),
            Ok(Ok(t)) => (Ok(()), t),
            Ok(Err(e)) => (Err(e), None),
        };
        let mut r = ProbeResult::new(outcome, started.elapsed());
        if let Some((ttft, tpot)) = timing {
            r.ttft = Some(ttft);
            r.tpot = tpot;
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    // test_sim_inference.py: request-id format, bodies per role and profile.
    #[test]
    fn request_id_is_unix_microseconds() {
        let t = UNIX_EPOCH + Duration::from_micros(1_234_567_890_123_456);
        assert_eq!(request_id(t), "1234567890123456_virtual");
    }

    /// An inline engine serving model `m` on `port`; `extra` is appended to its table.
    fn spec_for(port: u16, extra: &str) -> EngineSpec {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let text = format!(
            "[[engine]]\nengine_type = \"vllm\"\nserved_model_name = \"m\"\nhost = \"127.0.0.1\"\nport = {port}\nmgmt_port = 9001\n{extra}"
        );
        crate::config::file::parse(&text, std::path::Path::new("/x/a.toml"))
            .unwrap()
            .engines
            .remove(0)
    }

    fn prober_for(port: u16) -> HttpProber {
        let spec = spec_for(port, "");
        EngineClient::new(&spec).unwrap().prober(&spec)
    }

    /// One `GET /health` against a server that answers every connection with `raw` bytes
    /// (then closes); `None`: nothing listens.
    async fn health_against(raw: Option<Vec<u8>>) -> Fetch {
        use crate::probe::health::HealthTransport;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        match raw {
            None => drop(l),
            Some(raw) => {
                tokio::spawn(async move {
                    while let Ok((mut s, _)) = l.accept().await {
                        let mut buf = vec![0u8; 4096];
                        let _ = s.read(&mut buf).await;
                        let _ = s.write_all(&raw).await;
                        let _ = s.shutdown().await;
                    }
                });
            }
        }
        let spec = spec_for(port, "");
        EngineClient::new(&spec)
            .unwrap()
            .health()
            .get(Duration::from_secs(5))
            .await
    }

    // Issue 11, defect 2: each way /health can fail without a usable answer has a class of
    // its own; only a refused connection says the engine went away.
    #[tokio::test]
    async fn every_transport_error_class_of_health_is_named() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut big = b"HTTP/1.1 200 OK\r\nContent-Length: 2000000\r\n\r\n".to_vec();
        big.extend(std::iter::repeat_n(b'x', 2_000_000));
        let cases: Vec<(&str, Option<Vec<u8>>, Transport)> = vec![
            ("nothing listens", None, Transport::Refused),
            (
                "closed without an answer",
                Some(Vec::new()),
                Transport::Reset,
            ),
            (
                "garbage bytes",
                Some(b"\x00\x01\x02 not http at all\r\n\r\n".to_vec()),
                Transport::Protocol,
            ),
            (
                "an invalid status line",
                Some(b"HTTP/1.1 abc OK\r\nContent-Length: 0\r\n\r\n".to_vec()),
                Transport::Protocol,
            ),
            (
                "a truncated body",
                Some(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort".to_vec()),
                Transport::Reset,
            ),
            ("a body over 1 MiB", Some(big), Transport::BodyTooLarge),
        ];
        for (what, raw, want) in cases {
            match health_against(raw).await {
                Fetch::Error(class, e) => assert_eq!(class, want, "{what}: {e}"),
                other => panic!("{what}: {other:?}"),
            }
        }
    }

    /// Serves one connection with `response` (raw HTTP; empty: never answer) and returns
    /// what the client sent.
    async fn one_shot(response: &'static str) -> (u16, tokio::task::JoinHandle<String>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let h = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut buf = vec![0u8; 4096];
            let n = s.read(&mut buf).await.unwrap();
            if response.is_empty() {
                tokio::time::sleep(Duration::from_secs(30)).await;
            } else {
                s.write_all(response.as_bytes()).await.unwrap();
            }
            String::from_utf8_lossy(&buf[..n]).into_owned()
        });
        (port, h)
    }

    // Success needs a 2xx and a JSON body; the request carries the reference's headers.
    #[tokio::test]
    async fn outcomes_of_the_real_request() {
        let (port, h) =
            one_shot("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}").await;
        let r = prober_for(port).send(Duration::from_secs(5)).await;
        assert_eq!(r.outcome, Ok(()));
        let sent = h.await.unwrap().to_ascii_lowercase();
        assert!(sent.starts_with("post /v1/completions http/1.1"), "{sent}");
        assert!(sent.contains("content-type: application/json"), "{sent}");
        assert!(
            sent.contains("x-request-id: ") && sent.contains("_virtual"),
            "{sent}"
        );
        assert!(
            sent.contains(r#"{"max_tokens":1,"model":"m","prompt":"1"}"#),
            "{sent}"
        );
        let (port, _) =
            one_shot("HTTP/1.1 200 OK\r\nContent-Length: 4\r\nConnection: close\r\n\r\noops").await;
        assert!(matches!(
            prober_for(port).send(Duration::from_secs(5)).await.outcome,
            Err(ProbeFailure::BadBody(_))
        ));
        let (port, _) =
            one_shot("HTTP/1.1 503 Busy\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}").await;
        assert_eq!(
            prober_for(port).send(Duration::from_secs(5)).await.outcome,
            Err(ProbeFailure::Status(503))
        );
        let (port, _) = one_shot("").await;
        let r = prober_for(port).send(Duration::from_millis(200)).await;
        assert_eq!(
            r.outcome,
            Err(ProbeFailure::Timeout(Duration::from_millis(200)))
        );
        // Nothing listening: a transport error, reported, not a panic. The port is held by a
        // socket that is bound and never listens (a connection to it is refused), so no other
        // test's listener can take it meanwhile, as it could a port bound and released.
        let held = tokio::net::TcpSocket::new_v4().unwrap();
        held.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let free = held.local_addr().unwrap().port();
        let r = prober_for(free).send(Duration::from_secs(5)).await;
        assert!(
            matches!(
                r.outcome,
                Err(ProbeFailure::Transport(Transport::Refused, _))
            ),
            "{r:?}"
        );
    }

    // A timed-out probe closes its connection, so the engine sees the client go and aborts
    // the request instead of keeping it queued.
    #[tokio::test]
    async fn a_timed_out_probe_closes_its_connection() {
        use tokio::io::AsyncReadExt;
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut buf = vec![0u8; 4096];
            let _ = s.read(&mut buf).await.unwrap();
            // Never answer; wait for the client to hang up.
            tokio::time::timeout(Duration::from_secs(10), async {
                loop {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return true,
                        Ok(_) => {}
                    }
                }
            })
            .await
            .unwrap_or(false)
        });
        let r = prober_for(port).send(Duration::from_millis(200)).await;
        assert_eq!(
            r.outcome,
            Err(ProbeFailure::Timeout(Duration::from_millis(200)))
        );
        assert!(
            server.await.unwrap(),
            "the connection stayed open after the timeout"
        );
    }

    // infer_tls_config enabled: the client verifies the engine against ca_file, presents
    // its certificate, and both requests go over HTTPS.
    #[tokio::test]
    async fn https_when_the_inference_tls_config_is_enabled() {
        use crate::probe::health::HealthTransport;
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = tempfile::tempdir().unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        std::fs::write(dir.path().join("ca.crt"), cert.pem()).unwrap();
        std::fs::write(dir.path().join("server.key"), key.serialize_pem()).unwrap();
        let tls = crate::config::mindie::TlsConfig {
            enable_tls: true,
            ca_file: dir.path().join("ca.crt"),
            cert_file: dir.path().join("ca.crt"),
            key_file: dir.path().join("server.key"),
            ..Default::default()
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let router = axum::Router::new()
            .route("/health", axum::routing::get(|| async { "true" }))
            .route(
                "/v1/completions",
                axum::routing::post(|| async { axum::Json(json!({"choices": []})) }),
            );
        let cancel = tokio_util::sync::CancellationToken::new();
        let server = tokio::spawn(crate::server::serve(
            listener,
            router,
            Some(crate::tls::server_config(&tls).unwrap()),
            crate::config::ListenerLimits::default(),
            "test".to_owned(),
            cancel.clone(),
        ));
        let mut spec = spec_for(port, "");
        spec.infer_tls_config = tls;
        let client = EngineClient::new(&spec).unwrap();
        assert!(client.base().starts_with("https://"));
        let health = client.health().get(Duration::from_secs(5)).await;
        assert_eq!(
            health,
            Fetch::Response {
                status: 200,
                body: "true".into()
            }
        );
        assert_eq!(
            client
                .prober(&spec)
                .send(Duration::from_secs(5))
                .await
                .outcome,
            Ok(())
        );
        cancel.cancel();
        server.await.unwrap();
    }

    fn streaming_prober(port: u16) -> HttpProber {
        let mut p = prober_for(port);
        p.stream = true;
        p
    }

    #[tokio::test]
    async fn streamed_probe_outcomes() {
        let (port, h) = one_shot(
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\ndata: {\"choices\": [{\"text\": \"a\"}]}\n\ndata: {\"choices\": [{\"text\": \"b\"}]}\n\ndata: [DONE]\n\n",
        )
        .await;
        let r = streaming_prober(port).send(Duration::from_secs(5)).await;
        assert_eq!(r.outcome, Ok(()));
        assert!(r.ttft.is_some() && r.tpot.is_some(), "{r:?}");
        assert!(r.ttft.unwrap() <= r.latency);
        h.await.unwrap();
        let (port, _) =
            one_shot("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\ndata: not json\n\n").await;
        let r = streaming_prober(port).send(Duration::from_secs(5)).await;
        assert!(
            matches!(r.outcome, Err(ProbeFailure::BadStream(_))),
            "{r:?}"
        );
        assert_eq!(r.ttft, None);
        // Truncated: tokens but the connection closed before [DONE].
        let (port, _) = one_shot(
            "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\ndata: {\"choices\": [{\"text\": \"a\"}]}\n\n",
        )
        .await;
        let r = streaming_prober(port).send(Duration::from_secs(5)).await;
        assert_eq!(
            r.outcome,
            Err(ProbeFailure::BadStream(
                "the stream ended without [DONE] (truncated)".into()
            ))
        );
        let (port, _) =
            one_shot("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\ndata: [DONE]\n\n").await;
        let r = streaming_prober(port).send(Duration::from_secs(5)).await;
        assert_eq!(
            r.outcome,
            Err(ProbeFailure::BadStream(
                "the stream carried no token".into()
            ))
        );
        let (port, _) =
            one_shot("HTTP/1.1 500 Oops\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}").await;
        let r = streaming_prober(port).send(Duration::from_secs(5)).await;
        assert_eq!(r.outcome, Err(ProbeFailure::Status(500)));
    }

    // probe_max_tokens > 1 asks for that many tokens, streamed; 1 keeps the reference body.
    #[test]
    fn probe_body_follows_probe_max_tokens() {
        let p = prober_for(1);
        assert!(!p.stream);
        assert_eq!(
            serde_json::from_str::<Value>(p.body()).unwrap(),
            json!({"model": "m", "prompt": "1", "max_tokens": 1})
        );
        let spec = spec_for(1, "[engine.qos]\nprobe_max_tokens = 8\n");
        let p = EngineClient::new(&spec).unwrap().prober(&spec);
        assert!(p.stream);
        assert_eq!(
            serde_json::from_str::<Value>(p.body()).unwrap(),
            json!({"model": "m", "prompt": "1", "max_tokens": 8, "stream": true})
        );
    }

    // /metrics: parsed on 2xx; an HTTP error or a dead engine is an error (unknown), never
    // a figure.
    #[tokio::test]
    async fn metrics_scrape() {
        use crate::probe::MetricsSource;
        let client = |port: u16| EngineClient::new(&spec_for(port, "")).unwrap().metrics();
        let (port, h) = one_shot(
            "HTTP/1.1 200 OK\r\nContent-Length: 31\r\nConnection: close\r\n\r\nvllm:num_requests_running 3.0\n\n",
        )
        .await;
        let m = client(port).scrape(Duration::from_secs(5)).await.unwrap();
        assert_eq!(m.running, Some(3.0));
        assert!(h.await.unwrap().starts_with("GET /metrics "));
        let (port, _) =
            one_shot("HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                .await;
        let e = client(port)
            .scrape(Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(e.contains("404"), "{e}");
        let (port, _) = one_shot("").await;
        let e = client(port)
            .scrape(Duration::from_millis(200))
            .await
            .unwrap_err();
        assert!(e.contains("timed out"), "{e}");
    }
}

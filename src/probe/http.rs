//! HTTP to the engine's inference surface: `GET /health` for the HealthCollector and the
//! virtual `POST /v1/completions`.
//!
//! The virtual request is the reference's (§1.8): `Content-Type: application/json`,
//! `X-Request-Id: <unix µs>_virtual`, body `{"model", "prompt": "1", "max_tokens": 1}`, plus
//! `kv_transfer_params` for a layerwise (trigger) decode engine. Success is a 2xx status and
//! a JSON body. Every request runs under a timeout; a request that times out is dropped,
//! which closes its connection, so the engine aborts it instead of keeping it queued.

use super::health::{Fetch, HealthTransport};
use super::virtual_inference::{Failure, ProbeResult, Prober};
use crate::config::EngineSpec;
use crate::config::mindie::{DispatchProfile, Role};
use crate::tls::{TlsError, client_config};
use serde_json::{Value, json};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Largest response body read (a broken engine must not make the agent buffer without limit).
const MAX_BODY: usize = 1 << 20;

/// The body of the virtual request for `role`/`profile`.
pub fn request_body(role: Role, profile: DispatchProfile, model: &str) -> Value {
    let mut body = json!({ "model": model, "prompt": "1", "max_tokens": 1 });
    if role == Role::Decode && profile == DispatchProfile::Trigger {
        body["kv_transfer_params"] = json!({
            "do_remote_decode": false,
            "do_remote_prefill": true,
            "do_virtual": true,
        });
    }
    body
}

/// `X-Request-Id` of a virtual request sent at `now`: Unix microseconds and `_virtual`.
pub fn request_id(now: SystemTime) -> String {
    let us = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros());
    format!("{us}_virtual")
}

/// A client for one engine's inference surface (HTTP, or HTTPS per `infer_tls_config`).
#[derive(Debug, Clone)]
pub struct EngineClient {
    client: reqwest::Client,
    base: String,
}

impl EngineClient {
    /// Builds the client; TLS files are read now so a bad config fails at start.
    pub fn new(spec: &EngineSpec) -> Result<EngineClient, TlsError> {
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
            .pool_idle_timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| TlsError {
                config: "infer_tls_config",
                message: format!("cannot build the HTTP client: {e}"),
            })?;
        let scheme = if tls { "https" } else { "http" };
        Ok(EngineClient {
            client,
            base: format!("{scheme}://{}", spec.infer_authority()),
        })
    }

    /// `GET /health` transport for the HealthCollector.
    pub fn health(&self) -> HttpHealth {
        HttpHealth {
            client: self.client.clone(),
            url: format!("{}/health", self.base),
        }
    }

    /// The virtual request sender for `spec`'s role and model.
    pub fn prober(&self, spec: &EngineSpec) -> HttpProber {
        let model = spec.model.clone().unwrap_or_default();
        HttpProber {
            client: self.client.clone(),
            url: format!("{}/v1/completions", self.base),
            body: request_body(spec.role, spec.dispatch_profile, &model).to_string(),
        }
    }

    /// Base URL (`http://host:port`).
    pub fn base(&self) -> &str {
        &self.base
    }
}

fn describe(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    let mut cur = std::error::Error::source(e);
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

async fn read_limited(mut resp: reqwest::Response) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| describe(&e))? {
        if body.len() + chunk.len() > MAX_BODY {
            return Err(format!("body larger than {MAX_BODY} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// `GET /health` over HTTP.
#[derive(Debug, Clone)]
pub struct HttpHealth {
    client: reqwest::Client,
    url: String,
}

impl HealthTransport for HttpHealth {
    async fn get(&self, timeout: Duration) -> Fetch {
        let fut = async {
            let resp = self
                .client
                .get(&self.url)
                .send()
                .await
                .map_err(|e| describe(&e))?;
            let status = resp.status().as_u16();
            let body = read_limited(resp).await?;
            Ok::<_, String>(Fetch::Response {
                status,
                body: String::from_utf8_lossy(&body).into_owned(),
            })
        };
        match tokio::time::timeout(timeout, fut).await {
            Err(_) => Fetch::Timeout,
            Ok(Err(e)) => Fetch::Error(e),
            Ok(Ok(f)) => f,
        }
    }
}

/// The virtual `POST /v1/completions`.
#[derive(Debug, Clone)]
pub struct HttpProber {
    client: reqwest::Client,
    url: String,
    body: String,
}

impl HttpProber {
    /// The JSON body sent.
    pub fn body(&self) -> &str {
        &self.body
    }
}

impl Prober for HttpProber {
    async fn send(&self, timeout: Duration) -> ProbeResult {
        let started = Instant::now();
        let fut = async {
            let resp = self
                .client
                .post(&self.url)
                .header("Content-Type", "application/json")
                .header("X-Request-Id", request_id(SystemTime::now()))
                .body(self.body.clone())
                .send()
                .await
                .map_err(|e| Failure::Transport(describe(&e)))?;
            let status = resp.status();
            let body = read_limited(resp).await.map_err(Failure::Transport)?;
            if !status.is_success() {
                return Err(Failure::Status(status.as_u16()));
            }
            serde_json::from_slice::<serde::de::IgnoredAny>(&body)
                .map_err(|e| Failure::BadBody(e.to_string()))?;
            Ok(())
        };
        let outcome = match tokio::time::timeout(timeout, fut).await {
            Err(_) => Err(Failure::Timeout),
            Ok(r) => r,
        };
        ProbeResult {
            outcome,
            latency: started.elapsed(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // test_sim_inference.py: request-id format, bodies per role and profile.
    #[test]
    fn request_id_is_unix_microseconds() {
        let t = UNIX_EPOCH + Duration::from_micros(1_234_567_890_123_456);
        assert_eq!(request_id(t), "1234567890123456_virtual");
    }

    #[test]
    fn layerwise_decode_body_is_exact() {
        assert_eq!(
            request_body(Role::Decode, DispatchProfile::Trigger, "m"),
            json!({"model": "m", "prompt": "1", "max_tokens": 1,
                   "kv_transfer_params": {"do_remote_decode": false, "do_remote_prefill": true, "do_virtual": true}})
        );
    }

    #[test]
    fn other_roles_and_handoff_decode_send_the_plain_body() {
        let plain = json!({"model": "m", "prompt": "1", "max_tokens": 1});
        for (role, profile) in [
            (Role::Decode, DispatchProfile::Handoff),
            (Role::Decode, DispatchProfile::Unknown),
            (Role::Prefill, DispatchProfile::Trigger),
            (Role::Union, DispatchProfile::Handoff),
        ] {
            assert_eq!(
                request_body(role, profile, "m"),
                plain,
                "{role:?} {profile:?}"
            );
        }
    }
}

//! Who may call the admin listener: optionally a bearer token, a client certificate (mTLS),
//! or both (`[agent] admin_token_file`, `admin_tls`). `/healthz` stays open whatever is set,
//! so the kubelet's liveness probe needs no credentials. The mgmt listeners stay open:
//! Node Manager polls them without credentials.

use crate::config::AdminAuthConfig;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

/// Whether the connection a request came on presented a client certificate that the TLS
/// layer verified (set by `server::conn` on every request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ClientCert(pub bool);

/// What the admin listener requires, loaded from [`AdminAuthConfig`].
#[derive(Debug, Clone, Default)]
pub(crate) struct AdminAccess {
    token: Option<Vec<u8>>,
    client_cert: bool,
    /// Its TLS configuration (`admin_tls`).
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

impl AdminAccess {
    /// Reads the token file and the TLS files; errors name the key and the file.
    pub(crate) fn load(cfg: &AdminAuthConfig) -> Result<AdminAccess, String> {
        let token = match &cfg.token_file {
            None => None,
            Some(p) => Some(
                crate::config::read::token(p)
                    .map_err(|e| format!("[agent] admin_token_file: {e}"))?,
            ),
        };
        let tls = match &cfg.tls {
            None => None,
            Some(t) => Some(crate::tls::admin_server_config(t).map_err(|e| e.to_string())?),
        };
        Ok(AdminAccess {
            token,
            client_cert: cfg.tls.as_ref().is_some_and(|t| t.client_ca_file.is_some()),
            tls,
        })
    }

    /// Whether anything is required.
    pub(crate) fn required(&self) -> bool {
        self.token.is_some() || self.client_cert
    }

    /// For the start-up log line: `open`, `bearer token`, `client certificate`, or both.
    pub(crate) fn describe(&self) -> &'static str {
        match (self.token.is_some(), self.client_cert) {
            (false, false) => "open",
            (true, false) => "bearer token",
            (false, true) => "client certificate",
            (true, true) => "bearer token and client certificate",
        }
    }
}

/// Equal without an early exit on the first differing byte.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Why `req` may not pass, if it may not.
fn refusal(access: &AdminAccess, req: &Request) -> Option<Response> {
    if access.client_cert && req.extensions().get::<ClientCert>() != Some(&ClientCert(true)) {
        return Some(
            (
                StatusCode::FORBIDDEN,
                "a client certificate signed by admin_tls.client_ca_file is required\n",
            )
                .into_response(),
        );
    }
    if let Some(token) = &access.token {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| bearer_credentials(v.as_bytes()));
        if !given.is_some_and(|g| same(g.trim_ascii(), token)) {
            return Some(
                (
                    StatusCode::UNAUTHORIZED,
                    [(
                        header::WWW_AUTHENTICATE,
                        "Bearer realm=\"npu-health-agent\"",
                    )],
                    "a bearer token is required (Authorization: Bearer <admin_token_file>)\n",
                )
                    .into_response(),
            );
        }
    }
    None
}

/// The credentials of an `Authorization: Bearer <token>` value. The scheme is matched
/// without regard to case (RFC 9110 section 11.1, formerly RFC 7235), and one or more spaces
/// separate it from the token.
fn bearer_credentials(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(6)?;
    (scheme.eq_ignore_ascii_case(b"bearer") && rest.first() == Some(&b' '))
        .then(|| rest.trim_ascii_start())
}

/// The middleware in front of every admin route but `/healthz`.
pub(crate) async fn require(
    State(access): State<Arc<AdminAccess>>,
    req: Request,
    next: Next,
) -> Response {
    match refusal(&access, &req) {
        Some(r) => r,
        None => next.run(req).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(auth: Option<&str>, cert: Option<bool>) -> Request {
        let mut b = axum::http::Request::builder().uri("/metrics");
        if let Some(a) = auth {
            b = b.header(header::AUTHORIZATION, a);
        }
        let mut r = b.body(axum::body::Body::empty()).unwrap();
        if let Some(c) = cert {
            r.extensions_mut().insert(ClientCert(c));
        }
        r
    }

    fn access(token: Option<&str>, client_cert: bool) -> AdminAccess {
        AdminAccess {
            token: token.map(|t| t.as_bytes().to_vec()),
            client_cert,
            tls: None,
        }
    }

    #[test]
    fn each_requirement_is_checked_on_its_own_and_together() {
        let t = "0123456789abcdef0123";
        let bearer = format!("Bearer {t}");
        let code = |a: &AdminAccess, r: Request| refusal(a, &r).map(|r| r.status().as_u16());
        let open = access(None, false);
        assert_eq!(code(&open, req(None, None)), None);
        let tok = access(Some(t), false);
        assert_eq!(code(&tok, req(None, None)), Some(401));
        assert_eq!(
            code(&tok, req(Some("Bearer wrong-token-wrong-token"), None)),
            Some(401)
        );
        assert_eq!(
            code(&tok, req(Some(&format!("Basic {t}")), None)),
            Some(401)
        );
        assert_eq!(code(&tok, req(Some(&bearer), None)), None);
        let cert = access(None, true);
        assert_eq!(code(&cert, req(None, None)), Some(403));
        assert_eq!(code(&cert, req(None, Some(false))), Some(403));
        assert_eq!(code(&cert, req(None, Some(true))), None);
        let both = access(Some(t), true);
        assert_eq!(code(&both, req(Some(&bearer), Some(false))), Some(403));
        assert_eq!(code(&both, req(None, Some(true))), Some(401));
        assert_eq!(code(&both, req(Some(&bearer), Some(true))), None);
    }

    // Hardening round 2: the scheme in any case, as RFC 9110 has it (`bearer` was refused);
    // never a prefix of another scheme, never without the space.
    #[test]
    fn a_lowercase_bearer_scheme_is_accepted() {
        let t = "0123456789abcdef0123";
        let tok = access(Some(t), false);
        let code = |a: &AdminAccess, r: Request| refusal(a, &r).map(|r| r.status().as_u16());
        for scheme in ["bearer", "BEARER", "bEaReR"] {
            let a = format!("{scheme} {t}");
            assert_eq!(code(&tok, req(Some(&a), None)), None, "{a}");
        }
        for wrong in [
            format!("Bearer{t}"),
            format!("Bearerx {t}"),
            format!("bearer  {t}x"),
        ] {
            assert_eq!(code(&tok, req(Some(&wrong), None)), Some(401), "{wrong}");
        }
    }
}

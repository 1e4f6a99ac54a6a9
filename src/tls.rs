//! TLS from MindIE's TLS config objects (rustls with the `ring` provider).
//!
//! - `mgmt_tls_config` → the server side of `/status` (no client certificates required, as
//!   in the reference's server context);
//! - `infer_tls_config` → the client side of `/health` and the virtual request: the server is
//!   verified against `ca_file`, and the client presents `cert_file`/`key_file` when present.
//!
//! A `crl_file` is read and checked in both; the client uses it to reject a revoked engine
//! certificate, the server has no use for it (it asks for no client certificate).
//!
//! Keys must be unencrypted PEM (PKCS#8, PKCS#1 or SEC1). MindIE deployments often ship keys
//! encrypted with a password in `passwd_file`; those are refused at start with an error that
//! says how to convert them, rather than failing later.
//!
//! Files are read as every config file is ([`crate::config::read`]): regular files of at
//! most 4 MiB, so a FIFO named as a certificate cannot block the start.

use crate::config::mindie::TlsConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer};
use std::path::Path;
use std::sync::Arc;

/// A TLS configuration that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{config}: {message}")]
pub struct TlsError {
    /// `mgmt_tls_config` or `infer_tls_config`.
    pub config: &'static str,
    pub message: String,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read(path: &Path) -> Result<Vec<u8>, String> {
    crate::config::read::bytes(path).map_err(|e| format!("{} {e}", path.display()))
}

/// Reads every certificate of a PEM file.
pub(crate) fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<_> = CertificateDer::pem_slice_iter(&read(path)?)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: bad PEM: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no certificate in the file", path.display()));
    }
    Ok(certs)
}

/// Reads the CRLs of `crl_file` (none when the path is empty).
pub(crate) fn load_crls(path: &Path) -> Result<Vec<CertificateRevocationListDer<'static>>, String> {
    if path.as_os_str().is_empty() {
        return Ok(Vec::new());
    }
    let crls: Vec<_> = CertificateRevocationListDer::pem_slice_iter(
        &read(path).map_err(|e| format!("crl_file {e}"))?,
    )
    .collect::<Result<_, _>>()
    .map_err(|e| format!("crl_file {}: bad PEM: {e}", path.display()))?;
    if crls.is_empty() {
        return Err(format!("crl_file {}: no CRL in the file", path.display()));
    }
    Ok(crls)
}

/// Reads an unencrypted private key; an encrypted one is refused with a clear message.
pub(crate) fn load_key(path: &Path, passwd_file: &Path) -> Result<PrivateKeyDer<'static>, String> {
    let text = read(path).map_err(|e| format!("key_file {e}"))?;
    let s = String::from_utf8_lossy(&text);
    if s.contains("ENCRYPTED PRIVATE KEY") || s.contains("Proc-Type: 4,ENCRYPTED") {
        return Err(format!(
            "key_file {} is encrypted; npu-health-agent reads unencrypted PEM keys only and does not use passwd_file {}. \
             Decrypt it once (for example `openssl pkey -in {} -out server.key.pem`, entering the password) and point key_file at the result, readable by the agent only",
            path.display(),
            passwd_file.display(),
            path.display()
        ));
    }
    PrivateKeyDer::from_pem_slice(&text)
        .map_err(|e| format!("key_file {}: no usable private key ({e})", path.display()))
}

/// Server configuration for the mgmt listener.
pub(crate) fn server_config(tls: &TlsConfig) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let err = |message| TlsError {
        config: "mgmt_tls_config",
        message,
    };
    let certs = load_certs(&tls.cert_file).map_err(err)?;
    let key = load_key(&tls.key_file, &tls.passwd_file).map_err(err)?;
    if !load_crls(&tls.crl_file).map_err(err)?.is_empty() {
        tracing::info!(
            "mgmt_tls_config.crl_file is valid; it has no effect: the listener asks for no client certificate"
        );
    }
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| err(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| {
            err(format!(
                "certificate and key do not form a usable pair: {e}"
            ))
        })?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// Server configuration of the admin listener (`[agent] admin_tls`). With a client CA, a
/// client certificate is verified against it when presented; whether a route requires one is
/// the admin router's decision (`/healthz` stays open for probes that present none).
pub(crate) fn admin_server_config(
    tls: &crate::config::AdminTls,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let err = |message| TlsError {
        config: "admin_tls",
        message,
    };
    let certs = load_certs(&tls.cert_file).map_err(err)?;
    let key = load_key(&tls.key_file, Path::new("")).map_err(err)?;
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| err(e.to_string()))?;
    let builder = match &tls.client_ca_file {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in load_certs(ca).map_err(err)? {
                roots
                    .add(cert)
                    .map_err(|e| err(format!("client_ca_file {}: {e}", ca.display())))?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider(),
            )
            .allow_unauthenticated()
            .build()
            .map_err(|e| err(format!("client_ca_file {}: {e}", ca.display())))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut cfg = builder.with_single_cert(certs, key).map_err(|e| {
        err(format!(
            "certificate and key do not form a usable pair: {e}"
        ))
    })?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// Client configuration for the inference surface.
pub(crate) fn client_config(tls: &TlsConfig) -> Result<rustls::ClientConfig, TlsError> {
    let err = |message| TlsError {
        config: "infer_tls_config",
        message,
    };
    let mut roots = rustls::RootCertStore::empty();
    for cert in load_certs(&tls.ca_file).map_err(err)? {
        roots
            .add(cert)
            .map_err(|e| err(format!("ca_file {}: {e}", tls.ca_file.display())))?;
    }
    let crls = load_crls(&tls.crl_file).map_err(err)?;
    let verifier =
        rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider())
            .with_crls(crls)
            .build()
            .map_err(|e| err(format!("cannot build the certificate verifier: {e}")))?;
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| err(e.to_string()))?
        .with_webpki_verifier(verifier);
    let cfg = if tls.cert_file.exists() {
        let certs = load_certs(&tls.cert_file).map_err(err)?;
        let key = load_key(&tls.key_file, &tls.passwd_file).map_err(err)?;
        builder.with_client_auth_cert(certs, key).map_err(|e| {
            err(format!(
                "client certificate and key do not form a usable pair: {e}"
            ))
        })?
    } else {
        builder.with_no_client_auth()
    };
    Ok(cfg)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Writes a self-signed `server.crt` and `server.key` for `localhost` into `dir` (also
    /// used by the config validation's tests).
    pub(crate) fn write_pair(dir: &Path) -> TlsConfig {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        std::fs::write(dir.join("server.crt"), cert.pem()).unwrap();
        std::fs::write(dir.join("server.key"), key.serialize_pem()).unwrap();
        TlsConfig {
            enable_tls: true,
            ca_file: dir.join("server.crt"),
            cert_file: dir.join("server.crt"),
            key_file: dir.join("server.key"),
            passwd_file: dir.join("key_pwd.txt"),
            crl_file: Default::default(),
        }
    }

    #[test]
    fn server_and_client_configs_from_pem_files() {
        let d = tempfile::tempdir().unwrap();
        let tls = write_pair(d.path());
        server_config(&tls).unwrap();
        client_config(&tls).unwrap();
    }

    #[test]
    fn encrypted_keys_are_refused_with_a_way_out() {
        let d = tempfile::tempdir().unwrap();
        let tls = write_pair(d.path());
        std::fs::write(
            &tls.key_file,
            "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIB\n-----END ENCRYPTED PRIVATE KEY-----\n",
        )
        .unwrap();
        let e = server_config(&tls).unwrap_err().to_string();
        assert!(e.starts_with("mgmt_tls_config: key_file"), "{e}");
        assert!(
            e.contains("encrypted") && e.contains("openssl pkey") && e.contains("key_pwd.txt"),
            "{e}"
        );
    }

    #[test]
    fn crl_files_are_read_and_checked() {
        let d = tempfile::tempdir().unwrap();
        let mut tls = write_pair(d.path());
        tls.crl_file = d.path().join("missing.crl");
        let e = client_config(&tls).unwrap_err().to_string();
        assert!(e.contains("crl_file") && e.contains("missing.crl"), "{e}");
        assert!(server_config(&tls).is_err());
        std::fs::write(&tls.crl_file, "not a crl").unwrap();
        assert!(
            client_config(&tls)
                .unwrap_err()
                .to_string()
                .contains("no CRL")
        );
    }

    #[test]
    fn missing_files_name_the_config_and_the_path() {
        let tls = TlsConfig {
            enable_tls: true,
            ..TlsConfig::default()
        };
        let e = server_config(&tls).unwrap_err().to_string();
        assert!(
            e.contains("mgmt_tls_config") && e.contains("security/mgmt/cert/server.crt"),
            "{e}"
        );
        let e = client_config(&tls).unwrap_err().to_string();
        assert!(
            e.contains("infer_tls_config") && e.contains("ca.crt"),
            "{e}"
        );
    }
}

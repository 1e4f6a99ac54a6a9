//! What the configuration needs of the host, checked before it is used (at start, at a
//! reload, and by `check-config`): the admin listener's token and TLS files, every TLS file
//! an engine uses, read as the listeners and the client will read them, and the NPUs the
//! engines name. Here rather than in [`crate::config`], which knows only the text: loading
//! these files is the TLS layer's and the server's work, and the configuration does not
//! call up into them.

use crate::config::validate::devices_from;
use crate::config::{AgentConfig, ConfigError, EngineSpec, KeyError};

/// What needs the host: every TLS file an engine uses must be a readable regular file with
/// usable contents, and every NPU an engine names must be among `npus`, the logic ids the
/// driver reports. `npus` is `None` without a driver backend: the NPUs are not checked (the
/// agent then starts without NPU figures and virtual inference stays off).
pub fn host(cfg: &AgentConfig, npus: Option<&[u32]>) -> Result<(), ConfigError> {
    if cfg.agent.admin_listen.is_some() {
        // The token file and the TLS files, read as the listener will read them.
        crate::server::auth::AdminAccess::load(&cfg.agent.admin_auth)
            .map_err(|e| ConfigError::new(&cfg.source, "", e))?;
    }
    for (i, spec) in cfg.engines.iter().enumerate() {
        tls(spec).map_err(|(k, m)| cfg.engine_error(i, &k, m))?;
        if let (Some(found), Some(ids)) = (npus, &spec.devices.value)
            && let Some(id) = ids.iter().find(|id| !found.contains(id))
        {
            let from = devices_from(spec);
            return Err(cfg.engine_error(
                i,
                "devices",
                format!("NPU {id}{from} is not one the driver reports; NPUs found: {found:?}"),
            ));
        }
    }
    Ok(())
}

/// The TLS files of an engine: each named file readable (key `mgmt_tls_config.cert_file`,
/// …), then the material usable together.
fn tls(spec: &EngineSpec) -> Result<(), KeyError> {
    let origin = if spec.origin == "inline" {
        String::new()
    } else {
        format!(" (set in {})", spec.origin)
    };
    let file = |config: &str, key: &str, path: &std::path::Path| -> Result<(), KeyError> {
        crate::config::read::bytes(path).map(drop).map_err(|e| {
            (
                format!("{config}.{key}"),
                format!("{} {e}{origin}", path.display()),
            )
        })
    };
    let m = &spec.mgmt_tls_config;
    if m.enable_tls {
        file("mgmt_tls_config", "cert_file", &m.cert_file)?;
        file("mgmt_tls_config", "key_file", &m.key_file)?;
        if !m.crl_file.as_os_str().is_empty() {
            file("mgmt_tls_config", "crl_file", &m.crl_file)?;
        }
        crate::tls::server_config(m).map_err(|e| {
            (
                "mgmt_tls_config".to_owned(),
                format!("{}{origin}", e.message),
            )
        })?;
    }
    let c = &spec.infer_tls_config;
    if c.enable_tls {
        file("infer_tls_config", "ca_file", &c.ca_file)?;
        if !c.crl_file.as_os_str().is_empty() {
            file("infer_tls_config", "crl_file", &c.crl_file)?;
        }
        // The client certificate is optional (as for the reference's client context).
        if c.cert_file.exists() {
            file("infer_tls_config", "cert_file", &c.cert_file)?;
            file("infer_tls_config", "key_file", &c.key_file)?;
        }
        crate::tls::client_config(c).map_err(|e| {
            (
                "infer_tls_config".to_owned(),
                format!("{}{origin}", e.message),
            )
        })?;
    }
    Ok(())
}

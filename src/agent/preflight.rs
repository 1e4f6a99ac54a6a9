//! What the configuration needs of the host, checked before it is used (at start, at a
//! reload, and by `check-config`): the admin listener's token and TLS files, the Kubernetes
//! API mode's token and CA files (with `api_server`), every TLS file
//! an engine uses, read as the listeners and the client will read them, the NPUs the
//! engines name, and who may change the state directory (at start and by `check-config`;
//! what the agent's user may open is [`super::account`]'s).
//! Here rather than in [`crate::config`], which knows only the text: loading these files is
//! the TLS layer's and the server's work, and the configuration does not call up into them.

use super::account::Account;
use crate::config::engine::devices_from;
use crate::config::{AgentConfig, ConfigError, EngineSpec, KeyError};
use crate::continuity::StateDir;
use crate::continuity::trust::{Checked, Untrusted};

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
    for i in crate::integrations::REGISTRY {
        i.preflight(&cfg.agent)
            .map_err(|(key, m)| ConfigError::new(&cfg.source, key, m))?;
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

/// The state directory `run` uses (`None`: none), and whether it exists yet; refused when a
/// user other than the agent's could change it ([`crate::continuity::trust`]).
pub(crate) fn state_dir(cfg: &AgentConfig) -> Result<Option<(StateDir, Checked)>, ConfigError> {
    state_dir_as(cfg, None)
}

/// [`state_dir`] for an agent running as `account` (`check-config --user`; `None`: this
/// process's user). As root without `--user`, a directory of another user names the flag.
pub(crate) fn state_dir_as(
    cfg: &AgentConfig,
    account: Option<&Account>,
) -> Result<Option<(StateDir, Checked)>, ConfigError> {
    let Some(d) = StateDir::resolve(cfg.agent.state_dir.as_deref()) else {
        return Ok(None);
    };
    let checked = match account {
        Some(a) => d.check_as(crate::continuity::trust::User(a.uid)),
        None => d.check(),
    };
    let checked = checked.map_err(|e| {
        let mut err = untrusted(cfg, &d, e.clone());
        if let (None, Untrusted::NotOwned { owner, .. }) = (account, &e)
            && owner.0 != 0
            && rustix::process::geteuid().is_root()
        {
            err.message.push_str(&format!(
                "; if the agent runs as {owner} (the package's unit runs it as npu-health-agent), check as it does: `check-config --user <that user>`"
            ));
        }
        err
    })?;
    Ok(Some((d, checked)))
}

/// The error for a state directory another user could change, at the setting that names it.
pub(crate) fn untrusted(cfg: &AgentConfig, d: &StateDir, e: Untrusted) -> ConfigError {
    ConfigError::new(&cfg.source, d.from, e.to_string())
}

/// Every listener the configuration asks for, bound and released at once, as `run` will
/// bind it: a port in use or an address that is not on this host fails here, naming the
/// key. A port in use is put to the kernel (who holds it, [`super::holders`]): one that the
/// agent running with the same state directory holds at that address is fine (a new agent
/// takes its sockets over), returned as a note; any other holder fails, named.
pub(crate) fn listeners(cfg: &AgentConfig) -> Result<Vec<String>, ConfigError> {
    use std::io::ErrorKind::{AddrInUse, AddrNotAvailable};
    let dir = crate::continuity::StateDir::resolve(cfg.agent.state_dir.as_deref());
    let dir = dir.as_ref().map(|d| (d.path(), d.from));
    // (address, what, the address's key, where an error goes)
    let mut wanted: Vec<(std::net::SocketAddr, String, &str, Site)> = Vec::new();
    if let Some(a) = cfg.agent.admin_listen {
        let site = Site::Agent("[agent] admin_listen");
        wanted.push((a, "the admin listener".into(), "admin_listen", site));
    }
    for l in crate::integrations::REGISTRY
        .iter()
        .filter_map(|i| i.listen(&cfg.agent))
    {
        wanted.push((l.addr, l.label.into(), l.key, Site::Agent(l.key)));
    }
    for (i, spec) in cfg.engines.iter().enumerate() {
        // The address is mgmt_host's, else host's (the engine's); the port mgmt_port's.
        let what = format!("engine {}'s /status", spec.name);
        let addr_key = "mgmt_host, which defaults to host";
        wanted.push((spec.mgmt_listen, what, addr_key, Site::Engine(i)));
    }
    let addrs: Vec<_> = wanted.iter().map(|w| w.0).collect();
    // The kernel's view, read once, at the first port in use.
    let mut seen = None;
    let mut notes = Vec::new();
    for (addr, what, addr_key, site) in &wanted {
        let e = match std::net::TcpListener::bind(addr) {
            Ok(_) => continue,
            Err(e) => e,
        };
        let at = format!("cannot listen on {addr} for {what}: {e}");
        match e.kind() {
            AddrInUse => {
                let seen = seen.get_or_insert_with(|| {
                    super::holders::Seen::read(&crate::proc_sockets::ProcRoot::default(), &addrs)
                });
                match super::holders::in_use(*addr, what, seen, dir) {
                    Ok(note) => notes.push(note),
                    Err(why) => return Err(site.error(cfg, false, format!("{at}: {why}"))),
                }
            }
            AddrNotAvailable => {
                let m = format!(
                    "{at}: {} is not an address of this host (see {addr_key})",
                    addr.ip()
                );
                return Err(site.error(cfg, true, m));
            }
            _ => return Err(site.error(cfg, false, at)),
        }
    }
    Ok(notes)
}

/// Where a listener's error is told: a key of `[agent]` (or an integration's), or an
/// engine's `mgmt_host` (the address is not on this host) or `mgmt_port`.
enum Site {
    Agent(&'static str),
    Engine(usize),
}

impl Site {
    fn error(&self, cfg: &AgentConfig, not_here: bool, m: String) -> ConfigError {
        match self {
            Site::Agent(key) => ConfigError::new(&cfg.source, *key, m),
            Site::Engine(i) => {
                cfg.engine_error(*i, if not_here { "mgmt_host" } else { "mgmt_port" }, m)
            }
        }
    }
}

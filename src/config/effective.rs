//! The whole effective configuration ([`AgentConfig`]): the agent's settings and every
//! engine, from `agent.toml` or from the engine-server flags ([`AgentConfig::single`]), and
//! the checks only the whole shows (names and addresses between engines and the agent).

use super::agent::AgentSettings;
use super::engine::{
    EngineEnv, EngineLocation, EngineSpec, PolicyChoice, Sourced, build_engine, listen_addr,
};
use super::error::{engine_place, single_place};
use super::mindie::Role;
use super::qos::QosConfig;
use super::timing::Timing;
use super::{ConfigError, Form, KeyError, policy, resolve, tables};
use serde::Serialize;
use std::net::SocketAddr;
use std::path::PathBuf;

/// The whole effective configuration.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AgentConfig {
    /// File the configuration was read from (for messages).
    pub source: String,
    #[serde(skip)]
    pub form: Form,
    pub agent: AgentSettings,
    pub engines: Vec<EngineSpec>,
}

impl AgentConfig {
    /// An error about `key` of engine `index` (a path inside its table: `timing.window`).
    pub(crate) fn engine_error(
        &self,
        index: usize,
        key: &str,
        message: impl Into<String>,
    ) -> ConfigError {
        ConfigError::new(&self.source, self.engine_place(index, key), message)
    }

    /// Where `key` of engine `index` is set: `[[engine]] #2 (decode-0) timing.window` in
    /// `agent.toml`, the flag (or the key of `user_config.json`) in single-engine mode.
    pub fn engine_place(&self, index: usize, key: &str) -> String {
        match self.form {
            Form::Host => {
                engine_place(index, self.engines.get(index).map(|e| e.name.as_str()), key)
            }
            Form::Single => single_place(key),
        }
    }
}

/// Flags of single-engine mode (mirroring MindIE's engine server).
#[derive(Debug, Clone)]
pub struct SingleEngine {
    pub config_path: PathBuf,
    pub role: Role,
    pub host: String,
    pub port: u16,
    pub mgmt_port: u16,
    pub dp_rank: u32,
    pub devices: Option<Vec<u32>>,
    pub env_config_path: Option<PathBuf>,
    /// QoS settings (defaults, or the `--qos-*`/`--stall-*` flags).
    pub qos: QosConfig,
    /// The `[engine.qos]` keys the flags set (the policy's preset leaves them alone).
    pub qos_set: Vec<String>,
}

impl AgentConfig {
    /// Single-engine mode: one engine from `user_config.json` and flags.
    pub(crate) fn single(
        flags: &SingleEngine,
        agent: AgentSettings,
    ) -> Result<AgentConfig, ConfigError> {
        let file = flags.config_path.display().to_string();
        let key_error = |(k, m): KeyError| ConfigError::new(&file, single_place(&k), m);
        // MindIE's engine server refuses a symlinked --config-path; so does this mode.
        if std::fs::symlink_metadata(&flags.config_path).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(ConfigError::new(
                &file,
                "",
                "is a symlink; --config-path must name the file itself (as MindIE's engine server requires)",
            ));
        }
        let section = resolve::user_config(&flags.config_path, flags.role)
            .map_err(|e| ConfigError::new(&file, "", e))?;
        let engine_env = match &flags.env_config_path {
            Some(p) => EngineEnv::EnvJson {
                path: p.clone(),
                doc: resolve::env_json(p)
                    .map_err(|e| ConfigError::new(p.display().to_string(), "", e))?,
            },
            None => EngineEnv::AgentProcess,
        };
        let mgmt_listen = listen_addr(&flags.host, flags.mgmt_port)
            .map_err(|e| ConfigError::new(&file, "--host", e))?;
        let spec = build_engine(
            format!("{}-{}", flags.role.as_str(), flags.dp_rank),
            flags.role,
            section,
            EngineLocation {
                host: flags.host.clone(),
                port: flags.port,
                mgmt_listen,
                dp_rank: flags.dp_rank,
            },
            flags.devices.clone(),
            engine_env,
            Timing::default(),
            flags.qos.clone(),
            PolicyChoice {
                policy: Sourced {
                    value: agent.policy,
                    source: "--policy".to_owned(),
                },
                shadow: agent.shadow_policy,
                agent_policy: policy::AgentPolicy::default(),
                qos_set: flags.qos_set.clone(),
            },
            tables::Tables::defaults(&tables::listed(), tables::At::Engine),
            format!("{file} ({})", flags.role.section()),
        )
        .map_err(key_error)?;
        let cfg = AgentConfig {
            source: file.clone(),
            form: Form::Single,
            agent,
            engines: vec![spec],
        };
        cfg.validate_across()?;
        Ok(cfg)
    }
}

/// Whether two listen addresses would take the same socket: the same port, and the same IP
/// or either unspecified (`0.0.0.0`, `::`). Port 0 (any free port) never clashes.
fn same_socket(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() != 0
        && a.port() == b.port()
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

impl AgentConfig {
    /// Checks between engines and the agent: names used once, mgmt ports used once and not the
    /// admin listener's, and no inference address that is a listener of the agent's own.
    pub(crate) fn validate_across(&self) -> Result<(), ConfigError> {
        let infer: Vec<Option<SocketAddr>> = self
            .engines
            .iter()
            .map(|e| listen_addr(&e.host, e.port).ok())
            .collect();
        self.engines_apart(&infer)?;
        self.own_listeners_apart(&infer)
    }

    /// Engines among themselves: names and mgmt ports used once, and no engine probing a
    /// mgmt listener (its own or another's). `infer` is each engine's inference address.
    fn engines_apart(&self, infer: &[Option<SocketAddr>]) -> Result<(), ConfigError> {
        let cfg = self;
        for (i, a) in cfg.engines.iter().enumerate() {
            for b in &cfg.engines[..i] {
                if a.name == b.name {
                    return Err(cfg.engine_error(i, "name", format!("{:?} is used twice", a.name)));
                }
                if a.mgmt_listen.port() == b.mgmt_listen.port() {
                    return Err(cfg.engine_error(
                        i,
                        "mgmt_port",
                        format!(
                            "`{}` is also the mgmt_port of engine {:?}",
                            a.mgmt_listen.port(),
                            b.name
                        ),
                    ));
                }
            }
            let Some(at) = infer[i] else { continue };
            if same_socket(at, a.mgmt_listen) {
                return Err(cfg.engine_error(
                i,
                "port",
                format!(
                    "`{}` is also this engine's mgmt_port on {}: the agent would probe its own listener",
                    a.port,
                    a.mgmt_listen.ip()
                ),
            ));
            }
            if let Some(b) = cfg
                .engines
                .iter()
                .find(|b| b.name != a.name && same_socket(at, b.mgmt_listen))
            {
                return Err(cfg.engine_error(
                i,
                "port",
                format!(
                    "`{}` is the mgmt_port of engine {:?} ({}): the agent would probe its own listener",
                    a.port, b.name, b.mgmt_listen
                ),
            ));
            }
        }
        Ok(())
    }

    /// The agent's own listeners (admin, HAProxy agent-check): not an engine's mgmt port nor
    /// its inference address, and not each other's. `infer` is each engine's inference
    /// address.
    fn own_listeners_apart(&self, infer: &[Option<SocketAddr>]) -> Result<(), ConfigError> {
        let cfg = self;
        let admin_place = match cfg.form {
            Form::Host => "[agent] admin_listen",
            Form::Single => "--admin-listen",
        };
        let haproxy_place = match cfg.form {
            Form::Host => "[agent] haproxy_agent_listen",
            Form::Single => "--haproxy-agent-listen",
        };
        let own: Vec<(&str, SocketAddr)> = [
            (admin_place, cfg.agent.admin_listen),
            (haproxy_place, cfg.agent.haproxy_agent_listen),
        ]
        .into_iter()
        .filter_map(|(place, a)| a.map(|a| (place, a)))
        .collect();
        for (i, &(place, addr)) in own.iter().enumerate() {
            if let Some(e) = cfg
                .engines
                .iter()
                .find(|e| addr.port() != 0 && e.mgmt_listen.port() == addr.port())
            {
                return Err(ConfigError::new(
                    &cfg.source,
                    place,
                    format!(
                        "port `{}` is also the mgmt_port of engine {:?}",
                        addr.port(),
                        e.name
                    ),
                ));
            }
            if let Some((e, _)) = cfg
                .engines
                .iter()
                .zip(infer)
                .find(|(_, at)| at.is_some_and(|at| same_socket(addr, at)))
            {
                return Err(ConfigError::new(
                    &cfg.source,
                    place,
                    format!(
                        "`{addr}` is the inference address of engine {:?}: the agent would probe its own listener",
                        e.name
                    ),
                ));
            }
            if let Some((other, _)) = own[..i].iter().find(|(_, b)| same_socket(addr, *b)) {
                return Err(ConfigError::new(
                    &cfg.source,
                    place,
                    format!("`{addr}` is also {other}"),
                ));
            }
        }
        Ok(())
    }
}

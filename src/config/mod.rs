//! Configuration: what the agent monitors and how.
//!
//! Two ways in, one result ([`AgentConfig`]):
//! - single-engine mode mirrors MindIE's engine-server flags (`--config-path user_config.json
//!   --role … --host … --port … --mgmt-port …`) and reads that role's section ([`mindie`]);
//! - host mode reads `agent.toml` ([`file`]) with an `[agent]` table and any number of
//!   `[[engine]]` tables, each pointing at a `user_config.json` + role or carrying the keys
//!   inline.
//!
//! Every error names the file, the table and the key; [`validate`] holds the checks both
//! `check-config` and `run` apply, [`read`] how every file named is read.

pub mod actions;
pub mod bounds;
pub mod duration;
mod error;
pub mod file;
pub mod kubernetes;
pub mod mindie;
pub mod policy;
pub mod qos;
pub mod read;
pub mod resolve;
pub mod unknown;
pub mod validate;

use error::single_place;
pub use error::{ConfigError, Form, KeyError, engine_place};
use mindie::{DispatchProfile, EngineSection, EngineType, HealthCheckConfig, Role, TlsConfig};
use qos::QosConfig;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// `--backend`: which sources the agent may use.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum BackendChoice {
    /// DCMI where it works, `npu-smi` for the rest.
    #[default]
    Auto,
    /// DCMI only; devices without AI Cube calls report no figures.
    Dcmi,
    /// `npu-smi` only; `libdcmi.so` is not loaded.
    NpuSmi,
}

/// Default for how long a blocked DCMI call or a silent sampler thread is tolerated before
/// the agent calls itself unhealthy (`/healthz` 503, systemd watchdog pings stop).
pub const DEFAULT_SAMPLER_STUCK_AFTER: Duration = Duration::from_secs(10);

/// Whether `directives` is a valid level filter (`[agent] log_level`, and a reload's).
pub fn check_log_filter(directives: &str) -> Result<(), String> {
    tracing_subscriber::EnvFilter::try_new(directives)
        .map(|_| ())
        .map_err(|e| format!("{directives:?} is not a valid filter like \"info\" or \"warn,npu_health_agent=debug\": {e}"))
}

/// Virtual-inference timing. Defaults equal the reference's constants (V5); every value is
/// configurable so tests can compress time. Also `[engine.timing]` as read: a key left out
/// keeps its default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Timing {
    /// Timeout of the warm-up request. Reference: 180 s.
    #[serde(with = "duration")]
    pub warmup_timeout: Duration,
    /// Timeout of each periodic request. Reference: 5 s.
    #[serde(with = "duration")]
    pub request_timeout: Duration,
    /// AI Cube peak window. Reference: 5 s.
    #[serde(with = "duration")]
    pub window: Duration,
    /// Sleep between probes. Reference: 5 s.
    #[serde(with = "duration")]
    pub interval: Duration,
    /// Sleep between probes while the NPU is busy. Reference: 20 s.
    #[serde(with = "duration")]
    pub high_load_interval: Duration,
    /// Peak (percent) at or above which the busy interval applies. Reference: 80.
    pub high_load_threshold: f64,
    /// How often the agent probes the engine's `/health` in the background. Not in the
    /// reference (it probes on every `/status`); default 1 s.
    #[serde(with = "duration")]
    pub health_period: Duration,
    /// Overrides `health_check_config.health_collector_timeout` (whole seconds there) with
    /// any duration, so tests and the chaos suite can compress it. Default: not set.
    #[serde(with = "duration::option")]
    pub health_timeout: Option<Duration>,
    /// A `/health` that only times out is not abnormal while the engine shows it serves
    /// within this long (a periodic virtual request succeeded, or tokens advance). Default:
    /// twice `high_load_interval`; `"0s"` turns the rule off (the reference's verdict).
    #[serde(with = "duration::option")]
    pub serving_evidence_max_age: Option<Duration>,
}

impl Timing {
    /// How old evidence of serving may be to excuse a `/health` timeout (zero: never).
    pub fn serving_evidence_max_age(&self) -> Duration {
        self.serving_evidence_max_age
            .unwrap_or(self.high_load_interval * 2)
    }
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            warmup_timeout: Duration::from_secs(180),
            request_timeout: Duration::from_secs(5),
            window: Duration::from_secs(5),
            interval: Duration::from_secs(5),
            high_load_interval: Duration::from_secs(20),
            high_load_threshold: 80.0,
            health_period: Duration::from_secs(1),
            health_timeout: None,
            serving_evidence_max_age: None,
        }
    }
}

/// Where an engine setting came from (shown by `check-config` and `doctor`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Sourced<T> {
    pub value: T,
    pub source: String,
}

/// How the engine's environment is known to the agent.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum EngineEnv {
    /// An `engine_env` table in the agent config: the engine's environment as given.
    Table { vars: BTreeMap<String, String> },
    /// MindIE's `env.json`: the role's section, else `motor_common_env`.
    EnvJson {
        path: PathBuf,
        #[serde(skip)]
        doc: serde_json::Value,
    },
    /// Nothing configured: the agent's own environment.
    AgentProcess,
}

impl EngineEnv {
    /// Looks `key` up; the first configured source is authoritative (a key missing from an
    /// `engine_env` table or from `env.json` is unset, not looked up elsewhere).
    pub fn lookup(&self, role: Role, key: &str) -> Option<Sourced<String>> {
        match self {
            EngineEnv::Table { vars } => vars.get(key).map(|v| Sourced {
                value: v.clone(),
                source: "engine_env".to_owned(),
            }),
            EngineEnv::EnvJson { path, doc } => {
                mindie::env_json_lookup(doc, role, key).map(|(value, section)| Sourced {
                    value,
                    source: format!("{} {section}", path.display()),
                })
            }
            EngineEnv::AgentProcess => resolve::process_env(key),
        }
    }

    /// Human description of the source.
    pub fn describe(&self) -> String {
        match self {
            EngineEnv::Table { .. } => "engine_env table".to_owned(),
            EngineEnv::EnvJson { path, .. } => format!("env.json {}", path.display()),
            EngineEnv::AgentProcess => "agent environment".to_owned(),
        }
    }
}

/// Everything the agent knows about one engine.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EngineSpec {
    /// Name used in logs, metrics and `/status/detail`.
    pub name: String,
    pub role: Role,
    pub engine_type: EngineType,
    pub dispatch_profile: DispatchProfile,
    /// Model name sent in the virtual request.
    pub model: Option<String>,
    pub headless: bool,
    pub dp_rank: u32,
    pub health_check_config: HealthCheckConfig,
    /// Inference surface (`/health`, `/v1/completions`).
    pub host: String,
    pub port: u16,
    pub infer_tls_config: TlsConfig,
    /// Where `/status` is served.
    pub mgmt_listen: SocketAddr,
    pub mgmt_tls_config: TlsConfig,
    /// The engine's NPUs (logic ids): explicit `devices`, else `ASCEND_RT_VISIBLE_DEVICES` of
    /// the engine environment, else every NPU of the host.
    pub devices: Sourced<Option<Vec<u32>>>,
    pub engine_env: EngineEnv,
    pub timing: Timing,
    /// QoS score, levels and stall detection (`[engine.qos]`).
    pub qos: QosConfig,
    /// The detection policy in force, and where that came from.
    pub policy: Sourced<policy::Policy>,
    /// The agent policy's settings (`[engine.agent_policy]`; used under `agent` only).
    pub agent_policy: policy::AgentPolicy,
    /// What the verdict and the levels do through the kubelet and Kubernetes
    /// (`[engine.actions]`).
    pub actions: actions::ActionsConfig,
    /// How the engine's pod is found in the Kubernetes API mode (`[engine.kubernetes]`).
    pub pod: kubernetes::PodSelector,
    /// The file (and role) the engine section came from, or `inline`.
    pub origin: String,
}

impl EngineSpec {
    /// The agent policy's settings if that policy is in force; `None` under `reference`.
    /// The one place the policy switch is read for behaviour.
    pub fn agent_policy_in_force(&self) -> Option<&policy::AgentPolicy> {
        (self.policy.value == policy::Policy::Agent).then_some(&self.agent_policy)
    }

    /// `host:port` of the inference surface, IPv6 bracketed.
    pub fn infer_authority(&self) -> String {
        if self.host.contains(':') && !self.host.starts_with('[') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// The engine's base URL (`http://10.0.0.5:8000`): what identifies the engine to the agent.
    pub fn engine_url(&self) -> String {
        let scheme = if self.infer_tls_config.enable_tls {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}", self.infer_authority())
    }
}

/// Agent-wide settings (`[agent]` table or global flags).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AgentSettings {
    #[serde(with = "duration")]
    pub sample_period: Duration,
    pub dcmi_lib: Option<PathBuf>,
    pub npu_smi: PathBuf,
    pub backend: BackendChoice,
    pub dcmi_no_owner_check: bool,
    pub npu_smi_delay: u32,
    /// Admin/metrics listener (all engines' metrics, `/healthz`); none by default.
    pub admin_listen: Option<SocketAddr>,
    /// HAProxy's agent-check listener, for every engine (`server::agent_check`); none by
    /// default.
    pub haproxy_agent_listen: Option<SocketAddr>,
    /// Tokio worker threads.
    pub worker_threads: usize,
    /// Run the DCMI sampler thread under `SCHED_FIFO` when permitted.
    pub sampler_realtime: bool,
    /// A DCMI call blocking longer marks its NPU stale (hung). Default 1 s.
    #[serde(with = "duration")]
    pub driver_call_deadline: Duration,
    /// Time between reads of the driver's fault codes (at least 5 s through `npu-smi`).
    /// Default 1 s (docs/fault-codes.md).
    #[serde(with = "duration")]
    pub fault_period: Duration,
    /// A DCMI call blocked this long, or no sampling pass for this long, makes the agent
    /// unhealthy: `/healthz` answers 503 and the systemd watchdog pings stop. Default 10 s.
    #[serde(with = "duration")]
    pub sampler_stuck_after: Duration,
    /// Level filter (`RUST_LOG` syntax) when `RUST_LOG` is not set; default `info`.
    pub log_level: Option<String>,
    /// Connection limits of every listener the agent serves (mgmt, admin, TLS).
    pub listeners: ListenerLimits,
    /// Who may call the admin listener (`admin_token_file`, `admin_tls`).
    pub admin_auth: AdminAuthConfig,
    /// The detection policy of every engine that does not name its own. Default `agent`.
    pub policy: policy::Policy,
    /// The Kubernetes API mode (`[agent.kubernetes]`); `None`: off.
    pub kubernetes: Option<kubernetes::KubernetesConfig>,
    /// Where the state file and the handover socket live (`continuity`); `None`: systemd's
    /// `RUNTIME_DIRECTORY` if set, else nothing survives a restart of the agent.
    pub state_dir: Option<PathBuf>,
    /// MindCluster's `faultCode.json` (the levels of the driver's fault codes); `None`: its
    /// install path if the file is there, else the built-in table (docs/fault-codes.md).
    pub fault_code_file: Option<PathBuf>,
}

/// Access to the admin listener. With neither key it is open (bind it to loopback then);
/// `/healthz` always stays open, for liveness probes.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct AdminAuthConfig {
    /// A file holding the bearer token every other route requires.
    pub token_file: Option<PathBuf>,
    /// HTTPS on the admin listener; with `client_ca_file`, a client certificate signed by it.
    pub tls: Option<AdminTls>,
}

/// `[agent] admin_tls`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminTls {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// Routes other than `/healthz` require a client certificate signed by this CA.
    pub client_ca_file: Option<PathBuf>,
}

/// Connection limits of one listener (`[agent] max_connections`, `header_read_timeout`,
/// `idle_timeout`, `stall_timeout`; see `server::conn`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ListenerLimits {
    /// Concurrent connections per listener; past it the least recently active idle
    /// connection is closed to make room.
    pub max_connections: usize,
    /// A request's headers must arrive within this (also bounds a TLS handshake).
    #[serde(with = "duration")]
    pub header_read_timeout: Duration,
    /// A connection with no byte read or written for this long is closed.
    #[serde(with = "duration")]
    pub idle_timeout: Duration,
    /// A connection whose peer takes nothing more of what the agent sends (its receive
    /// window stays closed), or leaves sent data unacknowledged, for this long is closed by
    /// the kernel (`TCP_USER_TIMEOUT`).
    #[serde(with = "duration")]
    pub stall_timeout: Duration,
}

impl Default for ListenerLimits {
    fn default() -> Self {
        ListenerLimits {
            max_connections: 256,
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            stall_timeout: Duration::from_secs(20),
        }
    }
}

impl Default for AgentSettings {
    fn default() -> Self {
        AgentSettings {
            sample_period: Duration::from_millis(50),
            dcmi_lib: None,
            npu_smi: PathBuf::from("npu-smi"),
            backend: BackendChoice::Auto,
            dcmi_no_owner_check: false,
            npu_smi_delay: 1,
            admin_listen: None,
            haproxy_agent_listen: None,
            worker_threads: 2,
            sampler_realtime: true,
            driver_call_deadline: Duration::from_secs(1),
            fault_period: Duration::from_secs(1),
            sampler_stuck_after: DEFAULT_SAMPLER_STUCK_AFTER,
            log_level: None,
            listeners: ListenerLimits::default(),
            admin_auth: AdminAuthConfig::default(),
            policy: policy::Policy::default(),
            kubernetes: None,
            state_dir: None,
            fault_code_file: None,
        }
    }
}

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
    pub fn engine_error(&self, index: usize, key: &str, message: impl Into<String>) -> ConfigError {
        let place = match self.form {
            Form::Host => {
                engine_place(index, self.engines.get(index).map(|e| e.name.as_str()), key)
            }
            Form::Single => single_place(key),
        };
        ConfigError::new(&self.source, place, message)
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
    pub fn single(flags: &SingleEngine, agent: AgentSettings) -> Result<AgentConfig, ConfigError> {
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
            Some(p) => resolve::env_json(p.clone())
                .map_err(|e| ConfigError::new(p.display().to_string(), "", e))?,
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
                agent_policy: policy::AgentPolicy::default(),
                qos_set: flags.qos_set.clone(),
            },
            actions::EngineActions::default(),
            format!("{file} ({})", flags.role.section()),
        )
        .map_err(key_error)?;
        let cfg = AgentConfig {
            source: file.clone(),
            form: Form::Single,
            agent,
            engines: vec![spec],
        };
        validate::across(&cfg)?;
        Ok(cfg)
    }
}

/// Where an engine listens.
#[derive(Debug, Clone)]
pub struct EngineLocation {
    pub host: String,
    pub port: u16,
    pub mgmt_listen: SocketAddr,
    pub dp_rank: u32,
}

/// Parses `host` + `port` into a listen address (IPv6 literals with or without brackets).
pub fn listen_addr(host: &str, port: u16) -> Result<SocketAddr, String> {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    let ip: std::net::IpAddr = h
        .parse()
        .map_err(|_| format!("host {host:?} must be an IPv4 or IPv6 address"))?;
    Ok(SocketAddr::new(ip, port))
}

/// Parses `ASCEND_RT_VISIBLE_DEVICES` (`0,1,2`).
pub fn parse_visible_devices(s: &str) -> Result<Vec<u32>, String> {
    s.split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|t| {
            t.parse::<u32>()
                .map_err(|_| format!("{t:?} is not an NPU id"))
        })
        .collect::<Result<Vec<u32>, String>>()
        .and_then(|v| {
            if v.is_empty() {
                Err("no NPU id".to_owned())
            } else {
                Ok(v)
            }
        })
}

/// An engine's policy as configured: the policy and where it came from, its settings, and
/// the `[engine.qos]` keys written (the preset leaves those alone).
#[derive(Debug, Clone)]
pub struct PolicyChoice {
    pub policy: Sourced<policy::Policy>,
    pub agent_policy: policy::AgentPolicy,
    pub qos_set: Vec<String>,
}

#[allow(clippy::too_many_arguments)]
fn build_engine(
    name: String,
    role: Role,
    section: EngineSection,
    at: EngineLocation,
    devices: Option<Vec<u32>>,
    engine_env: EngineEnv,
    timing: Timing,
    mut qos: QosConfig,
    choice: PolicyChoice,
    acts: actions::EngineActions,
    origin: String,
) -> Result<EngineSpec, KeyError> {
    acts.actions
        .validate()
        .map_err(|(k, m)| (format!("actions.{k}"), m))?;
    acts.pod
        .validate()
        .map_err(|(k, m)| (format!("kubernetes.{k}"), m))?;
    policy::apply_preset(choice.policy.value, &mut qos, &choice.qos_set);
    choice
        .agent_policy
        .validate()
        .map_err(|(k, m)| (format!("agent_policy.{k}"), m))?;
    let devices = match devices {
        Some(d) => Sourced {
            value: Some(d),
            source: "devices".to_owned(),
        },
        None => match engine_env.lookup(role, "ASCEND_RT_VISIBLE_DEVICES") {
            Some(v) => Sourced {
                value: Some(parse_visible_devices(&v.value).map_err(|e| {
                    (
                        "devices".to_owned(),
                        format!("ASCEND_RT_VISIBLE_DEVICES from {}: {e}", v.source),
                    )
                })?),
                source: format!("ASCEND_RT_VISIBLE_DEVICES from {}", v.source),
            },
            None => Sourced {
                value: None,
                source: "every NPU of the host (no devices, no ASCEND_RT_VISIBLE_DEVICES)"
                    .to_owned(),
            },
        },
    };
    if section.health_check_config.enable_virtual_inference
        && section.engine_type == EngineType::Vllm
        && section.model.is_none()
    {
        return Err((
            String::new(),
            "engine_config.served_model_name (or model) is needed: the virtual request names the model".to_owned(),
        ));
    }
    let spec = EngineSpec {
        name,
        role,
        engine_type: section.engine_type,
        dispatch_profile: section.dispatch_profile,
        model: section.model,
        headless: section.headless,
        dp_rank: at.dp_rank,
        health_check_config: section.health_check_config,
        host: at.host,
        port: at.port,
        infer_tls_config: section.infer_tls_config,
        mgmt_listen: at.mgmt_listen,
        mgmt_tls_config: section.mgmt_tls_config,
        devices,
        engine_env,
        timing,
        qos,
        policy: choice.policy,
        agent_policy: choice.agent_policy,
        actions: acts.actions,
        pod: acts.pod,
        origin,
    };
    validate::engine(&spec)?;
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn visible_devices() {
        assert_eq!(parse_visible_devices("0,1, 3").unwrap(), vec![0, 1, 3]);
        assert!(parse_visible_devices("0,x").unwrap_err().contains("\"x\""));
        assert!(parse_visible_devices("").is_err());
    }

    #[test]
    fn listen_addresses() {
        assert_eq!(
            listen_addr("127.0.0.1", 9001).unwrap().to_string(),
            "127.0.0.1:9001"
        );
        assert_eq!(
            listen_addr("[::1]", 9001).unwrap().to_string(),
            "[::1]:9001"
        );
        assert!(
            listen_addr("localhost", 1)
                .unwrap_err()
                .contains("IPv4 or IPv6")
        );
    }

    #[test]
    fn env_sources_are_authoritative() {
        let table = EngineEnv::Table {
            vars: BTreeMap::from([("A".to_owned(), "1".to_owned())]),
        };
        assert_eq!(table.lookup(Role::Prefill, "A").unwrap().value, "1");
        // PATH is set for the agent but the table is the engine's whole environment.
        assert_eq!(table.lookup(Role::Prefill, "PATH"), None);
        assert!(
            EngineEnv::AgentProcess
                .lookup(Role::Prefill, "PATH")
                .is_some()
        );
    }
}

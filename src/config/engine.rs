//! An engine: where it is and what it runs ([`EngineSpec`]), built from its table or from
//! the engine-server flags ([`build_engine`]), its bounds and its check.

use super::engine_type::EngineType;
use super::mindie::{self, DispatchProfile, EngineSection, HealthCheckConfig, Role, TlsConfig};
use super::qos::QosConfig;
use super::tables::Tables;
use super::timing::Timing;
use super::{KeyError, policy, resolve};
use serde::Serialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

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
    pub(crate) fn lookup(&self, role: Role, key: &str) -> Option<Sourced<String>> {
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
            EngineEnv::AgentProcess => resolve::process_env(key).map(|value| Sourced {
                value,
                source: "agent environment".to_owned(),
            }),
        }
    }

    /// Human description of the source.
    pub(crate) fn describe(&self) -> String {
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
    /// The rules applied by the policy in force, and by the shadow (rules in `observe`, or
    /// `shadow_policy`), when there is one.
    pub judging: policy::Judgings,
    /// The integrations' tables (`[engine.actions]`, `[engine.kubernetes]`), each the
    /// integration's own type: `HaproxyMap::of(spec)`, shown as `actions` and `pod`.
    #[serde(flatten)]
    pub(crate) tables: Tables,
    /// The file (and role) the engine section came from, or `inline`.
    pub origin: String,
}

impl EngineSpec {
    /// The agent policy's settings if that policy is in force; `None` under `reference`.
    /// The one place the policy switch is read for behaviour.
    pub(crate) fn agent_policy_in_force(&self) -> Option<&policy::AgentPolicy> {
        (self.policy.value == policy::Policy::Agent).then_some(&self.agent_policy)
    }

    /// Recomputes the judgings after a test changed the policy or the `[engine.qos]` switches
    /// of a parsed spec (the file's written keys are not known here: none).
    #[cfg(test)]
    pub(crate) fn rejudged(mut self) -> EngineSpec {
        let shadow = self.judging.shadow.map(|s| s.policy);
        self.judging = policy::judgings(
            self.policy.value,
            shadow,
            &self.agent_policy,
            &self.qos,
            &[],
        )
        .expect("a test's spec judges");
        self
    }

    /// The way `side` judges the engine; `None` for a shadow that is not configured.
    pub(crate) fn judging(&self, side: policy::Side) -> Option<&policy::Judging> {
        match side {
            policy::Side::InForce => Some(&self.judging.in_force),
            policy::Side::Shadow => self.judging.shadow.as_ref(),
        }
    }

    /// `host:port` of the inference surface, IPv6 bracketed.
    pub(crate) fn infer_authority(&self) -> String {
        if self.host.contains(':') && !self.host.starts_with('[') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// The engine's base URL (`http://10.0.0.5:8000`): what identifies the engine to the agent.
    pub(crate) fn engine_url(&self) -> String {
        let scheme = if self.infer_tls_config.enable_tls {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}", self.infer_authority())
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
    /// `shadow_policy` (`[[engine]]`, else `[agent]`).
    pub shadow: Option<policy::Policy>,
    pub agent_policy: policy::AgentPolicy,
    pub qos_set: Vec<String>,
}

#[allow(clippy::too_many_arguments)]
pub(super) fn build_engine(
    name: String,
    role: Role,
    section: EngineSection,
    at: EngineLocation,
    devices: Option<Vec<u32>>,
    engine_env: EngineEnv,
    timing: Timing,
    mut qos: QosConfig,
    choice: PolicyChoice,
    mut tables: Tables,
    origin: String,
) -> Result<EngineSpec, KeyError> {
    // An engine's tables name no file: the folder they would be read from is never used.
    tables.check(std::path::Path::new(""))?;
    policy::apply_preset(choice.policy.value, &mut qos, &choice.qos_set);
    choice
        .agent_policy
        .validate()
        .map_err(|(k, m)| (format!("agent_policy.{k}"), m))?;
    let judging = policy::judgings(
        choice.policy.value,
        choice.shadow,
        &choice.agent_policy,
        &qos,
        &choice.qos_set,
    )
    .map_err(|(k, m)| {
        let k = if k == "shadow_policy" {
            k
        } else {
            format!("agent_policy.{k}")
        };
        (k, m)
    })?;
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
        && section.engine_type.request_names_model()
        && section.model.is_none()
    {
        return Err(missing_model(role, &origin));
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
        judging,
        tables,
        origin,
    };
    spec.validate()?;
    Ok(spec)
}

/// The `user_config.json` an engine's section was read from (its `origin` is `<file>
/// (<section>)`), or `None` for an engine written inline.
pub(super) fn origin_file(origin: &str) -> Option<&str> {
    if origin == "inline" {
        return None;
    }
    Some(origin.rsplit_once(" (").map_or(origin, |(file, _)| file))
}

/// Every file the agent reads for `spec`, with the key that names it (a path inside the
/// engine's table): its `user_config.json`, its `env.json`, and the TLS files it uses, as
/// the listener and the client read them (the client's certificate and key only where they
/// exist).
pub(crate) fn files_read(spec: &EngineSpec) -> Vec<(String, PathBuf)> {
    let mut files = Vec::new();
    if let Some(f) = origin_file(&spec.origin) {
        files.push(("config_path".to_owned(), PathBuf::from(f)));
    }
    if let EngineEnv::EnvJson { path, .. } = &spec.engine_env {
        files.push(("env_config_path".to_owned(), path.clone()));
    }
    let m = &spec.mgmt_tls_config;
    let mut tls = |config: &str, key: &str, path: &PathBuf| {
        if !path.as_os_str().is_empty() {
            files.push((format!("{config}.{key}"), path.clone()));
        }
    };
    if m.enable_tls {
        tls("mgmt_tls_config", "cert_file", &m.cert_file);
        tls("mgmt_tls_config", "key_file", &m.key_file);
        tls("mgmt_tls_config", "crl_file", &m.crl_file);
    }
    let c = &spec.infer_tls_config;
    if c.enable_tls {
        tls("infer_tls_config", "ca_file", &c.ca_file);
        tls("infer_tls_config", "crl_file", &c.crl_file);
        // The client certificate is optional (as for the reference's client context): read
        // where it exists, which the reader of this list finds out.
        tls("infer_tls_config", "cert_file", &c.cert_file);
        tls("infer_tls_config", "key_file", &c.key_file);
    }
    files
}

/// A vLLM engine with virtual inference on and no model for its request, named where the
/// engine was written: the inline key in `agent.toml`, else MindIE's JSON path in the file
/// `origin` names (`<file> (<section>)`; the place is then `config_path`, or the file itself
/// in single-engine mode).
fn missing_model(role: Role, origin: &str) -> KeyError {
    const WHY: &str = "virtual inference is on, and its request names the model";
    if origin == "inline" {
        return (
            "served_model_name".to_owned(),
            format!(
                "missing: {WHY} (on by default for an engine in agent.toml); set it, or `enable_virtual_inference = false` in [engine.health_check_config]"
            ),
        );
    }
    let file = origin_file(origin).unwrap_or(origin);
    let section = role.section();
    (
        "config_path".to_owned(),
        format!(
            "{section}.engine_config.served_model_name (or {section}.engine_config.model) is missing in {file}: {WHY} ({section}.health_check_config.enable_virtual_inference)"
        ),
    )
}

impl EngineSpec {
    /// Bounds of one engine; keys are paths inside its table (`timing.window`, `qos.period`).
    pub(crate) fn validate(&self) -> Result<(), KeyError> {
        use bounds::{DEVICES, DP_RANK, NAME_CHARS, PORT};
        let spec = self;
        let key = |k: &str, m: String| Err((k.to_owned(), m));
        let chars = spec.name.chars().count();
        if !NAME_CHARS.contains(chars) {
            return key(
                "name",
                format!(
                    "{:?} has {chars} characters, outside {NAME_CHARS}",
                    spec.name
                ),
            );
        }
        if let Some(c) = spec.name.chars().find(|c| c.is_control()) {
            return key(
                "name",
                format!(
                    "{:?} contains the control character U+{:04X}; names appear in log lines and metric labels",
                    spec.name, c as u32
                ),
            );
        }
        // The grammar: a letter or digit, then letters, digits, `.`, `_` or `-`. A name is a path
        // segment (`/engines/<name>/readyz`), a metric label, a word in HAProxy's agent check and
        // in log lines, so no `/`, no space at either end or inside, no quote or `#`.
        let mut chars = spec.name.chars();
        if !chars.next().is_some_and(char::is_alphanumeric)
            || chars.any(|c| !(c.is_alphanumeric() || matches!(c, '.' | '_' | '-')))
        {
            let bad = spec
                .name
                .char_indices()
                .find(|&(i, c)| !(c.is_alphanumeric() || (i > 0 && matches!(c, '.' | '_' | '-'))))
                .map_or(String::new(), |(i, c)| format!(" ({c:?} at {i})"));
            return key(
                "name",
                format!(
                    "{:?} is not a name{bad}: a letter or digit, then letters, digits, `.`, `_` or `-` (it is a URL path segment, a metric label and a word in HAProxy's agent check)",
                    spec.name
                ),
            );
        }
        PORT.check("port", spec.port)?;
        PORT.check("mgmt_port", spec.mgmt_listen.port())?;
        DP_RANK.check("dp_rank", spec.dp_rank)?;
        if let Some(ids) = &spec.devices.value {
            let from = devices_from(spec);
            if !DEVICES.contains(ids.len()) {
                let hint = if ids.is_empty() {
                    "; leave devices out to monitor every NPU of the host"
                } else {
                    ""
                };
                return key(
                    "devices",
                    format!("{} NPUs{from} is outside {DEVICES}{hint}", ids.len()),
                );
            }
            if let Some((i, id)) = ids
                .iter()
                .enumerate()
                .find(|(i, id)| ids[..*i].contains(id))
            {
                return key(
                    &format!("devices[{i}]"),
                    format!("NPU {id}{from} is listed twice"),
                );
            }
        }
        spec.timing
            .validate()
            .map_err(|(k, m)| (format!("timing.{k}"), m))?;
        spec.qos
            .validate()
            .map_err(|(k, m)| (format!("qos.{k}"), m))?;
        Ok(())
    }
}

/// ` (from ASCEND_RT_VISIBLE_DEVICES from …)` when the NPU list is not the `devices` key.
pub(crate) fn devices_from(spec: &EngineSpec) -> String {
    if spec.devices.source == "devices" {
        String::new()
    } else {
        format!(" (from {})", spec.devices.source)
    }
}

/// `[[engine]]` bounds (the timing's are [`super::timing::bounds`]).
pub(crate) mod bounds {
    use crate::config::bounds::Within;

    pub(crate) const PORT: Within<u16> = Within::new(1, 65535);
    pub(crate) const DP_RANK: Within<u32> = Within::new(0, 65535);
    /// How many NPUs one engine may name (the ring tells this many apart).
    /// (The ring's `MAX_DEVICES`; a test pins the two together.)
    pub(crate) const DEVICES: Within<usize> = Within::new(1, 256);
    /// Characters of an engine name (it appears in logs, metric labels and `/status/detail`).
    pub(crate) const NAME_CHARS: Within<usize> = Within::new(1, 128);
}

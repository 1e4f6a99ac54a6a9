//! Host mode: `agent.toml`.
//!
//! ```toml
//! [agent]
//! sample_period = "50ms"
//! admin_listen = "127.0.0.1:9400"
//!
//! [[engine]]
//! name = "prefill-0"
//! config_path = "/home/mindie/user_config.json"   # a MindIE user_config.json …
//! role = "prefill"
//! host = "10.0.0.5"
//! port = 8000
//! mgmt_port = 9001
//! devices = [0, 1, 2, 3]
//!
//! [[engine]]                                     # … or the same keys inline
//! engine_type = "vllm"
//! served_model_name = "qwen"
//! host = "10.0.0.5"
//! port = 8001
//! mgmt_port = 9002
//! [engine.health_check_config]
//! enable_virtual_inference = true
//! ```
//!
//! Unknown keys are rejected; every error names the file, the table and the key, type
//! errors included (the place is found from the parser's span, [`place_at`]).

use super::BackendChoice;
use super::engine::build_engine;
use super::mindie::{EngineSection, HealthCheckConfig, Role};
use super::policy::{AgentPolicy, Policy};
use super::qos::QosConfig;
use super::{
    AdminTls, AgentConfig, AgentSettings, ConfigError, EngineEnv, EngineLocation, Form, KeyError,
    Timing, duration, engine_place, listen_addr,
};
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

mod place;
mod tables;
mod written;
use crate::config::tables::{TableReader, Tables};
use place::place_at;
use tables::{OpenSlot, Slot, Wrong};
use written::Written;

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct FileConfig {
    agent: AgentTable,
    engine: Vec<EngineTable>,
}

/// `[agent]`: a key left out keeps its default, that of [`AgentSettings::default`].
#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct AgentTable {
    #[serde(with = "duration")]
    sample_period: Duration,
    dcmi_lib: Option<PathBuf>,
    npu_smi: PathBuf,
    backend: BackendChoice,
    dcmi_no_owner_check: bool,
    npu_smi_delay: u32,
    admin_listen: Option<String>,
    haproxy_agent_listen: Option<String>,
    env_config_path: Option<PathBuf>,
    worker_threads: usize,
    sampler_realtime: bool,
    #[serde(with = "duration")]
    driver_call_deadline: Duration,
    #[serde(with = "duration")]
    fault_period: Duration,
    #[serde(with = "duration")]
    sampler_stuck_after: Duration,
    log_level: Option<String>,
    max_connections: usize,
    admin_token_file: Option<PathBuf>,
    admin_tls: Option<AdminTls>,
    #[serde(with = "duration")]
    header_read_timeout: Duration,
    #[serde(with = "duration")]
    idle_timeout: Duration,
    #[serde(with = "duration")]
    stall_timeout: Duration,
    policy: Policy,
    shadow_policy: Option<Policy>,
    /// `[agent.kubernetes]`, the Kubernetes API mode's (read by its reader).
    kubernetes: Slot,
    state_dir: Option<PathBuf>,
    fault_code_file: Option<PathBuf>,
    npu_exporter_names: bool,
    pod_resources_socket: Option<PathBuf>,
    #[serde(with = "duration")]
    pod_resources_period: Duration,
    evidence_dir: Option<PathBuf>,
    evidence_max_bytes: u64,
    evidence_max_count: usize,
    evidence_min_free: u64,
}

impl Default for AgentTable {
    fn default() -> Self {
        let d = AgentSettings::default();
        AgentTable {
            sample_period: d.sample_period,
            dcmi_lib: d.dcmi_lib,
            npu_smi: d.npu_smi,
            backend: d.backend,
            dcmi_no_owner_check: d.dcmi_no_owner_check,
            npu_smi_delay: d.npu_smi_delay,
            admin_listen: None,
            haproxy_agent_listen: None,
            env_config_path: None,
            worker_threads: d.worker_threads,
            sampler_realtime: d.sampler_realtime,
            driver_call_deadline: d.driver_call_deadline,
            fault_period: d.fault_period,
            sampler_stuck_after: d.sampler_stuck_after,
            log_level: d.log_level,
            max_connections: d.listeners.max_connections,
            admin_token_file: d.admin_auth.token_file,
            admin_tls: d.admin_auth.tls,
            header_read_timeout: d.listeners.header_read_timeout,
            idle_timeout: d.listeners.idle_timeout,
            stall_timeout: d.listeners.stall_timeout,
            policy: d.policy,
            shadow_policy: None,
            kubernetes: None,
            state_dir: None,
            fault_code_file: None,
            npu_exporter_names: d.npu_exporter_names,
            pod_resources_socket: None,
            pod_resources_period: super::agent::DEFAULT_POD_RESOURCES_PERIOD,
            evidence_dir: None,
            evidence_max_bytes: d.evidence.max_bytes,
            evidence_max_count: d.evidence.max_count,
            evidence_min_free: d.evidence.min_free,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EngineTable {
    name: Option<String>,
    // Either a MindIE user_config.json and a role …
    config_path: Option<PathBuf>,
    role: Option<Role>,
    // … or the engine-section keys inline.
    engine_type: Option<toml::Value>,
    dispatch_profile: Option<toml::Value>,
    served_model_name: Option<toml::Value>,
    headless: Option<bool>,
    kv_transfer_config: Option<toml::Value>,
    health_check_config: Option<toml::Value>,
    mgmt_tls_config: Option<toml::Value>,
    infer_tls_config: Option<toml::Value>,
    // Where the engine is.
    host: String,
    port: u16,
    mgmt_host: Option<String>,
    mgmt_port: u16,
    #[serde(default)]
    dp_rank: u32,
    devices: Option<Vec<u32>>,
    engine_env: Option<BTreeMap<String, toml::Value>>,
    env_config_path: Option<PathBuf>,
    #[serde(default)]
    timing: Timing,
    #[serde(default)]
    qos: QosConfig,
    policy: Option<Policy>,
    shadow_policy: Option<Policy>,
    #[serde(default)]
    agent_policy: AgentPolicy,
    // The integrations' tables, read by their readers (`[engine.actions]`, `[engine.kubernetes]`).
    #[serde(default, rename = "actions")]
    _actions: OpenSlot,
    #[serde(default, rename = "kubernetes")]
    _kubernetes: Slot,
}

/// Reads and validates `agent.toml` (a regular file of at most 4 MiB, [`super::read`]).
pub fn load(path: &Path) -> Result<AgentConfig, ConfigError> {
    let file = path.display().to_string();
    let text = super::read::text(path).map_err(|e| ConfigError::new(&file, "", e))?;
    parse(&text, path)
}

/// The 1-based line and column (in characters) of byte `offset` of `text`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset.min(text.len())).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
    (line, column)
}

/// Parses `agent.toml` text; `path` names the file and resolves relative paths.
pub fn parse(text: &str, path: &Path) -> Result<AgentConfig, ConfigError> {
    parse_with(text, path, &crate::config::tables::listed())
}

/// [`parse`], the integrations' tables read by `readers` (the list's, or a test's).
pub(crate) fn parse_with(
    text: &str,
    path: &Path,
    readers: &[&dyn TableReader],
) -> Result<AgentConfig, ConfigError> {
    let file = path.display().to_string();
    let base = path.parent().unwrap_or(Path::new("."));
    // The text is parsed once, into its spanned document: that names the place of any
    // error, tells which keys the file writes, and is what the serde structs are read from.
    let (doc, errors) = toml::de::DeTable::parse_recoverable(text);
    let fail = |e: &toml::de::Error| {
        let place = e
            .span()
            .map(|s| place_at(doc.get_ref(), text, s, e.message()))
            .unwrap_or_default();
        ConfigError::new(&file, place, super::unknown::rewrite_serde(e.message()))
    };
    // A syntax error: the first, as the parser met it, at its line and column (an editor
    // jumps to `file:line:column`).
    if let Some(e) = errors.first() {
        let mut err = fail(e);
        if let Some(span) = e.span() {
            let (line, column) = line_column(text, span.start);
            err.file = format!("{file}:{line}:{column}");
        }
        return Err(err);
    }
    let written = Written::of(doc.get_ref());
    let parsed =
        FileConfig::deserialize(toml::de::Deserializer::from(doc.clone())).map_err(|e| fail(&e))?;
    let wrong = |w: Wrong| match w {
        Wrong::Toml(e) => fail(&e),
        Wrong::Unknown { key, known, span } => ConfigError::new(
            &file,
            place_at(doc.get_ref(), text, span, ""),
            super::unknown::message(&key, &known),
        ),
    };
    let (agent_tables, mut engine_tables) =
        tables::read_all(doc.get_ref(), parsed.engine.len(), readers).map_err(wrong)?;
    let agent = agent_settings(&parsed.agent, base, agent_tables)
        .map_err(|(key, msg)| ConfigError::new(&file, format!("[agent] {key}"), msg))?;
    if parsed.engine.is_empty() {
        return Err(ConfigError::new(
            &file,
            "",
            "no [[engine]] table: nothing to monitor",
        ));
    }
    let mut engines = Vec::new();
    for (i, t) in parsed.engine.iter().enumerate() {
        let choice = super::PolicyChoice {
            policy: match t.policy {
                Some(p) => super::Sourced {
                    value: p,
                    source: "[[engine]] policy".to_owned(),
                },
                None => super::Sourced {
                    value: agent.policy,
                    source: if written.agent_policy {
                        "[agent] policy".to_owned()
                    } else {
                        "default".to_owned()
                    },
                },
            },
            shadow: t.shadow_policy.or(agent.shadow_policy),
            agent_policy: t.agent_policy.clone(),
            qos_set: written.qos.get(i).cloned().unwrap_or_default(),
        };
        let tables = std::mem::take(&mut engine_tables[i]);
        let env_json = parsed.agent.env_config_path.as_deref();
        let spec = engine(t, i, base, env_json, choice, tables).map_err(|(key, msg)| {
            ConfigError::new(&file, engine_place(i, t.name.as_deref(), &key), msg)
        })?;
        engines.push(spec);
    }
    let cfg = AgentConfig {
        source: file,
        form: Form::Host,
        agent,
        engines,
    };
    cfg.validate_across()?;
    Ok(cfg)
}

/// `pod_resources_socket` and `pod_resources_period`: the pod labels, on with the socket.
fn pod_resources(t: &AgentTable) -> Result<Option<super::PodResourcesSettings>, KeyError> {
    match &t.pod_resources_socket {
        Some(socket) => Ok(Some(super::PodResourcesSettings {
            socket: socket.clone(),
            period: t.pod_resources_period,
        })),
        None if t.pod_resources_period != super::agent::DEFAULT_POD_RESOURCES_PERIOD => Err((
            "pod_resources_period".to_owned(),
            "is set, but there is no pod_resources_socket (the pod labels are off)".to_owned(),
        )),
        None => Ok(None),
    }
}

fn agent_settings(
    t: &AgentTable,
    base: &Path,
    mut tables: Tables,
) -> Result<AgentSettings, KeyError> {
    let admin_listen = match &t.admin_listen {
        None => None,
        Some(s) => Some(s.parse().map_err(|_| {
            (
                "admin_listen".to_owned(),
                format!("{s:?} is not an address like \"127.0.0.1:9400\""),
            )
        })?),
    };
    let haproxy_agent_listen = match &t.haproxy_agent_listen {
        None => None,
        Some(s) => Some(s.parse().map_err(|_| {
            (
                "haproxy_agent_listen".to_owned(),
                format!("{s:?} is not an address like \"127.0.0.1:9500\""),
            )
        })?),
    };
    if let Some(l) = &t.log_level {
        super::check_log_filter(l).map_err(|m| ("log_level".to_owned(), m))?;
    }
    if admin_listen.is_none() {
        for (key, set) in [
            ("admin_token_file", t.admin_token_file.is_some()),
            ("admin_tls", t.admin_tls.is_some()),
        ] {
            if set {
                return Err((
                    key.to_owned(),
                    "is set, but there is no admin listener (admin_listen)".to_owned(),
                ));
            }
        }
    }
    let rel = |p: &PathBuf| {
        if p.is_relative() && p.components().count() > 1 {
            base.join(p)
        } else {
            p.clone()
        }
    };
    let s = AgentSettings {
        sample_period: t.sample_period,
        dcmi_lib: t.dcmi_lib.as_ref().map(rel),
        npu_smi: rel(&t.npu_smi),
        backend: t.backend,
        dcmi_no_owner_check: t.dcmi_no_owner_check,
        npu_smi_delay: t.npu_smi_delay,
        admin_listen,
        haproxy_agent_listen,
        worker_threads: t.worker_threads,
        sampler_realtime: t.sampler_realtime,
        driver_call_deadline: t.driver_call_deadline,
        fault_period: t.fault_period,
        sampler_stuck_after: t.sampler_stuck_after,
        log_level: t.log_level.clone(),
        listeners: crate::config::ListenerLimits {
            max_connections: t.max_connections,
            header_read_timeout: t.header_read_timeout,
            idle_timeout: t.idle_timeout,
            stall_timeout: t.stall_timeout,
        },
        admin_auth: crate::config::AdminAuthConfig {
            token_file: t.admin_token_file.as_ref().map(|p| base_rel(base, p)),
            tls: t.admin_tls.as_ref().map(|x| AdminTls {
                cert_file: base_rel(base, &x.cert_file),
                key_file: base_rel(base, &x.key_file),
                client_ca_file: x.client_ca_file.as_ref().map(|p| base_rel(base, p)),
            }),
        },
        policy: t.policy,
        shadow_policy: t.shadow_policy,
        state_dir: t.state_dir.as_ref().map(|p| base_rel(base, p)),
        fault_code_file: t.fault_code_file.as_ref().map(|p| base_rel(base, p)),
        npu_exporter_names: t.npu_exporter_names,
        pod_resources: pod_resources(t)?,
        evidence: crate::config::evidence::EvidenceSettings {
            dir: t.evidence_dir.as_ref().map(|p| base_rel(base, p)),
            max_bytes: t.evidence_max_bytes,
            max_count: t.evidence_max_count,
            min_free: t.evidence_min_free,
        },
        tables: {
            // The integrations' agent-wide tables: checked after `[agent]`'s own keys.
            tables.check(base)?;
            tables
        },
    };
    s.validate()?;
    Ok(s)
}

/// An inline value for the MindIE section parser, as JSON. A float JSON cannot carry (`nan`,
/// `inf`) is refused here, naming its key: JSON would turn it into `null`, and the message
/// into "got None".
fn to_json(key: &str, v: &Option<toml::Value>) -> Result<Option<Value>, KeyError> {
    fn finite(path: &str, v: &toml::Value) -> Result<(), KeyError> {
        match v {
            toml::Value::Float(f) if !f.is_finite() => {
                Err((path.to_owned(), format!("`{f}` is not a finite number")))
            }
            toml::Value::Array(a) => a
                .iter()
                .enumerate()
                .try_for_each(|(i, v)| finite(&format!("{path}[{i}]"), v)),
            toml::Value::Table(t) => t
                .iter()
                .try_for_each(|(k, v)| finite(&format!("{path}.{k}"), v)),
            _ => Ok(()),
        }
    }
    let Some(v) = v else { return Ok(None) };
    finite(key, v)?;
    serde_json::to_value(v)
        .map(Some)
        .map_err(|e| (key.to_owned(), e.to_string()))
}

/// A file named in the config: relative paths are relative to the config's directory.
fn base_rel(base: &Path, p: &Path) -> PathBuf {
    if p.is_relative() {
        base.join(p)
    } else {
        p.to_path_buf()
    }
}

/// One `[[engine]]` table as an engine: its section, its environment, its addresses.
fn engine(
    t: &EngineTable,
    index: usize,
    base: &Path,
    agent_env_json: Option<&Path>,
    choice: super::PolicyChoice,
    tables: Tables,
) -> Result<super::EngineSpec, KeyError> {
    let (section, role, origin) = match &t.config_path {
        Some(cfg) => section_from_file(t, cfg, base)?,
        None => inline_section(t, base)?,
    };
    let engine_env = engine_env(t, base, agent_env_json)?;
    let mgmt_host = t.mgmt_host.clone().unwrap_or_else(|| t.host.clone());
    let mgmt_listen =
        listen_addr(&mgmt_host, t.mgmt_port).map_err(|e| ("mgmt_host".to_owned(), e))?;
    listen_addr(&t.host, t.port).map_err(|e| ("host".to_owned(), e))?;
    let name = t
        .name
        .clone()
        .unwrap_or_else(|| format!("{}-{}", role.as_str(), index));
    build_engine(
        name,
        role,
        section,
        EngineLocation {
            host: t.host.clone(),
            port: t.port,
            mgmt_listen,
            dp_rank: t.dp_rank,
        },
        t.devices.clone(),
        engine_env,
        t.timing.clone(),
        t.qos.clone(),
        choice,
        tables,
        origin,
    )
}

/// The engine section read from MindIE's `user_config.json` at `cfg` for the table's role,
/// with its role and where it came from; the engine keys of the table are not allowed then.
fn section_from_file(
    t: &EngineTable,
    cfg: &Path,
    base: &Path,
) -> Result<(EngineSection, Role, String), KeyError> {
    let inline_keys: Vec<&str> = [
        ("engine_type", t.engine_type.is_some()),
        ("dispatch_profile", t.dispatch_profile.is_some()),
        ("served_model_name", t.served_model_name.is_some()),
        ("headless", t.headless.is_some()),
        ("kv_transfer_config", t.kv_transfer_config.is_some()),
        ("health_check_config", t.health_check_config.is_some()),
        ("mgmt_tls_config", t.mgmt_tls_config.is_some()),
        ("infer_tls_config", t.infer_tls_config.is_some()),
    ]
    .into_iter()
    .filter_map(|(k, set)| set.then_some(k))
    .collect();
    if let Some(k) = inline_keys.first() {
        return Err((
            k.to_string(),
            "not allowed with config_path: the engine section comes from that file".to_owned(),
        ));
    }
    let role = t.role.ok_or_else(|| {
        (
            "role".to_owned(),
            "required with config_path (prefill, decode, union)".to_owned(),
        )
    })?;
    let path = base_rel(base, cfg);
    let section = super::resolve::user_config(&path, role)
        .map_err(|e| ("config_path".to_owned(), format!("{}: {e}", path.display())))?;
    let origin = format!("{} ({})", path.display(), role.section());
    Ok((section, role, origin))
}

/// The engine section written inline in the table, as MindIE's JSON would hold it (the
/// role is `union` unless the table says; virtual inference is on unless it says).
fn inline_section(t: &EngineTable, base: &Path) -> Result<(EngineSection, Role, String), KeyError> {
    let mut engine_config = serde_json::Map::new();
    if let Some(v) = to_json("served_model_name", &t.served_model_name)? {
        engine_config.insert("served_model_name".into(), v);
    }
    if let Some(h) = t.headless {
        engine_config.insert("headless".into(), Value::Bool(h));
    }
    if let Some(v) = to_json("kv_transfer_config", &t.kv_transfer_config)? {
        engine_config.insert("kv_transfer_config".into(), v);
    }
    let mut sec = serde_json::Map::new();
    if let Some(v) = to_json("engine_type", &t.engine_type)? {
        sec.insert("engine_type".into(), v);
    }
    if let Some(v) = to_json("dispatch_profile", &t.dispatch_profile)? {
        sec.insert("dispatch_profile".into(), v);
    }
    if let Some(v) = to_json("health_check_config", &t.health_check_config)? {
        sec.insert("health_check_config".into(), v);
    }
    sec.insert("engine_config".into(), Value::Object(engine_config));
    let section = EngineSection::from_parts(
        &Value::Object(sec),
        to_json("mgmt_tls_config", &t.mgmt_tls_config)?.as_ref(),
        to_json("infer_tls_config", &t.infer_tls_config)?.as_ref(),
        base,
        HealthCheckConfig::inline_defaults(),
    )
    .map_err(|e| (String::new(), e))?;
    Ok((section, t.role.unwrap_or(Role::Union), "inline".to_owned()))
}

/// Where the engine's environment is read from: the table's `engine_env`, else an
/// `env.json` (the table's, else `[agent]`'s), else the agent's own process.
fn engine_env(
    t: &EngineTable,
    base: &Path,
    agent_env_json: Option<&Path>,
) -> Result<EngineEnv, KeyError> {
    if let Some(vars) = &t.engine_env {
        let vars = vars
            .iter()
            .map(|(k, v)| {
                let s = match v {
                    toml::Value::String(s) => s.clone(),
                    toml::Value::Integer(i) => i.to_string(),
                    other => {
                        return Err((
                            format!("engine_env.{k}"),
                            format!("must be a string or an integer, got {other}"),
                        ));
                    }
                };
                Ok((k.clone(), s))
            })
            .collect::<Result<BTreeMap<_, _>, KeyError>>()?;
        return Ok(EngineEnv::Table { vars });
    }
    let Some(p) = t.env_config_path.as_deref().or(agent_env_json) else {
        return Ok(EngineEnv::AgentProcess);
    };
    let path = base_rel(base, p);
    let key = if t.env_config_path.is_some() {
        "env_config_path"
    } else {
        "env_config_path (from [agent])"
    };
    let doc = super::resolve::env_json(&path)
        .map_err(|e| (key.to_owned(), format!("{}: {e}", path.display())))?;
    Ok(EngineEnv::EnvJson { path, doc })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(text: &str) -> Result<AgentConfig, ConfigError> {
        parse(text, Path::new("/etc/npu-health-agent/agent.toml"))
    }

    // Issue 42: a syntax error names its line and column.
    #[test]
    fn a_syntax_error_names_its_line_and_column() {
        let e = parse_str("[agent\nx = 1\n").unwrap_err();
        assert_eq!(e.file, "/etc/npu-health-agent/agent.toml:1:7", "{e}");
        assert!(e.to_string().contains("unclosed table"), "{e}");
        let e = parse_str("# a comment\n[agent]\nsample_period = \n").unwrap_err();
        assert_eq!(e.file, "/etc/npu-health-agent/agent.toml:3:17", "{e}");
        let e = parse_str("[agent]\nname = \"\u{e9}\u{e9}\" x\n").unwrap_err();
        assert_eq!(e.file, "/etc/npu-health-agent/agent.toml:2:13", "{e}");
        // Errors that are not syntax keep the key as their place.
        let e = parse_str("[agent]\nsample_period = 5\n").unwrap_err();
        assert_eq!(e.file, "/etc/npu-health-agent/agent.toml", "{e}");
    }

    const INLINE: &str = r#"
[agent]
sample_period = "20ms"
admin_listen = "127.0.0.1:9400"

[[engine]]
name = "p0"
engine_type = "vllm"
served_model_name = "qwen"
host = "127.0.0.1"
port = 8000
mgmt_port = 9001
devices = [0, 1]
engine_env = { ASCEND_GLOBAL_LOG_LEVEL = 3 }
[engine.health_check_config]
enable_virtual_inference = true
max_failure_count = 2
[engine.timing]
interval = "100ms"
"#;

    #[test]
    fn inline_engine_with_defaults_filled_in() {
        let c = parse_str(INLINE).unwrap();
        assert_eq!(c.agent.sample_period, Duration::from_millis(20));
        assert_eq!(c.agent.admin_listen.unwrap().port(), 9400);
        let e = &c.engines[0];
        assert_eq!(e.name, "p0");
        assert_eq!(e.model.as_deref(), Some("qwen"));
        assert_eq!(e.health_check_config.max_failure_count, 2);
        assert_eq!(e.health_check_config.health_collector_timeout, 5);
        assert_eq!(e.timing.interval, Duration::from_millis(100));
        assert_eq!(e.timing.warmup_timeout, Duration::from_secs(180));
        assert_eq!(e.devices.value, Some(vec![0, 1]));
        assert_eq!(e.mgmt_listen.to_string(), "127.0.0.1:9001");
        assert_eq!(
            e.engine_env
                .lookup(Role::Union, "ASCEND_GLOBAL_LOG_LEVEL")
                .unwrap()
                .value,
            "3"
        );
    }

    #[test]
    fn unknown_keys_name_file_table_and_key() {
        let err = parse_str(&INLINE.replace("sample_period", "sample_periood"))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("/etc/npu-health-agent/agent.toml: [agent]"),
            "{err}"
        );
        assert!(err.contains("sample_periood"), "{err}");
        let err = parse_str(&INLINE.replace("devices = [0, 1]", "device = [0, 1]"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("[[engine]] #1") && err.contains("`device`"),
            "{err}"
        );
        let err = parse_str(&INLINE.replace("interval = ", "intervall = "))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("[[engine]] #1 (p0) timing.intervall: unknown key `intervall`; did you mean `interval`?"),
            "{err}"
        );
    }

    #[test]
    fn health_check_validation_names_the_engine() {
        let err =
            parse_str(&INLINE.replace("max_failure_count = 2", "health_collector_timeout = 0"))
                .unwrap_err()
                .to_string();
        assert!(
            err.contains("[[engine]] #1 (p0)")
                && err.contains("health_collector_timeout must be >= 1, got 0"),
            "{err}"
        );
    }

    #[test]
    fn bad_values_name_the_key() {
        let err = parse_str(&INLINE.replace("\"100ms\"", "\"soon\""))
            .unwrap_err()
            .to_string();
        assert!(err.contains("soon"), "{err}");
        let err = parse_str(&INLINE.replace(
            "admin_listen = \"127.0.0.1:9400\"",
            "admin_listen = \"here\"",
        ))
        .unwrap_err()
        .to_string();
        assert!(err.contains("[agent] admin_listen"), "{err}");
        let err = parse_str(&INLINE.replace(
            "mgmt_port = 9001",
            "mgmt_port = 9001\nmgmt_host = \"nowhere\"",
        ))
        .unwrap_err()
        .to_string();
        assert!(err.contains("mgmt_host"), "{err}");
    }

    #[test]
    fn config_path_and_inline_keys_do_not_mix() {
        let err = parse_str(&INLINE.replace(
            "name = \"p0\"",
            "name = \"p0\"\nconfig_path = \"u.json\"\nrole = \"prefill\"",
        ))
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("engine_type") && err.contains("not allowed with config_path"),
            "{err}"
        );
    }

    #[test]
    fn duplicate_mgmt_ports_are_rejected() {
        let two = format!(
            "{INLINE}\n{}",
            &INLINE[INLINE.find("[[engine]]").unwrap()..].replace("\"p0\"", "\"p1\"")
        );
        let err = parse_str(&two).unwrap_err().to_string();
        assert!(err.contains("[[engine]] #2 (p1) mgmt_port"), "{err}");
    }

    #[test]
    fn admin_port_must_differ_from_the_mgmt_ports() {
        let err = parse_str(&INLINE.replace("127.0.0.1:9400", "127.0.0.1:9001"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("[agent] admin_listen") && err.contains("9001"),
            "{err}"
        );
    }

    #[test]
    fn no_engine_is_an_error() {
        assert!(
            parse_str("[agent]\n")
                .unwrap_err()
                .to_string()
                .contains("no [[engine]]")
        );
    }

    #[test]
    fn user_config_reference_and_env_json() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("user_config.json"),
            r#"{"motor_engine_prefill_config": {"engine_type": "vllm", "engine_config": {"model": "/models/q"},
                 "health_check_config": {"enable_virtual_inference": true}}}"#,
        )
        .unwrap();
        std::fs::write(
            dir.path().join("env.json"),
            r#"{"motor_common_env": {"ASCEND_RT_VISIBLE_DEVICES": "4,5"}, "motor_engine_prefill_env": {"ASCEND_GLOBAL_LOG_LEVEL": "1"}}"#,
        )
        .unwrap();
        let text = r#"
[agent]
env_config_path = "env.json"
[[engine]]
config_path = "user_config.json"
role = "prefill"
host = "127.0.0.1"
port = 8000
mgmt_port = 9001
"#;
        let c = parse(text, &dir.path().join("agent.toml")).unwrap();
        let e = &c.engines[0];
        assert_eq!(e.name, "prefill-0");
        assert_eq!(e.model.as_deref(), Some("/models/q"));
        assert_eq!(e.devices.value, Some(vec![4, 5]));
        assert!(
            e.devices.source.contains("motor_common_env"),
            "{}",
            e.devices.source
        );
        let lvl = e
            .engine_env
            .lookup(Role::Prefill, "ASCEND_GLOBAL_LOG_LEVEL")
            .unwrap();
        assert_eq!(lvl.value, "1");
        assert!(lvl.source.contains("motor_engine_prefill_env"));
        let err = parse(
            &text.replace("role = \"prefill\"", "role = \"decode\""),
            &dir.path().join("agent.toml"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("config_path") && err.contains("motor_engine_decode_config"),
            "{err}"
        );
    }

    #[test]
    fn places_from_spans_name_the_table_and_the_key() {
        let text = "[agent]\na = 1\n[[engine]]\nname = \"p0\"\nb = [1, 2]\nd = { e = 3 }\n[engine.timing]\nc = 3\n[[engine]]\nd = 4\nd = 5\n";
        // The first byte of the first match of `needle`, with toml's message.
        let (doc, _) = toml::de::DeTable::parse_recoverable(text);
        let at = |needle: &str, message: &str| {
            let start = text.find(needle).unwrap();
            place_at(doc.get_ref(), text, start..start + 1, message)
        };
        assert_eq!(at("a = 1", ""), "[agent] a");
        assert_eq!(at("1", ""), "[agent] a", "a value names its key");
        assert_eq!(at("2", ""), "[[engine]] #1 (p0) b[1]");
        assert_eq!(at("3 }", ""), "[[engine]] #1 (p0) d.e");
        assert_eq!(at("c = 3", ""), "[[engine]] #1 (p0) timing.c");
        assert_eq!(at("4", ""), "[[engine]] #2 d");
        // A key defined twice is not in the recovered document: the headers name the table.
        assert_eq!(at("d = 5", "duplicate key"), "[[engine]] #2 d");
    }

    // [engine.actions] and the Kubernetes tables: defaults, relative files, and each bad
    // value named with its table and key.
    #[test]
    fn actions_and_kubernetes_keys() {
        use crate::integrations::answers::config::{NotReadyList, NotReadyOn};
        use crate::integrations::kubernetes::config::{
            DEFAULT_CONDITION_TYPE, EvictionMode, KubernetesConfig, PodSelector,
        };
        let c = parse_str(INLINE).unwrap();
        assert_eq!(
            NotReadyList::of(&c.engines[0]).0,
            [NotReadyOn::Degrade, NotReadyOn::Evict, NotReadyOn::Abnormal]
        );
        assert_eq!(
            KubernetesConfig::of(&c.agent),
            None,
            "off unless the table is there"
        );
        let with = INLINE.replacen(
            "\n[[engine]]",
            "[agent.kubernetes]\napi_server = \"https://10.0.0.1:6443\"\ntoken_file = \"secrets/token\"\n\n[[engine]]",
            1,
        ) + "[engine.actions]\nnot_ready_on = [\"throttle\"]\n[engine.kubernetes]\npod = \"inference/vllm-0\"\n";
        let c = parse_str(&with).unwrap();
        let k = KubernetesConfig::of(&c.agent).unwrap().clone();
        assert_eq!(k.condition_type, DEFAULT_CONDITION_TYPE);
        assert_eq!(k.eviction, EvictionMode::Api);
        assert_eq!(k.eviction_cooldown, Duration::from_secs(600));
        assert_eq!(
            k.token_file.unwrap(),
            Path::new("/etc/npu-health-agent/secrets/token")
        );
        assert_eq!(NotReadyList::of(&c.engines[0]).0, [NotReadyOn::Throttle]);
        assert_eq!(
            PodSelector::of(&c.engines[0]).named(),
            Some(("inference", "vllm-0"))
        );
        for (bad, place, says) in [
            (
                "[engine.actions]\nnot_ready_on = [\"sometimes\"]\n",
                "[[engine]] #1 (p0) actions.not_ready_on",
                "unknown variant",
            ),
            (
                "[engine.actions]\nnot_ready_on = [\"evict\", \"evict\"]\n",
                "actions.not_ready_on",
                "listed twice",
            ),
            (
                "[engine.kubernetes]\npod = \"vllm-0\"\n",
                "kubernetes.pod",
                "namespace/name",
            ),
            (
                "[engine.kubernetes]\npod = \"a/b\"\npod_selector = \"app=x\"\n",
                "kubernetes.pod",
                "must not be set",
            ),
            (
                "[engine.kubernetes]\npod_selector = \"app=(x\"\n",
                "kubernetes.pod_selector",
                "parentheses",
            ),
            (
                "[engine.kubernetes]\nnamespace = \"Inference\"\n",
                "kubernetes.namespace",
                "lower-case",
            ),
        ] {
            let err = parse_str(&format!("{INLINE}{bad}"))
                .unwrap_err()
                .to_string();
            assert!(err.contains(place) && err.contains(says), "{bad}: {err}");
        }
        for (bad, place, says) in [
            (
                "eviction = \"maybe\"",
                "kubernetes.eviction",
                "unknown variant",
            ),
            (
                "condition_type = \"Has Spaces\"",
                "kubernetes.condition_type",
                "qualified name",
            ),
            (
                "eviction_cooldown = \"1s\"",
                "kubernetes.eviction_cooldown",
                "outside",
            ),
            (
                "token_file = \"t\"",
                "kubernetes.token_file",
                "api_server is not",
            ),
            (
                "api_server = \"10.0.0.1:6443\"",
                "kubernetes.api_server",
                "not an http",
            ),
            (
                "node_name = \"Node_1\"",
                "kubernetes.node_name",
                "lower-case",
            ),
            // Hardening round 2: a token never crosses the network in clear text.
            (
                "api_server = \"http://10.0.0.1:8080\"\ntoken_file = \"t\"",
                "kubernetes.api_server",
                "clear text",
            ),
        ] {
            let text = INLINE.replacen(
                "\n[[engine]]",
                &format!("[agent.kubernetes]\n{bad}\n\n[[engine]]"),
                1,
            );
            let err = parse_str(&text).unwrap_err().to_string();
            assert!(err.contains(place) && err.contains(says), "{bad}: {err}");
        }
    }

    // `policy` in [agent], overridden per engine; the agent preset fills the qos keys left out
    // and keeps the ones written; [engine.agent_policy] is checked against its bounds.
    #[test]
    fn policy_from_agent_engine_and_default() {
        use crate::config::policy::{AGENT_STALL_WINDOW, Policy};
        let c = parse_str(INLINE).unwrap();
        assert_eq!(c.engines[0].policy.value, Policy::Agent, "the default");
        assert_eq!(c.engines[0].policy.source, "default");
        assert!(c.engines[0].qos.stall_detection && c.engines[0].qos.eviction);
        let reference = INLINE.replace("[agent]\n", "[agent]\npolicy = \"reference\"\n");
        let e = &parse_str(&reference).unwrap().engines[0];
        assert_eq!(e.policy.value, Policy::Reference);
        assert_eq!(e.qos, QosConfig::default(), "reference: no preset");
        let agent = INLINE.replace("[agent]\n", "[agent]\npolicy = \"agent\"\n");
        let c = parse_str(&agent).unwrap();
        let e = &c.engines[0];
        assert_eq!(
            (e.policy.value, e.policy.source.as_str()),
            (Policy::Agent, "[agent] policy")
        );
        assert!(e.qos.stall_detection && e.qos.eviction);
        assert_eq!(e.qos.stall_window, AGENT_STALL_WINDOW);
        let c = parse_str(&format!(
            "{agent}[engine.qos]\nqos_eviction = false\nstall_window = \"45s\"\n"
        ))
        .unwrap();
        let q = &c.engines[0].qos;
        assert!(q.stall_detection, "left out: the preset's");
        assert!(!q.eviction, "written: the file's");
        assert_eq!(q.stall_window, Duration::from_secs(45));
        let per_engine =
            agent.replace("name = \"p0\"\n", "name = \"p0\"\npolicy = \"reference\"\n");
        let e = &parse_str(&per_engine).unwrap().engines[0];
        assert_eq!(
            (e.policy.value, e.policy.source.as_str()),
            (Policy::Reference, "[[engine]] policy")
        );
        assert!(!e.qos.stall_detection, "reference: no preset");
        let err = parse_str(&INLINE.replace("[agent]\n", "[agent]\npolicy = \"fast\"\n"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("[agent] policy") && err.contains("reference"),
            "{err}"
        );
        let err = parse_str(&format!(
            "{agent}[engine.agent_policy]\nconfirm_failures = 0\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("(p0) agent_policy.confirm_failures: `0` is outside 1..=100"),
            "{err}"
        );
        let err = parse_str(&format!(
            "{agent}[engine.agent_policy]\nconfirm_failurs = 2\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("agent_policy.confirm_failurs: unknown key `confirm_failurs`; did you mean `confirm_failures`?"),
            "{err}"
        );
    }

    #[test]
    fn qos_table_defaults_aliases_and_errors() {
        let c = parse_str(INLINE).unwrap();
        let mut preset = QosConfig::default();
        crate::config::policy::apply_preset(crate::config::policy::Policy::Agent, &mut preset, &[]);
        assert_eq!(
            c.engines[0].qos, preset,
            "no table: defaults (the agent policy's preset)"
        );
        let with = |t: &str| parse_str(&format!("{INLINE}[engine.qos]\n{t}\n"));
        let q = with("stall_detection = true\nstall_window = \"30s\"\nqos_eviction = true\nqos_probe_max_tokens = 4\nweights = { latency = 0.6, memory = 0.2, progress = 0.2 }")
            .unwrap()
            .engines[0]
            .qos
            .clone();
        assert!(q.stall_detection && q.eviction);
        assert_eq!(q.stall_window, Duration::from_secs(30));
        assert_eq!(q.probe_max_tokens, 4);
        assert_eq!(q.weights.latency, 0.6);
        assert!(!q.skip_when_capacity_waiting, "V5 parity by default");
        let err = with("stall_windw = \"30s\"").unwrap_err().to_string();
        assert!(
            err.contains("[[engine]] #1 (p0) qos.stall_windw: unknown key `stall_windw`; did you mean `stall_window`?"),
            "{err}"
        );
        let err = with("weights = { latency = 0, memory = 0, progress = 0 }")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("qos.weights") && err.contains("above 0"),
            "{err}"
        );
        let err = with("probe_max_tokens = 0").unwrap_err().to_string();
        assert!(err.contains("qos.probe_max_tokens"), "{err}");
        let err = with("stall_window = \"0s\"").unwrap_err().to_string();
        assert!(
            err.contains("qos.stall_window: `0s` is outside 100ms..=1h"),
            "{err}"
        );
        let err = with("weights = { latency = 1 }").unwrap_err().to_string();
        assert!(err.contains("memory"), "missing weights are named: {err}");
    }
}

//! Reading MindIE's `user_config.json` (one role's engine section) and `env.json`.
//!
//! Defaults and validation follow the reference (virtual-inference-reference §4, V5):
//! `health_check_config` defaults 3 / false / 6 / 5 / 3 (an engine written inline in
//! `agent.toml` turns virtual inference on by default: [`HealthCheckConfig::inline_defaults`]),
//! the two collector fields must be
//! integers (not booleans, not strings) and at least 1, and an unknown key is an error, as it
//! is for MindIE's dataclass. Error texts carry the reference's wording
//! (`<name> must be an integer, got <repr>`, `<name> must be >= 1, got <n>`), with values shown
//! the way Python prints them. Beyond the reference, the two collector fields have an upper
//! bound (`<name> must be <= <max>, got <n>`): an hour-long `/health` timeout or a hundred
//! retries are never meant.

use super::engine_type::EngineType;
use bounds::{HEALTH_COLLECTOR_TIMEOUT_MAX, RETRY_ATTEMPTS_MAX};
use serde::Serialize;
use serde_json::Value;
use std::path::{Path, PathBuf};

pub use npu_health_wire::Role;

/// How prefill and decode hand over work (reference §4.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DispatchProfile {
    Handoff,
    Trigger,
    Bootstrap,
    Unknown,
}

impl DispatchProfile {
    /// Parses an explicit `dispatch_profile` (case-insensitive, plan names accepted).
    pub(crate) fn parse(s: &str) -> Result<DispatchProfile, String> {
        match s.to_ascii_lowercase().as_str() {
            "handoff" | "prefill_handoff_decode" => Ok(DispatchProfile::Handoff),
            "trigger" | "concurrent_engine_sync" => Ok(DispatchProfile::Trigger),
            "bootstrap" => Ok(DispatchProfile::Bootstrap),
            _ => Err(format!(
                "dispatch_profile must be one of handoff, trigger, bootstrap, prefill_handoff_decode, concurrent_engine_sync; got {}",
                py_repr(&Value::String(s.to_owned()))
            )),
        }
    }

    /// Infers the profile from vLLM's `kv_transfer_config` (object or JSON string).
    pub(crate) fn infer(
        engine_type: EngineType,
        kv_transfer_config: Option<&Value>,
    ) -> DispatchProfile {
        if engine_type != EngineType::Vllm {
            return DispatchProfile::Unknown;
        }
        let parsed;
        let cfg = match kv_transfer_config {
            Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
                Ok(v) => {
                    parsed = v;
                    &parsed
                }
                Err(_) => return DispatchProfile::Unknown,
            },
            Some(v) => v,
            None => return DispatchProfile::Unknown,
        };
        classify_connector(cfg)
    }
}

fn classify_connector(cfg: &Value) -> DispatchProfile {
    let name = cfg
        .get("kv_connector")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_ascii_lowercase();
    match name.as_str() {
        "mooncakeconnectorv1" | "mooncakehybridconnector" | "nixlconnector" => {
            DispatchProfile::Handoff
        }
        "mooncakelayerwiseconnector" => DispatchProfile::Trigger,
        "multiconnector" => {
            let connectors = cfg
                .get("kv_connector_extra_config")
                .and_then(|e| e.get("connectors"))
                .and_then(Value::as_array);
            match connectors {
                Some(list) if list.len() >= 2 => classify_connector(&list[0]),
                _ => DispatchProfile::Unknown,
            }
        }
        _ => DispatchProfile::Unknown,
    }
}

/// `health_check_config` with defaults filled in.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HealthCheckConfig {
    pub enable_virtual_inference: bool,
    /// Percent; virtual inference runs only when 0 < threshold <= 100 (checked at start).
    pub npu_usage_threshold: f64,
    pub max_failure_count: i64,
    /// Seconds.
    pub health_collector_timeout: u64,
    pub health_collector_timeout_retry_attempts: u64,
}

impl Default for HealthCheckConfig {
    fn default() -> Self {
        HealthCheckConfig {
            enable_virtual_inference: false,
            npu_usage_threshold: 3.0,
            max_failure_count: 6,
            health_collector_timeout: 5,
            health_collector_timeout_retry_attempts: 3,
        }
    }
}

const HEALTH_KEYS: [&str; 5] = [
    "enable_virtual_inference",
    "npu_usage_threshold",
    "max_failure_count",
    "health_collector_timeout",
    "health_collector_timeout_retry_attempts",
];

impl HealthCheckConfig {
    /// The defaults of an engine written inline in `agent.toml`: MindIE's, with virtual
    /// inference on. Hang detection is what the agent is for; MindIE's own files
    /// (`user_config.json`, single-engine mode) keep MindIE's `false`, so they mean there
    /// what they mean to MindIE.
    pub(crate) fn inline_defaults() -> HealthCheckConfig {
        HealthCheckConfig {
            enable_virtual_inference: true,
            ..HealthCheckConfig::default()
        }
    }

    /// Builds the config from a `health_check_config` object (absent or null: MindIE's
    /// defaults).
    pub fn from_value(v: Option<&Value>) -> Result<HealthCheckConfig, String> {
        HealthCheckConfig::from_value_over(HealthCheckConfig::default(), v)
    }

    /// [`HealthCheckConfig::from_value`], with `defaults` for the keys left out.
    pub(crate) fn from_value_over(
        defaults: HealthCheckConfig,
        v: Option<&Value>,
    ) -> Result<HealthCheckConfig, String> {
        let mut cfg = defaults;
        let obj = match v {
            None | Some(Value::Null) => return Ok(cfg),
            Some(Value::Object(o)) => o,
            Some(other) => {
                return Err(format!(
                    "health_check_config must be an object, got {}",
                    py_repr(other)
                ));
            }
        };
        for key in obj.keys() {
            if !HEALTH_KEYS.contains(&key.as_str()) {
                let hint = if key == "virtual_inference_timeout" {
                    " (a MindIE V6 key; this agent follows V5: set the probe timeout in the agent config)"
                } else {
                    ""
                };
                return Err(format!(
                    "health_check_config: {}{hint}",
                    super::unknown::message(key, &HEALTH_KEYS)
                ));
            }
        }
        // The reference validates none of these three at load and uses them as Python values.
        // Booleans and numbers mean what they mean there (a non-zero number is true; True is
        // 1); strings, null and containers are refused here, because the reference would read
        // any non-empty string as true (even "false") or fail at its first comparison.
        if let Some(v) = obj.get("enable_virtual_inference") {
            cfg.enable_virtual_inference = match v {
                Value::Bool(b) => *b,
                Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
                _ => {
                    return Err(format!(
                        "enable_virtual_inference must be true or false, got {}",
                        py_repr(v)
                    ));
                }
            };
        }
        if let Some(v) = obj.get("npu_usage_threshold") {
            cfg.npu_usage_threshold = python_number(v).ok_or_else(|| {
                format!("npu_usage_threshold must be a number, got {}", py_repr(v))
            })?;
        }
        if let Some(v) = obj.get("max_failure_count") {
            // `count >= max` with integer counts: a fractional max acts as its ceiling.
            cfg.max_failure_count = python_number(v)
                .map(|f| f.ceil().clamp(i64::MIN as f64, i64::MAX as f64) as i64)
                .ok_or_else(|| format!("max_failure_count must be a number, got {}", py_repr(v)))?;
        }
        if let Some(v) = obj.get("health_collector_timeout") {
            cfg.health_collector_timeout =
                positive_int("health_collector_timeout", v, HEALTH_COLLECTOR_TIMEOUT_MAX)?;
        }
        if let Some(v) = obj.get("health_collector_timeout_retry_attempts") {
            cfg.health_collector_timeout_retry_attempts = positive_int(
                "health_collector_timeout_retry_attempts",
                v,
                RETRY_ATTEMPTS_MAX,
            )?;
        }
        Ok(cfg)
    }

    /// Whether the threshold is in the range that lets virtual inference run.
    pub(crate) fn threshold_ok(&self) -> bool {
        self.npu_usage_threshold > 0.0 && self.npu_usage_threshold <= 100.0
    }
}

/// A JSON value as a Python number: numbers, and booleans as 1/0.
fn python_number(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::Bool(b) => Some(if *b { 1.0 } else { 0.0 }),
        _ => None,
    }
}

/// The reference's check for the two collector fields: an int, not a bool, at least 1; and
/// the agent's upper bound `max`.
fn positive_int(name: &str, v: &Value, max: u64) -> Result<u64, String> {
    let n = match v {
        Value::Number(n) if n.is_i64() || n.is_u64() => n.as_i64().unwrap_or(i64::MAX),
        _ => return Err(format!("{name} must be an integer, got {}", py_repr(v))),
    };
    if n < 1 {
        return Err(format!("{name} must be >= 1, got {n}"));
    }
    if n as u64 > max {
        return Err(format!("{name} must be <= {max}, got {v}"));
    }
    Ok(n as u64)
}

/// A value rendered as Python's `repr` would show it (the reference's error texts do).
pub(crate) fn py_repr(v: &Value) -> String {
    match v {
        Value::Null => "None".to_owned(),
        Value::Bool(true) => "True".to_owned(),
        Value::Bool(false) => "False".to_owned(),
        Value::String(s) => format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'")),
        other => other.to_string(),
    }
}

/// A TLS config object (reference §4.3). Unknown keys are ignored, as in the reference.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TlsConfig {
    pub enable_tls: bool,
    pub ca_file: PathBuf,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    pub passwd_file: PathBuf,
    pub crl_file: PathBuf,
}

impl Default for TlsConfig {
    fn default() -> Self {
        TlsConfig {
            enable_tls: false,
            ca_file: "security/mgmt/cert/ca.crt".into(),
            cert_file: "security/mgmt/cert/server.crt".into(),
            key_file: "security/mgmt/keys/server.key".into(),
            passwd_file: "security/mgmt/keys/key_pwd.txt".into(),
            crl_file: PathBuf::new(),
        }
    }
}

impl TlsConfig {
    /// Reads a TLS object; relative paths are resolved against `base`.
    pub(crate) fn from_value(
        name: &str,
        v: Option<&Value>,
        base: &Path,
    ) -> Result<TlsConfig, String> {
        let mut t = TlsConfig::default();
        match v {
            None | Some(Value::Null) => {}
            Some(Value::Object(o)) => {
                if let Some(e) = o.get("enable_tls") {
                    t.enable_tls = e.as_bool().ok_or_else(|| {
                        format!(
                            "{name}.enable_tls must be true or false, got {}",
                            py_repr(e)
                        )
                    })?;
                }
                for (key, slot) in [
                    ("ca_file", &mut t.ca_file),
                    ("cert_file", &mut t.cert_file),
                    ("key_file", &mut t.key_file),
                    ("passwd_file", &mut t.passwd_file),
                    ("crl_file", &mut t.crl_file),
                ] {
                    if let Some(p) = o.get(key) {
                        let s = p.as_str().ok_or_else(|| {
                            format!("{name}.{key} must be a path string, got {}", py_repr(p))
                        })?;
                        *slot = PathBuf::from(s);
                    }
                }
            }
            Some(other) => return Err(format!("{name} must be an object, got {}", py_repr(other))),
        }
        for p in [
            &mut t.ca_file,
            &mut t.cert_file,
            &mut t.key_file,
            &mut t.passwd_file,
            &mut t.crl_file,
        ] {
            if !p.as_os_str().is_empty() && p.is_relative() {
                *p = base.join(&*p);
            }
        }
        Ok(t)
    }
}

/// One role's engine section of `user_config.json`, as the agent needs it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EngineSection {
    pub engine_type: EngineType,
    pub dispatch_profile: DispatchProfile,
    /// `engine_config.served_model_name` (first entry), else `engine_config.model`.
    pub model: Option<String>,
    /// vLLM `headless` (PCP follower): never probes.
    pub headless: bool,
    pub health_check_config: HealthCheckConfig,
    pub mgmt_tls_config: TlsConfig,
    pub infer_tls_config: TlsConfig,
}

impl EngineSection {
    /// Parses the engine section of `role` from a whole `user_config.json` document.
    /// `base` resolves relative TLS paths. Errors name the section and key.
    pub fn from_user_config(doc: &Value, role: Role, base: &Path) -> Result<EngineSection, String> {
        let section = role.section();
        let sec = doc
            .get(&section)
            .ok_or_else(|| format!("no {section} section (role {})", role.as_str()))?;
        if !sec.is_object() {
            return Err(format!("{section} must be an object"));
        }
        let deploy_tls = doc
            .get("motor_deploy_config")
            .and_then(|d| d.get("tls_config"));
        let tls = |key: &str| sec.get(key).or_else(|| deploy_tls.and_then(|t| t.get(key)));
        EngineSection::from_parts(
            sec,
            tls("mgmt_tls_config"),
            tls("infer_tls_config"),
            base,
            HealthCheckConfig::default(),
        )
        .map_err(|e| format!("{section}: {e}"))
    }

    /// Parses an engine section object (also used for inline engines in the agent config);
    /// `health_defaults` fills the `health_check_config` keys left out.
    pub(crate) fn from_parts(
        sec: &Value,
        mgmt_tls: Option<&Value>,
        infer_tls: Option<&Value>,
        base: &Path,
        health_defaults: HealthCheckConfig,
    ) -> Result<EngineSection, String> {
        // The words come from the list of kinds, so the errors name every kind.
        let engine_type = match sec.get("engine_type") {
            None => {
                return Err(format!(
                    "engine_type is required ({})",
                    EngineType::one_of()
                ));
            }
            Some(v) => v.as_str().and_then(EngineType::parse).ok_or_else(|| {
                format!(
                    "engine_type must be {}, got {}",
                    EngineType::one_of(),
                    py_repr(v)
                )
            })?,
        };
        let engine_config = sec.get("engine_config");
        let dispatch_profile = match sec.get("dispatch_profile") {
            Some(Value::String(s)) => DispatchProfile::parse(s)?,
            Some(Value::Null) | None => DispatchProfile::infer(
                engine_type,
                engine_config.and_then(|e| e.get("kv_transfer_config")),
            ),
            Some(v) => {
                return Err(format!(
                    "dispatch_profile must be a string, got {}",
                    py_repr(v)
                ));
            }
        };
        let model = match engine_config.and_then(|e| e.get("served_model_name")) {
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Array(a)) => a.first().and_then(Value::as_str).map(str::to_owned),
            _ => None,
        }
        .or_else(|| {
            engine_config
                .and_then(|e| e.get("model"))
                .and_then(Value::as_str)
                .map(str::to_owned)
        });
        let headless = engine_config
            .and_then(|e| e.get("headless"))
            .and_then(Value::as_bool)
            .unwrap_or(false);
        Ok(EngineSection {
            engine_type,
            dispatch_profile,
            model,
            headless,
            health_check_config: HealthCheckConfig::from_value_over(
                health_defaults,
                sec.get("health_check_config"),
            )?,
            mgmt_tls_config: TlsConfig::from_value("mgmt_tls_config", mgmt_tls, base)?,
            infer_tls_config: TlsConfig::from_value("infer_tls_config", infer_tls, base)?,
        })
    }
}

/// Reads and parses a JSON file (a regular file of at most 4 MiB, [`super::read`]); the
/// caller names the file in errors.
pub(crate) fn read_json(path: &Path) -> Result<Value, String> {
    let text = super::read::text(path)?;
    serde_json::from_str(&text).map_err(|e| format!("invalid JSON: {e}"))
}

/// Looks up `key` in MindIE's `env.json`: the role's `motor_engine_<role>_env` section if it
/// has the key, else `motor_common_env`. Returns the value (numbers as text) and the section.
pub fn env_json_lookup(doc: &Value, role: Role, key: &str) -> Option<(String, String)> {
    for section in [role.env_section(), "motor_common_env".to_owned()] {
        if let Some(v) = doc.get(&section).and_then(|s| s.get(key)) {
            let text = match v {
                Value::String(s) => s.clone(),
                Value::Null => continue,
                other => other.to_string(),
            };
            return Some((text, section));
        }
    }
    None
}

/// `health_check_config` bounds beyond the reference's `>= 1` (checked by [`HealthCheckConfig::from_value`]).
pub(crate) mod bounds {
    /// Seconds.
    pub(crate) const HEALTH_COLLECTOR_TIMEOUT_MAX: u64 = 3600;
    pub(crate) const RETRY_ATTEMPTS_MAX: u64 = 100;
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    // tests/engine_server/config/test_endpoint.py: defaults 5/3/3/false.
    #[test]
    fn defaults_match_the_reference() {
        let c = HealthCheckConfig::from_value(None).unwrap();
        assert_eq!(c.health_collector_timeout, 5);
        assert_eq!(c.health_collector_timeout_retry_attempts, 3);
        assert_eq!(c.npu_usage_threshold, 3.0);
        assert_eq!(c.max_failure_count, 6);
        assert!(!c.enable_virtual_inference);
        assert_eq!(HealthCheckConfig::from_value(Some(&json!({}))).unwrap(), c);
    }

    #[test]
    fn overrides_are_taken() {
        let c = HealthCheckConfig::from_value(Some(&json!({
            "enable_virtual_inference": true, "npu_usage_threshold": 10, "max_failure_count": 2,
            "health_collector_timeout": 7, "health_collector_timeout_retry_attempts": 1
        })))
        .unwrap();
        assert!(c.enable_virtual_inference);
        assert_eq!((c.npu_usage_threshold, c.max_failure_count), (10.0, 2));
        assert_eq!(
            (
                c.health_collector_timeout,
                c.health_collector_timeout_retry_attempts
            ),
            (7, 1)
        );
    }

    // The reference rejects "abc", True, False, 0 and "4" for the two collector fields.
    #[test]
    fn collector_fields_are_validated_with_the_reference_texts() {
        for field in [
            "health_collector_timeout",
            "health_collector_timeout_retry_attempts",
        ] {
            for (bad, text) in [
                (
                    json!("abc"),
                    format!("{field} must be an integer, got 'abc'"),
                ),
                (json!(true), format!("{field} must be an integer, got True")),
                (
                    json!(false),
                    format!("{field} must be an integer, got False"),
                ),
                (json!(0), format!("{field} must be >= 1, got 0")),
                (json!("4"), format!("{field} must be an integer, got '4'")),
                (json!(2.5), format!("{field} must be an integer, got 2.5")),
                (json!(null), format!("{field} must be an integer, got None")),
            ] {
                let err = HealthCheckConfig::from_value(Some(&json!({ field: bad }))).unwrap_err();
                assert_eq!(err, text);
            }
        }
    }

    // No validation at load in the reference: booleans and numbers keep their Python meaning;
    // what the reference would misread or crash on is refused with the field named.
    #[test]
    fn the_three_unvalidated_fields_take_python_values() {
        let c = HealthCheckConfig::from_value(Some(&json!({
            "enable_virtual_inference": 1, "npu_usage_threshold": true, "max_failure_count": 2.5
        })))
        .unwrap();
        assert!(c.enable_virtual_inference);
        assert_eq!(c.npu_usage_threshold, 1.0);
        assert_eq!(c.max_failure_count, 3);
        let c = HealthCheckConfig::from_value(Some(
            &json!({"enable_virtual_inference": 0, "max_failure_count": 0}),
        ))
        .unwrap();
        assert!(!c.enable_virtual_inference);
        assert_eq!(c.max_failure_count, 0);
        for (k, v) in [
            ("enable_virtual_inference", json!("false")),
            ("npu_usage_threshold", json!("3")),
            ("max_failure_count", json!(null)),
        ] {
            let err = HealthCheckConfig::from_value(Some(&json!({ k: v }))).unwrap_err();
            assert!(err.starts_with(k), "{err}");
        }
    }

    #[test]
    fn unknown_keys_fail_and_the_v6_key_says_why() {
        let err = HealthCheckConfig::from_value(Some(&json!({"virtual_inference_timeout": 5.0})))
            .unwrap_err();
        assert!(
            err.contains("unknown key `virtual_inference_timeout`") && err.contains("V6"),
            "{err}"
        );
        let err = HealthCheckConfig::from_value(Some(&json!({"max_failures": 5}))).unwrap_err();
        assert!(err.contains("unknown key `max_failures`"), "{err}");
        // A typo gets the nearest key, in the same form as the agent's TOML.
        let err = HealthCheckConfig::from_value(Some(&json!({"max_failure_cont": 5}))).unwrap_err();
        assert!(
            err.contains("unknown key `max_failure_cont`; did you mean `max_failure_count`?"),
            "{err}"
        );
    }

    #[test]
    fn threshold_range() {
        for (t, ok) in [
            (3.0, true),
            (0.0, false),
            (-1.0, false),
            (100.0, true),
            (101.0, false),
            (200.0, false),
        ] {
            let c = HealthCheckConfig {
                npu_usage_threshold: t,
                ..HealthCheckConfig::default()
            };
            assert_eq!(c.threshold_ok(), ok, "{t}");
        }
    }

    // Reference §4.4.
    #[test]
    fn dispatch_profile_explicit_and_inferred() {
        assert_eq!(
            DispatchProfile::parse("Handoff").unwrap(),
            DispatchProfile::Handoff
        );
        assert_eq!(
            DispatchProfile::parse("prefill_handoff_decode").unwrap(),
            DispatchProfile::Handoff
        );
        assert_eq!(
            DispatchProfile::parse("CONCURRENT_ENGINE_SYNC").unwrap(),
            DispatchProfile::Trigger
        );
        assert_eq!(
            DispatchProfile::parse("bootstrap").unwrap(),
            DispatchProfile::Bootstrap
        );
        assert!(
            DispatchProfile::parse("pipeline")
                .unwrap_err()
                .contains("'pipeline'")
        );
        let v = EngineType::Vllm;
        for (conn, want) in [
            ("MooncakeConnectorV1", DispatchProfile::Handoff),
            ("mooncakehybridconnector", DispatchProfile::Handoff),
            ("NixlConnector", DispatchProfile::Handoff),
            ("MooncakeLayerwiseConnector", DispatchProfile::Trigger),
            ("SomethingElse", DispatchProfile::Unknown),
        ] {
            assert_eq!(
                DispatchProfile::infer(v, Some(&json!({ "kv_connector": conn }))),
                want,
                "{conn}"
            );
        }
        let multi = json!({"kv_connector": "MultiConnector", "kv_connector_extra_config": {"connectors": [
            {"kv_connector": "MooncakeLayerwiseConnector"}, {"kv_connector": "NixlConnector"}]}});
        assert_eq!(
            DispatchProfile::infer(v, Some(&multi)),
            DispatchProfile::Trigger
        );
        let short = json!({"kv_connector": "MultiConnector", "kv_connector_extra_config": {"connectors": [
            {"kv_connector": "MooncakeLayerwiseConnector"}]}});
        assert_eq!(
            DispatchProfile::infer(v, Some(&short)),
            DispatchProfile::Unknown
        );
        let as_string = json!("{\"kv_connector\": \"MooncakeLayerwiseConnector\"}");
        assert_eq!(
            DispatchProfile::infer(v, Some(&as_string)),
            DispatchProfile::Trigger
        );
        assert_eq!(
            DispatchProfile::infer(
                EngineType::Sglang,
                Some(&json!({"kv_connector": "NixlConnector"}))
            ),
            DispatchProfile::Unknown
        );
    }

    #[test]
    fn engine_section_from_user_config() {
        let doc = json!({
            "motor_deploy_config": {"tls_config": {"mgmt_tls_config": {"enable_tls": true, "cert_file": "c.pem", "extra": 1}}},
            "motor_engine_decode_config": {
                "engine_type": "vllm",
                "engine_config": {"served_model_name": ["qwen", "alias"], "kv_transfer_config": {"kv_connector": "MooncakeLayerwiseConnector"}},
                "health_check_config": {"enable_virtual_inference": true, "npu_usage_threshold": 10}
            }
        });
        let s =
            EngineSection::from_user_config(&doc, Role::Decode, Path::new("/etc/mindie")).unwrap();
        assert_eq!(s.engine_type, EngineType::Vllm);
        assert_eq!(s.dispatch_profile, DispatchProfile::Trigger);
        assert_eq!(s.model.as_deref(), Some("qwen"));
        assert!(s.mgmt_tls_config.enable_tls);
        assert_eq!(s.mgmt_tls_config.cert_file, Path::new("/etc/mindie/c.pem"));
        assert!(!s.infer_tls_config.enable_tls);
        assert_eq!(s.health_check_config.npu_usage_threshold, 10.0);
        let err = EngineSection::from_user_config(&doc, Role::Prefill, Path::new("/")).unwrap_err();
        assert!(err.contains("motor_engine_prefill_config"), "{err}");
    }

    #[test]
    fn engine_type_is_required_and_checked() {
        let base = Path::new("/");
        let d = HealthCheckConfig::default;
        let err = EngineSection::from_parts(&json!({}), None, None, base, d()).unwrap_err();
        assert!(err.contains("engine_type is required"), "{err}");
        let err = EngineSection::from_parts(&json!({"engine_type": "trt"}), None, None, base, d())
            .unwrap_err();
        assert!(err.contains("'trt'"), "{err}");
        assert!(
            err.contains("'vllm', 'sglang' or 'mindie'"),
            "every kind named: {err}"
        );
    }

    #[test]
    fn env_json_prefers_the_role_section() {
        let doc = json!({"motor_common_env": {"ASCEND_GLOBAL_LOG_LEVEL": 3, "X": "c"},
                         "motor_engine_prefill_env": {"ASCEND_GLOBAL_LOG_LEVEL": "1"}});
        assert_eq!(
            env_json_lookup(&doc, Role::Prefill, "ASCEND_GLOBAL_LOG_LEVEL"),
            Some(("1".into(), "motor_engine_prefill_env".into()))
        );
        assert_eq!(
            env_json_lookup(&doc, Role::Decode, "ASCEND_GLOBAL_LOG_LEVEL"),
            Some(("3".into(), "motor_common_env".into()))
        );
        assert_eq!(env_json_lookup(&doc, Role::Decode, "MISSING"), None);
    }
}

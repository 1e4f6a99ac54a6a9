//! A configuration error, located: the file, the table or flag, the key. Every check in
//! `config/` answers with a [`KeyError`] (the key inside its table, the message) that the
//! caller places ([`engine_place`]) in a [`ConfigError`].

/// A configuration error, located.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {place}{message}")]
pub struct ConfigError {
    pub file: String,
    /// Table/key prefix such as `[[engine]] #1 (prefill-0): ` (may be empty).
    pub place: String,
    pub message: String,
}

impl ConfigError {
    pub(crate) fn new(
        file: impl Into<String>,
        place: impl Into<String>,
        message: impl Into<String>,
    ) -> ConfigError {
        let mut place = place.into();
        if !place.is_empty() && !place.ends_with(": ") {
            place.push_str(": ");
        }
        ConfigError {
            file: file.into(),
            place,
            message: message.into(),
        }
    }
}

/// A key (a path inside its table, such as `timing.window`) and what is wrong with it.
pub type KeyError = (String, String);

/// The place of an engine's `key` in host mode: `[[engine]] #2 (decode-0) timing.window`.
pub fn engine_place(index: usize, name: Option<&str>, key: &str) -> String {
    let name = name
        .map(|n| format!(" ({})", n.escape_debug()))
        .unwrap_or_default();
    format!("[[engine]] #{}{name} {key}", index + 1)
        .trim_end()
        .to_owned()
}

/// The place of an engine's `key` in single-engine mode: the flag that sets it, else the key
/// (set in `user_config.json`).
pub(super) fn single_place(key: &str) -> String {
    match key {
        "port" => "--port",
        "mgmt_port" => "--mgmt-port",
        "host" | "mgmt_host" => "--host",
        "dp_rank" => "--dp-rank",
        "env_config_path" => "--env-config-path",
        "qos.stall_window" => "--stall-window",
        "qos.probe_max_tokens" => "--qos-probe-max-tokens",
        k if k == "devices" || k.starts_with("devices[") => "--devices",
        // The file is the error's own (`--config-path`).
        "config_path" => "",
        other => other,
    }
    .to_owned()
}

/// How the configuration was given (errors name its places accordingly).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Form {
    /// `agent.toml`: places are tables and keys.
    #[default]
    Host,
    /// MindIE's engine-server flags: places are flags, or keys of `user_config.json`.
    Single,
}

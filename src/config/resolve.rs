//! Resolution: the one place configuration reads beyond its own text. After `agent.toml` is
//! parsed (or the engine-server flags are), each engine's MindIE files are read here (its
//! `user_config.json` section, its `env.json`), and the agent's own environment when no other
//! source of an engine's variables is configured; validation comes after, on the result.

use super::mindie::{self, EngineSection, Role};
use std::path::Path;

/// The `role` section of the `user_config.json` at `path` (its relative paths taken from
/// the file's own directory). The message does not name the file: the caller places it.
pub(crate) fn user_config(path: &Path, role: Role) -> Result<EngineSection, String> {
    let doc = mindie::read_json(path)?;
    let base = path.parent().unwrap_or(Path::new("."));
    EngineSection::from_user_config(&doc, role, base)
}

/// MindIE's `env.json` at `path` (an engine's variables, by role section).
pub(crate) fn env_json(path: &Path) -> Result<serde_json::Value, String> {
    mindie::read_json(path)
}

/// `key` in the agent's own environment (an engine with no `engine_env` and no `env.json`
/// runs with the agent's variables).
pub(crate) fn process_env(key: &str) -> Option<String> {
    std::env::var(key).ok()
}

//! Configuration: what the agent monitors and how.
//!
//! Two ways in, one result ([`AgentConfig`]):
//! - single-engine mode mirrors MindIE's engine-server flags (`--config-path user_config.json
//!   --role … --host … --port … --mgmt-port …`) and reads that role's section ([`mindie`]);
//! - host mode reads `agent.toml` ([`file`]) with an `[agent]` table and any number of
//!   `[[engine]]` tables, each pointing at a `user_config.json` + role or carrying the keys
//!   inline.
//!
//! Parsed once ([`file`]), resolved ([`resolve`]: the MindIE files and the environment), then
//! checked: each table's type checks itself beside its bounds ([`agent`], [`engine`],
//! [`timing`], [`qos`], [`policy`]; the integrations' tables, [`tables`], are their own and
//! check themselves), and [`effective`] the whole,
//! so that `check-config`, `run` and a reload apply the same checks. Every error names the
//! file, the table and the key; [`read`] says how every file named is read; `advice` is
//! what `check-config` says of a valid configuration that may not do what was meant.
//! Configuration is the bottom layer: it names no runtime module.

mod advice;
pub mod agent;
pub mod bounds;
pub(crate) mod duration;
pub(crate) mod effective;
pub(crate) mod engine;
pub(crate) mod engine_type;
mod error;
pub(crate) mod evidence;
pub mod file;
pub mod mindie;
pub mod policy;
pub mod qos;
pub(crate) mod read;
pub(crate) mod resolve;
pub(crate) mod tables;
pub mod timing;
pub(crate) mod unknown;

pub use agent::{
    AdminAuthConfig, AdminTls, AgentSettings, BackendChoice, DEFAULT_SAMPLER_STUCK_AFTER,
    ListenerLimits, PodResourcesSettings, check_log_filter,
};
pub use effective::{AgentConfig, SingleEngine};
pub use engine::{
    EngineEnv, EngineLocation, EngineSpec, PolicyChoice, Sourced, listen_addr,
    parse_visible_devices,
};
pub use error::{ConfigError, Form, KeyError, engine_place};
pub use timing::Timing;

#[cfg(test)]
mod tests;

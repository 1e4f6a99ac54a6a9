//! HAProxy's configuration table: `[engine.actions.haproxy]`, the state each level and the
//! verdict `abnormal` put the engine's server in, and the states themselves. Data only: the
//! configuration reads it through the seam ([`TABLE`]), the rule is [`super::agent_check`].

use crate::config::tables::{ConfigTable, Table};
use crate::config::{EngineSpec, KeyError};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// `[engine.actions.haproxy]`, as the configuration reads it.
pub(crate) static TABLE: ConfigTable<HaproxyMap> = ConfigTable::engine("actions.haproxy");

/// A state HAProxy puts a server in, through the agent check's answer
/// (`AgentCheck::line` in the folder's rule has the words each one sends).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, strum::EnumIter)]
#[serde(rename_all = "lowercase")]
pub(crate) enum HaproxyState {
    /// In rotation at full weight, no connection limit.
    Ready,
    /// In rotation, at most as many requests as were running when the level began (at
    /// least 1): new ones wait in HAProxy's queue (`timeout queue`).
    Queue,
    /// No new requests (they go to the other servers, or the `backup`); requests in flight
    /// finish.
    Drain,
    /// Maintenance: no new requests; requests in flight finish.
    Maint,
    /// Marked down: out of rotation; requests in flight finish unless the server line has
    /// `on-marked-down shutdown-sessions`.
    Down,
}

impl HaproxyState {
    /// As written in the file, and in the action record.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            HaproxyState::Ready => "ready",
            HaproxyState::Queue => "queue",
            HaproxyState::Drain => "drain",
            HaproxyState::Maint => "maint",
            HaproxyState::Down => "down",
        }
    }
}

/// `[engine.actions.haproxy]`: the state each level and the verdict `abnormal` put the
/// engine's server in. `normal` is always `ready`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct HaproxyMap {
    /// Default `queue`: in-flight requests finish, new ones wait in HAProxy's queue.
    pub throttle: HaproxyState,
    /// Default `drain`: new requests go to the `backup` (draft) server.
    pub degrade: HaproxyState,
    /// Default `down`.
    pub evict: HaproxyState,
    /// Default `down`.
    pub abnormal: HaproxyState,
    /// The connection cap every answer but `queue`'s sends (`maxconn:N`), default 100000:
    /// in effect none. It replaces the server line's own `maxconn` (HAProxy keeps the
    /// agent's last one), and it is never 0: HAProxy 2.6 takes `maxconn:0` for "no cap" but
    /// then leaves the requests already queued there until `timeout queue` (measured).
    pub maxconn: u32,
}

/// [`HaproxyMap::maxconn`]'s default.
pub(crate) const HAPROXY_OPEN_MAXCONN: u32 = 100_000;

impl Default for HaproxyMap {
    fn default() -> Self {
        HaproxyMap {
            throttle: HaproxyState::Queue,
            degrade: HaproxyState::Drain,
            evict: HaproxyState::Down,
            abnormal: HaproxyState::Down,
            maxconn: HAPROXY_OPEN_MAXCONN,
        }
    }
}

impl HaproxyMap {
    /// The map of the engine `spec`.
    pub(crate) fn of(spec: &EngineSpec) -> HaproxyMap {
        spec.tables.get::<HaproxyMap>().copied().unwrap_or_default()
    }
}

impl Table for HaproxyMap {
    fn check(&mut self, _base: &Path) -> Result<(), KeyError> {
        if self.maxconn == 0 {
            return Err((
                "maxconn".to_owned(),
                "`0` would leave HAProxy's queued requests waiting until `timeout queue`: give a cap of 1 or more (the default 100000 is none in effect)".to_owned(),
            ));
        }
        Ok(())
    }
}

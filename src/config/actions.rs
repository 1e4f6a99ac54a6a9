//! `[engine.actions]`: what the degradation levels and the verdict do through the kubelet's
//! probes, the Kubernetes API and HAProxy's agent check (the rules are in
//! [`crate::actions`]).

use super::kubernetes::PodSelector;
use serde::{Deserialize, Serialize};

/// An engine's action settings as read: `[engine.actions]` and `[engine.kubernetes]`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineActions {
    pub actions: ActionsConfig,
    pub pod: PodSelector,
}

/// A state of the engine that makes `/readyz` fail (and the readiness gate `False`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NotReadyOn {
    /// QoS level `throttle` or worse. Opt-in: one load spike can bring every replica to
    /// `throttle` at once, and a pool that takes them all out serves nobody.
    Throttle,
    /// QoS level `degrade` or worse (the seed: move traffic to a smaller draft model).
    Degrade,
    /// QoS level `evict` (held).
    Evict,
    /// The verdict `/status` serves is `abnormal`.
    Abnormal,
}

impl NotReadyOn {
    /// As written in the file.
    pub fn as_str(self) -> &'static str {
        match self {
            NotReadyOn::Throttle => "throttle",
            NotReadyOn::Degrade => "degrade",
            NotReadyOn::Evict => "evict",
            NotReadyOn::Abnormal => "abnormal",
        }
    }
}

/// A state HAProxy puts a server in, through the agent check's answer
/// (`crate::actions::haproxy` has the words each one sends).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, strum::EnumIter)]
#[serde(rename_all = "lowercase")]
pub enum HaproxyState {
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
    pub fn as_str(self) -> &'static str {
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
pub struct HaproxyMap {
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
pub const HAPROXY_OPEN_MAXCONN: u32 = 100_000;

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

/// `[engine.actions]`, a key left out keeps its default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ActionsConfig {
    /// What makes `/readyz` answer 503 and the readiness gate `False`. Default `degrade`,
    /// `evict` and `abnormal`; `throttle` is opt-in. A level listed covers the worse ones
    /// (`throttle` also fails at `degrade` and `evict`). An engine whose `/health` never
    /// answered is never ready, whatever the list.
    pub not_ready_on: Vec<NotReadyOn>,
    /// What HAProxy's agent check answers at each level (`[agent] haproxy_agent_listen`).
    pub haproxy: HaproxyMap,
}

impl Default for ActionsConfig {
    fn default() -> Self {
        ActionsConfig {
            not_ready_on: vec![NotReadyOn::Degrade, NotReadyOn::Evict, NotReadyOn::Abnormal],
            haproxy: HaproxyMap::default(),
        }
    }
}

impl ActionsConfig {
    /// Checks the list and the HAProxy cap; `Err((key, message))`.
    pub fn validate(&self) -> Result<(), super::KeyError> {
        if self.haproxy.maxconn == 0 {
            return Err((
                "haproxy.maxconn".to_owned(),
                "`0` would leave HAProxy's queued requests waiting until `timeout queue`: give a cap of 1 or more (the default 100000 is none in effect)".to_owned(),
            ));
        }
        let mut seen = self.not_ready_on.clone();
        seen.sort();
        if let Some(w) = seen.windows(2).find(|w| w[0] == w[1]) {
            return Err((
                "not_ready_on".to_owned(),
                format!("`{}` is listed twice", w[0].as_str()),
            ));
        }
        Ok(())
    }

    /// Whether `on` is in the list.
    pub fn fails_on(&self, on: NotReadyOn) -> bool {
        self.not_ready_on.contains(&on)
    }
}

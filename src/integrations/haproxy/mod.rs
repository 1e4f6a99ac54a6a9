//! HAProxy's agent check: the one line the agent answers when HAProxy polls it for an engine
//! (`agent-check agent-send "<engine name>\n"` on the server line; the listener is
//! [`listener`], the configuration table [`config`]).
//!
//! HAProxy keeps each word of an answer until a later answer changes it (a `maint` stays
//! until a `ready`, a `maxconn:` until another), so every answer carries all four: the
//! operational state (`up`/`down`), the administrative state (`ready`/`drain`/`maint`), the
//! weight (always `100%`: a smaller share of a server line's default weight 1 rounds to 0,
//! which HAProxy treats as drained) and the connection cap (`[engine.actions.haproxy]
//! maxconn`, 100000 by default, outside `queue`; never `maxconn:0`, HAProxy's "no cap", after
//! which it leaves the requests already queued waiting until `timeout queue`). Text after `#`
//! is what HAProxy shows on its stats page (`last_agt`) for `up` and `down`: a fixed phrase
//! ([`AgentCheck::shown`]) naming the level or the kind of fault, never a score, the verdict's
//! reason or anything a client sent, since whoever reaches the port reads it. The whole
//! reason stays in `/status/detail` (`routers.haproxy`).
//!
//! Checked against HAProxy 2.6.12 (Debian's `haproxy`), docs/degradation.md: `drain`,
//! `maint` and `down` each send new requests to a `backup` server and let the ones in flight
//! finish; `maxconn:N` keeps new requests on the server, waiting in HAProxy's queue past N;
//! `ready` clears a `maint` set by hand on HAProxy's CLI at the next poll.

pub(crate) mod config;
pub(crate) mod listener;

use crate::config::tables::TableReader;
use crate::config::{AgentSettings, EngineSpec, ListenerLimits};
use crate::integrations::facts::{AbnormalCause, ActionInputs};
use crate::integrations::seam::{Engines, Integration, Listen, Serving};
use crate::monitor::journal::{Id, Told};
use crate::monitor::verdict::Status;
use crate::qos::score::Level;
use config::{HAPROXY_OPEN_MAXCONN, HaproxyMap, HaproxyState};
use strum::IntoEnumIterator;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Longest text sent after `#`, in bytes: HAProxy keeps 127 bytes of `via agent : down
/// (<text>)` for its stats page (`HCHK_DESC_LEN`, 128 with the NUL, in haproxy/haproxy
/// `include/haproxy/defaults.h`) and cuts the rest. Every [`AgentCheck::shown`] fits.
#[cfg(test)]
pub(crate) const MAX_REASON: usize = 108;

/// Its name in the journal, `/status/detail` and the metrics.
pub(crate) const ID: Id = Id("haproxy");

/// The state an agent check's answer put the server in, as the journal records it.
impl From<HaproxyState> for Told {
    fn from(s: HaproxyState) -> Told {
        Told::state(ID, "agent_check", s.as_str())
    }
}

/// HAProxy's agent check, in the registry.
pub(crate) struct Haproxy;

impl Integration for Haproxy {
    fn id(&self) -> Id {
        ID
    }

    fn describe(&self, spec: &EngineSpec, agent: &AgentSettings) -> String {
        let h = &HaproxyMap::of(spec);
        match agent.haproxy_agent_listen {
            None => "off ([agent] haproxy_agent_listen not set)".to_owned(),
            Some(addr) => format!(
                "agent check on {addr} (agent-send \"{}\\n\"): normal ready, throttle {}, degrade {}, evict {}, abnormal {}",
                spec.name,
                h.throttle.as_str(),
                h.degrade.as_str(),
                h.evict.as_str(),
                h.abnormal.as_str()
            ),
        }
    }

    fn tables(&self) -> Vec<&'static dyn TableReader> {
        vec![&config::TABLE]
    }

    fn router_states(&self) -> Vec<Told> {
        HaproxyState::iter().map(Told::from).collect()
    }

    fn listen(&self, agent: &AgentSettings) -> Option<Listen> {
        agent.haproxy_agent_listen.map(|addr| Listen {
            addr,
            key: "[agent] haproxy_agent_listen",
            label: "HAProxy agent-check listener",
            name: "haproxy agent check",
            hint: "agent-send \"<engine name>\\n\"",
        })
    }

    fn serve(
        &self,
        listener: TcpListener,
        engines: Engines,
        limits: ListenerLimits,
        name: String,
        cancel: CancellationToken,
    ) -> Serving {
        Box::pin(listener::serve(
            listener,
            engines,
            limits.max_connections,
            name,
            cancel,
        ))
    }
}

/// The answer for one poll.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AgentCheck {
    pub state: HaproxyState,
    /// The connection cap sent (`maxconn:N`): the admission cap at `queue`, else the
    /// configured open cap.
    pub maxconn: u32,
    /// What the line says after `#`: a fixed phrase, so no score, no engine's error text and
    /// no client's bytes reach whoever can connect to the port.
    pub shown: &'static str,
    /// Why, in full, for the agent's own record (`/status/detail`); never sent.
    pub reason: String,
}

impl AgentCheck {
    /// The line sent to HAProxy, newline included.
    pub(crate) fn line(&self) -> String {
        let words = match self.state {
            HaproxyState::Ready | HaproxyState::Queue => "up ready",
            HaproxyState::Drain => "up drain",
            HaproxyState::Maint => "up maint",
            HaproxyState::Down => "down ready",
        };
        format!(
            "{words} 100% maxconn:{} #{}\n",
            self.maxconn.max(1),
            self.shown
        )
    }

    /// The answer for a poll that names no engine this agent watches (or none at all):
    /// `down`, so a server line naming no engine here stays out of rotation.
    pub(crate) fn unknown(shown: &'static str) -> AgentCheck {
        AgentCheck {
            state: HaproxyState::Down,
            maxconn: HAPROXY_OPEN_MAXCONN,
            shown,
            reason: shown.to_owned(),
        }
    }
}

/// What the stats page shows for the verdict `abnormal`: the kind of fault only.
fn abnormal_shown(cause: Option<AbnormalCause>) -> &'static str {
    match cause {
        Some(AbnormalCause::Health) => "abnormal: /health fails",
        Some(AbnormalCause::VirtualInference) => "abnormal: virtual inference",
        Some(AbnormalCause::QosEviction) => "abnormal: QoS eviction",
        Some(AbnormalCause::EngineStopped) => "abnormal: an engine process stopped",
        None => "abnormal",
    }
}

/// What the stats page shows for a level: the level, not its score.
fn level_shown(level: Level) -> &'static str {
    match level {
        Level::Normal => "QoS level normal",
        Level::Throttle => "QoS level throttle",
        Level::Degrade => "QoS level degrade",
        Level::Evict => "QoS level evict",
    }
}

/// The agent check's rule: the verdict `abnormal` and each level take the state `map` names
/// for them; `normal` is `ready`; an engine whose `/health` never answered is `down`.
pub(crate) fn agent_check(f: &ActionInputs, map: &HaproxyMap) -> AgentCheck {
    let (state, shown, reason) = match (f.status, f.level) {
        (Status::Initial, _) => (
            HaproxyState::Down,
            "starting",
            format!("starting: {}", f.reason),
        ),
        (Status::Abnormal, _) => (
            map.abnormal,
            abnormal_shown(f.cause),
            format!("abnormal: {}", f.reason),
        ),
        (_, level) => {
            let state = match level {
                Level::Normal => HaproxyState::Ready,
                Level::Throttle => map.throttle,
                Level::Degrade => map.degrade,
                Level::Evict => map.evict,
            };
            (state, level_shown(level), f.level_words())
        }
    };
    let maxconn = match state {
        HaproxyState::Queue => f.admission_cap.unwrap_or(1).clamp(1, map.maxconn.max(1)),
        _ => map.maxconn,
    };
    let reason = match (state, f.admission_cap) {
        (HaproxyState::Queue, Some(n)) => {
            format!("{reason}: at most {n} running (as when it left normal), new ones queue")
        }
        (HaproxyState::Queue, None) => {
            format!(
                "{reason}: at most 1 running (no running count when it left normal), new ones queue"
            )
        }
        _ => reason,
    };
    AgentCheck {
        state,
        maxconn,
        shown,
        reason,
    }
}

#[cfg(test)]
mod tests;

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
//! is the reason HAProxy shows on its stats page (`last_agt`) for `up` and `down`.
//!
//! Checked against HAProxy 2.6.12 (Debian's `haproxy`), docs/degradation.md: `drain`,
//! `maint` and `down` each send new requests to a `backup` server and let the ones in flight
//! finish; `maxconn:N` keeps new requests on the server, waiting in HAProxy's queue past N;
//! `ready` clears a `maint` set by hand on HAProxy's CLI at the next poll.

pub mod config;
pub mod listener;

use super::{ActionInputs, Engines, Integration, Listen, Serving};
use crate::config::{AgentSettings, EngineSpec, ListenerLimits};
use crate::monitor::journal::{self, Told};
use crate::monitor::verdict::Status;
use crate::qos::score::Level;
use config::{HAPROXY_OPEN_MAXCONN, HaproxyMap, HaproxyState};
use strum::IntoEnumIterator;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Longest reason sent after `#`, in bytes: HAProxy keeps 127 bytes of `via agent : down
/// (<reason>)` for its stats page (`HCHK_DESC_LEN`, 128 with the NUL, in haproxy/haproxy
/// `include/haproxy/defaults.h`) and cuts the rest.
pub const MAX_REASON: usize = 108;

/// HAProxy's agent check, in the registry.
pub struct Haproxy;

impl Integration for Haproxy {
    fn id(&self) -> journal::Integration {
        journal::Integration::Haproxy
    }

    fn describe(&self, spec: &EngineSpec, agent: &AgentSettings) -> String {
        let h = &spec.actions.haproxy;
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

    fn router_states(&self) -> Vec<Told> {
        HaproxyState::iter().map(Told::Haproxy).collect()
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
pub struct AgentCheck {
    pub state: HaproxyState,
    /// The connection cap sent (`maxconn:N`): the admission cap at `queue`, else the
    /// configured open cap.
    pub maxconn: u32,
    /// Why, in one line.
    pub reason: String,
}

impl AgentCheck {
    /// The line sent to HAProxy, newline included.
    pub fn line(&self) -> String {
        let words = match self.state {
            HaproxyState::Ready | HaproxyState::Queue => "up ready",
            HaproxyState::Drain => "up drain",
            HaproxyState::Maint => "up maint",
            HaproxyState::Down => "down ready",
        };
        format!(
            "{words} 100% maxconn:{} #{}\n",
            self.maxconn.max(1),
            clean(&self.reason)
        )
    }

    /// The answer for a poll that names no engine this agent watches (or none at all).
    pub fn unknown(reason: String) -> AgentCheck {
        AgentCheck {
            state: HaproxyState::Down,
            maxconn: HAPROXY_OPEN_MAXCONN,
            reason,
        }
    }
}

/// `s` on one line of at most [`MAX_REASON`] bytes. A longer one is cut at the last space
/// that fits and ends in `...`, so the stats page never shows half a word or a dangling `(`.
fn clean(s: &str) -> String {
    let mut out: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if out.len() > MAX_REASON {
        const MORE: &str = "...";
        let mut end = MAX_REASON - MORE.len();
        while !out.is_char_boundary(end) {
            end -= 1;
        }
        out.truncate(end);
        if let Some(space) = out.rfind(' ') {
            out.truncate(space);
        }
        let kept = out.trim_end_matches([' ', ',', ';', ':', '(']).len();
        out.truncate(kept);
        out.push_str(MORE);
    }
    out
}

/// The agent check's rule: the verdict `abnormal` and each level take the state `map` names
/// for them; `normal` is `ready`; an engine whose `/health` never answered is `down`.
pub fn agent_check(f: &ActionInputs, map: &HaproxyMap) -> AgentCheck {
    let (state, reason) = match (f.status, f.level) {
        (Status::Initial, _) => (HaproxyState::Down, format!("starting: {}", f.reason)),
        (Status::Abnormal, _) => (map.abnormal, format!("abnormal: {}", f.reason)),
        (_, Level::Normal) => (HaproxyState::Ready, f.level_words()),
        (_, Level::Throttle) => (map.throttle, f.level_words()),
        (_, Level::Degrade) => (map.degrade, f.level_words()),
        (_, Level::Evict) => (map.evict, f.level_words()),
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
        reason,
    }
}

#[cfg(test)]
mod tests;

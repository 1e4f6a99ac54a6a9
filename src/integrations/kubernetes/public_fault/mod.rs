//! MindCluster public faults (`[agent.kubernetes] public_faults`, off by default): an engine
//! that turns `abnormal` is reported to ClusterD as a public fault on its NPUs (by physical
//! id, on this node), with the agent's own code; `recover` when it is `normal` again; the
//! restart-loop code when its episode escalated (`crate::monitor::episodes`). MindCluster
//! sees a hung engine only this way: its container has not exited.
//!
//! The transport is a ConfigMap per engine, labelled `mc-consumer-publicfault=true`, whose
//! data key `PublicFault` holds one message (ClusterD's informer,
//! `component/clusterd/pkg/interface/kube/informer.go` in Ascend/mind-cluster, reads every
//! such ConfigMap cluster-wide). The message's format and ClusterD's rules are in
//! `component/ascend-common/api/publicfault.go` and
//! `component/clusterd/pkg/application/publicfault/checker.go`; docs/kubernetes.md cites
//! each.
//!
//! What is planned here is pure ([`plan`]): what was published ([`Published`], kept in the
//! engine's state file, so a restarted agent neither repeats an `occur` nor loses a
//! `recover`), what the verdict wants ([`Desired`]), and the rate bound (one message per
//! change, at most one per `public_fault_min_interval`, an open fault's `occur` again every
//! `public_fault_refresh`). [`task`] is the loop and the API call; [`message`] the JSON.

pub(crate) mod message;
pub(crate) mod task;

pub(crate) use super::told::{FaultSent, Kind, Published};
use serde::{Deserialize, Serialize};

/// ClusterD's assertions the agent sends (it never sends `once`: a hung engine lasts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Assertion {
    Occur,
    Recover,
}

impl Assertion {
    /// Its word in the message and the journal.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Assertion::Occur => "occur",
            Assertion::Recover => "recover",
        }
    }
}

/// What the verdict wants published now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Desired {
    /// The engine is `abnormal`: this fault, of the episode begun at `since_unix_ms`.
    Fault { kind: Kind, since_unix_ms: u64 },
    /// The engine is `normal`: no fault.
    Clear,
    /// The verdict is `initial` (the engine has not answered yet, or the agent just
    /// started): nothing changes.
    Unknown,
}

/// The rate bound's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pace {
    pub min_interval_ms: u64,
    pub refresh_ms: u64,
}

/// What to write now: each fault with its assertion, in order (a `recover` before the
/// `occur` that replaces it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Nothing to publish.
    Idle,
    /// Something to publish, held back by the minimum interval until this time.
    Wait { until_unix_ms: u64 },
    /// Write these now.
    Write(Vec<(FaultSent, Assertion)>),
}

/// The fault id of `kind` in the episode begun at `since_ms` of the engine `key` (a hash of
/// node and engine, [`engine_key`]): `nha-<key>-<since>-<1|2>`, 36 characters of ClusterD's
/// `[a-zA-Z0-9-_.]{8,128}`. Stable for the episode, whatever restarts the agent.
pub(crate) fn fault_id(key: &str, kind: Kind, since_ms: u64) -> String {
    format!("nha-{key}-{since_ms}-{}", kind.digit())
}

/// 16 hex digits naming the engine on this node (FNV-1a of `node/engine`): the fault ids
/// and message ids of two engines never meet, and an engine name's characters (anything
/// but `/`) never reach ClusterD's id regex.
pub(crate) fn engine_key(node: &str, engine: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in node
        .bytes()
        .chain(std::iter::once(b'/'))
        .chain(engine.bytes())
    {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// What to write at `now_ms`, given what was published and what is wanted. `fresh` makes a
/// new fault's record (its id, code, devices and description) for an `occur`.
pub(crate) fn plan(
    p: &Published,
    want: &Desired,
    now_ms: u64,
    pace: Pace,
    fresh: impl FnOnce(Kind, u64) -> FaultSent,
) -> Plan {
    let due = |f: &FaultSent| now_ms.saturating_sub(f.sent_unix_ms) >= pace.refresh_ms;
    let mut out = Vec::new();
    match want {
        Desired::Unknown => {}
        Desired::Fault {
            kind,
            since_unix_ms,
        } => {
            let new = fresh(*kind, *since_unix_ms);
            match &p.open {
                Some(o) if o.fault_id == new.fault_id => {
                    if due(o) {
                        out.push((o.clone(), Assertion::Occur));
                    }
                }
                Some(o) => {
                    out.push((o.clone(), Assertion::Recover));
                    out.push((new, Assertion::Occur));
                }
                None => out.push((new, Assertion::Occur)),
            }
        }
        Desired::Clear => match (&p.open, &p.recovered) {
            (Some(o), _) => out.push((o.clone(), Assertion::Recover)),
            (None, Some(r)) if due(r) => out.push((r.clone(), Assertion::Recover)),
            (None, _) => {}
        },
    }
    if out.is_empty() {
        return Plan::Idle;
    }
    match p.last_write_unix_ms {
        Some(last) if now_ms < last + pace.min_interval_ms => Plan::Wait {
            until_unix_ms: last + pace.min_interval_ms,
        },
        _ => Plan::Write(out),
    }
}

/// `p` after `written` was written at `now_ms`.
pub(crate) fn after(p: &Published, written: &[(FaultSent, Assertion)], now_ms: u64) -> Published {
    let mut next = p.clone();
    for (f, a) in written {
        let sent = FaultSent {
            sent_unix_ms: now_ms,
            ..f.clone()
        };
        match a {
            Assertion::Occur => next.open = Some(sent),
            Assertion::Recover => {
                if next.open.as_ref().is_some_and(|o| o.fault_id == f.fault_id) {
                    next.open = None;
                    next.recovered = Some(sent);
                } else if next
                    .recovered
                    .as_ref()
                    .is_some_and(|r| r.fault_id == f.fault_id)
                {
                    // Its one repeat is written: nothing more to send for it.
                    next.recovered = None;
                }
            }
        }
    }
    next.last_write_unix_ms = Some(now_ms);
    next.messages += 1;
    next
}

#[cfg(test)]
mod tests;

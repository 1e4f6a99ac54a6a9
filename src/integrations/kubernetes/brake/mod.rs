//! The fleet brake (`[agent.kubernetes.brake]`, opt-in; docs/kubernetes.md, "The fleet
//! brake"): when more than `max_fraction` of a fleet's engines went `abnormal` through the
//! agent's own rules within `window`, further verdicts of those rules are held in observe
//! mode (`/status` answers as the reference does) until the window clears. The reference's
//! verdicts are never held.
//!
//! The local half is the engine's gate ([`crate::monitor::brake`]): a braked engine answers
//! the held judging until this loop lets an agent-rule verdict through. This loop, one per
//! engine and off every handler's path, watches the two judgings every [`BEAT`]: when the
//! configured one turns `abnormal` and the held one does not, it consults the shared state
//! ([`client::consult`]: one merge patch of its own key, a second when it acts) and opens
//! the gate if the fleet allows it. Until the answer (at most `request_timeout` per call),
//! the verdict is held. The API server unreachable: it stays held (fail closed), and asks again later.

pub(crate) mod client;
pub(crate) use super::config::brake as config;
pub(crate) mod state;

use crate::clock::unix_ms;
use crate::config::AgentSettings;
use crate::integrations::kubernetes::api::KubeClient;
use crate::integrations::kubernetes::config::KubernetesConfig;
use crate::monitor::brake::Gate;
use crate::monitor::{Monitor, Status};
use client::{BrakeError, Home, Tally};
use config::BrakeConfig;
use npu_health_wire::BrakeGate;
use state::{Decision, Fleet, allowed};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How often the loop looks at the engine's two judgings: the observer's beat.
pub(crate) const BEAT: Duration = Duration::from_millis(250);
/// The least wait before asking again after a failed consult.
const RETRY_AFTER_ERROR: Duration = Duration::from_secs(5);

/// The brake as started: its settings, where its state lives, this node.
#[derive(Debug, Clone)]
pub(crate) struct Brake {
    pub cfg: BrakeConfig,
    pub home: Home,
    pub node: String,
}

impl Brake {
    /// The brake of `k`, when it is on; `Err` names what it lacks to start.
    pub(crate) fn of(k: &KubernetesConfig) -> Option<Result<Brake, String>> {
        let cfg = &k.brake;
        if !cfg.enabled {
            return None;
        }
        let Some(namespace) = cfg.home() else {
            return Some(Err("no namespace for its ConfigMap: set [agent.kubernetes.brake] namespace, or $POD_NAMESPACE".to_owned()));
        };
        let Some(node) = k.node() else {
            return Some(Err("no node name (the engines' keys in the shared state): set [agent.kubernetes] node_name, or $NODE_NAME".to_owned()));
        };
        Some(Ok(Brake {
            cfg: cfg.clone(),
            home: Home {
                namespace,
                name: cfg.name.clone(),
            },
            node,
        }))
    }
}

/// Puts a fresh engine under the brake when the brake is on, before its loops start; an
/// engine it cannot hold runs as configured, and the log says why, once.
pub(crate) fn hold(m: &mut Monitor, agent: &AgentSettings) {
    if !KubernetesConfig::of(agent).is_some_and(|k| k.brake.enabled) {
        return;
    }
    if let Err(why) = m.hold_under_brake() {
        tracing::warn!(engine = %m.spec().name, "the fleet brake does not hold this engine: {why}");
    }
}

/// What the loop does at one beat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    Wait,
    /// Ask the shared state whether the configured verdict may act.
    Consult,
    /// The configured verdict is no longer `abnormal`: back to the held judging.
    Release,
}

/// The step at one beat: `configured` and `answered` are whether the configured judging and
/// `/status` say `abnormal`; `due`: a consult may be made now.
pub(crate) fn step(gate: Gate, configured: bool, answered: bool, due: bool) -> Step {
    match gate {
        Gate::Acting if !configured => Step::Release,
        Gate::Held if configured && !answered && due => Step::Consult,
        _ => Step::Wait,
    }
}

/// One engine's episode as the loop keeps it: when it may ask again, and whether its hold
/// was counted.
#[derive(Debug, Default)]
struct Episode {
    ask_at: Option<Instant>,
    counted: bool,
}

/// The shared state as last seen (a consult's answer or a refresh); `None`: not seen yet.
type Known = Option<Fleet>;

/// The engine's brake loop, until `cancel`.
pub(crate) async fn run(
    client: KubeClient,
    brake: Arc<Brake>,
    m: Arc<Monitor>,
    cancel: CancellationToken,
) {
    if m.gate() == Gate::Off {
        return;
    }
    let key = format!("{}/{}", brake.node, m.spec().name);
    m.note_brake(|r| r.reason = "no look at the shared state yet".to_owned());
    let mut ep = Episode::default();
    let mut known: Known = None;
    let mut refresh_at = Instant::now() + client::jitter(brake.cfg.refresh / 10, 0);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(BEAT) => {}
        }
        let now = Instant::now();
        let (configured, answered) = judged(&m);
        let due = ep.ask_at.is_none_or(|t| now >= t);
        match step(m.gate(), configured, answered, due) {
            Step::Wait if !configured => ep = Episode::default(),
            Step::Wait => {}
            Step::Release => {
                m.set_gate(Gate::Held);
                m.note_brake(|r| r.gate = BrakeGate::Held);
                ep = Episode::default();
            }
            Step::Consult => {
                let mut t = Tally::default();
                let at = unix_ms() / 1000;
                let r = client::consult(
                    &client,
                    &brake.cfg,
                    &brake.home,
                    &key,
                    at,
                    known.as_ref(),
                    &mut t,
                )
                .await;
                if let Ok(c) = &r {
                    known = Some(c.fleet.clone());
                }
                ep.ask_at = Some(Instant::now() + settle(&m, &brake.cfg, &mut ep, r, at));
            }
        }
        if now >= refresh_at {
            if let Some(f) = refresh(&client, &brake, &m).await {
                known = Some(f);
            }
            refresh_at =
                Instant::now() + brake.cfg.refresh + client::jitter(brake.cfg.refresh / 10, 0);
        }
    }
}

/// Whether the configured judging says `abnormal`, and whether `/status` does.
fn judged(m: &Monitor) -> (bool, bool) {
    let answered = m.peek_status() == Status::Abnormal;
    let configured = match m.gate() {
        Gate::Acting => answered,
        _ => m
            .shadow_verdict()
            .is_some_and(|v| v.status == Status::Abnormal),
    };
    (configured, answered)
}

/// Applies a consult's answer to the engine; returns how long until it may ask again.
fn settle(
    m: &Monitor,
    cfg: &BrakeConfig,
    ep: &mut Episode,
    r: Result<client::Consulted, BrakeError>,
    at: u64,
) -> Duration {
    let engine = m.spec().name.as_str();
    let first = !std::mem::replace(&mut ep.counted, true);
    match r {
        Ok(c) if c.decision == Decision::Act => {
            m.set_gate(Gate::Acting);
            m.note_brake(|r| {
                r.gate = BrakeGate::Acting;
                r.acted += 1;
                seen(r, &c.fleet, at, cfg);
            });
            tracing::info!(
                engine,
                "the fleet brake lets the agent's verdict act: {}",
                words(&c.fleet, at, cfg)
            );
            cfg.window
        }
        Ok(c) => {
            m.note_brake(|r| {
                r.holds += u64::from(first);
                seen(r, &c.fleet, at, cfg);
            });
            if first {
                tracing::warn!(
                    engine,
                    "the fleet brake holds the agent's verdict; /status answers as the reference: {}",
                    words(&c.fleet, at, cfg)
                );
            }
            // Its trip expires with the window: it asks again then (and counts again while
            // the configured verdict stays abnormal).
            cfg.window
        }
        Err(e) => {
            let e = e.to_string();
            m.note_brake(|r| {
                r.holds += u64::from(first);
                r.last_error = Some(e.clone());
            });
            if first {
                tracing::warn!(
                    engine,
                    "the fleet brake could not consult the shared state ({e}); the agent's verdict is held (fail closed) and asked again"
                );
            }
            RETRY_AFTER_ERROR.max(cfg.retry_backoff)
        }
    }
}

/// Notes a look at the state.
fn seen(r: &mut npu_health_wire::BrakeRecord, f: &Fleet, at: u64, cfg: &BrakeConfig) {
    let engaged = f.engaged(at, cfg.window.as_secs(), cfg.max_fraction);
    if engaged && !r.engaged {
        tracing::warn!("the fleet brake is engaged: {}", words(f, at, cfg));
    }
    r.engaged = engaged;
    r.reason = words(f, at, cfg);
    r.last_seen_unix_ms = Some(at * 1000);
    r.last_error = None;
}

/// The state in words.
fn words(f: &Fleet, at: u64, cfg: &BrakeConfig) -> String {
    let window = cfg.window.as_secs();
    let recent = f.recent(at, window);
    let engaged = f.engaged(at, window, cfg.max_fraction);
    format!(
        "{recent} of {} engines went abnormal through the agent's rules within {} (at most {} may, max_fraction {}): {}",
        f.engines,
        humantime::format_duration(cfg.window),
        allowed(f.engines, cfg.max_fraction),
        cfg.max_fraction,
        if engaged {
            format!(
                "engaged since {}",
                f.engaged_since(at, window, cfg.max_fraction).unwrap_or(at)
            )
        } else if f.engines == 0 {
            "not engaged (the fleet is not counted yet)".to_owned()
        } else {
            "not engaged".to_owned()
        }
    )
}

/// Reads the state for the metric and `/status/detail`; changes no gate. The state read,
/// when it was.
async fn refresh(client: &KubeClient, brake: &Brake, m: &Monitor) -> Known {
    let mut t = Tally::default();
    let at = unix_ms() / 1000;
    match client::read(client, &brake.home, &mut t).await {
        Ok(Some((f, bad))) => {
            if let Some(bad) = &bad {
                tracing::warn!(
                    "the fleet brake's ConfigMap {}: {bad}; read as far as it goes",
                    brake.home.name
                );
            }
            m.note_brake(|r| seen(r, &f, at, &brake.cfg));
            Some(f)
        }
        Ok(None) => {
            m.note_brake(|r| seen(r, &Fleet::default(), at, &brake.cfg));
            Some(Fleet::default())
        }
        Err(e) => {
            m.note_brake(|r| r.last_error = Some(e.to_string()));
            None
        }
    }
}

#[cfg(test)]
mod sim;
#[cfg(test)]
mod tests;

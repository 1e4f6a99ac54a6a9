//! The kubelet: what `/readyz` and `/livez` answer for an engine ([`readiness`],
//! [`liveness`]), as plain functions of what the monitor knows, and the two HTTP handlers on
//! the engine's listener and the admin one. [`config`] is `[engine.actions] not_ready_on`;
//! [`told`] has the words the journal records (`ready`/`not_ready`, `live`/`restart`).
//!
//! Readiness is for traffic: an engine that should not take new requests is taken out of
//! its Service (or its router's pool) and put back when it recovers, with nothing restarted.
//! Liveness is for restarts: the kubelet kills and restarts the engine's container in place,
//! so `/livez` fails only where Node Manager would kill (the verdict is `abnormal`) or at a
//! held `evict`, and never for want of an input, during the engine's warm-up, or while the
//! engine's port is closed (a container that died is restarted by the kubelet without a
//! probe; one that is starting must be left to load its model).

pub mod config;
pub mod told;

use super::{AbnormalCause, ActionInputs, Integration, Route};
use crate::config::actions::ActionsConfig;
use crate::config::{AgentSettings, EngineSpec};
use crate::integrations::envoy;
use crate::logging::RATE_LIMIT_INTERVAL;
use crate::logging::ratelimit::{Decision, RateLimiter};
use crate::monitor::Monitor;
use crate::monitor::journal;
use crate::monitor::verdict::Status;
use crate::monitor::vi_state::Phase;
use crate::qos::score::Level;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use config::NotReadyOn;
use serde::{Deserialize, Serialize};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The kubelet, in the registry.
pub struct Kubelet;

impl Integration for Kubelet {
    fn id(&self) -> journal::Integration {
        journal::Integration::Kubelet
    }

    fn routes(&self) -> &'static [Route] {
        &[
            Route {
                path: "/readyz",
                answer: readyz,
                on_admin: true,
            },
            Route {
                path: "/livez",
                answer: |e, _| livez(e),
                on_admin: true,
            },
        ]
    }

    fn describe(&self, spec: &EngineSpec, _agent: &AgentSettings) -> String {
        let not_ready: Vec<&str> = spec
            .actions
            .not_ready_on
            .iter()
            .map(|o| o.as_str())
            .collect();
        format!(
            "/readyz 503 while /health never answered{}{}; /livez 503 at abnormal (not with the engine's port closed) or a held evict on every input",
            if not_ready.is_empty() {
                String::new()
            } else {
                format!(" and on {}", not_ready.join(", "))
            },
            if not_ready.contains(&"degrade") || not_ready.contains(&"throttle") {
                ""
            } else {
                " (x-envoy-degraded at degrade on a 200)"
            }
        )
    }
}

/// `GET /readyz`: should the engine take new requests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Readiness {
    pub ready: bool,
    /// At `degrade`: answered with `x-envoy-degraded: true` (Envoy's active health check
    /// honours it on a passing answer only).
    pub degraded: bool,
    /// One line: why.
    pub reason: String,
}

/// The readiness rule: not ready while `/health` never answered, and on every state listed
/// in `not_ready_on` (a level listed covers the worse levels).
pub fn readiness(f: &ActionInputs, cfg: &ActionsConfig) -> Readiness {
    let degraded = f.level == Level::Degrade;
    let not_ready = |reason: String| Readiness {
        ready: false,
        degraded,
        reason,
    };
    if f.status == Status::Initial {
        return not_ready(format!("not ready: {}", f.reason));
    }
    if f.status == Status::Abnormal && cfg.fails_on(NotReadyOn::Abnormal) {
        return not_ready(format!("not ready: abnormal: {}", f.reason));
    }
    let from = [
        (NotReadyOn::Throttle, Level::Throttle),
        (NotReadyOn::Degrade, Level::Degrade),
        (NotReadyOn::Evict, Level::Evict),
    ]
    .into_iter()
    .filter(|(on, _)| cfg.fails_on(*on))
    .map(|(_, l)| l)
    .min();
    if let Some(from) = from
        && f.level >= from
    {
        return not_ready(format!(
            "not ready: {} (not_ready_on from {})",
            f.level_words(),
            from.as_str()
        ));
    }
    Readiness {
        ready: true,
        degraded,
        reason: match f.status {
            Status::Abnormal => format!(
                "ready ({}; abnormal is not in not_ready_on)",
                f.level_words()
            ),
            _ => format!("ready ({})", f.level_words()),
        },
    }
}

/// `GET /livez`: should the kubelet restart the engine's container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Liveness {
    pub live: bool,
    /// One line: why.
    pub reason: String,
}

/// The liveness rule: 503 only where Node Manager would kill (the verdict is `abnormal`) or
/// at a held `evict`, and not then either when the ground is a closed port (the process is
/// gone or starting: the kubelet restarts a dead container itself, and a starting one must
/// load its model) or a QoS score resting on a missing input.
pub fn liveness(f: &ActionInputs) -> Liveness {
    let live = |reason: String| Liveness { live: true, reason };
    let dead = |reason: String| Liveness {
        live: false,
        reason,
    };
    match (f.status, f.cause) {
        (Status::Initial, _) => live(format!("live: the engine is starting ({})", f.reason)),
        _ if f.phase == Phase::WarmingUp => live(format!("live: warming up ({})", f.reason)),
        (Status::Abnormal, Some(AbnormalCause::Health)) if f.port_closed => live(format!(
            "live: the engine's port is closed, a dead container is restarted without a probe and a starting one is loading ({})",
            f.reason
        )),
        (Status::Abnormal, Some(AbnormalCause::QosEviction)) if !f.inputs_complete => {
            live(format!(
                "live: {} rests on a missing input; not restarted for it",
                f.level_words()
            ))
        }
        (Status::Abnormal, _) => dead(format!("not live: abnormal: {}", f.reason)),
        _ if f.evict_held() => dead(format!(
            "not live: {} held, every input present",
            f.level_words()
        )),
        _ => live(format!("live ({})", f.level_words())),
    }
}

/// What `/readyz` and `/livez` answer for an engine, with the facts behind them, taken at
/// one instant (the metrics, the views and the journal read them together).
#[derive(Debug, Clone, PartialEq)]
pub struct Answers {
    pub facts: ActionInputs,
    pub readiness: Readiness,
    pub liveness: Liveness,
}

impl Answers {
    /// The answers for `facts` under `cfg`.
    pub fn from_facts(facts: ActionInputs, cfg: &ActionsConfig) -> Answers {
        Answers {
            readiness: readiness(&facts, cfg),
            liveness: liveness(&facts),
            facts,
        }
    }

    /// The answers for `m` now (reads only: the verdict is peeked).
    pub fn of(m: &Monitor) -> Answers {
        Answers::from_facts(ActionInputs::of(m), &m.spec.actions)
    }
}

/// `/readyz` of one engine: 200 while it should take new requests, else 503; either way one
/// line saying why, and `x-envoy-degraded: true` at `degrade`. An answer to Envoy's health
/// checker is recorded as what Envoy was told ([`envoy::note`]).
pub fn readyz(e: &Monitor, headers: &HeaderMap) -> Response {
    // A probe is a poll like Node Manager's: the first healthy one starts virtual inference.
    e.status();
    let r = readiness(&ActionInputs::of(e), &e.spec.actions);
    envoy::note(e, headers, &r);
    let code = if r.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let mut resp = probe_answer(code, r.reason);
    if r.degraded {
        resp.headers_mut()
            .insert(envoy::DEGRADED, HeaderValue::from_static("true"));
    }
    resp
}

/// `/livez` of one engine: 503 only where the kubelet should restart it.
pub fn livez(e: &Monitor) -> Response {
    e.status();
    let l = liveness(&ActionInputs::of(e));
    let code = if l.live {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    probe_answer(code, l.reason)
}

/// The one line an open `/engines/<name>/…` route answers, with a 404, for a name no engine
/// here has, whatever was asked (docs/endpoints.md, "A name no engine has").
pub const UNKNOWN_ENGINE: &str = "no engine of that name here";

/// What an open route of the admin listener (`/engines/<name>/readyz`, `/livez`) answers
/// for a name no engine here has: 404 and [`UNKNOWN_ENGINE`], never the name asked (the route
/// is open: it hands no stranger's text back). The operator finds what was asked in the log:
/// a warning naming it and the engines here, at most one per interval ([`UnknownNames`]).
pub fn unknown_engine(asked: &str, route: &str, engines: &[&str]) -> Response {
    static SEEN: OnceLock<Mutex<UnknownNames>> = OnceLock::new();
    let seen = SEEN.get_or_init(|| Mutex::new(UnknownNames::new(RATE_LIMIT_INTERVAL)));
    let line =
        seen.lock()
            .unwrap_or_else(|p| p.into_inner())
            .note(asked, route, engines, Instant::now());
    if let Some(line) = line {
        tracing::warn!("{line}");
    }
    probe_answer(StatusCode::NOT_FOUND, UNKNOWN_ENGINE.to_owned())
}

/// The log's side of names no engine has: one line per interval, naming the last name asked
/// (quoted, cut) and counting the requests not logged since. The log layer's own rate limit
/// folds identical lines only, and each name asked makes a line of its own.
#[derive(Debug)]
pub struct UnknownNames {
    lines: RateLimiter<()>,
}

impl UnknownNames {
    /// At most one line per `every`.
    pub fn new(every: Duration) -> UnknownNames {
        UnknownNames {
            lines: RateLimiter::new(every),
        }
    }

    /// The line to log for a request of `route` naming `asked` among `engines` at `now`, if
    /// one is due.
    pub fn note(
        &mut self,
        asked: &str,
        route: &str,
        engines: &[&str],
        now: Instant,
    ) -> Option<String> {
        let Decision::Write { suppressed } = self.lines.check(&(), now) else {
            return None;
        };
        let more = if suppressed > 0 {
            format!("; {suppressed} more such request(s) since the last line")
        } else {
            String::new()
        };
        Some(format!(
            "GET /engines/<name>{route} asked for {}, which no engine here has (engines: {}); answered 404 (a router or a probe names a wrong engine?){more}",
            crate::logging::quote(asked),
            engines.join(", ")
        ))
    }
}

fn probe_answer(code: StatusCode, line: String) -> Response {
    (
        code,
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        format!("{line}\n"),
    )
        .into_response()
}

#[cfg(test)]
mod tests;

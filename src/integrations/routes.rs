//! The routes every engine's listener serves for the integrations: the seam's own `/readyz`,
//! then each listed integration's ([`all`]). `/readyz` is the agent's answer (the readiness
//! rule, [`super::answers::readiness`]) and every integration hears it through one hook
//! ([`Integration::heard_readyz`]): the one that asked records what it was told, any may add
//! its header (Envoy's `x-envoy-degraded`). A router that reads `/readyz` is a folder and a
//! line of the list; this file does not change. Also here: what the open admin routes
//! (`/engines/<name>/readyz`, `/livez`) answer for a name no engine has.

use super::REGISTRY;
use super::answers::config::NotReadyList;
use super::answers::readiness;
use super::facts::ActionInputs;
use super::seam::{Integration, Readyz, Route, probe_answer};
use crate::logging::RATE_LIMIT_INTERVAL;
use crate::logging::ratelimit::{Decision, RateLimiter};
use crate::monitor::Monitor;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// `/readyz`, the seam's own route (open on the admin listener too: the kubelet's probes
/// carry no credentials).
const READYZ: Route = Route {
    path: "/readyz",
    answer: |e, asked| readyz_heard_by(REGISTRY, e, asked),
    on_admin: true,
};

/// Every route of the integrations on each engine's listener: `/readyz`, then each
/// integration's ([`Integration::routes`]), in the list's order.
pub(crate) fn all() -> impl Iterator<Item = Route> {
    std::iter::once(READYZ).chain(REGISTRY.iter().flat_map(|i| i.routes().iter().copied()))
}

/// `/readyz` of one engine: 200 while it should take new requests, else 503; either way one
/// line saying why. Each integration of `list` hears the answer (and who asked) and may add
/// its headers to it.
pub(crate) fn readyz_heard_by(
    list: &[&dyn Integration],
    e: &Monitor,
    asked: &HeaderMap,
) -> Response {
    // A probe is a poll like Node Manager's: the first healthy one starts virtual inference.
    e.status();
    let r = readiness(&ActionInputs::of(e), NotReadyList::of(e.spec()));
    let heard = Readyz {
        engine: e,
        asked,
        readiness: &r,
    };
    let mut extra = HeaderMap::new();
    for i in list {
        i.heard_readyz(&heard, &mut extra);
    }
    let code = if r.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let mut resp = probe_answer(code, r.reason);
    resp.headers_mut().extend(extra);
    resp
}

/// The one line an open `/engines/<name>/…` route answers, with a 404, for a name no engine
/// here has, whatever was asked (docs/endpoints.md, "A name no engine has").
pub(crate) const UNKNOWN_ENGINE: &str = "no engine of that name here";

/// What an open route of the admin listener (`/engines/<name>/readyz`, `/livez`) answers
/// for a name no engine here has: 404 and [`UNKNOWN_ENGINE`], never the name asked (the route
/// is open: it hands no stranger's text back). The operator finds what was asked in the log:
/// a warning naming it and the engines here, at most one per interval (`UnknownNames`).
pub(crate) fn unknown_engine(asked: &str, route: &str, engines: &[&str]) -> Response {
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
pub(crate) struct UnknownNames {
    lines: RateLimiter<()>,
}

impl UnknownNames {
    /// At most one line per `every`.
    pub(crate) fn new(every: Duration) -> UnknownNames {
        UnknownNames {
            lines: RateLimiter::new(every),
        }
    }

    /// The line to log for a request of `route` naming `asked` among `engines` at `now`, if
    /// one is due.
    pub(crate) fn note(
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

#[cfg(test)]
mod tests {
    use super::*;

    // Issue 48, R10: an unknown name on the open routes is answered with one fixed 404 whatever
    // was asked (it echoed the name), and the operator's log names what was asked, at most once
    // per interval, with a count of the rest.
    #[test]
    fn an_unknown_engine_name_is_a_fixed_404_and_one_log_line_per_interval() {
        for asked in ["nope", "<script>x</script>", &"n".repeat(100_000), "a\nb"] {
            let r = unknown_engine(asked, "/readyz", &["e2e"]);
            assert_eq!(r.status(), axum::http::StatusCode::NOT_FOUND);
            let body =
                futures_util::FutureExt::now_or_never(axum::body::to_bytes(r.into_body(), 1 << 20))
                    .unwrap()
                    .unwrap();
            let body = String::from_utf8_lossy(&body);
            assert_eq!(body, format!("{UNKNOWN_ENGINE}\n"), "asked {}", asked.len());
        }
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut seen = UnknownNames::new(Duration::from_secs(10));
        let first = seen.note("prefil-main", "/readyz", &["prefill-main", "decode"], at(0));
        assert_eq!(
            first.as_deref(),
            Some(
                "GET /engines/<name>/readyz asked for \"prefil-main\", which no engine here has (engines: prefill-main, decode); answered 404 (a router or a probe names a wrong engine?)"
            )
        );
        for i in 1..1000 {
            assert_eq!(seen.note(&format!("x{i}"), "/livez", &[], at(i)), None);
        }
        let next = seen
            .note(&"y".repeat(100_000), "/livez", &[], at(10_000))
            .unwrap();
        assert!(
            next.ends_with("999 more such request(s) since the last line"),
            "{next}"
        );
        assert!(next.len() < 1024, "cut: {} bytes", next.len());
    }
}

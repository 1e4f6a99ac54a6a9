//! Proof of the integrations seam: a router that reads `/readyz` (an nginx health check, say),
//! written as a new integration is, in this one file, and given to the `/readyz` route as one
//! more line of the list. It hears every answer through the seam's hook and records what it
//! was told in the engine's journal; nothing of the kubelet's folder, Envoy's or the journal
//! changes for it.

use super::REGISTRY;
use super::routes::{self, readyz_heard_by};
use super::seam::{Integration, Readyz};
use crate::config::{AgentSettings, EngineSpec};
use crate::monitor::Monitor;
use crate::monitor::journal::{ActionRecord, Id, Told};
use crate::probe::health::HealthOutcome;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;

/// Its name in the journal, `/status/detail` and the metrics.
const ID: Id = Id("nginx");

/// What its health check reads in a `/readyz` answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NginxState {
    Up,
    Down,
}

impl From<NginxState> for Told {
    fn from(s: NginxState) -> Told {
        let word = match s {
            NginxState::Up => "up",
            NginxState::Down => "down",
        };
        Told::state(ID, "health_check", word)
    }
}

/// The router, as the list would hold it.
struct Nginx;

impl Integration for Nginx {
    fn id(&self) -> Id {
        ID
    }

    fn describe(&self, _spec: &EngineSpec, _agent: &AgentSettings) -> String {
        "health check on /readyz".to_owned()
    }

    fn router_states(&self) -> Vec<Told> {
        [NginxState::Up, NginxState::Down].map(Told::from).to_vec()
    }

    fn heard_readyz(&self, a: &Readyz<'_>, _extra: &mut HeaderMap) {
        let ua = a
            .asked
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok());
        if ua.is_some_and(|ua| ua.starts_with("nginx-check")) {
            let s = if a.readiness.ready {
                NginxState::Up
            } else {
                NginxState::Down
            };
            a.engine.told_router(Told::from(s), &a.readiness.reason);
        }
    }
}

fn engine() -> Monitor {
    let spec = crate::config::file::parse(
        "[[engine]]\nname = \"e\"\nhost = \"127.0.0.1\"\nport = 8000\nmgmt_port = 9000\nengine_type = \"vllm\"\nserved_model_name = \"m\"\n",
        std::path::Path::new("agent.toml"),
    )
    .unwrap()
    .engines
    .remove(0);
    Monitor::new(spec, vec![0])
}

fn asked_by(ua: &'static str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(header::USER_AGENT, HeaderValue::from_static(ua));
    h
}

/// The status, headers and body of an answer.
fn seen(r: Response) -> (StatusCode, HeaderMap, String) {
    let (parts, body) = r.into_parts();
    let body = futures_util::FutureExt::now_or_never(axum::body::to_bytes(body, 1 << 20))
        .unwrap()
        .unwrap();
    (
        parts.status,
        parts.headers,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

/// What the journal says the router was told: (from, to).
fn told_nginx(m: &Monitor) -> Vec<(String, String)> {
    m.journal()
        .entries()
        .iter()
        .map(ActionRecord::from)
        .filter(|r| r.integration == "nginx")
        .inspect(|r| assert_eq!(r.action, "health_check"))
        .map(|r| (r.from, r.to))
        .collect()
}

// `/readyz` is the seam's route, not one integration's: served once, whatever the list.
#[test]
fn readyz_is_the_seams_route_and_no_integrations() {
    let readyz: Vec<_> = routes::all().filter(|r| r.path == "/readyz").collect();
    assert_eq!(readyz.len(), 1);
    assert!(readyz[0].on_admin, "open on the admin listener");
    for i in REGISTRY {
        assert!(
            i.routes().iter().all(|r| r.path != "/readyz"),
            "{} serves /readyz itself",
            i.id().as_str()
        );
    }
}

// A router added as one file and one line of the list hears each `/readyz` answer through
// the hook: what its own health check was told is in the journal and in its router state,
// an answer to anyone else is not recorded as its, and the answer itself is the one the
// list without it gives.
#[tokio::test(start_paused = true)]
async fn a_router_in_one_file_reads_readyz_through_the_hook_and_the_journal_records_it() {
    let list: Vec<&dyn Integration> = REGISTRY.iter().copied().chain([&Nginx as _]).collect();
    let m = engine();
    let (code, _, body) = seen(readyz_heard_by(&list, &m, &asked_by("nginx-check/1.0")));
    assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(told_nginx(&m), [("start".into(), "down".into())]);
    assert_eq!(m.acted().routers()["nginx"].state, "down");
    // The kubelet asking is not the router asking.
    seen(readyz_heard_by(&list, &m, &asked_by("kube-probe/1.31")));
    assert_eq!(m.acted().routers()["nginx"].polls, 1);
    m.record_health(&HealthOutcome::Healthy, true);
    let with = seen(readyz_heard_by(&list, &m, &asked_by("nginx-check/1.0")));
    assert_eq!(with.0, StatusCode::OK, "{}", with.2);
    assert_eq!(
        told_nginx(&m),
        [
            ("start".into(), "down".into()),
            ("down".into(), "up".into())
        ]
    );
    let seen_as = m.acted().routers_told()[&ID].told;
    assert!(Nginx.router_states().contains(&seen_as));
    let without = seen(readyz_heard_by(REGISTRY, &m, &asked_by("nginx-check/1.0")));
    assert_eq!(with, without, "the new router changes no answer");
}

//! Proof of the integrations seam: a router that reads `/readyz` (an nginx health check, say),
//! written as a new integration is, in this one file, and given to the `/readyz` route as one
//! more line of the list. It hears every answer through the seam's hook and records what it
//! was told in the engine's journal; nothing of the kubelet's folder, Envoy's or the journal
//! changes for it. It has a configuration table of its own, `[engine.actions.nginx]`, which
//! the configuration reads through the list; no line of `src/config/` names it.

use super::routes::{self, readyz_heard_by};
use super::seam::{Integration, Readyz};
use super::{REGISTRY, tables_of};
use crate::config::bounds::Within;
use crate::config::tables::{ConfigTable, Table, TableReader};
use crate::config::{AgentSettings, EngineSpec, KeyError};
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

/// `[engine.actions.nginx]`: the router's settings for an engine.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
struct NginxTable {
    /// The engine's weight in the upstream.
    weight: u32,
    /// Whether the engine is the upstream's `backup` server.
    backup: bool,
}

impl Default for NginxTable {
    fn default() -> Self {
        NginxTable {
            weight: 1,
            backup: false,
        }
    }
}

/// nginx's weights (`server … weight=N`).
const WEIGHT: Within<u32> = Within::new(1, 100);

impl Table for NginxTable {
    fn check(&mut self, _base: &std::path::Path) -> Result<(), KeyError> {
        WEIGHT.check("weight", self.weight)
    }
}

/// Its table, as it registers it.
static TABLE: ConfigTable<NginxTable> = ConfigTable::engine("actions.nginx");

/// The router, as the list would hold it.
struct Nginx;

impl Integration for Nginx {
    fn id(&self) -> Id {
        ID
    }

    fn describe(&self, spec: &EngineSpec, _agent: &AgentSettings) -> String {
        let t = spec.tables.get::<NginxTable>().cloned().unwrap_or_default();
        let backup = if t.backup { ", backup" } else { "" };
        format!("health check on /readyz, weight {}{backup}", t.weight)
    }

    fn tables(&self) -> Vec<&'static dyn TableReader> {
        vec![&TABLE]
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

/// The engine of [`engine`], with `extra` after it, read with the tables of `list`'s
/// integrations: `Err` the one line `check-config` prints.
fn read_with(list: &[&'static dyn Integration], extra: &str) -> Result<EngineSpec, String> {
    let text = format!(
        "[[engine]]\nname = \"e\"\nhost = \"127.0.0.1\"\nport = 8000\nmgmt_port = 9000\nengine_type = \"vllm\"\nserved_model_name = \"m\"\n{extra}"
    );
    crate::config::file::parse_with(&text, std::path::Path::new("agent.toml"), &tables_of(list))
        .map(|mut c| c.engines.remove(0))
        .map_err(|e| e.to_string())
}

// A router's table of its own under `[engine.actions]`, in the same one file: the
// configuration reads it through the list (its keys, its defaults, its bounds, its place in
// every error, its key among the known ones) and shows it in the effective configuration,
// and the tables of the list read as before beside it. Without its line in the list, its
// table is an unknown key.
#[test]
fn a_router_with_a_table_of_its_own_is_read_through_the_seam_with_no_line_of_the_configuration() {
    let list: Vec<&dyn Integration> = REGISTRY.iter().copied().chain([&Nginx as _]).collect();
    let spec = read_with(
        &list,
        "[engine.actions]\nnot_ready_on = [\"evict\"]\n[engine.actions.nginx]\nweight = 7\n",
    )
    .unwrap();
    assert_eq!(
        spec.tables.get::<NginxTable>(),
        Some(&NginxTable {
            weight: 7,
            backup: false
        })
    );
    let agent = AgentSettings::default();
    assert_eq!(
        Nginx.describe(&spec, &agent),
        "health check on /readyz, weight 7"
    );
    let not_ready = super::answers::config::NotReadyList::of(&spec);
    assert_eq!(not_ready.0, [super::answers::config::NotReadyOn::Evict]);
    let shown = serde_json::to_value(&spec).unwrap();
    assert_eq!(
        shown["actions"]["nginx"],
        serde_json::json!({"weight": 7, "backup": false})
    );
    assert_eq!(
        shown["actions"]["not_ready_on"],
        serde_json::json!(["evict"])
    );
    // Not written: its defaults.
    let spec = read_with(&list, "").unwrap();
    assert_eq!(
        spec.tables.get::<NginxTable>(),
        Some(&NginxTable::default())
    );
    for (extra, says) in [
        (
            "[engine.actions.nginx]\nweight = 0\n",
            "agent.toml: [[engine]] #1 (e) actions.nginx.weight: `0` is outside 1..=100",
        ),
        (
            "[engine.actions.nginx]\nweight = \"heavy\"\n",
            "agent.toml: [[engine]] #1 (e) actions.nginx.weight: invalid type: string \"heavy\", expected u32",
        ),
        (
            "[engine.actions.nginx]\nwieght = 2\n",
            "agent.toml: [[engine]] #1 (e) actions.nginx.wieght: unknown key `wieght`; did you mean `weight`? (known keys: weight, backup)",
        ),
        (
            "[engine.actions]\nngnix = {}\n",
            "agent.toml: [[engine]] #1 (e) actions.ngnix: unknown key `ngnix`; did you mean `nginx`? (known keys: not_ready_on, haproxy, nginx)",
        ),
    ] {
        assert_eq!(read_with(&list, extra).unwrap_err(), says, "{extra}");
    }
    // The list decides: without the router, its table is no key of the configuration.
    assert_eq!(
        read_with(REGISTRY, "[engine.actions.nginx]\nweight = 7\n").unwrap_err(),
        "agent.toml: [[engine]] #1 (e) actions.nginx: unknown key `nginx` (known keys: not_ready_on, haproxy)"
    );
}

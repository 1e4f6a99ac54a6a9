//! A real router in front of the engine (`--router haproxy|envoy`): the load goes through it,
//! and a draft engine (the fake engine answering as `draft`, serving the experiment's model
//! as an alias) stands behind it, taking what the router sends away from the main engine.
//!
//! - **HAProxy 2.6** polls the agent's agent check (`[agent] haproxy_agent_listen`), the
//!   draft is the `backup` server (docs/degradation.md, "HAProxy").
//! - **Envoy 1.40** health-checks the agent's `/engines/chaos/readyz` on its admin listener;
//!   the draft is the second cluster of an aggregate, as in `deploy/envoy/envoy.yaml`.
//!
//! Intervals are scaled with the experiment. Binaries: `haproxy` on the PATH, Envoy where
//! `scripts/routers install` puts it (or `NPU_HEALTH_HAPROXY`, `NPU_HEALTH_ENVOY`).

use crate::timescale::{fake_engine_speed, scaled_at_least};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The router in front of the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum RouterKind {
    /// HAProxy 2.6, the agent's agent check, the draft as `backup`.
    Haproxy,
    /// Envoy 1.40, health checks on the agent's `/engines/<name>/readyz`, the draft at the
    /// next priority.
    Envoy,
}

impl RouterKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RouterKind::Haproxy => "haproxy",
            RouterKind::Envoy => "envoy",
        }
    }

    /// Its binary: `haproxy` on the PATH, Envoy under `<repo>/target/routers/`.
    pub fn binary(self, repo: &Path) -> Result<PathBuf, String> {
        match self {
            RouterKind::Haproxy => {
                if let Some(p) = std::env::var_os("NPU_HEALTH_HAPROXY") {
                    return Ok(PathBuf::from(p));
                }
                std::env::var_os("PATH")
                    .and_then(|paths| {
                        std::env::split_paths(&paths)
                            .map(|d| d.join("haproxy"))
                            .find(|p| p.is_file())
                    })
                    .ok_or_else(|| "haproxy not found: scripts/routers install".to_owned())
            }
            RouterKind::Envoy => {
                if let Some(p) = std::env::var_os("NPU_HEALTH_ENVOY") {
                    return Ok(PathBuf::from(p));
                }
                let lib = repo.join("target/routers/venv/lib");
                std::fs::read_dir(&lib)
                    .ok()
                    .and_then(|dirs| {
                        dirs.flatten()
                            .map(|d| d.path().join("site-packages/envoy/_bin/envoy"))
                            .find(|p| p.is_file())
                    })
                    .ok_or_else(|| {
                        format!(
                            "envoy not found under {}: scripts/routers install",
                            lib.display()
                        )
                    })
            }
        }
    }

    /// The `[agent]` line the agent needs for this router, on `port`.
    pub fn agent_line(self, port: u16) -> String {
        match self {
            RouterKind::Haproxy => format!("haproxy_agent_listen = \"127.0.0.1:{port}\"\n"),
            RouterKind::Envoy => format!("admin_listen = \"127.0.0.1:{port}\"\n"),
        }
    }
}

/// What the agent told a router, as its action journal (`/status/detail` `actions`) shows it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RouterAction {
    /// Milliseconds from the scheduled injection (negative: before), on the agent's clock.
    pub t_ms: i64,
    /// `haproxy` or `envoy`.
    pub router: &'static str,
    pub from: String,
    pub to: String,
    /// The QoS level at that moment.
    pub level: String,
}

impl RouterAction {
    /// Whether this answer takes the main engine out of new traffic, so that the router
    /// sends it to the draft: HAProxy's `drain`, `maint` and `down`, Envoy's `unhealthy`
    /// and `degraded` (a degraded host takes traffic only when no priority has a healthy
    /// one, and the draft is healthy).
    pub fn takes_main_out(&self) -> bool {
        matches!(
            self.to.as_str(),
            "drain" | "maint" | "down" | "unhealthy" | "degraded"
        )
    }
}

/// Adds to `seen` the router actions of `journal` not in it yet (the journal keeps the last
/// 50 of every integration, so a run reads it at every sample). `t0_unix_ms`: the scheduled
/// injection on the agent's clock.
pub fn note_actions(
    seen: &mut Vec<RouterAction>,
    journal: &[npu_health_wire::ActionRecord],
    t0_unix_ms: i64,
) {
    for r in journal {
        let router = match r.integration.as_str() {
            "haproxy" => "haproxy",
            "envoy" => "envoy",
            _ => continue,
        };
        let a = RouterAction {
            t_ms: r.at_unix_ms as i64 - t0_unix_ms,
            router,
            from: r.from.clone(),
            to: r.to.clone(),
            level: r.level.as_str().to_owned(),
        };
        if !seen.contains(&a) {
            seen.push(a);
        }
    }
}

/// A running router and the draft engine behind it, both killed when dropped.
pub struct Router {
    pub kind: RouterKind,
    child: Child,
    draft: Child,
    /// Where clients send requests.
    pub front: SocketAddr,
    /// The draft engine's inference port.
    pub draft_port: u16,
}

/// The model the draft answers as (the first of its served names).
pub const DRAFT_MODEL: &str = "draft";

/// Envoy's command line before `-c <config>`: one worker thread (two cores are shared with
/// the engines), no hot-restart shared memory (several Envoys side by side), warnings only.
pub const ENVOY_ARGS: [&str; 5] = [
    "--disable-hot-restart",
    "--concurrency",
    "1",
    "-l",
    "warning",
];

/// What the router is placed in front of.
pub struct Placement<'a> {
    /// The main engine, as the load would reach it.
    pub main: SocketAddr,
    /// The agent's listener the router reads (HAProxy's agent check, or the admin listener).
    pub agent_port: u16,
    /// The engine's name in the agent's config.
    pub engine: &'a str,
    /// The model clients ask for (the draft serves it as an alias).
    pub model: &'a str,
    /// The agent binary (it runs the fake engine).
    pub agent_exe: &'a Path,
    pub repo: &'a Path,
    pub time_scale: f64,
}

fn ms(d: Duration) -> u128 {
    d.as_millis()
}

impl Router {
    /// Starts the draft engine, then the router, in `dir`; waits until the router's front
    /// accepts.
    pub async fn start(kind: RouterKind, dir: &Path, p: &Placement<'_>) -> Result<Router, String> {
        let bin = kind.binary(p.repo)?;
        let [draft_port, draft_control, front, admin] =
            fake_engine::launch::free_ports().map_err(|e| format!("no free port: {e}"))?;
        let log = |name: &str| -> Result<Stdio, String> {
            std::fs::File::create(dir.join(name))
                .map(Stdio::from)
                .map_err(|e| e.to_string())
        };
        let mut cmd = fake_engine::launch::command(
            p.agent_exe,
            draft_port,
            draft_control,
            DRAFT_MODEL,
            &[dir.join("draft-npu")],
        );
        // As fast as the main engine, scaled alike: the draft's share and the p99 through
        // the router compare like with like.
        cmd.args(["--alias", p.model])
            .args(fake_engine_speed(p.time_scale))
            .stderr(log("draft.log")?);
        let mut draft = cmd
            .spawn()
            .map_err(|e| format!("starting the draft engine: {e}"))?;
        let s = p.time_scale;
        let config = match kind {
            RouterKind::Haproxy => haproxy_config(p, front, draft_port, s),
            RouterKind::Envoy => envoy_config(p, front, draft_port, admin, s),
        };
        let cfg = dir.join(match kind {
            RouterKind::Haproxy => "haproxy.cfg",
            RouterKind::Envoy => "envoy.yaml",
        });
        std::fs::write(&cfg, config).map_err(|e| format!("{}: {e}", cfg.display()))?;
        let mut cmd = Command::new(&bin);
        match kind {
            RouterKind::Haproxy => cmd.arg("-db").arg("-f").arg(&cfg),
            RouterKind::Envoy => cmd.args(ENVOY_ARGS).arg("-c").arg(&cfg),
        };
        let child = match cmd
            .stdout(log(&format!("{}.log", kind.as_str()))?)
            .stderr(Stdio::null())
            .spawn()
        {
            Ok(c) => c,
            Err(e) => {
                let _ = draft.kill();
                let _ = draft.wait();
                return Err(format!("starting {}: {e}", bin.display()));
            }
        };
        let r = Router {
            kind,
            child,
            draft,
            front: SocketAddr::from(([127, 0, 0, 1], front)),
            draft_port,
        };
        let until = Instant::now() + Duration::from_secs(20);
        while tokio::net::TcpStream::connect(r.front).await.is_err()
            || tokio::net::TcpStream::connect(("127.0.0.1", draft_port))
                .await
                .is_err()
        {
            if Instant::now() > until {
                return Err(format!(
                    "{} or the draft engine did not start (logs in {})",
                    kind.as_str(),
                    dir.display()
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(r)
    }
}

impl Drop for Router {
    fn drop(&mut self) {
        for c in [&mut self.child, &mut self.draft] {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// HAProxy: the agent check every (scaled) second, requests queue up to the client's own
/// timeout (60 s, scaled) at throttle, the draft as `backup`.
fn haproxy_config(p: &Placement<'_>, front: u16, draft: u16, s: f64) -> String {
    let inter = scaled_at_least(Duration::from_secs(1), s, Duration::from_millis(50));
    let long = scaled_at_least(Duration::from_secs(60), s, Duration::from_secs(1));
    format!(
        "global\n    maxconn 4096\n    log stdout format raw local0 info\ndefaults\n    mode http\n    log global\n    option httplog\n    timeout connect 1s\n    timeout client {c}ms\n    timeout server {c}ms\n    timeout queue {c}ms\n\
         frontend llm\n    bind 127.0.0.1:{front}\n    default_backend llm\n\
         backend llm\n    server main {main} agent-check agent-addr 127.0.0.1 agent-port {agent} agent-inter {i}ms agent-send \"{engine}\\n\"\n    server draft 127.0.0.1:{draft} backup\n",
        c = ms(long),
        main = p.main,
        agent = p.agent_port,
        i = ms(inter),
        engine = p.engine,
    )
}

/// Envoy: `deploy/envoy/envoy.yaml`'s shape (an aggregate of the main and the draft, health
/// checks on the agent's `/engines/<name>/readyz` every scaled second); the draft's check is
/// its own `/health` (the agent watches the main engine only here).
fn envoy_config(p: &Placement<'_>, front: u16, draft: u16, admin: u16, s: f64) -> String {
    // Envoy's durations are seconds. The timeout is not scaled: it bounds how long the agent
    // takes to answer, which compressing the experiment does not shorten (a timed-out check
    // marks the host unhealthy, and would send load to the draft for nothing).
    let inter = format!(
        "{:.3}s",
        scaled_at_least(Duration::from_secs(1), s, Duration::from_millis(50)).as_secs_f64()
    );
    let check = |path: &str| {
        format!(
            "      health_checks:\n        - timeout: 1s\n          interval: {inter}\n          no_traffic_interval: {inter}\n          no_traffic_healthy_interval: {inter}\n          unhealthy_threshold: 1\n          healthy_threshold: 2\n          http_health_check: {{ path: {path} }}\n",
        )
    };
    let cluster = |name: &str, addr: SocketAddr, hc_port: u16, path: &str| {
        format!(
            "    - name: {name}\n      type: STATIC\n      connect_timeout: 1s\n      load_assignment:\n        cluster_name: {name}\n        endpoints:\n          - lb_endpoints:\n              - endpoint:\n                  address:\n                    socket_address: {{ address: {ip}, port_value: {port} }}\n                  health_check_config: {{ port_value: {hc_port} }}\n{hc}",
            ip = addr.ip(),
            port = addr.port(),
            hc = check(path),
        )
    };
    format!(
        r#"static_resources:
  listeners:
    - name: llm
      address:
        socket_address: {{ address: 127.0.0.1, port_value: {front} }}
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                stat_prefix: llm
                route_config:
                  virtual_hosts:
                    - name: llm
                      domains: ["*"]
                      routes:
                        - match: {{ prefix: "/" }}
                          route: {{ cluster: llm, timeout: 0s }}
                http_filters:
                  - name: envoy.filters.http.router
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
    - name: llm
      connect_timeout: 1s
      lb_policy: CLUSTER_PROVIDED
      cluster_type:
        name: envoy.clusters.aggregate
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.clusters.aggregate.v3.ClusterConfig
          clusters: [llm-main, llm-draft]
{main}{draftc}admin:
  address:
    socket_address: {{ address: 127.0.0.1, port_value: {admin} }}
"#,
        main = cluster(
            "llm-main",
            p.main,
            p.agent_port,
            &format!("/engines/{}/readyz", p.engine)
        ),
        draftc = cluster(
            "llm-draft",
            SocketAddr::from(([127, 0, 0, 1], draft)),
            draft,
            "/health"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use npu_health_wire::ActionRecord;
    use npu_health_wire::Level;

    fn record(at: u64, integration: &str, from: &str, to: &str) -> ActionRecord {
        ActionRecord {
            at_unix_ms: at,
            integration: integration.to_owned(),
            action: "agent_check".into(),
            from: from.into(),
            to: to.into(),
            level: Level::Degrade,
            reason: String::new(),
        }
    }

    // The router actions are taken once each, however often the journal is read, and only
    // a state that sends traffic to the draft counts as taking the main engine out.
    #[test]
    fn router_actions_are_noted_once_and_judged_by_their_state() {
        let journal = vec![
            record(1_000, "haproxy", "start", "ready"),
            record(1_500, "node_manager", "normal", "abnormal"),
            record(2_000, "haproxy", "ready", "queue"),
        ];
        let mut seen = Vec::new();
        note_actions(&mut seen, &journal, 1_200);
        note_actions(&mut seen, &journal, 1_200);
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert_eq!((seen[0].t_ms, seen[1].t_ms), (-200, 800));
        assert!(!seen.iter().any(RouterAction::takes_main_out), "{seen:?}");
        let later = [record(3_000, "envoy", "healthy", "unhealthy")];
        note_actions(&mut seen, &later, 1_200);
        assert_eq!(seen[2].router, "envoy");
        assert!(seen[2].takes_main_out());
        for to in ["drain", "maint", "down", "degraded"] {
            let a = RouterAction {
                to: to.into(),
                ..seen[0].clone()
            };
            assert!(a.takes_main_out(), "{to}");
        }
    }
}

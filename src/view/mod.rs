//! The operator views' data: what the admin page (`GET /`, fed by `GET /events`) and
//! `npu-health-agent top` show. Typed frames, built from the shared state by plain
//! functions and read back by the views and the tests with the same types.
//!
//! `GET /events` is a server-sent event stream of three frames: `hello` once (the node, the
//! NPUs and engines, the sampling period), then `samples` every [`FRAME_INTERVAL`] (every
//! ring sample since the last frame, at the sampling resolution: a 100 ms burst is two or
//! more points at 50 ms) and `engines` every [`ENGINES_EVERY`] frames (verdict, level, score,
//! failures against their limit, last probe, readiness, liveness, and the recent changes).
//! The first `samples` frame carries the last [`HISTORY`] so a chart is full at once.
//! [`top`] is what `npu-health-agent top` makes of them.

pub(crate) mod top;

use crate::config::{AgentSettings, EngineSpec};
use crate::integrations::Answers;
use crate::integrations::kubernetes::config::KubernetesConfig;
use crate::monitor::Monitor;
use crate::sampler::Shared;
use npu_health_wire::ActionRecord;
use npu_health_wire::Level;
use npu_health_wire::Status;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;

/// Time between `samples` frames: at most 4 frames a second per subscriber, whatever the
/// sampling period.
pub(crate) const FRAME_INTERVAL: Duration = Duration::from_millis(250);
/// An `engines` frame every this many `samples` frames (once a second).
pub(crate) const ENGINES_EVERY: u32 = 4;
/// History sent in the first `samples` frame (the page's chart span).
pub(crate) const HISTORY: Duration = Duration::from_secs(60);
/// Changes sent per `engines` frame, newest first, over every engine.
pub(crate) const RECENT: usize = 30;

/// The `hello` frame.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    /// The node the agent runs on ([`node_name`]): the views' title names it.
    #[serde(default)]
    pub node: String,
    pub version: String,
    /// The sampling period in force, milliseconds.
    pub period_ms: f64,
    pub frame_interval_ms: u64,
    /// Span of the history in the first `samples` frame, seconds.
    pub history_s: f64,
    pub npus: Vec<Npu>,
    pub engines: Vec<String>,
}

/// One NPU as the views name it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Npu {
    /// Index in the ring (the `i` of [`NpuSamples`]).
    pub index: u16,
    /// Logic id, as `npu-smi` and the metrics name it.
    pub id: u32,
    pub name: String,
    /// The engines it serves.
    pub engines: Vec<String>,
}

/// The `samples` frame: every sample since the previous frame.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Samples {
    /// Now, on the ring's clock (milliseconds since the agent started sampling).
    pub now_ms: f64,
    pub npus: Vec<NpuSamples>,
}

/// One NPU's samples, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NpuSamples {
    pub i: u16,
    /// Times on the ring's clock, milliseconds.
    pub t: Vec<f64>,
    /// AI Cube percent; `null` for a failed or stale reading (never drawn as 0).
    pub v: Vec<Option<u8>>,
}

/// The `engines` frame.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EnginesFrame {
    pub at_unix_ms: u64,
    pub engines: Vec<EngineLine>,
    /// The last changes and Kubernetes API attempts over every engine, newest first.
    pub recent: Vec<Recent>,
    /// NPU figures that change slowly (HBM, health, backend, stale).
    pub npus: Vec<NpuState>,
}

/// One engine, as the views show it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineLine {
    pub name: String,
    pub status: Status,
    pub reason: String,
    pub policy: String,
    pub level: Level,
    pub score: Option<f64>,
    pub ready: bool,
    pub ready_reason: String,
    pub live: bool,
    pub live_reason: String,
    pub failure_count: i64,
    /// The reference's limit (`max_failure_count`): any counted failure reaches it.
    pub max_failure_count: i64,
    /// The policy's own limit ([`failure_limit`]): `confirm_failures` under `agent`.
    #[serde(default)]
    pub failure_limit: i64,
    pub last_probe: Option<ProbeLine>,
    /// What each router polling the agent was last told (`haproxy`: `drain`, …).
    #[serde(default)]
    pub routers: std::collections::BTreeMap<String, String>,
    /// The driver's faults on the engine's NPUs, each with what it does to the engine:
    /// `NPU 0 reports 0x80E18402 (…), level SeparateNPU: one immediate confirming probe; …`.
    #[serde(default)]
    pub faults: Vec<String>,
}

/// The last virtual probe.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProbeLine {
    pub at_unix_ms: u64,
    pub success: bool,
    pub outcome: String,
    pub latency_ms: f64,
}

/// One recent action, for any integration (`monitor::journal`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Recent {
    pub engine: String,
    pub at_unix_ms: u64,
    /// `<integration> <action>`: `node_manager status`, `agent level`, `kubelet readyz`,
    /// `kubelet livez`, `haproxy agent_check`, `envoy health_check`, `kubernetes_api
    /// eviction`, ….
    pub what: String,
    /// `from -> to`, or the API call's outcome.
    pub change: String,
    /// The QoS level at that moment.
    #[serde(default)]
    pub level: String,
    pub detail: String,
}

/// One NPU's slow figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NpuState {
    pub i: u16,
    pub backend: String,
    pub stale: bool,
    pub hung: bool,
    pub health: Option<u32>,
    pub hbm_used_mb: Option<u64>,
    pub hbm_total_mb: Option<u64>,
    /// The driver's current fault codes, with their levels (`NPU 0 reports 0x… (…), level …`).
    #[serde(default)]
    pub faults: Vec<String>,
}

/// The name the views give the agent's node: `[agent.kubernetes] node_name`, else
/// `$NODE_NAME` (the shipped DaemonSet sets it from `spec.nodeName`), else the host name.
pub(crate) fn node_name(agent: &AgentSettings) -> String {
    let configured = KubernetesConfig::of(agent).and_then(|k| k.node_name.clone());
    let env = std::env::var("NODE_NAME").ok();
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").ok();
    pick_node(configured, env, host)
}

/// The first of the three that is not blank, trimmed; `unknown host` when none is.
fn pick_node(configured: Option<String>, env: Option<String>, host: Option<String>) -> String {
    [configured, env, host]
        .into_iter()
        .flatten()
        .map(|n| n.trim().to_owned())
        .find(|n| !n.is_empty())
        .unwrap_or_else(|| "unknown host".to_owned())
}

/// The counted failures that make `spec`'s engine abnormal under its policy: the agent
/// policy's `confirm_failures` when lower than `max_failure_count` (a confirmed failure
/// reaches it; an unconfirmed one still counts toward `max_failure_count`), else
/// `max_failure_count`, the reference's.
pub(crate) fn failure_limit(spec: &EngineSpec) -> i64 {
    let max = spec.health_check_config.max_failure_count;
    spec.agent_policy_in_force()
        .map_or(max, |a| max.min(i64::from(a.confirm_failures)))
}

/// The `hello` frame for `engines` over `shared`, on `node`.
pub(crate) fn hello(shared: &Shared, engines: &[Arc<Monitor>], node: &str) -> Hello {
    let npus = shared
        .devices
        .iter()
        .enumerate()
        .map(|(i, d)| Npu {
            index: i as u16,
            id: d.info.id,
            name: d.info.name.clone(),
            engines: engines
                .iter()
                .filter(|e| e.devices().contains(&(i as u16)))
                .map(|e| e.spec().name.clone())
                .collect(),
        })
        .collect();
    Hello {
        node: node.to_owned(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        period_ms: shared.sampler.period().as_secs_f64() * 1e3,
        frame_interval_ms: FRAME_INTERVAL.as_millis() as u64,
        history_s: HISTORY.as_secs_f64(),
        npus,
        engines: engines.iter().map(|e| e.spec().name.clone()).collect(),
    }
}

/// Every sample newer than `*after_ns` (ring clock), oldest first per NPU; moves `*after_ns`
/// to the newest one read. Reads the lock-free ring only.
pub(crate) fn samples_since(shared: &Shared, after_ns: &mut u64) -> Samples {
    let now_ns = shared.ring.now_ns();
    let mut per: Vec<NpuSamples> = (0..shared.devices.len())
        .map(|i| NpuSamples {
            i: i as u16,
            t: Vec::new(),
            v: Vec::new(),
        })
        .collect();
    let after = *after_ns;
    let mut newest = after;
    shared.ring.scan_back(|s| {
        if s.ts_ns <= after {
            return false;
        }
        newest = newest.max(s.ts_ns);
        if let Some(p) = per.get_mut(usize::from(s.device)) {
            p.t.push(s.ts_ns as f64 / 1e6);
            p.v.push(s.valid.then_some(s.value));
        }
        true
    });
    for p in &mut per {
        p.t.reverse();
        p.v.reverse();
    }
    *after_ns = newest;
    Samples {
        now_ms: now_ns as f64 / 1e6,
        npus: per,
    }
}

/// The ring-clock time [`HISTORY`] ago: where a new subscriber's first frame starts.
pub(crate) fn history_start(shared: &Shared) -> u64 {
    shared
        .ring
        .now_ns()
        .saturating_sub(HISTORY.as_nanos() as u64)
}

/// One engine's line (reads only; the verdict is peeked).
pub(crate) fn engine_line(m: &Monitor) -> EngineLine {
    let Answers {
        facts: f,
        readiness: r,
        liveness: l,
    } = Answers::of(m);
    EngineLine {
        name: m.spec().name.clone(),
        status: f.status,
        reason: f.reason,
        policy: m.spec().policy.value.as_str().to_owned(),
        level: f.level,
        score: f.score.map(crate::qos::round3),
        ready: r.ready,
        ready_reason: r.reason,
        live: l.live,
        live_reason: l.reason,
        failure_count: m.vi().failure_count(),
        max_failure_count: m.spec().health_check_config.max_failure_count,
        failure_limit: failure_limit(m.spec()),
        last_probe: m.vi().last_probe().map(|p| ProbeLine {
            at_unix_ms: p.at_unix_ms,
            success: p.success,
            outcome: p.outcome,
            latency_ms: (p.latency_ms * 10.0).round() / 10.0,
        }),
        routers: m
            .acted()
            .routers()
            .into_iter()
            .map(|(router, seen)| (router, seen.state))
            .collect(),
        faults: Vec::new(),
    }
}

/// The driver's faults on `m`'s NPUs, with what each does to it under its policy.
fn engine_faults(shared: &Shared, m: &Monitor) -> Vec<String> {
    let agent = m.spec().agent_policy_in_force().is_some();
    m.devices()
        .iter()
        .flat_map(|&i| shared.faults_of(i))
        .map(|f| {
            let effect = crate::monitor::evidence::driver_faults::fault_effect(agent, f.level);
            format!("{}: {}", f.describe(), effect.describe())
        })
        .collect()
}

fn from_entry(engine: &str, e: ActionRecord) -> Recent {
    Recent {
        engine: engine.to_owned(),
        at_unix_ms: e.at_unix_ms,
        what: format!("{} {}", e.integration.as_str(), e.action),
        change: if e.from.is_empty() {
            e.to
        } else {
            format!("{} -> {}", e.from, e.to)
        },
        level: e.level.as_str().to_owned(),
        detail: e.reason,
    }
}

/// The `engines` frame.
pub(crate) fn engines(shared: &Shared, engines: &[Arc<Monitor>]) -> EnginesFrame {
    let mut recent: Vec<Recent> = engines
        .iter()
        .flat_map(|m| {
            let name = &m.spec().name;
            m.actions()
                .into_iter()
                .map(|a| from_entry(name, a))
                .collect::<Vec<_>>()
        })
        .collect();
    recent.sort_by_key(|r| std::cmp::Reverse(r.at_unix_ms));
    recent.truncate(RECENT);
    let now = shared.ring.now_ns();
    let npus = shared
        .devices
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let s = d.snapshot(now);
            NpuState {
                i: i as u16,
                backend: s.backend.as_str().to_owned(),
                stale: s.stale,
                hung: s.hung,
                health: s.health,
                hbm_used_mb: s.hbm_used_mb,
                hbm_total_mb: s.hbm_total_mb,
                faults: shared
                    .faults_of(i as u16)
                    .iter()
                    .map(|f| f.describe())
                    .collect(),
            }
        })
        .collect();
    EnginesFrame {
        at_unix_ms: crate::clock::unix_ms(),
        engines: engines
            .iter()
            .map(|m| EngineLine {
                faults: engine_faults(shared, m),
                ..engine_line(m)
            })
            .collect(),
        recent,
        npus,
    }
}

/// The admin page: one self-contained HTML file (no external asset), embedded.
pub const PAGE: &str = include_str!("page.html");

#[cfg(test)]
mod tests {
    use super::*;

    // Issue 48: the views name the host. The configured Kubernetes node name first, then the
    // DaemonSet's $NODE_NAME, then the host name; blanks are skipped.
    #[test]
    fn the_node_is_the_first_name_given() {
        // (configured, $NODE_NAME, host name; "-": not set) → the name shown
        let rows = [
            (["n1", "env", "host\n"], "n1"),
            (["-", "env", "host\n"], "env"),
            (["-", "", "host\n"], "host"),
            ([" ", "-", "host"], "host"),
            (["-", "-", "-"], "unknown host"),
        ];
        let given = |v: &str| (v != "-").then(|| v.to_owned());
        for ([configured, env, host], want) in rows {
            assert_eq!(pick_node(given(configured), given(env), given(host)), want);
        }
    }

    // Issue 48: the page read "failures 2/6" at `abnormal` under the agent policy, whose
    // limit is 2 (`confirm_failures`); 6 is the reference's `max_failure_count`.
    #[test]
    fn the_failure_limit_is_the_policy_in_force() {
        let spec = |policy: &str, extra: &str| {
            let text = format!(
                "[agent]\npolicy = \"{policy}\"\n[[engine]]\nname = \"a\"\nengine_type = \"vllm\"\nserved_model_name = \"m\"\nhost = \"127.0.0.1\"\nport = 8000\nmgmt_port = 9001\n{extra}"
            );
            crate::config::file::parse(&text, std::path::Path::new("/x/agent.toml"))
                .unwrap()
                .engines
                .remove(0)
        };
        let hc = "[engine.health_check_config]\nmax_failure_count = 1\n";
        let rows = [
            (spec("agent", ""), 2),
            (spec("reference", ""), 6),
            (spec("agent", hc), 1),
            (
                spec("agent", "[engine.agent_policy]\nconfirm_failures = 4\n"),
                4,
            ),
        ];
        for (spec, want) in rows {
            assert_eq!(failure_limit(&spec), want, "{:?}", spec.policy);
        }
    }
}

//! The operator views' data: what the admin page (`GET /`, fed by `GET /events`) and
//! `npu-health-agent top` show. Typed frames (the `npu-health-wire` crate's), built from the
//! shared state and the monitor's snapshot by plain functions, and read back by the views and
//! the tests with the same types.
//!
//! `GET /events` is a server-sent event stream of three frames: `hello` once (the node, the
//! NPUs and engines, the sampling period), then `samples` every [`FRAME_INTERVAL`] (every
//! ring sample since the last frame, at the sampling resolution: a 100 ms burst is two or
//! more points at 50 ms) and `engines` every [`ENGINES_EVERY`] frames (verdict, level, score,
//! failures against their limit, last probe, readiness, liveness, and the recent changes).
//! The first `samples` frame carries the last [`HISTORY`] so a chart is full at once.
//! [`top`] is what `npu-health-agent top` makes of them.

pub(crate) mod top;

use crate::config::AgentSettings;
use crate::integrations::Answers;
use crate::integrations::kubernetes::config::KubernetesConfig;
use crate::monitor::Monitor;
use crate::sampler::Shared;
use npu_health_wire::{
    ActionRecord, EngineLine, EnginesFrame, Hello, Npu, NpuSamples, NpuState, ProbeLine, Recent,
    Samples,
};
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

/// One engine's line (reads only; the verdict is peeked): its answers, and virtual inference
/// as the monitor's snapshot has it.
pub(crate) fn engine_line(m: &Monitor) -> EngineLine {
    let Answers {
        facts: f,
        readiness: r,
        liveness: l,
    } = Answers::of(m);
    let vi = m.virtual_inference();
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
        failure_count: vi.failure_count,
        max_failure_count: vi.max_failure_count,
        failure_limit: vi.failure_limit,
        last_probe: vi.last_probe.map(|p| ProbeLine {
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
}

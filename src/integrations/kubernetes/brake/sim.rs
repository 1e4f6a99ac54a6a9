//! The fleet brake's simulation (not in CI; docs/kubernetes.md, "The fleet brake", and
//! BENCHMARKS.md): many agents in one process, each with the real consult and refresh code
//! ([`super::client`]) and one shared HTTP client pool, against the stand-in API server
//! (real HTTP on loopback), through a wave and a quiet period. Run:
//!
//! ```sh
//! NPU_HEALTH_BRAKE_SIM_AGENTS=1000 NPU_HEALTH_BRAKE_SIM_SPEEDUP=4 \
//!   cargo test --lib --features fake-driver brake::sim -- --ignored --nocapture
//! ```
//!
//! The wave: `WAVE_SHARE` of the agents' engines turn abnormal through an agent rule at
//! random times over `WAVE` (simulated), each consulting the shared state; then `QUIET` (as long as the window: the last agent to look sees a brake still engaged).
//! Every agent also reads the state every `refresh` (5 min, jittered), as the loop does.
//! Time is compressed by SPEEDUP: the state's clock runs SPEEDUP times faster than the real
//! one, so the requests are SPEEDUP times denser than in the real wave; the figures say both.

use super::client::{self, Home, Tally, consult};
use super::config::{BrakeConfig, DEFAULT_NAME, Fleet as FleetCfg};
use super::state::{Decision, allowed};
use super::tests::stand_in::{StandIn, TOKEN, pod};
use crate::integrations::kubernetes::api::KubeClient;
use crate::integrations::kubernetes::config::KubernetesConfig;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const WAVE: f64 = 120.0;
const QUIET: f64 = 300.0;
const WAVE_SHARE: f64 = 0.6;

/// What the agents saw and cost, in real time since the start.
#[derive(Default)]
struct Log {
    /// (real seconds, requests) per finished call.
    requests: Vec<(f64, u64)>,
    conflicts: u64,
    errors: u64,
    /// The first failed consult's error.
    first_error: Option<String>,
    bytes: u64,
    acted: u64,
    held: u64,
    /// Real latency of each consult (the most a verdict is delayed).
    delays: Vec<f64>,
    /// Simulated second the brake engaged (the first held verdict's write).
    engaged_at: Option<f64>,
    /// Per agent, the first simulated second it saw the brake engaged.
    saw: Vec<Option<f64>>,
}

/// A cheap deterministic random in [0, 1) from a seed.
fn unit(seed: u64) -> f64 {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    x ^= x >> 31;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 29;
    (x >> 11) as f64 / (1u64 << 53) as f64
}

#[test]
#[ignore = "a simulation: minutes of load; run by hand (BENCHMARKS.md)"]
fn simulation() {
    let env = |k: &str, d: f64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let agents = env("NPU_HEALTH_BRAKE_SIM_AGENTS", 1000.0) as usize;
    let speedup = env("NPU_HEALTH_BRAKE_SIM_SPEEDUP", 4.0);
    let pods = (0..agents)
        .map(|i| {
            pod(
                "serving",
                &format!("vllm-{i}"),
                &format!("node-{i:05}"),
                false,
                &[],
            )
        })
        .collect();
    let s = StandIn::start(pods);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let log = rt.block_on(run(&s.url, agents, speedup));
    report(&log, agents, speedup, &s);
}

async fn run(url: &str, agents: usize, speedup: f64) -> Log {
    let dir = std::env::temp_dir().join(format!("brake-sim-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("token"), TOKEN).unwrap();
    let k = KubernetesConfig {
        api_server: Some(url.to_owned()),
        token_file: Some(dir.join("token")),
        ..KubernetesConfig::default()
    };
    let c = KubeClient::new(&k).unwrap();
    let cfg = Arc::new(BrakeConfig {
        enabled: true,
        fleet: FleetCfg {
            namespace: Some("serving".to_owned()),
            selector: None,
        },
        ..BrakeConfig::default()
    });
    let home = Home {
        namespace: "npu-health".to_owned(),
        name: DEFAULT_NAME.to_owned(),
    };
    let log = Arc::new(Mutex::new(Log {
        saw: vec![None; agents],
        ..Log::default()
    }));
    let start = Instant::now();
    let t0 = 1_800_000_000u64;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..agents {
        let (c, cfg, home, log) = (c.clone(), cfg.clone(), home.clone(), log.clone());
        let turns = (unit(i as u64) < WAVE_SHARE).then(|| unit(i as u64 + 1_000_003) * WAVE);
        tasks.spawn(async move {
            agent(i, turns, &c, &cfg, &home, &log, speedup, start, t0).await;
        });
    }
    while tasks.join_next().await.is_some() {}
    Arc::try_unwrap(log).ok().unwrap().into_inner().unwrap()
}

/// One agent: refreshes every `refresh` (jittered) and, if its engine turns abnormal at
/// `turns` (simulated seconds), consults once.
#[allow(clippy::too_many_arguments)]
async fn agent(
    i: usize,
    turns: Option<f64>,
    c: &KubeClient,
    cfg: &BrakeConfig,
    home: &Home,
    log: &Mutex<Log>,
    speedup: f64,
    start: Instant,
    t0: u64,
) {
    let end = WAVE + QUIET;
    let refresh = cfg.refresh.as_secs_f64();
    let mut next_refresh = unit(i as u64 + 7) * refresh;
    let mut turned = turns;
    let mut known = None;
    loop {
        let next = match turned {
            Some(t) if t < next_refresh => t,
            _ => next_refresh,
        };
        if next >= end {
            return;
        }
        let wait = next / speedup - start.elapsed().as_secs_f64();
        if wait > 0.0 {
            tokio::time::sleep(Duration::from_secs_f64(wait)).await;
        }
        let sim = start.elapsed().as_secs_f64() * speedup;
        let now = t0 + sim as u64;
        let began = Instant::now();
        let mut t = Tally::default();
        if turned.is_some_and(|t| t <= next_refresh) {
            turned = None;
            let e = format!("node-{i:05}/e");
            let r = consult(c, cfg, home, &e, now, known.as_ref(), &mut t).await;
            let mut g = log.lock().unwrap();
            g.delays.push(began.elapsed().as_secs_f64());
            match r {
                Ok(k) => {
                    known = Some(k.fleet.clone());
                    let engaged = k.fleet.engaged(now, cfg.window.as_secs(), cfg.max_fraction);
                    if k.decision == Decision::Act {
                        g.acted += 1;
                    } else {
                        g.held += 1;
                        g.engaged_at.get_or_insert(sim);
                    }
                    if engaged && g.saw[i].is_none() {
                        g.saw[i] = Some(sim);
                    }
                }
                Err(e) => {
                    g.errors += 1;
                    g.first_error.get_or_insert(e.to_string());
                }
            }
            g.conflicts += t.conflicts;
            g.bytes += t.bytes;
            g.requests.push((start.elapsed().as_secs_f64(), t.requests));
        } else {
            next_refresh += refresh * (0.95 + unit(i as u64 ^ next_refresh as u64) / 10.0);
            let r = client::read(c, home, &mut t).await;
            let mut g = log.lock().unwrap();
            if let Ok(Some((f, _))) = r {
                if f.engaged(now, cfg.window.as_secs(), cfg.max_fraction) && g.saw[i].is_none() {
                    g.saw[i] = Some(sim);
                }
                known = Some(f);
            }
            g.bytes += t.bytes;
            g.requests.push((start.elapsed().as_secs_f64(), t.requests));
        }
    }
}

fn report(log: &Log, agents: usize, speedup: f64, s: &StandIn) {
    let span = (WAVE + QUIET) / speedup;
    let total: u64 = log.requests.iter().map(|r| r.1).sum();
    let mut per_sec = vec![0u64; span.ceil() as usize + 60];
    let last = per_sec.len() - 1;
    for (at, n) in &log.requests {
        per_sec[(*at as usize).min(last)] += n;
    }
    let peak = per_sec.iter().max().copied().unwrap_or(0);
    let mut delays = log.delays.clone();
    delays.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        delays
            .get(((delays.len() as f64 * p) as usize).min(delays.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0.0)
    };
    let last_saw = log
        .saw
        .iter()
        .flatten()
        .fold(None::<f64>, |m, &x| Some(m.map_or(x, |m| m.max(x))));
    let saw = log.saw.iter().flatten().count();
    let counts = s.api.config_map_counts();
    println!(
        "brake simulation: {agents} agents, speedup {speedup}, wave {WAVE} s of {:.0} % then {QUIET} s quiet (simulated)",
        WAVE_SHARE * 100.0
    );
    println!(
        "  requests: {total} in {span:.1} s real: mean {:.1}/s real ({:.1}/s at real time), peak {peak}/s real",
        total as f64 / span,
        total as f64 / span / speedup
    );
    println!(
        "  stand-in: {} GET, {} create, {} replace, {} patch, {} JSON patches refused (422: a claim of the count lost), {} conflicts (409), {} over 1 MiB",
        counts.gets,
        counts.creates,
        counts.replaces,
        counts.patches,
        counts.patch_refused,
        counts.conflicts,
        counts.too_large
    );
    let lists = s.api.seen_where("GET", "/pods").len();
    println!(
        "  pod lists (the fleet's count): {lists}; bytes read by the agents: {:.1} MB ({:.1} MB/s at real time)",
        log.bytes as f64 / 1e6,
        log.bytes as f64 / 1e6 / span / speedup
    );
    println!(
        "  consults: {} acted, {} held, {} failed; allowed {} (max_fraction 0.5 of {agents})",
        log.acted,
        log.held,
        log.errors,
        allowed(agents as u64, 0.5)
    );
    println!(
        "  conflicts seen by the agents (each one retry): {}; the first failed consult: {:?}",
        log.conflicts, log.first_error
    );
    println!(
        "  consult latency (the verdict's delay), real: p50 {:.3} s, p99 {:.3} s, max {:.3} s",
        pct(0.5),
        pct(0.99),
        pct(1.0)
    );
    println!(
        "  engaged at {:?} s simulated; {saw} agents saw it engaged, the last at {:?} s simulated",
        log.engaged_at, last_saw
    );
    if let Some(cm) = s.api.config_map("npu-health", DEFAULT_NAME) {
        let bytes = super::tests::stand_in::kube_brake::data_bytes(&cm);
        println!("  the ConfigMap's data at the end: {bytes} bytes");
    }
}

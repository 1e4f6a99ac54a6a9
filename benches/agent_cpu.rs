//! The whole agent's CPU at the defaults, with 16 NPUs, and what issue 50 costs (the records
//! of the rules and the shadow, the evidence bundles' watch), measured side by side in one run:
//!
//!     cargo bench --features fake-driver --bench agent_cpu
//!     NPU_HEALTH_BEFORE=<an earlier release binary> cargo bench --features fake-driver --bench agent_cpu
//!
//! Starts, as real processes, two fake engines and the agent (release build, fake libdcmi.so
//! with 16 NPUs, two engines of 8 NPUs each, every key at its default: the agent policy,
//! sampling every 50 ms, the QoS scrapes, the virtual probes, the stopped-process look at
//! `/proc` every 500 ms). The engines are idle but for the probes. Alternating rounds, each a
//! fresh agent warmed up for 5 s and then measured over `ROUND` by `utime + stime` of
//! `/proc/<agent>/stat`: the binary `NPU_HEALTH_BEFORE` names at its defaults (when set: the
//! "before" of a before/after table), this one at its defaults, and this one with issue 50's
//! options on (`shadow_policy = "reference"` beside the agent policy, `evidence_dir` set).
//! Prints a Markdown report (copied into BENCHMARKS.md).

mod common;

use common::{FakeEngine, cpu_ticks, free_port};
use std::time::{Duration, Instant};

/// One measured round.
const ROUND: Duration = Duration::from_secs(30);
/// Rounds per configuration.
const ROUNDS: usize = 3;

fn main() {
    let agent = common::agent_exe();
    let (dir, scenario) = common::scenario_16();
    let engines = [FakeEngine::start(&agent), FakeEngine::start(&agent)];
    let hz = common::ticks_per_second();
    let evidence = format!(
        "evidence_dir = \"{}\"",
        dir.path().join("evidence").display()
    );
    let issue_50 = format!("shadow_policy = \"reference\"\n{evidence}");
    let before = std::env::var_os("NPU_HEALTH_BEFORE").map(std::path::PathBuf::from);
    let mut configs: Vec<(String, std::path::PathBuf, String)> = Vec::new();
    if let Some(b) = &before {
        configs.push((
            format!("before: `{}`, the defaults", b.display()),
            b.clone(),
            String::new(),
        ));
    }
    configs.push((
        "this build, the defaults".to_owned(),
        agent.clone(),
        String::new(),
    ));
    configs.push((
        "this build, a shadow policy and evidence bundles on".to_owned(),
        agent.clone(),
        issue_50,
    ));
    let mut results: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
    for round in 0..ROUNDS {
        for (i, (_, exe, agent_extra)) in configs.iter().enumerate() {
            let (m1, m2) = (free_port(), free_port());
            let toml = common::write_config_with(
                dir.path(),
                &format!("r{round}c{i}"),
                &engines,
                (m1, m2),
                agent_extra,
                "",
            );
            let mut child = common::spawn_agent_settled(exe, &toml, &scenario, m1);
            let (t0, c0) = (Instant::now(), cpu_ticks(child.id()));
            std::thread::sleep(ROUND);
            let (t1, c1) = (Instant::now(), cpu_ticks(child.id()));
            let pct = (c1 - c0) as f64 / hz / (t1 - t0).as_secs_f64() * 100.0;
            results[i].push(pct);
            let _ = child.kill();
            let _ = child.wait();
        }
    }
    println!(
        "## The whole agent's CPU with 16 NPUs (`cargo bench --features fake-driver --bench agent_cpu`)\n"
    );
    println!(
        "Machine: {} cores. Agent: release build, fake libdcmi.so with 16 NPUs, 2 idle fake engines of 8 NPUs each, every key at its default; {ROUNDS} alternating rounds of {} s each, CPU from `/proc/<agent>/stat` (10 ms ticks: ±{:.3} point per round).\n",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        ROUND.as_secs(),
        100.0 / hz / ROUND.as_secs_f64()
    );
    println!("| configuration | CPU % of one core (median) | rounds |\n|---|---|---|");
    let mut medians = Vec::new();
    for ((name, _, _), v) in configs.iter().zip(&results) {
        let m = common::median(v);
        medians.push(m);
        let rounds: Vec<String> = v.iter().map(|x| format!("{x:.3}")).collect();
        println!("| {name} | {m:.3} % | {} |", rounds.join(", "));
    }
    println!(
        "\nAgainst the first row: {}.",
        medians[1..]
            .iter()
            .zip(&configs[1..])
            .map(|(m, (n, _, _))| format!("{n} {:+.3} point", m - medians[0]))
            .collect::<Vec<_>>()
            .join("; ")
    );
}

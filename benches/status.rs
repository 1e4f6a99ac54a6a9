//! `/status` and the agent process, measured side by side in one run:
//!
//!     cargo bench --features fake-driver --bench status
//!
//! Needs `wrk` (`apt-get install wrk`). Starts, as real processes: two fake engines, the agent
//! (release build, fake libdcmi.so with 16 NPUs, two engines of 8 NPUs each, sampling at
//! 100 Hz), and a bare axum server answering `/status` with the same bytes (this benchmark
//! re-run as a child). Prints a Markdown report (copied into BENCHMARKS.md):
//! - `/status` requests/s and p99 under `wrk`, agent against the bare handler;
//! - the sampler's tick lateness p99 while `wrk` saturates `/status` (from the agent's
//!   `npu_health_agent_sampler_tick_lateness_seconds` histogram, before/after difference);
//! - the agent's RSS;
//! - time from process start to the first `/status` answer.

mod common;

use common::{FakeEngine, free_port, get, median, spawn_agent, wait_for};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BODY: &str = r#"{"status":"normal"}"#;
const WRK_ARGS: [&str; 6] = ["-t", "2", "-c", "64", "-d", "5s"];
/// Alternating rounds per server; the report shows the median round.
const ROUNDS: usize = 3;

fn main() {
    if let Ok(addr) = std::env::var("BENCH_BARE_SERVER") {
        bare_server(&addr);
        return;
    }
    if Command::new("wrk").arg("--version").output().is_err() {
        eprintln!("wrk is not installed (apt-get install wrk)");
        std::process::exit(2);
    }
    let agent = common::agent_exe();
    let (dir, scenario) = common::scenario_16();
    println!(
        "## `/status` and the agent process (`cargo bench --features fake-driver --bench status`)\n"
    );
    println!(
        "Machine: {} cores. Agent: release build, fake libdcmi.so with 16 NPUs, 2 engines, sampling every 10 ms (100 Hz), 2 runtime worker threads.\n",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );

    let startup = start_to_first_answer(&agent, dir.path(), &scenario);

    let engines = [FakeEngine::start(&agent), FakeEngine::start(&agent)];
    let (m1, m2, admin) = (free_port(), free_port(), free_port());
    let toml = write_config(dir.path(), "bench", &engines, m1, m2, Some(admin));
    let mut agent_proc = spawn_agent(&agent, &toml, &scenario);
    let status_url = format!("http://127.0.0.1:{m1}/status");
    wait_for(&status_url, |b| b == BODY, Duration::from_secs(30));
    wait_for(
        &format!("http://127.0.0.1:{m2}/status"),
        |b| b == BODY,
        Duration::from_secs(30),
    );
    std::thread::sleep(Duration::from_secs(3));
    let rss_kib = rss_kib(agent_proc.id());

    let metrics_url = format!("http://127.0.0.1:{admin}/metrics");
    let bare_port = free_port();
    let mut bare = Command::new(std::env::current_exe().unwrap())
        .env("BENCH_BARE_SERVER", format!("127.0.0.1:{bare_port}"))
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let bare_url = format!("http://127.0.0.1:{bare_port}/status");
    wait_for(&bare_url, |b| b == BODY, Duration::from_secs(10));
    // Alternate the two servers so that drift on a shared machine hits both alike.
    let (mut ours_runs, mut bare_runs) = (Vec::new(), Vec::new());
    let mut jitter = (0u64, 0.0f64);
    for _ in 0..ROUNDS {
        let before = lateness(&metrics_url);
        ours_runs.push(wrk(&status_url));
        let after = lateness(&metrics_url);
        let j = p99_of_difference(&before, &after);
        jitter = (jitter.0 + j.0, jitter.1.max(j.1));
        bare_runs.push(wrk(&bare_url));
    }
    let _ = bare.kill();
    let _ = bare.wait();
    let idle_before = lateness(&metrics_url);
    std::thread::sleep(Duration::from_secs(10));
    let idle_after = lateness(&metrics_url);
    let idle_jitter = p99_of_difference(&idle_before, &idle_after);
    let _ = agent_proc.kill();
    let _ = agent_proc.wait();
    let ours = median_run(ours_runs);
    let bare_result = median_run(bare_runs);

    println!(
        "### `/status` under `wrk {} --latency`, median of {ROUNDS} alternating rounds\n",
        WRK_ARGS.join(" ")
    );
    println!("| server | requests/s | p50 | p99 |");
    println!("|---|---|---|---|");
    println!(
        "| agent `/status` (reads the verdict snapshot) | {:.0} | {} | {} |",
        ours.rps, ours.p50, ours.p99
    );
    println!(
        "| bare axum handler, same bytes, same runtime size | {:.0} | {} | {} |",
        bare_result.rps, bare_result.p50, bare_result.p99
    );
    println!(
        "\nAgent / bare: {:.1} % of the requests/s.\n",
        100.0 * ours.rps / bare_result.rps
    );
    println!("### Sampler tick lateness at 100 Hz\n");
    println!("| condition | passes | p99 lateness (histogram bucket bound) |");
    println!("|---|---|---|");
    println!(
        "| while `wrk` saturates `/status` (worst of {ROUNDS} rounds) | {} | ≤ {} |",
        jitter.0,
        fmt_s(jitter.1)
    );
    println!(
        "| idle, 10 s | {} | ≤ {} |\n",
        idle_jitter.0,
        fmt_s(idle_jitter.1)
    );
    println!("### Memory and start-up\n");
    println!("| measure | figure |");
    println!("|---|---|");
    println!(
        "| RSS of the agent, 16 NPUs, 2 engines, after warm-up | {:.1} MiB |",
        rss_kib as f64 / 1024.0
    );
    println!(
        "| process start to the first `/status` answer ({} runs) | median {:.1} ms, max {:.1} ms |\n",
        startup.len(),
        median(&startup),
        startup.iter().cloned().fold(0.0, f64::max)
    );
}

fn fmt_s(s: f64) -> String {
    if s.is_infinite() {
        "+Inf".to_owned()
    } else if s < 1e-3 {
        format!("{:.0} µs", s * 1e6)
    } else {
        format!("{:.1} ms", s * 1e3)
    }
}

/// Milliseconds from spawning the agent to its first `/status` answer, over several runs.
fn start_to_first_answer(agent: &Path, dir: &Path, scenario: &Path) -> Vec<f64> {
    let engines = [FakeEngine::start(agent), FakeEngine::start(agent)];
    let mut out = Vec::new();
    for i in 0..10 {
        let (m1, m2) = (free_port(), free_port());
        let toml = write_config(dir, &format!("start{i}"), &engines, m1, m2, None);
        let url = format!("127.0.0.1:{m1}");
        let t0 = Instant::now();
        let mut child = spawn_agent(agent, &toml, scenario);
        let answered = loop {
            if let Ok(mut s) = std::net::TcpStream::connect(&url) {
                use std::io::{Read, Write};
                let _ = write!(
                    s,
                    "GET /status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                );
                let mut b = String::new();
                if s.read_to_string(&mut b).is_ok() && b.contains("\"status\"") {
                    break t0.elapsed();
                }
            }
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "agent did not answer"
            );
            std::thread::sleep(Duration::from_micros(500));
        };
        out.push(answered.as_secs_f64() * 1e3);
        let _ = child.kill();
        let _ = child.wait();
    }
    out
}

/// The status bench's config: sampling at 100 Hz, the admin listener when asked.
fn write_config(
    dir: &Path,
    name: &str,
    engines: &[FakeEngine],
    m1: u16,
    m2: u16,
    admin: Option<u16>,
) -> PathBuf {
    let admin = admin
        .map(|a| format!("admin_listen = \"127.0.0.1:{a}\"\n"))
        .unwrap_or_default();
    common::write_config_with(
        dir,
        name,
        engines,
        (m1, m2),
        &format!("sample_period = \"10ms\"\n{admin}"),
        "",
    )
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Cumulative lateness buckets (upper bound in seconds, count) from the agent's metrics.
fn lateness(url: &str) -> Vec<(f64, u64)> {
    let text = get(url).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            l.strip_prefix("npu_health_agent_sampler_tick_lateness_seconds_bucket{le=\"")
        })
        .filter_map(|l| {
            let (le, rest) = l.split_once("\"} ")?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, rest.trim().parse().ok()?))
        })
        .collect()
}

/// (passes, p99 bucket bound) between two cumulative snapshots.
fn p99_of_difference(before: &[(f64, u64)], after: &[(f64, u64)]) -> (u64, f64) {
    let diff: Vec<(f64, u64)> = after
        .iter()
        .map(|(le, n)| {
            (
                *le,
                n - before.iter().find(|b| b.0 == *le).map_or(0, |b| b.1),
            )
        })
        .collect();
    let total = diff.last().map_or(0, |d| d.1);
    let bound = diff
        .iter()
        .find(|(_, n)| *n as f64 >= 0.99 * total as f64)
        .map_or(f64::INFINITY, |d| d.0);
    (total, bound)
}

fn median_run(mut runs: Vec<WrkResult>) -> WrkResult {
    runs.sort_by(|a, b| a.rps.total_cmp(&b.rps));
    runs.swap_remove(runs.len() / 2)
}

struct WrkResult {
    rps: f64,
    p50: String,
    p99: String,
}

fn wrk(url: &str) -> WrkResult {
    let out = Command::new("wrk")
        .args(WRK_ARGS)
        .arg("--latency")
        .arg(url)
        .output()
        .expect("run wrk");
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |prefix: &str| {
        text.lines()
            .map(str::trim)
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.split_whitespace().nth(1))
            .unwrap_or("?")
            .to_owned()
    };
    let rps = text
        .lines()
        .find(|l| l.starts_with("Requests/sec:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0.0);
    let non2xx = text
        .lines()
        .find(|l| l.contains("Non-2xx"))
        .map(str::to_owned);
    assert!(non2xx.is_none(), "{url}: {non2xx:?}");
    WrkResult {
        rps,
        p50: field("50%"),
        p99: field("99%"),
    }
}

fn bare_server(addr: &str) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let app = axum::Router::new().route(
            "/status",
            axum::routing::get(|| async {
                (
                    [(axum::http::header::CONTENT_TYPE, "application/json")],
                    BODY,
                )
            }),
        );
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        axum::serve(listener, app).await.unwrap();
    });
}

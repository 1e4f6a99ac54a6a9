//! `/metrics` with and without gzip: bytes on the wire and the agent's CPU per scrape, and
//! what each compression level costs on that very text.
//!
//!     cargo bench --features fake-driver --bench metrics_gzip
//!
//! Starts two fake engines and the agent (release build, fake libdcmi.so with 16 NPUs, two
//! engines of 8 NPUs each, an admin listener), warms it up 5 s, then alternates rounds of
//! `SCRAPES` admin `/metrics` scrapes, plain and with `Accept-Encoding: gzip` (what
//! Prometheus sends), each on a new connection as Prometheus makes them at most. CPU is the
//! agent's `utime + stime` over the round less its idle rate, measured between rounds. Prints
//! a Markdown report (copied into BENCHMARKS.md).

mod common;

use common::{FakeEngine, cpu_ticks, free_port, median};
use std::io::{Read, Write};
use std::time::{Duration, Instant};

const SCRAPES: usize = 400;
const ROUNDS: usize = 3;

/// One scrape: the body's bytes as they came, and whether they were gzipped.
fn scrape(port: u16, gzip: bool) -> (Vec<u8>, bool) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let enc = if gzip {
        "Accept-Encoding: gzip\r\n"
    } else {
        ""
    };
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: x\r\n{enc}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let at = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&raw[..at]).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(
        !head.contains("transfer-encoding: chunked"),
        "a chunked answer: this bench reads the body whole"
    );
    (
        raw[at + 4..].to_vec(),
        head.contains("content-encoding: gzip"),
    )
}

fn main() {
    let agent = common::agent_exe();
    let (dir, scenario) = common::scenario_16();
    let engines = [FakeEngine::start(&agent), FakeEngine::start(&agent)];
    let hz = common::ticks_per_second();
    let (m1, m2, admin) = (free_port(), free_port(), free_port());
    let toml = common::write_config_with(
        dir.path(),
        "gzip",
        &engines,
        (m1, m2),
        &format!("admin_listen = \"127.0.0.1:{admin}\""),
        "",
    );
    let mut child = common::spawn_agent_settled(&agent, &toml, &scenario, m1);
    let pid = child.id();
    let (plain, was) = scrape(admin, false);
    assert!(!was);
    let (zipped, was) = scrape(admin, true);
    assert!(was, "the agent did not gzip");
    let (mut cpu_plain, mut cpu_gzip) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        // The idle rate, over as long as a round takes.
        let (t0, c0) = (Instant::now(), cpu_ticks(pid));
        std::thread::sleep(Duration::from_secs(3));
        let idle = (cpu_ticks(pid) - c0) as f64 / t0.elapsed().as_secs_f64();
        for (gzip, out) in [(false, &mut cpu_plain), (true, &mut cpu_gzip)] {
            let (t0, c0) = (Instant::now(), cpu_ticks(pid));
            for _ in 0..SCRAPES {
                scrape(admin, gzip);
            }
            let secs = t0.elapsed().as_secs_f64();
            let ticks = (cpu_ticks(pid) - c0) as f64 - idle * secs;
            out.push(ticks / hz / SCRAPES as f64 * 1e3);
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    // Each level on this text, in this process (the agent uses level 1).
    let mut levels = Vec::new();
    for level in [1u32, 6, 9] {
        let reps = 200;
        let t0 = Instant::now();
        let mut size = 0;
        for _ in 0..reps {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(level));
            e.write_all(&plain).unwrap();
            size = e.finish().unwrap().len();
        }
        levels.push((level, size, t0.elapsed().as_secs_f64() / reps as f64 * 1e6));
    }
    println!(
        "## `/metrics` with gzip (`cargo bench --features fake-driver --bench metrics_gzip`)\n"
    );
    println!(
        "Machine: {} cores. Agent: release build, 16 fake NPUs, 2 idle fake engines; admin `/metrics` (every engine and NPU); {ROUNDS} alternating rounds of {SCRAPES} scrapes each, a new connection per scrape; CPU from `/proc/<agent>/stat` less the idle rate, medians.\n",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    println!("| scrape | bytes | agent CPU per scrape |");
    println!("|---|---:|---:|");
    println!(
        "| plain text | {} | {:.3} ms |",
        plain.len(),
        median(&cpu_plain)
    );
    println!(
        "| `Accept-Encoding: gzip` (level 1) | {} ({:.1} %) | {:.3} ms |",
        zipped.len(),
        zipped.len() as f64 / plain.len() as f64 * 100.0,
        median(&cpu_gzip)
    );
    println!("\nThe same text, each level, in the bench process:\n");
    println!("| level | bytes | time per compression |");
    println!("|---|---:|---:|");
    for (level, size, us) in levels {
        println!("| {level} | {size} | {us:.0} µs |");
    }
}

//! The stopped-process rule's cost (issue 40): what one look at the engine's processes
//! through `/proc` costs, and so what the agent policy's process task costs a core at its
//! defaults (a sample every `PROCESS_PERIOD`, the full look-up every `Watch::RECHECK`).
//!
//! `cargo bench --bench process`. The engine is stood in for by this process (it listens on
//! a port) with `CHILDREN` children (`sleep`), as vLLM's API server has its `EngineCore`
//! and workers. The full look-up reads every process's open files, so its cost grows with
//! the host's processes: the figure is printed with their count. Then the same with
//! `MANY` more descriptors open in this process (issue 48: a watched process with 1 M of
//! them cost 47 % of a core): a look-up reads at most `Watch::SCAN_BUDGET` entries per
//! sample, so one sample's budget is the most it costs per period.

use npu_health_agent::monitor::evidence::processes::PROCESS_PERIOD;
use npu_health_agent::probe::process::{Lookup, Watch, lookup, states_of};
use npu_health_agent::proc_sockets::{ProcRoot, Scan};
use std::time::{Duration, Instant};

const CHILDREN: usize = 4;
const ROUNDS: u32 = 2000;
const WATCH: Duration = Duration::from_secs(30);
/// Descriptors opened for the second part (below the usual limit of open files).
const MANY: usize = 16_000;

fn cpu_ns() -> u128 {
    // This thread's CPU time (the look is synchronous on it).
    let t = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
    t.split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn per_call(f: &mut dyn FnMut(), rounds: u32) -> Duration {
    let cpu = cpu_ns();
    for _ in 0..rounds {
        f();
    }
    let used = cpu_ns().saturating_sub(cpu);
    Duration::from_nanos((used / u128::from(rounds)) as u64)
}

fn main() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut children: Vec<_> = (0..CHILDREN)
        .map(|_| {
            std::process::Command::new("sleep")
                .arg("600")
                .spawn()
                .unwrap()
        })
        .collect();
    let root = ProcRoot::default();
    let processes = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.parse::<u32>().is_ok())
        })
        .count();
    let found = lookup(&root, "127.0.0.1", port);
    let Lookup::Found { states, .. } = &found else {
        panic!("not found: {found:?}");
    };
    let pids: Vec<u32> = states.iter().map(|(p, ..)| *p).collect();
    let full = per_call(&mut || drop(lookup(&root, "127.0.0.1", port)), ROUNDS / 10);
    let sample = per_call(&mut || drop(states_of(&root, &pids)), ROUNDS);
    // The watch as the agent runs it, in real time: one sample every PROCESS_PERIOD for
    // `WATCH` (its re-checks of the known listener included), the thread's CPU over that time.
    let mut watch = Watch::new(root.clone(), "127.0.0.1", port);
    drop(watch.sample());
    let (start, cpu) = (Instant::now(), cpu_ns());
    while start.elapsed() < WATCH {
        drop(watch.sample());
        std::thread::sleep(PROCESS_PERIOD);
    }
    let used = cpu_ns().saturating_sub(cpu) as f64;
    let cost = used / start.elapsed().as_nanos() as f64 * 100.0;
    let full_share = full.as_secs_f64() / Watch::GIVE_UP_EVERY.as_secs_f64() * 100.0;
    println!("## The stopped-process rule (`cargo bench --bench process`)\n");
    println!(
        "Host: {processes} processes; the engine: {} processes (a listener and {CHILDREN} children).\n",
        pids.len()
    );
    println!("| look | CPU per call |");
    println!("|---|---|");
    println!("| full look-up (`net/tcp`, every process's open files) | {full:?} |");
    println!("| a sample of the known tree (`stat` files) | {sample:?} |");
    println!(
        "\nThe watch at the defaults (a sample every {PROCESS_PERIOD:?}, the known listener checked again every {:?}), over {WATCH:?}: {cost:.4} % of one core.",
        Watch::RECHECK
    );
    println!(
        "An engine out of sight (a full look-up every {:?} at most): {full_share:.4} % of one core.",
        Watch::GIVE_UP_EVERY
    );
    // Many descriptors: one budget's worth of a look-up, and a whole one.
    let held: Vec<std::fs::File> = (0..MANY)
        .map_while(|_| std::fs::File::open("/dev/null").ok())
        .collect();
    let step = per_call(
        &mut || {
            // An inode nobody holds: the step reads its whole budget.
            let mut scan = Scan::new(&root, std::collections::BTreeSet::from([u64::MAX]));
            let _ = scan.step(Watch::SCAN_BUDGET);
        },
        200,
    );
    let full_many = per_call(&mut || drop(lookup(&root, "127.0.0.1", port)), 5);
    println!(
        "\nWith {} more descriptors open in the engine's stand-in: a full look-up {full_many:?}; one sample's budget ({} entries) {step:?}, {:.2} % of one core per {PROCESS_PERIOD:?} at most while a look-up runs.",
        held.len(),
        Watch::SCAN_BUDGET,
        step.as_secs_f64() / PROCESS_PERIOD.as_secs_f64() * 100.0
    );
    drop(held);
    for c in &mut children {
        let _ = c.kill();
        let _ = c.wait();
    }
    drop(listener);
}

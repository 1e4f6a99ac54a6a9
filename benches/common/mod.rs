//! What the benchmarks that run the agent as a process share: fake engines, a free port, the
//! agent's config (two engines of 8 NPUs each), the agent spawned on the fake driver, a
//! minimal HTTP GET, and a process's CPU time. Each bench includes it with `mod common;`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A scenario of 16 fake NPUs whose AI Cube figure is a square wave.
pub const SCENARIO_16: &str = "model = \"910B\"\ncards = 16\n[default]\naicube = { square = { high = 70, low = 2, width_ms = 300, period_ms = 1300 } }\n";

/// The agent binary this bench was built with.
pub fn agent_exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_npu-health-agent"))
}

/// A scratch directory with [`SCENARIO_16`] written in it, and the scenario's path.
pub fn scenario_16() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("scenario.toml");
    std::fs::write(&scenario, SCENARIO_16).unwrap();
    (dir, scenario)
}

/// The middle value of `v` (the upper one of an even count).
pub fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub struct FakeEngine {
    child: Child,
    pub port: u16,
}

impl FakeEngine {
    pub fn start(agent: &Path) -> FakeEngine {
        let (port, control) = (free_port(), free_port());
        let child = npu_health_agent::fake::engine_command(agent, port, control, "m", &[])
            .spawn()
            .unwrap();
        wait_for(
            &format!("http://127.0.0.1:{port}/health"),
            |_| true,
            Duration::from_secs(10),
        );
        FakeEngine { child, port }
    }
}

impl Drop for FakeEngine {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The agent's config: `agent_extra` in `[agent]`, `engine_extra` at the end of each
/// `[[engine]]`, engine `a` on NPUs 0–7 at `m1`, `b` on 8–15 at `m2`.
pub fn write_config_with(
    dir: &Path,
    name: &str,
    engines: &[FakeEngine],
    (m1, m2): (u16, u16),
    agent_extra: &str,
    engine_extra: &str,
) -> std::path::PathBuf {
    let engine = |n: &str, port: u16, mgmt: u16, devices: &str| {
        format!(
            "[[engine]]\nname = \"{n}\"\nengine_type = \"vllm\"\nserved_model_name = \"m\"\nhost = \"127.0.0.1\"\nport = {port}\nmgmt_port = {mgmt}\ndevices = {devices}\nengine_env = {{ ASCEND_GLOBAL_LOG_LEVEL = \"3\" }}\n[engine.health_check_config]\nenable_virtual_inference = true\n{engine_extra}"
        )
    };
    let text = format!(
        "[agent]\n{agent_extra}\n{}\n{}",
        engine("a", engines[0].port, m1, "[0, 1, 2, 3, 4, 5, 6, 7]"),
        engine("b", engines[1].port, m2, "[8, 9, 10, 11, 12, 13, 14, 15]")
    );
    let p = dir.join(format!("{name}.toml"));
    std::fs::write(&p, text).unwrap();
    p
}

pub fn spawn_agent(agent: &Path, toml: &Path, scenario: &Path) -> Child {
    Command::new(agent)
        .args(["--fake", "run", "--config"])
        .arg(toml)
        .env("FAKE_NPU_SCENARIO", scenario)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// [`spawn_agent`], returned once `/status` on `mgmt` reads normal and 5 s more have passed
/// (the start's own work done).
pub fn spawn_agent_settled(agent: &Path, toml: &Path, scenario: &Path, mgmt: u16) -> Child {
    let child = spawn_agent(agent, toml, scenario);
    wait_for(
        &format!("http://127.0.0.1:{mgmt}/status"),
        |b| b.contains("normal"),
        Duration::from_secs(30),
    );
    std::thread::sleep(Duration::from_secs(5));
    child
}

/// Minimal HTTP GET over a real socket; `None` until something answers.
pub fn get(url: &str) -> Option<String> {
    use std::io::{Read, Write};
    let rest = url.strip_prefix("http://")?;
    let (authority, path) = rest.split_once('/')?;
    let mut s = std::net::TcpStream::connect(authority).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET /{path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())
}

pub fn wait_for(url: &str, ok: impl Fn(&str) -> bool, limit: Duration) {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if get(url).is_some_and(|b| ok(&b)) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("{url} did not answer as expected within {limit:?}");
}

/// A process's CPU time so far, in clock ticks (`utime + stime` of `/proc/<pid>/stat`).
pub fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// Clock ticks per second (`getconf CLK_TCK`; 100 where it cannot be read).
pub fn ticks_per_second() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok()?.trim().parse().ok())
        .unwrap_or(100.0)
}

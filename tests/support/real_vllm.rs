//! A real vLLM for the tests, through the project's own `scripts/real-vllm` (docs/real-vllm.md):
//! started on a free loopback port, its process IDs read from the script's output, stopped
//! by PID when dropped. Tests using it run only with `NPU_HEALTH_REAL_VLLM=1` (after
//! `scripts/real-vllm install`) and otherwise print why they skipped.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// The environment variable that turns the real-engine tests on.
pub const ENV: &str = "NPU_HEALTH_REAL_VLLM";

/// Whether the real-engine tests run; prints the reason when they do not.
pub fn enabled(test: &str) -> bool {
    if std::env::var(ENV).as_deref() == Ok("1") {
        return true;
    }
    println!(
        "skipped {test}: set {ENV}=1 (after scripts/real-vllm install) to run it against a real vLLM"
    );
    false
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/real-vllm")
}

/// A running `vllm serve` started by `scripts/real-vllm up`.
pub struct RealVllm {
    pub name: String,
    pub port: u16,
    pub api_pid: u32,
    pub engine_core_pid: u32,
    pub worker_pid: u32,
    pub log: PathBuf,
}

impl RealVllm {
    /// `scripts/real-vllm up --name <name> [args…]`; panics with the script's output if it
    /// fails.
    pub fn up(name: &str, args: &[&str]) -> RealVllm {
        let out = Command::new(script())
            .args(["up", "--name", name])
            .args(args)
            .output()
            .expect("run scripts/real-vllm");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "scripts/real-vllm up failed ({}):\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let kv: HashMap<&str, &str> = stdout.lines().filter_map(|l| l.split_once('=')).collect();
        let num = |k: &str| -> u32 {
            kv.get(k)
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{k} missing from scripts/real-vllm up:\n{stdout}"))
        };
        RealVllm {
            name: name.to_owned(),
            port: num("port") as u16,
            api_pid: num("api_pid"),
            engine_core_pid: num("engine_core_pid"),
            worker_pid: num("worker_pid"),
            log: PathBuf::from(kv.get("log").copied().unwrap_or_default()),
        }
    }

    /// Base URL of its OpenAI server.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The file `scripts/real-vllm` keeps the Worker's PID in (rewritten by a new `up`).
    pub fn worker_pid_file(&self) -> PathBuf {
        state_dir().join("run").join(&self.name).join("worker_pid")
    }

    /// Whether the API server process is still alive.
    pub fn api_alive(&self) -> bool {
        Path::new(&format!("/proc/{}", self.api_pid)).exists()
            && !std::fs::read_to_string(format!("/proc/{}/stat", self.api_pid))
                .is_ok_and(|s| s.split_whitespace().nth(2) == Some("Z"))
    }

    /// Stops it (`scripts/real-vllm down`).
    pub fn down(&self) {
        let _ = Command::new(script())
            .args(["down", "--name", &self.name])
            .output();
    }

    /// Waits until the API server has exited by itself.
    pub fn wait_exit(&self, limit: Duration) -> bool {
        let end = std::time::Instant::now() + limit;
        while std::time::Instant::now() < end {
            if !self.api_alive() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    }
}

impl Drop for RealVllm {
    fn drop(&mut self) {
        self.down();
    }
}

/// `REAL_VLLM_HOME`, else `target/real-vllm`.
fn state_dir() -> PathBuf {
    std::env::var_os("REAL_VLLM_HOME").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("target/real-vllm"),
        PathBuf::from,
    )
}

/// Sends `sig` to `pid` (`kill -<sig>`).
pub fn signal(pid: u32, sig: &str) {
    let st = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(st.success(), "kill -{sig} {pid}");
}

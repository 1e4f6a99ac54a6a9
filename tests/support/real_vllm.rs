//! A real vLLM for the tests, through the project's own `scripts/real-vllm` (docs/real-vllm.md):
//! started on a free loopback port, its process IDs read from the script's output, stopped
//! by PID when dropped. Tests using it run only with `NPU_HEALTH_REAL_VLLM=1` (after
//! `scripts/real-vllm install`) and otherwise print why they skipped.

use npu_chaos::real_engine::{self, RealEngine};
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

/// A running `vllm serve` started by `scripts/real-vllm up`, stopped when dropped. Its
/// figures (port, PIDs, state directory) are the chaos runner's [`RealEngine`], read from the
/// script's output the same way.
pub struct RealVllm(RealEngine);

impl std::ops::Deref for RealVllm {
    type Target = RealEngine;
    fn deref(&self) -> &RealEngine {
        &self.0
    }
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
        RealVllm(RealEngine::from_up(&script(), name, &out).unwrap_or_else(|e| panic!("{e}")))
    }

    /// The fault plugin's stuck file (`up --fault-plugin` puts it in the instance's state
    /// directory): while it exists the Worker's model step does not return.
    pub fn stuck_file(&self) -> PathBuf {
        self.state.join("stuck")
    }

    /// Base URL of its OpenAI server.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Whether the API server process is still alive.
    pub fn api_alive(&self) -> bool {
        real_engine::running(self.api_pid)
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

/// Sends `sig` to `pid` (`kill -<sig>`).
pub fn signal(pid: u32, sig: &str) {
    let st = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(st.success(), "kill -{sig} {pid}");
}

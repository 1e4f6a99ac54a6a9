//! Test support: paths of the fakes built with the agent, scenario files, running the agent
//! binary, and running a test body in a fresh process (so each test can give the fake driver
//! its own scenario through the environment, as production gives the real one its config).
#![allow(dead_code)]

pub mod clusterd;
#[cfg(feature = "fake-driver")]
pub mod fake_engine;
pub mod kube_api;
pub mod load;
pub mod pod_resources;
pub mod prometheus;
pub mod promql;
#[cfg(feature = "fake-driver")]
pub mod real_vllm;
pub mod routers;
pub mod stack;
#[cfg(feature = "fake-driver")]
pub mod views;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A fake-driver scenario with one 910B NPU whose AI Cube figure is the file `npu0` in
/// `dir` (written as 0); returns the scenario's path.
pub fn one_npu_scenario(dir: &Path) -> PathBuf {
    std::fs::write(dir.join("npu0"), "0\n").expect("npu0");
    let scenario = dir.join("scenario.toml");
    std::fs::write(
        &scenario,
        "model = \"910B\"\ncards = 1\n[[device]]\nid = 0\naicube = { file = \"npu0\" }\n",
    )
    .expect("scenario");
    scenario
}

/// The agent binary under test (a fake-driver build also acts as the fake npu-smi).
pub fn agent() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_npu-health-agent"))
}

/// Fake libdcmi.so of a current driver.
pub fn fake_lib() -> PathBuf {
    npu_health_agent::fake::lib_path(npu_health_agent::fake::FAKE_LIB)
        .expect("fake libdcmi.so built")
}

/// Fake libdcmi.so of an older driver (no AI Cube symbols).
pub fn fake_legacy_lib() -> PathBuf {
    npu_health_agent::fake::lib_path(npu_health_agent::fake::FAKE_LEGACY_LIB)
        .expect("fake legacy libdcmi.so built")
}

/// A scenario file in its own temporary directory.
pub struct Scenario {
    pub dir: tempfile::TempDir,
    pub path: PathBuf,
}

/// Writes `text` as a scenario file.
pub fn scenario(text: &str) -> Scenario {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("scenario.toml");
    std::fs::write(&path, text).expect("write scenario");
    Scenario { dir, path }
}

/// Runs the agent with the fake npu-smi, the owner check off and the scenario; `lib` picks
/// the fake library (`None` runs without one).
pub fn run_agent(sc: &Scenario, lib: Option<&Path>, args: &[&str]) -> Output {
    let mut cmd = Command::new(agent());
    cmd.env("FAKE_NPU_SCENARIO", &sc.path)
        .env_remove("LD_LIBRARY_PATH")
        .env("RUST_LOG", "info")
        .arg("--npu-smi")
        .arg(agent())
        .arg("--dcmi-no-owner-check");
    match lib {
        Some(l) => {
            cmd.arg("--dcmi-lib").arg(l);
        }
        // No library anywhere: point the explicit path at nothing so discovery fails.
        None => {
            cmd.arg("--dcmi-lib")
                .arg(sc.dir.path().join("absent-libdcmi.so"));
        }
    }
    cmd.args(args).output().expect("run agent")
}

/// An inline engine (`engine_type = "vllm"`) serving `model` at `host:port`, with `extra`
/// appended to its table (e.g. an `[engine.qos]` table), as the agent parses it.
pub fn engine_spec(
    host: &str,
    port: u16,
    model: &str,
    extra: &str,
) -> npu_health_agent::config::EngineSpec {
    let text = format!(
        "[[engine]]\nengine_type = \"vllm\"\nserved_model_name = \"{model}\"\nhost = \"{host}\"\nport = {port}\nmgmt_port = 9001\n{extra}"
    );
    npu_health_agent::config::file::parse(&text, Path::new("/x/a.toml"))
        .expect("engine spec")
        .engines
        .remove(0)
}

/// The agent's own virtual-request sender for `spec` (the production HTTP client).
pub fn agent_prober(
    spec: &npu_health_agent::config::EngineSpec,
) -> npu_health_agent::probe::http::HttpProber {
    let _ = rustls::crypto::ring::default_provider().install_default();
    npu_health_agent::probe::http::EngineClient::new(spec)
        .expect("engine client")
        .prober(spec)
}

/// Starts `npu-health-agent --fake run --config <toml>` on the fake driver with `scenario`,
/// its log (RUST_LOG=info) in `<dir>/agent.log`.
pub fn spawn_agent(dir: &Path, toml: &Path, scenario: &Path) -> std::process::Child {
    spawn_agent_with(dir, toml, scenario, &[])
}

/// As [`spawn_agent`], with `global` flags (e.g. `--dcmi-lib <path>`) before `run`.
pub fn spawn_agent_with(
    dir: &Path,
    toml: &Path,
    scenario: &Path,
    global: &[std::ffi::OsString],
) -> std::process::Child {
    spawn_agent_logged(toml, scenario, global, &dir.join("agent.log"))
}

/// [`spawn_agent_with`], logging to `log`.
pub fn spawn_agent_logged(
    toml: &Path,
    scenario: &Path,
    global: &[std::ffi::OsString],
    log: &Path,
) -> std::process::Child {
    spawn_agent_env(toml, scenario, global, log, &[])
}

/// [`spawn_agent_logged`], with `env` set for the agent besides (e.g. a `PATH` with py-spy).
pub fn spawn_agent_env(
    toml: &Path,
    scenario: &Path,
    global: &[std::ffi::OsString],
    log: &Path,
    env: &[(&str, std::ffi::OsString)],
) -> std::process::Child {
    Command::new(agent())
        .envs(env.iter().map(|(k, v)| (k, v)))
        .arg("--fake")
        .args(global)
        .args(["run", "--config"])
        .arg(toml)
        .env("FAKE_NPU_SCENARIO", scenario)
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::from(
            std::fs::File::create(log).expect("agent log"),
        ))
        .spawn()
        .expect("start the agent")
}

/// Parses the agent's stdout as JSON, with its stderr in the panic message.
pub fn json(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "agent failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

const CHILD_ENV: &str = "NPU_TEST_CHILD";

/// The calling test's full name as libtest knows it (`<module>::<test>` in an area's test
/// binary), from the name libtest gives the thread a test runs on; `test` is the function's
/// own name, checked against it so that a wrong name fails here rather than in the child.
pub fn full_test_name(test: &str) -> String {
    let thread = std::thread::current();
    let name = thread.name().unwrap_or_default();
    assert!(
        name == test || name.ends_with(&format!("::{test}")),
        "in_child({test:?}) called from the test thread {name:?}: pass the calling test's own name"
    );
    name.to_owned()
}

/// Runs the calling test (named `test`) again in a fresh process with `envs` set. Returns
/// true inside that process, where the caller runs its body; in the parent it waits, checks
/// the child passed, and returns false.
pub fn in_child(test: &str, envs: &[(&str, &Path)]) -> bool {
    let test = full_test_name(test);
    if std::env::var(CHILD_ENV).as_deref() == Ok(test.as_str()) {
        return true;
    }
    let out = Command::new(std::env::current_exe().expect("test exe"))
        .args([test.as_str(), "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, &test)
        .envs(envs.iter().map(|(k, v)| (*k, *v)))
        .output()
        .expect("run test child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "test child {test} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    false
}

/// Figures a test measures, for the log of a run: each line is printed (seen with
/// `--nocapture`) and written to `target/tmp/figures/<test>.txt`, which `.ci/run` prints after
/// the suite. So the suite runs once and its figures still reach CI's log.
pub struct Figures {
    path: PathBuf,
}

impl Figures {
    /// Starts (empties) the figures file of `test`.
    pub fn new(test: &str) -> Self {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("figures");
        std::fs::create_dir_all(&dir).expect("figures dir");
        let path = dir.join(format!("{test}.txt"));
        std::fs::write(&path, "").expect("figures file");
        Figures { path }
    }

    /// Prints `text` and appends it to the file.
    pub fn line(&self, text: impl AsRef<str>) {
        use std::io::Write;
        let text = text.as_ref();
        println!("{text}");
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.path)
            .expect("figures file");
        writeln!(f, "{text}").expect("write a figure");
    }
}

/// Polls `done` every `poll` until it holds; after `limit` panics with `what` and `log()`
/// (the log of whatever the test waits on).
pub fn wait_or_panic(
    what: &str,
    limit: std::time::Duration,
    poll: std::time::Duration,
    log: impl Fn() -> String,
    mut done: impl FnMut() -> bool,
) {
    let end = std::time::Instant::now() + limit;
    while !done() {
        assert!(
            std::time::Instant::now() < end,
            "not within {limit:?}: {what}\n{}",
            log()
        );
        std::thread::sleep(poll);
    }
}

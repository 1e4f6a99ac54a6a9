//! Configuration errors through the binary: `check-config` rejects what `run` rejects, with
//! the same line, and neither blocks on a config file that is not a regular file. The full
//! table of rules is `config::tests`; these cases show the binary takes the same
//! path. Every run has a time limit, so a regression fails instead of hanging.
#![cfg(feature = "fake-driver")]

use crate::support;
use crate::support::stack::{free_ports, http};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The agent on the fake driver (its embedded default: NPUs 0 and 1).
fn agent() -> Command {
    let mut c = Command::new(support::agent());
    c.env_remove("FAKE_NPU_SCENARIO")
        .env_remove("NOTIFY_SOCKET")
        .env_remove("ASCEND_GLOBAL_LOG_LEVEL")
        .arg("--fake");
    c
}

/// How a finished command ended.
struct Ended {
    code: Option<i32>,
    stderr: String,
}

impl Ended {
    /// The last line on stderr: the error, when the command failed.
    fn last_line(&self) -> &str {
        self.stderr.lines().last().unwrap_or_default()
    }
}

/// Runs `cmd` (stderr to a file in `dir`, so a chatty child never blocks on a pipe); kills it
/// and fails the test if it has not exited within `limit`.
fn run_within(mut cmd: Command, dir: &Path, limit: Duration) -> Ended {
    let log = dir.join(format!(
        "stderr-{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let code = wait_exit(&mut child, limit);
    Ended {
        code,
        stderr: std::fs::read_to_string(&log).unwrap_or_default(),
    }
}

fn wait_exit(child: &mut Child, limit: Duration) -> Option<i32> {
    let end = Instant::now() + limit;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s.code();
        }
        if Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the agent did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `check-config` and `run` on `config`.
fn both(config: &Path, dir: &Path) -> (Ended, Ended) {
    let mut check = agent();
    check.args(["check-config", "--config"]).arg(config);
    let mut run = agent();
    run.args(["run", "--config"]).arg(config);
    (
        run_within(check, dir, Duration::from_secs(20)),
        run_within(run, dir, Duration::from_secs(20)),
    )
}

/// An agent.toml with one engine on free ports, and `extra` appended to its table.
fn write_config(dir: &Path, extra: &str) -> PathBuf {
    let [port, mgmt] = free_ports();
    let p = dir.join("agent.toml");
    std::fs::write(
        &p,
        format!(
            "[[engine]]\nname = \"a\"\nengine_type = \"vllm\"\nserved_model_name = \"m\"\nhost = \"127.0.0.1\"\nport = {port}\nmgmt_port = {mgmt}\ndevices = [0, 1]\n{extra}\n"
        ),
    )
    .unwrap();
    p
}

/// The `mgmt_port` [`write_config`] chose.
fn mgmt_port_of(text: &str) -> u16 {
    text.lines()
        .find_map(|l| l.strip_prefix("mgmt_port = "))
        .and_then(|p| p.trim().parse().ok())
        .expect("mgmt_port in the config")
}

fn mkfifo(p: &Path) {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        p,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR,
        0,
    )
    .unwrap();
}

// The three the issue found `check-config` accepting and `run` refusing with an error that
// named neither file nor key: the same line from both now, exit 2, and `run` exits at once.
#[test]
fn check_config_and_run_refuse_the_same_configs_with_the_same_line() {
    let dir = tempfile::tempdir().unwrap();
    for (extra, from, to, want) in [
        (
            "[engine.timing]\nwindow = \"2h\"",
            "",
            "",
            "[[engine]] #1 (a) timing.window: `2h` is outside 50ms..=10m",
        ),
        (
            "mgmt_tls_config = { enable_tls = true, cert_file = \"/nonexistent/server.crt\", key_file = \"/nonexistent/server.key\" }",
            "",
            "",
            "[[engine]] #1 (a) mgmt_tls_config.cert_file: /nonexistent/server.crt cannot read",
        ),
        (
            "",
            "devices = [0, 1]",
            "devices = [0, 7]",
            "[[engine]] #1 (a) devices: NPU 7 is not one the driver reports; NPUs found: [0, 1]",
        ),
    ] {
        let config = write_config(dir.path(), extra);
        let text = std::fs::read_to_string(&config).unwrap();
        std::fs::write(&config, text.replace(from, to)).unwrap();
        let started = Instant::now();
        let (check, run) = both(&config, dir.path());
        assert_eq!(check.code, Some(2), "check-config: {}", check.stderr);
        assert_eq!(run.code, Some(2), "run: {}", run.stderr);
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "both exit promptly"
        );
        assert!(check.last_line().contains(want), "{want}\n{}", check.stderr);
        assert_eq!(check.last_line(), run.last_line(), "{}", run.stderr);
        assert!(
            check
                .last_line()
                .starts_with(&format!("npu-health-agent: {}: ", config.display())),
            "{}",
            check.last_line()
        );
    }
}

// A few rules of the table through the binary, one per kind: a type error, a key set twice,
// a bound, an address that points at the agent, a control character in a name, an empty
// NPU list.
#[test]
fn check_config_names_the_table_the_key_and_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    let base = write_config(dir.path(), "");
    let text = std::fs::read_to_string(&base).unwrap();
    let mgmt_line = text.lines().find(|l| l.starts_with("mgmt_port")).unwrap();
    let mgmt = mgmt_line.trim_start_matches("mgmt_port = ").to_owned();
    let port_line = text.lines().find(|l| l.starts_with("port")).unwrap();
    for (from, to, want) in [
        (
            port_line,
            "port = \"abc\"".to_owned(),
            "[[engine]] #1 (a) port: invalid type: string \"abc\", expected u16",
        ),
        (
            port_line,
            format!("{port_line}\n{port_line}"),
            "[[engine]] #1 (a) port: duplicate key",
        ),
        (
            "devices = [0, 1]",
            "devices = [0, 1]\n[engine.timing]\nhealth_period = \"1ns\"".to_owned(),
            "[[engine]] #1 (a) timing.health_period: `1ns` is outside 50ms..=1m",
        ),
        (
            port_line,
            format!("port = {mgmt}"),
            "[[engine]] #1 (a) port: ",
        ),
        (
            "name = \"a\"",
            "name = \"a\\nb\"".to_owned(),
            "[[engine]] #1 (a\\nb) name: \"a\\nb\" contains the control character U+000A",
        ),
        (
            "devices = [0, 1]",
            "devices = []".to_owned(),
            "[[engine]] #1 (a) devices: 0 NPUs is outside 1..=256",
        ),
    ] {
        std::fs::write(&base, text.replacen(from, &to, 1)).unwrap();
        let mut check = agent();
        check.args(["check-config", "--config"]).arg(&base);
        let out = run_within(check, dir.path(), Duration::from_secs(20));
        assert_eq!(out.code, Some(2), "{}", out.stderr);
        assert!(out.last_line().contains(want), "{want}\n{}", out.stderr);
    }
}

// A FIFO as the config wedged the loader (open blocks until a writer appears); /dev/zero was
// read without end. Both, and a FIFO or /dev/zero as MindIE's files, are refused at once.
#[test]
fn fifos_and_dev_zero_are_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("agent.toml");
    mkfifo(&fifo);
    for config in [fifo.as_path(), Path::new("/dev/zero")] {
        let (check, run) = both(config, dir.path());
        for (what, e) in [("check-config", &check), ("run", &run)] {
            assert_eq!(e.code, Some(2), "{what}: {}", e.stderr);
            assert!(
                e.last_line().contains("not a regular file"),
                "{what}: {}",
                e.stderr
            );
        }
    }
    // Single-engine mode: user_config.json a FIFO, then env.json /dev/zero.
    let uc = dir.path().join("user_config.json");
    let flags = [
        "--role",
        "prefill",
        "--host",
        "127.0.0.1",
        "--port",
        "8000",
        "--mgmt-port",
        "9001",
    ];
    let mut cmd = agent();
    cmd.args(["check-config", "--config-path"])
        .arg(&fifo)
        .args(flags);
    let e = run_within(cmd, dir.path(), Duration::from_secs(20));
    assert_eq!(e.code, Some(2), "{}", e.stderr);
    assert!(e.last_line().contains("is a FIFO"), "{}", e.stderr);
    std::fs::write(
        &uc,
        r#"{"motor_engine_prefill_config": {"engine_type": "vllm", "engine_config": {"served_model_name": "m"}}}"#,
    )
    .unwrap();
    let mut cmd = agent();
    cmd.args(["run", "--config-path"])
        .arg(&uc)
        .args(flags)
        .args(["--env-config-path", "/dev/zero"]);
    let e = run_within(cmd, dir.path(), Duration::from_secs(20));
    assert_eq!(e.code, Some(2), "{}", e.stderr);
    assert!(
        e.last_line().contains("/dev/zero: is a character device"),
        "{}",
        e.stderr
    );
}

// The reload the issue saw wedge: the config replaced by a FIFO, then SIGHUP. The reload is
// rejected (the previous configuration keeps serving), and SIGTERM still stops the agent.
#[test]
fn sighup_with_a_fifo_as_the_config_is_rejected_and_sigterm_still_stops() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "");
    let text = std::fs::read_to_string(&config).unwrap();
    let mgmt = mgmt_port_of(&text);
    let log = dir.path().join("agent.log");
    let mut child = agent()
        .args(["run", "--config"])
        .arg(&config)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let status = || http("GET", &format!("http://127.0.0.1:{mgmt}/status"), None);
    let wait = |what: &str, f: &dyn Fn() -> bool| {
        let end = Instant::now() + Duration::from_secs(20);
        while !f() {
            assert!(Instant::now() < end, "{what}\n{}", read_log());
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    wait("serving", &|| status().is_some());
    std::fs::remove_file(&config).unwrap();
    mkfifo(&config);
    let pid = rustix::process::Pid::from_child(&child);
    rustix::process::kill_process(pid, rustix::process::Signal::HUP).unwrap();
    wait("the rejection", &|| {
        read_log().contains("configuration rejected")
    });
    assert!(read_log().contains("is a FIFO"), "{}", read_log());
    assert!(
        status().is_some(),
        "the previous configuration still serves"
    );
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let code = wait_exit(&mut child, Duration::from_secs(15));
    assert_eq!(code, Some(0), "{}", read_log());
}

/// `run` on `config`, its stderr (at `info`) in `log`; killed if the test fails before it
/// stopped, so a wedged agent never outlives its test.
struct Running {
    child: Child,
    log: PathBuf,
}

impl Running {
    fn start(config: &Path, log: PathBuf) -> Running {
        let child = agent()
            .args(["run", "--config"])
            .arg(config)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Running { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits up to a generous limit for `f`; fails with the log if it never holds.
    fn wait(&self, what: &str, f: impl Fn(&str) -> bool) {
        let end = Instant::now() + Duration::from_secs(20);
        while !f(&self.log()) {
            assert!(Instant::now() < end, "{what}\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn signal(&self, sig: rustix::process::Signal) {
        rustix::process::kill_process(rustix::process::Pid::from_child(&self.child), sig).unwrap();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// [`write_config`] with `[agent] fault_code_file = table`.
fn write_config_with_table(dir: &Path, table: &Path) -> PathBuf {
    let config = write_config(dir, "");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        format!("[agent]\nfault_code_file = {table:?}\n\n{text}"),
    )
    .unwrap();
    config
}

// Issue 41: a FIFO as faultCode.json hung check-config, and `run` before it bound a port.
// check-config fails with the file and why; `run` starts on the built-in table, says why,
// serves, and stops at SIGTERM.
#[test]
fn a_fifo_as_the_fault_code_file_fails_check_config_and_run_starts_without_it() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("faultCode.json");
    mkfifo(&table);
    let config = write_config_with_table(dir.path(), &table);
    let mut check = agent();
    check.args(["check-config", "--config"]).arg(&config);
    let e = run_within(check, dir.path(), Duration::from_secs(30));
    assert_eq!(e.code, Some(2), "{}", e.stderr);
    let want = format!(
        "[agent] fault_code_file: {}: is a FIFO, not a regular file",
        table.display()
    );
    assert!(e.last_line().contains(&want), "{want}\n{}", e.stderr);

    let mgmt = mgmt_port_of(&std::fs::read_to_string(&config).unwrap());
    let mut run = Running::start(&config, dir.path().join("agent.log"));
    run.wait("serving", |_| {
        http("GET", &format!("http://127.0.0.1:{mgmt}/status"), None).is_some()
    });
    assert!(
        run.log().contains(&want) && run.log().contains("using the built-in"),
        "{}",
        run.log()
    );
    stops_on_sigterm(&mut run);
}

/// SIGTERM stops `run`, with exit 0, within 15 s.
fn stops_on_sigterm(run: &mut Running) {
    run.signal(rustix::process::Signal::TERM);
    assert_eq!(
        wait_exit(&mut run.child, Duration::from_secs(15)),
        Some(0),
        "{}",
        run.log()
    );
}

// Issue 41: faultCode.json replaced by a FIFO, then SIGHUP, left the main loop stuck for
// good (SIGTERM and SIGHUP ignored). The reload goes through, the table in force stays with a
// warning that names the file and why, /status still answers, a second SIGHUP is handled, and
// SIGTERM stops the agent.
#[test]
fn sighup_with_a_fifo_as_the_fault_code_file_keeps_the_table_and_sigterm_still_stops() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("faultCode.json");
    std::fs::write(
        &table,
        r#"{"SeparateNPUCodes": ["80E18402"], "RestartBusinessCodes": ["80E01801"]}"#,
    )
    .unwrap();
    let config = write_config_with_table(dir.path(), &table);
    let mgmt = mgmt_port_of(&std::fs::read_to_string(&config).unwrap());
    let status = || http("GET", &format!("http://127.0.0.1:{mgmt}/status"), None);
    let mut run = Running::start(&config, dir.path().join("agent.log"));
    run.wait("serving", |_| status().is_some());
    let origin = format!("{} (2 codes)", table.display());
    assert!(run.log().contains(&origin), "{}", run.log());
    std::fs::remove_file(&table).unwrap();
    mkfifo(&table);
    run.signal(rustix::process::Signal::HUP);
    run.wait("the reload", |l| l.contains("configuration reloaded"));
    let warning = run
        .log()
        .lines()
        .find(|l| l.contains("is a FIFO"))
        .map(str::to_owned)
        .unwrap_or_else(|| panic!("no line says why:\n{}", run.log()));
    assert!(
        warning.contains("WARN")
            && warning.contains(&format!("[agent] fault_code_file: {}", table.display()))
            && warning.contains(&format!(
                "the levels in force, read before from {}, are kept",
                table.display()
            )),
        "{warning}"
    );
    assert!(status().is_some(), "/status still answers");
    run.signal(rustix::process::Signal::HUP);
    run.wait("the second reload", |l| {
        l.matches("configuration reloaded").count() == 2
    });
    stops_on_sigterm(&mut run);
}

// With no driver backend `run` starts anyway (without NPU figures), so check-config does not
// fail on the NPUs it cannot check; it says so.
#[test]
fn without_a_driver_check_config_says_the_npus_were_not_checked() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, text.replace("[0, 1]", "[0, 7]")).unwrap();
    let mut cmd = Command::new(support::agent());
    cmd.env_remove("LD_LIBRARY_PATH")
        .arg("--dcmi-lib")
        .arg(dir.path().join("absent-libdcmi.so"))
        .arg("--npu-smi")
        .arg(dir.path().join("absent-npu-smi"))
        .args(["check-config", "--config"])
        .arg(&config);
    let e = run_within(cmd, dir.path(), Duration::from_secs(30));
    assert_eq!(e.code, Some(0), "{}", e.stderr);
    assert!(
        e.stderr
            .contains("NPUs not checked: no usable driver backend"),
        "{}",
        e.stderr
    );
}

// MindCluster's faultCode.json: a malformed one (a bad entry, a key written twice, no code
// at all) fails check-config with the key and what is wrong; a good one is named with its count, and lists the agent does not know are named.
#[test]
fn check_config_reads_the_fault_code_table_and_names_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("faultCode.json");
    let config = write_config(dir.path(), "");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        format!("[agent]\nfault_code_file = {table:?}\n\n{text}"),
    )
    .unwrap();
    let check = || {
        let mut cmd = agent();
        cmd.args(["check-config", "--config"]).arg(&config);
        run_within(cmd, dir.path(), Duration::from_secs(30))
    };
    std::fs::write(&table, r#"{"SeparateNPUCodes": ["80E18402", "nope"]}"#).unwrap();
    let bad = check();
    assert_eq!(bad.code, Some(2), "{}", bad.stderr);
    assert!(
        bad.last_line().contains("[agent] fault_code_file")
            && bad
                .last_line()
                .contains("\"SeparateNPUCodes\"[1] is \"nope\", not a hex code"),
        "{}",
        bad.stderr
    );
    // Issue 41: two lists under one key, and a table of empty lists, passed.
    for (text, want) in [
        (
            r#"{"SeparateNPUCodes": ["80E18402"], "SeparateNPUCodes": ["80E3A201"]}"#,
            "\"SeparateNPUCodes\" is written twice",
        ),
        (
            r#"{"SeparateNPUCodes": [], "RestartNPUCodes": []}"#,
            "every list is empty (SeparateNPUCodes, RestartNPUCodes)",
        ),
    ] {
        std::fs::write(&table, text).unwrap();
        let bad = check();
        assert_eq!(bad.code, Some(2), "{}", bad.stderr);
        assert!(
            bad.last_line().contains("[agent] fault_code_file") && bad.last_line().contains(want),
            "{want}\n{}",
            bad.stderr
        );
    }
    std::fs::write(
        &table,
        r#"{"SeparateNPUCodes": ["80E18402"], "RestartBusinessCodes": ["80E01801"], "SwitchFaultCodes": []}"#,
    )
    .unwrap();
    let good = check();
    assert_eq!(good.code, Some(0), "{}", good.stderr);
    let want = format!(
        "fault-code levels from {} (2 codes; lists not read: SwitchFaultCodes)",
        table.display()
    );
    assert!(good.stderr.contains(&want), "{want}\n{}", good.stderr);
    std::fs::remove_file(&table).unwrap();
    let missing = check();
    assert_eq!(
        missing.code,
        Some(2),
        "a named file must exist: {}",
        missing.stderr
    );
}

// Issue 28: check-config binds every listener as `run` will, and names the key: a mgmt_port
// another process holds, and a host that is not an address of this host (the README's
// example had `host = "10.0.0.5"`; 192.0.2.1 is TEST-NET-1, on no host). `run` names the
// file and the key too.
#[test]
fn check_config_binds_every_listener_and_names_the_key() {
    let dir = tempfile::tempdir().unwrap();
    // The free port may be taken by a test running beside this one before it is held here:
    // choose again until this test holds it.
    let (config, mgmt, held) = loop {
        let config = write_config(dir.path(), "");
        let mgmt = mgmt_port_of(&std::fs::read_to_string(&config).unwrap());
        if let Ok(held) = std::net::TcpListener::bind(("127.0.0.1", mgmt)) {
            break (config, mgmt, held);
        }
    };
    let text = std::fs::read_to_string(&config).unwrap();
    let mut check = agent();
    check.args(["check-config", "--config"]).arg(&config);
    let check = run_within(check, dir.path(), Duration::from_secs(20));
    assert_eq!(check.code, Some(2), "{}", check.stderr);
    let want = format!(
        "[[engine]] #1 (a) mgmt_port: cannot listen on 127.0.0.1:{mgmt} for engine a's /status"
    );
    assert!(
        check.last_line().contains(&want) && check.last_line().contains("in use"),
        "{want}\n{}",
        check.stderr
    );
    let mut run = agent();
    run.args(["run", "--wait-for-ports", "1s", "--config"])
        .arg(&config);
    let run = run_within(run, dir.path(), Duration::from_secs(20));
    assert_ne!(run.code, Some(0), "{}", run.stderr);
    assert!(
        run.last_line().contains(&format!(
            "{}: [[engine]] #1 (a) mgmt_port: engine a's /status: cannot listen on 127.0.0.1:{mgmt}",
            config.display()
        )),
        "{}",
        run.stderr
    );
    drop(held);

    std::fs::write(
        &config,
        text.replace("host = \"127.0.0.1\"", "host = \"192.0.2.1\""),
    )
    .unwrap();
    let (check, run) = both(&config, dir.path());
    assert_eq!(check.code, Some(2), "{}", check.stderr);
    assert!(
        check.last_line().contains(&format!(
            "[[engine]] #1 (a) mgmt_host: cannot listen on 192.0.2.1:{mgmt} for engine a's /status"
        )) && check
            .last_line()
            .contains("192.0.2.1 is not an address of this host"),
        "{}",
        check.stderr
    );
    assert_ne!(run.code, Some(0), "{}", run.stderr);
    assert!(
        run.last_line().contains("mgmt_port")
            && run
                .last_line()
                .contains("192.0.2.1 is not an address of this host"),
        "{}",
        run.stderr
    );
    // Free, the same file passes.
    std::fs::write(&config, &text).unwrap();
    let mut check = agent();
    check.args(["check-config", "--config"]).arg(&config);
    let check = run_within(check, dir.path(), Duration::from_secs(20));
    assert_eq!(check.code, Some(0), "{}", check.stderr);
}

// A config whose ports the agent already running (same state directory) holds passes: a new
// agent would take them over. check-config before a reload or a restart keeps working.
#[test]
fn check_config_accepts_ports_held_by_the_running_agent() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let config = write_config(dir.path(), "");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        format!(
            "[agent]\nstate_dir = {:?}\n{text}",
            state.display().to_string()
        ),
    )
    .unwrap();
    let mut run = agent();
    run.args(["run", "--config"])
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = run.spawn().unwrap();
    let end = Instant::now() + Duration::from_secs(20);
    let mgmt = mgmt_port_of(&text);
    while !(state.join("handover.sock").exists()
        && std::net::TcpStream::connect(("127.0.0.1", mgmt)).is_ok())
    {
        assert!(Instant::now() < end, "the agent did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut check = agent();
    check.args(["check-config", "--config"]).arg(&config);
    let ended = run_within(check, dir.path(), Duration::from_secs(20));
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(ended.code, Some(0), "{}", ended.stderr);
    assert!(
        ended
            .stderr
            .contains("is in use by the running agent, which hands it over"),
        "{}",
        ended.stderr
    );
}

// Issue 28: the README's host-mode example is examples/agent.toml, and it runs as written:
// with the user_config.json it names (shipped beside it) and eight fake NPUs, check-config
// passes. (Its ports are swapped for free ones here, so a busy 9001 on the test machine
// cannot fail it.)
#[test]
fn the_readme_host_mode_example_is_shipped_and_passes_check_config() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let start = "One engine (`examples/minimal.toml`; every other key has a default):\n\n```toml\n";
    let from = readme.find(start).expect("the README's shortest config") + start.len();
    let block = &readme[from..from + readme[from..].find("```").unwrap()];
    let minimal = std::fs::read_to_string(root.join("examples/minimal.toml")).unwrap();
    assert_eq!(
        block, minimal,
        "README.md's example differs from examples/minimal.toml"
    );
    let shipped = std::fs::read_to_string(root.join("examples/agent.toml")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let [m] = free_ports();
    let config = dir.path().join("minimal.toml");
    std::fs::write(
        &config,
        minimal.replace("mgmt_port = 9001", &format!("mgmt_port = {m}")),
    )
    .unwrap();
    let mut check = agent();
    check
        .env("FAKE_NPU_SCENARIO", root.join("examples/fake-npus.toml"))
        .args(["check-config", "--config"])
        .arg(&config);
    let ended = run_within(check, dir.path(), Duration::from_secs(20));
    assert_eq!(ended.code, Some(0), "{}", ended.stderr);
    // Issue 48: the shortest config runs virtual inference (on by default in agent.toml),
    // polled from elsewhere; the built-in fault-code table says its count once.
    assert!(!ended.stderr.contains("WARNING"), "{}", ended.stderr);
    assert!(!ended.stderr.contains("loopback"), "{}", ended.stderr);
    let levels = ended
        .stderr
        .lines()
        .find(|l| l.contains("fault-code levels from built-in"))
        .unwrap_or_else(|| panic!("{}", ended.stderr));
    assert_eq!(levels.matches("codes").count(), 1, "{levels}");

    std::fs::copy(
        root.join("examples/user_config.json"),
        dir.path().join("user_config.json"),
    )
    .unwrap();
    let [a, b, admin] = free_ports();
    let text = shipped
        .replace("mgmt_port = 9001", &format!("mgmt_port = {a}"))
        .replace("mgmt_port = 9002", &format!("mgmt_port = {b}"))
        .replace("127.0.0.1:9400", &format!("127.0.0.1:{admin}"));
    assert_ne!(text, shipped);
    let config = dir.path().join("agent.toml");
    std::fs::write(&config, text).unwrap();
    let mut check = agent();
    check
        .env("FAKE_NPU_SCENARIO", root.join("examples/fake-npus.toml"))
        .args(["check-config", "--config"])
        .arg(&config);
    let ended = run_within(check, dir.path(), Duration::from_secs(20));
    assert_eq!(ended.code, Some(0), "{}", ended.stderr);
    assert!(
        ended
            .stderr
            .contains("configuration is valid (2 engine(s))"),
        "{}",
        ended.stderr
    );
}

/// `write_config`'s agent.toml with `[agent] state_dir = dir`.
fn write_config_with_state_dir(dir: &Path, state: &Path) -> PathBuf {
    let config = write_config(dir, "");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        format!(
            "[agent]\nstate_dir = {:?}\n{text}",
            state.display().to_string()
        ),
    )
    .unwrap();
    config
}

/// An unprivileged user for the state directory's owner (made once, kept): its uid and name.
fn unprivileged_user() -> Option<(u32, &'static str)> {
    const NAME: &str = "npuha-test-other";
    let uid = || {
        let out = Command::new("id").args(["-u", NAME]).output().ok()?;
        String::from_utf8(out.stdout).ok()?.trim().parse().ok()
    };
    if let Some(u) = uid() {
        return Some((u, NAME));
    }
    // Another test process may make it at the same moment: its uid is what counts.
    let _ = Command::new("useradd")
        .args([
            "--system",
            "--no-create-home",
            "--shell",
            "/usr/sbin/nologin",
            NAME,
        ])
        .status();
    uid().map(|u| (u, NAME))
}

// Issue 41: a state directory another user could write was trusted whole (that user planted
// the state a healthy engine read as `abnormal`, and a link the root agent wrote through),
// and check-config said nothing. Both refuse it now with the same line, naming the
// directory, what was found and the fix; `run` refuses before it serves.
#[test]
fn check_config_and_run_refuse_a_state_directory_another_user_can_change() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    let config = write_config_with_state_dir(dir.path(), &state);
    let refused = |want: &[String]| {
        let (check, run) = both(&config, dir.path());
        assert_eq!(check.code, Some(2), "check-config: {}", check.stderr);
        assert_eq!(run.code, Some(2), "run: {}", run.stderr);
        assert_eq!(check.last_line(), run.last_line(), "{}", run.stderr);
        let line = check.last_line();
        assert!(
            line.starts_with(&format!(
                "npu-health-agent: {}: [agent] state_dir: the state directory {} ",
                config.display(),
                state.display()
            )),
            "{line}"
        );
        for w in want {
            assert!(line.contains(w.as_str()), "{w:?} in\n{line}");
        }
        assert!(
            !state.join("state.json").exists(),
            "run refused before writing"
        );
    };
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o777)).unwrap();
    refused(&[
        "is writable by its group and all users (mode 0777)".into(),
        format!("`chmod 0700 {}`", state.display()),
    ]);
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o700)).unwrap();
    let mut check = agent();
    check.args(["check-config", "--config"]).arg(&config);
    let check = run_within(check, dir.path(), Duration::from_secs(20));
    assert_eq!(
        check.code,
        Some(0),
        "the agent's own 0700 directory: {}",
        check.stderr
    );
    if !rustix::process::geteuid().is_root() {
        eprintln!("note: not root, so no directory of another user to make; skipped that part");
        return;
    }
    let Some((uid, name)) = unprivileged_user() else {
        eprintln!("note: useradd made no user; skipped the directory of another user");
        return;
    };
    std::os::unix::fs::chown(&state, Some(uid), None).unwrap();
    refused(&[
        format!("is owned by uid {uid} ({name}), not by uid 0 (root) the agent runs as"),
        format!(
            "`chown root {} && chmod 0700 {}`",
            state.display(),
            state.display()
        ),
    ]);
    // Root's own directory in one of that user's: the user can swap it for another.
    std::os::unix::fs::chown(&state, Some(0), None).unwrap();
    let theirs = dir.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(uid), None).unwrap();
    let inner = theirs.join("state");
    std::fs::create_dir(&inner).unwrap();
    let config = write_config_with_state_dir(dir.path(), &inner);
    let (check, run) = both(&config, dir.path());
    assert_eq!((check.code, run.code), (Some(2), Some(2)), "{}", run.stderr);
    assert_eq!(check.last_line(), run.last_line());
    assert!(
        check.last_line().contains(&format!(
            "{}, above the state directory {}, is owned by uid {uid} ({name})",
            theirs.display(),
            inner.display()
        )),
        "{}",
        check.last_line()
    );
}

/// The name `/etc/group` gives `user`'s primary group (Debian's `nobody` is in `nogroup`).
fn primary_group(user: &str) -> String {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    let gid = passwd
        .lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f[0] == user)
        .map(|f| f[3].to_owned())
        .unwrap();
    std::fs::read_to_string("/etc/group")
        .unwrap()
        .lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.get(2) == Some(&gid.as_str()))
        .map_or(gid.clone(), |f| f[0].to_owned())
}

// Issue 42, then 48: `check-config --user` checks as the unit's user. A root-only token file
// passed `check-config` run as root and failed the start; issue 42 made it a warning (exit 0),
// and a token inside a 0700 directory of root's passed with no word (R8). Now each fails
// (exit 2), naming the file or the directory, its owner and mode, and the fix, with the
// user's primary group as /etc/group names it; every file the agent needs is checked (here
// also the engine's env.json). An unknown user is an error, and a state directory of root's is
// refused for another user, as `run` as that user would.
#[test]
fn check_config_as_the_units_user_fails_on_a_file_it_cannot_open() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path, m: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    };
    let dir = tempfile::tempdir().unwrap();
    // tempdir makes it 0700: the unit's user could not reach anything in it.
    mode(dir.path(), 0o755);
    let token = dir.path().join("admin.token");
    std::fs::write(&token, "0123456789abcdef0123456789abcdef\n").unwrap();
    mode(&token, 0o600);
    let env_json = dir.path().join("env.json");
    std::fs::write(&env_json, "{\"motor_common_env\": {}}").unwrap();
    let [admin] = free_ports();
    let config = write_config(dir.path(), "env_config_path = \"env.json\"");
    let text = std::fs::read_to_string(&config).unwrap();
    let with_token = |token: &Path| {
        std::fs::write(
            &config,
            format!(
                "[agent]\nadmin_listen = \"127.0.0.1:{admin}\"\nadmin_token_file = \"{}\"\n\n{text}",
                token.display()
            ),
        )
        .unwrap();
    };
    with_token(&token);
    let check = |user: Option<&str>| {
        let mut c = agent();
        c.args(["check-config", "--config"]).arg(&config);
        if let Some(u) = user {
            c.args(["--user", u]);
        }
        run_within(c, dir.path(), Duration::from_secs(20))
    };
    let euid = rustix::process::geteuid();
    // As the user running it: nothing to say (root reads every file; another user owns it).
    let me = check(None);
    assert_eq!(me.code, Some(0), "{}", me.stderr);
    assert!(!me.stderr.contains("WARNING"), "{}", me.stderr);
    if euid.is_root() {
        let group = primary_group("nobody");
        mode(&env_json, 0o600);
        let nobody = check(Some("nobody"));
        assert_eq!(nobody.code, Some(2), "{}", nobody.stderr);
        let t = token.display();
        let want = format!(
            "[agent] admin_token_file: {t} (uid 0, gid 0, mode 0600) is not readable by nobody (uid 65534): the agent running as nobody fails to start; `chown root:{group} {t} && chmod 0640 {t}`; the same for 1 more: [[engine]] #1 (a) env_config_path ({})",
            env_json.display()
        );
        assert!(
            nobody.last_line().contains(&want),
            "{want}\n{}",
            nobody.stderr
        );
        mode(&token, 0o644);
        mode(&env_json, 0o644);
        let readable = check(Some("nobody"));
        assert_eq!(readable.code, Some(0), "{}", readable.stderr);
        // R8: a readable token inside a directory of root's that nobody cannot search.
        let secret = dir.path().join("secret");
        std::fs::create_dir(&secret).unwrap();
        mode(&secret, 0o700);
        let inside = secret.join("token");
        std::fs::rename(&token, &inside).unwrap();
        with_token(&inside);
        let behind = check(Some("nobody"));
        assert_eq!(behind.code, Some(2), "{}", behind.stderr);
        let d = secret.display();
        let want = format!(
            "[agent] admin_token_file: {} is inside {d} (uid 0, gid 0, mode 0700), which nobody (uid 65534) cannot search: the agent running as nobody fails to start; `chgrp {group} {d} && chmod g+x {d}`",
            inside.display()
        );
        assert!(
            behind.last_line().contains(&want),
            "{want}\n{}",
            behind.stderr
        );
        mode(&secret, 0o711);
        // A state directory of root's is not nobody's.
        let state = dir.path().join("state");
        std::fs::create_dir(&state).unwrap();
        mode(&state, 0o700);
        let text = std::fs::read_to_string(&config).unwrap();
        std::fs::write(
            &config,
            text.replacen(
                "[agent]\n",
                &format!("[agent]\nstate_dir = \"{}\"\n", state.display()),
                1,
            ),
        )
        .unwrap();
        let refused = check(Some("nobody"));
        assert_eq!(refused.code, Some(2), "{}", refused.stderr);
        assert!(
            refused
                .last_line()
                .contains("is owned by uid 0 (root), not by uid"),
            "{}",
            refused.stderr
        );
    } else {
        eprintln!("skipped the other-user half: it needs root");
    }
    let unknown = check(Some("no-such-user-here"));
    assert_eq!(unknown.code, Some(2), "{}", unknown.stderr);
    assert!(
        unknown
            .last_line()
            .contains("--user no-such-user-here: no such user"),
        "{}",
        unknown.stderr
    );
}

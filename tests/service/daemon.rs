//! The agent as a system daemon, tested for real: systemd's notify protocol on a bound Unix
//! datagram socket (readiness, status, watchdog pings that stop when the sampler wedges,
//! stopping), SIGHUP reloads and SIGTERM with real signals, journald's native protocol on
//! a bound socket, JSON logs and the rate limit of repeated warnings.

use crate::support;
use crate::support::stack::{FAST_TIMING, free_ports, http};
use npu_health_agent::logging::journald;
use npu_health_wire::EngineDetail;
use npu_health_wire::Phase;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A fake engine (real process) with its NPU files.
struct Engine {
    child: Child,
    port: u16,
    control: u16,
}

impl Engine {
    fn start(dir: &Path, npu_files: &[PathBuf]) -> Engine {
        let [port, control] = free_ports();
        let child =
            npu_health_agent::fake::engine_command(support::agent(), port, control, "m", npu_files)
                .stderr(Stdio::from(
                    std::fs::File::create(dir.join(format!("engine-{port}.log"))).unwrap(),
                ))
                .spawn()
                .expect("start fake engine");
        Engine {
            child,
            port,
            control,
        }
    }

    /// Applies a fault patch, waiting for the control endpoint to come up.
    fn faults(&self, patch: &str) {
        let url = format!("http://127.0.0.1:{}/fake/faults", self.control);
        let end = Instant::now() + Duration::from_secs(20);
        let (code, body) = loop {
            match http("POST", &url, Some(patch)) {
                Some(r) => break r,
                None if Instant::now() < end => std::thread::sleep(Duration::from_millis(20)),
                None => panic!("the fake engine's control endpoint never answered"),
            }
        };
        assert_eq!(code, 200, "{body}");
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Two fake NPUs whose AI Cube figures come from files, and the scenario naming them.
fn npus(dir: &Path, device_extra: &str) -> (PathBuf, Vec<PathBuf>) {
    let files: Vec<PathBuf> = ["npu0", "npu1"].iter().map(|f| dir.join(f)).collect();
    for f in &files {
        std::fs::write(f, "5\n").unwrap();
    }
    let scenario = dir.join("scenario.toml");
    std::fs::write(
        &scenario,
        format!(
            "model = \"910B\"\ncards = 2\n[[device]]\nid = 0\naicube = {{ file = \"npu0\" }}\n{device_extra}\n[[device]]\nid = 1\naicube = {{ file = \"npu1\" }}\n{device_extra}\n"
        ),
    )
    .unwrap();
    (scenario, files)
}

/// An `[[engine]]` table on the fake engine at `port`.
fn engine_table(name: &str, port: u16, mgmt: u16, threshold: u32) -> String {
    engine_on(name, port, mgmt, threshold, "0, 1")
}

/// An `[[engine]]` table on the NPUs `devices` (logic ids, comma-separated).
fn engine_on(name: &str, port: u16, mgmt: u16, threshold: u32, devices: &str) -> String {
    format!(
        "[[engine]]\nname = \"{name}\"\nengine_type = \"vllm\"\nserved_model_name = \"m\"\nhost = \"127.0.0.1\"\nport = {port}\nmgmt_port = {mgmt}\ndevices = [{devices}]\nengine_env = {{ ASCEND_GLOBAL_LOG_LEVEL = \"3\" }}\n{FAST_TIMING}\n[engine.health_check_config]\nenable_virtual_inference = true\nnpu_usage_threshold = {threshold}\nmax_failure_count = 1000\n"
    )
}

/// One fake engine on two fake NPUs and an agent.toml watching it: `[agent]` holds
/// `sample_period = "20ms"` plus `agent_extra`; each NPU gets `device_extra`.
struct OneEngine {
    dir: tempfile::TempDir,
    scenario: PathBuf,
    engine: Engine,
    mgmt: u16,
    config: PathBuf,
}

impl OneEngine {
    fn new(name: &str, agent_extra: &str, device_extra: &str) -> OneEngine {
        let dir = tempfile::tempdir().unwrap();
        let (scenario, files) = npus(dir.path(), device_extra);
        let engine = Engine::start(dir.path(), &files);
        let [mgmt] = free_ports();
        let config = dir.path().join("agent.toml");
        std::fs::write(
            &config,
            format!(
                "[agent]\nsample_period = \"20ms\"\n{agent_extra}\n{}",
                engine_table(name, engine.port, mgmt, 10)
            ),
        )
        .unwrap();
        OneEngine {
            dir,
            scenario,
            engine,
            mgmt,
            config,
        }
    }
}

fn agent_cmd(scenario: &Path, config: &Path) -> Command {
    let mut c = Command::new(support::agent());
    c.args(["--fake", "run", "--config"])
        .arg(config)
        .env("FAKE_NPU_SCENARIO", scenario)
        .env("RUST_LOG", "info")
        .env_remove("NOTIFY_SOCKET")
        .env_remove("WATCHDOG_USEC")
        .env_remove("WATCHDOG_PID")
        .env_remove("JOURNAL_STREAM")
        .stdout(Stdio::null());
    c
}

fn signal(child: &Child, sig: rustix::process::Signal) {
    rustix::process::kill_process(rustix::process::Pid::from_child(child), sig).unwrap();
}

fn wait_exit(child: &mut Child, limit: Duration) -> Option<i32> {
    let end = Instant::now() + limit;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s.code();
        }
        assert!(Instant::now() < end, "agent did not exit within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits for `f`; on timeout panics with `what` and the log at `log` (if any).
fn wait_until(limit: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let log = LOG
        .with(|l| l.borrow().clone())
        .and_then(|p| std::fs::read_to_string(p).ok())
        .unwrap_or_default();
    panic!("timed out waiting for {what}\nagent log:\n{log}");
}

thread_local! {
    /// The agent log of the running test, shown when a wait times out.
    static LOG: std::cell::RefCell<Option<PathBuf>> = const { std::cell::RefCell::new(None) };
}

fn show_log_on_timeout(p: &Path) {
    LOG.with(|l| *l.borrow_mut() = Some(p.to_owned()));
}

fn detail(mgmt: u16) -> EngineDetail {
    let (_, body) = http(
        "GET",
        &format!("http://127.0.0.1:{mgmt}/status/detail"),
        None,
    )
    .expect("detail");
    serde_json::from_str(&body).expect("detail JSON")
}

/// One `/status` poll on a new connection, saying what went wrong and when (ms from the
/// start of the poll) if it did: refused, reset, timed out, or an answer without a status
/// line.
fn poll_once(mgmt: u16) -> Result<(), String> {
    use std::io::{Read, Write};
    let t = std::time::Instant::now();
    let at = |what: String| format!("{what} after {} ms", t.elapsed().as_millis());
    let mut s = std::net::TcpStream::connect(("127.0.0.1", mgmt))
        .map_err(|e| at(format!("connect: {e}")))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| at(format!("timeout: {e}")))?;
    write!(
        s,
        "GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| at(format!("write: {e}")))?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)
        .map_err(|e| at(format!("read ({} bytes): {e}", raw.len())))?;
    let text = String::from_utf8_lossy(&raw);
    if text.starts_with("HTTP/1.1 ") && text.contains("\r\n\r\n") {
        Ok(())
    } else {
        Err(at(format!("answer without a status line: {text:?}")))
    }
}

fn status(mgmt: u16) -> Option<String> {
    http("GET", &format!("http://127.0.0.1:{mgmt}/status"), None).map(|(_, b)| b)
}

/// Messages received on a notify socket, with their arrival times.
struct Notify {
    sock: UnixDatagram,
    got: Vec<(Instant, String)>,
}

impl Notify {
    fn bind(path: &Path) -> Notify {
        let sock = UnixDatagram::bind(path).unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        Notify {
            sock,
            got: Vec::new(),
        }
    }

    /// Receives for `d`.
    fn collect(&mut self, d: Duration) {
        let end = Instant::now() + d;
        let mut buf = vec![0u8; 4096];
        while Instant::now() < end {
            if let Ok(n) = self.sock.recv(&mut buf) {
                self.got.push((
                    Instant::now(),
                    String::from_utf8_lossy(&buf[..n]).into_owned(),
                ));
            }
        }
    }

    /// Receives until a message satisfies `f` (panics after `limit`); returns its index.
    fn until(&mut self, limit: Duration, f: impl Fn(&str) -> bool) -> usize {
        let end = Instant::now() + limit;
        let mut buf = vec![0u8; 4096];
        loop {
            assert!(
                Instant::now() < end,
                "no such notify message; got {:?}",
                self.got.iter().map(|(_, m)| m).collect::<Vec<_>>()
            );
            if let Ok(n) = self.sock.recv(&mut buf) {
                let m = String::from_utf8_lossy(&buf[..n]).into_owned();
                self.got.push((Instant::now(), m.clone()));
                if f(&m) {
                    return self.got.len() - 1;
                }
            }
        }
    }

    fn pings_after(&self, i: usize) -> Vec<Instant> {
        self.got[i..]
            .iter()
            .filter(|(_, m)| m.lines().any(|l| l == "WATCHDOG=1"))
            .map(|(t, _)| *t)
            .collect()
    }
}

// systemd's Type=notify protocol: READY=1 once the listeners are bound, with a status line;
// WATCHDOG=1 at half of WATCHDOG_USEC while the sampler ticks; no pings once a DCMI call
// hangs for good (systemd would restart the agent); STOPPING=1 and exit 0 on SIGTERM.
#[test]
fn systemd_readiness_status_and_watchdog_that_stops_when_the_sampler_wedges() {
    let [admin] = free_ports();
    let OneEngine {
        dir,
        scenario,
        engine,
        mgmt,
        config,
    } = OneEngine::new(
        "e0",
        &format!(
            "admin_listen = \"127.0.0.1:{admin}\"\ndriver_call_deadline = \"200ms\"\nsampler_stuck_after = \"2s\""
        ),
        "",
    );
    let notify_path = dir.path().join("notify");
    let mut notify = Notify::bind(&notify_path);
    let watchdog = Duration::from_secs(3);
    let mut agent = agent_cmd(&scenario, &config)
        .env("NOTIFY_SOCKET", &notify_path)
        .env("WATCHDOG_USEC", watchdog.as_micros().to_string())
        .stderr(Stdio::from(
            std::fs::File::create(dir.path().join("agent.log")).unwrap(),
        ))
        .spawn()
        .unwrap();
    let log = || std::fs::read_to_string(dir.path().join("agent.log")).unwrap_or_default();
    show_log_on_timeout(&dir.path().join("agent.log"));

    let ready = notify.until(Duration::from_secs(30), |m| {
        m.lines().any(|l| l == "READY=1")
    });
    // Every listener is bound when READY=1 arrives.
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", mgmt)).is_ok(),
        "mgmt listener bound at READY"
    );
    assert!(std::net::TcpStream::connect(("127.0.0.1", admin)).is_ok());
    let ready_msg = notify.got[ready].1.clone();
    assert!(
        ready_msg.contains("STATUS=1 engine: e0 ") && ready_msg.contains("2 NPUs: 2 dcmi"),
        "{ready_msg}"
    );
    assert!(
        notify.got[..ready]
            .iter()
            .all(|(_, m)| !m.contains("WATCHDOG=1")),
        "no ping before READY"
    );

    // Healthy: pings at about half the timeout, never a gap systemd would punish.
    notify.collect(Duration::from_secs(5));
    let pings = notify.pings_after(ready);
    assert!(pings.len() >= 2, "pings: {}\n{}", pings.len(), log());
    for w in pings.windows(2) {
        let gap = w[1] - w[0];
        assert!(
            gap < watchdog && gap >= watchdog / 4,
            "ping gap {gap:?} (timeout {watchdog:?})"
        );
    }
    // STATUS= follows the verdict once the engine answers.
    if !notify
        .got
        .iter()
        .any(|(_, m)| m.contains("STATUS=1 engine: e0 normal"))
    {
        notify.until(Duration::from_secs(20), |m| {
            m.contains("STATUS=1 engine: e0 normal")
        });
    }
    assert_eq!(
        http("GET", &format!("http://127.0.0.1:{admin}/healthz"), None).map(|r| r.0),
        Some(200)
    );

    // Wedge the sampler: every DCMI read now blocks until told otherwise (the engine owns
    // the NPU files).
    engine.faults(r#"{"driver_hang":true}"#);
    notify.until(Duration::from_secs(20), |m| {
        m.contains("STATUS=unhealthy, watchdog pings withheld: a DCMI call on NPU")
    });
    let quiet_from = notify.got.len();
    notify.collect(watchdog * 2);
    assert!(
        notify.pings_after(quiet_from).is_empty(),
        "no pings while the sampler is wedged"
    );
    let (code, body) = http("GET", &format!("http://127.0.0.1:{admin}/healthz"), None).unwrap();
    assert_eq!(code, 503, "{body}");
    assert!(log().contains("watchdog pings withheld"), "{}", log());
    // /status keeps answering from the engine's side meanwhile.
    assert!(status(mgmt).is_some());

    signal(&agent, rustix::process::Signal::TERM);
    notify.until(Duration::from_secs(10), |m| {
        m.lines().any(|l| l == "STOPPING=1")
    });
    assert_eq!(
        wait_exit(&mut agent, Duration::from_secs(15)),
        Some(0),
        "{}",
        log()
    );
    drop(engine);
}

// SIGHUP: an unchanged engine keeps its verdict state and failure count; a changed one
// restarts with its new settings on the same socket (polls never refused); an added one
// starts; a removed one stops; a start-only [agent] key is reported; an invalid file is
// rejected and everything keeps running. Then SIGTERM exits 0 with the ports closed.
#[test]
fn sighup_reload_keeps_untouched_engines_and_rejects_a_bad_file() {
    let dir = tempfile::tempdir().unwrap();
    let (scenario, files) = npus(dir.path(), "");
    for f in &files {
        std::fs::write(f, "0\n").unwrap();
    }
    // Each engine drives its own NPU, as on a real host.
    let a = Engine::start(dir.path(), &files[..1]);
    let b = Engine::start(dir.path(), &files[1..]);
    let [ma, mb, mc] = free_ports();
    let config = dir.path().join("agent.toml");
    let write = |body: &str| std::fs::write(&config, body).unwrap();
    let head = "[agent]\nsample_period = \"20ms\"\n\n";
    write(&format!(
        "{head}{}\n{}",
        engine_on("a", a.port, ma, 10, "0"),
        engine_on("b", b.port, mb, 10, "1")
    ));
    let mut agent = agent_cmd(&scenario, &config)
        .stderr(Stdio::from(
            std::fs::File::create(dir.path().join("agent.log")).unwrap(),
        ))
        .spawn()
        .unwrap();
    let log = || std::fs::read_to_string(dir.path().join("agent.log")).unwrap_or_default();
    show_log_on_timeout(&dir.path().join("agent.log"));
    for m in [ma, mb] {
        // The first healthy /status starts virtual inference (as the reference).
        wait_until(Duration::from_secs(30), "virtual inference running", || {
            status(m);
            http("GET", &format!("http://127.0.0.1:{m}/status/detail"), None)
                .is_some_and(|(_, b)| b.contains("\"phase\":\"running\""))
        });
    }
    // Engine a hangs with its NPUs idle: counted failures pile up (never abnormal here).
    a.faults(r#"{"hang":true}"#);
    wait_until(Duration::from_secs(30), "failures counted on a", || {
        detail(ma).virtual_inference.failure_count >= 2
    });
    let before = detail(ma).virtual_inference.failure_count;
    let threshold = |m: u16| {
        detail(m)
            .conditions
            .into_iter()
            .find(|c| c.name == "npu_usage_threshold")
            .map(|c| c.value)
    };
    assert_eq!(threshold(mb).as_deref(), Some("10"));

    // Poll b's /status all through the reload: never refused, never closed unanswered.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let poller = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut failed: Vec<String> = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Err(e) = poll_once(mb) {
                    failed.push(e);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            failed
        })
    };
    write(&format!(
        "{head}backend = \"npu-smi\"\n\n{}\n{}\n{}",
        engine_on("a", a.port, ma, 10, "0"),
        engine_on("b", b.port, mb, 20, "1"),
        engine_on("c", b.port, mc, 10, "1")
    ));
    signal(&agent, rustix::process::Signal::HUP);
    wait_until(Duration::from_secs(20), "engine c serves", || {
        status(mc).is_some()
    });
    wait_until(Duration::from_secs(10), "the reload line", || {
        log().contains("configuration reloaded")
    });
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let failed = poller.join().unwrap();
    assert!(
        failed.is_empty(),
        "b's /status failed during the reload: {failed:?}\n{}",
        log()
    );
    assert!(
        log().contains("configuration reloaded: added c; removed none; restarted b; untouched a; [agent] backend change(s) take effect at the next restart"),
        "{}",
        log()
    );
    let after = detail(ma).virtual_inference.failure_count;
    assert!(
        after >= before,
        "a's failure count survived: {before} then {after}"
    );
    // Untouched: a's virtual inference was not started again (that would be a warm-up and a
    // count from 0). Still running, or stopped at abnormal: a's hang goes on through the
    // reload, and on a loaded machine it can reach its limit before this read.
    let phase = detail(ma).virtual_inference.phase;
    assert!(
        matches!(phase, Phase::Running | Phase::Stopped),
        "a's virtual inference after the reload: {phase:?}"
    );
    assert_eq!(
        threshold(mb).as_deref(),
        Some("20"),
        "b runs with its new threshold"
    );
    // The agent kept its backend (a start-only key).
    assert!(
        detail(ma)
            .window
            .devices
            .iter()
            .all(|d| d.backend == "dcmi")
    );

    // Remove b.
    write(&format!(
        "{head}{}\n{}",
        engine_on("a", a.port, ma, 10, "0"),
        engine_on("c", b.port, mc, 10, "1")
    ));
    signal(&agent, rustix::process::Signal::HUP);
    wait_until(Duration::from_secs(20), "b's listener closed", || {
        status(mb).is_none()
    });
    assert!(status(mc).is_some());

    // A bad file is rejected, naming the key; nothing changes.
    let count = detail(ma).virtual_inference.failure_count;
    write(&format!(
        "{head}bogus_key = 1\n{}",
        engine_on("a", a.port, ma, 10, "0")
    ));
    signal(&agent, rustix::process::Signal::HUP);
    wait_until(Duration::from_secs(10), "the rejection", || {
        log().contains("configuration rejected")
    });
    assert!(log().contains("bogus_key"), "{}", log());
    assert!(status(mc).is_some(), "c still served");
    assert!(detail(ma).virtual_inference.failure_count >= count);

    signal(&agent, rustix::process::Signal::TERM);
    assert_eq!(
        wait_exit(&mut agent, Duration::from_secs(15)),
        Some(0),
        "{}",
        log()
    );
    assert!(status(ma).is_none() && status(mc).is_none(), "ports closed");
    assert!(log().contains("received SIGTERM"));
}

// Under systemd (JOURNAL_STREAM names stderr) the agent logs natively to journald with
// structured fields; with a JOURNAL_STREAM that is not its stderr it writes text.
#[test]
fn journald_native_logging_with_structured_fields() {
    let OneEngine {
        dir,
        scenario,
        engine,
        mgmt,
        config,
    } = OneEngine::new("j0", "", "");
    // The NPUs fail their reads: warnings with the device field.
    engine.faults(r#"{"driver_error":-8005}"#);
    let journal_path = dir.path().join("journal");
    let journal = UnixDatagram::bind(&journal_path).unwrap();
    journal
        .set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let stderr_path = dir.path().join("stderr");
    show_log_on_timeout(&stderr_path);
    let stderr = std::fs::File::create(&stderr_path).unwrap();
    let meta = std::os::unix::fs::MetadataExt::dev(&stderr.metadata().unwrap());
    let ino = std::os::unix::fs::MetadataExt::ino(&stderr.metadata().unwrap());
    let mut agent = agent_cmd(&scenario, &config)
        .env("JOURNAL_STREAM", format!("{meta}:{ino}"))
        .env(journald::SOCKET_ENV, &journal_path)
        .stderr(Stdio::from(stderr))
        .spawn()
        .unwrap();
    wait_until(Duration::from_secs(30), "normal", || {
        status(mgmt).as_deref() == Some(r#"{"status":"normal"}"#)
    });
    // The engine goes away: /health fails, a line with the verdict.
    drop(engine);
    let mut entries: Vec<Vec<(String, String)>> = Vec::new();
    let end = Instant::now() + Duration::from_secs(20);
    let has = |entries: &[Vec<(String, String)>], k: &str, v: &str| {
        entries
            .iter()
            .any(|e| e.iter().any(|(n, x)| n == k && x == v))
    };
    let mut buf = vec![0u8; 65536];
    while Instant::now() < end
        && !(has(&entries, "VERDICT", "abnormal") && has(&entries, "DEVICE", "0"))
    {
        if let Ok(n) = journal.recv(&mut buf) {
            entries.push(journald::decode(&buf[..n]).expect("a valid journal datagram"));
        }
    }
    signal(&agent, rustix::process::Signal::TERM);
    assert_eq!(wait_exit(&mut agent, Duration::from_secs(15)), Some(0));
    let text = std::fs::read_to_string(&stderr_path).unwrap();
    assert!(
        has(&entries, "VERDICT", "abnormal") && has(&entries, "ENGINE", "j0"),
        "{entries:?}"
    );
    assert!(has(&entries, "DEVICE", "0"), "{entries:?}");
    assert!(has(&entries, "SYSLOG_IDENTIFIER", "npu-health-agent"));
    let warn = entries
        .iter()
        .find(|e| e.iter().any(|(n, v)| n == "VERDICT" && v == "abnormal"))
        .unwrap();
    assert!(
        warn.iter()
            .any(|(n, v)| n == "PRIORITY" && (v == "4" || v == "3"))
    );
    assert!(
        !text.contains("/health fails"),
        "lines went to journald, not stderr: {text}"
    );

    // A JOURNAL_STREAM that is not this process's stderr (a redirected child): text on
    // stderr, nothing to journald.
    while journal.recv(&mut buf).is_ok() {}
    let out = Command::new(support::agent())
        .args(["--fake", "sample", "--window", "300ms", "--period", "20ms"])
        .env("FAKE_NPU_SCENARIO", &scenario)
        .env("JOURNAL_STREAM", "1:1")
        .env(journald::SOCKET_ENV, &journal_path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(" WARN AI Cube read failed") && err.contains("device=1"),
        "{err}"
    );
    assert!(journal.recv(&mut buf).is_err(), "nothing sent to journald");
}

// --log-format json: one JSON object per line; a driver that answers late on every pass
// (every 80 ms) gives one warning per NPU plus the count of what was suppressed, not a line
// per pass.
#[test]
fn json_logs_and_repeated_warnings_are_rate_limited() {
    let OneEngine {
        dir,
        scenario,
        engine,
        mgmt,
        config,
    } = OneEngine::new(
        "r0",
        "backend = \"dcmi\"\ndriver_call_deadline = \"40ms\"",
        "hang_ms = 80",
    );
    let stderr_path = dir.path().join("stderr");
    show_log_on_timeout(&stderr_path);
    let mut agent = agent_cmd(&scenario, &config)
        .arg("--log-format")
        .arg("json")
        .stderr(Stdio::from(std::fs::File::create(&stderr_path).unwrap()))
        .spawn()
        .unwrap();
    wait_until(Duration::from_secs(30), "the mgmt listener", || {
        status(mgmt).is_some()
    });
    std::thread::sleep(Duration::from_secs(4));
    signal(&agent, rustix::process::Signal::TERM);
    assert_eq!(wait_exit(&mut agent, Duration::from_secs(15)), Some(0));
    let text = std::fs::read_to_string(&stderr_path).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(
        lines
            .iter()
            .all(|l| l["timestamp"].is_string() && l["level"].is_string())
    );
    let late: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|l| {
            l["message"]
                .as_str()
                .is_some_and(|m| m.contains("later than the 40ms deadline"))
        })
        .collect();
    assert!(!late.is_empty(), "{text}");
    assert!(
        late.len() <= 4,
        "at most a first line and a summary per NPU, got {}:\n{text}",
        late.len()
    );
    let suppressed: u64 = late
        .iter()
        .filter_map(|l| l["suppressed"].as_str()?.parse::<u64>().ok())
        .sum();
    assert!(suppressed >= 5, "suppressed count {suppressed}:\n{text}");
    drop(engine);
}

/// Processes whose parent is `pid` (from /proc/<n>/stat).
fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(n) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{n}/stat")) else {
            continue;
        };
        // "pid (comm) state ppid ...": comm may hold spaces, so split after the last ')'.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(pid) {
            out.push(n);
        }
    }
    out
}

/// Whether `pid` is alive (not gone, not a zombie).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, r)| r.trim_start().starts_with('Z'))
        })
        .is_some_and(|zombie| !zombie)
}

// SIGTERM with the npu-smi backend: the agent exits 0 promptly and its `npu-smi info watch`
// children are killed before it exits, not left running (reparented) behind it. (That the
// supervisor reaps them is tested in tests/driver/sampler_threads.rs.)
#[test]
fn sigterm_kills_and_reaps_the_npu_smi_children() {
    let OneEngine {
        dir,
        scenario,
        engine,
        config,
        ..
    } = OneEngine::new("n0", "backend = \"npu-smi\"", "");
    show_log_on_timeout(&dir.path().join("agent.log"));
    let mut agent = agent_cmd(&scenario, &config)
        .stderr(Stdio::from(
            std::fs::File::create(dir.path().join("agent.log")).unwrap(),
        ))
        .spawn()
        .unwrap();
    let pid = agent.id();
    wait_until(Duration::from_secs(30), "a watch child per NPU", || {
        children_of(pid).len() >= 2
    });
    let kids = children_of(pid);
    let started = Instant::now();
    signal(&agent, rustix::process::Signal::TERM);
    assert_eq!(wait_exit(&mut agent, Duration::from_secs(15)), Some(0));
    let took = started.elapsed();
    // Gone at once: killed before the agent exited (a child left behind would live on until
    // its next write hits the closed pipe).
    let left: Vec<u32> = kids.iter().copied().filter(|&k| alive(k)).collect();
    assert!(left.is_empty(), "watch children left behind: {left:?}");
    let log = std::fs::read_to_string(dir.path().join("agent.log")).unwrap();
    assert!(
        log.contains("received SIGTERM") && log.contains("stopped"),
        "{log}"
    );
    eprintln!("SIGTERM to exit: {took:?} ({} watch children)", kids.len());
    drop(engine);
}

/// Threads of `pid` (0 when gone).
fn threads(pid: u32) -> u32 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Threads:"))?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// Whether `pid` has a handler for `sig` installed (SigCgt in /proc/<pid>/status).
fn catches(pid: u32, sig: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            let hex = s
                .lines()
                .find(|l| l.starts_with("SigCgt:"))?
                .split_whitespace()
                .nth(1)?
                .to_owned();
            u64::from_str_radix(&hex, 16).ok()
        })
        .is_some_and(|mask| mask & (1 << (sig - 1)) != 0)
}

// Hardening round 2: a SIGHUP with the file unchanged reports no start-only change, also
// after the binary was replaced on disk (a rebuild, a package upgrade of a `--fake` run):
// the kernel then names the running binary `<path> (deleted)`, and `--fake`'s npu-smi, the
// binary itself, read as a new npu_smi at every reload.
#[test]
fn a_reload_with_the_file_unchanged_reports_no_npu_smi_change() {
    let dir = tempfile::tempdir().unwrap();
    let (scenario, _files) = npus(dir.path(), "");
    // The agent and its fake libraries, copied where the binary can be replaced.
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let exe = bin.join("npu-health-agent");
    std::fs::copy(support::agent(), &exe).unwrap();
    let lib = npu_health_agent::fake::FAKE_LIB;
    std::fs::copy(
        npu_health_agent::fake::lib_path(lib).unwrap(),
        bin.join(lib),
    )
    .unwrap();
    let [port, mgmt] = free_ports();
    let config = dir.path().join("agent.toml");
    std::fs::write(&config, engine_on("a", port, mgmt, 10, "0")).unwrap();
    let log_path = dir.path().join("agent.log");
    let cmd = agent_cmd(&scenario, &config);
    let mut agent = Command::new(&exe)
        .args(cmd.get_args())
        .envs(cmd.get_envs().filter_map(|(k, v)| Some((k, v?))))
        .env_remove("NOTIFY_SOCKET")
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(&log_path).unwrap()))
        .spawn()
        .unwrap();
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    wait_until(Duration::from_secs(20), "/status served", || {
        status(mgmt).is_some()
    });
    let reloads = || log().matches("configuration reloaded").count();
    signal(&agent, rustix::process::Signal::HUP);
    wait_until(Duration::from_secs(10), "the first reload", || {
        reloads() == 1
    });
    std::fs::remove_file(&exe).unwrap();
    std::fs::copy(support::agent(), &exe).unwrap();
    signal(&agent, rustix::process::Signal::HUP);
    wait_until(Duration::from_secs(10), "the second reload", || {
        reloads() == 2
    });
    let text = log();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("configuration reloaded"))
        .collect();
    assert!(
        lines
            .iter()
            .all(|l| !l.contains("take effect at the next restart")),
        "{lines:#?}"
    );
    signal(&agent, rustix::process::Signal::TERM);
    assert_eq!(
        wait_exit(&mut agent, Duration::from_secs(15)),
        Some(0),
        "{}",
        log()
    );
}

// Issue 11 §5: a SIGHUP or SIGTERM at any moment of start-up has a defined outcome. From the
// first line of main the signals are caught: SIGHUP during start-up is a reload once ready
// (the agent keeps running and serves), SIGTERM stops it with exit 0. Before main (the
// dynamic loader) the kernel's default applies: that case is recognised by the handler not
// being installed yet when the signal was sent, and reported.
#[test]
fn signals_during_start_up_have_a_defined_outcome() {
    use rustix::process::Signal;
    let OneEngine {
        dir,
        scenario,
        config,
        mgmt,
        ..
    } = OneEngine::new("s0", "", "");
    let delays_us = [
        0u64, 200, 500, 1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000, 300_000,
    ];
    let mut before_main = 0;
    for (sig, name) in [(Signal::HUP, "SIGHUP"), (Signal::TERM, "SIGTERM")] {
        for &d in &delays_us {
            let log = dir.path().join(format!("agent-{name}-{d}.log"));
            let mut agent = agent_cmd(&scenario, &config)
                .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
                .spawn()
                .unwrap();
            std::thread::sleep(Duration::from_micros(d));
            // Threads other than main exist only once main runs (the runtime, the log
            // writer): from then on the handler must already be there.
            let running_main = threads(agent.id()) > 1;
            let handled = catches(agent.id(), sig.as_raw());
            assert!(
                handled || !running_main,
                "{name} at {d} µs: the agent runs threads but does not catch {name} yet"
            );
            signal(&agent, sig);
            let text = || std::fs::read_to_string(&log).unwrap_or_default();
            if !handled {
                // Sent before main's handler: the default action kills it, unless the
                // handler came in between the look and the signal (then as below).
                let end = Instant::now() + Duration::from_secs(3);
                let mut exited = None;
                while exited.is_none() && Instant::now() < end {
                    exited = agent.try_wait().unwrap();
                    std::thread::sleep(Duration::from_millis(10));
                }
                if let Some(s) = exited {
                    assert!(
                        s.code().is_none() || s.code() == Some(0),
                        "{name} at {d} µs before the handler: {s:?}\n{}",
                        text()
                    );
                    before_main += 1;
                    continue;
                }
            }
            if sig == Signal::HUP {
                // Keeps running, comes up, and serves /status.
                let end = Instant::now() + Duration::from_secs(20);
                let served = loop {
                    assert!(
                        agent.try_wait().unwrap().is_none(),
                        "SIGHUP at {d} µs killed the agent\n{}",
                        text()
                    );
                    if http("GET", &format!("http://127.0.0.1:{mgmt}/status"), None).is_some() {
                        break true;
                    }
                    if Instant::now() > end {
                        break false;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                };
                assert!(served, "SIGHUP at {d} µs: never served\n{}", text());
                signal(&agent, Signal::TERM);
            }
            assert_eq!(
                wait_exit(&mut agent, Duration::from_secs(15)),
                Some(0),
                "{name} at {d} µs\n{}",
                text()
            );
        }
    }
    eprintln!(
        "{} signals sent at {delays_us:?} µs after spawn; {before_main} arrived before main's handler",
        2 * delays_us.len()
    );
}

/// Every descendant of `pid`.
fn descendants(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        for c in children_of(p) {
            out.push(c);
            todo.push(c);
        }
    }
    out
}

// Issue 11 §5: the README's main command. SIGTERM, SIGINT and SIGHUP to `demo` each stop
// the demo and everything it started (the agent and the fake engine); and so does a SIGKILL,
// which no handler sees (issue 28: the children have the parent-death signal). Issue 48: the
// demo runs as a terminal's foreground process group, and Ctrl-C is SIGINT to that whole
// group; a clean stop logs no WARN and removes the demo's files; a closed stdout (`demo |
// head -1`) stops it as Ctrl-C does; the `top` command it prints runs against its agent.
#[test]
fn demo_stops_everything_it_started_on_a_signal_or_a_closed_stdout() {
    use rustix::process::Signal;
    use std::io::BufRead;
    use std::os::unix::process::CommandExt;
    let logs = tempfile::tempdir().unwrap();
    for (i, (sig, name)) in [
        (Some(Signal::TERM), "SIGTERM"),
        (Some(Signal::INT), "Ctrl-C (SIGINT to the process group)"),
        (Some(Signal::HUP), "SIGHUP"),
        (Some(Signal::KILL), "SIGKILL"),
        (None, "stdout closed after its first line"),
    ]
    .into_iter()
    .enumerate()
    {
        let err = logs.path().join(format!("demo-{i}.err"));
        let mut demo = Command::new(support::agent())
            .arg("demo")
            .env_remove("RUST_LOG")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&err).unwrap())
            .process_group(0)
            .spawn()
            .unwrap();
        let pid = demo.id();
        let mut lines = std::io::BufReader::new(demo.stdout.take().unwrap()).lines();
        let mut seen = Vec::new();
        for line in lines.by_ref() {
            let line = line.unwrap();
            seen.push(line.clone());
            if sig.is_none() || line.contains("/status {\"status\":\"normal\"}") {
                break;
            }
        }
        let files = seen
            .first()
            .and_then(|l| l.strip_prefix("demo: files in "))
            .map(PathBuf::from)
            .unwrap_or_else(|| panic!("{name}: no files line: {seen:#?}"));
        let kids = descendants(pid);
        let started = if sig.is_none() { 1 } else { 2 };
        assert!(
            kids.len() >= started,
            "{name}: the agent (and the fake engine) run: {kids:?}\n{seen:#?}"
        );
        let mut lines = Some(lines);
        match sig {
            None => lines = None,
            Some(Signal::INT) => {
                let group = rustix::process::Pid::from_raw(pid as i32).unwrap();
                rustix::process::kill_process_group(group, Signal::INT).unwrap();
            }
            Some(Signal::TERM) => {
                demo_top_runs(&seen);
                signal(&demo, Signal::TERM);
            }
            Some(s) => signal(&demo, s),
        }
        let code = wait_exit(&mut demo, Duration::from_secs(20));
        let end = Instant::now() + Duration::from_secs(10);
        while kids.iter().any(|&k| alive(k)) && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(50));
        }
        let left: Vec<u32> = kids.iter().copied().filter(|&k| alive(k)).collect();
        if !left.is_empty() {
            // Stop them first: they hold the demo's stdout, which the message reads.
            for &k in &left {
                if let Some(p) = rustix::process::Pid::from_raw(k as i32) {
                    let _ = rustix::process::kill_process(p, Signal::KILL);
                }
            }
        }
        let rest: Vec<String> = lines
            .map(|l| l.map_while(Result::ok).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "{name}: left running: {left:?}\n{rest:#?}");
        let stderr = std::fs::read_to_string(&err).unwrap();
        if sig == Some(Signal::KILL) {
            assert_eq!(code, None, "{name}: killed, no exit code");
            let _ = std::fs::remove_dir_all(&files);
        } else {
            assert_eq!(code, Some(0), "{name}\n{stderr}");
            assert!(!files.exists(), "{name}: {} left behind", files.display());
            for bad in [" WARN ", " ERROR ", "did not stop"] {
                assert!(
                    !stderr.contains(bad),
                    "{name}: a clean stop said {bad:?}:\n{stderr}"
                );
            }
        }
        eprintln!("{name}: demo and its {} processes stopped", kids.len());
    }
}

/// Runs the `top` command the demo printed, once: it draws the demo's engine.
fn demo_top_runs(seen: &[String]) {
    let line = seen
        .iter()
        .find_map(|l| l.strip_prefix("demo: top"))
        .unwrap_or_else(|| panic!("no top line: {seen:#?}"));
    let argv: Vec<&str> = line.split_whitespace().collect();
    let out = Command::new(argv[0])
        .args(&argv[1..])
        .args(["--once", "--width", "100"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{line}: {out:?}");
    assert!(
        text.lines()
            .any(|l| l.contains("demo") && l.contains("normal")),
        "{line}:\n{text}"
    );
}

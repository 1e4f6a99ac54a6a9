//! The agent under a real systemd (a private user manager, `npu_chaos::systemd`), run as the
//! shipped unit runs it (`deploy/systemd/npu-health-agent.service`, turned into a user unit):
//! `systemctl restart`, a crash under `Restart=on-failure`, and a package upgrade's
//! `daemon-reload` + `try-restart` never refuse a `/status` poll, because the listening
//! socket waits in systemd's file-descriptor store; the state comes back from the unit's
//! `RuntimeDirectory`, so a warm engine is not warmed up again and a hung one stays
//! `abnormal`. Root only: skipped with the reason elsewhere, failing under `CI=true`.

#![cfg(feature = "fake-driver")]

use crate::support;
use crate::support::stack::{FAST_TIMING, free_ports, http};
use npu_chaos::systemd::{self, UserManager};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const UNIT: &str = "npu-health-agent.service";

/// A manager, or `None` (with the reason printed) where none can run.
fn manager(dir: &Path) -> Option<UserManager> {
    if let Err(why) = systemd::preflight() {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("CI=true, but no private systemd user manager can run: {why}");
        }
        eprintln!("skipped: {why}");
        return None;
    }
    Some(UserManager::start(dir).unwrap_or_else(|e| panic!("{e}")))
}

/// The fake engine, the agent's config and scenario, and the agent as the shipped unit.
struct Host {
    dir: tempfile::TempDir,
    engine: Child,
    control: u16,
    mgmt: u16,
    sd: UserManager,
}

impl Host {
    fn start() -> Option<Host> {
        Host::start_with(false)
    }

    /// With `named_state_dir`, the config names the unit's `RuntimeDirectory=` as
    /// `state_dir`, as the shipped config does (`deploy/debian/agent.toml`).
    fn start_with(named_state_dir: bool) -> Option<Host> {
        let dir = tempfile::tempdir().unwrap();
        let sd = manager(&dir.path().join("systemd"))?;
        let files: Vec<PathBuf> = ["npu0", "npu1"]
            .iter()
            .map(|f| dir.path().join(f))
            .collect();
        for f in &files {
            std::fs::write(f, "0\n").unwrap();
        }
        let scenario = dir.path().join("scenario.toml");
        std::fs::write(&scenario, "model = \"910B\"\ncards = 2\n[[device]]\nid = 0\naicube = { file = \"npu0\" }\n[[device]]\nid = 1\naicube = { file = \"npu1\" }\n").unwrap();
        let [port, control, mgmt, admin] = free_ports();
        let engine =
            npu_health_agent::fake::engine_command(support::agent(), port, control, "m", &files)
                .stderr(Stdio::from(
                    std::fs::File::create(dir.path().join("engine.log")).unwrap(),
                ))
                .spawn()
                .expect("start fake engine");
        let toml = dir.path().join("agent.toml");
        // Without state_dir the unit's RuntimeDirectory= is the state directory; the shipped
        // config names it too.
        let state_dir = if named_state_dir {
            format!(
                "state_dir = \"{}\"\n",
                sd.runtime_dir().join("npu-health-agent").display()
            )
        } else {
            String::new()
        };
        std::fs::write(
            &toml,
            format!("[agent]\nsample_period = \"20ms\"\npolicy = \"reference\"\n{state_dir}admin_listen = \"127.0.0.1:{admin}\"\n\n[[engine]]\nname = \"e2e\"\nengine_type = \"vllm\"\nserved_model_name = \"m\"\nhost = \"127.0.0.1\"\nport = {port}\nmgmt_port = {mgmt}\ndevices = [0, 1]\nengine_env = {{ ASCEND_GLOBAL_LOG_LEVEL = \"3\" }}\n{FAST_TIMING}\n[engine.health_check_config]\nenable_virtual_inference = true\n"),
        )
        .unwrap();
        let text = |p: &Path| p.display().to_string();
        let agent = text(support::agent());
        let mut u = systemd::user_unit(
            systemd::SHIPPED_UNIT,
            &[&agent, "--fake", "run", "--config", &text(&toml)],
        )
        .unwrap();
        u.add(
            "Environment",
            &systemd::environment_value("FAKE_NPU_SCENARIO", &text(&scenario)),
            "the fake NPUs",
        );
        u.add(
            "Environment",
            &systemd::environment_value("RUST_LOG", "info"),
            "info lines",
        );
        let log = format!("append:{}", text(&dir.path().join("agent.log")));
        u.set("StandardOutput", &log, "a file the test reads");
        u.set("StandardError", &log, "the same");
        let mut host = Host {
            dir,
            engine,
            control,
            mgmt,
            sd,
        };
        host.sd.install_unit(UNIT, &u.text()).unwrap();
        host.sd.systemctl(&["start", UNIT]).unwrap();
        host.wait_status("normal");
        Some(host)
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/status", self.mgmt)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("agent.log")).unwrap_or_default()
    }

    fn wait_status(&self, want: &str) {
        let body = format!("{{\"status\":\"{want}\"}}");
        let end = Instant::now() + Duration::from_secs(30);
        loop {
            // /status/detail's phase: the warm-up done, as Node Manager's first poll starts it.
            if http("GET", &self.url(), None).is_some_and(|(_, b)| b == body) {
                let d = http(
                    "GET",
                    &format!("http://127.0.0.1:{}/status/detail", self.mgmt),
                    None,
                );
                if want != "normal" || d.is_some_and(|(_, b)| b.contains("\"phase\":\"running\"")) {
                    return;
                }
            }
            assert!(
                Instant::now() < end,
                "/status never became {want}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn main_pid(&self) -> Option<u32> {
        self.sd.main_pid(UNIT).unwrap()
    }

    /// Waits until the unit runs a main process other than `old` and it is ready.
    fn wait_new_main(&self, old: Option<u32>) -> u32 {
        let end = Instant::now() + Duration::from_secs(30);
        loop {
            let pid = self.main_pid();
            let active = self.sd.show(UNIT, "ActiveState").unwrap();
            if let Some(p) = pid
                && Some(p) != old
                && active == "active"
            {
                return p;
            }
            assert!(
                Instant::now() < end,
                "no new main process (state {active}):\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.sd.stop();
        let _ = self.engine.kill();
        let _ = self.engine.wait();
    }
}

/// Polls `/status` every 20 ms (a new connection each, as Node Manager does) until stopped:
/// each poll's answer, or `None` when it failed.
struct Poller {
    stop: Arc<AtomicBool>,
    polls: Arc<Mutex<Vec<Option<String>>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Poller {
    fn start(url: String) -> Poller {
        let stop = Arc::new(AtomicBool::new(false));
        let polls: Arc<Mutex<Vec<Option<String>>>> = Arc::default();
        let thread = {
            let (stop, polls) = (stop.clone(), polls.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Acquire) {
                    polls
                        .lock()
                        .unwrap()
                        .push(http("GET", &url, None).map(|r| r.1));
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        };
        Poller {
            stop,
            polls,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> Vec<Option<String>> {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        self.polls.lock().unwrap().clone()
    }
}

// `systemctl restart`, a SIGKILL of the main process (Restart=on-failure), and the package
// upgrade's daemon-reload + try-restart: not one poll fails, every answer is `normal`, and no
// new process sends a warm-up request again.
#[test]
fn restart_crash_and_upgrade_under_systemd_refuse_no_poll_and_forget_nothing() {
    let Some(h) = Host::start() else { return };
    let first = h.main_pid();
    let poller = Poller::start(h.url());
    std::thread::sleep(Duration::from_millis(500));
    h.sd.systemctl(&["restart", UNIT]).unwrap();
    let second = h.wait_new_main(first);
    std::thread::sleep(Duration::from_millis(500));
    h.sd.systemctl(&["kill", "--signal=SIGKILL", "--kill-whom=main", UNIT])
        .unwrap();
    let third = h.wait_new_main(Some(second));
    assert_eq!(h.sd.show(UNIT, "NRestarts").unwrap(), "1");
    std::thread::sleep(Duration::from_millis(500));
    // What deploy/debian/postinst runs on an upgrade.
    h.sd.systemctl(&["daemon-reload"]).unwrap();
    h.sd.systemctl(&["try-restart", UNIT]).unwrap();
    h.wait_new_main(Some(third));
    std::thread::sleep(Duration::from_secs(1));
    let polls = poller.finish();
    let failed = polls.iter().filter(|p| p.is_none()).count();
    let log = h.log();
    assert_eq!(failed, 0, "failed polls of {}:\n{log}", polls.len());
    assert!(
        polls
            .iter()
            .flatten()
            .all(|b| b == r#"{"status":"normal"}"#),
        "{polls:?}"
    );
    assert_eq!(
        log.matches("listening socket(s) passed back by systemd")
            .count(),
        3,
        "each new process took the socket back:\n{log}"
    );
    assert_eq!(
        log.matches("resuming from the saved state").count(),
        3,
        "{log}"
    );
    assert_eq!(
        log.matches("warm-up request succeeded").count(),
        1,
        "only the first process warmed the engine up:\n{log}"
    );
}

// Issue 42: docs/deploy.md's upgrade steps on a live host, as written: `check-config --user`
// from a shell (no RUNTIME_DIRECTORY in its environment) passes while the unit runs, each
// port noted as the one a new agent takes over; then the package's daemon-reload and
// try-restart refuse no poll. Issue 48: and it answers what `run` would. It blamed every
// port in use on the running agent (a port of the fake engine passed), named neither the
// agent nor the fix beside it without `state_dir`, and made it log a WARN each time (it
// connected to the handover socket). One host start for the cases (CI time).
#[test]
fn check_config_on_a_live_host_passes_only_the_agents_own_ports_and_names_any_other_holder() {
    let Some(h) = Host::start_with(true) else {
        return;
    };
    let config = h.dir.path().join("agent.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    let write = |name: &str, text: String| {
        let p = h.dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    // As shipped before issue 42: no `state_dir`, the unit's RuntimeDirectory= alone.
    let before = write(
        "agent-before.toml",
        text.lines()
            .filter(|l| !l.starts_with("state_dir"))
            .collect::<Vec<_>>()
            .join("\n"),
    );
    // The engine's /status on the fake engine's control port.
    let taken = write(
        "agent-taken.toml",
        text.replace(
            &format!("mgmt_port = {}", h.mgmt),
            &format!("mgmt_port = {}", h.control),
        ),
    );
    let check = |config: &Path| {
        let out = std::process::Command::new(support::agent())
            .args(["--fake", "check-config", "--config"])
            .arg(config)
            .args(["--user", "root"])
            .env_remove("RUNTIME_DIRECTORY")
            .env("FAKE_NPU_SCENARIO", h.dir.path().join("scenario.toml"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        eprintln!(
            "check-config {}: exit {:?}\n{err}",
            config.display(),
            out.status.code()
        );
        (out.status.code(), err)
    };
    let agent = h.main_pid().expect("the unit's main process");
    let logged = h.log().len();
    // Each case's failure, all told at once.
    let mut wrong = Vec::new();
    let mut case = |what: &str, ok: bool, out: &str| {
        if !ok {
            wrong.push(format!("{what}:\n{out}"));
        }
    };
    let (code, err) = check(&taken);
    let holder = format!(
        "pid {} (npu-health-agen, uid 0) listens on 127.0.0.1:{}",
        h.engine.id(),
        h.control
    );
    case(
        "another process's port fails, naming it",
        code == Some(2) && err.contains(&holder),
        &err,
    );
    let (code, err) = check(&before);
    let dir = h.sd.runtime_dir().join("npu-health-agent");
    let fix = format!("set `[agent] state_dir = \"{}\"`", dir.display());
    case(
        "without state_dir, it fails naming the running agent and the fix",
        code == Some(2)
            && err.contains(&format!("the running agent, pid {agent} ("))
            && err.contains(&fix),
        &err,
    );
    let (code, err) = check(&config);
    let note = format!(
        "engine e2e's /status 127.0.0.1:{} is in use by the running agent, which hands it over to a new one (pid {agent})",
        h.mgmt
    );
    case(
        "the agent's own port passes, noted",
        code == Some(0) && err.contains(&note),
        &err,
    );
    let log = h.log();
    let during = &log[logged..];
    case(
        "the running agent logs no WARN",
        !during.contains("WARN"),
        during,
    );
    assert!(wrong.is_empty(), "{}", wrong.join("\n\n"));
    let first = h.main_pid();
    let poller = Poller::start(h.url());
    std::thread::sleep(Duration::from_millis(300));
    h.sd.systemctl(&["daemon-reload"]).unwrap();
    h.sd.systemctl(&["try-restart", UNIT]).unwrap();
    h.wait_new_main(first);
    std::thread::sleep(Duration::from_millis(500));
    let polls = poller.finish();
    assert!(
        polls.iter().all(Option::is_some),
        "failed polls: {polls:?}\n{}",
        h.log()
    );
}

// A hung engine that the agent reported: `abnormal` on every poll through a restart.
#[test]
fn a_hung_engine_stays_abnormal_through_systemctl_restart() {
    let Some(h) = Host::start() else { return };
    let url = format!("http://127.0.0.1:{}/fake/faults", h.control);
    let (code, _) = http("POST", &url, Some(r#"{"hang": true}"#)).unwrap();
    assert_eq!(code, 200);
    h.wait_status("abnormal");
    let first = h.main_pid();
    let poller = Poller::start(h.url());
    h.sd.systemctl(&["restart", UNIT]).unwrap();
    h.wait_new_main(first);
    std::thread::sleep(Duration::from_secs(2));
    let polls = poller.finish();
    assert!(polls.iter().all(|p| p.is_some()), "{polls:?}");
    assert!(
        polls
            .iter()
            .flatten()
            .all(|b| b == r#"{"status":"abnormal"}"#),
        "{polls:?}\n{}",
        h.log()
    );
}

// A listener a reload closes leaves systemd's store too: otherwise systemd would keep the
// port listening with nobody to answer, and its pollers would time out instead of being
// refused.
#[test]
fn a_listener_a_reload_closes_leaves_the_store() {
    let Some(h) = Host::start() else { return };
    assert_eq!(h.sd.show(UNIT, "NFileDescriptorStore").unwrap(), "2");
    let toml = h.dir.path().join("agent.toml");
    let text = std::fs::read_to_string(&toml).unwrap();
    let admin_line = text
        .lines()
        .find(|l| l.starts_with("admin_listen"))
        .unwrap()
        .to_owned();
    let admin_port: u16 = admin_line
        .rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches('"')
        .parse()
        .unwrap();
    std::fs::write(&toml, text.replace(&format!("{admin_line}\n"), "")).unwrap();
    h.sd.systemctl(&["reload", UNIT]).unwrap();
    let end = Instant::now() + Duration::from_secs(20);
    while h.sd.show(UNIT, "NFileDescriptorStore").unwrap() != "1" {
        assert!(
            Instant::now() < end,
            "the store still holds {}:\n{}",
            h.sd.show(UNIT, "NFileDescriptorStore").unwrap(),
            h.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let refused = std::net::TcpStream::connect(("127.0.0.1", admin_port))
        .err()
        .map(|e| e.kind());
    assert_eq!(refused, Some(std::io::ErrorKind::ConnectionRefused));
    h.wait_status("normal");
}

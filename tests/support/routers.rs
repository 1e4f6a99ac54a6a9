//! Real routers for the tests: HAProxy (Debian's `haproxy`, 2.6) started from a config
//! written here, its stats socket read for each server's state, and a client that sends
//! completions through it and notes which engine answered.
//!
//! The tests run where the binary is found (`scripts/routers install` puts it there), and
//! skip with the reason where it is not; under `CI=true` or `NPU_HEALTH_ROUTERS=1` a
//! missing binary fails them instead.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Whether the tests must run (a missing router fails them).
fn required() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
        || std::env::var("NPU_HEALTH_ROUTERS").as_deref() == Ok("1")
}

/// `name` on the PATH (or `env` names it), if found.
fn find(name: &str, env: &str) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(env) {
        return Some(PathBuf::from(p));
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

/// The HAProxy binary, or `None` after printing why the test skips (panics where it must
/// run).
pub fn haproxy(test: &str) -> Option<PathBuf> {
    match find("haproxy", "NPU_HEALTH_HAPROXY") {
        Some(p) => Some(p),
        None if required() => panic!(
            "{test}: haproxy not found (scripts/routers install, or NPU_HEALTH_HAPROXY=<path>)"
        ),
        None => {
            println!("skipped {test}: haproxy not found (scripts/routers install to run it)");
            None
        }
    }
}

/// The Envoy binary (`scripts/routers install` puts it under target/routers/), or `None`
/// after printing why the test skips (panics where it must run).
pub fn envoy(test: &str) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("NPU_HEALTH_ENVOY") {
        return Some(PathBuf::from(p));
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/routers/venv/lib");
    let found = std::fs::read_dir(&venv).ok().and_then(|dirs| {
        dirs.flatten()
            .map(|d| d.path().join("site-packages/envoy/_bin/envoy"))
            .find(|p| p.is_file())
    });
    match found {
        Some(p) => Some(p),
        None if required() => panic!(
            "{test}: envoy not found under {} (scripts/routers install, or NPU_HEALTH_ENVOY=<path>)",
            venv.display()
        ),
        None => {
            println!("skipped {test}: envoy not found (scripts/routers install to run it)");
            None
        }
    }
}

/// A shipped example config with `from → to` replaced; each `from` must occur `times` (its
/// count in the file), so a changed example fails the test instead of going untested.
pub fn example(path: &str, edits: &[(&str, &str, usize)]) -> String {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    let mut text = std::fs::read_to_string(&file).unwrap();
    for (from, to, times) in edits {
        assert_eq!(
            text.matches(from).count(),
            *times,
            "{path}: {from:?} should occur {times} times"
        );
        text = text.replace(from, to);
    }
    text
}

/// `haproxy -c -f <path>`: whether it accepted the file, and what it said.
pub fn haproxy_check(bin: &Path, path: &Path) -> (bool, String) {
    let out = Command::new(bin)
        .arg("-c")
        .arg("-f")
        .arg(path)
        .output()
        .expect("run haproxy -c");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// `envoy --mode validate -c <path>`: its output, and whether it accepted the file.
pub fn envoy_validate(bin: &Path, path: &Path) -> (bool, String) {
    let out = Command::new(bin)
        .args(["--mode", "validate", "--disable-hot-restart", "-c"])
        .arg(path)
        .output()
        .expect("run envoy");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// A running Envoy, killed when dropped.
pub struct Envoy {
    child: Child,
    /// `http://127.0.0.1:<port>` of its listener.
    pub front: String,
    /// `http://127.0.0.1:<port>` of its admin interface (`/clusters`).
    pub admin: String,
    pub log: PathBuf,
}

impl Envoy {
    /// Starts `bin` on `config` (written to `dir/envoy.yaml` with an admin interface on
    /// `admin` added) and waits until its listener `port` accepts.
    pub fn start(bin: &Path, dir: &Path, config: &str, port: u16, admin: u16) -> Envoy {
        let cfg = dir.join("envoy.yaml");
        std::fs::write(
            &cfg,
            format!(
                "{config}\nadmin:\n  address:\n    socket_address: {{ address: 127.0.0.1, port_value: {admin} }}\n"
            ),
        )
        .unwrap();
        let log = dir.join("envoy.log");
        let child = Command::new(bin)
            .args(npu_chaos::router::ENVOY_ARGS)
            .arg("-c")
            .arg(&cfg)
            .stdout(Stdio::from(std::fs::File::create(&log).unwrap()))
            .stderr(Stdio::from(
                std::fs::OpenOptions::new().append(true).open(&log).unwrap(),
            ))
            .spawn()
            .expect("start envoy");
        let e = Envoy {
            child,
            front: format!("http://127.0.0.1:{port}"),
            admin: format!("http://127.0.0.1:{admin}"),
            log,
        };
        let until = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            let log = std::fs::read_to_string(&e.log).unwrap_or_default();
            assert!(Instant::now() < until, "envoy did not start: {log}");
            std::thread::sleep(Duration::from_millis(50));
        }
        e
    }

    /// The health flags Envoy's admin `/clusters` shows for `cluster`'s host on `port`
    /// (`healthy`, `/failed_active_hc`, `/degraded_active_hc`, …).
    pub fn health(&self, cluster: &str, port: u16) -> String {
        let (_, text) = super::stack::http("GET", &format!("{}/clusters", self.admin), None)
            .unwrap_or_default();
        let key = format!("{cluster}::127.0.0.1:{port}::health_flags::");
        text.lines()
            .find_map(|l| l.strip_prefix(&key).map(str::to_owned))
            .unwrap_or_default()
    }

    /// Waits until `f` holds of [`Envoy::health`]; panics after `limit`.
    pub fn wait_health(
        &self,
        cluster: &str,
        port: u16,
        limit: Duration,
        f: impl Fn(&str) -> bool,
    ) -> String {
        let until = Instant::now() + limit;
        loop {
            let h = self.health(cluster, port);
            if f(&h) {
                return h;
            }
            assert!(
                Instant::now() < until,
                "{cluster} host {port} never reached the state: {h:?}"
            );
            std::thread::sleep(Duration::from_millis(25));
        }
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The draft engine: the fake engine answering as `draft`, serving `m` too, killed when
/// dropped.
#[cfg(feature = "fake-driver")]
pub struct Draft {
    child: Child,
    /// Its fault-control port.
    pub control: u16,
}

#[cfg(feature = "fake-driver")]
impl Draft {
    /// Starts it on `port` (fault control on `control`) and waits until `/health` answers.
    pub fn start(port: u16, control: u16, dir: &std::path::Path) -> Draft {
        let mut cmd = npu_health_agent::fake::engine_command(
            super::agent(),
            port,
            control,
            "draft",
            &[dir.join("draft-npu")],
        );
        cmd.args(["--alias", "m"]).stderr(Stdio::null());
        let d = Draft {
            child: cmd.spawn().expect("start the draft engine"),
            control,
        };
        let until = Instant::now() + Duration::from_secs(10);
        while super::stack::http("GET", &format!("http://127.0.0.1:{port}/health"), None).is_none()
        {
            assert!(Instant::now() < until, "the draft engine did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        d
    }
}

#[cfg(feature = "fake-driver")]
impl Drop for Draft {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// HAProxy in front of a main engine and its `backup` draft: the shipped
/// `deploy/haproxy/haproxy.cfg` on local ports, the agent answering the main server's agent
/// check every 200 ms for `engine`, requests queueing up to 60 s (`timeout queue`) and
/// streams silent up to 60 s. The draft has no agent check here (it is not one of the test
/// agent's engines), and the stats page is read on the admin socket instead (`{stats}`).
pub fn main_and_draft(front: u16, main: u16, agent: u16, engine: &str, draft: u16) -> String {
    example(
        "deploy/haproxy/haproxy.cfg",
        &[
            ("/run/haproxy/admin.sock mode 660", "{stats}", 1),
            ("timeout client 10m", "timeout client 60s", 1),
            ("timeout server 10m", "timeout server 60s", 1),
            ("timeout queue 30s", "timeout queue 60s", 1),
            ("bind 0.0.0.0:8080", &format!("bind 127.0.0.1:{front}"), 1),
            (
                " backup agent-check agent-addr 10.0.0.5 agent-port 9500 agent-inter 1s agent-send \"draft\\n\"",
                " backup",
                1,
            ),
            ("10.0.0.5:8001", &format!("127.0.0.1:{draft}"), 1),
            ("10.0.0.5:8000", &format!("127.0.0.1:{main}"), 1),
            ("agent-addr 10.0.0.5", "agent-addr 127.0.0.1", 1),
            ("agent-port 9500", &format!("agent-port {agent}"), 1),
            ("agent-inter 1s", "agent-inter 200ms", 1),
            (
                "agent-send \"main\\n\"",
                &format!("agent-send \"{engine}\\n\""),
                1,
            ),
            (
                "listen stats\n    bind 127.0.0.1:8404\n    stats enable\n    stats uri /\n    stats refresh 5s\n",
                "",
                1,
            ),
        ],
    )
}

/// A running HAProxy, killed when dropped.
pub struct Haproxy {
    child: Child,
    /// Its admin socket (`show stat`).
    pub stats: PathBuf,
    /// `http://127.0.0.1:<port>` of its frontend.
    pub front: String,
    pub log: PathBuf,
}

impl Haproxy {
    /// Starts `bin` on `config` (written to `dir/haproxy.cfg`, with `{stats}` replaced by
    /// the socket's path) in the foreground, and waits until its frontend `port` accepts.
    pub fn start(bin: &Path, dir: &Path, config: &str, port: u16) -> Haproxy {
        let stats = dir.join("haproxy.sock");
        let cfg = dir.join("haproxy.cfg");
        std::fs::write(
            &cfg,
            config.replace("{stats}", &stats.display().to_string()),
        )
        .unwrap();
        let (ok, said) = haproxy_check(bin, &cfg);
        assert!(ok, "haproxy -c rejects the config:\n{said}");
        let log = dir.join("haproxy.log");
        let child = Command::new(bin)
            .arg("-db")
            .arg("-f")
            .arg(&cfg)
            .stdout(Stdio::from(std::fs::File::create(&log).unwrap()))
            .stderr(Stdio::from(
                std::fs::OpenOptions::new().append(true).open(&log).unwrap(),
            ))
            .spawn()
            .expect("start haproxy");
        let h = Haproxy {
            child,
            stats,
            front: format!("http://127.0.0.1:{port}"),
            log,
        };
        let until = Instant::now() + Duration::from_secs(10);
        // The socket's file can exist before HAProxy accepts on it.
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err()
            || std::os::unix::net::UnixStream::connect(&h.stats).is_err()
        {
            assert!(
                Instant::now() < until,
                "haproxy did not start: {}",
                h.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        h
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// One command on the admin socket; its answer.
    pub fn command(&self, cmd: &str) -> String {
        let mut s = std::os::unix::net::UnixStream::connect(&self.stats).expect("stats socket");
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        writeln!(s, "{cmd}").unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    /// `show stat` of `backend`: each server's fields by column name, and the backend's own
    /// (its queue: requests no server can take yet) as `BACKEND`.
    pub fn servers(&self, backend: &str) -> BTreeMap<String, BTreeMap<String, String>> {
        let text = self.command("show stat");
        let mut lines = text.lines().filter(|l| !l.trim().is_empty());
        let head: Vec<&str> = lines
            .next()
            .unwrap_or_default()
            .trim_start_matches("# ")
            .split(',')
            .collect();
        let mut out = BTreeMap::new();
        for l in lines {
            let row: BTreeMap<String, String> = head
                .iter()
                .zip(csv_fields(l))
                .map(|(k, v)| ((*k).to_owned(), v.to_owned()))
                .collect();
            if row.get("pxname").map(String::as_str) == Some(backend)
                && row.get("svname").map(String::as_str) != Some("FRONTEND")
            {
                out.insert(row["svname"].clone(), row);
            }
        }
        out
    }

    /// Waits until `f` holds of server `server` of `backend`; panics after `limit` with its
    /// fields.
    pub fn wait_server(
        &self,
        backend: &str,
        server: &str,
        limit: Duration,
        f: impl Fn(&BTreeMap<String, String>) -> bool,
    ) -> BTreeMap<String, String> {
        let until = Instant::now() + limit;
        loop {
            let s = self.servers(backend).remove(server).unwrap_or_default();
            if f(&s) {
                return s;
            }
            assert!(
                Instant::now() < until,
                "server {backend}/{server} never reached the state: {s:?}\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(25));
        }
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The fields of one CSV line (HAProxy quotes a field holding a comma, and doubles a quote
/// inside it).
fn csv_fields(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                field.push('"');
                chars.next();
            }
            ('"', _) => quoted = !quoted,
            (',', false) => out.push(std::mem::take(&mut field)),
            _ => field.push(c),
        }
    }
    out.push(field);
    out
}

/// One completion through a router: who answered, the status, how long it took.
#[derive(Debug, Clone)]
pub struct Answer {
    pub code: u16,
    /// The answer's `model` (the first served name of the engine that answered).
    pub model: String,
    pub took: Duration,
}

/// Sends one completion of `tokens` tokens for `model` to `base` and reads it whole
/// (`ignore_eos`, so a real engine produces them all; up to 60 s: it may wait in a router's
/// queue or on a slowed engine).
pub fn complete(base: &str, model: &str, tokens: u32) -> Answer {
    let body = format!(
        r#"{{"model": "{model}", "prompt": "hi", "max_tokens": {tokens}, "ignore_eos": true}}"#
    );
    let t = Instant::now();
    let got = super::stack::http_waiting(
        "POST",
        &format!("{base}/v1/completions"),
        Some(&body),
        &[],
        Duration::from_secs(60),
    )
    .map(|(code, _, text)| (code, text));
    let took = t.elapsed();
    match got {
        Some((code, text)) => Answer {
            code,
            model: serde_json::from_str::<serde_json::Value>(&text)
                .ok()
                .and_then(|v| v["model"].as_str().map(str::to_owned))
                .unwrap_or_default(),
            took,
        },
        None => Answer {
            code: 0,
            model: String::new(),
            took,
        },
    }
}

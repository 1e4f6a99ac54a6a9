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
        let check = Command::new(bin)
            .arg("-c")
            .arg("-f")
            .arg(&cfg)
            .output()
            .unwrap();
        assert!(
            check.status.success(),
            "haproxy -c rejects the config:\n{}{}",
            String::from_utf8_lossy(&check.stdout),
            String::from_utf8_lossy(&check.stderr)
        );
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
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() || !h.stats.exists() {
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

/// Sends one completion of `tokens` tokens for `model` to `base` and reads it whole.
pub fn complete(base: &str, model: &str, tokens: u32) -> Answer {
    let body = format!(r#"{{"model": "{model}", "prompt": "hi", "max_tokens": {tokens}}}"#);
    let t = Instant::now();
    let got = super::stack::http("POST", &format!("{base}/v1/completions"), Some(&body));
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

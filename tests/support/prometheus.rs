//! A real Prometheus for the tests (Debian's `prometheus` 2.42 and its `promtool`): started
//! on a config written here with the shipped rules file, asked through its HTTP API; and
//! the Grafana dashboards' queries, with the template variables filled in.
//!
//! The tests run where the binaries are found (`apt-get install prometheus`) and skip with
//! the reason where they are not; under `CI=true` or `NPU_HEALTH_PROMETHEUS=1` a missing
//! binary fails them instead.

use super::stack::{free_ports, http_with};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The shipped rules file.
pub fn rules_file() -> PathBuf {
    repo().join("deploy/prometheus/npu-health-agent.rules.yml")
}

/// The shipped rules file with every `for:` divided by `divisor`, written into `dir`: for a
/// live run that checks the chain (agent → scrape → rule → alert) without waiting out the
/// real durations, which `promtool test rules` checks on its own clock
/// (`deploy/prometheus/tests/`, run by `prometheus_rules.rs`).
pub fn rules_file_scaled(dir: &Path, divisor: u64) -> PathBuf {
    let text = std::fs::read_to_string(rules_file()).expect("the shipped rules file");
    let mut scaled = 0;
    let out: Vec<String> = text
        .lines()
        .map(|line| {
            let Some((indent, value)) = line.split_once("for: ") else {
                return line.to_owned();
            };
            if !indent.trim().is_empty() {
                return line.to_owned();
            }
            let d = humantime::parse_duration(value.trim())
                .unwrap_or_else(|e| panic!("a for: the test cannot read: {line:?}: {e}"));
            scaled += 1;
            format!("{indent}for: {}ms", d.as_millis() as u64 / divisor)
        })
        .collect();
    assert!(scaled > 0, "no for: in the rules file");
    let path = dir.join("npu-health-agent.rules.yml");
    std::fs::write(&path, out.join("\n") + "\n").expect("write the scaled rules");
    path
}

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `prometheus` or `promtool` from the PATH (or `NPU_HEALTH_PROMETHEUS_BIN=<dir>`), or
/// `None` after printing why `test` skips (panics where it must run).
pub fn binary(name: &str, test: &str) -> Option<PathBuf> {
    let dirs: Vec<PathBuf> = match std::env::var_os("NPU_HEALTH_PROMETHEUS_BIN") {
        Some(d) => vec![PathBuf::from(d)],
        None => std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).collect())
            .unwrap_or_default(),
    };
    let found = dirs.iter().map(|d| d.join(name)).find(|p| p.is_file());
    let required = std::env::var("CI").as_deref() == Ok("true")
        || std::env::var("NPU_HEALTH_PROMETHEUS").as_deref() == Ok("1");
    match found {
        Some(p) => Some(p),
        None if required => {
            panic!("{test}: {name} not found (apt-get install prometheus)")
        }
        None => {
            println!("skipped {test}: {name} not found (apt-get install prometheus to run it)");
            None
        }
    }
}

/// A running Prometheus; killed on drop.
pub struct Prometheus {
    child: Child,
    pub port: u16,
    pub dir: PathBuf,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    /// Starts Prometheus scraping `targets` (host:port) as job `npu-health-agent` every
    /// `interval`, evaluating `rules` (files) as often, its data and log under `dir`; waits
    /// until it is ready.
    pub fn start(
        bin: &Path,
        dir: &Path,
        targets: &[String],
        interval: &str,
        rules: &[PathBuf],
    ) -> Prometheus {
        let [port] = free_ports();
        let targets: Vec<String> = targets.iter().map(|t| format!("\"{t}\"")).collect();
        let rules: Vec<String> = rules
            .iter()
            .map(|r| format!("\"{}\"", r.display()))
            .collect();
        let config = format!(
            "global:\n  scrape_interval: {interval}\n  scrape_timeout: {interval}\n  evaluation_interval: {interval}\nrule_files: [{}]\nscrape_configs:\n  - job_name: npu-health-agent\n    static_configs:\n      - targets: [{}]\n",
            rules.join(", "),
            targets.join(", ")
        );
        let config_path = dir.join("prometheus.yml");
        std::fs::write(&config_path, config).unwrap();
        let child = Command::new(bin)
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(Stdio::from(
                std::fs::File::create(dir.join("prometheus.log")).unwrap(),
            ))
            .spawn()
            .expect("start prometheus");
        let p = Prometheus {
            child,
            port,
            dir: dir.to_owned(),
        };
        p.wait("ready", Duration::from_secs(60), || {
            http_with("GET", &p.url("/-/ready"), None, &[]).is_some_and(|(c, _)| c == 200)
        });
        p
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }

    /// `GET /api/v1/<what>` (a query string already encoded): its `data`, or the error.
    pub fn api(&self, what: &str) -> Result<Value, String> {
        let (code, body) = http_with("GET", &self.url(&format!("/api/v1/{what}")), None, &[])
            .ok_or_else(|| format!("no answer to /api/v1/{what}"))?;
        let v: Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
        if code != 200 || v["status"] != "success" {
            return Err(format!("HTTP {code}: {body}"));
        }
        Ok(v["data"].clone())
    }

    /// An instant query's result vector (or the error).
    pub fn query(&self, expr: &str) -> Result<Vec<Value>, String> {
        let data = self.api(&format!("query?query={}", encode(expr)))?;
        Ok(data["result"].as_array().cloned().unwrap_or_default())
    }

    /// The alerts pending or firing: `(alertname, state, labels)`.
    pub fn alerts(&self) -> Vec<(String, String, Value)> {
        let data = self.api("alerts").unwrap_or(Value::Null);
        data["alerts"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|a| {
                (
                    a["labels"]["alertname"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                    a["state"].as_str().unwrap_or_default().to_owned(),
                    a["labels"].clone(),
                )
            })
            .collect()
    }

    /// The healthy targets' count.
    pub fn targets_up(&self) -> usize {
        self.query("up == 1").map(|r| r.len()).unwrap_or(0)
    }

    /// Waits until `done`; panics with `what` and Prometheus's log.
    pub fn wait(&self, what: &str, limit: Duration, done: impl FnMut() -> bool) {
        super::wait_or_panic(what, limit, Duration::from_millis(250), || self.log(), done);
    }
}

/// Percent-encoding for a query string value.
pub fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Every PromQL query of a Grafana dashboard: `(panel title, expr)`, rows' panels included,
/// with Grafana's variables filled in as "All" (`$node`, `$engine`, … match anything) and
/// `$__rate_interval` as `rate_interval`.
pub fn dashboard_queries(path: &Path, rate_interval: &str) -> Vec<(String, String)> {
    let d: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap())
        .unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
    let mut out = Vec::new();
    let mut stack: Vec<&Value> = d["panels"].as_array().into_iter().flatten().collect();
    while let Some(p) = stack.pop() {
        stack.extend(p["panels"].as_array().into_iter().flatten());
        for t in p["targets"].as_array().into_iter().flatten() {
            if let Some(e) = t["expr"].as_str() {
                out.push((
                    p["title"].as_str().unwrap_or_default().to_owned(),
                    fill(e, rate_interval),
                ));
            }
        }
    }
    out.sort();
    out
}

/// Grafana's variables as "All": `$__rate_interval` → `rate_interval`, `$__range` → 1h, and
/// every other `$name` / `${name}` → `.*` (the dashboards use them only in `=~` matchers).
pub fn fill(expr: &str, rate_interval: &str) -> String {
    let e = expr
        .replace("$__rate_interval", rate_interval)
        .replace("$__range", "1h");
    let mut out = String::new();
    let mut rest = e.as_str();
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let len = if let Some(inner) = after.strip_prefix('{') {
            inner.find('}').map_or(0, |j| j + 2)
        } else {
            after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len())
        };
        out.push_str(".*");
        rest = &after[len..];
    }
    out.push_str(rest);
    out
}

/// The dashboard queries that return nothing from `p`: `(panel, expr, why)`.
pub fn empty_queries(
    p: &Prometheus,
    queries: &[(String, String)],
) -> Vec<(String, String, String)> {
    queries
        .iter()
        .filter_map(|(panel, expr)| match p.query(expr) {
            Ok(r) if !r.is_empty() => None,
            Ok(_) => Some((panel.clone(), expr.clone(), "no data".to_owned())),
            Err(e) => Some((panel.clone(), expr.clone(), e)),
        })
        .collect()
}

/// Waits until every query of `queries` returns data from `p`, but for the panels named in
/// `empty_by_design` (`(title, why)`); panics with the ones still empty after `limit`.
pub fn wait_for_dashboard_data(
    p: &Prometheus,
    queries: &[(String, String)],
    empty_by_design: &[(&str, &str)],
    limit: std::time::Duration,
    what: &str,
) {
    let end = Instant::now() + limit;
    loop {
        let empty: Vec<_> = empty_queries(p, queries)
            .into_iter()
            .filter(|(panel, _, _)| !empty_by_design.iter().any(|(t, _)| t == panel))
            .collect();
        if empty.is_empty() {
            return;
        }
        assert!(
            Instant::now() < end,
            "{what} queries without data: {empty:#?}"
        );
        std::thread::sleep(Duration::from_secs(1));
    }
}

//! The agent at fleet scale: N agents on this machine, each with 16 fake NPUs and 2
//! engines, scraped by one real Prometheus (with the shipped rules), measured: series and
//! bytes per scrape, scrape time, Prometheus's memory per agent, the agents' CPU and memory.
//! The fleet dashboard (deploy/grafana/npu-health-fleet.json) is checked against it: every
//! query returns data.
//!
//! Node Manager's polls are played too: every engine's `/status` each second. The fleet:
//! four fake engines shared by every agent (engine `a` of every node on e0;
//! `b` on e1, but on nodes 0 and 1 on e2, which hangs, and on nodes 2 and 3 on e3, slowed
//! with its KV cache full); each node's NPUs play a 5 s square wave at their own phase, the
//! hung engine's NPUs idle; the last two nodes have a driver fault code on one NPU.
//!
//! Skips unless `NPU_HEALTH_FLEET=<N>` (CI runs N = 4 with a 2 s scrape for the dashboard
//! check). The measurement in BENCHMARKS.md:
//!
//! ```sh
//! cargo build --release --features fake-driver
//! NPU_HEALTH_FLEET=50 NPU_HEALTH_FLEET_AGENT=target/release/npu-health-agent \
//!   cargo test --features fake-driver --test integrations fleet:: -- --nocapture
//! ```
//!
//! Environment: `NPU_HEALTH_FLEET_SCRAPE` (default `15s`), `NPU_HEALTH_FLEET_MEASURE`
//! (seconds measured after the fleet settles, default 180), `NPU_HEALTH_FLEET_AGENT` (the
//! agent binary; default the one this test was built with).
#![cfg(feature = "fake-driver")]

use crate::support;
use crate::support::prometheus::{self, Prometheus};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const NPUS: usize = 16;

/// Fleet dashboard panels with no data in this fleet, and why.
const EMPTY_BY_DESIGN: &[(&str, &str)] = &[];

struct Fleet {
    children: Vec<Child>,
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn ports(n: usize) -> Vec<u16> {
    (0..n)
        .map(|_| support::stack::free_ports::<1>()[0])
        .collect()
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// CPU time (user + system) of `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let get = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 after `)`.
    get(11) + get(12)
}

/// Resident memory of `pid`, bytes.
fn rss(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn clock_ticks() -> u64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100)
}

fn scenario(k: usize, n: usize) -> String {
    let phase = (k * 397) % 5000;
    let mut s = format!(
        "model = \"910B\"\ncards = {NPUS}\n[default]\naicube = {{ square = {{ high = 60, low = 5, width_ms = 1000, period_ms = 5000, phase_ms = {phase} }} }}\n"
    );
    for id in 0..NPUS {
        let hung_engine = k < 2 && id >= NPUS / 2;
        let fault = k + 2 >= n && id == 3;
        if hung_engine || fault {
            s.push_str(&format!("[[device]]\nid = {id}\n"));
            if hung_engine {
                s.push_str("aicube = { constant = 0 }\n");
            }
            if fault {
                s.push_str("error_codes = [0x81078603]\n");
            }
        }
    }
    s
}

fn engine_toml(name: &str, port: u16, mgmt: u16, devices: &[usize]) -> String {
    let devices: Vec<String> = devices.iter().map(|d| d.to_string()).collect();
    format!(
        "[[engine]]\nname = \"{name}\"\nengine_type = \"vllm\"\nserved_model_name = \"m\"\nhost = \"127.0.0.1\"\nport = {port}\nmgmt_port = {mgmt}\ndevices = [{}]\nengine_env = {{}}\n[engine.health_check_config]\nenable_virtual_inference = true\n",
        devices.join(", ")
    )
}

fn post(url: &str, body: &str) {
    let (code, said) = support::stack::http("POST", url, Some(body)).expect("control answers");
    assert_eq!(code, 200, "{url} {body}: {said}");
}

#[test]
fn a_fleet_of_agents_under_one_prometheus() {
    let test = "a_fleet_of_agents_under_one_prometheus";
    let Ok(n) = std::env::var("NPU_HEALTH_FLEET") else {
        println!("skipped {test}: set NPU_HEALTH_FLEET=<agents> to run it");
        return;
    };
    let n: usize = n.parse().expect("NPU_HEALTH_FLEET is a number of agents");
    assert!(
        n >= 4,
        "NPU_HEALTH_FLEET: at least 4 agents (the fleet's faults need them)"
    );
    let Some(prom_bin) = prometheus::binary("prometheus", test) else {
        return;
    };
    let scrape: String = env_or("NPU_HEALTH_FLEET_SCRAPE", "15s".to_owned());
    let scrape_s: u64 = scrape
        .trim_end_matches('s')
        .parse()
        .expect("NPU_HEALTH_FLEET_SCRAPE in whole seconds, e.g. 15s");
    let measure = Duration::from_secs(env_or("NPU_HEALTH_FLEET_MEASURE", 180));
    let agent_bin: PathBuf = std::env::var_os("NPU_HEALTH_FLEET_AGENT")
        .map(PathBuf::from)
        .unwrap_or_else(|| support::agent().to_owned());
    let agent_bin = std::fs::canonicalize(&agent_bin).expect("the agent binary");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();

    // The engines.
    let p = ports(8 + 3 * n);
    let (engine_ports, control_ports) = (&p[0..4], &p[4..8]);
    let mut fleet = Fleet {
        children: Vec::new(),
    };
    for k in 0..4 {
        fleet.children.push(
            npu_health_agent::fake::engine_command(
                &agent_bin,
                engine_ports[k],
                control_ports[k],
                "m",
                &[],
            )
            .spawn()
            .expect("start a fake engine"),
        );
    }
    let control = |k: usize| format!("http://127.0.0.1:{}/fake/faults", control_ports[k]);
    let end = Instant::now() + Duration::from_secs(30);
    while support::stack::http("GET", &control(3), None).is_none() {
        assert!(Instant::now() < end, "the fake engines did not start");
        std::thread::sleep(Duration::from_millis(100));
    }
    post(
        &control(3),
        r#"{"latency_ms": 1500, "kv_cache_usage": 0.97}"#,
    );

    // Prometheus first: its memory before any agent answers is the baseline.
    let admin: Vec<u16> = p[8..8 + n].to_vec();
    let targets: Vec<String> = admin.iter().map(|a| format!("127.0.0.1:{a}")).collect();
    let prom_dir = d.join("prometheus");
    std::fs::create_dir(&prom_dir).unwrap();
    let prom = Prometheus::start(
        &prom_bin,
        &prom_dir,
        &targets,
        &scrape,
        &[prometheus::rules_file()],
    );
    std::thread::sleep(Duration::from_secs(scrape_s + 1));
    let prom_base = rss(prom.pid());

    // The agents.
    let first_agent = fleet.children.len();
    for k in 0..n {
        let ad = d.join(format!("agent{k}"));
        std::fs::create_dir(&ad).unwrap();
        std::fs::write(ad.join("scenario.toml"), scenario(k, n)).unwrap();
        let b_engine = match k {
            0 | 1 => 2,
            2 | 3 => 3,
            _ => 1,
        };
        let (m_a, m_b) = (p[8 + n + 2 * k], p[8 + n + 2 * k + 1]);
        let half: Vec<usize> = (0..NPUS / 2).collect();
        let rest: Vec<usize> = (NPUS / 2..NPUS).collect();
        std::fs::write(
            ad.join("agent.toml"),
            format!(
                "[agent]\npolicy = \"agent\"\nadmin_listen = \"127.0.0.1:{}\"\nstate_dir = \"{}\"\n\n{}\n{}",
                admin[k],
                ad.join("state").display(),
                engine_toml("a", engine_ports[0], m_a, &half),
                engine_toml("b", engine_ports[b_engine], m_b, &rest)
            ),
        )
        .unwrap();
        let child = Command::new(&agent_bin)
            .arg("--fake")
            .args(["run", "--config"])
            .arg(ad.join("agent.toml"))
            .env("FAKE_NPU_SCENARIO", ad.join("scenario.toml"))
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::from(
                std::fs::File::create(ad.join("agent.log")).unwrap(),
            ))
            .spawn()
            .expect("start an agent");
        fleet.children.push(child);
    }
    // Node Manager's part: every engine's /status polled each second (virtual inference
    // starts at the first poll, as MindIE's does).
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let poller = {
        let stop = stop.clone();
        let mgmt: Vec<u16> = p[8 + n..8 + 3 * n].to_vec();
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let t = Instant::now();
                for m in &mgmt {
                    let _ =
                        support::stack::http("GET", &format!("http://127.0.0.1:{m}/status"), None);
                }
                std::thread::sleep(Duration::from_secs(1).saturating_sub(t.elapsed()));
            }
        })
    };
    // Engine e2 hangs once nodes 0 and 1 sent it their warm-up request (a hung warm-up waits
    // warmup_timeout, 180 s).
    let warmed = |mgmt: u16| {
        support::stack::http(
            "GET",
            &format!("http://127.0.0.1:{mgmt}/status/detail"),
            None,
        )
        .and_then(|(_, b)| serde_json::from_str::<serde_json::Value>(&b).ok())
        .is_some_and(|v| v["virtual_inference"]["warmup_done"] == true)
    };
    let end = Instant::now() + Duration::from_secs(120);
    while !(warmed(p[8 + n + 1]) && warmed(p[8 + n + 3])) {
        assert!(
            Instant::now() < end,
            "nodes 0 and 1 did not warm up: {:?}\n{}",
            support::stack::http(
                "GET",
                &format!("http://127.0.0.1:{}/status/detail", p[8 + n + 1]),
                None
            ),
            std::fs::read_to_string(d.join("agent0/agent.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    post(&control(2), r#"{"hang": true}"#);
    let agents: Vec<u32> = fleet.children[first_agent..]
        .iter()
        .map(|c| c.id())
        .collect();
    let engines: Vec<u32> = fleet.children[..first_agent]
        .iter()
        .map(|c| c.id())
        .collect();
    prom.wait(
        "every agent scraped",
        Duration::from_secs(120 + 2 * scrape_s),
        || prom.targets_up() == n,
    );
    // Settle: the warm-ups, the hung engines' detection, a few scrapes.
    std::thread::sleep(Duration::from_secs(30.max(3 * scrape_s)));

    // Measure.
    let ticks = clock_ticks();
    let cpu0: u64 = agents.iter().map(|&p| cpu_ticks(p)).sum();
    let ecpu0: u64 = engines.iter().map(|&p| cpu_ticks(p)).sum();
    let t0 = Instant::now();
    std::thread::sleep(measure);
    let secs = t0.elapsed().as_secs_f64();
    let cpu =
        (agents.iter().map(|&p| cpu_ticks(p)).sum::<u64>() - cpu0) as f64 / ticks as f64 / secs;
    let ecpu =
        (engines.iter().map(|&p| cpu_ticks(p)).sum::<u64>() - ecpu0) as f64 / ticks as f64 / secs;
    let agent_rss = agents.iter().map(|&p| rss(p)).sum::<u64>() as f64 / n as f64;
    let prom_rss = rss(prom.pid());
    let scalar = |q: &str| -> f64 {
        prom.query(q)
            .ok()
            .and_then(|r| r.first().cloned())
            .and_then(|v| v["value"][1].as_str()?.parse().ok())
            .unwrap_or(f64::NAN)
    };
    let m = measure.as_secs();
    let samples = scalar("avg(scrape_samples_scraped{job=\"npu-health-agent\"})");
    let samples_max = scalar("max(scrape_samples_scraped{job=\"npu-health-agent\"})");
    let dur_avg = scalar(&format!(
        "avg(avg_over_time(scrape_duration_seconds{{job=\"npu-health-agent\"}}[{m}s]))"
    ));
    let dur_max = scalar(&format!(
        "max(max_over_time(scrape_duration_seconds{{job=\"npu-health-agent\"}}[{m}s]))"
    ));
    let head = prom
        .api("status/tsdb")
        .ok()
        .and_then(|v| v["headStats"]["numSeries"].as_f64())
        .unwrap_or(f64::NAN);
    let bytes: Vec<usize> = admin
        .iter()
        .filter_map(|a| {
            support::stack::http("GET", &format!("http://127.0.0.1:{a}/metrics"), None)
                .map(|(_, b)| b.len())
        })
        .collect();
    let bytes_avg = bytes.iter().sum::<usize>() as f64 / bytes.len().max(1) as f64;
    // Where one agent's series go: the largest families.
    let (_, text) = support::stack::http(
        "GET",
        &format!("http://127.0.0.1:{}/metrics", admin[n - 1]),
        None,
    )
    .expect("an agent's /metrics");
    let mut families: std::collections::BTreeMap<String, usize> = Default::default();
    for l in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let name = l.split(['{', ' ']).next().unwrap_or_default();
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .filter(|f| text.contains(&format!("# TYPE {f} histogram")))
            .unwrap_or(name);
        *families.entry(family.to_owned()).or_default() += 1;
    }
    let mut by_size: Vec<(usize, String)> = families.into_iter().map(|(f, c)| (c, f)).collect();
    by_size.sort_by(|a, b| b.cmp(a));
    let per_agent_mem = (prom_rss.saturating_sub(prom_base)) as f64 / n as f64;
    println!(
        "fleet: {n} agents x {NPUS} fake NPUs x 2 engines, scrape {scrape}, measured {secs:.0} s"
    );
    println!(
        "| series per agent (samples per scrape, mean / max) | {samples:.0} / {samples_max:.0} |"
    );
    println!("| head series in Prometheus | {head:.0} |");
    println!("| bytes per scrape (mean, uncompressed) | {bytes_avg:.0} |");
    println!(
        "| scrape duration (mean / max) | {:.1} ms / {:.1} ms |",
        dur_avg * 1e3,
        dur_max * 1e3
    );
    println!(
        "| Prometheus RSS: before the agents / with them / per agent | {:.0} MiB / {:.0} MiB / {:.1} KiB |",
        prom_base as f64 / 1048576.0,
        prom_rss as f64 / 1048576.0,
        per_agent_mem / 1024.0
    );
    println!(
        "| the agents' CPU: total / per agent | {:.3} cores / {:.2} % of a core |",
        cpu,
        cpu / n as f64 * 100.0
    );
    println!(
        "| an agent's RSS (mean) | {:.1} MiB |",
        agent_rss / 1048576.0
    );
    println!("| the four shared fake engines' CPU (not the agents') | {ecpu:.3} cores |");
    let top: Vec<String> = by_size
        .iter()
        .take(6)
        .map(|(c, f)| format!("{f} {c}"))
        .collect();
    println!(
        "largest families of one agent ({} series in {} families): {}",
        by_size.iter().map(|(c, _)| c).sum::<usize>(),
        by_size.len(),
        top.join(", ")
    );
    assert!(samples > 0.0 && bytes_avg > 0.0 && cpu > 0.0);

    // The fleet dashboard: every query returns data.
    let queries = prometheus::dashboard_queries(
        &prometheus::repo().join("deploy/grafana/npu-health-fleet.json"),
        &format!("{}s", 4 * scrape_s),
    );
    assert!(queries.len() >= 15, "{queries:#?}");
    prometheus::wait_for_dashboard_data(
        &prom,
        &queries,
        EMPTY_BY_DESIGN,
        Duration::from_secs(5 * scrape_s + 30),
        "fleet dashboard",
    );
    println!("fleet dashboard: {} queries, all with data", queries.len());
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    poller.join().unwrap();
    // The hung engine's nodes are abnormal in the fleet view.
    let abnormal = prom
        .query("npu_health_agent_status{status=\"abnormal\"} == 1")
        .unwrap();
    let nodes: Vec<String> = abnormal
        .iter()
        .filter_map(|s| s["metric"]["instance"].as_str().map(str::to_owned))
        .collect();
    assert!(
        nodes.contains(&targets[0]) && nodes.contains(&targets[1]),
        "abnormal: {nodes:?}; agent 0's log:\n{}",
        std::fs::read_to_string(Path::new(d).join("agent0/agent.log")).unwrap_or_default()
    );
}

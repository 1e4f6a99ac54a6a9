//! The configuration's tests: one case per rule (the config text and the files it names,
//! the place the error names, and a fragment of the message), and the parsers of the
//! engine's addresses and NPU lists.
//!
//! One case per rule: the config text (and the files it names), the place the error
//! names, and a fragment of the message (the bound, where there is one).

use super::bounds::Shown;
use super::mindie::Role;
use super::*;
use crate::agent::preflight::host;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

const BASE: &str = r#"[agent]
admin_listen = "127.0.0.1:9400"

[[engine]]
name = "a"
engine_type = "vllm"
served_model_name = "m"
host = "127.0.0.1"
port = 8000
mgmt_port = 9001
devices = [0, 1]
"#;

/// A second engine, on its own ports.
const B: &str = "[[engine]]\nname = \"b\"\nengine_type = \"vllm\"\nserved_model_name = \"m\"\nhost = \"127.0.0.1\"\nport = 8001\nmgmt_port = 9002\n";

/// The NPUs the (pretend) driver reports.
const NPUS: &[u32] = &[0, 1];

/// What a case feeds the loader.
enum Input {
    /// `agent.toml` text; `{dir}` stands for the directory holding the fixtures.
    Text(String),
    /// A path given as the config file (`{dir}` as above).
    File(&'static str),
}

struct Case {
    rule: &'static str,
    input: Input,
    place: &'static str,
    says: &'static str,
}

/// BASE with `line` added to `[agent]`.
fn agent(line: &str) -> Input {
    Input::Text(BASE.replace("[agent]\n", &format!("[agent]\n{line}\n")))
}

/// BASE with `line` added to the engine's table.
fn top(line: &str) -> Input {
    Input::Text(BASE.replace("name = \"a\"\n", &format!("name = \"a\"\n{line}\n")))
}

/// BASE with `from` replaced by `to`.
fn set(from: &str, to: &str) -> Input {
    assert!(BASE.contains(from), "{from}");
    Input::Text(BASE.replacen(from, to, 1))
}

/// BASE followed by `text` (a sub-table of the engine, or another engine).
fn then(text: &str) -> Input {
    Input::Text(format!("{BASE}{text}\n"))
}

fn case(rule: &'static str, input: Input, place: &'static str, says: &'static str) -> Case {
    Case {
        rule,
        input,
        place,
        says,
    }
}

#[rustfmt::skip]
fn cases() -> Vec<Case> {
    vec![
        // [agent]: every number and duration (max_connections, header_read_timeout and
        // idle_timeout included), and the type errors.
        case("agent sample_period", agent("sample_period = \"1ns\""), "[agent] sample_period", "`1ns` is outside 10us..=1m"),
        case("agent npu_smi_delay", agent("npu_smi_delay = 0"), "[agent] npu_smi_delay", "`0` is outside 1..=100"),
        case("agent worker_threads", agent("worker_threads = 65"), "[agent] worker_threads", "`65` is outside 1..=64"),
        case("agent driver_call_deadline", agent("driver_call_deadline = \"1ms\""), "[agent] driver_call_deadline", "`1ms` is outside 10ms..=1m"),
        case("agent fault_period", agent("fault_period = \"2m\""), "[agent] fault_period", "`2m` is outside 10ms..=1m"),
        case("agent sampler_stuck_after", agent("sampler_stuck_after = \"1h\""), "[agent] sampler_stuck_after", "`1h` is outside 1s..=10m"),
        case("agent sampler_stuck_after above the deadline", agent("sampler_stuck_after = \"2s\"\ndriver_call_deadline = \"5s\""), "[agent] sampler_stuck_after", "must be longer than driver_call_deadline (`5s`)"),
        case("agent max_connections", agent("max_connections = 1"), "[agent] max_connections", "`1` is outside 4..=65536"),
        case("agent header_read_timeout", agent("header_read_timeout = \"10ms\""), "[agent] header_read_timeout", "`10ms` is outside 100ms..=2m"),
        case("agent idle_timeout", agent("idle_timeout = \"2h\""), "[agent] idle_timeout", "`2h` is outside 1s..=1h"),
        case("agent stall_timeout", agent("stall_timeout = \"500ms\""), "[agent] stall_timeout", "`500ms` is outside 1s..=10m"),
        case("agent backend type", agent("backend = \"gpu\""), "[agent] backend", "unknown variant `gpu`"),
        case("agent number type", agent("npu_smi_delay = \"1\""), "[agent] npu_smi_delay", "invalid type: string \"1\", expected u32"),
        case("unknown table", Input::Text(format!("[agnt]\nx = 1\n{BASE}")), "[agnt]", "unknown key `agnt`; did you mean `agent`?"),
        case("unknown top-level key", Input::Text(format!("bogus = 1\n{BASE}")), "bogus", "unknown key `bogus` (known keys: agent, engine)"),
        case("agent unknown key", agent("sample_periood = \"5s\""), "[agent] sample_periood", "unknown key `sample_periood`; did you mean `sample_period`?"),
        // [[engine]]: type errors name the table and key.
        case("engine port type", set("port = 8000", "port = \"abc\""), "[[engine]] #1 (a) port", "invalid type: string \"abc\", expected u16"),
        case("engine duplicate key", set("port = 8000", "port = 8000\nport = 8002"), "[[engine]] #1 (a) port", "duplicate key"),
        case("engine port range (type)", set("port = 8000", "port = 70000"), "[[engine]] #1 (a) port", "invalid value: integer `70000`, expected u16"),
        case("engine devices type", set("devices = [0, 1]", "devices = [-1]"), "[[engine]] #1 (a) devices[0]", "invalid value: integer `-1`, expected u32"),
        case("engine unknown key", top("device = [0]"), "[[engine]] #1 (a) device", "unknown key `device`; did you mean `devices`?"),
        case("engine missing key", set("port = 8000\n", ""), "[[engine]] #1 (a)", "missing field `port`"),
        // [[engine]]: bounds.
        case("engine port zero", set("port = 8000", "port = 0"), "[[engine]] #1 (a) port", "`0` is outside 1..=65535"),
        case("engine mgmt_port zero", set("mgmt_port = 9001", "mgmt_port = 0"), "[[engine]] #1 (a) mgmt_port", "`0` is outside 1..=65535"),
        case("engine dp_rank", top("dp_rank = 70000"), "[[engine]] #1 (a) dp_rank", "`70000` is outside 0..=65535"),
        case("engine devices empty", set("devices = [0, 1]", "devices = []"), "[[engine]] #1 (a) devices", "0 NPUs is outside 1..=256"),
        case("engine devices twice", set("devices = [0, 1]", "devices = [1, 1]"), "[[engine]] #1 (a) devices[1]", "NPU 1 is listed twice"),
        case("engine visible devices twice", set("devices = [0, 1]", "engine_env = { ASCEND_RT_VISIBLE_DEVICES = \"1,1\" }"), "[[engine]] #1 (a) devices[1]", "NPU 1 (from ASCEND_RT_VISIBLE_DEVICES from engine_env) is listed twice"),
        case("engine name newline", set("name = \"a\"", "name = \"a\\nb\""), "[[engine]] #1 (a\\nb) name", "contains the control character U+000A"),
        case("engine name control character", set("name = \"a\"", "name = \"a\\u001b[31m\""), "[[engine]] #1 (a\\u{1b}[31m) name", "control character U+001B"),
        case("engine name empty", set("name = \"a\"", "name = \"\""), "[[engine]] #1 () name", "has 0 characters, outside 1..=128"),
        // Hardening round 2: the name grammar.
        case("engine name slash", set("name = \"a\"", "name = \"a/b\""), "[[engine]] #1 (a/b) name", "\"a/b\" is not a name ('/' at 1)"),
        case("engine name leading space", set("name = \"a\"", "name = \" a\""), "[[engine]] #1 ( a) name", "(' ' at 0)"),
        case("engine name trailing space", set("name = \"a\"", "name = \"a \""), "[[engine]] #1 (a ) name", "(' ' at 1)"),
        case("engine name leading dash", set("name = \"a\"", "name = \"-a\""), "[[engine]] #1 (-a) name", "('-' at 0)"),
        case("engine name quote", set("name = \"a\"", "name = \"a\\\"b\""), "[[engine]] #1 (a\\\"b) name", "is not a name"),
        // Between engines, and addresses that point the agent at itself.
        case("engine name twice", then(&B.replace("\"b\"", "\"a\"")), "[[engine]] #2 (a) name", "\"a\" is used twice"),
        case("engine mgmt address twice", then(&B.replace("9002", "9001")), "[[engine]] #2 (b) mgmt_port", "`9001` is also the mgmt_port of engine \"a\""),
        case("engine port is its mgmt_port", set("mgmt_port = 9001", "mgmt_port = 8000"), "[[engine]] #1 (a) port", "`8000` is also this engine's mgmt_port on 127.0.0.1"),
        case("engine port is its mgmt_port on 0.0.0.0", set("mgmt_port = 9001", "mgmt_port = 8000\nmgmt_host = \"0.0.0.0\""), "[[engine]] #1 (a) port", "this engine's mgmt_port on 0.0.0.0"),
        case("engine port is another's mgmt_port", then(&B.replace("8001", "9001")), "[[engine]] #2 (b) port", "`9001` is the mgmt_port of engine \"a\""),
        case("admin_listen type", agent("").replace_admin("here"), "[agent] admin_listen", "\"here\" is not an address"),
        case("admin_listen is an engine's port", agent("").replace_admin("127.0.0.1:8000"), "[agent] admin_listen", "`127.0.0.1:8000` is the inference address of engine \"a\""),
        case("admin_listen is a mgmt_port", agent("").replace_admin("127.0.0.1:9001"), "[agent] admin_listen", "port `9001` is also the mgmt_port of engine \"a\""),
        case("haproxy_agent_listen type", agent("haproxy_agent_listen = \"here\""), "[agent] haproxy_agent_listen", "\"here\" is not an address"),
        case("haproxy_agent_listen is a mgmt_port", agent("haproxy_agent_listen = \"127.0.0.1:9001\""), "[agent] haproxy_agent_listen", "port `9001` is also the mgmt_port of engine \"a\""),
        case("haproxy_agent_listen is an engine's port", agent("haproxy_agent_listen = \"127.0.0.1:8000\""), "[agent] haproxy_agent_listen", "`127.0.0.1:8000` is the inference address of engine \"a\""),
        case("haproxy_agent_listen is the admin listener", agent("haproxy_agent_listen = \"0.0.0.0:9400\""), "[agent] haproxy_agent_listen", "`0.0.0.0:9400` is also [agent] admin_listen"),
        case("pod_resources_socket relative", agent("pod_resources_socket = \"pod-resources/kubelet.sock\""), "[agent] pod_resources_socket", "\"pod-resources/kubelet.sock\" is not an absolute path"),
        case("pod_resources_socket too long", agent(&format!("pod_resources_socket = \"/{}\"", "x".repeat(107))), "[agent] pod_resources_socket", "is 108 bytes, over the 107 a unix socket path holds"),
        case("pod_resources_period", agent("pod_resources_socket = \"/k.sock\"\npod_resources_period = \"20m\""), "[agent] pod_resources_period", "`20m` is outside 100ms..=10m"),
        case("pod_resources_period without a socket", agent("pod_resources_period = \"1s\""), "[agent] pod_resources_period", "there is no pod_resources_socket"),
        case("haproxy maxconn zero", then("[engine.actions.haproxy]\nmaxconn = 0"), "[[engine]] #1 (a) actions.haproxy.maxconn", "would leave HAProxy's queued requests waiting"),
        case("haproxy state unknown", then("[engine.actions.haproxy]\ndegrade = \"backup\""), "[[engine]] #1 (a) actions.haproxy.degrade", "unknown variant `backup`"),
        // [engine.timing]
        case("timing type", then("[engine.timing]\ninterval = \"five seconds\""), "[[engine]] #1 (a) timing.interval", "\"five seconds\" is not a duration"),
        case("timing warmup_timeout", then("[engine.timing]\nwarmup_timeout = \"0s\""), "[[engine]] #1 (a) timing.warmup_timeout", "`0s` is outside 1s..=1h"),
        case("timing request_timeout", then("[engine.timing]\nrequest_timeout = \"1h\""), "[[engine]] #1 (a) timing.request_timeout", "`1h` is outside 50ms..=10m"),
        case("timing window", then("[engine.timing]\nwindow = \"2h\""), "[[engine]] #1 (a) timing.window", "`2h` is outside 50ms..=10m"),
        case("timing interval", then("[engine.timing]\ninterval = \"1ms\""), "[[engine]] #1 (a) timing.interval", "`1ms` is outside 50ms..=1h"),
        case("timing high_load_interval", then("[engine.timing]\nhigh_load_interval = \"2h\""), "[[engine]] #1 (a) timing.high_load_interval", "`2h` is outside 50ms..=1h"),
        case("timing high_load_threshold NaN", then("[engine.timing]\nhigh_load_threshold = nan"), "[[engine]] #1 (a) timing.high_load_threshold", "`NaN` is outside 0..=100"),
        case("timing high_load_threshold -1", then("[engine.timing]\nhigh_load_threshold = -1.0"), "[[engine]] #1 (a) timing.high_load_threshold", "`-1` is outside 0..=100"),
        case("timing high_load_threshold 1e300", then("[engine.timing]\nhigh_load_threshold = 1e300"), "[[engine]] #1 (a) timing.high_load_threshold", "`1e300` is outside 0..=100"),
        case("timing health_period", then("[engine.timing]\nhealth_period = \"1ns\""), "[[engine]] #1 (a) timing.health_period", "`1ns` is outside 50ms..=1m"),
        case("timing health_timeout", then("[engine.timing]\nhealth_timeout = \"1ms\""), "[[engine]] #1 (a) timing.health_timeout", "`1ms` is outside 50ms..=10m"),
        case("timing serving_evidence_max_age", then("[engine.timing]\nserving_evidence_max_age = \"1ms\""), "[[engine]] #1 (a) timing.serving_evidence_max_age", "`1ms` is outside 50ms..=2h (or `0s`"),
        // [engine.qos]
        case("qos ttft_budget", then("[engine.qos]\nttft_budget = \"0s\""), "[[engine]] #1 (a) qos.ttft_budget", "`0s` is outside 10ms..=10m"),
        case("qos weight NaN", then("[engine.qos]\nweights = { latency = nan, memory = 0.3, progress = 0.2 }"), "[[engine]] #1 (a) qos.weights.latency", "`NaN` is outside 0..=100"),
        case("qos weights all zero", then("[engine.qos]\nweights = { latency = 0.0, memory = 0.0, progress = 0.0 }"), "[[engine]] #1 (a) qos.weights", "at least one weight must be above 0"),
        case("qos weights type", then("[engine.qos]\nweights = { latency = \"x\", memory = 0.3, progress = 0.2 }"), "[[engine]] #1 (a) qos.weights.latency", "invalid type"),
        case("qos kv_headroom_full", then("[engine.qos]\nkv_headroom_full = 0.0"), "[[engine]] #1 (a) qos.kv_headroom_full", "`0` is outside (0, 1]"),
        case("qos hysteresis", then("[engine.qos]\nhysteresis = 0.5"), "[[engine]] #1 (a) qos.hysteresis", "`0.5` is outside [0, 0.3)"),
        case("qos evict_after", then("[engine.qos]\nevict_after = 0"), "[[engine]] #1 (a) qos.evict_after", "`0` is outside 1..=1000"),
        case("qos probe_max_tokens", then("[engine.qos]\nprobe_max_tokens = 1000"), "[[engine]] #1 (a) qos.probe_max_tokens", "`1000` is outside 1..=256"),
        case("qos period", then("[engine.qos]\nperiod = \"1ms\""), "[[engine]] #1 (a) qos.period", "`1ms` is outside 50ms..=10m"),
        case("qos metrics_period", then("[engine.qos]\nmetrics_period = \"1h\""), "[[engine]] #1 (a) qos.metrics_period", "`1h` is outside 50ms..=10m"),
        case("qos max_input_age", then("[engine.qos]\nmax_input_age = \"2h\""), "[[engine]] #1 (a) qos.max_input_age", "`2h` is outside 100ms..=1h"),
        case("qos stall_window", then("[engine.qos]\nstall_window = \"0s\""), "[[engine]] #1 (a) qos.stall_window", "`0s` is outside 100ms..=1h"),
        // [engine.health_check_config] inline, and MindIE's user_config.json.
        case("health_collector_timeout >= 1", then("[engine.health_check_config]\nhealth_collector_timeout = 0"), "[[engine]] #1 (a)", "health_collector_timeout must be >= 1, got 0"),
        case("health_collector_timeout <= 3600", then("[engine.health_check_config]\nhealth_collector_timeout = 7200"), "[[engine]] #1 (a)", "health_collector_timeout must be <= 3600, got 7200"),
        case("retry_attempts <= 100", then("[engine.health_check_config]\nhealth_collector_timeout_retry_attempts = 1000"), "[[engine]] #1 (a)", "health_collector_timeout_retry_attempts must be <= 100, got 1000"),
        case("npu_usage_threshold NaN", then("[engine.health_check_config]\nnpu_usage_threshold = nan"), "[[engine]] #1 (a) health_check_config.npu_usage_threshold", "`NaN` is not a finite number"),
        case("max_failure_count inf", then("[engine.health_check_config]\nmax_failure_count = inf"), "[[engine]] #1 (a) health_check_config.max_failure_count", "`inf` is not a finite number"),
        case("user_config.json health_collector_timeout", Input::Text(uc_engine("{dir}/slow.json")), "[[engine]] #1 (a) config_path", "health_collector_timeout must be <= 3600, got 86400"),
        // Issue 48: no model for the virtual request, named where the engine was written.
        case("inline served_model_name missing", set("served_model_name = \"m\"\n", ""), "[[engine]] #1 (a) served_model_name", "missing: virtual inference is on, and its request names the model (on by default for an engine in agent.toml)"),
        case("user_config.json served_model_name missing", Input::Text(uc_engine("{dir}/nomodel.json")), "[[engine]] #1 (a) config_path", "motor_engine_prefill_config.engine_config.served_model_name (or motor_engine_prefill_config.engine_config.model) is missing in {dir}/nomodel.json: virtual inference is on"),
        // Files that are not regular files, or too large.
        case("config is a FIFO", Input::File("{dir}/fifo"), "", "is a FIFO, not a regular file"),
        case("config is /dev/zero", Input::File("/dev/zero"), "", "is a character device, not a regular file"),
        case("config is a directory", Input::File("{dir}"), "", "is a directory, not a regular file"),
        case("config too large", Input::File("{dir}/big"), "", "is larger than 4 MiB"),
        case("user_config.json is a FIFO", Input::Text(uc_engine("{dir}/fifo")), "[[engine]] #1 (a) config_path", "is a FIFO"),
        case("env.json is a FIFO", top("env_config_path = \"{dir}/fifo\""), "[[engine]] #1 (a) env_config_path", "is a FIFO"),
        case("env.json is /dev/zero", agent("env_config_path = \"/dev/zero\""), "[[engine]] #1 (a) env_config_path (from [agent])", "is a character device"),
        // What needs the host: NPUs and TLS files.
        case("NPU the driver does not report", set("devices = [0, 1]", "devices = [0, 7]"), "[[engine]] #1 (a) devices", "NPU 7 is not one the driver reports; NPUs found: [0, 1]"),
        case("mgmt TLS cert missing", top("mgmt_tls_config = { enable_tls = true, cert_file = \"{dir}/absent.crt\", key_file = \"{dir}/server.key\" }"), "[[engine]] #1 (a) mgmt_tls_config.cert_file", "absent.crt cannot read"),
        case("mgmt TLS key missing", top("mgmt_tls_config = { enable_tls = true, cert_file = \"{dir}/server.crt\", key_file = \"{dir}/absent.key\" }"), "[[engine]] #1 (a) mgmt_tls_config.key_file", "absent.key cannot read"),
        case("mgmt TLS cert a FIFO", top("mgmt_tls_config = { enable_tls = true, cert_file = \"{dir}/fifo\", key_file = \"{dir}/server.key\" }"), "[[engine]] #1 (a) mgmt_tls_config.cert_file", "is a FIFO"),
        case("mgmt TLS cert not PEM", top("mgmt_tls_config = { enable_tls = true, cert_file = \"{dir}/garbage.crt\", key_file = \"{dir}/server.key\" }"), "[[engine]] #1 (a) mgmt_tls_config", "no certificate in the file"),
        case("infer TLS ca missing", top("infer_tls_config = { enable_tls = true, ca_file = \"{dir}/absent-ca.crt\" }"), "[[engine]] #1 (a) infer_tls_config.ca_file", "absent-ca.crt cannot read"),
        case("mgmt TLS in user_config.json", Input::Text(uc_engine("{dir}/tls.json")), "[[engine]] #1 (a) mgmt_tls_config.cert_file", "(set in {dir}/tls.json (motor_engine_prefill_config))"),
    ]
}

/// BASE with the engine read from a user_config.json at `path`.
fn uc_engine(path: &str) -> String {
    BASE.replace(
        "engine_type = \"vllm\"\nserved_model_name = \"m\"\n",
        &format!("config_path = \"{path}\"\nrole = \"prefill\"\n"),
    )
}

trait ReplaceAdmin {
    fn replace_admin(self, addr: &str) -> Input;
}

impl ReplaceAdmin for Input {
    fn replace_admin(self, addr: &str) -> Input {
        match self {
            Input::Text(t) => Input::Text(t.replace("127.0.0.1:9400", addr)),
            other => other,
        }
    }
}

/// The fixtures cases name: a FIFO, a file over the cap, TLS material, user_config.json.
fn fixtures(dir: &Path) {
    super::read::mkfifo(&dir.join("fifo"));
    std::fs::write(
        dir.join("big"),
        vec![b'#'; super::read::MAX_BYTES as usize + 1],
    )
    .unwrap();
    // server.crt and server.key, a usable pair.
    crate::tls::tests::write_pair(dir);
    std::fs::write(dir.join("garbage.crt"), "not a certificate\n").unwrap();
    let section = |extra: &str| {
        format!(
            r#"{{"motor_engine_prefill_config": {{"engine_type": "vllm", "engine_config": {{"served_model_name": "m"}}{extra}}}}}"#
        )
    };
    std::fs::write(
        dir.join("slow.json"),
        section(r#", "health_check_config": {"health_collector_timeout": 86400}"#),
    )
    .unwrap();
    std::fs::write(
        dir.join("nomodel.json"),
        r#"{"motor_engine_prefill_config": {"engine_type": "vllm", "engine_config": {}, "health_check_config": {"enable_virtual_inference": true}}}"#,
    )
    .unwrap();
    std::fs::write(
        dir.join("tls.json"),
        section(r#", "mgmt_tls_config": {"enable_tls": true, "cert_file": "absent.crt", "key_file": "server.key"}"#),
    )
    .unwrap();
}

/// The error the loader and the host checks give for `input` (what `check-config` and
/// `run` report).
fn error_for(input: &Input, dir: &Path) -> (PathBuf, ConfigError) {
    let fill = |s: &str| s.replace("{dir}", &dir.display().to_string());
    let path = match input {
        Input::Text(t) => {
            let p = dir.join("agent.toml");
            std::fs::write(&p, fill(t)).unwrap();
            p
        }
        Input::File(p) => PathBuf::from(fill(p)),
    };
    let result = super::file::load(&path).and_then(|cfg| host(&cfg, Some(NPUS)));
    match result {
        Ok(()) => panic!(
            "accepted: {}",
            std::fs::read_to_string(&path).unwrap_or_default()
        ),
        Err(e) => (path, e),
    }
}

// The bounds written here as numbers are the runtime's own limits: the ring tells this many
// NPUs apart, and the sampler's periods are these (it reads them from here).
#[test]
fn the_written_bounds_are_the_runtimes_limits() {
    assert_eq!(engine::bounds::DEVICES.max, crate::ring::MAX_DEVICES);
    assert_eq!(
        (
            agent::bounds::SAMPLE_PERIOD.min,
            agent::bounds::SAMPLE_PERIOD.max
        ),
        (crate::sampler::MIN_PERIOD, crate::sampler::MAX_PERIOD)
    );
}

#[test]
fn every_rule_names_the_file_the_place_and_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    fixtures(dir.path());
    let mut failures = Vec::new();
    for c in cases() {
        let (path, e) = error_for(&c.input, dir.path());
        let says = c.says.replace("{dir}", &dir.path().display().to_string());
        // A syntax error (a duplicate key is one) also names its line and column.
        let file = path.display().to_string();
        let at_line = e.file.strip_prefix(&file).is_some_and(|rest| {
            rest.is_empty()
                || (rest.starts_with(':')
                    && rest[1..].split(':').count() == 2
                    && rest[1..].split(':').all(|n| n.parse::<usize>().is_ok()))
        });
        let ok = at_line
            && e.place.trim_end_matches(": ") == c.place
            && e.message.contains(&says)
            && !e.message.contains("got None");
        if !ok {
            failures.push(format!(
                "{}: want `{}` … {says:?}; got `{}` … {:?} (file {})",
                c.rule, c.place, e.place, e.message, e.file
            ));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn the_base_config_and_every_default_are_valid() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("agent.toml");
    std::fs::write(&p, format!("{BASE}{B}")).unwrap();
    let cfg = super::file::load(&p).unwrap();
    host(&cfg, Some(NPUS)).unwrap();
    assert_eq!(cfg.engines[0].timing, crate::config::Timing::default());
    // Without a driver backend the NPUs are not checked (run starts without figures).
    let p2 = dir.path().join("other.toml");
    std::fs::write(&p2, BASE.replace("[0, 1]", "[0, 7]")).unwrap();
    host(&super::file::load(&p2).unwrap(), None).unwrap();
}

/// The engine-server flags of single-engine mode: the prefill engine of `uc` on 127.0.0.1.
fn single_flags(
    uc: &Path,
    port: u16,
    mgmt: u16,
    devices: Option<Vec<u32>>,
) -> crate::config::SingleEngine {
    crate::config::SingleEngine {
        config_path: uc.to_path_buf(),
        role: Role::Prefill,
        host: "127.0.0.1".to_owned(),
        port,
        mgmt_port: mgmt,
        dp_rank: 0,
        devices,
        env_config_path: None,
        qos: crate::config::qos::QosConfig::default(),
        qos_set: Vec::new(),
    }
}

// Issue 48: virtual inference is on by default for an engine written in agent.toml; an
// engine read from MindIE's user_config.json, in host or single-engine mode, keeps MindIE's
// default (off), and a value written anywhere wins.
#[test]
fn virtual_inference_is_on_by_default_only_for_engines_written_in_agent_toml() {
    let dir = tempfile::tempdir().unwrap();
    let uc = dir.path().join("user_config.json");
    std::fs::write(
        &uc,
        r#"{"motor_engine_prefill_config": {"engine_type": "vllm", "engine_config": {"served_model_name": "m"}}}"#,
    )
    .unwrap();
    let enabled = |text: &str| {
        let p = dir.path().join("agent.toml");
        std::fs::write(&p, text).unwrap();
        super::file::load(&p).unwrap().engines[0]
            .health_check_config
            .enable_virtual_inference
    };
    assert!(enabled(BASE), "inline, nothing written: on");
    assert!(
        enabled(&format!(
            "{BASE}[engine.health_check_config]\nnpu_usage_threshold = 10\n"
        )),
        "inline, the table without the key: on"
    );
    assert!(!enabled(&format!(
        "{BASE}[engine.health_check_config]\nenable_virtual_inference = false\n"
    )));
    assert!(
        !enabled(&uc_engine(&uc.display().to_string())),
        "from user_config.json: MindIE's default"
    );
    let single = AgentConfig::single(
        &single_flags(&uc, 8000, 9001, None),
        AgentSettings::default(),
    )
    .unwrap();
    assert!(
        !single.engines[0]
            .health_check_config
            .enable_virtual_inference,
        "single-engine mode: MindIE's default"
    );
    // In single-engine mode a missing model names MindIE's JSON path in the file itself.
    std::fs::write(
        &uc,
        r#"{"motor_engine_prefill_config": {"engine_type": "vllm", "health_check_config": {"enable_virtual_inference": true}}}"#,
    )
    .unwrap();
    let e = AgentConfig::single(
        &single_flags(&uc, 8000, 9001, None),
        AgentSettings::default(),
    )
    .unwrap_err();
    assert_eq!(
        (e.file.clone(), e.place.as_str()),
        (uc.display().to_string(), "")
    );
    assert!(
        e.message
            .starts_with("motor_engine_prefill_config.engine_config.served_model_name (or motor_engine_prefill_config.engine_config.model) is missing in "),
        "{e}"
    );
}

// Issue 48: what check-config says of a valid configuration that may not do what was meant:
// each engine with virtual inference off, with the key that turns it on where the engine was
// written (agent.toml, or MindIE's JSON path in its file), and each /status on loopback, with
// the key that moves it (the flag in single-engine mode).
#[test]
fn virtual_inference_off_and_a_status_on_loopback_name_the_key_to_set() {
    let dir = tempfile::tempdir().unwrap();
    let uc = dir.path().join("user_config.json");
    std::fs::write(
        &uc,
        r#"{"motor_engine_prefill_config": {"engine_type": "vllm", "engine_config": {"served_model_name": "m"}}}"#,
    )
    .unwrap();
    let text = format!(
        "{BASE}[engine.health_check_config]\nenable_virtual_inference = false\n{}mgmt_host = \"0.0.0.0\"\n[[engine]]\nname = \"c\"\nconfig_path = \"user_config.json\"\nrole = \"prefill\"\nhost = \"127.0.0.1\"\nport = 8002\nmgmt_host = \"::1\"\nmgmt_port = 9003\n",
        B
    );
    let p = dir.path().join("agent.toml");
    std::fs::write(&p, text).unwrap();
    let cfg = super::file::load(&p).unwrap();
    let hung = "virtual inference is off, so a hung engine (alive, /health 200, no token out) is never reported abnormal";
    assert_eq!(
        cfg.virtual_inference_off(),
        [
            format!(
                "engine a: {hung}; set [[engine]] #1 (a) health_check_config.enable_virtual_inference = true"
            ),
            format!(
                "engine c: {hung}; set motor_engine_prefill_config.health_check_config.enable_virtual_inference to true in {}",
                uc.display()
            ),
        ]
    );
    let unreachable =
        "a loopback address: a Node Manager on another host or in another pod cannot reach it";
    assert_eq!(
        cfg.loopback_status(),
        [
            format!(
                "engine a's /status listens on 127.0.0.1:9001, {unreachable}; set [[engine]] #1 (a) mgmt_host to \"0.0.0.0\" or the node's address where it polls from elsewhere"
            ),
            format!(
                "engine c's /status listens on [::1]:9003, {unreachable}; set [[engine]] #3 (c) mgmt_host to \"0.0.0.0\" or the node's address where it polls from elsewhere"
            ),
        ]
    );
    let single = AgentConfig::single(
        &single_flags(&uc, 8000, 9001, None),
        AgentSettings::default(),
    )
    .unwrap();
    assert_eq!(
        single.virtual_inference_off(),
        [format!(
            "engine prefill-0: {hung}; set motor_engine_prefill_config.health_check_config.enable_virtual_inference to true in {}",
            uc.display()
        )]
    );
    assert!(
        single.loopback_status()[0].contains("; set --host to \"0.0.0.0\""),
        "{:?}",
        single.loopback_status()
    );
}

#[test]
fn single_engine_mode_names_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let uc = dir.path().join("user_config.json");
    std::fs::write(
        &uc,
        r#"{"motor_engine_prefill_config": {"engine_type": "vllm", "engine_config": {"served_model_name": "m"}}}"#,
    )
    .unwrap();
    let flags = |port, mgmt, devices| single_flags(&uc, port, mgmt, devices);
    let single = |f| AgentConfig::single(&f, AgentSettings::default());
    let e = single(flags(8000, 8000, None)).unwrap_err();
    assert_eq!(
        (e.place.as_str(), e.file.clone()),
        ("--port: ", uc.display().to_string())
    );
    assert!(e.message.contains("also this engine's mgmt_port"), "{e}");
    let e = single(flags(8000, 9001, Some(vec![]))).unwrap_err();
    assert_eq!(e.place, "--devices: ");
    let cfg = single(flags(8000, 9001, Some(vec![0, 7]))).unwrap();
    let e = host(&cfg, Some(NPUS)).unwrap_err();
    assert!(
        e.to_string()
            .contains("--devices: NPU 7 is not one the driver reports"),
        "{e}"
    );
}

#[test]
fn bounds_show_values_the_way_configs_write_them() {
    assert_eq!(
        timing::bounds::HEALTH_PERIOD.check("k", Duration::from_nanos(1)),
        Err(("k".to_owned(), "`1ns` is outside 50ms..=1m".to_owned()))
    );
    assert!(
        timing::bounds::HIGH_LOAD_THRESHOLD
            .check("k", f64::NAN)
            .unwrap_err()
            .1
            .starts_with("`NaN`")
    );
    assert_eq!(f64::INFINITY.shown(), "inf");
    assert_eq!(80.0_f64.shown(), "80");
    assert_eq!(0.05_f64.shown(), "0.05");
    assert_eq!(
        timing::bounds::WINDOW.clamp(Duration::ZERO),
        Duration::from_millis(50)
    );
}

#[test]
fn visible_devices() {
    assert_eq!(parse_visible_devices("0,1, 3").unwrap(), vec![0, 1, 3]);
    assert!(parse_visible_devices("0,x").unwrap_err().contains("\"x\""));
    assert!(parse_visible_devices("").is_err());
}

#[test]
fn listen_addresses() {
    assert_eq!(
        listen_addr("127.0.0.1", 9001).unwrap().to_string(),
        "127.0.0.1:9001"
    );
    assert_eq!(
        listen_addr("[::1]", 9001).unwrap().to_string(),
        "[::1]:9001"
    );
    assert!(
        listen_addr("localhost", 1)
            .unwrap_err()
            .contains("IPv4 or IPv6")
    );
}

#[test]
fn env_sources_are_authoritative() {
    let table = EngineEnv::Table {
        vars: BTreeMap::from([("A".to_owned(), "1".to_owned())]),
    };
    assert_eq!(table.lookup(Role::Prefill, "A").unwrap().value, "1");
    // PATH is set for the agent but the table is the engine's whole environment.
    assert_eq!(table.lookup(Role::Prefill, "PATH"), None);
    assert!(
        EngineEnv::AgentProcess
            .lookup(Role::Prefill, "PATH")
            .is_some()
    );
}

/// The keys a table of the configuration knows, as its unknown-key error lists them (`text`
/// writes `zz_not_a_key` in that table).
fn known_keys(text: &str) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("agent.toml");
    std::fs::write(&p, text).unwrap();
    let e = super::file::load(&p)
        .err()
        .unwrap_or_else(|| panic!("zz_not_a_key accepted in:\n{text}"));
    let m = e.to_string();
    let list = m
        .split_once("known keys: ")
        .map(|(_, l)| l.trim_end_matches(')').to_owned())
        .unwrap_or_else(|| panic!("no list of known keys in {m:?}"));
    list.split(", ").map(str::to_owned).collect()
}

/// The table rows of `docs/configuration.md`'s section `heading` (up to the next heading)
/// that name a key, each without its leading `` | ` ``.
fn documented_rows(heading: &str) -> Vec<String> {
    let doc = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/configuration.md"),
    )
    .unwrap();
    let start = doc
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("docs/configuration.md has no {heading:?}"));
    let body = &doc[start + heading.len() + 2..];
    body.lines()
        .take_while(|l| !l.starts_with('#'))
        .filter_map(|l| l.strip_prefix("| `"))
        .map(str::to_owned)
        .collect()
}

/// The keys in the first column of the tables of `docs/configuration.md`'s section `heading`
/// (up to the next heading of the same or a higher level), without `(alias …)` notes.
fn documented_keys(heading: &str) -> Vec<String> {
    let mut keys = Vec::new();
    for cell in documented_rows(heading)
        .iter()
        .filter_map(|l| l.split(" |").next())
    {
        // `key` or `key` (alias `other`): every name in backquotes of the first cell.
        keys.extend(
            cell.split('`')
                .enumerate()
                .filter(|(i, _)| i % 2 == 0)
                .map(|(_, k)| k.to_owned())
                .filter(|k| !k.is_empty() && !k.starts_with("--")),
        );
    }
    keys
}

// Issue 42: docs/configuration.md lists every key of every table, and no key that is not one:
// the keys come from the types themselves (each table's unknown-key error lists them), so a
// key added, renamed or removed without its line in the reference fails here.
#[test]
fn the_configuration_reference_lists_every_key_and_no_other() {
    const Z: &str = "zz_not_a_key = 1";
    let engine = |table: &str| format!("{BASE}[engine.{table}]\n{Z}\n");
    let tables: Vec<(&str, String, &str)> = vec![
        (
            "## `[agent]`",
            BASE.replace("[agent]\n", &format!("[agent]\n{Z}\n")),
            "",
        ),
        (
            "## `[[engine]]`",
            BASE.replace("name = \"a\"\n", &format!("name = \"a\"\n{Z}\n")),
            "",
        ),
        (
            "### `health_check_config`",
            format!("{BASE}[engine.health_check_config]\n{Z}\n"),
            "",
        ),
        ("## `[engine.timing]`", engine("timing"), ""),
        ("## `[engine.qos]`", engine("qos"), ""),
        ("## `[engine.agent_policy]`", engine("agent_policy"), ""),
        (
            "## `[engine.actions]` and `[engine.actions.haproxy]`",
            engine("actions"),
            "",
        ),
        (
            "## `[engine.actions]` and `[engine.actions.haproxy]`",
            engine("actions.haproxy"),
            "haproxy.",
        ),
        (
            "## `[agent.kubernetes]` and `[engine.kubernetes]`",
            BASE.replace(
                "[agent]\n",
                &format!("[agent]\n[agent.kubernetes]\n{Z}\n[agent]\n"),
            )
            .replacen("[agent]\n", "", 1),
            "",
        ),
        (
            "## `[agent.kubernetes]` and `[engine.kubernetes]`",
            engine("kubernetes"),
            "",
        ),
    ];
    let mut problems = Vec::new();
    for (heading, text, prefix) in &tables {
        let documented = documented_keys(heading);
        let known = known_keys(text);
        // A sub-table is a key of its table with a section of its own.
        let sub_tables = [
            "kubernetes",
            "timing",
            "qos",
            "agent_policy",
            "actions",
            "haproxy",
            "health_check_config",
        ];
        for k in known.iter().filter(|k| !sub_tables.contains(&k.as_str())) {
            let k = format!("{prefix}{k}");
            if !documented.contains(&k) {
                problems.push(format!("{heading}: `{k}` is a key and is not documented"));
            }
        }
        for k in documented.iter().filter(|k| k.starts_with(prefix)) {
            let bare = &k[prefix.len()..];
            // A sub-table's keys (`haproxy.x`) are checked with it.
            if prefix.is_empty() && bare.contains('.') {
                continue;
            }
            let all: Vec<&Vec<String>> = tables
                .iter()
                .filter(|(h, _, p)| h == heading && p == prefix)
                .map(|_| &known)
                .collect();
            if !all.iter().any(|ks| ks.iter().any(|x| x == bare)) {
                problems.push(format!("{heading}: `{k}` is documented and is not a key"));
            }
        }
    }
    // The two tables under one heading share its list: what one of them lacks the other has.
    problems.retain(|p| {
        let Some((heading, rest)) = p.split_once(": `") else {
            return true;
        };
        let Some(key) = rest.split('`').next() else {
            return true;
        };
        !(p.ends_with("is documented and is not a key")
            && tables
                .iter()
                .filter(|(h, ..)| *h == heading)
                .any(|(_, text, prefix)| {
                    key.strip_prefix(prefix)
                        .is_some_and(|b| known_keys(text).iter().any(|x| x == b))
                }))
    });
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

// Issue 49: the integrations' tables are theirs, registered through the seam; the reference
// is checked against every table of the list too (the keys its unknown-key error names), so
// an integration's table cannot go undocumented: each key is in the section that names its
// table (`[engine.actions.haproxy]`), or a single key in its parent's (`not_ready_on`).
#[test]
fn the_configuration_reference_lists_every_key_of_every_integrations_table() {
    use super::tables::At;
    const Z: &str = "zz_not_a_key = 1";
    let doc = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/configuration.md"),
    )
    .unwrap();
    let heading = |table: &str| {
        doc.lines()
            .find(|l| l.starts_with('#') && l.contains(&format!("`[{table}]`")))
            .map(str::to_owned)
    };
    let readers = super::tables::listed();
    assert!(readers.len() >= 4, "the list's tables: {}", readers.len());
    let mut problems = Vec::new();
    for r in readers {
        let (at, text) = match r.at() {
            At::Agent => (
                "agent",
                BASE.replacen(
                    "[[engine]]",
                    &format!("[agent.{}]\n{Z}\n\n[[engine]]", r.path()),
                    1,
                ),
            ),
            At::Engine => ("engine", format!("{BASE}[engine.{}]\n{Z}\n", r.path())),
        };
        let table = format!("{at}.{}", r.path());
        let (parent, last) = r.path().rsplit_once('.').unwrap_or(("", r.path()));
        match heading(&table) {
            // A table: each of its keys, bare or under its name (`haproxy.maxconn`).
            Some(h) => {
                let documented = documented_keys(&h);
                for k in known_keys(&text) {
                    if !documented.contains(&k) && !documented.contains(&format!("{last}.{k}")) {
                        problems.push(format!("{h}: `{k}` of [{table}] is not documented"));
                    }
                }
            }
            // A key of its parent table.
            None => match heading(&format!("{at}.{parent}")) {
                Some(h) if documented_keys(&h).iter().any(|k| k == last) => {}
                _ => problems.push(format!("`{table}` has no section and no row")),
            },
        }
    }
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

// Issue 48: `sample_period = 50` got "invalid type: integer `50`, expected a string". Every
// duration key (each key docs/configuration.md bounds with a range of durations) shows a bare
// number written as a duration, at its own place.
#[test]
fn every_duration_key_shows_a_bare_number_as_a_duration() {
    // Each table's section of the reference, and the config with `{key} = 50` in that table.
    const LINE: &str = "{key} = 50\n";
    let engine = |table: &str| format!("{BASE}[engine.{table}]\n{LINE}");
    let tables = [
        (
            "## `[agent]`",
            BASE.replace("[agent]\n", &format!("[agent]\n{LINE}")),
        ),
        ("## `[engine.timing]`", engine("timing")),
        ("## `[engine.qos]`", engine("qos")),
        ("## `[engine.agent_policy]`", engine("agent_policy")),
        (
            "## `[agent.kubernetes]` and `[engine.kubernetes]`",
            BASE.replacen(
                "\n[[engine]]",
                &format!("[agent.kubernetes]\n{LINE}\n[[engine]]"),
                1,
            ),
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("agent.toml");
    let (mut checked, mut problems) = (Vec::new(), Vec::new());
    for (heading, text) in &tables {
        for row in documented_rows(heading) {
            let key = row.split('`').next().unwrap_or_default().to_owned();
            // A bound: a range whose low end is a duration with its unit (`50ms..=10m`).
            let cells = row.split_once(" | ").map_or("", |(_, rest)| rest);
            let is_duration = cells.split('`').any(|c| {
                c.split_once("..=").is_some_and(|(lo, _)| {
                    lo.ends_with(char::is_alphabetic) && humantime::parse_duration(lo).is_ok()
                })
            });
            if !is_duration {
                continue;
            }
            std::fs::write(&p, text.replace("{key}", &key)).unwrap();
            match super::file::load(&p) {
                Err(e)
                    if e.place.trim_end_matches(": ").ends_with(&key)
                        && e.message.contains("`50` has no unit")
                        && e.message.contains("\"50ms\" or \"50s\"") => {}
                other => problems.push(format!("{heading} {key}: {other:?}")),
            }
            checked.push(key);
        }
    }
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
    for key in [
        "sample_period",
        "window",
        "stall_window",
        "progress_window",
        "resync_period",
    ] {
        assert!(
            checked.iter().any(|k| k == key),
            "{key} not found: {checked:?}"
        );
    }
    assert!(checked.len() >= 30, "{checked:?}");
}

// Issue 42: every flag of `run` and of the program is in docs/configuration.md (the flags
// come from the command-line types; hidden ones, internal to `demo`, aside).
#[test]
fn the_configuration_reference_names_every_flag_of_run() {
    use clap::CommandFactory;
    let doc = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/configuration.md"),
    )
    .unwrap();
    let cli = crate::cli::Cli::command();
    let run = cli
        .get_subcommands()
        .find(|c| c.get_name() == "run")
        .expect("a run command");
    let missing: Vec<String> = cli
        .get_arguments()
        .chain(run.get_arguments())
        .filter(|a| !a.is_hide_set())
        .filter_map(|a| a.get_long())
        .filter(|l| !matches!(*l, "help" | "version"))
        .map(|l| format!("--{l}"))
        .filter(|f| !doc.contains(&format!("`{f}")))
        .collect();
    assert!(
        missing.is_empty(),
        "not in docs/configuration.md: {missing:?}"
    );
}

// Issue 42: the pod labels are off unless the socket is named; named, the period defaults
// to 10 s.
#[test]
fn the_pod_labels_are_off_by_default_and_on_with_the_socket() {
    let parse = |text: &str| super::file::parse(text, Path::new("/etc/a/agent.toml")).unwrap();
    assert_eq!(parse(BASE).agent.pod_resources, None);
    let on = BASE.replace(
        "[agent]\n",
        "[agent]\npod_resources_socket = \"/var/lib/kubelet/pod-resources/kubelet.sock\"\n",
    );
    assert_eq!(
        parse(&on).agent.pod_resources,
        Some(PodResourcesSettings {
            socket: agent::POD_RESOURCES_SOCKET.into(),
            period: Duration::from_secs(10),
        })
    );
    let fast = on.replace("[agent]\n", "[agent]\npod_resources_period = \"250ms\"\n");
    assert_eq!(
        parse(&fast).agent.pod_resources.map(|p| p.period),
        Some(Duration::from_millis(250))
    );
}

//! The driver's fault codes as evidence, through the whole agent: the fake engine makes the
//! fake driver report codes (`errors=` in the NPU files), the agent binary reads them on its
//! DCMI thread, classifies them with the built-in table, and the monitor acts on them as
//! docs/fault-codes.md says (agent policy: a `RestartBusiness`-or-worse code makes it probe
//! at once and a failure is abnormal at once; a `SubHealthFault` lowers QoS one band; the
//! reference publishes only). `doctor` names them too.
#![cfg(feature = "fake-driver")]

use crate::support;
use crate::support::stack::{Launch, Stack};
use std::process::Command;
use std::time::{Duration, Instant};

/// 0x80E18402: HBM isolated rows reached 64, `SeparateNPU` in MindCluster's table.
const SEPARATE: u32 = 0x80E1_8402;
/// 0x81078605: some lanes of a RoCE port faulty, `SubHealthFault`.
const SUB_HEALTH: u32 = 0x8107_8605;
/// 0x81078603: network port link down, `NotHandleFault`.
const NOT_HANDLE: u32 = 0x8107_8603;

fn agent_stack() -> Stack {
    Stack::start_launch(Launch {
        policy: "agent",
        ..Launch::default()
    })
}

/// The faults `/status/detail` shows on NPU `i` of the window: (hex, level, effect).
fn faults(d: &serde_json::Value, i: usize) -> Vec<(String, String, String)> {
    d["window"]["devices"][i]["faults"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|f| {
                    (
                        f["hex"].as_str().unwrap_or_default().to_owned(),
                        f["level"].as_str().unwrap_or_default().to_owned(),
                        f["effect"].as_str().unwrap_or_default().to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

// A SeparateNPU code with a hang: the agent probes at once and is abnormal on that one
// failure, naming the code, its text and its level.
#[test]
fn a_separate_npu_fault_with_a_hang_is_abnormal_on_one_confirming_probe() {
    let s = agent_stack();
    let t0 = Instant::now();
    s.faults(&format!(
        r#"{{"hang": true, "npu_fault_codes": [{SEPARATE}]}}"#
    ));
    s.wait_for_status("abnormal", Duration::from_secs(20));
    let took = t0.elapsed();
    let d = s.detail();
    let vi = &d["virtual_inference"];
    let why = vi["abnormal_reason"].as_str().unwrap_or_default();
    assert!(
        why.contains("0x80E18402") && why.contains("level SeparateNPU") && why.contains("("),
        "the reason names the code, its text and its level: {d}"
    );
    assert_eq!(vi["last_probe"]["accounting"], "driver_fault", "{d}");
    assert_eq!(
        vi["failure_count"], 1,
        "one failure, no count to wait for: {d}"
    );
    assert_eq!(
        faults(&d, 0),
        [(
            "0x80E18402".to_owned(),
            "SeparateNPU".to_owned(),
            "confirms".to_owned()
        )],
        "{d}"
    );
    let log = s.agent_log();
    assert!(log.contains("probing now to confirm"), "{log}");
    eprintln!("abnormal {took:?} after the fault and the hang");
}

// A SeparateNPU code on an engine that answers: one confirming probe succeeds, the engine
// stays normal, and the fault is published.
#[test]
fn a_fault_on_an_engine_that_answers_is_published_and_the_engine_stays_normal() {
    let s = agent_stack();
    s.faults(&format!(
        r#"{{"npu_fault_codes": [{SEPARATE}, {NOT_HANDLE}]}}"#
    ));
    s.wait_until("the faults published", Duration::from_secs(10), |d| {
        faults(d, 1).len() == 2
    });
    let log_has = |what: &str| s.agent_log().contains(what);
    let end = Instant::now() + Duration::from_secs(10);
    while !log_has("the confirming virtual request succeeded") {
        assert!(Instant::now() < end, "{}", s.agent_log());
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_secs(2));
    let d = s.detail();
    assert_eq!(d["status"], "normal", "{d}");
    let f = faults(&d, 1);
    assert!(
        f.contains(&(
            "0x81078603".to_owned(),
            "NotHandleFault".to_owned(),
            "published".to_owned()
        )),
        "{d}"
    );
    // The metrics: npu-exporter's error-code gauges (the code in decimal, one family per
    // position) and the count per level, every level present.
    let m = s.metrics();
    let value = |prefix: &str| -> Vec<f64> {
        m.lines()
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse().ok()))
            .collect()
    };
    assert_eq!(
        value("npu_health_agent_chip_error_code{id=\"1\""),
        [f64::from(SEPARATE)],
        "{m}"
    );
    assert_eq!(
        value("npu_health_agent_chip_error_code_1{id=\"1\""),
        [f64::from(NOT_HANDLE)],
        "{m}"
    );
    assert!(
        value("npu_health_agent_chip_error_code_2{").is_empty(),
        "{m}"
    );
    let level = |l: &str| {
        value(&format!(
            "npu_health_agent_device_fault_level{{id=\"1\",model_name=\"910B3\",level=\"{l}\"}}"
        ))
    };
    assert_eq!(level("SeparateNPU"), [1.0], "{m}");
    assert_eq!(level("NotHandleFault"), [1.0], "{m}");
    // Only the levels with a code: a level without one has no series (nine per NPU, mostly
    // 0, were 144 of an agent's 471 series at 16 NPUs: BENCHMARKS.md, "Fleet scale").
    assert!(level("SubHealthFault").is_empty(), "{m}");
    assert!(level("unclassified").is_empty(), "{m}");
}

// A SubHealthFault code lowers the QoS level one band (normal → throttle) and says why; the
// verdict stays normal; the level comes back when the code clears.
#[test]
fn a_sub_health_fault_lowers_qos_to_throttle_and_no_further() {
    // QoS evaluated every 500 ms (the default 5 s divided as the engine's timing is): the
    // rule counts evaluations, not seconds.
    let s = Stack::start_launch(Launch {
        policy: "agent",
        engine_extra: "[engine.qos]\nperiod = \"500ms\"\nmetrics_period = \"500ms\"\n",
        ..Launch::default()
    });
    s.wait_until("a first QoS evaluation", Duration::from_secs(20), |d| {
        d["qos"]["evaluations"].as_u64().unwrap_or(0) > 0 && d["qos"]["level"] == "normal"
    });
    s.faults(&format!(r#"{{"npu_fault_codes": [{SUB_HEALTH}]}}"#));
    let d = s.wait_until("QoS lowered", Duration::from_secs(20), |d| {
        d["qos"]["level"] == "throttle"
    });
    let why = d["qos"]["lowered_by"].as_str().unwrap_or_default();
    assert!(
        why.contains("0x81078605") && why.contains("SubHealthFault"),
        "{d}"
    );
    assert_eq!(d["status"], "normal", "{d}");
    assert!(s.agent_log().contains("one band lower, at most throttle"));
    s.faults(r#"{"npu_fault_codes": []}"#);
    // The lowering holds three evaluations after the code clears.
    let d = s.wait_until("QoS back", Duration::from_secs(40), |d| {
        d["qos"]["level"] == "normal"
    });
    assert!(d["qos"]["lowered_by"].is_null(), "{d}");
}

// Under the reference policy a fault changes nothing: published, never acted on.
#[test]
fn the_reference_policy_publishes_faults_only() {
    let s = Stack::start("");
    s.faults(&format!(
        r#"{{"npu_fault_codes": [{SEPARATE}, {SUB_HEALTH}]}}"#
    ));
    let d = s.wait_until("the faults published", Duration::from_secs(10), |d| {
        faults(d, 0).len() == 2
    });
    assert!(faults(&d, 0).iter().all(|f| f.2 == "published"), "{d}");
    std::thread::sleep(Duration::from_secs(3));
    let d = s.detail();
    assert_eq!(d["status"], "normal", "{d}");
    assert_eq!(d["qos"]["level"], "normal", "{d}");
    assert!(!s.agent_log().contains("probing now to confirm"));
}

// `doctor` shows each engine's driver faults with their level and effect.
#[test]
fn doctor_names_the_drivers_faults() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("scenario.toml");
    std::fs::write(
        &scenario,
        format!("model = \"910B\"\ncards = 1\n[[device]]\nid = 0\nerror_codes = [{SEPARATE}, 0x12345678]\n"),
    )
    .unwrap();
    let toml = dir.path().join("agent.toml");
    let [port, mgmt] = support::stack::free_ports();
    std::fs::write(
        &toml,
        format!("[agent]\npolicy = \"agent\"\n[[engine]]\nname = \"d\"\nengine_type = \"vllm\"\nserved_model_name = \"m\"\nhost = \"127.0.0.1\"\nport = {port}\nmgmt_port = {mgmt}\nengine_env = {{ ASCEND_GLOBAL_LOG_LEVEL = \"3\" }}\n"),
    )
    .unwrap();
    let run = |json: bool| {
        let mut c = Command::new(support::agent());
        c.args(["--fake", "doctor", "--config"])
            .arg(&toml)
            .env("FAKE_NPU_SCENARIO", &scenario);
        if json {
            c.arg("--json");
        }
        let out = c.output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let text = run(false);
    assert!(
        text.contains("NPU 0 0x80E18402 (")
            && text.contains("level SeparateNPU: one immediate confirming probe"),
        "{text}"
    );
    assert!(
        text.contains("0x12345678") && text.contains("level unclassified: published only"),
        "{text}"
    );
    let v: serde_json::Value = serde_json::from_str(&run(true)).unwrap();
    let f = &v["engines"][0]["driver_faults"];
    assert_eq!(f[0]["level"], "SeparateNPU", "{v}");
    assert_eq!(f[0]["effect"], "confirms", "{v}");
    assert_eq!(f[0]["npu"], 0, "{v}");
}

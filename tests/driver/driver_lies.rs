//! Issue 16, "the driver's quiet lies": the four places where libdcmi answers `DCMI_OK` with a
//! figure that is not a reading, each modelled by the fake library as the real driver's
//! source behaves (docs/fake-driver.md) and driven through the production code: discovery
//! (`devices --json`, `doctor`), the sampler in-process, the windows (`sample --json`), and
//! the verdict of a whole stack under a probe failure (Node Manager emulator, as in
//! `agent_e2e.rs`).
//!
//! 1. the multi-utilization call answers OK with a zeroed struct when the firmware lacks the
//!    sub-command;
//! 2. health `0xFFFFFFFF` ("device does not exist") comes with rc 0;
//! 3. the pre-release name `dcmi_get_device_utilization_rate_v2` was first declared with a
//!    4-byte struct;
//! 4. the single call (type 14) turns a figure above 100 into 0 and answers OK.
#![cfg(feature = "fake-driver")]

use crate::support::stack::{Launch, Stack, free_ports};
use crate::support::{agent, fake_lib, in_child, json, run_agent, scenario};
use fake_engine::node_manager::{self, NmOptions, NmReport};
use npu_health_agent::driver::{BackendChoice, DriverConfig};
use npu_health_agent::sampler::{Sampler, SamplerConfig, Source, codes};
use npu_health_wire::Accounting;
use npu_health_wire::EngineDetail;
use npu_health_wire::SourceReason;
use std::ffi::OsString;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

fn device(v: &serde_json::Value, id: u64) -> &serde_json::Value {
    v["devices"]
        .as_array()
        .expect("devices array")
        .iter()
        .find(|d| d["id"] == id)
        .unwrap_or_else(|| panic!("device {id} missing in {v}"))
}

fn prerelease_lib() -> std::path::PathBuf {
    npu_health_agent::fake::lib_path(npu_health_agent::fake::FAKE_PRERELEASE_LIB)
        .expect("fake pre-release libdcmi.so built")
}

/// Polls `cond` every 10 ms for up to `limit`; a generous bound, not a timing assertion.
fn wait_for(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    cond()
}

fn in_process_driver() -> DriverConfig {
    DriverConfig {
        dcmi_lib: Some(fake_lib()),
        npu_smi: agent().to_owned(),
        backend: BackendChoice::Auto,
        check_owner: false,
        ..DriverConfig::default()
    }
}

/// One NPU whose figure (and health, and multi-call mode) the test writes into `npu0` next
/// to the scenario file.
const FILE_DRIVEN: &str = "model = \"910B\"\ncards = 1\n[npu_smi]\nwatch = \"unsupported\"\n[[device]]\nid = 0\naicube = { file = \"npu0\" }\n";

/// `npu0` of [`FILE_DRIVEN`] in the test child (whose scenario the parent wrote).
fn npu_file() -> std::path::PathBuf {
    std::path::Path::new(&std::env::var_os("FAKE_NPU_SCENARIO").expect("scenario set"))
        .with_file_name("npu0")
}

fn fast_sampler() -> SamplerConfig {
    SamplerConfig {
        period: Duration::from_millis(10),
        hbm_period: Duration::from_millis(50),
        watchdog_interval: Duration::from_millis(20),
        plausibility_recheck: Duration::from_millis(300),
        ..SamplerConfig::default()
    }
}

/// Runs the Node Manager emulator (reference heartbeat rules, intervals divided by ten)
/// against the stack for `limit`.
fn node_manager(stack: &Stack, limit: Duration) -> NmReport {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut opts = NmOptions::reference(vec![stack.status_url()], 0.1);
        opts.grace_period = Duration::from_millis(500);
        let cancel = CancellationToken::new();
        let stop = cancel.clone();
        let timer = tokio::spawn(async move {
            tokio::time::sleep(limit).await;
            stop.cancel();
        });
        let report = node_manager::run(opts, cancel, || {}).await;
        timer.abort();
        report
    })
}

/// A busy engine whose probes time out: the NPU reads 70 %, every completion takes 2 s
/// against the stack's 500 ms request timeout. The reference resets the count on a busy
/// peak, so such an engine must never be killed.
const BUSY_AND_SLOW: &str = r#"{"npu_usage": 70, "latency_ms": 2000}"#;

/// Waits until both of the stack's NPUs have `reason`; panics with the detail otherwise.
fn wait_for_reason(stack: &Stack, reason: SourceReason, limit: Duration) -> EngineDetail {
    let mut last = None;
    let ok = wait_for(limit, || {
        let d = stack.typed_detail();
        let done = d.window.devices.iter().all(|d| d.source_reason == reason);
        last = Some(d);
        done
    });
    assert!(
        ok,
        "NPUs never reached {reason:?}: {last:?}\n{}",
        stack.agent_log()
    );
    last.expect("polled at least once")
}

/// Asserts a busy, slow engine was never counted against and never killed; returns the
/// last probe's window peak.
fn assert_not_counted(stack: &Stack, report: &NmReport) -> Option<f64> {
    assert_eq!(
        report.killed_at_ms,
        None,
        "a busy engine was killed: {report:?}\n{}",
        stack.agent_log()
    );
    assert_eq!(report.max_consecutive_abnormal, 0, "{report:?}");
    let vi = stack.typed_detail().virtual_inference;
    assert_eq!(vi.failure_count, 0, "{vi:?}");
    assert!(!vi.abnormal, "{vi:?}");
    let last = vi.last_probe.as_ref().expect("a probe ran");
    assert!(!last.success, "the probes did time out: {vi:?}");
    assert_eq!(
        last.accounting,
        Accounting::Reset,
        "a busy peak resets the count: {vi:?}"
    );
    last.peak
}

// ---------------------------------------------------------------------------------------
// Defect 1: the multi-utilization call answers OK with a zeroed struct.

const ZEROED: &str = r#"
model = "910B"
cards = 2
[npu_smi]
watch_period_ms = 100
[default]
multi_util = "zeroed"
[[device]]
id = 0
aicube = { constant = 40 }
[[device]]
id = 1
aicube = { constant = 0 }
"#;

#[test]
fn defect1_zeroed_multi_call_is_judged_at_discovery_and_type14_serves() {
    let sc = scenario(ZEROED);
    let out = run_agent(&sc, Some(&fake_lib()), &["devices", "--json"]);
    let v = json(&out);
    // Busy: the zeros disagree with type 14, so the multi call is judged unreal.
    let d0 = device(&v, 0);
    assert_eq!(d0["source"], "dcmi-single", "{v}");
    assert_eq!(d0["source_reason"], "multi-zeroed", "{v}");
    assert!(
        d0["source_note"]
            .as_str()
            .unwrap()
            .contains("type 14 (AI Cube) read 40 %"),
        "{v}"
    );
    assert_eq!(d0["last_value"], 40, "{v}");
    // Idle: the zeros agree with type 14; nothing proves the call yet, so it stays checked.
    let d1 = device(&v, 1);
    assert_eq!(d1["source"], "dcmi-multi", "{v}");
    assert_eq!(d1["source_reason"], "multi-unverified", "{v}");
    assert_eq!(d1["last_value"], 0, "{v}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.matches("the firmware lacks the sub-command").count(),
        1,
        "one warning for device 0: {stderr}"
    );
}

#[test]
fn defect1_zeroed_multi_call_never_reads_as_an_idle_npu_in_windows() {
    let sc = scenario(ZEROED);
    let v = json(&run_agent(
        &sc,
        Some(&fake_lib()),
        &["sample", "--window", "1s", "--json"],
    ));
    let d0 = device(&v, 0);
    // Every valid sample is the type-14 figure: no 0 % among them.
    assert_eq!(d0["peak"], 40, "{v}");
    assert_eq!(d0["mean"], 40.0, "{v}");
    assert_eq!(device(&v, 1)["peak"], 0, "an idle NPU still reads 0: {v}");
}

// With no type 14, the zeros are checked against type 2 (AI Core); the device then has no
// AI Cube call left in DCMI and goes to npu-smi.
#[test]
fn defect1_zeroed_multi_call_without_type14_is_checked_against_ai_core() {
    let sc = scenario(&ZEROED.replace("[default]", "[default]\nutil_type14 = false"));
    let v = json(&run_agent(&sc, Some(&fake_lib()), &["devices", "--json"]));
    let d0 = device(&v, 0);
    assert_eq!(d0["backend"], "npu-smi", "{v}");
    assert_eq!(d0["source_reason"], "type14-unsupported", "{v}");
    let v = json(&run_agent(
        &sc,
        Some(&fake_lib()),
        &["sample", "--window", "1500ms", "--json"],
    ));
    assert_eq!(device(&v, 0)["peak"], 40, "{v}");
}

#[test]
fn defect1_multi_call_is_checked_again_while_running() {
    let sc = scenario(FILE_DRIVEN);
    std::fs::write(sc.dir.path().join("npu0"), "40\n").unwrap();
    if !in_child(
        "defect1_multi_call_is_checked_again_while_running",
        &[("FAKE_NPU_SCENARIO", &sc.path)],
    ) {
        return;
    }
    let npu = npu_file();
    let sampler = Sampler::start(&in_process_driver(), &fast_sampler()).unwrap();
    let shared = sampler.shared().clone();
    let dev = &shared.devices[0];
    assert!(wait_for(Duration::from_secs(10), || dev.reason()
        == SourceReason::MultiVerified));
    // A firmware change while running: the call now swallows "not supported".
    std::fs::write(&npu, "40 multi_util=zeroed\n").unwrap();
    assert!(
        wait_for(Duration::from_secs(10), || dev.reason()
            == SourceReason::MultiZeroed),
        "{:?}",
        dev.snapshot(shared.ring.now_ns())
    );
    assert_eq!(dev.source(), Source::DCMI_SINGLE);
    let r = sampler.window(&[0], Duration::from_millis(200)).unwrap();
    assert_eq!(r.devices[0].peak, Some(40), "{r:?}");
    // The disagreement never produced a valid 0.
    let r = sampler.window(&[0], Duration::from_secs(30)).unwrap();
    assert_eq!(r.devices[0].mean, Some(40.0), "{r:?}");
    // Back: the abandoned call is tried again and taken back once it reads.
    std::fs::write(&npu, "40\n").unwrap();
    assert!(wait_for(Duration::from_secs(10), || dev.source()
        == Source::DCMI_MULTI
        && dev.reason() == SourceReason::MultiVerified));
    sampler.shutdown();
}

#[test]
fn defect1_doctor_says_which_source_each_npu_uses_and_why() {
    let sc = scenario(ZEROED);
    let dir = tempfile::tempdir().unwrap();
    let uc = dir.path().join("user_config.json");
    std::fs::write(
        &uc,
        r#"{"version": "v2", "motor_engine_prefill_config": {"engine_type": "vllm",
            "engine_config": {"served_model_name": "m"},
            "health_check_config": {"enable_virtual_inference": true}}}"#,
    )
    .unwrap();
    let port = free_ports::<1>()[0].to_string();
    let out = std::process::Command::new(agent())
        .env("FAKE_NPU_SCENARIO", &sc.path)
        .env_remove("ASCEND_GLOBAL_LOG_LEVEL")
        .args(["--fake", "doctor", "--config-path"])
        .arg(&uc)
        .args([
            "--role",
            "prefill",
            "--host",
            "127.0.0.1",
            "--port",
            &port,
            "--mgmt-port",
            "9001",
            "--json",
        ])
        .output()
        .unwrap();
    let v = json(&out);
    assert_eq!(device(&v, 0)["source"], "dcmi-single", "{v}");
    assert_eq!(device(&v, 0)["source_reason"], "multi-zeroed", "{v}");
    assert_eq!(device(&v, 1)["source_reason"], "multi-unverified", "{v}");
}

// The false kill of the issue: a busy engine on a firmware without the sub-command, whose
// probes time out under load. Read as 0 %, each failure would count.
#[test]
fn defect1_busy_engine_with_timing_out_probes_on_zeroed_firmware_is_not_killed() {
    let stack = Stack::start_with("max_failure_count = 3", "", "multi_util = \"zeroed\"");
    stack.faults(BUSY_AND_SLOW);
    wait_for_reason(&stack, SourceReason::MultiZeroed, Duration::from_secs(20));
    let report = node_manager(&stack, Duration::from_secs(8));
    let peak = assert_not_counted(&stack, &report);
    assert_eq!(peak, Some(70.0), "the probe saw the real peak");
}

// The zeros of an idle NPU are still an idle NPU: a hung engine is still caught.
#[test]
fn defect1_hung_engine_with_idle_npu_on_zeroed_firmware_is_still_detected() {
    let stack = Stack::start_with("max_failure_count = 3", "", "multi_util = \"zeroed\"");
    stack.faults(r#"{"hang": true}"#);
    let report = node_manager(&stack, Duration::from_secs(20));
    assert!(
        report.killed_at_ms.is_some(),
        "not killed: {report:?}\n{}",
        stack.agent_log()
    );
    let d = stack.typed_detail();
    assert_eq!(d.virtual_inference.failure_count, 3, "{d:?}");
    assert_eq!(
        d.window.devices[0].source_reason,
        SourceReason::MultiUnverified,
        "{d:?}"
    );
}

// ---------------------------------------------------------------------------------------
// Defect 2: health 0xFFFFFFFF, "device does not exist", answered with rc 0.

#[test]
fn defect2_gone_device_is_a_distinct_state_logged_once() {
    let sc = scenario(
        "model = \"910B\"\ncards = 2\n[[device]]\nid = 0\nhealth = 0xFFFFFFFF\naicube = { constant = 40 }\n[[device]]\nid = 1\naicube = { constant = 20 }\n",
    );
    let v = json(&run_agent(&sc, Some(&fake_lib()), &["devices", "--json"]));
    let d0 = device(&v, 0);
    assert_eq!(d0["device_gone"], true, "{v}");
    assert_eq!(d0["health"], serde_json::Value::Null, "{v}");
    assert_eq!(d0["last_value"], serde_json::Value::Null, "never read: {v}");
    assert_eq!(device(&v, 1)["device_gone"], false);
    assert_eq!(device(&v, 1)["health"], 0);
    let out = run_agent(
        &sc,
        Some(&fake_lib()),
        &["sample", "--window", "3s", "--json"],
    );
    let v = json(&out);
    let d0 = device(&v, 0);
    assert_eq!(d0["peak"], serde_json::Value::Null, "{v}");
    assert!(d0["invalid"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(device(&v, 1)["peak"], 20, "{v}");
    // Health is read every second: three seconds, one line.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.matches("does not exist (health 0xFFFFFFFF)").count(),
        1,
        "{stderr}"
    );
}

#[test]
fn defect2_device_vanishing_while_running_is_unavailable_until_it_is_back() {
    let sc = scenario(FILE_DRIVEN);
    std::fs::write(sc.dir.path().join("npu0"), "30\n").unwrap();
    if !in_child(
        "defect2_device_vanishing_while_running_is_unavailable_until_it_is_back",
        &[("FAKE_NPU_SCENARIO", &sc.path)],
    ) {
        return;
    }
    let npu = npu_file();
    let sampler = Sampler::start(&in_process_driver(), &fast_sampler()).unwrap();
    let shared = sampler.shared().clone();
    let dev = &shared.devices[0];
    assert!(wait_for(Duration::from_secs(10), || dev
        .snapshot(shared.ring.now_ns())
        .health
        == Some(0)));
    std::fs::write(&npu, "30 health=0xFFFFFFFF\n").unwrap();
    assert!(wait_for(Duration::from_secs(10), || dev.is_gone()));
    let snap = dev.snapshot(shared.ring.now_ns());
    assert!(snap.device_gone, "{snap:?}");
    assert_eq!(snap.health, None, "the last health is not shown as current");
    assert!(
        wait_for(Duration::from_secs(10), || {
            let r = sampler.window(&[0], Duration::from_millis(200)).unwrap();
            r.devices[0].peak.is_none() && r.devices[0].invalid > 0
        }),
        "the gone device's window stayed available"
    );
    assert_eq!(
        dev.snapshot(shared.ring.now_ns()).last_error,
        Some(codes::DEVICE_GONE)
    );
    std::fs::write(&npu, "30\n").unwrap();
    assert!(wait_for(Duration::from_secs(10), || {
        let r = sampler.window(&[0], Duration::from_millis(200)).unwrap();
        !dev.is_gone() && r.devices[0].peak == Some(30)
    }));
    sampler.shutdown();
}

// A vanished NPU is no verdict: its windows are unavailable, so a failing probe is not
// counted (reference rule 2) and the engine is never made abnormal by it.
#[test]
fn defect2_gone_npus_never_make_the_engine_abnormal() {
    let stack = Stack::start("max_failure_count = 3");
    stack.faults(r#"{"npu_health": 4294967295}"#);
    let gone = stack.wait_until_typed("every NPU gone", Duration::from_secs(20), |d| {
        d.window.devices.iter().all(|x| x.device_gone)
    });
    assert_eq!(gone.window.devices[0].health, None);
    // The engine hangs with its NPUs idle: without the gone state this is a kill.
    stack.faults(r#"{"hang": true}"#);
    let report = node_manager(&stack, Duration::from_secs(8));
    assert_eq!(
        report.killed_at_ms,
        None,
        "{report:?}\n{}",
        stack.agent_log()
    );
    let vi = stack.typed_detail().virtual_inference;
    assert_eq!(vi.failure_count, 0, "{vi:?}");
    assert_eq!(
        vi.last_probe.as_ref().map(|p| p.accounting),
        Some(Accounting::Unchanged),
        "{vi:?}"
    );
    let m = stack.metrics();
    for id in ["0", "1"] {
        let gone = format!("npu_health_agent_device_gone{{id=\"{id}\",model_name=\"910B3\"}} 1");
        let health = format!(
            "npu_health_agent_chip_health_status{{id=\"{id}\",model_name=\"910B3\"}} 2147483647"
        );
        assert!(m.contains(&gone), "{gone} missing:\n{m}");
        assert!(m.contains(&health), "{health} missing:\n{m}");
    }
    let log = stack.agent_log();
    assert_eq!(
        log.matches("does not exist (health 0xFFFFFFFF)").count(),
        2,
        "once per NPU: {log}"
    );
}

// ---------------------------------------------------------------------------------------
// Defect 3: the pre-release name, first declared with a 4-byte struct.

const EARLY: &str = r#"
model = "910B"
cards = 2
prerelease_layout = "4-byte"
[[device]]
id = 0
aicube = { constant = 40 }
[[device]]
id = 1
aicube = { constant = 0 }
"#;

#[test]
fn defect3_prerelease_name_writing_the_4_byte_struct_falls_back_to_type14() {
    let sc = scenario(EARLY);
    let v = json(&run_agent(
        &sc,
        Some(&prerelease_lib()),
        &["devices", "--json"],
    ));
    let d0 = device(&v, 0);
    assert_eq!(d0["source"], "dcmi-single", "{v}");
    assert_eq!(d0["source_reason"], "multi-prerelease-layout", "{v}");
    assert_eq!(d0["last_value"], 40, "{v}");
    // All four bytes zero reads the same in both layouts: checked like any zero.
    assert_eq!(device(&v, 1)["source_reason"], "multi-unverified", "{v}");
    let v = json(&run_agent(
        &sc,
        Some(&prerelease_lib()),
        &["sample", "--window", "1s", "--json"],
    ));
    let d0 = device(&v, 0);
    assert_eq!(d0["peak"], 40, "{v}");
    assert_eq!(d0["invalid"], 0, "the packed figure was never stored: {v}");
}

#[test]
fn defect3_prerelease_name_writing_the_48_byte_struct_is_kept() {
    let sc = scenario(&EARLY.replace("4-byte", "48-byte"));
    let v = json(&run_agent(
        &sc,
        Some(&prerelease_lib()),
        &["devices", "--json"],
    ));
    let d0 = device(&v, 0);
    assert_eq!(d0["source"], "dcmi-multi", "{v}");
    assert_eq!(d0["source_reason"], "multi-verified", "{v}");
    assert_eq!(d0["last_value"], 40, "{v}");
}

#[test]
fn defect3_sampler_abandons_the_4_byte_layout_at_its_first_answer() {
    let sc = scenario(EARLY);
    if !in_child(
        "defect3_sampler_abandons_the_4_byte_layout_at_its_first_answer",
        &[("FAKE_NPU_SCENARIO", &sc.path)],
    ) {
        return;
    }
    let driver = DriverConfig {
        dcmi_lib: Some(prerelease_lib()),
        ..in_process_driver()
    };
    let sampler = Sampler::start(&driver, &fast_sampler()).unwrap();
    let shared = sampler.shared().clone();
    assert!(wait_for(Duration::from_secs(10), || shared
        .sampler
        .passes()
        > 20));
    let dev = &shared.devices[0];
    assert_eq!(dev.source(), Source::DCMI_SINGLE);
    assert_eq!(dev.reason(), SourceReason::MultiPrereleaseLayout);
    // The packed figure never reached the ring, not even as an invalid sample.
    let r = sampler.window(&[0, 1], Duration::from_secs(30)).unwrap();
    assert_eq!(r.devices[0].mean, Some(40.0), "{r:?}");
    assert_eq!(r.devices[0].invalid, 0, "{r:?}");
    assert_eq!(r.devices[1].peak, Some(0), "{r:?}");
    assert_eq!(shared.devices[1].source(), Source::DCMI_MULTI);
    sampler.shutdown();
}

#[test]
fn defect3_busy_engine_on_an_early_prerelease_library_is_seen_busy() {
    let stack = Stack::start_launch(Launch {
        health_check: "max_failure_count = 3",
        scenario_top: "prerelease_layout = \"4-byte\"",
        agent_args: vec![OsString::from("--dcmi-lib"), prerelease_lib().into()],
        ..Launch::default()
    });
    stack.faults(BUSY_AND_SLOW);
    wait_for_reason(
        &stack,
        SourceReason::MultiPrereleaseLayout,
        Duration::from_secs(20),
    );
    let report = node_manager(&stack, Duration::from_secs(8));
    let peak = assert_not_counted(&stack, &report);
    // Read through the packed aic_util, every busy figure is out of range: the window
    // would be unavailable instead of busy.
    assert_eq!(peak, Some(70.0));
}

// ---------------------------------------------------------------------------------------
// Defect 4: type 14 turns a figure above 100 into 0 and answers OK.

/// Type 14 is the only DCMI call; it reads a figure above 100 (the fake, like the driver,
/// answers 0 and OK) while npu-smi reads the NPU's real 55 %.
const TYPE14_ZERO: &str = r#"
model = "910B"
cards = 1
[npu_smi]
watch_period_ms = 100
[[device]]
id = 0
multi_util = false
aicube = { constant = 55 }
type14 = { constant = 150 }
"#;

#[test]
fn defect4_type14_zero_against_a_busy_npu_smi_is_suspect_then_npu_smi_serves() {
    let sc = scenario(TYPE14_ZERO);
    if !in_child(
        "defect4_type14_zero_against_a_busy_npu_smi_is_suspect_then_npu_smi_serves",
        &[("FAKE_NPU_SCENARIO", &sc.path)],
    ) {
        return;
    }
    let sampler = Sampler::start(&in_process_driver(), &fast_sampler()).unwrap();
    let shared = sampler.shared().clone();
    let dev = &shared.devices[0];
    assert!(
        wait_for(Duration::from_secs(15), || dev.source() == Source::NPU_SMI),
        "{:?}",
        dev.snapshot(shared.ring.now_ns())
    );
    assert_eq!(dev.reason(), SourceReason::Type14Zero);
    assert!(wait_for(Duration::from_secs(10), || sampler
        .window(&[0], Duration::from_millis(500))
        .unwrap()
        .devices[0]
        .peak
        == Some(55)));
    // From the start, no valid 0 was stored: every type-14 zero was suspect.
    let r = sampler.window(&[0], Duration::from_secs(30)).unwrap();
    assert_eq!(r.devices[0].mean, Some(55.0), "{r:?}");
    assert!(r.devices[0].invalid > 0, "{r:?}");
    sampler.shutdown();
}

#[test]
fn defect4_type14_zero_through_the_cli_never_reads_idle() {
    let sc = scenario(TYPE14_ZERO);
    let v = json(&run_agent(
        &sc,
        Some(&fake_lib()),
        &["sample", "--window", "3s", "--json"],
    ));
    let d = device(&v, 0);
    assert_eq!(d["peak"], 55, "{v}");
    assert_eq!(d["mean"], 55.0, "{v}");
}

// The documented limit: with no second source, a type-14 zero cannot be told from an idle
// NPU, and it is read as 0 (docs/driver.md, the fallback chain).
#[test]
fn defect4_without_a_second_source_a_type14_zero_reads_as_0() {
    let sc = scenario(&TYPE14_ZERO.replace("watch_period_ms = 100", "watch = \"unsupported\""));
    let v = json(&run_agent(
        &sc,
        Some(&fake_lib()),
        &["sample", "--window", "1s", "--json"],
    ));
    assert_eq!(device(&v, 0)["peak"], 0, "{v}");
    assert_eq!(device(&v, 0)["backend"], "dcmi", "{v}");
}

#[test]
fn defect4_busy_engine_whose_type14_reads_0_with_timing_out_probes_is_not_killed() {
    let stack = Stack::start_with(
        "max_failure_count = 3",
        "",
        "multi_util = false\ntype14 = { constant = 150 }",
    );
    stack.faults(BUSY_AND_SLOW);
    wait_for_reason(&stack, SourceReason::Type14Zero, Duration::from_secs(30));
    let report = node_manager(&stack, Duration::from_secs(8));
    let peak = assert_not_counted(&stack, &report);
    assert_eq!(peak, Some(70.0));
}

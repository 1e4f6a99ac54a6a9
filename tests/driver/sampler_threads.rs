//! The sampler in-process: the fake libdcmi.so is dlopen'd into the test process through the
//! production path, and the fake npu-smi runs as real child processes. Each test runs in its
//! own process (see `support::in_child`) so it can give the fake driver its own scenario.
#![cfg(feature = "fake-driver")]

use crate::support::{agent, fake_lib, in_child, scenario};
use npu_health_agent::driver::{Backend, BackendChoice, DriverConfig};
use npu_health_agent::sampler::{Sampler, SamplerConfig, Source};
use std::time::{Duration, Instant};

fn driver(backend: BackendChoice) -> DriverConfig {
    DriverConfig {
        dcmi_lib: Some(fake_lib()),
        npu_smi: agent().to_owned(),
        backend,
        check_owner: false,
        ..DriverConfig::default()
    }
}

/// Polls `cond` every 5 ms for up to `limit`; a generous bound, not a timing assertion.
fn wait_for(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    cond()
}

const HUNG: &str = r#"
model = "910B"
cards = 2
[npu_smi]
watch_period_ms = 20
[[device]]
id = 0
aicube = { constant = 30 }
[[device]]
id = 1
aicube = { constant = 60 }
hang_ms = 600000
hang_after_calls = 5
"#;

fn fast_cfg() -> SamplerConfig {
    SamplerConfig {
        period: Duration::from_millis(10),
        call_deadline: Duration::from_millis(200),
        watchdog_interval: Duration::from_millis(20),
        ..SamplerConfig::default()
    }
}

#[test]
fn hung_call_becomes_stale_without_blocking_readers_and_moves_to_npu_smi() {
    let sc = scenario(HUNG);
    if !in_child(
        "hung_call_becomes_stale_without_blocking_readers_and_moves_to_npu_smi",
        &[("FAKE_NPU_SCENARIO", &sc.path)],
    ) {
        return;
    }
    let sampler = Sampler::start(&driver(BackendChoice::Auto), &fast_cfg()).unwrap();
    let shared = sampler.shared().clone();
    assert!(
        wait_for(Duration::from_secs(10), || shared.devices[1].is_hung()),
        "device 1 never marked hung"
    );
    let (dev, kind, started) = shared
        .sampler
        .in_call()
        .expect("the sampler thread is stuck in the call");
    assert_eq!(dev, 1);
    // Readers run while the driver thread is blocked inside DCMI. Device 0 is stuck behind
    // the hung call: its recent samples are the watchdog's invalid ones, never 0 %. (Read
    // until a 100 ms window holds one: on a loaded machine the watchdog's 20 ms tick can be
    // late, and every window read meanwhile must still show no peak.)
    let mut report = sampler.window(&[0, 1], Duration::from_millis(100)).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while report.devices[0].invalid == 0 && std::time::Instant::now() < deadline {
        assert_eq!(report.devices[0].peak, None, "{report:?}");
        std::thread::sleep(Duration::from_millis(10));
        report = sampler.window(&[0, 1], Duration::from_millis(100)).unwrap();
    }
    assert_eq!(
        shared.sampler.in_call(),
        Some((1, kind, started)),
        "the call was in progress throughout"
    );
    let now = shared.ring.now_ns();
    let snap = shared.devices[1].snapshot(now);
    // Hung, and either still stale or already served by npu-smi.
    assert!(
        snap.hung && (snap.stale || snap.source == Source::NPU_SMI),
        "{snap:?}"
    );
    assert_eq!(report.devices[0].peak, None, "{report:?}");
    assert!(report.devices[0].invalid > 0, "{report:?}");
    assert!(wait_for(Duration::from_secs(10), || shared.devices[1]
        .source()
        == Source::NPU_SMI));
    assert!(
        wait_for(Duration::from_secs(10), || {
            let r = sampler.window(&[1], Duration::from_millis(300)).unwrap();
            r.devices[0].peak == Some(60)
        }),
        "device 1 never produced npu-smi readings"
    );
    // Served by npu-smi while the DCMI call stays blocked: fresh, and it stays fresh
    // although the watchdog sees the blocked call on every check (every 20 ms here).
    assert!(wait_for(Duration::from_secs(5), || !shared.devices[1].is_stale()));
    assert_never(Duration::from_secs(1), || shared.devices[1].is_stale());
    assert!(shared.devices[1].is_hung());
    // After three deadlines every DCMI device leaves the stuck thread.
    assert!(wait_for(Duration::from_secs(10), || shared.devices[0]
        .source()
        == Source::NPU_SMI));
    assert!(wait_for(Duration::from_secs(10), || {
        sampler
            .window(&[0], Duration::from_millis(300))
            .unwrap()
            .devices[0]
            .peak
            == Some(30)
    }));
    let invalid = sampler
        .window(&[0], Duration::from_secs(20))
        .unwrap()
        .devices[0]
        .invalid;
    assert!(
        invalid > 0,
        "the stuck period left invalid samples for device 0"
    );
    sampler.shutdown();
}

/// Polls `cond` every 2 ms for `span`; panics the first time it holds.
fn assert_never(span: Duration, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + span;
    let mut polls = 0;
    while Instant::now() < end {
        assert!(!cond(), "held at poll {polls}");
        polls += 1;
        std::thread::sleep(Duration::from_millis(2));
    }
}

// The real npu-smi goes through the same driver, so a hung device's watch may well print NA.
// An NA row is an answer, not a reading: the device stays stale, without a flicker a scrape
// could catch (the alert's `for:` restarts at every 0).
#[test]
fn a_hung_device_whose_npu_smi_reports_na_stays_stale() {
    let sc = scenario(&HUNG.replace("aicube = { constant = 60 }", "aicube = { file = \"npu1\" }"));
    std::fs::write(sc.dir.path().join("npu1"), "NA\n").unwrap();
    if !in_child(
        "a_hung_device_whose_npu_smi_reports_na_stays_stale",
        &[("FAKE_NPU_SCENARIO", &sc.path)],
    ) {
        return;
    }
    let sampler = Sampler::start(&driver(BackendChoice::Auto), &fast_cfg()).unwrap();
    let shared = sampler.shared().clone();
    assert!(wait_for(Duration::from_secs(10), || shared.devices[1]
        .is_hung()
        && shared.devices[1].source() == Source::NPU_SMI));
    // NA rows arrive (the error count moves) while the device reads stale throughout.
    let before = shared.devices[1].snapshot(shared.ring.now_ns()).errors;
    assert_never(Duration::from_secs(1), || !shared.devices[1].is_stale());
    let after = shared.devices[1].snapshot(shared.ring.now_ns()).errors;
    assert!(after > before + 10, "NA rows: {before} -> {after}");
    sampler.shutdown();
}

#[test]
fn hung_call_without_npu_smi_stays_stale_and_unavailable() {
    let sc = scenario(&HUNG.replace("watch_period_ms = 20", "watch = \"unsupported\""));
    if !in_child(
        "hung_call_without_npu_smi_stays_stale_and_unavailable",
        &[("FAKE_NPU_SCENARIO", &sc.path)],
    ) {
        return;
    }
    let sampler = Sampler::start(&driver(BackendChoice::Auto), &fast_cfg()).unwrap();
    let shared = sampler.shared().clone();
    assert!(wait_for(Duration::from_secs(10), || shared.devices[1].is_hung()));
    // Once the call has been stuck longer than the window, the window holds only the
    // watchdog's invalid samples: a hung driver reads as unavailable, never 0 %.
    let (_, _, started) = shared.sampler.in_call().expect("stuck in the call");
    assert!(wait_for(Duration::from_secs(10), || shared.ring.now_ns()
        > started + 600_000_000));
    let r = sampler.window(&[0, 1], Duration::from_millis(300)).unwrap();
    assert_eq!(r.combined.valid, 0, "{r:?}");
    assert_eq!(r.combined.peak, None, "{r:?}");
    assert!(r.devices.iter().all(|d| d.invalid > 0), "{r:?}");
    assert!(shared.devices[1].is_stale() && shared.devices[1].is_hung());
    assert_eq!(shared.devices[1].source().backend, Backend::Dcmi);
    assert!(shared.devices[0].is_stale());
    sampler.shutdown();
}

#[test]
fn runs_at_1ms_and_reports_the_programme() {
    let sc = scenario("model = \"910B\"\ncards = 2\n[default]\naicube = { constant = 45 }\n");
    if !in_child(
        "runs_at_1ms_and_reports_the_programme",
        &[("FAKE_NPU_SCENARIO", &sc.path)],
    ) {
        return;
    }
    let cfg = SamplerConfig {
        period: Duration::from_millis(1),
        ..SamplerConfig::default()
    };
    let sampler = Sampler::start(&driver(BackendChoice::Dcmi), &cfg).unwrap();
    let shared = sampler.shared().clone();
    assert!(wait_for(Duration::from_secs(10), || shared
        .sampler
        .passes()
        >= 300));
    let r = sampler.window(&[0, 1], Duration::from_secs(1)).unwrap();
    for d in &r.devices {
        assert_eq!(d.peak, Some(45));
        assert_eq!(d.invalid, 0);
        assert!(d.valid >= 100, "{r:?}");
    }
    sampler.shutdown();
}

#[test]
fn period_change_applies_without_waiting_for_the_old_tick_and_shutdown_is_prompt() {
    let sc = scenario("model = \"910B\"\ncards = 1\n");
    if !in_child(
        "period_change_applies_without_waiting_for_the_old_tick_and_shutdown_is_prompt",
        &[("FAKE_NPU_SCENARIO", &sc.path)],
    ) {
        return;
    }
    let cfg = SamplerConfig {
        period: Duration::from_secs(30),
        ..SamplerConfig::default()
    };
    let mut sampler = Sampler::start(&driver(BackendChoice::Dcmi), &cfg).unwrap();
    let shared = sampler.shared().clone();
    assert!(wait_for(Duration::from_secs(10), || shared
        .sampler
        .passes()
        >= 1));
    sampler.set_period(Duration::from_millis(2)).unwrap();
    // With the old period the next pass would be 30 s away.
    assert!(wait_for(Duration::from_secs(10), || shared
        .sampler
        .passes()
        >= 20));
    assert_eq!(sampler.period(), Duration::from_millis(2));
    assert!(sampler.set_period(Duration::ZERO).is_err());
    sampler.set_period(Duration::from_secs(30)).unwrap();
    let started = Instant::now();
    sampler.shutdown();
    // Loose bound: shutdown must not wait for the 30 s tick.
    assert!(started.elapsed() < Duration::from_secs(10));
}

// A call that answers after the deadline is discarded (it describes the past), the device
// recovers once calls answer in time again, and the late answer does not cut windows short.
#[test]
fn late_answer_is_discarded_and_the_device_recovers() {
    let sc = scenario(
        &HUNG
            .replace("hang_ms = 600000", "hang_ms = 1200\nhang_count = 1")
            .replace("watch_period_ms = 20", "watch = \"unsupported\""),
    );
    if !in_child(
        "late_answer_is_discarded_and_the_device_recovers",
        &[("FAKE_NPU_SCENARIO", &sc.path)],
    ) {
        return;
    }
    let sampler = Sampler::start(&driver(BackendChoice::Auto), &fast_cfg()).unwrap();
    let shared = sampler.shared().clone();
    assert!(wait_for(Duration::from_secs(10), || shared.devices[1].is_hung()));
    // The hung call returns after 1.2 s; later calls answer at once.
    assert!(
        wait_for(Duration::from_secs(10), || !shared.devices[1].is_hung()),
        "hung flag never cleared"
    );
    assert!(wait_for(Duration::from_secs(10), || {
        let r = sampler.window(&[0, 1], Duration::from_millis(300)).unwrap();
        r.devices.iter().all(|d| d.valid > 5)
    }));
    let r = sampler.window(&[0, 1], Duration::from_secs(5)).unwrap();
    assert!(!r.truncated);
    assert_eq!(r.devices[1].peak, Some(60));
    // The samples written while stuck are still in the window: the scan went past the late
    // answer instead of stopping at it.
    assert!(
        r.devices[0].invalid > 0 && r.devices[1].invalid > 0,
        "{r:?}"
    );
    let snap = shared.devices[1].snapshot(shared.ring.now_ns());
    assert!(!snap.stale && !snap.hung, "{snap:?}");
    sampler.shutdown();
}

fn children_of_self() -> Vec<String> {
    let me = std::process::id().to_string();
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // Fields after the ")" of the command: state, ppid, ...
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.get(1) == Some(&me.as_str()) {
            out.push(stat);
        }
    }
    out
}

#[test]
fn watch_children_restart_with_back_off_and_are_reaped_on_shutdown() {
    let sc = scenario(
        "model = \"910B\"\ncards = 2\n[npu_smi]\nwatch_period_ms = 20\nwatch_exit_after = 3\n[default]\naicube = { constant = 7 }\n",
    );
    if !in_child(
        "watch_children_restart_with_back_off_and_are_reaped_on_shutdown",
        &[("FAKE_NPU_SCENARIO", &sc.path)],
    ) {
        return;
    }
    let sampler =
        Sampler::start(&driver(BackendChoice::NpuSmi), &SamplerConfig::default()).unwrap();
    // Each child gives 3 rows and exits; more than 3 rows per device means it was restarted.
    assert!(
        wait_for(Duration::from_secs(15), || {
            let r = sampler.window(&[0, 1], Duration::from_secs(30)).unwrap();
            r.devices.iter().all(|d| d.valid > 6)
        }),
        "watch children were not restarted"
    );
    // The check below can see our children: while running there are watch children.
    assert!(wait_for(Duration::from_secs(10), || !children_of_self().is_empty()));
    sampler.shutdown();
    let left = children_of_self();
    assert!(left.is_empty(), "children left after shutdown: {left:?}");
}

#[test]
fn silent_watch_child_marks_the_device_stale() {
    let sc = scenario(
        "model = \"910B\"\ncards = 1\n[npu_smi]\nwatch_period_ms = 600000\n[default]\naicube = { constant = 7 }\n",
    );
    if !in_child(
        "silent_watch_child_marks_the_device_stale",
        &[("FAKE_NPU_SCENARIO", &sc.path)],
    ) {
        return;
    }
    let cfg = SamplerConfig {
        watch_stale_after: Some(Duration::from_millis(300)),
        watchdog_interval: Duration::from_millis(20),
        ..SamplerConfig::default()
    };
    let sampler = Sampler::start(&driver(BackendChoice::NpuSmi), &cfg).unwrap();
    let shared = sampler.shared().clone();
    assert!(wait_for(Duration::from_secs(10), || shared.devices[0]
        .snapshot(0)
        .last_value
        == Some(7)));
    assert!(wait_for(Duration::from_secs(10), || shared.devices[0].is_stale()));
    assert!(wait_for(Duration::from_secs(10), || {
        let r = sampler.window(&[0], Duration::from_millis(200)).unwrap();
        r.devices[0].valid == 0 && r.devices[0].invalid > 0
    }));
    sampler.shutdown();
}

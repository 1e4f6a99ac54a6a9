//! End to end through the agent binary: real dlopen of the fake libdcmi.so, real fake
//! npu-smi subprocesses, the CLI's JSON and exit codes.
#![cfg(feature = "fake-driver")]

use crate::support;
use crate::support::{fake_legacy_lib, fake_lib, json, run_agent, scenario};

fn device(v: &serde_json::Value, id: u64) -> &serde_json::Value {
    v["devices"]
        .as_array()
        .expect("devices array")
        .iter()
        .find(|d| d["id"] == id)
        .unwrap_or_else(|| panic!("device {id} missing in {v}"))
}

#[test]
fn dcmi_backend_reports_the_programmed_peak() {
    let sc = scenario(
        r#"
model = "910B"
cards = 2
[[device]]
id = 0
aicube = { square = { high = 90, low = 0, width_ms = 200, period_ms = 500 } }
[[device]]
id = 1
aicube = { constant = 37 }
"#,
    );
    let out = run_agent(
        &sc,
        Some(&fake_lib()),
        &["sample", "--window", "1500ms", "--json"],
    );
    let v = json(&out);
    let d0 = device(&v, 0);
    assert_eq!(d0["backend"], "dcmi");
    assert_eq!(d0["peak"], 90);
    assert_eq!(d0["invalid"], 0);
    assert!(d0["valid"].as_u64().unwrap() > 5, "{v}");
    let d1 = device(&v, 1);
    assert_eq!(d1["peak"], 37);
    assert_eq!(d1["mean"], 37.0);
    // Exactly the documented keys.
    let mut keys: Vec<_> = d1.as_object().unwrap().keys().cloned().collect();
    keys.sort();
    assert_eq!(keys, ["backend", "id", "invalid", "mean", "peak", "valid"]);
}

#[test]
fn npu_smi_backend_reports_the_same_peak() {
    let sc = scenario(
        r#"
model = "910B"
cards = 2
[npu_smi]
watch_period_ms = 50
[[device]]
id = 0
aicube = { square = { high = 90, low = 0, width_ms = 200, period_ms = 500 } }
[[device]]
id = 1
aicube = { constant = 37 }
"#,
    );
    let out = run_agent(&sc, None, &["sample", "--window", "1500ms", "--json"]);
    let v = json(&out);
    for (id, peak) in [(0, 90), (1, 37)] {
        let d = device(&v, id);
        assert_eq!(d["backend"], "npu-smi", "{v}");
        assert_eq!(d["peak"], peak, "{v}");
    }
}

#[test]
fn legacy_driver_without_aicube_symbols_falls_back_to_npu_smi() {
    let sc = scenario(
        "model = \"910B\"\ncards = 1\n[npu_smi]\nwatch_period_ms = 50\n[default]\naicube = { constant = 64 }\n",
    );
    let out = run_agent(&sc, Some(&fake_legacy_lib()), &["devices", "--json"]);
    let v = json(&out);
    let d = device(&v, 0);
    assert_eq!(d["backend"], "npu-smi", "{v}");
    // HBM and health still come from DCMI.
    assert_eq!(d["hbm_total_mb"], 65536);
    assert_eq!(d["capabilities"]["health"], true);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("-8255"), "{stderr}");
    let out = run_agent(
        &sc,
        Some(&fake_legacy_lib()),
        &["sample", "--window", "1s", "--json"],
    );
    assert_eq!(device(&json(&out), 0)["peak"], 64);
}

#[test]
fn type14_is_used_when_the_multi_call_is_unsupported() {
    let sc = scenario(
        "model = \"910B\"\ncards = 1\n[default]\nmulti_util = false\naicube = { constant = 21 }\n",
    );
    let v = json(&run_agent(&sc, Some(&fake_lib()), &["devices", "--json"]));
    let d = device(&v, 0);
    assert_eq!(d["backend"], "dcmi");
    assert_eq!(d["source"], "dcmi-single");
    assert_eq!(d["last_value"], 21);
}

// No device with an AI Cube source is "no usable driver backend": the table is still
// printed, and the exit code is 3.
#[test]
fn dcmi_only_backend_reports_no_source_instead_of_falling_back() {
    let sc = scenario("model = \"910B\"\ncards = 1\n");
    let out = run_agent(
        &sc,
        Some(&fake_legacy_lib()),
        &["--backend", "dcmi", "devices", "--json"],
    );
    assert_eq!(out.status.code(), Some(3));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let d = device(&v, 0);
    assert_eq!(d["backend"], "none");
    assert_eq!(d["capabilities"]["aicube"], false);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no usable driver backend"), "{stderr}");
    // Each backend with its own reason: the one that found the NPU says why none reads.
    assert!(
        stderr.contains("dcmi: no AI Cube source on any NPU: DCMI has no AI Cube call"),
        "{stderr}"
    );
    assert!(
        stderr.contains("npu-smi: not tried (--backend dcmi)"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("handing"),
        "no fallback is attempted: {stderr}"
    );
    let out = run_agent(
        &sc,
        Some(&fake_legacy_lib()),
        &["--backend", "dcmi", "sample", "--window", "1s"],
    );
    assert_eq!(out.status.code(), Some(3));
}

#[test]
fn legacy_driver_without_npu_smi_exits_3() {
    let sc = scenario("model = \"910B\"\ncards = 1\n[npu_smi]\nwatch = \"unsupported\"\n");
    let out = run_agent(&sc, Some(&fake_legacy_lib()), &["sample", "--window", "1s"]);
    assert_eq!(out.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("HDK does not support npu-smi info watch -s u (AI Cube Usage)"),
        "{stderr}"
    );
}

#[test]
fn prerelease_driver_name_of_the_multi_call_is_used() {
    let sc = scenario("model = \"910B\"\ncards = 1\n[default]\naicube = { constant = 33 }\n");
    let lib =
        npu_health_agent::fake::lib_path(npu_health_agent::fake::FAKE_PRERELEASE_LIB).unwrap();
    let v = json(&run_agent(&sc, Some(&lib), &["devices", "--json"]));
    let d = device(&v, 0);
    assert_eq!(d["source"], "dcmi-multi", "{v}");
    assert_eq!(d["last_value"], 33);
}

// The single type-14 path and the 950 v2 path ignore the value when rc != 0 too.
#[test]
fn single_call_and_v2_errors_are_invalid_not_77() {
    for model in ["910B", "950"] {
        let sc = scenario(&format!(
            "model = \"{model}\"\ncards = 1\n[default]\nmulti_util = false\naicube = {{ error = -8006 }}\n"
        ));
        let v = json(&run_agent(
            &sc,
            Some(&fake_lib()),
            &["sample", "--window", "500ms", "--json"],
        ));
        let d = device(&v, 0);
        assert_eq!(d["peak"], serde_json::Value::Null, "{model}: {v}");
        assert!(d["invalid"].as_u64().unwrap() > 0, "{model}: {v}");
        let v = json(&run_agent(&sc, Some(&fake_lib()), &["devices", "--json"]));
        assert_eq!(device(&v, 0)["last_error"], -8006, "{model}: {v}");
        assert_eq!(device(&v, 0)["last_value"], serde_json::Value::Null);
    }
}

#[test]
fn hbm_and_health_errors_and_out_of_range_health_are_not_used() {
    let sc = scenario(
        "model = \"910B\"\ncards = 3\n[[device]]\nid = 0\nhbm_error = -8005\n[[device]]\nid = 1\nhealth_error = -8255\n[[device]]\nid = 2\nhealth = 7\n",
    );
    let v = json(&run_agent(&sc, Some(&fake_lib()), &["devices", "--json"]));
    assert_eq!(
        device(&v, 0)["hbm_total_mb"],
        serde_json::Value::Null,
        "{v}"
    );
    assert_eq!(device(&v, 0)["capabilities"]["hbm"], false);
    assert_eq!(device(&v, 0)["health"], 0);
    assert_eq!(device(&v, 1)["health"], serde_json::Value::Null, "{v}");
    assert_eq!(device(&v, 1)["hbm_total_mb"], 65536);
    assert_eq!(
        device(&v, 2)["health"],
        serde_json::Value::Null,
        "health 7 is outside 0..=3: {v}"
    );
}

#[test]
fn partial_rows_through_a_real_pipe() {
    let sc = scenario(
        "model = \"910B\"\ncards = 1\n[npu_smi]\nwatch_period_ms = 30\nsplit_rows = true\n[default]\naicube = { constant = 58 }\n",
    );
    let v = json(&run_agent(
        &sc,
        None,
        &["sample", "--window", "1s", "--json"],
    ));
    let d = device(&v, 0);
    assert_eq!(d["peak"], 58, "{v}");
    assert_eq!(
        d["invalid"], 0,
        "a split row must not read as a bad figure: {v}"
    );
}

// The embedded default at npu-smi's real cadence (-d 1): the burst period is not a multiple
// of the watch period, so a 5 s window sees the burst through npu-smi too.
#[test]
fn embedded_default_through_npu_smi_at_the_real_cadence() {
    let out = std::process::Command::new(support::agent())
        .env_remove("FAKE_NPU_SCENARIO")
        .args([
            "--fake",
            "--backend",
            "npu-smi",
            "sample",
            "--window",
            "5s",
            "--json",
        ])
        .output()
        .unwrap();
    let v = json(&out);
    assert_eq!(device(&v, 0)["peak"], 85, "{v}");
    assert_eq!(device(&v, 1)["peak"], 12, "{v}");
    let out = std::process::Command::new(support::agent())
        .env_remove("FAKE_NPU_SCENARIO")
        .args(["--fake", "sample", "--window", "2s", "--json"])
        .output()
        .unwrap();
    let v = json(&out);
    assert_eq!(device(&v, 0)["peak"], 85, "{v}");
    assert_eq!(device(&v, 0)["backend"], "dcmi");
}

#[test]
fn zero_npus_from_dcmi_falls_through_to_npu_smi_and_says_why() {
    let sc = scenario("model = \"910B\"\ncards = 0\n");
    let out = run_agent(&sc, Some(&fake_lib()), &["devices"]);
    assert_eq!(out.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("enumerated no NPU"), "{stderr}");
    assert!(stderr.contains("npu-smi: no NPU found"), "{stderr}");
}

#[test]
fn a3_enumerates_two_dies_per_card_and_skips_the_mcu() {
    let sc =
        scenario("model = \"910_93\"\ncards = 2\n[[device]]\nid = 3\naicube = { constant = 55 }\n");
    let v = json(&run_agent(&sc, Some(&fake_lib()), &["devices", "--json"]));
    let devs = v["devices"].as_array().unwrap();
    assert_eq!(devs.len(), 4, "{v}");
    let d3 = device(&v, 3);
    assert_eq!(
        (d3["card"].as_u64(), d3["chip"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(d3["name"], "910_9391");
    // Same through npu-smi (mapping from `npu-smi info -m`, rows with ChipId).
    let sc2 = scenario(
        "model = \"910_93\"\ncards = 2\n[npu_smi]\nwatch_period_ms = 50\n[[device]]\nid = 3\naicube = { constant = 55 }\n",
    );
    let v = json(&run_agent(
        &sc2,
        None,
        &["sample", "--window", "1s", "--json", "--devices", "3"],
    ));
    assert_eq!(device(&v, 3)["peak"], 55, "{v}");
    assert_eq!(v["devices"].as_array().unwrap().len(), 1);
}

#[test]
fn ascend_950_uses_the_v2_api_and_the_layout_without_chip_column() {
    let sc = scenario(
        "model = \"950\"\ncards = 2\n[npu_smi]\nwatch_period_ms = 50\n[[device]]\nid = 1\naicube = { constant = 42 }\n",
    );
    let v = json(&run_agent(&sc, Some(&fake_lib()), &["devices", "--json"]));
    let d1 = device(&v, 1);
    assert_eq!(d1["backend"], "dcmi");
    assert_eq!(d1["chip"], serde_json::Value::Null);
    assert_eq!(d1["last_value"], 42);
    let v = json(&run_agent(
        &sc,
        None,
        &["sample", "--window", "1s", "--json"],
    ));
    assert_eq!(device(&v, 1)["peak"], 42, "{v}");
    assert_eq!(device(&v, 1)["backend"], "npu-smi");
}

// The fake writes 77 into the out-parameter whenever it fails: a reading of 77 would mean
// the agent used a value despite rc != 0.
#[test]
fn dcmi_errors_make_invalid_samples_and_the_value_is_ignored() {
    let sc = scenario(
        "model = \"910B\"\ncards = 3\n[[device]]\nid = 0\naicube = { error = -8005 }\n[[device]]\nid = 1\naicube = { constant = 150 }\n[[device]]\nid = 2\naicube = { error = -8123 }\n",
    );
    let v = json(&run_agent(
        &sc,
        Some(&fake_lib()),
        &["sample", "--window", "1s", "--json"],
    ));
    for id in 0..3 {
        let d = device(&v, id);
        assert_eq!(d["peak"], serde_json::Value::Null, "device {id}: {v}");
        assert_eq!(d["mean"], serde_json::Value::Null);
        assert_eq!(d["valid"], 0);
        assert!(d["invalid"].as_u64().unwrap() > 0);
        assert_eq!(d["backend"], "dcmi");
    }
    let v = json(&run_agent(&sc, Some(&fake_lib()), &["devices", "--json"]));
    assert_eq!(device(&v, 0)["last_error"], -8005);
    assert_eq!(device(&v, 0)["last_value"], serde_json::Value::Null);
    assert_eq!(
        device(&v, 1)["last_error"],
        -99997,
        "value 150 is out of range"
    );
    assert_eq!(device(&v, 2)["last_error"], -8123, "unknown codes are kept");
}

#[test]
fn npu_smi_na_is_unavailable_not_zero() {
    let sc = scenario(
        "model = \"910B\"\ncards = 1\n[npu_smi]\nwatch_period_ms = 50\n[default]\naicube = \"na\"\n",
    );
    let v = json(&run_agent(
        &sc,
        None,
        &["sample", "--window", "1s", "--json"],
    ));
    let d = device(&v, 0);
    assert_eq!(d["peak"], serde_json::Value::Null, "{v}");
    assert!(d["invalid"].as_u64().unwrap() > 0, "{v}");
}

#[test]
fn library_found_through_ld_library_path() {
    let sc = scenario("model = \"910B\"\ncards = 1\n[default]\naicube = { constant = 9 }\n");
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(fake_lib(), dir.path().join("libdcmi.so")).unwrap();
    let out = std::process::Command::new(support::agent())
        .env("FAKE_NPU_SCENARIO", &sc.path)
        .env("LD_LIBRARY_PATH", dir.path())
        .args([
            "--dcmi-no-owner-check",
            "--npu-smi",
            "/nonexistent/npu-smi",
            "devices",
            "--json",
        ])
        .output()
        .unwrap();
    let v = json(&out);
    assert_eq!(device(&v, 0)["backend"], "dcmi");
    assert_eq!(device(&v, 0)["last_value"], 9);
}

#[test]
fn untrusted_library_is_refused_without_the_flag() {
    let sc = scenario("model = \"910B\"\n");
    let dir = tempfile::tempdir().unwrap();
    let lib = dir.path().join("libdcmi.so");
    std::fs::copy(fake_lib(), &lib).unwrap();
    // Group-writable directory: refused even for root.
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o775),
    )
    .unwrap();
    let out = std::process::Command::new(support::agent())
        .env("FAKE_NPU_SCENARIO", &sc.path)
        .args(["--dcmi-lib"])
        .arg(&lib)
        .args(["--npu-smi", "/nonexistent/npu-smi", "devices"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&lib.display().to_string()), "{stderr}");
    assert!(stderr.contains("no usable driver backend"), "{stderr}");
    assert!(stderr.contains("npu-smi is not available"), "{stderr}");
}

#[test]
fn no_backend_exits_3_and_names_both_causes() {
    let sc = scenario("model = \"910B\"\n");
    let out = std::process::Command::new(support::agent())
        .env("FAKE_NPU_SCENARIO", &sc.path)
        .env_remove("LD_LIBRARY_PATH")
        .args([
            "--dcmi-lib",
            "/nonexistent/libdcmi.so",
            "--npu-smi",
            "/nonexistent/npu-smi",
            "sample",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("/nonexistent/libdcmi.so: does not exist"),
        "{stderr}"
    );
    assert!(stderr.contains("npu-smi:"), "{stderr}");
}

#[test]
fn unsupported_hdk_and_not_ready_driver_are_reported() {
    for (watch, text) in [
        (
            "unsupported",
            "HDK does not support npu-smi info watch -s u (AI Cube Usage)",
        ),
        ("not_ready", "npu-smi info watch -h failed with exit code 1"),
    ] {
        let sc = scenario(&format!(
            "model = \"910B\"\n[npu_smi]\nwatch = \"{watch}\"\n"
        ));
        let out = run_agent(&sc, None, &["devices"]);
        assert_eq!(out.status.code(), Some(3), "{watch}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(text), "{watch}: {stderr}");
    }
}

#[test]
fn bad_usage_exits_2() {
    let sc = scenario("model = \"910B\"\ncards = 1\n");
    let out = run_agent(&sc, Some(&fake_lib()), &["sample", "--devices", "7"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("device [7] not found") && stderr.contains("[0]"),
        "{stderr}"
    );
    let out = run_agent(&sc, Some(&fake_lib()), &["sample", "--window", "soon"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("soon"));
    let out = run_agent(&sc, Some(&fake_lib()), &["sample", "--period", "0s"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("period"));
    // Huge or empty windows are usage errors, not an allocation abort.
    for w in ["1000d", "0s"] {
        let out = run_agent(&sc, Some(&fake_lib()), &["sample", "--window", w]);
        assert_eq!(out.status.code(), Some(2), "{w}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("--window"),
            "{w}"
        );
    }
}

#[test]
fn version_shows_the_git_revision() {
    let out = std::process::Command::new(support::agent())
        .arg("--version")
        .output()
        .unwrap();
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(s.starts_with("npu-health-agent 0.1.0 (git "), "{s}");
}

// The driver's fault codes, read on the DCMI thread, with the driver's text where it has one;
// a device whose fault read fails says why and keeps its AI Cube figures.
#[test]
fn devices_show_the_drivers_fault_codes_and_their_texts() {
    let sc = scenario(
        "model = \"910B\"\ncards = 3\n[default]\naicube = { constant = 30 }\n[[device]]\nid = 0\nerror_codes = [0x80E01801, 0x12345678]\n[[device]]\nid = 1\nerror_codes_error = -8005\n",
    );
    let v = json(&run_agent(&sc, Some(&fake_lib()), &["devices", "--json"]));
    let d = device(&v, 0);
    assert_eq!(d["faults"][0]["hex"], "0x80E01801", "{d}");
    assert_eq!(d["faults"][0]["code"], 0x80E0_1801u32);
    assert_eq!(d["faults"][0]["text"], "HBM multi-bit ECC error on access");
    assert_eq!(d["faults"][1]["hex"], "0x12345678");
    assert!(
        d["faults"][1]["text"].is_null(),
        "the driver has no text: {d}"
    );
    assert!(d["faults_age_ms"].is_u64(), "{d}");
    let failing = device(&v, 1);
    assert_eq!(
        failing["faults_error"], "internal error (-8005)",
        "{failing}"
    );
    assert_eq!(failing["last_value"], 30, "AI Cube still read: {failing}");
    let clean = device(&v, 2);
    assert_eq!(clean["faults"], serde_json::json!([]), "{clean}");
    assert!(clean["faults_error"].is_null());
}

// Without DCMI the same codes come from `npu-smi info -t health`, with the texts the tool
// prints; a chip with none has none.
#[test]
fn devices_on_npu_smi_show_the_fault_codes_the_tool_prints() {
    let sc = scenario(
        "model = \"910B\"\ncards = 2\n[default]\naicube = { constant = 30 }\n[[device]]\nid = 0\nerror_codes = [0x80E01801, 0x12345678]\n",
    );
    let v = json(&run_agent(&sc, None, &["devices", "--json"]));
    let d = device(&v, 0);
    assert_eq!(d["backend"], "npu-smi", "{d}");
    assert_eq!(d["faults"][0]["hex"], "0x80E01801", "{d}");
    assert_eq!(d["faults"][0]["text"], "HBM multi-bit ECC error on access");
    assert_eq!(d["faults"][1]["hex"], "0x12345678", "{d}");
    assert!(d["faults_error"].is_null(), "{d}");
    let clean = device(&v, 1);
    assert_eq!(clean["faults"], serde_json::json!([]), "{clean}");
    assert!(clean["faults_age_ms"].is_u64(), "read, and none: {clean}");
}

// Issue 42: the pod labels find an NPU by the physical id the Ascend device plugin names it
// by (`Ascend910-<phy>`), so `devices --json` shows that id as the driver gives it: through
// DCMI, through npu-smi's `Chip Phy-ID` column (910_93), and none where npu-smi has no such
// column (910B).
#[test]
fn devices_shows_each_npus_physical_id_as_the_driver_gives_it() {
    let sc = scenario(
        "model = \"910_93\"\ncards = 1\n[npu_smi]\nwatch_period_ms = 50\n[[device]]\nid = 0\nphy_id = 5\n[[device]]\nid = 1\nphy_id = 4\n",
    );
    for lib in [Some(fake_lib()), None] {
        let v = json(&run_agent(&sc, lib.as_deref(), &["devices", "--json"]));
        assert_eq!(device(&v, 0)["phy_id"], 5, "{lib:?}: {v}");
        assert_eq!(device(&v, 1)["phy_id"], 4, "{lib:?}: {v}");
    }
    let sc = scenario("model = \"910B\"\ncards = 1\n[npu_smi]\nwatch_period_ms = 50\n");
    let v = json(&run_agent(&sc, None, &["devices", "--json"]));
    assert_eq!(device(&v, 0)["backend"], "npu-smi", "{v}");
    assert!(device(&v, 0)["phy_id"].is_null(), "{v}");
}

/// Asserts that each line of `text` has its cells where the title line has its columns:
/// a left-aligned cell starts where its title starts, a right-aligned one (`right`) ends
/// where its title ends. Cells hold no spaces but in the last column.
fn assert_columns(text: &str, titles: &[&str], right: &[&str]) {
    let lines: Vec<&str> = text.lines().collect();
    let mut from = 0;
    let edges: Vec<(usize, usize)> = titles
        .iter()
        .map(|t| {
            let at = from
                + lines[0][from..]
                    .find(t)
                    .unwrap_or_else(|| panic!("{t}: {text}"));
            from = at + t.len();
            (at, from)
        })
        .collect();
    for line in &lines[1..] {
        for (t, (start, end)) in titles.iter().zip(&edges).take(titles.len() - 1) {
            let ok = if right.contains(t) {
                line[..*end].ends_with(|c: char| c != ' ') && line[*end..].starts_with(' ')
            } else {
                line[*start..].starts_with(|c: char| c != ' ')
                    && (*start == 0 || line[..*start].ends_with(' '))
            };
            assert!(ok, "{t} out of its column in {line:?}:\n{text}");
        }
    }
}

// Issue 48: `devices` and `sample` line up their columns on a host of many NPUs with values
// missing (a failed HBM read, a device gone, an NPU without a reading), through the binary.
#[test]
fn devices_and_sample_line_up_their_columns() {
    let sc = scenario(
        "model = \"910B\"\ncards = 12\n\
         [[device]]\nid = 3\nhbm_error = -8005\nhealth = 0xFFFFFFFF\n\
         [[device]]\nid = 11\naicube = \"na\"\n",
    );
    let out = run_agent(&sc, Some(&fake_lib()), &["devices"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.lines().count(), 13, "{text}");
    assert!(
        text.contains("device gone") && text.contains("n/a"),
        "{text}"
    );
    let titles = [
        "ID", "CARD", "CHIP", "NAME", "BACKEND", "AI CUBE", "HBM MB", "HEALTH", "WHY",
    ];
    assert_columns(&text, &titles, &[]);
    let out = run_agent(
        &sc,
        Some(&fake_lib()),
        &["sample", "--window", "300ms", "--period", "50ms"],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        text.lines().count(),
        13,
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let titles = ["ID", "BACKEND", "PEAK", "MEAN", "VALID", "INVALID"];
    assert_columns(&text, &titles, &["PEAK", "MEAN", "VALID", "INVALID"]);
}

//! The fault-code calls through the real dlopen path: `dcmi::Dcmi` opens the fake
//! `libdcmi.so` and reads each chip's fault codes and their texts, on the v1 API (910B) and
//! the 950's v2 API. `dcmi_init` runs once per process and the fake reads its scenario then,
//! so each case re-runs this test binary in a child with its own `FAKE_NPU_SCENARIO`.
#![cfg(feature = "fake-driver")]

use crate::support;
use npu_health_agent::driver::dcmi::{Dcmi, DcmiError};
use std::process::Command;

const CHILD: &str = "NPU_HEALTH_DCMI_FAULTS_CHILD";

/// Runs `test` of this file in a child process with `scenario`; panics with its output if
/// it failed.
fn in_child(test: &str, scenario: &support::Scenario) {
    let test = support::full_test_name(test);
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            test.as_str(),
            "--exact",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(CHILD, "1")
        .env("FAKE_NPU_SCENARIO", &scenario.path)
        .output()
        .unwrap();
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(text.contains("1 passed"), "the child ran the test: {text}");
}

fn open() -> Dcmi {
    Dcmi::open(&support::fake_lib()).expect("open the fake libdcmi.so")
}

#[test]
fn fault_codes_and_texts_on_the_v1_api() {
    if std::env::var_os(CHILD).is_none() {
        let sc = support::scenario(
            "model = \"910B\"\ncards = 4\n[[device]]\nid = 0\nerror_codes = [0x80E01801, 0x80C98002]\n[[device]]\nid = 2\nerror_codes_error = -8005\n[[device]]\nid = 3\naicube = { file = \"npu3\" }\n",
        );
        std::fs::write(sc.dir.path().join("npu3"), "0 errors=0x40F84E00\n").unwrap();
        in_child("fault_codes_and_texts_on_the_v1_api", &sc);
        return;
    }
    let dcmi = open();
    let chips = dcmi.chips().unwrap();
    let codes = dcmi.error_codes(&chips[0]).unwrap();
    assert_eq!(codes, [0x80E0_1801, 0x80C9_8002]);
    assert_eq!(
        dcmi.error_text(&chips[0], 0x80E0_1801).unwrap(),
        "HBM multi-bit ECC error on access"
    );
    assert!(matches!(
        dcmi.error_text(&chips[0], 0x1234_5678),
        Err(DcmiError::NotSupport)
    ));
    assert!(dcmi.error_codes(&chips[1]).unwrap().is_empty(), "no fault");
    // A chip whose fault read fails: the driver's -8005, not -8255.
    assert!(matches!(
        dcmi.error_codes(&chips[2]),
        Err(DcmiError::InnerErr)
    ));
    // Over time: the file names the codes, then none.
    assert_eq!(dcmi.error_codes(&chips[3]).unwrap(), [0x40F8_4E00]);
    let file = std::path::Path::new(&std::env::var_os("FAKE_NPU_SCENARIO").unwrap())
        .parent()
        .unwrap()
        .join("npu3");
    std::fs::write(&file, "0 errors=\n").unwrap();
    assert!(
        dcmi.error_codes(&chips[3]).unwrap().is_empty(),
        "a cleared fault reads as none, not the stale list"
    );
}

#[test]
fn fault_codes_on_the_950s_v2_api() {
    if std::env::var_os(CHILD).is_none() {
        let sc = support::scenario(
            "model = \"950\"\ncards = 2\n[[device]]\nid = 1\nerror_codes = [0x81078603]\n",
        );
        in_child("fault_codes_on_the_950s_v2_api", &sc);
        return;
    }
    let dcmi = open();
    assert_eq!(dcmi.api(), npu_health_agent::driver::dcmi::Api::V2);
    let chips = dcmi.chips().unwrap();
    assert!(dcmi.error_codes(&chips[0]).unwrap().is_empty());
    assert_eq!(dcmi.error_codes(&chips[1]).unwrap(), [0x8107_8603]);
    assert_eq!(
        dcmi.error_text(&chips[1], 0x8107_8603).unwrap(),
        "network port link changed from up to down"
    );
}

// The fake npu-smi prints `info -t health` as the driver's npucli does, and the agent's
// parser reads it back: the codes in hex, a text per code (the decimal code where there is
// none), `OK` and `NA` for a chip without codes, each chip's word with `-i` alone.
#[test]
fn npu_smi_health_prints_the_codes_and_the_parser_reads_them() {
    use npu_health_agent::driver::npu_smi::parse::parse_health;
    let sc = support::scenario(
        "model = \"910_93\"\ncards = 1\n[[device]]\nid = 0\nhealth = 2\nerror_codes = [0x80E01801, 0x12345678]\n[[device]]\nid = 1\nhealth = 1\n",
    );
    let smi = |args: &[&str]| {
        let out = Command::new(support::agent())
            .env("FAKE_NPU_SCENARIO", &sc.path)
            .args(["info", "-t", "health"])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let text = smi(&["-i", "0", "-c", "0"]);
    let h = parse_health(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(h.health, "Alarm", "{text}");
    assert_eq!(h.codes, [0x80E0_1801, 0x1234_5678]);
    assert_eq!(
        h.texts,
        [
            "HBM multi-bit ECC error on access",
            &0x1234_5678u32.to_string()
        ]
    );
    assert!(
        text.contains("\tError Code                     : 80E01801 12345678\n"),
        "{text}"
    );
    let clean = parse_health(&smi(&["-i", "0", "-c", "1"])).unwrap();
    assert_eq!(
        (clean.health.as_str(), clean.codes.len()),
        ("OK", 0),
        "no codes reads OK whatever the health word"
    );
    let card = smi(&["-i", "0"]);
    assert!(
        card.contains(
            "\tHealth                         : Alarm\n\tChip ID                        : 0\n"
        ),
        "{card}"
    );
}

//! Tests of the bundle writer's outcome: a directory that cannot take a bundle is warned of
//! once per kind of problem, counted, and leaves the verdict as it was.

use super::store::StoreError;
use super::{Warned, settle};
use crate::monitor::Monitor;
use crate::monitor::verdict::Status;
use crate::probe::health::HealthOutcome;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// An engine whose verdict is `abnormal` (virtual inference found it hung).
fn abnormal_engine() -> Monitor {
    let text = "[[engine]]\nengine_type = \"vllm\"\nserved_model_name = \"m\"\nhost = \"127.0.0.1\"\nport = 8000\nmgmt_port = 9001\nengine_env = {}\n[engine.health_check_config]\nenable_virtual_inference = true\n";
    let spec = crate::config::file::parse(text, Path::new("/x/agent.toml"))
        .unwrap()
        .engines
        .remove(0);
    let m = Monitor::new(spec, vec![0]);
    m.record_health(&HealthOutcome::Healthy, true);
    m.vi().set_abnormal("6 counted failures");
    assert_eq!(m.peek_status(), Status::Abnormal);
    m
}

#[test]
fn a_directory_that_cannot_take_a_bundle_is_warned_of_once_and_leaves_the_verdict_alone() {
    let m = abnormal_engine();
    let before = m.verdict();
    let warned = Warned::default();
    let dir = Path::new("/x/evidence");
    let not_dir = || Err(StoreError::NotADirectory(dir.to_owned()));
    let t = Duration::ZERO;
    assert!(warned.warn_once(&StoreError::NotADirectory(dir.to_owned())));
    settle(&m, dir, &warned, not_dir(), t);
    settle(&m, dir, &warned, not_dir(), t);
    // The same problem again: no second warning.
    assert!(!warned.warn_once(&StoreError::NotADirectory(dir.to_owned())));
    let r = m.evidence();
    assert_eq!((r.written, r.failed, r.skipped), (0, 2, 0), "{r:?}");
    assert!(
        r.last_error.as_deref().unwrap().contains("not a directory"),
        "{r:?}"
    );
    // A full disk is another problem: warned of, and counted as skipped.
    let floor = StoreError::BelowFloor {
        dir: dir.to_owned(),
        free: 1,
        floor: 2,
    };
    settle(&m, dir, &warned, Err(floor), t);
    assert!(!warned.warn_once(&StoreError::BelowFloor {
        dir: dir.to_owned(),
        free: 1,
        floor: 2
    }));
    assert_eq!(m.evidence().skipped, 1);
    assert_eq!(m.verdict(), before);
    // Written again: the error is gone, and the next problem is warned of again.
    let path = PathBuf::from("/x/evidence/0000000000001-e-abnormal");
    settle(&m, dir, &warned, Ok((path.clone(), 42, 0)), t);
    let r = m.evidence();
    assert_eq!(r.last_path, Some(path.display().to_string()));
    assert_eq!((r.written, r.last_bytes, r.last_error), (1, 42, None));
    assert!(warned.warn_once(&StoreError::ReadOnly(dir.to_owned())));
    assert_eq!(m.verdict(), before);
}

// The summary says how long each part took, so a slow py-spy or npu-smi shows in the bundle
// itself; a part that cannot be had is a note, and the summary comes last.
#[test]
fn the_summary_says_how_long_each_part_took() {
    let nothing = tempfile::tempdir().unwrap();
    let summary = serde_json::json!({ "took_ms": { "metrics": 3 } });
    let parts = super::gather_local(
        &nothing.path().join("npu-smi"),
        "127.0.0.1",
        1,
        vec![("metrics.txt".to_owned(), b"m".to_vec())],
        summary,
    );
    let names: Vec<&str> = parts.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "metrics.txt",
            "processes.txt",
            "py-spy.txt",
            "npu-smi.txt",
            "summary.json"
        ]
    );
    let summary: serde_json::Value = serde_json::from_slice(&parts[4].1).unwrap();
    let took = &summary["took_ms"];
    for key in ["metrics", "processes", "py_spy", "npu_smi"] {
        assert!(took[key].is_u64(), "{key}: {summary}");
    }
    assert!(summary["finished_at_unix_ms"].as_u64().unwrap() > 0);
    let npu_smi = String::from_utf8_lossy(&parts[3].1);
    assert!(npu_smi.starts_with("# npu-smi info"), "{npu_smi}");
}

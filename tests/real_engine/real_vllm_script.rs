//! `scripts/real-vllm` on the paths that need no real install: no usable Python, an install
//! that fails half way (no half-built venv is left for the next `up` to trust), `up` before
//! `install`, and bad usage. All exit 2 with a message naming what is wrong.

use std::path::Path;
use std::process::{Command, Output};

fn script(home: &Path, python: &Path, args: &[&str]) -> Output {
    Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/real-vllm"))
        .args(args)
        .env("REAL_VLLM_HOME", home)
        .env("REAL_VLLM_PYTHON", python)
        .output()
        .expect("run scripts/real-vllm")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn a_missing_python_is_exit_2_with_the_reason() {
    let home = tempfile::tempdir().unwrap();
    let o = script(home.path(), Path::new("/nonexistent/python3"), &["install"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("no usable Python"), "{}", stderr(&o));
    assert!(!home.path().join("venv").exists());
}

// A "Python" that passes the version check, starts a venv and then fails: the install exits
// 2 and removes what it built, so nothing half-built is trusted later.
#[test]
fn a_failed_install_leaves_no_half_built_venv() {
    let home = tempfile::tempdir().unwrap();
    let py = home.path().join("python3");
    std::fs::write(
        &py,
        "#!/bin/sh\nif [ \"$1\" = -c ]; then exit 0; fi\nif [ \"$1\" = -m ] && [ \"$2\" = venv ]; then mkdir -p \"$3/bin\"; echo half > \"$3/bin/python\"; exit 1; fi\nexit 1\n",
    )
    .unwrap();
    Command::new("chmod").arg("+x").arg(&py).status().unwrap();
    let o = script(home.path(), &py, &["install"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("install failed"), "{}", stderr(&o));
    assert!(
        !home.path().join("venv").exists(),
        "the partial venv was removed"
    );
    // `up` does not trust what is not there.
    let o = script(home.path(), &py, &["up"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("not installed"), "{}", stderr(&o));
}

#[test]
fn bad_usage_is_exit_2() {
    let home = tempfile::tempdir().unwrap();
    for args in [&["frobnicate"][..], &[][..], &["up", "--bogus"][..]] {
        let o = script(home.path(), Path::new("python3"), args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains("usage"), "{}", stderr(&o));
    }
}

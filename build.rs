//! Build script: records the git revision and a hash of the sources for `--version`. (The DCMI bindings are generated
//! by `crates/dcmi/build.rs`.)

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=.git/HEAD");
    println!("cargo:rerun-if-changed=.git/refs/heads");
    let hash = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=NPU_HEALTH_AGENT_GIT_HASH={hash}");

    // What the binary is built from, so a tool that runs it (npu-chaos) can tell a binary
    // of other sources or without the fakes from the library it links, whatever the files'
    // times say: a hash of the crate's sources and manifest, and the fakes when built in.
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=Cargo.toml");
    let mut files = Vec::new();
    collect(std::path::Path::new("src"), &mut files);
    files.push("Cargo.toml".into());
    files.sort();
    let mut h = Fnv(0xcbf2_9ce4_8422_2325);
    for f in &files {
        h.eat(f.to_string_lossy().as_bytes());
        h.eat(&std::fs::read(f).unwrap_or_default());
    }
    let fakes = if std::env::var_os("CARGO_FEATURE_FAKE_DRIVER").is_some() {
        ", fake-driver"
    } else {
        ""
    };
    println!(
        "cargo:rustc-env=NPU_HEALTH_AGENT_BUILD=source {:016x}{fakes}",
        h.0
    );
}

fn collect(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            collect(&p, out);
        } else {
            out.push(p);
        }
    }
}

/// FNV-1a, 64 bits: stable across Rust versions, unlike the standard library's hasher.
struct Fnv(u64);

impl Fnv {
    fn eat(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

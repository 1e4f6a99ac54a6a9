//! Starting the fake engine from another process: free loopback ports, and the command that
//! runs it through the agent binary's `fake-engine` subcommand (a fake-driver build). Shared
//! by the agent's demo, its tests and the chaos runner.

use std::path::{Path, PathBuf};

/// `N` distinct free loopback ports. The listeners are held until all are picked, so the
/// ports differ from each other; another process may still take one before its user binds
/// it, which a caller must expect (the chaos runner detects it and starts again).
pub fn free_ports<const N: usize>() -> std::io::Result<[u16; N]> {
    let mut held = Vec::with_capacity(N);
    let mut ports = [0; N];
    for p in &mut ports {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        *p = l.local_addr()?.port();
        held.push(l);
    }
    Ok(ports)
}

/// The command that runs the fake engine (`exe fake-engine …`) on loopback: inference on
/// `port`, fault control on `control`, serving `model`, writing its NPU figure to `npu_files`.
/// Output is discarded; callers spawn it.
pub fn command(
    exe: &Path,
    port: u16,
    control: u16,
    model: &str,
    npu_files: &[PathBuf],
) -> std::process::Command {
    let mut c = std::process::Command::new(exe);
    c.args(["fake-engine", "--model", model])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--control", &format!("127.0.0.1:{control}")])
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    for f in npu_files {
        c.arg("--npu-file").arg(f);
    }
    c
}

//! Starting the fake engine from another process: free loopback ports, and the command that
//! runs it through the agent binary's `fake-engine` subcommand (a fake-driver build). Shared
//! by the agent's demo, its tests and the chaos runner.

use std::path::{Path, PathBuf};

/// `N` distinct free loopback ports. They come from below the kernel's ephemeral range
/// (`net.ipv4.ip_local_port_range`), where neither `bind(:0)` nor an outgoing connection's
/// source port lands, from a start that differs per process, and this process never hands
/// out the same port twice: a port picked here and bound a moment later is not taken in
/// between by a neighbour test's `:0` listener or its thousand client connections (a port
/// from `:0`, released, often was). Each is checked free by binding it; another process may
/// still bind one before its user does, which a caller must expect (the chaos runner
/// detects it and starts again).
pub fn free_ports<const N: usize>() -> std::io::Result<[u16; N]> {
    let mut ports = [0; N];
    let mut held = Vec::with_capacity(N);
    let mut next = NEXT_PORT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let (low, high) = port_range();
    let span = u32::from(high - low);
    let start = *next.get_or_insert_with(|| {
        let seed = std::process::id().wrapping_mul(2_654_435_761)
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
        (seed % span) as u16
    });
    let mut offset = start;
    for p in &mut ports {
        let mut tried = 0;
        loop {
            if tried == span {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AddrInUse,
                    format!("no free loopback port left in {low}..{high}"),
                ));
            }
            tried += 1;
            let port = low + offset;
            offset = ((u32::from(offset) + 1) % span) as u16;
            if let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", port)) {
                *p = port;
                held.push(l);
                break;
            }
        }
    }
    *next = Some(offset);
    Ok(ports)
}

/// Where [`free_ports`] goes on in this process (an offset into [`port_range`]).
static NEXT_PORT: std::sync::Mutex<Option<u16>> = std::sync::Mutex::new(None);

/// The ports [`free_ports`] hands out: from 10000 up to the start of the ephemeral range
/// (32768 on a default Linux), at least 5000 of them.
fn port_range() -> (u16, u16) {
    const LOW: u16 = 10_000;
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    (LOW, ephemeral_low.max(LOW + 5_000))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_never_handed_out_twice_and_stay_below_the_ephemeral_range() {
        let (low, high) = port_range();
        let mut seen = std::collections::HashSet::new();
        for _ in 0..200 {
            let ports: [u16; 4] = free_ports().unwrap();
            for p in ports {
                assert!((low..high).contains(&p), "{p} outside {low}..{high}");
                assert!(seen.insert(p), "{p} handed out twice");
            }
        }
        // A port bound elsewhere is skipped, not handed out.
        let [p] = free_ports::<1>().unwrap();
        let _taken = std::net::TcpListener::bind(("127.0.0.1", p + 1)).ok();
        let [q] = free_ports::<1>().unwrap();
        assert_ne!(q, p + 1);
    }
}

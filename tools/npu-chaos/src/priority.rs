//! The CPU priority of whatever serves `/status` in an experiment (the agent, or MindIE's
//! engine server for the peer).
//!
//! On a real node the engine computes on its NPUs; here the real vLLM computes on this
//! machine's two cores, so its load competes with the health service for the CPU, which no
//! NPU does. Linux groups tasks by session for fair scheduling (`sched_autogroup`, on in
//! these machines' kernel), and vLLM runs in a session of its own (`scripts/real-vllm` starts
//! it under `setsid`). Measured here under a 32-stream burst with one busy loop beside it:
//! an ordinary process of another session waited up to 1.7 s to be scheduled, as long at
//! `nice -10` (the sessions share the CPU as groups); the agent's `/status` took up to 1.2 s
//! to answer Node Manager's poll (median 1–3 ms) and once not within its 2 s timeout; at the
//! 1 s cadence late answers like these can decide a kill (the likely cause of the two false
//! kills in CI, whose polls were not recorded). With the health service in a session of its
//! own at group nice -10, the slowest answer was 47 ms (docs/chaos.md, "The health service's
//! CPU priority"; BENCHMARKS.md).
//!
//! So the runner starts the health service in a new session (a new scheduling group), at
//! nice -10 for the session and for the process: what an operator gives a node's health
//! service, whose late answer Node Manager counts as `abnormal`. It needs `CAP_SYS_NICE`
//! (root, as CI runs); without it the service runs at the default priority and the runner
//! says so once.

use super::procfs;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::process::Command;

/// The nice value of the health service and its scheduling group.
pub const HEALTH_SERVICE_NICE: i32 = -10;

/// A command that runs `program` in a session of its own (so in its own scheduling group) at
/// [`HEALTH_SERVICE_NICE`]: `setsid nice -n -10 program` (util-linux and coreutils; each
/// execs the next, so the child's pid is the program's). Without the privilege `nice` says so
/// in the program's stderr and runs it anyway. Call [`raise_group`] with the child's pid once
/// it is spawned.
pub fn command(program: impl AsRef<Path>) -> Command {
    let mut cmd = Command::new("setsid");
    cmd.args(["--", "nice", "-n", &HEALTH_SERVICE_NICE.to_string(), "--"])
        .arg(program.as_ref());
    cmd
}

/// Sets the scheduling group of `pid`'s session to [`HEALTH_SERVICE_NICE`]
/// (`/proc/<pid>/autogroup`) and checks the process's own nice. Says once, on stderr, when
/// either could not be set; never fails the experiment for it.
pub async fn raise_group(pid: Option<u32>) {
    static WARNED: AtomicBool = AtomicBool::new(false);
    let Some(pid) = pid else { return };
    // `setsid` runs first, then `nice`: until they have, the pid is still in the runner's
    // own session (whose group must not be the one raised) at the runner's nice.
    let (mut own, mut nice) = (false, None);
    for _ in 0..200 {
        match session_of(pid) {
            Some(s) => own = s == pid,
            None => return,
        }
        nice = process_nice(pid);
        if own && nice == Some(HEALTH_SERVICE_NICE) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut problems = Vec::new();
    if !own {
        problems.push("no session of its own after 1 s".to_owned());
    }
    let autogroup = format!("/proc/{pid}/autogroup");
    // A kernel without autogroup has no such file: the process nice is what counts there.
    if own
        && Path::new(&autogroup).exists()
        && let Err(e) = std::fs::write(&autogroup, HEALTH_SERVICE_NICE.to_string())
    {
        problems.push(format!("{autogroup}: {e}"));
    }
    match nice {
        Some(n) if n == HEALTH_SERVICE_NICE => {}
        Some(n) => problems.push(format!("process nice is {n}")),
        None => problems.push("process nice unknown".to_owned()),
    }
    if !problems.is_empty() && !WARNED.swap(true, Ordering::Relaxed) {
        eprintln!(
            "npu-chaos:   the health service runs at the default CPU priority, not nice {HEALTH_SERVICE_NICE} ({}; needs CAP_SYS_NICE): on a saturated machine its answers can be late",
            problems.join("; ")
        );
    }
}

/// The nice value of `pid`.
fn process_nice(pid: u32) -> Option<i32> {
    procfs::stat_field(pid, 19)
}

/// The session `pid` belongs to.
fn session_of(pid: u32) -> Option<u32> {
    procfs::stat_field(pid, 6)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A child started this way leads its own session, runs at the health service's nice,
    /// and (on a kernel with autogroup) its group is raised too. Without CAP_SYS_NICE only
    /// the session is checked.
    #[tokio::test]
    async fn the_health_service_gets_its_own_session_and_priority() {
        let mut cmd = command("sleep");
        cmd.arg("5")
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true);
        let child = cmd.spawn().expect("setsid, nice and sleep start");
        let pid = child.id().expect("running");
        raise_group(Some(pid)).await;
        assert_eq!(session_of(pid), Some(pid), "it leads a session of its own");
        if process_nice(std::process::id()).is_some_and(|n| n <= HEALTH_SERVICE_NICE)
            || std::fs::read_to_string("/proc/self/status")
                .is_ok_and(|s| s.lines().any(|l| l.starts_with("Uid:\t0\t")))
        {
            assert_eq!(process_nice(pid), Some(HEALTH_SERVICE_NICE));
            let group = format!("/proc/{pid}/autogroup");
            if let Ok(text) = std::fs::read_to_string(&group) {
                assert!(
                    text.trim_end()
                        .ends_with(&format!("nice {HEALTH_SERVICE_NICE}")),
                    "{group}: {text}"
                );
            }
        }
    }
}

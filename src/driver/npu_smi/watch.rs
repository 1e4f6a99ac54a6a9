//! One long-lived `npu-smi info watch -s u -i <card> [-c <chip>]` child per device.
//!
//! The reference spawns a process per reading (at most 4 per 5 s window) and reads only the
//! first NPU. We keep one child per device that needs the fallback, read its pipe with our own
//! buffer ([`WatchParser`]), restart it with back-off when it dies, and kill and reap it on
//! shutdown. argv only, no shell. Each child leads its own process group and the whole group
//! is killed, so a wrapper script's children cannot keep the pipe (and our reader) alive.
//!
//! Supervision follows the child's exit, not the end of its pipe: a wrapper's background
//! process inherits the write end, so after the child dies the pipe may never reach EOF. The
//! pipe is polled with a timeout and the child checked for exit (without reaping it, so its
//! group id stays ours) at least every 100 ms; on exit its group is killed, the pipe
//! closed, the child reaped and restarted.

use super::parse::{Cube, WatchEvent, WatchParser};
use crossbeam_channel::{Receiver, Sender};
use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::io::Errno;
use rustix::process::{Pid, WaitId, WaitIdOptions};
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often a child is checked for exit while its pipe is quiet: the longest a dead child
/// stays a zombie when a grandchild keeps its pipe open.
const EXIT_CHECK: Duration = Duration::from_millis(100);

/// Output still read once the child is dead: its last lines are reported, but a grandchild
/// outside its group that keeps writing cannot hold the supervisor.
const DRAIN_LIMIT: usize = 64 * 1024;

/// Which device a watch child follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WatchTarget {
    /// `-i`: card id (logic id on a 950).
    pub npu: u32,
    /// `-c`: chip id; `None` on a 950, whose npu-smi has no `-c`.
    pub chip: Option<u32>,
}

/// How watch children are run.
#[derive(Debug, Clone)]
pub struct WatchConfig {
    /// The `npu-smi` executable.
    pub npu_smi: PathBuf,
    /// `-d`: seconds between passes, 1..=100.
    pub delay_s: u32,
    /// Wait before the first restart; doubles after every child that gave no row.
    pub backoff_initial: Duration,
    /// Longest wait between restarts.
    pub backoff_max: Duration,
}

impl WatchConfig {
    /// argv for `target` (without the program).
    pub(crate) fn args(&self, target: WatchTarget) -> Vec<String> {
        let mut a = vec![
            "info".to_owned(),
            "watch".to_owned(),
            "-s".to_owned(),
            "u".to_owned(),
            "-i".to_owned(),
            target.npu.to_string(),
        ];
        if let Some(chip) = target.chip {
            a.extend(["-c".to_owned(), chip.to_string()]);
        }
        a.extend(["-d".to_owned(), self.delay_s.to_string()]);
        a
    }
}

/// What the watch reports to its owner (called on the watch thread).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchUpdate {
    /// A row for the target device.
    Reading(Cube),
    /// A row without an AI Cube column: `-s u` was dropped by the tool.
    NoCubeColumn,
    /// A line that is not a row (an error message), or an overlong line.
    Message(String),
    /// The child could not be started.
    SpawnFailed(String),
    /// The child exited; it will be restarted after `retry_in` unless the watch is stopping.
    Exited {
        status: Option<ExitStatus>,
        rows: u64,
        retry_in: Duration,
    },
}

struct Shared {
    child: Mutex<Slot>,
}

struct Slot {
    stopping: bool,
    child: Option<Child>,
}

/// A running watch; dropping it stops the child and joins the thread.
pub struct Watch {
    shared: Arc<Shared>,
    stop_tx: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
    /// Disconnects when the supervisor thread exits.
    done: Receiver<()>,
}

/// Kills `child` and every process in its group (it was started as a group leader).
fn kill_group(child: &mut Child) {
    let pid = Pid::from_child(child);
    let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
    let _ = child.kill();
}

impl Watch {
    /// Starts the supervisor thread for `target`; `on_update` receives every update.
    pub fn start(
        cfg: WatchConfig,
        target: WatchTarget,
        name: String,
        on_update: impl FnMut(WatchUpdate) + Send + 'static,
    ) -> std::io::Result<Watch> {
        let shared = Arc::new(Shared {
            child: Mutex::new(Slot {
                stopping: false,
                child: None,
            }),
        });
        let (stop_tx, stop_rx) = crossbeam_channel::bounded(1);
        let (done_tx, done) = crossbeam_channel::bounded::<()>(0);
        let s = shared.clone();
        let thread = std::thread::Builder::new().name(name).spawn(move || {
            let _done = done_tx;
            supervise(cfg, target, s, stop_rx, on_update)
        })?;
        Ok(Watch {
            shared,
            stop_tx: Some(stop_tx),
            thread: Some(thread),
            done,
        })
    }

    /// The running child's PID (also its process group), if one runs.
    #[cfg(test)]
    fn pid(&self) -> Option<u32> {
        let slot = self.shared.child.lock().unwrap_or_else(|p| p.into_inner());
        slot.child.as_ref().map(Child::id)
    }

    /// Kills the child, waits for the supervisor to reap it, and joins the thread.
    pub fn stop(mut self) {
        self.stop_inner();
    }

    /// Stops many watches at once: every child is killed first, then the supervisors are
    /// awaited against one 3 s deadline, so shutdown does not take 3 s per NPU when
    /// `npu-smi` is stuck in the driver.
    pub(crate) fn stop_all(watches: Vec<Watch>) {
        let mut watches = watches;
        for w in &mut watches {
            w.signal_stop();
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(3);
        for mut w in watches {
            w.finish(deadline);
        }
    }

    fn stop_inner(&mut self) {
        self.signal_stop();
        self.finish(std::time::Instant::now() + Duration::from_secs(3));
    }

    /// Marks the watch stopping, kills the child's process group and wakes the supervisor.
    fn signal_stop(&mut self) {
        {
            let mut slot = self.shared.child.lock().unwrap_or_else(|p| p.into_inner());
            slot.stopping = true;
            if let Some(child) = slot.child.as_mut() {
                kill_group(child);
            }
        }
        drop(self.stop_tx.take());
    }

    /// Waits until `deadline` for the supervisor to reap the child, then joins it.
    fn finish(&mut self, deadline: std::time::Instant) {
        if let Some(t) = self.thread.take() {
            // Bounded: a child stuck in the driver (uninterruptible) must not hang shutdown.
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.done.recv_timeout(left) {
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                    tracing::warn!("npu-smi watch child did not exit in time; leaving it behind");
                }
                _ => {
                    let _ = t.join();
                }
            }
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

fn supervise(
    cfg: WatchConfig,
    target: WatchTarget,
    shared: Arc<Shared>,
    stop_rx: Receiver<()>,
    mut on_update: impl FnMut(WatchUpdate),
) {
    let mut backoff = cfg.backoff_initial;
    loop {
        let spawned = {
            let mut slot = shared.child.lock().unwrap_or_else(|p| p.into_inner());
            if slot.stopping {
                return;
            }
            Command::new(&cfg.npu_smi)
                .args(cfg.args(target))
                .process_group(0)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .map(|mut child| {
                    let out = child.stdout.take();
                    let pid = Pid::from_child(&child);
                    slot.child = Some(child);
                    (out, pid)
                })
        };
        let mut rows = 0u64;
        let mut status = None;
        match spawned {
            Err(e) => on_update(WatchUpdate::SpawnFailed(format!(
                "cannot run {}: {e}",
                cfg.npu_smi.display()
            ))),
            Ok((stdout, pid)) => {
                let started = Instant::now();
                if let Some(stdout) = stdout {
                    rows = follow(stdout, pid, target, &mut on_update);
                }
                // The child exited, was killed, or closed its stdout: kill what is left of its
                // group (a grandchild holding the pipe), then reap it.
                let child = shared
                    .child
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .child
                    .take();
                if let Some(mut child) = child {
                    kill_group(&mut child);
                    status = child.wait().ok();
                }
                if rows > 0 || started.elapsed() > cfg.backoff_max {
                    backoff = cfg.backoff_initial;
                }
            }
        }
        if shared
            .child
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .stopping
        {
            return;
        }
        on_update(WatchUpdate::Exited {
            status,
            rows,
            retry_in: backoff,
        });
        match stop_rx.recv_timeout(backoff) {
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
            _ => return,
        }
        backoff = (backoff * 2).min(cfg.backoff_max);
    }
}

/// Reads the child's pipe, reporting rows for `target`, until EOF or until the child exits,
/// whichever comes first (then reads what it left, up to [`DRAIN_LIMIT`]). The pipe is closed
/// on return. Returns the number of rows.
fn follow(
    mut stdout: ChildStdout,
    pid: Pid,
    target: WatchTarget,
    on_update: &mut impl FnMut(WatchUpdate),
) -> u64 {
    let mut rows = Rows::new(target);
    let mut buf = [0u8; 4096];
    loop {
        match read_ready(&mut stdout, &mut buf, EXIT_CHECK) {
            Chunk::Data(n) => rows.push(&buf[..n], on_update),
            Chunk::Quiet => {}
            Chunk::End => return rows.finish(on_update),
        }
        if has_exited(pid) {
            break;
        }
    }
    let mut left = DRAIN_LIMIT;
    while left > 0 {
        let want = left.min(buf.len());
        match read_ready(&mut stdout, &mut buf[..want], Duration::ZERO) {
            Chunk::Data(n) => {
                rows.push(&buf[..n], on_update);
                left -= n;
            }
            Chunk::Quiet | Chunk::End => break,
        }
    }
    rows.finish(on_update)
}

/// What one wait on the pipe gave.
enum Chunk {
    /// This many bytes were read.
    Data(usize),
    /// Nothing to read within the wait.
    Quiet,
    /// EOF, or the pipe cannot be read.
    End,
}

/// Reads once from `stdout` if it becomes readable within `wait`.
fn read_ready(stdout: &mut ChildStdout, buf: &mut [u8], wait: Duration) -> Chunk {
    let timeout = Timespec::try_from(wait).unwrap_or_default();
    match rustix::event::poll(&mut [PollFd::new(&*stdout, PollFlags::IN)], Some(&timeout)) {
        Ok(0) | Err(Errno::INTR) => return Chunk::Quiet,
        Ok(_) => {}
        Err(_) => return Chunk::End,
    }
    match stdout.read(buf) {
        Ok(0) => Chunk::End,
        Ok(n) => Chunk::Data(n),
        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => Chunk::Quiet,
        Err(_) => Chunk::End,
    }
}

/// Whether the child has exited. It is not reaped here: until it is, its PID cannot be
/// reused, so killing its group afterwards cannot hit a stranger.
fn has_exited(pid: Pid) -> bool {
    let exited = rustix::process::waitid(
        WaitId::Pid(pid),
        WaitIdOptions::EXITED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT,
    );
    // ECHILD (or any other error) would never clear: stop following rather than spin.
    !matches!(exited, Ok(None) | Err(Errno::INTR))
}

/// Turns the child's output into updates for `target`, counting the target's rows.
struct Rows {
    parser: WatchParser,
    target: WatchTarget,
    count: u64,
}

impl Rows {
    fn new(target: WatchTarget) -> Rows {
        Rows {
            parser: WatchParser::new(),
            target,
            count: 0,
        }
    }

    fn push(&mut self, bytes: &[u8], on_update: &mut impl FnMut(WatchUpdate)) {
        let (target, count) = (self.target, &mut self.count);
        self.parser
            .push(bytes, |ev| report(ev, target, count, on_update));
    }

    /// Reports a last line without a newline; returns the row count.
    fn finish(mut self, on_update: &mut impl FnMut(WatchUpdate)) -> u64 {
        let (target, count) = (self.target, &mut self.count);
        self.parser
            .finish(|ev| report(ev, target, count, on_update));
        self.count
    }
}

/// Reports one parsed line; a row of another device is skipped.
fn report(
    ev: WatchEvent,
    target: WatchTarget,
    count: &mut u64,
    on_update: &mut impl FnMut(WatchUpdate),
) {
    match ev {
        WatchEvent::Row(r)
            if r.npu == target.npu && (target.chip.is_none() || r.chip == target.chip) =>
        {
            *count += 1;
            on_update(WatchUpdate::Reading(r.cube));
        }
        WatchEvent::Row(_) => {}
        WatchEvent::RowWithoutCube => on_update(WatchUpdate::NoCubeColumn),
        WatchEvent::Text(t) => on_update(WatchUpdate::Message(t)),
        WatchEvent::Overlong => on_update(WatchUpdate::Message("overlong line dropped".to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argv_for_v1_and_950() {
        let cfg = WatchConfig {
            npu_smi: "npu-smi".into(),
            delay_s: 1,
            backoff_initial: Duration::from_millis(10),
            backoff_max: Duration::from_secs(1),
        };
        assert_eq!(
            cfg.args(WatchTarget {
                npu: 3,
                chip: Some(1)
            })
            .join(" "),
            "info watch -s u -i 3 -c 1 -d 1"
        );
        assert_eq!(
            cfg.args(WatchTarget { npu: 5, chip: None }).join(" "),
            "info watch -s u -i 5 -d 1"
        );
    }

    /// A watch of NPU 0 chip 0 under `cfg`, its updates on the channel.
    fn watch_npu0(cfg: WatchConfig) -> (Watch, crossbeam_channel::Receiver<WatchUpdate>) {
        let (tx, rx) = crossbeam_channel::unbounded();
        let w = Watch::start(
            cfg,
            WatchTarget {
                npu: 0,
                chip: Some(0),
            },
            "t".into(),
            move |u| {
                let _ = tx.send(u);
            },
        )
        .unwrap();
        (w, rx)
    }

    #[test]
    fn restarts_back_off_doubling_up_to_the_maximum() {
        let cfg = WatchConfig {
            npu_smi: "/nonexistent/npu-smi".into(),
            delay_s: 1,
            backoff_initial: Duration::from_millis(10),
            backoff_max: Duration::from_millis(40),
        };
        let (w, rx) = watch_npu0(cfg);
        let mut waits = Vec::new();
        while waits.len() < 5 {
            match rx
                .recv_timeout(Duration::from_secs(10))
                .expect("updates keep coming")
            {
                WatchUpdate::Exited { retry_in, rows, .. } => {
                    assert_eq!(rows, 0);
                    waits.push(retry_in.as_millis());
                }
                WatchUpdate::SpawnFailed(e) => assert!(e.contains("/nonexistent/npu-smi"), "{e}"),
                other => panic!("unexpected {other:?}"),
            }
        }
        w.stop();
        assert_eq!(waits, [10, 20, 40, 40, 40]);
    }

    #[test]
    fn rows_report_only_the_target_and_are_counted() {
        let out = b"NpuID(Idx)  ChipId(Idx)  AI Cube(%)\n0 0 10\n0 1 20\n0 1 NA\nerror: x\n0 1 3";
        let mut got = Vec::new();
        let mut parsed = Rows::new(WatchTarget {
            npu: 0,
            chip: Some(1),
        });
        let mut on_update = |u| got.push(u);
        // Split mid-line: the parser joins chunks.
        parsed.push(&out[..40], &mut on_update);
        parsed.push(&out[40..], &mut on_update);
        let rows = parsed.finish(&mut on_update);
        assert_eq!(rows, 3);
        assert_eq!(
            got,
            vec![
                WatchUpdate::Reading(Cube::Percent(20)),
                WatchUpdate::Reading(Cube::Na),
                WatchUpdate::Message("error: x".into()),
                WatchUpdate::Reading(Cube::Percent(3)),
            ]
        );
    }

    /// `/proc/<pid>/stat` after the command name: state, ppid, pgrp, ...; `None` once gone.
    fn stat_fields(pid: u32) -> Option<Vec<String>> {
        let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let (_, rest) = s.rsplit_once(')')?;
        Some(rest.split_whitespace().map(str::to_owned).collect())
    }

    /// Whether `pid` is gone or a zombie (dead, whoever has to reap it).
    fn dead(pid: u32) -> bool {
        stat_fields(pid).is_none_or(|f| f[0] == "Z")
    }

    fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !done() {
            assert!(Instant::now() < deadline, "not within 20 s: {what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills, by their process group, the stand-in's background helpers the watch left alive.
    struct Helpers(PathBuf);

    impl Drop for Helpers {
        fn drop(&mut self) {
            let pids = std::fs::read_to_string(&self.0).unwrap_or_default();
            for pid in pids.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
                let Some(f) = stat_fields(pid).filter(|f| f[0] != "Z") else {
                    continue;
                };
                // The helper is still in the group its watch child led.
                if let Some(pgrp) = f[2].parse().ok().and_then(rustix::process::Pid::from_raw) {
                    let _ =
                        rustix::process::kill_process_group(pgrp, rustix::process::Signal::KILL);
                }
            }
        }
    }

    // Issue 11 §3: a wrapper `npu-smi` whose background process kept the pipe open left the
    // killed child a zombie, never restarted, because supervision waited for the pipe's EOF.
    #[test]
    fn dead_watch_child_is_reaped_and_restarted_even_when_a_forked_grandchild_holds_the_pipe() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let helpers = d.path().join("helpers");
        let _cleanup = Helpers(helpers.clone());
        let npu_smi = d.path().join("npu-smi");
        std::fs::write(
            &npu_smi,
            format!(
                "#!/bin/sh\n\
                 sleep 1000 &\n\
                 echo $! >> '{}'\n\
                 echo 'NpuID(Idx)  ChipId(Idx)  AI Cube(%)'\n\
                 while :; do echo '0           0           42'; sleep 0.1; done\n",
                helpers.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&npu_smi, std::fs::Permissions::from_mode(0o755)).unwrap();
        let cfg = WatchConfig {
            npu_smi,
            delay_s: 1,
            backoff_initial: Duration::from_millis(50),
            backoff_max: Duration::from_secs(1),
        };
        let (w, rx) = watch_npu0(cfg);
        let reading = |u: &WatchUpdate| *u == WatchUpdate::Reading(Cube::Percent(42));
        wait_until("a first row", || rx.try_iter().any(|u| reading(&u)));
        let first = w.pid().expect("a child runs");
        let helper = || {
            std::fs::read_to_string(&helpers)
                .unwrap_or_default()
                .lines()
                .next()
                .and_then(|l| l.trim().parse::<u32>().ok())
        };
        let grandchild = helper().expect("the stand-in started its helper");
        assert!(!dead(grandchild), "the helper holds the pipe");

        rustix::process::kill_process(
            rustix::process::Pid::from_raw(first as i32).unwrap(),
            rustix::process::Signal::KILL,
        )
        .unwrap();
        wait_until("the killed child reaped", || stat_fields(first).is_none());
        wait_until("its helper killed with its group", || dead(grandchild));
        wait_until("a new child", || w.pid().is_some_and(|p| p != first));
        let mut exited = false;
        wait_until("rows again after the restart", || {
            rx.try_iter().any(|u| {
                exited |= matches!(u, WatchUpdate::Exited { .. });
                exited && reading(&u)
            })
        });
        w.stop();
    }
}

//! One long-lived `npu-smi info watch -s u -i <card> [-c <chip>]` child per device.
//!
//! The reference spawns a process per reading (at most 4 per 5 s window) and reads only the
//! first NPU. We keep one child per device that needs the fallback, read its pipe with our own
//! buffer ([`WatchParser`]), restart it with back-off when it dies, and kill and reap it on
//! shutdown. argv only, no shell. Each child leads its own process group and the whole group
//! is killed, so a wrapper script's children cannot keep the pipe (and our reader) alive.

use super::parse::{Cube, WatchEvent, WatchParser};
use crossbeam_channel::{Receiver, Sender};
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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
    pub fn args(&self, target: WatchTarget) -> Vec<String> {
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
    let pid = rustix::process::Pid::from_child(child);
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

    /// Kills the child, waits for the supervisor to reap it, and joins the thread.
    pub fn stop(mut self) {
        self.stop_inner();
    }

    /// Stops many watches at once: every child is killed first, then the supervisors are
    /// awaited against one 3 s deadline, so shutdown does not take 3 s per NPU when
    /// `npu-smi` is stuck in the driver.
    pub fn stop_all(watches: Vec<Watch>) {
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
            // Bounded: a pipe held open by a process outside the group must not hang shutdown.
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.done.recv_timeout(left) {
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                    tracing::warn!("npu-smi watch reader did not stop in time; leaving it behind");
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
                    slot.child = Some(child);
                    out
                })
        };
        let mut rows = 0u64;
        let mut status = None;
        match spawned {
            Err(e) => on_update(WatchUpdate::SpawnFailed(format!(
                "cannot run {}: {e}",
                cfg.npu_smi.display()
            ))),
            Ok(stdout) => {
                let started = Instant::now();
                if let Some(stdout) = stdout {
                    rows = pump(stdout, target, &mut on_update);
                }
                // EOF: the child exited or was killed; reap it.
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

/// Reads the pipe until EOF, reporting rows for `target`; returns the number of rows.
fn pump(
    mut stdout: impl Read,
    target: WatchTarget,
    on_update: &mut impl FnMut(WatchUpdate),
) -> u64 {
    let mut parser = WatchParser::new();
    let mut buf = [0u8; 4096];
    let mut rows = 0u64;
    let mut handle = |ev: WatchEvent| match ev {
        WatchEvent::Row(r)
            if r.npu == target.npu && (target.chip.is_none() || r.chip == target.chip) =>
        {
            rows += 1;
            on_update(WatchUpdate::Reading(r.cube));
        }
        WatchEvent::Row(_) => {}
        WatchEvent::RowWithoutCube => on_update(WatchUpdate::NoCubeColumn),
        WatchEvent::Text(t) => on_update(WatchUpdate::Message(t)),
        WatchEvent::Overlong => on_update(WatchUpdate::Message("overlong line dropped".to_owned())),
    };
    loop {
        match stdout.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => parser.push(&buf[..n], &mut handle),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    parser.finish(&mut handle);
    rows
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

    #[test]
    fn restarts_back_off_doubling_up_to_the_maximum() {
        let cfg = WatchConfig {
            npu_smi: "/nonexistent/npu-smi".into(),
            delay_s: 1,
            backoff_initial: Duration::from_millis(10),
            backoff_max: Duration::from_millis(40),
        };
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
    fn pump_reports_only_the_target_and_counts_rows() {
        let out = b"NpuID(Idx)  ChipId(Idx)  AI Cube(%)\n0 0 10\n0 1 20\n0 1 NA\nerror: x\n0 1 3";
        let mut got = Vec::new();
        let rows = pump(
            &out[..],
            WatchTarget {
                npu: 0,
                chip: Some(1),
            },
            &mut |u| got.push(u),
        );
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
}

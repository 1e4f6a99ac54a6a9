//! The agent's side of `Type=notify`: `READY=1` once everything is up, `STATUS=` whenever
//! the one-line summary changes, `RELOADING=1`/`READY=1` around a reload, `STOPPING=1` at
//! shutdown, and `WATCHDOG=1` at half of `WATCHDOG_USEC`, sent only while the sampler is
//! alive and ticking and the async runtime answers. A wedged sampler or runtime stops the
//! pings, so systemd restarts the agent.
//!
//! The pings come from a dedicated OS thread, not from the runtime: a ping sent by a task
//! would prove only that one worker runs. Without `NOTIFY_SOCKET` everything here is a no-op.

use super::notify::{self, Notifier, NotifyState};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Longest wait for the runtime to run a trivial task before a ping is withheld.
const RUNTIME_ANSWER: Duration = Duration::from_secs(2);
/// How often `STATUS=` is recomputed.
const STATUS_EVERY: Duration = Duration::from_secs(1);

/// What the supervision thread asks of the agent.
pub(crate) struct Probe {
    /// One-line summary for `STATUS=`.
    pub status: Box<dyn Fn() -> String + Send>,
    /// `Ok` while the sampler threads are alive and ticking.
    pub alive: Box<dyn Fn() -> Result<(), String> + Send>,
    /// The runtime that must answer for a ping to be sent.
    pub runtime: tokio::runtime::Handle,
}

/// The connection to systemd (inert without `NOTIFY_SOCKET`).
pub(crate) struct Systemd {
    notifier: Option<Arc<Notifier>>,
    watchdog: Option<Duration>,
    thread: Option<(JoinHandle<()>, Sender<()>)>,
}

impl Systemd {
    /// Reads `NOTIFY_SOCKET`, `WATCHDOG_USEC` and `WATCHDOG_PID`; a bad value is logged and
    /// that part disabled.
    pub(crate) fn from_env() -> Systemd {
        let notifier = match Notifier::from_env() {
            Ok(n) => n.map(Arc::new),
            Err(e) => {
                tracing::error!("{e}; not notifying systemd");
                None
            }
        };
        let watchdog = match notify::watchdog_timeout() {
            Ok(w) => w,
            Err(e) => {
                tracing::error!("{e}; no watchdog pings");
                None
            }
        };
        if notifier.is_none() && watchdog.is_some() {
            tracing::warn!("WATCHDOG_USEC is set without NOTIFY_SOCKET; no watchdog pings");
        }
        Systemd {
            notifier,
            watchdog,
            thread: None,
        }
    }

    fn send(&self, states: &[NotifyState<'_>]) {
        if let Some(n) = &self.notifier
            && let Err(e) = n.send(states)
        {
            tracing::warn!("cannot notify systemd ({states:?}): {e}");
        }
    }

    /// Everything is up: `READY=1` with the first status line, then supervision starts.
    pub(crate) fn ready(&mut self, probe: Probe) {
        let Some(n) = self.notifier.clone() else {
            return;
        };
        let first = (probe.status)();
        self.send(&[
            NotifyState::Ready,
            NotifyState::Status(&notify::status_text(&first)),
        ]);
        let (stop_tx, stop_rx) = crossbeam_channel::bounded(1);
        let watchdog = self.watchdog;
        if let Some(w) = watchdog {
            tracing::info!(
                "systemd watchdog: {w:?}; pinging every {:?} while the sampler is alive",
                w / 2
            );
        }
        match std::thread::Builder::new()
            .name("npu-systemd".to_owned())
            .spawn(move || supervise(&n, watchdog, &probe, first, &stop_rx))
        {
            Ok(h) => self.thread = Some((h, stop_tx)),
            Err(e) => tracing::error!("cannot start the systemd supervision thread: {e}"),
        }
    }

    /// Hands `sockets` to systemd's file-descriptor store, each named after its address
    /// (`continuity::sockets::fd_name`), so a restart or a crash does not close them: the
    /// next process gets them back in `LISTEN_FDS`. Needs `FileDescriptorStoreMax=` in the
    /// unit; without it systemd drops them and logs why. A no-op without systemd.
    pub(crate) fn store_sockets(&self, sockets: &[(String, std::os::fd::BorrowedFd<'_>)]) {
        let Some(n) = &self.notifier else { return };
        for (name, fd) in sockets {
            // `Custom`: the crate's FDSTORE variants come with its `fdstore` feature, which
            // would add a second fd-passing crate for what rustix already does here.
            let fdname = format!("FDNAME={name}");
            if let Err(e) = n.send_with_fds(
                &[
                    NotifyState::Custom("FDSTORE=1"),
                    NotifyState::Custom(&fdname),
                ],
                std::slice::from_ref(fd),
            ) {
                tracing::warn!("cannot store socket {name} with systemd: {e}");
            }
        }
    }

    /// Removes the sockets named `names` from systemd's file-descriptor store (listeners a
    /// reload closed).
    pub(crate) fn forget_sockets(&self, names: &[String]) {
        for name in names {
            let fdname = format!("FDNAME={name}");
            self.send(&[
                NotifyState::Custom("FDSTOREREMOVE=1"),
                NotifyState::Custom(&fdname),
            ]);
        }
    }

    /// A reload starts (`RELOADING=1` with `MONOTONIC_USEC=`, as `Type=notify-reload` wants).
    pub(crate) fn reloading(&self) {
        let status = NotifyState::Status("reloading the configuration");
        match NotifyState::monotonic_usec_now() {
            Ok(now) => self.send(&[NotifyState::Reloading, now, status]),
            Err(e) => {
                tracing::warn!("cannot read CLOCK_MONOTONIC for systemd's reload message: {e}");
                self.send(&[NotifyState::Reloading, status]);
            }
        }
    }

    /// The reload finished (applied or rejected): `READY=1` and a status line.
    pub(crate) fn reloaded(&self, status: &str) {
        self.send(&[
            NotifyState::Ready,
            NotifyState::Status(&notify::status_text(status)),
        ]);
    }

    /// Shutdown starts: `STOPPING=1`; supervision (and so the pings) ends.
    pub(crate) fn stopping(&mut self) {
        self.send(&[NotifyState::Stopping, NotifyState::Status("stopping")]);
        if let Some((h, stop)) = self.thread.take() {
            drop(stop);
            let _ = h.join();
        }
    }
}

impl Drop for Systemd {
    fn drop(&mut self) {
        if let Some((h, stop)) = self.thread.take() {
            drop(stop);
            let _ = h.join();
        }
    }
}

/// Whether the runtime runs a trivial task within `limit`.
fn runtime_answers(rt: &tokio::runtime::Handle, limit: Duration) -> bool {
    let (tx, rx) = crossbeam_channel::bounded(1);
    rt.spawn(async move {
        let _ = tx.send(());
    });
    rx.recv_timeout(limit).is_ok()
}

fn supervise(
    n: &Notifier,
    watchdog: Option<Duration>,
    probe: &Probe,
    mut last_status: String,
    stop: &Receiver<()>,
) {
    let ping_every = watchdog.map(|w| w / 2);
    let step = ping_every.map_or(STATUS_EVERY, |p| p.min(STATUS_EVERY));
    let mut next_ping = Instant::now();
    let mut withheld: Option<String> = None;
    loop {
        let mut status = (probe.status)();
        if let Some(every) = ping_every
            && Instant::now() >= next_ping
        {
            let verdict = (probe.alive)().and_then(|()| {
                if runtime_answers(&probe.runtime, RUNTIME_ANSWER.min(every / 2)) {
                    Ok(())
                } else {
                    Err("the async runtime does not answer".to_owned())
                }
            });
            match verdict {
                Ok(()) => {
                    if let Err(e) = n.send(&[NotifyState::Watchdog]) {
                        tracing::warn!("cannot ping the systemd watchdog: {e}");
                    }
                    if withheld.take().is_some() {
                        tracing::warn!("watchdog pings resume: the sampler is alive again");
                    }
                    next_ping = Instant::now() + every;
                }
                Err(why) => {
                    if withheld.as_deref() != Some(why.as_str()) {
                        tracing::error!(
                            "watchdog pings withheld: {why}; systemd restarts the agent when its watchdog expires"
                        );
                    }
                    status = format!("unhealthy, watchdog pings withheld: {why}");
                    withheld = Some(why);
                    // Look again soon: one slow answer must not cost a whole step.
                    next_ping = Instant::now() + (every / 8).min(step);
                }
            }
        }
        if status != last_status {
            if let Err(e) = n.send(&[NotifyState::Status(&notify::status_text(&status))]) {
                tracing::warn!("cannot send the status to systemd: {e}");
            }
            last_status = status;
        }
        let wait = match ping_every {
            Some(_) => step
                .min(next_ping.saturating_duration_since(Instant::now()))
                .max(Duration::from_millis(10)),
            None => step,
        };
        match stop.recv_timeout(wait) {
            Err(RecvTimeoutError::Timeout) => {}
            _ => return,
        }
    }
}

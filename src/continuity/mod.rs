//! The agent's own restarts must not read as the engine's death, nor make the agent forget
//! what it knew. Node Manager, the kubelet and the routers read an engine's health from the
//! agent's port: while no process answers there, a poll is refused and counts as `abnormal`.
//!
//! Two things survive a restart:
//! - **The listening sockets.** A socket outlives the process that holds it as long as
//!   another process holds it too; connections that arrive meanwhile wait in its backlog and
//!   are answered by the next process. Under systemd the agent stores its sockets in the
//!   service's file-descriptor store and takes them back from `LISTEN_FDS` ([`sockets`]);
//!   a second agent started beside a running one takes them over through a unix socket in
//!   the state directory ([`handover`]), the Kubernetes rolling update's path.
//! - **The state** ([`statefile`]): each engine's verdict inputs and levels, written on every
//!   change to `state.json` in the state directory (under `/run`), read back at start when
//!   it belongs to the same engine.
//!
//! The state directory is `[agent] state_dir`, else systemd's `RUNTIME_DIRECTORY` (the
//! unit's `RuntimeDirectory=`); without either, nothing survives a restart and the agent
//! says so at start. Only the agent's user may be able to change it ([`trust`]), and once
//! checked it is held open ([`StateDir::hold`]): the state goes to the directory checked,
//! whatever is put in its path's place later.

pub(crate) mod handover;
pub(crate) mod sockets;
pub(crate) mod statefile;
pub(crate) mod trust;

use std::path::{Path, PathBuf};

/// Where the state file and the handover socket live.
#[derive(Debug, Clone)]
pub struct StateDir {
    path: PathBuf,
    /// What named it: `[agent] state_dir`, `--state-dir` or `RUNTIME_DIRECTORY`.
    pub from: &'static str,
    /// The state file in the directory held open ([`StateDir::hold`]).
    held: Option<statefile::Place>,
}

/// Why the directory could not be held.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HoldError {
    #[error("cannot open the state directory {} ({from}): {source}", path.display())]
    Open {
        path: PathBuf,
        from: &'static str,
        source: std::io::Error,
    },
    /// What was opened is not what was checked: another user could change it.
    #[error(transparent)]
    Untrusted(#[from] trust::Untrusted),
}

/// The handover socket's file name.
const SOCKET_NAME: &str = crate::config::agent::HANDOVER_SOCKET;
/// The state file's name.
pub(crate) const STATE_NAME: &str = "state.json";

impl StateDir {
    /// The configured directory (`[agent] state_dir`), else systemd's `RUNTIME_DIRECTORY`
    /// (its first entry); `None`: nothing survives a restart.
    pub(crate) fn resolve(configured: Option<&Path>) -> Option<StateDir> {
        if let Some(p) = configured {
            return Some(StateDir {
                path: p.to_owned(),
                from: "[agent] state_dir",
                held: None,
            });
        }
        let env = std::env::var_os("RUNTIME_DIRECTORY")?;
        let first = std::env::split_paths(&env).next()?;
        (first.is_absolute()).then_some(StateDir {
            path: first,
            from: "RUNTIME_DIRECTORY",
            held: None,
        })
    }

    /// The directory.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    #[cfg(test)]
    /// The state file.
    pub(crate) fn state_file(&self) -> PathBuf {
        self.path.join(STATE_NAME)
    }

    /// The handover socket.
    pub(crate) fn handover_socket(&self) -> PathBuf {
        self.path.join(SOCKET_NAME)
    }

    /// Opens the directory, once [`StateDir::check`] passed, and holds it: the state file is
    /// read, written and cleaned up relative to it from now on ([`StateDir::state`]). What
    /// was opened is checked again (owned by the agent's user, writable by no one else), so
    /// a directory swapped in between is refused.
    pub(crate) fn hold(&mut self) -> Result<(), HoldError> {
        let open = |source| HoldError::Open {
            path: self.path.clone(),
            from: self.from,
            source,
        };
        let place = statefile::Place::open(&self.path, self.from, STATE_NAME).map_err(open)?;
        let (owner, mode) = place.owner_and_mode().map_err(open)?;
        trust::check_opened(&self.path, self.from, owner, mode, trust::User::me())?;
        self.held = Some(place);
        Ok(())
    }

    /// The state file in the directory held; `None` before [`StateDir::hold`].
    pub(crate) fn state(&self) -> Option<&statefile::Place> {
        self.held.as_ref()
    }

    /// Whether only the agent's user can change the directory and the path to it.
    pub(crate) fn check(&self) -> Result<trust::Checked, trust::Untrusted> {
        trust::check(&self.path, self.from)
    }

    /// [`StateDir::check`] for an agent running as `user`.
    pub(crate) fn check_as(&self, user: trust::User) -> Result<trust::Checked, trust::Untrusted> {
        trust::check_as(&self.path, self.from, user)
    }

    /// Creates the directory (mode 0700) if it is missing.
    pub(crate) fn create(&self) -> Result<(), String> {
        use std::os::unix::fs::DirBuilderExt;
        match std::fs::metadata(&self.path) {
            Ok(m) if m.is_dir() => Ok(()),
            Ok(_) => Err(format!(
                "{} ({}) is not a directory",
                self.path.display(),
                self.from
            )),
            Err(_) => std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&self.path)
                .map_err(|e| format!("cannot create {} ({}): {e}", self.path.display(), self.from)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_dir_must_be_absolute_and_short_enough_for_the_socket() {
        use crate::config::agent::check_state_dir;
        assert!(check_state_dir(Path::new("/run/npu-health-agent")).is_ok());
        let e = check_state_dir(Path::new("run/x")).unwrap_err();
        assert!(e.contains("absolute"), "{e}");
        let long = format!("/run/{}", "d".repeat(100));
        let e = check_state_dir(Path::new(&long)).unwrap_err();
        assert!(e.contains("107"), "{e}");
    }

    #[test]
    fn the_configured_dir_wins_over_systemds() {
        let d = StateDir::resolve(Some(Path::new("/tmp/x"))).unwrap();
        assert_eq!(d.from, "[agent] state_dir");
        assert_eq!(d.state_file(), Path::new("/tmp/x/state.json"));
        assert_eq!(d.handover_socket(), Path::new("/tmp/x/handover.sock"));
    }
}

//! Who holds a socket, as the kernel tells it under `/proc`: its socket tables (`net/tcp`,
//! `net/tcp6`, `net/unix`) give each listening socket's address, user and inode, and a
//! process's descriptors (`/proc/<pid>/fd`, links `socket:[inode]`) say which sockets it
//! holds. Two users: the stopped-process rule finds the engine's process by the socket its
//! connections reach ([`crate::probe::process`]), and `check-config` names whoever holds a
//! port it needs ([`crate::agent::preflight`]).
//!
//! The tables are the reader's network namespace (`/proc/net` is `/proc/self/net`): the one
//! the agent connects and binds in, so a socket found there is the one its probes reach or
//! its listeners would collide with. A process's own namespace is `/proc/<pid>/ns/net`.
//! Another user's descriptors are unreadable without `CAP_SYS_PTRACE`; the table still names
//! the socket's user.
//!
//! The root is overridable (`/proc` in production, a directory in tests). The field's
//! `procfs` crate reads these files too; this stays because it is four columns of two
//! tables, and the walk over descriptors has to stop at a budget and go on later
//! ([`Scan`]), which an iterator over one process's descriptors does not give.

mod scan;
pub(crate) mod table;

pub use scan::{Held, Progress, Scan, socket_inode};
pub(crate) use table::{Listening, UnixListening};

use std::path::PathBuf;

/// Where `/proc` is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcRoot(pub PathBuf);

impl Default for ProcRoot {
    fn default() -> Self {
        ProcRoot(PathBuf::from("/proc"))
    }
}

impl ProcRoot {
    /// `/proc/<pid>`.
    pub(crate) fn pid(&self, pid: u32) -> PathBuf {
        self.0.join(pid.to_string())
    }
}

/// Every listening TCP socket of the reader's network namespace (IPv4 and IPv6); rows that
/// are not one are skipped, and a table that cannot be read gives none.
pub(crate) fn tcp_listening(root: &ProcRoot) -> Vec<Listening> {
    ["net/tcp", "net/tcp6"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(root.0.join(f)).ok())
        .flat_map(|text| {
            text.lines()
                .filter_map(table::tcp_listening)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Every listening unix socket with a path, of the reader's network namespace.
pub(crate) fn unix_listening(root: &ProcRoot) -> Vec<UnixListening> {
    std::fs::read_to_string(root.0.join("net/unix"))
        .map(|t| t.lines().filter_map(table::unix_listening).collect())
        .unwrap_or_default()
}

/// The network namespace of process `pid` (`None`: the reader's own, `self`), as its
/// `ns/net` link names it (`net:[4026531840]`); `None` where it cannot be read.
pub(crate) fn netns(root: &ProcRoot, pid: Option<u32>) -> Option<PathBuf> {
    let dir = match pid {
        Some(p) => root.pid(p),
        None => root.0.join("self"),
    };
    std::fs::read_link(dir.join("ns/net")).ok()
}

/// A process, named as `ss -p` and `ps` name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Process {
    pub pid: u32,
    /// Its command name (`comm`, at most 15 bytes); empty if it could not be read.
    pub comm: String,
    /// Its effective user; `None` if it could not be read.
    pub uid: Option<u32>,
}

impl Process {
    /// Process `pid` under `root`.
    pub(crate) fn read(root: &ProcRoot, pid: u32) -> Process {
        let dir = root.pid(pid);
        let comm = std::fs::read_to_string(dir.join("comm"))
            .map(|c| c.trim_end_matches('\n').to_owned())
            .unwrap_or_default();
        let uid = std::fs::read_to_string(dir.join("status"))
            .ok()
            .and_then(|s| effective_uid(&s));
        Process { pid, comm, uid }
    }
}

impl std::fmt::Display for Process {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pid {}", self.pid)?;
        // The name is the process's own choice: shown escaped, so it cannot forge a line.
        let name = self.comm.escape_debug().to_string();
        match (name.is_empty(), self.uid) {
            (false, Some(u)) => write!(f, " ({name}, uid {u})"),
            (false, None) => write!(f, " ({name})"),
            (true, Some(u)) => write!(f, " (uid {u})"),
            (true, None) => Ok(()),
        }
    }
}

/// The effective uid of a `/proc/<pid>/status` text (`Uid: real effective saved fs`).
fn effective_uid(status: &str) -> Option<u32> {
    let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_is_named_by_pid_command_and_user() {
        let dir = tempfile::tempdir().unwrap();
        let root = ProcRoot(dir.path().to_owned());
        let p = root.pid(42);
        std::fs::create_dir_all(&p).unwrap();
        std::fs::write(p.join("comm"), "python3\n").unwrap();
        std::fs::write(
            p.join("status"),
            "Name:\tpython3\nUid:\t1000\t1001\t1001\t1001\nGid:\t0\t0\t0\t0\n",
        )
        .unwrap();
        assert_eq!(
            Process::read(&root, 42).to_string(),
            "pid 42 (python3, uid 1001)"
        );
        std::fs::write(p.join("comm"), "evil\nline\n").unwrap();
        assert_eq!(
            Process::read(&root, 42).to_string(),
            "pid 42 (evil\\nline, uid 1001)"
        );
        assert_eq!(Process::read(&root, 43).to_string(), "pid 43");
        assert_eq!(effective_uid("Uid:\tx\n"), None);
        assert_eq!(effective_uid(""), None);
    }

    // The real /proc: this test's own listener is in the reader's table, at its address,
    // and this process is found holding it.
    #[test]
    fn this_process_holds_its_own_listener() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let at = l.local_addr().unwrap();
        let root = ProcRoot::default();
        let rows = tcp_listening(&root);
        let row = rows
            .iter()
            .find(|r| r.local == at)
            .unwrap_or_else(|| panic!("{at} not among {rows:?}"));
        let scan = Scan::new(&root, std::collections::BTreeSet::from([row.inode]))
            .in_netns(netns(&root, None))
            .finish();
        let me = std::process::id();
        assert!(scan.found.iter().any(|h| h.pid == me), "{:?}", scan.found);
        assert_eq!(Process::read(&root, me).pid, me);
    }
}

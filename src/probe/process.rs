//! The engine's processes, seen from the host through `/proc`: the process that listens on
//! the engine's port and its descendants (vLLM's API server and its `EngineCore`), with the
//! state each is in. A stopped process (`T`, SIGSTOP; `t`, a debugger's stop) answers
//! nothing, which is evidence a wedged engine cannot fake and a healthy one never shows.
//!
//! How it can lie, and what is done about it:
//! - Another process may hold the port (a proxy in front of the engine): its state is the
//!   one read. The agent then sees a healthy proxy, never a false stop.
//! - The engine's processes may be out of sight: another PID namespace (a pod without
//!   `hostPID`), or another user's `/proc/<pid>/fd` without `CAP_SYS_PTRACE`. Then no
//!   process is found and the rule stays silent ([`Lookup::NotFound`] says why).
//! - A pid can be reused after the engine died: the listener is looked up again whenever
//!   the process it named is gone, and a stopped process counts only while it still holds
//!   the port's socket (checked each time a stop is seen).
//!
//! The root is overridable (`/proc` in production, a directory in tests).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Where `/proc` is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcRoot(pub PathBuf);

impl Default for ProcRoot {
    fn default() -> Self {
        ProcRoot(PathBuf::from("/proc"))
    }
}

/// The scheduler state of one process, from the third field of `/proc/<pid>/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcState {
    /// `R`, `S`, `D`, `I`, …: not stopped.
    Live(char),
    /// `T` (stopped by a signal) or `t` (stopped by a debugger).
    Stopped,
    /// `Z` or `X`: exited, not yet reaped.
    Dead,
}

impl ProcState {
    /// The state, the parent and the CPU time (`utime + stime`, in clock ticks) a
    /// `/proc/<pid>/stat` line names; `None` for a line that is not one.
    pub fn of_stat(line: &str) -> Option<(ProcState, u32, u64)> {
        // `pid (comm) S ppid …`: the command may hold spaces and parentheses, so the state
        // follows the last `)`. utime and stime are the 14th and 15th fields of the line,
        // the 12th and 13th after the state.
        let rest = &line[line.rfind(')')? + 1..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let state = fields.first()?.chars().next()?;
        let ppid = fields.get(1)?.parse().ok()?;
        let cpu = fields
            .get(11)
            .zip(fields.get(12))
            .and_then(|(u, s)| Some(u.parse::<u64>().ok()? + s.parse::<u64>().ok()?))
            .unwrap_or(0);
        let s = match state {
            'T' | 't' => ProcState::Stopped,
            'Z' | 'X' | 'x' => ProcState::Dead,
            c => ProcState::Live(c),
        };
        Some((s, ppid, cpu))
    }
}

/// What a look for the engine's processes found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// The process listening on the port, and the states of it and its descendants.
    Found {
        pid: u32,
        /// (pid, state, CPU ticks), the listener first.
        states: Vec<(u32, ProcState, u64)>,
    },
    /// No process in sight holds the port: why, in words.
    NotFound(String),
}

impl Lookup {
    /// The first stopped process among those found, with its CPU ticks (a process stopped
    /// all along has the same ticks at every sample).
    pub fn stopped(&self) -> Option<(u32, u64)> {
        match self {
            Lookup::Found { states, .. } => states
                .iter()
                .find(|(_, s, _)| *s == ProcState::Stopped)
                .map(|(p, _, t)| (*p, *t)),
            Lookup::NotFound(_) => None,
        }
    }
}

/// The inodes of the sockets listening on `port` (IPv4 and IPv6), from `net/tcp{,6}`.
pub fn listening_inodes(root: &ProcRoot, port: u16) -> BTreeSet<u64> {
    let mut out = BTreeSet::new();
    for file in ["net/tcp", "net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(root.0.join(file)) else {
            continue;
        };
        out.extend(text.lines().skip(1).filter_map(|l| listening_on(l, port)));
    }
    out
}

/// The inode of a `net/tcp` row that listens (state `0A`) on `port`.
fn listening_on(row: &str, port: u16) -> Option<u64> {
    let f: Vec<&str> = row.split_whitespace().collect();
    // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
    let local = f.get(1)?;
    let (_, hex_port) = local.rsplit_once(':')?;
    if u16::from_str_radix(hex_port, 16).ok()? != port || *f.get(3)? != "0A" {
        return None;
    }
    f.get(9)?.parse().ok()
}

/// Whether process `pid` holds one of `inodes` among its open files.
pub fn holds(root: &ProcRoot, pid: u32, inodes: &BTreeSet<u64>) -> bool {
    let Ok(fds) = std::fs::read_dir(root.0.join(pid.to_string()).join("fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path())
            .is_ok_and(|t| socket_inode(&t).is_some_and(|i| inodes.contains(&i)))
    })
}

/// The inode of a `socket:[N]` link target.
fn socket_inode(target: &Path) -> Option<u64> {
    let t = target.to_str()?;
    t.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
}

/// Every pid in `root`, with its state, parent and CPU ticks.
fn processes(root: &ProcRoot) -> Vec<(u32, ProcState, u32, u64)> {
    let Ok(dir) = std::fs::read_dir(&root.0) else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(root.0.join(pid.to_string()).join("stat")).ok()?;
            let (state, ppid, cpu) = ProcState::of_stat(&stat)?;
            Some((pid, state, ppid, cpu))
        })
        .collect()
}

/// `pid` and its descendants among `all` (pid, state, parent, CPU ticks), `pid` first.
pub fn tree(all: &[(u32, ProcState, u32, u64)], pid: u32) -> Vec<(u32, ProcState, u64)> {
    let Some(&(_, state, _, cpu)) = all.iter().find(|(p, ..)| *p == pid) else {
        return Vec::new();
    };
    let mut out = vec![(pid, state, cpu)];
    let mut i = 0;
    while i < out.len() {
        let parent = out[i].0;
        for &(p, s, pp, t) in all {
            // A pid seen already is not walked again (a malformed root cannot loop it).
            if pp == parent && out.iter().all(|(q, ..)| *q != p) {
                out.push((p, s, t));
            }
        }
        i += 1;
    }
    out
}

/// The states and CPU ticks of `pids` now; `None` when one of them is gone (look the tree
/// up again).
pub fn states_of(root: &ProcRoot, pids: &[u32]) -> Option<Vec<(u32, ProcState, u64)>> {
    pids.iter()
        .map(|&pid| {
            let stat = std::fs::read_to_string(root.0.join(pid.to_string()).join("stat")).ok()?;
            let (state, _, cpu) = ProcState::of_stat(&stat)?;
            (state != ProcState::Dead).then_some((pid, state, cpu))
        })
        .collect()
}

/// The engine's processes, watched. A sample reads only the known tree's `stat` files; every
/// [`Watch::RECHECK`] the listener is checked to still hold the socket it held (its own open
/// files) and its tree is read again from the kernel's `children` lists. The full look-up
/// (`net/tcp`, which the kernel builds by walking its whole socket table, and every process's
/// open files) runs only when no listener is known: at once when the known one is gone,
/// then backing off from 1 s to [`Watch::GIVE_UP_EVERY`] while none is found (an engine out
/// of sight costs little). Its cost is in BENCHMARKS.md (`cargo bench --bench process`).
#[derive(Debug, Default)]
pub struct Watch {
    root: ProcRoot,
    known: Option<Known>,
    /// No listener in sight: why, when to look again, and the back-off reached.
    missing: Option<(String, std::time::Instant, std::time::Duration)>,
}

/// The listener found, the sockets it held, its tree, and when they were checked.
#[derive(Debug)]
struct Known {
    pid: u32,
    inodes: BTreeSet<u64>,
    pids: Vec<u32>,
    at: std::time::Instant,
}

impl Watch {
    /// How long a found tree is trusted before it is checked again (a child started by the
    /// engine after the check is seen from then on).
    pub const RECHECK: std::time::Duration = std::time::Duration::from_secs(10);
    /// The longest wait between two full look-ups while no listener is in sight.
    pub const GIVE_UP_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

    /// Watches under `root`.
    pub fn new(root: ProcRoot) -> Watch {
        Watch {
            root,
            known: None,
            missing: None,
        }
    }

    /// One sample for the engine on `port`.
    pub fn sample(&mut self, port: u16) -> Lookup {
        let now = std::time::Instant::now();
        if let Some(k) = &mut self.known {
            let states = if now.duration_since(k.at) < Self::RECHECK {
                states_of(&self.root, &k.pids)
            } else if holds(&self.root, k.pid, &k.inodes) {
                k.at = now;
                tree_by_children(&self.root, k.pid)
            } else {
                None
            };
            if let Some(states) = states {
                k.pids = states.iter().map(|(p, ..)| *p).collect();
                return Lookup::Found { pid: k.pid, states };
            }
            // Gone, or no longer the listener: look for the new one at once.
            self.known = None;
            self.missing = None;
        }
        if let Some((why, next, _)) = &self.missing
            && now < *next
        {
            return Lookup::NotFound(why.clone());
        }
        match find(&self.root, port) {
            Ok((pid, inodes, states)) => {
                let pids = states.iter().map(|(p, ..)| *p).collect();
                self.known = Some(Known {
                    pid,
                    inodes,
                    pids,
                    at: now,
                });
                self.missing = None;
                Lookup::Found { pid, states }
            }
            Err(why) => {
                let wait = self
                    .missing
                    .as_ref()
                    .map_or(std::time::Duration::from_secs(1), |m| {
                        (m.2 * 2).min(Self::GIVE_UP_EVERY)
                    });
                self.missing = Some((why.clone(), now + wait, wait));
                Lookup::NotFound(why)
            }
        }
    }
}

/// `pid` and its descendants with their states, from each one's `task/*/children` (the
/// kernel's list, so no other process is read); `None` where the kernel has no such file
/// (`CONFIG_PROC_CHILDREN` off) or `pid` is gone.
fn tree_by_children(root: &ProcRoot, pid: u32) -> Option<Vec<(u32, ProcState, u64)>> {
    let mut pids = vec![pid];
    let mut i = 0;
    while i < pids.len() {
        let tasks = std::fs::read_dir(root.0.join(pids[i].to_string()).join("task")).ok()?;
        for t in tasks.flatten() {
            let children = std::fs::read_to_string(t.path().join("children")).ok()?;
            for c in children
                .split_whitespace()
                .filter_map(|c| c.parse::<u32>().ok())
            {
                if !pids.contains(&c) {
                    pids.push(c);
                }
            }
        }
        i += 1;
    }
    states_of(root, &pids)
}

/// Finds the engine's processes for `port` from scratch: the sockets listening on it, the
/// process holding one, and its tree; `Err` says why none is in sight.
type Found = (u32, BTreeSet<u64>, Vec<(u32, ProcState, u64)>);

fn find(root: &ProcRoot, port: u16) -> Result<Found, String> {
    let inodes = listening_inodes(root, port);
    if inodes.is_empty() {
        return Err(format!(
            "nothing listens on port {port} in this network namespace"
        ));
    }
    let all = processes(root);
    let pid = all
        .iter()
        .map(|(p, ..)| *p)
        .find(|p| holds(root, *p, &inodes))
        .ok_or_else(|| {
            format!(
                "no process in sight holds port {port}'s socket (another PID namespace, or another user's without CAP_SYS_PTRACE)"
            )
        })?;
    let states = tree_by_children(root, pid).unwrap_or_else(|| tree(&all, pid));
    Ok((pid, inodes, states))
}

/// Finds the engine's processes for `port` from scratch (what [`Watch`] does when it knows
/// no listener).
pub fn lookup(root: &ProcRoot, port: u16) -> Lookup {
    match find(root, port) {
        Ok((pid, _, states)) => Lookup::Found { pid, states },
        Err(why) => Lookup::NotFound(why),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_follows_the_last_parenthesis() {
        let line = "42 (python3) S 1 42 42 0 -1 4194304 100 0 0 0 700 50 0 0 20 0 1";
        assert_eq!(
            ProcState::of_stat(line),
            Some((ProcState::Live('S'), 1, 750))
        );
        assert_eq!(
            ProcState::of_stat("43 (VLLM::EngineCore) T 42 42 42 0 -1 0 0 0 0 0 9 1 0"),
            Some((ProcState::Stopped, 42, 10))
        );
        assert_eq!(
            ProcState::of_stat("44 (a) b) (c) t 42 1"),
            Some((ProcState::Stopped, 42, 0)),
            "a short line has no CPU figure"
        );
        assert_eq!(
            ProcState::of_stat("45 (x) Z 1"),
            Some((ProcState::Dead, 1, 0))
        );
        assert_eq!(ProcState::of_stat("garbage"), None);
        assert_eq!(ProcState::of_stat("46 (x) R notanumber"), None);
    }

    #[test]
    fn a_listening_row_names_its_inode() {
        let header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode";
        let listen = "   0: 0100007F:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 12345 1 0";
        let established = "   1: 0100007F:1F40 0100007F:D431 01 00000000:00000000 00:00000000 00000000  1000        0 12346 1 0";
        assert_eq!(listening_on(listen, 8000), Some(12345));
        assert_eq!(listening_on(listen, 8001), None);
        assert_eq!(listening_on(established, 8000), None, "not listening");
        assert_eq!(listening_on(header, 8000), None);
    }

    #[test]
    fn the_tree_is_the_listener_and_its_descendants() {
        let all = [
            (1, ProcState::Live('S'), 0, 1),
            (10, ProcState::Live('S'), 1, 2),
            (11, ProcState::Stopped, 10, 3),
            (12, ProcState::Live('R'), 11, 4),
            (20, ProcState::Stopped, 1, 5),
        ];
        let t = tree(&all, 10);
        assert_eq!(
            t,
            [
                (10, ProcState::Live('S'), 2),
                (11, ProcState::Stopped, 3),
                (12, ProcState::Live('R'), 4)
            ]
        );
        let found = Lookup::Found { pid: 10, states: t };
        assert_eq!(found.stopped(), Some((11, 3)), "a child stopped");
        assert_eq!(tree(&all, 99), Vec::new());
    }

    // A real process, seen through the real /proc: this test's own listener, found by its
    // port, and not stopped.
    #[test]
    fn this_process_is_found_by_its_listening_port() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let found = lookup(&ProcRoot::default(), port);
        let me = std::process::id();
        match &found {
            Lookup::Found { pid, states } => {
                assert_eq!(*pid, me);
                assert_eq!(states[0].0, me);
            }
            other => panic!("not found: {other:?}"),
        }
        assert_eq!(found.stopped(), None);
        let mut w = Watch::new(ProcRoot::default());
        assert!(matches!(w.sample(port), Lookup::Found { pid, .. } if pid == me));
        drop(l);
        assert!(matches!(
            lookup(&ProcRoot::default(), port),
            Lookup::NotFound(_)
        ));
    }

    // A real child stopped with SIGSTOP is seen stopped through the real /proc, and live
    // again after SIGCONT.
    #[test]
    fn a_stopped_child_is_seen_stopped() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        let state = |want: ProcState| {
            (0..100).any(|_| {
                let s = states_of(&ProcRoot::default(), &[pid]);
                if s.is_some_and(|s| s.len() == 1 && s[0].0 == pid && s[0].1 == want) {
                    return true;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
                false
            })
        };
        let signal = |sig: &str| {
            std::process::Command::new("kill")
                .args([sig, &pid.to_string()])
                .status()
                .unwrap()
        };
        assert!(state(ProcState::Live('S')), "sleeping at first");
        assert!(signal("-STOP").success());
        assert!(state(ProcState::Stopped), "stopped after SIGSTOP");
        assert!(signal("-CONT").success());
        assert!(state(ProcState::Live('S')), "live after SIGCONT");
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(states_of(&ProcRoot::default(), &[pid]), None, "gone");
    }
}

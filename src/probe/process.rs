//! The engine's processes, seen from the host through `/proc`: the process that holds the
//! listening socket the agent's connections to the engine reach, and its descendants
//! (vLLM's API server and its `EngineCore`), with the state each is in. A stopped process
//! (`T`, SIGSTOP; `t`, a debugger's stop) answers nothing, which is evidence a wedged engine
//! cannot fake and a healthy one never shows.
//!
//! Which socket is the engine's: the one the kernel hands a connection to the engine's
//! address and port to ([`crate::proc_sockets::table::reached`]): a listener on that address,
//! else on a wildcard (an engine on `0.0.0.0:P` is reached at `127.0.0.1:P`). A listener on
//! the same port at another address (`127.0.0.2:P`, `[::1]:P`) is someone else's, never
//! watched (issue 48, R1: a local user's process there was watched after the engine
//! restarted, and its stop read as the engine's).
//!
//! In which network namespace: the agent's own. The tables under `/proc/net` are the
//! reader's, the namespace the agent's probes connect in, so the socket found there is the
//! one whose holder answers them; processes of another namespace (`/proc/<pid>/ns/net`
//! differs) are not read. An engine that serves from another namespace (a pod on the pod
//! network, seen by an agent with the host's PID namespace) is then out of sight, and the
//! rule stays silent, saying so: its address may be in several namespaces (a loopback
//! address is in all), and a wrong guess would watch a stranger, where silence only leaves
//! the other rules to catch a stop.
//!
//! How it can lie, and what is done about it:
//! - Another process may hold the socket (a proxy in front of the engine): its state is the
//!   one read. The agent then sees a healthy proxy, never a false stop.
//! - The engine's processes may be out of sight: another PID namespace (a pod without
//!   `hostPID`), or another user's `/proc/<pid>/fd` without `CAP_SYS_PTRACE`. Then no
//!   process is found and the rule stays silent ([`Lookup::NotFound`] says why).
//! - A pid can be reused after the engine died, and a process can close the socket: the
//!   listener is looked up again whenever the process it named is gone or no longer holds
//!   the socket, and before a stopped process counts, the watch confirms that the listener
//!   still holds the socket the engine's address reaches and that the stopped process is
//!   still its own or a descendant (each time a new stop is seen).
//! - A process with very many descriptors: the look-up reads at most
//!   [`Watch::SCAN_BUDGET`] descriptors per sample and goes on at the next, and a known
//!   listener is checked again by its one descriptor, not by all of them.
//!
//! The root is overridable (`/proc` in production, a directory in tests).

use crate::proc_sockets::{Held, ProcRoot, Progress, Scan, table};
use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

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
    pub(crate) fn of_stat(line: &str) -> Option<(ProcState, u32, u64)> {
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

/// One process as sampled: (pid, state, CPU ticks).
pub(crate) type Sampled = (u32, ProcState, u64);

/// What a look for the engine's processes found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// The process holding the engine's listening socket, and the states of it and its
    /// descendants.
    Found {
        pid: u32,
        /// (pid, state, CPU ticks), the listener first.
        states: Vec<(u32, ProcState, u64)>,
    },
    /// No process in sight holds the engine's socket: why, in words.
    NotFound(String),
}

impl Lookup {
    /// The first stopped process among those found, with its CPU ticks (a process stopped
    /// all along has the same ticks at every sample).
    pub(crate) fn stopped(&self) -> Option<(u32, u64)> {
        match self {
            Lookup::Found { states, .. } => states
                .iter()
                .find(|(_, s, _)| *s == ProcState::Stopped)
                .map(|(p, _, t)| (*p, *t)),
            Lookup::NotFound(_) => None,
        }
    }
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
pub(crate) fn tree(all: &[(u32, ProcState, u32, u64)], pid: u32) -> Vec<(u32, ProcState, u64)> {
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
/// [`Watch::RECHECK`] the listener's descriptor is read again (one link: does it still hold
/// the socket?) and its tree is read again from the kernel's `children` lists. A stop seen
/// is confirmed against the socket table before it counts ([`Lookup::Found`] only then).
/// The look-up (`net/tcp`, which the kernel builds by walking its whole socket table, then
/// the processes' descriptors, [`Watch::SCAN_BUDGET`] of them per sample) runs only when no
/// listener is known: at once when the known one is gone, then backing off from 1 s to
/// [`Watch::GIVE_UP_EVERY`] while none is found (an engine out of sight costs little). Its
/// cost is in BENCHMARKS.md (`cargo bench --bench process`).
#[derive(Debug)]
pub struct Watch {
    root: ProcRoot,
    host: String,
    port: u16,
    phase: Phase,
    /// The most entries one sample's look-up reads ([`Watch::SCAN_BUDGET`]).
    budget: u64,
    /// Descriptors and processes read by look-ups so far (the budget's measure).
    pub read: u64,
}

/// Where a [`Watch`] is.
#[derive(Debug)]
enum Phase {
    /// Nothing looked at yet: look at once.
    Fresh,
    /// No listener in sight: why, when to look again, and the back-off reached.
    Waiting {
        why: String,
        next: Instant,
        backoff: Duration,
    },
    /// A look-up under way, over as many samples as its budget asks.
    Searching(Search),
    /// The listener found.
    Known(Known),
}

/// A look-up under way: the walk, the engine's addresses, what it looks for (in words).
#[derive(Debug)]
struct Search {
    scan: Scan,
    targets: Vec<SocketAddr>,
    sockets: String,
    backoff: Option<Duration>,
}

/// The listener found, the descriptor by which it holds the engine's socket, its tree, and
/// when they were checked; the stop confirmed last (pid, CPU ticks).
#[derive(Debug)]
struct Known {
    held: Held,
    targets: Vec<SocketAddr>,
    pids: Vec<u32>,
    at: Instant,
    confirmed: Option<(u32, u64)>,
}

impl Watch {
    /// How long a found tree is trusted before it is checked again (a child started by the
    /// engine after the check is seen from then on).
    pub const RECHECK: Duration = Duration::from_secs(10);
    /// The longest wait between two full look-ups while no listener is in sight.
    pub const GIVE_UP_EVERY: Duration = Duration::from_secs(60);
    /// The most entries (processes listed, descriptors read) one sample's look-up reads.
    pub const SCAN_BUDGET: u64 = 4096;

    /// Watches the engine at `host:port` under `root`.
    pub fn new(root: ProcRoot, host: &str, port: u16) -> Watch {
        Watch {
            root,
            host: host.to_owned(),
            port,
            phase: Phase::Fresh,
            budget: Self::SCAN_BUDGET,
            read: 0,
        }
    }

    #[cfg(test)]
    /// With another budget per sample than [`Watch::SCAN_BUDGET`].
    pub(crate) fn with_budget(mut self, budget: u64) -> Watch {
        self.budget = budget;
        self
    }

    /// One sample, now.
    pub fn sample(&mut self) -> Lookup {
        self.sample_at(Instant::now())
    }

    /// One sample at `now`.
    pub(crate) fn sample_at(&mut self, now: Instant) -> Lookup {
        let (found, next) = match std::mem::replace(&mut self.phase, Phase::Fresh) {
            Phase::Fresh => self.start(now, None),
            Phase::Known(k) => self.known(k, now),
            Phase::Waiting { why, next, backoff } if now < next => (
                Lookup::NotFound(why.clone()),
                Phase::Waiting { why, next, backoff },
            ),
            Phase::Waiting { backoff, .. } => self.start(now, Some(backoff)),
            Phase::Searching(s) => self.search(s, now),
        };
        self.phase = next;
        found
    }

    /// A sample of the known listener's tree; a look-up at once when it is gone, no longer
    /// holds the socket, or a stop seen does not hold up.
    fn known(&mut self, mut k: Known, now: Instant) -> (Lookup, Phase) {
        let states = if now.duration_since(k.at) < Self::RECHECK {
            states_of(&self.root, &k.pids)
        } else if self.still_holds(&k.held) {
            k.at = now;
            tree_by_children(&self.root, k.held.pid)
        } else {
            None
        };
        let Some(states) = states else {
            return self.start(now, None);
        };
        match self.checked(k, states) {
            Some(found) => found,
            None => self.start(now, None),
        }
    }

    /// The known listener's tree as found, once a stop in it is confirmed ([`Watch::confirm`],
    /// each new stop once); `None` when a stop does not hold up.
    fn checked(
        &mut self,
        mut k: Known,
        states: Vec<(u32, ProcState, u64)>,
    ) -> Option<(Lookup, Phase)> {
        k.pids = states.iter().map(|(p, ..)| *p).collect();
        let found = Lookup::Found {
            pid: k.held.pid,
            states,
        };
        match found.stopped() {
            None => k.confirmed = None,
            Some(s) if k.confirmed == Some(s) => {}
            Some(s) if self.confirm(&k, s.0) => k.confirmed = Some(s),
            Some(_) => return None,
        }
        Some((found, Phase::Known(k)))
    }

    /// Whether the descriptor that held the engine's socket still does (one link read).
    fn still_holds(&mut self, held: &Held) -> bool {
        self.read += 1;
        let fd = self.root.pid(held.pid).join("fd").join(held.fd.to_string());
        std::fs::read_link(fd)
            .ok()
            .and_then(|t| crate::proc_sockets::socket_inode(&t))
            == Some(held.inode)
    }

    /// Whether the stop of `stopped` counts against the engine: the listener still holds
    /// the socket, the kernel still hands the engine's connections to that socket, and
    /// `stopped` is the listener or one of its descendants.
    fn confirm(&mut self, k: &Known, stopped: u32) -> bool {
        if !self.still_holds(&k.held) {
            return false;
        }
        let rows = crate::proc_sockets::tcp_listening(&self.root);
        if !table::reached(&rows, &k.targets)
            .iter()
            .any(|r| r.inode == k.held.inode)
        {
            return false;
        }
        stopped == k.held.pid
            || tree_by_children(&self.root, k.held.pid)
                .unwrap_or_else(|| tree(&processes(&self.root), k.held.pid))
                .iter()
                .any(|(p, ..)| *p == stopped)
    }

    /// Starts a look-up: the engine's addresses, the sockets they reach, then the walk.
    fn start(&mut self, now: Instant, backoff: Option<Duration>) -> (Lookup, Phase) {
        match sought(&self.root, &self.host, self.port) {
            Ok((scan, targets, sockets)) => self.search(
                Search {
                    scan,
                    targets,
                    sockets,
                    backoff,
                },
                now,
            ),
            Err(why) => wait(why, now, backoff),
        }
    }

    /// One budget's worth of the look-up.
    fn search(&mut self, mut s: Search, now: Instant) -> (Lookup, Phase) {
        let before = s.scan.read;
        let progress = s.scan.step(self.budget);
        self.read += s.scan.read - before;
        if progress == Progress::More {
            let why = format!("looking for the process that holds {}", s.sockets);
            return (Lookup::NotFound(why), Phase::Searching(s));
        }
        match holder(&self.root, &s.scan) {
            Ok((held, states)) => {
                let k = Known {
                    held,
                    targets: s.targets,
                    pids: Vec::new(),
                    at: now,
                    confirmed: None,
                };
                // A stop in the tree counts only once confirmed, as at any sample; one
                // that does not hold up is looked for again at the next sample.
                self.checked(k, states).unwrap_or_else(|| {
                    let why = format!("{} changed while it was looked for", s.sockets);
                    (Lookup::NotFound(why), Phase::Fresh)
                })
            }
            Err(why) => wait(
                format!("no process in sight holds {}{why}", s.sockets),
                now,
                s.backoff,
            ),
        }
    }
}

/// No listener in sight: [`Lookup::NotFound`] with `why`, and the next look-up after a
/// back-off (1 s, doubling up to [`Watch::GIVE_UP_EVERY`]).
fn wait(why: String, now: Instant, backoff: Option<Duration>) -> (Lookup, Phase) {
    let wait = backoff.map_or(Duration::from_secs(1), |b| {
        (b * 2).min(Watch::GIVE_UP_EVERY)
    });
    (
        Lookup::NotFound(why.clone()),
        Phase::Waiting {
            why,
            next: now + wait,
            backoff: wait,
        },
    )
}

/// The addresses of `host:port` (an IP literal, else what the name resolves to).
fn targets(host: &str, port: u16) -> Result<Vec<SocketAddr>, String> {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = h.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    (h, port)
        .to_socket_addrs()
        .map(Iterator::collect)
        .map_err(|e| format!("cannot resolve {host}: {e}"))
}

/// What a look-up looks for: the walk for the sockets the engine's addresses reach (in this
/// network namespace's processes), the addresses, and the sockets in words; `Err` when there
/// are none.
fn sought(
    root: &ProcRoot,
    host: &str,
    port: u16,
) -> Result<(Scan, Vec<SocketAddr>, String), String> {
    let targets = targets(host, port)?;
    let rows = crate::proc_sockets::tcp_listening(root);
    let reached = table::reached(&rows, &targets);
    if reached.is_empty() {
        let at: Vec<String> = targets.iter().map(ToString::to_string).collect();
        return Err(format!(
            "nothing listens at {} in the agent's network namespace",
            at.join(" or ")
        ));
    }
    let mut at: Vec<String> = reached.iter().map(|r| r.local.to_string()).collect();
    at.dedup();
    let sockets = format!("the socket listening at {}", at.join(", "));
    let inodes: BTreeSet<u64> = reached.iter().map(|r| r.inode).collect();
    let scan = Scan::new(root, inodes)
        .first_only()
        .in_netns(crate::proc_sockets::netns(root, None));
    Ok((scan, targets, sockets))
}

/// The holder a finished walk found, and its tree; `Err` says why there is none (to follow
/// "no process in sight holds …").
fn holder(root: &ProcRoot, scan: &Scan) -> Result<(Held, Vec<Sampled>), String> {
    let Some(held) = scan.found.first() else {
        return Err(if scan.unreadable > 0 {
            format!(
                " ({} processes' descriptors unreadable: another user's, without CAP_SYS_PTRACE)",
                scan.unreadable
            )
        } else {
            " (another PID namespace?)".to_owned()
        });
    };
    let states =
        tree_by_children(root, held.pid).unwrap_or_else(|| tree(&processes(root), held.pid));
    if states.is_empty() {
        return Err(format!(" (pid {} held it, and is gone)", held.pid));
    }
    Ok((*held, states))
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

/// Finds the engine's processes for `host:port` from scratch, reading every descriptor at
/// once (what [`Watch`] does over several samples).
pub fn lookup(root: &ProcRoot, host: &str, port: u16) -> Lookup {
    let (scan, _, sockets) = match sought(root, host, port) {
        Ok(s) => s,
        Err(why) => return Lookup::NotFound(why),
    };
    match holder(root, &scan.finish()) {
        Ok((held, states)) => Lookup::Found {
            pid: held.pid,
            states,
        },
        Err(why) => Lookup::NotFound(format!("no process in sight holds {sockets}{why}")),
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
    // address and port, and not stopped.
    #[test]
    fn this_process_is_found_by_its_listening_socket() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let found = lookup(&ProcRoot::default(), "127.0.0.1", port);
        let me = std::process::id();
        match &found {
            Lookup::Found { pid, states } => {
                assert_eq!(*pid, me);
                assert_eq!(states[0].0, me);
            }
            other => panic!("not found: {other:?}"),
        }
        assert_eq!(found.stopped(), None);
        let mut w = Watch::new(ProcRoot::default(), "127.0.0.1", port);
        let sampled = settled(&mut w, Instant::now());
        assert!(
            matches!(sampled, Lookup::Found { pid, .. } if pid == me),
            "{sampled:?}"
        );
        assert!(matches!(
            lookup(&ProcRoot::default(), "127.0.0.2", port),
            Lookup::NotFound(_)
        ));
        drop(l);
        assert!(matches!(
            lookup(&ProcRoot::default(), "127.0.0.1", port),
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

    /// A `/proc`-like root: socket tables, and processes with their state and descriptors.
    struct FakeProc(tempfile::TempDir);

    impl FakeProc {
        fn new() -> FakeProc {
            let f = FakeProc(tempfile::tempdir().unwrap());
            std::fs::create_dir_all(f.0.path().join("net")).unwrap();
            f.listen(&[]);
            f
        }

        fn root(&self) -> ProcRoot {
            ProcRoot(self.0.path().to_owned())
        }

        /// The listening sockets now: `(address, inode)`.
        fn listen(&self, rows: &[(&str, u64)]) {
            let rows: Vec<(&str, u32, u64)> = rows.iter().map(|(a, i)| (*a, 1000, *i)).collect();
            let (v4, v6) = crate::proc_sockets::table::test_rows::tables(&rows);
            std::fs::write(self.0.path().join("net/tcp"), v4).unwrap();
            std::fs::write(self.0.path().join("net/tcp6"), v6).unwrap();
        }

        /// Process `pid` (a child of 1) in `state`, with `fds` descriptors of which the last
        /// is the socket `inode`.
        fn process(&self, pid: u32, state: char, fds: u32, inode: u64) {
            let dir = self.0.path().join(pid.to_string());
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(dir.join("fd")).unwrap();
            std::fs::create_dir_all(dir.join(format!("task/{pid}"))).unwrap();
            std::fs::write(dir.join(format!("task/{pid}/children")), "").unwrap();
            self.state(pid, state);
            for n in 0..fds {
                let t = if n + 1 == fds {
                    format!("socket:[{inode}]")
                } else {
                    format!("pipe:[{n}]")
                };
                std::os::unix::fs::symlink(t, dir.join("fd").join(n.to_string())).unwrap();
            }
        }

        fn state(&self, pid: u32, state: char) {
            let stat =
                format!("{pid} (p{pid}) {state} 1 {pid} {pid} 0 -1 0 0 0 0 0 5 5 0 0 20 0 1");
            std::fs::write(self.0.path().join(format!("{pid}/stat")), stat).unwrap();
        }
    }

    /// Listening sockets: (address, inode).
    type Listeners<'a> = &'a [(&'a str, u64)];

    /// Samples until the look-up is over (as many samples as its budget asks).
    fn settled(w: &mut Watch, now: Instant) -> Lookup {
        for _ in 0..10_000 {
            match w.sample_at(now) {
                Lookup::NotFound(why) if why.starts_with("looking") => {}
                other => return other,
            }
        }
        panic!("the look-up never ended");
    }

    // Issue 48, R1: a local user listening on 127.0.0.2:PORT or [::1]:PORT (PORT the
    // engine's) was watched, and its SIGSTOP read as the engine's. The watched process is the
    // one holding the socket the engine's address reaches, whatever else holds the port.
    #[test]
    fn the_engine_is_the_holder_of_its_address_not_of_its_port() {
        let rows: [(Listeners, &str, Option<u32>); 6] = [
            // (listeners, the engine's host, the process watched)
            (
                &[
                    ("127.0.0.2:8000", 1),
                    ("[::1]:8000", 2),
                    ("127.0.0.1:8000", 3),
                ],
                "127.0.0.1",
                Some(30),
            ),
            (
                &[
                    ("127.0.0.2:8000", 1),
                    ("[::1]:8000", 2),
                    ("0.0.0.0:8000", 3),
                ],
                "127.0.0.1",
                Some(30),
            ),
            (
                &[("127.0.0.2:8000", 1), ("[::1]:8000", 2)],
                "127.0.0.1",
                None,
            ),
            (&[("127.0.0.2:8000", 1), ("127.0.0.1:8000", 3)], "::1", None),
            (
                &[("127.0.0.2:8000", 1), ("[::1]:8000", 2), ("[::]:8000", 3)],
                "::1",
                Some(20),
            ),
            (
                &[("127.0.0.2:8001", 1), ("[::1]:8001", 2), ("[::]:8000", 3)],
                "[::1]",
                Some(30),
            ),
        ];
        for (listeners, host, want) in rows {
            let p = FakeProc::new();
            p.listen(listeners);
            // The impostors first (lower pids: read first, as /proc lists them), stopped.
            p.process(10, 'T', 3, 1);
            p.process(20, 'T', 3, 2);
            p.process(30, 'S', 3, 3);
            let mut w = Watch::new(p.root(), host, 8000);
            let got = settled(&mut w, Instant::now());
            let pid = match &got {
                Lookup::Found { pid, .. } => Some(*pid),
                Lookup::NotFound(_) => None,
            };
            assert_eq!(pid, want, "{listeners:?} {host}: {got:?}");
            assert_eq!(lookup(&p.root(), host, 8000), got, "{listeners:?} {host}");
        }
    }

    // Issue 48, R1 (low): "the code never checks, for up to 10 s, that a stopped process still
    // holds the socket". A stop counts only once the listener is confirmed to still hold the
    // socket the engine's address reaches.
    #[test]
    fn a_stop_counts_only_while_the_stopped_process_still_holds_the_engines_socket() {
        let p = FakeProc::new();
        p.listen(&[("127.0.0.1:8000", 3)]);
        p.process(30, 'S', 3, 3);
        let mut w = Watch::new(p.root(), "127.0.0.1", 8000);
        let t0 = Instant::now();
        assert!(matches!(settled(&mut w, t0), Lookup::Found { pid: 30, .. }));
        // It closed the socket (the descriptor now names another) and stopped, within
        // RECHECK of the last check: not the engine's stop.
        p.process(30, 'T', 3, 77);
        let got = w.sample_at(t0 + Duration::from_millis(500));
        assert_eq!(got.stopped(), None, "{got:?}");
        // Still holding it, but the engine's address no longer reaches it (another socket
        // listens at the exact address now): not the engine's stop either.
        p.process(30, 'S', 3, 3);
        p.listen(&[("0.0.0.0:8000", 3)]);
        let mut w = Watch::new(p.root(), "127.0.0.1", 8000);
        assert!(matches!(settled(&mut w, t0), Lookup::Found { pid: 30, .. }));
        p.listen(&[("0.0.0.0:8000", 3), ("127.0.0.1:8000", 4)]);
        p.state(30, 'T');
        let got = w.sample_at(t0 + Duration::from_millis(500));
        assert_eq!(got.stopped(), None, "{got:?}");
        // Holding the engine's socket, stopped: it counts, and stays counted without the
        // table being read again.
        p.listen(&[("127.0.0.1:8000", 3)]);
        let mut w = Watch::new(p.root(), "127.0.0.1", 8000);
        p.state(30, 'S');
        assert!(matches!(settled(&mut w, t0), Lookup::Found { pid: 30, .. }));
        p.state(30, 'T');
        let got = w.sample_at(t0 + Duration::from_millis(500));
        assert_eq!(got.stopped(), Some((30, 10)), "{got:?}");
        std::fs::remove_file(p.0.path().join("net/tcp")).unwrap();
        let got = w.sample_at(t0 + Duration::from_secs(1));
        assert_eq!(got.stopped(), Some((30, 10)), "{got:?}");
    }

    // Issue 48, R1 (low): once a process with a million descriptors was watched, each check
    // read them all (47 % of a core). The look-up reads at most SCAN_BUDGET entries per
    // sample, and the known listener is checked again by its one descriptor.
    #[test]
    fn the_proc_scan_reads_at_most_its_budget_per_sample() {
        let p = FakeProc::new();
        p.listen(&[("127.0.0.1:8000", 3)]);
        // A small budget, so that the root holds few files (each costs the disk).
        let budget = 64;
        let fds = 2 * budget as u32;
        // Nobody holds the engine's socket: every descriptor is read, a budget per sample.
        p.process(10, 'S', fds, 1);
        p.process(20, 'S', fds, 2);
        let mut w = Watch::new(p.root(), "127.0.0.1", 8000).with_budget(budget);
        let t0 = Instant::now();
        let budgeted = |w: &mut Watch, at: Instant| {
            let mut samples = 0;
            loop {
                let before = w.read;
                let got = w.sample_at(at);
                assert!(
                    w.read - before <= budget,
                    "sample {samples} read {} entries",
                    w.read - before
                );
                samples += 1;
                if !matches!(&got, Lookup::NotFound(why) if why.starts_with("looking")) {
                    return (got, samples);
                }
            }
        };
        let (got, samples) = budgeted(&mut w, t0);
        assert!(
            matches!(&got, Lookup::NotFound(why) if why.starts_with("no process in sight")),
            "{got:?}"
        );
        assert!(w.read >= 2 * u64::from(fds), "{} entries", w.read);
        assert!(samples as u64 >= w.read / budget, "{samples} samples");
        // The engine comes, with as many descriptors: found within the budget too.
        p.process(30, 'S', fds, 3);
        let (got, _) = budgeted(&mut w, t0 + Duration::from_secs(2));
        assert!(matches!(got, Lookup::Found { pid: 30, .. }), "{got:?}");
        // The re-check after RECHECK: one descriptor, not all of them.
        let before = w.read;
        let got = w.sample_at(t0 + Duration::from_secs(2) + Watch::RECHECK);
        assert!(matches!(got, Lookup::Found { pid: 30, .. }), "{got:?}");
        assert_eq!(w.read - before, 1);
    }
}

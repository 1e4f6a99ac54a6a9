//! Who holds a port the configuration needs, in words: `check-config`'s answer to "address
//! already in use", so that it passes only what `run` would start with. The kernel's tables
//! say which listening sockets are in the way ([`crate::proc_sockets`]); the processes'
//! descriptors say who holds each. A running agent is a process holding a unix socket named
//! `handover.sock`: its directory is that agent's state directory. Found without connecting
//! to it, so a check leaves nothing in the running agent's log.
//!
//! - A socket the running agent of this configuration's state directory holds, at the very
//!   address configured, is handed over to a new agent: a note. Whoever else holds it too
//!   (systemd's file-descriptor store, pid 1) does not change that.
//! - Held by a running agent of another state directory (or of none configured here): an
//!   error naming it and the `state_dir` that would let a new agent take its sockets over.
//! - Held by any other process: an error naming it (pid, command, user).
//! - Held by a process this user cannot see (another user's `/proc/<pid>/fd`): an error
//!   naming the socket's user, and how to see more.

use crate::proc_sockets::table::conflicts;
use crate::proc_sockets::{self, Listening, ProcRoot, Process, Scan};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// What the kernel shows of the sockets in the way of some addresses.
#[derive(Debug, Default)]
pub(super) struct Seen {
    /// Every listening TCP socket of this network namespace.
    pub listening: Vec<Listening>,
    /// The processes holding each socket in the way, by inode.
    pub holders: BTreeMap<u64, Vec<Process>>,
    /// Running agents: the pid holding a handover socket, and its state directory.
    pub agents: Vec<(u32, PathBuf)>,
    /// Processes whose descriptors this user could not read.
    pub unreadable: usize,
    /// This user.
    pub me: u32,
}

impl Seen {
    /// Reads the tables under `root`, then every process's descriptors once, for the sockets
    /// in the way of `addrs` and the running agents' handover sockets.
    pub(super) fn read(root: &ProcRoot, addrs: &[SocketAddr]) -> Seen {
        let listening = proc_sockets::tcp_listening(root);
        let handover: Vec<_> = proc_sockets::unix_listening(root)
            .into_iter()
            .filter(|u| {
                u.path.file_name()
                    == Some(std::ffi::OsStr::new(crate::config::agent::HANDOVER_SOCKET))
            })
            .collect();
        let wanted = listening
            .iter()
            .filter(|l| addrs.iter().any(|a| conflicts(l.local, *a)))
            .map(|l| l.inode)
            .chain(handover.iter().map(|u| u.inode))
            .collect();
        let scan = Scan::new(root, wanted).finish();
        let mut holders: BTreeMap<u64, Vec<Process>> = BTreeMap::new();
        for h in &scan.found {
            let list = holders.entry(h.inode).or_default();
            if list.iter().all(|p| p.pid != h.pid) {
                list.push(Process::read(root, h.pid));
            }
        }
        let agents = handover
            .iter()
            .flat_map(|u| {
                let dir = u.path.parent().map(Path::to_owned).unwrap_or_default();
                holders
                    .get(&u.inode)
                    .into_iter()
                    .flatten()
                    .map(move |p| (p.pid, dir.clone()))
            })
            .collect();
        Seen {
            listening,
            holders,
            agents,
            unreadable: scan.unreadable,
            me: rustix::process::geteuid().as_raw(),
        }
    }
}

/// Whether two state directories are the same (as written, or once links are resolved).
fn same_dir(a: &Path, b: &Path) -> bool {
    a == b
        || matches!(
            (std::fs::canonicalize(a), std::fs::canonicalize(b)),
            (Ok(x), Ok(y)) if x == y
        )
}

/// What keeps `addr` (for `what`) from being bound, as [`Seen`] shows it, with this
/// configuration's state directory (`state_dir`: the directory and what named it): `Ok`
/// with a note when it is all the running agent's of that directory, at that address (a new
/// agent takes it over); else `Err` with who holds it, and the fix where there is one.
pub(super) fn in_use(
    addr: SocketAddr,
    what: &str,
    seen: &Seen,
    state_dir: Option<(&Path, &str)>,
) -> Result<String, String> {
    let ours: Vec<u32> = seen
        .agents
        .iter()
        .filter(|(_, d)| state_dir.is_some_and(|(s, _)| same_dir(d, s)))
        .map(|(p, _)| *p)
        .collect();
    let mut handed = Vec::new();
    // (rank, words): the most telling first.
    let mut problems: Vec<(u8, String)> = Vec::new();
    for r in seen.listening.iter().filter(|r| conflicts(r.local, addr)) {
        let holders = seen.holders.get(&r.inode).map_or(&[][..], Vec::as_slice);
        let agent_of = |pid: u32| seen.agents.iter().find(|(p, _)| *p == pid);
        if let Some(p) = holders.iter().find(|p| ours.contains(&p.pid)) {
            if r.local == addr {
                handed.push(p.pid);
            } else {
                problems.push((2, format!(
                    "the running agent, {p}, listens on {}, not on {addr}: a new agent takes over a socket only at the same address; keep {} until that agent stops",
                    r.local, r.local
                )));
            }
        } else if let Some((p, dir)) = holders
            .iter()
            .find_map(|p| agent_of(p.pid).map(|a| (p, &a.1)))
        {
            let here = match state_dir {
                Some((d, from)) => format!("this configuration's is {} ({from})", d.display()),
                None => "this configuration has none".to_owned(),
            };
            problems.push((1, format!(
                "the running agent, {p}, holds it (listening on {}); its state directory is {}, and {here}: set `[agent] state_dir = \"{}\"`, so that a new agent takes its sockets over",
                r.local,
                dir.display(),
                dir.display()
            )));
        } else if !holders.is_empty() {
            let who: Vec<String> = holders.iter().map(ToString::to_string).collect();
            problems.push((0, format!("{} listens on {}", who.join(" and "), r.local)));
        } else if seen.unreadable > 0 {
            problems.push((3, format!(
                "a socket of uid {} listens on {}, and this user (uid {}) cannot see which process holds it (another user's /proc/<pid>/fd): run check-config as root, or `sudo ss -ltnp 'sport = :{}'`",
                r.uid, r.local, seen.me, addr.port()
            )));
        } else {
            problems.push((3, format!(
                "a socket of uid {} listens on {}, held by no process in sight (another PID namespace?); `ss -ltnp 'sport = :{}'` may name it",
                r.uid, r.local, addr.port()
            )));
        }
    }
    problems.sort_by_key(|(rank, _)| *rank);
    match (problems.first(), handed.first()) {
        (Some((_, words)), _) => Err(words.clone()),
        (None, Some(pid)) => Ok(format!(
            "{what} {addr} is in use by the running agent, which hands it over to a new one (pid {pid})"
        )),
        (None, None) => Err(format!(
            "no listening socket of this network namespace is in the way: a socket bound without listening holds the port; `ss -tanp 'sport = :{}'` names it",
            addr.port()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    /// A state directory and what named it.
    type Dir<'a> = Option<(&'a Path, &'a str)>;
    /// A note (passes) or an error, each by a part of its words.
    type Want = Result<&'static str, &'static str>;

    fn process(pid: u32, comm: &str, uid: u32) -> Process {
        Process {
            pid,
            comm: comm.to_owned(),
            uid: Some(uid),
        }
    }

    /// A host: the agent (pid 700, state directory /run/npu-health-agent) on 0.0.0.0:9001
    /// (systemd's store holds it too) and 127.0.0.1:9400; the fake engine (pid 800) on
    /// 127.0.0.1:33701; another user's socket (uid 1001) on 127.0.0.1:5000, out of sight.
    fn host() -> Seen {
        let l = |a: &str, uid, inode| Listening {
            local: addr(a),
            uid,
            inode,
        };
        let agent = process(700, "npu-health-agen", 998);
        Seen {
            listening: vec![
                l("0.0.0.0:9001", 998, 1),
                l("127.0.0.1:9400", 998, 2),
                l("127.0.0.1:33701", 0, 3),
                l("127.0.0.1:5000", 1001, 4),
            ],
            holders: BTreeMap::from([
                (1, vec![process(1, "systemd", 0), agent.clone()]),
                (2, vec![agent.clone()]),
                (3, vec![process(800, "fake-engine", 0)]),
                (9, vec![agent]),
            ]),
            agents: vec![(700, PathBuf::from("/run/npu-health-agent"))],
            unreadable: 2,
            me: 1000,
        }
    }

    // Issue 48: check-config blamed every "address in use" on the running agent once its
    // handover socket answered, and passed a port that another process held.
    #[test]
    fn a_port_in_use_passes_only_as_the_running_agents_own() {
        let seen = host();
        let ours = Some((Path::new("/run/npu-health-agent"), "[agent] state_dir"));
        let other = Some((Path::new("/run/elsewhere"), "[agent] state_dir"));
        let rows: [(&str, Dir, Want); 9] = [
            // The agent's own, at the same address (systemd holds it too): handed over.
            (
                "0.0.0.0:9001",
                ours,
                Ok("in use by the running agent, which hands it over to a new one (pid 700)"),
            ),
            (
                "127.0.0.1:9400",
                ours,
                Ok("in use by the running agent, which hands it over to a new one (pid 700)"),
            ),
            // The agent's, but at a wildcard's address: not taken over by a new agent.
            (
                "127.0.0.1:9001",
                ours,
                Err(
                    "the running agent, pid 700 (npu-health-agen, uid 998), listens on 0.0.0.0:9001, not on 127.0.0.1:9001",
                ),
            ),
            // Another process's, agent running or not.
            (
                "127.0.0.1:33701",
                ours,
                Err("pid 800 (fake-engine, uid 0) listens on 127.0.0.1:33701"),
            ),
            (
                "127.0.0.1:33701",
                None,
                Err("pid 800 (fake-engine, uid 0) listens on 127.0.0.1:33701"),
            ),
            (
                "0.0.0.0:33701",
                ours,
                Err("pid 800 (fake-engine, uid 0) listens on 127.0.0.1:33701"),
            ),
            // Beside a live agent without its state directory: the agent and the fix.
            (
                "0.0.0.0:9001",
                None,
                Err(
                    "the running agent, pid 700 (npu-health-agen, uid 998), holds it (listening on 0.0.0.0:9001); its state directory is /run/npu-health-agent, and this configuration has none: set `[agent] state_dir = \"/run/npu-health-agent\"`",
                ),
            ),
            (
                "0.0.0.0:9001",
                other,
                Err(
                    "its state directory is /run/npu-health-agent, and this configuration's is /run/elsewhere ([agent] state_dir): set `[agent] state_dir = \"/run/npu-health-agent\"`",
                ),
            ),
            // Out of sight: the socket's user, and how to see more.
            (
                "127.0.0.1:5000",
                ours,
                Err(
                    "a socket of uid 1001 listens on 127.0.0.1:5000, and this user (uid 1000) cannot see which process holds it (another user's /proc/<pid>/fd): run check-config as root, or `sudo ss -ltnp 'sport = :5000'`",
                ),
            ),
        ];
        for (a, dir, want) in rows {
            let got = in_use(addr(a), "engine e's /status", &seen, dir);
            match (&got, want) {
                (Ok(g), Ok(w)) | (Err(g), Err(w)) if g.contains(w) => {}
                _ => panic!("{a} with {dir:?}: {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn a_port_nobody_listens_on_names_what_else_holds_it() {
        let mut seen = host();
        let got = in_use(addr("127.0.0.1:6000"), "x", &seen, None).unwrap_err();
        assert!(got.contains("bound without listening"), "{got}");
        seen.unreadable = 0;
        seen.me = 0;
        let got = in_use(addr("127.0.0.1:5000"), "x", &seen, None).unwrap_err();
        assert!(got.contains("no process in sight"), "{got}");
    }

    // The real kernel: this test's listener is named with this process as its holder, and
    // nothing is connected to find it.
    #[test]
    fn the_holder_of_a_real_listener_is_named() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let at = l.local_addr().unwrap();
        let seen = Seen::read(&ProcRoot::default(), &[at]);
        let got = in_use(at, "x", &seen, None).unwrap_err();
        let me = format!("pid {} (", std::process::id());
        assert!(got.starts_with(&me), "{got}");
        assert!(got.ends_with(&format!("listens on {at}")), "{got}");
    }
}

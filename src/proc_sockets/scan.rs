//! Which processes hold a socket: a walk over `/proc/<pid>/fd` that reads each descriptor's
//! link (`socket:[inode]`) and stops when its budget of entries is spent, to go on where it
//! stopped at the next step. A process with a million descriptors then costs the agent a
//! bounded share of a core per period for longer, never a million reads in one period.

use super::ProcRoot;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// One descriptor that names a wanted socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    pub pid: u32,
    /// The descriptor's number (`/proc/<pid>/fd/<fd>`): checking it again costs one read.
    pub fd: u32,
    pub inode: u64,
}

/// Whether a [`Scan`] has more to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// Its budget ran out first: step it again.
    More,
    /// Every process was read (or, with [`Scan::first_only`], a holder was found).
    Done,
}

/// A walk over every process's descriptors for the sockets of `wanted`, in steps.
#[derive(Debug)]
pub struct Scan {
    root: ProcRoot,
    wanted: BTreeSet<u64>,
    /// The processes not yet read (`None` before the first step lists them).
    procs: Option<std::fs::ReadDir>,
    /// The process being read, and where its descriptors are.
    current: Option<(u32, std::fs::ReadDir)>,
    /// Only processes in this network namespace (the link `ns/net` names), when set.
    netns: Option<PathBuf>,
    first_only: bool,
    done: bool,
    /// What was found, in the order read.
    pub found: Vec<Held>,
    /// Processes whose descriptors could not be read (another user's without
    /// `CAP_SYS_PTRACE`).
    pub unreadable: usize,
    /// Entries read so far: one per process listed (with its namespace link), one per
    /// descriptor.
    pub read: u64,
}

impl Scan {
    /// A walk under `root` for `wanted`; nothing is read before [`Scan::step`].
    pub fn new(root: &ProcRoot, wanted: BTreeSet<u64>) -> Scan {
        Scan {
            root: root.clone(),
            wanted,
            procs: None,
            current: None,
            netns: None,
            first_only: false,
            done: false,
            found: Vec::new(),
            unreadable: 0,
            read: 0,
        }
    }

    /// Stops at the first holder found.
    pub(crate) fn first_only(mut self) -> Scan {
        self.first_only = true;
        self
    }

    /// Reads only the processes whose network namespace is `ns` (as [`super::netns`] names
    /// it); `None`: every process.
    pub(crate) fn in_netns(mut self, ns: Option<PathBuf>) -> Scan {
        self.netns = ns;
        self
    }

    /// Reads at most `budget` entries more.
    pub fn step(&mut self, budget: u64) -> Progress {
        let mut spent = 0;
        while !self.done {
            if spent >= budget {
                return Progress::More;
            }
            spent += 1;
            self.read += 1;
            if let Some((pid, fds)) = &mut self.current {
                match fds.next() {
                    Some(Ok(entry)) => {
                        let pid = *pid;
                        self.look_at(pid, &entry.path());
                    }
                    // Gone meanwhile, or the end of its descriptors.
                    Some(Err(_)) | None => self.current = None,
                }
            } else {
                self.next_process();
            }
        }
        Progress::Done
    }

    /// Reads every entry left, however many.
    pub(crate) fn finish(mut self) -> Scan {
        self.step(u64::MAX);
        self
    }

    /// One descriptor of `pid`.
    fn look_at(&mut self, pid: u32, fd: &Path) {
        let Some(inode) = std::fs::read_link(fd)
            .ok()
            .as_deref()
            .and_then(socket_inode)
        else {
            return;
        };
        if !self.wanted.contains(&inode) {
            return;
        }
        let Some(n) = fd.file_name().and_then(|n| n.to_str()?.parse().ok()) else {
            return;
        };
        self.found.push(Held { pid, fd: n, inode });
        if self.first_only {
            self.done = true;
        }
    }

    /// Lists the next process and opens its descriptors (`/proc` lists them by pid, so an
    /// ancestor, which usually made the socket its children inherit, comes first).
    fn next_process(&mut self) {
        if self.procs.is_none() {
            match std::fs::read_dir(&self.root.0) {
                Ok(d) => self.procs = Some(d),
                Err(_) => {
                    self.done = true;
                    return;
                }
            }
        }
        let Some(procs) = self.procs.as_mut() else {
            return;
        };
        let pid = match procs.next() {
            None => {
                self.done = true;
                return;
            }
            Some(e) => e
                .ok()
                .and_then(|e| e.file_name().to_str()?.parse::<u32>().ok()),
        };
        let Some(pid) = pid else { return };
        let denied = |e: &std::io::Error| e.kind() == std::io::ErrorKind::PermissionDenied;
        if let Some(want) = &self.netns {
            match std::fs::read_link(self.root.pid(pid).join("ns/net")) {
                Ok(ns) if ns == *want => {}
                Err(e) if denied(&e) => {
                    self.unreadable += 1;
                    return;
                }
                _ => return,
            }
        }
        match std::fs::read_dir(self.root.pid(pid).join("fd")) {
            Ok(fds) => self.current = Some((pid, fds)),
            Err(e) if denied(&e) => self.unreadable += 1,
            Err(_) => {}
        }
    }
}

/// The inode a `socket:[N]` link target names.
pub fn socket_inode(target: &Path) -> Option<u64> {
    let t = target.to_str()?;
    t.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A `/proc`-like root: each process `(pid, descriptors, the inode of its last)`, every
    /// other descriptor a socket nobody wants.
    fn root_with(procs: &[(u32, u32, u64)]) -> (tempfile::TempDir, ProcRoot) {
        let dir = tempfile::tempdir().unwrap();
        for &(pid, fds, inode) in procs {
            let fd = dir.path().join(pid.to_string()).join("fd");
            std::fs::create_dir_all(&fd).unwrap();
            for n in 0..fds {
                let target = if n + 1 == fds {
                    format!("socket:[{inode}]")
                } else {
                    format!("socket:[{}]", 1_000_000 + u64::from(n))
                };
                symlink(target, fd.join(n.to_string())).unwrap();
            }
        }
        // Entries that are not processes, as /proc has (`self`, `net`, …).
        std::fs::create_dir_all(dir.path().join("net")).unwrap();
        std::fs::write(dir.path().join("uptime"), "1 1\n").unwrap();
        let root = ProcRoot(dir.path().to_owned());
        (dir, root)
    }

    // Issue 48 (R1, low): a watched process with a million descriptors cost 47 % of a core,
    // every descriptor read in one go. A step reads at most its budget, and the next step
    // goes on where it stopped, until the holder is found.
    #[test]
    fn a_step_reads_at_most_its_budget_and_the_next_goes_on() {
        let (_dir, root) = root_with(&[(10, 300, 7), (20, 150, 8), (30, 4, 99)]);
        let mut scan = Scan::new(&root, BTreeSet::from([99]));
        let budget = 32;
        let mut steps = 0;
        loop {
            let before = scan.read;
            let p = scan.step(budget);
            assert!(
                scan.read - before <= budget,
                "step {steps} read {} entries",
                scan.read - before
            );
            steps += 1;
            if p == Progress::Done {
                break;
            }
            assert!(steps < 1000, "never done");
        }
        assert_eq!(
            scan.found,
            [Held {
                pid: 30,
                fd: 3,
                inode: 99
            }]
        );
        // Every descriptor read, in as many steps as the budget asks.
        assert!(scan.read >= 300 + 150 + 4, "{} entries", scan.read);
        assert!(steps as u64 >= scan.read / budget, "{steps} steps");
    }

    #[test]
    fn every_holder_is_found_or_only_the_first() {
        let (_dir, root) = root_with(&[(10, 5, 7), (20, 5, 8), (30, 5, 7)]);
        let all = Scan::new(&root, BTreeSet::from([7, 8])).finish();
        let mut pids: Vec<(u32, u64)> = all.found.iter().map(|h| (h.pid, h.inode)).collect();
        pids.sort();
        assert_eq!(pids, [(10, 7), (20, 8), (30, 7)]);
        let first = Scan::new(&root, BTreeSet::from([7, 8]))
            .first_only()
            .finish();
        assert_eq!(first.found.len(), 1, "{:?}", first.found);
        assert!(first.read < all.read, "{} {}", first.read, all.read);
    }

    #[test]
    fn a_process_of_another_network_namespace_is_not_read() {
        let (dir, root) = root_with(&[(10, 50, 7), (20, 50, 7)]);
        for (pid, ns) in [(10, "net:[1]"), (20, "net:[2]")] {
            let d = dir.path().join(pid.to_string()).join("ns");
            std::fs::create_dir_all(&d).unwrap();
            symlink(ns, d.join("net")).unwrap();
        }
        let scan = Scan::new(&root, BTreeSet::from([7]))
            .in_netns(Some(PathBuf::from("net:[2]")))
            .finish();
        assert_eq!(scan.found.iter().map(|h| h.pid).collect::<Vec<_>>(), [20]);
        assert!(scan.read < 100, "{} entries", scan.read);
    }

    #[test]
    fn a_root_that_is_not_there_is_done_at_once() {
        let mut scan = Scan::new(
            &ProcRoot(PathBuf::from("/nonexistent/proc")),
            BTreeSet::from([1]),
        );
        assert_eq!(scan.step(10), Progress::Done);
        assert!(scan.found.is_empty());
    }

    #[test]
    fn a_socket_link_names_its_inode() {
        let rows = [
            ("socket:[12345]", Some(12345)),
            ("socket:[]", None),
            ("socket:[-1]", None),
            ("pipe:[12345]", None),
            ("/dev/null", None),
            ("socket:[12345", None),
        ];
        for (t, want) in rows {
            assert_eq!(socket_inode(Path::new(t)), want, "{t}");
        }
    }
}

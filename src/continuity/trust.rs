//! Who may change the state directory. A restarted agent believes the state file it finds
//! there, and writes its own through a temporary file beside it: whoever can write in the
//! directory, or put another directory in its place, decides what a restarted agent reports
//! and where its writes land (a review found both, issue 41).
//!
//! So, walking the path from `/`: the state directory itself must be owned by the agent's
//! user (its effective uid) and writable by no one else; every directory above it must be
//! owned by root or that user, and writable by no one else unless it is sticky (in `/tmp`
//! nobody else can rename or remove what is ours); every symbolic link on the way must be
//! owned by root or that user (nobody else can point it elsewhere). A directory missing at
//! the end of the path is fine: the agent creates it, mode 0700, and checks it again.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

/// How many symbolic links a walk follows (the kernel's own limit).
const MAX_LINKS: usize = 40;

/// What a walk found at the end of the path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Checked {
    /// The state directory exists and only the agent's user can change it.
    Exists,
    /// `first` and what follows it do not exist yet; what leads there is sound.
    Missing { first: PathBuf },
}

/// A user, shown with its name when `/etc/passwd` has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct User(pub u32);

impl User {
    /// The user the agent runs as (its effective uid: the one its files are created with).
    pub(crate) fn me() -> User {
        User(rustix::process::geteuid().as_raw())
    }

    /// The name `chown` takes: the user's name, else its number.
    fn chown_name(self) -> String {
        passwd_name(self.0).unwrap_or_else(|| self.0.to_string())
    }
}

impl std::fmt::Display for User {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match passwd_name(self.0) {
            Some(n) => write!(f, "uid {} ({n})", self.0),
            None => write!(f, "uid {}", self.0),
        }
    }
}

/// The name of `uid` in `/etc/passwd` (only for messages: a user known to NSS alone is shown
/// by number).
fn passwd_name(uid: u32) -> Option<String> {
    let text = std::fs::read_to_string("/etc/passwd").ok()?;
    text.lines().find_map(|l| {
        let mut f = l.split(':');
        let name = f.next()?;
        (f.nth(1)?.parse() == Ok(uid)).then(|| name.to_owned())
    })
}

/// Who besides the owner may write, from a mode (`None`: nobody).
fn writers(mode: u32) -> Option<&'static str> {
    match (mode & 0o020 != 0, mode & 0o002 != 0) {
        (true, true) => Some("its group and all users"),
        (true, false) => Some("its group"),
        (false, true) => Some("all users"),
        (false, false) => None,
    }
}

/// A state directory another user could change: what was found, and the way out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Untrusted {
    #[error(
        "the state directory {} is owned by {owner}, not by {me} the agent runs as: {owner} could plant the state it reads at start or a link it writes through; `chown {} {} && chmod 0700 {}`, or point {from} at a directory of the agent's own",
        dir.display(), me.chown_name(), dir.display(), dir.display()
    )]
    NotOwned {
        dir: PathBuf,
        owner: User,
        me: User,
        from: &'static str,
    },
    #[error(
        "the state directory {} is writable by {} (mode {mode:04o}): they could plant the state the agent reads at start or a link it writes through; `chmod 0700 {}`, or point {from} at a directory of the agent's own",
        dir.display(), writers(*mode).unwrap_or("others"), dir.display()
    )]
    Writable {
        dir: PathBuf,
        mode: u32,
        from: &'static str,
    },
    #[error(
        "{}, above the state directory {}, is owned by {owner}: that user can put another directory in its place; point {from} at a directory whose parents only root and the agent's user can write (such as /run/npu-health-agent)",
        at.display(), dir.display()
    )]
    AboveNotOwned {
        at: PathBuf,
        dir: PathBuf,
        owner: User,
        from: &'static str,
    },
    #[error(
        "{}, above the state directory {}, is writable by {} and not sticky (mode {mode:04o}): they can put another directory in its place; `chmod go-w {}` (or `chmod +t`), or point {from} at a directory whose parents only root and the agent's user can write (such as /run/npu-health-agent)",
        at.display(), dir.display(), writers(*mode).unwrap_or("others"), at.display()
    )]
    AboveWritable {
        at: PathBuf,
        dir: PathBuf,
        mode: u32,
        from: &'static str,
    },
    #[error(
        "{}, on the way to the state directory {}, is a symbolic link owned by {owner}: that user can point it elsewhere; point {from} at the directory it leads to, or replace the link with one of root's",
        at.display(), dir.display()
    )]
    Link {
        at: PathBuf,
        dir: PathBuf,
        owner: User,
        from: &'static str,
    },
    #[error(
        "{}, on the way to the state directory {}, is not a directory; point {from} at a directory",
        at.display(), dir.display()
    )]
    NotADirectory {
        at: PathBuf,
        dir: PathBuf,
        from: &'static str,
    },
    #[error(
        "the path of the state directory {} has more than {MAX_LINKS} symbolic links (a loop?); point {from} at the real directory",
        dir.display()
    )]
    Links { dir: PathBuf, from: &'static str },
    #[error(
        "cannot check the state directory {}: {}: {error}; make it readable by {me}, or point {from} elsewhere",
        dir.display(), at.display()
    )]
    Unreadable {
        at: PathBuf,
        dir: PathBuf,
        error: String,
        me: User,
        from: &'static str,
    },
}

/// Where on the path an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// The state directory itself.
    Target,
    /// A directory above it.
    Above,
    /// A symbolic link on the way.
    Link,
}

/// What is wrong with an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flaw {
    /// Owned by this uid, which may not own it.
    Owner(u32),
    /// Writable by others (its mode).
    Writable(u32),
}

/// The rule: what is wrong with an entry at `place`, owned by `owner`, of mode `mode`, for
/// an agent running as `me` (`None`: nothing).
fn judge(place: Place, owner: u32, mode: u32, me: u32) -> Option<Flaw> {
    let owner_ok = match place {
        Place::Target => owner == me,
        Place::Above | Place::Link => owner == me || owner == 0,
    };
    if !owner_ok {
        return Some(Flaw::Owner(owner));
    }
    let sticky = mode & 0o1000 != 0;
    let open = writers(mode).is_some();
    match place {
        Place::Target if open => Some(Flaw::Writable(mode & 0o7777)),
        Place::Above if open && !sticky => Some(Flaw::Writable(mode & 0o7777)),
        _ => None,
    }
}

/// Checks `dir` (named by `from`) and the path that leads to it, for an agent running as
/// [`User::me`].
pub(crate) fn check(dir: &Path, from: &'static str) -> Result<Checked, Untrusted> {
    check_as(dir, from, User::me())
}

/// [`check`] for an agent running as `me` (`check-config --user`).
pub(crate) fn check_as(dir: &Path, from: &'static str, me: User) -> Result<Checked, Untrusted> {
    let flaw = |place: Place, at: &Path, f: Flaw, owner: u32| -> Untrusted {
        let (at, dir) = (at.to_owned(), dir.to_owned());
        match (place, f) {
            (Place::Target, Flaw::Owner(o)) => Untrusted::NotOwned {
                dir,
                owner: User(o),
                me,
                from,
            },
            (Place::Target, Flaw::Writable(mode)) => Untrusted::Writable { dir, mode, from },
            (Place::Above, Flaw::Owner(o)) => Untrusted::AboveNotOwned {
                at,
                dir,
                owner: User(o),
                from,
            },
            (Place::Above, Flaw::Writable(mode)) => Untrusted::AboveWritable {
                at,
                dir,
                mode,
                from,
            },
            // A link's mode means nothing: only its owner can be its flaw.
            (Place::Link, _) => Untrusted::Link {
                at,
                dir,
                owner: User(owner),
                from,
            },
        }
    };
    let unreadable = |at: &Path, e: std::io::Error| Untrusted::Unreadable {
        at: at.to_owned(),
        dir: dir.to_owned(),
        error: e.to_string(),
        me,
        from,
    };
    let stat = |at: &Path| std::fs::symlink_metadata(at).map_err(|e| unreadable(at, e));
    // The components still to walk; a link's target goes in front of them. `at` is the
    // real directory reached so far (no link in it), `here` its metadata.
    let mut todo: VecDeque<OsString> = parts(dir).collect();
    let mut at = PathBuf::from("/");
    let mut here = stat(&at)?;
    let mut links = 0;
    while let Some(part) = todo.pop_front() {
        if part == ".." {
            at.pop();
            here = stat(&at)?;
            continue;
        }
        // Whoever can write `at` can replace what is in it.
        if let Some(f) = judge(Place::Above, here.uid(), here.mode(), me.0) {
            return Err(flaw(Place::Above, &at, f, here.uid()));
        }
        let next = at.join(&part);
        let meta = match std::fs::symlink_metadata(&next) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Checked::Missing { first: next });
            }
            Err(e) => return Err(unreadable(&next, e)),
        };
        if meta.file_type().is_symlink() {
            if let Some(f) = judge(Place::Link, meta.uid(), meta.mode(), me.0) {
                return Err(flaw(Place::Link, &next, f, meta.uid()));
            }
            links += 1;
            if links > MAX_LINKS {
                return Err(Untrusted::Links {
                    dir: dir.to_owned(),
                    from,
                });
            }
            let target = std::fs::read_link(&next).map_err(|e| unreadable(&next, e))?;
            if target.is_absolute() {
                at = PathBuf::from("/");
                here = stat(&at)?;
            }
            for p in parts(&target).collect::<Vec<_>>().into_iter().rev() {
                todo.push_front(p);
            }
            continue;
        }
        if !meta.is_dir() {
            return Err(Untrusted::NotADirectory {
                at: next,
                dir: dir.to_owned(),
                from,
            });
        }
        at = next;
        here = meta;
    }
    if let Some(f) = judge(Place::Target, here.uid(), here.mode(), me.0) {
        return Err(flaw(Place::Target, &at, f, here.uid()));
    }
    Ok(Checked::Exists)
}

/// The directory the agent opened after checking `dir` (named by `from`): owned by `owner`,
/// of mode `mode`, for an agent running as `me`; an error when another user could change it
/// (it was swapped between the check and the open).
pub(crate) fn check_opened(
    dir: &Path,
    from: &'static str,
    owner: u32,
    mode: u32,
    me: User,
) -> Result<(), Untrusted> {
    match judge(Place::Target, owner, mode, me.0) {
        None => Ok(()),
        Some(Flaw::Owner(o)) => Err(Untrusted::NotOwned {
            dir: dir.to_owned(),
            owner: User(o),
            me,
            from,
        }),
        Some(Flaw::Writable(mode)) => Err(Untrusted::Writable {
            dir: dir.to_owned(),
            mode,
            from,
        }),
    }
}

/// The names along `p` (`..` kept, `.` and `/` dropped).
fn parts(p: &Path) -> impl Iterator<Item = OsString> + '_ {
    p.components().filter_map(|c| match c {
        Component::Normal(n) => Some(n.to_owned()),
        Component::ParentDir => Some("..".into()),
        Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    const ME: u32 = 1000;
    const OTHER: u32 = 1001;

    // The rule, as a table: (place, owner, mode, what is wrong).
    #[test]
    fn who_may_own_and_write_each_entry_on_the_path() {
        use Flaw::{Owner, Writable};
        use Place::{Above, Link, Target};
        let rows: &[(Place, u32, u32, Option<Flaw>)] = &[
            (Target, ME, 0o700, None),
            (Target, ME, 0o755, None),
            (Target, ME, 0o40700, None),
            (Target, OTHER, 0o700, Some(Owner(OTHER))),
            // Root's directory is not the agent's when the agent is not root.
            (Target, 0, 0o700, Some(Owner(0))),
            (Target, ME, 0o770, Some(Writable(0o770))),
            (Target, ME, 0o777, Some(Writable(0o777))),
            (Target, ME, 0o703, Some(Writable(0o703))),
            // Sticky does not help the state directory: others could still add links.
            (Target, ME, 0o1777, Some(Writable(0o1777))),
            (Above, 0, 0o755, None),
            (Above, ME, 0o700, None),
            (Above, 0, 0o1777, None),
            (Above, 0, 0o41777, None),
            (Above, 0, 0o777, Some(Writable(0o777))),
            (Above, 0, 0o775, Some(Writable(0o775))),
            (Above, OTHER, 0o755, Some(Owner(OTHER))),
            (Above, OTHER, 0o1777, Some(Owner(OTHER))),
            (Link, 0, 0o777, None),
            (Link, ME, 0o777, None),
            (Link, OTHER, 0o777, Some(Owner(OTHER))),
        ];
        for &(place, owner, mode, want) in rows {
            assert_eq!(
                judge(place, owner, mode, ME),
                want,
                "{place:?} owned by {owner}, mode {mode:o}"
            );
        }
        // Root may own everything when the agent runs as root.
        assert_eq!(judge(Target, 0, 0o700, 0), None);
    }

    fn chmod(p: &Path, mode: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    // The walk on real directories, as the user running the test (owner checks need two
    // users: the service test makes one).
    #[test]
    fn the_walk_checks_the_directory_the_parents_and_the_links() {
        let me = User::me();
        let d = tempfile::tempdir().unwrap();
        let base = d.path().canonicalize().unwrap();
        let state = base.join("state");
        let from = "[agent] state_dir";
        assert_eq!(
            check_as(&state, from, me),
            Ok(Checked::Missing {
                first: state.clone()
            })
        );
        std::fs::create_dir(&state).unwrap();
        chmod(&state, 0o700);
        assert_eq!(check_as(&state, from, me), Ok(Checked::Exists));
        chmod(&state, 0o777);
        let e = check_as(&state, from, me).unwrap_err();
        assert!(matches!(e, Untrusted::Writable { mode: 0o777, .. }), "{e}");
        let text = e.to_string();
        assert!(
            text.contains(&format!("chmod 0700 {}", state.display())),
            "{text}"
        );
        assert!(
            text.contains("writable by its group and all users"),
            "{text}"
        );
        chmod(&state, 0o700);
        // A parent anyone may write (not sticky): refused, naming the parent.
        chmod(&base, 0o777);
        let e = check_as(&state, from, me).unwrap_err();
        chmod(&base, 0o700);
        assert!(
            matches!(&e, Untrusted::AboveWritable { at, .. } if *at == base),
            "{e}"
        );
        // Sticky, it is fine (/tmp).
        chmod(&base, 0o1777);
        assert_eq!(check_as(&state, from, me), Ok(Checked::Exists));
        chmod(&base, 0o700);
        // Through a link of our own, relative or absolute, the target is what is checked.
        let link = base.join("link");
        std::os::unix::fs::symlink("state", &link).unwrap();
        assert_eq!(check_as(&link, from, me), Ok(Checked::Exists));
        chmod(&state, 0o777);
        assert!(matches!(
            check_as(&link, from, me),
            Err(Untrusted::Writable { .. })
        ));
        chmod(&state, 0o700);
        let abs = base.join("abs");
        std::os::unix::fs::symlink(&state, &abs).unwrap();
        assert_eq!(check_as(&abs.join("."), from, me), Ok(Checked::Exists));
        // `..` after a link is the target's parent.
        let sub = state.join("sub");
        std::fs::create_dir(&sub).unwrap();
        chmod(&sub, 0o700);
        assert_eq!(
            check_as(&base.join("link/sub/.."), from, me),
            Ok(Checked::Exists)
        );
        // A loop ends.
        std::os::unix::fs::symlink("loop", base.join("loop")).unwrap();
        assert!(matches!(
            check_as(&base.join("loop"), from, me),
            Err(Untrusted::Links { .. })
        ));
        // A file on the way.
        std::fs::write(base.join("file"), "").unwrap();
        assert!(matches!(
            check_as(&base.join("file/x"), from, me),
            Err(Untrusted::NotADirectory { .. })
        ));
        // Owned by us as another uid sees it: not its own.
        let e = check_as(&state, from, User(me.0.wrapping_add(1))).unwrap_err();
        assert!(
            matches!(
                e,
                Untrusted::NotOwned { .. } | Untrusted::AboveNotOwned { .. }
            ),
            "{e}"
        );
    }

    #[test]
    fn a_message_names_the_directory_the_owner_and_the_fix() {
        let e = Untrusted::NotOwned {
            dir: "/run/x".into(),
            owner: User(4_000_000),
            me: User(0),
            from: "[agent] state_dir",
        };
        assert_eq!(
            e.to_string(),
            "the state directory /run/x is owned by uid 4000000, not by uid 0 (root) the agent runs as: uid 4000000 could plant the state it reads at start or a link it writes through; `chown root /run/x && chmod 0700 /run/x`, or point [agent] state_dir at a directory of the agent's own"
        );
    }
}

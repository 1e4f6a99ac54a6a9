//! Who the agent runs as (`check-config --user`, the unit's `User=`), and whether that user
//! can open each file the configuration makes the agent read: every directory on the way
//! searchable, the file itself readable (or executable), by the permission bits, as the
//! kernel decides for a process of that user. The checks run as root, who opens anything, so
//! they read the modes instead of trying. ACLs, and the unit's `SupplementaryGroups=`, are
//! not seen: only the groups `/etc/group` lists the user in.

use crate::config::{AgentConfig, ConfigError, Form};
use crate::integrations::kubernetes::config::KubernetesConfig;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// A user the agent runs as: its ids, as `/etc/passwd` and `/etc/group` give them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Account {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    /// The primary group's name as `/etc/group` gives it (`nogroup` for Debian's `nobody`),
    /// or its number when `/etc/group` has none.
    pub group: String,
    /// Supplementary groups (`/etc/group` members).
    pub groups: Vec<u32>,
}

/// Permission bits of the "other" class; shifted by 3 for the group, 6 for the owner.
const READ: u32 = 0o4;
const EXECUTE: u32 = 0o1;

impl Account {
    /// `name` (or a number) from `/etc/passwd` and `/etc/group`.
    pub(crate) fn lookup(name: &str) -> Result<Account, String> {
        Account::lookup_in(
            name,
            &std::fs::read_to_string("/etc/passwd").unwrap_or_default(),
            &std::fs::read_to_string("/etc/group").unwrap_or_default(),
        )
    }

    fn lookup_in(name: &str, passwd: &str, group: &str) -> Result<Account, String> {
        let entry = passwd
            .lines()
            .map(|l| l.split(':').collect::<Vec<_>>())
            .find(|f| f.len() >= 4 && (f[0] == name || f[2] == name))
            .ok_or_else(|| {
                format!("--user {name}: no such user in /etc/passwd (give the unit's User=)")
            })?;
        let (uid, gid) = match (entry[2].parse::<u32>(), entry[3].parse::<u32>()) {
            (Ok(u), Ok(g)) => (u, g),
            _ => {
                return Err(format!(
                    "--user {name}: /etc/passwd's entry has no numeric ids"
                ));
            }
        };
        let user = entry[0];
        let groups: Vec<Vec<&str>> = group
            .lines()
            .map(|l| l.split(':').collect::<Vec<_>>())
            .filter(|f| f.len() >= 4)
            .collect();
        let primary = groups
            .iter()
            .find(|f| f[2].parse() == Ok(gid))
            .map_or_else(|| gid.to_string(), |f| f[0].to_owned());
        Ok(Account {
            name: user.to_owned(),
            uid,
            gid,
            group: primary,
            groups: groups
                .iter()
                .filter(|f| f[3].split(',').any(|m| m == user))
                .filter_map(|f| f[2].parse().ok())
                .collect(),
        })
    }

    /// Whether this user has `bit` ([`READ`] or [`EXECUTE`]) on a file of `owner`:`group`
    /// with `mode`. The kernel takes one class, the first that matches (owner, group,
    /// other), and never falls through to the next; root reads and searches anything.
    fn has(&self, owner: u32, group: u32, mode: u32, bit: u32) -> bool {
        if self.uid == 0 {
            return true;
        }
        let shift = if owner == self.uid {
            6
        } else if group == self.gid || self.groups.contains(&group) {
            3
        } else {
            0
        };
        mode & (bit << shift) != 0
    }

    #[cfg(test)]
    /// Whether this user may read a file of `owner`:`group` with `mode`.
    pub(crate) fn may_read(&self, owner: u32, group: u32, mode: u32) -> bool {
        self.has(owner, group, mode, READ)
    }

    /// Why this user could not open `path` to `want` it: a directory on the way it may not
    /// search, or the file's own mode. `None` when it can, or when the file is not there
    /// (the checks that read the file say so). Symbolic links are followed: the directories
    /// of the path as written and of the file it resolves to are all searched on the way.
    pub(crate) fn blocked(&self, path: &Path, want: Use) -> Option<Blocked> {
        let real = std::fs::canonicalize(path).ok()?;
        let written = std::path::absolute(path).unwrap_or_else(|_| real.clone());
        let mut dirs: Vec<&Path> = written.ancestors().skip(1).collect();
        dirs.reverse();
        let mut real_dirs: Vec<&Path> = real.ancestors().skip(1).collect();
        real_dirs.reverse();
        for dir in real_dirs {
            if !dirs.contains(&dir) {
                dirs.push(dir);
            }
        }
        for dir in dirs {
            let Ok(m) = std::fs::metadata(dir) else {
                continue;
            };
            if !self.has(m.uid(), m.gid(), m.mode(), EXECUTE) {
                return Some(Blocked::Directory {
                    dir: dir.to_path_buf(),
                    mode: Mode::of(&m),
                });
            }
        }
        let m = std::fs::metadata(&real).ok()?;
        let bit = match want {
            Use::Read => READ,
            Use::Execute => EXECUTE,
        };
        (!self.has(m.uid(), m.gid(), m.mode(), bit)).then(|| Blocked::File(Mode::of(&m)))
    }
}

/// What the agent does with a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Use {
    Read,
    Execute,
}

/// A file's owner, group and permission bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Mode {
    pub uid: u32,
    pub gid: u32,
    pub bits: u32,
}

impl Mode {
    fn of(m: &std::fs::Metadata) -> Mode {
        Mode {
            uid: m.uid(),
            gid: m.gid(),
            bits: m.mode() & 0o7777,
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "uid {}, gid {}, mode {:04o}",
            self.uid, self.gid, self.bits
        )
    }
}

/// Why a user cannot open a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Blocked {
    /// A directory on the way that the user may not search (no `x` for it).
    Directory { dir: PathBuf, mode: Mode },
    /// The file's own mode.
    File(Mode),
}

/// A file the configuration makes the agent open, the key that names it, and what the
/// agent does without it (`None`: it does not start).
struct Needed {
    key: String,
    path: PathBuf,
    want: Use,
    without: Option<&'static str>,
}

/// The files of `cfg` that an agent running as `account` could not open: those it cannot
/// start without (an error each, named by its key), and those it starts without (the
/// driver's library, `npu-smi`: a warning each).
#[derive(Debug, Default)]
pub(crate) struct Unreachable {
    /// The place (key), the file, and the whole message.
    pub errors: Vec<(String, PathBuf, String)>,
    /// Each a whole line: the key, then the message.
    pub warnings: Vec<String>,
}

impl Unreachable {
    /// The one-line error `check-config` fails with: the first file in full, the others by
    /// key and path.
    pub(crate) fn error(&self, source: &str) -> Option<ConfigError> {
        let ((place, _, message), rest) = self.errors.split_first()?;
        let mut message = message.clone();
        if !rest.is_empty() {
            let others: Vec<String> = rest
                .iter()
                .map(|(key, path, _)| format!("{key} ({})", path.display()))
                .collect();
            message.push_str(&format!(
                "; the same for {} more: {}",
                rest.len(),
                others.join(", ")
            ));
        }
        Some(ConfigError::new(source, place, message))
    }
}

/// Every file `cfg` makes the agent open that `account` could not, checked by
/// [`Account::blocked`].
pub(crate) fn unreachable_files(cfg: &AgentConfig, account: &Account) -> Unreachable {
    let mut found = Unreachable::default();
    let mut seen: Vec<PathBuf> = Vec::new();
    for n in needed(cfg) {
        if seen.contains(&n.path) {
            continue;
        }
        seen.push(n.path.clone());
        let Some(blocked) = account.blocked(&n.path, n.want) else {
            continue;
        };
        let message = explain(account, &n, &blocked);
        match n.without {
            None => found.errors.push((n.key, n.path, message)),
            Some(_) => found.warnings.push(format!("{}: {message}", n.key)),
        }
    }
    found
}

/// `<file> … is not readable by <user> (uid …): <what happens>; <the fix>`.
fn explain(account: &Account, n: &Needed, blocked: &Blocked) -> String {
    let user = format!("{} (uid {})", account.name, account.uid);
    let then = match n.without {
        None => format!("the agent running as {} fails to start", account.name),
        Some(what) => format!(
            "the agent running as {} starts without {what}",
            account.name
        ),
    };
    let group = &account.group;
    let path = n.path.display();
    match blocked {
        Blocked::Directory { dir, mode } => {
            let dir = dir.display();
            format!(
                "{path} is inside {dir} ({mode}), which {user} cannot search: {then}; `chgrp {group} {dir} && chmod g+x {dir}`, or keep the file where {} can reach it",
                account.name
            )
        }
        Blocked::File(mode) => match n.want {
            Use::Read => format!(
                "{path} ({mode}) is not readable by {user}: {then}; `chown root:{group} {path} && chmod 0640 {path}`"
            ),
            Use::Execute => format!(
                "{path} ({mode}) is not executable by {user}: {then}; `chgrp {group} {path} && chmod g+rx {path}`"
            ),
        },
    }
}

/// Every file `cfg` makes the agent open, with the key that names it, in the order the
/// configuration names them: the configuration itself, the agent's files, each engine's.
fn needed(cfg: &AgentConfig) -> Vec<Needed> {
    let read = |key: &str, path: &Path| Needed {
        key: key.to_owned(),
        path: path.to_path_buf(),
        want: Use::Read,
        without: None,
    };
    let config_key = match cfg.form {
        Form::Host => "--config",
        Form::Single => "--config-path",
    };
    let mut files = vec![read(config_key, Path::new(&cfg.source))];
    let a = &cfg.agent;
    if let Some(f) = &a.admin_auth.token_file {
        files.push(read("[agent] admin_token_file", f));
    }
    if let Some(t) = &a.admin_auth.tls {
        files.push(read("[agent] admin_tls.cert_file", &t.cert_file));
        files.push(read("[agent] admin_tls.key_file", &t.key_file));
        if let Some(ca) = &t.client_ca_file {
            files.push(read("[agent] admin_tls.client_ca_file", ca));
        }
    }
    if let Some(k) = KubernetesConfig::of(a) {
        for (key, f) in [("token_file", &k.token_file), ("ca_file", &k.ca_file)] {
            if let Some(f) = f {
                files.push(read(&format!("[agent.kubernetes] {key}"), f));
            }
        }
    }
    // A table it cannot read: check-config refuses it; run logs that and keeps the built-in.
    let table = a.fault_code_file.clone().or_else(|| {
        let default = Path::new(crate::driver::fault_levels::DEFAULT_PATH);
        default.exists().then(|| default.to_path_buf())
    });
    if let Some(t) = table {
        files.push(read("[agent] fault_code_file", &t));
    }
    files.extend(driver_files(cfg));
    for (i, spec) in cfg.engines.iter().enumerate() {
        files.extend(
            crate::config::engine::files_read(spec)
                .into_iter()
                .map(|(key, path)| read(&cfg.engine_place(i, &key), &path)),
        );
    }
    files
}

/// The driver's library and `npu-smi`, where the configuration names them (searched for,
/// they are not known here): the agent starts without either.
fn driver_files(cfg: &AgentConfig) -> Vec<Needed> {
    let mut files = Vec::new();
    if let Some(lib) = &cfg.agent.dcmi_lib {
        files.push(Needed {
            key: "[agent] dcmi_lib".to_owned(),
            path: lib.clone(),
            want: Use::Read,
            without: Some("DCMI (the NPUs are read through npu-smi, or not at all)"),
        });
    }
    if cfg.agent.npu_smi.components().count() > 1 {
        files.push(Needed {
            key: "[agent] npu_smi".to_owned(),
            path: cfg.agent.npu_smi.clone(),
            want: Use::Execute,
            without: Some("npu-smi"),
        });
    }
    files
}

#[cfg(test)]
mod tests {
    use super::{Account, Blocked, Use};
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\nagent:x:998:997::/nonexistent:/usr/sbin/nologin\nlonely:x:996:4242::/:/bin/false\n";
    const GROUP: &str = "root:x:0:\nnogroup:x:65534:\nnpu:x:997:\nHwHiAiUser:x:1000:agent,other\n";

    fn user(name: &str) -> Account {
        Account::lookup_in(name, PASSWD, GROUP).unwrap()
    }

    // Issue 48: the hint names the primary group as /etc/group gives it (Debian's nobody is
    // in `nogroup`, not `nobody`), the number when /etc/group has no such group.
    #[test]
    fn the_primary_group_is_named_as_etc_group_gives_it() {
        let nobody = user("nobody");
        assert_eq!((nobody.uid, nobody.gid), (65534, 65534));
        assert_eq!(nobody.group, "nogroup");
        assert!(nobody.groups.is_empty());
        let agent = user("998");
        assert_eq!(
            (agent.name.as_str(), agent.group.as_str()),
            ("agent", "npu")
        );
        assert_eq!(agent.groups, [1000], "a member of HwHiAiUser");
        assert_eq!(user("lonely").group, "4242");
        assert!(
            Account::lookup_in("ghost", PASSWD, GROUP)
                .unwrap_err()
                .contains("--user ghost: no such user")
        );
    }

    // The kernel's rule: one class, the first that matches; no falling through to "other".
    #[test]
    fn permission_bits_are_read_for_the_first_class_that_matches() {
        let agent = user("agent");
        for (owner, group, mode, readable) in [
            (998, 0, 0o400, true),
            (998, 0, 0o044, false),
            (0, 997, 0o040, true),
            (0, 997, 0o404, false),
            (0, 1000, 0o040, true),
            (0, 0, 0o004, true),
            (0, 0, 0o640, false),
        ] {
            assert_eq!(
                agent.may_read(owner, group, mode),
                readable,
                "{owner}:{group} {mode:o}"
            );
        }
        assert!(user("root").may_read(5, 5, 0));
    }

    fn chmod(p: &Path, mode: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    // Issue 48 (R8): a file nobody may read, inside a directory of root's it may not search,
    // is blocked by that directory, through a symbolic link too; real files and modes, with
    // the user as /etc/passwd has it (the suite runs as root).
    #[test]
    fn a_directory_on_the_way_that_the_user_cannot_search_blocks_the_file() {
        let Ok(nobody) = Account::lookup("nobody") else {
            eprintln!("skipped: no user nobody here");
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        chmod(dir.path(), 0o755);
        let secret = dir.path().join("secret");
        std::fs::create_dir(&secret).unwrap();
        chmod(&secret, 0o700);
        let token = secret.join("token");
        std::fs::write(&token, "t").unwrap();
        chmod(&token, 0o644);
        let at_dir = |b: Option<Blocked>| match b {
            Some(Blocked::Directory { dir, mode }) => Some((dir, mode.bits)),
            _ => None,
        };
        assert_eq!(
            at_dir(nobody.blocked(&token, Use::Read)),
            Some((secret.clone(), 0o700))
        );
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&token, &link).unwrap();
        assert_eq!(
            at_dir(nobody.blocked(&link, Use::Read)),
            Some((secret.clone(), 0o700)),
            "the link's target is behind the directory"
        );
        chmod(&secret, 0o711);
        assert_eq!(nobody.blocked(&token, Use::Read), None);
        assert_eq!(nobody.blocked(&link, Use::Read), None);
        chmod(&token, 0o600);
        assert!(matches!(
            nobody.blocked(&token, Use::Read),
            Some(Blocked::File(m)) if m.bits == 0o600
        ));
        assert!(matches!(
            nobody.blocked(&token, Use::Execute),
            Some(Blocked::File(_))
        ));
        assert_eq!(user("root").blocked(&token, Use::Read), None);
        assert_eq!(
            nobody.blocked(&dir.path().join("absent"), Use::Read),
            None,
            "a missing file is the readers' to report"
        );
    }
}

//! `state.json`: every engine's saved state ([`crate::monitor::saved`]), written on every
//! change and read back at start.
//!
//! Written atomically (a temporary file in the same directory, then `rename`), at most
//! [`MAX_BYTES`], checked every [`CHECK_EVERY`] and written only when an engine's state
//! changed. The temporary file is always a new one (`O_EXCL`, no link followed), and those a
//! crash left behind are removed at start ([`remove_stale`]). Read back only if it is a
//! regular file of the agent's own user (not a link) of at most [`MAX_BYTES`], parses, is of
//! a format this agent knows, was written no more than [`MAX_AGE`] ago and not in the future.
//! Anything else is ignored with one warning saying why, and the agent starts clean: a bad
//! file never stops the agent. An engine's entry is used only for the engine of the same
//! name at the same address.
//!
//! Every one of these is done relative to the state directory held open since the start
//! ([`Place`]), by name, never through the directory's path again: the directory was checked
//! at start ([`super::trust`]), and a parent that becomes writable by others later lets them
//! put a link to another place where the directory was (issue 48). The writes still land in
//! the directory checked; the persister says so in the log ([`Place::doubt`]).

use crate::monitor::saved::EngineState;
use rustix::fs::{AtFlags, Mode, OFlags};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The file format this agent writes and reads.
pub(crate) const FORMAT: u32 = 1;
/// The largest file written or read (a few KiB per engine in practice).
pub(crate) const MAX_BYTES: u64 = 4 * 1024 * 1024;
/// A file older than this is ignored: the agent was down long enough that Node Manager has
/// acted on what it saw, and the engine has been restarted or replaced since.
pub(crate) const MAX_AGE: Duration = Duration::from_secs(3600);
/// A file dated more than this ahead of the clock is ignored (written by a clock that has
/// since been stepped back, or not by this agent).
pub(crate) const FUTURE_SLACK: Duration = Duration::from_secs(30);
/// How often the persister compares the state with what it last wrote.
pub(crate) const CHECK_EVERY: Duration = Duration::from_millis(100);

/// The file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct StateFile {
    pub format: u32,
    /// The agent version that wrote it.
    pub agent: String,
    pub pid: u32,
    pub saved_at_unix_ms: u64,
    pub engines: Vec<EngineState>,
}

/// The state file in its directory, held open: every read, write and removal is relative to
/// the directory's descriptor, by name, with no link followed, so a directory put in the
/// path's place while the agent runs receives none of them.
#[derive(Debug, Clone)]
pub(crate) struct Place {
    dir: Arc<OwnedFd>,
    /// The directory's path, for messages and [`Place::doubt`].
    dir_path: PathBuf,
    /// What named the directory (`[agent] state_dir`, …).
    from: &'static str,
    name: &'static str,
}

impl Place {
    /// The file `name` in the directory at `dir_path` (named by `from`), the directory opened
    /// now. Links on the path are followed: the caller checked the path just before
    /// ([`super::trust`]), and checks what was opened ([`Place::owner_and_mode`]).
    pub(crate) fn open(
        dir_path: &Path,
        from: &'static str,
        name: &'static str,
    ) -> std::io::Result<Place> {
        let fd = rustix::fs::open(
            dir_path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Place {
            dir: Arc::new(fd),
            dir_path: dir_path.to_owned(),
            from,
            name,
        })
    }

    /// The file's path, as the messages give it.
    pub(crate) fn path(&self) -> PathBuf {
        self.dir_path.join(self.name)
    }

    /// The owner (uid) and mode of the directory held.
    pub(crate) fn owner_and_mode(&self) -> std::io::Result<(u32, u32)> {
        let st = rustix::fs::fstat(&*self.dir)?;
        Ok((st.st_uid, st.st_mode))
    }

    /// Why the directory's path may no longer lead to the directory held, if it may not: the
    /// path is no longer trusted (a parent became writable by others: [`super::trust`]), or
    /// it leads elsewhere already. The state is still written to the directory held; a
    /// restarted agent reads the path.
    pub(crate) fn doubt(&self) -> Option<String> {
        let mut why = Vec::new();
        if let Err(e) = super::trust::check(&self.dir_path, self.from) {
            why.push(e.to_string());
        }
        let held = rustix::fs::fstat(&*self.dir)
            .ok()
            .map(|s| (s.st_dev, s.st_ino));
        let named = rustix::fs::stat(&self.dir_path)
            .ok()
            .map(|s| (s.st_dev, s.st_ino));
        if held.is_none() || named != held {
            why.push(format!(
                "{} ({}) is no longer the directory the agent opened at start (moved, or replaced by another or a link)",
                self.dir_path.display(),
                self.from
            ));
        }
        (!why.is_empty()).then(|| why.join("; "))
    }

    /// Opens `name` in the directory held with `flags` (and `O_NOFOLLOW`, `O_CLOEXEC`).
    fn open_at(&self, name: &OsStr, flags: OFlags, mode: Mode) -> std::io::Result<std::fs::File> {
        let fd = rustix::fs::openat(
            &*self.dir,
            name,
            flags | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            mode,
        )?;
        Ok(std::fs::File::from(fd))
    }

    /// Removes `name` from the directory held (a link itself, never what it points to).
    fn unlink(&self, name: &OsStr) -> std::io::Result<()> {
        Ok(rustix::fs::unlinkat(&*self.dir, name, AtFlags::empty())?)
    }
}

/// What was found at start.
#[derive(Debug, Default)]
pub(crate) struct Found {
    engines: HashMap<String, EngineState>,
}

impl Found {
    /// Nothing (no file, or a file ignored).
    pub(crate) fn none() -> Found {
        Found::default()
    }

    /// How many engines it holds (the tests read it).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.engines.len()
    }

    /// The saved state of the engine named `name` at `engine_url`; an entry for that name
    /// at another address is dropped with a log line.
    pub(crate) fn take(&mut self, name: &str, engine_url: &str) -> Option<EngineState> {
        let s = self.engines.remove(name)?;
        if s.engine != engine_url {
            tracing::info!(
                engine = %name,
                "the saved state is for {}, the engine is now at {engine_url}: not used",
                s.engine
            );
            return None;
        }
        Some(s)
    }

    /// Names of the entries no engine took.
    pub(crate) fn left(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.engines.keys().map(String::as_str).collect();
        v.sort_unstable();
        v
    }
}

/// Why a file was ignored.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum Ignored {
    #[error("cannot read it: {0}")]
    Unreadable(String),
    #[error("it is not a regular file")]
    NotAFile,
    #[error("it is a symbolic link; the agent reads only a file it wrote itself")]
    Link,
    #[error(
        "it is owned by uid {owner}, not by uid {me} the agent runs as; the agent reads only a file it wrote itself"
    )]
    NotOwned { owner: u32, me: u32 },
    #[error("it is {0} bytes, over the {MAX_BYTES} a state file may hold")]
    TooLarge(u64),
    #[error("it does not parse: {0}")]
    Corrupt(String),
    #[error("it is of format {0}, this agent reads format {FORMAT}")]
    Format(u32),
    #[error("it was written {0:?} in the future (the clock was stepped back?)")]
    Future(Duration),
    #[error("it was written {0:?} ago, over the {MAX_AGE:?} a state is trusted")]
    TooOld(Duration),
}

/// Reads the file at `place`; `Ok(None)` when there is none.
pub(crate) fn read(place: &Place, now_unix_ms: u64) -> Result<Option<StateFile>, Ignored> {
    // No link followed, no wait for a FIFO's writer; what is checked is what was opened.
    let flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY;
    let file = match place.open_at(OsStr::new(place.name), flags, Mode::empty()) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) => {
            return Err(Ignored::Link);
        }
        Err(e) => return Err(Ignored::Unreadable(e.to_string())),
    };
    let meta = file
        .metadata()
        .map_err(|e| Ignored::Unreadable(e.to_string()))?;
    if !meta.file_type().is_file() {
        return Err(Ignored::NotAFile);
    }
    let me = rustix::process::geteuid().as_raw();
    if std::os::unix::fs::MetadataExt::uid(&meta) != me {
        return Err(Ignored::NotOwned {
            owner: std::os::unix::fs::MetadataExt::uid(&meta),
            me,
        });
    }
    if meta.len() > MAX_BYTES {
        return Err(Ignored::TooLarge(meta.len()));
    }
    let mut text = Vec::new();
    file.take(MAX_BYTES + 1)
        .read_to_end(&mut text)
        .map_err(|e| Ignored::Unreadable(e.to_string()))?;
    if text.len() as u64 > MAX_BYTES {
        return Err(Ignored::TooLarge(text.len() as u64));
    }
    // The format first, so a newer agent's file is named as such, not as corrupt.
    #[derive(Deserialize)]
    struct Head {
        format: u32,
    }
    let head: Head = serde_json::from_slice(&text).map_err(|e| Ignored::Corrupt(e.to_string()))?;
    if head.format != FORMAT {
        return Err(Ignored::Format(head.format));
    }
    let file: StateFile =
        serde_json::from_slice(&text).map_err(|e| Ignored::Corrupt(e.to_string()))?;
    if file.saved_at_unix_ms > now_unix_ms + FUTURE_SLACK.as_millis() as u64 {
        return Err(Ignored::Future(Duration::from_millis(
            file.saved_at_unix_ms - now_unix_ms,
        )));
    }
    let age = Duration::from_millis(now_unix_ms.saturating_sub(file.saved_at_unix_ms));
    if age > MAX_AGE {
        return Err(Ignored::TooOld(age));
    }
    Ok(Some(file))
}

/// What the agent finds at `place` at start, with one log line for a file it ignores.
pub(crate) fn load(place: &Place) -> Found {
    let now = crate::clock::unix_ms();
    let path = place.path();
    match read(place, now) {
        Ok(None) => Found::none(),
        Ok(Some(f)) => {
            let age = Duration::from_millis(now.saturating_sub(f.saved_at_unix_ms));
            let mut engines = HashMap::new();
            for e in f.engines {
                engines.insert(e.name.clone(), e);
            }
            tracing::info!(
                "state file {}: {} engine(s), written {:.1} s ago by agent {} (pid {})",
                path.display(),
                engines.len(),
                age.as_secs_f64(),
                f.agent,
                f.pid
            );
            Found { engines }
        }
        Err(why) => {
            tracing::warn!(
                "state file {} ignored: {why}; every engine starts from its initial state",
                path.display()
            );
            Found::none()
        }
    }
}

/// The bytes of a state file holding `engines`.
fn render(engines: &[EngineState]) -> Result<Vec<u8>, String> {
    let f = StateFile {
        format: FORMAT,
        agent: crate::VERSION.to_owned(),
        pid: std::process::id(),
        saved_at_unix_ms: crate::clock::unix_ms(),
        engines: engines.to_vec(),
    };
    let bytes = serde_json::to_vec(&f).map_err(|e| format!("cannot encode the state: {e}"))?;
    if bytes.len() as u64 > MAX_BYTES {
        return Err(format!(
            "the state is {} bytes, over the {MAX_BYTES} a state file may hold; not written",
            bytes.len()
        ));
    }
    Ok(bytes)
}

/// Writes `engines` to `place` atomically (a temporary file beside it, then a rename).
pub(crate) fn write(place: &Place, engines: &[EngineState]) -> Result<(), String> {
    let bytes = render(engines)?;
    let tmp = tmp_name(place.name);
    let result = (|| {
        let mut f = create_new(place, &tmp)?;
        f.write_all(&bytes)?;
        f.sync_data()?;
        rustix::fs::renameat(&*place.dir, &tmp, &*place.dir, place.name)?;
        Ok::<(), std::io::Error>(())
    })();
    result.map_err(|e| {
        let _ = place.unlink(&tmp);
        format!("cannot write {}: {e}", place.path().display())
    })
}

/// A new file `tmp` in the directory held, mode 0600: never one that was there, never
/// through a link. What is in the way (this pid's leftover from before a crash, or anything
/// else) is removed (an unlink, which does not follow a link) and the creation tried once
/// more.
fn create_new(place: &Place, tmp: &OsStr) -> std::io::Result<std::fs::File> {
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL;
    let mode = Mode::from_raw_mode(0o600);
    match place.open_at(tmp, flags, mode) {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            place.unlink(tmp)?;
            place.open_at(tmp, flags, mode)
        }
        r => r,
    }
}

/// The temporary file this process writes `name` through: `<name>.<pid>.tmp`.
fn tmp_name(name: &str) -> std::ffi::OsString {
    format!("{name}.{}.tmp", std::process::id()).into()
}

/// Whether `name` is a temporary file of `state` (`<state>.<digits>.tmp`, any pid).
fn is_tmp_of(name: &std::ffi::OsStr, state: &std::ffi::OsStr) -> bool {
    let (Some(name), Some(state)) = (name.to_str(), state.to_str()) else {
        return false;
    };
    name.strip_prefix(state)
        .and_then(|r| r.strip_prefix('.'))
        .and_then(|r| r.strip_suffix(".tmp"))
        .is_some_and(|pid| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()))
}

/// What [`remove_stale`] removed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Removed {
    pub files: usize,
    /// Their size (a link counts 0).
    pub bytes: u64,
}

/// Removes the temporary files of `place` that writes cut short left beside it (a crash
/// between the creation and the rename), whatever pid wrote them. For a start, once no
/// other agent writes there.
pub(crate) fn remove_stale(place: &Place) -> Result<Removed, String> {
    let dir = place.dir_path.display();
    let entries =
        rustix::fs::Dir::read_from(&*place.dir).map_err(|e| format!("cannot list {dir}: {e}"))?;
    let mut removed = Removed::default();
    for entry in entries.flatten() {
        let name = OsStr::from_bytes(entry.file_name().to_bytes()).to_owned();
        if !is_tmp_of(&name, OsStr::new(place.name)) {
            continue;
        }
        // Of the entry itself, not of what a link points to.
        let Ok(st) = rustix::fs::statat(&*place.dir, &name, AtFlags::SYMLINK_NOFOLLOW) else {
            continue;
        };
        let kind = rustix::fs::FileType::from_raw_mode(st.st_mode);
        if kind == rustix::fs::FileType::Directory {
            continue;
        }
        place.unlink(&name).map_err(|e| {
            format!(
                "cannot remove {}: {e}",
                place.dir_path.join(&name).display()
            )
        })?;
        removed.files += 1;
        if kind == rustix::fs::FileType::RegularFile {
            removed.bytes += u64::try_from(st.st_size).unwrap_or(0);
        }
    }
    Ok(removed)
}

/// Where the states come from: every engine monitored now.
pub(crate) type Source = Box<dyn Fn() -> Vec<EngineState> + Send + Sync>;

/// Writes the state file whenever an engine's state changes.
pub(crate) struct Persister {
    place: Place,
    source: std::sync::Arc<Source>,
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

/// The engines' part of what was last written (the file's own header changes every time).
type Last = std::sync::Arc<std::sync::Mutex<Option<Vec<u8>>>>;

impl Persister {
    /// Starts checking every [`CHECK_EVERY`].
    pub(crate) fn start(place: Place, source: Source) -> Persister {
        let source = std::sync::Arc::new(source);
        let cancel = CancellationToken::new();
        let last: Last = Default::default();
        let task = tokio::spawn(run(place.clone(), source.clone(), last, cancel.clone()));
        Persister {
            place,
            source,
            cancel,
            task,
        }
    }

    /// Stops checking and writes the state as it is now, whatever was written before: the
    /// last word before the process stops or hands over.
    pub(crate) async fn finish(self) -> Result<(), String> {
        self.cancel.cancel();
        let _ = self.task.await;
        let (place, source) = (self.place.clone(), self.source.clone());
        let (doubt, written) =
            tokio::task::spawn_blocking(move || (place.doubt(), write(&place, &source())))
                .await
                .map_err(|e| format!("the state writer panicked: {e}"))?;
        say_doubt(&self.place, &mut None, doubt);
        written
    }

    /// The file written.
    pub(crate) fn path(&self) -> PathBuf {
        self.place.path()
    }
}

async fn run(place: Place, source: std::sync::Arc<Source>, last: Last, cancel: CancellationToken) {
    let mut failing = false;
    let mut doubted: Option<String> = None;
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(CHECK_EVERY) => {}
        }
        let engines = source();
        let Ok(key) = serde_json::to_vec(&engines) else {
            continue;
        };
        let changed = last.lock().unwrap_or_else(|p| p.into_inner()).as_ref() != Some(&key);
        if !changed {
            continue;
        }
        let p = place.clone();
        let (doubt, written) =
            tokio::task::spawn_blocking(move || (p.doubt(), write(&p, &engines)))
                .await
                .unwrap_or_else(|e| (None, Err(format!("the state writer panicked: {e}"))));
        say_doubt(&place, &mut doubted, doubt);
        match written {
            Ok(()) => {
                if failing {
                    tracing::info!("state file {} written again", place.path().display());
                }
                failing = false;
                *last.lock().unwrap_or_else(|p| p.into_inner()) = Some(key);
            }
            Err(e) => {
                if !failing {
                    tracing::warn!("{e}; a restart of the agent would lose what changed since");
                }
                failing = true;
            }
        }
    }
}

/// Logs a change of [`Place::doubt`] (`now`; `said`: the last one logged).
fn say_doubt(place: &Place, said: &mut Option<String>, now: Option<String>) {
    if *said == now {
        return;
    }
    match &now {
        Some(why) => tracing::warn!(
            "{why}; the state is still written to the directory opened at start, by its descriptor, never through the path; a restarted agent reads the path"
        ),
        None => tracing::info!(
            "the state directory {} is trusted again and is the directory the agent opened",
            place.dir_path.display()
        ),
    }
    *said = now;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `p`, a `state.json`, in its directory held open.
    fn at(p: &Path) -> Place {
        assert_eq!(p.file_name(), Some(OsStr::new("state.json")));
        Place::open(p.parent().unwrap(), "[agent] state_dir", "state.json").unwrap()
    }

    /// The temporary file this process writes `p` through.
    fn tmp_path(p: &Path) -> PathBuf {
        p.with_file_name(tmp_name("state.json"))
    }

    fn file(dir: &Path, text: &[u8]) -> PathBuf {
        let p = dir.join("state.json");
        std::fs::write(&p, text).unwrap();
        p
    }

    fn header(saved_at: u64, format: u32) -> String {
        format!(
            r#"{{"format":{format},"agent":"x","pid":1,"saved_at_unix_ms":{saved_at},"engines":[]}}"#
        )
    }

    const NOW: u64 = 1_800_000_000_000;

    #[test]
    fn a_missing_file_is_no_state_and_a_good_one_reads_back() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("state.json");
        assert_eq!(read(&at(&p), NOW), Ok(None));
        write(&at(&p), &[]).unwrap();
        let f = read(&at(&p), crate::clock::unix_ms()).unwrap().unwrap();
        assert_eq!(f.format, FORMAT);
        assert_eq!(f.pid, std::process::id());
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // Nothing is left beside it.
        let names: Vec<_> = std::fs::read_dir(d.path()).unwrap().collect();
        assert_eq!(names.len(), 1);
    }

    // Each kind of bad file is named, never a panic.
    #[test]
    fn bad_files_are_ignored_with_the_reason() {
        let d = tempfile::tempdir().unwrap();
        let corrupt: [&[u8]; 4] = [
            b"{not json",
            b"",
            b"\x00\xff\xfe garbage",
            br#"{"format":1}"#,
        ];
        for text in corrupt {
            let p = file(d.path(), text);
            let e = read(&at(&p), NOW).unwrap_err();
            assert!(matches!(e, Ignored::Corrupt(_)), "{text:?}: {e}");
        }
        let p = file(d.path(), header(NOW, 99).as_bytes());
        assert_eq!(read(&at(&p), NOW).unwrap_err(), Ignored::Format(99));
        let p = file(d.path(), header(NOW + 3_600_000, FORMAT).as_bytes());
        assert!(matches!(
            read(&at(&p), NOW).unwrap_err(),
            Ignored::Future(_)
        ));
        let p = file(d.path(), header(NOW - 2 * 3_600_000, FORMAT).as_bytes());
        assert!(matches!(
            read(&at(&p), NOW).unwrap_err(),
            Ignored::TooOld(_)
        ));
        // Slightly ahead (clocks) is fine.
        let p = file(d.path(), header(NOW + 1_000, FORMAT).as_bytes());
        assert!(read(&at(&p), NOW).unwrap().is_some());
        let big = vec![b' '; MAX_BYTES as usize + 1];
        let p = file(d.path(), &big);
        assert!(matches!(
            read(&at(&p), NOW).unwrap_err(),
            Ignored::TooLarge(_)
        ));
        let e = tempfile::tempdir().unwrap();
        let sub = e.path().join("state.json");
        std::fs::create_dir(&sub).unwrap();
        assert_eq!(read(&at(&sub), NOW).unwrap_err(), Ignored::NotAFile);
    }

    // Issue 41: the state file is read only if the agent's user wrote it, never through a
    // link (a planted one made a healthy engine read `abnormal` at start).
    #[test]
    fn a_link_or_another_users_file_is_not_read() {
        let d = tempfile::tempdir().unwrap();
        let good = d.path().join("good.json");
        std::fs::write(&good, header(NOW, FORMAT)).unwrap();
        let held = Place::open(d.path(), "[agent] state_dir", "good.json").unwrap();
        assert!(read(&held, NOW).unwrap().is_some());
        let p = d.path().join("state.json");
        std::os::unix::fs::symlink(&good, &p).unwrap();
        assert_eq!(read(&at(&p), NOW).unwrap_err(), Ignored::Link);
        if !rustix::process::geteuid().is_root() {
            eprintln!("note: not root, so no file of another user to read; skipped that part");
            return;
        }
        std::fs::remove_file(&p).unwrap();
        std::fs::write(&p, header(NOW, FORMAT)).unwrap();
        std::os::unix::fs::chown(&p, Some(4_000_000), None).unwrap();
        assert_eq!(
            read(&at(&p), NOW).unwrap_err(),
            Ignored::NotOwned {
                owner: 4_000_000,
                me: 0
            }
        );
    }

    // Issue 41: a link planted at the temporary path made the agent (root) overwrite the
    // file it pointed to. The link is removed, not written through, and a leftover file of
    // the same name (this pid's, from before a crash) is replaced.
    #[test]
    fn what_is_at_the_temporary_path_is_replaced_never_written_through() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("state.json");
        let victim = d.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        std::os::unix::fs::symlink(&victim, tmp_path(&p)).unwrap();
        write(&at(&p), &[]).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert!(std::fs::symlink_metadata(&p).unwrap().is_file());
        assert!(read(&at(&p), crate::clock::unix_ms()).unwrap().is_some());
        assert!(!tmp_path(&p).exists());
        std::fs::write(tmp_path(&p), "left by a crash").unwrap();
        write(&at(&p), &[]).unwrap();
        assert!(read(&at(&p), crate::clock::unix_ms()).unwrap().is_some());
        assert!(!tmp_path(&p).exists());
    }

    #[test]
    fn a_temporary_file_is_the_state_files_name_a_pid_and_tmp() {
        for (name, want) in [
            ("state.json.123.tmp", true),
            ("state.json.1.tmp", true),
            ("state.json..tmp", false),
            ("state.json.12a.tmp", false),
            ("state.json.123.tmp.x", false),
            ("state.json", false),
            ("other.json.123.tmp", false),
            ("xstate.json.123.tmp", false),
        ] {
            assert_eq!(
                is_tmp_of(name.as_ref(), "state.json".as_ref()),
                want,
                "{name}"
            );
        }
    }

    // Issue 41: 30 crashes mid-write left 29 temporary files, up to 4 MiB each, and nothing
    // removed them. At start every one goes (any pid, a link too), and nothing else.
    #[test]
    fn stale_temporary_files_of_any_pid_are_removed_and_counted() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("state.json");
        write(&at(&p), &[]).unwrap();
        std::fs::write(d.path().join("state.json.123.tmp"), [b'x'; 100]).unwrap();
        std::fs::write(d.path().join("state.json.4567.tmp"), [b'x'; 20]).unwrap();
        let victim = d.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        std::os::unix::fs::symlink(&victim, d.path().join("state.json.9.tmp")).unwrap();
        std::fs::create_dir(d.path().join("state.json.8.tmp")).unwrap();
        for keep in ["state.json.x.tmp", "other.json.1.tmp"] {
            std::fs::write(d.path().join(keep), "").unwrap();
        }
        assert_eq!(
            remove_stale(&at(&p)),
            Ok(Removed {
                files: 3,
                bytes: 120
            })
        );
        let mut left: Vec<String> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                "other.json.1.tmp",
                "state.json",
                "state.json.8.tmp",
                "state.json.x.tmp",
                "victim"
            ]
        );
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert_eq!(remove_stale(&at(&p)), Ok(Removed::default()));
    }

    #[test]
    fn an_entry_is_used_only_for_the_engine_at_its_address() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("state.json");
        let text = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/state-v1.json"),
        )
        .unwrap();
        let mut f: StateFile = serde_json::from_str(&text).unwrap();
        f.saved_at_unix_ms = crate::clock::unix_ms();
        std::fs::write(&p, serde_json::to_vec(&f).unwrap()).unwrap();
        let mut found = load(&at(&p));
        assert_eq!(found.len(), 1);
        assert!(found.take("e2e", "http://127.0.0.1:1").is_none());
        let mut found = load(&at(&p));
        assert!(found.take("other", "http://127.0.0.1:8000").is_none());
        assert_eq!(found.left(), vec!["e2e"]);
        let s = found.take("e2e", "http://127.0.0.1:8000").unwrap();
        assert!(s.vi.abnormal);
        assert_eq!(s.vi.failure_count, 6);
    }

    /// The file at `p` once `done` holds of it (for at most 10 s).
    async fn read_when(p: &Path, done: impl Fn(&StateFile) -> bool) -> StateFile {
        for _ in 0..500 {
            if let Ok(Some(f)) = read(&at(p), crate::clock::unix_ms())
                && done(&f)
            {
                return f;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("the state file never showed the change");
    }

    // The persister writes when an engine's state changes, not when only the time goes on.
    #[tokio::test]
    async fn the_persister_writes_on_change_only() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("state.json");
        let state = std::sync::Arc::new(std::sync::Mutex::new(Vec::<EngineState>::new()));
        let s2 = state.clone();
        let per = Persister::start(at(&p), Box::new(move || s2.lock().unwrap().clone()));
        let first = read_when(&p, |_| true).await;
        tokio::time::sleep(CHECK_EVERY * 5).await;
        let again = read(&at(&p), crate::clock::unix_ms()).unwrap().unwrap();
        assert_eq!(
            first.saved_at_unix_ms, again.saved_at_unix_ms,
            "no change, no write"
        );
        let text = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/state-v1.json"),
        )
        .unwrap();
        let f: StateFile = serde_json::from_str(&text).unwrap();
        *state.lock().unwrap() = f.engines.clone();
        // (Compared as JSON: a probe's monotonic time is not part of the file.)
        let want = serde_json::to_value(&f.engines).unwrap();
        let changed = read_when(&p, |g| serde_json::to_value(&g.engines).unwrap() == want).await;
        assert!(changed.saved_at_unix_ms >= first.saved_at_unix_ms);
        per.finish().await.unwrap();
    }
    // Issue 48, R11: the state directory was checked at start only, and written through its
    // path: once a parent became writable by others, they could swap the directory for a
    // link to another place while the agent ran, and its writes went there. Held open, the
    // directory checked gets every write, the other place none, and the doubt is said.
    #[tokio::test]
    async fn a_state_directory_swapped_for_a_link_after_start_gets_no_write_through_it() {
        let d = tempfile::tempdir().unwrap();
        let base = d.path().canonicalize().unwrap();
        let dir = base.join("state");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .unwrap();
        let elsewhere = base.join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        let place = Place::open(&dir, "[agent] state_dir", "state.json").unwrap();
        assert_eq!(place.doubt(), None);
        let text = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/state-v1.json"),
        )
        .unwrap();
        let engines = serde_json::from_str::<StateFile>(&text).unwrap().engines;
        let state = Arc::new(std::sync::Mutex::new(Vec::<EngineState>::new()));
        let s2 = state.clone();
        let per = Persister::start(place.clone(), Box::new(move || s2.lock().unwrap().clone()));
        let moved = base.join("moved");
        read_when(&dir.join("state.json"), |_| true).await;
        // The swap: the directory moved away, a link to another place in its path.
        std::fs::rename(&dir, &moved).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &dir).unwrap();
        *state.lock().unwrap() = engines.clone();
        let want = serde_json::to_value(&engines).unwrap();
        read_when(&moved.join("state.json"), |f| {
            serde_json::to_value(&f.engines).unwrap() == want
        })
        .await;
        per.finish().await.unwrap();
        assert_eq!(remove_stale(&place), Ok(Removed::default()));
        let there: Vec<_> = std::fs::read_dir(&elsewhere).unwrap().collect();
        assert!(there.is_empty(), "written through the link: {there:?}");
        let doubt = place.doubt().expect("the path leads elsewhere now");
        assert!(
            doubt.contains("is no longer the directory the agent opened at start"),
            "{doubt}"
        );
    }
}

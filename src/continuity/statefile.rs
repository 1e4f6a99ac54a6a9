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

use crate::monitor::saved::EngineState;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The file format this agent writes and reads.
pub const FORMAT: u32 = 1;
/// The largest file written or read (a few KiB per engine in practice).
pub const MAX_BYTES: u64 = 4 * 1024 * 1024;
/// A file older than this is ignored: the agent was down long enough that Node Manager has
/// acted on what it saw, and the engine has been restarted or replaced since.
pub const MAX_AGE: Duration = Duration::from_secs(3600);
/// A file dated more than this ahead of the clock is ignored (written by a clock that has
/// since been stepped back, or not by this agent).
pub const FUTURE_SLACK: Duration = Duration::from_secs(30);
/// How often the persister compares the state with what it last wrote.
pub const CHECK_EVERY: Duration = Duration::from_millis(100);

/// The file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StateFile {
    pub format: u32,
    /// The agent version that wrote it.
    pub agent: String,
    pub pid: u32,
    pub saved_at_unix_ms: u64,
    pub engines: Vec<EngineState>,
}

/// What was found at start.
#[derive(Debug, Default)]
pub struct Found {
    engines: HashMap<String, EngineState>,
    /// How old the file was.
    pub age: Option<Duration>,
}

impl Found {
    /// Nothing (no file, or a file ignored).
    pub fn none() -> Found {
        Found::default()
    }

    /// How many engines it holds.
    pub fn len(&self) -> usize {
        self.engines.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.engines.is_empty()
    }

    /// The saved state of the engine named `name` at `engine_url`; an entry for that name
    /// at another address is dropped with a log line.
    pub fn take(&mut self, name: &str, engine_url: &str) -> Option<EngineState> {
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
    pub fn left(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.engines.keys().map(String::as_str).collect();
        v.sort_unstable();
        v
    }
}

/// Why a file was ignored.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Ignored {
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

/// Reads the file at `path`; `Ok(None)` when there is none.
pub fn read(path: &Path, now_unix_ms: u64) -> Result<Option<StateFile>, Ignored> {
    use rustix::fs::OFlags;
    // No link followed, no wait for a FIFO's writer; what is checked is what was opened.
    let flags = OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY;
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags.bits() as i32)
        .open(path)
    {
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
    if meta.uid() != me {
        return Err(Ignored::NotOwned {
            owner: meta.uid(),
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

/// What the agent finds at `path` at start, with one log line for a file it ignores.
pub fn load(path: &Path) -> Found {
    let now = crate::clock::unix_ms();
    match read(path, now) {
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
            Found {
                engines,
                age: Some(age),
            }
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

/// Writes `engines` to `path` atomically (a temporary file beside it, then a rename).
pub fn write(path: &Path, engines: &[EngineState]) -> Result<(), String> {
    let bytes = render(engines)?;
    let tmp = tmp_path(path);
    let result = (|| {
        let mut f = create_new(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_data()?;
        std::fs::rename(&tmp, path)
    })();
    result.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("cannot write {}: {e}", path.display())
    })
}

/// A new file at `tmp`, mode 0600: never one that was there, never through a link. What is
/// in the way (this pid's leftover from before a crash, or anything else) is removed (an
/// unlink, which does not follow a link) and the creation tried once more.
fn create_new(tmp: &Path) -> std::io::Result<std::fs::File> {
    let open = || {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(tmp)
    };
    match open() {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            std::fs::remove_file(tmp)?;
            open()
        }
        r => r,
    }
}

/// The temporary file this process writes `path` through: `<name>.<pid>.tmp`.
fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_owned();
    name.push(format!(".{}.tmp", std::process::id()));
    path.with_file_name(name)
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
pub struct Removed {
    pub files: usize,
    /// Their size (a link counts 0).
    pub bytes: u64,
}

/// Removes the temporary files of `path` that writes cut short left beside it (a crash
/// between the creation and the rename), whatever pid wrote them. For a start, once no
/// other agent writes there.
pub fn remove_stale(path: &Path) -> Result<Removed, String> {
    let (Some(dir), Some(state)) = (path.parent(), path.file_name()) else {
        return Ok(Removed::default());
    };
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
    let mut removed = Removed::default();
    for entry in entries.flatten() {
        if !is_tmp_of(&entry.file_name(), state) {
            continue;
        }
        // Of the entry itself, not of what a link points to.
        let Ok(meta) = entry.metadata() else { continue };
        if meta.is_dir() {
            continue;
        }
        let p = entry.path();
        std::fs::remove_file(&p).map_err(|e| format!("cannot remove {}: {e}", p.display()))?;
        removed.files += 1;
        if meta.is_file() {
            removed.bytes += meta.len();
        }
    }
    Ok(removed)
}

/// Where the states come from: every engine monitored now.
pub type Source = Box<dyn Fn() -> Vec<EngineState> + Send + Sync>;

/// Writes the state file whenever an engine's state changes.
pub struct Persister {
    path: PathBuf,
    source: std::sync::Arc<Source>,
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

/// The engines' part of what was last written (the file's own header changes every time).
type Last = std::sync::Arc<std::sync::Mutex<Option<Vec<u8>>>>;

impl Persister {
    /// Starts checking every [`CHECK_EVERY`].
    pub fn start(path: PathBuf, source: Source) -> Persister {
        let source = std::sync::Arc::new(source);
        let cancel = CancellationToken::new();
        let last: Last = Default::default();
        let task = tokio::spawn(run(path.clone(), source.clone(), last, cancel.clone()));
        Persister {
            path,
            source,
            cancel,
            task,
        }
    }

    /// Stops checking and writes the state as it is now, whatever was written before: the
    /// last word before the process stops or hands over.
    pub async fn finish(self) -> Result<(), String> {
        self.cancel.cancel();
        let _ = self.task.await;
        let (path, source) = (self.path.clone(), self.source.clone());
        tokio::task::spawn_blocking(move || write(&path, &source()))
            .await
            .map_err(|e| format!("the state writer panicked: {e}"))?
    }

    /// The file written.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

async fn run(path: PathBuf, source: std::sync::Arc<Source>, last: Last, cancel: CancellationToken) {
    let mut failing = false;
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
        let p = path.clone();
        let written = tokio::task::spawn_blocking(move || write(&p, &engines))
            .await
            .unwrap_or_else(|e| Err(format!("the state writer panicked: {e}")));
        match written {
            Ok(()) => {
                if failing {
                    tracing::info!("state file {} written again", path.display());
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

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(read(&p, NOW), Ok(None));
        write(&p, &[]).unwrap();
        let f = read(&p, crate::clock::unix_ms()).unwrap().unwrap();
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
            let e = read(&p, NOW).unwrap_err();
            assert!(matches!(e, Ignored::Corrupt(_)), "{text:?}: {e}");
        }
        let p = file(d.path(), header(NOW, 99).as_bytes());
        assert_eq!(read(&p, NOW).unwrap_err(), Ignored::Format(99));
        let p = file(d.path(), header(NOW + 3_600_000, FORMAT).as_bytes());
        assert!(matches!(read(&p, NOW).unwrap_err(), Ignored::Future(_)));
        let p = file(d.path(), header(NOW - 2 * 3_600_000, FORMAT).as_bytes());
        assert!(matches!(read(&p, NOW).unwrap_err(), Ignored::TooOld(_)));
        // Slightly ahead (clocks) is fine.
        let p = file(d.path(), header(NOW + 1_000, FORMAT).as_bytes());
        assert!(read(&p, NOW).unwrap().is_some());
        let big = vec![b' '; MAX_BYTES as usize + 1];
        let p = file(d.path(), &big);
        assert!(matches!(read(&p, NOW).unwrap_err(), Ignored::TooLarge(_)));
        let sub = d.path().join("dir");
        std::fs::create_dir(&sub).unwrap();
        assert_eq!(read(&sub, NOW).unwrap_err(), Ignored::NotAFile);
    }

    // Issue 41: the state file is read only if the agent's user wrote it, never through a
    // link (a planted one made a healthy engine read `abnormal` at start).
    #[test]
    fn a_link_or_another_users_file_is_not_read() {
        let d = tempfile::tempdir().unwrap();
        let good = d.path().join("good.json");
        std::fs::write(&good, header(NOW, FORMAT)).unwrap();
        assert!(read(&good, NOW).unwrap().is_some());
        let p = d.path().join("state.json");
        std::os::unix::fs::symlink(&good, &p).unwrap();
        assert_eq!(read(&p, NOW).unwrap_err(), Ignored::Link);
        if !rustix::process::geteuid().is_root() {
            eprintln!("note: not root, so no file of another user to read; skipped that part");
            return;
        }
        std::fs::remove_file(&p).unwrap();
        std::fs::write(&p, header(NOW, FORMAT)).unwrap();
        std::os::unix::fs::chown(&p, Some(4_000_000), None).unwrap();
        assert_eq!(
            read(&p, NOW).unwrap_err(),
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
        write(&p, &[]).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert!(std::fs::symlink_metadata(&p).unwrap().is_file());
        assert!(read(&p, crate::clock::unix_ms()).unwrap().is_some());
        assert!(!tmp_path(&p).exists());
        std::fs::write(tmp_path(&p), "left by a crash").unwrap();
        write(&p, &[]).unwrap();
        assert!(read(&p, crate::clock::unix_ms()).unwrap().is_some());
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
        write(&p, &[]).unwrap();
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
            remove_stale(&p),
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
        assert_eq!(remove_stale(&p), Ok(Removed::default()));
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
        let mut found = load(&p);
        assert_eq!(found.len(), 1);
        assert!(found.take("e2e", "http://127.0.0.1:1").is_none());
        let mut found = load(&p);
        assert!(found.take("other", "http://127.0.0.1:8000").is_none());
        assert_eq!(found.left(), vec!["e2e"]);
        let s = found.take("e2e", "http://127.0.0.1:8000").unwrap();
        assert!(s.vi.abnormal);
        assert_eq!(s.vi.failure_count, 6);
    }

    /// The file at `p` once `done` holds of it (for at most 10 s).
    async fn read_when(p: &Path, done: impl Fn(&StateFile) -> bool) -> StateFile {
        for _ in 0..500 {
            if let Ok(Some(f)) = read(p, crate::clock::unix_ms())
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
        let per = Persister::start(p.clone(), Box::new(move || s2.lock().unwrap().clone()));
        let first = read_when(&p, |_| true).await;
        tokio::time::sleep(CHECK_EVERY * 5).await;
        let again = read(&p, crate::clock::unix_ms()).unwrap().unwrap();
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
}

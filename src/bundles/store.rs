//! The evidence directory on disk: whether a bundle may be written there now (a directory,
//! writable, not read-only, free space above the floor), the bundle written whole (into
//! `<name>.partial`, renamed when complete, so a reader never sees half of one), and the caps
//! kept (the oldest bundles removed first). Only names this module gave are ever removed: a
//! directory set by mistake to `/var/lib` loses nothing else.

use std::fs;
use std::io::Write;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

/// The caps of the evidence directory (`[agent] evidence_max_bytes`, `evidence_max_count`,
/// `evidence_min_free`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Caps {
    pub max_bytes: u64,
    pub max_count: usize,
    pub min_free: u64,
}

/// Why no bundle can be written now.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StoreError {
    #[error("the evidence directory {0:?} is not a directory")]
    NotADirectory(PathBuf),
    #[error("cannot create the evidence directory {dir:?}: {source}")]
    Create {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("the evidence directory {0:?} is on a read-only file system")]
    ReadOnly(PathBuf),
    #[error(
        "{free} bytes free under the evidence directory {dir:?}, below evidence_min_free ({floor})"
    )]
    BelowFloor { dir: PathBuf, free: u64, floor: u64 },
    #[error("cannot write {path:?}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl StoreError {
    /// The kind of problem, for warning once per kind and for the metric's outcome.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            StoreError::NotADirectory(_) => "not_a_directory",
            StoreError::Create { .. } => "cannot_create",
            StoreError::ReadOnly(_) => "read_only",
            StoreError::BelowFloor { .. } => "below_floor",
            StoreError::Write { .. } => "cannot_write",
        }
    }
}

/// The file system's free space for an unprivileged writer under `dir`, and whether it is
/// mounted read-only (statvfs); `None` when it cannot be asked.
fn space(dir: &Path) -> Option<(u64, bool)> {
    let s = rustix::fs::statvfs(dir).ok()?;
    let ro = s.f_flag.contains(rustix::fs::StatVfsMountFlags::RDONLY);
    Some((s.f_bavail.saturating_mul(s.f_frsize), ro))
}

/// Whether a bundle may be written in `dir` now: created if missing (mode 0750), a
/// directory, on a writable mount, with at least `floor` bytes free.
pub(crate) fn ready(dir: &Path, floor: u64) -> Result<(), StoreError> {
    match fs::metadata(dir) {
        Ok(m) if !m.is_dir() => return Err(StoreError::NotADirectory(dir.to_owned())),
        Ok(_) => {}
        Err(_) => fs::DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(dir)
            .map_err(|source| StoreError::Create {
                dir: dir.to_owned(),
                source,
            })?,
    }
    if let Some((free, ro)) = space(dir) {
        if ro {
            return Err(StoreError::ReadOnly(dir.to_owned()));
        }
        if free < floor {
            return Err(StoreError::BelowFloor {
                dir: dir.to_owned(),
                free,
                floor,
            });
        }
    }
    Ok(())
}

/// Writes `parts` (file name, bytes) as the bundle `dir/name`: into `name.partial`, renamed
/// once every part is written. Its path and size; nothing is left behind on an error.
pub(crate) fn write(
    dir: &Path,
    name: &str,
    parts: &[(String, Vec<u8>)],
) -> Result<(PathBuf, u64), StoreError> {
    let partial = dir.join(format!("{name}.partial"));
    let done = dir.join(name);
    let written = write_parts(&partial, parts).and_then(|bytes| {
        fs::rename(&partial, &done)
            .map(|()| bytes)
            .map_err(|source| StoreError::Write {
                path: done.clone(),
                source,
            })
    });
    if written.is_err() {
        let _ = fs::remove_dir_all(&partial);
    }
    Ok((done, written?))
}

fn write_parts(at: &Path, parts: &[(String, Vec<u8>)]) -> Result<u64, StoreError> {
    let failed = |path: &Path| {
        let path = path.to_owned();
        move |source| StoreError::Write { path, source }
    };
    fs::DirBuilder::new()
        .mode(0o750)
        .create(at)
        .map_err(failed(at))?;
    let mut bytes = 0;
    for (file, body) in parts {
        let path = at.join(file);
        let mut f = fs::File::create(&path).map_err(failed(&path))?;
        f.write_all(body).map_err(failed(&path))?;
        bytes += body.len() as u64;
    }
    Ok(bytes)
}

/// Whether `name` is one this module gave: a bundle (`<13 digits>-…`) or one left half
/// written by an agent that died while writing it (`….partial`).
fn ours(name: &str) -> bool {
    let b = name.as_bytes();
    b.len() > 14 && b[..13].iter().all(u8::is_ascii_digit) && b[13] == b'-'
}

/// The size of the bundle at `p` (its files; a bundle holds no sub-directory).
fn size(p: &Path) -> u64 {
    fs::read_dir(p)
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// Keeps `dir` within `caps`: removes bundles left half written, then the oldest bundles
/// (their names start with the time they were written) until both the count and the bytes
/// are within the caps. `keep`, the bundle just written, is never removed. What was removed.
pub(crate) fn prune(dir: &Path, caps: Caps, keep: &Path) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut bundles: Vec<(String, PathBuf)> = entries
        .flatten()
        .filter_map(|e| Some((e.file_name().into_string().ok()?, e.path())))
        .filter(|(n, _)| ours(n))
        .collect();
    bundles.sort();
    let mut removed = Vec::new();
    bundles.retain(|(n, p)| {
        let half = n.ends_with(".partial");
        if half && fs::remove_dir_all(p).is_ok() {
            removed.push(p.clone());
        }
        !half
    });
    let mut sized: Vec<(PathBuf, u64)> = bundles
        .into_iter()
        .map(|(_, p)| {
            let s = size(&p);
            (p, s)
        })
        .collect();
    let mut total: u64 = sized.iter().map(|(_, s)| s).sum();
    let mut i = 0;
    while i < sized.len() && (sized.len() > caps.max_count || total > caps.max_bytes) {
        if sized[i].0 == keep {
            i += 1;
            continue;
        }
        let (p, s) = sized.remove(i);
        if fs::remove_dir_all(&p).is_ok() {
            total -= s;
            removed.push(p);
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAPS: Caps = Caps {
        max_bytes: 1 << 20,
        max_count: 3,
        min_free: 0,
    };

    fn bundle(dir: &Path, at: u64, bytes: usize) -> PathBuf {
        let parts = vec![("a.txt".to_owned(), vec![b'x'; bytes])];
        write(dir, &format!("{at:013}-e-abnormal"), &parts)
            .unwrap()
            .0
    }

    #[test]
    fn the_oldest_bundles_go_first_when_the_count_cap_is_passed() {
        let d = tempfile::tempdir().unwrap();
        let all: Vec<PathBuf> = (1..=5).map(|t| bundle(d.path(), t, 10)).collect();
        let removed = prune(d.path(), CAPS, &all[4]);
        assert_eq!(removed, all[..2].to_vec());
        for p in &all[2..] {
            assert!(p.is_dir(), "{p:?} was removed");
        }
    }

    #[test]
    fn the_oldest_bundles_go_first_when_the_byte_cap_is_passed_but_never_the_new_one() {
        let d = tempfile::tempdir().unwrap();
        let caps = Caps {
            max_bytes: 250,
            ..CAPS
        };
        let old = bundle(d.path(), 1, 100);
        let mid = bundle(d.path(), 2, 100);
        let new = bundle(d.path(), 3, 100);
        assert_eq!(prune(d.path(), caps, &new), vec![old]);
        assert!(mid.is_dir() && new.is_dir());
        // A new bundle over the cap by itself stays: the older ones go.
        let huge = bundle(d.path(), 4, 400);
        assert_eq!(prune(d.path(), caps, &huge), vec![mid, new]);
        assert!(huge.is_dir());
    }

    #[test]
    fn pruning_removes_half_written_bundles_and_nothing_it_did_not_write() {
        let d = tempfile::tempdir().unwrap();
        let theirs = d.path().join("important");
        fs::create_dir(&theirs).unwrap();
        fs::write(d.path().join("0000000000001-notes.txt"), "x").unwrap();
        let half = d.path().join("0000000000002-e-abnormal.partial");
        fs::create_dir(&half).unwrap();
        let b = bundle(d.path(), 3, 10);
        let caps = Caps {
            max_count: 1,
            ..CAPS
        };
        let removed = prune(d.path(), caps, &b);
        assert!(removed.contains(&half), "{removed:?}");
        assert!(theirs.is_dir() && b.is_dir());
    }

    #[test]
    fn a_bundle_is_written_whole_under_its_name_with_its_size() {
        let d = tempfile::tempdir().unwrap();
        let parts = vec![
            ("one.txt".to_owned(), b"12345".to_vec()),
            ("two.json".to_owned(), b"{}".to_vec()),
        ];
        let (p, bytes) = write(d.path(), "0000000000001-e-abnormal", &parts).unwrap();
        assert_eq!(bytes, 7);
        assert_eq!(fs::read_to_string(p.join("one.txt")).unwrap(), "12345");
        assert!(!d.path().join("0000000000001-e-abnormal.partial").exists());
    }

    #[test]
    fn an_evidence_directory_that_is_a_file_is_refused_by_name() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("evidence");
        fs::write(&f, "not a directory").unwrap();
        let e = ready(&f, 0).unwrap_err();
        assert_eq!(e.kind(), "not_a_directory");
        assert!(e.to_string().contains("evidence"), "{e}");
    }

    #[test]
    fn a_missing_evidence_directory_is_created() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("a/evidence");
        ready(&dir, 0).unwrap();
        assert!(dir.is_dir());
    }

    #[test]
    fn nothing_is_written_while_free_space_is_below_the_floor() {
        let d = tempfile::tempdir().unwrap();
        let e = ready(d.path(), u64::MAX).unwrap_err();
        assert_eq!(e.kind(), "below_floor");
        assert!(e.to_string().contains("evidence_min_free"), "{e}");
    }

    #[test]
    fn a_read_only_mount_is_refused() {
        // A real read-only mount: `NPU_HEALTH_TEST_RO_MOUNT` names one (e.g. as root:
        // `mount -t tmpfs -o ro none /tmp/ro`), else /proc/sys or /sys where a container
        // mounts them read-only; none found, nothing is proved here (and it says so).
        let named = std::env::var_os("NPU_HEALTH_TEST_RO_MOUNT").map(PathBuf::from);
        let ro = named
            .into_iter()
            .chain(["/proc/sys", "/sys"].into_iter().map(PathBuf::from))
            .find(|p| space(p).is_some_and(|(_, ro)| ro));
        match ro {
            Some(p) => assert_eq!(ready(&p, 0).unwrap_err().kind(), "read_only", "{p:?}"),
            None => eprintln!("no read-only mount found: not proved here"),
        }
    }

    #[test]
    fn a_directory_that_cannot_be_written_fails_and_leaves_nothing() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("locked");
        fs::create_dir(&dir).unwrap();
        fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o555)).unwrap();
        let parts = vec![("a.txt".to_owned(), b"x".to_vec())];
        let got = write(&dir, "0000000000001-e-abnormal", &parts);
        if rustix::process::geteuid().is_root() {
            // Root writes through mode bits: what CI can prove is the read-only mount above.
            assert!(got.is_ok());
        } else {
            assert_eq!(got.unwrap_err().kind(), "cannot_write");
            assert_eq!(fs::read_dir(&dir).unwrap().count(), 0);
        }
    }
}

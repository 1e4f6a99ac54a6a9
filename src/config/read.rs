//! Reading the files a configuration names: `agent.toml`, MindIE's `user_config.json` and
//! `env.json`, the TLS material, and MindCluster's `faultCode.json` (`fault_code_file`, read
//! by the driver's `fault_levels`). Regular files only (a symlink to one is fine), at most
//! [`MAX_BYTES`].
//!
//! Why not `std::fs::read`: opening a FIFO blocks until a writer appears, so a FIFO named as
//! the config wedged a SIGHUP reload and with it the signal loop (SIGTERM was never seen);
//! `/dev/zero` never ends. The file is opened with `O_NONBLOCK` (no wait for a FIFO's writer),
//! its type is checked on the opened handle (no window between a check and the open), and at
//! most `MAX_BYTES + 1` bytes are read whatever the metadata claims (`/proc` files say 0).

use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// Largest file the configuration layer reads: 4 MiB, far above any real config or
/// certificate chain.
pub(crate) const MAX_BYTES: u64 = 4 << 20;

/// The bytes of the regular file at `path`; the error says why not (without the path: the
/// caller names it).
pub(crate) fn bytes(path: &Path) -> Result<Vec<u8>, String> {
    let flags = (rustix::fs::OFlags::NONBLOCK | rustix::fs::OFlags::NOCTTY).bits();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags as i32)
        .open(path)
        .map_err(|e| format!("cannot read: {e}"))?;
    let kind = file
        .metadata()
        .map_err(|e| format!("cannot read: {e}"))?
        .file_type();
    if !kind.is_file() {
        return Err(format!(
            "is {}, not a regular file; only a regular file (or a symlink to one) is read",
            describe(kind)
        ));
    }
    let mut data = Vec::new();
    file.take(MAX_BYTES + 1)
        .read_to_end(&mut data)
        .map_err(|e| format!("cannot read: {e}"))?;
    if data.len() as u64 > MAX_BYTES {
        return Err(format!(
            "is larger than {} MiB, the limit for a config file",
            MAX_BYTES >> 20
        ));
    }
    Ok(data)
}

/// Longest bearer token file read.
pub(crate) const MAX_TOKEN_FILE: u64 = 4096;
/// Shortest bearer token accepted.
pub(crate) const MIN_TOKEN: usize = 16;

/// A bearer token file (`[agent] admin_token_file`, `[agent.kubernetes] token_file`), read
/// the same way for both: the file's content without surrounding whitespace (a final newline
/// is fine), a regular file ([`bytes`]) of at most [`MAX_TOKEN_FILE`] bytes, the token at
/// least [`MIN_TOKEN`] printable characters without spaces. The error names the file.
pub(crate) fn token(path: &Path) -> Result<Vec<u8>, String> {
    let raw = bytes(path).map_err(|e| format!("{} {e}", path.display()))?;
    if raw.len() as u64 > MAX_TOKEN_FILE {
        return Err(format!(
            "{} is larger than {MAX_TOKEN_FILE} bytes",
            path.display()
        ));
    }
    let token = raw.trim_ascii().to_vec();
    if token.len() < MIN_TOKEN || token.iter().any(|b| !b.is_ascii_graphic()) {
        return Err(format!(
            "{} must hold one token of at least {MIN_TOKEN} printable characters, without spaces",
            path.display()
        ));
    }
    Ok(token)
}

/// The file at `path` as UTF-8 text (see [`bytes`]).
pub(crate) fn text(path: &Path) -> Result<String, String> {
    String::from_utf8(bytes(path)?).map_err(|e| format!("is not UTF-8 text: {e}"))
}

fn describe(kind: std::fs::FileType) -> &'static str {
    if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

/// Makes a FIFO at `p` (owner read and write), for the tests that show nothing waits on one.
#[cfg(test)]
pub(crate) fn mkfifo(p: &Path) {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        p,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR,
        0,
    )
    .unwrap();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_files_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("token");
        std::fs::write(&p, "  0123456789abcdef\n").unwrap();
        assert_eq!(token(&p).unwrap(), b"0123456789abcdef");
        for (text, why) in [
            ("short", "at least 16"),
            ("0123456789 abcdef", "without spaces"),
        ] {
            std::fs::write(&p, text).unwrap();
            let e = token(&p).unwrap_err();
            assert!(e.contains(why), "{e}");
        }
        std::fs::write(&p, "x".repeat(5000)).unwrap();
        assert!(token(&p).unwrap_err().contains("larger than 4096"));
        assert!(
            token(dir.path())
                .unwrap_err()
                .contains("not a regular file")
        );
        assert!(
            token(&dir.path().join("absent"))
                .unwrap_err()
                .contains("cannot read")
        );
    }

    #[test]
    fn a_regular_file_and_a_symlink_to_one_are_read() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("a.toml");
        std::fs::write(&f, "x = 1\n").unwrap();
        std::os::unix::fs::symlink(&f, d.path().join("link.toml")).unwrap();
        assert_eq!(text(&f).unwrap(), "x = 1\n");
        assert_eq!(text(&d.path().join("link.toml")).unwrap(), "x = 1\n");
    }

    #[test]
    fn devices_fifos_and_directories_are_refused_without_reading() {
        let d = tempfile::tempdir().unwrap();
        let fifo = d.path().join("fifo");
        mkfifo(&fifo);
        // No writer: a blocking open would never return.
        assert!(text(&fifo).unwrap_err().contains("is a FIFO"));
        assert!(
            text(Path::new("/dev/zero"))
                .unwrap_err()
                .contains("is a character device")
        );
        assert!(text(d.path()).unwrap_err().contains("is a directory"));
        assert!(
            text(&d.path().join("absent"))
                .unwrap_err()
                .contains("cannot read")
        );
    }

    #[test]
    fn the_cap_holds_whatever_the_size() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("big");
        std::fs::write(&f, vec![b'#'; MAX_BYTES as usize]).unwrap();
        assert_eq!(bytes(&f).unwrap().len() as u64, MAX_BYTES);
        std::fs::write(&f, vec![b'#'; MAX_BYTES as usize + 1]).unwrap();
        assert!(bytes(&f).unwrap_err().contains("larger than 4 MiB"));
    }
}

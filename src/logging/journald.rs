//! journald's native protocol: one datagram per event on `/run/systemd/journal/socket`, each
//! field a `NAME=value` line (values with a newline use the length-prefixed form).
//!
//! Event fields become journal fields in upper case (`engine` → `ENGINE=`, `device` →
//! `DEVICE=`, `verdict` → `VERDICT=`), so `journalctl -u npu-health-agent ENGINE=prefill-0`
//! selects one engine's lines.
//!
//! This layer is ours rather than `tracing-journald`'s: that crate (0.3) sends to the fixed
//! `/run/systemd/journal/socket` and cannot be pointed at another ([`SOCKET_ENV`]: the tests'
//! journal, a journald in a container at another path): its `Layer::new` takes no path
//! (tracing-journald 0.3.2). Its fields otherwise match
//! these with `with_field_prefix(None)`, except that it leaves a field named like a journal
//! field (`priority`, `message`) unprefixed, so it would be sent twice.

use super::format::Fields;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::Context;

/// journald's socket.
pub(crate) const DEFAULT_SOCKET: &str = "/run/systemd/journal/socket";
/// Overrides the socket path (tests; a journald in a container at another path).
pub const SOCKET_ENV: &str = "NPU_HEALTH_AGENT_JOURNAL_SOCKET";
/// `SYSLOG_IDENTIFIER=` of every entry.
pub(crate) const IDENTIFIER: &str = "npu-health-agent";
/// A message longer than this is cut when the datagram is too large for the socket.
const TRUNCATE_AT: usize = 8 * 1024;

/// The output layer writing to journald.
#[derive(Debug)]
pub(crate) struct Journald {
    sock: UnixDatagram,
}

impl Journald {
    /// Connects to journald's socket (or the one named by [`SOCKET_ENV`]).
    pub(crate) fn connect() -> Result<Journald, String> {
        let path = std::env::var_os(SOCKET_ENV)
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| DEFAULT_SOCKET.into());
        Journald::connect_to(Path::new(&path))
    }

    /// Connects to the journal socket at `path`.
    pub(crate) fn connect_to(path: &Path) -> Result<Journald, String> {
        let sock = UnixDatagram::unbound().map_err(|e| format!("cannot make a socket: {e}"))?;
        sock.connect(path)
            .map_err(|e| format!("journald is not reachable at {}: {e}", path.display()))?;
        Ok(Journald { sock })
    }

    /// Sends one entry; a message too large for a datagram is cut and sent again.
    pub(crate) fn send(&self, e: &JournalEntry<'_>) -> std::io::Result<()> {
        match self.sock.send(&encode(e, usize::MAX)) {
            Err(err) if err.raw_os_error() == Some(libc_emsgsize()) => {
                self.sock.send(&encode(e, TRUNCATE_AT)).map(|_| ())
            }
            other => other.map(|_| ()),
        }
    }
}

impl<S: Subscriber> Layer<S> for Journald {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let meta = event.metadata();
        let mut fields = Fields::default();
        event.record(&mut fields);
        let entry = JournalEntry {
            level: *meta.level(),
            target: meta.target(),
            file: meta.file(),
            line: meta.line(),
            fields: &fields,
        };
        if let Err(e) = self.send(&entry) {
            // journald went away: the line still reaches stderr (the journal stream).
            let mut line = format!(
                "{} {:>5} ",
                humantime::format_rfc3339_micros(std::time::SystemTime::now()),
                entry.level.as_str()
            );
            let _ = fields.write_text(&mut line);
            eprintln!("{line} (journald: {e})");
        }
    }
}

/// One journal entry: an event's metadata and fields.
#[derive(Debug, Clone, Copy)]
pub(crate) struct JournalEntry<'a> {
    pub level: Level,
    pub target: &'a str,
    pub file: Option<&'a str>,
    pub line: Option<u32>,
    pub fields: &'a Fields,
}

fn libc_emsgsize() -> i32 {
    rustix::io::Errno::MSGSIZE.raw_os_error()
}

/// syslog priority of a level.
fn priority(l: Level) -> u8 {
    match l {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        _ => 7,
    }
}

/// A journal field name from an event field name: upper case, `[A-Z0-9_]`, not starting
/// with `_` or a digit, at most 64 bytes; names journald or we set are prefixed `FIELD_`.
pub(crate) fn field_name(name: &str) -> String {
    let mut n: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    let reserved = [
        "MESSAGE",
        "PRIORITY",
        "SYSLOG_IDENTIFIER",
        "TARGET",
        "CODE_FILE",
        "CODE_LINE",
        "MESSAGE_ID",
        "ERRNO",
        "SYSLOG_FACILITY",
        "SYSLOG_PID",
        "CODE_FUNC",
    ];
    if n.is_empty()
        || n.starts_with('_')
        || n.starts_with(|c: char| c.is_ascii_digit())
        || reserved.contains(&n.as_str())
    {
        n = format!("FIELD_{}", n.trim_start_matches('_'));
    }
    n.truncate(64);
    n
}

fn put(out: &mut Vec<u8>, name: &str, value: &str) {
    out.extend_from_slice(name.as_bytes());
    if value.contains('\n') {
        out.push(b'\n');
        out.extend_from_slice(&(value.len() as u64).to_le_bytes());
        out.extend_from_slice(value.as_bytes());
    } else {
        out.push(b'=');
        out.extend_from_slice(value.as_bytes());
    }
    out.push(b'\n');
}

/// The datagram of one entry, the message cut to `max_message` bytes.
pub(crate) fn encode(e: &JournalEntry<'_>, max_message: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    let mut message = e.fields.message.as_str();
    if message.len() > max_message {
        let mut end = max_message;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message = &message[..end];
    }
    put(&mut out, "MESSAGE", message);
    put(&mut out, "PRIORITY", &priority(e.level).to_string());
    put(&mut out, "SYSLOG_IDENTIFIER", IDENTIFIER);
    put(&mut out, "TARGET", e.target);
    if let Some(f) = e.file {
        put(&mut out, "CODE_FILE", f);
    }
    if let Some(l) = e.line {
        put(&mut out, "CODE_LINE", &l.to_string());
    }
    for (k, v) in &e.fields.fields {
        put(&mut out, &field_name(k), &v.to_string());
    }
    out
}

/// Parses a datagram back into fields (tests, and the `journald` test sink).
pub fn decode(mut b: &[u8]) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let nl = b
            .iter()
            .position(|&c| c == b'\n')
            .ok_or("entry without a final newline")?;
        let line = &b[..nl];
        if let Some(eq) = line.iter().position(|&c| c == b'=') {
            out.push((
                String::from_utf8_lossy(&line[..eq]).into_owned(),
                String::from_utf8_lossy(&line[eq + 1..]).into_owned(),
            ));
            b = &b[nl + 1..];
        } else {
            let name = String::from_utf8_lossy(line).into_owned();
            let rest = &b[nl + 1..];
            if rest.len() < 8 {
                return Err(format!("field {name}: length missing"));
            }
            let len = u64::from_le_bytes(rest[..8].try_into().unwrap_or_default()) as usize;
            let value = rest
                .get(8..8 + len)
                .ok_or_else(|| format!("field {name}: value shorter than {len}"))?;
            if rest.get(8 + len) != Some(&b'\n') {
                return Err(format!("field {name}: no newline after the value"));
            }
            out.push((name, String::from_utf8_lossy(value).into_owned()));
            b = &rest[8 + len + 1..];
        }
    }
    Ok(out)
}

/// Whether stderr is connected to the journal: systemd sets `JOURNAL_STREAM=<dev>:<inode>`
/// of the stream it gave the service; a child whose stderr was redirected does not match.
pub(crate) fn stderr_is_journal() -> bool {
    let Some(v) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = v.to_str().and_then(|s| s.split_once(':')) else {
        return false;
    };
    let (Ok(dev), Ok(ino)) = (dev.parse::<u64>(), ino.parse::<u64>()) else {
        return false;
    };
    match rustix::fs::fstat(std::io::stderr()) {
        Ok(st) => st.st_dev == dev && st.st_ino == ino,
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logging::format::FieldValue;
    use std::time::Duration;

    fn fields(message: &str) -> Fields {
        Fields {
            message: message.into(),
            fields: vec![
                ("engine", FieldValue::Text("prefill-0".into())),
                ("verdict", FieldValue::Text("abnormal".into())),
                ("device", FieldValue::U64(3)),
                ("message", FieldValue::Text("clash".into())),
                ("_private", FieldValue::Text("x".into())),
            ],
        }
    }

    fn entry(fields: &Fields) -> JournalEntry<'_> {
        JournalEntry {
            level: Level::WARN,
            target: "npu_health_agent::engine",
            file: Some("src/engine.rs"),
            line: Some(42),
            fields,
        }
    }

    #[test]
    fn fields_round_trip_including_multi_line_values() {
        let f = fields("line one\nline two");
        let d = decode(&encode(&entry(&f), usize::MAX)).unwrap();
        let get = |k: &str| d.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("MESSAGE"), Some("line one\nline two"));
        assert_eq!(get("PRIORITY"), Some("4"));
        assert_eq!(get("SYSLOG_IDENTIFIER"), Some("npu-health-agent"));
        assert_eq!(get("ENGINE"), Some("prefill-0"));
        assert_eq!(get("VERDICT"), Some("abnormal"));
        assert_eq!(get("DEVICE"), Some("3"));
        assert_eq!(get("FIELD_MESSAGE"), Some("clash"));
        assert_eq!(get("FIELD_PRIVATE"), Some("x"));
        assert_eq!(get("CODE_FILE"), Some("src/engine.rs"));
        assert_eq!(get("CODE_LINE"), Some("42"));
    }

    #[test]
    fn long_messages_are_cut_on_a_character_boundary() {
        let f = fields(&"é".repeat(10));
        let d = decode(&encode(&entry(&f), 5)).unwrap();
        assert_eq!(d[0].1, "éé");
    }

    #[test]
    fn names_are_valid_journal_fields() {
        assert_eq!(field_name("device"), "DEVICE");
        assert_eq!(field_name("a.b-c"), "A_B_C");
        assert_eq!(field_name("9x"), "FIELD_9X");
        assert_eq!(field_name("priority"), "FIELD_PRIORITY");
        assert!(field_name(&"x".repeat(100)).len() <= 64);
    }

    #[test]
    fn truncated_datagrams_are_rejected() {
        assert!(decode(b"MESSAGE=x").is_err());
        assert!(decode(b"MESSAGE\n\x05\0\0\0\0\0\0\0ab\n").is_err());
    }

    // The layer reaches the socket it is pointed at (the reason it is ours: module docs).
    #[test]
    fn the_layer_writes_to_the_socket_it_is_pointed_at() {
        use tracing_subscriber::layer::SubscriberExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal");
        let journal = UnixDatagram::bind(&path).unwrap();
        journal
            .set_read_timeout(Some(Duration::from_millis(2000)))
            .unwrap();
        let mut buf = vec![0u8; 4096];
        let subscriber = tracing_subscriber::registry().with(Journald::connect_to(&path).unwrap());
        tracing::subscriber::with_default(subscriber, || tracing::warn!(engine = "e0", "ours"));
        let n = journal.recv(&mut buf).unwrap();
        let d = decode(&buf[..n]).unwrap();
        assert!(d.contains(&("ENGINE".to_owned(), "e0".to_owned())), "{d:?}");
    }
}

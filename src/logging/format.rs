//! One log event as plain data, and its text and JSON renderings.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime};
use tracing::Level;
use tracing::field::{Field as TField, Visit};

/// A structured field: name and rendered value.
pub type Field = (&'static str, String);

/// One event, rendered once; also the rate limiter's key (the time is not part of it).
#[derive(Debug, Clone)]
pub struct Record {
    pub time: SystemTime,
    pub level: Level,
    pub target: String,
    pub file: Option<&'static str>,
    pub line: Option<u32>,
    pub message: String,
    pub fields: Vec<Field>,
}

impl PartialEq for Record {
    fn eq(&self, o: &Record) -> bool {
        self.level == o.level
            && self.file == o.file
            && self.line == o.line
            && self.target == o.target
            && self.message == o.message
            && self.fields == o.fields
    }
}

impl Eq for Record {}

impl std::hash::Hash for Record {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.level.as_str().hash(h);
        self.file.hash(h);
        self.line.hash(h);
        self.target.hash(h);
        self.message.hash(h);
        self.fields.hash(h);
    }
}

impl Record {
    /// This record, written after `n` identical ones were suppressed.
    pub fn with_suppressed(&self, n: u64) -> Record {
        let mut r = self.clone();
        r.time = SystemTime::now();
        r.message = format!(
            "{} ({n} identical lines suppressed before this one)",
            r.message
        );
        r.fields.push(("suppressed", n.to_string()));
        r
    }

    /// The line reporting `n` suppressed copies of this record over `over`.
    pub fn summary(&self, n: u64, over: Duration) -> Record {
        let mut r = self.clone();
        r.time = SystemTime::now();
        r.message = format!(
            "{} (repeated {n} more times in {:.0}s, suppressed)",
            r.message,
            over.as_secs_f64()
        );
        r.fields.push(("suppressed", n.to_string()));
        r
    }
}

/// Collects an event's message and fields.
#[derive(Default)]
pub struct Visitor {
    pub message: String,
    pub fields: Vec<Field>,
}

impl Visit for Visitor {
    fn record_str(&mut self, field: &TField, value: &str) {
        if field.name() == "message" {
            self.message = value.to_owned();
        } else {
            self.fields.push((field.name(), value.to_owned()));
        }
    }

    fn record_debug(&mut self, field: &TField, value: &dyn std::fmt::Debug) {
        let v = format!("{value:?}");
        if field.name() == "message" {
            self.message = v;
        } else {
            self.fields.push((field.name(), v));
        }
    }
}

/// Longest text copied from outside (tool output, an engine's answer) into an error.
pub const QUOTE_MAX: usize = 512;

/// `s` with every control character escaped (`\n`, `\t`, `\u{1b}`, …), so one event is
/// one line and copied bytes cannot drive a terminal.
pub fn escape_controls(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.contains(char::is_control) {
        return s.into();
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if c.is_control() {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    out.into()
}

/// `s` as quoted in an error: in double quotes, control characters and quotes escaped, cut
/// at [`QUOTE_MAX`] bytes with how much was left out.
pub fn quote(s: &str) -> String {
    let mut cut = s.len().min(QUOTE_MAX);
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    let head = format!("{:?}", &s[..cut]);
    if cut == s.len() {
        head
    } else {
        format!("{head}… ({} more bytes)", s.len() - cut)
    }
}

/// `2026-11-30T00:23:05.123456Z  WARN message key=value ...`, control characters escaped.
pub fn text(r: &Record) -> String {
    let mut s = format!(
        "{} {:>5} {}",
        humantime::format_rfc3339_micros(r.time),
        r.level.as_str(),
        escape_controls(&r.message)
    );
    for (k, v) in &r.fields {
        if v.is_empty()
            || v.contains(char::is_whitespace)
            || v.contains('"')
            || v.contains(char::is_control)
        {
            let _ = write!(s, " {k}={v:?}");
        } else {
            let _ = write!(s, " {k}={v}");
        }
    }
    s.push('\n');
    s
}

/// One JSON object: `timestamp`, `level`, `target`, `message`, then the fields.
pub fn json(r: &Record) -> String {
    let mut m = serde_json::Map::new();
    m.insert(
        "timestamp".into(),
        humantime::format_rfc3339_micros(r.time).to_string().into(),
    );
    m.insert("level".into(), r.level.as_str().into());
    m.insert("target".into(), r.target.clone().into());
    m.insert("message".into(), r.message.clone().into());
    for (k, v) in &r.fields {
        let key = if m.contains_key(*k) {
            format!("field_{k}")
        } else {
            (*k).to_owned()
        };
        m.insert(key, v.clone().into());
    }
    let mut s = serde_json::Value::Object(m).to_string();
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec() -> Record {
        Record {
            time: SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000),
            level: Level::WARN,
            target: "npu_health_agent::engine".into(),
            file: Some("src/engine.rs"),
            line: Some(1),
            message: "/health fails".into(),
            fields: vec![
                ("engine", "prefill-0".into()),
                ("error", "connection refused".into()),
            ],
        }
    }

    #[test]
    fn text_line() {
        assert_eq!(
            text(&rec()),
            "2023-11-14T22:13:20.000000Z  WARN /health fails engine=prefill-0 error=\"connection refused\"\n"
        );
    }

    #[test]
    fn text_lines_escape_control_bytes_from_outside() {
        let mut r = rec();
        r.message = "npu-smi said: ok\n2026-01-01T00:00:00Z ERROR forged\x1b[2J".into();
        r.fields = vec![("output", "a\x07b".into())];
        let line = text(&r);
        assert_eq!(
            line.matches('\n').count(),
            1,
            "one event, one line: {line:?}"
        );
        assert!(!line.contains('\x1b') && !line.contains('\x07'), "{line:?}");
        assert!(
            line.contains("ok\\n2026") && line.contains("\\u{1b}[2J"),
            "{line:?}"
        );
        assert!(line.contains(r#"output="a\u{7}b""#), "{line:?}");
    }

    #[test]
    fn quoted_output_is_cut_at_a_stated_size() {
        assert_eq!(quote("short\n"), "\"short\\n\"");
        let long = "é".repeat(QUOTE_MAX);
        let q = quote(&long);
        assert!(
            q.ends_with(&format!("… ({} more bytes)", long.len() - QUOTE_MAX)),
            "{q}"
        );
        assert!(q.len() < QUOTE_MAX + 40);
    }

    #[test]
    fn json_line_keeps_fields_and_never_overwrites_the_envelope() {
        let mut r = rec();
        r.fields.push(("message", "clash".into()));
        let v: serde_json::Value = serde_json::from_str(&json(&r)).unwrap();
        assert_eq!(v["level"], "WARN");
        assert_eq!(v["message"], "/health fails");
        assert_eq!(v["engine"], "prefill-0");
        assert_eq!(v["field_message"], "clash");
        assert_eq!(v["timestamp"], "2023-11-14T22:13:20.000000Z");
    }

    #[test]
    fn the_time_is_not_part_of_the_identity() {
        let a = rec();
        let mut b = rec();
        b.time += Duration::from_secs(5);
        assert_eq!(a, b);
        b.fields[0].1 = "decode-0".into();
        assert_ne!(a, b);
    }
}

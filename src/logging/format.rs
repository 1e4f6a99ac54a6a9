//! An event's fields as plain data ([`Fields`], also the rate limiter's key and journald's
//! entry), and the field formatter of the text format ([`TextFields`]).
//!
//! The text lines come from `tracing-subscriber`'s fmt layer; the fields in them are written
//! here because its own formatter escapes only terminal escapes (ESC, BEL, ...) in the
//! message and nothing in other fields: a newline copied from an engine's answer would start
//! a forged log line (`tracing_subscribers_own_fields_let_a_newline_through`).

use std::fmt;
use tracing::field::{Field, Visit};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::fmt::format::Writer;

/// A field's value as recorded: numbers and booleans kept as such, anything else rendered.
#[derive(Debug, Clone)]
pub(crate) enum FieldValue {
    I64(i64),
    U64(u64),
    F64(f64),
    Bool(bool),
    Text(String),
}

impl FieldValue {
    /// The value, to record again (the rate limiter's own lines).
    pub(crate) fn as_value(&self) -> &dyn tracing::Value {
        match self {
            FieldValue::I64(v) => v,
            FieldValue::U64(v) => v,
            FieldValue::F64(v) => v,
            FieldValue::Bool(v) => v,
            FieldValue::Text(v) => v,
        }
    }
}

// Compared and hashed by their bits, so a NaN field still makes a rate-limit key equal to
// itself.
impl PartialEq for FieldValue {
    fn eq(&self, o: &FieldValue) -> bool {
        match (self, o) {
            (FieldValue::F64(a), FieldValue::F64(b)) => a.to_bits() == b.to_bits(),
            (FieldValue::I64(a), FieldValue::I64(b)) => a == b,
            (FieldValue::U64(a), FieldValue::U64(b)) => a == b,
            (FieldValue::Bool(a), FieldValue::Bool(b)) => a == b,
            (FieldValue::Text(a), FieldValue::Text(b)) => a == b,
            _ => false,
        }
    }
}

impl Eq for FieldValue {}

impl std::hash::Hash for FieldValue {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        std::mem::discriminant(self).hash(h);
        match self {
            FieldValue::I64(v) => v.hash(h),
            FieldValue::U64(v) => v.hash(h),
            FieldValue::F64(v) => v.to_bits().hash(h),
            FieldValue::Bool(v) => v.hash(h),
            FieldValue::Text(v) => v.hash(h),
        }
    }
}

impl fmt::Display for FieldValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FieldValue::I64(v) => write!(f, "{v}"),
            FieldValue::U64(v) => write!(f, "{v}"),
            // As tracing renders a float it is given (`1.0`, not `1`).
            FieldValue::F64(v) => write!(f, "{v:?}"),
            FieldValue::Bool(v) => write!(f, "{v}"),
            FieldValue::Text(v) => f.write_str(v),
        }
    }
}

/// An event's message and its other fields, in the order recorded.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub(crate) struct Fields {
    pub message: String,
    pub fields: Vec<(&'static str, FieldValue)>,
}

impl Fields {
    fn put(&mut self, field: &Field, value: FieldValue) {
        if field.name() == "message" {
            self.message = value.to_string();
        } else {
            self.fields.push((field.name(), value));
        }
    }

    /// `message key=value ...`: control characters escaped, a value with a space, a quote
    /// or a control character quoted.
    pub(crate) fn write_text(&self, w: &mut impl fmt::Write) -> fmt::Result {
        let mut sep = "";
        if !self.message.is_empty() {
            w.write_str(&escape_controls(&self.message))?;
            sep = " ";
        }
        for (k, v) in &self.fields {
            let v = v.to_string();
            if v.is_empty()
                || v.contains(char::is_whitespace)
                || v.contains('"')
                || v.contains(char::is_control)
            {
                write!(w, "{sep}{k}={v:?}")?;
            } else {
                write!(w, "{sep}{k}={v}")?;
            }
            sep = " ";
        }
        Ok(())
    }
}

impl Visit for Fields {
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, FieldValue::I64(value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, FieldValue::U64(value));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, FieldValue::F64(value));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, FieldValue::Bool(value));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, FieldValue::Text(value.to_owned()));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.put(field, FieldValue::Text(format!("{value:?}")));
    }
}

/// The text format's field formatter (see the module doc for why it is ours).
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct TextFields;

impl<'w> FormatFields<'w> for TextFields {
    fn format_fields<R: RecordFields>(&self, mut writer: Writer<'w>, fields: R) -> fmt::Result {
        let mut f = Fields::default();
        fields.record(&mut f);
        f.write_text(&mut writer)
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
    let cut = quote_cut(s);
    let head = format!("{:?}", &s[..cut]);
    if cut == s.len() {
        head
    } else {
        format!("{head}… ({} more bytes)", s.len() - cut)
    }
}

/// `s` as one line of an error's own words (not quoted): control characters escaped, cut
/// at [`QUOTE_MAX`] bytes with how much was left out.
pub fn clip(s: &str) -> String {
    let s = escape_controls(s);
    let cut = quote_cut(&s);
    if cut == s.len() {
        s.into_owned()
    } else {
        format!("{}… ({} more bytes)", &s[..cut], s.len() - cut)
    }
}

/// Where [`quote`] and [`clip`] cut `s`: at most [`QUOTE_MAX`] bytes, on a character boundary.
fn quote_cut(s: &str) -> usize {
    let mut cut = s.len().min(QUOTE_MAX);
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    cut
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::fmt::MakeWriter;
    use tracing_subscriber::layer::SubscriberExt;

    /// Everything a fmt layer writes, kept.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Captured {
        type Writer = Captured;
        fn make_writer(&'a self) -> Captured {
            self.clone()
        }
    }

    impl Captured {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    /// What the agent's text layer writes for `f`.
    fn text_of(f: impl FnOnce()) -> String {
        let out = Captured::default();
        let layer = super::super::text_layer().with_writer(out.clone());
        tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), f);
        out.text()
    }

    const FORGED: &str = "ok\n2026-01-01T00:00:00Z ERROR forged\x1b[2J";

    #[test]
    fn text_lines_keep_their_shape() {
        let line = text_of(|| {
            tracing::warn!(
                engine = "prefill-0",
                device = 3,
                error = %"connection refused",
                "/health fails"
            )
        });
        let (time, rest) = line.split_once(' ').unwrap();
        assert!(
            humantime::parse_rfc3339(time).is_ok() && time.ends_with('Z') && time.len() == 27,
            "{line:?}"
        );
        assert_eq!(
            rest,
            " WARN /health fails engine=prefill-0 device=3 error=\"connection refused\"\n"
        );
    }

    #[test]
    fn text_lines_escape_control_bytes_from_outside() {
        let line = text_of(|| tracing::error!(output = "a\x07b", "npu-smi said: {FORGED}"));
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

    // Why the field formatter is ours: the crate's own escapes ESC but keeps a newline in the
    // message and anything in a Display field.
    #[test]
    fn tracing_subscribers_own_fields_let_a_newline_through() {
        let out = Captured::default();
        let layer = tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .with_writer(out.clone());
        tracing::subscriber::with_default(
            tracing_subscriber::registry().with(layer),
            || tracing::error!(answer = %"x\ny", "npu-smi said: {FORGED}"),
        );
        let text = out.text();
        assert_eq!(text.matches('\n').count(), 3, "{text:?}");
        assert!(
            text.contains("\n2026-01-01T00:00:00Z ERROR forged"),
            "{text:?}"
        );
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

    /// The fields of every event, as this module collects them.
    #[derive(Clone, Default)]
    struct Keep(Arc<Mutex<Vec<Fields>>>);

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Keep {
        fn on_event(&self, e: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
            let mut f = Fields::default();
            e.record(&mut f);
            self.0.lock().unwrap().push(f);
        }
    }

    #[test]
    fn fields_keep_numbers_and_compare_by_value() {
        let keep = Keep::default();
        let subscriber = tracing_subscriber::registry().with(keep.clone());
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(device = 1u32, peak = f64::NAN, "m");
            tracing::warn!(device = 2u32, peak = f64::NAN, "m");
        });
        let got = keep.0.lock().unwrap().clone();
        let (a, b) = (&got[0], &got[1]);
        assert_eq!(a.message, "m");
        assert_eq!(a.fields[0], ("device", FieldValue::U64(1)));
        assert_eq!(a, &a.clone(), "a NaN field still equals itself");
        assert_ne!(a, b);
        let mut s = String::new();
        a.write_text(&mut s).unwrap();
        assert_eq!(s, "m device=1 peak=NaN");
    }
}

//! Durations in config files, in humantime's syntax (`"5s"`, `"50ms"`), for
//! `#[serde(with = "duration")]` (and `duration::option` for an optional one).
//!
//! Written with `humantime-serde`. Read here: its error says only `invalid value: string
//! "soon", expected a duration` (humantime-serde 1.1), while every config error shows what a
//! duration looks like (`a_bad_duration_says_what_one_looks_like`).

use serde::Deserializer;
use serde::de::{self, Visitor};
use std::time::Duration;

pub(crate) use humantime_serde::serialize;

/// A duration like `"5s"` or `"50ms"`.
pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    d.deserialize_any(Text)
}

/// Reads a duration from its text; a bare number (`sample_period = 50`) is refused with the
/// same number written as a duration, since its unit cannot be guessed.
struct Text;

impl Visitor<'_> for Text {
    type Value = Duration;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a duration like \"5s\" or \"50ms\"")
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Duration, E> {
        parse(s)
    }

    fn visit_i64<E: de::Error>(self, n: i64) -> Result<Duration, E> {
        Err(bare(&n.to_string(), &format!("\"{n}ms\" or \"{n}s\"")))
    }

    fn visit_u64<E: de::Error>(self, n: u64) -> Result<Duration, E> {
        Err(bare(&n.to_string(), &format!("\"{n}ms\" or \"{n}s\"")))
    }

    fn visit_f64<E: de::Error>(self, f: f64) -> Result<Duration, E> {
        // humantime takes no fractions: 0.5 (seconds) is written "500ms".
        let ms = (f * 1000.0).round();
        Err(bare(&f.to_string(), &format!("\"{ms}ms\"")))
    }
}

/// The error for a number written without its unit.
fn bare<E: de::Error>(number: &str, example: &str) -> E {
    E::custom(format!(
        "`{number}` has no unit: a duration is a quoted string with its unit, such as {example}"
    ))
}

fn parse<E: de::Error>(s: &str) -> Result<Duration, E> {
    humantime::parse_duration(s).map_err(|e| {
        E::custom(format!(
            "{s:?} is not a duration like \"5s\" or \"50ms\": {e}"
        ))
    })
}

/// An optional duration (absent: `None`).
pub(crate) mod option {
    use serde::{Deserialize, Deserializer};
    use std::time::Duration;

    pub(crate) use humantime_serde::option::serialize;

    /// A duration like `"5s"`, if given.
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        Ok(Option::<Given>::deserialize(d)?.map(|g| g.0))
    }

    /// One given duration, read as [`super::deserialize`] reads it.
    struct Given(Duration);

    impl<'de> Deserialize<'de> for Given {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Given, D::Error> {
            super::deserialize(d).map(Given)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[derive(Debug, serde::Deserialize, serde::Serialize)]
    struct Ours {
        #[serde(with = "super")]
        d: Duration,
        #[serde(default, with = "super::option")]
        o: Option<Duration>,
    }

    #[test]
    fn a_bad_duration_says_what_one_looks_like() {
        let ours = toml::from_str::<Ours>("d = \"soon\"").unwrap_err();
        assert!(
            ours.message()
                .starts_with("\"soon\" is not a duration like \"5s\" or \"50ms\": "),
            "{}",
            ours.message()
        );
    }

    // Issue 48: `sample_period = 50` said only "expected a string"; a number without its
    // unit is shown written as a duration, whether the key is optional or not.
    #[test]
    fn a_bare_number_is_shown_as_a_duration() {
        for (text, says) in [
            (
                "d = 50",
                "`50` has no unit: a duration is a quoted string with its unit, such as \"50ms\" or \"50s\"",
            ),
            (
                "d = 0.5",
                "`0.5` has no unit: a duration is a quoted string with its unit, such as \"500ms\"",
            ),
            ("d = \"5s\"\no = 20", "`20` has no unit"),
            ("d = true", "expected a duration like \"5s\" or \"50ms\""),
        ] {
            let e = toml::from_str::<Ours>(text).unwrap_err();
            assert!(e.message().contains(says), "{text}: {}", e.message());
        }
    }

    #[test]
    fn durations_read_and_write_in_humantime_syntax() {
        let o: Ours = toml::from_str("d = \"1m 500ms\"").unwrap();
        assert_eq!((o.d, o.o), (Duration::from_millis(60_500), None));
        let o: Ours = toml::from_str("d = \"5s\"\no = \"50ms\"").unwrap();
        assert_eq!(o.o, Some(Duration::from_millis(50)));
        assert_eq!(
            serde_json::to_string(&o).unwrap(),
            r#"{"d":"5s","o":"50ms"}"#
        );
    }
}

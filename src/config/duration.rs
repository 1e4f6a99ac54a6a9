//! Durations in config files, in humantime's syntax (`"5s"`, `"50ms"`), for
//! `#[serde(with = "duration")]` (and `duration::option` for an optional one).
//!
//! Written with `humantime-serde`. Read here: its error says only `invalid value: string
//! "soon", expected a duration` (humantime-serde 1.1), while every config error shows what a
//! duration looks like (`a_bad_duration_says_what_one_looks_like`).

use serde::{Deserialize, Deserializer};
use std::time::Duration;

pub use humantime_serde::serialize;

/// A duration like `"5s"` or `"50ms"`.
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    parse(&String::deserialize(d)?)
}

fn parse<E: serde::de::Error>(s: &str) -> Result<Duration, E> {
    humantime::parse_duration(s).map_err(|e| {
        E::custom(format!(
            "{s:?} is not a duration like \"5s\" or \"50ms\": {e}"
        ))
    })
}

/// An optional duration (absent: `None`).
pub mod option {
    use super::parse;
    use serde::{Deserialize, Deserializer};
    use std::time::Duration;

    pub use humantime_serde::option::serialize;

    /// A duration like `"5s"`, if given.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|s| parse(&s))
            .transpose()
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

//! `engine_type`: which kind of engine an engine is, as its table or its `user_config.json`
//! section names it. Data only, on the configuration's floor: what each kind *does* (its
//! metric names, its virtual request, its `/health`) lives in its own file of
//! `src/engines/`, which maps each value here to its kind.

use serde::Serialize;
use strum::IntoEnumIterator;

/// `engine_type`: one value per file of `src/engines/` (a test there holds the two lists
/// equal).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Serialize,
    serde::Deserialize,
    strum::EnumIter,
    strum::IntoStaticStr,
)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
pub enum EngineType {
    /// vLLM's OpenAI server (`vllm serve`).
    Vllm,
    /// SGLang's HTTP server (`python -m sglang.launch_server`).
    Sglang,
    /// MindIE's engine server (mindie-motor 3.0.0b2) in front of vLLM.
    Mindie,
}

impl EngineType {
    /// The word written in a configuration.
    pub(crate) fn as_str(self) -> &'static str {
        self.into()
    }

    /// The value `word` names, if any (exact, as MindIE compares it).
    pub(crate) fn parse(word: &str) -> Option<EngineType> {
        EngineType::iter().find(|t| t.as_str() == word)
    }

    /// Every word, quoted as Python prints a string, for an error: `'vllm', 'sglang' or
    /// 'mindie'`.
    pub(crate) fn one_of() -> String {
        let words: Vec<String> = EngineType::iter()
            .map(|t| format!("'{}'", t.as_str()))
            .collect();
        match words.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
            _ => words.concat(),
        }
    }

    /// Whether the virtual request of this kind names the model, so that an engine with
    /// virtual inference on must say which (checked when the configuration is read; the
    /// kind's file in `src/engines/` says why). SGLang's OpenAI server takes a request
    /// without one (`model` defaults to `default`, `protocol.py`).
    pub(crate) fn request_names_model(self) -> bool {
        match self {
            EngineType::Vllm | EngineType::Mindie => true,
            EngineType::Sglang => false,
        }
    }
}

impl std::fmt::Display for EngineType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_word_parses_back_and_the_error_names_every_kind() {
        for t in EngineType::iter() {
            assert_eq!(EngineType::parse(t.as_str()), Some(t));
            assert!(EngineType::one_of().contains(&format!("'{t}'")), "{t}");
        }
        assert_eq!(EngineType::one_of(), "'vllm', 'sglang' or 'mindie'");
        assert_eq!(EngineType::parse("VLLM"), None, "exact, as MindIE");
        assert_eq!(EngineType::parse("trt"), None);
    }

    // docs/configuration.md's `engine_type` row names every value and no other.
    #[test]
    fn the_configuration_reference_lists_every_engine_type() {
        let doc = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/configuration.md"),
        )
        .unwrap();
        let row = doc
            .lines()
            .find(|l| l.starts_with("| `engine_type` (inline)"))
            .expect("docs/configuration.md has an engine_type row");
        let values = row.split(" | ").nth(2).expect("a values cell");
        let named: Vec<&str> = values
            .split('`')
            .enumerate()
            .filter(|(i, _)| i % 2 == 1)
            .map(|(_, w)| w)
            .collect();
        let words: Vec<&str> = EngineType::iter().map(EngineType::as_str).collect();
        assert_eq!(named, words, "{row}");
    }
}

//! Just enough PromQL to check a dashboard against a live scrape: the metric names an
//! expression selects, the label names its matchers and `by`/`without`/`on`/`ignoring`
//! clauses use, and the Prometheus text format's series and labels.

use std::collections::{BTreeMap, BTreeSet};

/// What one expression reads.
#[derive(Debug, Default, PartialEq)]
pub struct Reads {
    /// Metric name → label names in its matchers.
    pub selectors: BTreeMap<String, BTreeSet<String>>,
    /// Label names in grouping and matching clauses.
    pub grouping: BTreeSet<String>,
}

const KEYWORDS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "inf",
    "nan",
];

/// Aggregation operators: `sum by (x) (...)` puts the grouping between the name and `(`.
const AGGREGATIONS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
];

fn ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// Label names inside `{...}` matchers (`a="x", b=~"y"`); `s` starts after `{`. Returns
/// the names and the byte length up to and including the closing `}`.
fn matchers(s: &str) -> (BTreeSet<String>, usize) {
    let mut names = BTreeSet::new();
    let mut chars = s.char_indices().peekable();
    let mut name = String::new();
    while let Some((i, c)) = chars.next() {
        match c {
            '}' => return (names, i + 1),
            '"' | '\'' | '`' => {
                // A quoted value: skip to its end (backslash escapes).
                while let Some((_, d)) = chars.next() {
                    if d == '\\' {
                        chars.next();
                    } else if d == c {
                        break;
                    }
                }
            }
            '=' | '!' | '~' => {
                if !name.is_empty() {
                    names.insert(std::mem::take(&mut name));
                }
            }
            c if ident_char(c) => name.push(c),
            _ => name.clear(),
        }
    }
    (names, s.len())
}

/// Label names in a `( ... )` list; `s` starts after `(`.
fn label_list(s: &str) -> (BTreeSet<String>, usize) {
    let end = s.find(')').map_or(s.len(), |i| i + 1);
    let names = s[..end.saturating_sub(1)]
        .split(',')
        .map(|l| l.trim().to_owned())
        .filter(|l| !l.is_empty())
        .collect();
    (names, end)
}

/// Reads an expression. Grafana's `$var`, `${var}` and `$__interval` are skipped; so are
/// strings, numbers, durations, functions (an identifier before `(`) and keywords.
pub fn reads(expr: &str) -> Reads {
    let mut r = Reads::default();
    let b = expr.as_bytes();
    let mut i = 0;
    while i < expr.len() {
        let c = b[i] as char;
        if c == '"' || c == '\'' || c == '`' {
            i += 1;
            while i < expr.len() && b[i] as char != c {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
        } else if c == '$' {
            i += 1;
            if i < expr.len() && b[i] == b'{' {
                i = expr[i..].find('}').map_or(expr.len(), |k| i + k + 1);
            } else {
                while i < expr.len() && ident_char(b[i] as char) {
                    i += 1;
                }
            }
        } else if c == '[' {
            i = expr[i..].find(']').map_or(expr.len(), |k| i + k + 1);
        } else if c == '{' {
            // Matchers with no metric name before them (`{__name__=...}`): labels only.
            let (names, len) = matchers(&expr[i + 1..]);
            r.grouping.extend(names);
            i += 1 + len;
        } else if c.is_ascii_digit()
            || (c == '.' && i + 1 < expr.len() && (b[i + 1] as char).is_ascii_digit())
        {
            while i < expr.len() && (ident_char(b[i] as char) || b[i] == b'.') {
                i += 1;
            }
        } else if ident_char(c) {
            let start = i;
            while i < expr.len() && ident_char(b[i] as char) {
                i += 1;
            }
            let word = &expr[start..i];
            let rest = expr[i..].trim_start();
            let skipped = expr.len() - i - rest.len();
            let lower = word.to_ascii_lowercase();
            if matches!(
                lower.as_str(),
                "by" | "without" | "on" | "ignoring" | "group_left" | "group_right"
            ) && rest.starts_with('(')
            {
                let (names, len) = label_list(&rest[1..]);
                r.grouping.extend(names);
                i += skipped + 1 + len;
            } else if rest.starts_with('(')
                || KEYWORDS.contains(&lower.as_str())
                || AGGREGATIONS.contains(&lower.as_str())
            {
                // A function or aggregation, or a keyword.
            } else {
                let labels = if let Some(inner) = rest.strip_prefix('{') {
                    let (names, len) = matchers(inner);
                    i += skipped + 1 + len;
                    names
                } else {
                    BTreeSet::new()
                };
                r.selectors
                    .entry(word.to_owned())
                    .or_default()
                    .extend(labels);
            }
        } else {
            i += 1;
        }
    }
    r
}

/// The series of a Prometheus text scrape: name → label names seen on it.
pub fn scrape(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let name: String = line.chars().take_while(|c| ident_char(*c)).collect();
        let labels = match line[name.len()..].strip_prefix('{') {
            Some(rest) => matchers(rest).0,
            None => BTreeSet::new(),
        };
        out.entry(name).or_default().extend(labels);
    }
    out
}

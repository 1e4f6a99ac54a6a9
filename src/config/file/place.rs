//! Where in `agent.toml` a parse or type error is: toml's errors carry a byte span but no
//! key, so the span is looked up in the spanned document and named the way every other
//! error names its place (`[agent] backend`, `[[engine]] #2 (decode-0) timing.interval`).

use crate::config::engine_place;

/// One step of a key path: a key, or an index into an array.
#[derive(Debug, Clone, PartialEq)]
enum Step {
    Key(String),
    Index(usize),
}

/// Names the place of a parse or type error at `span` of `text`, the way every other error
/// names it: `[agent] backend`, `[[engine]] #2 (decode-0) timing.interval`,
/// `[[engine]] #1 (p0) devices[0]`.
///
/// toml's errors carry a span but no key, so the key or value holding the span is looked up
/// in the spanned document `doc` (recovered as far as the parser could, on a syntax error).
/// A syntax error can leave that lookup short (a key defined twice is not in the recovered
/// table): the headers above the span then give the table, and the text at the span the key.
pub(super) fn place_at(
    doc: &toml::de::DeTable<'_>,
    text: &str,
    span: std::ops::Range<usize>,
    message: &str,
) -> String {
    let mut path = Vec::new();
    if !find_in_table(doc, span.start, &mut path) || message.starts_with("duplicate") {
        path = header_path(text, span.start);
        let key = text.get(span.clone()).unwrap_or_default().trim();
        let key = key.trim_matches(|c| c == '"' || c == '\'');
        if !key.is_empty() && !key.contains(['=', '[', ']', '\n', ' ']) {
            path.extend(key.split('.').map(|k| Step::Key(k.to_owned())));
        }
    }
    format_path(doc, &path)
}

/// Whether `offset` lies in a key or value of `table` (deepest first); the path to it in
/// `path`.
fn find_in_table(table: &toml::de::DeTable<'_>, offset: usize, path: &mut Vec<Step>) -> bool {
    for (k, v) in table.iter() {
        path.push(Step::Key(k.get_ref().to_string()));
        if k.span().contains(&offset) || find_in_value(v, offset, path) {
            return true;
        }
        path.pop();
    }
    false
}

fn find_in_value(
    v: &toml::Spanned<toml::de::DeValue<'_>>,
    offset: usize,
    path: &mut Vec<Step>,
) -> bool {
    match v.get_ref() {
        toml::de::DeValue::Table(t) if find_in_table(t, offset, path) => return true,
        toml::de::DeValue::Array(a) => {
            for (i, item) in a.iter().enumerate() {
                path.push(Step::Index(i));
                if find_in_value(item, offset, path) {
                    return true;
                }
                path.pop();
            }
        }
        _ => {}
    }
    v.span().contains(&offset)
}

/// The table headers in force at byte `offset` (`[[engine]]` counted), as a path.
fn header_path(text: &str, offset: usize) -> Vec<Step> {
    let mut path = Vec::new();
    let mut engines = 0;
    let mut pos = 0;
    for line in text.split_inclusive('\n') {
        if pos > offset {
            break;
        }
        pos += line.len();
        let t = line.trim();
        let Some(header) = t.strip_prefix('[') else {
            continue;
        };
        let array = header.starts_with('[');
        let name = header
            .trim_start_matches('[')
            .split(']')
            .next()
            .unwrap_or_default();
        path = name
            .split('.')
            .map(|k| Step::Key(k.trim().trim_matches('"').to_owned()))
            .collect();
        if array && name.trim() == "engine" {
            engines += 1;
        }
        if path.first() == Some(&Step::Key("engine".to_owned())) {
            path.insert(1, Step::Index(engines.max(1) - 1));
        }
    }
    path
}

/// `[agent] key`, `[[engine]] #N (name) key.path`, or the dotted path elsewhere.
fn format_path(doc: &toml::de::DeTable<'_>, path: &[Step]) -> String {
    let rest = |steps: &[Step]| {
        let mut out = String::new();
        for s in steps {
            match s {
                Step::Key(k) if out.is_empty() => out.push_str(k),
                Step::Key(k) => {
                    out.push('.');
                    out.push_str(k);
                }
                Step::Index(i) => out.push_str(&format!("[{i}]")),
            }
        }
        out
    };
    match path {
        [Step::Key(t), Step::Index(i), tail @ ..] if t == "engine" => {
            let name = doc
                .get("engine")
                .and_then(|e| e.get_ref().as_array())
                .and_then(|a| a.get(*i))
                .and_then(|e| e.get_ref().as_table())
                .and_then(|e| e.get("name"))
                .and_then(|n| n.get_ref().as_str());
            engine_place(*i, name, &rest(tail))
        }
        [Step::Key(t), tail @ ..] if t == "agent" => {
            format!("[agent] {}", rest(tail)).trim_end().to_owned()
        }
        [Step::Key(t)] if doc.get(t.as_str()).is_some_and(|v| v.get_ref().is_table()) => {
            format!("[{t}]")
        }
        other => rest(other),
    }
}

//! The integrations' tables of `agent.toml` (`[agent.kubernetes]`, `[engine.kubernetes]`,
//! the keys of `[engine.actions]`), each read by its integration's reader
//! ([`crate::config::tables`]) from the parsed document with its spans, so an error names
//! its place as any other does. `agent.toml`'s own types hold only the slots
//! ([`Slot`], [`OpenSlot`]): the keys the file may write there.

use crate::config::tables::{At, Fault, OPEN, TableReader, Tables};
use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};
use std::ops::Range;
use toml::de::{DeTable, ValueDeserializer};

/// What reading an integration's table found wrong.
pub(super) enum Wrong {
    /// toml's error, with its span.
    Toml(toml::de::Error),
    /// A key of `[engine.actions]` no table claims, at `span`; `known`: the keys claimed.
    Unknown {
        key: String,
        known: Vec<&'static str>,
        span: Range<usize>,
    },
}

/// Every table `readers` has `at`, read from `written` (the `[agent]` table or one
/// `[[engine]]` table as written, if it was). `[engine.actions]`'s keys are read in the
/// order written, as serde reads a table, so the first wrong one is the one named.
fn read(
    written: Option<&DeTable<'_>>,
    at: At,
    readers: &[&dyn TableReader],
) -> Result<Tables, Wrong> {
    let mine: Vec<&dyn TableReader> = readers.iter().copied().filter(|r| r.at() == at).collect();
    let mut read: Vec<(&'static str, Box<dyn crate::config::tables::Table>)> = Vec::new();
    let open = written
        .and_then(|t| t.get(OPEN))
        .and_then(|v| v.get_ref().as_table());
    if let (At::Engine, Some(open)) = (at, open) {
        let claimed = |r: &&dyn TableReader| r.path().strip_prefix(OPEN)?.strip_prefix('.');
        for (key, value) in open.iter() {
            let k: &str = key.get_ref().as_ref();
            match mine.iter().find(|r| claimed(r) == Some(k)) {
                Some(r) => {
                    let table = r
                        .read(Some(ValueDeserializer::from(value.clone())))
                        .map_err(|Fault::Parse(e)| Wrong::Toml(e))?;
                    read.push((r.path(), table));
                }
                None => {
                    return Err(Wrong::Unknown {
                        key: k.to_owned(),
                        known: mine.iter().filter_map(claimed).collect(),
                        span: key.span(),
                    });
                }
            }
        }
    }
    let mut tables = Tables::default();
    for r in mine {
        let table = match read.iter().position(|(p, _)| *p == r.path()) {
            Some(i) => read.swap_remove(i).1,
            None => {
                let value = match r.path().split_once('.') {
                    Some(_) => None,
                    None => written.and_then(|t| t.get(r.path())).cloned(),
                };
                r.read(value.map(ValueDeserializer::from))
                    .map_err(|Fault::Parse(e)| Wrong::Toml(e))?
            }
        };
        tables.push(r, table);
    }
    Ok(tables)
}

/// The tables of the `[agent]` table and of each of the `engines` `[[engine]]` tables of
/// the document `top`.
pub(super) fn read_all(
    top: &DeTable<'_>,
    engines: usize,
    readers: &[&dyn TableReader],
) -> Result<(Tables, Vec<Tables>), Wrong> {
    let agent = top.get("agent").and_then(|v| v.get_ref().as_table());
    let engine = |i: usize| {
        let engines = top.get("engine")?.get_ref().as_array()?;
        engines.get(i)?.get_ref().as_table()
    };
    let agent = read(agent, At::Agent, readers)?;
    let engines = (0..engines)
        .map(|i| read(engine(i), At::Engine, readers))
        .collect::<Result<Vec<Tables>, Wrong>>()?;
    Ok((agent, engines))
}

/// The slot of a table an integration reads (`[agent.kubernetes]`, `[engine.kubernetes]`):
/// the file may write it; its reader reads what is there.
pub(super) type Slot = Option<IgnoredAny>;

/// `[engine.actions]`: a table, whose keys the integrations read.
#[derive(Debug, Default)]
pub(super) struct OpenSlot;

impl<'de> Deserialize<'de> for OpenSlot {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<OpenSlot, D::Error> {
        d.deserialize_struct("ActionsConfig", &[], OpenVisitor)
    }
}

struct OpenVisitor;

impl<'de> Visitor<'de> for OpenVisitor {
    type Value = OpenSlot;

    // The words serde wrote when the table was one struct, so a value that is not a table
    // is named as before ("invalid type: integer `5`, expected struct ActionsConfig").
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("struct ActionsConfig")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<OpenSlot, A::Error> {
        while a.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(OpenSlot)
    }
}

//! The integrations' tables (`[agent.kubernetes]`, `[engine.kubernetes]`, the keys of
//! `[engine.actions]`), kept by the configuration without naming them: each integration
//! owns its table's type and how it is checked ([`Table`]), declares where it sits and how
//! it is read ([`ConfigTable`], a [`TableReader`]), and registers it through its seam
//! (`Integration::tables`). The configuration asks the list for the readers through
//! [`Listed`], a trait of its own that the integrations' list implements for [`Readers`]:
//! the compiler finds the one implementation, so the configuration stays the floor and names
//! no integration, and a list without it does not build.

use super::KeyError;
use serde::de::DeserializeOwned;
use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};
use std::any::Any;
use std::fmt::Debug;
use std::marker::PhantomData;
use std::path::Path;

/// Which table of the file an integration's table sits in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum At {
    /// `[agent]` (agent-wide, fixed until the agent restarts).
    Agent,
    /// Each `[[engine]]`.
    Engine,
}

/// The engine's table whose keys all belong to the integrations: any table registered at
/// `actions.<key>` is read there, and a key no table claims is unknown.
pub(crate) const OPEN: &str = "actions";

/// What reading a table found wrong.
#[derive(Debug)]
pub(crate) enum Fault {
    /// A value of the wrong type or an unknown key: toml's error, placed from its span.
    Parse(toml::de::Error),
}

/// The value of an integration's table, as the configuration keeps it.
pub(crate) trait Table: Value {
    /// Its bounds, and its files made relative to the configuration's folder (`base`);
    /// `Err((key inside the table, why))`, an empty key for the table itself.
    fn check(&mut self, _base: &Path) -> Result<(), KeyError> {
        Ok(())
    }
}

/// What the configuration does with any table's value: compare, copy, show. Every
/// `Debug + Clone + PartialEq + Serialize` type has it.
pub(crate) trait Value: Any + Debug + Send + Sync {
    /// A copy.
    fn boxed(&self) -> Box<dyn Table>;
    /// Whether `other` is the same value (of the same type).
    fn same(&self, other: &dyn Table) -> bool;
    /// As the effective configuration shows it, its keys in their order.
    fn shown(&self) -> Shown;
    /// As [`Any`], to get the integration's type back.
    fn any(&self) -> &dyn Any;
}

impl<T> Value for T
where
    T: Table + Clone + PartialEq + Serialize,
{
    fn boxed(&self) -> Box<dyn Table> {
        Box::new(self.clone())
    }

    fn same(&self, other: &dyn Table) -> bool {
        other.any().downcast_ref::<T>() == Some(self)
    }

    fn shown(&self) -> Shown {
        // Through JSON's text, which keeps the fields' order (`serde_json::Value` sorts them).
        serde_json::to_string(self)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or(Shown::Null)
    }

    fn any(&self) -> &dyn Any {
        self
    }
}

/// How one integration's table is read, registered through the integrations' seam.
pub(crate) trait TableReader: Sync {
    /// The table it sits in.
    fn at(&self) -> At;
    /// Its place there: `kubernetes` (`[agent.kubernetes]`), `actions.haproxy`,
    /// `actions.not_ready_on`.
    fn path(&self) -> &'static str;
    /// The key the effective configuration shows it under (the first part of its path
    /// unless it says: `[engine.kubernetes]` is shown as `pod`).
    fn shown_as(&self) -> &'static str {
        self.path().split('.').next().unwrap_or_default()
    }
    /// Reads its value as written (`None`: not written, the defaults).
    fn read(&self, value: Option<toml::de::ValueDeserializer<'_>>)
    -> Result<Box<dyn Table>, Fault>;
}

/// An integration's configuration table of type `T` at `path` of `[agent]` or each
/// `[[engine]]`: read as serde reads `T` (a key left out keeps `T`'s default), checked by
/// `T`'s [`Table::check`], got back with `spec.tables.get::<T>()`.
pub(crate) struct ConfigTable<T> {
    at: At,
    path: &'static str,
    shown_as: Option<&'static str>,
    of: PhantomData<fn() -> T>,
}

impl<T> ConfigTable<T> {
    /// `[agent.<path>]`.
    pub(crate) const fn agent(path: &'static str) -> Self {
        ConfigTable {
            at: At::Agent,
            path,
            shown_as: None,
            of: PhantomData,
        }
    }

    /// `[engine.<path>]` (`actions.<key>` for a key of `[engine.actions]`).
    pub(crate) const fn engine(path: &'static str) -> Self {
        ConfigTable {
            at: At::Engine,
            path,
            shown_as: None,
            of: PhantomData,
        }
    }

    /// Shown under `key` in the effective configuration instead of its path's first part.
    pub(crate) const fn shown_as(mut self, key: &'static str) -> Self {
        self.shown_as = Some(key);
        self
    }
}

impl<T: Table + Default + DeserializeOwned> TableReader for ConfigTable<T> {
    fn at(&self) -> At {
        self.at
    }

    fn path(&self) -> &'static str {
        self.path
    }

    fn shown_as(&self) -> &'static str {
        self.shown_as
            .unwrap_or_else(|| self.path.split('.').next().unwrap_or_default())
    }

    fn read(
        &self,
        value: Option<toml::de::ValueDeserializer<'_>>,
    ) -> Result<Box<dyn Table>, Fault> {
        let t = match value {
            Some(v) => T::deserialize(v).map_err(Fault::Parse)?,
            None => T::default(),
        };
        Ok(Box::new(t))
    }
}

/// Where the configuration finds the readers: the integrations' list implements it for
/// [`Readers`].
pub(crate) trait Listed {
    /// Every table, the seam's own first, then each integration's in the list's order (the
    /// order of the keys in an unknown-key error and in the effective configuration).
    fn readers() -> Vec<&'static dyn TableReader>;
}

/// The readers of the integrations' list (see [`Listed`]).
pub(crate) struct Readers;

/// The registered readers.
pub(crate) fn listed() -> Vec<&'static dyn TableReader> {
    <Readers as Listed>::readers()
}

struct Entry {
    path: &'static str,
    shown_as: &'static str,
    table: Box<dyn Table>,
}

/// The integrations' tables of one `[agent]` or `[[engine]]`, in the readers' order.
#[derive(Default)]
pub(crate) struct Tables(Vec<Entry>);

impl Tables {
    /// The defaults of every table `readers` has `at` (nothing written).
    pub(crate) fn defaults(readers: &[&dyn TableReader], at: At) -> Tables {
        let mut t = Tables::default();
        for r in readers.iter().filter(|r| r.at() == at) {
            // A table with nothing written is its defaults: no type to get wrong.
            if let Ok(table) = r.read(None) {
                t.push(*r, table);
            }
        }
        t
    }

    /// Adds the table `r` read.
    pub(crate) fn push(&mut self, r: &dyn TableReader, table: Box<dyn Table>) {
        self.0.push(Entry {
            path: r.path(),
            shown_as: r.shown_as(),
            table,
        });
    }

    /// The integration's table of type `T`, if one is registered.
    pub(crate) fn get<T: Table>(&self) -> Option<&T> {
        self.0
            .iter()
            .find_map(|e| e.table.any().downcast_ref::<T>())
    }

    /// Checks every table; the key is its place (`actions.haproxy.maxconn`).
    pub(crate) fn check(&mut self, base: &Path) -> Result<(), KeyError> {
        for e in &mut self.0 {
            e.table.check(base).map_err(|(k, m)| {
                let key = if k.is_empty() {
                    e.path.to_owned()
                } else {
                    format!("{}.{k}", e.path)
                };
                (key, m)
            })?;
        }
        Ok(())
    }
}

impl Clone for Tables {
    fn clone(&self) -> Self {
        Tables(
            self.0
                .iter()
                .map(|e| Entry {
                    path: e.path,
                    shown_as: e.shown_as,
                    table: e.table.boxed(),
                })
                .collect(),
        )
    }
}

impl PartialEq for Tables {
    fn eq(&self, other: &Self) -> bool {
        self.0.len() == other.0.len()
            && self
                .0
                .iter()
                .zip(&other.0)
                .all(|(a, b)| a.path == b.path && a.table.same(b.table.as_ref()))
    }
}

impl Debug for Tables {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.0.iter().map(|e| (e.path, &e.table)))
            .finish()
    }
}

/// Each table under the key it is shown as, in the readers' order; the tables that share a
/// key (`actions.not_ready_on`, `actions.haproxy`) as one object of their last parts.
impl Serialize for Tables {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut shown: Vec<(String, Shown)> = Vec::new();
        for e in &self.0 {
            let value = e.table.shown();
            let Some((_, rest)) = e.path.split_once('.') else {
                shown.push((e.shown_as.to_owned(), value));
                continue;
            };
            let at = match shown.iter().position(|(k, _)| k == e.shown_as) {
                Some(i) => i,
                None => {
                    shown.push((e.shown_as.to_owned(), Shown::Map(Vec::new())));
                    shown.len() - 1
                }
            };
            if let Shown::Map(m) = &mut shown[at].1 {
                m.push((rest.to_owned(), value));
            }
        }
        Shown::Map(shown).serialize(s)
    }
}

/// A value as JSON has it, its keys in the order written: what [`Tables`] shows, whatever
/// the table's type.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Shown {
    /// Null.
    Null,
    /// A boolean.
    Bool(bool),
    /// A negative integer.
    I64(i64),
    /// A non-negative integer.
    U64(u64),
    /// A float.
    F64(f64),
    /// A string.
    Str(String),
    /// An array.
    Seq(Vec<Shown>),
    /// An object, its keys in order.
    Map(Vec<(String, Shown)>),
}

impl Serialize for Shown {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Shown::Null => s.serialize_unit(),
            Shown::Bool(b) => s.serialize_bool(*b),
            Shown::I64(n) => s.serialize_i64(*n),
            Shown::U64(n) => s.serialize_u64(*n),
            Shown::F64(n) => s.serialize_f64(*n),
            Shown::Str(t) => s.serialize_str(t),
            Shown::Seq(v) => v.serialize(s),
            Shown::Map(m) => {
                let mut map = s.serialize_map(Some(m.len()))?;
                for (k, v) in m {
                    map.serialize_entry(k, v)?;
                }
                map.end()
            }
        }
    }
}

impl<'de> serde::Deserialize<'de> for Shown {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Shown, D::Error> {
        d.deserialize_any(ShownVisitor)
    }
}

struct ShownVisitor;

impl<'de> serde::de::Visitor<'de> for ShownVisitor {
    type Value = Shown;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_unit<E>(self) -> Result<Shown, E> {
        Ok(Shown::Null)
    }
    fn visit_bool<E>(self, b: bool) -> Result<Shown, E> {
        Ok(Shown::Bool(b))
    }
    fn visit_i64<E>(self, n: i64) -> Result<Shown, E> {
        Ok(Shown::I64(n))
    }
    fn visit_u64<E>(self, n: u64) -> Result<Shown, E> {
        Ok(Shown::U64(n))
    }
    fn visit_f64<E>(self, n: f64) -> Result<Shown, E> {
        Ok(Shown::F64(n))
    }
    fn visit_str<E>(self, t: &str) -> Result<Shown, E> {
        Ok(Shown::Str(t.to_owned()))
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<Shown, A::Error> {
        let mut v = Vec::new();
        while let Some(x) = a.next_element()? {
            v.push(x);
        }
        Ok(Shown::Seq(v))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut a: A) -> Result<Shown, A::Error> {
        let mut m = Vec::new();
        while let Some(kv) = a.next_entry()? {
            m.push(kv);
        }
        Ok(Shown::Map(m))
    }
}

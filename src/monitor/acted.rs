//! What the integrations keep of an engine beyond the journal: what each router that polls
//! the agent was last told (typed, [`Told`]), and each integration's own memory ([`Memory`]:
//! the Kubernetes API mode's record and eviction gate), kept beside the verdict so
//! `/status/detail` shows it and, under the integration's own keys, in the state file so a
//! restart keeps it ([`Kept`]). Nothing here names an integration, and nothing here feeds the
//! verdict.

use super::journal::{Id, Told};
use crate::clock::unix_ms;
use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;
use std::any::Any;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Mutex;

/// What a router that polls the agent was last told about an engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Seen {
    /// The state it was told.
    pub told: Told,
    /// Since when it is told that state.
    pub since_unix_ms: u64,
    pub last_poll_unix_ms: u64,
    /// Polls answered since the agent started.
    pub polls: u64,
}

pub(crate) use npu_health_wire::RouterSeen;

/// One integration's memory of an engine: its own type, in the engine's monitor, saved in the
/// state file under its own keys. Made with `Default` the first time the integration asks for
/// it ([`ActionMemory::with`]), or when the agent equips the engine ([`ActionMemory::equip`]).
pub(crate) trait Memory: Any + Send + fmt::Debug {
    /// Its entries in the state file, in the order written (`null` for what it does not hold:
    /// the keys are there either way).
    fn save(&self) -> Vec<(&'static str, Box<RawValue>)>;

    /// Takes back what an agent before saved under its keys in `saved` (an unreadable entry
    /// reads as nothing kept).
    fn restore(&mut self, saved: &Kept);
}

/// What the integrations kept of one engine in the state file: their keys, in order, each with
/// its JSON as written (flattened into the engine's entry, beside the monitor's own keys).
#[derive(Debug, Clone, Default)]
pub(crate) struct Kept(Vec<(String, Box<RawValue>)>);

impl Kept {
    /// The entry under `key`, read as `T`; `None` when absent or unreadable.
    pub(crate) fn get<T: serde::de::DeserializeOwned>(&self, key: &str) -> Option<T> {
        let (_, raw) = self.0.iter().find(|(k, _)| k == key)?;
        serde_json::from_str(raw.get()).ok()
    }

    /// Adds the entry `key`, replacing one of that key.
    fn put(&mut self, key: &str, value: Box<RawValue>) {
        match self.0.iter_mut().find(|(k, _)| k == key) {
            Some((_, v)) => *v = value,
            None => self.0.push((key.to_owned(), value)),
        }
    }
}

/// As JSON text: two [`Kept`] are equal when they write the same file.
impl PartialEq for Kept {
    fn eq(&self, other: &Kept) -> bool {
        self.0.len() == other.0.len()
            && self
                .0
                .iter()
                .zip(&other.0)
                .all(|((a, x), (b, y))| a == b && x.get() == y.get())
    }
}

impl Serialize for Kept {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for Kept {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Kept, D::Error> {
        struct Entries;
        impl<'de> Visitor<'de> for Entries {
            type Value = Kept;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("the integrations' entries")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Kept, A::Error> {
                let mut kept = Kept::default();
                // Read as values (the flattened entry is buffered, which a raw value cannot
                // come through), written back as text.
                while let Some((k, v)) = m.next_entry::<String, serde_json::Value>()? {
                    let raw =
                        serde_json::value::to_raw_value(&v).map_err(serde::de::Error::custom)?;
                    kept.put(&k, raw);
                }
                Ok(kept)
            }
        }
        d.deserialize_map(Entries)
    }
}

/// The routers' states (with the last answer's reason), each integration's memory, and what
/// a restored state kept that no memory took yet.
#[derive(Debug, Default)]
pub(crate) struct ActionMemory {
    memories: Mutex<Memories>,
    routers: Mutex<BTreeMap<Id, (Seen, String)>>,
}

/// The memories in the order they were made, and what was restored before they were.
#[derive(Debug, Default)]
struct Memories {
    made: Vec<Box<dyn Memory>>,
    restored: Kept,
}

impl Memories {
    /// The memory of type `T`, made (from what was restored) if there is none yet.
    fn of<T: Memory + Default>(&mut self) -> &mut T {
        let at = match self
            .made
            .iter()
            .position(|m| (m.as_ref() as &dyn Any).is::<T>())
        {
            Some(at) => at,
            None => {
                let mut m = T::default();
                m.restore(&self.restored);
                self.made.push(Box::new(m));
                self.made.len() - 1
            }
        };
        (self.made[at].as_mut() as &mut dyn Any)
            .downcast_mut::<T>()
            .expect("the type was just checked")
    }
}

impl ActionMemory {
    /// `f` of the memory of type `T` (made on first use, from what a restart restored).
    pub(crate) fn with<T: Memory + Default, R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        let mut g = self.memories.lock().unwrap_or_else(|p| p.into_inner());
        f(g.of::<T>())
    }

    /// Makes `memories` now, each from what was restored, unless one of its type is made: the
    /// agent equips a new engine with every integration's, so the state file holds their keys
    /// from the first write.
    pub(crate) fn equip(&self, memories: Vec<Box<dyn Memory>>) {
        let mut g = self.memories.lock().unwrap_or_else(|p| p.into_inner());
        for mut m in memories {
            let id = (m.as_ref() as &dyn Any).type_id();
            if !g
                .made
                .iter()
                .any(|o| (o.as_ref() as &dyn Any).type_id() == id)
            {
                m.restore(&g.restored);
                g.made.push(m);
            }
        }
    }

    /// What the memories keep, for the state file: each memory's entries in the order made,
    /// then what was restored and no memory took.
    pub(crate) fn saved(&self) -> Kept {
        let g = self.memories.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = Kept::default();
        for (k, v) in g.made.iter().flat_map(|m| m.save()) {
            out.put(k, v);
        }
        for (k, v) in &g.restored.0 {
            if !out.0.iter().any(|(o, _)| o == k) {
                out.0.push((k.clone(), v.clone()));
            }
        }
        out
    }

    /// Takes back what an agent before kept (an agent restart): every memory made takes its
    /// entries now, one made later at its making.
    pub(crate) fn restore(&self, saved: &Kept) {
        let mut g = self.memories.lock().unwrap_or_else(|p| p.into_inner());
        g.restored = saved.clone();
        for m in &mut g.made {
            m.restore(saved);
        }
    }

    /// Notes an answer to a router's poll (`told` names the router); when the state changed,
    /// `Some` of the state before (`None` at the first poll).
    pub(crate) fn router_saw(&self, told: Told, reason: &str) -> Option<Option<Told>> {
        let now = unix_ms();
        let mut g = self.routers.lock().unwrap_or_else(|p| p.into_inner());
        let (seen, why) = g.entry(told.integration()).or_insert_with(|| {
            let first = Seen {
                told,
                since_unix_ms: now,
                last_poll_unix_ms: now,
                polls: 0,
            };
            (first, String::new())
        });
        let changed = if seen.polls == 0 {
            Some(None)
        } else if seen.told != told {
            Some(Some(std::mem::replace(&mut seen.told, told)))
        } else {
            None
        };
        if changed.is_some() {
            seen.since_unix_ms = now;
        }
        seen.last_poll_unix_ms = now;
        seen.polls += 1;
        if why != reason {
            reason.clone_into(why);
        }
        changed
    }

    /// What each router was last told, typed, by router.
    pub(crate) fn routers_told(&self) -> BTreeMap<Id, Seen> {
        self.routers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(i, (s, _))| (*i, *s))
            .collect()
    }

    /// What each router was last told, in words, by router.
    pub(crate) fn routers(&self) -> BTreeMap<String, RouterSeen> {
        self.routers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(i, (s, why))| {
                let seen = RouterSeen {
                    state: s.told.word().to_owned(),
                    since_unix_ms: s.since_unix_ms,
                    last_poll_unix_ms: s.last_poll_unix_ms,
                    polls: s.polls,
                    reason: why.clone(),
                };
                (i.as_str().to_owned(), seen)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROUTER: Id = Id("router");

    #[test]
    fn a_router_state_change_is_noted_once() {
        let a = ActionMemory::default();
        let told = |s| Told::state(ROUTER, "poll", s);
        assert_eq!(a.router_saw(told("up"), "normal"), Some(None));
        assert_eq!(a.router_saw(told("up"), "normal (score 0.9)"), None);
        assert_eq!(
            a.router_saw(told("down"), "degrade"),
            Some(Some(told("up")))
        );
        let r = a.routers();
        assert_eq!(r["router"].polls, 3);
        assert_eq!(r["router"].state, "down");
        assert_eq!(r["router"].reason, "degrade");
        assert_eq!(a.routers_told()[&ROUTER].told, told("down"));
    }

    /// A memory of two keys, as an integration keeps one.
    #[derive(Debug, Default)]
    struct Counts {
        first: Option<u64>,
        second: Option<u64>,
    }

    impl Memory for Counts {
        fn save(&self) -> Vec<(&'static str, Box<RawValue>)> {
            let raw = |v: &Option<u64>| serde_json::value::to_raw_value(v).unwrap();
            vec![("first", raw(&self.first)), ("second", raw(&self.second))]
        }

        fn restore(&mut self, saved: &Kept) {
            self.first = saved.get("first").flatten();
            self.second = saved.get("second").flatten();
        }
    }

    fn text(k: &Kept) -> String {
        serde_json::to_string(k).unwrap()
    }

    // A memory writes its keys in its own order, null included, and takes them back whether
    // it was made before the restore or after it; what no memory took is written back (as a
    // JSON value: an object's keys sorted).
    #[test]
    fn a_memory_is_saved_under_its_keys_and_restored_whenever_it_is_made() {
        let a = ActionMemory::default();
        assert_eq!(text(&a.saved()), "{}", "no memory made, nothing written");
        a.equip(vec![Box::new(Counts::default())]);
        assert_eq!(text(&a.saved()), r#"{"first":null,"second":null}"#);
        a.with(|c: &mut Counts| c.second = Some(2));
        let saved = a.saved();
        assert_eq!(text(&saved), r#"{"first":null,"second":2}"#);
        let file: Kept = serde_json::from_str(r#"{"second":2,"other":{"b":1,"a":2}}"#).unwrap();
        let later = ActionMemory::default();
        later.restore(&file);
        assert_eq!(later.with(|c: &mut Counts| c.second), Some(2), "made after");
        let before = ActionMemory::default();
        before.equip(vec![Box::new(Counts::default())]);
        before.restore(&file);
        assert_eq!(
            before.with(|c: &mut Counts| c.second),
            Some(2),
            "made before"
        );
        assert_eq!(
            text(&before.saved()),
            r#"{"first":null,"second":2,"other":{"a":2,"b":1}}"#
        );
    }
}

//! What a driver fault code means for the NPU: MindCluster's handling levels.
//!
//! Fleet operators already run MindCluster's table (`faultCode.json`: one list of hex codes
//! per level); its device plugin isolates NPUs by it. The agent reads the same file, so a
//! code means the same thing to both. Without the file a small built-in table is used
//! ([`BUILT_IN`], its origin beside it). A code in neither is [`FaultLevel::Unclassified`].
//! The file is read as the configuration's own files are ([`crate::config::read`]: a regular
//! file of at most 4 MiB, a FIFO refused without waiting for a writer). See
//! docs/fault-codes.md.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

/// Where MindCluster's device plugin image installs the table
/// (`component/ascend-device-plugin/pkg/common/fault_code.go`, `build/Dockerfile`).
pub(crate) const DEFAULT_PATH: &str = "/usr/local/faultCode.json";

pub(crate) use npu_health_wire::FaultLevel;

/// The level a `faultCode.json` key lists (its chip and network lists alike).
fn level_of_key(key: &str) -> Option<FaultLevel> {
    Some(match key {
        "NotHandleFaultCodes" | "NotHandleFaultNetworkCodes" => FaultLevel::NotHandleFault,
        "SubHealthFaultCodes" | "SubHealthFaultNetworkCodes" => FaultLevel::SubHealthFault,
        "RestartRequestCodes" => FaultLevel::RestartRequest,
        "RestartBusinessCodes" => FaultLevel::RestartBusiness,
        "FreeRestartNPUCodes" => FaultLevel::FreeRestartNPU,
        "RestartNPUCodes" => FaultLevel::RestartNPU,
        "PreSeparateNPUCodes" | "PreSeparateNPUNetworkCodes" => FaultLevel::PreSeparateNPU,
        "SeparateNPUCodes" | "SeparateNPUNetworkCodes" => FaultLevel::SeparateNPU,
        _ => return None,
    })
}

/// A few codes of MindCluster's `component/ascend-device-plugin/build/faultCode.json`
/// (Ascend/mind-cluster, last changed in `ada4c99b3db0d4c8258851f869ac49bb9b9d0bdc`), with
/// the level that file gives them; used when no file is installed.
pub(crate) const BUILT_IN: &[(u64, FaultLevel)] = &[
    (0x80E0_1801, FaultLevel::RestartBusiness), // HBM multi-bit ECC on access
    (0x80E1_8400, FaultLevel::NotHandleFault),  // HBM multi-bit ECC, with the host PID
    (0x80E1_8401, FaultLevel::NotHandleFault),  // HBM isolated rows reached 16
    (0x80E1_8402, FaultLevel::SeparateNPU),     // HBM isolated rows reached 64
    (0x80E1_8005, FaultLevel::RestartNPU),      // HBM controller parity
    (0x80E1_8008, FaultLevel::RestartNPU),      // HBM controller multi-bit ECC
    (0x80C9_8001, FaultLevel::RestartNPU),      // AI Core reset failure
    (0x80C9_8002, FaultLevel::RestartRequest),  // AI Core external input error
    (0x80C9_8008, FaultLevel::RestartRequest),  // AI Core multi-bit ECC
    (0x80CB_8002, FaultLevel::RestartRequest),  // AI Vector external input error
    (0x8107_8603, FaultLevel::NotHandleFault),  // network port link down
    (0x8107_8605, FaultLevel::SubHealthFault),  // some lanes of a RoCE port faulty
    (0x819B_8003, FaultLevel::NotHandleFault),  // HCCS configuration error
    (0x40F8_4E00, FaultLevel::RestartNPU),      // host-device heartbeat lost (card drop)
    (0x8C20_4E00, FaultLevel::RestartBusiness), // tsdaemon heartbeat lost
];

/// How many repeated codes [`FaultTable::describe`] names; the line stays one line.
const SHOWN_REPEATS: usize = 8;

/// Why a `faultCode.json` cannot be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TableError {
    /// Not a regular file, too large, missing, unreadable, not UTF-8.
    #[error("{}: {why}", .path.display())]
    Read { path: PathBuf, why: String },
    #[error("{}: not JSON: {source}", .path.display())]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{}: {what}", .path.display())]
    Shape { path: PathBuf, what: String },
}

/// Code → level, and where the table came from.
#[derive(Debug, Clone)]
pub(crate) struct FaultTable {
    levels: HashMap<u64, FaultLevel>,
    /// The file read, or `built-in (…)`.
    pub origin: String,
    /// Keys of the file the agent does not know (a newer MindCluster); ignored.
    pub unknown_keys: Vec<String>,
    /// Codes the file lists more than once (MindCluster's own file does), in order; each
    /// takes the most severe of its levels.
    pub repeated: Vec<u64>,
}

impl FaultTable {
    /// The table `[agent] fault_code_file` names; without one, MindCluster's file at
    /// [`DEFAULT_PATH`] where it exists, else the built-in table.
    pub(crate) fn configured(file: Option<&std::path::Path>) -> Result<FaultTable, TableError> {
        match file {
            Some(p) => FaultTable::load(p),
            None if std::path::Path::new(DEFAULT_PATH).exists() => {
                FaultTable::load(std::path::Path::new(DEFAULT_PATH))
            }
            None => Ok(FaultTable::built_in()),
        }
    }

    /// The built-in table.
    pub(crate) fn built_in() -> FaultTable {
        FaultTable {
            levels: BUILT_IN.iter().copied().collect(),
            // The count is `describe`'s to say, once.
            origin: "built-in (mind-cluster's faultCode.json at ada4c99)".to_owned(),
            unknown_keys: Vec::new(),
            repeated: Vec::new(),
        }
    }

    /// Reads `path` through the configuration's bounded reader, which never waits on a FIFO
    /// and stops at 4 MiB (a `/dev/zero` or a runaway file once grew the agent past its
    /// unit's `MemoryMax`). Blocking file I/O: call it off the async runtime.
    pub(crate) fn load(path: &Path) -> Result<FaultTable, TableError> {
        let text = crate::config::read::text(path).map_err(|why| TableError::Read {
            path: path.to_owned(),
            why,
        })?;
        FaultTable::parse(&text, path)
    }

    /// Parses the text of a `faultCode.json` (`path` names it in errors). A code listed more
    /// than once takes the most severe of its levels (MindCluster's own file lists
    /// `A2301001` under two levels, `B4060011` twice in one); a list key written twice, or a
    /// table without a single code, is refused.
    pub(crate) fn parse(text: &str, path: &Path) -> Result<FaultTable, TableError> {
        let shape = |what: String| TableError::Shape {
            path: path.to_owned(),
            what,
        };
        let Entries(entries) = serde_json::from_str(text).map_err(|source| {
            if source.classify() == serde_json::error::Category::Data {
                shape("the top level must be an object of code lists".to_owned())
            } else {
                TableError::Json {
                    path: path.to_owned(),
                    source,
                }
            }
        })?;
        let mut levels: HashMap<u64, FaultLevel> = HashMap::new();
        let mut seen_keys = HashSet::new();
        let mut unknown_keys = Vec::new();
        let mut known = Vec::new();
        let mut repeated = Vec::new();
        for (key, list) in &entries {
            if !seen_keys.insert(key.as_str()) {
                return Err(shape(format!(
                    "\"{key}\" is written twice; a JSON reader would keep one list and drop the other silently: merge them into one"
                )));
            }
            let Some(level) = level_of_key(key) else {
                unknown_keys.push(key.clone());
                continue;
            };
            known.push(key.as_str());
            let serde_json::Value::Array(codes) = list else {
                return Err(shape(format!("\"{key}\" must be a list of hex strings")));
            };
            for (i, c) in codes.iter().enumerate() {
                let code = match c.as_str().map(parse_code) {
                    Some(Ok(code)) => code,
                    Some(Err(why)) => {
                        return Err(shape(format!(
                            "\"{key}\"[{i}] is {}, not a hex code: {why}",
                            crate::logging::quote(c.as_str().unwrap_or_default())
                        )));
                    }
                    None => {
                        return Err(shape(format!(
                            "\"{key}\"[{i}] is {}, not a hex code",
                            crate::logging::clip(&c.to_string())
                        )));
                    }
                };
                match levels.entry(code) {
                    Entry::Vacant(v) => {
                        v.insert(level);
                    }
                    Entry::Occupied(mut o) => {
                        repeated.push(code);
                        let most = (*o.get()).max(level);
                        o.insert(most);
                    }
                }
            }
        }
        // Each repeated code once, where it was first repeated (a set, not a search of the
        // list: a 4 MiB file holds some 380,000 codes).
        let mut named = HashSet::new();
        repeated.retain(|c| named.insert(*c));
        if known.is_empty() {
            return Err(shape(
                "no list the agent knows (NotHandleFaultCodes, RestartBusinessCodes, SeparateNPUCodes, …)"
                    .to_owned(),
            ));
        }
        if levels.is_empty() {
            return Err(shape(format!(
                "every list is empty ({}): a table without codes classifies nothing; list the codes, or leave fault_code_file unset",
                known.join(", ")
            )));
        }
        Ok(FaultTable {
            levels,
            origin: path.display().to_string(),
            unknown_keys,
            repeated,
        })
    }

    /// The level of `code`.
    pub(crate) fn level(&self, code: u64) -> FaultLevel {
        self.levels
            .get(&code)
            .copied()
            .unwrap_or(FaultLevel::Unclassified)
    }

    /// `<origin> (<N> codes; lists not read: …; listed more than once: …)`, as
    /// `check-config` and the log say it.
    pub(crate) fn describe(&self) -> String {
        let mut notes = String::new();
        if !self.unknown_keys.is_empty() {
            notes += &format!("; lists not read: {}", self.unknown_keys.join(", "));
        }
        if !self.repeated.is_empty() {
            let mut codes: Vec<String> = self
                .repeated
                .iter()
                .take(SHOWN_REPEATS)
                .map(|c| format!("{c:08X}"))
                .collect();
            if self.repeated.len() > SHOWN_REPEATS {
                codes.push(format!("… {} more", self.repeated.len() - SHOWN_REPEATS));
            }
            notes += &format!(
                "; listed more than once, the most severe level holds: {}",
                codes.join(", ")
            );
        }
        format!("{} ({} codes{notes})", self.origin, self.len())
    }

    /// How many codes it classifies.
    pub(crate) fn len(&self) -> usize {
        self.levels.len()
    }
}

/// The top-level object's entries in the file's order, a key written twice kept twice
/// (`serde_json::Value`'s map keeps the last one and says nothing).
struct Entries(Vec<(String, serde_json::Value)>);

impl<'de> serde::Deserialize<'de> for Entries {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(EntriesVisitor)
    }
}

struct EntriesVisitor;

impl<'de> serde::de::Visitor<'de> for EntriesVisitor {
    type Value = Entries;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an object of code lists")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Entries, A::Error> {
        let mut entries = Vec::new();
        while let Some(entry) = map.next_entry()? {
            entries.push(entry);
        }
        Ok(Entries(entries))
    }
}

/// Why a string is not a fault code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum NotACode {
    #[error("no hex digit")]
    Empty,
    #[error("more than 16 hex digits")]
    TooLong,
    /// `+80E18402`: Rust's own hex parser takes a leading `+`, a fault code has no sign.
    #[error("a sign is not part of a hex code")]
    Sign,
    #[error("{0:?} is not a hex digit")]
    NotHex(char),
}

/// A code as `faultCode.json` and `npu-smi` write it: hex digits only, without `0x` (an
/// `0x` is accepted), at most 16 of them (some codes are wider than the 32 bits of the DCMI
/// list).
pub(crate) fn parse_code(s: &str) -> Result<u64, NotACode> {
    let hex = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    if let Some(c) = hex.chars().find(|c| !c.is_ascii_hexdigit()) {
        return Err(if c == '+' || c == '-' {
            NotACode::Sign
        } else {
            NotACode::NotHex(c)
        });
    }
    if hex.is_empty() {
        return Err(NotACode::Empty);
    }
    if hex.len() > 16 {
        return Err(NotACode::TooLong);
    }
    // Only hex digits, at most 16: fits.
    u64::from_str_radix(hex, 16).map_err(|_| NotACode::TooLong)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<FaultTable, TableError> {
        FaultTable::parse(text, Path::new("faultCode.json"))
    }

    #[test]
    fn the_file_lists_codes_by_level_and_the_more_severe_wins() {
        let t = parse(
            r#"{"NotHandleFaultCodes": ["81078603"], "RestartBusinessCodes": ["80E01801", "A2301001"],
                "SeparateNPUCodes": ["a2301001", "0x80E18402"], "SubHealthFaultNetworkCodes": ["81078605"],
                "PreSeparateNPUCodes": ["110001024"], "SwitchFaultCodes": ["1"]}"#,
        )
        .unwrap();
        assert_eq!(t.level(0x8107_8603), FaultLevel::NotHandleFault);
        assert_eq!(t.level(0x80E0_1801), FaultLevel::RestartBusiness);
        assert_eq!(
            t.level(0xA230_1001),
            FaultLevel::SeparateNPU,
            "listed twice"
        );
        assert_eq!(t.level(0x80E1_8402), FaultLevel::SeparateNPU);
        assert_eq!(t.level(0x8107_8605), FaultLevel::SubHealthFault);
        assert_eq!(
            t.level(0x1_1000_1024),
            FaultLevel::PreSeparateNPU,
            "wider than 32 bits"
        );
        assert_eq!(t.level(0xDEAD_BEEF), FaultLevel::Unclassified);
        assert_eq!(t.unknown_keys, ["SwitchFaultCodes"]);
        assert_eq!(t.len(), 6);
    }

    #[test]
    fn a_malformed_file_names_what_is_wrong() {
        let err = |t: &str| parse(t).unwrap_err().to_string();
        assert!(err("{").contains("not JSON"), "{}", err("{"));
        assert!(err("[1]").contains("top level"));
        assert!(
            err(r#"{"SeparateNPUCodes": "80E18402"}"#)
                .contains("\"SeparateNPUCodes\" must be a list")
        );
        let e = err(r#"{"SeparateNPUCodes": ["80E18402", "xyz"]}"#);
        assert!(
            e.contains("\"SeparateNPUCodes\"[1] is \"xyz\", not a hex code"),
            "{e}"
        );
        assert!(err(r#"{"SeparateNPUCodes": [80]}"#).contains("[0] is 80"));
        assert!(err(r#"{"Other": []}"#).contains("no list the agent knows"));
        assert!(err(r#"{"SeparateNPUCodes": ["12345678901234567"]}"#).contains("not a hex code"));
    }

    // Issue 48, N8: `+80E18402` was read as 80E18402 (Rust's hex parser takes a sign). A
    // code is hex digits alone, an `0x` before them at most.
    #[test]
    fn a_code_is_hex_digits_alone_and_a_sign_is_refused_by_name() {
        let rows: &[(&str, Result<u64, NotACode>)] = &[
            ("80E18402", Ok(0x80E1_8402)),
            ("80e18402", Ok(0x80E1_8402)),
            ("0x80E18402", Ok(0x80E1_8402)),
            ("0X80E18402", Ok(0x80E1_8402)),
            ("110001024", Ok(0x1_1000_1024)),
            ("FFFFFFFFFFFFFFFF", Ok(u64::MAX)),
            ("+80E18402", Err(NotACode::Sign)),
            ("-80E18402", Err(NotACode::Sign)),
            ("0x+80E18402", Err(NotACode::Sign)),
            ("+", Err(NotACode::Sign)),
            ("", Err(NotACode::Empty)),
            ("0x", Err(NotACode::Empty)),
            ("12345678901234567", Err(NotACode::TooLong)),
            (" 80E18402", Err(NotACode::NotHex(' '))),
            ("80E1_8402", Err(NotACode::NotHex('_'))),
            ("xyz", Err(NotACode::NotHex('x'))),
            ("８０", Err(NotACode::NotHex('８'))),
        ];
        for (text, want) in rows {
            assert_eq!(parse_code(text), *want, "{text:?}");
        }
        let e = parse(r#"{"SeparateNPUCodes": ["+80E18402"]}"#)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"SeparateNPUCodes\"[0] is \"+80E18402\", not a hex code: a sign is not part of a hex code"),
            "{e}"
        );
        // What is quoted from the file is cut, however long the entry.
        let long = format!(r#"{{"SeparateNPUCodes": ["{}"]}}"#, "z".repeat(100_000));
        assert!(parse(&long).unwrap_err().to_string().len() < 1_000);
    }

    /// `load(path)` on a thread; a regression that blocks fails after `limit` instead of
    /// hanging the test run.
    fn load_within(path: &Path, limit: std::time::Duration) -> Result<FaultTable, TableError> {
        let (tx, rx) = std::sync::mpsc::channel();
        let path = path.to_owned();
        std::thread::spawn(move || tx.send(FaultTable::load(&path)));
        rx.recv_timeout(limit)
            .expect("the load did not return: it blocked on the file")
    }

    use crate::config::read::mkfifo;

    // Issue 41: a FIFO as faultCode.json hung check-config, the start and a reload (opening
    // it waits for a writer that never comes).
    #[test]
    fn a_fifo_is_refused_without_waiting_for_a_writer() {
        let d = tempfile::tempdir().unwrap();
        let fifo = d.path().join("faultCode.json");
        mkfifo(&fifo);
        let e = load_within(&fifo, std::time::Duration::from_secs(30))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(&fifo.display().to_string())
                && e.contains("is a FIFO, not a regular file"),
            "{e}"
        );
    }

    // Issue 41: /dev/zero grew the agent to 2.1 GB, 22 MB of codes past its MemoryMax.
    #[test]
    fn dev_zero_and_a_file_over_4_mib_are_refused() {
        let e = load_within(Path::new("/dev/zero"), std::time::Duration::from_secs(30))
            .unwrap_err()
            .to_string();
        assert!(e.contains("/dev/zero: is a character device"), "{e}");
        let d = tempfile::tempdir().unwrap();
        let big = d.path().join("faultCode.json");
        // Valid JSON just over the bound: the size, not the content, refuses it.
        let pad = " ".repeat(crate::config::read::MAX_BYTES as usize);
        std::fs::write(
            &big,
            format!("{{\"SeparateNPUCodes\": [\"80E18402\"]}}{pad}"),
        )
        .unwrap();
        let e = FaultTable::load(&big).unwrap_err().to_string();
        assert!(e.contains("is larger than 4 MiB"), "{e}");
    }

    // Issue 41: serde_json keeps the last of two lists under one key and says nothing.
    #[test]
    fn a_list_key_written_twice_is_refused() {
        let e = parse(
            r#"{"SeparateNPUCodes": ["80E18402"], "NotHandleFaultCodes": ["81078603"],
                "SeparateNPUCodes": ["80E3A201"]}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("\"SeparateNPUCodes\" is written twice") && e.contains("merge them"),
            "{e}"
        );
        let e = parse(r#"{"SeparateNPUCodes": ["80E18402"], "Other": [], "Other": []}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"Other\" is written twice"), "{e}");
    }

    // Issue 41: a table whose lists were all empty passed check-config and classified nothing.
    #[test]
    fn a_table_whose_lists_are_all_empty_is_refused() {
        let e = parse(r#"{"SeparateNPUCodes": [], "RestartNPUCodes": [], "Other": ["1"]}"#)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("every list is empty (SeparateNPUCodes, RestartNPUCodes)"),
            "{e}"
        );
    }

    // MindCluster's own faultCode.json lists a code twice in one list (`B4060011`), once in
    // two cases (`80818c00`, `80818C00`) and one under two levels (`A2301001`): it is
    // accepted, the most severe level holds, and the repeats are named, not silent.
    #[test]
    fn a_code_listed_more_than_once_takes_the_most_severe_level_and_is_named() {
        let t = parse(
            r#"{"RestartBusinessCodes": ["B4060011", "A2301001", "B4060011"],
                "SeparateNPUCodes": ["80818c00", "A2301001", "80818C00"]}"#,
        )
        .unwrap();
        assert_eq!(t.level(0xA230_1001), FaultLevel::SeparateNPU);
        assert_eq!(t.level(0xB406_0011), FaultLevel::RestartBusiness);
        assert_eq!(t.repeated, [0xB406_0011, 0xA230_1001, 0x8081_8C00]);
        assert_eq!(
            t.describe(),
            "faultCode.json (3 codes; listed more than once, the most severe level holds: B4060011, A2301001, 80818C00)"
        );
        let many: Vec<String> = (1..=10).map(|c| format!("\"{c:X}\"")).collect();
        let list = many.join(", ");
        let t = parse(&format!(r#"{{"NotHandleFaultCodes": [{list}, {list}]}}"#)).unwrap();
        assert_eq!(t.repeated.len(), 10);
        assert!(
            t.describe().ends_with(": 00000001, 00000002, 00000003, 00000004, 00000005, 00000006, 00000007, 00000008, … 2 more)"),
            "{}",
            t.describe()
        );
    }

    #[test]
    fn serde_and_as_str_name_every_level_alike() {
        for l in FaultLevel::ALL {
            let json = serde_json::to_string(&l).unwrap();
            assert_eq!(
                json,
                format!("\"{}\"", l.as_str()),
                "serde and as_str agree"
            );
            assert_eq!(serde_json::from_str::<FaultLevel>(&json).unwrap(), l);
        }
    }

    // Issue 48: check-config printed "built-in (15 codes of …) (15 codes)".
    #[test]
    fn the_built_in_table_says_its_count_once() {
        let t = FaultTable::built_in();
        assert_eq!(
            t.describe(),
            format!(
                "built-in (mind-cluster's faultCode.json at ada4c99) ({} codes)",
                BUILT_IN.len()
            )
        );
    }

    #[test]
    fn the_built_in_table_orders_levels_as_mindcluster_does() {
        let t = FaultTable::built_in();
        assert_eq!(t.len(), BUILT_IN.len());
        assert_eq!(t.level(0x80E1_8402), FaultLevel::SeparateNPU);
        assert!(FaultLevel::SeparateNPU > FaultLevel::PreSeparateNPU);
        assert!(FaultLevel::RestartBusiness > FaultLevel::RestartRequest);
        assert!(FaultLevel::SubHealthFault > FaultLevel::NotHandleFault);
        assert!(FaultLevel::NotHandleFault > FaultLevel::Unclassified);
    }
}

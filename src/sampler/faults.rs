//! The driver's fault codes with their MindCluster level: the table in force (replaced on a
//! reload) and the classification every reader uses, so the monitor, the metrics and the
//! views give a code the same level. A code the table does not name is `unclassified`,
//! logged once per code for the agent's life.

use super::status::FaultCode;
use crate::driver::fault_levels::{FaultLevel, FaultTable};
use std::collections::HashSet;
use std::sync::{Arc, Mutex, RwLock};

/// Unclassified codes remembered for the log-once rule; past this, new ones are logged
/// every time they are met rather than remembered (a driver spewing garbage codes must not
/// grow the set without bound).
const MAX_LOGGED: usize = 1024;

/// The table in force and the unclassified codes already logged.
#[derive(Debug)]
pub struct Classifier {
    table: RwLock<Arc<FaultTable>>,
    logged: Mutex<HashSet<u32>>,
}

impl Default for Classifier {
    fn default() -> Self {
        Classifier {
            table: RwLock::new(Arc::new(FaultTable::built_in())),
            logged: Mutex::new(HashSet::new()),
        }
    }
}

/// One fault code on one NPU, with its level.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct NpuFault {
    /// The NPU's logic id.
    pub npu: u32,
    pub code: u32,
    /// `0x80E18402`.
    pub hex: String,
    pub text: Option<String>,
    pub level: FaultLevel,
}

impl NpuFault {
    /// `NPU 3 reports 0x80E18402 (HBM isolated rows reached 64), level SeparateNPU`.
    pub(crate) fn describe(&self) -> String {
        format!(
            "NPU {} reports {}{}, level {}",
            self.npu,
            self.hex,
            self.text
                .as_deref()
                .map(|t| format!(" ({t})"))
                .unwrap_or_default(),
            self.level
        )
    }
}

impl Classifier {
    /// Puts `table` in force.
    pub(crate) fn set_table(&self, table: FaultTable) {
        *self.table.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(table);
    }

    /// The table in force.
    pub(crate) fn table(&self) -> Arc<FaultTable> {
        self.table.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// `codes` of NPU `npu`, each with its level; an unclassified code is logged the first
    /// time it is met.
    pub(crate) fn classify(&self, npu: u32, codes: &[FaultCode]) -> Vec<NpuFault> {
        if codes.is_empty() {
            return Vec::new();
        }
        let table = self.table();
        codes
            .iter()
            .map(|c| {
                let level = table.level(u64::from(c.code));
                if level == FaultLevel::Unclassified && self.first_time(c.code) {
                    tracing::warn!(
                        npu,
                        code = %c.hex,
                        "NPU {npu} reports fault code {}{} that {} does not classify: published as unclassified, never acted on",
                        c.hex,
                        c.text.as_deref().map(|t| format!(" ({t})")).unwrap_or_default(),
                        table.origin
                    );
                }
                NpuFault {
                    npu,
                    code: c.code,
                    hex: c.hex.clone(),
                    text: c.text.clone(),
                    level,
                }
            })
            .collect()
    }

    fn first_time(&self, code: u32) -> bool {
        let mut logged = self.logged.lock().unwrap_or_else(|p| p.into_inner());
        if logged.contains(&code) {
            return false;
        }
        if logged.len() < MAX_LOGGED {
            logged.insert(code);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_take_the_level_of_the_table_in_force() {
        let c = Classifier::default();
        let codes = [
            FaultCode::new(0x80E1_8402, Some("HBM".into())),
            FaultCode::new(0x1234_5678, None),
        ];
        let f = c.classify(2, &codes);
        assert_eq!(f[0].level, FaultLevel::SeparateNPU);
        assert_eq!(f[0].npu, 2);
        assert_eq!(f[1].level, FaultLevel::Unclassified);
        assert_eq!(
            f[0].describe(),
            "NPU 2 reports 0x80E18402 (HBM), level SeparateNPU"
        );
        c.set_table(
            FaultTable::parse(
                r#"{"NotHandleFaultCodes": ["80E18402", "12345678"]}"#,
                std::path::Path::new("t.json"),
            )
            .unwrap(),
        );
        let f = c.classify(2, &codes);
        assert_eq!(f[0].level, FaultLevel::NotHandleFault);
        assert_eq!(f[1].level, FaultLevel::NotHandleFault);
    }

    #[test]
    fn an_unclassified_code_is_remembered_once_and_the_memory_is_bounded() {
        let c = Classifier::default();
        assert!(c.first_time(7));
        assert!(!c.first_time(7));
        for code in 0..(MAX_LOGGED as u32 * 2) {
            c.first_time(1000 + code);
        }
        assert_eq!(c.logged.lock().unwrap().len(), MAX_LOGGED);
    }
}

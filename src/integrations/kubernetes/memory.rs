//! What the Kubernetes API mode keeps of an engine: its record ([`KubeRecord`], shown in
//! `/status/detail`) and the eviction gate's memory ([`GateMemory`]), held in the engine's
//! monitor as this integration's own memory and saved in the state file under the keys
//! `kubernetes` and `eviction_gate` (`null` while there is none), so a restarted agent keeps
//! the record, the cooldown and the back-off; and what the public faults published
//! (`public_fault`, written only once something was: a file of an agent that never published
//! is the same as before).

use super::told::{GateMemory, KubeRecord, Published};
use crate::monitor::Monitor;
use crate::monitor::acted::{Kept, Memory};
use serde_json::value::RawValue;

/// The state file's key of the record.
const RECORD: &str = "kubernetes";
/// The state file's key of the gate's memory.
const GATE: &str = "eviction_gate";
/// The state file's key of what the public faults published.
const PUBLIC_FAULT: &str = "public_fault";

/// The record (`None` while the mode never acted for the engine) and the gate's memory.
#[derive(Debug, Default)]
pub(crate) struct KubeMemory {
    record: Option<KubeRecord>,
    gate: Option<GateMemory>,
    public_fault: Option<Published>,
}

impl Memory for KubeMemory {
    fn save(&self) -> Vec<(&'static str, Box<RawValue>)> {
        // Both are plain data: they always encode.
        let raw = |v: serde_json::Result<Box<RawValue>>| v.expect("plain data encodes");
        let mut out = vec![
            (RECORD, raw(serde_json::value::to_raw_value(&self.record))),
            (GATE, raw(serde_json::value::to_raw_value(&self.gate))),
        ];
        if let Some(p) = &self.public_fault {
            out.push((PUBLIC_FAULT, raw(serde_json::value::to_raw_value(p))));
        }
        out
    }

    fn restore(&mut self, saved: &Kept) {
        self.record = saved.get(RECORD).flatten();
        self.gate = saved.get(GATE).flatten();
        self.public_fault = saved.get(PUBLIC_FAULT);
    }
}

/// A copy of the record of `m` (`/status/detail`'s `kubernetes`, the metrics of its calls).
pub(crate) fn record(m: &Monitor) -> Option<KubeRecord> {
    m.acted().with(|k: &mut KubeMemory| k.record.clone())
}

/// Changes the record of `m` (creating it).
pub(crate) fn update(m: &Monitor, f: impl FnOnce(&mut KubeRecord)) {
    m.acted()
        .with(|k: &mut KubeMemory| f(k.record.get_or_insert_with(KubeRecord::default)));
}

/// The eviction gate's memory of `m`, as last written.
pub(crate) fn gate(m: &Monitor) -> Option<GateMemory> {
    m.acted().with(|k: &mut KubeMemory| k.gate)
}

/// Keeps the eviction gate's memory of `m`.
pub(crate) fn set_gate(m: &Monitor, g: GateMemory) {
    m.acted().with(|k: &mut KubeMemory| k.gate = Some(g));
}

/// What the public faults published for `m`, as last kept.
pub(crate) fn public_fault(m: &Monitor) -> Option<Published> {
    m.acted().with(|k: &mut KubeMemory| k.public_fault.clone())
}

/// Keeps what the public faults published for `m` (the state file is written after).
pub(crate) fn set_public_fault(m: &Monitor, p: Published) {
    m.acted()
        .with(|k: &mut KubeMemory| k.public_fault = Some(p));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::continuity::statefile::StateFile;
    use crate::monitor::saved::Carry;

    /// The state file the agent at 9bb121d wrote (before this memory moved out of the
    /// monitor), with a record and a gate memory.
    fn written_before() -> Vec<u8> {
        std::fs::read(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures/state-v1-kubernetes.json"),
        )
        .unwrap()
    }

    fn engine() -> Monitor {
        let spec = crate::config::file::parse(
            "[[engine]]\nname = \"e2e\"\nhost = \"127.0.0.1\"\nport = 8000\nmgmt_port = 9000\nengine_type = \"vllm\"\nserved_model_name = \"m\"\n",
            std::path::Path::new("agent.toml"),
        )
        .unwrap()
        .engines
        .remove(0);
        Monitor::new(spec, vec![0])
    }

    // An agent restarted across the memory's move reads the state file the one before wrote,
    // forgets nothing of the record or the gate, and writes the same bytes back.
    #[test]
    fn a_state_file_written_before_the_move_is_read_and_written_back_byte_for_byte() {
        let before = written_before();
        let mut file: StateFile = serde_json::from_slice(&before).unwrap();
        let m = engine();
        crate::integrations::equip(&m);
        m.restore(&file.engines[0], Carry::ALL);
        let r = record(&m).expect("the record kept");
        assert_eq!(r.attempts.len(), 3);
        assert_eq!(r.pod.as_deref(), Some("inference/vllm-0"));
        assert_eq!(gate(&m).unwrap().done_at_unix_ms, Some(1796280801500));
        file.engines = vec![m.saved()];
        let before = String::from_utf8(before).unwrap();
        let after = same_progress_clock(
            &before,
            String::from_utf8(serde_json::to_vec(&file).unwrap()).unwrap(),
        );
        assert_eq!(after, before);
    }

    /// `after` with QoS progress's `last_ok_unix_ms` written as in `before` when the two are
    /// at most 1 ms apart: that time is kept as an `Instant` and goes back through the clock
    /// on the way out (`qos::progress`), which can round a millisecond either way. Not this
    /// memory's keys: they must come back byte for byte.
    fn same_progress_clock(before: &str, after: String) -> String {
        const KEY: &str = "\"last_ok_unix_ms\":";
        let value = |s: &str| {
            let at = s.find(KEY).map(|i| i + KEY.len())?;
            let digits: String = s[at..].chars().take_while(char::is_ascii_digit).collect();
            Some((at, digits))
        };
        match (value(before), value(&after)) {
            (Some((_, b)), Some((at, a))) if b != a => {
                let (bn, an): (u64, u64) = (b.parse().unwrap(), a.parse().unwrap());
                assert!(
                    bn.abs_diff(an) <= 1,
                    "last_ok_unix_ms {bn} came back as {an}"
                );
                format!("{}{b}{}", &after[..at], &after[at + a.len()..])
            }
            _ => after,
        }
    }

    // Restored before the mode first asks for its memory (no engine equipped), the record is
    // still there when it asks; an engine equipped writes both keys, null, before any.
    #[test]
    fn the_memory_is_kept_whether_made_before_or_after_the_restore() {
        let file: StateFile = serde_json::from_slice(&written_before()).unwrap();
        let m = engine();
        m.restore(&file.engines[0], Carry::ALL);
        assert_eq!(record(&m).unwrap().api_errors, 1);
        assert_eq!(gate(&m).unwrap().backoff_ms, 2000);
        let fresh = engine();
        crate::integrations::equip(&fresh);
        let text = serde_json::to_string(&fresh.saved()).unwrap();
        assert!(
            text.ends_with(r#","kubernetes":null,"eviction_gate":null}"#),
            "{text}"
        );
    }
}

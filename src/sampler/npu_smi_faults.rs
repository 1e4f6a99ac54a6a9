//! Fault codes of the NPUs that have no DCMI chip (no `libdcmi.so`, or one without the
//! chip): `npu-smi info -t health -i <card> -c <chip>` per NPU on a thread of its own, so a
//! slow tool never delays the watchdog or the AI Cube readings. Each run is a process that
//! loads the driver, so it reads at most every [`MIN_PERIOD`], not the DCMI thread's 1 s.
//!
//! What the tool shows is what the DCMI call returns, with one quiet difference taken from
//! its source (docs/fault-codes.md): when the chip reports no code it prints `OK` whatever
//! the health word, so "no code" here is the same "no code" as DCMI's.

use super::Shared;
use super::status::FaultCode;
use crate::driver::npu_smi;
use crossbeam_channel::Receiver;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Shortest time between two reads of an NPU's faults through `npu-smi`.
pub(super) const MIN_PERIOD: Duration = Duration::from_secs(5);
/// Longest wait for one `npu-smi info -t health`.
pub(super) const TIMEOUT: Duration = Duration::from_secs(5);

/// Thread body: reads the faults of the devices at `indices` (ring order) every `period`
/// (at least [`MIN_PERIOD`]) until `stop` disconnects.
pub(super) fn run(
    shared: Arc<Shared>,
    npu_smi: PathBuf,
    indices: Vec<usize>,
    period: Duration,
    stop: Receiver<()>,
    done: crossbeam_channel::Sender<()>,
) {
    // Disconnects when the thread ends, however it ends.
    let _done = done;
    let period = period.max(MIN_PERIOD);
    loop {
        for &i in &indices {
            let Some(d) = shared.devices.get(i) else {
                continue;
            };
            let read = npu_smi::health(&npu_smi, d.info.card, d.info.chip, TIMEOUT)
                .map(|h| codes(&h))
                .map_err(|e| e.to_string());
            if let Err(e) = &read {
                tracing::debug!(npu = d.info.id, "fault codes not read: {e}");
            }
            d.record_faults(shared.ring.now_ns(), read);
            if stop.try_recv() != Err(crossbeam_channel::TryRecvError::Empty) {
                return;
            }
        }
        match stop.recv_timeout(period) {
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
            _ => return,
        }
    }
}

/// The codes of one `npu-smi info -t health`, each with the text printed for it: the tool
/// prints one per code, in order; when the counts differ (a text the parser could not
/// read) no text is attached rather than the wrong one.
fn codes(h: &npu_smi::parse::ChipHealth) -> Vec<FaultCode> {
    let paired = h.texts.len() == h.codes.len();
    h.codes
        .iter()
        .enumerate()
        .filter(|(_, c)| **c != 0)
        .map(|(k, &c)| {
            let text = if paired {
                h.texts.get(k).cloned()
            } else {
                None
            };
            FaultCode::new(c, text.filter(|t| !t.is_empty()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_code_takes_the_text_printed_for_it_or_none() {
        let mut h = npu_smi::parse::ChipHealth {
            health: "Alarm".into(),
            codes: vec![0x80E0_1801, 0x80C9_8002],
            texts: vec!["HBM ECC".into(), "AI Core input".into()],
        };
        assert_eq!(
            codes(&h),
            [
                FaultCode::new(0x80E0_1801, Some("HBM ECC".into())),
                FaultCode::new(0x80C9_8002, Some("AI Core input".into()))
            ]
        );
        // One text missing: which code it belonged to is unknown, so none is attached.
        h.texts.pop();
        assert_eq!(
            codes(&h),
            [
                FaultCode::new(0x80E0_1801, None),
                FaultCode::new(0x80C9_8002, None)
            ]
        );
    }
}

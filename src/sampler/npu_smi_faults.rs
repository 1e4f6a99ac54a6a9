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
pub const MIN_PERIOD: Duration = Duration::from_secs(5);
/// Longest wait for one `npu-smi info -t health`.
pub const TIMEOUT: Duration = Duration::from_secs(5);

/// Thread body: reads the faults of the devices at `indices` (ring order) every `period`
/// (at least [`MIN_PERIOD`]) until `stop` disconnects.
pub fn run(
    shared: Arc<Shared>,
    npu_smi: PathBuf,
    indices: Vec<usize>,
    period: Duration,
    stop: Receiver<()>,
) {
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

/// The codes of one `npu-smi info -t health`, each with the text printed for it (the tool
/// prints one per code, in order).
fn codes(h: &npu_smi::parse::ChipHealth) -> Vec<FaultCode> {
    h.codes
        .iter()
        .enumerate()
        .filter(|(_, c)| **c != 0)
        .map(|(k, &c)| {
            FaultCode::new(
                c,
                h.texts
                    .get(k)
                    .filter(|t| !t.is_empty() && *t != "NA")
                    .cloned(),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_code_takes_the_text_printed_for_it() {
        let h = npu_smi::parse::ChipHealth {
            health: "Alarm".into(),
            codes: vec![0x80E0_1801, 0, 0x80C9_8002],
            texts: vec!["HBM ECC".into(), "zero".into()],
        };
        assert_eq!(
            codes(&h),
            [
                FaultCode::new(0x80E0_1801, Some("HBM ECC".into())),
                FaultCode::new(0x80C9_8002, None)
            ]
        );
    }
}

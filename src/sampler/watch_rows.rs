//! The rows of an `npu-smi` watch child, device by device: a reading or an invalid sample with
//! its pseudo code where the watch serves its device, an opinion on type 14's zeros where it
//! only cross-checks them. The watchdog ([`super::watchdog`]) runs the children and hands each
//! row here.

use super::Shared;
use super::codes;
use super::plausibility::NpuSmiCheck;
use super::source::{Source, SourceReason};
use crate::driver::dcmi::UtilType;
use crate::driver::npu_smi::{Cube, WatchUpdate};
use crate::ring::Sample;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// A cross-check watch's row `u` on device `idx`: stored as an opinion on type 14's zeros;
/// `true` when type 14 kept reading 0 against busy rows and the watch now serves the device
/// (the row is then a reading too).
pub(super) fn cross_check_row(
    shared: &Shared,
    idx: usize,
    serving: &AtomicBool,
    check: &mut NpuSmiCheck,
    u: &WatchUpdate,
    ts: u64,
) -> bool {
    let WatchUpdate::Reading(Cube::Percent(v)) = *u else {
        return false;
    };
    let dev = &shared.devices[idx];
    dev.record_npu_smi_opinion(ts, v);
    // The latest type-14 answer at most a few passes old.
    let age = (shared.sampler.period() * 3).max(Duration::from_millis(250));
    let type14 = dev
        .type14_latest(ts, age)
        .map(|t| u8::try_from(t).unwrap_or(u8::MAX));
    if !(check.row(v, type14) && dev.replace_source(Source::DCMI_SINGLE, Source::NPU_SMI)) {
        return false;
    }
    serving.store(true, Ordering::Release);
    dev.clear_npu_smi_opinion();
    dev.set_reason(SourceReason::Type14Zero, u32::from(v), UtilType::AiCube);
    tracing::warn!(
        device = dev.info.id,
        "utilization type 14 keeps reading 0 while npu-smi reads {v} %; AI Cube now read from npu-smi info watch -s u"
    );
    true
}

/// What a row of a watch that serves its device stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Row {
    /// A reading, percent.
    Reading(u8),
    /// An invalid sample with this pseudo code, and the warning logged when a run of
    /// failures starts (`None`: none).
    Invalid(i32, Option<&'static str>),
}

/// The row `u` is on a device (`gone`: the driver says it does not exist, so its rows are
/// no readings); `None` when `u` is no row but an event of the child.
pub(super) fn row_of(u: &WatchUpdate, gone: bool) -> Option<Row> {
    match u {
        WatchUpdate::Reading(_) | WatchUpdate::NoCubeColumn if gone => {
            Some(Row::Invalid(codes::DEVICE_GONE, None))
        }
        WatchUpdate::Reading(Cube::Percent(v)) => Some(Row::Reading(*v)),
        WatchUpdate::Reading(Cube::Na) => Some(Row::Invalid(
            codes::NA,
            Some("npu-smi reports NA for AI Cube"),
        )),
        WatchUpdate::Reading(Cube::OutOfRange) => Some(Row::Invalid(
            codes::BAD_VALUE,
            Some("npu-smi reports an AI Cube figure above 100 %; ignored"),
        )),
        WatchUpdate::NoCubeColumn => Some(Row::Invalid(
            codes::NO_CUBE_COLUMN,
            Some("npu-smi watch output has no AI Cube column; rows ignored"),
        )),
        WatchUpdate::Message(_) | WatchUpdate::SpawnFailed(_) | WatchUpdate::Exited { .. } => None,
    }
}

/// Stores `row` of device `idx` at ring time `ts`.
pub(super) fn store_row(shared: &Shared, idx: usize, ts: u64, row: Row) {
    let dev = &shared.devices[idx];
    let (value, valid) = match row {
        Row::Reading(v) => (v, true),
        Row::Invalid(..) => (0, false),
    };
    shared.ring.push(Sample {
        device: idx as u16,
        ts_ns: ts,
        value,
        valid,
    });
    match row {
        Row::Reading(v) => {
            dev.record_value(ts, v);
        }
        Row::Invalid(code, warning) => {
            if dev.record_error(ts, code)
                && let Some(w) = warning
            {
                tracing::warn!(device = dev.info.id, "{w}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Row, row_of};
    use crate::driver::npu_smi::{Cube, WatchUpdate};
    use crate::sampler::codes;
    use std::time::Duration;

    // What a serving watch's row stores, as a table: a reading, or an invalid sample with
    // its pseudo code; a gone device's rows are no readings; events are no rows.
    #[test]
    fn a_watch_row_is_a_reading_or_an_invalid_sample_with_its_code() {
        use WatchUpdate::{Message, NoCubeColumn, Reading};
        let exited = WatchUpdate::Exited {
            status: None,
            rows: 3,
            retry_in: Duration::from_secs(1),
        };
        // (update, device gone, Ok(reading) or Err(code); None: no row)
        type Case = (WatchUpdate, bool, Option<Result<u8, i32>>);
        let table: [Case; 10] = [
            (Reading(Cube::Percent(42)), false, Some(Ok(42))),
            (
                Reading(Cube::Percent(42)),
                true,
                Some(Err(codes::DEVICE_GONE)),
            ),
            (Reading(Cube::Na), false, Some(Err(codes::NA))),
            (Reading(Cube::Na), true, Some(Err(codes::DEVICE_GONE))),
            (
                Reading(Cube::OutOfRange),
                false,
                Some(Err(codes::BAD_VALUE)),
            ),
            (NoCubeColumn, false, Some(Err(codes::NO_CUBE_COLUMN))),
            (NoCubeColumn, true, Some(Err(codes::DEVICE_GONE))),
            (Message("x".to_owned()), false, None),
            (Message("x".to_owned()), true, None),
            (exited, false, None),
        ];
        for (u, gone, want) in &table {
            let got = row_of(u, *gone).map(|r| match r {
                Row::Reading(v) => Ok(v),
                Row::Invalid(c, _) => Err(c),
            });
            assert_eq!(got, *want, "{u:?}, gone {gone}");
        }
        assert_eq!(
            row_of(&Reading(Cube::Percent(7)), true),
            Some(Row::Invalid(codes::DEVICE_GONE, None)),
            "a gone device's row warns nothing of its own"
        );
    }
}

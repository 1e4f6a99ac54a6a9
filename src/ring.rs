//! Lock-free ring of AI Cube samples for every monitored NPU.
//!
//! Fixed capacity, allocated once. A sample is packed into one 64-bit word (device, value,
//! validity and a microsecond timestamp), so a slot is a single `AtomicU64`: writers (the DCMI
//! sampler thread, the `npu-smi` watch threads, the watchdog) claim a slot with one `fetch_add`
//! and publish the sample with one store, and readers load whole samples with one load. No
//! writer ever blocks, allocates or waits for a reader, any number of readers can scan while
//! writers run, and no reader can see half of one sample and half of another: that holds by
//! the slot's type (`AtomicU64`), so no test tries to catch a torn read (one did, and could
//! not fail); `packs_round_trip` checks the packing. The oldest samples are overwritten. No
//! `unsafe`.
//!
//! Limits of the packing: at most 256 devices, values 0..=127 (AI Cube is 0..=100), timestamps
//! with microsecond resolution up to 2^47 µs (4.4 years) after the ring was created.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Most devices a ring can tell apart.
pub(crate) const MAX_DEVICES: usize = 256;

const WRITTEN: u64 = 1 << 63;
const TS_SHIFT: u32 = 16;
const TS_MAX_US: u64 = (1 << 47) - 1;
const VALID: u64 = 1 << 7;

/// One AI Cube reading (or a failed attempt to get one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// Index of the device in the sampler's device table (below [`MAX_DEVICES`]).
    pub device: u16,
    /// Monotonic time of the reading, nanoseconds since the ring was created (stored with
    /// microsecond resolution).
    pub ts_ns: u64,
    /// AI Cube usage in percent; meaningful only when `valid`.
    pub value: u8,
    /// False for a failed, missing, stale or hung reading: never counted as 0 %.
    pub valid: bool,
}

impl Sample {
    fn pack(&self) -> u64 {
        let us = (self.ts_ns / 1000).min(TS_MAX_US);
        WRITTEN
            | us << TS_SHIFT
            | u64::from(self.device & 0xff) << 8
            | if self.valid { VALID } else { 0 }
            | u64::from(self.value.min(127))
    }

    fn unpack(word: u64) -> Option<Sample> {
        (word & WRITTEN != 0).then(|| Sample {
            device: ((word >> 8) & 0xff) as u16,
            ts_ns: ((word >> TS_SHIFT) & TS_MAX_US) * 1000,
            value: (word & 0x7f) as u8,
            valid: word & VALID != 0,
        })
    }
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("capacity", &self.capacity())
            .field("written", &self.written())
            .finish()
    }
}

/// The sample ring. Share it with `Arc`.
pub struct Ring {
    slots: Box<[AtomicU64]>,
    mask: u64,
    head: AtomicU64,
    epoch: Instant,
}

impl Ring {
    /// A ring holding at least `capacity` samples (rounded up to a power of two, minimum 64).
    pub fn new(capacity: usize) -> Ring {
        let cap = capacity.max(64).next_power_of_two();
        Ring {
            slots: (0..cap).map(|_| AtomicU64::new(0)).collect(),
            mask: cap as u64 - 1,
            head: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    /// Capacity to keep `retention` of samples for `devices` devices written every `period`.
    pub fn capacity_for(devices: usize, period: Duration, retention: Duration) -> usize {
        let per_device = retention.as_nanos() / period.as_nanos().max(1) + 1;
        (per_device as usize).saturating_mul(devices.max(1))
    }

    /// Number of slots.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Nanoseconds since the ring was created (the clock of [`Sample::ts_ns`]).
    pub fn now_ns(&self) -> u64 {
        self.ns_at(Instant::now())
    }

    /// `at` on the ring's clock (0 for instants before the ring existed).
    pub(crate) fn ns_at(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.epoch).as_nanos() as u64
    }

    /// Total samples ever written.
    pub(crate) fn written(&self) -> u64 {
        self.head.load(Ordering::Acquire)
    }

    /// Appends a sample. Never blocks, never allocates.
    pub fn push(&self, sample: Sample) {
        let i = self.head.fetch_add(1, Ordering::AcqRel);
        self.slots[(i & self.mask) as usize].store(sample.pack(), Ordering::Release);
    }

    /// Visits samples from newest to oldest until `visit` returns false or the ring's history
    /// ends. Returns true if it stopped because `visit` asked to (history was long enough).
    pub(crate) fn scan_back(&self, mut visit: impl FnMut(&Sample) -> bool) -> bool {
        let head = self.head.load(Ordering::Acquire);
        let oldest = head.saturating_sub(self.slots.len() as u64);
        for i in (oldest..head).rev() {
            let word = self.slots[(i & self.mask) as usize].load(Ordering::Acquire);
            if let Some(s) = Sample::unpack(word)
                && !visit(&s)
            {
                return true;
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(device: u16, ts_ns: u64, value: u8, valid: bool) -> Sample {
        Sample {
            device,
            ts_ns,
            value,
            valid,
        }
    }

    #[test]
    fn packs_round_trip() {
        for s in [
            sample(0, 0, 0, false),
            sample(255, TS_MAX_US * 1000, 100, true),
            sample(7, 9_000, 100, true),
            sample(3, 123_456_000, 0, true),
        ] {
            assert_eq!(Sample::unpack(s.pack()), Some(s));
        }
        // Microsecond resolution; saturating beyond 2^47 µs; never-written slots are empty.
        assert_eq!(
            Sample::unpack(sample(1, 1_999, 5, true).pack())
                .unwrap()
                .ts_ns,
            1_000
        );
        assert_eq!(
            Sample::unpack(sample(1, u64::MAX, 5, true).pack())
                .unwrap()
                .ts_ns,
            TS_MAX_US * 1000
        );
        assert_eq!(Sample::unpack(0), None);
    }

    #[test]
    fn newest_first_and_oldest_overwritten() {
        let r = Ring::new(64);
        for i in 0..100u64 {
            r.push(sample(0, i * 1000, (i % 100) as u8, true));
        }
        let mut seen = Vec::new();
        r.scan_back(|s| {
            seen.push(s.ts_ns / 1000);
            true
        });
        assert_eq!(seen.len(), 64);
        assert_eq!(seen[0], 99);
        assert_eq!(*seen.last().unwrap(), 36);
    }

    #[test]
    fn capacity_rounds_up() {
        assert_eq!(Ring::new(1).capacity(), 64);
        assert_eq!(Ring::new(1000).capacity(), 1024);
        assert_eq!(
            Ring::capacity_for(16, Duration::from_millis(50), Duration::from_secs(30)),
            16 * 601
        );
    }
}

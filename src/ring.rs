//! Lock-free ring of AI Cube samples for every monitored NPU.
//!
//! Fixed capacity, allocated once. Writers (the DCMI sampler thread, the `npu-smi` watch
//! threads, the watchdog) claim a slot with one `fetch_add` and publish it through a per-slot
//! sequence number (a seqlock built only from atomics, so no `unsafe`): a writer never blocks,
//! never allocates and never waits for a reader. Readers copy a slot and keep it only if the
//! sequence number was even and unchanged around the copy, so any number of readers can scan
//! while writers run. The oldest samples are overwritten.

use std::sync::atomic::{AtomicU64, Ordering, fence};
use std::time::{Duration, Instant};

/// One AI Cube reading (or a failed attempt to get one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// Index of the device in the sampler's device table.
    pub device: u16,
    /// Monotonic time of the reading, nanoseconds since the ring was created.
    pub ts_ns: u64,
    /// AI Cube usage in percent; meaningful only when `valid`.
    pub value: u8,
    /// False for a failed, missing, stale or hung reading: never counted as 0 %.
    pub valid: bool,
}

impl Sample {
    fn pack(&self) -> u64 {
        u64::from(self.device) | u64::from(self.value) << 16 | u64::from(self.valid) << 24
    }

    fn unpack(ts_ns: u64, p: u64) -> Sample {
        Sample {
            device: (p & 0xffff) as u16,
            ts_ns,
            value: ((p >> 16) & 0xff) as u8,
            valid: (p >> 24) & 1 == 1,
        }
    }
}

struct Slot {
    /// 2i+1 while sample i is being written, 2i+2 once it is published.
    seq: AtomicU64,
    ts: AtomicU64,
    payload: AtomicU64,
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
    slots: Box<[Slot]>,
    mask: u64,
    head: AtomicU64,
    epoch: Instant,
}

impl Ring {
    /// A ring holding at least `capacity` samples (rounded up to a power of two, minimum 64).
    pub fn new(capacity: usize) -> Ring {
        let cap = capacity.max(64).next_power_of_two();
        let slots = (0..cap)
            .map(|_| Slot {
                seq: AtomicU64::new(0),
                ts: AtomicU64::new(0),
                payload: AtomicU64::new(0),
            })
            .collect();
        Ring {
            slots,
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
    pub fn ns_at(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.epoch).as_nanos() as u64
    }

    /// Total samples ever written.
    pub fn written(&self) -> u64 {
        self.head.load(Ordering::Acquire)
    }

    /// Appends a sample. Never blocks, never allocates.
    pub fn push(&self, sample: Sample) {
        let i = self.head.fetch_add(1, Ordering::AcqRel);
        let slot = &self.slots[(i & self.mask) as usize];
        slot.seq.store(2 * i + 1, Ordering::Relaxed);
        fence(Ordering::Release);
        slot.ts.store(sample.ts_ns, Ordering::Relaxed);
        slot.payload.store(sample.pack(), Ordering::Relaxed);
        slot.seq.store(2 * i + 2, Ordering::Release);
    }

    /// Sample number `i`, if it is published and not yet overwritten.
    fn read(&self, i: u64) -> Option<Sample> {
        let slot = &self.slots[(i & self.mask) as usize];
        let s1 = slot.seq.load(Ordering::Acquire);
        if s1 != 2 * i + 2 {
            return None;
        }
        let ts = slot.ts.load(Ordering::Relaxed);
        let p = slot.payload.load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        (slot.seq.load(Ordering::Relaxed) == s1).then(|| Sample::unpack(ts, p))
    }

    /// Visits samples from newest to oldest until `visit` returns false or the ring's history
    /// ends. Returns true if it stopped because `visit` asked to (history was long enough).
    pub fn scan_back(&self, mut visit: impl FnMut(&Sample) -> bool) -> bool {
        let head = self.head.load(Ordering::Acquire);
        let oldest = head.saturating_sub(self.slots.len() as u64);
        for i in (oldest..head).rev() {
            if let Some(s) = self.read(i)
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
    use std::sync::Arc;

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
            sample(0, 1, 0, false),
            sample(65535, u64::MAX, 255, true),
            sample(7, 9, 100, true),
        ] {
            assert_eq!(Sample::unpack(s.ts_ns, s.pack()), s);
        }
    }

    #[test]
    fn newest_first_and_oldest_overwritten() {
        let r = Ring::new(64);
        for i in 0..100u64 {
            r.push(sample(0, i, (i % 100) as u8, true));
        }
        let mut seen = Vec::new();
        r.scan_back(|s| {
            seen.push(s.ts_ns);
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

    // Readers racing writers must only ever see whole samples: every writer writes samples
    // whose value is derived from the timestamp, so a torn read would break the relation.
    #[test]
    fn concurrent_readers_never_see_torn_samples() {
        let r = Arc::new(Ring::new(256));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writers: Vec<_> = (0..3u16)
            .map(|w| {
                let r = r.clone();
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut i = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let ts = i * 3 + u64::from(w);
                        r.push(sample(w, ts, (ts % 101) as u8, ts.is_multiple_of(2)));
                        i += 1;
                    }
                })
            })
            .collect();
        let mut checked = 0u64;
        for _ in 0..2000 {
            r.scan_back(|s| {
                assert_eq!(u64::from(s.value), s.ts_ns % 101);
                assert_eq!(s.valid, s.ts_ns.is_multiple_of(2));
                assert_eq!(u64::from(s.device), s.ts_ns % 3);
                checked += 1;
                true
            });
        }
        stop.store(true, Ordering::Relaxed);
        for w in writers {
            w.join().unwrap();
        }
        assert!(checked > 0);
    }
}

//! Readers of the ring: peak, mean and sample counts over a recent window.
//!
//! A window with no valid sample is *unavailable* (`peak == None`), never 0 %: a failed,
//! missing, stale or hung reading must not look like an idle NPU, because an idle NPU is what
//! lets a failed probe count against the engine.

use crate::ring::{Ring, Sample};
use std::time::Duration;

/// Writers stamp a sample just before claiming its slot, so ring order and time order agree
/// to within scheduling noise; the scan goes this far past the window start before stopping.
const ORDER_SLACK_NS: u64 = 1_000_000_000;

/// Statistics of the valid samples in a window.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize)]
pub struct WindowStats {
    /// Highest valid reading; `None` means unavailable.
    pub peak: Option<u8>,
    /// Mean of the valid readings; `None` when unavailable.
    pub mean: Option<f64>,
    /// Valid samples in the window.
    pub valid: u32,
    /// Failed, stale or hung readings in the window.
    pub invalid: u32,
}

impl WindowStats {
    #[cfg(test)]
    /// Whether the window holds at least one valid reading.
    pub(crate) fn available(&self) -> bool {
        self.peak.is_some()
    }

    fn add(&mut self, s: &Sample, sum: &mut u64) {
        if s.valid {
            self.valid += 1;
            *sum += u64::from(s.value);
            self.peak = Some(self.peak.map_or(s.value, |p| p.max(s.value)));
        } else {
            self.invalid += 1;
        }
    }

    fn finish(&mut self, sum: u64) {
        self.mean = (self.valid > 0).then(|| sum as f64 / f64::from(self.valid));
    }
}

/// Result of a window query.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct WindowReport {
    /// Per requested device, in request order.
    pub devices: Vec<WindowStats>,
    /// Over all requested devices: the peak is the maximum of their peaks.
    pub combined: WindowStats,
    /// The ring's history is shorter than the window (capacity too small for it).
    pub truncated: bool,
}

/// Peak/mean/counts for `devices` (ring device indices) over the last `window`.
pub(crate) fn query(ring: &Ring, devices: &[u16], window: Duration) -> WindowReport {
    query_at(ring, devices, window, ring.now_ns())
}

/// As [`query`], for a window ending at `now_ns` on the ring's clock.
pub fn query_at(ring: &Ring, devices: &[u16], window: Duration, now_ns: u64) -> WindowReport {
    let start = now_ns.saturating_sub(window.as_nanos() as u64);
    let max_dev = devices.iter().copied().max().map_or(0, usize::from);
    let mut position = vec![usize::MAX; max_dev + 1];
    for (i, d) in devices.iter().enumerate() {
        position[usize::from(*d)] = i;
    }
    let mut stats = vec![WindowStats::default(); devices.len()];
    let mut sums = vec![0u64; devices.len()];
    let reached_start = ring.scan_back(|s| {
        if s.ts_ns < start {
            return s.ts_ns + ORDER_SLACK_NS >= start;
        }
        if s.ts_ns <= now_ns
            && let Some(&i) = position.get(usize::from(s.device))
            && i != usize::MAX
        {
            stats[i].add(s, &mut sums[i]);
        }
        true
    });
    let mut combined = WindowStats::default();
    let mut total = 0u64;
    for (st, sum) in stats.iter_mut().zip(&sums) {
        st.finish(*sum);
        combined.valid += st.valid;
        combined.invalid += st.invalid;
        total += sum;
        combined.peak = match (combined.peak, st.peak) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }
    combined.finish(total);
    // Reaching the end of the ring's history without passing the window start means older
    // samples of the window were overwritten (unless the ring never wrapped).
    let truncated = !reached_start && ring.written() > ring.capacity() as u64;
    WindowReport {
        devices: stats,
        combined,
        truncated,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn push(r: &Ring, device: u16, t_ms: u64, value: u8, valid: bool) {
        r.push(Sample {
            device,
            ts_ns: t_ms * MS,
            value,
            valid,
        });
    }

    #[test]
    fn peak_mean_and_counts() {
        let r = Ring::new(1024);
        push(&r, 0, 1000, 10, true);
        push(&r, 0, 1100, 90, true);
        push(&r, 1, 1100, 40, true);
        push(&r, 0, 1200, 0, false);
        let rep = query_at(&r, &[0, 1], Duration::from_millis(500), 1200 * MS);
        assert_eq!(rep.devices[0].peak, Some(90));
        assert_eq!(rep.devices[0].mean, Some(50.0));
        assert_eq!((rep.devices[0].valid, rep.devices[0].invalid), (2, 1));
        assert_eq!(rep.devices[1].peak, Some(40));
        assert_eq!(rep.combined.peak, Some(90));
        assert_eq!(rep.combined.valid, 3);
        assert!(!rep.truncated);
    }

    #[test]
    fn window_with_only_invalid_samples_is_unavailable_not_zero() {
        let r = Ring::new(64);
        for t in 0..10 {
            push(&r, 0, 1000 + t * 50, 0, false);
        }
        let rep = query_at(&r, &[0], Duration::from_secs(5), 2000 * MS);
        assert_eq!(rep.devices[0].peak, None);
        assert_eq!(rep.devices[0].mean, None);
        assert!(!rep.devices[0].available());
        assert_eq!(rep.devices[0].invalid, 10);
        assert!(!rep.combined.available());
    }

    #[test]
    fn empty_window_is_unavailable() {
        let r = Ring::new(64);
        push(&r, 0, 100, 55, true);
        let rep = query_at(&r, &[0], Duration::from_secs(1), 10_000 * MS);
        assert_eq!(rep.devices[0], WindowStats::default());
    }

    #[test]
    fn samples_outside_the_window_or_device_set_are_ignored() {
        let r = Ring::new(64);
        push(&r, 0, 100, 99, true); // before the window
        push(&r, 2, 1500, 80, true); // other device
        push(&r, 0, 1500, 20, true);
        push(&r, 0, 2500, 70, true); // after "now"
        let rep = query_at(&r, &[0], Duration::from_secs(1), 2000 * MS);
        assert_eq!(rep.devices[0].peak, Some(20));
        assert_eq!(rep.devices[0].valid, 1);
    }

    #[test]
    fn zero_is_a_valid_reading() {
        let r = Ring::new(64);
        push(&r, 0, 1000, 0, true);
        let rep = query_at(&r, &[0], Duration::from_secs(1), 1000 * MS);
        assert_eq!(rep.devices[0].peak, Some(0));
        assert!(rep.devices[0].available());
    }

    #[test]
    fn truncated_when_history_is_shorter_than_the_window() {
        let r = Ring::new(64);
        for t in 0..200 {
            push(&r, 0, 10_000 + t * 10, 1, true);
        }
        let rep = query_at(&r, &[0], Duration::from_secs(5), 12_000 * MS);
        assert!(rep.truncated);
        assert_eq!(rep.devices[0].valid, 64);
    }
}

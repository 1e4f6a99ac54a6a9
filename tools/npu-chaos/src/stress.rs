//! CPU stress for `cpu_stress_<N>pct`: one real busy thread per core of this machine, each
//! spinning N % of every 10 ms slice and sleeping the rest. It competes with everything on
//! the host — the engine, the load, and the agent itself — which is the point.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const SLICE: Duration = Duration::from_millis(10);

/// Running burner threads; the load is changed with [`CpuStress::set`].
#[derive(Debug)]
pub struct CpuStress {
    pct: Arc<AtomicU8>,
    stop: Arc<AtomicBool>,
    busy: Arc<AtomicU64>,
    threads: Vec<JoinHandle<()>>,
}

impl CpuStress {
    /// Starts one thread per core, idle (0 %).
    pub fn start() -> CpuStress {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let pct = Arc::new(AtomicU8::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let busy = Arc::new(AtomicU64::new(0));
        let threads = (0..cores)
            .map(|i| {
                let (pct, stop, busy) = (pct.clone(), stop.clone(), busy.clone());
                std::thread::Builder::new()
                    .name(format!("cpu-stress-{i}"))
                    .spawn(move || burn(&pct, &stop, &busy))
                    .expect("spawn a CPU stress thread")
            })
            .collect();
        CpuStress {
            pct,
            stop,
            busy,
            threads,
        }
    }

    /// Sets the share of every core to burn (0..=100).
    pub fn set(&self, pct: u8) {
        self.pct.store(pct.min(100), Ordering::Relaxed);
    }

    /// Busy slices run so far, all threads together.
    pub fn busy_slices(&self) -> u64 {
        self.busy.load(Ordering::Relaxed)
    }

    /// Stops and joins the threads; the number of busy slices they ran.
    pub fn stop(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        for t in std::mem::take(&mut self.threads) {
            let _ = t.join();
        }
        self.busy_slices()
    }
}

/// Dropped without `stop` (an early return): the threads stop at their next slice.
impl Drop for CpuStress {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn burn(pct: &AtomicU8, stop: &AtomicBool, busy_slices: &AtomicU64) {
    while !stop.load(Ordering::Relaxed) {
        let p = u32::from(pct.load(Ordering::Relaxed));
        if p == 0 {
            std::thread::sleep(SLICE);
            continue;
        }
        let start = Instant::now();
        let busy = SLICE * p / 100;
        let mut x = 0u64;
        while start.elapsed() < busy {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        busy_slices.fetch_add(1, Ordering::Relaxed);
        if let Some(rest) = SLICE.checked_sub(start.elapsed()) {
            std::thread::sleep(rest);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The threads burn only while set (none before, none after going back to 0 %), and stop
    // when asked. (CPU shares are a benchmark
    // matter on a shared machine; here only that they ran and stopped.)
    #[test]
    fn burns_while_set_and_stops() {
        let s = CpuStress::start();
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(s.busy_slices(), 0, "idle until set");
        s.set(50);
        let end = Instant::now() + Duration::from_secs(10);
        while s.busy_slices() == 0 {
            assert!(Instant::now() < end, "no busy slice ran at 50 %");
            std::thread::sleep(Duration::from_millis(5));
        }
        s.set(0);
        // A slice already started finishes; after that, nothing burns at 0 %.
        std::thread::sleep(SLICE * 3);
        let at_zero = s.busy_slices();
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(s.busy_slices(), at_zero, "burned at 0 %");
        // `stop` returns only once every thread has exited (it joins them; a thread that
        // never stops hangs this test).
        assert_eq!(s.stop(), at_zero);
    }
}

//! Scheduling of the sampler thread.
//!
//! The sampler wakes every period for a few microseconds. When the HTTP side (or anything
//! else on the host) saturates the CPU, an ordinary thread can wait milliseconds for a core
//! after its timer fires; measured on a 2-core VM with `wrk` on `/status`, the sampler's p99
//! tick lateness at 100 Hz went from ≤ 250 µs idle to ≤ 5 ms. `SCHED_FIFO` at a low real-time
//! priority lets it preempt ordinary threads on wake-up. It needs root or `CAP_SYS_NICE`;
//! without it the thread stays at normal priority and says so once.

use thread_priority::{
    RealtimeThreadSchedulePolicy, ThreadPriority, ThreadPriorityValue, ThreadSchedulePolicy,
    set_thread_priority_and_policy, thread_native_id,
};

/// Real-time priority used (1 is the lowest; kernel threads and audio use higher ones).
const FIFO_PRIORITY: u8 = 10;

/// Puts the calling thread under `SCHED_FIFO`; returns why not when it cannot.
pub fn make_current_thread_realtime() -> Result<(), String> {
    let value = ThreadPriorityValue::try_from(FIFO_PRIORITY).map_err(|e| e.to_owned())?;
    set_thread_priority_and_policy(
        thread_native_id(),
        ThreadPriority::Crossplatform(value),
        ThreadSchedulePolicy::Realtime(RealtimeThreadSchedulePolicy::Fifo),
    )
    .map_err(|e| format!("{e:?}"))
}

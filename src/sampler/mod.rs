//! The sampler: the backend that serves the NPUs ([`backends`]) writes their AI Cube samples
//! into the ring and their HBM, health and fault codes into each [`DeviceStatus`]. The DCMI
//! backend does it from a dedicated OS thread that owns every DCMI call, with a watchdog
//! thread that notices hung calls and runs the `npu-smi` fallback.
//!
//! Nothing on the async side ever waits on a driver call: readers only touch the ring and
//! the atomics in [`status`]. Control (period change, shutdown) goes through channels.

pub(crate) mod backends;
pub mod codes;
mod dcmi_reads;
mod dcmi_thread;
pub(crate) mod faults;
mod liveness;
mod npu_smi_faults;
pub(crate) mod plausibility;
pub mod priority;
pub(crate) mod source;
pub(crate) mod status;
mod watch_rows;
mod watchdog;

pub(crate) use liveness::SamplerStatus;
pub use source::Source;
pub(crate) use source::SourceReason;
pub(crate) use status::{DeviceSnapshot, DeviceStatus};

use crate::driver::{Backend, DeviceInfo, DriverConfig};
use crate::ring::Ring;
use crate::window::{self, WindowReport};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Shortest period accepted (`[agent] sample_period`'s bound; the loop also runs correctly
/// at 1 ms for tests).
pub(crate) const MIN_PERIOD: Duration = crate::config::agent::bounds::SAMPLE_PERIOD.min;
/// Longest period accepted.
pub(crate) const MAX_PERIOD: Duration = crate::config::agent::bounds::SAMPLE_PERIOD.max;
/// Longest ring history accepted.
pub(crate) const MAX_RETENTION: Duration = Duration::from_secs(3600);
/// Most ring slots (8 bytes each: 16 MiB); a longer history at a short period is cut to
/// this and window queries report `truncated`.
pub(crate) const MAX_RING_SLOTS: usize = 1 << 21;

/// Sampler settings; defaults documented on each field.
#[derive(Debug, Clone)]
pub struct SamplerConfig {
    /// Time between passes. Default 50 ms: the driver refreshes about every 100 ms, and
    /// sampling at twice that rate sees every refresh.
    pub period: Duration,
    /// History the ring keeps at the starting period. Default 30 s.
    pub retention: Duration,
    /// A DCMI call blocking longer marks its device stale. Default 1 s.
    pub call_deadline: Duration,
    /// Time between HBM/health reads. Default 1 s.
    pub hbm_period: Duration,
    /// Time between reads of the driver's fault codes. Default 1 s.
    pub fault_period: Duration,
    /// Watchdog check interval. Default 100 ms.
    pub watchdog_interval: Duration,
    /// Longest wait for `dcmi_init` and enumeration. Default 10 s.
    pub init_timeout: Duration,
    /// A watch child silent this long marks its device stale. Default: three `-d` periods,
    /// at least 3 s.
    pub watch_stale_after: Option<Duration>,
    /// Logic ids to monitor; `None` monitors every NPU found.
    pub devices: Option<Vec<u32>>,
    /// Run the DCMI thread under `SCHED_FIFO` when permitted (root or `CAP_SYS_NICE`).
    /// Default true.
    pub realtime: bool,
    /// Time between re-checks of a judged multi-utilization call (see
    /// [`plausibility`]). Default 10 s.
    pub plausibility_recheck: Duration,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            period: Duration::from_millis(50),
            retention: Duration::from_secs(30),
            call_deadline: Duration::from_secs(1),
            hbm_period: Duration::from_secs(1),
            fault_period: Duration::from_secs(1),
            watchdog_interval: Duration::from_millis(100),
            init_timeout: Duration::from_secs(10),
            watch_stale_after: None,
            devices: None,
            realtime: true,
            plausibility_recheck: plausibility::DEFAULT_RECHECK,
        }
    }
}

/// Why the sampler could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Every backend, in the order tried, with why it serves no NPU.
    #[error("no usable driver backend: {}", Tried::list(tried))]
    NoBackend { tried: Vec<Tried> },
    #[error("device {missing:?} not found; NPUs found: {found:?}")]
    UnknownDevice { missing: Vec<u32>, found: Vec<u32> },
    #[error("invalid sampler setting: {0}")]
    Invalid(String),
    #[error("cannot start a sampler thread: {0}")]
    Thread(#[from] std::io::Error),
}

/// A backend that was tried (or left out), and why it serves no NPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tried {
    pub backend: Backend,
    pub error: String,
}

impl Tried {
    /// `backend` failed with `error`.
    pub(crate) fn new(backend: Backend, error: impl Into<String>) -> Tried {
        Tried {
            backend,
            error: error.into(),
        }
    }

    /// `dcmi: <why>; npu-smi: <why>`, in the order tried.
    fn list(tried: &[Tried]) -> String {
        let parts: Vec<String> = tried
            .iter()
            .map(|t| format!("{}: {}", t.backend, t.error))
            .collect();
        parts.join("; ")
    }
}

/// State shared by the sampler threads and every reader.
#[derive(Debug)]
pub struct Shared {
    pub ring: Ring,
    pub devices: Vec<DeviceStatus>,
    pub sampler: SamplerStatus,
    /// The fault-code levels in force ([`faults`]).
    pub fault_levels: faults::Classifier,
    /// Codes older than this are not evidence ([`Shared::evidence_faults_of`]): three fault
    /// periods, at least 15 s (three `npu-smi` reads).
    pub fault_max_age: Duration,
}

/// How old fault codes may be and still count as evidence: three reads.
fn fault_max_age(fault_period: Duration) -> Duration {
    (fault_period * 3).max(Duration::from_secs(15))
}

impl Shared {
    /// The current fault codes of the device at ring index `index`, with their levels
    /// (empty for an unknown index), however old: what the views show, with the age.
    pub(crate) fn faults_of(&self, index: u16) -> Vec<faults::NpuFault> {
        match self.devices.get(usize::from(index)) {
            Some(d) => self.fault_levels.classify(d.info.id, &d.fault_codes()),
            None => Vec::new(),
        }
    }

    /// The codes of [`Shared::faults_of`] when their read is at most `fault_max_age` old:
    /// what the monitor acts on.
    pub(crate) fn evidence_faults_of(&self, index: u16) -> Vec<faults::NpuFault> {
        match self.devices.get(usize::from(index)) {
            Some(d) => self.fault_levels.classify(
                d.info.id,
                &d.fresh_fault_codes(self.ring.now_ns(), self.fault_max_age),
            ),
            None => Vec::new(),
        }
    }

    /// Whether the sampler threads are alive and ticking: no DCMI call blocked longer than
    /// `stuck_after`, a DCMI pass completed within `max(stuck_after, 3 × period)` (the period
    /// in force; once the thread has run), and the watchdog thread checked within
    /// `stuck_after`. A sampler
    /// without devices has nothing to wedge.
    pub(crate) fn liveness(&self, stuck_after: Duration) -> Result<(), String> {
        let period = self.sampler.period();
        if self.devices.is_empty() {
            return Ok(());
        }
        let now = self.ring.now_ns();
        let age = |t: u64| Duration::from_nanos(now.saturating_sub(t));
        if let Some((dev, _, started)) = self.sampler.in_call()
            && age(started) > stuck_after
        {
            let id = self.devices.get(dev).map_or(0, |d| d.info.id);
            return Err(format!(
                "a DCMI call on NPU {id} has been blocked for more than {stuck_after:?}"
            ));
        }
        let pass_limit = stuck_after.max(period * 3);
        if let Some(last) = self.sampler.last_pass()
            && age(last) > pass_limit
        {
            return Err(format!(
                "the DCMI sampler thread completed no pass in {pass_limit:?}"
            ));
        }
        if let Some(last) = self.sampler.last_watchdog_tick()
            && age(last) > stuck_after
        {
            return Err(format!(
                "the sampler's watchdog thread has not run in {stuck_after:?}"
            ));
        }
        Ok(())
    }
}

/// A running sampler. Dropping it shuts it down.
pub struct Sampler {
    shared: Arc<Shared>,
    /// The backend serving the devices, started ([`backends`]).
    reader: Option<Box<dyn backends::Reader>>,
    /// The backend serving the devices, those tried before it (why they were not used) and
    /// those after it that `--backend` left out: what [`Sampler::require_cube_source`] names.
    served_by: Option<Backend>,
    tried: Vec<Tried>,
    left_out: Vec<Tried>,
    period: Duration,
}

impl Sampler {
    /// Finds a backend, enumerates the NPUs and starts sampling.
    pub fn start(driver: &DriverConfig, cfg: &SamplerConfig) -> Result<Sampler, StartError> {
        Sampler::start_with(backends::chain(driver.backend), driver, cfg)
    }

    /// [`Sampler::start`] with the backends to try, in order (tests give their own).
    pub(crate) fn start_with(
        chain: Vec<Box<dyn backends::DeviceBackend>>,
        driver: &DriverConfig,
        cfg: &SamplerConfig,
    ) -> Result<Sampler, StartError> {
        validate(cfg)?;
        let backends::Discovered {
            backend,
            found,
            tried,
            left_out,
        } = backends::discover(chain, driver.backend, driver, cfg)?;
        let all: Vec<&DeviceInfo> = found.iter().collect();
        let selected = select_devices(&all, cfg.devices.as_deref())?;
        check_selection(selected.len())?;
        let ring = Ring::new(
            Ring::capacity_for(selected.len(), cfg.period, cfg.retention).min(MAX_RING_SLOTS),
        );
        let (source, reason) = (backend.first_source(), backend.first_reason());
        let devices: Vec<DeviceStatus> = selected
            .iter()
            .map(|&i| DeviceStatus::new(found[i].clone(), source, reason))
            .collect();
        let shared = Arc::new(Shared {
            ring,
            devices,
            sampler: SamplerStatus::default(),
            fault_levels: faults::Classifier::default(),
            fault_max_age: fault_max_age(cfg.fault_period),
        });
        shared.sampler.set_period(cfg.period);
        let served_by = backend.kind();
        let reader = backend.start(backends::StartCtx {
            shared: shared.clone(),
            served: selected.iter().copied().enumerate().collect(),
            driver,
            cfg,
        })?;
        Ok(Sampler {
            shared,
            reader: Some(reader),
            served_by: Some(served_by),
            tried,
            left_out,
            period: cfg.period,
        })
    }

    /// A sampler without devices or threads, for an agent that must keep serving `/status`
    /// from `/health` alone when no driver backend works (`reason` says why).
    pub(crate) fn without_backend(reason: &str) -> Sampler {
        tracing::error!(
            "no NPU figures: {reason}; virtual inference is disabled, /status follows /health only"
        );
        let shared = Arc::new(Shared {
            ring: Ring::new(64),
            devices: Vec::new(),
            sampler: SamplerStatus::default(),
            fault_levels: faults::Classifier::default(),
            fault_max_age: fault_max_age(SamplerConfig::default().fault_period),
        });
        shared.sampler.set_period(SamplerConfig::default().period);
        Sampler {
            shared,
            reader: None,
            served_by: None,
            tried: Vec::new(),
            left_out: Vec::new(),
            period: SamplerConfig::default().period,
        }
    }

    /// Whether the backend serving the devices reads their fault codes.
    fn faults_read(&self) -> bool {
        self.reader.as_ref().is_some_and(|r| r.reads_faults())
    }

    /// State shared with readers.
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The monitored devices, in ring index order.
    pub fn devices(&self) -> &[DeviceStatus] {
        &self.shared.devices
    }

    /// Ring index of the device with logic id `id`.
    pub(crate) fn index_of(&self, id: u32) -> Option<u16> {
        self.shared
            .devices
            .iter()
            .position(|d| d.info.id == id)
            .map(|i| i as u16)
    }

    /// Window statistics for devices given by logic id (unknown ids are an error).
    pub fn window(&self, ids: &[u32], window: Duration) -> Result<WindowReport, StartError> {
        let mut idx = Vec::with_capacity(ids.len());
        let mut missing = Vec::new();
        for id in ids {
            match self.index_of(*id) {
                Some(i) => idx.push(i),
                None => missing.push(*id),
            }
        }
        if !missing.is_empty() {
            return Err(StartError::UnknownDevice {
                missing,
                found: self.shared.devices.iter().map(|d| d.info.id).collect(),
            });
        }
        Ok(window::query(&self.shared.ring, &idx, window))
    }

    /// Whether at least one device has (or may still get) a source of AI Cube figures.
    pub(crate) fn any_cube_source(&self) -> bool {
        self.shared
            .devices
            .iter()
            .any(|d| d.source() != Source::UNAVAILABLE)
    }

    /// [`Sampler::any_cube_source`] as an error that names what was tried: the backends
    /// before the one that found the NPUs, that one with why its devices have no figure,
    /// the fallbacks behind it, and the backends `--backend` left out.
    pub(crate) fn require_cube_source(&self) -> Result<(), StartError> {
        if self.any_cube_source() {
            return Ok(());
        }
        let mut tried = self.tried.clone();
        if let Some(kind) = self.served_by {
            let now = self.shared.ring.now_ns();
            let mut notes: Vec<String> = self
                .shared
                .devices
                .iter()
                .map(|d| d.snapshot(now).source_note)
                .collect();
            notes.sort();
            notes.dedup();
            tried.push(Tried::new(
                kind,
                format!("no AI Cube source on any NPU: {}", notes.join(" / ")),
            ));
        }
        for fallback in self.reader.iter().flat_map(|r| r.fallbacks()) {
            tried.push(Tried::new(fallback, "not usable (see the warnings above)"));
        }
        tried.extend(self.left_out.iter().cloned());
        Err(StartError::NoBackend { tried })
    }

    /// Current sampling period.
    pub fn period(&self) -> Duration {
        self.period
    }

    /// Changes the sampling period of the DCMI thread.
    pub fn set_period(&mut self, period: Duration) -> Result<(), StartError> {
        check_period(period)?;
        if let Some(r) = &self.reader {
            r.set_period(period);
        }
        self.period = period;
        self.shared.sampler.set_period(period);
        Ok(())
    }

    /// Waits until every device has a decided source (no first read or disagreement pending)
    /// and, if DCMI serves any, one whole pass ran after that.
    pub(crate) fn wait_settled(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        // The pass count when every device was first seen decided: one more whole pass
        // after it, so a verdict reached in the middle of a pass has its first reading too.
        let mut decided_at: Option<u64> = None;
        loop {
            // A device whose calls disagree is still being judged (at most a second or two).
            // And the first fault read of each device (the DCMI thread makes it on its first
            // pass, the npu-smi fault thread at once), so a report has the codes.
            let pending = self.shared.devices.iter().any(|d| {
                self.reader.as_ref().is_some_and(|r| r.settling(d))
                    || (self.faults_read() && !d.faults_attempted() && !d.is_hung())
            });
            if pending {
                decided_at = None;
            } else if decided_at.is_none() {
                decided_at = Some(self.shared.sampler.passes());
            }
            if let Some(at) = decided_at
                && (self.reader.as_ref().is_none_or(|r| !r.runs_passes())
                    || self.shared.sampler.passes() > at)
            {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Stops the threads: watch children are killed and reaped; the DCMI thread is joined
    /// unless it is stuck in a driver call, in which case it is left behind with a warning.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if let Some(r) = self.reader.take() {
            r.stop(&self.shared);
        }
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A selection the ring can hold: at least one NPU, at most the ring's device count.
fn check_selection(selected: usize) -> Result<(), StartError> {
    if selected == 0 {
        return Err(StartError::Invalid("no NPU selected".to_owned()));
    }
    if selected > crate::ring::MAX_DEVICES {
        return Err(StartError::Invalid(format!(
            "{selected} NPUs selected; the ring tells at most {} apart",
            crate::ring::MAX_DEVICES
        )));
    }
    Ok(())
}

fn check_period(p: Duration) -> Result<(), StartError> {
    if p < MIN_PERIOD || p > MAX_PERIOD {
        return Err(StartError::Invalid(format!(
            "period {p:?} is outside {MIN_PERIOD:?}..={MAX_PERIOD:?}"
        )));
    }
    Ok(())
}

fn validate(cfg: &SamplerConfig) -> Result<(), StartError> {
    check_period(cfg.period)?;
    if cfg.retention < Duration::from_secs(1) || cfg.retention > MAX_RETENTION {
        return Err(StartError::Invalid(format!(
            "retention {:?} is outside 1s..=1h",
            cfg.retention
        )));
    }
    for (name, d) in [
        ("call_deadline", cfg.call_deadline),
        ("hbm_period", cfg.hbm_period),
        ("fault_period", cfg.fault_period),
        ("watchdog_interval", cfg.watchdog_interval),
        ("init_timeout", cfg.init_timeout),
        ("plausibility_recheck", cfg.plausibility_recheck),
    ] {
        if d.is_zero() {
            return Err(StartError::Invalid(format!("{name} must be above zero")));
        }
    }
    Ok(())
}

/// Indices into `infos` of the requested devices, in request order (all when `None`).
fn select_devices(infos: &[&DeviceInfo], wanted: Option<&[u32]>) -> Result<Vec<usize>, StartError> {
    let Some(wanted) = wanted else {
        return Ok((0..infos.len()).collect());
    };
    let mut out = Vec::new();
    let mut missing = Vec::new();
    for id in wanted {
        match infos.iter().position(|i| i.id == *id) {
            Some(p) if !out.contains(&p) => out.push(p),
            Some(_) => {}
            None => missing.push(*id),
        }
    }
    if !missing.is_empty() {
        return Err(StartError::UnknownDevice {
            missing,
            found: infos.iter().map(|i| i.id).collect(),
        });
    }
    Ok(out)
}

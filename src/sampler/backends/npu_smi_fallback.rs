//! The `npu-smi` fallback as a backend around another: it finds what the primary finds and
//! starts the primary with `npu-smi` watch children behind it
//! ([`DeviceBackend::accept_fallback`]), which take the devices the primary cannot read or
//! whose calls hang. Without it (`--backend dcmi`) the primary runs alone and such a device
//! has no AI Cube source.

use super::{DeviceBackend, Reader, StartCtx};
use crate::driver::{Backend, DeviceInfo, DriverConfig};
use crate::sampler::watchdog::Fallback;
use crate::sampler::{SamplerConfig, Source, SourceReason, StartError};

/// `primary` with the `npu-smi` fallback behind it when `enabled`, else `primary` alone.
pub(super) fn around(primary: Box<dyn DeviceBackend>, enabled: bool) -> Box<dyn DeviceBackend> {
    if enabled {
        Box::new(NpuSmiFallback { primary })
    } else {
        primary
    }
}

/// A backend whose unreadable devices fall back to `npu-smi` watch children.
struct NpuSmiFallback {
    primary: Box<dyn DeviceBackend>,
}

impl DeviceBackend for NpuSmiFallback {
    fn kind(&self) -> Backend {
        self.primary.kind()
    }

    fn discover(
        &mut self,
        driver: &DriverConfig,
        cfg: &SamplerConfig,
    ) -> Result<Vec<DeviceInfo>, String> {
        self.primary.discover(driver, cfg)
    }

    fn first_source(&self) -> Source {
        self.primary.first_source()
    }

    fn first_reason(&self) -> SourceReason {
        self.primary.first_reason()
    }

    fn accept_fallback(&mut self, fallback: Fallback) {
        self.primary.accept_fallback(fallback);
    }

    fn start(self: Box<Self>, ctx: StartCtx<'_>) -> Result<Box<dyn Reader>, StartError> {
        let mut primary = self.primary;
        // The capability probe runs on a helper thread as the watchdog starts: start-up
        // does not wait up to 5 s for a fallback it may not need.
        primary.accept_fallback(Fallback::new(ctx.driver, None));
        primary.start(ctx)
    }
}

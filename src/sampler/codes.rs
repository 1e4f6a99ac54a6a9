//! Pseudo error codes for readings that did not come from a DCMI return code: what
//! `npu-smi` printed instead of a figure, a figure a second source contradicts, a device gone.

/// `npu-smi` printed `NA`.
pub(crate) const NA: i32 = -99996;
/// A figure above 100 % or unparseable.
pub(crate) const BAD_VALUE: i32 = -99997;
/// The `npu-smi` header has no AI Cube column.
pub(crate) const NO_CUBE_COLUMN: i32 = -99995;
/// A figure answered with `DCMI_OK` that a second source contradicts, or a zero no
/// second source can vouch for (see `sampler::plausibility`).
pub(crate) const SUSPECT: i32 = -99994;
/// The driver reports the device does not exist (health `0xFFFFFFFF`).
pub const DEVICE_GONE: i32 = -99993;

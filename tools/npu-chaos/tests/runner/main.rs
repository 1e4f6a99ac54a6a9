//! `npu-chaos` through its binary and its private systemd user manager, for real; and the
//! shadow rows' comparison on outcomes built in the test. One test binary for the tool
//! (docs/ci.md, "Test binaries"); each file is a module.

mod chaos_cli;
mod repeated_hang;
mod shadow_compare;
mod systemd_manager;

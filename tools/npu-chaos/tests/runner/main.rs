//! `npu-chaos` through its binary and its private systemd user manager, for real. One test
//! binary for the tool (docs/ci.md, "Test binaries"); each file is a module.

mod chaos_cli;
mod repeated_hang;
mod systemd_manager;

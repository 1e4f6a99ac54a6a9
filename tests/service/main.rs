//! The agent as a service: configuration errors through the binary, the daemon's systemd and
//! signal paths, its own restarts and handovers, its listeners' limits and access control, the
//! service commands, arbitrary input on every surface, and the modules' layering.
//! One test binary for the area (docs/ci.md, "Test binaries"); each file is a module.

#[path = "../support/mod.rs"]
mod support;

mod admin_access;
mod agent_restart;
mod config_errors;
mod daemon;
mod k8s_manifests;
mod listener_limits;
mod module_layering;
mod property_surfaces;
mod service_cli;
mod soak;
mod systemd_restart;

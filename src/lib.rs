//! npu-health-agent: a host agent for LLM inference nodes on Huawei Ascend NPUs.
//!
//! Data flows one way through the modules:
//! [`driver`] (dlopen'd `libdcmi.so`, `npu-smi` fallback) → [`sampler`] (one OS thread owns
//! every driver call) → [`ring`] (lock-free sample ring) → [`window`] (peak-window readers)
//! → [`monitor`] (one engine's loops, rules and verdict, fed by [`probe`]: `/health`, the
//! virtual request, `/metrics`, each as the engine's kind in [`engines`] has them) and [`qos`] (its score) → [`server`] (`/status`, `/status/detail`, `/metrics`)
//! and [`integrations`] (what the verdict and the level tell each system that acts on them:
//! Node Manager, the kubelet, the Kubernetes API, HAProxy, Envoy; one folder each).
//! [`pod_resources`] asks the kubelet which pod holds each NPU (the pod labels of `/metrics`).
//! [`config`] says what to monitor,
//! [`agent`] wires it together (and reloads it on SIGHUP), [`continuity`] carries the
//! listening sockets and each engine's state across the agent's own restarts and upgrades
//! ([`clock`] converts the times it saves), [`service`] speaks systemd's
//! notify protocol and handles signals, [`slots`] shares every listener's connections fairly
//! among their sources, [`logging`] writes text, JSON or journald, [`proc_sockets`] reads who
//! holds a socket from `/proc` (for the stopped-process rule and `check-config`), and the
//! binary's commands live in [`cli`]. No `unsafe` here: the DCMI binding is the crate
//! `crates/dcmi` (re-exported as [`driver::dcmi`]).
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

pub mod agent;
pub(crate) mod bundles;
pub mod cli;
pub mod clock;
pub mod config;
pub(crate) mod continuity;
pub mod driver;
pub mod engines;
#[cfg(feature = "fake-driver")]
pub mod fake;
pub mod integrations;
pub mod logging;
pub mod monitor;
pub(crate) mod pod_resources;
pub mod probe;
pub mod proc_sockets;
pub mod qos;
pub mod ring;
pub mod sampler;
pub mod server;
pub(crate) mod service;
pub(crate) mod slots;
pub(crate) mod tls;
pub mod view;
pub mod window;

/// Version string shown by `--version`: crate version, git revision, a hash of the sources
/// and manifest, and `fake-driver` when the fakes are built in (build.rs).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (git ",
    env!("NPU_HEALTH_AGENT_GIT_HASH"),
    ", ",
    env!("NPU_HEALTH_AGENT_BUILD"),
    ")"
);

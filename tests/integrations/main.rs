//! The agent beside the real components operators run: HAProxy and Envoy in front of the
//! engines, Prometheus and promtool with the shipped rules and dashboards, the admin page in
//! chromium, `top` in tmux, and the fleet under one Prometheus. A test whose component is not
//! installed skips with a note, and fails under `CI=true`.
//! One test binary for the area (docs/ci.md, "Test binaries"); each file is a module.

#[path = "../support/mod.rs"]
mod support;

mod fleet;
mod live_page_browser;
mod operator_views;
mod pod_labels;
mod prometheus_live;
mod prometheus_rules;
mod router_envoy;
mod router_haproxy;

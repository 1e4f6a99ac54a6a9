//! Probing the engine: the HealthCollector (`/health`), the virtual inference loop, the
//! HTTP client that carries both, and the enabling conditions.

pub mod gates;
pub mod health;
pub mod http;
pub mod virtual_inference;

//! What the agent sends on `/status`, `/status/detail`, `/qos` and `/events`, as plain types:
//! the agent writes them, and the chaos runner, `top` and the tests read them back, so a word
//! renamed breaks the build of every reader, not a dashboard. Depends on serde only, so the
//! readers need not link the agent to read its answers.

mod actions;
mod level;
mod phase;
mod status;

pub use actions::{ActionRecord, RouterSeen};
pub use level::Level;
pub use phase::Phase;
pub use status::Status;

//! The plan's rules: one message per change, the minimum interval, the refresh, the
//! escalation's swap, and a restart's idempotence.

use super::*;

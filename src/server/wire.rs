//! The server's own part of the wire: how a typed answer becomes the JSON it sends. The
//! types themselves (`/status/detail`, `/qos`, `/events`) live in the `npu-health-wire`
//! crate, which the chaos runner, `top` and the tests read them back with.
//!
//! Objects go out with their keys sorted, at every level (they pass through
//! `serde_json::Value`, as the hand-built JSON always did), so the bytes on the wire do not
//! depend on the order fields are declared in.

use serde::Serialize;

/// `value` as the JSON the server sends: keys sorted at every level.
pub(crate) fn to_json<T: Serialize>(value: &T) -> serde_json::Value {
    serde_json::to_value(value).unwrap_or_else(|e| {
        // Only a map with non-string keys or a failing Serialize impl can fail here; none
        // of the wire crate's types has either.
        serde_json::json!({ "error": format!("cannot encode: {e}") })
    })
}

//! The committed DCMI bindings must equal a fresh bindgen run over `vendor-headers/`.
//! Runs only with `--features bindgen` (needs libclang); `.ci/run` does that.
#![cfg(feature = "bindgen")]

#[test]
fn committed_bindings_match_a_fresh_generation() {
    let fresh = include_str!(concat!(env!("OUT_DIR"), "/dcmi_bindings.rs"));
    let committed = include_str!("../src/bindings.rs");
    assert!(
        fresh == committed,
        "crates/dcmi/src/bindings.rs is out of date with vendor-headers/dcmi_interface_api.h; \
         regenerate with `DCMI_BINDINGS_UPDATE=1 cargo build -p dcmi --features bindgen`"
    );
}

//! The conditions under which virtual inference runs (reference §1.2–§1.3), each with its
//! value and verdict, for `doctor`, `/status/detail` and the start decision.
//!
//! The reference's order: engine type, DP rank and headless are decided from the config;
//! then, at the first healthy `/status`: `enable_virtual_inference`, the
//! `ASCEND_GLOBAL_LOG_LEVEL` gate, the threshold range, and AI Cube readability. `/health`
//! answering is what triggers the start.

use crate::config::EngineSpec;
use crate::driver::Backend;

pub(crate) use npu_health_wire::Condition;

/// A condition that is known (its `ok` is set).
fn condition(
    name: &'static str,
    value: impl Into<String>,
    ok: bool,
    note: impl Into<String>,
) -> Condition {
    Condition {
        name: name.into(),
        value: value.into(),
        ok: Some(ok),
        note: note.into(),
    }
}

/// The environment variable of the log-level gate.
pub(crate) const LOG_LEVEL_VAR: &str = "ASCEND_GLOBAL_LOG_LEVEL";

/// The reference's log-level rule: unset, blank after trimming, or exactly `3` (after
/// trimming) allow virtual inference; anything else (`1`, `03`, `ERROR`) disables it.
pub(crate) fn log_level_allows(value: Option<&str>) -> bool {
    match value.map(str::trim) {
        None | Some("") | Some("3") => true,
        Some(_) => false,
    }
}

/// Conditions known from the configuration alone.
pub(crate) fn static_conditions(spec: &EngineSpec) -> Vec<Condition> {
    let hc = &spec.health_check_config;
    let mut v = Vec::new();
    // The engine's kind says whether virtual inference applies to it (src/engines/).
    let applies = crate::engines::of(spec.engine_type).virtual_inference(spec);
    v.push(condition(
        "engine_type",
        spec.engine_type.as_str(),
        applies.is_ok(),
        applies.err().unwrap_or_default(),
    ));
    v.push(condition(
        "enable_virtual_inference",
        hc.enable_virtual_inference.to_string(),
        hc.enable_virtual_inference,
        if hc.enable_virtual_inference {
            ""
        } else {
            "Health check is disabled"
        },
    ));
    v.push(condition(
        "dp_rank",
        spec.dp_rank.to_string(),
        spec.dp_rank == 0,
        if spec.dp_rank == 0 {
            ""
        } else {
            "only DP rank 0 performs virtual inference"
        },
    ));
    v.push(condition(
        "headless",
        spec.headless.to_string(),
        !spec.headless,
        if spec.headless {
            "headless (PCP follower) engines do not perform virtual inference"
        } else {
            ""
        },
    ));
    let level = spec.engine_env.lookup(spec.role, LOG_LEVEL_VAR);
    let (value, ok, note) = match &level {
        None => (
            format!("unset ({}; ERROR by default)", spec.engine_env.describe()),
            true,
            String::new(),
        ),
        Some(l) => {
            let ok = log_level_allows(Some(&l.value));
            let shown = format!("'{}' (from {})", l.value, l.source);
            let note = if ok {
                String::new()
            } else {
                format!(
                    "Virtual inference requires {LOG_LEVEL_VAR}=3 (ERROR); got '{}'. Virtual inference is disabled.",
                    l.value
                )
            };
            (shown, ok, note)
        }
    };
    v.push(condition(LOG_LEVEL_VAR, value, ok, note));
    let t = hc.npu_usage_threshold;
    v.push(condition(
        "npu_usage_threshold",
        t.to_string(),
        hc.threshold_ok(),
        if hc.threshold_ok() {
            String::new()
        } else {
            format!("npu_usage_threshold {t} is outside (0, 100]; virtual inference does not start")
        },
    ));
    v
}

/// AI Cube readability: at least one of the engine's NPUs has a source.
pub(crate) fn cube_condition(sources: &[(u32, Backend)]) -> Condition {
    let value = sources
        .iter()
        .map(|(id, b)| format!("{id}:{b}"))
        .collect::<Vec<_>>()
        .join(",");
    let ok = sources.iter().any(|(_, b)| b.reads_cube());
    let value = if sources.is_empty() {
        "no NPU data (no driver backend)".to_owned()
    } else {
        value
    };
    condition(
        "ai_cube",
        value,
        ok,
        if ok {
            ""
        } else {
            "AI Cube usage is readable neither through DCMI nor npu-smi on the engine's NPUs; virtual inference is disabled"
        },
    )
}

/// `/health` answered at least once.
pub(crate) fn health_condition(has_connected: bool, last_error: Option<&str>) -> Condition {
    Condition {
        name: "health".into(),
        value: if has_connected {
            "answered".to_owned()
        } else {
            "not answered yet".to_owned()
        },
        ok: has_connected.then_some(true),
        note: if has_connected {
            String::new()
        } else {
            format!(
                "virtual inference starts at the first /status after /health answers{}",
                last_error
                    .map(|e| format!(" (last: {e})"))
                    .unwrap_or_default()
            )
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::file;
    use std::path::Path;

    // test_sim_inference.py: level "1" → off; "3" or unset → on. Strings are compared after
    // trimming, so " 3 " passes and "03" does not.
    #[test]
    fn log_level_rule() {
        for (v, ok) in [
            (None, true),
            (Some(""), true),
            (Some("   "), true),
            (Some("3"), true),
            (Some(" 3 "), true),
            (Some("03"), false),
            (Some("0"), false),
            (Some("1"), false),
            (Some("2"), false),
            (Some("4"), false),
            (Some("ERROR"), false),
        ] {
            assert_eq!(log_level_allows(v), ok, "{v:?}");
        }
    }

    fn spec(extra: &str, engine_extra: &str) -> EngineSpec {
        let enable = if extra.contains("enable_virtual_inference") {
            ""
        } else {
            "enable_virtual_inference = true"
        };
        let text = format!(
            "[[engine]]\nengine_type = \"vllm\"\nserved_model_name = \"m\"\nhost = \"127.0.0.1\"\nport = 8000\nmgmt_port = 9001\n{engine_extra}\n[engine.health_check_config]\n{enable}\n{extra}"
        );
        file::parse(&text, Path::new("/x/agent.toml"))
            .unwrap()
            .engines
            .remove(0)
    }

    fn verdict(s: &EngineSpec, name: &str) -> bool {
        static_conditions(s)
            .iter()
            .find(|c| c.name == name)
            .unwrap()
            .ok
            .unwrap()
    }

    // test_mgmt_endpoint.py: dp_rank 2 → disabled, dp 0 → enabled; headless; sglang.
    #[test]
    fn gate_matrix() {
        let s = spec(
            "",
            "dp_rank = 2\nengine_env = { ASCEND_GLOBAL_LOG_LEVEL = \"3\" }",
        );
        assert!(!verdict(&s, "dp_rank"));
        assert!(verdict(&s, LOG_LEVEL_VAR));
        let s0 = spec(
            "",
            "dp_rank = 0\nengine_env = { ASCEND_GLOBAL_LOG_LEVEL = \"3\" }",
        );
        assert!(
            static_conditions(&s0).iter().all(|c| c.ok == Some(true)),
            "DP rank 0 runs"
        );
        let s = spec("", "headless = true");
        assert!(!verdict(&s, "headless"));
        let s = spec("", "engine_env = { ASCEND_GLOBAL_LOG_LEVEL = \"1\" }");
        let c = static_conditions(&s);
        let lvl = c.iter().find(|c| c.name == LOG_LEVEL_VAR).unwrap();
        assert_eq!(lvl.ok, Some(false));
        assert!(
            lvl.note
                .contains("requires ASCEND_GLOBAL_LOG_LEVEL=3 (ERROR); got '1'"),
            "{}",
            lvl.note
        );
        for (t, ok) in [
            ("3", true),
            ("0", false),
            ("-1", false),
            ("101", false),
            ("200", false),
            ("100", true),
        ] {
            let s = spec(&format!("npu_usage_threshold = {t}"), "");
            assert_eq!(verdict(&s, "npu_usage_threshold"), ok, "{t}");
        }
        let mut s = spec("", "policy = \"reference\"");
        s.engine_type = crate::config::engine_type::EngineType::Sglang;
        assert!(!verdict(&s, "engine_type"), "as MindIE V5");
        s.policy.value = crate::config::policy::Policy::Agent;
        assert!(verdict(&s, "engine_type"), "the agent policy probes SGLang");
        let s = spec("enable_virtual_inference = false", "");
        let c = static_conditions(&s);
        assert_eq!(
            c.iter()
                .find(|c| c.name == "enable_virtual_inference")
                .unwrap()
                .note,
            "Health check is disabled"
        );
    }

    #[test]
    fn cube_and_health_conditions() {
        assert_eq!(
            cube_condition(&[(0, Backend::Dcmi), (1, Backend::Unavailable)]).ok,
            Some(true)
        );
        let c = cube_condition(&[(0, Backend::Unavailable)]);
        assert_eq!(c.ok, Some(false));
        assert!(c.note.contains("neither through DCMI nor npu-smi"));
        assert_eq!(health_condition(false, Some("refused")).ok, None);
        assert_eq!(health_condition(true, None).ok, Some(true));
    }
}

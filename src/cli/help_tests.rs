//! The flags' help against the defaults the agent uses: a help that states a default
//! (`[default: X]`, or "default `X`") states the one in the configuration's types, read from
//! them here, not copied (issue 48: `--stall-window` said 60 s; it is 30 s).

use super::Cli;
use crate::config::AgentSettings;
use crate::config::policy::{Policy, apply_preset};
use crate::qos::QosConfig;
use clap::{CommandFactory, ValueEnum};
use std::time::Duration;

/// The name clap takes for a value of `v`.
fn word<T: ValueEnum>(v: T) -> String {
    v.to_possible_value()
        .map(|p| p.get_name().to_owned())
        .unwrap_or_default()
}

/// A duration as the help writes it: whole seconds (`30s`, `60s`), else milliseconds (`50ms`).
fn duration(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// The default the agent uses for the flag with clap id `id`, as its help would write it.
fn real_default(id: &str) -> Option<String> {
    let agent = AgentSettings::default();
    Some(match id {
        // The policy's preset sets it when the flag is absent.
        "stall_window" => {
            let mut qos = QosConfig::default();
            apply_preset(agent.policy, &mut qos, &[]);
            duration(qos.stall_window)
        }
        "sample_period" => duration(agent.sample_period),
        "backend" => word(agent.backend),
        "npu_smi_delay" => agent.npu_smi_delay.to_string(),
        "npu_smi" => agent.npu_smi.display().to_string(),
        "policy" => agent.policy.as_str().to_owned(),
        // `run` takes an absent --wait-for-ports as `unwrap_or_default`.
        "wait_for_ports" => duration(Duration::default()),
        _ => return None,
    })
}

/// The default a help text states, if it states one.
fn stated_default(help: &str) -> Option<String> {
    if let Some((_, rest)) = help.split_once("[default: ") {
        let end = rest.find([']', ',', ';']).unwrap_or(rest.len());
        return Some(rest[..end].trim().to_owned());
    }
    let (_, rest) = help.split_once("default `")?;
    Some(rest.split_once('`')?.0.to_owned())
}

/// Every argument of `cmd` and its subcommands, with the command's name.
fn every_arg(cmd: &clap::Command, out: &mut Vec<(String, String, String)>) {
    for a in cmd.get_arguments() {
        let help = a.get_long_help().or(a.get_help()).map(|h| h.to_string());
        out.push((
            cmd.get_name().to_owned(),
            a.get_id().to_string(),
            help.unwrap_or_default(),
        ));
    }
    for sub in cmd.get_subcommands() {
        every_arg(sub, out);
    }
}

#[test]
fn every_flag_help_that_states_a_default_states_the_real_one() {
    let mut cmd = Cli::command();
    cmd.build();
    let mut args = Vec::new();
    every_arg(&cmd, &mut args);
    let mut checked = Vec::new();
    for (command, id, help) in &args {
        let Some(stated) = stated_default(help) else {
            continue;
        };
        let real = real_default(id).unwrap_or_else(|| {
            panic!("{command} --{id} states a default ({stated}) that this test does not read: add it to real_default")
        });
        assert_eq!(stated, real, "{command} --{id}: {help}");
        checked.push(id.as_str());
    }
    for id in ["stall_window", "sample_period", "backend", "policy"] {
        assert!(checked.contains(&id), "--{id} was not checked: {checked:?}");
    }
    // --stall-window's default is the policy's: the other policy's is told too.
    let reference = duration(QosConfig::default().stall_window);
    let (_, _, help) = args.iter().find(|(_, id, _)| id == "stall_window").unwrap();
    assert!(
        help.contains(&format!(
            "{reference} under --policy {}",
            Policy::Reference.as_str().to_owned()
        )),
        "{help}"
    );
}

#[test]
fn a_stated_default_is_read_in_both_forms() {
    for (help, want) in [
        ("Stall detection window [default: 30s].", Some("30s")),
        ("Wait [default: 0s, fail at once].", Some("0s")),
        (
            "Window [default: 30s; 60s under --policy reference].",
            Some("30s"),
        ),
        (
            "The npu-smi executable (default `npu-smi`, in PATH).",
            Some("npu-smi"),
        ),
        (
            "The engine's NPUs; default ASCEND_RT_VISIBLE_DEVICES, else all.",
            None,
        ),
    ] {
        assert_eq!(stated_default(help).as_deref(), want, "{help}");
    }
}

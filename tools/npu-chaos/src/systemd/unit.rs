//! The user unit derived from the shipped one: which `[Service]` and `[Unit]` keys a private
//! user manager keeps, which it drops and why, and the unit-file syntax they are read and
//! written in.

use super::SHIPPED_UNIT_PATH;
use std::time::Duration;

/// `[Service]` keys kept as shipped: a user manager applies them (or accepts them: see the
/// notes in docs/chaos.md on the cgroup limits on this host), and they shape how the agent
/// starts, stops, restarts, keeps its sockets and runs.
const KEPT_SERVICE: &[&str] = &[
    "Type",
    "NotifyAccess",
    "ExecReload",
    "ExecStop",
    "ExecStartPre",
    "ExecStartPost",
    "ExecStopPost",
    "KillMode",
    "KillSignal",
    "SendSIGKILL",
    "TimeoutSec",
    "TimeoutStartSec",
    "TimeoutStopSec",
    "WatchdogSec",
    "Restart",
    "RestartSec",
    "RestartPreventExitStatus",
    "RestartForceExitStatus",
    "SuccessExitStatus",
    "FileDescriptorStoreMax",
    "FileDescriptorStorePreserve",
    "RuntimeDirectory",
    "RuntimeDirectoryMode",
    "RuntimeDirectoryPreserve",
    "StateDirectory",
    "StateDirectoryMode",
    "Nice",
    "CPUWeight",
    "CPUSchedulingPolicy",
    "CPUSchedulingPriority",
    "OOMScoreAdjust",
    "StartLimitIntervalSec",
    "StartLimitBurst",
    "StartLimitAction",
    "Environment",
    "EnvironmentFile",
    "UMask",
    "LimitNOFILE",
    "LimitRTPRIO",
    "LimitMEMLOCK",
    "MemoryMax",
    "MemoryHigh",
    "TasksMax",
    // Process attributes and seccomp filters: a user manager applies them (verified here:
    // NoNewPrivs 1, Seccomp 2, CapBnd 0 in the agent's /proc/<pid>/status), so the agent
    // runs under the shipped restrictions.
    "NoNewPrivileges",
    "CapabilityBoundingSet",
    "AmbientCapabilities",
    "RestrictRealtime",
    "RestrictSUIDSGID",
    "LockPersonality",
    "MemoryDenyWriteExecute",
    "RestrictAddressFamilies",
    "RestrictNamespaces",
    "SystemCallArchitectures",
    "SystemCallFilter",
    "SystemCallErrorNumber",
];

/// `[Unit]` keys kept as shipped.
const KEPT_UNIT: &[&str] = &[
    "Description",
    "Documentation",
    "StartLimitIntervalSec",
    "StartLimitBurst",
    "StartLimitAction",
];

/// Keys left out, by section, with the reason.
const DROPPED: &[(&str, &[&str], &str)] = &[
    (
        "Service",
        &["User", "Group", "SupplementaryGroups", "DynamicUser"],
        "a user manager runs its units as its own user (root here); asked to switch, it fails the start (status 217/USER: the user does not exist here)",
    ),
    (
        "Service",
        &["DevicePolicy", "DeviceAllow"],
        "device access is a cgroup (the v1 devices controller, or BPF on cgroup2) only the system manager sets up; a user manager's unit stays in the devices cgroup it was started in",
    ),
    (
        "Service",
        &["RemoveIPC"],
        "acts only on the User= of a system service",
    ),
    (
        "Service",
        &["LogsDirectory", "CacheDirectory", "ConfigurationDirectory"],
        "a user manager makes these under $XDG_CONFIG_HOME, not /var; the agent writes nothing there",
    ),
    (
        "Service",
        &[
            "ProtectSystem",
            "ProtectHome",
            "PrivateTmp",
            "PrivateDevices",
            "PrivateNetwork",
            "PrivateUsers",
            "PrivateMounts",
            "ProtectKernelTunables",
            "ProtectKernelModules",
            "ProtectKernelLogs",
            "ProtectControlGroups",
            "ProtectClock",
            "ProtectHostname",
            "ProtectProc",
            "ReadWritePaths",
            "ReadOnlyPaths",
            "InaccessiblePaths",
        ],
        "mount-namespace sandboxing: the manager already runs in a private mount namespace here, and the shipped unit avoids these on purpose (the Ascend driver's per-namespace device table)",
    ),
    (
        "Service",
        &["ExecStart"],
        "replaced by the command under test",
    ),
    (
        "Unit",
        &["After", "Wants", "Requires", "Before", "BindsTo", "PartOf"],
        "ordering against system units (network-online.target): a user manager has none of them",
    ),
];

/// The `[Install]` section's reason.
const INSTALL_DROPPED: &str = "nothing enables the unit: it is started by name";

/// A key left out of the derived unit.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DroppedKey {
    pub section: String,
    pub key: String,
    pub value: String,
    pub reason: String,
}

/// A user unit derived from a shipped system unit ([`user_unit`]).
#[derive(Debug, Clone)]
pub struct UserUnit {
    unit: Vec<(String, String)>,
    service: Vec<(String, String)>,
    /// What was left out of the shipped unit, and why.
    pub dropped: Vec<DroppedKey>,
    /// What was set here beside the shipped keys (`Key=value: why`).
    pub changes: Vec<String>,
}

impl UserUnit {
    /// The last value of a `[Service]` key.
    pub fn service_value(&self, key: &str) -> Option<&str> {
        self.service
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The `[Service]` keys, in order.
    pub fn service_keys(&self) -> impl Iterator<Item = (&str, &str)> {
        self.service.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// The `[Unit]` keys, in order.
    pub fn unit_keys(&self) -> impl Iterator<Item = (&str, &str)> {
        self.unit.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// Sets a `[Service]` key, replacing every shipped value of it; `why` is recorded.
    pub fn set(&mut self, key: &str, value: &str, why: &str) {
        let at = self.service.iter().position(|(k, _)| k == key);
        self.service.retain(|(k, _)| k != key);
        let entry = (key.to_owned(), value.to_owned());
        match at {
            Some(i) => self.service.insert(i.min(self.service.len()), entry),
            None => self.service.push(entry),
        }
        self.changes.push(format!("{key}={value}: {why}"));
    }

    /// Adds a `[Service]` line (another `Environment=`, say); `why` is recorded.
    pub fn add(&mut self, key: &str, value: &str, why: &str) {
        self.service.push((key.to_owned(), value.to_owned()));
        self.changes.push(format!("{key}={value}: {why}"));
    }

    /// The unit file, with a header naming its source, what was left out and what changed.
    pub fn text(&self) -> String {
        let mut s = format!(
            "# Derived by npu-chaos (tools/npu-chaos/src/systemd.rs) from {SHIPPED_UNIT_PATH}\n# for a private systemd user manager.\n"
        );
        if !self.dropped.is_empty() {
            s.push_str("# Left out:\n");
            for d in &self.dropped {
                s.push_str(&format!(
                    "#   [{}] {}={}: {}\n",
                    d.section,
                    d.key,
                    d.value.replace('\n', " "),
                    d.reason
                ));
            }
        }
        if !self.changes.is_empty() {
            s.push_str("# Set here:\n");
            for c in &self.changes {
                s.push_str(&format!("#   {c}\n"));
            }
        }
        s.push_str("[Unit]\n");
        for (k, v) in &self.unit {
            s.push_str(&format!("{k}={v}\n"));
        }
        s.push_str("\n[Service]\n");
        for (k, v) in &self.service {
            s.push_str(&format!("{k}={v}\n"));
        }
        s
    }
}

/// The shipped unit (`shipped`, the text of a system unit file) as a user manager runs it:
/// the `[Service]` keys such a manager applies kept as written, the others dropped with the
/// reason, `ExecStart=` replaced by `exec_start` (quoted for systemd), `[Unit]`
/// `DefaultDependencies=no` added (see the module's doc). A key this function does not know
/// is dropped too, with a reason saying so: a test keeps the shipped unit free of them.
pub fn user_unit(shipped: &str, exec_start: &[&str]) -> Result<UserUnit, String> {
    if exec_start.is_empty() {
        return Err("ExecStart: no command".to_owned());
    }
    let mut u = UserUnit {
        unit: Vec::new(),
        service: Vec::new(),
        dropped: Vec::new(),
        changes: Vec::new(),
    };
    let mut exec_at = None;
    for (section, key, value) in parse_unit(shipped)? {
        let kept = match section.as_str() {
            "Unit" => KEPT_UNIT.contains(&key.as_str()),
            "Service" => KEPT_SERVICE.contains(&key.as_str()),
            _ => false,
        };
        if kept {
            match section.as_str() {
                "Unit" => u.unit.push((key, value)),
                _ => u.service.push((key, value)),
            }
            continue;
        }
        if section == "Service" && key == "ExecStart" && exec_at.is_none() {
            exec_at = Some(u.service.len());
        }
        let reason = if section == "Install" {
            INSTALL_DROPPED.to_owned()
        } else {
            DROPPED
                .iter()
                .find(|(s, keys, _)| *s == section && keys.contains(&key.as_str()))
                .map_or_else(
                    || {
                        format!(
                            "not classified by npu_chaos::systemd::user_unit: add `{key}` to the kept or the dropped keys"
                        )
                    },
                    |(_, _, r)| (*r).to_owned(),
                )
        };
        u.dropped.push(DroppedKey {
            section,
            key,
            value,
            reason,
        });
    }
    let exec = exec_line(exec_start);
    let at = exec_at.unwrap_or(u.service.len()).min(u.service.len());
    u.service.insert(at, ("ExecStart".to_owned(), exec.clone()));
    u.changes
        .push(format!("ExecStart={exec}: the command under test"));
    u.unit
        .push(("DefaultDependencies".to_owned(), "no".to_owned()));
    u.changes.push(
        "[Unit] DefaultDependencies=no: the default dependencies pull in basic.target, whose sockets.target starts the host's user sockets (dbus, gpg-agent)".to_owned(),
    );
    Ok(u)
}

/// The `[Unit]`-file entries of `text` as (section, key, value): comments (`#`, `;`) and
/// blank lines skipped, a line ending in `\` continued on the next (as systemd joins them,
/// with a space).
fn parse_unit(text: &str) -> Result<Vec<(String, String, String)>, String> {
    let mut out = Vec::new();
    let mut section: Option<String> = None;
    let mut lines = text.lines().enumerate();
    while let Some((n, raw)) = lines.next() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = Some(name.to_owned());
            continue;
        }
        let mut full = line.to_owned();
        while full.ends_with('\\') {
            full.pop();
            full.push(' ');
            // The next line that is not a comment continues it.
            for (_, next) in lines.by_ref() {
                let next = next.trim();
                if !(next.starts_with('#') || next.starts_with(';')) {
                    full.push_str(next);
                    break;
                }
            }
        }
        let Some((key, value)) = full.split_once('=') else {
            return Err(format!("line {}: {raw:?} is not `Key=value`", n + 1));
        };
        let Some(section) = &section else {
            return Err(format!("line {}: {raw:?} is outside any [section]", n + 1));
        };
        out.push((
            section.clone(),
            key.trim().to_owned(),
            value.trim().to_owned(),
        ));
    }
    Ok(out)
}

/// A command line for `ExecStart=`: each word in double quotes, with `\` and `"` escaped, and
/// `%` and `$` doubled so systemd expands neither specifiers nor variables in them.
pub fn exec_line(argv: &[&str]) -> String {
    argv.iter()
        .map(|a| {
            let mut q = String::with_capacity(a.len() + 2);
            q.push('"');
            for c in a.chars() {
                match c {
                    '\\' | '"' => {
                        q.push('\\');
                        q.push(c);
                    }
                    '%' => q.push_str("%%"),
                    '$' => q.push_str("$$"),
                    _ => q.push(c),
                }
            }
            q.push('"');
            q
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// A value for `Environment=`: `"KEY=value"` quoted as [`exec_line`] quotes a word (without
/// the `$` doubling: systemd expands no variables in `Environment=`).
pub fn environment_value(key: &str, value: &str) -> String {
    let mut q = String::from("\"");
    for c in format!("{key}={value}").chars() {
        match c {
            '\\' | '"' => {
                q.push('\\');
                q.push(c);
            }
            '%' => q.push_str("%%"),
            _ => q.push(c),
        }
    }
    q.push('"');
    q
}

/// A systemd time span (`RestartSec=1s`, `500ms`, `2min 30s`, a bare number of seconds).
pub fn parse_timespan(s: &str) -> Option<Duration> {
    let s = s.trim();
    if let Ok(secs) = s.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs));
    }
    humantime::parse_duration(s).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::systemd::SHIPPED_UNIT;

    // The unit operators install, as a user manager runs it: the keys that shape starting,
    // stopping, restarting and keeping sockets are kept as shipped; the identity, device
    // and ordering keys are dropped with a reason; no key of the shipped file is left
    // unclassified (a new one fails here until it is sorted into a list).
    #[test]
    fn the_user_unit_follows_the_shipped_unit() {
        let u = user_unit(SHIPPED_UNIT, &["/x/npu-health-agent", "--fake", "run"]).unwrap();
        let shipped = parse_unit(SHIPPED_UNIT).unwrap();
        let unknown: Vec<&DroppedKey> = u
            .dropped
            .iter()
            .filter(|d| d.reason.starts_with("not classified"))
            .collect();
        assert!(unknown.is_empty(), "unclassified keys: {unknown:#?}");
        // Every shipped [Service] key is either kept with its value or dropped with a reason.
        for (section, key, value) in &shipped {
            let kept = match section.as_str() {
                "Service" => u.service_keys().any(|(k, v)| k == key && v == value),
                "Unit" => u.unit_keys().any(|(k, v)| k == key && v == value),
                _ => false,
            };
            let dropped = u
                .dropped
                .iter()
                .any(|d| &d.section == section && &d.key == key && &d.value == value);
            assert!(
                kept != dropped,
                "[{section}] {key}={value}: kept {kept}, dropped {dropped}"
            );
        }
        // What the runner's faults depend on is kept whenever shipped.
        for key in [
            "Type",
            "NotifyAccess",
            "KillMode",
            "TimeoutStopSec",
            "WatchdogSec",
            "Restart",
            "RestartSec",
            "FileDescriptorStoreMax",
            "RuntimeDirectory",
            "RuntimeDirectoryPreserve",
            "Nice",
            "CPUWeight",
        ] {
            let shipped_value = shipped
                .iter()
                .rev()
                .find(|(s, k, _)| s == "Service" && k == key)
                .map(|(_, _, v)| v.as_str());
            assert_eq!(u.service_value(key), shipped_value, "{key}");
        }
        assert_eq!(
            u.service_value("ExecStart"),
            Some(r#""/x/npu-health-agent" "--fake" "run""#)
        );
        assert!(u.dropped.iter().any(|d| d.key == "User"), "{:?}", u.dropped);
        assert!(u.dropped.iter().any(|d| d.key == "DeviceAllow"));
        assert!(
            !u.service_keys()
                .any(|(k, _)| k == "User" || k == "DevicePolicy"),
            "{}",
            u.text()
        );
        let text = u.text();
        assert!(text.contains("DefaultDependencies=no"), "{text}");
        assert!(text.contains("# Left out:"), "{text}");
        // The text is itself a unit file with one ExecStart.
        let again = parse_unit(&text).unwrap();
        assert_eq!(again.iter().filter(|(_, k, _)| k == "ExecStart").count(), 1);
    }

    #[test]
    fn set_replaces_and_add_appends() {
        let mut u = user_unit(
            "[Service]\nType=notify\nRestartSec=1s\nEnvironment=A=1\n[Install]\nWantedBy=x\n",
            &["/bin/true"],
        )
        .unwrap();
        u.set("RestartSec", "50ms", "scaled");
        u.add("Environment", &environment_value("B", "two words"), "test");
        assert_eq!(u.service_value("RestartSec"), Some("50ms"));
        assert_eq!(
            u.service_keys()
                .filter(|(k, _)| *k == "Environment")
                .count(),
            2
        );
        assert_eq!(u.dropped.len(), 1);
        assert_eq!(u.dropped[0].reason, INSTALL_DROPPED);
        assert!(u.text().contains("Environment=\"B=two words\""));
        let err = user_unit("[Service]\nType=notify\nNoSuchKey=1\n", &["/bin/true"]).unwrap();
        assert!(err.dropped[0].reason.starts_with("not classified"));
    }

    #[test]
    fn unit_files_parse_with_comments_and_continuations() {
        let t = "# c\n[Unit]\nDescription=a = b\n[Service]\n; c\nExecStart=/bin/x \\\n  --y \\\n  # skipped\n  --z\n";
        let p = parse_unit(t).unwrap();
        assert_eq!(p[0], ("Unit".into(), "Description".into(), "a = b".into()));
        assert_eq!(p[1].2, "/bin/x  --y  --z");
        assert!(parse_unit("Key=1\n").unwrap_err().contains("outside"));
        assert!(parse_unit("[S]\nnothing\n").unwrap_err().contains("line 2"));
    }

    #[test]
    fn exec_words_are_quoted_and_escaped() {
        assert_eq!(
            exec_line(&["/a b/c", "50%", "$HOME", "x\"y"]),
            r#""/a b/c" "50%%" "$$HOME" "x\"y""#
        );
        assert_eq!(environment_value("K", "a%b"), r#""K=a%%b""#);
    }

    #[test]
    fn time_spans() {
        assert_eq!(parse_timespan("1s"), Some(Duration::from_secs(1)));
        assert_eq!(parse_timespan("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_timespan("2"), Some(Duration::from_secs(2)));
        assert_eq!(parse_timespan("2min 30s"), Some(Duration::from_secs(150)));
        assert_eq!(parse_timespan("soon"), None);
    }
}

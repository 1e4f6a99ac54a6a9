//! The agent crate's top-level modules depend on each other without a cycle: data flows
//! down (driver → sampler → ring → window; probe → monitor → server; agent and cli wire
//! them), no module calls back up into its caller, and the configuration is the bottom
//! layer every module may read and that reads none of them. A
//! dependency is a `crate::<module>` path in shipped code (comments and unit test modules
//! ignored), or a `super::<module>` path where `super` is the crate root (in `src/<module>.rs`
//! or `src/<module>/mod.rs`; `super::super::<module>` one folder down).
//! The same holds for every crate under `tools/` and `fakes/`, and the shipped code of the
//! agent, `tools/` and `fakes/` has no glob import (`use …::*`): each file names what it uses.
//! `cargo test --test service module_layering:: -- --nocapture` prints the graphs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn rust_files(p: &Path, out: &mut Vec<PathBuf>) {
    if p.is_file() {
        out.push(p.to_owned());
    } else if let Ok(dir) = std::fs::read_dir(p) {
        for e in dir.flatten() {
            let path = e.path();
            if path.is_dir() || path.extension().is_some_and(|x| x == "rs") {
                rust_files(&path, out);
            }
        }
    }
}

/// The workspace root (this crate's manifest directory).
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// An item without its visibility (`pub`, `pub(crate)`, …).
fn without_visibility(item: &str) -> &str {
    match item.strip_prefix("pub") {
        Some(r) if r.starts_with('(') => r[r.find(')').map_or(0, |i| i + 1)..].trim_start(),
        Some(r) if r.starts_with(char::is_whitespace) => r.trim_start(),
        _ => item,
    }
}

/// The shipped lines of a Rust file: (line number, the line without its `//` comment), up
/// to its unit tests. Unit tests may reach anywhere: a `#[cfg(test)]` module ends the
/// shipped code of its file (it comes last); another `#[cfg(test)]` item does not. (A test
/// module in a file of its own, `tests.rs`, is left out by its callers.)
fn shipped_lines(text: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut test_only = false;
    for (i, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or_default();
        let item = code.trim_start();
        if item.starts_with("#[cfg(test)]") || (test_only && item.starts_with("#[")) {
            test_only = true;
            continue;
        }
        if test_only && without_visibility(item).starts_with("mod ") {
            break;
        }
        test_only = false;
        out.push((i + 1, code));
    }
    out
}

/// The name a path segment starts with (`k8s` in `k8s::api`).
fn ident(s: &str) -> String {
    s.chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

/// The first segments a path continues with after `crate::` or `super::`: one (`run` in
/// `run::run(…)`), or each of a group (`a`, `b` in `{a::X, b}`, over lines too).
fn path_heads(rest: &str) -> Vec<String> {
    let Some(group) = rest.strip_prefix('{') else {
        return vec![ident(rest)];
    };
    let (mut heads, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                heads.push(ident(group[start..i].trim_start()));
                break;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                heads.push(ident(group[start..i].trim_start()));
                start = i + 1;
            }
            _ => {}
        }
    }
    heads
}

/// Module → the modules its shipped code names, for the crate whose sources are in `src`
/// (its `lib.rs` and `main.rs` left out). A module is a file `src/<m>.rs` or a folder
/// `src/<m>/`; it names another by a `crate::<other>` path, or by `super::<other>` where
/// `super` is the crate root (a file of `src/` or a folder's `mod.rs`; `super::super::` from
/// a file inside a folder). A folder's file naming its folder's other files (`super::<x>`)
/// names its own module.
fn graph_of(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    graph_with_tables(src, &[])
}

/// The node of the integrations' tables: `src/integrations/<name>/config.rs` (its
/// configuration table) and `src/integrations/<name>/told.rs` (the states it is told), data
/// that the configuration and the monitor's journal read and that reads no runtime module.
const TABLES: &str = "integration_tables";

/// Whether `rel` (a path under `src/`) is one of the integrations' tables.
fn is_table(rel: &Path) -> bool {
    let parts: Vec<&str> = rel.iter().map(|c| c.to_str().unwrap()).collect();
    matches!(parts.as_slice(), ["integrations", _, f] if *f == "config.rs" || *f == "told.rs")
}

/// Whether a `crate::` path's rest (`integrations::haproxy::config::X`) names a table.
fn names_table(rest: &str) -> bool {
    let Some(r) = rest.strip_prefix("integrations::") else {
        return false;
    };
    let mut segs = r.splitn(3, "::");
    let (_, second) = (segs.next(), segs.next().map(ident));
    matches!(second.as_deref(), Some("config" | "told"))
}

/// [`graph_of`], with the files under `src/<folder>/` that [`is_table`] says are tables as a
/// node of their own ([`TABLES`]) for each folder in `tabled`.
fn graph_with_tables(src: &Path, tabled: &[&str]) -> BTreeMap<String, BTreeSet<String>> {
    let mut mods = BTreeMap::new();
    for e in std::fs::read_dir(src).unwrap().flatten() {
        let path = e.path();
        let name = path.file_stem().unwrap().to_str().unwrap().to_owned();
        let module = path.is_dir() || path.extension().is_some_and(|x| x == "rs");
        if module && name != "lib" && name != "main" {
            mods.insert(name, path);
        }
    }
    let mut names: BTreeSet<String> = mods.keys().cloned().collect();
    if !tabled.is_empty() {
        names.insert(TABLES.to_owned());
    }
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, path) in &mods {
        let mut files = Vec::new();
        rust_files(path, &mut files);
        // A test module in a file of its own (`#[cfg(test)] mod tests;`) is not shipped.
        for f in files.iter().filter(|f| !f.ends_with("tests.rs")) {
            let table = tabled.contains(&module.as_str()) && is_table(f.strip_prefix(src).unwrap());
            let m = if table {
                TABLES.to_owned()
            } else {
                module.clone()
            };
            let mut deps = BTreeSet::new();
            let text = std::fs::read_to_string(f).unwrap();
            let code: Vec<&str> = shipped_lines(&text).into_iter().map(|(_, c)| c).collect();
            let code = code.join("\n");
            // How many `super::` lead from this file to the crate root: 1 from `src/<m>.rs`
            // and `src/<m>/mod.rs`, 2 from `src/<m>/<file>.rs`, …
            let rel = f.strip_prefix(src).unwrap();
            let depth = rel.components().count() - usize::from(f.ends_with("mod.rs"));
            let mut named = Vec::new();
            for (i, _) in code.match_indices("crate::") {
                let rest = &code[i + "crate::".len()..];
                if !tabled.is_empty() && names_table(rest) {
                    named.push(TABLES.to_owned());
                } else {
                    named.extend(path_heads(rest));
                }
            }
            // A table names its own folder's runtime by any `super::` that is not a table.
            if table {
                for (i, _) in code.match_indices("super::") {
                    let next = ident(&code[i + "super::".len()..]);
                    if next != "config" && next != "told" && next != "super" {
                        named.push(module.clone());
                    }
                }
            }
            for (i, _) in code.match_indices("super::") {
                let before = &code[..i];
                // The start of a chain: `super::super::x` is counted once, from its first.
                if before.ends_with("super::")
                    || before.ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
                {
                    continue;
                }
                let mut rest = &code[i..];
                let mut supers = 0;
                while let Some(r) = rest.strip_prefix("super::") {
                    rest = r;
                    supers += 1;
                }
                if supers == depth {
                    named.extend(path_heads(rest));
                }
            }
            for dep in named {
                if names.contains(&dep) && dep != m {
                    deps.insert(dep);
                }
            }
            edges.entry(m).or_default().extend(deps);
        }
        edges.entry(module.clone()).or_default();
    }
    edges
}

/// Module → the modules its shipped code names, in the agent crate. The integrations'
/// tables ([`TABLES`]) are part of the configuration's layer: their arrows are the
/// configuration's, and an arrow to them is an arrow to the configuration.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    on_the_configurations_floor(graph_with_tables(&root().join("src"), &["integrations"]))
}

/// `g` with its tables' node folded into the configuration's.
fn on_the_configurations_floor(
    mut g: BTreeMap<String, BTreeSet<String>>,
) -> BTreeMap<String, BTreeSet<String>> {
    let tables = g.remove(TABLES).unwrap_or_default();
    for deps in g.values_mut() {
        if deps.remove(TABLES) {
            deps.insert("config".to_owned());
        }
    }
    let config = g.entry("config".to_owned()).or_default();
    config.extend(tables);
    config.remove("config");
    g
}

/// A cycle through `from`, if any (depth-first).
fn cycle_from(g: &BTreeMap<String, BTreeSet<String>>, from: &str) -> Option<Vec<String>> {
    fn walk(
        g: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        seen: &mut BTreeSet<String>,
    ) -> bool {
        let last = path.last().unwrap().clone();
        for n in &g[&last] {
            if *n == path[0] {
                path.push(n.clone());
                return true;
            }
            if seen.insert(n.clone()) {
                path.push(n.clone());
                if walk(g, path, seen) {
                    return true;
                }
                path.pop();
            }
        }
        false
    }
    let mut path = vec![from.to_owned()];
    walk(g, &mut path, &mut BTreeSet::new()).then_some(path)
}

#[test]
fn top_level_modules_have_no_dependency_cycle() {
    let g = graph();
    for (m, deps) in &g {
        println!(
            "{m:10} -> {}",
            deps.iter().cloned().collect::<Vec<_>>().join(" ")
        );
    }
    let cycles: Vec<String> = g
        .keys()
        .filter_map(|m| cycle_from(&g, m))
        .map(|c| c.join(" -> "))
        .collect();
    assert!(cycles.is_empty(), "module cycles: {cycles:#?}");
}

/// Whether a walk along `g`'s arrows leads from `from` to `to`.
fn reaches(g: &BTreeMap<String, BTreeSet<String>>, from: &str, to: &str) -> bool {
    let (mut seen, mut next) = (BTreeSet::new(), vec![from.to_owned()]);
    while let Some(m) = next.pop() {
        if m == to {
            return true;
        }
        if seen.insert(m.clone()) {
            next.extend(g.get(&m).into_iter().flatten().cloned());
        }
    }
    false
}

/// A function of shipped code: its file, name, first line and length in lines (from `fn`
/// to its closing brace).
#[derive(Debug)]
struct Function {
    file: String,
    name: String,
    line: usize,
    lines: usize,
    /// The lines above it (its doc and attributes) say why it is long: `Long because:`.
    reason: bool,
}

/// The functions of the shipped code of every Rust file under `dirs` (unit tests left out).
/// A function ends at the first `}` indented as its `fn` line (the project is rustfmt'd).
fn functions(base: &Path, dirs: &[&str]) -> Vec<Function> {
    let mut files = Vec::new();
    for d in dirs {
        rust_files(&base.join(d), &mut files);
    }
    let mut out = Vec::new();
    for f in files
        .iter()
        // Shipped code: not a crate's integration tests (`tests/`), nor a build's output.
        .filter(|f| {
            let rel = f.strip_prefix(base).unwrap_or(f);
            !f.ends_with("tests.rs")
                && !rel
                    .components()
                    .any(|c| c.as_os_str() == "target" || c.as_os_str() == "tests")
        })
    {
        let text = std::fs::read_to_string(f).unwrap();
        let all: Vec<&str> = text.lines().collect();
        let shipped = shipped_lines(&text);
        let end = shipped.last().map_or(0, |(n, _)| *n);
        for (n, code) in &shipped {
            let item = without_visibility(code.trim_start());
            let item = ["const ", "async ", "unsafe ", "extern \"C\" "]
                .iter()
                .fold(item, |i, q| i.strip_prefix(q).unwrap_or(i));
            let Some(rest) = item.strip_prefix("fn ") else {
                continue;
            };
            let indent = code.len() - code.trim_start().len();
            let close = format!("{}}}", " ".repeat(indent));
            let Some(last) = (*n..=end).find(|&k| {
                let l = all[k - 1];
                l.starts_with(&close) && l.len() - l.trim_start().len() == indent
            }) else {
                continue;
            };
            // A declaration without a body (`fn f();` in a trait) is not a function here.
            if (*n..last).any(|k| all[k - 1].trim_end().ends_with(';'))
                && !(*n..last).any(|k| all[k - 1].trim_end().ends_with('{'))
            {
                continue;
            }
            let above = all[..n - 1]
                .iter()
                .rev()
                .take_while(|l| {
                    let t = l.trim_start();
                    t.starts_with("//") || t.starts_with("#[")
                })
                .any(|l| l.contains("Long because:"));
            out.push(Function {
                file: f.strip_prefix(base).unwrap().display().to_string(),
                name: ident(rest),
                line: *n,
                lines: last - n + 1,
                reason: above,
            });
        }
    }
    out.sort_by(|a, b| b.lines.cmp(&a.lines).then(a.file.cmp(&b.file)));
    out
}

/// A shipped file's length: its lines before the `#[cfg(test)]` of its test module (all of
/// them without one), and whether its top (the comments above its first item) says why it is
/// long: `Long because:`.
#[derive(Debug, PartialEq)]
struct FileLength {
    file: String,
    lines: usize,
    reason: bool,
}

/// The shipped length of `text`: its lines before the `#[cfg(test)]` that opens a test module
/// (a `#[cfg(test)]` item that is no module does not end the shipped code).
fn shipped_length(text: &str) -> usize {
    let lines: Vec<&str> = text.lines().collect();
    let opens_tests = |i: usize| {
        lines[i + 1..]
            .iter()
            .map(|l| without_visibility(l.trim_start()))
            .find(|l| !l.starts_with("#[") && !l.starts_with("//"))
            .is_some_and(|l| l.starts_with("mod "))
    };
    (0..lines.len())
        .find(|&i| lines[i].trim_start().starts_with("#[cfg(test)]") && opens_tests(i))
        .unwrap_or(lines.len())
}

/// Whether the top of `text` (its comments, inner attributes and blank lines, up to its first
/// item) gives a reason for its length.
fn long_reason_at_top(text: &str) -> bool {
    text.lines()
        .take_while(|l| {
            let t = l.trim_start();
            t.is_empty() || ["//", "/*", "*", "#!["].iter().any(|p| t.starts_with(p))
        })
        .any(|l| l.contains("Long because:"))
}

/// The shipped files of every Rust file under `dirs` with their lengths, longest first: not a
/// test module in a file of its own (`tests.rs`), a crate's integration tests (`tests/`) nor a
/// build's output.
fn file_lengths(base: &Path, dirs: &[&str]) -> Vec<FileLength> {
    let mut files = Vec::new();
    for d in dirs {
        rust_files(&base.join(d), &mut files);
    }
    let mut out: Vec<FileLength> = files
        .iter()
        .filter(|f| {
            let rel = f.strip_prefix(base).unwrap_or(f);
            !f.ends_with("tests.rs")
                && !rel
                    .components()
                    .any(|c| c.as_os_str() == "target" || c.as_os_str() == "tests")
        })
        .map(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            FileLength {
                file: f.strip_prefix(base).unwrap().display().to_string(),
                lines: shipped_length(&text),
                reason: long_reason_at_top(&text),
            }
        })
        .collect();
    out.sort_by(|a, b| b.lines.cmp(&a.lines).then(a.file.cmp(&b.file)));
    out
}

/// The most lines a shipped file holds without a reason at its top.
const MAX_FILE_LINES: usize = 600;

// No shipped file is over 600 lines (its tests aside) without a reason at its top (a line
// `// Long because: …` among the comments above its first item): past that, a file holds
// more than one reader keeps in mind, and its items want files that each say what they are
// for. The agent, the tools, the fakes and the binding.
#[test]
fn no_shipped_file_over_600_lines_without_a_reason() {
    let long: Vec<String> = file_lengths(root(), &["src", "tools", "fakes", "crates"])
        .into_iter()
        .filter(|f| f.lines > MAX_FILE_LINES && !f.reason)
        .map(|f| format!("{} ({} lines)", f.file, f.lines))
        .collect();
    assert!(
        long.is_empty(),
        "over {MAX_FILE_LINES} shipped lines without `// Long because:` at the top: {long:#?}"
    );
}

// The check itself: a 601-line file is found, a reason at its top is read (not one further
// down), its test module is not counted, nor is a `tests.rs`, and a `#[cfg(test)]` item that
// is no module does not end the shipped code.
#[test]
fn a_long_file_is_found() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("src/m")).unwrap();
    let body = "const _: u8 = 1;\n".repeat(598);
    let tests = "#[cfg(test)]\nmod tests {\n    fn t() {}\n}\n";
    let files = [
        // 600 shipped lines.
        ("src/m/fits.rs", format!("//! Fits.\n{body}\n{tests}")),
        // 601, a `#[cfg(test)]` item among them.
        (
            "src/m/long.rs",
            format!("//! Long.\n#[cfg(test)]\nconst T: u8 = 0;\n{body}{tests}"),
        ),
        (
            "src/m/reasoned.rs",
            format!("//! Long.\n// Long because: a table.\n\n{body}"),
        ),
        (
            "src/m/reason_below.rs",
            format!("//! Long.\nuse a::b;\n// Long because: too late.\n{body}"),
        ),
        ("src/m/tests.rs", body.repeat(2)),
    ];
    for (path, text) in &files {
        std::fs::write(dir.path().join(path), text).unwrap();
    }
    let got: Vec<(String, usize, bool)> = file_lengths(dir.path(), &["src"])
        .into_iter()
        .map(|f| (f.file, f.lines, f.reason))
        .collect();
    let want = [
        ("src/m/long.rs", 601, false),
        ("src/m/reason_below.rs", 601, false),
        ("src/m/reasoned.rs", 601, true),
        ("src/m/fits.rs", 600, false),
    ]
    .map(|(f, n, r)| (f.to_owned(), n, r));
    assert_eq!(got, want);
}

/// Each integration: its name, its homes (its folder now; before the integrations wing, the
/// files it lived in) and the names that are its own in code.
const INTEGRATIONS: &[(&str, &[&str], &[&str])] = &[
    (
        "node_manager",
        &["integrations/node_manager/"],
        &["Integration::NodeManager", "node_manager", "NodeManager"],
    ),
    (
        "kubelet",
        &["integrations/kubelet/"],
        &[
            "kubelet::",
            "Readiness {",
            "Liveness {",
            "readyz",
            "livez",
            "NotReadyOn",
            "Integration::Kubelet",
        ],
    ),
    (
        "kubernetes_api",
        &[
            "integrations/kubernetes/",
            "k8s/",
            "actions/eviction.rs",
            "config/kubernetes.rs",
        ],
        &[
            "k8s::",
            "KubeRecord",
            "ApiMode",
            "KubernetesConfig",
            "PodSelector",
            "PodAction",
            "GateMemory",
            "eviction_ground",
            "KubernetesApi",
            "kubernetes::",
        ],
    ),
    (
        "haproxy",
        &[
            "integrations/haproxy/",
            "actions/haproxy.rs",
            "server/agent_check.rs",
        ],
        &[
            "HaproxyState",
            "HaproxyMap",
            "AgentCheck",
            "agent_check",
            "haproxy_agent_listen",
            "Haproxy",
            "HAPROXY_",
        ],
    ),
    ("envoy", &["integrations/envoy/"], &["envoy", "Envoy"]),
];

/// The files of `src` outside `homes` whose shipped code (comments and strings left out)
/// names one of `names`.
fn naming_files(src: &Path, homes: &[&str], names: &[&str]) -> Vec<String> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut out = Vec::new();
    for f in files.iter().filter(|f| !f.ends_with("tests.rs")) {
        let rel = f.strip_prefix(src).unwrap().display().to_string();
        if homes.iter().any(|h| rel.starts_with(h)) {
            continue;
        }
        let text = std::fs::read_to_string(f).unwrap();
        let code: String = shipped_lines(&text)
            .into_iter()
            .map(|(_, c)| c.split('"').step_by(2).collect::<Vec<_>>().join("\"\""))
            .collect::<Vec<_>>()
            .join("\n");
        if names.iter().any(|n| code.contains(n)) {
            out.push(rel);
        }
    }
    out.sort();
    out
}

// Figures of the layout, for a review or a closing note: shipped files, modules, import
// arrows, arrows back up (an arrow inside a cycle), cycles, and the ten longest functions.
// Of this checkout, or of the one `NPU_HEALTH_LAYOUT_OF` names (an older one, to compare):
// `NPU_HEALTH_LAYOUT_OF=<checkout> cargo test --features fake-driver --test service
// module_layering::the_layout_in_figures -- --nocapture`.
#[test]
fn the_layout_in_figures() {
    let base = std::env::var_os("NPU_HEALTH_LAYOUT_OF")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().to_owned());
    let src = base.join("src");
    let g = on_the_configurations_floor(graph_with_tables(&src, &["integrations"]));
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let shipped = files.iter().filter(|f| !f.ends_with("tests.rs")).count();
    let arrows: usize = g.values().map(BTreeSet::len).sum();
    let back = arrows_back_up(&g);
    let cycles = cycles_of(&g);
    println!(
        "{}: {shipped} shipped files in src/, {} modules, {arrows} arrows, {} back up, {} cycles",
        base.display(),
        g.len(),
        back.len(),
        cycles.len()
    );
    for b in &back {
        println!("  back up: {b}");
    }
    print_circles(&base);
    print_visibility(&base);
    println!("the files outside each integration's home whose code names it:");
    for (name, homes, names) in INTEGRATIONS {
        let files = naming_files(&src, homes, names);
        let folders: BTreeSet<&str> = files.iter().map(|f| f.split('/').next().unwrap()).collect();
        println!(
            "  {name}: {} files in {} folders: {}",
            files.len(),
            folders.len(),
            files.join(" ")
        );
    }
    let fns = functions(&base, &["src", "tools", "fakes", "crates"]);
    let over = fns.iter().filter(|f| f.lines > 100).count();
    println!("functions over 100 lines: {over}; the ten longest:");
    for f in fns.iter().take(10) {
        let why = if f.reason { " (a reason is given)" } else { "" };
        println!("  {:4} {}:{} {}{why}", f.lines, f.file, f.line, f.name);
    }
    let long: Vec<FileLength> = file_lengths(&base, &["src", "tools", "fakes", "crates"])
        .into_iter()
        .filter(|f| f.lines > MAX_FILE_LINES)
        .collect();
    println!(
        "shipped files over {MAX_FILE_LINES} lines: {} ({} with a reason):",
        long.len(),
        long.iter().filter(|f| f.reason).count()
    );
    for f in &long {
        let why = if f.reason { " (a reason is given)" } else { "" };
        println!("  {:4} {}{why}", f.lines, f.file);
    }
    assert!(arrows > 0, "no arrow found under {}", src.display());
}

/// The arrows of `g` that run back up: each inside a circle (its head reaches its tail).
fn arrows_back_up(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    g.iter()
        .flat_map(|(m, deps)| deps.iter().map(move |d| (m, d)))
        .filter(|(m, d)| reaches(g, d, m))
        .map(|(m, d)| format!("{m} -> {d}"))
        .collect()
}

/// Prints the circles of the checkout at `base`: between the top-level modules of each crate
/// under `tools/`, `fakes/` and `crates/` (the agent's are printed above), and between the
/// files of each folder module of every crate, with the arrows that run back up.
fn print_circles(base: &Path) {
    let (mut module_circles, mut module_back) = (Vec::new(), Vec::new());
    for (name, src) in member_crates_in(base, &["tools", "fakes", "crates"]) {
        let g = graph_of(&src);
        module_circles.extend(cycles_of(&g).into_iter().map(|c| format!("{name}: {c:?}")));
        module_back.extend(
            arrows_back_up(&g)
                .into_iter()
                .map(|a| format!("{name}: {a}")),
        );
    }
    println!(
        "module level in tools/, fakes/, crates/: {} circles, {} arrows back up",
        module_circles.len(),
        module_back.len()
    );
    for c in module_circles.iter().chain(&module_back) {
        println!("  {c}");
    }
    let (mut circles, mut back) = (Vec::new(), Vec::new());
    for (_, src) in all_crates(base) {
        circles.extend(file_circles(base, &src));
        let mut folders = Vec::new();
        folder_modules(&src, &mut folders);
        for folder in folders {
            let rel = folder
                .strip_prefix(base)
                .unwrap_or(&folder)
                .display()
                .to_string();
            let g = files_graph(&src, &folder);
            back.extend(
                arrows_back_up(&g)
                    .into_iter()
                    .map(|a| format!("{rel}: {a}")),
            );
        }
    }
    println!(
        "file level (the agent, tools/, fakes/, crates/): {} circles, {} arrows back up",
        circles.len(),
        back.len()
    );
    for c in &circles {
        println!("  circle: {c}");
    }
    for b in &back {
        println!("  back up: {b}");
    }
}

/// How many items of shipped code carry each visibility: `pub`, `pub(crate)`, `pub(super)`,
/// `pub(in …)` (an item: a `fn`, `struct`, `enum`, `union`, `trait`, `type`, `const`,
/// `static`, `mod` or `use` whose line starts with its visibility; fields and variants
/// aside). `tests.rs` and test modules are not shipped.
fn visibility_counts(src: &Path) -> BTreeMap<&'static str, usize> {
    // A qualifier first (`pub const fn`, `pub async fn`, `pub unsafe fn`, `pub extern "C"
    // fn`) still makes one item.
    const ITEMS: &[&str] = &[
        "fn ", "struct ", "enum ", "union ", "trait ", "type ", "const ", "static ", "mod ",
        "use ", "async ", "unsafe ", "extern ",
    ];
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut out = BTreeMap::new();
    for f in files.iter().filter(|f| !f.ends_with("tests.rs")) {
        let text = std::fs::read_to_string(f).unwrap();
        for (_, code) in shipped_lines(&text) {
            let t = code.trim_start();
            let vis = match t {
                _ if t.starts_with("pub ") => "pub",
                _ if t.starts_with("pub(crate)") => "pub(crate)",
                _ if t.starts_with("pub(super)") => "pub(super)",
                _ if t.starts_with("pub(in ") => "pub(in …)",
                _ => continue,
            };
            let item = without_visibility(t);
            if ITEMS.iter().any(|k| item.starts_with(k)) {
                *out.entry(vis).or_default() += 1;
            }
        }
    }
    out
}

/// Prints `pub` items against restricted ones, in the agent's shipped code and in that of the
/// crates under `tools/`, `fakes/` and `crates/`.
fn print_visibility(base: &Path) {
    for (name, src) in all_crates(base) {
        let n = visibility_counts(&src);
        let restricted: usize = n.iter().filter(|(v, _)| **v != "pub").map(|(_, k)| k).sum();
        println!(
            "{name}: {} pub items, {restricted} restricted ({} pub(crate), {} pub(super), {} pub(in …))",
            n.get("pub").unwrap_or(&0),
            n.get("pub(crate)").unwrap_or(&0),
            n.get("pub(super)").unwrap_or(&0),
            n.get("pub(in …)").unwrap_or(&0),
        );
    }
}

// The check itself: each visibility is counted on items of shipped code, not on fields, a
// `pub const fn` once, nor in a test module.
#[test]
fn visibility_is_counted_on_items() {
    let dir = tempfile::tempdir().unwrap();
    let text = "\
pub mod a;
pub(crate) use a::X;
pub struct S {
    pub field: u8,
}
pub const fn f() {}
pub const N: u8 = 1;
pub(super) fn g() {}
pub(in crate::a) enum E {}
#[cfg(test)]
mod tests {
    pub fn t() {}
}
";
    std::fs::write(dir.path().join("lib.rs"), text).unwrap();
    let got = visibility_counts(dir.path());
    let want = [
        ("pub", 4),
        ("pub(crate)", 1),
        ("pub(in …)", 1),
        ("pub(super)", 1),
    ];
    assert_eq!(got, BTreeMap::from(want));
}

// No function of shipped code is over 100 lines without a reason given beside it (a line
// `// Long because: …` among the comments and attributes above its `fn`): a long loop is a
// machine of named steps, a long function a list of named ones. The agent, the tools, the
// fakes and the binding.
#[test]
fn no_function_over_100_lines_without_a_reason() {
    let long: Vec<String> = functions(root(), &["src", "tools", "fakes", "crates"])
        .into_iter()
        .filter(|f| f.lines > 100 && !f.reason)
        .map(|f| format!("{}:{} {} ({} lines)", f.file, f.line, f.name, f.lines))
        .collect();
    assert!(
        long.is_empty(),
        "over 100 lines without `// Long because:` above: {long:#?}"
    );
}

// The check itself: a 101-line function is found, its reason is read, and a test module's
// function is not shipped code.
#[test]
fn a_long_function_is_found() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("src")).unwrap();
    let body = "    let _ = 1;\n".repeat(99);
    let text = format!(
        "pub fn long() {{\n{body}}}\n\n// Long because: a table.\nfn table() {{\n{body}}}\n\n#[cfg(test)]\nmod tests {{\n    fn t() {{\n{body}    }}\n}}\n"
    );
    std::fs::write(dir.path().join("src/a.rs"), text).unwrap();
    let fns = functions(dir.path(), &["src"]);
    let got: Vec<(&str, usize, bool)> = fns
        .iter()
        .map(|f| (f.name.as_str(), f.lines, f.reason))
        .collect();
    assert_eq!(got, [("long", 101, false), ("table", 101, true)]);
}

// The check itself: a graph with a cycle is found out.
#[test]
fn a_cycle_is_found() {
    let mut g = BTreeMap::new();
    g.insert("a".to_owned(), BTreeSet::from(["b".to_owned()]));
    g.insert("b".to_owned(), BTreeSet::from(["c".to_owned()]));
    g.insert("c".to_owned(), BTreeSet::from(["a".to_owned()]));
    g.insert("d".to_owned(), BTreeSet::from(["a".to_owned()]));
    assert_eq!(
        cycle_from(&g, "a").unwrap(),
        ["a", "b", "c", "a"].map(str::to_owned)
    );
    assert_eq!(cycle_from(&g, "d"), None);
}

// Configuration is the bottom layer: its shipped code names no other top-level module (the
// runtime converts what it needs, as `agent::driver_config` and
// `FaultTable::configured` do), so every module may read it and it reads none back. Nor
// does it name the integrations' tables: each integration reads its own, registered
// through the seam (`config::tables`), so a new table touches no file of `src/config/`.
#[test]
fn the_configuration_names_no_runtime_module() {
    let g = graph();
    assert!(g["config"].is_empty(), "config names {:?}", g["config"]);
    let g = graph_with_tables(&root().join("src"), &["integrations"]);
    assert!(
        g["config"].is_empty(),
        "config names {:?} (the integrations' tables are theirs)",
        g["config"]
    );
    // The integrations' tables (their configuration and the states they are told) are data
    // of the same floor: they name the configuration and nothing that runs.
    let g = graph_with_tables(&root().join("src"), &["integrations"]);
    let tables: Vec<&String> = g[TABLES].iter().filter(|m| *m != "config").collect();
    assert!(
        tables.is_empty(),
        "the integrations' tables name {tables:?}"
    );
}

// The tables are found as a node of their own: a table that names its integration's
// runtime (`super::<rule>`) is an arrow from the tables back up.
#[test]
fn a_table_naming_its_runtime_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    let files = [
        ("config/mod.rs", "use crate::integrations::x::config::T;\n"),
        ("integrations/mod.rs", "pub mod x;\nuse crate::config::C;\n"),
        (
            "integrations/x/mod.rs",
            "pub mod config;\npub fn rule() {}\n",
        ),
        ("integrations/x/config.rs", "pub struct T;\n"),
    ];
    for (path, text) in files {
        std::fs::create_dir_all(src.join(path).parent().unwrap()).unwrap();
        std::fs::write(src.join(path), text).unwrap();
    }
    let g = graph_with_tables(src, &["integrations"]);
    assert_eq!(g["config"], BTreeSet::from([TABLES.to_owned()]));
    assert_eq!(cycle_from(&g, "config"), None);
    std::fs::write(
        src.join("integrations/x/config.rs"),
        "pub struct T;\nfn f() { super::rule() }\n",
    )
    .unwrap();
    let g = graph_with_tables(src, &["integrations"]);
    assert!(g[TABLES].contains("integrations"), "{g:?}");
    assert!(cycle_from(&g, "config").is_some(), "{g:?}");
}

/// The configuration's files → the files of `src/config/` their shipped code names: a
/// `super::<file>` or `crate::config::<file>` path, or a name `config/mod.rs` re-exports
/// (`pub use <file>::{…}`), counted as the file that defines it. `mod.rs` (the façade) and
/// `tests.rs` are left out.
fn config_graph() -> BTreeMap<String, BTreeSet<String>> {
    let dir = root().join("src/config");
    let mut files = BTreeMap::new();
    for e in std::fs::read_dir(&dir).unwrap().flatten() {
        let name = e.path().file_stem().unwrap().to_str().unwrap().to_owned();
        if name != "mod" && name != "tests" {
            // A file, or a folder of them (`file/`): one node.
            let mut paths = Vec::new();
            rust_files(&e.path(), &mut paths);
            // Each file's shipped code: up to its unit tests.
            let text: Vec<String> = paths
                .iter()
                .map(|p| {
                    let t = std::fs::read_to_string(p).unwrap();
                    t.lines()
                        .take_while(|l| !l.starts_with("#[cfg(test)]"))
                        .collect::<Vec<_>>()
                        .join("\n")
                })
                .collect();
            files.insert(name, text.join("\n"));
        }
    }
    let facade = std::fs::read_to_string(dir.join("mod.rs")).unwrap();
    let mut defined_in = BTreeMap::new();
    for (i, _) in facade.match_indices("pub use ") {
        let stmt = &facade[i + "pub use ".len()..];
        let stmt = &stmt[..stmt.find(';').unwrap()];
        if let Some((file, names)) = stmt.split_once("::") {
            for n in names.split(|c: char| !(c.is_alphanumeric() || c == '_')) {
                if !n.is_empty() {
                    defined_in.insert(n.to_owned(), file.to_owned());
                }
            }
        }
    }
    let word = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut edges = BTreeMap::new();
    for (name, text) in &files {
        // Without comments.
        let code: String = text
            .lines()
            .map(|l| l.split("//").next().unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n");
        let mut deps = BTreeSet::new();
        for prefix in ["super::", "crate::config::"] {
            for (i, _) in code.match_indices(prefix) {
                let rest = &code[i + prefix.len()..];
                let named: Vec<String> = match rest.strip_prefix('{') {
                    Some(group) => group[..group.find('}').unwrap()]
                        .split(',')
                        .map(|n| word(n.trim()))
                        .collect(),
                    None => vec![word(rest)],
                };
                for n in named {
                    let file = if files.contains_key(&n) {
                        Some(n)
                    } else {
                        defined_in.get(&n).cloned()
                    };
                    if let Some(f) = file.filter(|f| f != name) {
                        deps.insert(f);
                    }
                }
            }
        }
        edges.insert(name.clone(), deps);
    }
    edges
}

// Inside the configuration, a walk goes down and never back up: parse (`file`) → the whole
// (`effective`) → an engine (`engine`) → its parts (`timing`, `qos`, `policy`, `actions`, …)
// → `bounds`, `error`, `read`. Each type's check sits in the type's own file beside its
// bounds, so no file reaches up to a checker that imports it.
#[test]
fn the_configurations_files_have_no_arrow_back_up() {
    let g = config_graph();
    for (m, deps) in &g {
        println!(
            "config/{m:10} -> {}",
            deps.iter().cloned().collect::<Vec<_>>().join(" ")
        );
    }
    assert!(g["file"].contains("engine"), "the walk is read: {g:?}");
    assert!(g["engine"].contains("timing"), "the walk is read: {g:?}");
    let cycles: Vec<String> = g
        .keys()
        .filter_map(|m| cycle_from(&g, m))
        .map(|c| c.join(" -> "))
        .collect();
    assert!(
        cycles.is_empty(),
        "arrows back up inside config: {cycles:#?}"
    );
}

/// The crates under `parents` (`tools`, `fakes`): each directory there with a `Cargo.toml`
/// and a `src/`, as (`tools/npu-chaos`, its `src`), in order.
fn member_crates(parents: &[&str]) -> Vec<(String, PathBuf)> {
    member_crates_in(root(), parents)
}

/// [`member_crates`] of the checkout at `base`.
fn member_crates_in(base: &Path, parents: &[&str]) -> Vec<(String, PathBuf)> {
    let mut crates = Vec::new();
    for parent in parents {
        let Ok(dir) = std::fs::read_dir(base.join(parent)) else {
            continue;
        };
        for e in dir.flatten() {
            let dir = e.path();
            if dir.join("Cargo.toml").is_file() && dir.join("src").is_dir() {
                let name = dir.file_name().unwrap().to_str().unwrap();
                crates.push((format!("{parent}/{name}"), dir.join("src")));
            }
        }
    }
    crates.sort();
    crates
}

// The runner and the fakes are layered as the agent is: in each crate under `tools/` and
// `fakes/`, no top-level module names one that names it back (the time scaling the runner,
// the agent's operations and the router share is `npu-chaos`'s bottom module, `timescale`).
#[test]
fn tools_and_fakes_have_no_module_cycle() {
    let crates = member_crates(&["tools", "fakes"]);
    let found: Vec<&str> = crates.iter().map(|(c, _)| c.as_str()).collect();
    for want in ["tools/npu-chaos", "fakes/fake-engine"] {
        assert!(found.contains(&want), "{want} not among {found:?}");
    }
    let mut cycles = Vec::new();
    for (name, src) in &crates {
        let g = graph_of(src);
        if g.is_empty() {
            println!("{name}: no module besides its root");
        }
        for (m, deps) in &g {
            println!(
                "{name}: {m:12} -> {}",
                deps.iter().cloned().collect::<Vec<_>>().join(" ")
            );
        }
        cycles.extend(
            g.keys()
                .filter_map(|m| cycle_from(&g, m))
                .map(|c| format!("{name}: {}", c.join(" -> "))),
        );
    }
    assert!(cycles.is_empty(), "module cycles: {cycles:#?}");
}

// The check itself: a circle written as `super::<module>` in a top-level file is found, and
// a folder's file naming its own folder's files (`super::<file>`) is not one.
#[test]
fn a_cycle_through_super_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir_all(src.join("b")).unwrap();
    let files = [
        ("lib.rs", "pub mod a;\npub mod b;\npub mod c;\n"),
        ("a.rs", "pub fn f() -> u32 {\n    super::b::g()\n}\n"),
        ("b/mod.rs", "mod part;\npub use part::g;\n"),
        (
            "b/part.rs",
            "use super::super::{c::h, x};\npub fn g() -> u32 {\n    super::other() + h()\n}\n",
        ),
        (
            "c.rs",
            "pub fn h() -> u32 {\n    1\n}\n#[cfg(test)]\nmod tests {\n    use crate::a;\n}\n",
        ),
    ];
    for (f, text) in files {
        std::fs::write(src.join(f), text).unwrap();
    }
    let g = graph_of(src);
    let set = |s: &[&str]| s.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    assert_eq!(g["a"], set(&["b"]));
    assert_eq!(
        g["b"],
        set(&["c"]),
        "`super::other` in b/part.rs is b's own"
    );
    assert_eq!(g["c"], set(&[]), "test modules reach anywhere");
    assert_eq!(cycle_from(&g, "a"), None);
    std::fs::write(
        src.join("c.rs"),
        "pub fn h() -> u32 {\n    super::a::f()\n}\n",
    )
    .unwrap();
    let g = graph_of(src);
    assert_eq!(
        cycle_from(&g, "a").unwrap(),
        ["a", "b", "c", "a"].map(str::to_owned)
    );
}

/// The children of a folder module, each a node of its file-level graph: each file beside its
/// `mod.rs` (by stem) and each sub-folder (all of its files one node). `mod.rs` is the
/// folder's façade, not a node; `tests.rs` is not shipped.
fn children(folder: &Path) -> BTreeMap<String, PathBuf> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(folder).unwrap().flatten() {
        let path = e.path();
        let name = path.file_stem().unwrap().to_str().unwrap().to_owned();
        let module = path.is_dir() || path.extension().is_some_and(|x| x == "rs");
        if module && name != "mod" && name != "tests" {
            out.insert(name, path);
        }
    }
    out
}

/// The names a folder's `mod.rs` brings in from its children (`pub use inject::{a, b};`,
/// `use stack::Stack;`), each → the child it comes from: a sibling that names `super::a`
/// names `inject`.
fn facade_names(folder: &Path, kids: &BTreeMap<String, PathBuf>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let Ok(text) = std::fs::read_to_string(folder.join("mod.rs")) else {
        return out;
    };
    let code: Vec<&str> = shipped_lines(&text).into_iter().map(|(_, c)| c).collect();
    let code = code.join("\n");
    for (i, _) in code.match_indices("use ") {
        let stmt = code[i + "use ".len()..].trim_start();
        let stmt = &stmt[..stmt.find(';').unwrap_or(stmt.len())];
        let Some((child, names)) = stmt.split_once("::") else {
            continue;
        };
        if !kids.contains_key(child) {
            continue;
        }
        for n in names.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if !n.is_empty() && !kids.contains_key(n) {
                out.insert(n.to_owned(), child.to_owned());
            }
        }
    }
    out
}

/// Child → the siblings its shipped code names, inside `folder` (a folder module of the crate
/// whose sources are in `src`). A child names a sibling by `super::<sibling>` (as many
/// `super::` as lead from its file up to `folder`), by `crate::<folder's path>::<sibling>`,
/// or by a name `mod.rs` brings in from that sibling ([`facade_names`]).
fn files_graph(src: &Path, folder: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let kids = children(folder);
    let facade = facade_names(folder, &kids);
    let segments: Vec<String> = folder
        .strip_prefix(src)
        .unwrap()
        .iter()
        .map(|c| c.to_str().unwrap().to_owned())
        .collect();
    let prefix = format!("crate::{}::", segments.join("::"));
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (kid, path) in &kids {
        let mut files = Vec::new();
        rust_files(path, &mut files);
        let mut named = Vec::new();
        for f in files.iter().filter(|f| !f.ends_with("tests.rs")) {
            let text = std::fs::read_to_string(f).unwrap();
            let code: Vec<&str> = shipped_lines(&text).into_iter().map(|(_, c)| c).collect();
            let code = code.join("\n");
            for (i, _) in code.match_indices(&prefix) {
                named.extend(path_heads(&code[i + prefix.len()..]));
            }
            let rel = f.strip_prefix(folder).unwrap();
            let depth = rel.components().count() - usize::from(f.ends_with("mod.rs"));
            named.extend(heads_after_supers(&code, depth));
        }
        let deps = named
            .into_iter()
            .filter_map(|n| match kids.contains_key(&n) {
                true => Some(n),
                false => facade.get(&n).cloned(),
            })
            .filter(|n| n != kid);
        edges.entry(kid.clone()).or_default().extend(deps);
    }
    edges
}

/// The heads of the paths in `code` that start with exactly `depth` `super::` (a chain is
/// counted once, from its first `super::`).
fn heads_after_supers(code: &str, depth: usize) -> Vec<String> {
    let mut heads = Vec::new();
    for (i, _) in code.match_indices("super::") {
        let before = &code[..i];
        if before.ends_with("super::")
            || before.ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
        {
            continue;
        }
        let mut rest = &code[i..];
        let mut supers = 0;
        while let Some(r) = rest.strip_prefix("super::") {
            rest = r;
            supers += 1;
        }
        if supers == depth {
            heads.extend(path_heads(rest));
        }
    }
    heads
}

/// Every folder module under `src` (a folder with a `mod.rs`), depth first.
fn folder_modules(src: &Path, out: &mut Vec<PathBuf>) {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(src)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    for d in dirs {
        if d.join("mod.rs").is_file() {
            out.push(d.clone());
        }
        folder_modules(&d, out);
    }
}

/// The distinct cycles of `g`, each rotated to start at its least node, without the
/// repeated last node.
fn cycles_of(g: &BTreeMap<String, BTreeSet<String>>) -> BTreeSet<Vec<String>> {
    g.keys()
        .filter_map(|m| cycle_from(g, m))
        .map(|mut c| {
            c.pop();
            let at = c
                .iter()
                .enumerate()
                .min_by_key(|(_, m)| *m)
                .map_or(0, |(i, _)| i);
            c.rotate_left(at);
            c
        })
        .collect()
}

/// Each crate the layout test reads in the checkout at `base`, as (its name, its `src`): the
/// agent, then every crate under `tools/`, `fakes/` and `crates/`.
fn all_crates(base: &Path) -> Vec<(String, PathBuf)> {
    std::iter::once(("agent".to_owned(), base.join("src")))
        .chain(member_crates_in(base, &["tools", "fakes", "crates"]))
        .collect()
}

/// The file-level circles of every folder module of the crate whose sources are in `src`, as
/// `<folder>: a -> b -> a` (the folder relative to `base`, the checkout).
fn file_circles(base: &Path, src: &Path) -> Vec<String> {
    let mut folders = Vec::new();
    folder_modules(src, &mut folders);
    let mut out = Vec::new();
    for folder in folders {
        let rel = folder.strip_prefix(base).unwrap_or(&folder).display();
        for mut c in cycles_of(&files_graph(src, &folder)) {
            c.push(c[0].clone());
            out.push(format!("{rel}: {}", c.join(" -> ")));
        }
    }
    out
}

/// File-level circles known and owned elsewhere, each with its reason: the test tolerates them
/// and fails once one is gone, so that its line is deleted.
const KNOWN_CIRCLES: &[(&str, &str)] = &[];

// Inside each folder module, no file (or sub-folder) names a sibling that names it back, in
// the agent and in every crate under `tools/`, `fakes/` and `crates/`: the files of a folder
// are layered as its modules are (a circle of files is one file split in several, each
// needing all the others to be read).
#[test]
fn no_file_level_circle_inside_a_module() {
    let mut found = Vec::new();
    for (name, src) in all_crates(root()) {
        let circles = file_circles(root(), &src);
        for c in &circles {
            println!("{name}: {c}");
        }
        found.extend(circles);
    }
    let known: Vec<&str> = KNOWN_CIRCLES.iter().map(|(c, _)| *c).collect();
    let new: Vec<&String> = found
        .iter()
        .filter(|c| !known.contains(&c.as_str()))
        .collect();
    assert!(new.is_empty(), "file-level circles: {new:#?}");
    let gone: Vec<&&str> = known
        .iter()
        .filter(|k| !found.iter().any(|c| c == *k))
        .collect();
    assert!(
        gone.is_empty(),
        "known circles no longer found (delete them from KNOWN_CIRCLES): {gone:#?}"
    );
}

// The check itself: a circle of files inside a folder is found however the files name each
// other (`super::<file>`, `crate::<folder>::<file>`, `super::super::` from a sub-folder's file,
// a name the folder's `mod.rs` brings in from a file), and so is a circle of sub-folders (as
// `integrations/envoy` ↔ `integrations/kubelet`); a unit test module is not shipped code.
#[test]
fn a_file_level_circle_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    let files = [
        ("lib.rs", "pub mod run;\npub mod wing;\n"),
        (
            "run/mod.rs",
            "mod a;\nmod b;\nmod c;\nmod sub;\npub use c::Thing;\n",
        ),
        ("run/a.rs", "use super::b::f;\n"),
        ("run/b.rs", "pub fn f() {\n    crate::run::sub::g()\n}\n"),
        ("run/sub/mod.rs", "mod deep;\npub use deep::g;\n"),
        (
            "run/sub/deep.rs",
            "pub fn g() {\n    let _ = super::super::Thing;\n}\n",
        ),
        (
            "run/c.rs",
            "pub struct Thing;\n#[cfg(test)]\nmod tests {\n    use super::super::a;\n}\n",
        ),
        ("wing/mod.rs", "pub mod x;\npub mod y;\n"),
        ("wing/x/mod.rs", "pub struct X;\n"),
        ("wing/y/mod.rs", "use super::x::X;\n"),
    ];
    for (path, text) in files {
        std::fs::create_dir_all(src.join(path).parent().unwrap()).unwrap();
        std::fs::write(src.join(path), text).unwrap();
    }
    let set = |s: &[&str]| s.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    let g = files_graph(src, &src.join("run"));
    assert_eq!(g["a"], set(&["b"]), "super::<file>");
    assert_eq!(g["b"], set(&["sub"]), "crate::<folder>::<file>");
    assert_eq!(g["sub"], set(&["c"]), "super::super:: and mod.rs's names");
    assert_eq!(g["c"], set(&[]), "test modules reach anywhere");
    assert_eq!(files_graph(src, &src.join("wing"))["y"], set(&["x"]));
    assert!(
        file_circles(src, src).is_empty(),
        "{:?}",
        file_circles(src, src)
    );
    std::fs::write(src.join("run/c.rs"), "pub struct Thing;\nuse super::a;\n").unwrap();
    std::fs::write(
        src.join("wing/x/mod.rs"),
        "pub struct X(crate::wing::y::Y);\n",
    )
    .unwrap();
    let found = file_circles(src, src);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(
        found[0].ends_with("run: a -> b -> sub -> c -> a"),
        "{found:?}"
    );
    assert!(found[1].ends_with("wing: x -> y -> x"), "{found:?}");
}

/// The lines of `text` with a glob import (`use x::*;`, `pub use x::*;`, `use x::{y, *};`,
/// over lines too) in shipped code (as [`shipped_lines`] reads it).
fn glob_imports(text: &str) -> Vec<usize> {
    let mut found = Vec::new();
    let mut in_use = false;
    for (n, code) in shipped_lines(text) {
        // `pub use`, `pub(crate) use`, … as `use`.
        in_use |= without_visibility(code.trim_start()).starts_with("use ");
        if !in_use {
            continue;
        }
        let statement = &code[..code.find(';').unwrap_or(code.len())];
        // A `*` where a path segment goes: after `::`, `{` or `,`, or first on its line.
        let glob = statement.match_indices('*').any(|(i, _)| {
            let before = statement[..i].trim_end();
            before.is_empty() || before.ends_with("::") || before.ends_with(['{', ','])
        });
        if glob {
            found.push(n);
        }
        in_use = !code.contains(';');
    }
    found
}

/// The member crates whose shipped code has no glob import; the agent's own `src/` has none
/// either and is checked with them.
const GLOB_FREE: &[&str] = &["tools", "fakes"];

// Explicit imports: a glob makes every name of a module a dependency of the file, and a
// folder of files that glob-import each other through their `mod.rs` one namespace with an
// import circle inside; named imports say what each file uses (and its `mod.rs` re-exports
// what the rest of the crate uses, by name). Unit test modules may glob (`use super::*;`).
#[test]
fn no_shipped_glob_imports() {
    let crates = member_crates(GLOB_FREE);
    assert!(
        ["tools/npu-chaos", "fakes/fake-engine", "fakes/npu-fake"]
            .iter()
            .all(|want| crates.iter().any(|(c, _)| c == want)),
        "{crates:?}"
    );
    // The agent's own `src/`, then each member crate's (`tools/npu-chaos/src`).
    let dirs = std::iter::once(("src".to_owned(), root().join("src"))).chain(
        crates
            .iter()
            .map(|(c, src)| (format!("{c}/src"), src.clone())),
    );
    let mut found = Vec::new();
    for (name, src) in dirs {
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        files.sort();
        for f in files.iter().filter(|f| !f.ends_with("tests.rs")) {
            let text = std::fs::read_to_string(f).unwrap();
            let rel = f.strip_prefix(&src).unwrap().display();
            found.extend(
                glob_imports(&text)
                    .into_iter()
                    .map(|n| format!("{name}/{rel}:{n}")),
            );
        }
    }
    assert!(
        found.is_empty(),
        "glob imports in shipped code (import the names used): {found:#?}"
    );
}

// The check itself: shipped glob imports are found in each form; a unit test module's is
// not, nor a `*` that is no import.
#[test]
fn a_glob_import_is_found() {
    let text = "\
//! use nothing::*; (a comment)
use std::io::Write;
pub use crate::a::*;
pub(crate) use b::{c, *};
use d::{
    e,
    *,
};
fn f() -> u32 {
    use g::{h as _, self};
    2 * 3 // use x::*;
}

#[cfg(test)]
mod tests {
    use super::*;
}
";
    assert_eq!(glob_imports(text), [3, 4, 7]);
}

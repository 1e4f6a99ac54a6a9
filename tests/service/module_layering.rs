//! The agent crate's top-level modules depend on each other without a cycle: data flows
//! down (driver → sampler → ring → window; probe → monitor → server; agent and cli wire
//! them), no module calls back up into its caller, and the configuration is the bottom
//! layer every module may read and that reads none of them. A
//! dependency is a `crate::<module>` path in shipped code (comments and unit test modules
//! ignored).
//! `cargo test --test service module_layering:: -- --nocapture` prints the graph.

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

/// Module → the modules its shipped code names.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut mods = BTreeMap::new();
    for e in std::fs::read_dir(&src).unwrap().flatten() {
        let path = e.path();
        let name = path.file_stem().unwrap().to_str().unwrap().to_owned();
        if name != "lib" && name != "main" {
            mods.insert(name, path);
        }
    }
    let names: BTreeSet<String> = mods.keys().cloned().collect();
    let mut edges = BTreeMap::new();
    for (m, path) in &mods {
        let mut files = Vec::new();
        rust_files(path, &mut files);
        let mut deps = BTreeSet::new();
        // A test module in a file of its own (`#[cfg(test)] mod tests;`) is not shipped.
        for f in files.iter().filter(|f| !f.ends_with("tests.rs")) {
            let text = std::fs::read_to_string(f).unwrap();
            let mut test_only = false;
            for line in text.lines() {
                let code = line.split("//").next().unwrap_or_default();
                let item = code.trim_start();
                // Unit tests may reach anywhere: a `#[cfg(test)]` module ends the shipped
                // code of its file (it comes last); another `#[cfg(test)]` item does not.
                if item.starts_with("#[cfg(test)]") || (test_only && item.starts_with("#[")) {
                    test_only = true;
                    continue;
                }
                if test_only && (item.starts_with("mod ") || item.starts_with("pub mod ")) {
                    break;
                }
                test_only = false;
                for (i, _) in code.match_indices("crate::") {
                    let rest = &code[i + "crate::".len()..];
                    let dep: String = rest
                        .chars()
                        .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                        .collect();
                    if names.contains(&dep) && &dep != m {
                        deps.insert(dep);
                    }
                }
            }
        }
        edges.insert(m.clone(), deps);
    }
    edges
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
// `FaultTable::configured` do), so every module may read it and it reads none back.
#[test]
fn the_configuration_names_no_runtime_module() {
    let g = graph();
    assert!(g["config"].is_empty(), "config names {:?}", g["config"]);
}

/// The configuration's files → the files of `src/config/` their shipped code names: a
/// `super::<file>` or `crate::config::<file>` path, or a name `config/mod.rs` re-exports
/// (`pub use <file>::{…}`), counted as the file that defines it. `mod.rs` (the façade) and
/// `tests.rs` are left out.
fn config_graph() -> BTreeMap<String, BTreeSet<String>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/config");
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

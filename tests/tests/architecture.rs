//! The house rules of ARCHITECTURE.md, checked on the source tree: inside `runtime` modules
//! import only downward (a fixed layer order, no cycles between files), `collectives` does no
//! I/O, and only the configuration and the launch detection read the environment.
//!
//! The checks read the sources as text: `crate::a::b` and `super::x` paths outside comments and
//! test modules are the imports. That is a lexical approximation, good enough to keep the
//! layering honest; a violation names the file and the path it used.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every `.rs` file under `dir`, with its module path (`comm::call`, `transport`, `crate`).
fn modules(dir: &Path) -> BTreeMap<String, PathBuf> {
    fn walk(base: &Path, d: &Path, out: &mut BTreeMap<String, PathBuf>) {
        let mut entries: Vec<_> = std::fs::read_dir(d)
            .unwrap_or_else(|e| panic!("{}: {e}", d.display()))
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                walk(base, &p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let rel = p.strip_prefix(base).unwrap().with_extension("");
                let mut parts: Vec<String> = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                if matches!(
                    parts.last().map(String::as_str),
                    Some("mod" | "lib" | "main")
                ) {
                    parts.pop();
                }
                let name = if parts.is_empty() {
                    "crate".to_string()
                } else {
                    parts.join("::")
                };
                out.insert(name, p);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// The code of a file without comments and without its `#[cfg(test)] mod tests`.
fn code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => &text[..],
    };
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Paths following `prefix` (`crate::` or `super::`): `a::b::c` as segments.
fn paths_after(code: &str, prefix: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find(prefix) {
        let before = rest[..i].chars().last();
        rest = &rest[i + prefix.len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue; // `foo_crate::`
        }
        let mut segs = Vec::new();
        let mut s = rest;
        loop {
            let n = s
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(s.len());
            if n == 0 {
                break;
            }
            segs.push(s[..n].to_string());
            s = &s[n..];
            match s.strip_prefix("::") {
                Some(t) => s = t,
                None => break,
            }
        }
        if !segs.is_empty() {
            out.push(segs);
        }
    }
    out
}

/// The module (among `names`, at most `depth` segments) a path names.
fn resolve(names: &BTreeSet<String>, segs: &[String], depth: usize) -> Option<String> {
    (1..=segs.len().min(depth))
        .rev()
        .map(|d| segs[..d].join("::"))
        .find(|c| names.contains(c))
}

/// Import edges between modules of at most `depth` segments.
fn edges(dir: &Path, depth: usize) -> BTreeMap<String, BTreeSet<(String, String)>> {
    let mods = modules(dir);
    let names: BTreeSet<String> = mods.keys().cloned().collect();
    let cut = |m: &str| m.split("::").take(depth).collect::<Vec<_>>().join("::");
    let mut out: BTreeMap<String, BTreeSet<(String, String)>> = BTreeMap::new();
    for (m, p) in &mods {
        let c = code(p);
        // `super` of `a::b` (a/b.rs or a/b/mod.rs) is `a`.
        let parent: Vec<String> = if m == "crate" {
            vec![]
        } else {
            let v: Vec<String> = m.split("::").map(String::from).collect();
            v[..v.len() - 1].to_vec()
        };
        let mut refs = Vec::new();
        for segs in paths_after(&c, "crate::") {
            if let Some(t) = resolve(&names, &segs, depth) {
                refs.push((t, format!("crate::{}", segs.join("::"))));
            }
        }
        for segs in paths_after(&c, "super::") {
            let mut full = parent.clone();
            full.extend(segs.iter().cloned());
            if let Some(t) = resolve(&names, &full, depth) {
                refs.push((t, format!("super::{}", segs.join("::"))));
            }
        }
        let a = cut(m);
        for (t, how) in refs {
            let b = cut(&t);
            if a != b && !a.starts_with(&format!("{b}::")) && !b.starts_with(&format!("{a}::")) {
                out.entry(a.clone())
                    .or_default()
                    .insert((b, format!("{} uses {how}", p.display())));
            }
        }
    }
    out
}

/// Strongly connected components with more than one module.
fn cycles(e: &BTreeMap<String, BTreeSet<(String, String)>>) -> Vec<Vec<String>> {
    let nodes: BTreeSet<&String> = e
        .keys()
        .chain(e.values().flat_map(|s| s.iter().map(|x| &x.0)))
        .collect();
    let reach = |from: &String| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.clone()];
        while let Some(n) = stack.pop() {
            for (t, _) in e.get(&n).into_iter().flatten() {
                if seen.insert(t.clone()) {
                    stack.push(t.clone());
                }
            }
        }
        seen
    };
    let r: BTreeMap<&String, BTreeSet<String>> = nodes.iter().map(|n| (*n, reach(n))).collect();
    let mut done = BTreeSet::new();
    let mut out = Vec::new();
    for n in &nodes {
        if done.contains(*n) {
            continue;
        }
        let comp: Vec<String> = nodes
            .iter()
            .filter(|m| r[*n].contains(**m) && r[**m].contains(*n))
            .map(|m| (*m).clone())
            .collect();
        for c in &comp {
            done.insert(c.clone());
        }
        if comp.len() > 1 {
            out.push(comp);
        }
    }
    out
}

fn explain(e: &BTreeMap<String, BTreeSet<(String, String)>>, comp: &[String]) -> String {
    let mut s = String::new();
    for a in comp {
        for (b, how) in e.get(a).into_iter().flatten() {
            if comp.contains(b) {
                s.push_str(&format!("\n  {a} -> {b}: {how}"));
            }
        }
    }
    s
}

/// The runtime's layers, bottom up: a module may import only modules of a lower layer.
const RUNTIME_LAYERS: &[&[&str]] = &[
    &["store", "machine", "hostlist", "vars", "private_fs"],
    &["knobs"],
    &["error"],
    &["topology"],
    &["config"],
    &["bootstrap"],
    &["transport"],
    &["executor"],
    &["comm"],
    &["crate"],
];

#[test]
fn runtime_imports_only_downward() {
    let dir = root().join("runtime/src");
    let e = edges(&dir, 1);
    let layer = |m: &str| {
        RUNTIME_LAYERS
            .iter()
            .position(|l| l.contains(&m))
            .unwrap_or_else(|| panic!("module {m} has no layer in RUNTIME_LAYERS: add it"))
    };
    let mut bad = Vec::new();
    for (a, targets) in &e {
        for (b, how) in targets {
            if layer(b) >= layer(a) {
                bad.push(format!("{a} -> {b}: {how}"));
            }
        }
    }
    assert!(bad.is_empty(), "upward imports:\n{}", bad.join("\n"));
}

#[test]
fn no_import_cycles_between_files() {
    for krate in ["runtime", "collectives", "launcher"] {
        let e = edges(&root().join(krate).join("src"), 3);
        let c = cycles(&e);
        assert!(
            c.is_empty(),
            "{krate}: import cycles:{}",
            c.iter().map(|comp| explain(&e, comp)).collect::<String>()
        );
    }
}

#[test]
fn collectives_do_no_io() {
    let forbidden = [
        "std::fs",
        "std::net",
        "std::process",
        "std::env",
        "std::io",
        "std::thread",
        "println!",
        "eprintln!",
        "tracing::",
    ];
    for (m, p) in modules(&root().join("collectives/src")) {
        let c = code(&p);
        for f in forbidden {
            assert!(
                !c.contains(f),
                "collectives::{m} ({}) uses {f}",
                p.display()
            );
        }
    }
}

/// Where the runtime may read the environment: its knobs in `config`, the launcher's variables
/// in the launch detection — and the CUDA toolkit's own `CUDA_HOME` / `CUDA_PATH`, which the
/// device kernels' compiler needs when (and only if) it first compiles them.
const ENV_READERS: &[&str] = &["config", "bootstrap::launch", "transport::cuda::kernels"];

#[test]
fn only_config_and_launch_detection_read_the_environment() {
    let mut bad = Vec::new();
    for (m, p) in modules(&root().join("runtime/src")) {
        let c = code(&p);
        if ["env::var", "env::vars", "var_os("]
            .iter()
            .any(|f| c.contains(f))
            && !ENV_READERS.contains(&m.as_str())
        {
            bad.push(format!("{m} ({})", p.display()));
        }
    }
    assert!(
        bad.is_empty(),
        "these runtime modules read the environment; parse the knob in config.rs (or the \
         launcher's variable in bootstrap/launch) and pass it down:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_checker_sees_imports() {
    // Guard against a checker that finds nothing: the runtime's comm imports the executor.
    let e = edges(&root().join("runtime/src"), 1);
    assert!(e["comm"].iter().any(|(b, _)| b == "executor"), "{e:?}");
    assert!(!paths_after("use crate::a::b;", "crate::").is_empty());
    assert!(paths_after("foo_crate::a", "crate::").is_empty());
}

/// The paths ARCHITECTURE.md's file map names: a tree of `name  description` lines, two spaces
/// of indent per level, folders ending in `/`.
fn file_map() -> BTreeSet<String> {
    let text = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let map = text
        .split("## File map")
        .nth(1)
        .expect("ARCHITECTURE.md has a '## File map' section");
    let block = map
        .split("```")
        .nth(1)
        .expect("the file map is a code block");
    let mut out = BTreeSet::new();
    let mut stack: Vec<String> = Vec::new();
    for line in block.lines().filter(|l| !l.trim().is_empty()) {
        let depth = (line.len() - line.trim_start().len()) / 2;
        let name = line.split_whitespace().next().unwrap().to_string();
        stack.truncate(depth);
        let path = format!("{}{name}", stack.concat());
        if name.ends_with('/') {
            stack.push(name);
        }
        out.insert(path);
    }
    out
}

#[test]
fn the_file_map_names_every_source_file() {
    let map = file_map();
    let mut missing = Vec::new();
    for dir in [
        "collectives/src",
        "runtime/src",
        "runtime/tests",
        "launcher/src",
        "examples/src",
        "tests/src",
        "tests/tests",
    ] {
        for p in modules(&root().join(dir)).values() {
            let rel = p
                .strip_prefix(root())
                .unwrap()
                .to_string_lossy()
                .replace("/./", "/");
            let rel = rel.trim_start_matches("./").to_string();
            if !map.contains(&rel) {
                missing.push(rel);
            }
        }
    }
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md's file map does not name:\n{}",
        missing.join("\n")
    );
}

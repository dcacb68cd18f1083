//! Issue 16: no import cycles in the client crate. For each module directory
//! of `src/` (the crate root, `backend`, `backend/native`), the modules in it
//! must not import one another in a circle: an edge `a → b` is a path
//! `crate::…::b…` or (from a file directly in the directory) `super::b…` in
//! `a`'s code, where a name the directory's `mod.rs` re-exports from `b`
//! (`pub use b::Name`) counts as `b`. Comments and `#[cfg(test)] mod tests`
//! are left out: only what the code compiles counts.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The code of a file, without comments and without its test module.
fn code(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap();
    let text = text.split("#[cfg(test)]\nmod tests").next().unwrap_or_default();
    text.lines().map(|l| l.split("//").next().unwrap_or_default()).collect::<Vec<_>>().join("\n")
}

/// Every `.rs` file under `dir`.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    out
}

/// The child modules of the directory `dir`: name → (files, whether it is a
/// single file directly in `dir`).
fn children(dir: &Path) -> BTreeMap<String, (Vec<PathBuf>, bool)> {
    let mut kids: BTreeMap<String, (Vec<PathBuf>, bool)> = BTreeMap::new();
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_stem().unwrap().to_string_lossy().to_string();
        if p.is_dir() {
            kids.entry(name).or_default().0.extend(files_under(&p));
        } else if p.extension().is_some_and(|x| x == "rs") && name != "mod" && name != "lib" {
            let kid = kids.entry(name).or_default();
            kid.0.push(p);
            kid.1 = true;
        }
    }
    kids
}

/// The identifiers right after each `prefix` in `code` (`prefix{a, b::c}` gives a and b).
fn names_after<'a>(code: &'a str, prefix: &str) -> Vec<&'a str> {
    let mut out = Vec::new();
    for (i, _) in code.match_indices(prefix) {
        let rest = &code[i + prefix.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let group = &group[..group.find('}').unwrap_or(group.len())];
            out.extend(group.split(',').filter_map(|item| item.trim().split("::").next()).filter(|n| !n.is_empty()));
        } else {
            let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(rest.len());
            out.push(&rest[..end]);
        }
    }
    out
}

/// The edges between the children of `dir`, whose path from the crate root is `path`.
fn graph(dir: &Path, path: &str) -> BTreeMap<String, BTreeSet<String>> {
    let kids = children(dir);
    let parent = if dir.join("mod.rs").exists() { dir.join("mod.rs") } else { dir.join("lib.rs") };
    let mut reexported = BTreeMap::new();
    for line in code(&parent).lines().map(str::trim) {
        let Some(rest) = line.strip_prefix("pub use ").or_else(|| line.strip_prefix("pub(crate) use ")) else {
            continue;
        };
        let Some((kid, names)) = rest.trim_end_matches(';').split_once("::") else { continue };
        if kids.contains_key(kid) {
            for n in names.split(|c: char| !(c.is_alphanumeric() || c == '_')).filter(|n| !n.is_empty()) {
                reexported.insert(n.to_string(), kid.to_string());
            }
        }
    }
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (kid, (files, single_file)) in &kids {
        let targets = edges.entry(kid.clone()).or_default();
        for f in files {
            let code = code(f);
            let direct = *single_file || f.parent() == Some(&dir.join(kid)) && f.ends_with("mod.rs");
            let mut names = names_after(&code, &format!("{path}::"));
            if direct && f.parent() == Some(dir) {
                names.extend(names_after(&code, "super::"));
            }
            for n in names {
                let target = if kids.contains_key(n) { Some(n.to_string()) } else { reexported.get(n).cloned() };
                if let Some(t) = target.filter(|t| t != kid) {
                    targets.insert(t);
                }
            }
        }
    }
    edges
}

/// A cycle in `edges`, if there is one.
fn cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == n) {
            return Some(path[i..].to_vec());
        }
        if !done.insert(n.to_string()) {
            return None;
        }
        path.push(n.to_string());
        for m in edges.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, edges, path, done) {
                return Some(c);
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    edges.keys().find_map(|n| visit(n, edges, &mut Vec::new(), &mut done))
}

#[test]
fn no_module_imports_a_sibling_that_imports_it_back() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    for (dir, path) in [
        (src.clone(), "crate"),
        (src.join("backend"), "crate::backend"),
        (src.join("backend/native"), "crate::backend::native"),
    ] {
        let edges = graph(&dir, path);
        assert!(edges.len() > 3, "{path}: too few modules found ({edges:?}): the check reads the wrong place");
        assert_eq!(cycle(&edges), None, "{path}: an import cycle; the edges: {edges:#?}");
    }
}

/// The check can fail: a graph with a cycle is reported.
#[test]
fn the_cycle_finder_finds_a_cycle() {
    let edges: BTreeMap<String, BTreeSet<String>> = [("a", "b"), ("b", "c"), ("c", "a"), ("d", "a")]
        .into_iter()
        .map(|(x, y)| (x.to_string(), BTreeSet::from([y.to_string()])))
        .collect();
    assert_eq!(cycle(&edges), Some(vec!["a".to_string(), "b".to_string(), "c".to_string()]));
    let mut acyclic = edges.clone();
    acyclic.remove("c");
    assert_eq!(cycle(&acyclic), None);
}

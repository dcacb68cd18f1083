//! Issue 33 (after issue 16): no import cycles in any crate of the workspace.
//!
//! This check reads the sources of every crate under `crates/` and of
//! `python/` (the Python package's crate; it lives in
//! the testkit because it belongs to no one crate). For each directory of a
//! crate's module tree (the crate root and every module with submodules), the
//! modules in it must not import one another in a circle. An edge `a → b`
//! between two modules of one directory is a path in `a`'s code (in a `use`
//! or in an expression) that names `b` or something inside it: `crate::…`,
//! `super::…` and `self::…` paths are resolved from the module that holds
//! them, grouped imports (`crate::{a, b::c}`) are expanded, and a name bound
//! by a `use` in a module on the way (`pub use b::Name`, a glob `pub use
//! b::*`) counts as where it was imported from. Comments, string literals
//! and `#[cfg(test)]` modules are left out: only what the shipped code
//! compiles counts. What it does not see: bare names brought in by
//! `use super::*` and then used as `b::…`.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fs;
use std::path::{Path, PathBuf};

/// A module's path from its crate root: `["backend", "native"]`.
type ModPath = Vec<String>;

/// The edges between the modules of one directory: module → the modules it imports.
type Edges = BTreeMap<String, BTreeSet<String>>;

// ---- reading Rust: tokens without comments, strings or char literals ----

/// The tokens of `text`: identifiers, `::`, and single punctuation characters.
/// Comments, string and char literals and lifetimes are dropped.
fn tokens(text: &str) -> Vec<String> {
    let s: Vec<char> = text.chars().collect();
    let (mut out, mut i) = (Vec::new(), 0);
    while i < s.len() {
        i = match s[i] {
            c if c.is_whitespace() => i + 1,
            '/' if s.get(i + 1) == Some(&'/') => skip_line(&s, i),
            '/' if s.get(i + 1) == Some(&'*') => skip_block_comment(&s, i),
            '"' => skip_string(&s, i + 1),
            '\'' => skip_quote(&s, i),
            ':' if s.get(i + 1) == Some(&':') => {
                out.push("::".to_string());
                i + 2
            }
            c if c.is_alphanumeric() || c == '_' => ident(&s, i, &mut out),
            c => {
                out.push(c.to_string());
                i + 1
            }
        };
    }
    out
}

fn skip_line(s: &[char], i: usize) -> usize {
    s[i..].iter().position(|&c| c == '\n').map_or(s.len(), |n| i + n)
}

fn skip_block_comment(s: &[char], mut i: usize) -> usize {
    let mut depth = 0;
    while i < s.len() {
        match (s[i], s.get(i + 1)) {
            ('/', Some('*')) => (depth, i) = (depth + 1, i + 2),
            ('*', Some('/')) => (depth, i) = (depth - 1, i + 2),
            _ => i += 1,
        }
        if depth == 0 {
            return i;
        }
    }
    i
}

/// Past the end of a string whose body starts at `i` (escapes honoured).
fn skip_string(s: &[char], mut i: usize) -> usize {
    while i < s.len() && s[i] != '"' {
        i += if s[i] == '\\' { 2 } else { 1 };
    }
    i + 1
}

/// Past a char literal (`'a'`, `'\n'`) or past the quote of a lifetime.
fn skip_quote(s: &[char], i: usize) -> usize {
    if s.get(i + 1) == Some(&'\\') {
        return i + 2 + s[i + 2..].iter().position(|&c| c == '\'').map_or(0, |n| n + 1);
    }
    if s.get(i + 2) == Some(&'\'') {
        return i + 3;
    }
    i + 1
}

/// Reads the identifier at `i` into `out`, or skips the string it prefixes
/// (`b"…"`, `r"…"`, `r#"…"#`, `br#"…"#`).
fn ident(s: &[char], i: usize, out: &mut Vec<String>) -> usize {
    let end = i + s[i..].iter().position(|&c| !(c.is_alphanumeric() || c == '_')).unwrap_or(s.len() - i);
    let word: String = s[i..end].iter().collect();
    let hashes = s[end..].iter().take_while(|&&c| c == '#').count();
    match word.as_str() {
        "r" | "br" if s.get(end + hashes) == Some(&'"') => skip_raw_string(s, end + hashes + 1, hashes),
        "b" if s.get(end) == Some(&'"') => skip_string(s, end + 1),
        "b" if s.get(end) == Some(&'\'') => skip_quote(s, end),
        _ => {
            out.push(word);
            end
        }
    }
}

fn skip_raw_string(s: &[char], mut i: usize, hashes: usize) -> usize {
    while i < s.len() {
        if s[i] == '"' && s[i + 1..].iter().take(hashes).filter(|&&c| c == '#').count() == hashes {
            return i + 1 + hashes;
        }
        i += 1;
    }
    i
}

fn is_ident(t: &str) -> bool {
    t.chars().next().is_some_and(|c| c.is_alphabetic() || c == '_')
}

// ---- paths and use-trees ----

/// The use-tree (or path) at `t[i..]` under `prefix`: each leaf's path with
/// the name it binds (`*` for a glob), and the index after the tree.
fn tree(t: &[String], mut i: usize, prefix: &[String]) -> (Vec<(ModPath, String)>, usize) {
    let mut path = prefix.to_vec();
    loop {
        match t.get(i).map(String::as_str) {
            Some("{") => return group(t, i + 1, &path),
            Some("*") => return (vec![(path, "*".to_string())], i + 1),
            Some(id) if is_ident(id) => {
                path.push(id.to_string());
                if t.get(i + 1).map(String::as_str) == Some("::") {
                    i += 2;
                    continue;
                }
                return leaf(t, i + 1, path);
            }
            _ => return (vec![(path.clone(), path.last().cloned().unwrap_or_default())], i),
        }
    }
}

/// The items of a `{…}` group whose body starts at `t[i]`.
fn group(t: &[String], mut i: usize, prefix: &[String]) -> (Vec<(ModPath, String)>, usize) {
    let mut out = Vec::new();
    while i < t.len() && t[i] != "}" {
        let (items, next) = tree(t, i, prefix);
        out.extend(items);
        i = next.max(i + 1);
        if t.get(i).map(String::as_str) == Some(",") {
            i += 1;
        }
    }
    (out, i + 1)
}

/// A path that ends at `t[i]`: `self` names its prefix; `as x` renames it.
fn leaf(t: &[String], i: usize, mut path: ModPath) -> (Vec<(ModPath, String)>, usize) {
    if path.last().map(String::as_str) == Some("self") && path.len() > 1 {
        path.pop();
    }
    let mut name = path.last().cloned().unwrap_or_default();
    let mut next = i;
    if t.get(i).map(String::as_str) == Some("as") {
        name = t.get(i + 1).cloned().unwrap_or_default();
        next = i + 2;
    }
    (vec![(path, name)], next)
}

// ---- what one file says ----

/// What the code of one file says about modules.
#[derive(Default)]
struct Facts {
    /// Paths the code names: (the module the code is in, the path as written).
    refs: Vec<(ModPath, ModPath)>,
    /// Names bound by `use`: (the module, the name, the path it stands for).
    uses: Vec<(ModPath, String, ModPath)>,
    /// Modules declared `#[cfg(test)] mod x;`: their files do not count.
    test_mods: Vec<ModPath>,
    /// Items declared (`fn x`, `struct X`, …): (the module, the name), for globs.
    items: Vec<(ModPath, String)>,
}

/// The facts of the file of module `module`, whose text is `text`.
fn facts(module: &[String], text: &str) -> Facts {
    let t = tokens(text);
    let (mut f, mut scope, mut i) = (Facts::default(), Scope::default(), 0);
    while i < t.len() {
        let here = scope.module(module);
        i = match t[i].as_str() {
            "#" if is_cfg_test(&t[i..]) => skip_test_item(&t, i + 7, &here, &mut f),
            "mod" if t.get(i + 2).map(String::as_str) == Some("{") => scope.open(Some(&t[i + 1]), i + 3),
            "{" => scope.open(None, i + 1),
            "}" => scope.close(i + 1),
            "use" => record_use(&t, i + 1, &here, &mut f),
            "fn" | "struct" | "enum" | "trait" | "type" | "const" | "static" | "union" => {
                f.items.push((here, t.get(i + 1).cloned().unwrap_or_default()));
                i + 1
            }
            "crate" | "super" | "self" if starts_path(&t, i) => {
                let (items, next) = tree(&t, i, &[]);
                f.refs.extend(items.into_iter().map(|(p, _)| (here.clone(), p)));
                next
            }
            _ => i + 1,
        };
    }
    f
}

/// Where the reading of a file is: the brace depth, and the inline modules
/// (`mod x { … }`) open there with the depth each opened at.
#[derive(Default)]
struct Scope {
    depth: usize,
    inline: Vec<(String, usize)>,
}

impl Scope {
    /// A `{` (of `mod name {` if `name`); returns `next`.
    fn open(&mut self, name: Option<&String>, next: usize) -> usize {
        self.depth += 1;
        if let Some(name) = name {
            self.inline.push((name.clone(), self.depth));
        }
        next
    }

    /// A `}`; returns `next`.
    fn close(&mut self, next: usize) -> usize {
        if self.inline.last().is_some_and(|&(_, d)| d == self.depth) {
            self.inline.pop();
        }
        self.depth = self.depth.saturating_sub(1);
        next
    }

    /// The module the code is in, in the file of module `file`.
    fn module(&self, file: &[String]) -> ModPath {
        file.iter().cloned().chain(self.inline.iter().map(|(m, _)| m.clone())).collect()
    }
}

/// Whether `t` starts with `#[cfg(test)]`.
fn is_cfg_test(t: &[String]) -> bool {
    t.len() >= 7 && t[..7].iter().map(String::as_str).eq(["#", "[", "cfg", "(", "test", ")", "]"])
}

/// After `#[cfg(test)]` at `t[i]`: skips the item; a `mod x;` is recorded as a test module.
fn skip_test_item(t: &[String], mut i: usize, here: &[String], f: &mut Facts) -> usize {
    while i < t.len() && t[i] != "{" && t[i] != ";" {
        i += 1;
    }
    if t.get(i).map(String::as_str) == Some(";") {
        if i >= 2 && t[i - 2] == "mod" {
            f.test_mods.push(here.iter().cloned().chain([t[i - 1].clone()]).collect());
        }
        return i + 1;
    }
    let mut depth = 0;
    while i < t.len() {
        depth += match t[i].as_str() {
            "{" => 1,
            "}" => -1,
            _ => 0,
        };
        i += 1;
        if depth == 0 {
            break;
        }
    }
    i
}

/// Whether `t[i]` (`crate`, `super` or `self`) starts a path: it is followed
/// by `::` and is not itself the middle of one.
fn starts_path(t: &[String], i: usize) -> bool {
    t.get(i + 1).map(String::as_str) == Some("::") && (i == 0 || t[i - 1] != "::")
}

/// Records the `use` whose tree starts at `t[i]`; returns the index after it.
fn record_use(t: &[String], i: usize, here: &[String], f: &mut Facts) -> usize {
    let (items, next) = tree(t, i, &[]);
    for (path, name) in items {
        f.refs.push((here.to_vec(), path.clone()));
        f.uses.push((here.to_vec(), name, path));
    }
    next
}

// ---- one crate ----

/// One crate's modules and what their files say.
struct Crate {
    /// Every module that has a file (the root is `[]`).
    modules: BTreeSet<ModPath>,
    /// Names bound by `use` in each module: (name, the path it stands for).
    uses: BTreeMap<ModPath, Vec<(String, ModPath)>>,
    /// Items declared in each module, by name.
    items: BTreeMap<ModPath, BTreeSet<String>>,
    /// Every path named: (the module the code is in, the path as written).
    refs: Vec<(ModPath, ModPath)>,
}

impl Crate {
    /// A crate from its files: (module path, text). The files of a
    /// `#[cfg(test)] mod x;` are left out.
    fn new(files: &[(ModPath, String)]) -> Crate {
        let all: Vec<(ModPath, Facts)> = files.iter().map(|(m, text)| (m.clone(), facts(m, text))).collect();
        let tests: Vec<ModPath> = all.iter().flat_map(|(_, f)| f.test_mods.clone()).collect();
        let mut c = Crate { modules: BTreeSet::new(), uses: BTreeMap::new(), items: BTreeMap::new(), refs: vec![] };
        for (m, f) in all.into_iter().filter(|(m, _)| !tests.iter().any(|t| m.starts_with(t))) {
            c.modules.insert(m);
            c.refs.extend(f.refs);
            for (module, name, path) in f.uses {
                c.uses.entry(module).or_default().push((name, path));
            }
            for (module, name) in f.items {
                c.items.entry(module).or_default().insert(name);
            }
        }
        c
    }

    /// The module `path` names when written in module `from`, following `use`
    /// bindings, and whether the whole path is that module (not an item in
    /// it). `None` for a path outside the crate.
    fn resolve(&self, from: &[String], path: &[String], hops: usize) -> Option<(ModPath, bool)> {
        let (mut cur, rest) = start(from, path)?;
        let rooted = rest.len() < path.len();
        for (n, seg) in rest.iter().enumerate() {
            match self.step(&cur, seg, hops) {
                Some((next, true)) => cur = next,
                Some((next, false)) => return Some((next, false)),
                None if n == 0 && !rooted => return None,
                None => return Some((cur, false)),
            }
        }
        Some((cur, true))
    }

    /// One segment down from module `cur`: a submodule, or a name bound there
    /// by `use` (through globs too).
    fn step(&self, cur: &[String], seg: &str, hops: usize) -> Option<(ModPath, bool)> {
        let child = join(cur, seg);
        if self.modules.contains(&child) {
            return Some((child, true));
        }
        if hops > 8 {
            return None;
        }
        let bound = self.uses.get(cur).into_iter().flatten();
        if let Some((_, path)) = bound.clone().find(|(name, _)| name == seg) {
            return self.resolve(cur, path, hops + 1);
        }
        bound.filter(|(name, _)| name == "*").find_map(|(_, glob)| self.through_glob(cur, glob, seg, hops + 1))
    }

    /// `seg` as found in the module that `glob` (written in `cur`) names.
    fn through_glob(&self, cur: &[String], glob: &[String], seg: &str, hops: usize) -> Option<(ModPath, bool)> {
        let (module, true) = self.resolve(cur, glob, hops)? else { return None };
        if self.items.get(&module).is_some_and(|items| items.contains(seg)) {
            return Some((module, false));
        }
        self.step(&module, seg, hops)
    }

    /// The edges of every directory of the crate: directory → its edges.
    fn edges(&self) -> BTreeMap<ModPath, Edges> {
        let mut dirs: BTreeMap<ModPath, Edges> = BTreeMap::new();
        for m in self.modules.iter().filter(|m| !m.is_empty()) {
            let (name, dir) = m.split_last().unwrap();
            dirs.entry(dir.to_vec()).or_default().entry(name.clone()).or_default();
        }
        for (from, path) in &self.refs {
            let Some((to, _)) = self.resolve(from, path, 0) else { continue };
            let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
            if common < from.len() && common < to.len() && self.modules.contains(&from[..=common]) {
                let dir = dirs.entry(from[..common].to_vec()).or_default();
                dir.entry(from[common].clone()).or_default().insert(to[common].clone());
            }
        }
        dirs
    }
}

/// Where a path begins, written in module `from`: the module its leading
/// `crate`, `self` and `super` segments name, and the segments after them.
fn start<'p>(from: &[String], path: &'p [String]) -> Option<(ModPath, &'p [String])> {
    let (mut cur, mut rest) = match path.first().map(String::as_str) {
        Some("crate") => (vec![], &path[1..]),
        Some("self") => (from.to_vec(), &path[1..]),
        _ => (from.to_vec(), path),
    };
    while rest.first().map(String::as_str) == Some("super") {
        cur.pop()?;
        rest = &rest[1..];
    }
    Some((cur, rest))
}

fn join(m: &[String], seg: &str) -> ModPath {
    m.iter().cloned().chain([seg.to_string()]).collect()
}

// ---- circles ----

/// The circles of a directory: each set of two or more modules that all
/// reach one another (a strongly connected component), in name order.
fn circles(edges: &Edges) -> Vec<Vec<String>> {
    let reach = |from: &str| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.to_string()];
        while let Some(n) = todo.pop() {
            for m in edges.get(&n).into_iter().flatten() {
                if seen.insert(m.clone()) {
                    todo.push(m.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<String>> = edges.keys().map(|n| (n, reach(n))).collect();
    let mut out: Vec<Vec<String>> = Vec::new();
    for (n, r) in &reaches {
        if r.contains(*n) && !out.iter().any(|c| c.contains(n)) {
            out.push(
                reaches.keys().filter(|m| r.contains(**m) && reaches[*m].contains(*n)).map(|m| m.to_string()).collect(),
            );
        }
    }
    out.retain(|c| c.len() > 1);
    out
}

/// A shortest cycle through `from`: `from → … → from`.
fn shortest_cycle(edges: &Edges, from: &str) -> Vec<String> {
    let mut back: BTreeMap<String, String> = BTreeMap::new();
    let mut todo = VecDeque::from([from.to_string()]);
    while let Some(n) = todo.pop_front() {
        for m in edges.get(&n).into_iter().flatten() {
            if m == from {
                let mut path = vec![from.to_string(), n.clone()];
                while let Some(p) = back.get(path.last().unwrap()).filter(|_| path.last().unwrap() != from) {
                    path.push(p.clone());
                }
                path.reverse();
                return path;
            }
            if !back.contains_key(m) {
                back.insert(m.clone(), n.clone());
                todo.push_back(m.clone());
            }
        }
    }
    vec![]
}

/// One line per circle: where it is, its modules, a shortest cycle through
/// the first, and the edges among them.
fn report(place: &str, edges: &Edges) -> Vec<String> {
    circles(edges)
        .into_iter()
        .map(|c| {
            let inner: Vec<String> = c
                .iter()
                .flat_map(|a| edges[a].iter().filter(|b| c.contains(b)).map(move |b| format!("{a} → {b}")))
                .collect();
            let example = shortest_cycle(edges, &c[0]).join(" → ");
            format!(
                "{place}: {} modules in a circle: {}\n    e.g. {example}\n    edges: {}",
                c.len(),
                c.join(", "),
                inner.join(", ")
            )
        })
        .collect()
}

// ---- the workspace ----

/// Every `.rs` file under `dir`, with its module path (`src/a/mod.rs` and
/// `src/a.rs` are `a`; `lib.rs` and `main.rs` are the root).
fn module_files(src: &Path, dir: &Path, out: &mut Vec<(ModPath, String)>) {
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            module_files(src, &p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push((module_path(&p.strip_prefix(src).unwrap().with_extension("")), fs::read_to_string(&p).unwrap()));
        }
    }
}

fn module_path(rel: &Path) -> ModPath {
    let mut m: ModPath = rel.iter().map(|c| c.to_string_lossy().to_string()).collect();
    if m.last().is_some_and(|l| l == "mod") || m == ["lib"] || m == ["main"] {
        m.pop();
    }
    m
}

/// The crates of the workspace: (directory name, its `src/`).
fn workspace_crates() -> Vec<(String, PathBuf)> {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../crates");
    let mut out: Vec<(String, PathBuf)> = fs::read_dir(&crates)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("src").is_dir())
        .map(|p| (p.file_name().unwrap().to_string_lossy().to_string(), p.join("src")))
        .collect();
    // The Python package's crate lives beside its Python code, in python/.
    let python = crates.join("../python");
    if python.join("src").is_dir() {
        out.push(("python".to_string(), python.join("src")));
    }
    out.sort();
    out
}

/// A directory's place for messages: `fencelock-server/src/raft`.
fn place(krate: &str, dir: &[String]) -> String {
    [krate.to_string(), "src".to_string()].into_iter().chain(dir.iter().cloned()).collect::<Vec<_>>().join("/")
}

#[test]
fn no_module_imports_a_sibling_that_imports_it_back() {
    let (mut failures, mut dirs, mut edge_count) = (Vec::new(), 0, 0);
    let crates = workspace_crates();
    assert!(crates.len() >= 10, "too few crates found ({crates:?}): the check reads the wrong place");
    for (name, src) in &crates {
        let mut files = Vec::new();
        module_files(src, src, &mut files);
        for (dir, edges) in Crate::new(&files).edges() {
            dirs += 1;
            edge_count += edges.values().map(BTreeSet::len).sum::<usize>();
            failures.extend(report(&place(name, &dir), &edges));
        }
    }
    assert!(edge_count > 200, "only {edge_count} edges in {dirs} directories: the check reads too little");
    assert!(failures.is_empty(), "import circles between modules of one directory:\n{}", failures.join("\n"));
}

/// Builds the edges of a crate given as (file, text) pairs.
fn edges_of(files: &[(&str, &str)]) -> BTreeMap<ModPath, Edges> {
    let files: Vec<(ModPath, String)> =
        files.iter().map(|(f, text)| (module_path(Path::new(&f.replace(".rs", ""))), text.to_string())).collect();
    Crate::new(&files).edges()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|n| n.to_string()).collect()
}

/// The check can fail: a graph with a circle is reported, and one without is not.
#[test]
fn the_cycle_finder_finds_a_cycle() {
    let edges: Edges =
        [("a", "b"), ("b", "c"), ("c", "a"), ("d", "a")].into_iter().map(|(x, y)| (x.to_string(), set(&[y]))).collect();
    assert_eq!(circles(&edges), vec![vec!["a".to_string(), "b".to_string(), "c".to_string()]]);
    assert_eq!(shortest_cycle(&edges, "a"), ["a", "b", "c", "a"]);
    let mut acyclic = edges.clone();
    acyclic.remove("c");
    assert_eq!(circles(&acyclic), Vec::<Vec<String>>::new());
}

/// A grouped import makes an edge to every module it names, nested groups included.
#[test]
fn a_grouped_import_makes_an_edge() {
    let edges = edges_of(&[
        ("lib.rs", "mod a; mod b; mod c; mod d;"),
        ("a.rs", "use crate::{b, c::{self, X}, d::Y as Z};"),
        ("b.rs", ""),
        ("c.rs", ""),
        ("d.rs", ""),
    ]);
    assert_eq!(edges[&vec![]]["a"], set(&["b", "c", "d"]));
}

/// `super::`, `self::` and a name the parent re-exports count as the module
/// they lead to; comments, strings and `#[cfg(test)]` code do not count.
#[test]
fn paths_resolve_through_super_self_and_reexports() {
    let edges = edges_of(&[
        ("lib.rs", "pub mod net; mod conn; pub use conn::Conn;"),
        ("net/mod.rs", "mod a; mod b; mod c; pub use self::b::*; use c::Frame;"),
        (
            "net/a.rs",
            "fn f() { super::Thing::new(); let _: super::Frame; }\n// super::c::X\nconst S: &str = \"crate::net::c\";",
        ),
        ("net/b.rs", "pub struct Thing; fn g() -> crate::Conn { todo!() }"),
        ("net/c.rs", "pub struct Frame;\n#[cfg(test)]\nmod tests { use super::super::a; }"),
        ("conn.rs", "pub struct Conn;"),
    ]);
    assert_eq!(edges[&vec!["net".to_string()]]["a"], set(&["b", "c"]));
    assert_eq!(edges[&vec!["net".to_string()]]["b"], set(&[]), "crate::Conn is conn, outside b's directory");
    assert_eq!(edges[&vec![]]["net"], set(&["conn"]));
    assert_eq!(edges[&vec!["net".to_string()]]["c"], set(&[]));
}

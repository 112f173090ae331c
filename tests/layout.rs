//! The house rules of the source tree, checked on the files themselves:
//!
//! - the modules of `src/` (and of the core, `quotad-core/src/`) depend on one another one
//!   way: no cycle among the top-level modules (read from their `crate::` paths), nor among the
//!   children of any module with a folder (read from `crate::a::b::` and `super::` paths), so a
//!   module can be read and changed knowing only what it uses;
//! - no source file (Rust, shell, Python, Lua, the console's JavaScript, CSS and HTML; not
//!   third-party code under `vendor/`) is over 600 lines, so each one can be read whole;
//! - no type of a crate has its `impl` blocks (its own and its traits') in more than three
//!   files, so a type is read in one place: a type that would need more is split into parts.
//!
//! Paths in comments do not count. A module's own descendants and its parent are not its
//! siblings: only edges between siblings make a cycle here.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

const MAX_LINES: usize = 600;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file below `dir`.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    files_ending(dir, &["rs"])
}

/// Every file below `dir` whose extension is one of `exts`, except third-party code (`vendor/`).
fn files_ending(dir: &Path, exts: &[&str]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = fs::read_dir(dir) else {
        return out;
    };
    for e in entries {
        let p = e.unwrap().path();
        if p.is_dir() {
            if !p.ends_with("vendor") {
                out.extend(files_ending(&p, exts));
            }
        } else if p.extension().is_some_and(|x| exts.iter().any(|e| x == *e)) {
            out.push(p);
        }
    }
    out.sort();
    out
}

/// The code of a file without its `//` comments (doc comments included).
fn code(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap();
    text.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn ident_at(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The first names after each `prefix` in `code`: `prefix::a` and `prefix::{a, b::c}` give
/// `a` (and `b`).
fn names_after(code: &str, prefix: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = code;
    while let Some(i) = rest.find(prefix) {
        // `prefix` must start a path: not the tail of a longer name (`my_crate::`).
        let before = rest[..i].chars().next_back();
        let after = &rest[i + prefix.len()..];
        rest = after;
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let after = after.trim_start();
        if let Some(group) = after.strip_prefix('{') {
            let mut depth = 1;
            let mut item_start = true;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 1 => item_start = true,
                    c if item_start && depth == 1 && !c.is_whitespace() => {
                        let id = ident_at(&group[j..]);
                        if !id.is_empty() {
                            out.insert(id.to_string());
                        }
                        item_start = false;
                    }
                    _ => {}
                }
                if depth == 0 {
                    break;
                }
            }
        } else {
            let id = ident_at(after);
            if !id.is_empty() {
                out.insert(id.to_string());
            }
        }
    }
    out
}

/// The child modules of the module whose files are in `dir`: `x.rs` and `x/` give `x`.
fn children(dir: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        if p.is_dir() {
            out.insert(name);
        } else if let Some(stem) = name.strip_suffix(".rs") {
            if !["mod", "lib", "main"].contains(&stem) {
                out.insert(stem.to_string());
            }
        }
    }
    out
}

/// The files of child `name` of `dir`, each with the `super::` prefix that names `dir`'s
/// module from its top level.
fn child_files(dir: &Path, name: &str) -> Vec<(PathBuf, Option<String>)> {
    let mut out = Vec::new();
    let file = dir.join(format!("{name}.rs"));
    if file.is_file() {
        out.push((file, Some("super::".to_string())));
    }
    let sub = dir.join(name);
    for f in rust_files(&sub) {
        let rel = f.strip_prefix(&sub).unwrap();
        let mut depth = rel.components().count();
        if rel.file_name().is_some_and(|n| n == "mod.rs") {
            depth -= 1;
        }
        out.push((f, Some("super::".repeat(depth + 1))));
    }
    out
}

/// Edges among the children of the module in `dir`, named `path` (`crate`, `crate::http`).
fn sibling_edges(dir: &Path, path: &str) -> BTreeMap<String, BTreeMap<String, PathBuf>> {
    let kids = children(dir);
    let mut edges: BTreeMap<String, BTreeMap<String, PathBuf>> = BTreeMap::new();
    for kid in &kids {
        for (file, sup) in child_files(dir, kid) {
            let code = code(&file);
            let mut used = names_after(&code, &format!("{path}::"));
            if path != "crate" {
                if let Some(sup) = sup {
                    used.extend(names_after(&code, &sup));
                }
            }
            for u in used {
                if kids.contains(&u) && &u != kid {
                    edges
                        .entry(kid.clone())
                        .or_default()
                        .entry(u)
                        .or_insert(file.clone());
                }
            }
        }
    }
    edges
}

/// A cycle in `edges`, as the path that closes it, if there is one.
fn find_cycle(edges: &BTreeMap<String, BTreeMap<String, PathBuf>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        edges: &BTreeMap<String, BTreeMap<String, PathBuf>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(n.to_string(), 1);
        stack.push(n.to_string());
        for m in edges.get(n).into_iter().flat_map(|e| e.keys()) {
            match state.get(m.as_str()).copied() {
                Some(1) => {
                    let from = stack.iter().position(|s| s == m).unwrap();
                    let mut cycle = stack[from..].to_vec();
                    cycle.push(m.clone());
                    return Some(cycle);
                }
                Some(_) => {}
                None => {
                    if let Some(c) = visit(m, edges, state, stack) {
                        return Some(c);
                    }
                }
            }
        }
        stack.pop();
        state.insert(n.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in edges.keys() {
        if !state.contains_key(n.as_str()) {
            let mut stack = Vec::new();
            if let Some(c) = visit(n, edges, &mut state, &mut stack) {
                return Some(c);
            }
        }
    }
    None
}

/// Every module with a folder, of the server (`src/`) and of the core (`quotad-core/src/`),
/// with its path in its crate: `src` is `crate`, `src/http` is `crate::http`.
fn module_dirs() -> Vec<(PathBuf, String)> {
    fn walk(dir: &Path, path: &str, out: &mut Vec<(PathBuf, String)>) {
        out.push((dir.to_path_buf(), path.to_string()));
        let mut subs: Vec<_> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_dir())
            .collect();
        subs.sort();
        for s in subs {
            let name = s.file_name().unwrap().to_string_lossy().to_string();
            walk(&s, &format!("{path}::{name}"), out);
        }
    }
    let mut out = Vec::new();
    walk(&root().join("src"), "crate", &mut out);
    walk(&root().join("quotad-core/src"), "crate", &mut out);
    out
}

#[test]
fn no_module_of_src_depends_on_itself_through_its_siblings() {
    let mut cycles = Vec::new();
    for (dir, path) in module_dirs() {
        let edges = sibling_edges(&dir, &path);
        if let Some(cycle) = find_cycle(&edges) {
            let steps: Vec<String> = cycle
                .windows(2)
                .map(|w| {
                    let file = &edges[&w[0]][&w[1]];
                    let file = file.strip_prefix(root()).unwrap_or(file);
                    format!("{} -> {} ({})", w[0], w[1], file.display())
                })
                .collect();
            cycles.push(format!("in {path}: {}", steps.join(", ")));
        }
    }
    assert!(cycles.is_empty(), "module cycles:\n{}", cycles.join("\n"));
}

#[test]
fn the_checker_sees_a_cycle_and_the_paths_that_make_one() {
    // The rules above must be able to fail: a made-up pair of modules that use each other.
    let code = "use crate::{a::X, b};\nuse crate::c::{self, D}; // crate::e\nlet _ = my_crate::f;";
    let names = names_after(code, "crate::");
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        ["a", "b", "c", "e"].map(String::from),
        "comments are stripped by `code`, not here; `my_crate::` is not `crate::`"
    );
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("a.rs"), "use super::b::B;\n").unwrap();
    fs::write(dir.path().join("b.rs"), "// super::a in a comment\n").unwrap();
    fs::create_dir(dir.path().join("c")).unwrap();
    fs::write(dir.path().join("c/mod.rs"), "use crate::m::a;\n").unwrap();
    let edges = sibling_edges(dir.path(), "crate::m");
    assert_eq!(find_cycle(&edges), None);
    fs::write(dir.path().join("b.rs"), "use super::c::C;\n").unwrap();
    fs::write(dir.path().join("c/inner.rs"), "use super::super::a;\n").unwrap();
    let edges = sibling_edges(dir.path(), "crate::m");
    let cycle = find_cycle(&edges).expect("a -> b -> c -> a");
    assert_eq!(cycle.first(), cycle.last());
    assert_eq!(cycle.len(), 4);
}

#[test]
fn no_source_file_is_over_600_lines() {
    let mut long = Vec::new();
    let code = ["rs", "sh", "py", "lua", "js", "css", "html"];
    for dir in [
        "src",
        "quotad-core/src",
        "quotad-client/src",
        "tests",
        "benches",
        "examples",
        "scripts",
        "console",
        ".ci",
    ] {
        for f in files_ending(&root().join(dir), &code) {
            let lines = fs::read_to_string(&f).unwrap().lines().count();
            if lines > MAX_LINES {
                long.push(format!(
                    "{} ({lines} lines)",
                    f.strip_prefix(root()).unwrap().display()
                ));
            }
        }
    }
    assert!(
        long.is_empty(),
        "files over {MAX_LINES} lines:\n{}",
        long.join("\n")
    );
}

/// Most files a type's `impl` blocks may be spread over.
const MAX_IMPL_FILES: usize = 3;

/// The type an `impl` header names (`impl<T> Trait for a::Type<T> {`: `Type`), if `line` is
/// one.
fn implemented_type(line: &str) -> Option<String> {
    let rest = line.trim_start().strip_prefix("impl")?;
    if !rest.starts_with([' ', '<']) {
        return None;
    }
    // Past the impl's own generics.
    let mut rest = rest.trim_start();
    if rest.starts_with('<') {
        let mut depth = 0;
        for (i, c) in rest.char_indices() {
            match c {
                '<' => depth += 1,
                '>' => depth -= 1,
                _ => {}
            }
            if depth == 0 {
                rest = &rest[i + 1..];
                break;
            }
        }
    }
    let header = rest.split(['{', '\n']).next()?.split(" where ").next()?;
    let ty = header
        .rsplit_once(" for ")
        .map_or(header, |(_, t)| t)
        .trim();
    let ty = ty.trim_start_matches('&').trim_start_matches("dyn ").trim();
    let path = ty.split('<').next()?;
    let name = ident_at(path.rsplit("::").next()?.trim());
    (!name.is_empty()).then(|| name.to_string())
}

#[test]
fn the_impl_reader_names_the_implemented_type() {
    let cases = [
        ("impl Limiter {", Some("Limiter")),
        ("    impl<'a> EntryRef<'a> {", Some("EntryRef")),
        ("impl fmt::Debug for ScyllaStore {", Some("ScyllaStore")),
        ("impl<T: CqlName> CqlName for Option<T> {", Some("Option")),
        (
            "impl<S> tower::Layer<S> for crate::x::Reserve where S: Clone {",
            Some("Reserve"),
        ),
        ("implied(x);", None),
        ("fn f() -> impl Iterator<Item = u8> {", None),
    ];
    for (line, want) in cases {
        assert_eq!(implemented_type(line).as_deref(), want, "{line}");
    }
}

#[test]
fn no_type_is_implemented_in_more_than_three_files() {
    let mut spread = Vec::new();
    for krate in ["src", "quotad-core/src", "quotad-client/src"] {
        let mut files: BTreeMap<String, BTreeSet<PathBuf>> = BTreeMap::new();
        for f in rust_files(&root().join(krate)) {
            for line in code(&f).lines() {
                if let Some(ty) = implemented_type(line) {
                    files.entry(ty).or_default().insert(f.clone());
                }
            }
        }
        for (ty, fs) in files {
            if fs.len() > MAX_IMPL_FILES {
                let names: Vec<String> = fs
                    .iter()
                    .map(|f| f.strip_prefix(root()).unwrap().display().to_string())
                    .collect();
                spread.push(format!("{ty} in {}: {}", krate, names.join(", ")));
            }
        }
    }
    assert!(
        spread.is_empty(),
        "types implemented in more than {MAX_IMPL_FILES} files:\n{}",
        spread.join("\n")
    );
}

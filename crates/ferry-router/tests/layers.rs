//! The layers of `src/` import one way (see the crate documentation): `route` may import
//! `compile`, `encode` and `base`; `compile` may import `encode` and `base`; `encode` only `base`;
//! `base` nothing. These tests read the sources and fail naming the file and line of an import
//! that breaks that, or of a circle between modules.
//!
//! What counts as an import is every `crate::` path outside a comment (a `use`, a path in code, a
//! serde attribute's string). Inside a layer, paths name their layer (`crate::base::row::oid`),
//! not the crate root's re-exports (`crate::oid`, `crate::config`), which would hide the layer.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

/// The layers, lowest first: a layer may import those before it.
const LAYERS: [&str; 4] = ["base", "encode", "compile", "route"];

/// Files outside the layers: the crate root and the facades that keep old public paths.
const ROOT_FILES: [&str; 2] = ["lib.rs", "tables.rs"];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The `.rs` files of a layer directory, sorted.
fn layer_files(layer: &str) -> Vec<PathBuf> {
    let dir = src().join(layer);
    let mut files: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    for f in &files {
        assert!(
            f.extension().is_some_and(|x| x == "rs"),
            "{}: a layer holds modules only, no subdirectories",
            shown(f)
        );
    }
    files
}

/// `src/encode/format.rs` as written in a message.
fn shown(file: &Path) -> String {
    let rel = file.strip_prefix(src()).unwrap_or(file);
    format!("src/{}", rel.display())
}

/// The module a file is: `("encode", "format")`; a layer's `mod.rs` is `(layer, "mod")`.
fn module_of(file: &Path) -> (String, String) {
    let layer = file.parent().unwrap().file_name().unwrap();
    let stem = file.file_stem().unwrap();
    (
        layer.to_string_lossy().into_owned(),
        stem.to_string_lossy().into_owned(),
    )
}

/// One `crate::` path in the code of a line: its first segment and, when there is one, its
/// second (`crate::encode::format::RecordFormat` gives `("encode", Some("format"))`). A
/// grouped `crate::{...}` gives an empty first segment.
fn crate_paths(line: &str) -> Vec<(String, Option<String>)> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        let first = ident(rest);
        let after = &rest[first.len()..];
        let second = after
            .strip_prefix("::")
            .map(ident)
            .filter(|s| !s.is_empty());
        out.push((first, second));
    }
    out
}

/// Every line of a file that is code (not a `//` comment), numbered from 1.
fn code_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l))
        .filter(|(_, l)| !l.trim_start().starts_with("//"))
}

#[test]
fn every_module_is_in_a_layer() {
    let mut problems = Vec::new();
    for entry in fs::read_dir(src()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if !LAYERS.contains(&name.as_str()) {
                problems.push(format!(
                    "src/{name}/: not a layer ({LAYERS:?}); put its modules in one"
                ));
            }
        } else if !ROOT_FILES.contains(&name.as_str()) {
            problems.push(format!(
                "src/{name}: a module outside the layers; move it into the one it belongs to"
            ));
        }
    }
    assert!(problems.is_empty(), "\n{}\n", problems.join("\n"));
}

#[test]
fn layers_import_only_the_layers_below() {
    let mut problems = Vec::new();
    for (rank, layer) in LAYERS.iter().enumerate() {
        for file in layer_files(layer) {
            let text = fs::read_to_string(&file).unwrap();
            for (n, line) in code_lines(&text) {
                let at = format!("{}:{n}", shown(&file));
                if line.contains("super::super::") {
                    problems.push(format!(
                        "{at}: `super::super::` leaves the layer through the crate root; write \
                         `crate::<layer>::...`\n    {}",
                        line.trim()
                    ));
                }
                for (first, _) in crate_paths(line) {
                    match LAYERS.iter().position(|l| *l == first) {
                        Some(r) if r > rank => problems.push(format!(
                            "{at}: the {layer} layer imports the {first} layer, which is above \
                             it (allowed: {:?})\n    {}",
                            &LAYERS[..=rank],
                            line.trim()
                        )),
                        Some(_) => {}
                        None if first.is_empty() => problems.push(format!(
                            "{at}: a grouped `crate::{{...}}` path; write one `use` per layer\n    {}",
                            line.trim()
                        )),
                        None => problems.push(format!(
                            "{at}: `crate::{first}` goes through the crate root's re-exports, \
                             which hides the layer; write `crate::<layer>::...`\n    {}",
                            line.trim()
                        )),
                    }
                }
            }
        }
    }
    assert!(problems.is_empty(), "\n{}\n", problems.join("\n"));
}

#[test]
fn no_import_circles_between_modules() {
    // Module -> (module it imports -> first line that does).
    type Module = (String, String);
    let mut graph: BTreeMap<Module, BTreeMap<Module, String>> = BTreeMap::new();
    for layer in LAYERS {
        for file in layer_files(layer) {
            let from = module_of(&file);
            let text = fs::read_to_string(&file).unwrap();
            let edges = graph.entry(from.clone()).or_default();
            for (n, line) in code_lines(&text) {
                for (first, second) in crate_paths(line) {
                    let Some(second) = second else { continue };
                    let to = (first.clone(), second.clone());
                    if to == from || !src().join(&first).join(format!("{second}.rs")).is_file() {
                        continue;
                    }
                    edges
                        .entry(to)
                        .or_insert_with(|| format!("{}:{n}", shown(&file)));
                }
            }
        }
    }
    // Depth-first search; a module met again while on the path closes a circle.
    fn visit(
        m: &Module,
        graph: &BTreeMap<Module, BTreeMap<Module, String>>,
        path: &mut Vec<Module>,
        done: &mut Vec<Module>,
        circles: &mut Vec<String>,
    ) {
        if done.contains(m) {
            return;
        }
        if let Some(start) = path.iter().position(|p| p == m) {
            let ring = &path[start..];
            let steps: Vec<String> = ring
                .iter()
                .enumerate()
                .map(|(i, a)| {
                    let b = ring.get(i + 1).unwrap_or(&ring[0]);
                    format!("  {}/{} -> {}/{} at {}", a.0, a.1, b.0, b.1, graph[a][b])
                })
                .collect();
            circles.push(format!("an import circle:\n{}", steps.join("\n")));
            return;
        }
        path.push(m.clone());
        for next in graph.get(m).into_iter().flat_map(|e| e.keys()) {
            visit(next, graph, path, done, circles);
        }
        path.pop();
        done.push(m.clone());
    }
    let mut circles = Vec::new();
    let mut done = Vec::new();
    for m in graph.keys() {
        visit(m, &graph, &mut Vec::new(), &mut done, &mut circles);
    }
    assert!(circles.is_empty(), "\n{}\n", circles.join("\n"));
}

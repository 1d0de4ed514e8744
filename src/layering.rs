//! Checks of the source tree's layering, read from the sources themselves: the files of
//! `src/worker` (the loop and its I/O) and of `src/exchange` (the engine) each import their
//! siblings without a cycle, and the engine never names the worker, so the dependency runs
//! one way (the worker drives the engine, the engine drives the codecs and the app).
//!
//! Test-only: it reads `src/`, never the compiled crate, and checks nothing else.

use std::collections::BTreeMap;

/// The `.rs` files of `dir` by stem (`mod` included), read.
fn sources(dir: &std::path::Path) -> BTreeMap<String, String> {
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(dir).expect("a source folder") {
        let path = entry.expect("entry").path();
        if let (Some(stem), Some("rs")) =
            (path.file_stem().and_then(|s| s.to_str()), path.extension().and_then(|e| e.to_str()))
        {
            files.insert(stem.to_owned(), std::fs::read_to_string(&path).expect("source"));
        }
    }
    files
}

/// The module names `text` reaches through `prefix` (`super::name`), comments aside;
/// `super::super::` is not read as `super::`.
fn named(text: &str, prefix: &str) -> Vec<String> {
    let mut words = Vec::new();
    for line in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
        for (at, _) in line.match_indices(prefix) {
            let rest = &line[at + prefix.len()..];
            if prefix == "super::" && (line[..at].ends_with("super::") || rest.starts_with("super::")) {
                continue;
            }
            let word: String =
                rest.chars().take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_').collect();
            words.push(word);
        }
    }
    words
}

/// Each file of `src/<dir>` (`mod.rs` aside) and the sibling files it names, comments
/// aside: `super::name` or `crate::<dir>::name`.
fn sibling_imports(dir: &str) -> BTreeMap<String, Vec<String>> {
    let files = sources(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(dir));
    let within = format!("crate::{dir}::");
    let mut graph = BTreeMap::new();
    for (name, text) in files.iter().filter(|(name, _)| *name != "mod") {
        let mut uses: Vec<String> = named(text, "super::")
            .into_iter()
            .chain(named(text, &within))
            .filter(|word| word != name && word != "mod" && files.contains_key(word))
            .collect();
        uses.sort();
        uses.dedup();
        graph.insert(name.clone(), uses);
    }
    graph
}

/// The first cycle found from `at` (depth first), as the files along it.
fn cycle(graph: &BTreeMap<String, Vec<String>>, at: &str, path: &mut Vec<String>) -> Option<Vec<String>> {
    if let Some(start) = path.iter().position(|p| p == at) {
        let mut found = path[start..].to_vec();
        found.push(at.to_owned());
        return Some(found);
    }
    path.push(at.to_owned());
    for next in graph.get(at).into_iter().flatten() {
        if let Some(found) = cycle(graph, next, path) {
            return Some(found);
        }
    }
    path.pop();
    None
}

#[test]
fn the_worker_and_engine_files_import_each_other_without_a_cycle() {
    let worker = sibling_imports("worker");
    let engine = sibling_imports("exchange");
    assert!(worker["mux"].contains(&"conn".to_owned()), "the parse sees imports");
    assert!(engine["produce"].contains(&"download".to_owned()), "and the engine's");
    for graph in [&worker, &engine] {
        for file in graph.keys() {
            if let Some(found) = cycle(graph, file, &mut Vec::new()) {
                panic!("an import cycle: {}", found.join(" -> "));
            }
        }
    }
}

#[test]
fn the_engine_never_names_the_worker() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/exchange");
    for (name, text) in sources(&root) {
        let code = text.lines().filter(|l| !l.trim_start().starts_with("//"));
        assert!(code.clone().all(|l| !l.contains("worker::")), "exchange/{name}.rs names the worker");
    }
}

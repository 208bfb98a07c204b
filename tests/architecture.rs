//! The workspace's boundaries, checked from its sources (README:
//! Architecture). The compiler already refuses an import of a crate that is
//! not a dependency; this holds the dependencies themselves to the design:
//! which docket crate may use which, where SQL, HTTP and the terminal live,
//! and, inside each crate, no import circle between its modules, no source
//! file over 500 lines, no function over 80 and no public `Result<_, String>`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The product crates: name (the folder under crates/) and the docket
/// crates each may depend on.
const ALLOWED: &[(&str, &[&str])] = &[
    ("model", &[]),
    ("mock", &["model"]),
    ("ledger", &["model"]),
    ("providers", &["model"]),
    ("engine", &["model", "ledger", "providers"]),
    ("console", &["model", "ledger", "providers"]),
];

/// Outside crates that belong to one part only: the ledger's databases, the
/// console's terminal, the mock's server, the providers' HTTP client.
const OWNED: &[(&str, &str)] = &[
    ("rusqlite", "ledger"),
    ("postgres", "ledger"),
    ("ratatui", "console"),
    ("crossterm", "console"),
    ("tui-input", "console"),
    ("axum", "mock"),
    ("reqwest", "providers"),
];

fn manifest(path: &Path) -> toml::Table {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.parse()
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The names in a manifest's `[dependencies]` (not dev- or build-).
fn dependencies(m: &toml::Table) -> BTreeSet<String> {
    m.get("dependencies")
        .and_then(|d| d.as_table())
        .map(|d| d.keys().cloned().collect())
        .unwrap_or_default()
}

fn product_crates() -> Vec<(String, BTreeSet<String>)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(root().join("crates")).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == "testkit" {
            continue;
        }
        out.push((
            name,
            dependencies(&manifest(&entry.path().join("Cargo.toml"))),
        ));
    }
    out.sort();
    out
}

#[test]
fn each_crate_depends_only_on_the_docket_crates_below_it() {
    let crates = product_crates();
    let names: BTreeSet<&str> = crates.iter().map(|(n, _)| n.as_str()).collect();
    let expected: BTreeSet<&str> = ALLOWED.iter().map(|(n, _)| *n).collect();
    assert_eq!(
        names, expected,
        "crates/ holds other crates than the design names"
    );
    for (name, deps) in &crates {
        let allowed = ALLOWED.iter().find(|(n, _)| n == name).unwrap().1;
        let docket: BTreeSet<&str> = deps
            .iter()
            .filter_map(|d| d.strip_prefix("docket-"))
            .collect();
        let extra: Vec<_> = docket.iter().filter(|d| !allowed.contains(d)).collect();
        assert!(
            extra.is_empty(),
            "crates/{name} depends on docket-{extra:?}"
        );
    }
    // The binary's facade depends on every part, the test kit on the facade.
    let top = dependencies(&manifest(&root().join("Cargo.toml")));
    for (name, _) in ALLOWED {
        assert!(
            top.contains(&format!("docket-{name}")),
            "docket does not use docket-{name}"
        );
    }
}

#[test]
fn sql_http_and_the_terminal_each_live_in_one_crate() {
    let mut users: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    let top = dependencies(&manifest(&root().join("Cargo.toml")));
    for (dep, _) in OWNED {
        if top.contains(*dep) {
            users.entry(dep).or_default().push("docket (src/)".into());
        }
    }
    for (name, deps) in product_crates() {
        for (dep, _) in OWNED {
            if deps.contains(*dep) {
                users.entry(dep).or_default().push(name.clone());
            }
        }
    }
    for (dep, owner) in OWNED {
        assert_eq!(
            users.get(dep).cloned().unwrap_or_default(),
            vec![owner.to_string()],
            "{dep} is for crates/{owner} only"
        );
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Every source file of the product: src/ and each crate's src/ (the test
/// kit is test code).
fn product_sources() -> Vec<PathBuf> {
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    for (name, _) in ALLOWED {
        rust_files(&root().join("crates").join(name).join("src"), &mut files);
    }
    assert!(files.len() > 150, "found {} source files", files.len());
    files
}

/// A module's unit tests kept in a file of their own (`foo/tests.rs`,
/// declared `#[cfg(test)] mod tests;`): test code, like an inline `mod tests`.
fn is_unit_tests(f: &Path) -> bool {
    f.file_name().is_some_and(|n| n == "tests.rs")
}

/// A file's lines up to its unit tests, without comment lines.
fn product_code(text: &str) -> Vec<&str> {
    let mut lines: Vec<&str> = Vec::new();
    let mut it = text.lines().peekable();
    while let Some(l) = it.next() {
        if l.trim() == "#[cfg(test)]"
            && it
                .peek()
                .is_some_and(|n| n.trim_start().starts_with("mod tests"))
        {
            break;
        }
        if !l.trim_start().starts_with("//") {
            lines.push(l);
        }
    }
    lines
}

/// The top-level modules a line names through `crate::` (and, in a file
/// directly under src/, through `super::`).
fn named_modules(line: &str, top_level_file: bool, out: &mut BTreeSet<String>) {
    let mut prefixes = vec!["crate::"];
    if top_level_file {
        prefixes.push("super::");
    }
    for prefix in prefixes {
        for (i, _) in line.match_indices(prefix) {
            let before = line[..i].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
                continue;
            }
            let rest = &line[i + prefix.len()..];
            if let Some(group) = rest.strip_prefix('{') {
                let inner = group.split('}').next().unwrap_or("");
                for part in inner.split(',') {
                    let name: String = part
                        .trim()
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    out.insert(name);
                }
            } else {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                out.insert(name);
            }
        }
    }
}

/// Per crate, which top-level module names which.
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        let rel = f.strip_prefix(src).unwrap();
        let parts: Vec<_> = rel
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        let module = parts[0].trim_end_matches(".rs").to_string();
        if parts.len() == 1 && (module == "lib" || module == "main") {
            continue;
        }
        if is_unit_tests(f) {
            continue;
        }
        let text = std::fs::read_to_string(f).unwrap();
        let mut named = BTreeSet::new();
        for line in product_code(&text) {
            named_modules(line, parts.len() == 1, &mut named);
        }
        named.remove(&module);
        graph.entry(module).or_default().extend(named);
    }
    let modules: BTreeSet<String> = graph.keys().cloned().collect();
    for deps in graph.values_mut() {
        deps.retain(|d| modules.contains(d));
    }
    graph
}

/// A circle through `start`, if there is one (depth-first search).
fn circle_through(graph: &BTreeMap<String, BTreeSet<String>>, start: &str) -> Option<Vec<String>> {
    let mut stack = vec![(start.to_string(), vec![start.to_string()])];
    let mut seen = BTreeSet::new();
    while let Some((at, path)) = stack.pop() {
        for next in graph.get(&at).into_iter().flatten() {
            if next == start {
                let mut circle = path.clone();
                circle.push(start.to_string());
                return Some(circle);
            }
            if seen.insert(next.clone()) {
                let mut longer = path.clone();
                longer.push(next.clone());
                stack.push((next.clone(), longer));
            }
        }
    }
    None
}

#[test]
fn no_import_circle_between_the_modules_of_a_crate() {
    let mut circles = Vec::new();
    let mut crates: Vec<(String, PathBuf)> = ALLOWED
        .iter()
        .map(|(n, _)| (n.to_string(), root().join("crates").join(n).join("src")))
        .collect();
    crates.push(("docket".into(), root().join("src")));
    for (name, src) in crates {
        let graph = module_graph(&src);
        assert!(!graph.is_empty(), "{name}: no modules read");
        for module in graph.keys() {
            if let Some(c) = circle_through(&graph, module) {
                circles.push(format!("{name}: {}", c.join(" -> ")));
                break;
            }
        }
    }
    assert!(
        circles.is_empty(),
        "import circles:\n{}",
        circles.join("\n")
    );
}

#[test]
fn the_checker_sees_a_circle_when_there_is_one() {
    let mut named = BTreeSet::new();
    named_modules("use crate::{store, watch::Tune};", false, &mut named);
    named_modules("let x = super::queue::beat(c);", true, &mut named);
    named_modules("let y = mycrate::other::f();", false, &mut named);
    let expected: BTreeSet<String> = ["store", "watch", "queue"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(named, expected);
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec!["a"]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.into_iter().map(String::from).collect()))
    .collect();
    assert_eq!(
        circle_through(&graph, "a"),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    assert_eq!(circle_through(&graph, "d"), None);
}

/// Line counts over a limit: files over 500 lines, functions over 80.
const MAX_FILE_LINES: usize = 500;
const MAX_FN_LINES: usize = 80;

/// The functions of a file's product code longer than `MAX_FN_LINES`, from
/// their `fn` line to the closing brace at the same indentation.
fn long_functions(text: &str) -> Vec<(usize, usize, String)> {
    let start = regex::Regex::new(
        r"^(\s*)(pub(\([a-z:]+\))? )?(async )?(const )?(unsafe )?fn [A-Za-z0-9_]+",
    )
    .unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let end_of_product = lines
        .windows(2)
        .position(|w| w[0].trim() == "#[cfg(test)]" && w[1].trim_start().starts_with("mod tests"))
        .unwrap_or(lines.len());
    let mut long = Vec::new();
    for (i, line) in lines[..end_of_product].iter().enumerate() {
        let Some(m) = start.captures(line) else {
            continue;
        };
        let close = format!("{}}}", &m[1]);
        if line.trim_end().ends_with(';') {
            continue;
        }
        if let Some(len) = lines[i + 1..end_of_product]
            .iter()
            .position(|l| *l == close)
            && len + 2 > MAX_FN_LINES
        {
            long.push((i + 1, len + 2, line.trim().to_string()));
        }
    }
    long
}

#[test]
fn no_source_file_over_500_lines_and_no_function_over_80() {
    let mut over = Vec::new();
    // The test kit too: it is code every test reads.
    let mut files = product_sources();
    rust_files(&root().join("crates/testkit/src"), &mut files);
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let rel = f.strip_prefix(root()).unwrap().display().to_string();
        let n = text.lines().count();
        if n > MAX_FILE_LINES {
            over.push(format!("{rel}: {n} lines"));
        }
        if is_unit_tests(&f) {
            continue;
        }
        for (at, len, head) in long_functions(&text) {
            over.push(format!("{rel}:{at}: a function of {len} lines: {head}"));
        }
    }
    assert!(
        over.is_empty(),
        "{} over the limits:\n{}",
        over.len(),
        over.join("\n")
    );
}

#[test]
fn the_length_checker_measures_functions() {
    let short = "fn a() {\n    x();\n}\n";
    assert!(long_functions(short).is_empty());
    let body = "    x();\n".repeat(MAX_FN_LINES);
    let long = format!("pub(crate) async fn b(\n    y: u8,\n) {{\n{body}}}\n");
    assert_eq!(
        long_functions(&long),
        vec![(1, MAX_FN_LINES + 4, "pub(crate) async fn b(".to_string())]
    );
    let tests_only = format!("#[cfg(test)]\nmod tests {{\n    fn c() {{\n{body}    }}\n}}\n");
    assert!(long_functions(&tests_only).is_empty());
}

/// The public signatures in `code` whose error is a bare `String`: `pub`
/// functions, every method of a `pub trait` (its implementors and callers
/// are outside the module), and `pub type` aliases.
fn stringly_signatures(code: &str) -> Vec<String> {
    let stringly = regex::Regex::new(r"Result<[^;{]*,\s*String>").unwrap();
    let public = regex::Regex::new(r"^\s*pub (async )?fn |^\s*pub type ").unwrap();
    let mut found = Vec::new();
    let mut trait_end: Option<String> = None;
    let mut lines = code.lines();
    while let Some(line) = lines.next() {
        if trait_end.as_deref() == Some(line) {
            trait_end = None;
        } else if line.trim_start().starts_with("pub trait ") && !line.ends_with('}') {
            let indent = line.len() - line.trim_start().len();
            trait_end = Some(format!("{}}}", &line[..indent]));
        }
        let in_trait_fn = trait_end.is_some() && line.trim_start().starts_with("fn ");
        if !(public.is_match(line) || in_trait_fn) {
            continue;
        }
        // A signature may span lines: read on to its body or its end.
        let mut sig = line.trim().to_string();
        while !sig.contains('{') && !sig.ends_with(';') {
            let Some(next) = lines.next() else { break };
            sig.push(' ');
            sig.push_str(next.trim());
        }
        let head = sig.split('{').next().unwrap_or_default();
        if stringly.is_match(head) {
            found.push(head.trim().to_string());
        }
    }
    found
}

#[test]
fn every_public_error_is_a_typed_enum() {
    let mut found = Vec::new();
    for f in product_sources() {
        let text = std::fs::read_to_string(&f).unwrap();
        let code = product_code(&text).join("\n");
        for sig in stringly_signatures(&code) {
            found.push(format!(
                "{}: {sig}",
                f.strip_prefix(root()).unwrap().display()
            ));
        }
    }
    assert!(
        found.is_empty(),
        "public signatures with a String error:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_error_checker_sees_functions_traits_and_aliases() {
    let code = "pub fn a(\n    x: u8,\n) -> Result<(), String> {\n}\n\
                pub(crate) fn b() -> Result<(), String> {\n}\n\
                fn c() -> Result<(), String> {\n}\n\
                pub trait T: Send {\n    fn d(&self) -> Result<Vec<u8>, String>;\n    \
                fn e(&self) -> Result<(), E> {\n        Ok(())\n    }\n}\n\
                fn f() -> Result<(), String> {\n}\n\
                pub type Page<'a> = Pin<Box<dyn Future<Output = Result<Vec<u8>, String>> + 'a>>;\n\
                pub type Fine = Result<(), E>;\n";
    let found = stringly_signatures(code);
    assert_eq!(found.len(), 3, "{found:?}");
    assert!(found[0].starts_with("pub fn a("), "{found:?}");
    assert!(found[1].starts_with("fn d("), "{found:?}");
    assert!(found[2].starts_with("pub type Page"), "{found:?}");
}

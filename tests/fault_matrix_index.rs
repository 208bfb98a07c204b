//! `tests/FAULT_MATRIX.md` maps each of the fault matrix's 40 rows to the
//! tests that show it. This keeps the map true: every row is there once,
//! each has a status, and every test it names exists in the file it names.

use std::path::Path;

const ROWS: [(&str, u32); 7] = [
    ("P", 7),
    ("S", 8),
    ("B", 8),
    ("D", 5),
    ("I", 4),
    ("C", 4),
    ("X", 4),
];

#[test]
fn every_row_is_mapped_once_to_tests_that_exist() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let map = std::fs::read_to_string(root.join("tests/FAULT_MATRIX.md")).unwrap();
    let rows: Vec<Vec<&str>> = map
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| row"))
        .map(|l| l.trim_matches('|').split('|').map(str::trim).collect())
        .collect();
    let mut wanted: Vec<String> = ROWS
        .iter()
        .flat_map(|(p, n)| (1..=*n).map(move |i| format!("{p}{i}")))
        .collect();
    assert_eq!(wanted.len(), 40);
    let mut problems = Vec::new();
    for cells in &rows {
        let [row, _fault, tests, status] = cells[..] else {
            problems.push(format!("not four cells: {cells:?}"));
            continue;
        };
        match wanted.iter().position(|w| w == row) {
            Some(i) => {
                wanted.remove(i);
            }
            None => problems.push(format!("{row}: unknown or twice")),
        }
        if !(status == "covered"
            || status.starts_with("covered (")
            || status.starts_with("partial: ")
            || status.starts_with("none: "))
        {
            problems.push(format!("{row}: status {status:?}"));
        }
        if status.starts_with("none") != (tests == "—") {
            problems.push(format!("{row}: tests {tests:?} with status {status:?}"));
        }
        for named in tests.split(';').map(str::trim).filter(|t| *t != "—") {
            let Some((file, function)) = named.split_once("::") else {
                problems.push(format!("{row}: {named:?} is not FILE::FUNCTION"));
                continue;
            };
            match std::fs::read_to_string(root.join(file)) {
                Ok(text) if text.contains(&format!("fn {function}(")) => {}
                Ok(_) => problems.push(format!("{row}: no fn {function} in {file}")),
                Err(e) => problems.push(format!("{row}: {file}: {e}")),
            }
        }
    }
    assert!(wanted.is_empty(), "rows missing from the map: {wanted:?}");
    assert!(problems.is_empty(), "{problems:#?}");
}

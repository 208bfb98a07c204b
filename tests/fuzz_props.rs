//! Every fuzz target (`docket::fuzzing`) on its committed corpus and on a
//! few thousand seeded mutations of it: no reader of outside input panics,
//! whatever the bytes. The long runs are `cargo bench --bench fuzz` (stable)
//! and `cargo +nightly fuzz run TARGET` in `fuzz/` (coverage-guided).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;

use rand::SeedableRng;

const MUTATIONS: usize = 3_000;

#[test]
fn no_reader_of_outside_input_panics_on_its_corpus_or_mutations_of_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    let mut failures = Vec::new();
    for (name, target) in docket::fuzzing::TARGETS {
        let corpus = docket::fuzzing::corpus(&root, name)
            .unwrap_or_else(|e| panic!("no corpus for {name} in {}: {e}", root.display()));
        assert!(!corpus.is_empty(), "the corpus of {name} is empty");
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x00d0_c4e7 ^ name.len() as u64);
        let inputs = corpus
            .iter()
            .cloned()
            .chain((0..MUTATIONS).map(|_| docket::fuzzing::mutate(&mut rng, &corpus)));
        for input in inputs {
            if catch_unwind(AssertUnwindSafe(|| target(&input))).is_err() {
                failures.push(format!(
                    "{name} panicked on {:?}",
                    String::from_utf8_lossy(&input)
                ));
                break;
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn every_target_has_a_cargo_fuzz_target_and_a_corpus() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    for (name, _) in docket::fuzzing::TARGETS {
        let file = root.join(format!("fuzz_targets/{name}.rs"));
        let text =
            std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        assert!(
            text.contains(&format!("docket::fuzzing::{name}(")),
            "{} does not call its target",
            file.display()
        );
        assert!(
            root.join("corpus").join(name).is_dir(),
            "no corpus for {name}"
        );
    }
}

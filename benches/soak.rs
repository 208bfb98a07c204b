//! The crash soak (issue 12): `cargo bench --bench soak -- [--trials N]
//! [--mode sync|batch-openai|batch-anthropic|batch-gemini] [--seed S]
//! [--items N] [--power-loss]`. N trials per mode (default 20), seeds 1..=N (or the one
//! seed given, to replay a failure), each interrupted by SIGKILL at a random
//! moment or at a named failpoint one to three times and resumed to the end,
//! with the ledger and the mock's billing log checked after every run (see
//! `crates/testkit/src/soak.rs`). Prints trials passed/run per mode and the seed
//! of every failure. `--power-loss`: each kill is also a simulated power
//! loss that drops the WAL bytes the killed run never synced (row P7).

use docket_testkit as support;

use std::collections::BTreeMap;
use std::time::Instant;

use support::soak::{Mode, power_loss_trial, trial};

struct Args {
    trials: u64,
    modes: Vec<Mode>,
    seed: Option<u64>,
    items: usize,
    power_loss: bool,
}

fn args() -> Args {
    let mut a = Args {
        trials: 20,
        modes: Mode::ALL.to_vec(),
        seed: None,
        items: 40,
        power_loss: false,
    };
    let raw: Vec<String> = std::env::args().skip(1).collect();
    let mut it = raw.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .unwrap_or_else(|| panic!("{flag} needs a value"))
                .clone()
        };
        match flag.as_str() {
            "--trials" => a.trials = value().parse().expect("--trials N"),
            "--mode" => {
                let m = value();
                a.modes = vec![Mode::from_name(&m).unwrap_or_else(|| panic!("no mode {m}"))];
            }
            "--seed" => a.seed = Some(value().parse().expect("--seed S")),
            "--items" => a.items = value().parse().expect("--items N"),
            "--power-loss" => a.power_loss = true,
            // `cargo bench` passes --bench.
            _ => {}
        }
    }
    a
}

fn main() {
    let a = args();
    let seeds: Vec<u64> = match a.seed {
        Some(s) => vec![s],
        None => (1..=a.trials).collect(),
    };
    println!(
        "docket crash soak: {} trial(s) per mode, {} items each{}",
        seeds.len(),
        a.items,
        if a.power_loss {
            "; every kill is also a power loss"
        } else {
            ""
        }
    );
    for mode in &a.modes {
        let started = Instant::now();
        let (mut passed, mut kills, mut billed, mut unrecorded, mut ambiguous) = (0, 0, 0, 0, 0);
        let (mut losses, mut lost_bytes, mut checkpointed) = (0, 0, 0);
        let mut cuts: BTreeMap<String, u64> = BTreeMap::new();
        let mut failed = Vec::new();
        for &seed in &seeds {
            let outcome = std::panic::catch_unwind(|| {
                if a.power_loss {
                    power_loss_trial(*mode, seed, a.items)
                } else {
                    trial(*mode, seed, a.items)
                }
            });
            match outcome {
                Ok(Ok(r)) => {
                    passed += 1;
                    kills += r.kills;
                    billed += r.billed;
                    unrecorded += r.billed_unrecorded;
                    ambiguous += r.ambiguous;
                    losses += r.power_losses;
                    lost_bytes += r.wal_bytes_lost;
                    checkpointed += r.checkpointed_losses;
                    for c in r.cuts {
                        *cuts.entry(c).or_default() += 1;
                    }
                }
                Ok(Err(e)) => {
                    println!("  FAIL {} seed {seed}: {e}", mode.name());
                    failed.push(seed);
                }
                Err(_) => {
                    println!("  FAIL {} seed {seed}: panicked (see above)", mode.name());
                    failed.push(seed);
                }
            }
        }
        println!(
            "{:<16} {passed}/{} trials passed in {:.0} s; {kills} runs killed; billed {billed}, of which {unrecorded} \
             the ledger has no answer for (each recorded ambiguous; {ambiguous} ambiguous attempts in all)  [{}]",
            mode.name(),
            seeds.len(),
            started.elapsed().as_secs_f64(),
            if failed.is_empty() { "PASS" } else { "FAIL" }
        );
        println!("                 cuts: {cuts:?}");
        if a.power_loss {
            println!(
                "                 power losses: {losses}, {lost_bytes} unsynced WAL bytes lost; {checkpointed} after a checkpoint"
            );
        }
        if !failed.is_empty() {
            println!(
                "                 failing seeds (replay with --mode {} --seed S): {failed:?}",
                mode.name()
            );
        }
    }
}

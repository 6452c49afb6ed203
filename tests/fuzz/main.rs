//! The fuzz harness: every parser that reads untrusted input, fed mutated inputs, on stable Rust
//! with no tool beyond cargo (`cargo test -p railring-tests --test fuzz`; `scripts/fuzz` for
//! the long mode).
//!
//! This is the fuzzer that needs no tool and no C++ compiler: a mutational fuzzer seeded per
//! target with valid inputs (fixtures, hand-written seeds) and a dictionary of the grammar's
//! tokens; each execution applies 1–8 mutations (bit flips, interesting bytes and
//! numbers, insertions, deletions, duplicated ranges — which grow nesting — and splices between
//! seeds). It has no coverage feedback; the seeds and dictionaries stand in for it. The
//! coverage-guided fuzzer, libFuzzer on stable (`tests/fuzz-lf`, `scripts/fuzz-cov`, run by CI
//! too), fuzzes the same targets (`targets.rs`).
//!
//! For each execution it checks: no panic (caught, the input saved and reported), no hang
//! (an execution over 2 s is reported; 15 s in a debug build), bounded memory (a counting allocator reports any single
//! allocation over 256 MiB: no size may come from an unchecked number). Budget: `RAILRING_FUZZ_EXECS`
//! executions per target (default 2 000) or `RAILRING_FUZZ_SECS` seconds per target;
//! `RAILRING_FUZZ_TARGETS=a,b` picks targets; `RAILRING_FUZZ_SEED` replays a run. Inputs that
//! failed once live in `tests/fuzz/regressions/<target>/` and are replayed first, every run.

mod alloc;
mod mutate;
mod run;
mod targets;

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

fn env_num(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

fn main() {
    // libtest-style arguments (filters, --nocapture) are accepted and ignored, except
    // `--list`, which prints nothing (cargo test --list).
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--list") {
        return;
    }
    let execs = env_num("RAILRING_FUZZ_EXECS").unwrap_or(2000);
    let secs = env_num("RAILRING_FUZZ_SECS").map(Duration::from_secs);
    let seed = env_num("RAILRING_FUZZ_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    }) | 1;
    let only: Option<Vec<String>> = std::env::var("RAILRING_FUZZ_TARGETS")
        .ok()
        .map(|v| v.split(',').map(|s| s.trim().to_string()).collect());
    let out_dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fuzz-findings");
    std::panic::set_hook(Box::new(|_| {}));
    println!("fuzz: seed {seed} (RAILRING_FUZZ_SEED replays it)");
    println!(
        "{:<14} {:>9} {:>8} {:>7} {:>6} {:>6} {:>12}",
        "target", "execs", "secs", "exec/s", "panics", "hangs", "max alloc"
    );
    let mut failed = Vec::new();
    let mut total = 0u64;
    for t in targets::all() {
        if only
            .as_ref()
            .is_some_and(|o| !o.iter().any(|n| n == t.name))
        {
            continue;
        }
        let r = run::run(&t, seed, execs, secs, &out_dir);
        total += r.execs;
        println!(
            "{:<14} {:>9} {:>8.1} {:>7.0} {:>6} {:>6} {:>9} KiB",
            t.name,
            r.execs,
            r.time.as_secs_f64(),
            r.execs as f64 / r.time.as_secs_f64().max(1e-9),
            r.panics.len(),
            r.hangs.len(),
            r.max_alloc / 1024
        );
        for (what, path) in r.panics.iter().chain(r.hangs.iter()).chain(r.big.iter()) {
            failed.push(format!(
                "{}: {what} (input saved in {})",
                t.name,
                path.display()
            ));
        }
    }
    let _ = std::io::stdout().flush();
    if failed.is_empty() {
        println!("fuzz: {total} executions, 0 panics, 0 hangs, no unbounded allocation");
        println!("1 passed, 0 failed");
    } else {
        for f in &failed {
            println!("FAIL {f}");
        }
        println!("0 passed, 1 failed");
        std::process::exit(1);
    }
}

//! The mutational fuzzer's loop: one target's regressions and seeds as they are, then mutated
//! inputs until the budget, each checked for a panic, a hang and an oversized allocation.

use crate::alloc;
use crate::mutate::{mutate, Rng};
use crate::targets::{regressions, Target};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What one target's run found.
pub struct Report {
    pub execs: u64,
    pub time: Duration,
    pub max_alloc: usize,
    pub panics: Vec<(String, PathBuf)>,
    pub hangs: Vec<(String, PathBuf)>,
    pub big: Vec<(String, PathBuf)>,
}

/// An execution slower than this is a hang (a debug build on a loaded 2-core machine expands a
/// 65 536-name hostlist in about 3 s; the release build in a fraction of a second).
const HANG: Duration = Duration::from_secs(if cfg!(debug_assertions) { 15 } else { 2 });
/// A single allocation larger than this was sized by an unchecked number.
const BIG_ALLOC: usize = 256 << 20;

fn save(dir: &Path, target: &str, n: usize, data: &[u8]) -> PathBuf {
    let _ = std::fs::create_dir_all(dir);
    let p = dir.join(format!("{target}-{n}.bin"));
    let _ = std::fs::write(&p, data);
    p
}

/// Run one target: its regressions and seeds as they are, then mutated inputs until the budget.
pub fn run(t: &Target, seed: u64, execs: u64, secs: Option<Duration>, out: &Path) -> Report {
    let mut rng = Rng(seed
        ^ t.name
            .bytes()
            .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(b as u64)));
    let mut r = Report {
        execs: 0,
        time: Duration::ZERO,
        max_alloc: 0,
        panics: Vec::new(),
        hangs: Vec::new(),
        big: Vec::new(),
    };
    let start = Instant::now();
    let mut fixed: Vec<Vec<u8>> = regressions(t.name);
    fixed.extend(t.seeds.iter().cloned());
    let mut i = 0usize;
    loop {
        let done = match secs {
            Some(s) => start.elapsed() >= s && i >= fixed.len(),
            None => r.execs >= execs.max(fixed.len() as u64),
        };
        if done {
            break;
        }
        let input = if i < fixed.len() {
            fixed[i].clone()
        } else {
            let mut d = t.seeds[rng.below(t.seeds.len())].clone();
            mutate(&mut rng, &mut d, t.dict, &t.seeds);
            d
        };
        i += 1;
        alloc::take_max();
        let t0 = Instant::now();
        let res = catch_unwind(AssertUnwindSafe(|| (t.exec)(&input)));
        let took = t0.elapsed();
        let big = alloc::take_max();
        r.max_alloc = r.max_alloc.max(big);
        r.execs += 1;
        if let Err(e) = res {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panic".into());
            if r.panics.len() < 10 {
                let p = save(out, t.name, r.panics.len(), &input);
                r.panics.push((format!("panic: {msg}"), p));
            }
        }
        if took > HANG && r.hangs.len() < 10 {
            let p = save(out, &format!("{}-hang", t.name), r.hangs.len(), &input);
            r.hangs
                .push((format!("hang: one execution took {took:?}"), p));
        }
        if big > BIG_ALLOC && r.big.len() < 10 {
            let p = save(out, &format!("{}-alloc", t.name), r.big.len(), &input);
            r.big.push((format!("allocation of {big} bytes"), p));
        }
    }
    r.time = start.elapsed();
    r
}

//! Test program for rails and stragglers, through `railring::Communicator::init()`. Modes:
//!   loop SECS     all-reduce, reduce-scatter, all-gather, broadcast and all-to-all, small and
//!                 large (a large and a small call in flight at once), over and over for SECS
//!                 seconds (rank 0 decides when to stop); every element of every result checked
//!                 on every rank against an exact reference; prints "OK rank R calls N" and the
//!                 rail each rank's link ended on
//!   straggle MS CALLS RANK...   the listed ranks sleep MS milliseconds before every one of
//!                 CALLS all-reduces (RAILRING_STRAGGLER prints the report); "OK rank R"
use railring::{Communicator, ReduceOp};
use std::time::{Duration, Instant};

fn val(r: usize, i: usize, it: usize) -> i32 {
    ((i * 5 + r * 3 + it * 7) % 9 + 1) as i32
}

fn fail(what: String) -> ! {
    eprintln!("WRONG {what}");
    std::process::exit(1);
}

fn check(what: &str, got: &[i32], want: impl Fn(usize) -> i32) {
    for (i, g) in got.iter().enumerate() {
        let w = want(i);
        if *g != w {
            fail(format!("{what}: element {i}: got {g}, expected {w}"));
        }
    }
}

/// One round of every collective at `n` elements per rank (iteration `it`).
fn round(c: &Communicator, n: usize, it: usize) {
    let (size, me) = (c.size(), c.rank());
    let sum = |i: usize| (0..size).map(|r| val(r, i, it)).sum::<i32>();
    // a large all-reduce and a small one in flight together
    let big: Vec<i32> = (0..n).map(|i| val(me, i, it)).collect();
    let small: Vec<i32> = (0..5).map(|i| val(me, i, it)).collect();
    let pb = c.all_reduce_start(big, ReduceOp::Sum);
    let ps = c.all_reduce_start(small, ReduceOp::Sum);
    let big = pb
        .wait()
        .unwrap_or_else(|e| fail(format!("all_reduce {n}: {e}")));
    let small = ps
        .wait()
        .unwrap_or_else(|e| fail(format!("all_reduce 5: {e}")));
    check(&format!("all_reduce {n} it {it}"), &big, sum);
    check(&format!("all_reduce 5 it {it}"), &small, sum);
    // reduce-scatter: this rank's block of the sum
    let input: Vec<i32> = (0..n * size).map(|i| val(me, i, it)).collect();
    let mut out = vec![0i32; n];
    c.reduce_scatter(&input, &mut out, ReduceOp::Sum)
        .unwrap_or_else(|e| fail(format!("reduce_scatter {n}: {e}")));
    check(&format!("reduce_scatter {n} it {it}"), &out, |i| {
        sum(me * n + i)
    });
    // all-gather
    let mine: Vec<i32> = (0..n).map(|i| val(me, i, it)).collect();
    let mut all = vec![0i32; n * size];
    c.all_gather(&mine, &mut all)
        .unwrap_or_else(|e| fail(format!("all_gather {n}: {e}")));
    check(&format!("all_gather {n} it {it}"), &all, |i| {
        val(i / n, i % n, it)
    });
    // broadcast from a root that changes
    let root = it % size;
    let mut b: Vec<i32> = if me == root {
        (0..n).map(|i| val(root, i, it)).collect()
    } else {
        vec![0; n]
    };
    c.broadcast(&mut b, root)
        .unwrap_or_else(|e| fail(format!("broadcast {n}: {e}")));
    check(&format!("broadcast {n} root {root} it {it}"), &b, |i| {
        val(root, i, it)
    });
    // all-to-all: block j of rank r goes to rank j
    let input: Vec<i32> = (0..n * size).map(|i| val(me, i, it)).collect();
    let mut out = vec![0i32; n * size];
    c.all_to_all(&input, &mut out)
        .unwrap_or_else(|e| fail(format!("all_to_all {n}: {e}")));
    check(&format!("all_to_all {n} it {it}"), &out, |i| {
        let (src, k) = (i / n, i % n);
        val(src, me * n + k, it)
    });
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let c = Communicator::init().unwrap_or_else(|e| fail(format!("init: {e}")));
    let me = c.rank();
    match args.first().map(String::as_str) {
        Some("loop") => {
            let secs: f64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(10.0);
            let start = Instant::now();
            let mut it = 0usize;
            let mut calls = 0usize;
            loop {
                for n in [3usize, 4099, 150_000] {
                    round(&c, n, it);
                    calls += 6;
                }
                it += 1;
                if me == 0 {
                    println!("round {it}");
                }
                // rank 0 decides when to stop, so every rank makes the same calls
                let mut stop = [u8::from(me == 0 && start.elapsed().as_secs_f64() >= secs)];
                c.broadcast(&mut stop, 0)
                    .unwrap_or_else(|e| fail(format!("broadcast stop: {e}")));
                calls += 1;
                if stop[0] == 1 {
                    break;
                }
            }
            let (rail, name) = c.rail();
            println!(
                "OK rank {me} calls {calls} rounds {it} rail {rail} {}",
                name.unwrap_or_default()
            );
        }
        Some("straggle") => {
            let ms: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(20);
            let calls: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(50);
            let late: Vec<usize> = args[3.min(args.len())..]
                .iter()
                .filter_map(|s| s.parse().ok())
                .collect();
            for it in 0..calls {
                if late.contains(&me) {
                    std::thread::sleep(Duration::from_millis(ms));
                }
                let mut b: Vec<i32> = (0..1000).map(|i| val(me, i, it)).collect();
                c.all_reduce(&mut b, ReduceOp::Sum)
                    .unwrap_or_else(|e| fail(format!("all_reduce: {e}")));
                let n = c.size();
                check("straggle all_reduce", &b, |i| {
                    (0..n).map(|r| val(r, i, it)).sum()
                });
            }
            println!("OK rank {me}");
        }
        _ => {
            eprintln!("usage: rr-railcheck loop SECS | straggle MS CALLS RANK...");
            std::process::exit(2);
        }
    }
}

//! railcompare: railring against MPI on the same ranks, the same sizes, the same checks.
//!
//! ```text
//! railcompare -np 4 [--hostfile F | -H host:n,...] [--ssh CMD] [--mpirun-args "..."]
//!             [--railrun-args "..."] [--rounds N] [--svg out.svg] [--json out.json]
//!             -- allreduce -b 8 -e 256M -f 2 -n 20 -w 5
//! ```
//!
//! Everything after `--` is railperf's own command line (nccl-tests flags); both benchmarks
//! get exactly those arguments plus `-J <file>`:
//!
//! * MPI:      `mpirun -np N [--allow-run-as-root] --oversubscribe --mca mpi_yield_when_idle 1
//!   [--hostfile F | -H L] [--mca plm_rsh_agent SSH] MPIRUN-ARGS mpiperf ARGS -J F`
//! * railring: `railrun -np N [--hostfile F | -H L] [--ssh SSH] RAILRUN-ARGS railperf ARGS -J F`
//!
//! mpirun runs with `TMPDIR` set to a fresh directory of its own (removed afterwards), so that
//! it never shares Open MPI's session directory with another mpirun starting at the same time.
//!
//! `mpiperf`, `railperf` (and `railrun`, else the one on `PATH`) are taken from the directory
//! of railcompare's own executable. `--allow-run-as-root` is added when running as root;
//! `--no-yield` drops the yield setting (it helps MPI when ranks outnumber cores and costs it
//! latency otherwise).
//!
//! **Interleaving**: whole sweeps alternate between the libraries in `--rounds` rounds
//! (default 3) in ABBA order — MPI, railring, railring, MPI, MPI, railring, ... — so slow drift
//! of the machine (other jobs, thermal, page cache) hits both equally and neither always goes
//! first. Per size, each library's row is the run with the **median** time over its rounds (the
//! faster of the middle two for an even count), time and bus bandwidth from that same run;
//! `#wrong` is the sum over rounds. (One launch per sweep, not per size: per-size launches would
//! measure mostly start-up and cold caches.) **Slow-host guard** (`--settle`, on by default):
//! a cross-core latency probe before and after every launch; while the host is slow the launch
//! waits, and one a slow spell overlapped runs again (`railring_examples::compare::settle`).
//!
//! Output: one table with both libraries side by side and the ratio railring/MPI of the bus
//! bandwidth per size, out-of-place and in-place; `--svg` plots bus bandwidth against size
//! (log scale) for both; `--json` writes the medians, the ratios and every raw run. Results are
//! read from the `-J` JSON rank 0 writes (in /tmp of rank 0's host); when rank 0 ran on another
//! host, from the table it printed instead. Exit status: 0 when both ran with no wrong element,
//! 1 otherwise.
//!
//! The parts live in `railring_examples::compare` (arguments, runs, statistics, table, SVG);
//! this file runs them in order and writes the summary and the JSON.

use railring_examples::compare::args::{parse_args, Args, USAGE};
use railring_examples::compare::plot::svg;
use railring_examples::compare::runs::{check_tools, command, find_tools, order, show, Run};
use railring_examples::compare::settle::{cross_core_ns, ran_slow, run_guarded, Baseline};
use railring_examples::compare::stats::{compare, Compared};
use railring_examples::compare::table::{f_opt, table};
use railring_examples::compare::Lib;
use railring_examples::perf::{self, Options};

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let a = match parse_args(&argv) {
        Ok(a) => a,
        Err(e) if e.is_empty() => {
            println!("{USAGE}");
            return;
        }
        Err(e) => {
            eprintln!("railcompare: {e}\n\n{USAGE}");
            std::process::exit(2);
        }
    };
    std::process::exit(match run(a) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("railcompare: {e}");
            1
        }
    });
}

fn run(mut a: Args) -> Result<i32, String> {
    if a.probe {
        return match cross_core_ns() {
            Some(ns) => {
                println!("{ns:.0}");
                Ok(0)
            }
            None => {
                Err("no cross-core probe: fewer than two CPUs, or the probe did not finish".into())
            }
        };
    }
    // Validate the benchmark's arguments here, once, with railperf's own parser.
    a.perf.retain(|x| x != "--vs-mpi");
    let o = Options::parse(&a.perf)
        .map_err(|e| format!("benchmark arguments: {e}\n\n{}", perf::USAGE))?;
    if o.help {
        return Err(format!("benchmark arguments: -h\n\n{}", perf::USAGE));
    }
    if o.json.is_some() {
        return Err("benchmark arguments: leave -J out (railcompare adds its own); use railcompare --json FILE".into());
    }
    // mpiperf's calls are blocking: unless told otherwise, railperf's are too, so the two
    // columns measure the same thing.
    let gave_z = a
        .perf
        .iter()
        .any(|x| x == "-z" || x == "--blocking" || x.starts_with("--blocking="));
    if !gave_z {
        a.perf.extend(["-z".to_string(), "1".to_string()]);
    } else if !o.blocking {
        println!("# note: railring with non-blocking calls (-z 0), MPI with blocking calls (mpiperf has no non-blocking mode)");
    }
    if o.csv.is_some() {
        return Err("benchmark arguments: leave --csv out (railcompare runs several rounds); use railcompare --json FILE".into());
    }
    let tools = find_tools()?;
    let title = format!("{} over {} ranks", o.coll.name(), a.np);
    println!(
        "# railcompare: {title}; {} round(s) per library in ABBA order, median per size",
        a.rounds
    );
    println!(
        "# mpi:      {}",
        show(&command(Lib::Mpi, &a, &tools, "FILE"))
    );
    println!(
        "# railring: {}",
        show(&command(Lib::Railring, &a, &tools, "FILE"))
    );
    if a.dry_run {
        return Ok(0);
    }
    check_tools(&tools)?;
    let mut runs = Vec::new();
    let mut base = Baseline::default();
    if let Some(q) = a.quiet_ns {
        base.note(q);
    }
    let said = |r: &Run| {
        let wrong: u64 = r.rows.iter().map(|x| x.oop_wrong + x.ip_wrong).sum();
        let probes = match r.probes {
            (Some(b), Some(e)) => format!(", cross-core {b:.0}/{e:.0} ns before/after"),
            _ => String::new(),
        };
        println!(
            "# round {} {:<8} {} rows, {} wrong, {:.1} s{probes}",
            r.round + 1,
            r.lib.name(),
            r.rows.len(),
            wrong,
            r.secs
        );
    };
    for (lib, round) in order(a.rounds) {
        let r = run_guarded(lib, round, &a, &tools, &mut base, a.settle)?;
        said(&r);
        runs.push(r);
    }
    // Runs made before the first quiet probe passed their own check: run once more those
    // that were slow against the baseline as it ended.
    if a.settle.is_some() {
        for run in runs.iter_mut() {
            if ran_slow(run, &base) {
                let (lib, round) = (run.lib, run.round);
                println!(
                    "# round {} {}: ran while the host was slow (the fastest probe since: {:.0} ns): running it again",
                    round + 1,
                    lib.name(),
                    base.best_ns.unwrap_or(0.0)
                );
                let r = run_guarded(lib, round, &a, &tools, &mut base, a.settle)?;
                said(&r);
                *run = r;
            }
        }
    }
    let rows = compare(&runs);
    println!("#");
    print!("{}", table(&rows));
    let wrong = |lib: Lib| -> u64 {
        runs.iter()
            .filter(|r| r.lib == lib)
            .flat_map(|r| &r.rows)
            .map(|x| x.oop_wrong + x.ip_wrong)
            .sum()
    };
    let (wm, wr) = (wrong(Lib::Mpi), wrong(Lib::Railring));
    let ok = |w: u64| if w == 0 { "OK" } else { "FAILED" };
    println!(
        "# Out of bounds values : mpi {wm} {}, railring {wr} {}",
        ok(wm),
        ok(wr)
    );
    let avg = |f: &dyn Fn(&Compared) -> Option<f64>| -> Option<f64> {
        let v: Vec<f64> = rows
            .iter()
            .filter_map(f)
            .filter(|x| x.is_finite())
            .collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    };
    let bus = |lib: Lib| {
        avg(&|r: &Compared| {
            let a = match lib {
                Lib::Mpi => r.mpi.as_ref(),
                Lib::Railring => r.railring.as_ref(),
            }?;
            Some((a.oop_busbw + a.ip_busbw) / 2.0)
        })
    };
    let geo = |f: &dyn Fn(&Compared) -> Option<f64>| -> Option<f64> {
        let v: Vec<f64> = rows
            .iter()
            .filter_map(f)
            .filter(|x| x.is_finite() && *x > 0.0)
            .collect();
        (!v.is_empty()).then(|| (v.iter().map(|x| x.ln()).sum::<f64>() / v.len() as f64).exp())
    };
    println!(
        "# Avg bus bandwidth    : mpi {}, railring {}; geometric mean of ratios railring/mpi: out-of-place {}, in-place {}",
        f_opt(bus(Lib::Mpi), 4),
        f_opt(bus(Lib::Railring), 4),
        f_opt(geo(&|r| r.ratio_oop_busbw), 3),
        f_opt(geo(&|r| r.ratio_ip_busbw), 3)
    );
    if let Some(p) = &a.svg {
        std::fs::write(p, svg(&rows, &title)).map_err(|e| format!("writing {p}: {e}"))?;
        println!("# plot: {p}");
    }
    if let Some(p) = &a.json {
        let raw: Vec<serde_json::Value> = runs
            .iter()
            .map(|r| {
                serde_json::json!({
                    "library": r.lib.name(),
                    "round": r.round,
                    "seconds": r.secs,
                    "cross_core_ns": [r.probes.0, r.probes.1],
                    "rows": r.rows.iter().map(|x| serde_json::json!({
                        "size": x.size, "count": x.count, "type": x.dtype, "redop": x.redop, "root": x.root,
                        "oop_time_us": x.oop_time_us, "oop_busbw": x.oop_busbw, "oop_wrong": x.oop_wrong,
                        "ip_time_us": x.ip_time_us, "ip_busbw": x.ip_busbw, "ip_wrong": x.ip_wrong,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        let doc = serde_json::json!({
            "collective": o.coll.name(),
            "nranks": a.np,
            "rounds": a.rounds,
            "order": order(a.rounds).iter().map(|(l, _)| l.name()).collect::<Vec<_>>(),
            "statistic": "median over rounds",
            "commands": {
                "mpi": show(&command(Lib::Mpi, &a, &tools, "FILE")),
                "railring": show(&command(Lib::Railring, &a, &tools, "FILE")),
            },
            "rows": rows,
            "runs": raw,
        });
        let text = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?;
        std::fs::write(p, text + "\n").map_err(|e| format!("writing {p}: {e}"))?;
        println!("# json: {p}");
    }
    Ok(if wm == 0 && wr == 0 { 0 } else { 1 })
}

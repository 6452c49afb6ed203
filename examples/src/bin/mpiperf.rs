//! mpiperf: railperf's MPI peer — the same flags, table, JSON and element-by-element checks
//! (the shared driver in `perf/`), with every collective a real MPI call on `MPI_COMM_WORLD`
//! (see `mpi_backend.rs`). Build with `--features mpi`; start with mpirun:
//!
//! ```text
//! mpirun -np 4 mpiperf allreduce -b 8 -e 256M -f 2 -n 20 -w 5
//! ```
//!
//! `railcompare` runs it and railperf side by side. half / bfloat16 have no MPI datatype: asking
//! for one is an error; `-d all` runs the other eight types (and says so). Calls are blocking
//! MPI calls issued back to back whatever `-z` says (the header says "blocking calls").
//!
//! Started by a launcher of another MPI (MPICH's `mpiexec` for an Open MPI build, or railrun),
//! `MPI_Init` gives every rank a world of one: mpiperf compares the size of `MPI_COMM_WORLD` with
//! the number of ranks the launcher announced and stops with an error when they differ.

use railring_examples::mpi_backend::{self, Mpi};
use railring_examples::perf::{self, Backend, Options};

fn first_rank() -> bool {
    ["OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"]
        .iter()
        .find_map(|v| std::env::var(v).ok())
        .map(|r| r.trim() == "0")
        .unwrap_or(true)
}

/// The number of ranks the launcher says it started, and the variable that says so.
fn launcher_size() -> Option<(&'static str, usize)> {
    [
        "RAILRING_WORLD_SIZE",
        "OMPI_COMM_WORLD_SIZE",
        "PMI_SIZE",
        "PMIX_SIZE",
    ]
    .into_iter()
    .find_map(|v| Some((v, std::env::var(v).ok()?.trim().parse().ok()?)))
}

/// The world MPI gave must be the one the launcher started.
fn check_world(be: &Mpi) -> Result<(), String> {
    match launcher_size() {
        Some((var, n)) if n != be.size() => Err(format!(
            "MPI_COMM_WORLD has {} rank(s), but the launcher started {n} ({var}={n}): this mpiperf is built against {}, which the launcher does not serve, so every rank would run alone. Start it with that MPI's own mpirun (e.g. mpirun -np {n} mpiperf ...)",
            be.size(),
            be.library()
        )),
        _ => Ok(()),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut opts = match Options::parse(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!(
                "mpiperf: {e}\n\n{}",
                perf::USAGE.replace("railperf", "mpiperf")
            );
            std::process::exit(2);
        }
    };
    if opts.help {
        println!("{}", perf::USAGE.replace("railperf", "mpiperf"));
        return;
    }
    if opts.vs_mpi {
        if first_rank() {
            eprintln!("mpiperf: --vs-mpi belongs to railperf (it points to railcompare)");
        }
        std::process::exit(2);
    }
    let skipped: Vec<&str> = opts
        .dtypes
        .iter()
        .filter(|d| !mpi_backend::supported(**d))
        .map(|d| d.name())
        .collect();
    if !skipped.is_empty() {
        if opts.dtypes.len() == skipped.len() {
            if first_rank() {
                eprintln!("mpiperf: MPI has no native {} datatype; use -d float, double, int8, uint8, int32, uint32, int64 or uint64", skipped.join(" / "));
            }
            std::process::exit(2);
        }
        if first_rank() {
            println!(
                "# mpiperf: skipping {} (no native MPI datatype)",
                skipped.join(", ")
            );
        }
        opts.dtypes.retain(|d| mpi_backend::supported(*d));
    }
    // MPI calls here are always blocking, issued back to back (-z has no effect): say so in
    // the table's header.
    opts.blocking = true;
    let result = match Mpi::init() {
        Ok(be) => match check_world(&be) {
            Ok(()) => perf::run_with(&be, &opts),
            Err(e) => {
                if first_rank() {
                    eprintln!("mpiperf: {e}");
                }
                // be is dropped (MPI_Finalize) before exiting
                drop(be);
                std::process::exit(1);
            }
        },
        // be is dropped at the end of the arm: MPI_Finalize before exiting
        Err(e) => Err(e),
    };
    match result {
        Ok(0) => {}
        Ok(wrong) => {
            eprintln!("mpiperf: {wrong} wrong elements");
            std::process::exit(1);
        }
        Err(e) => {
            eprintln!("mpiperf: {e}");
            std::process::exit(1);
        }
    }
}

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

use railring_examples::mpi_backend::{self, Mpi};
use railring_examples::perf::{self, Options};

fn first_rank() -> bool {
    ["OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"]
        .iter()
        .find_map(|v| std::env::var(v).ok())
        .map(|r| r.trim() == "0")
        .unwrap_or(true)
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
        Ok(be) => perf::run_with(&be, &opts),
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

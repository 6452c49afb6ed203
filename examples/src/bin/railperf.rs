//! railperf: collective benchmarks in the format of nccl-tests (same flags, same table, same
//! algbw/busbw formulas), over railring.
//!
//! ```text
//! railrun -np 4 railperf allreduce -b 8 -e 256M -f 2 -n 20 -w 5 -c 1
//! railrun -np 8 --hostfile hf railperf allgather -d bf16 -J results.json
//! ```

use railring_examples::perf::{self, Options};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opts = match Options::parse(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("railperf: {e}\n\n{}", perf::USAGE);
            std::process::exit(2);
        }
    };
    if opts.help {
        println!("{}", perf::USAGE);
        return;
    }
    if opts.vs_mpi {
        // The comparison is two jobs (mpirun + railrun), so it cannot run inside one: rank 0
        // points to railcompare with the same arguments (one write, exit 2); the other ranks
        // leave quietly with 0 so the launcher does not end the job before rank 0 has said it.
        let env = |names: &[&str]| {
            names
                .iter()
                .find_map(|v| std::env::var(v).ok().filter(|x| !x.trim().is_empty()))
        };
        let rank = env(&[
            "RAILRING_RANK",
            "OMPI_COMM_WORLD_RANK",
            "PMI_RANK",
            "PMIX_RANK",
        ])
        .unwrap_or_else(|| "0".into());
        if rank.trim() != "0" {
            std::process::exit(0);
        }
        let n = env(&["RAILRING_WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"])
            .unwrap_or_else(|| "N".into());
        let same: Vec<&str> = args
            .iter()
            .map(String::as_str)
            .filter(|a| *a != "--vs-mpi")
            .collect();
        let msg = format!(
            "railperf: --vs-mpi: comparing with MPI takes two jobs (one under mpirun, one under railrun), run side by side by railcompare:\n  \
             railcompare -np {n} [--hostfile F | -H hosts] [--svg plot.svg] -- {}\n\
             (railcompare, railperf and mpiperf sit in the same directory; mpiperf needs `cargo build --release -p railring-examples --features mpi`; see docs/mpi.md)\n",
            same.join(" ")
        );
        use std::io::Write as _;
        let _ = std::io::stderr().write_all(msg.as_bytes());
        std::process::exit(2);
    }
    match perf::run(&opts) {
        Ok(0) => {}
        Ok(wrong) => {
            eprintln!("railperf: {wrong} wrong elements");
            std::process::exit(1);
        }
        Err(e) => {
            eprintln!("railperf: {e}");
            std::process::exit(1);
        }
    }
}

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

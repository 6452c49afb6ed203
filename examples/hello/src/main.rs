//! hello-railring: the smallest complete railring program — copy this crate to start your own.
//!
//! ```text
//! cargo build --release -p hello-railring
//! target/release/railrun -np 4 target/release/hello-railring
//! ```

use railring::{Communicator, ReduceOp};

fn main() -> Result<(), railring::Error> {
    // Join the job: railrun's environment, srun, torchrun-style env, or alone (a world of one).
    let comm = Communicator::init()?;
    let (rank, size) = (comm.rank(), comm.size());

    // Every rank contributes rank+1 in each element; the sum is the same on every rank.
    let mut v = vec![(rank + 1) as f32; 1024];
    comm.all_reduce(&mut v, ReduceOp::Sum)?;
    let want = (size * (size + 1) / 2) as f32;
    assert!(v.iter().all(|&x| x == want), "rank {rank}: wrong sum");

    // Non-blocking: start, do other work, wait.
    let pending = comm.all_reduce_start(vec![1u64; 16], ReduceOp::Sum);
    let ones = pending.wait()?;
    assert_eq!(ones[0], size as u64);

    println!(
        "hello from rank {rank} of {size}: sum {} (want {want})",
        v[0]
    );
    Ok(())
}

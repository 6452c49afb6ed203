//! rr-mpiprog: a rank program for the MPI bootstrap tests (`tests/tests/mpi.rs`), started by
//! `mpirun` (never by railrun).
//!
//! Usage: `rr-mpiprog MODE`
//!
//! * `init`: `Communicator::init()` alone (it detects mpirun, initializes MPI itself and
//!   finalizes it after the bootstrap); then all-reduces, and all-reduces on a `split()`
//!   sub-communicator (which needs rank 0's bootstrap store to still be running).
//! * `from-mpi`: the program initializes MPI (`mpi::initialize()`), builds one communicator with
//!   `Communicator::from_mpi(&world)` and a second one with `Communicator::init()` (which must
//!   find MPI initialized and use it), checks both, interleaved, then an `MPI_Allreduce` too.
//!
//! Every check is an f32 sum all-reduce of small integers (exact in any order), in place and out
//! of place, compared element by element with the reference on every rank. Prints
//! `OK rank R of N mode M nodes K host H` on success; `FAIL rank R: ...` on stderr and exit 1.

use mpi::collective::SystemOperation;
use mpi::topology::Communicator as _;
use mpi::traits::*;
use railring::{Communicator, ReduceOp};

const SIZES: &[usize] = &[1, 3, 1000, 4096 + 17, (1 << 18) + 5];

fn value(r: usize, i: usize) -> f32 {
    ((i * 7 + r * 13) % 11 + 1) as f32
}

fn check_all_reduce(c: &Communicator, what: &str) -> Result<(), String> {
    let (me, n) = (c.rank(), c.size());
    for &len in SIZES {
        let input: Vec<f32> = (0..len).map(|i| value(me, i)).collect();
        let want: Vec<f32> = (0..len)
            .map(|i| (0..n).map(|r| value(r, i)).sum())
            .collect();
        let mut inplace = input.clone();
        c.all_reduce(&mut inplace, ReduceOp::Sum)
            .map_err(|e| format!("{what}: all_reduce of {len}: {e}"))?;
        let mut out = vec![f32::NAN; len];
        c.all_reduce_into(&input, &mut out, ReduceOp::Sum)
            .map_err(|e| format!("{what}: all_reduce_into of {len}: {e}"))?;
        for (kind, got) in [("in-place", &inplace), ("out-of-place", &out)] {
            let wrong: Vec<usize> = (0..len)
                .filter(|&i| got[i].to_bits() != want[i].to_bits())
                .collect();
            if let Some(&i) = wrong.first() {
                return Err(format!(
                    "{what}: {kind} all_reduce of {len} f32: {} wrong elements, first [{i}] = {} (want {})",
                    wrong.len(),
                    got[i],
                    want[i]
                ));
            }
        }
    }
    Ok(())
}

fn expect_env_rank(c: &Communicator) -> Result<(), String> {
    for (var, mine) in [
        ("OMPI_COMM_WORLD_RANK", c.rank()),
        ("OMPI_COMM_WORLD_SIZE", c.size()),
    ] {
        if let Ok(v) = std::env::var(var) {
            if v.trim() != mine.to_string() {
                return Err(format!("{var}={v} but the communicator says {mine}"));
            }
        }
    }
    Ok(())
}

fn run(mode: &str) -> Result<(usize, usize, usize), String> {
    match mode {
        "init" => {
            let c = Communicator::init().map_err(|e| format!("Communicator::init: {e}"))?;
            if c.size() < 2 {
                return Err(format!("world of {}: mpirun was not detected", c.size()));
            }
            expect_env_rank(&c)?;
            if mpi::environment::is_initialized() && !mpi::environment::is_finalized() {
                return Err("MPI is still initialized after init(): it should be finalized after the bootstrap".into());
            }
            check_all_reduce(&c, "init")?;
            let sub = c
                .split(Some((c.rank() % 2) as u32), 0)
                .map_err(|e| format!("split: {e}"))?
                .ok_or("split returned no communicator")?;
            check_all_reduce(&sub, "split")?;
            check_all_reduce(&c, "init after split")?;
            Ok((c.rank(), c.size(), c.nnodes()))
        }
        "from-mpi" => {
            let universe = mpi::initialize().ok_or("mpi::initialize: MPI already initialized")?;
            let world = universe.world();
            let a = Communicator::from_mpi(&world).map_err(|e| format!("from_mpi: {e}"))?;
            if a.rank() != world.rank() as usize || a.size() != world.size() as usize {
                return Err(format!(
                    "from_mpi: rank {} of {}, MPI says {} of {}",
                    a.rank(),
                    a.size(),
                    world.rank(),
                    world.size()
                ));
            }
            expect_env_rank(&a)?;
            let b = Communicator::init()
                .map_err(|e| format!("Communicator::init with MPI initialized: {e}"))?;
            if b.rank() != a.rank() || b.size() != a.size() {
                return Err(format!(
                    "init(): rank {} of {} vs from_mpi {} of {}",
                    b.rank(),
                    b.size(),
                    a.rank(),
                    a.size()
                ));
            }
            if mpi::environment::is_finalized() {
                return Err("init() finalized the program's own MPI".into());
            }
            check_all_reduce(&a, "from_mpi")?;
            check_all_reduce(&b, "init (MPI owned by the program)")?;
            check_all_reduce(&a, "from_mpi again")?;
            // MPI itself still works next to railring.
            let mut s = 0i64;
            world.all_reduce_into(&(a.rank() as i64 + 1), &mut s, SystemOperation::sum());
            let n = a.size() as i64;
            if s != n * (n + 1) / 2 {
                return Err(format!(
                    "MPI_Allreduce after railring: {s}, want {}",
                    n * (n + 1) / 2
                ));
            }
            let r = (a.rank(), a.size(), a.nnodes());
            drop(a);
            drop(b);
            drop(universe); // MPI_Finalize
            Ok(r)
        }
        other => Err(format!("unknown mode '{other}' (init | from-mpi)")),
    }
}

fn main() {
    let mode = std::env::args().nth(1).unwrap_or_default();
    match run(&mode) {
        Ok((rank, size, nodes)) => {
            println!(
                "OK rank {rank} of {size} mode {mode} nodes {nodes} host {}",
                railring::machine::hostname()
            );
        }
        Err(e) => {
            let r = std::env::var("OMPI_COMM_WORLD_RANK")
                .or_else(|_| std::env::var("PMI_RANK"))
                .unwrap_or_else(|_| "?".into());
            eprintln!("FAIL rank {r}: {e}");
            std::process::exit(1);
        }
    }
}

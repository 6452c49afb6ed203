//! railring: collective communication for every machine — all-reduce and friends over shared
//! memory inside a node and one TCP ring per rail between nodes, started by `railrun` (or srun,
//! torchrun-style variables, mpirun with the `mpi` feature).
//!
//! # A complete program
//!
//! ```
//! use railring::{Communicator, ReduceOp};
//!
//! fn main() -> Result<(), railring::Error> {
//!     // Join the job: railrun's environment, a Slurm step, torchrun-style variables, or
//!     // alone (a world of one, as when this example runs under `cargo test`).
//!     let comm = Communicator::init()?;
//!     let (rank, size) = (comm.rank(), comm.size());
//!
//!     // Every rank contributes rank + 1; every rank ends with the same sum.
//!     let mut grads = vec![(rank + 1) as f32; 1 << 16];
//!     comm.all_reduce(&mut grads, ReduceOp::Sum)?;
//!     assert!(grads.iter().all(|&g| g == (size * (size + 1) / 2) as f32));
//!     println!("rank {rank} of {size}: {}", grads[0]);
//!     Ok(())
//! }
//! ```
//!
//! Build it, then start it with railrun (`railrun -np 4 target/release/prog`, or across hosts
//! with `--hostfile`); `examples/hello` in the repository is this program as a crate to copy.
//!
//! # Collectives
//!
//! Every rank must make the same calls in the same order. In-place and out-of-place forms:
//!
//! ```
//! # use railring::{Communicator, ReduceOp};
//! # let comm = Communicator::init()?;
//! let n = comm.size();
//! let input: Vec<f64> = (0..8 * n).map(|i| i as f64).collect();
//! let mut sum = vec![0.0; input.len()];
//! comm.all_reduce_into(&input, &mut sum, ReduceOp::Sum)?;      // out of place
//! let mut mine = vec![0.0; 8];
//! comm.reduce_scatter(&input, &mut mine, ReduceOp::Max)?;       // block `rank` of the reduction
//! let mut all = vec![0.0; 8 * n];
//! comm.all_gather(&mine, &mut all)?;                            // every rank's block, in order
//! let mut b = [comm.rank() as u32; 4];
//! comm.broadcast(&mut b, 0)?;                                   // rank 0's values everywhere
//! assert_eq!(b, [0; 4]);
//! comm.barrier()?;
//! # Ok::<(), railring::Error>(())
//! ```
//!
//! Element types are those implementing [`Element`]: `i8`, `u8`, `i32`, `u32`, `i64`, `u64`,
//! `f32`, `f64` and [`half`]'s `f16` / `bf16` (re-exported here, so no version to match):
//!
//! ```
//! # use railring::{Communicator, ReduceOp};
//! use railring::half::bf16;
//! # let comm = Communicator::init()?;
//! let mut v = vec![bf16::from_f32(1.5); 100];
//! comm.all_reduce(&mut v, ReduceOp::Max)?;
//! assert_eq!(v[0], bf16::from_f32(1.5));
//! # Ok::<(), railring::Error>(())
//! ```
//!
//! # Non-blocking calls
//!
//! `*_start` takes an owned buffer and returns a [`Pending`]; the call runs on the
//! communicator's worker thread, in program order with every other call, and `wait` hands the
//! buffer back:
//!
//! ```
//! # use railring::{Communicator, ReduceOp};
//! # let comm = Communicator::init()?;
//! let pending = comm.all_reduce_start(vec![1i64; 1024], ReduceOp::Sum);
//! // ... compute something else meanwhile ...
//! let summed = pending.wait()?;
//! assert_eq!(summed[0], comm.size() as i64);
//! # Ok::<(), railring::Error>(())
//! ```
//!
//! # Sub-communicators
//!
//! [`Communicator::split`] works like `MPI_Comm_split`: ranks with the same color form a new
//! communicator, ordered by key; `None` takes part but gets none.
//!
//! ```
//! # use railring::{Communicator, ReduceOp};
//! # let comm = Communicator::init()?;
//! let half = comm.split(Some((comm.rank() % 2) as u32), 0)?.expect("a color was given");
//! let mut x = [1u32];
//! half.all_reduce(&mut x, ReduceOp::Sum)?;
//! assert_eq!(x[0] as usize, half.size());
//! # Ok::<(), railring::Error>(())
//! ```
//!
//! # Errors
//!
//! Every failure is an [`Error`] whose message says what failed, where (rank, host, peer) and
//! what to try. A rejected argument ([`Error::Invalid`]) leaves the communicator usable; any
//! other failure (a peer died, ranks made different calls, nothing moved for
//! `RAILRING_TIMEOUT` seconds) is reported on every rank and the communicator refuses further
//! calls. [`Error`] is `#[non_exhaustive]`: match the variants you handle and keep a `_` arm.
//!
//! ```
//! # use railring::{Communicator, Error, ReduceOp};
//! # let comm = Communicator::init()?;
//! let input = [1.0f32; 4];
//! let mut output = [0.0f32; 3];
//! match comm.all_reduce_into(&input, &mut output, ReduceOp::Sum) {
//!     Err(Error::Invalid(why)) => println!("bad arguments: {why}"),
//!     Err(Error::Mismatch { peer, theirs, .. }) => println!("rank {peer} called {theirs}"),
//!     Err(Error::Timeout { waiting, .. }) => println!("no word from ranks {waiting:?}"),
//!     Err(e) => return Err(e),
//!     Ok(()) => unreachable!("the lengths differ"),
//! }
//! # Ok::<(), railring::Error>(())
//! ```
//!
//! # What is public
//!
//! The API is what this page lists at the crate root: [`Communicator`] (with the untyped
//! `*_raw` forms for bindings and benchmarks), [`Pending`], [`Error`], [`Result`], [`DataType`],
//! [`Element`], [`ReduceOp`], [`half`], the plan vocabulary of [`Communicator::explain`] /
//! [`Communicator::plan_for`], and `device` (feature `cuda`). The modules below it are the
//! runtime's machinery: `railrun`, the benchmarks and the tests use them, so they are `pub`, but
//! they are hidden from these docs and may change in any release. Their design is in the
//! repository's ARCHITECTURE.md (layers, bottom up: `vars`, `machine`, `hostlist`, `store` →
//! `error` → `topology` → `config` → `bootstrap` → `transport` → `executor` → `comm`; each
//! imports only modules of lower layers, checked by `tests/tests/architecture.rs`).

// Hidden modules document their internals for developers (`cargo doc --document-private-items
// --all-features` renders them); links there may name private or feature-gated items, which the
// public build cannot resolve: hence the rustdoc allowances on three of them.
//
// Hidden: the launcher and the benchmarks use these; not a stable API (see "What is public").
#[doc(hidden)]
#[allow(rustdoc::broken_intra_doc_links, rustdoc::private_intra_doc_links)]
pub mod bootstrap;
// Hidden: Communicator and Pending are re-exported at the root; the rest is the call path.
#[doc(hidden)]
#[allow(rustdoc::broken_intra_doc_links, rustdoc::private_intra_doc_links)]
pub mod comm;
// Hidden: knobs are the RAILRING_* environment variables (README), not a Rust API.
#[doc(hidden)]
pub mod config;
pub mod error;
// Hidden: the executor runs plans for the communicator; internal.
#[doc(hidden)]
pub mod executor;
// Hidden: the Slurm hostlist grammar, shared with railrun.
#[doc(hidden)]
pub mod hostlist;
// Hidden: every knob's declaration (name, kind, default, range), shared with railrun.
#[doc(hidden)]
pub mod knobs;
// Hidden: this machine's identity, shared with railrun.
#[doc(hidden)]
pub mod machine;
// Hidden: private files in shared directories (segments, rank output), shared with railrun.
#[doc(hidden)]
pub mod private_fs;
// Hidden: the bootstrap store, served by railrun.
#[doc(hidden)]
pub mod store;
// Hidden: topology loaders and bindings behind `railrun topo`; users meet them as files and knobs.
#[doc(hidden)]
#[allow(rustdoc::broken_intra_doc_links, rustdoc::private_intra_doc_links)]
pub mod topology;
// Hidden: links and fabrics under the executor.
#[doc(hidden)]
pub mod transport;
// Hidden: environment variable names shared by railrun and the runtime.
#[doc(hidden)]
pub mod vars;

/// Collectives on device memory (feature `cuda`).
#[cfg(feature = "cuda")]
pub use comm::device;
pub use comm::{Communicator, Pending};
pub use error::{Error, Result};
/// The `half` crate (`f16`, `bf16`), re-exported so that users name the same types railring
/// implements [`Element`] for.
pub use half;
pub use railring_collectives::plan::{Algo, CollKind, Layout, Plan};
pub use railring_collectives::{DataType, Element, ReduceOp};

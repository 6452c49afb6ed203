//! Shared code of the examples: the nccl-tests-style benchmark driver behind `railperf`.

pub mod perf;
/// MPI as a benchmark backend (`mpiperf`); cargo feature `mpi`.
#[cfg(feature = "mpi")]
pub mod mpi_backend;

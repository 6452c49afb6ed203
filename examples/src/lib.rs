//! Shared code of the examples: the nccl-tests-style benchmark driver behind `railperf`, and
//! `railcompare`'s parts.

pub mod compare;

/// MPI as a benchmark backend (`mpiperf`); cargo feature `mpi`.
#[cfg(feature = "mpi")]
pub mod mpi_backend;
pub mod perf;

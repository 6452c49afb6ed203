//! Emulated cluster harness (network namespaces, real sshd, veth rails)
//! for railring's integration tests. See `tests/cluster/README.md`.

pub mod bins;
pub mod cluster;
pub mod proc;
pub mod slurm;

pub use cluster::{Cluster, ClusterSpec, UpOptions, HEAD};

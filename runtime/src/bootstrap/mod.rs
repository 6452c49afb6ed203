//! Bootstrap: how ranks of a job find each other. The launcher (or rank 0 under srun /
//! torchrun-style env) serves a key-value store; ranks publish their addresses in it.

pub mod auth;
pub mod launch_env;
#[cfg(feature = "mpi")]
pub mod mpi;
pub mod store;
pub mod wire;

pub use store::{Backend, Store, StoreClient, StoreError};

//! railring: collective communication for every machine.
//!
//! Modules, bottom up (each imports only modules left of it; see ARCHITECTURE.md and
//! `tests/tests/architecture.rs`): [`vars`], [`machine`], [`hostlist`], [`store`] → [`error`] →
//! [`topology`] → [`config`] → [`bootstrap`] → [`transport`] → [`executor`] → [`comm`].
pub mod bootstrap;
pub mod comm;
pub mod config;
pub mod error;
pub mod executor;
pub mod hostlist;
pub mod machine;
pub mod store;
pub mod topology;
pub mod transport;
pub mod vars;

/// Collectives on device memory (feature `cuda`).
#[cfg(feature = "cuda")]
pub use comm::device;
pub use comm::{Communicator, Pending};
pub use error::{Error, Result};
pub use railring_collectives::{DataType, Element, ReduceOp};

//! railring: collective communication for every machine.
//!
//! Modules, bottom up (each imports only the ones above it in this list; see ARCHITECTURE.md):
//! [`error`], [`machine`], [`hostlist`], [`store`] → [`config`] → [`topology`] → [`bootstrap`] →
//! [`transport`] → [`executor`] → [`comm`].
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

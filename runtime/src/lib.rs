//! railring: collective communication for every machine.
pub mod bootstrap;
pub mod config;
pub mod error;
pub mod host;
pub mod hostlist;
pub mod topology;
pub mod transport;
pub mod vars;

pub use error::{Error, Result};
pub mod comm;
#[cfg(feature = "cuda")]
pub mod comm_cuda;
pub mod executor;

pub use comm::{Communicator, Pending};
pub use railring_collectives::{DataType, Element, ReduceOp};

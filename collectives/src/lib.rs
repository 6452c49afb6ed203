//! Pure collective-communication logic: element types, reduction kernels, algorithm plans,
//! checking and the cost model. Nothing here touches sockets, processes or files.

pub mod dtype;
pub mod kernels;
pub mod plan;

pub use dtype::{as_bytes, as_bytes_mut, DataType, Element, ReduceOp};

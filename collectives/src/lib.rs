//! Pure collective-communication logic: element types, reduction kernels, algorithm plans,
//! checking and the cost model. Nothing here touches sockets, processes or files.

pub mod bruck;
pub mod build;
pub mod builder;
pub mod check;
pub mod cost;
pub mod dtype;
pub mod fabric;
pub mod fx;
pub mod kernels;
pub mod pairwise;
pub mod plan;
pub mod recursive_doubling;
pub mod ring;
#[cfg(test)]
mod testing;
pub mod tree;
pub mod two_level;

pub use build::{algorithms_for, build_plan};
pub use builder::PlanError;
pub use check::{check, CheckError};
pub use cost::{CostModel, LinkCost};
pub use dtype::{as_bytes, as_bytes_mut, DataType, Element, ReduceOp};
pub use plan::{split, Algo, Buf, CollKind, Layout, Plan, Region, Step, Xfer};

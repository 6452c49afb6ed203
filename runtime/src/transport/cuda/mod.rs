//! The GPU in-node fabric (cargo feature `cuda`): a [`NodeFabric`](super::NodeFabric) over
//! device memory ([`GpuFabric`]), so the executor runs the same plans on GPU buffers as on host
//! buffers.
//!
//! - Each local rank allocates a device **staging buffer** (two slots, like the shared-memory
//!   fabric's) with `cuMemAlloc`, exports it with `cuIpcGetMemHandle`, and publishes the handle
//!   and its device's PCI bus id through the bootstrap store ([`ipc`]). Every rank opens every
//!   peer's buffer with `cuIpcOpenMemHandle` (lazy peer access): same device (several ranks on
//!   one GPU: IPC within a device is allowed), or another device when `cuDeviceCanAccessPeer`
//!   says so (NVLink where present, PCIe P2P elsewhere).
//! - Per chunk, each rank copies its pieces into its slot, then **reduces its own piece by
//!   reading every peer's slot directly with one kernel** (`rr_reduce_*`, NVRTC-compiled, see
//!   [`kernels`]), then copies everyone's reduced pieces out. Ranks synchronise through flags in
//!   a small host shared-memory segment (spin, yield, sleep; peers' liveness and
//!   `RAILRING_TIMEOUT` checked like the CPU fabric). The host drives every step, so several
//!   processes sharing one GPU never spin inside kernels waiting for each other.
//! - Where direct access is impossible for any pair, every rank agrees (through the store) to
//!   **stage through pinned host memory** and run the CPU path instead; the reason is logged at
//!   INFO.
//!
//! Nothing here runs without `libcuda`: [`driver_present`] guards every entry point, and a
//! missing driver is a clean error, never a panic.
//!
//! Files: `driver.rs` (loading, errors, contexts), `launch.rs` (compiling and launching the
//! kernels of [`kernels`]), `pinned.rs` (page-locked host memory), `flags.rs` (the host flag
//! segment), `setup.rs` (what a set-up needs to know), `fabric.rs` (the fabric's set-up and its collectives), [`ipc`] (handles and the
//! agreement through the store), [`gdr`] (GPUDirect RDMA: device memory for network steps).

mod driver;
mod fabric;
mod flags;
pub mod gdr;
pub mod ipc;
pub mod kernels;
mod launch;
mod pinned;
mod setup;

pub use driver::{bus_id, context, cuda_err, driver_present, nvrtc_present, require_driver};
pub use fabric::{gpu_fabric, GpuFabric, GpuPath, DEFAULT_GPU_SLOT};
pub use flags::flags_path;
pub use launch::{launch_avg, launch_reduce, op_kernels, OpKernels};
pub use pinned::PinnedBuf;
pub use setup::FabricSetup;

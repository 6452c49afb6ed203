//! RDMA between nodes (cargo feature `rdma`): one RC queue pair per (peer, channel) on the HCA
//! of this rank's rail, driven by the same executor as TCP (an [`RdmaLink`] is a
//! [`Link`](super::Link): non-blocking `try_send` / `try_recv`, chunked by the ring slot size).
//!
//! - **Wire protocol**: RDMA WRITE WITH IMMEDIATE into the peer's receive ring, credits returned
//!   by RDMA-writing the receiver's consumed counter into the sender's mailbox. The logic lives
//!   in [`flow`], a pure state machine tested against an in-memory NIC model; `link.rs` only
//!   turns its decisions into verbs calls.
//! - **Connection**: each side creates its QP and rings, publishes [`ConnInfo`] (QP number,
//!   LID, GID, PSN, MTU, ring and mailbox address + rkey) in the bootstrap store, and finishes
//!   the RTR/RTS transitions when the peer's record appears. Data flows only after both sides
//!   announce RTR (so no write reaches a QP that is not ready). All of it is non-blocking: a
//!   link that is still connecting moves 0 bytes, and the executor's timeout names the peer.
//! - **GPUDirect RDMA**: a link made by [`RdmaNet::device_link`] keeps both rings in device
//!   memory ([`DeviceRings`], allocated by the CUDA side) registered with the HCA, so the NIC
//!   reads sent data from and writes received data to GPU memory; the link's memory-kind calls
//!   copy device buffers into and out of the rings on the GPU (after flushing the NIC's writes).
//!   Used for device collectives when the GPU–NIC path class is within
//!   `RAILRING_NET_GDR_LEVEL` (default PXB: [`gpudirect_at`]) on every rank and the HCA
//!   registers device memory (`nvidia-peermem`; dma-buf registration is not implemented);
//!   otherwise device data is staged through pinned host memory.
//! - **Registration cache**: [`MrCache`] keyed by (ptr, len), LRU-bounded, serving
//!   [`Link::register`](super::Link::register) (device memory only on GPUDirect links).
//! - **Selection** ([`select_net`]): `RAILRING_NET=ib|socket|auto` (default `auto`) and
//!   `RAILRING_IB_HCA` (NCCL grammar, [`hca`]). No usable device, or `ibverbs::devices()`
//!   failing (as it does without the kernel modules: `Unsupported, os error 38`), selects TCP
//!   with one INFO line; it is never fatal.
//!
//! Files: `select.rs` (the choice of network and GPUDirect), `mr_cache.rs`, `conn.rs` (the
//! connection records), `rings.rs` (rings and the data path verbs aside: [`DeviceRings`], slot
//! filling and draining), `verbs.rs` (opened HCAs, memory regions), `net.rs` ([`RdmaNet`], the endpoint), `link.rs`
//! ([`RdmaLink`]), [`flow`] and [`hca`].

mod conn;
pub mod flow;
pub mod hca;
mod link;
mod mr_cache;
mod net;
mod rings;
mod select;
mod verbs;

pub use conn::{conn_keys, ConnInfo};
pub use hca::HcaPort;
pub use link::RdmaLink;
pub use mr_cache::MrCache;
pub use net::RdmaNet;
pub use rings::{ring_bytes, DeviceRings};
pub use select::{
    gpu_nic_path, gpudirect_allowed, gpudirect_at, probe_hcas, select_net_from, select_net_with,
    NetChoice, NetSelection,
};
pub(crate) use select::{link_for, select_net};
pub use verbs::IbDev;

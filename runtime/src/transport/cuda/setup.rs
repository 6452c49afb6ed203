//! What setting up the GPU fabric needs to know about the communicator ([`FabricSetup`]),
//! shared by the fabric and its flag segment.

use super::ipc;
use crate::store::StoreClient;
use std::time::Duration;

/// What [`gpu_fabric`](super::gpu_fabric) needs to know about the communicator.
pub struct FabricSetup<'a> {
    pub store: &'a StoreClient,
    pub comm: u64,
    /// Distinguishes successive set-ups on one communicator (the call sequence number).
    pub epoch: u64,
    pub job: &'a str,
    pub host_id: &'a str,
    pub host: String,
    /// Communicator ranks on this node, in local order, and this rank's local index.
    pub local: &'a [usize],
    pub me: usize,
    pub timeout: Duration,
    /// `RAILRING_GPU_SLOT` as parsed by [`crate::config`] (`None`: unset or not a size).
    pub gpu_slot: Option<u64>,
    /// `CUDA_MPS_PIPE_DIRECTORY` as read by [`crate::config`].
    pub mps_pipe_dir: Option<&'a std::ffi::OsStr>,
    /// `RAILRING_TOPO_FILE`, for naming the links between GPUs in log lines.
    pub topo_file: Option<&'a std::path::Path>,
}

impl FabricSetup<'_> {
    /// Store key prefix of this node's set-up (nodes set up their fabrics side by side).
    pub(super) fn prefix(&self) -> String {
        format!(
            "{}/n{}",
            ipc::prefix(self.comm, self.epoch),
            self.local.first().copied().unwrap_or(0)
        )
    }
}

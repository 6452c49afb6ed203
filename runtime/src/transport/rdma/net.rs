//! This process's RDMA endpoint ([`RdmaNet`]): the opened HCA ports, and the links it makes
//! over them (host rings, or device rings for GPUDirect).

use super::hca::HcaPort;
use super::link::RdmaLink;
use super::rings::{ring_bytes, DeviceRings};
use super::verbs::IbDev;
use crate::store::StoreClient;
use crate::transport::LinkId;
use std::io;
use std::sync::Arc;

/// The RDMA endpoint of this process: the opened HCA ports (rail i uses port i mod n).
pub struct RdmaNet {
    devs: Vec<Arc<IbDev>>,
}

impl RdmaNet {
    /// Open `hcas`, using GID `gid_index` (`RAILRING_IB_GID_INDEX`, RoCE) on each port.
    pub fn open(hcas: &[HcaPort], gid_index: u8) -> io::Result<RdmaNet> {
        let mut devs = Vec::new();
        let mut errs = Vec::new();
        for h in hcas {
            match IbDev::open(h, gid_index) {
                Ok(d) => devs.push(Arc::new(d)),
                Err(e) => errs.push(e.to_string()),
            }
        }
        if devs.is_empty() {
            return Err(io::Error::new(io::ErrorKind::NotFound, errs.join("; ")));
        }
        Ok(RdmaNet { devs })
    }

    pub fn describe(&self) -> String {
        self.devs
            .iter()
            .map(|d| {
                format!(
                    "{}:{} ({})",
                    d.name,
                    d.port,
                    if d.roce { "RoCE" } else { "IB" }
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The HCA a rail's links use.
    pub fn hca_for_rail(&self, rail: usize) -> &str {
        &self.devs[rail % self.devs.len()].name
    }

    /// Whether the HCA of `rail` can register these device rings with `ibv_reg_mr` (GPUDirect
    /// RDMA through the `nvidia-peermem` kernel module): registers both, then deregisters.
    pub fn probe_device_rings(&self, rail: usize, rings: &dyn DeviceRings) -> io::Result<()> {
        let dev = &self.devs[rail % self.devs.len()];
        let (s, r) = rings.rings();
        for a in [s, r] {
            // SAFETY: the rings are live device memory of ring_bytes() bytes, deregistered at
            // once.
            let mr = unsafe { dev.reg(a as usize, ring_bytes()) }.map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("registering device memory with {}: {e}", dev.name),
                )
            })?;
            mr.dereg();
        }
        Ok(())
    }

    /// [`RdmaNet::link`] with its rings in device memory (GPUDirect RDMA): the link moves
    /// device memory only through the rings' copies, and the NIC reads and writes the rings.
    pub fn device_link(
        &self,
        store: Arc<StoreClient>,
        id: LinkId,
        rail: usize,
        rings: Box<dyn DeviceRings>,
    ) -> io::Result<RdmaLink> {
        let i = rail % self.devs.len();
        RdmaLink::create(self.devs[i].clone(), store, id, Some(rings))
    }

    /// Start a link to `peer` on channel `chan` (non-blocking: the connection completes inside
    /// `try_send` / `try_recv` once the peer's record is in the store).
    pub fn link(&self, store: Arc<StoreClient>, id: LinkId, rail: usize) -> io::Result<RdmaLink> {
        let i = rail % self.devs.len();
        RdmaLink::create(self.devs[i].clone(), store, id, None)
    }
}

//! Verbs, the hardware part (nothing here runs without an HCA): an opened HCA port with its
//! protection domain ([`IbDev`]), registered memory regions, and this process's RDMA endpoint
//! ([`RdmaNet`]) that makes the links.

use super::link::{LinkEnds, RdmaLink};
use super::rings::{ring_bytes, DeviceRings};
use super::select::HcaPort;
use crate::bootstrap::StoreClient;
pub(super) use ibverbs_sys as ffi;
use std::io;
use std::sync::Arc;

pub(super) fn last_err(what: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// An opened HCA port with its protection domain.
pub struct IbDev {
    pub name: String,
    pub port: u8,
    pub(super) ctx: *mut ffi::ibv_context,
    pub(super) pd: *mut ffi::ibv_pd,
    pub(super) lid: u16,
    pub(super) mtu: u32,
    pub(super) gid: [u8; 16],
    pub(super) gid_index: u8,
    pub(super) roce: bool,
}

// SAFETY: libibverbs objects are thread safe (verbs API guarantee); the pointers are owned here
// and freed only in Drop.
unsafe impl Send for IbDev {}
unsafe impl Sync for IbDev {}

impl Drop for IbDev {
    fn drop(&mut self) {
        // SAFETY: created in open(); every QP/MR using the PD holds an Arc<IbDev>, so they are
        // gone. Errors are ignored (nothing to do about them at teardown, and no panics).
        unsafe {
            ffi::ibv_dealloc_pd(self.pd);
            ffi::ibv_close_device(self.ctx);
        }
    }
}

impl IbDev {
    fn open(hca: &HcaPort) -> io::Result<IbDev> {
        let gid_index: u8 = std::env::var("RAILRING_IB_GID_INDEX")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        // SAFETY: the device list is freed before returning; ctx/pd are checked for null.
        unsafe {
            let mut n = 0i32;
            let list = ffi::ibv_get_device_list(&mut n);
            if list.is_null() {
                return Err(last_err("ibv_get_device_list"));
            }
            let mut dev = std::ptr::null_mut();
            for i in 0..n.max(0) as usize {
                let d = *list.add(i);
                let name = ffi::ibv_get_device_name(d);
                if !name.is_null() && std::ffi::CStr::from_ptr(name).to_string_lossy() == hca.device
                {
                    dev = d;
                    break;
                }
            }
            let ctx = if dev.is_null() {
                std::ptr::null_mut()
            } else {
                ffi::ibv_open_device(dev)
            };
            ffi::ibv_free_device_list(list);
            if ctx.is_null() {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("cannot open RDMA device {}", hca.device),
                ));
            }
            let mut pa = ffi::ibv_port_attr::default();
            let rc =
                ffi::ibv_query_port(ctx, hca.port, &mut pa as *mut ffi::ibv_port_attr as *mut _);
            if rc != 0 || pa.state != ffi::ibv_port_state::IBV_PORT_ACTIVE {
                ffi::ibv_close_device(ctx);
                return Err(io::Error::other(format!(
                    "{} port {} is not active",
                    hca.device, hca.port
                )));
            }
            let mut gid = ffi::ibv_gid::default();
            let roce = pa.link_layer == ffi::IBV_LINK_LAYER_ETHERNET as u8;
            if ffi::ibv_query_gid(ctx, hca.port, gid_index as i32, &mut gid) != 0 {
                ffi::ibv_close_device(ctx);
                return Err(last_err("ibv_query_gid"));
            }
            let pd = ffi::ibv_alloc_pd(ctx);
            if pd.is_null() {
                ffi::ibv_close_device(ctx);
                return Err(last_err("ibv_alloc_pd"));
            }
            Ok(IbDev {
                name: hca.device.clone(),
                port: hca.port,
                ctx,
                pd,
                lid: pa.lid,
                mtu: pa.active_mtu,
                gid: gid.raw,
                gid_index,
                roce,
            })
        }
    }

    /// Register `[ptr, ptr+len)` (host or, with GPUDirect, device memory) for local and remote
    /// write.
    ///
    /// # Safety
    /// The memory must stay valid until the registration is deregistered.
    pub(super) unsafe fn reg(&self, ptr: usize, len: usize) -> io::Result<Mr> {
        let access = ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
            | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE;
        let mr = ffi::ibv_reg_mr(self.pd, ptr as *mut _, len, access.0 as i32);
        if mr.is_null() {
            return Err(last_err("ibv_reg_mr"));
        }
        Ok(Mr(mr))
    }
}

/// A registered memory region (deregistered explicitly: several owners may share the handle).
#[derive(Clone, Copy)]
pub(super) struct Mr(*mut ffi::ibv_mr);

// SAFETY: an ibv_mr is an immutable description once registered.
unsafe impl Send for Mr {}

impl Mr {
    pub(super) fn lkey(&self) -> u32 {
        // SAFETY: non-null from ibv_reg_mr, alive until dereg.
        unsafe { (*self.0).lkey }
    }
    pub(super) fn rkey(&self) -> u32 {
        // SAFETY: as above.
        unsafe { (*self.0).rkey }
    }
    pub(super) fn dereg(self) {
        // SAFETY: registered by IbDev::reg and deregistered once (owners drop their copy).
        unsafe {
            ffi::ibv_dereg_mr(self.0);
        }
    }
}

/// The RDMA endpoint of this process: the opened HCA ports (rail i uses port i mod n).
pub struct RdmaNet {
    devs: Vec<Arc<IbDev>>,
}

impl RdmaNet {
    pub fn open(hcas: &[HcaPort]) -> io::Result<RdmaNet> {
        let mut devs = Vec::new();
        let mut errs = Vec::new();
        for h in hcas {
            match IbDev::open(h) {
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
    #[allow(clippy::too_many_arguments)]
    pub fn device_link(
        &self,
        store: Arc<StoreClient>,
        comm: u64,
        me: usize,
        peer: usize,
        chan: usize,
        rail: usize,
        rings: Box<dyn DeviceRings>,
    ) -> io::Result<RdmaLink> {
        let i = rail % self.devs.len();
        let ends = LinkEnds {
            comm,
            me,
            peer,
            chan,
        };
        RdmaLink::create(self.devs[i].clone(), store, ends, Some(rings))
    }

    /// Start a link to `peer` on channel `chan` (non-blocking: the connection completes inside
    /// `try_send` / `try_recv` once the peer's record is in the store).
    pub fn link(
        &self,
        store: Arc<StoreClient>,
        comm: u64,
        me: usize,
        peer: usize,
        chan: usize,
        rail: usize,
    ) -> io::Result<RdmaLink> {
        let i = rail % self.devs.len();
        let ends = LinkEnds {
            comm,
            me,
            peer,
            chan,
        };
        RdmaLink::create(self.devs[i].clone(), store, ends, None)
    }
}

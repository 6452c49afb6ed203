//! Verbs, the hardware part (nothing here runs without an HCA): an opened HCA port with its
//! protection domain ([`IbDev`]) and registered memory regions.

use super::hca::HcaPort;
pub(super) use ibverbs_sys as ffi;
use std::io;

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
    pub(super) fn open(hca: &HcaPort, gid_index: u8) -> io::Result<IbDev> {
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

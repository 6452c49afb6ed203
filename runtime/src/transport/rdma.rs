//! RDMA between nodes (cargo feature `rdma`): one RC queue pair per (peer, channel) on the HCA
//! of this rank's rail, driven by the same executor as TCP (an [`RdmaLink`] is a [`Link`]:
//! non-blocking `try_send` / `try_recv`, chunked by the ring slot size).
//!
//! - **Wire protocol**: RDMA WRITE WITH IMMEDIATE into the peer's receive ring, credits returned
//!   by RDMA-writing the receiver's consumed counter into the sender's mailbox. The logic lives
//!   in [`flow`], a pure state machine tested against an in-memory NIC model; this file only
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
//!   [`Link::register`] (device memory only on GPUDirect links).
//! - **Selection** ([`select_net`]): `RAILRING_NET=ib|socket|auto` (default `auto`) and
//!   `RAILRING_IB_HCA` (NCCL grammar, [`hca`]). No usable device, or `ibverbs::devices()`
//!   failing (as it does without the kernel modules: `Unsupported, os error 38`), selects TCP
//!   with one INFO line; it is never fatal.

pub mod flow;
pub mod hca;

use super::{Link, LinkError, MemKind, Registration};
use crate::bootstrap::StoreClient;
use crate::error::{Error, Result};
use crate::topology::PathClass;
use flow::{Flow, FlowConfig, WrKind};
use hca::HcaFilter;
use serde::{Deserialize, Serialize};
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------------
// Selection (pure; the verbs probe is injected so tests need no hardware)
// ---------------------------------------------------------------------------------------------

/// `RAILRING_NET`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NetChoice {
    /// RDMA when a usable HCA exists, else TCP.
    Auto,
    /// RDMA requested: still falls back to TCP (with an INFO line) when no HCA is usable.
    Ib,
    /// TCP only.
    Socket,
}

impl NetChoice {
    pub fn parse(s: &str) -> Option<NetChoice> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Some(NetChoice::Auto),
            "ib" | "rdma" | "verbs" => Some(NetChoice::Ib),
            "socket" | "tcp" => Some(NetChoice::Socket),
            _ => None,
        }
    }
}

/// One usable HCA port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HcaPort {
    pub device: String,
    pub port: u8,
}

/// What [`select_net_with`] decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NetSelection {
    Ib(Vec<HcaPort>),
    /// TCP, and why (None when `RAILRING_NET=socket` asked for it).
    Socket(Option<String>),
}

/// Decide between RDMA and TCP. `probe` lists active HCA ports (an `Err` is what
/// `ibverbs::devices()` returns without RDMA support). Falling back logs one INFO line.
pub fn select_net_with(
    choice: NetChoice,
    filter: Option<&HcaFilter>,
    probe: impl FnOnce() -> io::Result<Vec<HcaPort>>,
) -> NetSelection {
    if choice == NetChoice::Socket {
        return NetSelection::Socket(None);
    }
    let why = match probe() {
        Err(e) => format!("no RDMA support ({e})"),
        Ok(all) if all.is_empty() => "no RDMA device with an active port".to_string(),
        Ok(all) => {
            let chosen: Vec<HcaPort> = all
                .iter()
                .filter(|h| filter.is_none_or(|f| f.matches(&h.device, h.port)))
                .cloned()
                .collect();
            if !chosen.is_empty() {
                return NetSelection::Ib(chosen);
            }
            format!(
                "RAILRING_IB_HCA={} matches none of {}",
                filter.map(|f| f.to_string()).unwrap_or_default(),
                all.iter()
                    .map(|h| format!("{}:{}", h.device, h.port))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }
    };
    let asked = match choice {
        NetChoice::Ib => "RAILRING_NET=ib, but ",
        _ => "",
    };
    tracing::info!(target: "railring::net", "{asked}{why}: using TCP sockets");
    NetSelection::Socket(Some(why))
}

/// Read `RAILRING_NET` / `RAILRING_IB_HCA` and probe the machine. Bad values are errors naming
/// the variable; a missing device is not an error (TCP is selected).
pub fn select_net_from_env() -> Result<NetSelection> {
    let var = |n: &str| std::env::var(n).ok().filter(|v| !v.trim().is_empty());
    let choice = match var("RAILRING_NET") {
        None => NetChoice::Auto,
        Some(v) => NetChoice::parse(&v).ok_or_else(|| Error::Env {
            var: "RAILRING_NET".into(),
            value: v.clone(),
            why: "expected ib, socket or auto".into(),
        })?,
    };
    let filter = match var("RAILRING_IB_HCA") {
        None => None,
        Some(v) => Some(HcaFilter::parse(&v).map_err(|e| Error::Env {
            var: "RAILRING_IB_HCA".into(),
            value: v.clone(),
            why: e.to_string(),
        })?),
    };
    Ok(select_net_with(choice, filter.as_ref(), probe_hcas))
}

/// The hook for the communicator: `Ok(Some(net))` to use RDMA links between nodes, `Ok(None)`
/// for TCP. Opening the chosen devices failing also falls back to TCP with an INFO line. The
/// devices are opened once per process (sub-communicators share them); bad `RAILRING_NET` /
/// `RAILRING_IB_HCA` values are errors every time.
pub(crate) fn select_net(rank: usize) -> Result<Option<Arc<RdmaNet>>> {
    static NET: std::sync::Mutex<Option<Option<Arc<RdmaNet>>>> = std::sync::Mutex::new(None);
    let sel = select_net_from_env()?;
    let mut cached = NET.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(n) = cached.as_ref() {
        return Ok(n.clone());
    }
    let net = match sel {
        NetSelection::Socket(_) => None,
        NetSelection::Ib(hcas) => match RdmaNet::open(&hcas) {
            Ok(n) => {
                tracing::info!(target: "railring::net", rank, "RDMA over {}", n.describe());
                Some(Arc::new(n))
            }
            Err(e) => {
                tracing::info!(target: "railring::net", rank, "opening RDMA devices failed ({e}): using TCP sockets");
                None
            }
        },
    };
    *cached = Some(net.clone());
    Ok(net)
}

/// The link `LinkTable::link` uses for a network peer when RDMA was selected (`Ok(None)`: use
/// TCP). Errors name the peer and channel.
#[allow(clippy::too_many_arguments)]
pub(crate) fn link_for(
    net: Option<&Arc<RdmaNet>>,
    store: Option<&Arc<StoreClient>>,
    comm: u64,
    me: usize,
    peer: usize,
    chan: usize,
    rail: usize,
) -> Result<Option<Box<dyn Link>>> {
    let (Some(net), Some(store)) = (net, store) else {
        return Ok(None);
    };
    let l = net
        .link(store.clone(), comm, me, peer, chan, rail)
        .map_err(|e| Error::Transport {
            rank: me,
            what: format!("RDMA link to rank {peer} (channel {chan})"),
            err: e,
        })?;
    Ok(Some(Box::new(l)))
}

/// Active HCA ports on this machine, through `ibverbs::devices()`. Never panics: a device that
/// cannot be opened, or whose port 1 is not active, is skipped.
pub fn probe_hcas() -> io::Result<Vec<HcaPort>> {
    let list = ibverbs::devices()?;
    let mut out = Vec::new();
    for dev in list.iter() {
        let Some(name) = dev.name().map(|n| n.to_string_lossy().into_owned()) else {
            continue;
        };
        // ibverbs 0.9 opens port 1 and fails unless it is ACTIVE or ARMED.
        match dev.open() {
            Ok(_) => out.push(HcaPort {
                device: name,
                port: 1,
            }),
            Err(e) => {
                tracing::debug!(target: "railring::net", "RDMA device {name} skipped: {e}")
            }
        }
    }
    Ok(out)
}

/// Whether device memory may be registered with the NIC directly (GPUDirect RDMA): only when
/// the GPU and the NIC share a PCIe switch (PIX: one switch, PXB: several). Through the host
/// bridge or across CPUs it is slower than staging through host memory, or unsupported.
pub fn gpudirect_allowed(path: Option<PathClass>) -> bool {
    gpudirect_at(path, Some(PathClass::Pxb))
}

/// GPUDirect RDMA at `level` (`RAILRING_NET_GDR_LEVEL`, [`crate::config::parse_gdr_level`]) for a GPU–NIC `path` (`None`:
/// unknown, never; `X` / `NV#` are not GPU–NIC paths and never qualify either).
pub fn gpudirect_at(path: Option<PathClass>, level: Option<PathClass>) -> bool {
    match (path, level) {
        (Some(p), Some(l)) => p >= PathClass::Pix && p <= l,
        _ => false,
    }
}

/// The GPU–NIC path class from the topology (`None` when either device is unknown).
pub fn gpu_nic_path(
    topo: &crate::topology::Topology,
    gpu_busid: &str,
    nic_name: &str,
) -> Option<PathClass> {
    let norm = |s: &str| s.trim().to_ascii_lowercase();
    let g = topo.gpus.iter().position(|g| {
        g.busid.as_deref().is_some_and(|b| {
            norm(b).ends_with(&norm(gpu_busid)) || norm(gpu_busid).ends_with(&norm(b))
        })
    })?;
    let n = topo.nics.iter().position(|n| n.matches(nic_name))?;
    Some(topo.path_class(
        crate::topology::DeviceId::Gpu(g),
        crate::topology::DeviceId::Nic(n),
    ))
}

// ---------------------------------------------------------------------------------------------
// Registration cache (pure over the registration handle type)
// ---------------------------------------------------------------------------------------------

/// A cache of memory registrations keyed by (ptr, len): a request inside an existing
/// registration reuses it; the least recently used entry is deregistered when full.
///
/// Registrations are not invalidated when memory is freed (verbs offers no hook): owners of
/// buffers that are freed and reallocated call [`MrCache::invalidate`].
pub struct MrCache<H> {
    entries: Vec<MrEntry<H>>,
    cap: usize,
    tick: u64,
    pub hits: u64,
    pub misses: u64,
}

struct MrEntry<H> {
    ptr: usize,
    len: usize,
    mem: MemKind,
    handle: H,
    used: u64,
}

impl<H: Clone> MrCache<H> {
    pub fn new(cap: usize) -> MrCache<H> {
        MrCache {
            entries: Vec::new(),
            cap: cap.max(1),
            tick: 0,
            hits: 0,
            misses: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The registration covering `[ptr, ptr+len)` of kind `mem`, registering it with `reg` on a
    /// miss (evicting with `dereg` when full).
    pub fn get_or_register(
        &mut self,
        ptr: usize,
        len: usize,
        mem: MemKind,
        reg: impl FnOnce(usize, usize) -> io::Result<H>,
        mut dereg: impl FnMut(H),
    ) -> io::Result<H> {
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "cannot register an empty buffer",
            ));
        }
        let end = ptr
            .checked_add(len)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "buffer wraps around"))?;
        self.tick += 1;
        if let Some(e) = self
            .entries
            .iter_mut()
            .find(|e| e.mem == mem && e.ptr <= ptr && end <= e.ptr + e.len)
        {
            e.used = self.tick;
            self.hits += 1;
            return Ok(e.handle.clone());
        }
        self.misses += 1;
        let handle = reg(ptr, len)?;
        if self.entries.len() >= self.cap {
            if let Some((i, _)) = self.entries.iter().enumerate().min_by_key(|(_, e)| e.used) {
                dereg(self.entries.swap_remove(i).handle);
            }
        }
        self.entries.push(MrEntry {
            ptr,
            len,
            mem,
            handle: handle.clone(),
            used: self.tick,
        });
        Ok(handle)
    }

    /// Drop every registration overlapping `[ptr, ptr+len)`.
    pub fn invalidate(&mut self, ptr: usize, len: usize, mut dereg: impl FnMut(H)) {
        let end = ptr.saturating_add(len);
        let mut i = 0;
        while i < self.entries.len() {
            let e = &self.entries[i];
            if e.ptr < end && ptr < e.ptr + e.len {
                dereg(self.entries.swap_remove(i).handle);
            } else {
                i += 1;
            }
        }
    }

    /// Remove everything (deregistering through `dereg`).
    pub fn clear(&mut self, mut dereg: impl FnMut(H)) {
        for e in self.entries.drain(..) {
            dereg(e.handle);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Connection records (exchanged through the bootstrap store)
// ---------------------------------------------------------------------------------------------

/// What each side of a link publishes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnInfo {
    pub qpn: u32,
    pub lid: u16,
    /// GID as 32 hex digits (all zero on InfiniBand without routing).
    pub gid: String,
    pub psn: u32,
    /// `ibv_mtu` enum value of the active MTU.
    pub mtu: u32,
    pub ring_addr: u64,
    pub ring_rkey: u32,
    pub mailbox_addr: u64,
    pub mailbox_rkey: u32,
    pub slots: u32,
    pub slot_bytes: u32,
}

impl ConnInfo {
    pub fn gid_bytes(&self) -> Option<[u8; 16]> {
        let s = self.gid.trim();
        if s.len() != 32 {
            return None;
        }
        let mut g = [0u8; 16];
        for (i, b) in g.iter_mut().enumerate() {
            *b = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(g)
    }

    pub fn gid_hex(g: &[u8; 16]) -> String {
        g.iter().map(|b| format!("{b:02x}")).collect()
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    pub fn decode(b: &[u8]) -> io::Result<ConnInfo> {
        let c: ConnInfo = serde_json::from_slice(b).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("bad RDMA connection record: {e}"),
            )
        })?;
        if c.gid_bytes().is_none() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("bad GID {:?} in RDMA connection record", c.gid),
            ));
        }
        Ok(c)
    }
}

/// Store keys of the record `from` publishes for `to` on channel `chan`, and its "RTR" flag.
pub fn conn_keys(comm: u64, chan: usize, from: usize, to: usize) -> (String, String) {
    let k = format!("c{comm:x}/ib/{chan}/{from}-{to}");
    let r = format!("{k}/rtr");
    (k, r)
}

// ---------------------------------------------------------------------------------------------
// GPUDirect rings (the CUDA side implements the trait; this file makes no CUDA calls)
// ---------------------------------------------------------------------------------------------

/// Device memory holding a GPUDirect link's two rings (send staging and receive), each
/// [`ring_bytes`] long, and the copies in and out of them. The NIC reads the send ring and
/// writes the receive ring in device memory directly, so device data never passes through host
/// memory; the CUDA implementation is `transport::cuda::CudaRings`.
pub trait DeviceRings: Send {
    /// CUDA ordinal of the device the rings are on.
    fn ordinal(&self) -> i32;
    /// Device addresses of the send and the receive ring.
    fn rings(&self) -> (u64, u64);
    /// Copy each `(dst, src, len)` (host or device addresses: unified addressing) and wait until
    /// all are done.
    ///
    /// # Safety
    /// Every range valid for its access on its side.
    unsafe fn copy(&mut self, list: &[(u64, u64, usize)]) -> io::Result<()>;
    /// Make the NIC's completed writes into device memory visible to the device's next reads
    /// (`cuFlushGPUDirectRDMAWrites`).
    fn flush_nic_writes(&mut self) -> io::Result<()>;
}

/// Bytes of each ring of a link (device rings are allocated this size).
pub fn ring_bytes() -> usize {
    DEFAULT_SLOTS as usize * DEFAULT_SLOT_BYTES as usize
}

/// Where a link's rings live.
enum Rings {
    Host { send: Vec<u8>, recv: Vec<u8> },
    Device(Box<dyn DeviceRings>),
}

impl Rings {
    fn addrs(&self) -> (u64, u64) {
        match self {
            Rings::Host { send, recv } => (send.as_ptr() as u64, recv.as_ptr() as u64),
            Rings::Device(d) => d.rings(),
        }
    }
}

/// The sending half of a link's data path, verbs aside: take ring slots for up to `len` bytes
/// of `src` and fill them — host rings with plain copies, device rings with one batch of
/// device copies that has finished when this returns (the NIC reads the slots next). Returns
/// the writes to post and the bytes taken. `Err`: the link is broken.
///
/// # Safety
/// `src` valid for reads of `len` bytes of a kind the rings can copy from; `rings` sized for
/// `flow`'s configuration.
unsafe fn fill_slots(
    flow: &mut Flow,
    rings: &mut Rings,
    src: *const u8,
    len: usize,
) -> std::result::Result<(Vec<flow::DataPost>, usize), String> {
    let mut posts = Vec::new();
    let mut list = Vec::new();
    let (send_base, _) = rings.addrs();
    let mut off = 0;
    while off < len && flow.can_send() {
        let n = (len - off).min(flow.config().slot_bytes as usize);
        let p = flow.post_data(n).map_err(|e| e.to_string())?;
        match rings {
            // The slot lies inside the ring (flow checks lengths against the slot size).
            Rings::Host { send, .. } => {
                std::ptr::copy_nonoverlapping(src.add(off), send.as_mut_ptr().add(p.local_off), n)
            }
            Rings::Device(_) => list.push((
                send_base + p.local_off as u64,
                (src as u64).wrapping_add(off as u64),
                n,
            )),
        }
        posts.push(p);
        off += n;
    }
    if let (Rings::Device(d), false) = (rings, list.is_empty()) {
        d.copy(&list)
            .map_err(|e| format!("staging into the send ring: {e}"))?;
    }
    Ok((posts, off))
}

/// The receiving half: hand out up to `len` bytes into `dst`, in sequence. Device rings: flush
/// the NIC's writes, then copy everything in one batch that has finished when this returns.
/// Either way every byte handed out is in `dst` on return, so the caller may report credit
/// (and the sender overwrite the slots) afterwards — never before. `Err`: the link is broken.
///
/// # Safety
/// `dst` valid for writes of `len` bytes of a kind the rings can copy to; `rings` sized for
/// `flow`'s configuration.
unsafe fn drain_slots(
    flow: &mut Flow,
    rings: &mut Rings,
    dst: *mut u8,
    len: usize,
) -> std::result::Result<usize, String> {
    let (_, recv_base) = rings.addrs();
    let mut got = 0;
    let mut list = Vec::new();
    while got < len {
        let Some((off, avail)) = flow.readable() else {
            break;
        };
        let n = avail.min(len - got);
        match rings {
            // flow hands out ranges inside the ring
            Rings::Host { recv, .. } => {
                std::ptr::copy_nonoverlapping(recv.as_ptr().add(off), dst.add(got), n)
            }
            Rings::Device(_) => list.push((
                (dst as u64).wrapping_add(got as u64),
                recv_base + off as u64,
                n,
            )),
        }
        flow.consume(n).map_err(|e| e.to_string())?;
        got += n;
    }
    if let (Rings::Device(d), false) = (rings, list.is_empty()) {
        d.flush_nic_writes()
            .and_then(|_| d.copy(&list))
            .map_err(|e| format!("copying out of the receive ring: {e}"))?;
    }
    Ok(got)
}

// ---------------------------------------------------------------------------------------------
// Verbs (hardware; nothing below runs without an HCA)
// ---------------------------------------------------------------------------------------------

use ibverbs_sys as ffi;

/// Slot size and count of each link's rings (`RAILRING_NET_CHUNK` sized slots are the TCP
/// equivalent; 8 slots keep several chunks in flight).
const DEFAULT_SLOTS: u32 = 8;
const DEFAULT_SLOT_BYTES: u32 = 512 << 10;

fn last_err(what: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// An opened HCA port with its protection domain.
pub struct IbDev {
    pub name: String,
    pub port: u8,
    ctx: *mut ffi::ibv_context,
    pd: *mut ffi::ibv_pd,
    lid: u16,
    mtu: u32,
    gid: [u8; 16],
    gid_index: u8,
    roce: bool,
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
    unsafe fn reg(&self, ptr: usize, len: usize) -> io::Result<Mr> {
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
struct Mr(*mut ffi::ibv_mr);

// SAFETY: an ibv_mr is an immutable description once registered.
unsafe impl Send for Mr {}

impl Mr {
    fn lkey(&self) -> u32 {
        // SAFETY: non-null from ibv_reg_mr, alive until dereg.
        unsafe { (*self.0).lkey }
    }
    fn rkey(&self) -> u32 {
        // SAFETY: as above.
        unsafe { (*self.0).rkey }
    }
    fn dereg(self) {
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
        RdmaLink::create(
            self.devs[i].clone(),
            store,
            comm,
            me,
            peer,
            chan,
            Some(rings),
        )
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
        RdmaLink::create(self.devs[i].clone(), store, comm, me, peer, chan, None)
    }
}

enum Conn {
    /// Our record is published; waiting for the peer's.
    WaitPeer,
    /// RTR/RTS done; waiting for the peer to say it is RTR too.
    WaitReady(ConnInfo),
    Up(ConnInfo),
}

/// An RC queue pair to one peer with its rings (see the module docs).
pub struct RdmaLink {
    dev: Arc<IbDev>,
    cq: *mut ffi::ibv_cq,
    qp: *mut ffi::ibv_qp,
    rings: Rings,
    /// [0]: mailbox the peer writes its consumed count into; [1]: source of our reports.
    mbox: Box<[u64; 2]>,
    send_mr: Mr,
    recv_mr: Mr,
    mbox_mr: Mr,
    flow: Flow,
    conn: Conn,
    psn: u32,
    store: Arc<StoreClient>,
    peer_keys: (String, String),
    my_rtr_key: String,
    last_check: Instant,
    cache: MrCache<Mr>,
    sent: u64,
    desc: String,
    broken: Option<String>,
}

// SAFETY: the verbs objects are owned by the link and used from one thread at a time (&mut).
unsafe impl Send for RdmaLink {}

impl Drop for RdmaLink {
    fn drop(&mut self) {
        // SAFETY: objects created in create(); destroyed once, QP before CQ, MRs after the QP.
        unsafe {
            ffi::ibv_destroy_qp(self.qp);
            ffi::ibv_destroy_cq(self.cq);
        }
        self.send_mr.dereg();
        self.recv_mr.dereg();
        self.mbox_mr.dereg();
        self.cache.clear(Mr::dereg);
    }
}

impl RdmaLink {
    #[allow(clippy::too_many_arguments)]
    fn create(
        dev: Arc<IbDev>,
        store: Arc<StoreClient>,
        comm: u64,
        me: usize,
        peer: usize,
        chan: usize,
        device_rings: Option<Box<dyn DeviceRings>>,
    ) -> io::Result<RdmaLink> {
        let cfg = FlowConfig::new(DEFAULT_SLOTS, DEFAULT_SLOT_BYTES, 2 * DEFAULT_SLOTS + 4)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        let ring = cfg.slots as usize * cfg.slot_bytes as usize;
        let rings = match device_rings {
            Some(d) => Rings::Device(d),
            None => Rings::Host {
                send: vec![0u8; ring],
                recv: vec![0u8; ring],
            },
        };
        let (send_addr, recv_addr) = rings.addrs();
        let mut mbox = Box::new([0u64; 2]);
        // SAFETY: verbs calls on a live context/PD; every pointer is checked; the buffers are
        // owned by the link and outlive their registrations (deregistered in Drop).
        unsafe {
            let cq = ffi::ibv_create_cq(
                dev.ctx,
                (cfg.sq_depth + cfg.slots) as i32 * 2,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            );
            if cq.is_null() {
                return Err(last_err("ibv_create_cq"));
            }
            let mut init = ffi::ibv_qp_init_attr {
                qp_context: std::ptr::null_mut(),
                send_cq: cq,
                recv_cq: cq,
                srq: std::ptr::null_mut(),
                cap: ffi::ibv_qp_cap {
                    max_send_wr: cfg.sq_depth,
                    max_recv_wr: cfg.slots,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                qp_type: ffi::ibv_qp_type::IBV_QPT_RC,
                sq_sig_all: 1,
            };
            let qp = ffi::ibv_create_qp(dev.pd, &mut init);
            if qp.is_null() {
                let e = last_err("ibv_create_qp");
                ffi::ibv_destroy_cq(cq);
                return Err(e);
            }
            let cleanup = |e: io::Error| {
                ffi::ibv_destroy_qp(qp);
                ffi::ibv_destroy_cq(cq);
                e
            };
            let send_mr = dev.reg(send_addr as usize, ring).map_err(cleanup)?;
            let recv_mr = match dev.reg(recv_addr as usize, ring) {
                Ok(m) => m,
                Err(e) => {
                    send_mr.dereg();
                    return Err(cleanup(e));
                }
            };
            let mbox_mr = match dev.reg(mbox.as_mut_ptr() as usize, 16) {
                Ok(m) => m,
                Err(e) => {
                    send_mr.dereg();
                    recv_mr.dereg();
                    return Err(cleanup(e));
                }
            };
            let psn = (std::process::id() ^ (me as u32).wrapping_mul(2654435761) ^ chan as u32)
                & 0xff_ffff;
            let mut link = RdmaLink {
                desc: format!(
                    "rdma {}:{} -> rank {peer} (channel {chan}{})",
                    dev.name,
                    dev.port,
                    if matches!(rings, Rings::Device(_)) {
                        ", GPUDirect"
                    } else {
                        ""
                    }
                ),
                dev,
                cq,
                qp,
                rings,
                mbox,
                send_mr,
                recv_mr,
                mbox_mr,
                flow: Flow::new(cfg),
                conn: Conn::WaitPeer,
                psn,
                peer_keys: conn_keys(comm, chan, peer, me),
                my_rtr_key: conn_keys(comm, chan, me, peer).1,
                store,
                last_check: Instant::now() - Duration::from_secs(1),
                cache: MrCache::new(64),
                sent: 0,
                broken: None,
            };
            link.to_init()?;
            link.post_recvs()?;
            let info = ConnInfo {
                qpn: (*qp).qp_num,
                lid: link.dev.lid,
                gid: ConnInfo::gid_hex(&link.dev.gid),
                psn,
                mtu: link.dev.mtu,
                ring_addr: recv_addr,
                ring_rkey: link.recv_mr.rkey(),
                mailbox_addr: link.mbox.as_ptr() as u64,
                mailbox_rkey: link.mbox_mr.rkey(),
                slots: cfg.slots,
                slot_bytes: cfg.slot_bytes,
            };
            let (my_key, _) = conn_keys(comm, chan, me, peer);
            link.store
                .set(&my_key, &info.encode())
                .map_err(|e| io::Error::other(e.to_string()))?;
            Ok(link)
        }
    }

    fn modify(
        &self,
        attr: &mut ffi::ibv_qp_attr,
        mask: ffi::ibv_qp_attr_mask,
        what: &str,
    ) -> io::Result<()> {
        // SAFETY: qp is live; attr is a valid struct for the fields named in mask.
        let rc = unsafe { ffi::ibv_modify_qp(self.qp, attr, mask.0 as i32) };
        if rc != 0 {
            return Err(io::Error::new(
                io::Error::from_raw_os_error(rc).kind(),
                format!(
                    "ibv_modify_qp to {what}: {}",
                    io::Error::from_raw_os_error(rc)
                ),
            ));
        }
        Ok(())
    }

    fn to_init(&self) -> io::Result<()> {
        use ffi::ibv_qp_attr_mask as M;
        let mut a = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_INIT,
            pkey_index: 0,
            port_num: self.dev.port,
            qp_access_flags: (ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
                | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE)
                .0,
            ..Default::default()
        };
        self.modify(
            &mut a,
            M::IBV_QP_STATE | M::IBV_QP_PKEY_INDEX | M::IBV_QP_PORT | M::IBV_QP_ACCESS_FLAGS,
            "INIT",
        )
    }

    fn to_rtr_rts(&self, r: &ConnInfo) -> io::Result<()> {
        use ffi::ibv_qp_attr_mask as M;
        let gid = r.gid_bytes().unwrap_or([0; 16]);
        let global = self.dev.roce || gid != [0u8; 16] && self.dev.gid != [0u8; 16] && r.lid == 0;
        let mut a = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_RTR,
            path_mtu: self.dev.mtu.min(r.mtu),
            dest_qp_num: r.qpn,
            rq_psn: r.psn,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            ..Default::default()
        };
        a.ah_attr.dlid = r.lid;
        a.ah_attr.port_num = self.dev.port;
        if global {
            a.ah_attr.is_global = 1;
            a.ah_attr.grh.dgid = ffi::ibv_gid { raw: gid };
            a.ah_attr.grh.sgid_index = self.dev.gid_index;
            a.ah_attr.grh.hop_limit = 255;
        }
        self.modify(
            &mut a,
            M::IBV_QP_STATE
                | M::IBV_QP_AV
                | M::IBV_QP_PATH_MTU
                | M::IBV_QP_DEST_QPN
                | M::IBV_QP_RQ_PSN
                | M::IBV_QP_MAX_DEST_RD_ATOMIC
                | M::IBV_QP_MIN_RNR_TIMER,
            "RTR",
        )?;
        let mut a = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_RTS,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            sq_psn: self.psn,
            max_rd_atomic: 1,
            ..Default::default()
        };
        self.modify(
            &mut a,
            M::IBV_QP_STATE
                | M::IBV_QP_TIMEOUT
                | M::IBV_QP_RETRY_CNT
                | M::IBV_QP_RNR_RETRY
                | M::IBV_QP_SQ_PSN
                | M::IBV_QP_MAX_QP_RD_ATOMIC,
            "RTS",
        )
    }

    fn post_recvs(&mut self) -> io::Result<()> {
        let n = self.flow.recv_to_post();
        for _ in 0..n {
            let mut wr = ffi::ibv_recv_wr {
                wr_id: WrKind::Recv.encode(),
                next: std::ptr::null_mut(),
                sg_list: std::ptr::null_mut(),
                num_sge: 0,
            };
            let mut bad = std::ptr::null_mut();
            // SAFETY: a zero-length receive WR (writes with immediate carry no receive data);
            // qp and its context are live.
            let rc = unsafe {
                let ctx = (*self.qp).context;
                match (*ctx).ops.post_recv {
                    Some(f) => f(self.qp, &mut wr, &mut bad),
                    None => libc::ENOSYS,
                }
            };
            if rc != 0 {
                return Err(io::Error::new(
                    io::Error::from_raw_os_error(rc).kind(),
                    format!("ibv_post_recv: {}", io::Error::from_raw_os_error(rc)),
                ));
            }
            self.flow.on_recv_posted(1);
        }
        Ok(())
    }

    /// Post an RDMA write (with immediate when `imm` is set), signaled.
    #[allow(clippy::too_many_arguments)]
    fn post_write(
        &self,
        local: u64,
        len: u32,
        lkey: u32,
        remote: u64,
        rkey: u32,
        imm: Option<u32>,
        wr_id: u64,
    ) -> io::Result<()> {
        let mut sge = ffi::ibv_sge {
            addr: local,
            length: len,
            lkey,
        };
        let mut wr = ffi::ibv_send_wr {
            wr_id,
            next: std::ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
            opcode: if imm.is_some() {
                ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM
            } else {
                ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE
            },
            send_flags: ffi::ibv_send_flags::IBV_SEND_SIGNALED.0,
            ..Default::default()
        };
        wr.__bindgen_anon_1.imm_data = imm.unwrap_or(0).to_be();
        wr.wr.rdma = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
            remote_addr: remote,
            rkey,
        };
        let mut bad = std::ptr::null_mut();
        // SAFETY: the sge points into a registered region owned by the link; qp is live.
        let rc = unsafe {
            let ctx = (*self.qp).context;
            match (*ctx).ops.post_send {
                Some(f) => f(self.qp, &mut wr, &mut bad),
                None => libc::ENOSYS,
            }
        };
        if rc != 0 {
            return Err(io::Error::new(
                io::Error::from_raw_os_error(rc).kind(),
                format!("ibv_post_send: {}", io::Error::from_raw_os_error(rc)),
            ));
        }
        Ok(())
    }

    fn fail(&mut self, why: String) -> LinkError {
        self.broken = Some(why.clone());
        LinkError::Io(io::Error::other(format!("{}: {why}", self.desc)))
    }

    /// Advance the connection (store look-ups at most every millisecond), drain completions and
    /// pick up credit.
    fn progress(&mut self) -> Result<bool, LinkError> {
        if let Some(b) = &self.broken {
            return Err(LinkError::Io(io::Error::other(b.clone())));
        }
        match &self.conn {
            Conn::Up(_) => {}
            _ if self.last_check.elapsed() < Duration::from_millis(1) => return Ok(false),
            Conn::WaitPeer => {
                self.last_check = Instant::now();
                let key = self.peer_keys.0.clone();
                let present = self
                    .store
                    .check(std::slice::from_ref(&key))
                    .map_err(|e| LinkError::Io(io::Error::other(e.to_string())))?;
                if present.first() != Some(&true) {
                    return Ok(false);
                }
                let raw = self
                    .store
                    .get(&key, Duration::from_secs(5))
                    .map_err(|e| LinkError::Io(io::Error::other(e.to_string())))?;
                let info = ConnInfo::decode(&raw).map_err(LinkError::Io)?;
                if info.slots != self.flow.config().slots
                    || info.slot_bytes != self.flow.config().slot_bytes
                {
                    return Err(self.fail(format!(
                        "peer rings are {} x {} bytes, ours {} x {}",
                        info.slots,
                        info.slot_bytes,
                        self.flow.config().slots,
                        self.flow.config().slot_bytes
                    )));
                }
                if let Err(e) = self.to_rtr_rts(&info) {
                    return Err(self.fail(e.to_string()));
                }
                self.store
                    .set(&self.my_rtr_key, b"1")
                    .map_err(|e| LinkError::Io(io::Error::other(e.to_string())))?;
                self.conn = Conn::WaitReady(info);
                return Ok(false);
            }
            Conn::WaitReady(info) => {
                self.last_check = Instant::now();
                let info = info.clone();
                let present = self
                    .store
                    .check(std::slice::from_ref(&self.peer_keys.1))
                    .map_err(|e| LinkError::Io(io::Error::other(e.to_string())))?;
                if present.first() != Some(&true) {
                    return Ok(false);
                }
                tracing::debug!(target: "railring::net", "{} connected", self.desc);
                self.conn = Conn::Up(info);
            }
        }
        let mut wcs = [ffi::ibv_wc::default(); 32];
        loop {
            // SAFETY: cq is live; wcs is a valid array of ibv_wc.
            let n = unsafe {
                let ctx = (*self.cq).context;
                match (*ctx).ops.poll_cq {
                    Some(f) => f(self.cq, wcs.len() as i32, wcs.as_mut_ptr() as *mut _),
                    None => -1,
                }
            };
            if n < 0 {
                return Err(self.fail("ibv_poll_cq failed".into()));
            }
            for wc in &wcs[..n as usize] {
                if let Some((status, vendor)) = wc.error() {
                    let why = format!(
                        "work completion error status {status} (vendor {vendor:#x}): the peer is unreachable or gone"
                    );
                    self.broken = Some(why.clone());
                    return Err(LinkError::PeerGone(format!("{}: {why}", self.desc)));
                }
                let r = match WrKind::decode(wc.wr_id()) {
                    Some(WrKind::Recv) => {
                        let imm = wc.imm_data().map(u32::from_be).unwrap_or(0);
                        self.flow.on_arrival(imm, wc.len() as u32)
                    }
                    Some(_) => self.flow.on_send_completion(wc.wr_id()),
                    None => Ok(()),
                };
                if let Err(e) = r {
                    return Err(self.fail(e.to_string()));
                }
            }
            if (n as usize) < wcs.len() {
                break;
            }
        }
        self.post_recvs().map_err(|e| self.fail(e.to_string()))?;
        // SAFETY: the mailbox is written by the NIC; a volatile aligned 8-byte read.
        let credit = unsafe { std::ptr::read_volatile(&self.mbox[0]) };
        if let Err(e) = self.flow.on_credit(credit) {
            return Err(self.fail(e.to_string()));
        }
        Ok(true)
    }

    fn report_credit(&mut self, idle: bool) -> Result<(), LinkError> {
        let Conn::Up(r) = &self.conn else {
            return Ok(());
        };
        let (addr, rkey) = (r.mailbox_addr, r.mailbox_rkey);
        if let Some(v) = self.flow.credit_due(idle) {
            // The NIC may read the source after later reports changed it: any value it reads
            // is a valid (monotonic) count.
            // SAFETY: mbox[1] is inside the registered mailbox region.
            unsafe { std::ptr::write_volatile(&mut self.mbox[1], v) };
            let src = &self.mbox[1] as *const u64 as u64;
            let lkey = self.mbox_mr.lkey();
            if let Err(e) = self.post_write(src, 8, lkey, addr, rkey, None, WrKind::Credit.encode())
            {
                return Err(self.fail(e.to_string()));
            }
            self.flow.on_credit_posted(v);
        }
        Ok(())
    }
}

impl RdmaLink {
    /// Refuse memory the rings cannot be filled from or drained into.
    fn check_kind(&mut self, mem: MemKind) -> Result<(), LinkError> {
        if Link::supports(self, mem) {
            return Ok(());
        }
        Err(LinkError::Io(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("{}: cannot move {mem:?} memory", self.desc),
        )))
    }

    /// Queue up to `len` bytes from `src` (memory of kind `mem`): take ring slots and fill
    /// them ([`fill_slots`]), then post the writes.
    ///
    /// # Safety
    /// `src` valid for reads of `len` bytes of kind `mem`.
    unsafe fn send_from(
        &mut self,
        src: *const u8,
        len: usize,
        mem: MemKind,
    ) -> Result<usize, LinkError> {
        self.check_kind(mem)?;
        if !self.progress()? {
            return Ok(0);
        }
        let Conn::Up(r) = &self.conn else {
            return Ok(0);
        };
        let (ring, rkey) = (r.ring_addr, r.ring_rkey);
        let (posts, off) = match fill_slots(&mut self.flow, &mut self.rings, src, len) {
            Ok(x) => x,
            Err(e) => return Err(self.fail(e)),
        };
        let (send_base, _) = self.rings.addrs();
        let lkey = self.send_mr.lkey();
        for p in &posts {
            if let Err(e) = self.post_write(
                send_base + p.local_off as u64,
                p.len,
                lkey,
                ring + p.remote_off as u64,
                rkey,
                Some(p.imm),
                p.wr_id,
            ) {
                return Err(self.fail(e.to_string()));
            }
        }
        self.sent += off as u64;
        // Piggyback: a link used in both directions reports credit here too.
        self.report_credit(false)?;
        Ok(off)
    }

    /// Hand out up to `len` bytes into `dst` (memory of kind `mem`) with [`drain_slots`], then
    /// report credit (only now: every byte handed out has been copied).
    ///
    /// # Safety
    /// `dst` valid for writes of `len` bytes of kind `mem`.
    unsafe fn recv_into(
        &mut self,
        dst: *mut u8,
        len: usize,
        mem: MemKind,
    ) -> Result<usize, LinkError> {
        self.check_kind(mem)?;
        if !self.progress()? {
            return Ok(0);
        }
        let got = match drain_slots(&mut self.flow, &mut self.rings, dst, len) {
            Ok(n) => n,
            Err(e) => return Err(self.fail(e)),
        };
        let idle = self.flow.readable().is_none();
        self.report_credit(idle)?;
        Ok(got)
    }
}

impl Link for RdmaLink {
    fn describe(&self) -> String {
        self.desc.clone()
    }

    fn try_send(&mut self, data: &[u8]) -> Result<usize, LinkError> {
        // SAFETY: a live slice of host memory.
        unsafe { self.send_from(data.as_ptr(), data.len(), MemKind::Host) }
    }

    fn try_recv(&mut self, buf: &mut [u8]) -> Result<usize, LinkError> {
        // SAFETY: a live slice of host memory.
        unsafe { self.recv_into(buf.as_mut_ptr(), buf.len(), MemKind::Host) }
    }

    unsafe fn try_send_mem(
        &mut self,
        ptr: *const u8,
        n: usize,
        mem: MemKind,
    ) -> Result<usize, LinkError> {
        self.send_from(ptr, n, mem)
    }

    unsafe fn try_recv_mem(
        &mut self,
        ptr: *mut u8,
        n: usize,
        mem: MemKind,
    ) -> Result<usize, LinkError> {
        self.recv_into(ptr, n, mem)
    }

    fn supports(&self, mem: MemKind) -> bool {
        match (mem, &self.rings) {
            (MemKind::Host, _) => true,
            (MemKind::Device { ordinal }, Rings::Device(d)) => d.ordinal() == ordinal,
            (MemKind::Device { .. }, Rings::Host { .. }) => false,
        }
    }

    fn register(
        &mut self,
        ptr: *const u8,
        len: usize,
        mem: MemKind,
    ) -> Result<Registration, LinkError> {
        if !Link::supports(self, mem) {
            return Err(LinkError::Io(io::Error::new(
                io::ErrorKind::Unsupported,
                "device memory is registered only on GPUDirect links (rings in device memory)",
            )));
        }
        let dev = self.dev.clone();
        let mr = self
            .cache
            .get_or_register(
                ptr as usize,
                len,
                mem,
                // SAFETY: the caller keeps the buffer alive while it is registered and
                // invalidates the cache before freeing it (see MrCache).
                |p, l| unsafe { dev.reg(p, l) },
                Mr::dereg,
            )
            .map_err(LinkError::Io)?;
        Ok(Registration {
            key: ((mr.rkey() as u64) << 32) | mr.lkey() as u64,
        })
    }

    fn check_peer(&self) -> Result<(), LinkError> {
        match &self.broken {
            Some(b) => Err(LinkError::PeerGone(b.clone())),
            None => Ok(()),
        }
    }

    fn bytes_sent(&self) -> u64 {
        self.sent
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    fn port(d: &str) -> HcaPort {
        HcaPort {
            device: d.into(),
            port: 1,
        }
    }

    #[test]
    fn net_choice_parses() {
        assert_eq!(NetChoice::parse("IB"), Some(NetChoice::Ib));
        assert_eq!(NetChoice::parse(" socket "), Some(NetChoice::Socket));
        assert_eq!(NetChoice::parse("auto"), Some(NetChoice::Auto));
        assert_eq!(NetChoice::parse(""), Some(NetChoice::Auto));
        assert_eq!(NetChoice::parse("infiniband!"), None);
    }

    #[test]
    fn devices_error_selects_socket() {
        // what ibverbs::devices() returns on this machine (no RDMA kernel support)
        let enosys = || Err(io::Error::from_raw_os_error(38));
        for choice in [NetChoice::Auto, NetChoice::Ib] {
            match select_net_with(choice, None, enosys) {
                NetSelection::Socket(Some(why)) => {
                    assert!(why.contains("no RDMA support"), "{why}")
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn no_devices_selects_socket() {
        match select_net_with(NetChoice::Ib, None, || Ok(vec![])) {
            NetSelection::Socket(Some(why)) => assert!(why.contains("no RDMA device")),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn socket_choice_never_probes() {
        let probed = RefCell::new(false);
        let r = select_net_with(NetChoice::Socket, None, || {
            *probed.borrow_mut() = true;
            Ok(vec![port("mlx5_0")])
        });
        assert_eq!(r, NetSelection::Socket(None));
        assert!(!*probed.borrow());
    }

    #[test]
    fn devices_are_filtered() {
        let all = || Ok(vec![port("mlx5_0"), port("mlx5_1"), port("mlx5_10")]);
        let f = HcaFilter::parse("=mlx5_1").unwrap();
        assert_eq!(
            select_net_with(NetChoice::Auto, Some(&f), all),
            NetSelection::Ib(vec![port("mlx5_1")])
        );
        let f = HcaFilter::parse("^mlx5_1").unwrap();
        assert_eq!(
            select_net_with(NetChoice::Auto, Some(&f), all),
            NetSelection::Ib(vec![port("mlx5_0")])
        );
        assert_eq!(
            select_net_with(NetChoice::Auto, None, all),
            NetSelection::Ib(vec![port("mlx5_0"), port("mlx5_1"), port("mlx5_10")])
        );
        let f = HcaFilter::parse("bnxt").unwrap();
        match select_net_with(NetChoice::Ib, Some(&f), all) {
            NetSelection::Socket(Some(why)) => {
                assert!(why.contains("RAILRING_IB_HCA=bnxt matches none"), "{why}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn gpudirect_only_below_a_pcie_switch() {
        assert!(gpudirect_allowed(Some(PathClass::Pix)));
        assert!(gpudirect_allowed(Some(PathClass::Pxb)));
        for c in [
            PathClass::Phb,
            PathClass::Node,
            PathClass::Sys,
            PathClass::Same,
            PathClass::Nv(4),
        ] {
            assert!(!gpudirect_allowed(Some(c)), "{c}");
        }
        assert!(!gpudirect_allowed(None));
    }

    #[test]
    fn gdr_level_admits_pcie_paths_up_to_it() {
        // a level admits its own class and every closer one, never an unknown path
        assert!(gpudirect_at(Some(PathClass::Pix), Some(PathClass::Pxb)));
        assert!(!gpudirect_at(Some(PathClass::Phb), Some(PathClass::Pxb)));
        assert!(gpudirect_at(Some(PathClass::Phb), Some(PathClass::Phb)));
        assert!(gpudirect_at(Some(PathClass::Sys), Some(PathClass::Sys)));
        assert!(!gpudirect_at(Some(PathClass::Pix), None));
        assert!(!gpudirect_at(None, Some(PathClass::Sys)));
    }

    #[test]
    fn gpudirect_decision_from_a_real_topology() {
        use crate::topology::{DeviceId, Topology};
        let t = Topology::from_file("../tests/fixtures/topology/aws-p4d-24xl-topo.xml").unwrap();
        let (mut yes, mut no) = (0, 0);
        for (g, gpu) in t.gpus.iter().enumerate() {
            let bus = gpu.busid.clone().unwrap();
            for (n, nic) in t.nics.iter().enumerate() {
                let p = gpu_nic_path(&t, &bus, &nic.name);
                assert_eq!(p, Some(t.path_class(DeviceId::Gpu(g), DeviceId::Nic(n))));
                if gpudirect_allowed(p) {
                    yes += 1;
                } else {
                    no += 1;
                }
            }
        }
        assert!(
            yes > 0 && no > 0,
            "p4d has PIX and SYS GPU-NIC pairs ({yes}/{no})"
        );
        assert_eq!(gpu_nic_path(&t, "0000:ff:00.0", &t.nics[0].name), None);
    }

    #[test]
    fn mr_cache_hits_contained_ranges_and_evicts_lru() {
        let regs = RefCell::new(Vec::<(usize, usize)>::new());
        let deregs = RefCell::new(Vec::<u32>::new());
        let mut c: MrCache<u32> = MrCache::new(2);
        let mut next = 0u32;
        let mut get = |c: &mut MrCache<u32>, p: usize, l: usize| {
            c.get_or_register(
                p,
                l,
                MemKind::Host,
                |p, l| {
                    regs.borrow_mut().push((p, l));
                    next += 1;
                    Ok(next)
                },
                |h| deregs.borrow_mut().push(h),
            )
            .unwrap()
        };
        let a = get(&mut c, 0x1000, 0x1000);
        assert_eq!(get(&mut c, 0x1000, 0x1000), a, "exact hit");
        assert_eq!(get(&mut c, 0x1800, 0x100), a, "contained hit");
        let b = get(&mut c, 0x8000, 0x10);
        assert_ne!(a, b);
        assert_eq!(c.hits, 2);
        assert_eq!(c.misses, 2);
        get(&mut c, 0x1000, 0x10); // touch a: b is now the LRU
        let d = get(&mut c, 0x20000, 0x10);
        assert_eq!(*deregs.borrow(), vec![b], "LRU evicted");
        assert_eq!(c.len(), 2);
        // a range straddling a registration is a miss
        let e = get(&mut c, 0x1f00, 0x200);
        assert!(e != a && e != d);
        assert_eq!(regs.borrow().len(), 4);
        // invalidation removes overlapping entries
        c.invalidate(0x1f80, 1, |h| deregs.borrow_mut().push(h));
        assert_eq!(c.len(), 1);
        // device memory is keyed separately
        let dev = c
            .get_or_register(
                0x20000,
                0x10,
                MemKind::Device { ordinal: 0 },
                |_, _| Ok(99),
                |_| {},
            )
            .unwrap();
        assert_eq!(dev, 99);
        assert!(c
            .get_or_register(0x1, 0, MemKind::Host, |_, _| Ok(1), |_| {})
            .is_err());
        c.clear(|h| deregs.borrow_mut().push(h));
        assert!(c.is_empty());
    }

    #[test]
    fn conn_info_round_trips_and_rejects_garbage() {
        let c = ConnInfo {
            qpn: 0x1234,
            lid: 7,
            gid: ConnInfo::gid_hex(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8]),
            psn: 0xabcdef,
            mtu: 5,
            ring_addr: 0x7f00_0000_1000,
            ring_rkey: 0x55,
            mailbox_addr: 0x7f00_0000_9000,
            mailbox_rkey: 0x66,
            slots: 8,
            slot_bytes: 1 << 19,
        };
        let d = ConnInfo::decode(&c.encode()).unwrap();
        assert_eq!(d, c);
        assert_eq!(d.gid_bytes().unwrap()[0], 0xfe);
        assert!(ConnInfo::decode(b"{").is_err());
        let mut bad = c.clone();
        bad.gid = "zz".into();
        assert!(ConnInfo::decode(&bad.encode()).is_err());
        let (k, r) = conn_keys(0x1f, 3, 0, 5);
        assert_eq!(k, "c1f/ib/3/0-5");
        assert_eq!(r, "c1f/ib/3/0-5/rtr");
    }

    #[test]
    fn probing_this_machine_never_panics() {
        // Without RDMA hardware this is Err (ENOSYS) or an empty list; either selects TCP.
        match probe_hcas() {
            Ok(v) => eprintln!("RDMA ports here: {v:?}"),
            Err(e) => eprintln!("no RDMA here: {e}"),
        }
        let _ = select_net_with(NetChoice::Auto, None, probe_hcas);
    }
}

/// The link's staging halves ([`fill_slots`] / [`drain_slots`]) over both kinds of rings,
/// against a NIC played by the test: the verbs calls are the only part of a link they leave out.
#[cfg(test)]
mod staging_tests {
    use super::*;
    use std::sync::Mutex;

    /// Device rings stand-in: host memory (owned through raw pointers, as a device buffer would
    /// be), every copy batch and flush logged.
    struct FakeRings {
        send: *mut u8,
        recv: *mut u8,
        len: usize,
        log: Arc<Mutex<Vec<&'static str>>>,
    }

    // SAFETY: the buffers are owned by the value.
    unsafe impl Send for FakeRings {}

    impl FakeRings {
        fn new(len: usize, log: Arc<Mutex<Vec<&'static str>>>) -> FakeRings {
            let mk = || Box::into_raw(vec![0u8; len].into_boxed_slice()) as *mut u8;
            FakeRings {
                send: mk(),
                recv: mk(),
                len,
                log,
            }
        }
    }

    impl Drop for FakeRings {
        fn drop(&mut self) {
            for p in [self.send, self.recv] {
                // SAFETY: from Box::into_raw of a boxed slice of `len` bytes in new().
                drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, self.len)) });
            }
        }
    }

    impl DeviceRings for FakeRings {
        fn ordinal(&self) -> i32 {
            0
        }
        fn rings(&self) -> (u64, u64) {
            (self.send as u64, self.recv as u64)
        }
        unsafe fn copy(&mut self, list: &[(u64, u64, usize)]) -> io::Result<()> {
            self.log.lock().unwrap().push("copy");
            for &(d, s, n) in list {
                std::ptr::copy_nonoverlapping(s as *const u8, d as *mut u8, n);
            }
            Ok(())
        }
        fn flush_nic_writes(&mut self) -> io::Result<()> {
            self.log.lock().unwrap().push("flush");
            Ok(())
        }
    }

    struct End {
        flow: Flow,
        rings: Rings,
        log: Arc<Mutex<Vec<&'static str>>>,
    }

    fn end(cfg: FlowConfig, device: bool) -> End {
        let len = cfg.slots as usize * cfg.slot_bytes as usize;
        let log = Arc::new(Mutex::new(Vec::new()));
        let rings = if device {
            Rings::Device(Box::new(FakeRings::new(len, log.clone())))
        } else {
            Rings::Host {
                send: vec![0; len],
                recv: vec![0; len],
            }
        };
        let mut flow = Flow::new(cfg);
        let n = flow.recv_to_post();
        flow.on_recv_posted(n);
        End { flow, rings, log }
    }

    /// The NIC executes a write: sender's send slot into the receiver's receive slot, then
    /// the receive completion (with a re-posted receive) and the send completion.
    fn execute(from: &mut End, to: &mut End, p: &flow::DataPost) {
        let (s, _) = from.rings.addrs();
        let (_, r) = to.rings.addrs();
        // SAFETY: both ranges lie inside rings of the flow's shape.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (s + p.local_off as u64) as *const u8,
                (r + p.remote_off as u64) as *mut u8,
                p.len as usize,
            )
        };
        to.flow.on_arrival(p.imm, p.len).unwrap();
        let n = to.flow.recv_to_post();
        to.flow.on_recv_posted(n);
        from.flow.on_send_completion(p.wr_id).unwrap();
    }

    fn stream(device: bool, seed: u64) {
        let cfg = FlowConfig::new(4, 1000, 10).unwrap();
        let (mut a, mut b) = (end(cfg, device), end(cfg, device));
        let mut x = seed | 1;
        let mut rnd = move |n: usize| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % n.max(1) as u64) as usize
        };
        let data: Vec<u8> = (0..50_000).map(|_| rnd(256) as u8).collect();
        let mut got = vec![0u8; data.len()];
        let (mut sent, mut recvd) = (0, 0);
        let mut pending: Vec<flow::DataPost> = Vec::new();
        let (mut fills, mut drains) = (0, 0);
        let mut steps = 0;
        while recvd < data.len() {
            steps += 1;
            assert!(steps < 100_000, "no progress");
            match rnd(3) {
                0 if sent < data.len() => {
                    let want = 1 + rnd(3000).min(data.len() - sent - 1);
                    // SAFETY: a live range of `data`.
                    let (posts, n) = unsafe {
                        fill_slots(&mut a.flow, &mut a.rings, data[sent..].as_ptr(), want)
                    }
                    .unwrap();
                    assert_eq!(posts.iter().map(|p| p.len as usize).sum::<usize>(), n);
                    fills += usize::from(n > 0);
                    sent += n;
                    pending.extend(posts);
                }
                1 if !pending.is_empty() => {
                    // the NIC runs some writes, in order (one RC queue pair)
                    let k = 1 + rnd(pending.len());
                    for p in pending.drain(..k) {
                        execute(&mut a, &mut b, &p);
                    }
                }
                _ => {
                    let want = 1 + rnd(2500);
                    let want = want.min(got.len() - recvd);
                    // SAFETY: a live range of `got`.
                    let n = unsafe {
                        drain_slots(&mut b.flow, &mut b.rings, got[recvd..].as_mut_ptr(), want)
                    }
                    .unwrap();
                    assert_eq!(
                        got[recvd..recvd + n],
                        data[recvd..recvd + n],
                        "stream corrupted"
                    );
                    drains += usize::from(n > 0);
                    recvd += n;
                    // credit goes back only now; the sender may overwrite the slots at once
                    if let Some(v) = b.flow.credit_due(b.flow.readable().is_none()) {
                        b.flow.on_credit_posted(v);
                        a.flow.on_credit(v).unwrap();
                        b.flow.on_send_completion(WrKind::Credit.encode()).unwrap();
                        // nothing left to read: the sender may now overwrite any slot
                        if b.flow.readable().is_none() {
                            match &mut b.rings {
                                Rings::Host { recv, .. } => recv.fill(0xEE),
                                Rings::Device(d) => {
                                    let (_, r) = d.rings();
                                    // SAFETY: the stand-in's receive ring, 4000 bytes.
                                    unsafe { std::ptr::write_bytes(r as *mut u8, 0xEE, 4000) };
                                }
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(got, data);
        if device {
            // one batch of copies per call that moved data; every receive batch after a flush
            let la = a.log.lock().unwrap();
            assert_eq!(la.iter().filter(|e| **e == "copy").count(), fills);
            assert!(!la.contains(&"flush"), "the sender never flushes");
            let lb = b.log.lock().unwrap();
            assert_eq!(lb.len(), 2 * drains, "{lb:?}");
            for pair in lb.chunks(2) {
                assert_eq!(pair, ["flush", "copy"]);
            }
        }
    }

    #[test]
    fn device_rings_carry_a_stream_in_order() {
        for seed in 1..=20 {
            stream(true, seed);
        }
    }

    #[test]
    fn host_rings_carry_a_stream_in_order() {
        for seed in 1..=20 {
            stream(false, seed);
        }
    }

    #[test]
    fn a_failed_device_copy_breaks_the_link() {
        struct Broken;
        impl DeviceRings for Broken {
            fn ordinal(&self) -> i32 {
                0
            }
            fn rings(&self) -> (u64, u64) {
                (4096, 8192)
            }
            unsafe fn copy(&mut self, _: &[(u64, u64, usize)]) -> io::Result<()> {
                Err(io::Error::other("cuMemcpyAsync: an illegal memory access"))
            }
            fn flush_nic_writes(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let cfg = FlowConfig::new(4, 1000, 10).unwrap();
        let mut flow = Flow::new(cfg);
        let mut rings = Rings::Device(Box::new(Broken));
        let src = [1u8; 10];
        // SAFETY: the stand-in never touches memory.
        let e = unsafe { fill_slots(&mut flow, &mut rings, src.as_ptr(), 10) }.unwrap_err();
        assert!(
            e.contains("staging into the send ring") && e.contains("illegal"),
            "{e}"
        );
    }
}

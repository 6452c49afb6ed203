//! The CUDA IPC in-node fabric ([`GpuFabric`], see [`super`]): setting it up collectively
//! ([`gpu_fabric`]: export every rank's staging buffer, open the peers', agree on direct reads
//! or staging through host memory) and running an in-node collective on device memory.

use super::driver::{bus_id, cuda_err};
use super::flags::{open_flags, FlagSeg};
use super::ipc::{self, Access, GpuPeer, IpcHandle, Verdict};
use super::launch::{launch_avg, launch_reduce, op_kernels, sm_count};
use super::setup::FabricSetup;
use crate::error::{Error, Result};
use crate::transport::{Backoff, NodeFabric, NodeMode, NodeOp, DESC};
use cudarc::driver::{sys, CudaContext, CudaStream};
use railring_collectives::{DataType, ReduceOp};
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Default bytes of one device staging slot (two per rank): `RAILRING_GPU_SLOT`. The host drives
/// every chunk (copy in, flags, reduce kernel, flags, copy out), a fixed cost of about 60 us a
/// chunk on an H200 under MPS, so the slot is large: 1 GiB all-reduce, 2 ranks on one H200,
/// busbw 80 GB/s with 4 MiB slots, 197 with 16 MiB, 296 with 64 MiB (4 ranks: 69, 184, 278).
/// Two slots of 64 MiB are 128 MiB of device memory per rank.
pub const DEFAULT_GPU_SLOT: usize = 64 << 20;

/// How local ranks move device data, decided identically on every member.
pub enum GpuPath {
    /// Direct reads of peers' device buffers through CUDA IPC.
    Direct(Box<GpuFabric>),
    /// Stage through pinned host memory and the CPU path, and why.
    Staged(String),
}

/// The CUDA IPC in-node fabric (see the module docs).
pub struct GpuFabric {
    ranks: Vec<usize>,
    me: usize,
    rank: usize,
    host: String,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    scratch: u64,
    /// Per local rank: base of its staging buffer as mapped in this process.
    bases: Vec<u64>,
    /// Which of `bases` were opened through IPC (closed on drop).
    opened: Vec<bool>,
    table: u64,
    flags: FlagSeg,
    gen: u64,
    slot: usize,
    sms: u32,
    pub timeout: Duration,
}

// SAFETY: the raw device pointers and the mapping are owned by the fabric; CUDA contexts and
// streams are thread safe; the executor uses the fabric from one thread at a time.
unsafe impl Send for GpuFabric {}

impl Drop for GpuFabric {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        let _ = self.stream.synchronize();
        // Peers may still be copying out of our slot from the last call: give them a moment.
        let mut b = Backoff::new();
        while (0..self.ranks.len())
            .any(|j| self.flags.done(j).load(Ordering::Acquire) < self.gen && self.flags.alive(j))
            && b.waited() < Duration::from_secs(5)
        {
            b.snooze();
        }
        // SAFETY: each pointer was obtained once (cuMemAlloc / cuIpcOpenMemHandle) and is
        // released once; errors at teardown are ignored.
        unsafe {
            for (j, &o) in self.opened.iter().enumerate() {
                if o {
                    let _ = sys::cuIpcCloseMemHandle(self.bases[j]);
                }
            }
            let _ = sys::cuMemFree_v2(self.table);
            let _ = sys::cuMemFree_v2(self.scratch);
        }
    }
}

/// Build the in-node GPU path for a device: `Direct` when every local rank can read every
/// peer's staging buffer, else `Staged` with the reason (logged at INFO). Collective over the
/// local ranks (they all call it at the same point, with the same epoch).
pub fn gpu_fabric(s: &FabricSetup<'_>, ctx: &Arc<CudaContext>) -> Result<GpuPath> {
    let rank = s.local[s.me];
    let l = s.local.len();
    let prefix = s.prefix();
    let slot = slot_bytes(s.gpu_slot);
    ctx.bind_to_thread()
        .map_err(|e| cuda_err(rank, "binding the CUDA context", e))?;
    let my_dev = ctx.cu_device();
    let my_bus = bus_id(my_dev).map_err(|e| cuda_err(rank, "reading the GPU's PCI bus id", e))?;

    let (scratch, handle, note) = export_staging(2 * slot);
    let mine = GpuPeer {
        rank,
        pid: std::process::id(),
        bus_id: my_bus.clone(),
        ordinal: ctx.ordinal() as i32,
        handle,
        bytes: 2 * slot,
        note,
    };
    let peers = match ipc::exchange_peers(s.store, &prefix, s.me, l, &mine, s.timeout) {
        Ok(p) => p,
        Err(e) => {
            free_dev(scratch);
            return Err(e);
        }
    };
    if peers.iter().any(|p| p.bytes != 2 * slot) {
        free_dev(scratch);
        return Err(Error::Invalid(
            "local ranks disagree on RAILRING_GPU_SLOT: set it identically for every rank".into(),
        ));
    }
    let access = ipc::plan_access(s.me, &peers, &my_bus, |p| {
        can_access_peer(my_dev, &p.bus_id)
    });
    // Open every peer's buffer now, so an IPC failure is part of the verdict.
    let mut mapped = PeerBuffers {
        bases: vec![0u64; l],
        opened: vec![false; l],
    };
    let mut problem = access.as_ref().err().cloned();
    if problem.is_none() {
        problem = mapped.open(s.me, &peers, scratch).err();
    }
    let verdict = Verdict { rank, problem };
    let agreed = match ipc::agree(s.store, &prefix, s.me, l, &verdict, s.timeout) {
        Ok(a) => a,
        Err(e) => {
            mapped.close();
            free_dev(scratch);
            return Err(e);
        }
    };
    if let Err(why) = agreed {
        mapped.close();
        free_dev(scratch);
        tracing::info!(target: "railring::init", rank, "GPU in-node path: staging through pinned host memory ({why})");
        return Ok(GpuPath::Staged(why));
    }
    log_direct_paths(
        s.topo_file,
        s.mps_pipe_dir,
        rank,
        &my_bus,
        &access.unwrap_or_default(),
        &peers,
    );
    direct_fabric(s, ctx, slot, scratch, mapped).map(|f| GpuPath::Direct(Box::new(f)))
}

/// Bytes of one staging slot (two per rank): `RAILRING_GPU_SLOT` ([`FabricSetup::gpu_slot`]),
/// 64 KiB to 1 GiB in whole pages, else [`DEFAULT_GPU_SLOT`].
fn slot_bytes(asked: Option<u64>) -> usize {
    asked
        .map(|v| (v.min(1 << 30) as usize).clamp(64 << 10, 1 << 30))
        .unwrap_or(DEFAULT_GPU_SLOT)
        & !4095
}

/// Allocate this rank's staging buffer of `bytes` and export it for the peers (`cuMemAlloc`:
/// pool allocations cannot be exported). Returns its device address (0 when the allocation
/// failed) and its IPC handle, or why there is none.
fn export_staging(bytes: usize) -> (sys::CUdeviceptr, Option<IpcHandle>, Option<String>) {
    let mut scratch: sys::CUdeviceptr = 0;
    // SAFETY: plain device allocation, released in GpuFabric::drop or by the set-up on failure.
    let alloc = unsafe { sys::cuMemAlloc_v2(&mut scratch, bytes) }.result();
    let (handle, note) = match alloc {
        Err(e) => (None, Some(format!("cuMemAlloc of {bytes} bytes: {e}"))),
        Ok(()) => {
            let mut h = sys::CUipcMemHandle {
                reserved: [0; ipc::HANDLE_BYTES],
            };
            // SAFETY: exporting an allocation of this context.
            match unsafe { sys::cuIpcGetMemHandle(&mut h, scratch) }.result() {
                Ok(()) => {
                    let mut b = [0u8; ipc::HANDLE_BYTES];
                    for (d, s) in b.iter_mut().zip(h.reserved.iter()) {
                        *d = *s as u8;
                    }
                    (Some(IpcHandle(b)), None)
                }
                Err(e) => (None, Some(format!("cuIpcGetMemHandle: {e}"))),
            }
        }
    };
    (scratch, handle, note)
}

/// Free device memory the set-up allocated (0: nothing was).
fn free_dev(p: sys::CUdeviceptr) {
    if p != 0 {
        // SAFETY: allocated by the set-up, not shared yet (or every peer agreed not to use it).
        unsafe {
            let _ = sys::cuMemFree_v2(p);
        }
    }
}

/// Whether device `my_dev` can read the memory of the GPU at PCI bus id `bus` directly
/// (`None`: the driver could not tell).
fn can_access_peer(my_dev: sys::CUdevice, bus: &str) -> Option<bool> {
    let c = std::ffi::CString::new(bus.to_string()).ok()?;
    let mut dev: sys::CUdevice = 0;
    // SAFETY: c is a NUL-terminated bus id; dev is written on success.
    unsafe { sys::cuDeviceGetByPCIBusId(&mut dev, c.as_ptr()) }
        .result()
        .ok()?;
    let mut can = 0;
    // SAFETY: both are valid device handles.
    unsafe { sys::cuDeviceCanAccessPeer(&mut can, my_dev, dev) }
        .result()
        .ok()?;
    Some(can != 0)
}

/// Every local rank's staging buffer as mapped in this process.
struct PeerBuffers {
    /// Per local rank: base of its staging buffer (ours: the allocation itself).
    bases: Vec<u64>,
    /// Which of `bases` were opened through IPC (closed by [`PeerBuffers::close`]).
    opened: Vec<bool>,
}

impl PeerBuffers {
    /// Open every peer's exported buffer (`scratch`: ours). Stops at the first failure, which
    /// is returned as the reason to stage through host memory instead.
    fn open(
        &mut self,
        me: usize,
        peers: &[GpuPeer],
        scratch: sys::CUdeviceptr,
    ) -> std::result::Result<(), String> {
        for (j, p) in peers.iter().enumerate() {
            if j == me {
                self.bases[j] = scratch;
                continue;
            }
            let Some(h) = p.handle else { continue };
            let mut raw = sys::CUipcMemHandle {
                reserved: [0; ipc::HANDLE_BYTES],
            };
            for (d, s) in raw.reserved.iter_mut().zip(h.0.iter()) {
                *d = *s as std::ffi::c_char;
            }
            let mut dp: sys::CUdeviceptr = 0;
            // SAFETY: opening a handle exported by a live peer of this job.
            let r = unsafe {
                sys::cuIpcOpenMemHandle_v2(
                    &mut dp,
                    raw,
                    sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
                )
            }
            .result();
            match r {
                Ok(()) => {
                    self.bases[j] = dp;
                    self.opened[j] = true;
                }
                Err(e) => {
                    return Err(format!(
                        "cuIpcOpenMemHandle of rank {}'s buffer (GPU {}): {e}",
                        p.rank, p.bus_id
                    ));
                }
            }
        }
        Ok(())
    }

    /// Close every buffer opened through IPC.
    fn close(&self) {
        for (j, &o) in self.opened.iter().enumerate() {
            if o {
                // SAFETY: opened by `open`, closed once.
                unsafe {
                    let _ = sys::cuIpcCloseMemHandle(self.bases[j]);
                }
            }
        }
    }
}

/// The INFO line saying how this rank reads each peer's buffer on the direct path, and the
/// WARN line when ranks share a GPU with no MPS daemon to run them side by side.
fn log_direct_paths(
    topo_file: Option<&std::path::Path>,
    mps_pipe_dir: Option<&std::ffi::OsStr>,
    rank: usize,
    my_bus: &str,
    access: &[Access],
    peers: &[GpuPeer],
) {
    let paths: Vec<String> = access
        .iter()
        .zip(peers)
        .filter(|(a, _)| **a != Access::Local)
        .map(|(a, p)| match a {
            Access::SameDevice => format!("rank {}: same GPU (IPC)", p.rank),
            _ => format!(
                "rank {}: peer access to GPU {} ({})",
                p.rank,
                p.bus_id,
                link_label(topo_file, my_bus, &p.bus_id)
            ),
        })
        .collect();
    tracing::info!(target: "railring::init", rank, "GPU in-node path: direct reads of peers' device buffers on GPU {my_bus}; {}", paths.join(", "));
    let sharing: Vec<usize> = access
        .iter()
        .zip(peers)
        .filter(|(a, _)| **a == Access::SameDevice)
        .map(|(_, p)| p.rank)
        .collect();
    // One warning per GPU: from the lowest rank on it.
    if !sharing.is_empty() && sharing.iter().all(|&r| r > rank) {
        let pipe = mps_control_pipe(mps_pipe_dir);
        if !pipe.exists() {
            tracing::warn!(target: "railring::init", rank, "ranks {rank} and {sharing:?} share GPU {my_bus} and no CUDA MPS daemon runs here (its control pipe {} is missing): the driver time-slices their processes, about 0.8 ms a pipeline step (2 ranks on an H200: 760 us per all-reduce up to 4 MiB, 65 us under MPS); start `nvidia-cuda-mps-control -d` before the job, or give each rank its own GPU", pipe.display());
        }
    }
}

/// Where the MPS control daemon's pipe lives: `$CUDA_MPS_PIPE_DIRECTORY/control`, by default
/// `/tmp/nvidia-mps/control` (the daemon creates it when it starts).
fn mps_control_pipe(dir: Option<&std::ffi::OsStr>) -> std::path::PathBuf {
    let dir = match dir {
        Some(d) if !d.is_empty() => std::path::PathBuf::from(d),
        _ => std::path::PathBuf::from("/tmp/nvidia-mps"),
    };
    dir.join("control")
}

/// The direct path's remaining pieces once every rank agreed: the device table of the peers'
/// bases (what the reduce kernel indexes), the flag segment and a stream. On failure
/// everything the set-up holds (`scratch`, `mapped`) is released.
fn direct_fabric(
    s: &FabricSetup<'_>,
    ctx: &Arc<CudaContext>,
    slot: usize,
    scratch: sys::CUdeviceptr,
    mapped: PeerBuffers,
) -> Result<GpuFabric> {
    let rank = s.local[s.me];
    let l = s.local.len();
    let fail = |e: Error, table: u64| {
        mapped.close();
        free_dev(scratch);
        free_dev(table);
        e
    };
    let mut table: sys::CUdeviceptr = 0;
    // SAFETY: allocating and filling l u64s.
    let r = unsafe {
        sys::cuMemAlloc_v2(&mut table, 8 * l)
            .result()
            .and_then(|_| {
                sys::cuMemcpyHtoD_v2(table, mapped.bases.as_ptr() as *const _, 8 * l).result()
            })
    };
    if let Err(e) = r {
        return Err(fail(cuda_err(rank, "uploading the peer table", e), table));
    }
    let flags = match open_flags(s, l) {
        Ok(f) => f,
        Err(e) => return Err(fail(e, table)),
    };
    flags.pid(s.me).store(std::process::id(), Ordering::Release);
    let stream = match ctx.new_stream() {
        Ok(st) => st,
        Err(e) => return Err(fail(cuda_err(rank, "creating a CUDA stream", e), table)),
    };
    let PeerBuffers { bases, opened } = mapped;
    Ok(GpuFabric {
        ranks: s.local.to_vec(),
        me: s.me,
        rank,
        host: s.host.clone(),
        ctx: ctx.clone(),
        stream,
        scratch,
        bases,
        opened,
        table,
        flags,
        gen: 0,
        slot,
        sms: sm_count(ctx),
        timeout: s.timeout,
    })
}

/// "NVLink" / "PCIe P2P" for log lines, from the topology when it knows both GPUs.
fn link_label(topo_file: Option<&std::path::Path>, a: &str, b: &str) -> String {
    let Ok(t) = crate::topology::Topology::discover_from(topo_file) else {
        return "P2P".into();
    };
    let find = |bus: &str| {
        t.gpus.iter().position(|g| {
            g.busid.as_deref().is_some_and(|x| {
                x.to_ascii_lowercase()
                    .ends_with(bus.trim_start_matches("0000:"))
            })
        })
    };
    match (find(a), find(b)) {
        (Some(x), Some(y)) => match t.path_class(
            crate::topology::DeviceId::Gpu(x),
            crate::topology::DeviceId::Gpu(y),
        ) {
            crate::topology::PathClass::Nv(n) => format!("NVLink x{n}"),
            c => format!("PCIe P2P, {c}"),
        },
        _ => "P2P".into(),
    }
}

impl GpuFabric {
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    fn who(&self, i: usize) -> usize {
        self.ranks.get(i).copied().unwrap_or(i)
    }

    fn err(&self, what: &str, e: impl std::fmt::Display) -> Error {
        cuda_err(self.rank, what, e)
    }

    fn wait_all(&self, what: &str, target: u64, flag: impl Fn(usize) -> u64) -> Result<()> {
        let l = self.ranks.len();
        let mut b = Backoff::new();
        let mut j = 0;
        while j < l {
            if flag(j) >= target {
                j += 1;
                b.reset();
                continue;
            }
            b.snooze();
            if b.check_due() {
                if !self.flags.alive(j) {
                    return Err(Error::PeerDead {
                        rank: self.rank,
                        peer: self.who(j),
                        host: self.host.clone(),
                        why: format!("its process exited during an in-node GPU {what}"),
                    });
                }
                if b.waited() > self.timeout {
                    return Err(Error::Timeout {
                        rank: self.rank,
                        secs: self.timeout.as_secs(),
                        waiting: (0..l)
                            .filter(|&k| flag(k) < target)
                            .map(|k| self.who(k))
                            .collect(),
                        what: format!("in-node GPU {what}"),
                    });
                }
            }
        }
        Ok(())
    }

    fn sync(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(|e| self.err("waiting for the GPU", e))
    }

    fn copy(&self, dst: u64, src: u64, n: usize) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        // SAFETY: both addresses are device memory valid for n bytes (the user's buffer within
        // the bounds the executor checked, or a staging slot piece).
        unsafe { cudarc::driver::result::memcpy_dtod_async(dst, src, n, self.stream.cu_stream()) }
            .map_err(|e| self.err("device copy", e))
    }

    fn check_descs(
        &self,
        s: usize,
        desc: &[u8; DESC],
        describe: &dyn Fn(&[u8; DESC]) -> String,
    ) -> Result<()> {
        for j in 0..self.ranks.len() {
            let mut theirs = [0u8; DESC];
            // SAFETY: inside the mapping; not rewritten before we mark this slot done.
            unsafe {
                std::ptr::copy_nonoverlapping(self.flags.desc(j, s), theirs.as_mut_ptr(), DESC)
            };
            if &theirs != desc {
                return Err(Error::Mismatch {
                    rank: self.rank,
                    peer: self.who(j),
                    mine: describe(desc),
                    theirs: describe(&theirs),
                });
            }
        }
        Ok(())
    }

    /// Finish an average over `count` elements of `work` (device memory) on the fabric's stream.
    pub fn finish_avg(&self, work: u64, count: usize, dtype: DataType, ranks: usize) -> Result<()> {
        let k = op_kernels(self.rank, &self.ctx, dtype, ReduceOp::Avg)?;
        // SAFETY: work holds count elements of dtype (checked by the caller).
        unsafe { launch_avg(&self.stream, &k, self.sms, work, count as u64, ranks as u32) }
            .map_err(|e| self.err("average kernel", e))
    }

    /// One in-node collective on device memory (`call.work` is a device address; the call is
    /// in place).
    ///
    /// # Safety
    /// `call.work` must be device memory of this fabric's device, valid over every slice.
    pub unsafe fn run(&mut self, call: NodeOp<'_>) -> Result<()> {
        let NodeOp {
            mode,
            dtype,
            op,
            work,
            slices,
            desc,
            describe,
            ..
        } = call;
        let work = work as u64;
        let l = self.ranks.len();
        let me = self.me;
        let esz = dtype.size();
        if mode == NodeMode::AllToAll {
            return Err(Error::Plan(
                "in-node all-to-all on device memory is not supported (device collectives are \
                 all-reduces)"
                    .into(),
            ));
        }
        if l == 1 {
            return Ok(());
        }
        let need = match mode {
            NodeMode::Broadcast { .. } => 1,
            _ => l,
        };
        if slices.len() < need {
            return Err(Error::Plan(format!(
                "{} slices for {l} local ranks",
                slices.len()
            )));
        }
        self.ctx
            .bind_to_thread()
            .map_err(|e| self.err("binding the CUDA context", e))?;
        let mode = match mode {
            NodeMode::AllReduceSmall | NodeMode::Reduce { .. } => NodeMode::AllReduce,
            m => m,
        };
        let kern = match mode {
            NodeMode::ReduceScatter | NodeMode::AllReduce => {
                Some(op_kernels(self.rank, &self.ctx, dtype, op)?)
            }
            _ => None,
        };
        let (piece_cap, max_slice) = match mode {
            NodeMode::Broadcast { .. } => (
                self.slot & !255,
                slices.iter().map(|s| s.1).max().unwrap_or(0),
            ),
            _ => (
                (self.slot / l) & !255,
                slices.iter().map(|s| s.1).max().unwrap_or(0),
            ),
        };
        let cap_elems = (piece_cap / esz).max(1);
        let nchunks = (max_slice / esz).div_ceil(cap_elems).max(1);
        let slot_base = |j: usize, s: usize| self.bases[j] + (s * self.slot) as u64;
        let mine_base = self.scratch;
        for c in 0..nchunks {
            self.gen += 1;
            let g = self.gen;
            let s = (g % 2) as usize;
            let piece = |j: usize| -> (u64, usize) {
                let (off, len) = slices[j];
                let (po, pl) = railring_collectives::plan::split(len / esz, nchunks, c);
                (work + (off + po * esz) as u64, pl * esz)
            };
            if g > 2 {
                self.wait_all("reuse of a staging slot", g - 2, |j| {
                    self.flags.done(j).load(Ordering::Acquire)
                })?;
            }
            if c == 0 {
                std::ptr::copy_nonoverlapping(desc.as_ptr(), self.flags.desc(me, s), DESC);
            }
            let mine = mine_base + (s * self.slot) as u64;
            match mode {
                NodeMode::AllGather => {
                    let (p, n) = piece(me);
                    self.copy(mine + (me * piece_cap) as u64, p, n)?;
                }
                NodeMode::Broadcast { root } => {
                    if me == root {
                        let (p, n) = piece(0);
                        self.copy(mine, p, n)?;
                    }
                }
                _ => {
                    for j in 0..l {
                        let (p, n) = piece(j);
                        self.copy(mine + (j * piece_cap) as u64, p, n)?;
                    }
                }
            }
            self.sync()?;
            fence(Ordering::Release);
            self.flags.ready(me).store(g, Ordering::Release);
            self.wait_all("collective (waiting for peers' data)", g, |j| {
                self.flags.ready(j).load(Ordering::Acquire)
            })?;
            if c == 0 {
                self.check_descs(s, desc, describe)?;
            }
            match mode {
                NodeMode::ReduceScatter | NodeMode::AllReduce => {
                    let (p, n) = piece(me);
                    let dst = if mode == NodeMode::ReduceScatter {
                        p
                    } else {
                        mine + (me * piece_cap) as u64
                    };
                    let off = (s * self.slot + me * piece_cap) as u64;
                    if let Some(k) = &kern {
                        launch_reduce(
                            &self.stream,
                            k,
                            self.sms,
                            dst,
                            self.table,
                            off,
                            l as i32,
                            (n / esz) as u64,
                        )
                        .map_err(|e| self.err("reduce kernel", e))?;
                    }
                    self.sync()?;
                    if mode == NodeMode::AllReduce {
                        self.flags.reduced(me).store(g, Ordering::Release);
                        self.wait_all("all-reduce (waiting for peers' reductions)", g, |j| {
                            self.flags.reduced(j).load(Ordering::Acquire)
                        })?;
                        for j in 0..l {
                            let (p, n) = piece(j);
                            self.copy(p, slot_base(j, s) + (j * piece_cap) as u64, n)?;
                        }
                        self.sync()?;
                    }
                }
                NodeMode::AllGather => {
                    for j in (0..l).filter(|&j| j != me) {
                        let (p, n) = piece(j);
                        self.copy(p, slot_base(j, s) + (j * piece_cap) as u64, n)?;
                    }
                    self.sync()?;
                }
                NodeMode::Broadcast { root } => {
                    if me != root {
                        let (p, n) = piece(0);
                        self.copy(p, slot_base(root, s), n)?;
                        self.sync()?;
                    }
                }
                NodeMode::AllReduceSmall | NodeMode::Reduce { .. } => {
                    unreachable!("rewritten above")
                }
                NodeMode::AllToAll => unreachable!("refused above"),
            }
            self.flags.done(me).store(g, Ordering::Release);
        }
        Ok(())
    }
}

impl NodeFabric for GpuFabric {
    fn ranks(&self) -> &[usize] {
        &self.ranks
    }
    unsafe fn node_op(&mut self, call: NodeOp<'_>) -> Result<()> {
        // this fabric does not read an out-of-place input directly: copy it in first
        self.run(call.in_place())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mps_pipe_follows_the_environment() {
        assert_eq!(
            mps_control_pipe(None),
            std::path::PathBuf::from("/tmp/nvidia-mps/control")
        );
        assert_eq!(
            mps_control_pipe(Some(std::ffi::OsStr::new(""))),
            std::path::PathBuf::from("/tmp/nvidia-mps/control")
        );
        assert_eq!(
            mps_control_pipe(Some(std::ffi::OsStr::new("/run/mps"))),
            std::path::PathBuf::from("/run/mps/control")
        );
    }

    #[test]
    fn slot_defaults_and_clamps() {
        assert_eq!(slot_bytes(None), DEFAULT_GPU_SLOT);
        assert_eq!(slot_bytes(Some(1)), 64 << 10);
        assert_eq!(slot_bytes(Some(u64::MAX)), 1 << 30);
        assert_eq!(slot_bytes(Some((16 << 20) + 5)), 16 << 20);
    }
}

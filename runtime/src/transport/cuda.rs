//! The GPU in-node fabric (cargo feature `cuda`): a [`NodeFabric`] over device memory, so the
//! executor runs the same plans on GPU buffers as on host buffers.
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

pub mod gdr;
pub mod ipc;
pub mod kernels;

use super::{Backoff, NodeFabric, NodeMode, NodeOp, DESC};
use crate::bootstrap::StoreClient;
use crate::error::{Error, Result};
use cudarc::driver::{sys, CudaContext, CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use ipc::{Access, GpuPeer, IpcHandle, Verdict};
use kernels::HalfImpl;
use railring_collectives::{DataType, ReduceOp};
use std::collections::HashMap;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// Default bytes of one device staging slot (two per rank): `RAILRING_GPU_SLOT`.
pub const DEFAULT_GPU_SLOT: usize = 4 << 20;

/// Is the CUDA driver library loadable? Never panics (only tries to dlopen it).
pub fn driver_present() -> bool {
    // SAFETY: is_culib_present only attempts to load the library and drops it.
    unsafe { sys::is_culib_present() }
}

/// Is NVRTC loadable?
pub fn nvrtc_present() -> bool {
    // SAFETY: as above.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

fn io_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

/// A CUDA failure as a runtime error.
pub fn cuda_err(rank: usize, what: impl Into<String>, e: impl std::fmt::Display) -> Error {
    Error::Transport {
        rank,
        what: what.into(),
        err: io_err(e),
    }
}

/// `Err` unless the driver library can be loaded: the guard in front of every CUDA call.
pub fn require_driver(rank: usize) -> Result<()> {
    if driver_present() {
        return Ok(());
    }
    Err(Error::Transport {
        rank,
        what: "CUDA".into(),
        err: io::Error::new(
            io::ErrorKind::NotFound,
            "the CUDA driver library (libcuda.so.1) is not present: device collectives need an NVIDIA driver",
        ),
    })
}

/// Run a CUDA call that may panic inside cudarc (a missing symbol in an old driver), turning
/// the panic into an error.
fn no_panic<T>(rank: usize, what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panic".into());
            Err(cuda_err(rank, what, msg))
        }
    }
}

/// The primary context of device `ordinal` (guarded: no driver, no device → `Err`).
pub fn context(rank: usize, ordinal: usize) -> Result<Arc<CudaContext>> {
    require_driver(rank)?;
    no_panic(rank, "creating a CUDA context", || {
        CudaContext::new(ordinal)
            .map_err(|e| cuda_err(rank, format!("CUDA context on device {ordinal}"), e))
    })
}

/// The PCI bus id of a device (`0000:3b:00.0`).
pub fn bus_id(dev: sys::CUdevice) -> io::Result<String> {
    let mut buf = [0 as std::ffi::c_char; 64];
    // SAFETY: buf holds 64 bytes as declared; the driver NUL-terminates.
    unsafe { sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as i32, dev) }
        .result()
        .map_err(io_err)?;
    // SAFETY: NUL-terminated by the driver (and the buffer is zeroed).
    let s = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    Ok(s.to_string_lossy().to_ascii_lowercase())
}

// ---------------------------------------------------------------------------------------------
// Kernels: compiled once per (device, dtype, op) and cached for the process
// ---------------------------------------------------------------------------------------------

/// The compiled kernels of one (dtype, op).
#[derive(Clone)]
pub struct OpKernels {
    pub reduce: CudaFunction,
    pub avg: Option<CudaFunction>,
    pub half: HalfImpl,
}

type KernelKey = (usize, DataType, ReduceOp);

fn kernel_cache() -> &'static Mutex<HashMap<KernelKey, OpKernels>> {
    static C: OnceLock<Mutex<HashMap<KernelKey, OpKernels>>> = OnceLock::new();
    C.get_or_init(|| Mutex::new(HashMap::new()))
}

fn compile_one(
    ctx: &Arc<CudaContext>,
    d: DataType,
    op: ReduceOp,
    half: HalfImpl,
    arch: Option<(i32, i32)>,
    includes: &[String],
) -> std::result::Result<OpKernels, String> {
    use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
    let src = kernels::module_source(d, op, half);
    let opts = CompileOptions {
        options: kernels::compile_options(arch, includes),
        name: Some(format!("{}.cu", kernels::reduce_kernel_name(d, op))),
        ..Default::default()
    };
    let ptx = compile_ptx_with_opts(&src, opts).map_err(|e| format!("NVRTC: {e}"))?;
    let module = ctx
        .load_module(ptx)
        .map_err(|e| format!("loading PTX: {e}"))?;
    let reduce = module
        .load_function(&kernels::reduce_kernel_name(d, op))
        .map_err(|e| e.to_string())?;
    let avg = if op == ReduceOp::Avg {
        Some(
            module
                .load_function(&kernels::avg_kernel_name(d))
                .map_err(|e| e.to_string())?,
        )
    } else {
        None
    };
    Ok(OpKernels { reduce, avg, half })
}

/// The kernels for (dtype, op) on `ctx`'s device, compiling them with NVRTC on first use. Half
/// types try the toolkit headers first, then the built-in variant; a too-new architecture for
/// this NVRTC is retried with NVRTC's default.
pub fn op_kernels(
    rank: usize,
    ctx: &Arc<CudaContext>,
    d: DataType,
    op: ReduceOp,
) -> Result<OpKernels> {
    let key = (ctx.ordinal(), d, op);
    if let Some(k) = kernel_cache()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&key)
    {
        return Ok(k.clone());
    }
    if !nvrtc_present() {
        return Err(Error::Transport {
            rank,
            what: "compiling reduction kernels".into(),
            err: io::Error::new(
                io::ErrorKind::NotFound,
                "NVRTC (libnvrtc.so) is not present: install the CUDA runtime compiler",
            ),
        });
    }
    let k = no_panic(rank, "compiling reduction kernels", || {
        let arch = ctx.compute_capability().ok();
        let includes = kernels::header_dirs();
        let halves: &[HalfImpl] =
            if matches!(d, DataType::F16 | DataType::Bf16) && !includes.is_empty() {
                &[HalfImpl::Headers, HalfImpl::Builtin]
            } else {
                &[HalfImpl::Builtin]
            };
        let mut errs = Vec::new();
        for &h in halves {
            for a in [arch, None] {
                match compile_one(ctx, d, op, h, a, &includes) {
                    Ok(k) => return Ok(k),
                    Err(e) => errs.push(format!("{h:?}/{a:?}: {e}")),
                }
                if arch.is_none() {
                    break;
                }
            }
        }
        Err(cuda_err(
            rank,
            format!("compiling the {d} {op} kernel"),
            errs.join("; "),
        ))
    })?;
    tracing::debug!(target: "railring::init", rank, "compiled {} ({:?} half types)", kernels::reduce_kernel_name(d, op), k.half);
    kernel_cache()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, k.clone());
    Ok(k)
}

fn sm_count(ctx: &CudaContext) -> u32 {
    ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .map(|v| v.max(1) as u32)
        .unwrap_or(1)
}

fn launch_cfg(n: u64, sms: u32) -> LaunchConfig {
    let d = kernels::launch_dims(n, sms);
    LaunchConfig {
        grid_dim: (d.grid, 1, 1),
        block_dim: (d.block, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Enqueue `dst[i] = src_0[i] op ... op src_{k-1}[i]` for `n` elements, `src_j = bases_j + off`
/// where `table` is a device array of the k base addresses.
///
/// # Safety
/// Every address must be valid device memory for `n` elements on `stream`'s device.
#[allow(clippy::too_many_arguments)]
pub unsafe fn launch_reduce(
    stream: &CudaStream,
    k: &OpKernels,
    sms: u32,
    dst: u64,
    table: u64,
    off: u64,
    nsrc: i32,
    n: u64,
) -> std::result::Result<(), cudarc::driver::DriverError> {
    if n == 0 {
        return Ok(());
    }
    stream
        .launch_builder(&k.reduce)
        .arg(&dst)
        .arg(&table)
        .arg(&off)
        .arg(&nsrc)
        .arg(&n)
        .launch(launch_cfg(n, sms))
        .map(|_| ())
}

/// Enqueue the division finishing an average of `ranks` contributions over `n` elements.
///
/// # Safety
/// `buf` must be valid device memory for `n` elements.
pub unsafe fn launch_avg(
    stream: &CudaStream,
    k: &OpKernels,
    sms: u32,
    buf: u64,
    n: u64,
    ranks: u32,
) -> std::result::Result<(), cudarc::driver::DriverError> {
    let Some(f) = &k.avg else {
        return Ok(());
    };
    if n == 0 || ranks <= 1 {
        return Ok(());
    }
    stream
        .launch_builder(f)
        .arg(&buf)
        .arg(&n)
        .arg(&ranks)
        .launch(launch_cfg(n, sms))
        .map(|_| ())
}

// ---------------------------------------------------------------------------------------------
// Pinned host memory (the staging path)
// ---------------------------------------------------------------------------------------------

/// Page-locked host memory from `cuMemHostAlloc`, grown on demand.
pub struct PinnedBuf {
    ptr: *mut u8,
    len: usize,
    ctx: Arc<CudaContext>,
}

// SAFETY: plain host memory owned by this value.
unsafe impl Send for PinnedBuf {}

impl PinnedBuf {
    pub fn new(ctx: Arc<CudaContext>) -> PinnedBuf {
        PinnedBuf {
            ptr: std::ptr::null_mut(),
            len: 0,
            ctx,
        }
    }

    /// At least `len` bytes (contents not preserved when it grows).
    pub fn ensure(
        &mut self,
        len: usize,
    ) -> std::result::Result<*mut u8, cudarc::driver::DriverError> {
        if len > self.len || self.ptr.is_null() {
            self.free();
            self.ctx.bind_to_thread()?;
            let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
            // SAFETY: allocating len.max(1) bytes of portable pinned memory.
            unsafe {
                sys::cuMemHostAlloc(&mut p, len.max(1), 0x1 /* PORTABLE */)
            }
            .result()?;
            self.ptr = p as *mut u8;
            self.len = len.max(1);
        }
        Ok(self.ptr)
    }

    fn free(&mut self) {
        if !self.ptr.is_null() {
            let _ = self.ctx.bind_to_thread();
            // SAFETY: allocated by cuMemHostAlloc above, freed once.
            unsafe {
                let _ = sys::cuMemFreeHost(self.ptr as *mut _);
            }
            self.ptr = std::ptr::null_mut();
            self.len = 0;
        }
    }
}

impl Drop for PinnedBuf {
    fn drop(&mut self) {
        self.free();
    }
}

// ---------------------------------------------------------------------------------------------
// Host flag segment (synchronisation between local ranks)
// ---------------------------------------------------------------------------------------------

const FMAGIC: u64 = 0x5241_494c_4750_5531; // "RAILGPU1"
const FHDR: usize = 64;
const FCTL: usize = 384;

/// Per local rank: `ready`, `reduced`, `done` generation counters on their own cache lines,
/// its pid, and the call descriptor of each slot.
struct FlagSeg {
    seg: super::shm::Segment,
}

impl FlagSeg {
    fn map(path: &std::path::Path, l: usize, create: bool) -> io::Result<FlagSeg> {
        let len = FHDR + l * FCTL;
        let seg = super::shm::Segment::map(path, len, create)?;
        let s = FlagSeg { seg };
        if create {
            s.at::<AtomicU64>(0).store(FMAGIC, Ordering::Release);
        } else if s.at::<AtomicU64>(0).load(Ordering::Acquire) != FMAGIC {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "not a railring GPU flag segment",
            ));
        }
        Ok(s)
    }
    fn at<T>(&self, off: usize) -> &T {
        debug_assert!(off + std::mem::size_of::<T>() <= self.seg.len());
        // SAFETY: offsets are inside the mapping and 8-aligned; atomics accept any bits.
        unsafe { &*(self.seg.base().add(off) as *const T) }
    }
    fn ready(&self, i: usize) -> &AtomicU64 {
        self.at(FHDR + i * FCTL)
    }
    fn reduced(&self, i: usize) -> &AtomicU64 {
        self.at(FHDR + i * FCTL + 64)
    }
    fn done(&self, i: usize) -> &AtomicU64 {
        self.at(FHDR + i * FCTL + 128)
    }
    fn pid(&self, i: usize) -> &AtomicU32 {
        self.at(FHDR + i * FCTL + 192)
    }
    fn desc(&self, i: usize, slot: usize) -> *mut u8 {
        // SAFETY: bytes 256..384 of the control block.
        unsafe { self.seg.base().add(FHDR + i * FCTL + 256 + slot * DESC) }
    }
    fn alive(&self, i: usize) -> bool {
        let pid = self.pid(i).load(Ordering::Acquire);
        if pid == 0 {
            return true;
        }
        // SAFETY: signal 0 only checks for existence.
        let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
        r == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
    }
}

// ---------------------------------------------------------------------------------------------
// The fabric
// ---------------------------------------------------------------------------------------------

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

fn fnv(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// Where a node's GPU flag segment lives.
pub fn flags_path(job: &str, comm: u64, epoch: u64, host_id: &str) -> PathBuf {
    let job: String = job
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .take(32)
        .collect();
    PathBuf::from(format!(
        "/dev/shm/railring-gpu-{job}-{comm:x}-{epoch}-{:x}",
        fnv(host_id)
    ))
}

/// What [`gpu_fabric`] needs to know about the communicator.
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
}

impl FabricSetup<'_> {
    /// Store key prefix of this node's set-up (nodes set up their fabrics side by side).
    fn prefix(&self) -> String {
        format!(
            "{}/n{}",
            ipc::prefix(self.comm, self.epoch),
            self.local.first().copied().unwrap_or(0)
        )
    }
}

/// Build the in-node GPU path for a device: `Direct` when every local rank can read every
/// peer's staging buffer, else `Staged` with the reason (logged at INFO). Collective over the
/// local ranks (they all call it at the same point, with the same epoch).
pub fn gpu_fabric(s: &FabricSetup<'_>, ctx: &Arc<CudaContext>) -> Result<GpuPath> {
    let rank = s.local[s.me];
    let l = s.local.len();
    let prefix = s.prefix();
    let slot = std::env::var("RAILRING_GPU_SLOT")
        .ok()
        .and_then(|v| crate::config::parse_size(&v))
        .map(|v| (v as usize).clamp(64 << 10, 1 << 30))
        .unwrap_or(DEFAULT_GPU_SLOT)
        & !4095;
    ctx.bind_to_thread()
        .map_err(|e| cuda_err(rank, "binding the CUDA context", e))?;
    let my_dev = ctx.cu_device();
    let my_bus = bus_id(my_dev).map_err(|e| cuda_err(rank, "reading the GPU's PCI bus id", e))?;

    // Allocate and export the staging buffer (cuMemAlloc: pool allocations cannot be exported).
    let mut scratch: sys::CUdeviceptr = 0;
    // SAFETY: plain device allocation of 2 slots, released in GpuFabric::drop or below.
    let alloc = unsafe { sys::cuMemAlloc_v2(&mut scratch, 2 * slot) }.result();
    let (handle, note) = match alloc {
        Err(e) => (None, Some(format!("cuMemAlloc of {} bytes: {e}", 2 * slot))),
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
    let free_scratch = |p: sys::CUdeviceptr| {
        if p != 0 {
            // SAFETY: allocated above, not shared yet (or every peer agreed not to use it).
            unsafe {
                let _ = sys::cuMemFree_v2(p);
            }
        }
    };
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
            free_scratch(scratch);
            return Err(e);
        }
    };
    if peers.iter().any(|p| p.bytes != 2 * slot) {
        free_scratch(scratch);
        return Err(Error::Invalid(
            "local ranks disagree on RAILRING_GPU_SLOT: set it identically for every rank".into(),
        ));
    }
    let access = ipc::plan_access(s.me, &peers, &my_bus, |p| {
        let c = std::ffi::CString::new(p.bus_id.clone()).ok()?;
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
    });
    // Open every peer's buffer now, so an IPC failure is part of the verdict.
    let mut bases = vec![0u64; l];
    let mut opened = vec![false; l];
    let mut problem = access.as_ref().err().cloned();
    if problem.is_none() {
        for (j, p) in peers.iter().enumerate() {
            if j == s.me {
                bases[j] = scratch;
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
                    bases[j] = dp;
                    opened[j] = true;
                }
                Err(e) => {
                    problem = Some(format!(
                        "cuIpcOpenMemHandle of rank {}'s buffer (GPU {}): {e}",
                        p.rank, p.bus_id
                    ));
                    break;
                }
            }
        }
    }
    let close_all = |bases: &[u64], opened: &[bool]| {
        for (j, &o) in opened.iter().enumerate() {
            if o {
                // SAFETY: opened above, closed once.
                unsafe {
                    let _ = sys::cuIpcCloseMemHandle(bases[j]);
                }
            }
        }
    };
    let verdict = Verdict {
        rank,
        problem: problem.clone(),
    };
    let agreed = match ipc::agree(s.store, &prefix, s.me, l, &verdict, s.timeout) {
        Ok(a) => a,
        Err(e) => {
            close_all(&bases, &opened);
            free_scratch(scratch);
            return Err(e);
        }
    };
    if let Err(why) = agreed {
        close_all(&bases, &opened);
        free_scratch(scratch);
        tracing::info!(target: "railring::init", rank, "GPU in-node path: staging through pinned host memory ({why})");
        return Ok(GpuPath::Staged(why));
    }
    let paths: Vec<String> = access
        .unwrap_or_default()
        .iter()
        .zip(&peers)
        .filter(|(a, _)| **a != Access::Local)
        .map(|(a, p)| match a {
            Access::SameDevice => format!("rank {}: same GPU (IPC)", p.rank),
            _ => format!(
                "rank {}: peer access to GPU {} ({})",
                p.rank,
                p.bus_id,
                link_label(&my_bus, &p.bus_id)
            ),
        })
        .collect();
    tracing::info!(target: "railring::init", rank, "GPU in-node path: direct reads of peers' device buffers on GPU {my_bus}; {}", paths.join(", "));

    // The device table of peers' bases, and the flag segment.
    let fail = |e: Error, table: u64| {
        close_all(&bases, &opened);
        free_scratch(scratch);
        free_scratch(table);
        e
    };
    let mut table: sys::CUdeviceptr = 0;
    // SAFETY: allocating and filling l u64s.
    let r = unsafe {
        sys::cuMemAlloc_v2(&mut table, 8 * l)
            .result()
            .and_then(|_| sys::cuMemcpyHtoD_v2(table, bases.as_ptr() as *const _, 8 * l).result())
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
    Ok(GpuPath::Direct(Box::new(GpuFabric {
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
    })))
}

fn open_flags(s: &FabricSetup<'_>, l: usize) -> Result<FlagSeg> {
    let rank = s.local[s.me];
    let path = flags_path(s.job, s.comm, s.epoch, s.host_id);
    let prefix = s.prefix();
    let err = |what: &str, e: io::Error| Error::Shm {
        rank,
        what: format!("{what} {}", path.display()),
        err: e,
    };
    let seg = if s.me == 0 {
        let _ = std::fs::remove_file(&path);
        let f = FlagSeg::map(&path, l, true).map_err(|e| err("creating", e))?;
        s.store.set(&format!("{prefix}/flags"), b"1")?;
        f
    } else {
        s.store.get(&format!("{prefix}/flags"), s.timeout)?;
        FlagSeg::map(&path, l, false).map_err(|e| err("opening", e))?
    };
    if s.store.add(&format!("{prefix}/flags-mapped"), 1)? == l as i64 {
        let _ = std::fs::remove_file(&path);
    }
    Ok(seg)
}

/// "NVLink" / "PCIe P2P" for log lines, from the topology when it knows both GPUs.
fn link_label(a: &str, b: &str) -> String {
    let Ok(t) = crate::topology::Topology::discover() else {
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
            NodeMode::AllReduceSmall => NodeMode::AllReduce,
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
                NodeMode::AllReduceSmall => unreachable!("rewritten above"),
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
    fn no_driver_is_a_clean_error() {
        if driver_present() {
            eprintln!(
                "SKIPPED: a CUDA driver is present here; the no-driver path is not exercised"
            );
            return;
        }
        let e = require_driver(3).unwrap_err();
        assert!(e.to_string().contains("libcuda.so.1"), "{e}");
        assert!(e.to_string().starts_with("rank 3"), "{e}");
        let e = context(0, 0).unwrap_err();
        assert!(e.to_string().contains("not present"), "{e}");
    }

    #[test]
    fn panics_inside_cuda_calls_become_errors() {
        let r: Result<()> = no_panic(1, "x", || panic!("Missing symbol cuFoo"));
        let e = r.unwrap_err().to_string();
        assert!(e.contains("Missing symbol cuFoo"), "{e}");
    }

    #[test]
    fn flag_paths_are_clean() {
        let p = flags_path("job/../x y", 0x1f, 7, "host-a");
        let s = p.to_string_lossy();
        assert!(s.starts_with("/dev/shm/railring-gpu-jobxy-1f-7-"), "{s}");
        assert_ne!(flags_path("j", 1, 1, "a"), flags_path("j", 1, 1, "b"));
    }

    #[test]
    fn flag_segment_round_trip() {
        let path = std::env::temp_dir().join(format!("rr-gpu-flags-test-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let a = FlagSeg::map(&path, 3, true).unwrap();
        let b = FlagSeg::map(&path, 3, false).unwrap();
        a.ready(2).store(9, Ordering::Release);
        assert_eq!(b.ready(2).load(Ordering::Acquire), 9);
        b.pid(1).store(std::process::id(), Ordering::Release);
        assert!(a.alive(1));
        assert!(a.alive(0), "unset pid counts as alive (not started)");
        assert!(
            FlagSeg::map(&path, 4, false).is_err(),
            "too small for 4 ranks"
        );
        std::fs::write(&path, vec![0u8; 4096]).unwrap();
        assert!(FlagSeg::map(&path, 3, false).is_err(), "wrong magic");
        let _ = std::fs::remove_file(&path);
    }
}

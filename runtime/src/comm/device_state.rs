//! The device side of a communicator (feature `cuda`): device calls run in the communicator's
//! call order (`blocking` / `submit`), under its poisoning rules, through the same executor and
//! plans as host calls, without adding fields to `Inner`. [`super::device`] is the public API
//! over this.
//!
//! Per-communicator device state (the GPU fabric, an internal stream, a pinned staging buffer)
//! lives in a registry keyed by the communicator's shared state, held weakly: it is created
//! collectively on the first device call and dropped with the last handle that looks it up
//! after the communicator is gone.

use super::call::{Inner, Shape};
use super::{Communicator, Pending, Shared};
use crate::error::{Error, Result};
use crate::executor::{Bufs, Executor, Links, DEVICE_CHAN};
#[cfg(feature = "rdma")]
use crate::transport::cuda::gdr;
use crate::transport::cuda::gdr::CudaDataMem;
use crate::transport::cuda::ipc::{self, Verdict};
use crate::transport::cuda::{
    cuda_err, gpu_fabric, require_driver, FabricSetup, GpuPath, PinnedBuf,
};
use crate::transport::NodeFabric;
use cudarc::driver::{sys, CudaContext, CudaEvent, CudaStream};
use railring_collectives::plan::{Algo, CollKind};
use railring_collectives::{DataType, ReduceOp};
use std::sync::{Arc, Mutex, OnceLock, Weak};

/// A device all-reduce's buffer (device address and length) and its reduction.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DeviceBuf {
    pub ptr: u64,
    pub bytes: usize,
    pub dtype: DataType,
    pub op: ReduceOp,
}

/// A communicator's device resources.
pub(crate) struct DeviceState {
    ordinal: usize,
    /// The stream device collectives run on (the fabric's, when there is one).
    stream: Arc<CudaStream>,
    path: GpuPath,
    /// Several nodes and every node has a direct GPU fabric (agreed by all ranks): in-node steps
    /// run on the device, network steps on a pinned host copy of this rank's slice only.
    hybrid: bool,
    /// Hybrid, and every rank agreed to GPUDirect RDMA: the network steps run on the device
    /// buffer itself (device-resident link rings, received chunks reduced by a kernel) instead
    /// of a pinned host copy of the slice.
    gdr: Option<CudaDataMem>,
    pinned: PinnedBuf,
}

/// The links of device network steps: the same peers on channels flagged [`DEVICE_CHAN`]
/// (GPUDirect links, rings in device memory).
struct DeviceChannels<'a>(&'a mut dyn Links);

impl Links for DeviceChannels<'_> {
    fn link(&mut self, peer: usize, chan: usize) -> Result<*mut dyn crate::transport::Link> {
        self.0.link(peer, chan | DEVICE_CHAN)
    }
    fn host_of(&self, peer: usize) -> String {
        self.0.host_of(peer)
    }
}

/// Why this rank cannot run its network steps on device memory (`Ok(())`: it can).
#[cfg(feature = "rdma")]
fn gpudirect_verdict(g: &Inner, ctx: &Arc<CudaContext>) -> std::result::Result<(), String> {
    use crate::transport::rdma::{gpu_nic_path, gpudirect_at};
    let Some(net) = g.links.rdma() else {
        return Err("the network is TCP sockets".into());
    };
    let Some(level) = g.world.cfg.gdr_level else {
        return Err("RAILRING_NET_GDR_LEVEL=LOC".into());
    };
    if let Some(why) = gdr::gdr_unsupported(ctx) {
        return Err(why);
    }
    if !crate::transport::cuda::nvrtc_present() {
        return Err("NVRTC (libnvrtc.so) is not present to compile the reduction kernels".into());
    }
    let hca = net.hca_for_rail(g.rail).to_string();
    let busid = crate::transport::cuda::bus_id(ctx.cu_device())
        .map_err(|e| format!("PCI bus id of GPU {}: {e}", ctx.ordinal()))?;
    let topo = g
        .world
        .cfg
        .topology()
        .map_err(|e| format!("topology unknown ({e})"))?;
    let path = gpu_nic_path(&topo, &busid, &hca);
    if !gpudirect_at(path, Some(level)) {
        return Err(format!(
            "GPU {busid} -> {hca} is {}, beyond RAILRING_NET_GDR_LEVEL={level}",
            path.map(|p| p.to_string())
                .unwrap_or_else(|| "an unknown path".into())
        ));
    }
    gdr::CudaRings::new(ctx)
        .and_then(|r| net.probe_device_rings(g.rail, &r))
        .map_err(|e| e.to_string())
}

/// Decide GPUDirect RDMA for the network steps, collectively (every rank's links on the
/// device channels must exist at both ends): all ranks can, or none uses it. Everything that
/// can fail on one rank is tried before the agreement and counts as that rank's reason.
fn agree_gpudirect(
    g: &mut Inner,
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
) -> Result<Option<CudaDataMem>> {
    let rank = g.rank;
    #[cfg(feature = "rdma")]
    let mine = gpudirect_verdict(g, ctx);
    #[cfg(not(feature = "rdma"))]
    let mine: std::result::Result<(), String> =
        Err("built without the rdma feature (TCP sockets)".into());
    let mut mem = None;
    let mine = mine.and_then(|()| {
        CudaDataMem::new(rank, ctx, stream.clone())
            .map(|m| mem = Some(m))
            .map_err(|e| e.to_string())
    });
    let store = g
        .world
        .store
        .clone()
        .ok_or_else(|| Error::Invalid("several nodes but no store".into()))?;
    let verdict = Verdict {
        rank,
        problem: mine.err(),
    };
    let prefix = agreement(g, "gdr");
    match ipc::agree(&store, &prefix, rank, g.size, &verdict, g.world.cfg.timeout)? {
        Ok(()) => {
            tracing::info!(target: "railring::init", rank, "GPUDirect RDMA: network steps read and write device memory (link rings on the GPU)");
            #[cfg(feature = "rdma")]
            {
                let c = ctx.clone();
                g.links.set_device_rings(Arc::new(move || {
                    gdr::CudaRings::new(&c)
                        .map(|r| Box::new(r) as Box<dyn crate::transport::rdma::DeviceRings>)
                }));
            }
            Ok(mem)
        }
        Err(why) => {
            tracing::info!(target: "railring::init", rank, "no GPUDirect RDMA ({why}): network steps on a pinned host copy");
            Ok(None)
        }
    }
}

/// Store prefix of one world-wide agreement of this communicator's device set-up.
fn agreement(g: &Inner, what: &str) -> String {
    format!("{}/{what}", ipc::prefix(g.comm, g.seq))
}

type Slot = Arc<Mutex<Option<DeviceState>>>;
type Registry = Mutex<Vec<(Weak<Shared>, Slot)>>;

fn registry() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(|| Mutex::new(Vec::new()))
}

/// This communicator's device slot (empty until the first device call fills it collectively).
fn slot_of(c: &Communicator) -> Slot {
    let mut r = registry().lock().unwrap_or_else(|e| e.into_inner());
    r.retain(|(w, _)| w.strong_count() > 0);
    if let Some((_, s)) = r
        .iter()
        .find(|(w, _)| std::ptr::eq(w.as_ptr(), Arc::as_ptr(&c.sh)))
    {
        return s.clone();
    }
    let s: Slot = Arc::new(Mutex::new(None));
    r.push((Arc::downgrade(&c.sh), s.clone()));
    s
}

/// Set up the device state on the first call (collective: every rank makes its first device
/// call at the same point of the call order).
fn ensure_state<'a>(
    g: &mut Inner,
    slot: &'a mut Option<DeviceState>,
    ctx: &Arc<CudaContext>,
) -> Result<&'a mut DeviceState> {
    if let Some(st) = slot.as_ref() {
        if st.ordinal != ctx.ordinal() {
            return Err(Error::Invalid(format!(
                "device collectives on this communicator use GPU {}; this buffer is on GPU {} \
                 (use one device per communicator)",
                st.ordinal,
                ctx.ordinal()
            )));
        }
    } else {
        let rank = g.rank;
        let node = g
            .layout
            .locate(rank)
            .map(|(n, _)| n)
            .ok_or_else(|| Error::Invalid("rank missing from layout".into()))?;
        let local = g.layout.nodes[node].clone();
        let me = local.iter().position(|&r| r == rank).unwrap_or(0);
        let nodes = g.layout.nodes.len();
        let path = if g.size == 1 {
            GpuPath::Staged("a single rank".into())
        } else if local.len() == 1 {
            GpuPath::Staged("one rank on this node: nothing to do in the node".into())
        } else {
            let store = g
                .world
                .store
                .clone()
                .ok_or_else(|| Error::Invalid("several local ranks but no store".into()))?;
            let host_id = g
                .world
                .peers
                .get(rank)
                .map(|p| p.host_id.clone())
                .unwrap_or_default();
            let setup = FabricSetup {
                store: &store,
                comm: g.comm,
                epoch: g.seq,
                job: &g.world.job,
                host_id: &host_id,
                host: crate::machine::hostname(),
                local: &local,
                me,
                timeout: g.world.cfg.timeout,
                gpu_slot: g.world.cfg.gpu_slot,
                mps_pipe_dir: g.world.cfg.mps_pipe_dir.as_deref(),
                topo_file: g.world.cfg.topo_file.as_deref(),
            };
            match gpu_fabric(&setup, ctx) {
                Ok(p) => p,
                Err(e) if nodes > 1 => {
                    // The ranks of other nodes are about to wait for this rank's verdict on
                    // the world path: give it (they stage) rather than leave them waiting
                    // until the timeout, then fail this call.
                    if let Some(store) = g.world.store.clone() {
                        let v = Verdict {
                            rank,
                            problem: Some(format!("GPU fabric setup failed: {e}")),
                        };
                        let prefix = agreement(g, "world");
                        let _ = ipc::agree(&store, &prefix, rank, g.size, &v, g.world.cfg.timeout);
                    }
                    return Err(e);
                }
                Err(e) => return Err(e),
            }
        };
        // Across nodes every rank must run the same plan: the hybrid path only when every
        // node has a direct fabric (agreed through the store by all ranks), else all stage.
        let hybrid = if nodes > 1 && g.size > 1 {
            let store = g
                .world
                .store
                .clone()
                .ok_or_else(|| Error::Invalid("several nodes but no store".into()))?;
            let mine = Verdict {
                rank,
                problem: match &path {
                    GpuPath::Direct(_) => None,
                    // a node of one rank has no in-node steps to run
                    GpuPath::Staged(_) if local.len() == 1 => None,
                    GpuPath::Staged(why) => Some(why.clone()),
                },
            };
            let prefix = agreement(g, "world");
            match ipc::agree(&store, &prefix, rank, g.size, &mine, g.world.cfg.timeout)? {
                Ok(()) => {
                    if local.len() == 1 {
                        tracing::info!(target: "railring::init", rank, "GPU collectives across {nodes} nodes, one rank per node: the network ring on the device buffer where GPUDirect RDMA is agreed, else on a pinned host copy");
                    } else {
                        tracing::info!(target: "railring::init", rank, "GPU collectives across {nodes} nodes: in-node steps on the GPUs, network steps on a pinned host copy of each rank's 1/{} slice (or the slice itself with GPUDirect RDMA)", local.len());
                    }
                    true
                }
                Err(why) => {
                    tracing::info!(target: "railring::init", rank, "GPU collectives across {nodes} nodes: staging whole buffers through pinned host memory ({why})");
                    false
                }
            }
        } else {
            false
        };
        let stream = match &path {
            GpuPath::Direct(f) => f.stream().clone(),
            GpuPath::Staged(_) => ctx
                .new_stream()
                .map_err(|e| cuda_err(rank, "creating a CUDA stream", e))?,
        };
        let gdr = if hybrid {
            agree_gpudirect(g, ctx, &stream)?
        } else {
            None
        };
        *slot = Some(DeviceState {
            ordinal: ctx.ordinal(),
            stream,
            path,
            hybrid,
            gdr,
            pinned: PinnedBuf::new(ctx.clone()),
        });
    }
    slot.as_mut()
        .ok_or_else(|| Error::Invalid("device state missing".into()))
}

/// One device all-reduce inside the communicator's call order. Waits for `ready` (recorded on
/// the caller's stream) before touching the buffer; returns an event recorded after the last
/// write, for the caller's stream to wait on.
fn run_all_reduce(
    g: &mut Inner,
    slot: &Slot,
    ctx: &Arc<CudaContext>,
    buf: DeviceBuf,
    ready: &CudaEvent,
) -> Result<CudaEvent> {
    let DeviceBuf {
        ptr,
        bytes,
        dtype,
        op,
    } = buf;
    let rank = g.rank;
    ctx.bind_to_thread()
        .map_err(|e| cuda_err(rank, "binding the CUDA context", e))?;
    let mut guard = slot.lock().unwrap_or_else(|e| e.into_inner());
    let st = ensure_state(g, &mut guard, ctx)?;
    st.stream
        .wait(ready)
        .map_err(|e| cuda_err(rank, "ordering after the caller's stream", e))?;
    let esz = dtype.size();
    let count = bytes / esz;
    if g.size == 1 {
        g.next_desc(Shape::new(CollKind::AllReduce, dtype, op, count, 0));
    } else {
        let single_node = g.layout.nodes.len() == 1;
        let direct = match &mut st.path {
            GpuPath::Direct(fab) if single_node || st.hybrid => {
                // A non-uniform layout has no two-level plan: stage (every rank decides alike).
                let split = g
                    .plan(CollKind::AllReduce, Algo::TwoLevel, count, 0)
                    .ok()
                    .and_then(|p| p.split_for_device());
                match split {
                    Some(split) => {
                        let desc =
                            g.next_desc(Shape::new(CollKind::AllReduce, dtype, op, count, 0));
                        let fabric: &mut (dyn NodeFabric + 'static) = &mut **fab;
                        // SAFETY: `ptr` is device memory of `bytes` bytes on the fabric's device
                        // (checked by the caller); `pre`/`post` hold only in-node steps, which the
                        // GPU fabric runs with device copies and kernels (the host never
                        // dereferences it).
                        unsafe {
                            run_steps(
                                g,
                                Some(&mut *fabric),
                                &split.pre,
                                &desc,
                                op,
                                ptr as *mut u8,
                                bytes,
                            )?
                        };
                        if let (false, Some(mem)) = (split.net.steps.is_empty(), st.gdr.as_mut()) {
                            // SAFETY: `ptr` is device memory of `bytes` bytes on the device the
                            // GPUDirect links' rings and `mem` are on; the network steps touch
                            // only their regions of it, through the links and `mem`.
                            unsafe {
                                run_net_on_device(
                                    g,
                                    mem,
                                    &split.net,
                                    &desc,
                                    op,
                                    ptr as *mut u8,
                                    bytes,
                                )?
                            };
                        } else if !split.net.steps.is_empty() {
                            let (lo, hi) = (split.net_range.0 * esz, split.net_range.1 * esz);
                            let host = st.pinned.ensure(bytes).map_err(|e| {
                                cuda_err(
                                    rank,
                                    format!("allocating {bytes} bytes of pinned memory"),
                                    e,
                                )
                            })?;
                            if hi > lo {
                                // SAFETY: [lo, hi) lies inside both buffers of `bytes` bytes.
                                unsafe {
                                    sys::cuMemcpyDtoHAsync_v2(
                                        host.add(lo) as *mut _,
                                        ptr + lo as u64,
                                        hi - lo,
                                        st.stream.cu_stream(),
                                    )
                                }
                                .result()
                                .map_err(|e| {
                                    cuda_err(rank, "copying this rank's slice to host", e)
                                })?;
                                st.stream
                                    .synchronize()
                                    .map_err(|e| cuda_err(rank, "waiting for the GPU", e))?;
                            }
                            // SAFETY: pinned host memory of `bytes` bytes, ours while locked; the
                            // network steps touch only [lo, hi), just copied from the device.
                            unsafe { run_steps(g, None, &split.net, &desc, op, host, bytes)? };
                            if hi > lo {
                                // SAFETY: as above, host to device.
                                unsafe {
                                    sys::cuMemcpyHtoDAsync_v2(
                                        ptr + lo as u64,
                                        host.add(lo) as *const _,
                                        hi - lo,
                                        st.stream.cu_stream(),
                                    )
                                }
                                .result()
                                .map_err(|e| {
                                    cuda_err(
                                        rank,
                                        "copying this rank's slice back to the device",
                                        e,
                                    )
                                })?;
                                // the pinned buffer is reused by the next call
                                st.stream
                                    .synchronize()
                                    .map_err(|e| cuda_err(rank, "waiting for the GPU", e))?;
                            }
                        }
                        // SAFETY: as for `pre`.
                        unsafe {
                            run_steps(
                                g,
                                Some(fabric),
                                &split.post,
                                &desc,
                                op,
                                ptr as *mut u8,
                                bytes,
                            )?
                        };
                        if op == ReduceOp::Avg && count > 0 {
                            fab.finish_avg(ptr, count, dtype, g.size)?;
                        }
                        true
                    }
                    None => false,
                }
            }
            GpuPath::Staged(_) if st.hybrid && st.gdr.is_some() => {
                // One rank per node with GPUDirect RDMA: the plan is the network ring alone,
                // run on the device buffer itself (every rank decides alike: same layout, same
                // agreements).
                let split = g
                    .plan(CollKind::AllReduce, Algo::TwoLevel, count, 0)
                    .ok()
                    .and_then(|p| p.split_for_device())
                    .filter(|s| s.pre.steps.is_empty() && s.post.steps.is_empty());
                match (split, st.gdr.as_mut()) {
                    (Some(split), Some(mem)) => {
                        let desc =
                            g.next_desc(Shape::new(CollKind::AllReduce, dtype, op, count, 0));
                        // SAFETY: as for the network steps above.
                        unsafe {
                            run_net_on_device(g, mem, &split.net, &desc, op, ptr as *mut u8, bytes)?
                        };
                        if op == ReduceOp::Avg && count > 0 {
                            mem.finish_avg(ptr, count, dtype, g.size)?;
                        }
                        true
                    }
                    _ => false,
                }
            }
            _ => false,
        };
        if !direct {
            staged(g, st, ptr, bytes, dtype, op)?;
        }
    }
    st.stream
        .record_event(None)
        .map_err(|e| cuda_err(rank, "recording completion", e))
}

/// Run some steps of a plan through the communicator's executor on `work`: in-node steps on
/// `fabric` (the GPU fabric, for device memory), network steps on the communicator's links.
///
/// # Safety
/// `work` valid for `bytes` bytes of the kind the steps' transports read and write.
unsafe fn run_steps(
    g: &mut Inner,
    fabric: Option<&mut (dyn NodeFabric + 'static)>,
    plan: &railring_collectives::plan::Plan,
    desc: &crate::executor::CallDesc,
    op: ReduceOp,
    work: *mut u8,
    bytes: usize,
) -> Result<()> {
    if plan.steps.is_empty() {
        return Ok(());
    }
    let mut ex = Executor {
        rank: g.rank,
        size: g.size,
        links: &mut g.links,
        fabric,
        timeout: g.world.cfg.timeout,
        chunk: g.world.cfg.net_chunk,
        staging: &mut g.staging,
        mem: None,
    };
    let bufs = Bufs {
        work,
        work_bytes: bytes,
        input: std::ptr::null(),
        input_bytes: 0,
        src: None,
        scratch: std::ptr::null_mut(),
        scratch_bytes: 0,
    };
    ex.run(plan, desc, op, bufs)
}

/// Run the network steps of a plan on device memory: GPUDirect links (device channels),
/// received chunks reduced on the device by `mem`. First waits for `mem`'s stream (the
/// device state's), so the caller's work and the in-node steps have written the buffer before
/// the links read it.
///
/// # Safety
/// `work` device memory of `bytes` bytes on `mem`'s device.
unsafe fn run_net_on_device(
    g: &mut Inner,
    mem: &mut CudaDataMem,
    plan: &railring_collectives::plan::Plan,
    desc: &crate::executor::CallDesc,
    op: ReduceOp,
    work: *mut u8,
    bytes: usize,
) -> Result<()> {
    if plan.steps.is_empty() {
        return Ok(());
    }
    mem.synchronize()?;
    let mut links = DeviceChannels(&mut g.links);
    let mut ex = Executor {
        rank: g.rank,
        size: g.size,
        links: &mut links,
        fabric: None,
        timeout: g.world.cfg.timeout,
        // Each device reduction of a received chunk is a launch plus a wait (~10 us): at least
        // 2 MiB per chunk keeps that small next to the transfer, and half a link ring stays free
        // for the NIC meanwhile.
        chunk: g.world.cfg.net_chunk.max(2 << 20),
        staging: &mut g.staging,
        mem: Some(mem),
    };
    let bufs = Bufs {
        work,
        work_bytes: bytes,
        input: std::ptr::null(),
        input_bytes: 0,
        src: None,
        scratch: std::ptr::null_mut(),
        scratch_bytes: 0,
    };
    ex.run(plan, desc, op, bufs)
}

/// Copy to pinned host memory, run the host collective (same executor, shm fabric and network
/// links), copy back.
fn staged(
    g: &mut Inner,
    st: &mut DeviceState,
    ptr: u64,
    bytes: usize,
    dtype: DataType,
    op: ReduceOp,
) -> Result<()> {
    let rank = g.rank;
    let host = st.pinned.ensure(bytes).map_err(|e| {
        cuda_err(
            rank,
            format!("allocating {bytes} bytes of pinned memory"),
            e,
        )
    })?;
    if bytes > 0 {
        // SAFETY: host has at least `bytes` bytes; ptr is device memory of `bytes` bytes.
        unsafe { sys::cuMemcpyDtoHAsync_v2(host as *mut _, ptr, bytes, st.stream.cu_stream()) }
            .result()
            .map_err(|e| cuda_err(rank, "copying device data to host", e))?;
        st.stream
            .synchronize()
            .map_err(|e| cuda_err(rank, "waiting for the GPU", e))?;
    }
    // SAFETY: pinned host memory of at least `bytes` bytes, owned by the state we hold locked.
    let buf = unsafe { std::slice::from_raw_parts_mut(host, bytes) };
    g.all_reduce(buf, dtype, op)?;
    if bytes > 0 {
        // SAFETY: as above, host to device.
        unsafe { sys::cuMemcpyHtoDAsync_v2(ptr, host as *const _, bytes, st.stream.cu_stream()) }
            .result()
            .map_err(|e| cuda_err(rank, "copying the result to the device", e))?;
        // The pinned buffer is reused by the next call: finish the copy before returning it.
        st.stream
            .synchronize()
            .map_err(|e| cuda_err(rank, "waiting for the GPU", e))?;
    }
    Ok(())
}

/// Blocking form: runs in call order on the caller's thread.
pub(crate) fn all_reduce_device(
    c: &Communicator,
    ctx: &Arc<CudaContext>,
    buf: DeviceBuf,
    ready: &CudaEvent,
) -> Result<CudaEvent> {
    require_driver(c.rank())?;
    let slot = slot_of(c);
    c.blocking(|g| run_all_reduce(g, &slot, ctx, buf, ready))
}

/// Non-blocking form: queued behind earlier non-blocking calls on the communicator's worker.
/// `finish` runs on the worker after the collective, with its completion event.
pub(crate) fn all_reduce_device_start<R: Send + 'static>(
    c: &Communicator,
    ctx: Arc<CudaContext>,
    buf: DeviceBuf,
    ready: CudaEvent,
    finish: impl FnOnce(CudaEvent) -> Result<R> + Send + 'static,
) -> Pending<R> {
    let slot = slot_of(c);
    c.submit_to_worker(move |g| {
        let done = run_all_reduce(g, &slot, &ctx, buf, &ready)?;
        finish(done)
    })
}

/// A pending operation that has already failed (before it could be queued).
pub(crate) fn failed<R>(e: Error) -> Pending<R> {
    Pending::done(Err(e))
}

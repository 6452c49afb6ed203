//! The executor: runs a [`Plan`] for this rank over links (point-to-point) and the shared-memory
//! fabric (in-node steps). One executor serves every algorithm and every transport.
//!
//! - `Exchange` steps drive the send and the receive concurrently from one thread through
//!   non-blocking links; received data that must be reduced lands in a chunk-sized staging
//!   buffer and is reduced chunk by chunk while the kernel keeps receiving the next chunk.
//!   Consecutive independent exchanges with small sends run as one group (all at once).
//! - The first transfer with each peer in a call carries the call's descriptor (sequence number,
//!   kind, dtype, count, op, root); a peer whose descriptor differs fails the call naming both.
//! - A `NodeReduceScatter` immediately followed by a `NodeAllGather` over the same group and
//!   slices runs as one pipelined in-node all-reduce.
//! - With `mem` set (GPUDirect RDMA: device buffers, device-resident link rings) the executor
//!   runs only exchanges; data moves through the links' memory-kind calls, received chunks are
//!   staged and reduced by the [`DataMem`] (a device kernel), descriptors stay host memory.
//!
//! Files: this one (the executor, plans step by step, in-node steps, the pipelined two-level
//! all-reduce), `exchange.rs` (one `Exchange` step: the point-to-point engine), `desc.rs` (the
//! call descriptor).

mod desc;
mod direct;
mod exchange;

pub use desc::CallDesc;
pub use direct::DirectNode;

use crate::error::{Error, Result};
use crate::transport::{DataMem, Link, LinkError, NodeFabric, NodeMode, NodeOp, DESC};
use exchange::{ExchangeOp, Transfer};
use railring_collectives::fx::FxSet;
use railring_collectives::plan::{Buf, Plan, Region, Step, Xfer};
use railring_collectives::{CollKind, DataType, ReduceOp};
use std::time::Duration;

pub use crate::transport::links::{Links, DEVICE_CHAN, P2P_CHAN};

/// Everything one rank needs to run plans.
pub struct Executor<'a> {
    pub rank: usize,
    /// Ranks in the communicator.
    pub size: usize,
    pub links: &'a mut dyn Links,
    pub fabric: Option<&'a mut (dyn NodeFabric + 'static)>,
    pub timeout: Duration,
    /// Receive-reduce chunk in bytes.
    pub chunk: usize,
    pub staging: &'a mut Vec<u64>,
    /// `Some` when the buffers are not host memory (GPUDirect: device memory): network steps
    /// move them through the links' memory-kind calls and reduce received chunks here. Such an
    /// executor runs network exchanges only.
    pub mem: Option<&'a mut dyn DataMem>,
}

/// A `Links` for an executor that only runs in-node steps.
struct NoLinks;
impl Links for NoLinks {
    fn link(&mut self, peer: usize, _chan: usize) -> Result<*mut dyn Link> {
        Err(Error::Plan(format!(
            "in-node executor asked for a link to rank {peer}"
        )))
    }
    fn host_of(&self, _peer: usize) -> String {
        "?".into()
    }
}

/// The fabric mode of an in-node reduce-scatter fused with the all-gather that follows it (the
/// node is the whole communicator): a one-node reduce when the call is a reduce (only the root
/// needs the result), else the one-round small all-reduce up to 32 KiB of contiguous slices,
/// else the pipelined all-reduce.
fn fused_mode(
    kind: CollKind,
    root: usize,
    group: &[usize],
    slices: &[Region],
    esz: usize,
) -> NodeMode {
    let total: usize = slices.iter().map(|s| s.len).sum::<usize>() * esz;
    match group.iter().position(|&r| r == root) {
        Some(root) if kind == CollKind::Reduce => NodeMode::Reduce { root },
        _ if total <= 32 << 10 && slices.windows(2).all(|w| w[0].end() == w[1].offset) => {
            NodeMode::AllReduceSmall
        }
        _ => NodeMode::AllReduce,
    }
}

/// Raw buffer pointers handed to the network thread of a pipelined call.
#[derive(Clone, Copy)]
struct SendBufs(Bufs);
// SAFETY: the pipelined executor gives the network thread and the caller's thread disjoint
// regions of the buffers (different segments) and joins the thread before returning.
unsafe impl Send for SendBufs {}

/// The rank's buffers for one call.
#[derive(Clone, Copy)]
pub struct Bufs {
    pub work: *mut u8,
    pub work_bytes: usize,
    pub input: *const u8,
    pub input_bytes: usize,
    /// Out-of-place calls: where `work`'s initial contents are (same length). The executor
    /// copies them in, or lets an in-node fabric read them directly when the plan starts with
    /// an in-node all-reduce.
    pub src: Option<*const u8>,
    /// The plan's scratch space (`Buf::Scratch`): set by [`Executor::run`] from a per-thread
    /// buffer when the plan has scratch regions; callers pass null and 0.
    pub scratch: *mut u8,
    pub scratch_bytes: usize,
}

/// Scratch buffers stay with their thread between calls up to this size (bytes), so repeated
/// calls of a plan with scratch regions (the Bruck all-to-all) allocate nothing.
const SCRATCH_KEEP: usize = 4 << 20;

thread_local! {
    static SCRATCH: std::cell::Cell<Vec<u64>> = const { std::cell::Cell::new(Vec::new()) };
}

impl Bufs {
    fn region(&self, r: &Region, esz: usize) -> Result<(*mut u8, usize)> {
        let (base, len) = match r.buf {
            Buf::Work => (self.work, self.work_bytes),
            Buf::Input => (self.input as *mut u8, self.input_bytes),
            Buf::Scratch => (self.scratch, self.scratch_bytes),
        };
        let off = r
            .offset
            .checked_mul(esz)
            .ok_or_else(|| Error::Plan("region overflow".into()))?;
        let n = r
            .len
            .checked_mul(esz)
            .ok_or_else(|| Error::Plan("region overflow".into()))?;
        if off.checked_add(n).is_none_or(|e| e > len) {
            return Err(Error::Plan(format!(
                "region {r} outside a buffer of {} elements",
                len / esz
            )));
        }
        // Bounds checked above; `wrapping_add` because device buffers are not allocations
        // Rust knows of (the result is the same).
        Ok((base.wrapping_add(off), n))
    }

    /// A plan's transfer as bytes of these buffers (`None` when it moves nothing). Its
    /// descriptor goes first when it is the call's first with this (peer, channel), which
    /// `seen` records.
    fn transfer(
        &self,
        x: Option<&Xfer>,
        esz: usize,
        seen: &mut Seen,
    ) -> Result<Option<Transfer<*mut u8>>> {
        match x {
            Some(x) if x.region.len > 0 => {
                let (ptr, len) = self.region(&x.region, esz)?;
                Ok(Some(Transfer {
                    peer: x.peer,
                    chan: x.chan,
                    ptr,
                    len,
                    hdr: seen.insert((x.peer, x.chan)),
                }))
            }
            _ => Ok(None),
        }
    }
}

/// The (peer, channel) pairs one call has carried its descriptor on, in one direction. Most
/// plans talk to a handful: those sit in a list on the stack, searched in order (no allocation
/// or hashing per call on the small-message path); an Fx hash set takes the rest (all-to-all over
/// many ranks).
#[derive(Default)]
struct Seen {
    few: [(usize, usize); 8],
    n: usize,
    more: FxSet<(usize, usize)>,
}

impl Seen {
    /// Add `k`; true when it was not there before.
    fn insert(&mut self, k: (usize, usize)) -> bool {
        if self.few[..self.n].contains(&k) {
            return false;
        }
        if self.n < self.few.len() {
            self.few[self.n] = k;
            self.n += 1;
            return true;
        }
        self.more.insert(k)
    }
}

/// What every step of one call shares: its encoded descriptor (carried by the first transfer
/// with each peer, compared by in-node peers), element type and reduction.
#[derive(Clone, Copy)]
struct StepCall<'d> {
    desc: &'d [u8; DESC],
    dtype: DataType,
    op: ReduceOp,
}

impl<'a> Executor<'a> {
    fn link_err(&self, peer: usize, e: LinkError) -> Error {
        match e {
            LinkError::PeerGone(why) => Error::PeerDead {
                rank: self.rank,
                peer,
                host: self.links.host_of(peer),
                why,
            },
            LinkError::Io(err) => Error::Transport {
                rank: self.rank,
                what: format!("link to rank {peer} on {}", self.links.host_of(peer)),
                err,
            },
        }
    }

    /// Run `plan` for one call.
    ///
    /// # Safety
    /// `bufs` must describe buffers valid for reads (input) and reads/writes (work).
    pub unsafe fn run(
        &mut self,
        plan: &Plan,
        desc: &CallDesc,
        op: ReduceOp,
        bufs: Bufs,
    ) -> Result<()> {
        let scratch = plan.scratch_len();
        if scratch > 0 {
            // Taken from the thread and put back: a nested run on this thread takes an empty one.
            let bytes = scratch
                .checked_mul(desc.dtype.size())
                .ok_or_else(|| Error::Plan("scratch size overflow".into()))?;
            let mut s = SCRATCH.take();
            if s.len() < bytes.div_ceil(8) {
                s.resize(bytes.div_ceil(8), 0);
            }
            let with = Bufs {
                scratch: s.as_mut_ptr().cast(),
                scratch_bytes: bytes,
                ..bufs
            };
            let r = self.run_plan(plan, desc, op, with);
            if s.capacity() * 8 <= SCRATCH_KEEP {
                SCRATCH.set(s);
            }
            return r;
        }
        self.run_plan(plan, desc, op, bufs)
    }

    /// [`Self::run`] once the scratch space is in `bufs`.
    unsafe fn run_plan(
        &mut self,
        plan: &Plan,
        desc: &CallDesc,
        op: ReduceOp,
        bufs: Bufs,
    ) -> Result<()> {
        // A leading in-node reduce-scatter can read an out-of-place input directly when the plan
        // ends with the matching all-gather: the reduce-scatter writes this rank's slice, the
        // network steps work inside it, the all-gather writes every other slice — no pass that
        // first copies the input over the result.
        let rs_src = match (plan.steps.first(), plan.steps.last()) {
            (
                Some(Step::NodeReduceScatter { group, slices }),
                Some(Step::NodeAllGather {
                    group: g2,
                    slices: s2,
                }),
            ) => plan.steps.len() >= 2 && group == g2 && slices == s2,
            _ => false,
        };
        self.run_with(plan, desc, op, bufs, rs_src)
    }

    /// [`Self::run`]; `rs_src`: the plan's leading reduce-scatter may read `bufs.src` directly
    /// (the caller guarantees every other slice of `work` is written later).
    unsafe fn run_with(
        &mut self,
        plan: &Plan,
        desc: &CallDesc,
        op: ReduceOp,
        bufs: Bufs,
        rs_src: bool,
    ) -> Result<()> {
        let dtype = desc.dtype;
        let esz = dtype.size();
        let mut hdr_sent = Seen::default();
        let mut hdr_recv = Seen::default();
        let d = desc.encode();
        let call = StepCall {
            desc: &d,
            dtype,
            op,
        };
        let mut src = bufs.src.filter(|&p| !std::ptr::eq(p, bufs.work));
        if let Some(m) = &self.mem {
            let kind = m.kind();
            if src.is_some() {
                return Err(Error::Plan(format!(
                    "an out-of-place call on {kind:?} memory reached the network executor"
                )));
            }
            if let Some(s) = plan
                .steps
                .iter()
                .find(|s| !matches!(s, Step::Exchange { .. }))
            {
                return Err(Error::Plan(format!(
                    "step {s:?} on {kind:?} memory: the executor runs only network exchanges there"
                )));
            }
        }
        if let (Some(p), false) = (src, rs_src) {
            std::ptr::copy(p, bufs.work, bufs.work_bytes);
            src = None;
        }
        let mut group = Vec::new();
        let mut i = 0;
        let trace = tracing::enabled!(target: "railring::exec", tracing::Level::TRACE);
        while i < plan.steps.len() {
            let t0 = trace.then(std::time::Instant::now);
            let step_index = i;
            match &plan.steps[i] {
                Step::Exchange { send, recv, reduce } => {
                    group.clear();
                    let n = self.group_len(&plan.steps[i..], &bufs, esz, &mut group)?;
                    if n >= 2 {
                        let mut sends = Vec::with_capacity(n);
                        let mut recvs = Vec::with_capacity(n);
                        for (step, &(sl, rl)) in plan.steps[i..i + n].iter().zip(&group) {
                            if let Step::Exchange { send, recv, .. } = step {
                                let st = bufs.transfer(send.as_ref(), esz, &mut hdr_sent)?;
                                let rt = bufs.transfer(recv.as_ref(), esz, &mut hdr_recv)?;
                                sends.extend(st.zip(sl).map(|(t, l)| (t.read_only(), l)));
                                recvs.extend(rt.zip(rl));
                            }
                        }
                        self.exchange_group(&sends, &recvs, &d, dtype, op)?;
                        tracing::debug!(target: "railring::exec", rank = self.rank, "{} steps {i}..{}: {n} exchanges as one group", CallDesc::describe_bytes(&d), i + n);
                        i += n - 1;
                    } else {
                        let send = bufs.transfer(send.as_ref(), esz, &mut hdr_sent)?;
                        let recv = bufs.transfer(recv.as_ref(), esz, &mut hdr_recv)?;
                        self.exchange(ExchangeOp {
                            send: send.map(Transfer::read_only),
                            recv,
                            reduce: *reduce,
                            send_desc: &d,
                            recv_desc: &d,
                            dtype,
                            op,
                        })?;
                    }
                }
                Step::NodeReduceScatter { group, slices } => {
                    // Fuse only when the node is the whole communicator: then every rank's plan is
                    // exactly [reduce-scatter, all-gather], so all ranks make the same choice
                    // (elsewhere a rank with an empty ring slice may have no steps in between).
                    let fused = group.len() == self.size
                        && matches!(plan.steps.get(i + 1), Some(Step::NodeAllGather { group: g2, slices: s2 }) if g2 == group && s2 == slices);
                    let mode = if fused {
                        i += 1;
                        fused_mode(desc.kind, desc.root as usize, group, slices, esz)
                    } else {
                        NodeMode::ReduceScatter
                    };
                    self.node(mode, group, slices, call, bufs, src.take())?;
                }
                Step::NodeAllGather { group, slices } => {
                    // A one-node all-gather given this rank's block as its input (see
                    // Inner::all_gather_into): the fabric reads the block there, so peers read
                    // the caller's input rather than a copy of it just written into the result.
                    let me = group.iter().position(|&r| r == self.rank);
                    let own = match (plan.steps.len(), me) {
                        (1, Some(me)) if bufs.input_bytes > 0 && group.len() > 1 => {
                            let (p, n) = bufs.region(&slices[me], esz)?;
                            if n != bufs.input_bytes {
                                return Err(Error::Plan(format!(
                                    "all-gather: input of {} bytes for a block of {n}",
                                    bufs.input_bytes
                                )));
                            }
                            // where the input would start if it were as long as `work`: the
                            // fabric only touches its block, at the block's offset
                            Some(bufs.input.wrapping_sub(p as usize - bufs.work as usize))
                        }
                        _ => None,
                    };
                    self.node(NodeMode::AllGather, group, slices, call, bufs, own)?
                }
                Step::NodeBroadcast {
                    group,
                    root,
                    region,
                } => {
                    let mode = NodeMode::Broadcast { root: *root };
                    self.node(mode, group, std::slice::from_ref(region), call, bufs, None)?
                }
                Step::NodeAllToAll {
                    group,
                    blocks,
                    in_place,
                } => {
                    // the blocks sit at the same offsets in the input: the fabric reads them
                    // there; no input (Inner::all_to_all_in_place) or a transpose of blocks the
                    // plan received (`in_place`): the fabric reads and writes the work buffer
                    if !in_place && bufs.input_bytes > 0 && bufs.input_bytes < bufs.work_bytes {
                        return Err(Error::Plan(format!(
                            "in-node all-to-all: input of {} bytes for {} bytes of blocks",
                            bufs.input_bytes, bufs.work_bytes
                        )));
                    }
                    let input = (!in_place && bufs.input_bytes > 0).then_some(bufs.input);
                    self.node(NodeMode::AllToAll, group, blocks, call, bufs, input)?
                }
                Step::Copy { src, dst } => {
                    let (s, n) = bufs.region(src, esz)?;
                    let (t, m) = bufs.region(dst, esz)?;
                    if n != m {
                        return Err(Error::Plan(format!("copy {src} -> {dst}: lengths differ")));
                    }
                    std::ptr::copy(s, t, n);
                }
            }
            if let Some(t0) = t0 {
                tracing::trace!(target: "railring::exec", rank = self.rank, "{} step {step_index}: {:?}", CallDesc::describe_bytes(&d), t0.elapsed());
            }
            i += 1;
        }
        Ok(())
    }

    /// One in-node step on the fabric (nothing to do for a group of one but copy an
    /// out-of-place input): `slices` become byte ranges of `bufs.work`; `src`, an out-of-place
    /// input the fabric reads directly.
    unsafe fn node(
        &mut self,
        mode: NodeMode,
        group: &[usize],
        slices: &[Region],
        call: StepCall<'_>,
        bufs: Bufs,
        src: Option<*const u8>,
    ) -> Result<()> {
        let StepCall { desc: d, dtype, op } = call;
        if group.len() <= 1 {
            match (src, mode) {
                (Some(p), NodeMode::AllToAll) => {
                    for s in slices {
                        let (d, n) = bufs.region(s, dtype.size())?;
                        std::ptr::copy(p.add(d as usize - bufs.work as usize), d, n);
                    }
                }
                (Some(p), _) => std::ptr::copy(p, bufs.work, bufs.work_bytes),
                (None, _) => {}
            }
            return Ok(());
        }
        let esz = dtype.size();
        let fabric = self
            .fabric
            .as_deref_mut()
            .ok_or_else(|| Error::Plan("in-node step without a shared-memory fabric".into()))?;
        if fabric.ranks() != group {
            return Err(Error::Plan(format!(
                "in-node step over {group:?}, but this node holds {:?}",
                fabric.ranks()
            )));
        }
        let mut fixed = [(0usize, 0usize); 16];
        let mut heap = Vec::new();
        for (i, s) in slices.iter().enumerate() {
            let (p, n) = bufs.region(s, esz)?;
            let e = (p as usize - bufs.work as usize, n);
            match fixed.get_mut(i) {
                Some(f) if slices.len() <= 16 => *f = e,
                _ => heap.push(e),
            }
        }
        let byte_slices: &[(usize, usize)] = if slices.len() <= 16 {
            &fixed[..slices.len()]
        } else {
            &heap
        };
        fabric.node_op(NodeOp {
            mode,
            dtype,
            op,
            src,
            work: bufs.work,
            slices: byte_slices,
            desc: d,
            describe: &CallDesc::describe_bytes,
        })
    }

    /// Run a segmented two-level all-reduce as a software pipeline: `segs` are (element offset,
    /// plan for that segment's length) with plans of the shape [in-node reduce-scatter, network
    /// exchanges, in-node all-gather]. This thread runs every segment's in-node steps in order
    /// (reduce-scatters first, then all-gathers) while a second thread runs each segment's
    /// network ring as soon as its reduce-scatter is done — the network is never idle waiting for
    /// shared-memory phases, and those phases hide behind the wire time.
    ///
    /// # Safety
    /// As [`Executor::run`]; segments must be disjoint and inside `bufs.work`.
    pub unsafe fn run_pipelined(
        &mut self,
        segs: &[(usize, std::sync::Arc<Plan>)],
        desc: &CallDesc,
        op: ReduceOp,
        bufs: Bufs,
    ) -> Result<()> {
        use std::sync::mpsc;
        let esz = desc.dtype.size();
        // Split by step kind, not by position (`Plan::split_for_device`): a rank whose ring slice
        // is empty has [RS, AG] with nothing between, and its AG must still wait until after every
        // segment's RS, as its node's peers run theirs.
        let split_plan = |p: &Plan| -> (Plan, Plan, Plan) {
            let mut rs = Vec::new();
            let mut net = Vec::new();
            let mut ag = Vec::new();
            for st in &p.steps {
                match st {
                    Step::NodeReduceScatter { .. } => rs.push(st.clone()),
                    Step::NodeAllGather { .. } => ag.push(st.clone()),
                    _ => net.push(st.clone()),
                }
            }
            let mk = |steps| Plan {
                kind: p.kind,
                algo: p.algo,
                rank: p.rank,
                steps,
            };
            (mk(rs), mk(net), mk(ag))
        };
        let parts: Vec<(usize, Plan, Plan, Plan)> = segs
            .iter()
            .map(|(off, p)| {
                let (a, b, c) = split_plan(p);
                (*off, a, b, c)
            })
            .collect();
        let seg_bufs = |off: usize, len: usize| Bufs {
            work: bufs.work.add(off * esz),
            work_bytes: len * esz,
            input: bufs.input,
            input_bytes: 0,
            src: None,
            scratch: bufs.scratch,
            scratch_bytes: bufs.scratch_bytes,
        };
        let lens: Vec<usize> = segs
            .iter()
            .enumerate()
            .map(|(k, (off, _))| {
                segs.get(k + 1)
                    .map(|n| n.0)
                    .unwrap_or(bufs.work_bytes / esz)
                    - off
            })
            .collect();
        // Out of place, each segment's reduce-scatter reads the input directly; its all-gather
        // later writes the rest of the segment.
        let src = bufs.src.filter(|&p| !std::ptr::eq(p, bufs.work));
        let (rank, size, timeout, chunk) = (self.rank, self.size, self.timeout, self.chunk);
        let links: &mut dyn Links = &mut *self.links;
        let staging: &mut Vec<u64> = &mut *self.staging;
        let fabric = self.fabric.as_deref_mut();
        let (to_net, net_rx) = mpsc::channel::<(usize, SendBufs)>();
        let (done_tx, from_net) = mpsc::channel::<Result<usize>>();
        let nets: Vec<&Plan> = parts.iter().map(|p| &p.2).collect();
        std::thread::scope(|sc| {
            let nets = &nets;
            let net = std::thread::Builder::new()
                .name("railring-net".into())
                .spawn_scoped(sc, move || {
                    let mut ex = Executor {
                        rank,
                        size,
                        links,
                        fabric: None,
                        timeout,
                        chunk,
                        staging,
                        mem: None,
                    };
                    for (k, b) in net_rx {
                        let r = ex.run(nets[k], desc, op, b.0).map(|_| k);
                        let failed = r.is_err();
                        if done_tx.send(r).is_err() || failed {
                            break;
                        }
                    }
                });
            let net = match net {
                Ok(h) => h,
                Err(e) => {
                    return Err(Error::Transport {
                        rank,
                        what: "starting the network thread".into(),
                        err: e,
                    })
                }
            };
            let mut no_links = NoLinks;
            let mut scratch = Vec::new();
            let mut main = Executor {
                rank,
                size,
                links: &mut no_links,
                fabric,
                timeout,
                chunk,
                staging: &mut scratch,
                mem: None,
            };
            let mut result = Ok(());
            for (k, (off, rs, _, _)) in parts.iter().enumerate() {
                let b = seg_bufs(*off, lens[k]);
                let with_src = Bufs {
                    src: src.map(|p| p.add(off * esz)),
                    ..b
                };
                let is_rs = matches!(rs.steps[..], [Step::NodeReduceScatter { .. }]);
                if let Err(e) = main.run_with(rs, desc, op, with_src, is_rs) {
                    result = Err(e);
                    break;
                }
                if to_net.send((k, SendBufs(b))).is_err() {
                    break;
                }
            }
            drop(to_net);
            if result.is_ok() {
                for (k, (off, _, _, ag)) in parts.iter().enumerate() {
                    match from_net.recv() {
                        Ok(Ok(j)) if j == k => {}
                        Ok(Ok(j)) => {
                            result = Err(Error::Plan(format!(
                                "pipelined segment {j} finished before {k}"
                            )));
                            break;
                        }
                        Ok(Err(e)) => {
                            result = Err(e);
                            break;
                        }
                        Err(_) => {
                            result = Err(Error::Plan("network thread ended early".into()));
                            break;
                        }
                    }
                    if let Err(e) = main.run(ag, desc, op, seg_bufs(*off, lens[k])) {
                        result = Err(e);
                        break;
                    }
                }
            }
            drop(from_net);
            let _ = net.join();
            result
        })
    }

    /// Point-to-point: send to one peer and/or receive from one peer, concurrently. Each side
    /// carries its descriptor; a receive whose descriptor differs from the sender's fails.
    ///
    /// # Safety
    /// The pointers must be valid for the given lengths.
    pub unsafe fn p2p(
        &mut self,
        send: Option<(*const u8, usize, usize, CallDesc)>,
        recv: Option<(*mut u8, usize, usize, CallDesc)>,
    ) -> Result<()> {
        let sd = send.map(|s| s.3.encode()).unwrap_or([0u8; DESC]);
        let rd = recv.map(|r| r.3.encode()).unwrap_or([0u8; DESC]);
        let dtype = send
            .map(|s| s.3.dtype)
            .or(recv.map(|r| r.3.dtype))
            .unwrap_or(DataType::U8);
        self.exchange(ExchangeOp {
            send: send.map(|(ptr, len, peer, _)| Transfer {
                peer,
                chan: P2P_CHAN,
                ptr,
                len,
                hdr: true,
            }),
            recv: recv.map(|(ptr, len, peer, _)| Transfer {
                peer,
                chan: P2P_CHAN,
                ptr,
                len,
                hdr: true,
            }),
            reduce: false,
            send_desc: &sd,
            recv_desc: &rd,
            dtype,
            op: ReduceOp::Sum,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::Seen;

    #[test]
    fn seen_reports_each_pair_once_past_its_inline_list() {
        let mut s = Seen::default();
        let pairs: Vec<(usize, usize)> = (0..20).map(|i| (i % 10, i / 10)).collect();
        for &p in &pairs {
            assert!(s.insert(p), "{p:?} is new");
        }
        for &p in pairs.iter().rev() {
            assert!(!s.insert(p), "{p:?} was seen");
        }
        assert!(s.insert((10, 0)));
        assert_eq!(s.n, 8);
        assert_eq!(s.more.len(), 13);
    }
}

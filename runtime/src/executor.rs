//! The executor: runs a [`Plan`] for this rank over links (point-to-point) and the shared-memory
//! fabric (in-node steps). One executor serves every algorithm and every transport.
//!
//! - `Exchange` steps drive the send and the receive concurrently from one thread through
//!   non-blocking links; received data that must be reduced lands in a chunk-sized staging
//!   buffer and is reduced chunk by chunk while the kernel keeps receiving the next chunk.
//! - The first transfer with each peer in a call carries the call's descriptor (sequence number,
//!   kind, dtype, count, op, root); a peer whose descriptor differs fails the call naming both.
//! - A `NodeReduceScatter` immediately followed by a `NodeAllGather` over the same group and
//!   slices runs as one pipelined in-node all-reduce.
//! - With `mem` set (GPUDirect RDMA: device buffers, device-resident link rings) the executor
//!   runs only exchanges; data moves through the links' memory-kind calls, received chunks are
//!   staged and reduced by the [`DataMem`] (a device kernel), descriptors stay host memory.

use crate::error::{Error, Result};
use crate::transport::{
    Backoff, DataMem, Link, LinkError, MemKind, NodeFabric, NodeMode, NodeOp, DESC,
};
use railring_collectives::plan::{Buf, CollKind, Plan, Region, Step};
use railring_collectives::{kernels, DataType, ReduceOp};
use std::collections::HashSet;
use std::time::Duration;

/// The identity of one collective call, compared across ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallDesc {
    pub seq: u64,
    pub kind: CollKind,
    pub dtype: DataType,
    pub op: ReduceOp,
    pub count: u64,
    pub root: u32,
    pub comm: u64,
}

const HDR_MAGIC: u32 = 0x5252_4844; // "RRHD"

impl CallDesc {
    pub fn encode(&self) -> [u8; DESC] {
        let mut b = [0u8; DESC];
        b[0..4].copy_from_slice(&HDR_MAGIC.to_le_bytes());
        b[4] = self.kind as u8;
        b[5] = self.dtype as u8;
        b[6] = self.op as u8;
        b[8..16].copy_from_slice(&self.seq.to_le_bytes());
        b[16..24].copy_from_slice(&self.count.to_le_bytes());
        b[24..28].copy_from_slice(&self.root.to_le_bytes());
        b[32..40].copy_from_slice(&self.comm.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; DESC]) -> Option<CallDesc> {
        if u32::from_le_bytes(b[0..4].try_into().ok()?) != HDR_MAGIC {
            return None;
        }
        Some(CallDesc {
            kind: CollKind::from_u8(b[4])?,
            dtype: DataType::from_u8(b[5])?,
            op: ReduceOp::from_u8(b[6])?,
            seq: u64::from_le_bytes(b[8..16].try_into().ok()?),
            count: u64::from_le_bytes(b[16..24].try_into().ok()?),
            root: u32::from_le_bytes(b[24..28].try_into().ok()?),
            comm: u64::from_le_bytes(b[32..40].try_into().ok()?),
        })
    }

    pub fn describe(&self) -> String {
        let mut s = format!(
            "{} #{} ({} x {}",
            self.kind, self.seq, self.count, self.dtype
        );
        if matches!(
            self.kind,
            CollKind::AllReduce | CollKind::ReduceScatter | CollKind::Reduce
        ) {
            s.push_str(&format!(", op {}", self.op));
        }
        if matches!(self.kind, CollKind::Broadcast | CollKind::Reduce) {
            s.push_str(&format!(", root {}", self.root));
        }
        s.push(')');
        s
    }

    pub fn describe_bytes(b: &[u8; DESC]) -> String {
        match CallDesc::decode(b) {
            Some(d) => d.describe(),
            None => "an unknown call (corrupt descriptor)".into(),
        }
    }
}

/// Channel used by point-to-point calls (separate TCP connections from collectives' rings).
pub const P2P_CHAN: usize = 1 << 16;
/// Flag on the channel of links that move device memory (GPUDirect RDMA: rings in device
/// memory), kept apart from the host-memory links of the same peers.
pub const DEVICE_CHAN: usize = 1 << 17;

/// Gives the executor a link to a peer on a channel, connecting on first use.
pub trait Links: Send {
    /// A stable pointer to the link (valid until the provider is dropped).
    fn link(&mut self, peer: usize, chan: usize) -> Result<*mut dyn Link>;
    /// Host name of a peer, for errors.
    fn host_of(&self, peer: usize) -> String;
}

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
}

impl Bufs {
    fn region(&self, r: &Region, esz: usize) -> Result<(*mut u8, usize)> {
        let (base, len) = match r.buf {
            Buf::Work => (self.work, self.work_bytes),
            Buf::Input => (self.input as *mut u8, self.input_bytes),
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
                what: format!("link to rank {peer}"),
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
        let mut hdr_sent: HashSet<(usize, usize)> = HashSet::new();
        let mut hdr_recv: HashSet<(usize, usize)> = HashSet::new();
        let d = desc.encode();
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
        let mut i = 0;
        let trace = tracing::enabled!(target: "railring::exec", tracing::Level::TRACE);
        while i < plan.steps.len() {
            let t0 = trace.then(std::time::Instant::now);
            let step_index = i;
            match &plan.steps[i] {
                Step::Exchange { send, recv, reduce } => {
                    let s = match send {
                        Some(x) if x.region.len > 0 => {
                            let (p, n) = bufs.region(&x.region, esz)?;
                            let h = hdr_sent.insert((x.peer, x.chan));
                            Some((x.peer, x.chan, p as *const u8, n, h))
                        }
                        _ => None,
                    };
                    let r = match recv {
                        Some(x) if x.region.len > 0 => {
                            let (p, n) = bufs.region(&x.region, esz)?;
                            let h = hdr_recv.insert((x.peer, x.chan));
                            Some((x.peer, x.chan, p, n, h))
                        }
                        _ => None,
                    };
                    self.exchange(s, r, *reduce, &d, &d, dtype, op)?;
                }
                Step::NodeReduceScatter { group, slices } => {
                    // Fuse only when the node is the whole communicator: then every rank's plan is
                    // exactly [reduce-scatter, all-gather], so all ranks make the same choice
                    // (elsewhere a rank with an empty ring slice may have no steps in between).
                    let fused = group.len() == self.size
                        && matches!(plan.steps.get(i + 1), Some(Step::NodeAllGather { group: g2, slices: s2 }) if g2 == group && s2 == slices);
                    let total: usize = slices.iter().map(|s| s.len).sum::<usize>() * esz;
                    let mode = if fused {
                        i += 1;
                        if total <= 32 << 10 && slices.windows(2).all(|w| w[0].end() == w[1].offset)
                        {
                            NodeMode::AllReduceSmall
                        } else {
                            NodeMode::AllReduce
                        }
                    } else {
                        NodeMode::ReduceScatter
                    };
                    self.node(mode, group, slices, &d, dtype, op, bufs, src.take())?;
                }
                Step::NodeAllGather { group, slices } => self.node(
                    NodeMode::AllGather,
                    group,
                    slices,
                    &d,
                    dtype,
                    op,
                    bufs,
                    None,
                )?,
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

    #[allow(clippy::too_many_arguments)]
    unsafe fn node(
        &mut self,
        mode: NodeMode,
        group: &[usize],
        slices: &[Region],
        d: &[u8; DESC],
        dtype: DataType,
        op: ReduceOp,
        bufs: Bufs,
        src: Option<*const u8>,
    ) -> Result<()> {
        if group.len() <= 1 {
            if let Some(p) = src {
                std::ptr::copy(p, bufs.work, bufs.work_bytes);
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
        self.exchange(
            send.map(|(p, n, peer, _)| (peer, P2P_CHAN, p, n, true)),
            recv.map(|(p, n, peer, _)| (peer, P2P_CHAN, p, n, true)),
            false,
            &sd,
            &rd,
            dtype,
            ReduceOp::Sum,
        )
    }

    /// Send and receive concurrently (either may be absent). Tuples: (peer, chan, ptr, bytes,
    /// header first?).
    #[allow(clippy::too_many_arguments)]
    unsafe fn exchange(
        &mut self,
        send: Option<(usize, usize, *const u8, usize, bool)>,
        recv: Option<(usize, usize, *mut u8, usize, bool)>,
        reduce: bool,
        d: &[u8; DESC],
        rd: &[u8; DESC],
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        let sl = match send {
            Some((p, c, ..)) => Some(self.links.link(p, c)?),
            None => None,
        };
        let rl = match recv {
            Some((p, c, ..)) => Some(self.links.link(p, c)?),
            None => None,
        };
        let esz = dtype.size();
        // Where the data is: host memory, or (GPUDirect) memory only the links and `self.mem`
        // touch. Descriptors are always host memory.
        let kind = self.mem.as_ref().map(|m| m.kind()).unwrap_or(MemKind::Host);
        if kind != MemKind::Host {
            for (l, peer) in [(sl, send.map(|s| s.0)), (rl, recv.map(|r| r.0))] {
                if let (Some(l), Some(peer)) = (l, peer) {
                    if !(*l).supports(kind) {
                        return Err(Error::Plan(format!(
                            "the link to rank {peer} ({}) cannot move {kind:?} memory",
                            (*l).describe()
                        )));
                    }
                }
            }
        }
        // A send region that overlaps the receive region (recursive doubling exchanges whole
        // buffers) must not see received bytes: send from a snapshot.
        let mut snapshot: Vec<u64> = Vec::new();
        let send = match (send, recv) {
            (Some((p, c, sp, sn, h)), Some((_, _, rp, rn, _)))
                if (sp as usize) < rp as usize + rn && (rp as usize) < sp as usize + sn =>
            {
                if kind != MemKind::Host {
                    return Err(Error::Plan(format!(
                        "overlapping send and receive regions on {kind:?} memory"
                    )));
                }
                snapshot.resize(sn.div_ceil(8), 0);
                std::ptr::copy_nonoverlapping(sp, snapshot.as_mut_ptr() as *mut u8, sn);
                Some((p, c, snapshot.as_ptr() as *const u8, sn, h))
            }
            _ => send,
        };
        let chunk = (self.chunk / esz).max(1) * esz;
        let stage = match &mut self.mem {
            Some(m) if reduce && recv.is_some() => m.stage(chunk)?,
            Some(_) => std::ptr::null_mut(),
            None => {
                if reduce && recv.is_some() && self.staging.len() * 8 < chunk {
                    self.staging.resize(chunk.div_ceil(8), 0);
                }
                self.staging.as_mut_ptr() as *mut u8
            }
        };
        // send state
        let mut s_hdr = if send.is_some_and(|s| s.4) { 0 } else { DESC };
        let mut s_off = 0usize;
        let s_len = send.map(|s| s.3).unwrap_or(0);
        // A small send with its descriptor goes out as one write (one packet on TCP).
        let combined: Option<Vec<u8>> = match send {
            Some((_, _, ptr, n, true)) if n <= 16 << 10 && kind == MemKind::Host => {
                let mut v = Vec::with_capacity(DESC + n);
                v.extend_from_slice(d);
                v.extend_from_slice(std::slice::from_raw_parts(ptr, n));
                Some(v)
            }
            _ => None,
        };
        let mut c_off = 0usize;
        let mut s_done = send.is_none();
        // recv state
        let mut r_hdr_buf = [0u8; DESC];
        let mut r_hdr = if recv.is_some_and(|r| r.4) { 0 } else { DESC };
        let mut r_off = 0usize;
        let mut r_fill = 0usize;
        let r_len = recv.map(|r| r.3).unwrap_or(0);
        let mut r_done = recv.is_none();
        let mut b = Backoff::new();
        while !(s_done && r_done) {
            let mut progress = false;
            if let (false, Some((peer, _, ptr, _, _)), Some(l)) = (s_done, send, sl) {
                let l = &mut *l;
                loop {
                    let n = if let Some(c) = &combined {
                        let n = l
                            .try_send(&c[c_off..])
                            .map_err(|e| self.link_err(peer, e))?;
                        c_off += n;
                        if c_off == c.len() {
                            s_hdr = DESC;
                            s_off = s_len;
                        }
                        n
                    } else if s_hdr < DESC {
                        let n = l
                            .try_send(&d[s_hdr..])
                            .map_err(|e| self.link_err(peer, e))?;
                        s_hdr += n;
                        n
                    } else {
                        let n = l
                            .try_send_mem(ptr.wrapping_add(s_off), s_len - s_off, kind)
                            .map_err(|e| self.link_err(peer, e))?;
                        s_off += n;
                        n
                    };
                    if n == 0 {
                        break;
                    }
                    progress = true;
                    if s_hdr == DESC && s_off == s_len {
                        s_done = true;
                        break;
                    }
                }
            }
            if let (false, Some((peer, _, dst, _, _)), Some(l)) = (r_done, recv, rl) {
                let l = &mut *l;
                loop {
                    let n = if r_hdr < DESC {
                        let n = l
                            .try_recv(&mut r_hdr_buf[r_hdr..])
                            .map_err(|e| self.link_err(peer, e))?;
                        r_hdr += n;
                        if r_hdr == DESC && &r_hdr_buf != rd {
                            return Err(Error::Mismatch {
                                rank: self.rank,
                                peer,
                                mine: CallDesc::describe_bytes(rd),
                                theirs: CallDesc::describe_bytes(&r_hdr_buf),
                            });
                        }
                        n
                    } else if !reduce {
                        let n = l
                            .try_recv_mem(dst.wrapping_add(r_off), r_len - r_off, kind)
                            .map_err(|e| self.link_err(peer, e))?;
                        r_off += n;
                        n
                    } else {
                        let want = chunk.min(r_len - r_off);
                        let n = l
                            .try_recv_mem(stage.wrapping_add(r_fill), want - r_fill, kind)
                            .map_err(|e| self.link_err(peer, e))?;
                        r_fill += n;
                        if r_fill == want {
                            match &mut self.mem {
                                Some(m) => {
                                    m.reduce_into(dtype, op, dst.wrapping_add(r_off), stage, want)?
                                }
                                None => {
                                    kernels::reduce_into_raw(dtype, op, dst.add(r_off), stage, want)
                                }
                            }
                            r_off += want;
                            r_fill = 0;
                        }
                        n
                    };
                    if n == 0 {
                        break;
                    }
                    progress = true;
                    if r_hdr == DESC && r_off == r_len {
                        r_done = true;
                        break;
                    }
                }
            }
            if progress {
                b.reset();
                continue;
            }
            if s_done && r_done {
                break;
            }
            // Nothing moved: wait. Links with file descriptors are polled (the kernel wakes us);
            // shared-memory links back off (spin, yield, sleep).
            let fds: Vec<(i32, i16)> = [
                (!s_done)
                    .then(|| {
                        sl.and_then(|l| (*l).poll_fd_for(true))
                            .map(|fd| (fd, libc::POLLOUT))
                    })
                    .flatten(),
                (!r_done)
                    .then(|| {
                        rl.and_then(|l| (*l).poll_fd_for(false))
                            .map(|fd| (fd, libc::POLLIN))
                    })
                    .flatten(),
            ]
            .into_iter()
            .flatten()
            .collect();
            let need = usize::from(!s_done) + usize::from(!r_done);
            if fds.len() == need && b.waited() > Duration::from_micros(50) {
                let mut p: Vec<libc::pollfd> = fds
                    .iter()
                    .map(|&(fd, ev)| libc::pollfd {
                        fd,
                        events: ev,
                        revents: 0,
                    })
                    .collect();
                libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, 100);
            } else if b.waited() > Duration::from_micros(20) {
                // A shared-memory link sleeps on its node's bell (woken by the peer's next
                // store); with a TCP link also pending, only briefly, then poll again.
                let short = if fds.is_empty() {
                    Duration::from_millis(5)
                } else {
                    Duration::from_micros(200)
                };
                let parked = match (s_done, r_done) {
                    (false, _) if sl.is_some_and(|l| (*l).poll_fd().is_none()) => {
                        sl.is_some_and(|l| (*l).park(true, !r_done && rl == sl, short))
                    }
                    (_, false) if rl.is_some_and(|l| (*l).poll_fd().is_none()) => {
                        rl.is_some_and(|l| (*l).park(false, true, short))
                    }
                    _ => false,
                };
                if !parked {
                    b.snooze();
                }
            } else {
                b.snooze();
            }
            if b.check_due() || fds.len() == need {
                if let (false, Some((peer, ..)), Some(l)) = (s_done, send, sl) {
                    (*l).check_peer().map_err(|e| self.link_err(peer, e))?;
                }
                if let (false, Some((peer, ..)), Some(l)) = (r_done, recv, rl) {
                    (*l).check_peer().map_err(|e| self.link_err(peer, e))?;
                }
                if b.waited() > self.timeout {
                    let mut waiting = Vec::new();
                    if !s_done {
                        waiting.extend(send.map(|s| s.0));
                    }
                    if !r_done {
                        waiting.extend(recv.map(|r| r.0));
                    }
                    waiting.dedup();
                    return Err(Error::Timeout {
                        rank: self.rank,
                        secs: self.timeout.as_secs(),
                        waiting,
                        what: CallDesc::describe_bytes(d),
                    });
                }
            }
        }
        Ok(())
    }
}

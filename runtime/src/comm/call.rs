//! One communicator's state (`Inner`) and the path of a call through it: argument checks, the
//! call descriptor, the algorithm choice (forced, or the cost model's; cached per call shape),
//! the plan cache, the executor run, and failure handling — a failed call poisons the
//! communicator and tells the peers (store abort record, node abort word, closed links).

use super::straggler::{self, Recorder, StragglerRow};
use super::PeerInfo;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::executor::{Bufs, CallDesc, DirectNode, Executor};
use crate::store::StoreClient;
use crate::transport::links::LinkTable;
use crate::transport::tcp::TcpNet;
use crate::transport::NodeFabric;
use railring_collectives::build::build_plan;
use railring_collectives::fx::FxMap;
use railring_collectives::plan::{Algo, CollKind, Layout, Plan};
use railring_collectives::{kernels, DataType, ReduceOp};
use std::sync::Arc;
use std::time::Duration;

/// The deadline of each store request on the failure path (recording or reading the job's
/// first failure): about a second of answer time, so a rank whose store is gone still ends
/// within a few seconds of its failure.
const FAIL_PATH_LIMIT: Duration = Duration::from_secs(2);
/// The largest copy an in-place all-to-all keeps for the next call (bytes).
const INPLACE_KEEP: usize = 64 << 20;

/// The receive-reduce chunk of one call: `RAILRING_NET_CHUNK`, but never more than the call's
/// buffer (rounded up to 4 KiB), so the staging area a call grows is sized by the call, not by
/// the knob (a 4 MiB all-reduce with `RAILRING_NET_CHUNK=256M` stages 4 MiB).
fn chunk_for(knob: usize, call_bytes: usize) -> usize {
    knob.min(call_bytes.next_multiple_of(4096).max(4096))
}

/// What every communicator made from one bootstrap shares: the job, the store, the TCP
/// endpoint and the settings — and this communicator's ranks (`peers`, renumbered by `split`).
#[derive(Clone)]
pub(super) struct World {
    pub job: String,
    pub peers: Arc<Vec<PeerInfo>>,
    pub store: Option<Arc<StoreClient>>,
    pub net: Option<Arc<TcpNet>>,
    pub cfg: Config,
}

/// A collective call's shape: what every rank must agree on (with the sequence number, its
/// [`CallDesc`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct Shape {
    pub kind: CollKind,
    pub dtype: DataType,
    pub op: ReduceOp,
    pub count: usize,
    pub root: usize,
}

impl Shape {
    pub fn new(kind: CollKind, dtype: DataType, op: ReduceOp, count: usize, root: usize) -> Shape {
        Shape {
            kind,
            dtype,
            op,
            count,
            root,
        }
    }
}

/// The last call's (kind, count, element size, root), its plan and, when that plan is one
/// in-node fabric call, that call ([`DirectNode`]: repeated small one-node calls go straight to
/// the fabric).
struct LastCall {
    kind: CollKind,
    count: usize,
    esz: usize,
    root: usize,
    plan: Arc<Plan>,
    direct: Option<DirectNode>,
}

/// One communicator's state on this rank. The rooms of `comm` share it; nothing outside does.
pub(crate) struct Inner {
    pub(super) rank: usize,
    pub(super) size: usize,
    /// This communicator's id (1 for the world; `split` derives the others).
    pub(super) comm: u64,
    pub(super) layout: Layout,
    pub(super) world: World,
    pub(super) links: LinkTable,
    pub(super) fabric: Option<Box<dyn NodeFabric>>,
    /// Calls made so far (the descriptor's sequence number).
    pub(super) seq: u64,
    p2p_send: FxMap<usize, u64>,
    p2p_recv: FxMap<usize, u64>,
    plans: FxMap<(CollKind, Algo, usize, usize), Arc<Plan>>,
    choices: FxMap<(CollKind, usize, usize, usize), (Algo, String)>,
    pub(super) staging: Vec<u64>,
    /// Scratch kept between calls up to [`INPLACE_KEEP`] bytes: the copy an in-place all-to-all
    /// sends from, the input copy an out-of-place reduce-scatter reduces in place, a non-root's
    /// reduce result.
    inplace_copy: Vec<u8>,
    pub(super) poisoned: Option<String>,
    pub(super) split_seq: u64,
    /// The rail (index into the TCP rails) this rank's network traffic uses.
    pub(super) rail: usize,
    /// The bootstrap store this rank serves (rank 0 under srun / torchrun-style env / MPI).
    pub(super) store_server: Option<crate::store::ServerHandle>,
    /// The last call's shape and plan (repeated calls skip planning).
    last: Option<LastCall>,
    /// How long recent collective calls took here (straggler detection).
    strag: Recorder,
}

impl Inner {
    /// A fresh communicator state (no call made yet).
    pub(super) fn new(
        rank: usize,
        comm: u64,
        layout: Layout,
        world: World,
        links: LinkTable,
        fabric: Option<Box<dyn NodeFabric>>,
    ) -> Inner {
        Inner {
            rank,
            size: world.peers.len(),
            comm,
            layout,
            world,
            links,
            fabric,
            seq: 0,
            p2p_send: FxMap::default(),
            p2p_recv: FxMap::default(),
            plans: FxMap::default(),
            choices: FxMap::default(),
            staging: Vec::new(),
            inplace_copy: Vec::new(),
            poisoned: None,
            split_seq: 0,
            rail: 0,
            store_server: None,
            last: None,
            strag: Recorder::new(),
        }
    }

    /// Run `f` unless an earlier failure poisoned the communicator; a failure (other than a
    /// rejected argument) poisons it.
    pub(super) fn guarded<R>(g: &mut Inner, f: impl FnOnce(&mut Inner) -> Result<R>) -> Result<R> {
        if let Some(p) = &g.poisoned {
            return Err(Error::Poisoned(p.clone()));
        }
        let r = f(g);
        match r {
            Err(Error::Invalid(_)) | Ok(_) => r,
            Err(e) => {
                let e = g.fail(e);
                g.poisoned = Some(e.to_string());
                Err(e)
            }
        }
    }

    /// After a failed call: tell the peers (shm abort word, closed connections, the store's abort
    /// record) so nobody waits for this rank until a timeout, and add the first failure reported
    /// by any rank to the error when it names someone else (the root cause of a cascade).
    pub(super) fn fail(&mut self, e: Error) -> Error {
        // Record first, then tell the peers: a peer that reacts to our abort finds the record.
        let Some(store) = self.world.store.clone() else {
            self.links.abort();
            return e;
        };
        // Every store request here has a short deadline: the store (or the relay's host) may be
        // the thing that failed, and a failing rank must end, not wait on it.
        let key = format!("c{:x}/abort", self.comm);
        let first = match store.check_within(std::slice::from_ref(&key), FAIL_PATH_LIMIT) {
            Ok(p) if p.first() == Some(&true) => store
                .get_within(&key, FAIL_PATH_LIMIT)
                .ok()
                .map(|v| String::from_utf8_lossy(&v).into_owned()),
            Ok(_) => {
                let _ = store.set_within(
                    &key,
                    format!("rank {}: {e}", self.rank).as_bytes(),
                    FAIL_PATH_LIMIT,
                );
                None
            }
            Err(_) => None,
        };
        self.links.abort();
        match (first, e) {
            (
                Some(f),
                Error::PeerDead {
                    rank,
                    peer,
                    host,
                    why,
                },
            ) if !f.starts_with(&format!("rank {}:", self.rank)) => Error::PeerDead {
                rank,
                peer,
                host,
                why: format!("{why}; first failure reported: {f}"),
            },
            (
                Some(f),
                Error::Timeout {
                    rank,
                    secs,
                    waiting,
                    what,
                },
            ) if !f.starts_with(&format!("rank {}:", self.rank)) => Error::Timeout {
                rank,
                secs,
                waiting,
                what: format!("{what}; first failure reported: {f}"),
            },
            (_, e) => e,
        }
    }

    /// The algorithm for a call (cached; see [`Inner::choose`]).
    pub(super) fn algo(&mut self, kind: CollKind, count: usize, esz: usize, root: usize) -> Algo {
        match self.choices.get(&(kind, count, esz, root)) {
            Some((a, _)) => *a,
            None => self.choose(kind, count, esz, root).0,
        }
    }

    /// The algorithm for a call: forced by `RAILRING_ALGO`, else the cost model's choice. The
    /// choice is cached per (kind, count, element size, root): pricing builds every rank's plan.
    pub(super) fn choose(
        &mut self,
        kind: CollKind,
        count: usize,
        esz: usize,
        root: usize,
    ) -> (Algo, String) {
        if let Some((a, why)) = self.choices.get(&(kind, count, esz, root)) {
            return (*a, why.clone());
        }
        let (a, why) = self.choose_uncached(kind, count, esz, root);
        tracing::info!(target: "railring::tune", rank = self.rank, "{kind} of {} bytes: {a} ({why})", count * esz);
        if self.choices.len() > 4096 {
            self.choices.clear();
        }
        self.choices
            .insert((kind, count, esz, root), (a, why.clone()));
        (a, why)
    }

    pub(super) fn choose_uncached(
        &self,
        kind: CollKind,
        count: usize,
        esz: usize,
        root: usize,
    ) -> (Algo, String) {
        let candidates = railring_collectives::build::algorithms_for(kind);
        if let Some(a) = self.world.cfg.algo {
            if candidates.contains(&a)
                && build_plan(kind, a, &self.layout, self.rank, count, root).is_ok()
            {
                return (a, format!("forced by RAILRING_ALGO={a}"));
            }
        }
        // On one node the two-level plan is the shared-memory fabric alone: each rank reduces its
        // slice from every peer's staging slot, and small calls take one flag round. Every
        // point-to-point plan moves the same bytes through shm rings with more synchronisation.
        if self.layout.nodes.len() == 1
            && matches!(
                kind,
                CollKind::AllReduce
                    | CollKind::Barrier
                    | CollKind::ReduceScatter
                    | CollKind::AllGather
            )
            && candidates.contains(&Algo::TwoLevel)
        {
            return (
                Algo::TwoLevel,
                "one node: in-node shared-memory fabric".into(),
            );
        }
        // Broadcast, reduce and all-to-all on one node, by measurement (4 ranks on 2 cores,
        // railperf with RAILRING_ALGO forced; README "Scoreboard"): the fabric's
        // broadcast at every size (2 MiB: 0.42 ms against the ring's 0.71 and the tree's 1.05;
        // up to 32 KiB one round through the root's slot); the fabric's reduce at every
        // size (small ones: only the root waits); the fabric's all-to-all at every size,
        // staged or single copy (64 B blocks: 5 µs against 13 µs pairwise; staged 64 KiB
        // blocks 37-46 µs against pairwise's 80-90, 256 KiB 152-169 against 197-311).
        if self.layout.nodes.len() == 1 && self.layout.size() > 1 {
            let bytes = count.saturating_mul(esz);
            let pick = match kind {
                CollKind::Broadcast | CollKind::Reduce | CollKind::AllToAll => Some(Algo::TwoLevel),
                _ => None,
            };
            if let Some(a) = pick.filter(|a| candidates.contains(a)) {
                if build_plan(kind, a, &self.layout, self.rank, count, root).is_ok() {
                    return (
                        a,
                        format!("one node: {a} measured fastest at {bytes} bytes"),
                    );
                }
            }
        }
        self.world
            .cfg
            .cost
            .choose(kind, &self.layout, count, esz, root)
    }

    pub(super) fn plan(
        &mut self,
        kind: CollKind,
        algo: Algo,
        count: usize,
        root: usize,
    ) -> Result<Arc<Plan>> {
        let key = (kind, algo, count, root);
        if let Some(p) = self.plans.get(&key) {
            return Ok(p.clone());
        }
        let p = Arc::new(
            build_plan(kind, algo, &self.layout, self.rank, count, root)
                .map_err(|e| Error::Plan(e.to_string()))?,
        );
        if self.plans.len() > 256 {
            self.plans.clear();
        }
        self.plans.insert(key, p.clone());
        Ok(p)
    }

    /// The next call's descriptor (every call takes a sequence number, even a trivial one).
    pub(super) fn next_desc(&mut self, c: Shape) -> CallDesc {
        self.seq += 1;
        CallDesc {
            seq: self.seq,
            kind: c.kind,
            dtype: c.dtype,
            op: c.op,
            count: c.count as u64,
            root: c.root as u32,
            comm: self.comm,
        }
    }

    /// Run one planned collective on `work` (and `input` for all-to-all).
    pub(super) fn exec(&mut self, c: Shape, work: &mut [u8], input: &[u8]) -> Result<()> {
        self.exec_from(c, work, input, None)
    }

    /// [`Inner::exec`] for an out-of-place call whose work buffer starts as a copy of `src`.
    /// Records how long the call took here (small calls sampled unless the report is on: see
    /// [`straggler`]); every `RAILRING_STRAGGLER` calls, the straggler report (rank 0 prints
    /// it).
    pub(super) fn exec_from(
        &mut self,
        c: Shape,
        work: &mut [u8],
        input: &[u8],
        src: Option<&[u8]>,
    ) -> Result<()> {
        let every = self.world.cfg.straggler;
        let timed = if !self.strag.internal && self.size > 1 {
            self.strag
                .start(c.count.saturating_mul(c.dtype.size()), every > 0)
        } else {
            None
        };
        self.exec_call(c, work, input, src)?;
        if let Some(t0) = timed {
            self.strag.record_since(t0);
            if every > 0 && self.strag.calls.is_multiple_of(every) {
                let rows = self.stragglers(every as usize)?;
                if self.rank == 0 {
                    let calls = rows.first().map(|r| r.calls as u64).unwrap_or(0);
                    eprintln!(
                        "{}",
                        straggler::report_line(&rows, self.strag.calls + 1 - calls, self.comm)
                    );
                }
            }
        }
        Ok(())
    }

    /// The per-rank view of the last `n` collective calls (collective: one all-gather of every
    /// rank's durations; see [`straggler`]).
    pub(super) fn stragglers(&mut self, n: usize) -> Result<Vec<StragglerRow>> {
        let mine = self.strag.last(n);
        let k = mine.len();
        let mut buf = vec![0u8; 4 * k * self.size];
        for (i, d) in mine.iter().enumerate() {
            let at = 4 * (self.rank * k + i);
            buf[at..at + 4].copy_from_slice(&d.to_le_bytes());
        }
        if self.size > 1 && k > 0 {
            self.strag.internal = true;
            let r = self.all_gather(&mut buf, DataType::U32);
            self.strag.internal = false;
            r?;
        }
        let durs: Vec<Vec<u32>> = (0..self.size)
            .map(|r| {
                (0..k)
                    .map(|i| {
                        let at = 4 * (r * k + i);
                        u32::from_le_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]])
                    })
                    .collect()
            })
            .collect();
        let hosts: Vec<String> = self
            .world
            .peers
            .iter()
            .map(|p| p.hostname.clone())
            .collect();
        Ok(straggler::analyze(&durs, &hosts))
    }

    fn exec_call(
        &mut self,
        c: Shape,
        work: &mut [u8],
        input: &[u8],
        src: Option<&[u8]>,
    ) -> Result<()> {
        let Shape {
            kind,
            dtype,
            op,
            count,
            root,
        } = c;
        let desc = self.next_desc(c);
        if self.size == 1 {
            if let Some(s) = src {
                work.copy_from_slice(s);
            }
            return Ok(());
        }
        let bufs = Bufs {
            work: work.as_mut_ptr(),
            work_bytes: work.len(),
            input: input.as_ptr(),
            input_bytes: input.len(),
            src: src.map(|s| s.as_ptr()),
            scratch: std::ptr::null_mut(),
            scratch_bytes: 0,
        };
        // The last call's shape and plan: repeated calls skip both map lookups, and a plan that
        // is one fabric call goes straight to the fabric. (Pipelined calls are not cached: they
        // carry one plan per segment.)
        let cached = match &self.last {
            Some(l)
                if l.kind == kind
                    && l.count == count
                    && l.esz == dtype.size()
                    && l.root == root =>
            {
                if let (Some(d), Some(f)) = (&l.direct, self.fabric.as_deref_mut()) {
                    // SAFETY: work, input and src are live slices of the stated lengths.
                    return unsafe { d.run(f, &desc, op, bufs) };
                }
                Some(l.plan.clone())
            }
            _ => None,
        };
        let (plan, segs) = match cached {
            Some(p) => (p, Vec::new()),
            None => {
                let algo = self.algo(kind, count, dtype.size(), root);
                // A two-level all-reduce over several nodes, big enough: cut it into segments
                // and overlap each segment's network ring with the neighbours' in-node phases.
                let seg = self.world.cfg.pipeline_seg / dtype.size();
                let pipelined = kind == CollKind::AllReduce
                    && algo == Algo::TwoLevel
                    && self.layout.nodes.len() > 1
                    && self.layout.nodes.iter().all(|n| n.len() > 1)
                    && seg > 0
                    && count >= 2 * seg;
                if pipelined {
                    let k = count.div_ceil(seg);
                    let mut v = Vec::with_capacity(k);
                    for i in 0..k {
                        let (off, len) = railring_collectives::plan::split(count, k, i);
                        v.push((off, self.plan(kind, algo, len, root)?));
                    }
                    (v[0].1.clone(), v)
                } else {
                    let plan = self.plan(kind, algo, count, root)?;
                    // (not when each step's time is traced: that walks the plan)
                    let traced = tracing::enabled!(target: "railring::exec", tracing::Level::TRACE);
                    let direct = self.fabric.as_deref().filter(|_| !traced).and_then(|f| {
                        DirectNode::of(&plan, kind, root, dtype.size(), self.size, f.ranks())
                    });
                    self.last = Some(LastCall {
                        kind,
                        count,
                        esz: dtype.size(),
                        root,
                        plan: plan.clone(),
                        direct,
                    });
                    // the first call of a shape too: the executor would copy an out-of-place
                    // input into `work` first, and the fabric then see an in-place call
                    if let (Some(d), Some(f)) = (
                        self.last.as_ref().and_then(|l| l.direct.as_ref()),
                        self.fabric.as_deref_mut(),
                    ) {
                        // SAFETY: work, input and src are live slices of the stated lengths.
                        return unsafe { d.run(f, &desc, op, bufs) };
                    }
                    (plan, Vec::new())
                }
            }
        };
        let pipelined = !segs.is_empty();
        let mut ex = Executor {
            rank: self.rank,
            size: self.size,
            links: &mut self.links,
            fabric: self.fabric.as_deref_mut(),
            timeout: self.world.cfg.timeout,
            chunk: chunk_for(self.world.cfg.net_chunk, work.len().max(input.len())),
            staging: &mut self.staging,
            mem: None,
        };
        // SAFETY: work, input and src are live slices of the stated lengths for the whole call.
        unsafe {
            if pipelined {
                ex.run_pipelined(&segs, &desc, op, bufs)
            } else {
                ex.run(&plan, &desc, op, bufs)
            }
        }
    }

    pub(super) fn check_root(&self, root: usize) -> Result<()> {
        if root >= self.size {
            return Err(Error::Invalid(format!(
                "root {root} is not a rank of this communicator of {} ranks",
                self.size
            )));
        }
        Ok(())
    }

    pub(super) fn all_reduce(
        &mut self,
        buf: &mut [u8],
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        self.all_reduce_from(buf, None, dtype, op)
    }

    pub(super) fn all_reduce_from(
        &mut self,
        buf: &mut [u8],
        src: Option<&[u8]>,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        let count = buf.len() / dtype.size();
        if src.is_some_and(|s| s.len() != buf.len()) {
            return Err(Error::Invalid(
                "all_reduce: input and output lengths differ".into(),
            ));
        }
        self.exec_from(
            Shape::new(CollKind::AllReduce, dtype, op, count, 0),
            buf,
            &[],
            src,
        )?;
        if op == ReduceOp::Avg {
            kernels::finish_avg(dtype, buf, self.size);
        }
        Ok(())
    }

    pub(super) fn reduce_scatter(
        &mut self,
        buf: &mut [u8],
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        let esz = dtype.size();
        if !buf.len().is_multiple_of(esz * self.size) {
            return Err(Error::Invalid(format!(
                "reduce_scatter: {} elements are not {} equal blocks",
                buf.len() / esz,
                self.size
            )));
        }
        let count = buf.len() / esz / self.size;
        self.exec(
            Shape::new(CollKind::ReduceScatter, dtype, op, count, 0),
            buf,
            &[],
        )?;
        if op == ReduceOp::Avg {
            let b = count * esz;
            kernels::finish_avg(
                dtype,
                &mut buf[self.rank * b..(self.rank + 1) * b],
                self.size,
            );
        }
        Ok(())
    }

    /// Out-of-place reduce-scatter: `input` holds `size` blocks, `out` one; this rank's block of
    /// the reduction goes to `out`. The reduce-scatter runs in place on a copy of `input` kept
    /// by the communicator (up to [`INPLACE_KEEP`] bytes), not on one made per call.
    pub(super) fn reduce_scatter_into(
        &mut self,
        input: &[u8],
        out: &mut [u8],
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        if out.len() * self.size != input.len() {
            return Err(Error::Invalid(format!(
                "reduce_scatter: input of {} bytes for {} ranks' blocks of {}",
                input.len(),
                self.size,
                out.len()
            )));
        }
        let mut work = std::mem::take(&mut self.inplace_copy);
        work.clear();
        work.reserve(input.len());
        // SAFETY: `work` has room for `input` (reserved), which it does not overlap; the copy
        // writes every byte before the length covers it. `kernels::copy`: heap buffers meet
        // the placement glibc's copy is slow for.
        unsafe {
            kernels::copy(work.as_mut_ptr(), input.as_ptr(), input.len());
            work.set_len(input.len());
        }
        let r = self.reduce_scatter(&mut work, dtype, op);
        if r.is_ok() {
            let b = out.len();
            // SAFETY: `out` holds `b` bytes and the block of `work` as many; distinct buffers.
            unsafe { kernels::copy(out.as_mut_ptr(), work[self.rank * b..].as_ptr(), b) };
        }
        if work.capacity() <= INPLACE_KEEP {
            self.inplace_copy = work;
        }
        r
    }

    pub(super) fn all_gather(&mut self, buf: &mut [u8], dtype: DataType) -> Result<()> {
        let esz = dtype.size();
        if !buf.len().is_multiple_of(esz * self.size) {
            return Err(Error::Invalid(format!(
                "all_gather: {} elements are not {} equal blocks",
                buf.len() / esz,
                self.size
            )));
        }
        let count = buf.len() / esz / self.size;
        self.exec(
            Shape::new(CollKind::AllGather, dtype, ReduceOp::Sum, count, 0),
            buf,
            &[],
        )
    }

    /// All-gather of `input` (this rank's block) into `out`. On one node the fabric reads the
    /// block from `input` (peers read the caller's input, not a copy just written); elsewhere
    /// the block is copied into place and the all-gather runs in place.
    pub(super) fn all_gather_into(
        &mut self,
        input: &[u8],
        out: &mut [u8],
        dtype: DataType,
    ) -> Result<()> {
        let esz = dtype.size();
        if input.len() * self.size != out.len() || !input.len().is_multiple_of(esz) {
            return Err(Error::Invalid(format!(
                "all_gather: output of {} bytes for {} ranks' blocks of {}",
                out.len(),
                self.size,
                input.len()
            )));
        }
        let count = input.len() / esz;
        if self.size > 1 && self.layout.nodes.len() == 1 && count > 0 && self.fabric.is_some() {
            return self.exec(
                Shape::new(CollKind::AllGather, dtype, ReduceOp::Sum, count, 0),
                out,
                input,
            );
        }
        let me = self.rank;
        let mine = &mut out[me * input.len()..(me + 1) * input.len()];
        // SAFETY: `mine` and `input` have the same length and are distinct buffers
        unsafe { kernels::copy(mine.as_mut_ptr(), input.as_ptr(), input.len()) };
        self.all_gather(out, dtype)
    }

    pub(super) fn broadcast(&mut self, buf: &mut [u8], dtype: DataType, root: usize) -> Result<()> {
        self.broadcast_from(buf, None, dtype, root)
    }

    /// Broadcast of the root's `src` (out of place; `None`: of `buf`) into every rank's `buf`;
    /// only the root's `src` is read. On one node the fabric stages the root's chunks from `src`
    /// and the root copies each staged (cached) chunk to its `buf` while the peers do.
    pub(super) fn broadcast_from(
        &mut self,
        buf: &mut [u8],
        src: Option<&[u8]>,
        dtype: DataType,
        root: usize,
    ) -> Result<()> {
        self.check_root(root)?;
        if src.is_some_and(|s| s.len() != buf.len()) {
            return Err(Error::Invalid(
                "broadcast: input and output lengths differ".into(),
            ));
        }
        let src = src.filter(|_| self.rank == root);
        let count = buf.len() / dtype.size();
        self.exec_from(
            Shape::new(CollKind::Broadcast, dtype, ReduceOp::Sum, count, root),
            buf,
            &[],
            src,
        )
    }

    pub(super) fn reduce(
        &mut self,
        buf: &mut [u8],
        dtype: DataType,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        self.reduce_from(buf, None, dtype, op, root)
    }

    /// Reduce of `src` (out of place; `None`: of `buf`) into the root's `buf`: the plan reads
    /// `src` where it can (a one-node reduce's fabric reads it directly) instead of a copy.
    pub(super) fn reduce_from(
        &mut self,
        buf: &mut [u8],
        src: Option<&[u8]>,
        dtype: DataType,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        self.check_root(root)?;
        if src.is_some_and(|s| s.len() != buf.len()) {
            return Err(Error::Invalid(
                "reduce: input and output lengths differ".into(),
            ));
        }
        let count = buf.len() / dtype.size();
        self.exec_from(
            Shape::new(CollKind::Reduce, dtype, op, count, root),
            buf,
            &[],
            src,
        )?;
        if op == ReduceOp::Avg && self.rank == root {
            kernels::finish_avg(dtype, buf, self.size);
        }
        Ok(())
    }

    /// A reduce on a rank other than the root whose `buf` must stay unchanged: reduced from
    /// `buf` into scratch the communicator keeps (up to 64 MiB), not into a copy made per call.
    pub(super) fn reduce_unchanged(
        &mut self,
        buf: &[u8],
        dtype: DataType,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        let mut scratch = std::mem::take(&mut self.inplace_copy);
        if scratch.len() < buf.len() {
            scratch.resize(buf.len(), 0);
        }
        let r = self.reduce_from(&mut scratch[..buf.len()], Some(buf), dtype, op, root);
        if scratch.capacity() <= INPLACE_KEEP {
            self.inplace_copy = scratch;
        }
        r
    }

    pub(super) fn all_to_all(
        &mut self,
        input: &[u8],
        output: &mut [u8],
        dtype: DataType,
    ) -> Result<()> {
        let count = input.len() / dtype.size() / self.size;
        if self.size == 1 {
            output.copy_from_slice(input);
            self.next_desc(Shape::new(
                CollKind::AllToAll,
                dtype,
                ReduceOp::Sum,
                count,
                0,
            ));
            return Ok(());
        }
        self.exec(
            Shape::new(CollKind::AllToAll, dtype, ReduceOp::Sum, count, 0),
            output,
            input,
        )
    }

    /// All-to-all in place: `buf`'s blocks are sent, then replaced by the received ones. The
    /// blocks to send are first copied aside (as MPI's `MPI_IN_PLACE` all-to-all does), into a
    /// buffer kept for the next call.
    pub(super) fn all_to_all_in_place(&mut self, buf: &mut [u8], dtype: DataType) -> Result<()> {
        // On one node the in-node fabric's all-to-all is the whole plan, and it works in place
        // (the staging copy reads each chunk in before writing it; the single copy pairs ranks).
        let count = buf.len() / dtype.size() / self.size.max(1);
        if self.size > 1
            && self.layout.nodes.len() == 1
            && count > 0
            && self.algo(CollKind::AllToAll, count, dtype.size(), 0) == Algo::TwoLevel
        {
            return self.exec(
                Shape::new(CollKind::AllToAll, dtype, ReduceOp::Sum, count, 0),
                buf,
                &[],
            );
        }
        let mut copy = std::mem::take(&mut self.inplace_copy);
        copy.clear();
        copy.extend_from_slice(buf);
        let r = self.all_to_all(&copy, buf, dtype);
        if copy.capacity() <= INPLACE_KEEP {
            self.inplace_copy = copy;
        }
        r
    }

    pub(super) fn barrier(&mut self) -> Result<()> {
        let mut b = [0u8; 1];
        self.exec(
            Shape::new(CollKind::Barrier, DataType::U8, ReduceOp::Max, 1, 0),
            &mut b,
            &[],
        )
    }

    pub(super) fn p2p(
        &mut self,
        send: Option<(&[u8], usize)>,
        recv: Option<(&mut [u8], usize)>,
        dtype: DataType,
    ) -> Result<()> {
        for p in send
            .as_ref()
            .map(|s| s.1)
            .into_iter()
            .chain(recv.as_ref().map(|r| r.1))
        {
            if p >= self.size {
                return Err(Error::Invalid(format!(
                    "peer {p} is not a rank of this communicator of {} ranks",
                    self.size
                )));
            }
        }
        let esz = dtype.size();
        // Each direction carries its own descriptor: sequence numbers count sends per peer.
        if let Some((buf, peer)) = send {
            let n = buf.len() / esz;
            let s = self.p2p_send.entry(peer).or_insert(0);
            *s += 1;
            let desc = CallDesc {
                seq: *s,
                kind: CollKind::SendRecv,
                dtype,
                op: ReduceOp::Sum,
                count: n as u64,
                root: self.rank as u32,
                comm: self.comm,
            };
            let (rdesc, rbuf) = match recv {
                Some((rb, src)) => {
                    let r = self.p2p_recv.entry(src).or_insert(0);
                    *r += 1;
                    (
                        Some((
                            CallDesc {
                                seq: *r,
                                kind: CollKind::SendRecv,
                                dtype,
                                op: ReduceOp::Sum,
                                count: (rb.len() / esz) as u64,
                                root: src as u32,
                                comm: self.comm,
                            },
                            src,
                        )),
                        Some(rb),
                    )
                }
                None => (None, None),
            };
            return self.p2p_exec(Some((buf, peer, desc)), rbuf.zip(rdesc), esz);
        }
        if let Some((rb, src)) = recv {
            let r = self.p2p_recv.entry(src).or_insert(0);
            *r += 1;
            let d = CallDesc {
                seq: *r,
                kind: CollKind::SendRecv,
                dtype,
                op: ReduceOp::Sum,
                count: (rb.len() / esz) as u64,
                root: src as u32,
                comm: self.comm,
            };
            return self.p2p_exec(None, Some((rb, (d, src))), esz);
        }
        Ok(())
    }

    /// Point-to-point: a sender's descriptor names itself as "root"; the receiver expects the
    /// sender's rank there, so the descriptors of a matching send and receive are equal.
    pub(super) fn p2p_exec(
        &mut self,
        send: Option<(&[u8], usize, CallDesc)>,
        recv: Option<(&mut [u8], (CallDesc, usize))>,
        _esz: usize,
    ) -> Result<()> {
        if self.size == 1
            || send.as_ref().is_some_and(|s| s.1 == self.rank)
            || recv.as_ref().is_some_and(|r| r.1 .1 == self.rank)
        {
            // Self-send: copy directly.
            if let (Some((s, sp, _)), Some((r, (_, rp)))) = (&send, &recv) {
                if *sp == self.rank && *rp == self.rank && s.len() == r.len() {
                    let r: &mut [u8] =
                        unsafe { std::slice::from_raw_parts_mut(r.as_ptr() as *mut u8, r.len()) };
                    r.copy_from_slice(s);
                    return Ok(());
                }
            }
            return Err(Error::Invalid(
                "send/recv to self needs a matching send_recv on the same call".into(),
            ));
        }
        let mut ex = Executor {
            rank: self.rank,
            size: self.size,
            links: &mut self.links,
            fabric: None,
            timeout: self.world.cfg.timeout,
            chunk: chunk_for(
                self.world.cfg.net_chunk,
                recv.as_ref().map(|r| r.0.len()).unwrap_or(0),
            ),
            staging: &mut self.staging,
            mem: None,
        };
        // SAFETY: the slices outlive the call.
        unsafe {
            ex.p2p(
                send.map(|(b, p, d)| (b.as_ptr(), b.len(), p, d)),
                recv.map(|(b, (d, p))| (b.as_mut_ptr(), b.len(), p, d)),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_staging_chunk_is_sized_by_the_call() {
        assert_eq!(chunk_for(256 << 20, 4 << 20), 4 << 20);
        assert_eq!(chunk_for(512 << 10, 4 << 20), 512 << 10);
        assert_eq!(chunk_for(1 << 20, 0), 4096);
        assert_eq!(chunk_for(1 << 20, 5000), 8192);
    }
}

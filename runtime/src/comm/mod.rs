//! The communicator: who the ranks are, where they live, and the collective API.
//!
//! The rooms of this folder, in the order a call walks through them:
//! - `mod.rs` (here): the types ([`Communicator`], its shared state) and the typed public API;
//! - [`raw`]: the same collectives on byte buffers plus a [`DataType`] (benchmarks, bindings);
//! - [`binding`]: started collectives on caller-owned memory (raw pointers and a keep-alive
//!   owner) and one-sided send/recv on bytes, for language bindings (hidden from the docs);
//! - [`order`]: call ordering — blocking calls on the caller's thread, `*_start` calls on one
//!   worker thread, tickets keeping both in program order — and [`Pending`];
//! - [`call`]: `Inner`, one communicator's state, and its call path: argument checks, the
//!   algorithm choice, the plan cache, the executor run, failure handling (poisoning, telling
//!   the peers);
//! - [`setup`]: making communicators — `init` from the launch, the world gathered through the
//!   store, binding, the node's shared-memory segment, `split`;
//! - [`straggler`]: how long each recent call took here, and who arrived last
//!   (`RAILRING_STRAGGLER`, [`Communicator::stragglers`]);
//! - `device` / `device_state` (feature `cuda`): collectives on device memory and the
//!   per-communicator device state they keep.
//!
//! Links to peers are the transport's ([`crate::transport::links::LinkTable`]); the executor gets
//! them through the [`Links`](crate::transport::links::Links) trait.

mod bias;
mod binding;
mod call;
#[cfg(feature = "cuda")]
pub mod device;
#[cfg(feature = "cuda")]
pub(crate) mod device_state;
mod order;
mod raw;
mod setup;
pub mod straggler;

pub use crate::transport::links::PeerInfo;
pub use order::Pending;

use crate::error::{Error, Result};
use call::Inner;
use railring_collectives::plan::{Algo, CollKind, Layout, Plan};
use railring_collectives::{as_bytes, as_bytes_mut, DataType, Element, ReduceOp};
use std::sync::{mpsc, Arc, Condvar, Mutex};

/// A group of ranks that run collectives together.
///
/// Calls on one communicator run in the order they are made (non-blocking ones included); every
/// rank must make the same calls in the same order. After a failed call (a peer died, calls
/// disagreed, a timeout) the communicator refuses further calls.
pub struct Communicator {
    sh: Arc<Shared>,
}

/// What every handle of one communicator shares: its state, the call-order tickets and the
/// worker, plus the facts that never change (read without a lock).
struct Shared {
    inner: bias::BiasedLock<Inner>,
    turn: Mutex<order::Turn>,
    turn_cv: Condvar,
    worker: Mutex<Option<mpsc::Sender<order::Queued>>>,
    /// Set once the worker exists: from then on calls take tickets.
    worker_started: std::sync::atomic::AtomicBool,
    /// Tests: while set, the worker takes up no call.
    #[cfg(test)]
    hold_worker: Arc<std::sync::atomic::AtomicBool>,
    rank: usize,
    size: usize,
    local_rank: usize,
    local_size: usize,
    node: usize,
    nnodes: usize,
}

impl Communicator {
    pub fn rank(&self) -> usize {
        self.sh.rank
    }
    pub fn size(&self) -> usize {
        self.sh.size
    }
    pub fn local_rank(&self) -> usize {
        self.sh.local_rank
    }
    pub fn local_size(&self) -> usize {
        self.sh.local_size
    }
    /// Index of this rank's node (nodes ordered by their lowest rank).
    pub fn node(&self) -> usize {
        self.sh.node
    }
    pub fn nnodes(&self) -> usize {
        self.sh.nnodes
    }
    /// Which ranks share which node.
    pub fn layout(&self) -> Layout {
        self.lock().layout.clone()
    }
    /// The rail (index into this rank's rail interfaces) its network traffic uses, and its name.
    pub fn rail(&self) -> (usize, Option<String>) {
        let g = self.lock();
        let name = g
            .world
            .net
            .as_ref()
            .and_then(|n| n.rails.get(g.rail).map(|r| r.ifname.clone()));
        (g.rail, name)
    }
    /// Who arrived last at the recent collective calls (up to [`straggler::WINDOW`]; calls
    /// under [`straggler::TIME_ALWAYS`] bytes sampled one in [`straggler::SAMPLE`] unless
    /// `RAILRING_STRAGGLER` is set) and how late, one row per rank (see [`straggler`]).
    /// Collective: every rank must call it; it exchanges each rank's call durations with one
    /// all-gather.
    pub fn stragglers(&self) -> Result<Vec<straggler::StragglerRow>> {
        self.blocking(|g| g.stragglers(straggler::WINDOW))
    }
    /// `RAILRING_STRAGGLER`: the report interval in calls (0: off).
    pub fn straggler_every(&self) -> u64 {
        self.lock().world.cfg.straggler
    }
    /// Bytes sent so far over network links (for counters and tests).
    pub fn net_bytes_sent(&self) -> u64 {
        self.lock().links.net_bytes_sent()
    }
    /// The algorithm the communicator would use for `kind` of `count` elements of `dtype`, and why.
    pub fn explain(
        &self,
        kind: CollKind,
        count: usize,
        dtype: DataType,
        root: usize,
    ) -> (Algo, String) {
        self.lock().choose(kind, count, dtype.size(), root)
    }
    /// The plan this rank runs for such a call (for `--explain` style output).
    pub fn plan_for(
        &self,
        kind: CollKind,
        count: usize,
        dtype: DataType,
        root: usize,
    ) -> Result<Plan> {
        let mut g = self.lock();
        let (algo, _) = g.choose(kind, count, dtype.size(), root);
        g.plan(kind, algo, count, root).map(|p| (*p).clone())
    }

    fn lock(&self) -> bias::BiasedGuard<'_, Inner> {
        self.sh.inner.lock()
    }

    // ---- collectives ----

    /// In-place all-reduce: every rank ends with the reduction of every rank's `buf`.
    pub fn all_reduce<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        self.blocking(|g| g.all_reduce(as_bytes_mut(buf), T::DTYPE, op))
    }

    /// Out-of-place all-reduce.
    pub fn all_reduce_into<T: Element>(
        &self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        same_len("all_reduce_into", input, output)?;
        self.blocking(|g| {
            g.all_reduce_from(as_bytes_mut(output), Some(as_bytes(input)), T::DTYPE, op)
        })
    }

    /// Non-blocking all-reduce of an owned buffer; `wait()` returns it reduced.
    pub fn all_reduce_start<T: Element>(&self, mut buf: Vec<T>, op: ReduceOp) -> Pending<Vec<T>> {
        self.submit(move |g| {
            g.all_reduce(as_bytes_mut(&mut buf), T::DTYPE, op)
                .map(|_| buf)
        })
    }

    /// Out-of-place all-reduce of owned buffers, started now: `wait()` returns `(input,
    /// output)`, `output` holding the reduction of every rank's `input` (`input` unchanged). The
    /// runtime reads `input` where it is (no copy into `output` first), as
    /// [`Communicator::all_reduce_into`] does.
    pub fn all_reduce_into_start<T: Element>(
        &self,
        input: Vec<T>,
        mut output: Vec<T>,
        op: ReduceOp,
    ) -> Pending<(Vec<T>, Vec<T>)> {
        if let Err(e) = same_len("all_reduce_into_start", &input, &output) {
            return Pending::done(Err(e));
        }
        self.submit(move |g| {
            g.all_reduce_from(
                as_bytes_mut(&mut output),
                Some(as_bytes(&input)),
                T::DTYPE,
                op,
            )
            .map(|_| (input, output))
        })
    }

    /// Reduce-scatter: `input` holds `size` blocks of `output.len()` elements; rank r's `output`
    /// receives the reduction of block r.
    pub fn reduce_scatter<T: Element>(
        &self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        let n = self.size();
        if input.len() != output.len() * n {
            return Err(Error::Invalid(format!(
                "reduce_scatter: input has {} elements, expected {} x {n}",
                input.len(),
                output.len()
            )));
        }
        self.blocking(|g| {
            g.reduce_scatter_into(as_bytes(input), as_bytes_mut(output), T::DTYPE, op)
        })
    }

    /// In-place reduce-scatter: `buf` holds `size` blocks; afterwards this rank's block holds the
    /// reduction (other blocks are scratch).
    pub fn reduce_scatter_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        self.blocking(|g| g.reduce_scatter(as_bytes_mut(buf), T::DTYPE, op))
    }

    pub fn reduce_scatter_start<T: Element>(
        &self,
        mut buf: Vec<T>,
        op: ReduceOp,
    ) -> Pending<Vec<T>> {
        self.submit(move |g| {
            g.reduce_scatter(as_bytes_mut(&mut buf), T::DTYPE, op)
                .map(|_| buf)
        })
    }

    /// All-gather: `output` (`size` x `input.len()`) receives every rank's `input`, in rank order.
    pub fn all_gather<T: Element>(&self, input: &[T], output: &mut [T]) -> Result<()> {
        let (n, c) = (self.size(), input.len());
        if output.len() != c * n {
            return Err(Error::Invalid(format!(
                "all_gather: output has {} elements, expected {c} x {n}",
                output.len()
            )));
        }
        self.blocking(|g| g.all_gather_into(as_bytes(input), as_bytes_mut(output), T::DTYPE))
    }

    /// In-place all-gather: this rank's block of `buf` is its contribution.
    pub fn all_gather_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        self.blocking(|g| g.all_gather(as_bytes_mut(buf), T::DTYPE))
    }

    pub fn all_gather_start<T: Element>(&self, mut buf: Vec<T>) -> Pending<Vec<T>> {
        self.submit(move |g| g.all_gather(as_bytes_mut(&mut buf), T::DTYPE).map(|_| buf))
    }

    /// Out-of-place all-gather of owned buffers, started now: `wait()` returns `(input,
    /// output)`, `output` (`size` x `input.len()`) holding every rank's `input` in rank order.
    pub fn all_gather_into_start<T: Element>(
        &self,
        input: Vec<T>,
        mut output: Vec<T>,
    ) -> Pending<(Vec<T>, Vec<T>)> {
        let (n, c) = (self.size(), input.len());
        if output.len() != c * n {
            return Pending::done(Err(Error::Invalid(format!(
                "all_gather_into_start: output has {} elements, expected {c} x {n}",
                output.len()
            ))));
        }
        self.submit(move |g| {
            g.all_gather_into(as_bytes(&input), as_bytes_mut(&mut output), T::DTYPE)
                .map(|_| (input, output))
        })
    }

    /// Broadcast `root`'s `buf` to every rank.
    pub fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        self.blocking(|g| g.broadcast(as_bytes_mut(buf), T::DTYPE, root))
    }

    /// Out-of-place broadcast: every rank's `output` receives `root`'s `input` (read only on
    /// the root; the same length as `output` on every rank).
    pub fn broadcast_into<T: Element>(
        &self,
        input: &[T],
        output: &mut [T],
        root: usize,
    ) -> Result<()> {
        same_len("broadcast_into", input, output)?;
        self.blocking(|g| {
            g.broadcast_from(as_bytes_mut(output), Some(as_bytes(input)), T::DTYPE, root)
        })
    }

    pub fn broadcast_start<T: Element>(&self, mut buf: Vec<T>, root: usize) -> Pending<Vec<T>> {
        self.submit(move |g| {
            g.broadcast(as_bytes_mut(&mut buf), T::DTYPE, root)
                .map(|_| buf)
        })
    }

    /// Reduce to `root`: `output` on the root receives the reduction of every rank's `input`
    /// (on other ranks `output` is used as scratch).
    pub fn reduce<T: Element>(
        &self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        same_len("reduce", input, output)?;
        self.blocking(|g| {
            g.reduce_from(
                as_bytes_mut(output),
                Some(as_bytes(input)),
                T::DTYPE,
                op,
                root,
            )
        })
    }

    /// In-place reduce: the root's `buf` receives the reduction; other ranks' `buf` is unchanged.
    pub fn reduce_in_place<T: Element>(
        &self,
        buf: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        if self.rank() == root {
            self.blocking(|g| g.reduce(as_bytes_mut(buf), T::DTYPE, op, root))
        } else {
            self.blocking(|g| g.reduce_unchanged(as_bytes(buf), T::DTYPE, op, root))
        }
    }

    pub fn reduce_start<T: Element>(
        &self,
        mut buf: Vec<T>,
        op: ReduceOp,
        root: usize,
    ) -> Pending<Vec<T>> {
        self.submit(move |g| {
            g.reduce(as_bytes_mut(&mut buf), T::DTYPE, op, root)
                .map(|_| buf)
        })
    }

    /// Out-of-place reduce of owned buffers, started now: `wait()` returns `(input, output)`;
    /// the root's `output` holds the reduction of every rank's `input` (elsewhere `output` is
    /// scratch), as [`Communicator::reduce`].
    pub fn reduce_into_start<T: Element>(
        &self,
        input: Vec<T>,
        mut output: Vec<T>,
        op: ReduceOp,
        root: usize,
    ) -> Pending<(Vec<T>, Vec<T>)> {
        if let Err(e) = same_len("reduce_into_start", &input, &output) {
            return Pending::done(Err(e));
        }
        self.submit(move |g| {
            g.reduce_from(
                as_bytes_mut(&mut output),
                Some(as_bytes(&input)),
                T::DTYPE,
                op,
                root,
            )
            .map(|_| (input, output))
        })
    }

    /// All-to-all: `input` holds `size` blocks (block j goes to rank j); `output` receives
    /// `size` blocks (block j from rank j).
    pub fn all_to_all<T: Element>(&self, input: &[T], output: &mut [T]) -> Result<()> {
        let n = self.size();
        if input.len() != output.len() || !input.len().is_multiple_of(n) {
            return Err(Error::Invalid(format!(
                "all_to_all: input {} and output {} elements must be equal and divisible by {n}",
                input.len(),
                output.len()
            )));
        }
        self.blocking(|g| g.all_to_all(as_bytes(input), as_bytes_mut(output), T::DTYPE))
    }

    /// All-to-all in place: `buf` holds `size` blocks (block j goes to rank j) and receives
    /// `size` blocks (block j from rank j). The blocks to send are copied aside first, into a
    /// buffer the communicator keeps for the next call.
    pub fn all_to_all_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        let n = self.size();
        if !buf.len().is_multiple_of(n) {
            return Err(Error::Invalid(format!(
                "all_to_all_in_place: {} elements are not divisible by {n}",
                buf.len()
            )));
        }
        self.blocking(|g| g.all_to_all_in_place(as_bytes_mut(buf), T::DTYPE))
    }

    /// Out-of-place all-to-all of owned buffers, started now: `wait()` returns `(input,
    /// output)`, `output` holding block j from rank j (as [`Communicator::all_to_all`]).
    pub fn all_to_all_into_start<T: Element>(
        &self,
        input: Vec<T>,
        mut output: Vec<T>,
    ) -> Pending<(Vec<T>, Vec<T>)> {
        let n = self.size();
        if input.len() != output.len() || !input.len().is_multiple_of(n) {
            return Pending::done(Err(Error::Invalid(format!(
                "all_to_all_into_start: input {} and output {} elements must be equal and divisible by {n}",
                input.len(),
                output.len()
            ))));
        }
        self.submit(move |g| {
            g.all_to_all(as_bytes(&input), as_bytes_mut(&mut output), T::DTYPE)
                .map(|_| (input, output))
        })
    }

    /// All-to-all of `buf` (as [`Communicator::all_to_all_in_place`]), started now: the same
    /// vector comes back holding the received blocks.
    pub fn all_to_all_start<T: Element>(&self, mut buf: Vec<T>) -> Pending<Vec<T>> {
        let n = self.size();
        self.submit(move |g| {
            if !buf.len().is_multiple_of(n) {
                return Err(Error::Invalid(
                    "all_to_all: length not divisible by the world size".into(),
                ));
            }
            g.all_to_all_in_place(as_bytes_mut(&mut buf), T::DTYPE)
                .map(|_| buf)
        })
    }

    /// Send `buf` to `peer` (matched in order with the peer's `recv` from this rank).
    pub fn send<T: Element>(&self, buf: &[T], peer: usize) -> Result<()> {
        self.blocking(|g| g.p2p(Some((as_bytes(buf), peer)), None, T::DTYPE))
    }

    /// Receive `buf.len()` elements from `peer`.
    pub fn recv<T: Element>(&self, buf: &mut [T], peer: usize) -> Result<()> {
        self.blocking(|g| g.p2p(None, Some((as_bytes_mut(buf), peer)), T::DTYPE))
    }

    /// Send to `dest` and receive from `src` at the same time (no deadlock when ranks pair up).
    pub fn send_recv<T: Element>(
        &self,
        send: &[T],
        dest: usize,
        recv: &mut [T],
        src: usize,
    ) -> Result<()> {
        self.blocking(|g| {
            g.p2p(
                Some((as_bytes(send), dest)),
                Some((as_bytes_mut(recv), src)),
                T::DTYPE,
            )
        })
    }

    /// Wait until every rank has called `barrier`.
    pub fn barrier(&self) -> Result<()> {
        self.blocking(|g| g.barrier())
    }

    pub fn barrier_start(&self) -> Pending<()> {
        self.submit(|g| g.barrier())
    }

    /// Split like `MPI_Comm_split`: ranks passing the same `color` form a new communicator,
    /// ordered by (`key`, old rank). `None` (MPI_UNDEFINED) takes part but gets no communicator.
    pub fn split(&self, color: Option<u32>, key: i64) -> Result<Option<Communicator>> {
        self.blocking(|g| g.split(color, key))
    }
}

/// An out-of-place call's input and output hold the same number of elements.
fn same_len<T>(what: &str, input: &[T], output: &[T]) -> Result<()> {
    if input.len() != output.len() {
        return Err(Error::Invalid(format!(
            "{what}: input has {} elements, output {}",
            input.len(),
            output.len()
        )));
    }
    Ok(())
}

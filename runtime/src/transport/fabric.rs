//! The in-node collective interface: [`NodeFabric`] and the words it speaks — which collective
//! ([`NodeMode`]), one call's arguments ([`NodeOp`]) and the size of the call descriptor that
//! the ranks of a node compare ([`DESC`]). Implementations: `shm::ShmFabric` on CPU hosts and,
//! behind the `cuda` feature, `cuda::GpuFabric` over device memory.

use railring_collectives::{DataType, ReduceOp};

/// Bytes of a call descriptor (`executor::CallDesc::encode`): what every fabric keeps per rank
/// for mismatch checks, and what the first transfer with each peer carries.
pub const DESC: usize = 64;

/// Which in-node collective to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeMode {
    /// Reduce-scatter: afterwards local rank i's slice holds the node's reduction of it.
    ReduceScatter,
    /// All-gather: afterwards every slice holds its owner's data.
    AllGather,
    /// Reduce-scatter and all-gather fused (an in-node all-reduce), pipelined per chunk.
    AllReduce,
    /// Small all-reduce: every rank reduces the whole (small) buffer itself; one flag round. A
    /// fabric may run it another way (the shared-memory fabric's two ranks whose kernel copies
    /// fast: each reduces its peer's half, as [`NodeMode::AllReduce`]).
    AllReduceSmall,
    /// Reduce to local index `root` (the node is the whole communicator): the root's buffer
    /// receives the reduction; the others only hand their data over (their buffers are
    /// scratch). A fabric may run it as an all-reduce.
    Reduce { root: usize },
    /// Broadcast from local index `root`: every member's `slices[0]` receives the root's.
    Broadcast { root: usize },
    /// All-to-all: `slices[j]` is local rank j's block, at the same offsets in this rank's
    /// input (`src`: the block destined for local rank j) and in `work` (the block from local
    /// rank j). Every block has the same length.
    AllToAll,
}

/// One in-node collective call: [`NodeFabric::node_op`]'s arguments.
#[derive(Clone, Copy)]
pub struct NodeOp<'a> {
    pub mode: NodeMode,
    pub dtype: DataType,
    pub op: ReduceOp,
    /// Out-of-place calls: where this rank's input is, at the same offsets as `work`. `None`:
    /// in place, the input is `work` itself. An all-gather reads only this rank's own slice
    /// there (the pointer may stand for a buffer holding just that slice).
    pub src: Option<*const u8>,
    /// The rank's buffer; `slices` are byte ranges of it.
    pub work: *mut u8,
    /// `(byte offset, bytes)` of each local rank's slice (`slices[i]` owned by local index i;
    /// identical on every member).
    pub slices: &'a [(usize, usize)],
    /// This call's descriptor: peers whose descriptor differs fail the call...
    pub desc: &'a [u8; DESC],
    /// ...described with this.
    pub describe: &'a dyn Fn(&[u8; DESC]) -> String,
}

impl NodeOp<'_> {
    /// Where this rank's input is: `src`, or `work` in place.
    pub fn input(&self) -> *const u8 {
        self.src.unwrap_or(self.work)
    }

    /// The same call in place: an out-of-place input is first copied into `work` over every
    /// slice. For fabrics that do not read `src` directly.
    ///
    /// # Safety
    /// `src` valid for reads and `work` for writes over every slice (host memory).
    pub unsafe fn in_place(self) -> Self {
        if let Some(src) = self.src {
            if !std::ptr::eq(src, self.work) {
                for &(o, n) in self.slices {
                    std::ptr::copy(src.add(o), self.work.add(o), n);
                }
            }
        }
        NodeOp { src: None, ..self }
    }
}

/// An in-node collective engine: the shared-memory fabric on CPU hosts; a CUDA IPC / NVLink
/// fabric on GPU hosts. The executor hands it the plan's `NodeReduceScatter` / `NodeAllGather`
/// steps (fused into one all-reduce where possible).
pub trait NodeFabric: Send {
    /// Communicator ranks on this node, in local-rank order.
    fn ranks(&self) -> &[usize];
    /// Run one in-node collective over byte slices of `call.work`. An out-of-place call
    /// (`call.src` set) reads this rank's input from `src`: fabrics that stage data anyway read
    /// it directly, others copy it in first ([`NodeOp::in_place`]).
    ///
    /// # Safety
    /// `call.work` valid for reads and writes, and `call.src` for reads, over every slice.
    unsafe fn node_op(&mut self, call: NodeOp<'_>) -> crate::Result<()>;
}

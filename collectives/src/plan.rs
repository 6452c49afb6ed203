//! Plans: for one rank of one collective call, the list of steps — exchange with a peer over a
//! channel, in-node reduce-scatter / all-gather over shared memory, local copies. A plan is data:
//! it can be checked symbolically ([`crate::check`](mod@crate::check)), priced
//! ([`crate::cost`]), rendered (`Display`) and executed (by the runtime's executor, over any
//! transport).
//!
//! Conventions every algorithm and the executor rely on:
//! - Regions are in **elements**, never bytes.
//! - `Buf::Work` is the rank's working buffer: for all-reduce / broadcast / reduce it has `count`
//!   elements; for reduce-scatter and all-gather `count * n` (rank r's block is
//!   `split(count*n, n, r)`... see each algorithm); `Buf::Input` is a second, read-only buffer
//!   (all-to-all's send buffer); `Buf::Scratch` is the rank's own temporary space for one call
//!   (e.g. the Bruck all-to-all packs blocks there), uninitialised at the start, as long as the
//!   plan's furthest scratch region ([`Plan::scratch_len`]).
//! - `Exchange` steps between the same ordered pair of ranks on the same channel are matched in
//!   order (FIFO). Zero-length transfers are skipped by every executor, consistently on both sides.
//! - In an `Exchange`, the send and the receive run concurrently (never send-then-receive), so two
//!   ranks that exchange with each other cannot deadlock.
//! - `reduce: true` means `dst = dst op incoming`, with `op` the call's combiner.

use std::fmt;

/// The kind of a collective call. Travels (with sequence number, dtype, count, op, root) in the
/// first frame of every call, so ranks whose calls disagree get an error, not garbage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum CollKind {
    AllReduce = 0,
    ReduceScatter = 1,
    AllGather = 2,
    Broadcast = 3,
    Reduce = 4,
    AllToAll = 5,
    SendRecv = 6,
    Barrier = 7,
}

impl CollKind {
    pub const ALL: [CollKind; 8] = [
        CollKind::AllReduce,
        CollKind::ReduceScatter,
        CollKind::AllGather,
        CollKind::Broadcast,
        CollKind::Reduce,
        CollKind::AllToAll,
        CollKind::SendRecv,
        CollKind::Barrier,
    ];
    pub fn from_u8(v: u8) -> Option<CollKind> {
        CollKind::ALL.get(v as usize).copied()
    }
    pub const fn name(self) -> &'static str {
        match self {
            CollKind::AllReduce => "all_reduce",
            CollKind::ReduceScatter => "reduce_scatter",
            CollKind::AllGather => "all_gather",
            CollKind::Broadcast => "broadcast",
            CollKind::Reduce => "reduce",
            CollKind::AllToAll => "all_to_all",
            CollKind::SendRecv => "send_recv",
            CollKind::Barrier => "barrier",
        }
    }
}

impl fmt::Display for CollKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which of the rank's buffers a region lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Buf {
    /// The working buffer (in/out).
    Work,
    /// A read-only second buffer (all-to-all's send buffer).
    Input,
    /// Temporary space of this rank for the call: uninitialised at the start, gone at the end.
    Scratch,
}

/// A range of elements in one of the rank's buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Region {
    pub buf: Buf,
    pub offset: usize,
    pub len: usize,
}

impl Region {
    pub const fn work(offset: usize, len: usize) -> Region {
        Region {
            buf: Buf::Work,
            offset,
            len,
        }
    }
    pub const fn input(offset: usize, len: usize) -> Region {
        Region {
            buf: Buf::Input,
            offset,
            len,
        }
    }
    pub const fn scratch(offset: usize, len: usize) -> Region {
        Region {
            buf: Buf::Scratch,
            offset,
            len,
        }
    }
    pub const fn end(&self) -> usize {
        self.offset + self.len
    }
}

/// One side of a point-to-point transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Xfer {
    /// Rank (in the communicator) of the peer.
    pub peer: usize,
    /// Region of *this* rank's buffer that is sent from / received into.
    pub region: Region,
    /// Channel: the ring index for multi-ring plans. The runtime maps a channel to a rail.
    pub chan: usize,
}

/// One step of a plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Send `send` and receive `recv` concurrently. With `reduce`, received elements are combined
    /// into the destination region; otherwise they overwrite it.
    Exchange {
        send: Option<Xfer>,
        recv: Option<Xfer>,
        reduce: bool,
    },
    /// In-node reduce-scatter among `group` (ranks on one node, identical list on every member):
    /// afterwards member `group[i]`'s `slices[i]` of its work buffer holds the combination of
    /// that region over every member, combined in `group` order. Other regions are unchanged.
    NodeReduceScatter {
        group: Vec<usize>,
        slices: Vec<Region>,
    },
    /// In-node all-gather among `group`: afterwards every member's `slices[i]` holds member
    /// `group[i]`'s `slices[i]`.
    NodeAllGather {
        group: Vec<usize>,
        slices: Vec<Region>,
    },
    /// In-node broadcast among `group`: afterwards every member's `region` holds member
    /// `group[root]`'s `region` (`root` is an index into `group`).
    NodeBroadcast {
        group: Vec<usize>,
        root: usize,
        region: Region,
    },
    /// In-node all-to-all among `group`: afterwards member `group[i]`'s `Work` region
    /// `blocks[j]` holds member `group[j]`'s `Input` region at the offsets of `blocks[i]`
    /// (`blocks` name `Work` regions; the `Input` blocks sit at the same offsets). With
    /// `in_place` the blocks are read from `Work` instead: the members' blocks are transposed
    /// there (member i's `blocks[j]` swaps with member j's `blocks[i]`).
    NodeAllToAll {
        group: Vec<usize>,
        blocks: Vec<Region>,
        in_place: bool,
    },
    /// Local copy inside this rank (e.g. all-to-all's own block).
    Copy { src: Region, dst: Region },
}

impl Step {
    /// The node group of an in-node step (`None` for exchanges and copies).
    pub fn node_group(&self) -> Option<&[usize]> {
        match self {
            Step::NodeReduceScatter { group, .. }
            | Step::NodeAllGather { group, .. }
            | Step::NodeBroadcast { group, .. }
            | Step::NodeAllToAll { group, .. } => Some(group),
            Step::Exchange { .. } | Step::Copy { .. } => None,
        }
    }

    /// The `Work` regions an in-node step touches, one per member (a broadcast's one region for
    /// every member).
    pub fn node_regions(&self) -> Vec<Region> {
        match self {
            Step::NodeReduceScatter { slices, .. } | Step::NodeAllGather { slices, .. } => {
                slices.clone()
            }
            Step::NodeBroadcast { group, region, .. } => vec![*region; group.len()],
            Step::NodeAllToAll { blocks, .. } => blocks.clone(),
            Step::Exchange { .. } | Step::Copy { .. } => Vec::new(),
        }
    }

    /// A short name of the step's kind, for messages.
    pub fn kind_name(&self) -> &'static str {
        match self {
            Step::Exchange { .. } => "exchange",
            Step::NodeReduceScatter { .. } => "node reduce-scatter",
            Step::NodeAllGather { .. } => "node all-gather",
            Step::NodeBroadcast { .. } => "node broadcast",
            Step::NodeAllToAll { .. } => "node all-to-all",
            Step::Copy { .. } => "copy",
        }
    }
}

/// Algorithms. One file each in this crate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algo {
    /// Reduce-scatter inside each node over shared memory, one ring per rail between nodes,
    /// all-gather inside the node.
    TwoLevel,
    /// One flat ring over all ranks.
    Ring,
    /// Recursive doubling (latency-optimised, small messages).
    RecursiveDoubling,
    /// Binomial tree (broadcast / reduce).
    Tree,
    /// Pairwise exchange (all-to-all).
    Pairwise,
    /// Bruck's all-to-all: ceil(log2 n) rounds, blocks packed (small blocks, many ranks).
    Bruck,
}

impl Algo {
    pub const fn name(self) -> &'static str {
        match self {
            Algo::TwoLevel => "two_level",
            Algo::Ring => "ring",
            Algo::RecursiveDoubling => "recursive_doubling",
            Algo::Tree => "tree",
            Algo::Pairwise => "pairwise",
            Algo::Bruck => "bruck",
        }
    }
    pub fn parse(s: &str) -> Option<Algo> {
        Some(match s.to_ascii_lowercase().replace('-', "_").as_str() {
            "two_level" | "twolevel" | "hier" | "hierarchical" => Algo::TwoLevel,
            "ring" => Algo::Ring,
            "recursive_doubling" | "rd" | "rec_doubling" => Algo::RecursiveDoubling,
            "tree" => Algo::Tree,
            "pairwise" => Algo::Pairwise,
            "bruck" => Algo::Bruck,
            _ => return None,
        })
    }
}

impl fmt::Display for Algo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which ranks share a node. `nodes[k]` lists the ranks on node k in local-rank order; every rank
/// appears exactly once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    pub nodes: Vec<Vec<usize>>,
}

impl Layout {
    /// `n` ranks, `per_node` consecutive ranks per node (the last node may have fewer).
    pub fn block(n: usize, per_node: usize) -> Layout {
        let per = per_node.max(1);
        let nodes = (0..n)
            .collect::<Vec<_>>()
            .chunks(per)
            .map(|c| c.to_vec())
            .collect();
        Layout { nodes }
    }
    pub fn single_node(n: usize) -> Layout {
        Layout::block(n, n.max(1))
    }
    pub fn size(&self) -> usize {
        self.nodes.iter().map(|n| n.len()).sum()
    }
    /// (node index, local rank) of `rank`.
    pub fn locate(&self, rank: usize) -> Option<(usize, usize)> {
        for (k, node) in self.nodes.iter().enumerate() {
            if let Some(i) = node.iter().position(|&r| r == rank) {
                return Some((k, i));
            }
        }
        None
    }
    /// True when every node holds the same number of ranks.
    pub fn uniform(&self) -> bool {
        self.nodes.windows(2).all(|w| w[0].len() == w[1].len())
    }
}

/// The plan of one rank for one call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub kind: CollKind,
    pub algo: Algo,
    pub rank: usize,
    pub steps: Vec<Step>,
}

/// A plan cut where in-node steps meet network steps, for buffers the network cannot reach
/// directly (device memory): run `pre` on the buffer, copy `net_range` to host memory, run
/// `net` on the host copy (same offsets), copy `net_range` back, run `post` on the buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceSplit {
    pub pre: Plan,
    pub net: Plan,
    pub post: Plan,
    /// Elements `[start, end)` of the work buffer that the network steps read or write (empty
    /// when there are none).
    pub net_range: (usize, usize),
}

impl Plan {
    /// Elements of scratch space the plan needs: the end of its furthest `Scratch` region (0 for
    /// most plans).
    pub fn scratch_len(&self) -> usize {
        let mut end = 0;
        for s in &self.steps {
            let regions = match s {
                Step::Exchange { send, recv, .. } => {
                    [send.map(|x| x.region), recv.map(|x| x.region)]
                }
                Step::Copy { src, dst } => [Some(*src), Some(*dst)],
                _ => [None, None],
            };
            for r in regions.into_iter().flatten() {
                if r.buf == Buf::Scratch && r.len > 0 {
                    end = end.max(r.end());
                }
            }
        }
        end
    }

    /// Split into in-node steps, network exchanges, in-node steps (see [`DeviceSplit`]). `None`
    /// when the plan is not of that shape (an in-node step between exchanges, a local copy, or
    /// a region of the input buffer), so the caller stages the whole buffer instead.
    pub fn split_for_device(&self) -> Option<DeviceSplit> {
        let is_node = |s: &Step| {
            matches!(
                s,
                Step::NodeReduceScatter { .. } | Step::NodeAllGather { .. }
            )
        };
        let first_net = self
            .steps
            .iter()
            .position(|s| !is_node(s))
            .unwrap_or(self.steps.len());
        let after_net = self.steps[first_net..]
            .iter()
            .position(is_node)
            .map_or(self.steps.len(), |i| first_net + i);
        if !self.steps[after_net..].iter().all(is_node) {
            return None;
        }
        let (mut lo, mut hi) = (usize::MAX, 0usize);
        for s in &self.steps[first_net..after_net] {
            let Step::Exchange { send, recv, .. } = s else {
                return None;
            };
            for x in send.iter().chain(recv.iter()) {
                if x.region.buf != Buf::Work {
                    return None;
                }
                if x.region.len > 0 {
                    lo = lo.min(x.region.offset);
                    hi = hi.max(x.region.end());
                }
            }
        }
        let part = |steps: &[Step]| Plan {
            kind: self.kind,
            algo: self.algo,
            rank: self.rank,
            steps: steps.to_vec(),
        };
        Some(DeviceSplit {
            pre: part(&self.steps[..first_net]),
            net: part(&self.steps[first_net..after_net]),
            post: part(&self.steps[after_net..]),
            net_range: if lo < hi { (lo, hi) } else { (0, 0) },
        })
    }
}

/// Element range of part `i` when `count` elements are split into `parts` nearly equal parts
/// (the first `count % parts` parts get one more).
pub fn split(count: usize, parts: usize, i: usize) -> (usize, usize) {
    let parts = parts.max(1);
    let base = count / parts;
    let rem = count % parts;
    let off = i * base + i.min(rem);
    let len = base + usize::from(i < rem);
    (off, len)
}

impl fmt::Display for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = match self.buf {
            Buf::Work => "work",
            Buf::Input => "in",
            Buf::Scratch => "tmp",
        };
        write!(f, "{b}[{}..{}]", self.offset, self.end())
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "rank {} {} via {}:", self.rank, self.kind, self.algo)?;
        for (i, s) in self.steps.iter().enumerate() {
            match s {
                Step::Exchange { send, recv, reduce } => {
                    write!(f, "  {i:3}: exchange")?;
                    if let Some(x) = send {
                        write!(f, " send {} -> rank {} (ch {})", x.region, x.peer, x.chan)?;
                    }
                    if let Some(x) = recv {
                        let how = if *reduce { "reduce" } else { "recv" };
                        write!(f, " {how} {} <- rank {} (ch {})", x.region, x.peer, x.chan)?;
                    }
                    writeln!(f)?;
                }
                Step::NodeReduceScatter { group, slices } => writeln!(
                    f,
                    "  {i:3}: node reduce-scatter over {group:?}, slices {}",
                    fmt_regions(slices)
                )?,
                Step::NodeAllGather { group, slices } => writeln!(
                    f,
                    "  {i:3}: node all-gather over {group:?}, slices {}",
                    fmt_regions(slices)
                )?,
                Step::NodeBroadcast {
                    group,
                    root,
                    region,
                } => writeln!(
                    f,
                    "  {i:3}: node broadcast over {group:?} from member {root}, region {region}"
                )?,
                Step::NodeAllToAll {
                    group,
                    blocks,
                    in_place,
                } => writeln!(
                    f,
                    "  {i:3}: node all-to-all{} over {group:?}, blocks {}",
                    if *in_place { " in place" } else { "" },
                    fmt_regions(blocks)
                )?,
                Step::Copy { src, dst } => writeln!(f, "  {i:3}: copy {src} -> {dst}")?,
            }
        }
        Ok(())
    }
}

fn fmt_regions(r: &[Region]) -> String {
    r.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn split_covers_exactly() {
        for count in [0usize, 1, 5, 7, 16, 1001] {
            for parts in 1..17 {
                let mut next = 0;
                for i in 0..parts {
                    let (off, len) = split(count, parts, i);
                    assert_eq!(off, next);
                    next = off + len;
                }
                assert_eq!(next, count);
            }
        }
    }
    #[test]
    fn layout() {
        let l = Layout::block(5, 2);
        assert_eq!(l.nodes, vec![vec![0, 1], vec![2, 3], vec![4]]);
        assert_eq!(l.locate(3), Some((1, 1)));
        assert!(!l.uniform());
        assert_eq!(l.size(), 5);
    }
}

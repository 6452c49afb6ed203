//! Two-level all-reduce for layouts with the same number of ranks L on each of N nodes.
//!
//! Buffer convention: `Work` has `count` elements, in/out (all_reduce).
//!
//! 1. `NodeReduceScatter` over the node's ranks (in local-rank order) with slices
//!    `split(count, L, i)`: local rank i then holds slice i reduced over its node.
//! 2. Local rank i joins ring i (channel i) with local rank i of every other node (ring order =
//!    node order) and runs a ring all-reduce on slice i, cut into N chunks
//!    `split(slice_len, N, j)`: N-1 reduce-scatter steps then N-1 all-gather steps.
//! 3. `NodeAllGather` with the same slices.
//!
//! With N == 1 it is just the in-node reduce-scatter + all-gather; with L == 1 just the ring.
//! Every element is reduced once inside each node (in local-rank order), then along one ring
//! chain, then copied, so all ranks end bit-identical. Non-uniform layouts are refused
//! ([`PlanError::NonUniform`]); the chooser then falls back to the flat ring.

use crate::builder::{push_exchange, work, Ctx, LayoutIndex, PlanError};
use crate::plan::{split, Algo, CollKind, Layout, Plan, Region, Step};
use crate::ring::{chain_pipeline, ring_all_gather, ring_reduce_scatter, Chain};

/// Two-level all-reduce of `count` elements.
pub fn all_reduce(layout: &Layout, rank: usize, count: usize) -> Result<Plan, PlanError> {
    all_reduce_in(&LayoutIndex::new(layout)?.ctx(rank)?, layout, count)
}

pub(crate) fn all_reduce_in(ctx: &Ctx, layout: &Layout, count: usize) -> Result<Plan, PlanError> {
    let rank = ctx.rank;
    if !layout.uniform() {
        return Err(PlanError::NonUniform {
            algo: Algo::TwoLevel,
            sizes: layout.nodes.iter().map(|n| n.len()).collect(),
        });
    }
    let nn = layout.nodes.len();
    // uniform: node k holds positions [k*l, (k+1)*l) of the node-major order
    let l = layout.nodes[0].len();
    let (node, local) = (ctx.me() / l, ctx.me() % l);
    let group = &layout.nodes[node];
    let mut steps = Vec::with_capacity(2 * nn + 2);
    if count > 0 {
        let slices: Vec<Region> = (0..l).map(|i| work(split(count, l, i))).collect();
        if l > 1 {
            steps.push(Step::NodeReduceScatter {
                group: group.clone(),
                slices: slices.clone(),
            });
        }
        let ring: Vec<usize> = layout.nodes.iter().map(|n| n[local]).collect();
        let mine = slices[local];
        let chunk = |c: usize| {
            let (off, len) = split(mine.len, nn, c);
            Region::work(mine.offset + off, len)
        };
        ring_reduce_scatter(&mut steps, &ring, node, &chunk, local);
        ring_all_gather(&mut steps, &ring, node, &chunk, local);
        if l > 1 {
            steps.push(Step::NodeAllGather {
                group: group.clone(),
                slices,
            });
        }
    }
    Ok(Plan {
        kind: CollKind::AllReduce,
        algo: Algo::TwoLevel,
        rank,
        steps,
    })
}

/// Two-level reduce-scatter (`Work` has `count * n`; rank r's block `[r*count, (r+1)*count)`
/// ends reduced). On one node: the fabric's reduce-scatter with every rank's block as its slice.
/// Across N nodes of L ranks (uniform layouts; others are refused and the chooser takes the
/// ring), mirroring the all-reduce so every rail carries a ring:
///
/// 1. For each node j, one in-node reduce-scatter over the L blocks of node j's ranks: local
///    rank i then holds block `nodes[j][i]` reduced over its node, for every j (the blocks a
///    local rank owns are not contiguous when ranks are not numbered node by node, hence one
///    step per node).
/// 2. Local rank i runs a ring reduce-scatter (channel i) with local rank i of every other node
///    over those N blocks: afterwards it holds its own block reduced over every node.
///
/// Each element is reduced inside each node in local-rank order, then along one ring chain.
pub fn reduce_scatter(layout: &Layout, rank: usize, count: usize) -> Result<Plan, PlanError> {
    reduce_scatter_in(&LayoutIndex::new(layout)?.ctx(rank)?, layout, count)
}

pub(crate) fn reduce_scatter_in(
    ctx: &Ctx,
    layout: &Layout,
    count: usize,
) -> Result<Plan, PlanError> {
    let rank = ctx.rank;
    if layout.nodes.len() == 1 {
        return node_only(CollKind::ReduceScatter, ctx, layout, count);
    }
    let (group, local, ring, node) = across_nodes(ctx, layout)?;
    let mut steps = Vec::new();
    if count > 0 {
        let block = |j: usize| Region::work(layout.nodes[j][local] * count, count);
        if group.len() > 1 {
            for j in 0..layout.nodes.len() {
                steps.push(Step::NodeReduceScatter {
                    group: group.clone(),
                    slices: column(layout, j, count),
                });
            }
        }
        ring_reduce_scatter(&mut steps, &ring, node, &block, local);
    }
    Ok(plan(CollKind::ReduceScatter, rank, steps))
}

/// Two-level all-gather (`Work` has `count * n`; on entry rank r's block holds its
/// contribution). On one node: the fabric's all-gather. Across nodes (uniform layouts): local
/// rank i first runs a ring all-gather (channel i) with local rank i of every other node, so it
/// holds the blocks of local rank i of every node; then, for each node j, one in-node
/// all-gather of node j's L blocks.
pub fn all_gather(layout: &Layout, rank: usize, count: usize) -> Result<Plan, PlanError> {
    all_gather_in(&LayoutIndex::new(layout)?.ctx(rank)?, layout, count)
}

pub(crate) fn all_gather_in(ctx: &Ctx, layout: &Layout, count: usize) -> Result<Plan, PlanError> {
    let rank = ctx.rank;
    if layout.nodes.len() == 1 {
        return node_only(CollKind::AllGather, ctx, layout, count);
    }
    let (group, local, ring, node) = across_nodes(ctx, layout)?;
    let mut steps = Vec::new();
    if count > 0 {
        let block = |j: usize| Region::work(layout.nodes[j][local] * count, count);
        ring_all_gather(&mut steps, &ring, node, &block, local);
        if group.len() > 1 {
            for j in 0..layout.nodes.len() {
                steps.push(Step::NodeAllGather {
                    group: group.clone(),
                    slices: column(layout, j, count),
                });
            }
        }
    }
    Ok(plan(CollKind::AllGather, rank, steps))
}

/// Two-level broadcast from `root` (`Work` has `count`). On one node: the fabric's broadcast
/// (every peer copies the root's data out of its staging slot). Across N nodes of L ranks
/// (uniform layouts), every rail carries a share:
///
/// 1. In the root's node, the fabric's broadcast of the whole buffer.
/// 2. Local rank i of the root's node sends slice i (`split(count, L, i)`) down a pipelined
///    chain through local rank i of every other node (channel i).
/// 3. In every other node, an in-node all-gather of the L slices.
pub fn broadcast(
    layout: &Layout,
    rank: usize,
    count: usize,
    root: usize,
) -> Result<Plan, PlanError> {
    broadcast_in(&LayoutIndex::new(layout)?.ctx(rank)?, layout, count, root)
}

pub(crate) fn broadcast_in(
    ctx: &Ctx,
    layout: &Layout,
    count: usize,
    root: usize,
) -> Result<Plan, PlanError> {
    let rank = ctx.rank;
    ctx.check_root(root)?;
    let mut steps = Vec::new();
    if layout.nodes.len() == 1 {
        let group = layout.nodes[0].clone();
        if count > 0 && group.len() > 1 {
            steps.push(Step::NodeBroadcast {
                group,
                root: ctx.pos[root],
                region: Region::work(0, count),
            });
        }
        return Ok(plan(CollKind::Broadcast, rank, steps));
    }
    let (group, local, ring, node) = across_nodes(ctx, layout)?;
    let nn = ring.len();
    let l = group.len();
    let (rnode, rlocal) = (ctx.pos[root] / l, ctx.pos[root] % l);
    if count > 0 {
        let slices: Vec<Region> = (0..l).map(|i| work(split(count, l, i))).collect();
        if node == rnode && l > 1 {
            steps.push(Step::NodeBroadcast {
                group: group.clone(),
                root: rlocal,
                region: Region::work(0, count),
            });
        }
        let mine = slices[local];
        let chunks = crate::ring::broadcast_chunks(mine.len);
        let at = |q: usize| ring[(rnode + q) % nn];
        let chain = Chain {
            at: &at,
            n: nn,
            me: (node + nn - rnode) % nn,
        };
        let chunk = |j: usize| {
            let (off, len) = split(mine.len, chunks, j);
            Region::work(mine.offset + off, len)
        };
        chain_pipeline(&mut steps, &chain, &chunk, chunks, false, local);
        if node != rnode && l > 1 {
            steps.push(Step::NodeAllGather { group, slices });
        }
    }
    Ok(plan(CollKind::Broadcast, rank, steps))
}

/// Two-level reduce to `root` (`Work` has `count`; the root's ends reduced, the others' are
/// scratch). On one node: the fabric's pipelined all-reduce (the root needs every reduced
/// piece anyway). Across N nodes of L ranks (uniform layouts), the mirror of [`broadcast`]:
///
/// 1. In every node, an in-node reduce-scatter: local rank i holds slice i reduced over its
///    node.
/// 2. Local rank i passes slice i up a pipelined reduction chain through local rank i of every
///    node, ending at the root's node (channel i).
/// 3. In the root's node, an in-node all-gather of the L fully reduced slices.
pub fn reduce(layout: &Layout, rank: usize, count: usize, root: usize) -> Result<Plan, PlanError> {
    reduce_in(&LayoutIndex::new(layout)?.ctx(rank)?, layout, count, root)
}

pub(crate) fn reduce_in(
    ctx: &Ctx,
    layout: &Layout,
    count: usize,
    root: usize,
) -> Result<Plan, PlanError> {
    let rank = ctx.rank;
    ctx.check_root(root)?;
    if layout.nodes.len() == 1 {
        let mut p = all_reduce_in(ctx, layout, count)?;
        p.kind = CollKind::Reduce;
        return Ok(p);
    }
    let (group, local, ring, node) = across_nodes(ctx, layout)?;
    let nn = ring.len();
    let l = group.len();
    let rnode = ctx.pos[root] / l;
    let mut steps = Vec::new();
    if count > 0 {
        let slices: Vec<Region> = (0..l).map(|i| work(split(count, l, i))).collect();
        if l > 1 {
            steps.push(Step::NodeReduceScatter {
                group: group.clone(),
                slices: slices.clone(),
            });
        }
        let mine = slices[local];
        let chunks = crate::ring::broadcast_chunks(mine.len);
        // position nn-1 is the root's node: the chain starts at the node after it
        let at = |q: usize| ring[(rnode + 1 + q) % nn];
        let chain = Chain {
            at: &at,
            n: nn,
            me: (node + 2 * nn - rnode - 1) % nn,
        };
        let chunk = |j: usize| {
            let (off, len) = split(mine.len, chunks, j);
            Region::work(mine.offset + off, len)
        };
        chain_pipeline(&mut steps, &chain, &chunk, chunks, true, local);
        if node == rnode && l > 1 {
            steps.push(Step::NodeAllGather { group, slices });
        }
    }
    Ok(plan(CollKind::Reduce, rank, steps))
}

/// Two-level all-to-all (`Input` holds n blocks of `count`, block j for rank j; `Work` receives
/// block j from rank j). The blocks between ranks of one node go through the fabric in one
/// in-node all-to-all (every rank writes each peer's block into its staging slot once, the peer
/// copies it out; small calls take one round). The blocks to other nodes go pairwise, as in
/// [`crate::pairwise`], skipping the rounds whose partner shares the node; or, for blocks of at
/// most [`NODE_PAIR_MAX`] elements where every node holds L consecutive ranks (L > 1), node
/// pair by node pair: local rank i sends local rank i of each other node the L blocks for that
/// node in one message and receives its L blocks for this node into their places in `Work`;
/// then the node's ranks transpose each remote node's L blocks in place on the fabric. A rank
/// sends N-1 messages across nodes instead of N·L-L, as Open MPI's Bruck all-to-all saves
/// messages by forwarding. Any layout.
pub fn all_to_all(layout: &Layout, rank: usize, count: usize) -> Result<Plan, PlanError> {
    all_to_all_in(&LayoutIndex::new(layout)?.ctx(rank)?, layout, count)
}

/// Largest block (elements) that the two-level all-to-all sends node pair by node pair: measured
/// with 2 ranks on each of 2 and 4 emulated hosts (2 rails at 500 Mbit/s, 2 cores): 64 B-4 KiB
/// per rank 1.2-2x faster than a message per remote rank (2 x 2 at 512 B: 32-34 us against
/// 50-65), 32 KiB on 4 x 2 (4 KiB blocks) 480-610 us against 540-630; from 8 KiB blocks on, the
/// same time either way (the rails' rate), so larger blocks keep one message per remote rank and
/// skip the second pass through shared memory.
pub const NODE_PAIR_MAX: usize = 1024;

/// L when every node holds L > 1 ranks with consecutive numbers (so the blocks for one node
/// sit together in the input and output).
fn consecutive_nodes(layout: &Layout) -> Option<usize> {
    let l = layout.nodes.first()?.len();
    (l > 1
        && layout.nodes.len() > 1
        && layout.uniform()
        && layout
            .nodes
            .iter()
            .all(|g| g.windows(2).all(|w| w[1] == w[0] + 1)))
    .then_some(l)
}

pub(crate) fn all_to_all_in(ctx: &Ctx, layout: &Layout, count: usize) -> Result<Plan, PlanError> {
    let rank = ctx.rank;
    let n = ctx.n;
    // this rank's node and its span [start, end) in node-major order
    let me = ctx.me();
    let (mut node, mut start) = (0, 0);
    while start + layout.nodes[node].len() <= me {
        start += layout.nodes[node].len();
        node += 1;
    }
    let end = start + layout.nodes[node].len();
    let group = layout.nodes[node].clone();
    let mut steps = Vec::new();
    if count > 0 {
        if group.len() > 1 {
            let blocks = group
                .iter()
                .map(|&m| Region::work(m * count, count))
                .collect();
            steps.push(Step::NodeAllToAll {
                group: group.clone(),
                blocks,
                in_place: false,
            });
        } else {
            steps.push(Step::Copy {
                src: Region::input(rank * count, count),
                dst: Region::work(rank * count, count),
            });
        }
        if let Some(l) = consecutive_nodes(layout).filter(|_| count <= NODE_PAIR_MAX) {
            let nn = layout.nodes.len();
            let local = me - start;
            for k in 1..nn {
                let (to, from) = (
                    &layout.nodes[(node + k) % nn],
                    &layout.nodes[(node + nn - k) % nn],
                );
                push_exchange(
                    &mut steps,
                    Some((to[local], Region::input(to[0] * count, l * count))),
                    Some((from[local], Region::work(from[0] * count, l * count))),
                    false,
                    0,
                );
            }
            // local rank i now holds, in node B's blocks, what B's local rank i sent to each
            // rank here: block j goes to local rank j, which holds the block for i
            for k in 1..nn {
                let from = &layout.nodes[(node + nn - k) % nn];
                steps.push(Step::NodeAllToAll {
                    group: group.clone(),
                    blocks: (0..l)
                        .map(|i| Region::work((from[0] + i) * count, count))
                        .collect(),
                    in_place: true,
                });
            }
            return Ok(plan(CollKind::AllToAll, rank, steps));
        }
        let remote = |r: usize| !(start..end).contains(&ctx.pos[r]);
        for k in 1..n {
            let to = (rank + k) % n;
            let from = (rank + n - k) % n;
            push_exchange(
                &mut steps,
                remote(to).then(|| (to, Region::input(to * count, count))),
                remote(from).then(|| (from, Region::work(from * count, count))),
                false,
                0,
            );
        }
    }
    Ok(plan(CollKind::AllToAll, rank, steps))
}

/// This rank's node group, local index, ring (local rank `local` of every node, in node order)
/// and node index, for the two-level collectives across nodes (uniform layouts only).
fn across_nodes(
    ctx: &Ctx,
    layout: &Layout,
) -> Result<(Vec<usize>, usize, Vec<usize>, usize), PlanError> {
    if !layout.uniform() {
        return Err(PlanError::NonUniform {
            algo: Algo::TwoLevel,
            sizes: layout.nodes.iter().map(|n| n.len()).collect(),
        });
    }
    // uniform: node k holds positions [k*l, (k+1)*l) of the node-major order
    let l = layout.nodes[0].len();
    let (node, local) = (ctx.me() / l, ctx.me() % l);
    let ring = layout.nodes.iter().map(|n| n[local]).collect();
    Ok((layout.nodes[node].clone(), local, ring, node))
}

/// The blocks of node `j`'s ranks as in-node slices: slice i is the block of `nodes[j][i]`.
fn column(layout: &Layout, j: usize, count: usize) -> Vec<Region> {
    layout.nodes[j]
        .iter()
        .map(|&r| Region::work(r * count, count))
        .collect()
}

fn plan(kind: CollKind, rank: usize, steps: Vec<Step>) -> Plan {
    Plan {
        kind,
        algo: Algo::TwoLevel,
        rank,
        steps,
    }
}

/// Reduce-scatter or all-gather on one node: the fabric's collective with every rank's block as
/// its slice.
pub(crate) fn node_only(
    kind: CollKind,
    ctx: &Ctx,
    layout: &Layout,
    count: usize,
) -> Result<Plan, PlanError> {
    let rank = ctx.rank;
    let group = layout.nodes[0].clone();
    let mut steps = Vec::new();
    if count > 0 && ctx.n > 1 {
        // slices in group order; block of rank r is [r*count, (r+1)*count)
        let slices: Vec<Region> = group
            .iter()
            .map(|&r| Region::work(r * count, count))
            .collect();
        steps.push(match kind {
            CollKind::ReduceScatter => Step::NodeReduceScatter { group, slices },
            _ => Step::NodeAllGather { group, slices },
        });
    }
    Ok(plan(kind, rank, steps))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::{check, CheckError};
    use crate::testing::{plans, run_matrix};

    #[test]
    fn reduce_scatter_and_all_gather_across_nodes() {
        for kind in [CollKind::ReduceScatter, CollKind::AllGather] {
            let cases = run_matrix(kind, Algo::TwoLevel, true);
            assert!(cases > 100, "{kind}: {cases} cases");
        }
        // Every network exchange stays on the rank's own ring (channel = local index) and
        // every in-node step is over the rank's own node.
        let layout = Layout {
            nodes: vec![vec![0, 3, 4], vec![1, 5, 7], vec![2, 6, 8]],
        };
        for kind in [CollKind::ReduceScatter, CollKind::AllGather] {
            for rank in 0..9 {
                let (node, local) = layout.locate(rank).unwrap();
                let p =
                    crate::build::build_plan(kind, Algo::TwoLevel, &layout, rank, 5, 0).unwrap();
                for st in &p.steps {
                    match st {
                        Step::Exchange { send, recv, .. } => {
                            for x in send.iter().chain(recv.iter()) {
                                assert_eq!(x.chan, local);
                                assert_eq!(layout.locate(x.peer).unwrap().1, local);
                            }
                        }
                        Step::NodeReduceScatter { group, .. }
                        | Step::NodeAllGather { group, .. } => {
                            assert_eq!(group, &layout.nodes[node])
                        }
                        other => panic!("unexpected step {other:?}"),
                    }
                }
            }
        }
    }

    #[test]
    fn broadcast_reduce_and_all_to_all() {
        for kind in [CollKind::Broadcast, CollKind::Reduce] {
            let cases = run_matrix(kind, Algo::TwoLevel, true);
            assert!(cases > 100, "{kind}: {cases} cases");
        }
        // all-to-all has a plan for every layout
        let cases = run_matrix(CollKind::AllToAll, Algo::TwoLevel, false);
        assert!(cases > 100, "all-to-all: {cases} cases");
        // 4 nodes x 2 consecutive ranks: small blocks cross nodes once per node pair (3
        // messages of 2 blocks, then 3 in-place transposes), larger ones once per remote rank
        let exchanges = |p: &Plan| {
            p.steps
                .iter()
                .filter(|s| matches!(s, Step::Exchange { send: Some(_), .. }))
                .count()
        };
        let b = Layout::block(8, 2);
        let small =
            crate::build::build_plan(CollKind::AllToAll, Algo::TwoLevel, &b, 3, 10, 0).unwrap();
        assert_eq!(exchanges(&small), 3, "{small}");
        assert!(
            matches!(
                small.steps[0],
                Step::NodeAllToAll {
                    in_place: false,
                    ..
                }
            ) && small.steps[4..]
                .iter()
                .all(|s| matches!(s, Step::NodeAllToAll { in_place: true, .. })),
            "{small}"
        );
        let big = NODE_PAIR_MAX + 1;
        let large =
            crate::build::build_plan(CollKind::AllToAll, Algo::TwoLevel, &b, 3, big, 0).unwrap();
        assert_eq!(exchanges(&large), 6, "{large}");
        // ranks of a node not numbered consecutively: per remote rank at every size
        let strided = Layout {
            nodes: vec![vec![0, 2], vec![1, 3]],
        };
        let p = crate::build::build_plan(CollKind::AllToAll, Algo::TwoLevel, &strided, 0, 10, 0)
            .unwrap();
        assert_eq!(exchanges(&p), 2, "{p}");
        // one node: one fabric step each
        let l = Layout::single_node(4);
        for (kind, root) in [(CollKind::Broadcast, 2), (CollKind::AllToAll, 0)] {
            let p = crate::build::build_plan(kind, Algo::TwoLevel, &l, 1, 10, root).unwrap();
            assert_eq!(p.steps.len(), 1, "{p}");
            assert!(p.steps[0].node_group().is_some(), "{p}");
        }
    }

    #[test]
    fn single_node_reduce_scatter_and_all_gather() {
        for n in 1..=16 {
            let layout = Layout::single_node(n);
            for count in [0, 1, 7, 1000] {
                for kind in [CollKind::ReduceScatter, CollKind::AllGather] {
                    let plans = plans(kind, Algo::TwoLevel, &layout, count, 0).unwrap();
                    check(kind, &layout, count, 0, &plans)
                        .unwrap_or_else(|e| panic!("{kind} n={n} count={count}: {e}"));
                }
            }
        }
        assert!(matches!(
            reduce_scatter(
                &Layout {
                    nodes: vec![vec![0, 1], vec![2]]
                },
                0,
                3
            ),
            Err(PlanError::NonUniform { .. })
        ));
    }

    #[test]
    fn device_split_keeps_the_network_inside_the_ranks_own_slice() {
        for (n, per) in [(8, 4), (6, 2), (4, 2), (3, 1), (4, 4)] {
            let layout = Layout::block(n, per);
            for count in [0usize, 1, 5, 1000, 4099] {
                for rank in 0..n {
                    let p = all_reduce(&layout, rank, count).unwrap();
                    let d = p.split_for_device().expect("two-level splits");
                    // nothing lost or reordered
                    let mut joined = d.pre.steps.clone();
                    joined.extend(d.net.steps.iter().cloned());
                    joined.extend(d.post.steps.iter().cloned());
                    assert_eq!(joined, p.steps);
                    assert!(d
                        .net
                        .steps
                        .iter()
                        .all(|s| matches!(s, Step::Exchange { .. })));
                    // the network only touches this rank's slice of the in-node split
                    let local = rank % per;
                    let (off, len) = split(count, per, local);
                    let (lo, hi) = d.net_range;
                    if d.net.steps.is_empty() {
                        assert_eq!((lo, hi), (0, 0));
                    } else if len > 0 {
                        assert!(
                            off <= lo && hi <= off + len,
                            "{n}/{per} r{rank} c{count}: {lo}..{hi} not in {off}+{len}"
                        );
                    }
                    if per > 1 && !d.net.steps.is_empty() {
                        assert!(
                            matches!(d.pre.steps[..], [Step::NodeReduceScatter { .. }]),
                            "{n}/{per} r{rank} c{count}: {:?}",
                            p.steps
                        );
                        assert!(matches!(d.post.steps[..], [Step::NodeAllGather { .. }]));
                    }
                }
            }
        }
        // a node step between exchanges cannot be split
        let mut p = all_reduce(&Layout::block(8, 4), 0, 100).unwrap();
        let rs = p.steps[0].clone();
        p.steps.insert(2, rs);
        assert_eq!(p.split_for_device(), None);
    }

    #[test]
    fn all_reduce_matrix() {
        assert!(run_matrix(CollKind::AllReduce, Algo::TwoLevel, true) > 100);
    }

    #[test]
    fn shape() {
        // 2 nodes x 4 ranks: RS, 1 + 1 ring steps on channel = local rank, AG.
        let l = Layout::block(8, 4);
        let p = all_reduce(&l, 6, 800).unwrap();
        assert_eq!(p.steps.len(), 4);
        assert!(matches!(p.steps[0], Step::NodeReduceScatter { .. }));
        match &p.steps[1] {
            Step::Exchange {
                send: Some(s),
                recv: Some(r),
                reduce: true,
            } => {
                assert_eq!((s.peer, r.peer, s.chan, r.chan), (2, 2, 2, 2));
                assert_eq!(s.region.len + r.region.len, 200);
            }
            s => panic!("{s:?}"),
        }
        assert!(matches!(p.steps[3], Step::NodeAllGather { .. }));
        // Single node: no ring steps. One rank per node: no node steps.
        let p = all_reduce(&Layout::single_node(4), 1, 100).unwrap();
        assert_eq!(p.steps.len(), 2);
        let p = all_reduce(&Layout::block(4, 1), 1, 100).unwrap();
        assert!(p.steps.iter().all(|s| matches!(s, Step::Exchange { .. })));
        assert_eq!(p.steps.len(), 6);
    }

    #[test]
    fn node_group_disagreement_is_caught() {
        let l = Layout::block(8, 4);
        let mut p = plans(CollKind::AllReduce, Algo::TwoLevel, &l, 100, 0).unwrap();
        if let Step::NodeReduceScatter { slices, .. } = &mut p[5].steps[0] {
            slices.swap(0, 1);
        }
        let e = check(CollKind::AllReduce, &l, 100, 0, &p).unwrap_err();
        assert!(matches!(e, CheckError::NodeMismatch { .. }), "{e}");

        let mut p = plans(CollKind::AllReduce, Algo::TwoLevel, &l, 100, 0).unwrap();
        if let Step::NodeAllGather { group, .. } = &mut p[1].steps[3] {
            group.swap(2, 3);
        }
        let e = check(CollKind::AllReduce, &l, 100, 0, &p).unwrap_err();
        assert!(matches!(e, CheckError::NodeMismatch { .. }), "{e}");

        // A node step over ranks of two nodes is refused statically.
        let mut p = plans(CollKind::AllReduce, Algo::TwoLevel, &l, 100, 0).unwrap();
        if let Step::NodeAllGather { group, .. } = &mut p[0].steps[3] {
            group[3] = 4;
        }
        let e = check(CollKind::AllReduce, &l, 100, 0, &p).unwrap_err();
        assert!(
            matches!(
                e,
                CheckError::BadStep {
                    rank: 0,
                    step: 3,
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn dropped_node_step_is_caught() {
        let l = Layout::block(8, 4);
        let mut p = plans(CollKind::AllReduce, Algo::TwoLevel, &l, 100, 0).unwrap();
        p[2].steps.remove(0);
        let e = check(CollKind::AllReduce, &l, 100, 0, &p).unwrap_err();
        // Rank 2 reaches the all-gather while its node waits in the reduce-scatter.
        assert!(matches!(e, CheckError::NodeMismatch { .. }), "{e}");
        // Dropping it on the whole node leaves partial sums.
        let mut p = plans(CollKind::AllReduce, Algo::TwoLevel, &l, 100, 0).unwrap();
        for plan in p.iter_mut().take(4) {
            plan.steps.remove(0);
        }
        let e = check(CollKind::AllReduce, &l, 100, 0, &p).unwrap_err();
        assert!(matches!(e, CheckError::Wrong { .. }), "{e}");
    }
}

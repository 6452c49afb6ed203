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

use crate::builder::{work, Ctx, LayoutIndex, PlanError};
use crate::plan::{split, Algo, CollKind, Layout, Plan, Region, Step};
use crate::ring::{ring_all_gather, ring_reduce_scatter};

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

/// Reduce-scatter on one node: the shared-memory fabric's reduce-scatter with every rank's block
/// as its slice (`Work` has `count * n`; rank r's block ends reduced). Several nodes: unsupported
/// (blocks owned by one local rank are not contiguous across nodes); the chooser takes the ring.
pub fn reduce_scatter(layout: &Layout, rank: usize, count: usize) -> Result<Plan, PlanError> {
    node_only(
        CollKind::ReduceScatter,
        &LayoutIndex::new(layout)?.ctx(rank)?,
        layout,
        count,
    )
}

/// All-gather on one node: the fabric's all-gather with every rank's block as its slice.
pub fn all_gather(layout: &Layout, rank: usize, count: usize) -> Result<Plan, PlanError> {
    node_only(
        CollKind::AllGather,
        &LayoutIndex::new(layout)?.ctx(rank)?,
        layout,
        count,
    )
}

/// Reduce-scatter or all-gather on one node (see [`reduce_scatter`], [`all_gather`]).
pub(crate) fn node_only(
    kind: CollKind,
    ctx: &Ctx,
    layout: &Layout,
    count: usize,
) -> Result<Plan, PlanError> {
    let rank = ctx.rank;
    if layout.nodes.len() != 1 {
        return Err(PlanError::Unsupported {
            kind,
            algo: Algo::TwoLevel,
        });
    }
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
    Ok(Plan {
        kind,
        algo: Algo::TwoLevel,
        rank,
        steps,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::{check, CheckError};
    use crate::testing::{plans, run_matrix};

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
            reduce_scatter(&Layout::block(4, 2), 0, 3),
            Err(PlanError::Unsupported { .. })
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

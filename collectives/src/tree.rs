//! Binomial trees: broadcast(root), reduce(root), and all-reduce as reduce + broadcast.
//!
//! Buffer conventions:
//! - broadcast: `Work` has `count` elements; the root's content ends everywhere.
//! - reduce: `Work` has `count`; the root ends with the reduction. Non-root buffers are clobbered
//!   (they accumulate their subtree's partial result): the executor runs non-roots on a scratch
//!   copy.
//! - all_reduce: `Work` has `count`, in/out; reduce to the first rank in node-major order, then
//!   broadcast from it (bit-identical: one reduction, then copies).
//!
//! Ranks are numbered by virtual index `v` = distance from the root in node-major order
//! (the concatenation of `layout.nodes`). The parent of v ≠ 0 is `v - lowbit(v)`; its children
//! are `v + m` for the powers of two `m < lowbit(v)` (for the root: `m < n.next_power_of_two()`).
//! Broadcast sends to the children largest subtree first (the far, cross-node hops happen once,
//! early); reduce receives from the children smallest subtree first (those are ready first).
//!
//! A reduce over at most [`FLAT_REDUCE_MAX`] ranks, each alone on its node, is flat instead: every
//! rank sends to the root, which receives from them in virtual order.

use crate::builder::{push_exchange, Ctx, LayoutIndex, PlanError};
use crate::plan::{Algo, CollKind, Layout, Plan, Region, Step};

/// Most ranks, one per node, whose reduce is flat (every rank sends straight to the root) rather
/// than a binomial tree. Four nodes: one network hop instead of two, and no rank forwards — in a
/// stream of calls every sender runs ahead of the root, so its messages share TCP segments and
/// the root reads several at once, where the binomial tree's forwarding rank sends each call's
/// message alone as soon as its child's arrives. 4 emulated hosts x 1 rank on 2 vCPUs, railperf
/// reduce back to back, medians of 8 launches, µs a call out of place / in place, tree -> flat
/// (Open MPI in the flat series' loop): 64 B 13.96 / 14.17 -> 11.02 / 12.72 (15.42 / 15.22),
/// 512 B 14.80 / 13.89 -> 11.40 / 10.73 (15.57 / 15.31). With more ranks the root's receives
/// outnumber the hops saved (8 ranks: 3-4x slower), so larger reduces keep the tree.
pub const FLAT_REDUCE_MAX: usize = 4;

struct Tree {
    parent: Option<usize>,
    /// Children ranks, largest subtree first.
    children: Vec<usize>,
}

fn tree(ctx: &Ctx, root: usize) -> Tree {
    let n = ctx.n;
    let base = ctx.pos[root];
    let v = (ctx.me() + n - base) % n;
    let rank_of = |u: usize| ctx.order[(u + base) % n];
    let low = if v == 0 {
        n.next_power_of_two()
    } else {
        v & v.wrapping_neg()
    };
    let parent = (v != 0).then(|| rank_of(v - low));
    let mut children = Vec::new();
    let mut m = low / 2;
    while m >= 1 {
        if v + m < n {
            children.push(rank_of(v + m));
        }
        m /= 2;
    }
    Tree { parent, children }
}

/// The flat reduce's tree: the root's children are every other rank, in virtual order.
fn flat(ctx: &Ctx, root: usize) -> Tree {
    let n = ctx.n;
    let base = ctx.pos[root];
    let rank_of = |u: usize| ctx.order[(u + base) % n];
    if ctx.me() == base {
        // reduce_steps receives from the children last to first
        Tree {
            parent: None,
            children: (1..n).rev().map(rank_of).collect(),
        }
    } else {
        Tree {
            parent: Some(root),
            children: Vec::new(),
        }
    }
}

fn bcast_steps(steps: &mut Vec<Step>, t: &Tree, all: Region) {
    if let Some(p) = t.parent {
        push_exchange(steps, None, Some((p, all)), false, 0);
    }
    for &c in &t.children {
        push_exchange(steps, Some((c, all)), None, false, 0);
    }
}

fn reduce_steps(steps: &mut Vec<Step>, t: &Tree, all: Region) {
    for &c in t.children.iter().rev() {
        push_exchange(steps, None, Some((c, all)), true, 0);
    }
    if let Some(p) = t.parent {
        push_exchange(steps, Some((p, all)), None, false, 0);
    }
}

fn plan(kind: CollKind, rank: usize, steps: Vec<Step>) -> Plan {
    Plan {
        kind,
        algo: Algo::Tree,
        rank,
        steps,
    }
}

/// Binomial-tree broadcast of `count` elements from `root`.
pub fn broadcast(
    layout: &Layout,
    rank: usize,
    count: usize,
    root: usize,
) -> Result<Plan, PlanError> {
    broadcast_in(&LayoutIndex::new(layout)?.ctx(rank)?, count, root)
}

pub(crate) fn broadcast_in(ctx: &Ctx, count: usize, root: usize) -> Result<Plan, PlanError> {
    let rank = ctx.rank;
    ctx.check_root(root)?;
    let mut steps = Vec::new();
    bcast_steps(&mut steps, &tree(ctx, root), Region::work(0, count));
    Ok(plan(CollKind::Broadcast, rank, steps))
}

/// Binomial-tree reduce of `count` elements to `root` (non-root buffers are clobbered); flat
/// over at most [`FLAT_REDUCE_MAX`] ranks that are each alone on their node.
pub fn reduce(layout: &Layout, rank: usize, count: usize, root: usize) -> Result<Plan, PlanError> {
    let index = LayoutIndex::new(layout)?;
    reduce_in(&index.ctx(rank)?, flat_reduce(layout), count, root)
}

/// Whether a reduce over `layout` is flat: at most [`FLAT_REDUCE_MAX`] ranks, each alone on its
/// node.
pub(crate) fn flat_reduce(layout: &Layout) -> bool {
    // as many nodes as ranks, each of one: no sum over a large layout's nodes per plan built
    layout.nodes.len() <= FLAT_REDUCE_MAX && layout.nodes.iter().all(|node| node.len() == 1)
}

/// `flat_tree`: every rank sends straight to the root ([`flat_reduce`]), else down the binomial
/// tree.
pub(crate) fn reduce_in(
    ctx: &Ctx,
    flat_tree: bool,
    count: usize,
    root: usize,
) -> Result<Plan, PlanError> {
    let rank = ctx.rank;
    ctx.check_root(root)?;
    let t = if flat_tree {
        flat(ctx, root)
    } else {
        tree(ctx, root)
    };
    let mut steps = Vec::new();
    reduce_steps(&mut steps, &t, Region::work(0, count));
    Ok(plan(CollKind::Reduce, rank, steps))
}

/// All-reduce as binomial reduce to the first rank in node-major order, then broadcast.
pub fn all_reduce(layout: &Layout, rank: usize, count: usize) -> Result<Plan, PlanError> {
    all_reduce_in(&LayoutIndex::new(layout)?.ctx(rank)?, count)
}

pub(crate) fn all_reduce_in(ctx: &Ctx, count: usize) -> Result<Plan, PlanError> {
    let rank = ctx.rank;
    let t = tree(ctx, ctx.order[0]);
    let all = Region::work(0, count);
    let mut steps = Vec::new();
    reduce_steps(&mut steps, &t, all);
    bcast_steps(&mut steps, &t, all);
    Ok(plan(CollKind::AllReduce, rank, steps))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::{check, CheckError};
    use crate::testing::{plans, run_matrix};

    #[test]
    fn broadcast_matrix() {
        assert!(run_matrix(CollKind::Broadcast, Algo::Tree, false) > 100);
    }

    #[test]
    fn reduce_matrix() {
        assert!(run_matrix(CollKind::Reduce, Algo::Tree, false) > 100);
    }

    #[test]
    fn all_reduce_matrix() {
        assert!(run_matrix(CollKind::AllReduce, Algo::Tree, false) > 100);
    }

    #[test]
    fn root_sends_far_first() {
        // 8 ranks on 2 nodes, root 0: the first hop goes to the other node (rank 4).
        let p = broadcast(&Layout::block(8, 4), 0, 10, 0).unwrap();
        let peers: Vec<usize> = p
            .steps
            .iter()
            .filter_map(|s| match s {
                Step::Exchange { send: Some(x), .. } => Some(x.peer),
                _ => None,
            })
            .collect();
        assert_eq!(peers, vec![4, 2, 1]);
        // Depth: every rank has at most ceil(log2 n) steps in a broadcast.
        for n in 1..=16usize {
            let l = Layout::block(n, 4);
            let depth = n.next_power_of_two().trailing_zeros() as usize;
            for r in 0..n {
                assert!(broadcast(&l, r, 1, n - 1).unwrap().steps.len() <= depth.max(1));
            }
        }
    }

    /// (peers received from, peers sent to) by one rank's reduce plan, in step order.
    fn reduce_peers(l: &Layout, rank: usize, root: usize) -> (Vec<usize>, Vec<usize>) {
        let p = reduce(l, rank, 3, root).unwrap();
        let (mut from, mut to) = (Vec::new(), Vec::new());
        for s in &p.steps {
            if let Step::Exchange { send, recv, .. } = s {
                from.extend(recv.as_ref().map(|x| x.peer));
                to.extend(send.as_ref().map(|x| x.peer));
            }
        }
        (from, to)
    }

    #[test]
    fn reduce_over_four_lone_ranks_is_flat() {
        // four nodes of one rank, in any order: every rank sends once, straight to the root
        for l in [
            Layout::block(4, 1),
            Layout {
                nodes: vec![vec![2], vec![0], vec![3], vec![1]],
            },
        ] {
            for root in 0..4 {
                for r in (0..4).filter(|&r| r != root) {
                    assert_eq!(reduce_peers(&l, r, root), (vec![], vec![root]), "{l:?}");
                }
                let (mut from, to) = reduce_peers(&l, root, root);
                assert!(to.is_empty());
                from.sort_unstable();
                let others: Vec<usize> = (0..4).filter(|&r| r != root).collect();
                assert_eq!(from, others, "{l:?} root {root}");
            }
        }
        // five lone ranks, or four on two nodes: the binomial tree (rank 2 forwards rank 3's)
        let (from, _) = reduce_peers(&Layout::block(5, 1), 0, 0);
        assert_eq!(from.len(), 3);
        assert_eq!(reduce_peers(&Layout::block(4, 2), 3, 0), (vec![], vec![2]));
        assert_eq!(reduce_peers(&Layout::block(4, 2), 0, 0).0.len(), 2);
    }

    #[test]
    fn broken_broadcast_is_caught() {
        let l = Layout::block(6, 2);
        // Dropping the root's first send: that subtree waits forever.
        let mut p = plans(CollKind::Broadcast, Algo::Tree, &l, 5, 2).unwrap();
        p[2].steps.remove(0);
        let e = check(CollKind::Broadcast, &l, 5, 2, &p).unwrap_err();
        assert!(matches!(e, CheckError::Deadlock(_)), "{e}");
        // Reduce with a child's contribution overwriting instead of reducing.
        let mut p = plans(CollKind::Reduce, Algo::Tree, &l, 5, 2).unwrap();
        let root_steps = &mut p[2].steps;
        if let Some(Step::Exchange { reduce, .. }) = root_steps.last_mut() {
            *reduce = false;
        }
        let e = check(CollKind::Reduce, &l, 5, 2, &p).unwrap_err();
        assert!(matches!(e, CheckError::Wrong { rank: 2, .. }), "{e}");
    }
}

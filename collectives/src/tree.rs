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

use crate::builder::{push_exchange, Ctx, LayoutIndex, PlanError};
use crate::plan::{Algo, CollKind, Layout, Plan, Region, Step};

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

/// Binomial-tree reduce of `count` elements to `root` (non-root buffers are clobbered).
pub fn reduce(layout: &Layout, rank: usize, count: usize, root: usize) -> Result<Plan, PlanError> {
    reduce_in(&LayoutIndex::new(layout)?.ctx(rank)?, count, root)
}

pub(crate) fn reduce_in(ctx: &Ctx, count: usize, root: usize) -> Result<Plan, PlanError> {
    let rank = ctx.rank;
    ctx.check_root(root)?;
    let mut steps = Vec::new();
    reduce_steps(&mut steps, &tree(ctx, root), Region::work(0, count));
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

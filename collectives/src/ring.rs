//! Flat ring over all ranks, in node-major order (the concatenation of `layout.nodes`), so that
//! consecutive ring neighbours share a node and only one link per node boundary crosses the
//! network. Channel 0.
//!
//! Buffer conventions (`n` ranks):
//! - all_reduce: `Work` has `count` elements, in/out. The buffer is cut into n chunks
//!   (`split(count, n, c)`); ring position p ends the reduce-scatter phase owning chunk p fully
//!   reduced, then the all-gather phase circulates the owned chunks. Every element is reduced
//!   along one chain and then copied, so all ranks end bit-identical.
//! - reduce_scatter: `Work` has `count * n`; afterwards rank r's block `[r*count, (r+1)*count)`
//!   holds the reduction of that block over all ranks; other blocks are clobbered.
//! - all_gather: `Work` has `count * n`; on entry rank r's block holds its contribution;
//!   afterwards every block j holds rank j's contribution.
//! - broadcast: `Work` has `count`; a pipelined chain starting at the root (ring order rotated to
//!   the root), the message cut into chunks so that every link is busy at once.
//!
//! Schedule (position p, next = p+1, prev = p-1, modulo n), steps s = 0..n-1:
//! - reduce-scatter: send chunk `p-s-1`, receive-and-reduce chunk `p-s-2`;
//! - all-gather: send chunk `p-s`, receive (overwrite) chunk `p-s-1`.

use crate::builder::{push_exchange, work, Ctx, LayoutIndex, PlanError};
use crate::plan::{split, Algo, CollKind, Layout, Plan, Region, Step};

/// Elements per broadcast pipeline chunk (the chain is cut into `ceil(count / this)` chunks, at
/// most [`BCAST_MAX_CHUNKS`]).
pub const BCAST_CHUNK_ELEMS: usize = 32 * 1024;
/// Upper bound on the number of broadcast pipeline chunks.
pub const BCAST_MAX_CHUNKS: usize = 64;

/// Appends the reduce-scatter phase of a ring: `ring[pos]` is this rank, `chunk(c)` the region
/// of chunk c (identical on every member). Afterwards position `pos` holds chunk `pos` reduced
/// over the whole ring.
pub(crate) fn ring_reduce_scatter(
    steps: &mut Vec<Step>,
    ring: &[usize],
    pos: usize,
    chunk: &dyn Fn(usize) -> Region,
    chan: usize,
) {
    let n = ring.len();
    if n < 2 {
        return;
    }
    let next = ring[(pos + 1) % n];
    let prev = ring[(pos + n - 1) % n];
    for s in 0..n - 1 {
        let sc = (pos + 2 * n - s - 1) % n;
        let rc = (pos + 2 * n - s - 2) % n;
        push_exchange(
            steps,
            Some((next, chunk(sc))),
            Some((prev, chunk(rc))),
            true,
            chan,
        );
    }
}

/// Appends the all-gather phase of a ring: on entry position p holds chunk p; afterwards every
/// position holds every chunk.
pub(crate) fn ring_all_gather(
    steps: &mut Vec<Step>,
    ring: &[usize],
    pos: usize,
    chunk: &dyn Fn(usize) -> Region,
    chan: usize,
) {
    let n = ring.len();
    if n < 2 {
        return;
    }
    let next = ring[(pos + 1) % n];
    let prev = ring[(pos + n - 1) % n];
    for s in 0..n - 1 {
        let sc = (pos + n - s) % n;
        let rc = (pos + 2 * n - s - 1) % n;
        push_exchange(
            steps,
            Some((next, chunk(sc))),
            Some((prev, chunk(rc))),
            false,
            chan,
        );
    }
}

fn plan(kind: CollKind, rank: usize, steps: Vec<Step>) -> Plan {
    Plan {
        kind,
        algo: Algo::Ring,
        rank,
        steps,
    }
}

/// Ring all-reduce of `count` elements.
pub fn all_reduce(layout: &Layout, rank: usize, count: usize) -> Result<Plan, PlanError> {
    all_reduce_in(&LayoutIndex::new(layout)?.ctx(rank)?, count)
}

pub(crate) fn all_reduce_in(ctx: &Ctx, count: usize) -> Result<Plan, PlanError> {
    let rank = ctx.rank;
    let n = ctx.n;
    let mut steps = Vec::with_capacity(2 * n.saturating_sub(1));
    let chunk = |c: usize| work(split(count, n, c));
    ring_reduce_scatter(&mut steps, ctx.order, ctx.me(), &chunk, 0);
    ring_all_gather(&mut steps, ctx.order, ctx.me(), &chunk, 0);
    Ok(plan(CollKind::AllReduce, rank, steps))
}

/// Ring reduce-scatter: `count` elements per rank, `Work` has `count * n`.
pub fn reduce_scatter(layout: &Layout, rank: usize, count: usize) -> Result<Plan, PlanError> {
    reduce_scatter_in(&LayoutIndex::new(layout)?.ctx(rank)?, count)
}

pub(crate) fn reduce_scatter_in(ctx: &Ctx, count: usize) -> Result<Plan, PlanError> {
    let rank = ctx.rank;
    let mut steps = Vec::with_capacity(ctx.n.saturating_sub(1));
    let order = &ctx.order;
    let chunk = |c: usize| Region::work(order[c] * count, count);
    ring_reduce_scatter(&mut steps, order, ctx.me(), &chunk, 0);
    Ok(plan(CollKind::ReduceScatter, rank, steps))
}

/// Ring all-gather: `count` elements per rank, `Work` has `count * n`.
pub fn all_gather(layout: &Layout, rank: usize, count: usize) -> Result<Plan, PlanError> {
    all_gather_in(&LayoutIndex::new(layout)?.ctx(rank)?, count)
}

pub(crate) fn all_gather_in(ctx: &Ctx, count: usize) -> Result<Plan, PlanError> {
    let rank = ctx.rank;
    let mut steps = Vec::with_capacity(ctx.n.saturating_sub(1));
    let order = &ctx.order;
    let chunk = |c: usize| Region::work(order[c] * count, count);
    ring_all_gather(&mut steps, order, ctx.me(), &chunk, 0);
    Ok(plan(CollKind::AllGather, rank, steps))
}

/// Number of pipeline chunks [`broadcast`] uses for `count` elements.
pub fn broadcast_chunks(count: usize) -> usize {
    count.div_ceil(BCAST_CHUNK_ELEMS).clamp(1, BCAST_MAX_CHUNKS)
}

/// Pipelined chain broadcast from `root`, with [`broadcast_chunks`] chunks.
pub fn broadcast(
    layout: &Layout,
    rank: usize,
    count: usize,
    root: usize,
) -> Result<Plan, PlanError> {
    broadcast_chunked(layout, rank, count, root, broadcast_chunks(count))
}

/// Pipelined chain broadcast from `root` with the message cut into `chunks` parts
/// (`split(count, chunks, j)`). Chain position q (distance from the root in ring order) receives
/// chunk `t-q+1` from q-1 and sends chunk `t-q` to q+1 at time step t, both in one `Exchange`.
pub fn broadcast_chunked(
    layout: &Layout,
    rank: usize,
    count: usize,
    root: usize,
    chunks: usize,
) -> Result<Plan, PlanError> {
    broadcast_chunked_in(&LayoutIndex::new(layout)?.ctx(rank)?, count, root, chunks)
}

pub(crate) fn broadcast_chunked_in(
    ctx: &Ctx,
    count: usize,
    root: usize,
    chunks: usize,
) -> Result<Plan, PlanError> {
    let rank = ctx.rank;
    ctx.check_root(root)?;
    let n = ctx.n;
    let at = |q: usize| ctx.order[(ctx.pos[root] + q) % n];
    let chain = Chain {
        at: &at,
        n,
        me: (ctx.me() + n - ctx.pos[root]) % n,
    };
    let mut steps = Vec::new();
    let chunk = |j: usize| work(split(count, chunks.max(1), j));
    chain_pipeline(&mut steps, &chain, &chunk, chunks, false, 0);
    Ok(plan(CollKind::Broadcast, rank, steps))
}

/// A chain of `n` positions: `at(q)` is the rank at position q; this rank is at `me`.
pub(crate) struct Chain<'a> {
    pub at: &'a dyn Fn(usize) -> usize,
    pub n: usize,
    pub me: usize,
}

/// Appends a pipelined chain moving `chunks` chunks (`chunk(j)`) from position 0 towards
/// position n-1: at time step t, position q receives chunk `t-q+1` from q-1 and sends chunk
/// `t-q` to q+1, both in one `Exchange`. Without `reduce` it is a broadcast from position 0;
/// with `reduce`, each position combines what it receives into its own chunk before passing it
/// on, so position n-1 ends with the reduction over the chain.
pub(crate) fn chain_pipeline(
    steps: &mut Vec<Step>,
    c: &Chain<'_>,
    chunk: &dyn Fn(usize) -> Region,
    chunks: usize,
    reduce: bool,
    chan: usize,
) {
    let s = chunks.max(1);
    let (n, q, chain) = (c.n, c.me, c.at);
    if n < 2 {
        return;
    }
    let chunk_at =
        |j: isize| -> Option<Region> { (j >= 0 && (j as usize) < s).then(|| chunk(j as usize)) };
    // Only t in [q-1, q+s) moves anything (the other steps would be empty and dropped).
    let lo = (q as isize - 1).max(0);
    let hi = ((s + n - 2) as isize).min((q + s) as isize);
    for t in lo..hi {
        let send = if q + 1 < n {
            chunk_at(t - q as isize).map(|r| (chain(q + 1), r))
        } else {
            None
        };
        let recv = if q > 0 {
            chunk_at(t - q as isize + 1).map(|r| (chain(q - 1), r))
        } else {
            None
        };
        push_exchange(steps, send, recv, reduce, chan);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::{check, CheckError};
    use crate::testing::{layouts, plans, run_matrix};

    #[test]
    fn all_reduce_matrix() {
        assert!(run_matrix(CollKind::AllReduce, Algo::Ring, false) > 100);
    }

    #[test]
    fn reduce_scatter_matrix() {
        assert!(run_matrix(CollKind::ReduceScatter, Algo::Ring, false) > 100);
    }

    #[test]
    fn all_gather_matrix() {
        assert!(run_matrix(CollKind::AllGather, Algo::Ring, false) > 100);
    }

    #[test]
    fn broadcast_matrix() {
        assert!(run_matrix(CollKind::Broadcast, Algo::Ring, false) > 100);
    }

    #[test]
    fn broadcast_pipelined() {
        for n in 1..=9 {
            for layout in layouts(n) {
                for count in [0, 1, 5, 64, 100] {
                    for chunks in [1, 2, 3, 8, 100] {
                        for root in [0, n / 2, n - 1] {
                            let plans: Vec<Plan> = (0..n)
                                .map(|r| broadcast_chunked(&layout, r, count, root, chunks))
                                .collect::<Result<_, _>>()
                                .unwrap();
                            check(CollKind::Broadcast, &layout, count, root, &plans)
                                .unwrap_or_else(|e| {
                                    panic!("n={n} {layout:?} count={count} chunks={chunks}: {e}")
                                });
                        }
                    }
                }
            }
        }
        assert_eq!(broadcast_chunks(0), 1);
        assert_eq!(broadcast_chunks(BCAST_CHUNK_ELEMS + 1), 2);
        assert_eq!(broadcast_chunks(usize::MAX / 2), BCAST_MAX_CHUNKS);
    }

    #[test]
    fn ring_neighbours_share_nodes() {
        // block(8, 4): only ranks 3 and 7 send across nodes.
        let l = Layout::block(8, 4);
        for r in 0..8 {
            let p = all_reduce(&l, r, 80).unwrap();
            for s in &p.steps {
                if let Step::Exchange { send: Some(x), .. } = s {
                    assert_eq!(x.peer, (r + 1) % 8);
                }
            }
        }
        // Interleaved layout: ring follows node-major order 0 2 4 6 1 3 5 7.
        let l = Layout {
            nodes: vec![vec![0, 2, 4, 6], vec![1, 3, 5, 7]],
        };
        let p = all_reduce(&l, 6, 80).unwrap();
        match &p.steps[0] {
            Step::Exchange { send: Some(x), .. } => assert_eq!(x.peer, 1),
            s => panic!("{s:?}"),
        }
    }

    #[test]
    fn wrong_region_is_caught() {
        let l = Layout::block(4, 2);
        let count = 40; // 4 equal chunks of 10
        let mut p = plans(CollKind::AllReduce, Algo::Ring, &l, count, 0).unwrap();
        if let Step::Exchange { recv: Some(x), .. } = &mut p[2].steps[1] {
            x.region.offset = (x.region.offset + 10) % 40;
        } else {
            panic!("expected an exchange");
        }
        let e = check(CollKind::AllReduce, &l, count, 0, &p).unwrap_err();
        assert!(matches!(e, CheckError::Wrong { .. }), "{e}");
    }

    #[test]
    fn dropped_step_is_caught() {
        let l = Layout::block(4, 2);
        for victim in 0..4 {
            for step in 0..6 {
                let mut p = plans(CollKind::AllReduce, Algo::Ring, &l, 40, 0).unwrap();
                p[victim].steps.remove(step);
                let e = check(CollKind::AllReduce, &l, 40, 0, &p).unwrap_err();
                assert!(matches!(e, CheckError::Deadlock(_)), "{e}");
            }
        }
        // In reduce-scatter, dropping the last step of every rank would leave partial sums.
        let mut p = plans(CollKind::ReduceScatter, Algo::Ring, &l, 5, 0).unwrap();
        for plan in &mut p {
            plan.steps.pop();
        }
        let e = check(CollKind::ReduceScatter, &l, 5, 0, &p).unwrap_err();
        assert!(matches!(e, CheckError::Wrong { .. }), "{e}");
        assert!(e.to_string().contains("missing"), "{e}");
    }
}

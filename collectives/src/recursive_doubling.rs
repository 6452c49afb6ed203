//! Recursive-doubling all-reduce: latency-optimised (⌈log2 n⌉ rounds on the whole buffer), for
//! small messages.
//!
//! Buffer convention: `Work` has `count` elements, in/out (all_reduce).
//!
//! Ranks are taken in node-major order (positions p = 0..n), so the first rounds (small masks)
//! pair ranks on the same node. With p2 the largest power of two ≤ n and `extra = n - p2`:
//! 1. Fold: for p < 2*extra, even p sends its buffer to p+1 and sits out; odd p reduces it in and
//!    takes virtual index p/2. Positions p ≥ 2*extra take virtual index p - extra.
//! 2. For mask = 1, 2, 4, ... < p2: exchange the whole buffer with virtual partner `v ^ mask`,
//!    reducing (`dst = dst op incoming`).
//! 3. Unfold: odd p < 2*extra sends the result to p-1, which overwrites its buffer.
//!
//! Bit-identity: in every round both partners hold trees of the same shape and compute
//! `op(a, b)` resp. `op(b, a)` of the same two operands, which is the same value for the
//! commutative operators; by induction all members of a 2^k block hold the same tree after
//! round k, and the unfold copies.
//!
//! Note for executors: in step 2 the send and receive regions are the same (the whole buffer,
//! `reduce: true`). The send must carry the buffer as it was when the step started: receive into
//! staging and combine after the send has read the region (the checker models exactly that).

use crate::builder::{push_exchange, Ctx, LayoutIndex, PlanError};
use crate::plan::{Algo, CollKind, Layout, Plan, Region, Step};

/// Recursive-doubling all-reduce of `count` elements.
pub fn all_reduce(layout: &Layout, rank: usize, count: usize) -> Result<Plan, PlanError> {
    all_reduce_in(&LayoutIndex::new(layout)?.ctx(rank)?, count)
}

pub(crate) fn all_reduce_in(ctx: &Ctx, count: usize) -> Result<Plan, PlanError> {
    let rank = ctx.rank;
    let n = ctx.n;
    let p = ctx.me();
    let all = Region::work(0, count);
    let p2 = if n.is_power_of_two() {
        n
    } else {
        n.next_power_of_two() / 2
    };
    let extra = n - p2;
    let at = |pos: usize| ctx.order[pos];
    // Virtual index -> position.
    let position = |v: usize| if v < extra { 2 * v + 1 } else { v + extra };
    let mut steps = Vec::new();
    if p < 2 * extra && p.is_multiple_of(2) {
        push_exchange(&mut steps, Some((at(p + 1), all)), None, false, 0);
        push_exchange(&mut steps, None, Some((at(p + 1), all)), false, 0);
    } else {
        let v = if p < 2 * extra { p / 2 } else { p - extra };
        if p < 2 * extra {
            push_exchange(&mut steps, None, Some((at(p - 1), all)), true, 0);
        }
        let mut mask = 1;
        while mask < p2 {
            let partner = at(position(v ^ mask));
            push_exchange(
                &mut steps,
                Some((partner, all)),
                Some((partner, all)),
                true,
                0,
            );
            mask <<= 1;
        }
        if p < 2 * extra {
            push_exchange(&mut steps, Some((at(p - 1), all)), None, false, 0);
        }
    }
    Ok(Plan {
        kind: CollKind::AllReduce,
        algo: Algo::RecursiveDoubling,
        rank,
        steps,
    })
}

/// The blocks (`count` elements each, block of rank r at `r * count`) of the ranks at
/// positions `lo..hi` of the node-major order, merged into runs of consecutive rank numbers
/// (one region each: with ranks numbered node by node, one region for the whole range).
fn block_runs(ctx: &Ctx, lo: usize, hi: usize, count: usize) -> Vec<Region> {
    let mut ranks: Vec<usize> = (lo..hi).map(|p| ctx.order[p]).collect();
    ranks.sort_unstable();
    let mut runs: Vec<Region> = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i + 1;
        while j < ranks.len() && ranks[j] == ranks[j - 1] + 1 {
            j += 1;
        }
        runs.push(Region::work(ranks[i] * count, (j - i) * count));
        i = j;
    }
    runs
}

/// Sends `send` and receives `recv` with `peer`, pairing the runs in order (both sides compute
/// the same lists, so the peer's receives match these sends one for one).
fn exchange_runs(
    steps: &mut Vec<Step>,
    peer: usize,
    send: &[Region],
    recv: &[Region],
    reduce: bool,
) {
    for k in 0..send.len().max(recv.len()) {
        push_exchange(
            steps,
            send.get(k).map(|&r| (peer, r)),
            recv.get(k).map(|&r| (peer, r)),
            reduce,
            0,
        );
    }
}

fn power_of_two(ctx: &Ctx, kind: CollKind) -> Result<(), PlanError> {
    if ctx.n.is_power_of_two() {
        Ok(())
    } else {
        Err(PlanError::Unsupported {
            kind,
            algo: Algo::RecursiveDoubling,
        })
    }
}

/// Recursive-doubling all-gather (`Work` has `count * n`; rank r's block holds its contribution
/// on entry), for a power-of-two number of ranks (others: unsupported; the chooser takes the
/// ring): in round k, position p exchanges with `p ^ 2^k` every block its group of 2^k
/// positions holds. log2(n) rounds: the latency-bound choice for small blocks.
pub fn all_gather(layout: &Layout, rank: usize, count: usize) -> Result<Plan, PlanError> {
    all_gather_in(&LayoutIndex::new(layout)?.ctx(rank)?, count)
}

pub(crate) fn all_gather_in(ctx: &Ctx, count: usize) -> Result<Plan, PlanError> {
    power_of_two(ctx, CollKind::AllGather)?;
    let p = ctx.me();
    let mut steps = Vec::new();
    if count > 0 {
        let mut w = 1;
        while w < ctx.n {
            let mine = p / w * w;
            let theirs = mine ^ w;
            let peer = ctx.order[p ^ w];
            let send = block_runs(ctx, mine, mine + w, count);
            let recv = block_runs(ctx, theirs, theirs + w, count);
            exchange_runs(&mut steps, peer, &send, &recv, false);
            w <<= 1;
        }
    }
    Ok(Plan {
        kind: CollKind::AllGather,
        algo: Algo::RecursiveDoubling,
        rank: ctx.rank,
        steps,
    })
}

/// Recursive-halving reduce-scatter (`Work` has `count * n`; rank r's block ends reduced), for a
/// power-of-two number of ranks: in the round of width w (n/2, n/4, ..., 1), position p keeps
/// the half of its current window of 2w positions that holds its own block, sends the other
/// half's blocks to `p ^ w` and reduces in that partner's copy of its own half. log2(n) rounds.
pub fn reduce_scatter(layout: &Layout, rank: usize, count: usize) -> Result<Plan, PlanError> {
    reduce_scatter_in(&LayoutIndex::new(layout)?.ctx(rank)?, count)
}

pub(crate) fn reduce_scatter_in(ctx: &Ctx, count: usize) -> Result<Plan, PlanError> {
    power_of_two(ctx, CollKind::ReduceScatter)?;
    let p = ctx.me();
    let mut steps = Vec::new();
    if count > 0 {
        let mut w = ctx.n / 2;
        while w >= 1 {
            let mine = p / w * w;
            let theirs = mine ^ w;
            let peer = ctx.order[p ^ w];
            let send = block_runs(ctx, theirs, theirs + w, count);
            let recv = block_runs(ctx, mine, mine + w, count);
            exchange_runs(&mut steps, peer, &send, &recv, true);
            w /= 2;
        }
    }
    Ok(Plan {
        kind: CollKind::ReduceScatter,
        algo: Algo::RecursiveDoubling,
        rank: ctx.rank,
        steps,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::{check, CheckError};
    use crate::plan::{Step, Xfer};
    use crate::testing::{plans, run_matrix};

    #[test]
    fn all_reduce_matrix() {
        assert!(run_matrix(CollKind::AllReduce, Algo::RecursiveDoubling, false) > 100);
    }

    #[test]
    fn all_gather_and_reduce_scatter_on_powers_of_two() {
        let mut cases = 0;
        for n in 1..=16usize {
            for layout in crate::testing::layouts(n) {
                for count in crate::testing::counts(n) {
                    for kind in [CollKind::AllGather, CollKind::ReduceScatter] {
                        let built = plans(kind, Algo::RecursiveDoubling, &layout, count, 0);
                        if !n.is_power_of_two() {
                            assert!(matches!(built, Err(PlanError::Unsupported { .. })), "{n}");
                            continue;
                        }
                        let p = built.unwrap();
                        check(kind, &layout, count, 0, &p).unwrap_or_else(|e| {
                            panic!("{kind} n={n} {layout:?} count={count}: {e}")
                        });
                        // log2(n) rounds with ranks numbered node by node
                        if count > 0
                            && layout
                                .nodes
                                .iter()
                                .flatten()
                                .enumerate()
                                .all(|(i, &r)| i == r)
                        {
                            for q in &p {
                                assert_eq!(
                                    q.steps.len(),
                                    n.trailing_zeros() as usize,
                                    "{kind} n={n}"
                                );
                            }
                        }
                        cases += 1;
                    }
                }
            }
        }
        assert!(cases > 100, "{cases}");
    }

    #[test]
    fn rounds() {
        for (n, max_steps) in [(1, 0), (2, 1), (4, 2), (5, 4), (8, 3), (12, 5), (16, 4)] {
            let l = Layout::block(n, 4);
            let most = (0..n)
                .map(|r| all_reduce(&l, r, 10).unwrap().steps.len())
                .max();
            assert_eq!(most, Some(max_steps), "n={n}");
        }
    }

    fn xchg(peer: usize, send: bool, recv: bool, reduce: bool) -> Step {
        let x = Xfer {
            peer,
            region: Region::work(0, 1),
            chan: 0,
        };
        Step::Exchange {
            send: send.then_some(x),
            recv: recv.then_some(x),
            reduce,
        }
    }

    fn plan(rank: usize, steps: Vec<Step>) -> Plan {
        Plan {
            kind: CollKind::AllReduce,
            algo: Algo::RecursiveDoubling,
            rank,
            steps,
        }
    }

    #[test]
    fn reversed_reduction_order_is_caught() {
        // Three ranks, one element. Rank 1 computes ((a0+a1)+a2) and forwards it to rank 0, but
        // rank 2 computes ((a1+a2)+a0): the same contributions, a different tree.
        let l = Layout::single_node(3);
        let bad = vec![
            plan(
                0,
                vec![
                    xchg(1, true, false, false),
                    xchg(2, true, false, false),
                    xchg(1, false, true, false),
                ],
            ),
            plan(
                1,
                vec![
                    Step::Exchange {
                        send: Some(Xfer {
                            peer: 2,
                            region: Region::work(0, 1),
                            chan: 0,
                        }),
                        recv: Some(Xfer {
                            peer: 0,
                            region: Region::work(0, 1),
                            chan: 0,
                        }),
                        reduce: true,
                    },
                    xchg(2, false, true, true),
                    xchg(0, true, false, false),
                ],
            ),
            plan(
                2,
                vec![xchg(1, true, true, true), xchg(0, false, true, true)],
            ),
        ];
        let e = check(CollKind::AllReduce, &l, 1, 0, &bad).unwrap_err();
        assert!(matches!(e, CheckError::NotBitIdentical { .. }), "{e}");
        let msg = e.to_string();
        assert!(
            msg.contains("rank 2") || msg.contains("ranks 0 and 2"),
            "{msg}"
        );

        // Fixed: rank 1 combines everything in one order and sends the result to both.
        let good = vec![
            plan(
                0,
                vec![xchg(1, true, false, false), xchg(1, false, true, false)],
            ),
            plan(
                1,
                vec![
                    xchg(0, false, true, true),
                    xchg(2, false, true, true),
                    xchg(0, true, false, false),
                    xchg(2, true, false, false),
                ],
            ),
            plan(
                2,
                vec![xchg(1, true, false, false), xchg(1, false, true, false)],
            ),
        ];
        check(CollKind::AllReduce, &l, 1, 0, &good).unwrap();
    }

    #[test]
    fn swapped_rounds_are_caught() {
        // n = 4: ranks 2 and 3 run their rounds in the opposite order to ranks 0 and 1. Every
        // exchange still finds its partner, but contributions get lost and doubled.
        let l = Layout::single_node(4);
        let mut p = plans(CollKind::AllReduce, Algo::RecursiveDoubling, &l, 3, 0).unwrap();
        p[2].steps.swap(0, 1);
        p[3].steps.swap(0, 1);
        let e = check(CollKind::AllReduce, &l, 3, 0, &p).unwrap_err();
        assert!(matches!(e, CheckError::Wrong { .. }), "{e}");
    }
}

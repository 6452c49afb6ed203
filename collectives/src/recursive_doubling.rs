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
use crate::plan::{Algo, CollKind, Layout, Plan, Region};

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

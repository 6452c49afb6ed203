//! Bruck's all-to-all: ceil(log2 n) rounds of one message each, for small blocks, where the
//! number of messages (each one a round trip through a socket or a ring and a wake-up on the
//! other side) sets the time rather than the bytes.
//!
//! Buffer convention as [`crate::pairwise`]: `Input` holds n blocks of `count` elements, block j
//! going to rank j; `Work` receives n blocks, block j coming from rank j.
//!
//! Positions are node-major (`v` = this rank's position, `order[v]` its rank). A block from
//! position s to position d has the *slot* i = (d - s) mod n, which never changes. In round k
//! (distance 2^k) every rank sends to position v + 2^k the blocks it holds whose slot has bit k
//! set, packed into one message, and receives the same slots from v - 2^k; after the round
//! with a slot's highest bit the block is at its destination. A rank keeps the block of slot i
//! it holds at its `Work` block of position v - i (its source, once it has arrived), so blocks
//! move straight from `Input` (before their first hop) and into their final place (after their
//! last) without a rotation pass.
//!
//! When n is a power of two, `+` and `-` become XOR (slot i = d XOR s, partner v XOR 2^k): each
//! round is then a swap between two ranks, as in recursive doubling, rather than a shift around
//! the ranks. Measured on 4 emulated hosts × 1 rank, 64 B a rank: 19–23 µs a call against the
//! shift's 23–26 (each rank's send and receive meet one peer, who is waiting for the same swap).
//!
//! Blocks are packed into and unpacked from the `Scratch` buffer (n blocks at most); a round that
//! moves one block sends from and receives into place.
//!
//! Each rank sends ceil(log2 n) messages of at most n/2 blocks instead of pairwise's n - 1 of
//! one block: fewer, larger messages, and about (log2 n)/2 times the bytes. The cost model
//! picks it where messages, not bytes, set the time.

use crate::builder::{push_exchange, Ctx, LayoutIndex, PlanError};
use crate::plan::{Algo, CollKind, Layout, Plan, Region, Step};

/// Bruck all-to-all with `count` elements per block.
pub fn all_to_all(layout: &Layout, rank: usize, count: usize) -> Result<Plan, PlanError> {
    all_to_all_in(&LayoutIndex::new(layout)?.ctx(rank)?, count)
}

pub(crate) fn all_to_all_in(ctx: &Ctx, count: usize) -> Result<Plan, PlanError> {
    let n = ctx.n;
    let v = ctx.me();
    let at = |p: usize| ctx.order[p % n] * count;
    // Where a slot's block goes first (from its source) and where its holder keeps it.
    let xor = n.is_power_of_two();
    let dest = |i: usize| if xor { v ^ i } else { v + i };
    let keep = |i: usize| if xor { v ^ i } else { v + n - i };
    let mut steps = Vec::new();
    if count > 0 {
        steps.push(Step::Copy {
            src: Region::input(at(v), count),
            dst: Region::work(at(v), count),
        });
        // Slot i's block: in `Input` (block of its destination) until its first hop, then in
        // `Work` at the block of position v - i.
        let held = |i: usize, d: usize| {
            if i & (d - 1) == 0 {
                Region::input(at(dest(i)), count)
            } else {
                Region::work(at(keep(i)), count)
            }
        };
        let mut d = 1;
        while d < n {
            // slot d's first hop goes to its destination; slot d arrives from its keeper's source
            let to = ctx.order[dest(d) % n];
            let from = ctx.order[keep(d) % n];
            let slots: Vec<usize> = (1..n).filter(|i| i & d != 0).collect();
            let m = slots.len();
            if m == 1 {
                // only slot d: it leaves `Input` and lands in place
                push_exchange(
                    &mut steps,
                    Some((to, held(d, d))),
                    Some((from, Region::work(at(keep(d)), count))),
                    false,
                    0,
                );
            } else {
                for (j, &i) in slots.iter().enumerate() {
                    steps.push(Step::Copy {
                        src: held(i, d),
                        dst: Region::scratch(j * count, count),
                    });
                }
                push_exchange(
                    &mut steps,
                    Some((to, Region::scratch(0, m * count))),
                    Some((from, Region::scratch(m * count, m * count))),
                    false,
                    0,
                );
                for (j, &i) in slots.iter().enumerate() {
                    steps.push(Step::Copy {
                        src: Region::scratch((m + j) * count, count),
                        dst: Region::work(at(keep(i)), count),
                    });
                }
            }
            d *= 2;
        }
    }
    Ok(Plan {
        kind: CollKind::AllToAll,
        algo: Algo::Bruck,
        rank: ctx.rank,
        steps,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::{check, CheckError};
    use crate::plan::Buf;
    use crate::testing::{plans, run_matrix};

    #[test]
    fn all_to_all_matrix() {
        assert!(run_matrix(CollKind::AllToAll, Algo::Bruck, false) > 100);
    }

    #[test]
    fn rounds_are_log2_and_scratch_at_most_n_blocks() {
        for n in [2usize, 3, 4, 5, 7, 8, 9, 16] {
            let l = Layout::block(n, 2);
            for p in plans(CollKind::AllToAll, Algo::Bruck, &l, 3, 0).unwrap() {
                let exchanges = p
                    .steps
                    .iter()
                    .filter(|s| matches!(s, Step::Exchange { .. }))
                    .count();
                assert_eq!(exchanges, n.next_power_of_two().trailing_zeros() as usize);
                assert!(p.scratch_len() <= n * 3, "n={n}: {}", p.scratch_len());
            }
        }
        // 2 ranks: one exchange, no scratch (the pairwise plan)
        let p = all_to_all(&Layout::single_node(2), 0, 5).unwrap();
        assert_eq!(p.scratch_len(), 0);
    }

    #[test]
    fn broken_bruck_is_caught() {
        let l = Layout::block(4, 1);
        // Packing a block from the wrong place: a wrong element arrives somewhere.
        let mut p = plans(CollKind::AllToAll, Algo::Bruck, &l, 2, 0).unwrap();
        let s = p[2]
            .steps
            .iter_mut()
            .find_map(|s| match s {
                Step::Copy { src, dst } if dst.buf == Buf::Scratch => Some(src),
                _ => None,
            })
            .unwrap();
        s.offset = (s.offset + 2) % 8;
        let e = check(CollKind::AllToAll, &l, 2, 0, &p).unwrap_err();
        assert!(matches!(e, CheckError::Wrong { .. }), "{e}");
        // Sending scratch that was never written: uninitialised values arrive.
        let mut p = plans(CollKind::AllToAll, Algo::Bruck, &l, 2, 0).unwrap();
        p[1].steps
            .retain(|s| !matches!(s, Step::Copy { dst, .. } if dst.buf == Buf::Scratch));
        let e = check(CollKind::AllToAll, &l, 2, 0, &p).unwrap_err();
        assert!(e.to_string().contains("uninitialised"), "{e}");
        // Scratch beyond the call's largest buffer (4 blocks of 2 elements) is refused.
        let mut p = plans(CollKind::AllToAll, Algo::Bruck, &l, 2, 0).unwrap();
        if let Some(Step::Copy { dst, .. }) = p[0].steps.get_mut(1) {
            dst.offset = 7;
        }
        let e = check(CollKind::AllToAll, &l, 2, 0, &p).unwrap_err();
        assert!(
            matches!(
                e,
                CheckError::BadStep {
                    rank: 0,
                    step: 1,
                    ..
                }
            ) && e.to_string().contains("scratch"),
            "{e}"
        );
    }
}

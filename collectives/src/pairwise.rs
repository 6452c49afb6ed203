//! Pairwise-exchange all-to-all.
//!
//! Buffer convention: `Input` (read-only) holds n blocks of `count` elements, block j going to
//! rank j; `Work` receives n blocks, block j coming from rank j.
//!
//! The own block is a local `Copy`; then for k = 1..n: send `Input` block `(r+k) % n` to rank
//! `(r+k) % n` and receive `Work` block `(r-k) % n` from rank `(r-k) % n`, in one `Exchange`
//! (rank r's partner in round k sends to it in the same round, so every round is a permutation
//! and nobody waits).

use crate::builder::{push_exchange, Ctx, LayoutIndex, PlanError};
use crate::plan::{Algo, CollKind, Layout, Plan, Region, Step};

/// Pairwise all-to-all with `count` elements per block.
pub fn all_to_all(layout: &Layout, rank: usize, count: usize) -> Result<Plan, PlanError> {
    all_to_all_in(&LayoutIndex::new(layout)?.ctx(rank)?, count)
}

pub(crate) fn all_to_all_in(ctx: &Ctx, count: usize) -> Result<Plan, PlanError> {
    let rank = ctx.rank;
    let n = ctx.n;
    let mut steps = Vec::new();
    if count > 0 {
        steps.push(Step::Copy {
            src: Region::input(rank * count, count),
            dst: Region::work(rank * count, count),
        });
        for k in 1..n {
            let to = (rank + k) % n;
            let from = (rank + n - k) % n;
            push_exchange(
                &mut steps,
                Some((to, Region::input(to * count, count))),
                Some((from, Region::work(from * count, count))),
                false,
                0,
            );
        }
    }
    Ok(Plan {
        kind: CollKind::AllToAll,
        algo: Algo::Pairwise,
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
    fn all_to_all_matrix() {
        assert!(run_matrix(CollKind::AllToAll, Algo::Pairwise, false) > 100);
    }

    #[test]
    fn broken_all_to_all_is_caught() {
        let l = Layout::block(5, 2);
        // Missing own-block copy: block 3 of rank 3 stays uninitialised.
        let mut p = plans(CollKind::AllToAll, Algo::Pairwise, &l, 4, 0).unwrap();
        p[3].steps.remove(0);
        let e = check(CollKind::AllToAll, &l, 4, 0, &p).unwrap_err();
        assert!(matches!(e, CheckError::Wrong { rank: 3, .. }), "{e}");
        assert!(e.to_string().contains("uninitialised"), "{e}");
        // Sending the wrong input block.
        let mut p = plans(CollKind::AllToAll, Algo::Pairwise, &l, 4, 0).unwrap();
        if let Step::Exchange { send: Some(x), .. } = &mut p[1].steps[1] {
            x.region.offset = 0;
        }
        let e = check(CollKind::AllToAll, &l, 4, 0, &p).unwrap_err();
        assert!(matches!(e, CheckError::Wrong { rank: 2, .. }), "{e}");
        // Receiving into the read-only input buffer.
        let mut p = plans(CollKind::AllToAll, Algo::Pairwise, &l, 4, 0).unwrap();
        if let Step::Exchange { recv: Some(x), .. } = &mut p[1].steps[1] {
            x.region.buf = crate::plan::Buf::Input;
        }
        let e = check(CollKind::AllToAll, &l, 4, 0, &p).unwrap_err();
        assert!(
            matches!(
                e,
                CheckError::BadStep {
                    rank: 1,
                    step: 1,
                    ..
                }
            ),
            "{e}"
        );
    }
}

//! The entry point: [`build_plan`] dispatches a (collective kind, algorithm) pair to the algorithm
//! files, after validating the layout, the rank and the root.
//!
//! Supported combinations (everything else is [`PlanError::Unsupported`]):
//!
//! | kind            | algorithms                                        |
//! |-----------------|---------------------------------------------------|
//! | all_reduce      | two_level (uniform layouts), ring, recursive_doubling, tree |
//! | reduce_scatter  | two_level (one node: the shm fabric), ring        |
//! | all_gather      | two_level (one node: the shm fabric), ring        |
//! | broadcast       | tree, ring (pipelined chain)                      |
//! | reduce          | tree                                              |
//! | all_to_all      | pairwise                                          |
//! | barrier         | as all_reduce of `max(count, 1)` elements (any all-reduce algorithm) |
//! | send_recv       | none: point-to-point is not a plan ([`PlanError::NotAPlan`]) |
//!
//! Buffer conventions (see also each algorithm file and [`crate::check`](mod@crate::check)),
//! with `n` ranks:
//! - all_reduce: `Work` has `count` elements, in/out.
//! - reduce_scatter: `Work` has `count * n`; afterwards rank r's block `[r*count, (r+1)*count)`
//!   holds the reduction of that block over all ranks (other blocks: unspecified).
//! - all_gather: `Work` has `count * n`; on entry rank r's block holds its contribution;
//!   afterwards every block j holds rank j's contribution.
//! - broadcast: `Work` has `count`; the root's content ends everywhere.
//! - reduce: `Work` has `count`; the root ends with the reduction; non-root buffers are clobbered
//!   (the executor runs non-roots on a scratch copy).
//! - all_to_all: `Input` holds n blocks of `count` (block j goes to rank j), `Work` receives n
//!   blocks (block j comes from rank j).
//! - barrier: `Work` has `max(count, 1)` elements (one `u8` is enough), content irrelevant.

use crate::plan::{Algo, CollKind, Layout, Plan};
use crate::{pairwise, recursive_doubling, ring, tree, two_level};

// The shared vocabulary lives in `builder`; re-exported so `build::PlanError` and
// `build::validate_layout` keep working.
pub use crate::builder::{validate_layout, PlanError};

/// Builds the plan of `rank` for one call. `count` is in elements (per-rank block size for
/// reduce_scatter / all_gather / all_to_all); `root` is only used by broadcast and reduce.
pub fn build_plan(
    kind: CollKind,
    algo: Algo,
    layout: &Layout,
    rank: usize,
    count: usize,
    root: usize,
) -> Result<Plan, PlanError> {
    let unsupported = Err(PlanError::Unsupported { kind, algo });
    match kind {
        CollKind::AllReduce => all_reduce(algo, layout, rank, count),
        CollKind::Barrier => {
            let mut p = all_reduce(algo, layout, rank, count.max(1))?;
            p.kind = CollKind::Barrier;
            Ok(p)
        }
        CollKind::ReduceScatter => match algo {
            Algo::Ring => ring::reduce_scatter(layout, rank, count),
            Algo::TwoLevel => two_level::reduce_scatter(layout, rank, count),
            _ => unsupported,
        },
        CollKind::AllGather => match algo {
            Algo::Ring => ring::all_gather(layout, rank, count),
            Algo::TwoLevel => two_level::all_gather(layout, rank, count),
            _ => unsupported,
        },
        CollKind::Broadcast => match algo {
            Algo::Tree => tree::broadcast(layout, rank, count, root),
            Algo::Ring => ring::broadcast(layout, rank, count, root),
            Algo::TwoLevel => two_level::broadcast(layout, rank, count, root),
            _ => unsupported,
        },
        CollKind::Reduce => match algo {
            Algo::Tree => tree::reduce(layout, rank, count, root),
            Algo::TwoLevel => two_level::reduce(layout, rank, count, root),
            _ => unsupported,
        },
        CollKind::AllToAll => match algo {
            Algo::Pairwise => pairwise::all_to_all(layout, rank, count),
            Algo::TwoLevel => two_level::all_to_all(layout, rank, count),
            _ => unsupported,
        },
        CollKind::SendRecv => Err(PlanError::NotAPlan { kind }),
    }
}

fn all_reduce(algo: Algo, layout: &Layout, rank: usize, count: usize) -> Result<Plan, PlanError> {
    match algo {
        Algo::TwoLevel => two_level::all_reduce(layout, rank, count),
        Algo::Ring => ring::all_reduce(layout, rank, count),
        Algo::RecursiveDoubling => recursive_doubling::all_reduce(layout, rank, count),
        Algo::Tree => tree::all_reduce(layout, rank, count),
        Algo::Pairwise => Err(PlanError::Unsupported {
            kind: CollKind::AllReduce,
            algo,
        }),
    }
}

/// The algorithms that implement `kind`, in the chooser's order of preference on equal price.
pub fn algorithms_for(kind: CollKind) -> &'static [Algo] {
    match kind {
        CollKind::AllReduce | CollKind::Barrier => &[
            Algo::TwoLevel,
            Algo::Ring,
            Algo::RecursiveDoubling,
            Algo::Tree,
        ],
        CollKind::ReduceScatter | CollKind::AllGather => &[Algo::TwoLevel, Algo::Ring],
        CollKind::Broadcast => &[Algo::Tree, Algo::Ring, Algo::TwoLevel],
        CollKind::Reduce => &[Algo::Tree, Algo::TwoLevel],
        CollKind::AllToAll => &[Algo::Pairwise, Algo::TwoLevel],
        CollKind::SendRecv => &[],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dispatch_errors() {
        let l = Layout::block(6, 4);
        assert!(matches!(
            build_plan(CollKind::AllReduce, Algo::TwoLevel, &l, 0, 10, 0),
            Err(PlanError::NonUniform { .. })
        ));
        assert!(matches!(
            build_plan(CollKind::AllGather, Algo::Tree, &l, 0, 10, 0),
            Err(PlanError::Unsupported { .. })
        ));
        assert!(matches!(
            build_plan(CollKind::SendRecv, Algo::Ring, &l, 0, 10, 0),
            Err(PlanError::NotAPlan { .. })
        ));
        assert!(matches!(
            build_plan(CollKind::AllReduce, Algo::Ring, &l, 6, 10, 0),
            Err(PlanError::BadRank { rank: 6, n: 6 })
        ));
        assert!(matches!(
            build_plan(CollKind::Broadcast, Algo::Tree, &l, 0, 10, 6),
            Err(PlanError::BadRoot { root: 6, n: 6 })
        ));
        let dup = Layout {
            nodes: vec![vec![0, 1], vec![1, 2]],
        };
        assert!(matches!(
            build_plan(CollKind::AllReduce, Algo::Ring, &dup, 0, 10, 0),
            Err(PlanError::BadLayout(_))
        ));
        let empty = Layout { nodes: vec![] };
        assert!(matches!(
            build_plan(CollKind::AllReduce, Algo::Ring, &empty, 0, 10, 0),
            Err(PlanError::BadLayout(_))
        ));
    }

    #[test]
    fn every_listed_algorithm_builds() {
        for l in [Layout::block(8, 4), Layout::single_node(8)] {
            for kind in CollKind::ALL {
                for &algo in algorithms_for(kind) {
                    for r in 0..8 {
                        let b = build_plan(kind, algo, &l, r, 100, 3);
                        assert!(b.is_ok(), "{kind} {algo} {l:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn barrier_is_checked_as_all_reduce() {
        let l = Layout::block(5, 2);
        for algo in [Algo::Ring, Algo::RecursiveDoubling, Algo::Tree] {
            let plans = crate::testing::plans(CollKind::Barrier, algo, &l, 0, 0).unwrap();
            assert!(plans.iter().any(|p| !p.steps.is_empty()));
            crate::check::check(CollKind::Barrier, &l, 0, 0, &plans).unwrap();
        }
    }
}

//! The entry point: [`build_plan`] dispatches a (collective kind, algorithm) pair to the algorithm
//! files, after validating the layout, the rank and the root.
//!
//! Supported combinations (everything else is [`PlanError::Unsupported`]):
//!
//! | kind            | algorithms                                        |
//! |-----------------|---------------------------------------------------|
//! | all_reduce      | two_level (uniform layouts), ring, recursive_doubling, tree |
//! | reduce_scatter  | two_level (uniform layouts), ring, recursive_doubling (halving; 2^k ranks) |
//! | all_gather      | two_level (uniform layouts), ring, recursive_doubling (2^k ranks) |
//! | broadcast       | tree, ring (pipelined chain), two_level (uniform layouts) |
//! | reduce          | tree, two_level (uniform layouts)                 |
//! | all_to_all      | pairwise, two_level, bruck                        |
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

use crate::builder::{Ctx, LayoutIndex};
use crate::plan::{Algo, CollKind, Layout, Plan};
use crate::{bruck, pairwise, recursive_doubling, ring, tree, two_level};

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
    let f = builder_of(kind, algo)?;
    f(&LayoutIndex::new(layout)?.ctx(rank)?, layout, count, root)
}

/// Builds many ranks' plans of one call over one layout, validating the layout once (the same
/// plans as [`build_plan`], which builds one plan through a `Planner` of its own).
pub struct Planner<'a> {
    layout: &'a Layout,
    index: LayoutIndex,
}

impl<'a> Planner<'a> {
    pub fn new(layout: &'a Layout) -> Result<Planner<'a>, PlanError> {
        Ok(Planner {
            layout,
            index: LayoutIndex::new(layout)?,
        })
    }
    /// The validated layout (size, node-major order).
    pub fn index(&self) -> &LayoutIndex {
        &self.index
    }
    /// The plan of `rank` (see [`build_plan`]).
    pub fn plan(
        &self,
        kind: CollKind,
        algo: Algo,
        rank: usize,
        count: usize,
        root: usize,
    ) -> Result<Plan, PlanError> {
        let f = builder_of(kind, algo)?;
        f(&self.index.ctx(rank)?, self.layout, count, root)
    }
}

/// One algorithm's builder for one kind: (rank's context, layout, count, root).
type BuildFn = fn(&Ctx, &Layout, usize, usize) -> Result<Plan, PlanError>;

/// The dispatch table: which algorithm file builds (kind, algo), or why none does.
fn builder_of(kind: CollKind, algo: Algo) -> Result<BuildFn, PlanError> {
    let unsupported = Err(PlanError::Unsupported { kind, algo });
    Ok(match (kind, algo) {
        (CollKind::AllReduce, Algo::TwoLevel) => |c, l, n, _| two_level::all_reduce_in(c, l, n),
        (CollKind::AllReduce, Algo::Ring) => |c, _, n, _| ring::all_reduce_in(c, n),
        (CollKind::AllReduce, Algo::RecursiveDoubling) => {
            |c, _, n, _| recursive_doubling::all_reduce_in(c, n)
        }
        (CollKind::AllReduce, Algo::Tree) => |c, _, n, _| tree::all_reduce_in(c, n),
        // barrier: an all-reduce of max(count, 1) elements
        (CollKind::Barrier, Algo::TwoLevel) => {
            |c, l, n, _| barrier(two_level::all_reduce_in(c, l, n.max(1)))
        }
        (CollKind::Barrier, Algo::Ring) => |c, _, n, _| barrier(ring::all_reduce_in(c, n.max(1))),
        (CollKind::Barrier, Algo::RecursiveDoubling) => {
            |c, _, n, _| barrier(recursive_doubling::all_reduce_in(c, n.max(1)))
        }
        (CollKind::Barrier, Algo::Tree) => |c, _, n, _| barrier(tree::all_reduce_in(c, n.max(1))),
        (CollKind::Barrier, Algo::Pairwise) => {
            return Err(PlanError::Unsupported {
                kind: CollKind::AllReduce,
                algo,
            })
        }
        (CollKind::ReduceScatter, Algo::Ring) => |c, _, n, _| ring::reduce_scatter_in(c, n),
        (CollKind::ReduceScatter, Algo::RecursiveDoubling) => {
            |c, _, n, _| recursive_doubling::reduce_scatter_in(c, n)
        }
        (CollKind::AllGather, Algo::RecursiveDoubling) => {
            |c, _, n, _| recursive_doubling::all_gather_in(c, n)
        }
        (CollKind::ReduceScatter, Algo::TwoLevel) => {
            |c, l, n, _| two_level::reduce_scatter_in(c, l, n)
        }
        (CollKind::AllGather, Algo::Ring) => |c, _, n, _| ring::all_gather_in(c, n),
        (CollKind::AllGather, Algo::TwoLevel) => |c, l, n, _| two_level::all_gather_in(c, l, n),
        (CollKind::Broadcast, Algo::Tree) => |c, _, n, r| tree::broadcast_in(c, n, r),
        (CollKind::Broadcast, Algo::Ring) => {
            |c, _, n, r| ring::broadcast_chunked_in(c, n, r, ring::broadcast_chunks(n))
        }
        (CollKind::Broadcast, Algo::TwoLevel) => |c, l, n, r| two_level::broadcast_in(c, l, n, r),
        (CollKind::Reduce, Algo::Tree) => {
            |c, l, n, r| tree::reduce_in(c, tree::flat_reduce(l), n, r)
        }
        (CollKind::Reduce, Algo::TwoLevel) => |c, l, n, r| two_level::reduce_in(c, l, n, r),
        (CollKind::AllToAll, Algo::Pairwise) => |c, _, n, _| pairwise::all_to_all_in(c, n),
        (CollKind::AllToAll, Algo::TwoLevel) => |c, l, n, _| two_level::all_to_all_in(c, l, n),
        (CollKind::AllToAll, Algo::Bruck) => |c, _, n, _| bruck::all_to_all_in(c, n),
        (CollKind::SendRecv, _) => return Err(PlanError::NotAPlan { kind }),
        _ => return unsupported,
    })
}

fn barrier(plan: Result<Plan, PlanError>) -> Result<Plan, PlanError> {
    plan.map(|mut p| {
        p.kind = CollKind::Barrier;
        p
    })
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
        CollKind::ReduceScatter | CollKind::AllGather => {
            &[Algo::TwoLevel, Algo::Ring, Algo::RecursiveDoubling]
        }
        CollKind::Broadcast => &[Algo::Tree, Algo::Ring, Algo::TwoLevel],
        CollKind::Reduce => &[Algo::Tree, Algo::TwoLevel],
        CollKind::AllToAll => &[Algo::Pairwise, Algo::TwoLevel, Algo::Bruck],
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

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
//! Buffer conventions (see also each algorithm file and [`crate::check`]), with `n` ranks:
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

use crate::plan::{Algo, CollKind, Layout, Plan, Region, Step, Xfer};
use crate::{pairwise, recursive_doubling, ring, tree, two_level};

/// Why no plan could be built.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("algorithm {algo} does not implement {kind}")]
    Unsupported { kind: CollKind, algo: Algo },
    #[error("{kind} is point-to-point and has no plan (the runtime handles it directly)")]
    NotAPlan { kind: CollKind },
    #[error(
        "algorithm {algo} needs the same number of ranks on every node (node sizes: {sizes:?})"
    )]
    NonUniform { algo: Algo, sizes: Vec<usize> },
    #[error("rank {rank} is not in the communicator of {n} ranks")]
    BadRank { rank: usize, n: usize },
    #[error("root {root} is not in the communicator of {n} ranks")]
    BadRoot { root: usize, n: usize },
    #[error("invalid layout: {0}")]
    BadLayout(String),
}

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
            _ => unsupported,
        },
        CollKind::Reduce => match algo {
            Algo::Tree => tree::reduce(layout, rank, count, root),
            _ => unsupported,
        },
        CollKind::AllToAll => match algo {
            Algo::Pairwise => pairwise::all_to_all(layout, rank, count),
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
        CollKind::Broadcast => &[Algo::Tree, Algo::Ring],
        CollKind::Reduce => &[Algo::Tree],
        CollKind::AllToAll => &[Algo::Pairwise],
        CollKind::SendRecv => &[],
    }
}

/// Checks that `layout` is a partition of `0..n` into non-empty nodes and returns `n`.
pub fn validate_layout(layout: &Layout) -> Result<usize, PlanError> {
    let n = layout.size();
    if n == 0 {
        return Err(PlanError::BadLayout("no ranks".into()));
    }
    let mut seen = vec![false; n];
    for (k, node) in layout.nodes.iter().enumerate() {
        if node.is_empty() {
            return Err(PlanError::BadLayout(format!("node {k} has no ranks")));
        }
        for &r in node {
            if r >= n {
                return Err(PlanError::BadLayout(format!(
                    "node {k} lists rank {r}, but there are only {n} ranks"
                )));
            }
            if std::mem::replace(&mut seen[r], true) {
                return Err(PlanError::BadLayout(format!("rank {r} appears twice")));
            }
        }
    }
    Ok(n)
}

/// Validated context shared by the algorithm builders: the communicator size, the node-major
/// rank order (the concatenation of `layout.nodes`) and each rank's position in it.
#[derive(Clone, Debug)]
pub(crate) struct Ctx {
    pub n: usize,
    pub rank: usize,
    /// Ranks in node-major order.
    pub order: Vec<usize>,
    /// `pos[r]` = index of rank r in `order`.
    pub pos: Vec<usize>,
}

impl Ctx {
    pub fn new(layout: &Layout, rank: usize) -> Result<Ctx, PlanError> {
        let n = validate_layout(layout)?;
        if rank >= n {
            return Err(PlanError::BadRank { rank, n });
        }
        let order: Vec<usize> = layout.nodes.iter().flatten().copied().collect();
        let mut pos = vec![0; n];
        for (p, &r) in order.iter().enumerate() {
            pos[r] = p;
        }
        Ok(Ctx {
            n,
            rank,
            order,
            pos,
        })
    }
    pub fn check_root(&self, root: usize) -> Result<(), PlanError> {
        if root >= self.n {
            return Err(PlanError::BadRoot { root, n: self.n });
        }
        Ok(())
    }
    /// This rank's position in node-major order.
    pub fn me(&self) -> usize {
        self.pos[self.rank]
    }
}

/// Appends an `Exchange` step, dropping zero-length sides (executors skip them anyway) and the
/// whole step when both sides are empty. Both sides of a transfer compute the same region
/// length, so the dropping is consistent between sender and receiver.
pub(crate) fn push_exchange(
    steps: &mut Vec<Step>,
    send: Option<(usize, Region)>,
    recv: Option<(usize, Region)>,
    reduce: bool,
    chan: usize,
) {
    let send = send
        .filter(|(_, r)| r.len > 0)
        .map(|(peer, region)| Xfer { peer, region, chan });
    let recv = recv
        .filter(|(_, r)| r.len > 0)
        .map(|(peer, region)| Xfer { peer, region, chan });
    if send.is_none() && recv.is_none() {
        return;
    }
    steps.push(Step::Exchange { send, recv, reduce });
}

/// `Region::work` of a `(offset, len)` pair as returned by [`crate::plan::split`].
pub(crate) fn work(range: (usize, usize)) -> Region {
    Region::work(range.0, range.1)
}

#[cfg(test)]
pub(crate) mod testing {
    //! The test matrix shared by the algorithm files.
    use super::*;
    use crate::check::check;

    /// Layouts for `n` ranks: single node, blocks of 2 and 4, a non-uniform one with ranks not
    /// in node-major order, and (for even n) an interleaved uniform one.
    pub fn layouts(n: usize) -> Vec<Layout> {
        let mut v = vec![
            Layout::single_node(n),
            Layout::block(n, 2),
            Layout::block(n, 4),
        ];
        // Non-uniform: node sizes 1, 3, 2, 1, 3, 2, ... filled with a permutation of 0..n.
        let perm: Vec<usize> = (0..n).map(|i| (i * 5 + 3) % n).collect();
        let perm = if is_perm(&perm) {
            perm
        } else {
            (0..n).rev().collect()
        };
        let mut nodes = Vec::new();
        let mut it = perm.into_iter();
        for size in [1usize, 3, 2].iter().cycle() {
            let node: Vec<usize> = it.by_ref().take(*size).collect();
            if node.is_empty() {
                break;
            }
            nodes.push(node);
        }
        v.push(Layout { nodes });
        if n & 1 == 0 && n >= 4 {
            v.push(Layout {
                nodes: vec![(0..n).step_by(2).collect(), (1..n).step_by(2).collect()],
            });
        }
        v.dedup();
        v
    }

    fn is_perm(p: &[usize]) -> bool {
        let mut s = p.to_vec();
        s.sort_unstable();
        s.iter().enumerate().all(|(i, &x)| i == x)
    }

    pub fn counts(n: usize) -> Vec<usize> {
        let mut c = vec![0, 1, n.saturating_sub(1), n, n + 1, 7, 13, 1000];
        c.sort_unstable();
        c.dedup();
        c
    }

    pub fn roots(n: usize) -> Vec<usize> {
        let mut r = vec![0, n / 2, n - 1];
        r.dedup();
        r
    }

    pub fn plans(
        kind: CollKind,
        algo: Algo,
        layout: &Layout,
        count: usize,
        root: usize,
    ) -> Result<Vec<Plan>, PlanError> {
        (0..layout.size())
            .map(|r| build_plan(kind, algo, layout, r, count, root))
            .collect()
    }

    /// Builds and checks every rank's plan over the whole matrix. `uniform_only`: non-uniform
    /// layouts must be refused with `NonUniform`. Returns the number of checked cases.
    pub fn run_matrix(kind: CollKind, algo: Algo, uniform_only: bool) -> usize {
        let rooted = matches!(kind, CollKind::Broadcast | CollKind::Reduce);
        let mut cases = 0;
        for n in 1..=16 {
            for layout in layouts(n) {
                for count in counts(n) {
                    let roots = if rooted { roots(n) } else { vec![0] };
                    for root in roots {
                        let built = plans(kind, algo, &layout, count, root);
                        if uniform_only && !layout.uniform() {
                            assert!(
                                matches!(built, Err(PlanError::NonUniform { .. })),
                                "{kind} {algo} {layout:?} should be refused: {built:?}"
                            );
                            continue;
                        }
                        let plans = match built {
                            Ok(p) => p,
                            Err(e) => panic!("{kind} {algo} n={n} {layout:?} count={count}: {e}"),
                        };
                        if let Err(e) = check(kind, &layout, count, root, &plans) {
                            panic!(
                                "{kind} {algo} n={n} {layout:?} count={count} root={root}: {e}\n{}",
                                plans
                                    .iter()
                                    .map(|p| p.to_string())
                                    .collect::<Vec<_>>()
                                    .join("")
                            );
                        }
                        cases += 1;
                    }
                }
            }
        }
        cases
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
                    // two_level reduce-scatter / all-gather exist on one node only
                    let node_only = algo == Algo::TwoLevel
                        && matches!(kind, CollKind::ReduceScatter | CollKind::AllGather);
                    for r in 0..8 {
                        let b = build_plan(kind, algo, &l, r, 100, 3);
                        if node_only && l.nodes.len() > 1 {
                            assert!(
                                matches!(b, Err(PlanError::Unsupported { .. })),
                                "{kind} {algo}"
                            );
                        } else {
                            assert!(b.is_ok(), "{kind} {algo} {l:?}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn barrier_is_checked_as_all_reduce() {
        let l = Layout::block(5, 2);
        for algo in [Algo::Ring, Algo::RecursiveDoubling, Algo::Tree] {
            let plans = testing::plans(CollKind::Barrier, algo, &l, 0, 0).unwrap();
            assert!(plans.iter().any(|p| !p.steps.is_empty()));
            crate::check::check(CollKind::Barrier, &l, 0, 0, &plans).unwrap();
        }
    }

    #[test]
    fn test_layouts_are_valid() {
        for n in 1..=16 {
            for l in testing::layouts(n) {
                assert_eq!(validate_layout(&l), Ok(n), "{l:?}");
            }
        }
    }
}

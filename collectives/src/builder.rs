//! The vocabulary every algorithm builder shares: [`PlanError`], the validated layout
//! ([`LayoutIndex`]) and each rank's context `Ctx` over it (communicator size, node-major rank
//! order), layout validation and the step helpers
//! (`push_exchange`, `work`). The algorithm files import this module; the dispatcher
//! ([`crate::build`]) imports both, so imports go one way.

use crate::plan::{Algo, CollKind, Layout, Region, Step, Xfer};

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

/// A validated layout: the communicator size, the node-major rank order (the concatenation of
/// `layout.nodes`) and each rank's position in it, computed once and shared by every rank's
/// plan, so building all n plans of a call costs n plans, not n times the layout as well.
#[derive(Clone, Debug)]
pub struct LayoutIndex {
    n: usize,
    order: Vec<usize>,
    pos: Vec<usize>,
}

impl LayoutIndex {
    pub fn new(layout: &Layout) -> Result<LayoutIndex, PlanError> {
        let n = validate_layout(layout)?;
        let order: Vec<usize> = layout.nodes.iter().flatten().copied().collect();
        let mut pos = vec![0; n];
        for (p, &r) in order.iter().enumerate() {
            pos[r] = p;
        }
        Ok(LayoutIndex { n, order, pos })
    }
    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.n
    }
    /// Ranks in node-major order.
    pub fn order(&self) -> &[usize] {
        &self.order
    }
    /// The context of `rank`'s plan.
    pub(crate) fn ctx(&self, rank: usize) -> Result<Ctx<'_>, PlanError> {
        if rank >= self.n {
            return Err(PlanError::BadRank { rank, n: self.n });
        }
        Ok(Ctx {
            n: self.n,
            rank,
            order: &self.order,
            pos: &self.pos,
        })
    }
}

/// Validated context shared by the algorithm builders: the communicator size, the node-major
/// rank order (the concatenation of `layout.nodes`) and each rank's position in it.
#[derive(Clone, Debug)]
pub(crate) struct Ctx<'a> {
    pub n: usize,
    pub rank: usize,
    /// Ranks in node-major order.
    pub order: &'a [usize],
    /// `pos[r]` = index of rank r in `order`.
    pub pos: &'a [usize],
}

impl Ctx<'_> {
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

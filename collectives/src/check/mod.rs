//! Symbolic checker: runs all n ranks' plans of one call over symbolic values and verifies the
//! collective's postcondition on every rank.
//!
//! Values. Every element is a hash-consed expression: `Leaf(rank, buffer, index)` (the initial
//! content of that element of that rank), `Op(a, b)` (one application of the call's combiner,
//! `dst = dst op incoming`), or *uninitialised*. `Op` is normalised for commutativity (its two
//! children are sorted), so `op(a, b)` and `op(b, a)` are the same value, but `((a+b)+c)` and
//! `(a+(b+c))` are not: two ranks holding the same value id hold bit-identical results for every
//! commutative operator, including floating-point sums.
//!
//! Initial buffers (`n` ranks, `Work` sizes as in [`crate::build`]): `Work[i]` of rank r is
//! `Leaf(r, work, i)`, except for all_gather, where only rank r's own block is initialised, and
//! all_to_all, where `Work` is uninitialised and `Input[i]` is `Leaf(r, in, i)`. `Input` is
//! read-only and empty for every other kind.
//!
//! Execution model (the strictest the plan semantics allow, so that a plan passing here is
//! correct on any transport):
//! - A rank executes its steps in order. On reaching an `Exchange` it *posts* its send: the
//!   message is the send region's content at that moment. The receive completes when the first
//!   unconsumed message of (peer → rank, channel) is posted (FIFO per ordered pair and channel);
//!   received data is applied at once (overwrite or `dst = dst op incoming`). The step completes
//!   when its receive has completed **and its send has been received** (rendezvous: a transport
//!   that buffers nothing must not deadlock either). Zero-length sides are skipped on both ends.
//! - Because the send is a snapshot taken before the receive, a send region may overlap the
//!   receive region when `reduce` is set (recursive doubling sends and reduces the whole
//!   buffer): the executor must stage the incoming data. Without `reduce`, overlapping send and
//!   receive regions are refused (an executor receiving in place would corrupt the send).
//! - `NodeReduceScatter` / `NodeAllGather` run when every member of the group has reached one;
//!   members must list the same group (same order) and the same slices. Member `group[i]`'s
//!   `slices[i]` becomes `((v[g0] op v[g1]) op v[g2]) ...` in group order (reduce-scatter), resp.
//!   every member's `slices[i]` becomes member `group[i]`'s (all-gather). Groups must lie within
//!   one node of the layout and slices must be disjoint.
//! - If no rank can make progress before all are done, that is a deadlock.
//!
//! Postconditions: all_reduce (and barrier): every rank's element i is the combination of all
//! n ranks' element i, each exactly once, and all ranks hold the *same expression*. reduce: the
//! root's elements likewise. reduce_scatter: rank r's block r likewise. all_gather: block j of
//! every rank is rank j's block j. broadcast: the root's elements. all_to_all: block j of rank r
//! is block r of rank j's input.
//!
//! Files: this one holds the entry point [`check`]; `error.rs` [`CheckError`], `expr.rs` the
//! symbolic values, `validate.rs` the static checks of each plan, `sim.rs` the execution model,
//! `postcondition.rs` the final checks, `tests.rs` hand-written plans. Imports go one way:
//! `mod.rs` → `sim` → `validate`, `expr` → `error`; `postcondition` (more of `Sim`) →
//! `sim`.

mod error;
mod expr;
mod postcondition;
mod sim;
#[cfg(test)]
mod tests;
mod validate;

pub use error::CheckError;

use crate::plan::{CollKind, Layout, Plan};
use sim::Sim;
use validate::validate;

/// Checks the plans of all `layout.size()` ranks (`plans[r]` is rank r's) of one call.
pub fn check(
    kind: CollKind,
    layout: &Layout,
    count: usize,
    root: usize,
    plans: &[Plan],
) -> Result<(), CheckError> {
    let n =
        crate::builder::validate_layout(layout).map_err(|e| CheckError::Input(e.to_string()))?;
    if plans.len() != n {
        return Err(CheckError::Input(format!(
            "{} plans for {n} ranks",
            plans.len()
        )));
    }
    for (r, p) in plans.iter().enumerate() {
        if p.rank != r {
            return Err(CheckError::Input(format!(
                "plans[{r}] is rank {}'s",
                p.rank
            )));
        }
        if p.kind != kind {
            return Err(CheckError::Input(format!(
                "rank {r}'s plan is for {}, not {kind}",
                p.kind
            )));
        }
    }
    let count = if kind == CollKind::Barrier {
        count.max(1)
    } else {
        count
    };
    let (work_len, input_len) = match kind {
        CollKind::AllReduce | CollKind::Barrier | CollKind::Broadcast | CollKind::Reduce => {
            (Some(count), 0)
        }
        CollKind::ReduceScatter | CollKind::AllGather => (count.checked_mul(n), 0),
        CollKind::AllToAll => (count.checked_mul(n), count.checked_mul(n).unwrap_or(0)),
        CollKind::SendRecv => {
            return Err(CheckError::Input("send_recv has no plan to check".into()));
        }
    };
    let work_len = match work_len {
        Some(w) if w < (1 << 32) && n < (1 << 30) => w,
        _ => {
            return Err(CheckError::Input(format!(
                "too large to check symbolically: {n} ranks x {count} elements"
            )))
        }
    };
    if matches!(kind, CollKind::Broadcast | CollKind::Reduce) && root >= n {
        return Err(CheckError::Input(format!("root {root} of {n} ranks")));
    }
    for p in plans {
        validate(p, layout, n, work_len, input_len)?;
    }
    let mut sim = Sim::new(kind, plans, n, count, work_len, input_len);
    sim.run()?;
    sim.postcondition(kind, root)
}

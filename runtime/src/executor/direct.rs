//! Plans that are one in-node fabric operation — a one-node all-reduce or reduce (an in-node
//! reduce-scatter fused with its all-gather) or a one-node broadcast — resolved once, when the
//! communicator caches the plan, into the fabric call they make. A repeated call then goes
//! straight to the fabric: no walk over the plan's steps, no region or group checks per call
//! (they were done here), which is most of what a sub-microsecond call costs besides the fabric
//! itself. The fabric receives exactly the call [`super::Executor::run`] would make.

use super::{fused_mode, Bufs, CallDesc};
use crate::error::{Error, Result};
use crate::transport::{NodeFabric, NodeMode, NodeOp};
use railring_collectives::plan::{Buf, Plan, Region, Step};
use railring_collectives::{CollKind, ReduceOp};

/// One fabric call standing for a whole plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirectNode {
    mode: NodeMode,
    /// `(byte offset, bytes)` of `work`, one per local rank.
    slices: Vec<(usize, usize)>,
    /// The fabric reads an out-of-place input directly (the fused all-reduce, the broadcast's
    /// root); otherwise it is copied over `work` first, as the executor does for a plan that
    /// does not start with one.
    src_direct: bool,
    /// The largest byte offset the slices reach (checked against each call's buffer).
    end: usize,
}

impl DirectNode {
    /// The fabric call `plan` amounts to, if it is one in-node operation over every rank of the
    /// communicator (`size`) and `ranks` is the fabric's membership; `None` for every other
    /// plan (they run step by step). `kind` and `root` are the call's.
    pub fn of(
        plan: &Plan,
        kind: CollKind,
        root: usize,
        esz: usize,
        size: usize,
        ranks: &[usize],
    ) -> Option<DirectNode> {
        let bytes = |r: &Region| -> Option<(usize, usize)> {
            (r.buf == Buf::Work).then_some(())?;
            Some((r.offset.checked_mul(esz)?, r.len.checked_mul(esz)?))
        };
        let (group, mode, regions, src_direct) = match plan.steps.as_slice() {
            [Step::NodeReduceScatter { group, slices }, Step::NodeAllGather {
                group: g2,
                slices: s2,
            }] if group == g2 && slices == s2 => (
                group,
                fused_mode(kind, root, group, slices, esz),
                slices.as_slice(),
                true,
            ),
            [Step::NodeBroadcast {
                group,
                root,
                region,
            }] => (
                group,
                NodeMode::Broadcast { root: *root },
                std::slice::from_ref(region),
                true,
            ),
            _ => return None,
        };
        if group.len() != size || group.len() <= 1 || group.as_slice() != ranks {
            return None;
        }
        let slices = regions.iter().map(bytes).collect::<Option<Vec<_>>>()?;
        let end = slices
            .iter()
            .map(|&(o, n)| o.checked_add(n))
            .try_fold(0usize, |m, e| e.map(|e| m.max(e)))?;
        Some(DirectNode {
            mode,
            slices,
            src_direct,
            end,
        })
    }

    /// Run the call on `fabric`.
    ///
    /// # Safety
    /// As [`super::Executor::run`]: `bufs` describes buffers valid for reads (`src`) and
    /// reads and writes (`work`).
    pub unsafe fn run(
        &self,
        fabric: &mut dyn NodeFabric,
        desc: &CallDesc,
        op: ReduceOp,
        bufs: Bufs,
    ) -> Result<()> {
        if self.end > bufs.work_bytes {
            return Err(Error::Plan(format!(
                "in-node call over {} bytes on a buffer of {}",
                self.end, bufs.work_bytes
            )));
        }
        let mut src = bufs.src.filter(|&p| !std::ptr::eq(p, bufs.work));
        if let (Some(p), false) = (src, self.src_direct) {
            std::ptr::copy(p, bufs.work, bufs.work_bytes);
            src = None;
        }
        let d = desc.encode();
        fabric.node_op(NodeOp {
            mode: self.mode,
            dtype: desc.dtype,
            op,
            src,
            work: bufs.work,
            slices: &self.slices,
            desc: &d,
            describe: &CallDesc::describe_bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use railring_collectives::plan::Region;

    fn plan(steps: Vec<Step>) -> Plan {
        Plan {
            kind: CollKind::AllReduce,
            algo: railring_collectives::Algo::TwoLevel,
            rank: 0,
            steps,
        }
    }

    #[test]
    fn fused_reduce_scatter_and_all_gather_is_one_fabric_call() {
        let slices = vec![Region::work(0, 3), Region::work(3, 3)];
        let p = plan(vec![
            Step::NodeReduceScatter {
                group: vec![0, 1],
                slices: slices.clone(),
            },
            Step::NodeAllGather {
                group: vec![0, 1],
                slices,
            },
        ]);
        let d = DirectNode::of(&p, CollKind::AllReduce, 0, 4, 2, &[0, 1]).unwrap();
        assert_eq!(d.mode, NodeMode::AllReduceSmall);
        assert_eq!(d.slices, vec![(0, 12), (12, 12)]);
        assert!(d.src_direct);
        assert_eq!(d.end, 24);
        let r = DirectNode::of(&p, CollKind::Reduce, 1, 4, 2, &[0, 1]).unwrap();
        assert_eq!(r.mode, NodeMode::Reduce { root: 1 });
        // not the whole communicator, or not this fabric's ranks: step by step
        assert!(DirectNode::of(&p, CollKind::AllReduce, 0, 4, 3, &[0, 1]).is_none());
        assert!(DirectNode::of(&p, CollKind::AllReduce, 0, 4, 2, &[1, 0]).is_none());
    }

    #[test]
    fn broadcast_is_one_fabric_call_and_other_plans_are_not() {
        let b = plan(vec![Step::NodeBroadcast {
            group: vec![0, 1, 2],
            root: 2,
            region: Region::work(0, 5),
        }]);
        let d = DirectNode::of(&b, CollKind::Broadcast, 2, 8, 3, &[0, 1, 2]).unwrap();
        assert_eq!(d.mode, NodeMode::Broadcast { root: 2 });
        assert_eq!(d.slices, vec![(0, 40)]);
        // the root's out-of-place input is staged by the fabric itself (no copy over work first)
        assert!(d.src_direct);
        // a group of one, an all-gather alone, a plan with a copy: not direct
        let one = plan(vec![Step::NodeBroadcast {
            group: vec![0],
            root: 0,
            region: Region::work(0, 5),
        }]);
        assert!(DirectNode::of(&one, CollKind::Broadcast, 0, 8, 1, &[0]).is_none());
        let ag = plan(vec![Step::NodeAllGather {
            group: vec![0, 1],
            slices: vec![Region::work(0, 1), Region::work(1, 1)],
        }]);
        assert!(DirectNode::of(&ag, CollKind::AllGather, 0, 8, 2, &[0, 1]).is_none());
        let mut with_copy = b.clone();
        with_copy.steps.push(Step::Copy {
            src: Region::work(0, 1),
            dst: Region::work(1, 1),
        });
        assert!(DirectNode::of(&with_copy, CollKind::Broadcast, 2, 8, 3, &[0, 1, 2]).is_none());
    }
}

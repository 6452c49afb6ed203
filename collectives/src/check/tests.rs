//! Hand-written plans the checker must accept or refuse: rendezvous deadlocks, length
//! mismatches, static errors, in-node groups across nodes, input errors. (The algorithms' own
//! plans are checked in their files, over the whole test matrix.)

use super::*;
use crate::plan::{Algo, Region, Step, Xfer};

fn x(peer: usize, off: usize, len: usize) -> Option<Xfer> {
    Some(Xfer {
        peer,
        region: Region::work(off, len),
        chan: 0,
    })
}

fn plan(kind: CollKind, rank: usize, steps: Vec<Step>) -> Plan {
    Plan {
        kind,
        algo: Algo::Ring,
        rank,
        steps,
    }
}

fn ex(send: Option<Xfer>, recv: Option<Xfer>, reduce: bool) -> Step {
    Step::Exchange { send, recv, reduce }
}

/// A correct hand-written 2-rank all-reduce.
fn pair(count: usize) -> Vec<Plan> {
    (0..2)
        .map(|r| {
            plan(
                CollKind::AllReduce,
                r,
                vec![ex(x(1 - r, 0, count), x(1 - r, 0, count), true)],
            )
        })
        .collect()
}

#[test]
fn accepts_pair() {
    check(CollKind::AllReduce, &Layout::block(2, 1), 3, 0, &pair(3)).unwrap();
}

#[test]
fn rendezvous_deadlock() {
    // Both send first, then receive: fine with buffering transports, a deadlock without.
    let l = Layout::single_node(2);
    let plans: Vec<Plan> = (0..2)
        .map(|r| {
            plan(
                CollKind::AllReduce,
                r,
                vec![
                    ex(x(1 - r, 0, 4), None, false),
                    ex(None, x(1 - r, 0, 4), true),
                ],
            )
        })
        .collect();
    let e = check(CollKind::AllReduce, &l, 4, 0, &plans).unwrap_err();
    assert!(matches!(e, CheckError::Deadlock(_)), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("rank 0 step 0") && msg.contains("not received yet"),
        "{msg}"
    );

    // Waiting for a rank that finished.
    let mut plans = pair(4);
    plans[1].steps.clear();
    let e = check(CollKind::AllReduce, &l, 4, 0, &plans).unwrap_err();
    assert!(matches!(e, CheckError::Deadlock(_)), "{e}");
}

#[test]
fn length_mismatch() {
    let l = Layout::single_node(2);
    let mut plans = pair(4);
    plans[1].steps[0] = ex(x(0, 0, 4), x(0, 0, 3), true);
    let e = check(CollKind::AllReduce, &l, 4, 0, &plans).unwrap_err();
    assert_eq!(
        e,
        CheckError::LenMismatch {
            rank: 1,
            step: 0,
            src: 0,
            chan: 0,
            send_step: 0,
            send_len: 4,
            recv_len: 3
        }
    );
}

#[test]
fn static_errors() {
    let l = Layout::single_node(2);
    let cases: Vec<(Step, &str)> = vec![
        (ex(x(1, 2, 4), x(1, 0, 4), true), "out of bounds"),
        (ex(x(5, 0, 4), x(1, 0, 4), true), "not a rank"),
        (ex(x(0, 0, 4), x(1, 0, 4), true), "itself"),
        (ex(x(1, 0, 4), x(1, 2, 2), false), "overlap"),
        (
            Step::Copy {
                src: Region::work(0, 2),
                dst: Region::input(0, 2),
            },
            "read-only",
        ),
        (
            Step::NodeAllGather {
                group: vec![0, 1],
                slices: vec![Region::work(0, 3), Region::work(2, 2)],
            },
            "overlap",
        ),
        (
            Step::NodeAllGather {
                group: vec![1],
                slices: vec![Region::work(0, 3)],
            },
            "does not contain",
        ),
    ];
    for (step, what) in cases {
        let mut plans = pair(4);
        plans[0].steps.insert(0, step);
        let e = check(CollKind::AllReduce, &l, 4, 0, &plans).unwrap_err();
        assert!(
            matches!(
                e,
                CheckError::BadStep {
                    rank: 0,
                    step: 0,
                    ..
                }
            ) && e.to_string().contains(what),
            "{what}: {e}"
        );
    }
}

#[test]
fn node_steps_across_nodes_refused() {
    let l = Layout::block(2, 1);
    let plans: Vec<Plan> = (0..2)
        .map(|r| {
            plan(
                CollKind::AllReduce,
                r,
                vec![Step::NodeReduceScatter {
                    group: vec![0, 1],
                    slices: vec![Region::work(0, 1), Region::work(1, 1)],
                }],
            )
        })
        .collect();
    let e = check(CollKind::AllReduce, &l, 2, 0, &plans).unwrap_err();
    assert!(e.to_string().contains("another node"), "{e}");
}

#[test]
fn node_reduce_scatter_order_is_group_order() {
    // RS over [0, 1, 2] then AG: every rank ends with ((r0 + r1) + r2).
    let l = Layout::single_node(3);
    let slices = vec![Region::work(0, 1), Region::work(1, 1), Region::work(2, 1)];
    let plans: Vec<Plan> = (0..3)
        .map(|r| {
            plan(
                CollKind::AllReduce,
                r,
                vec![
                    Step::NodeReduceScatter {
                        group: vec![0, 1, 2],
                        slices: slices.clone(),
                    },
                    Step::NodeAllGather {
                        group: vec![0, 1, 2],
                        slices: slices.clone(),
                    },
                ],
            )
        })
        .collect();
    check(CollKind::AllReduce, &l, 3, 0, &plans).unwrap();
    // Missing all-gather: rank 1 has only its own slice reduced.
    let mut p2 = plans.clone();
    for p in &mut p2 {
        p.steps.pop();
    }
    let e = check(CollKind::AllReduce, &l, 3, 0, &p2).unwrap_err();
    assert!(
        matches!(
            e,
            CheckError::Wrong {
                rank: 1,
                index: 0,
                ..
            }
        ),
        "{e}"
    );
    assert!(
        e.to_string().contains("got r1[0]; missing r0[0] r2[0]"),
        "{e}"
    );
}

#[test]
fn input_errors() {
    let l = Layout::single_node(2);
    assert!(matches!(
        check(CollKind::AllReduce, &l, 4, 0, &pair(4)[..1]),
        Err(CheckError::Input(_))
    ));
    let mut p = pair(4);
    p.swap(0, 1);
    assert!(matches!(
        check(CollKind::AllReduce, &l, 4, 0, &p),
        Err(CheckError::Input(_))
    ));
    assert!(matches!(
        check(CollKind::ReduceScatter, &l, 4, 0, &pair(4)),
        Err(CheckError::Input(_))
    ));
}

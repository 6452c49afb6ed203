//! The fast path (rotation classes) against the brute force (every rank simulated) on small
//! fabrics of every kind, symmetric and not; the routes; the rounds of the algorithms.

use super::schedule::{rotation, shape_count, Schedule};
use super::*;
use crate::build::{algorithms_for, Planner};
use crate::plan::{Algo, CollKind};

fn gbit(x: f64) -> f64 {
    x * 1e9 / 8.0
}

/// A small fabric: `nodes` × `rpn` ranks, `nics` NICs, the given wiring and tiers.
fn fabric(
    nodes: usize,
    rpn: usize,
    nics: usize,
    wiring: Wiring,
    spines: Option<(usize, f64)>,
    core: Option<(usize, usize, f64)>,
    ecmp: Ecmp,
) -> Fabric {
    Fabric {
        name: "t".into(),
        nodes,
        ranks_per_node: rpn,
        node_link: LinkSpec {
            bw: 5e9,
            latency: 1e-6,
        },
        nics,
        nic: LinkSpec {
            bw: gbit(200.0),
            latency: 5e-6,
        },
        wiring,
        spine: spines.map(|(s, bw)| SpineTier {
            spines: s,
            link_bw: gbit(bw),
        }),
        core: core.map(|(lpp, up, bw)| CoreTier {
            leaves_per_pod: lpp,
            uplinks: up,
            link_bw: gbit(bw),
        }),
        ecmp,
        hop_latency: 0.5e-6,
        efficiency: 0.95,
        reduce_bw: 8e9,
    }
}

/// Every shipped topology kind in small: 3-tier fat-tree, 2-tier spine-leaf 3:1, rail-optimized
/// pods, the emulated kinds (node on leaf, 1 and 2 rails), one leaf, with hash, ideal and worst
/// ECMP, and fabrics whose last leaf / unit / pod is not full.
fn fabrics() -> Vec<Fabric> {
    let mut v = Vec::new();
    for ecmp in [Ecmp::Hash { seed: 7 }, Ecmp::Ideal, Ecmp::Worst] {
        // 3-tier fat-tree: 8 nodes x 2, 2 nodes per leaf, 2 leaves per pod, 2 spines, 2 core uplinks
        v.push(fabric(
            8,
            2,
            1,
            Wiring::NodeOnLeaf { nodes_per_leaf: 2 },
            Some((2, 200.0)),
            Some((2, 2, 200.0)),
            ecmp,
        ));
        // spine-leaf 3:1, 4 nodes per leaf, 2 NICs, 2 spines
        v.push(fabric(
            12,
            2,
            2,
            Wiring::NodeOnLeaf { nodes_per_leaf: 4 },
            Some((2, 4.0 * 2.0 * 200.0 / 3.0 / 2.0)),
            None,
            ecmp,
        ));
        // rail-optimized: 4 NICs, 4 ranks per node, 3 nodes per unit (the last unit not full)
        v.push(fabric(
            7,
            4,
            4,
            Wiring::RailOptimized { nodes_per_su: 3 },
            Some((3, 400.0)),
            None,
            ecmp,
        ));
        // rail-optimized 3-tier, 2 NICs, 2 units per pod
        v.push(fabric(
            8,
            2,
            2,
            Wiring::RailOptimized { nodes_per_su: 2 },
            Some((2, 200.0)),
            Some((4, 2, 100.0)),
            ecmp,
        ));
        // more NICs than ranks per node; odd spine count
        v.push(fabric(
            6,
            1,
            2,
            Wiring::NodeOnLeaf { nodes_per_leaf: 2 },
            Some((3, 100.0)),
            None,
            ecmp,
        ));
    }
    // one leaf, no spines
    v.push(fabric(
        4,
        4,
        2,
        Wiring::NodeOnLeaf { nodes_per_leaf: 4 },
        None,
        None,
        Ecmp::Ideal,
    ));
    v
}

fn kinds() -> [(CollKind, usize); 6] {
    [
        (CollKind::AllReduce, 0),
        (CollKind::ReduceScatter, 0),
        (CollKind::AllGather, 0),
        (CollKind::AllToAll, 0),
        (CollKind::Broadcast, 3),
        (CollKind::Reduce, 1),
    ]
}

#[test]
fn fast_path_equals_brute_force() {
    let mut compared = 0;
    let mut symmetric = 0;
    for f in fabrics() {
        f.validate().unwrap();
        let full = f.ranks();
        // full fabric, a partial last node, one rank short of two nodes
        let mut sizes = vec![full, full - 1, (f.ranks_per_node * 2).min(full) - 1];
        sizes.retain(|&n| (1..=64).contains(&n));
        sizes.dedup();
        for n in sizes {
            let mut fast = FabricPlanner::new(&f, n, true).unwrap();
            let mut brute = FabricPlanner::new(&f, n, false).unwrap();
            for (kind, root) in kinds() {
                for &algo in algorithms_for(kind) {
                    for count in [0usize, 1, n - 1, n, n + 1, 1000, 4099, 1 << 20] {
                        let a = fast.predict(kind, algo, count, 4, root);
                        let b = brute.predict(kind, algo, count, 4, root);
                        match (a, b) {
                            (Ok(a), Ok(b)) => {
                                assert_eq!(
                                    (a.time, a.rounds, a.transfer, a.bottleneck),
                                    (b.time, b.rounds, b.transfer, b.bottleneck),
                                    "{} n={n} {kind} {algo} count={count}",
                                    f.summary()
                                );
                                if a.rho < n {
                                    symmetric += 1;
                                }
                                compared += 1;
                            }
                            (Err(a), Err(b)) => assert_eq!(a, b),
                            (a, b) => panic!("{kind} {algo} n={n}: {a:?} vs {b:?}"),
                        }
                    }
                }
            }
        }
    }
    assert!(compared > 2000, "{compared}");
    assert!(symmetric > 1000, "{symmetric}");
}

#[test]
fn rounds_of_the_algorithms() {
    let f = fabric(
        4,
        2,
        2,
        Wiring::NodeOnLeaf { nodes_per_leaf: 2 },
        Some((2, 200.0)),
        None,
        Ecmp::Ideal,
    );
    let layout = f.layout(8);
    let planner = Planner::new(&layout).unwrap();
    let rounds = |kind, algo| {
        let n = 8;
        let cc = shape_count(kind, algo, 1 << 20, n);
        let plans: Vec<_> = (0..n)
            .map(|r| planner.plan(kind, algo, r, cc, 0).unwrap())
            .collect();
        Schedule::run(&plans, n, n).unwrap().rounds.len()
    };
    // ring: 2(n-1); two-level: RS + 2(N-1) + AG; tree: log2 n reduce + log2 n broadcast
    assert_eq!(rounds(CollKind::AllReduce, Algo::Ring), 14);
    assert_eq!(rounds(CollKind::AllReduce, Algo::TwoLevel), 8);
    assert_eq!(rounds(CollKind::AllReduce, Algo::Tree), 6);
    assert_eq!(rounds(CollKind::AllToAll, Algo::Pairwise), 8);
    assert_eq!(rotation(CollKind::AllReduce, Algo::TwoLevel, &layout), 2);
    assert_eq!(rotation(CollKind::AllReduce, Algo::Tree, &layout), 8);
    // a tiny all-reduce still takes the ring's 2(n-1) rounds (chunks pass through every rank)
    let mut p = FabricPlanner::new(&f, 8, true).unwrap();
    let a = p.predict(CollKind::AllReduce, Algo::Ring, 1, 4, 0).unwrap();
    assert_eq!(a.rounds, 14);
    assert_eq!(a.transfer, 4.0);
}

#[test]
fn routes_count_switches_and_share_uplinks() {
    let f = fabric(
        8,
        1,
        1,
        Wiring::NodeOnLeaf { nodes_per_leaf: 2 },
        Some((2, 100.0)),
        Some((2, 2, 100.0)),
        Ecmp::Worst,
    );
    let r = Routes::new(&f);
    assert_eq!((f.leaves(), f.pods()), (4, 2));
    let hops = |a: usize, b: usize| r.path(&f, (a, 0), (b, 0), 1).unwrap().hops;
    assert_eq!(hops(0, 1), 1);
    assert_eq!(hops(0, 2), 3);
    assert_eq!(hops(0, 4), 5);
    assert!(r.path(&f, (3, 0), (3, 0), 1).is_none());
    let classes: Vec<LinkClass> = r
        .path(&f, (0, 0), (7, 0), 1)
        .unwrap()
        .links()
        .iter()
        .map(|&l| r.class(l))
        .collect();
    assert_eq!(
        classes,
        [
            LinkClass::NicUp,
            LinkClass::LeafUp,
            LinkClass::SpineUp,
            LinkClass::SpineDown,
            LinkClass::LeafDown,
            LinkClass::NicDown
        ]
    );
    assert!((f.leaf_oversubscription().unwrap() - 2.0).abs() < 1e-12);
}

#[test]
fn oversubscription_slows_the_ring_where_it_crosses_leaves() {
    // 4 nodes x 1 rank, 2 per leaf; 1:1 vs 3:1 uplinks: the ring crosses each leaf once per
    // direction, so 3:1 makes its cross-leaf flows 3x slower.
    let mk = |up: f64| {
        let mut f = fabric(
            4,
            1,
            1,
            Wiring::NodeOnLeaf { nodes_per_leaf: 2 },
            Some((2, up)),
            None,
            Ecmp::Ideal,
        );
        f.nic.bw = gbit(10.0);
        f
    };
    let (f1, f3) = (mk(10.0), mk(10.0 / 3.0));
    let t = |f: &Fabric| {
        let mut p = FabricPlanner::new(f, 4, true).unwrap();
        p.predict(CollKind::AllReduce, Algo::Ring, 16 << 20, 4, 0)
            .unwrap()
    };
    let (a, b) = (t(&f1), t(&f3));
    assert!(
        b.time > 2.5 * a.time && b.time < 3.1 * a.time,
        "{a:?} {b:?}"
    );
    assert_eq!(b.bottleneck.unwrap().tier, Tier::Link(LinkClass::LeafUp));
    assert_eq!(a.bottleneck.unwrap().tier, Tier::Link(LinkClass::NicUp));
}

#[test]
fn bad_fabrics_are_refused_before_allocation() {
    let mut f = fabric(
        4,
        1,
        1,
        Wiring::NodeOnLeaf { nodes_per_leaf: 2 },
        None,
        None,
        Ecmp::Ideal,
    );
    assert!(f.validate().unwrap_err().0.contains("no spine tier"));
    f.spine = Some(SpineTier {
        spines: 2,
        link_bw: f64::NAN,
    });
    assert!(f.validate().unwrap_err().0.contains("spine link bandwidth"));
    f.spine = Some(SpineTier {
        spines: 2,
        link_bw: 1e9,
    });
    f.validate().unwrap();
    f.nodes = usize::MAX / 2;
    assert!(f.validate().unwrap_err().0.contains("ranks"));
    f.nodes = 4_000_000;
    f.ranks_per_node = 1;
    f.nics = 1000;
    assert!(f.validate().unwrap_err().0.contains("links"));
    f.nics = 1;
    f.efficiency = 1.5;
    assert!(f.validate().is_err());
}

#[test]
fn a_wrong_symmetry_is_caught_by_the_brute_force() {
    // The ring broadcast is a pipeline: its ranks are not alike. Claiming they are (one class)
    // gives another schedule than running every rank — which is what the equality test checks.
    let f = fabric(
        4,
        2,
        1,
        Wiring::NodeOnLeaf { nodes_per_leaf: 2 },
        Some((2, 200.0)),
        None,
        Ecmp::Ideal,
    );
    let layout = f.layout(8);
    let planner = Planner::new(&layout).unwrap();
    let cc = shape_count(CollKind::Broadcast, Algo::Ring, 1 << 20, 8);
    let plans: Vec<_> = (0..8)
        .map(|r| {
            planner
                .plan(CollKind::Broadcast, Algo::Ring, r, cc, 0)
                .unwrap()
        })
        .collect();
    let all = Schedule::run(&plans, 8, 8).unwrap();
    let wrong = Schedule::run(&plans[..1], 8, 1);
    assert!(wrong.map_or(true, |w| w.rounds != all.rounds));
}

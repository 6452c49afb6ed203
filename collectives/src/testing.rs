//! The test matrix shared by the algorithm files: layouts, counts and roots for n = 1..16, and
//! [`run_matrix`], which builds every rank's plan through the dispatcher ([`build_plan`], so
//! validation is exercised too) and checks it symbolically. Test-only.

use crate::build::build_plan;
use crate::builder::PlanError;
use crate::check::check;
use crate::plan::{Algo, CollKind, Layout, Plan};

/// Layouts for `n` ranks: single node, blocks of 2 and 4, a non-uniform one with ranks not
/// in node-major order, and (for even n) an interleaved uniform one.
pub fn layouts(n: usize) -> Vec<Layout> {
    let mut v = vec![
        Layout::single_node(n),
        Layout::block(n, 2),
        Layout::block(n, 4),
        // one rank per node, in rank order and reversed (a flat reduce's layouts)
        Layout::block(n, 1),
        Layout {
            nodes: (0..n).rev().map(|r| vec![r]).collect(),
        },
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

#[test]
fn test_layouts_are_valid() {
    for n in 1..=16 {
        for l in layouts(n) {
            assert_eq!(crate::builder::validate_layout(&l), Ok(n), "{l:?}");
        }
    }
}

//! Postconditions over the simulated buffers: reductions combine every rank's element exactly
//! once and are the same expression on every rank (bit-identical); gathers, broadcasts and
//! all-to-all land each rank's block where it belongs.

use super::error::CheckError;
use super::expr::{leaf, Val, UNKNOWN};
use super::sim::Sim;
use crate::plan::{Buf, CollKind};
use std::fmt::Write as _;

impl Sim<'_> {
    pub(super) fn postcondition(&self, kind: CollKind, root: usize) -> Result<(), CheckError> {
        let n = self.n;
        let count = self.count;
        let mut scratch = Vec::new();
        match kind {
            CollKind::AllReduce | CollKind::Barrier => {
                for i in 0..count {
                    let v0 = self.work[0][i];
                    self.reduced(0, i, v0, &mut scratch)?;
                    for r in 1..n {
                        let v = self.work[r][i];
                        if v != v0 {
                            self.reduced(r, i, v, &mut scratch)?;
                            return Err(CheckError::NotBitIdentical {
                                rank: 0,
                                other: r,
                                index: i,
                                a: self.ex.render(v0),
                                b: self.ex.render(v),
                            });
                        }
                    }
                }
            }
            CollKind::Reduce => {
                for i in 0..count {
                    self.reduced(root, i, self.work[root][i], &mut scratch)?;
                }
            }
            CollKind::ReduceScatter => {
                for r in 0..n {
                    for i in r * count..(r + 1) * count {
                        self.reduced(r, i, self.work[r][i], &mut scratch)?;
                    }
                }
            }
            CollKind::AllGather | CollKind::Broadcast | CollKind::AllToAll => {
                for r in 0..n {
                    for (i, &v) in self.work[r].iter().enumerate() {
                        let want = match kind {
                            CollKind::AllGather => leaf(i / count, Buf::Work, i),
                            CollKind::Broadcast => leaf(root, Buf::Work, i),
                            _ => leaf(i / count, Buf::Input, r * count + i % count),
                        };
                        if v != want {
                            return Err(CheckError::Wrong {
                                rank: r,
                                index: i,
                                expected: self.ex.render(want),
                                got: self.ex.render(v),
                            });
                        }
                    }
                }
            }
            CollKind::SendRecv => {}
        }
        Ok(())
    }

    /// `v` (rank r's work element i) must combine element i of every rank exactly once.
    fn reduced(
        &self,
        r: usize,
        i: usize,
        v: Val,
        scratch: &mut Vec<Val>,
    ) -> Result<(), CheckError> {
        let n = self.n;
        if n <= 64 && v != UNKNOWN {
            // Exact: n leaves, all of work element i, n distinct ranks below n.
            let sum = self.ex.summary(v);
            let all = if n == 64 { u64::MAX } else { (1 << n) - 1 };
            if sum.key == i as u64 && sum.leaves == n as u64 && !sum.dup && sum.ranks == all {
                return Ok(());
            }
        }
        let complete = self.ex.leaves(v, scratch, n);
        scratch.sort_unstable();
        let ok = complete
            && scratch.len() == n
            && scratch
                .iter()
                .enumerate()
                .all(|(s, &x)| x == leaf(s, Buf::Work, i));
        if ok {
            return Ok(());
        }
        let expected = if n == 1 {
            format!("r0[{i}]")
        } else {
            format!("element {i} of all {n} ranks combined, each exactly once")
        };
        let mut got = self.ex.render(v);
        if complete {
            let want: Vec<Val> = (0..n).map(|s| leaf(s, Buf::Work, i)).collect();
            let missing = multiset_minus(&want, scratch);
            let extra = multiset_minus(scratch, &want);
            let list = |xs: &[Val]| {
                xs.iter()
                    .map(|&x| self.ex.render(x))
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            if !missing.is_empty() {
                let _ = write!(got, "; missing {}", list(&missing));
            }
            if !extra.is_empty() {
                let _ = write!(got, "; extra {}", list(&extra));
            }
        } else if got.contains("uninitialised") {
            got.push_str("; uses uninitialised data");
        } else {
            let _ = write!(got, "; more than {n} contributions");
        }
        Err(CheckError::Wrong {
            rank: r,
            index: i,
            expected,
            got,
        })
    }
}

/// Elements of sorted `a` not matched in sorted `b` (multiset difference).
fn multiset_minus(a: &[Val], b: &[Val]) -> Vec<Val> {
    let mut out = Vec::new();
    let mut j = 0;
    for &x in a {
        while j < b.len() && b[j] < x {
            j += 1;
        }
        if j < b.len() && b[j] == x {
            j += 1;
        } else {
            out.push(x);
        }
    }
    out
}

//! Symbolic values: an element is a hash-consed expression over the ranks' initial elements
//! (`Leaf`), one application of the combiner with its operands sorted (`Op`, commutative
//! normalisation), or uninitialised. Each `Op` keeps a summary so the common postcondition
//! check is O(1).

use crate::plan::Buf;
use std::fmt::Write as _;

pub(super) type Val = u64;
pub(super) const UNKNOWN: Val = 0;
const OP_BIT: Val = 1 << 63;

pub(super) fn leaf(rank: usize, buf: Buf, idx: usize) -> Val {
    1 + (((rank as u64) << 33) | (u64::from(buf == Buf::Input) << 32) | idx as u64)
}

enum Node {
    Unknown,
    Leaf {
        rank: usize,
        input: bool,
        idx: usize,
    },
    Op(Val, Val),
}

/// What a value combines, kept per node so that the common postcondition check is O(1):
/// the leaves' common (buffer, index) key (or [`MIXED`]), how many leaves, which ranks (for
/// ranks < 64) and whether some rank appears twice.
#[derive(Clone, Copy)]
pub(super) struct Summary {
    pub(super) key: u64,
    pub(super) leaves: u64,
    pub(super) ranks: u64,
    pub(super) dup: bool,
}

const MIXED: u64 = u64::MAX;

/// Hash-consed `Op` nodes (open addressing, linear probing: fast even without optimisation).
pub(super) struct Exprs {
    ops: Vec<(Val, Val)>,
    sums: Vec<Summary>,
    /// `index + 1` into `ops`, 0 = empty. Length is a power of two.
    table: Vec<u32>,
}

impl Default for Exprs {
    fn default() -> Self {
        Exprs::with_capacity(512)
    }
}

fn slot(key: (Val, Val), len: usize) -> usize {
    let h = (key.0 ^ key.1.rotate_left(29)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (h >> (64 - len.trailing_zeros())) as usize
}

impl Exprs {
    pub(super) fn with_capacity(ops: usize) -> Exprs {
        Exprs {
            ops: Vec::with_capacity(ops),
            sums: Vec::with_capacity(ops),
            table: vec![0; (2 * ops).next_power_of_two().max(1024)],
        }
    }

    pub(super) fn op(&mut self, a: Val, b: Val) -> Val {
        if a == UNKNOWN || b == UNKNOWN {
            return UNKNOWN;
        }
        let key = if a <= b { (a, b) } else { (b, a) };
        if (self.ops.len() + 1) * 2 > self.table.len() {
            self.grow();
        }
        let mask = self.table.len() - 1;
        let mut h = slot(key, self.table.len());
        loop {
            let e = self.table[h] as usize;
            if e == 0 {
                break;
            }
            let k = self.ops[e - 1];
            if k.0 == key.0 && k.1 == key.1 {
                return OP_BIT | (e - 1) as u64;
            }
            h = (h + 1) & mask;
        }
        let (sa, sb) = (self.summary(key.0), self.summary(key.1));
        self.sums.push(Summary {
            key: if sa.key == sb.key { sa.key } else { MIXED },
            leaves: sa.leaves + sb.leaves,
            ranks: sa.ranks | sb.ranks,
            dup: sa.dup || sb.dup || sa.ranks & sb.ranks != 0,
        });
        self.ops.push(key);
        self.table[h] = self.ops.len() as u32;
        OP_BIT | (self.ops.len() - 1) as u64
    }

    fn grow(&mut self) {
        let len = self.table.len() * 2;
        let mut table = vec![0u32; len];
        for (i, &key) in self.ops.iter().enumerate() {
            let mut h = slot(key, len);
            while table[h] != 0 {
                h = (h + 1) & (len - 1);
            }
            table[h] = i as u32 + 1;
        }
        self.table = table;
    }

    /// Summary of a known (not uninitialised) value.
    pub(super) fn summary(&self, v: Val) -> Summary {
        if v & OP_BIT != 0 {
            self.sums[(v & !OP_BIT) as usize]
        } else {
            let x = v - 1;
            let rank = x >> 33;
            Summary {
                key: x & 0x1_ffff_ffff,
                leaves: 1,
                ranks: if rank < 64 { 1 << rank } else { 0 },
                dup: false,
            }
        }
    }

    fn node(&self, v: Val) -> Node {
        if v == UNKNOWN {
            Node::Unknown
        } else if v & OP_BIT != 0 {
            let (a, b) = self.ops[(v & !OP_BIT) as usize];
            Node::Op(a, b)
        } else {
            let x = v - 1;
            Node::Leaf {
                rank: (x >> 33) as usize,
                input: (x >> 32) & 1 == 1,
                idx: (x & 0xffff_ffff) as usize,
            }
        }
    }

    pub(super) fn render(&self, v: Val) -> String {
        const MAX: usize = 240;
        let mut s = String::new();
        self.render_into(v, &mut s, MAX);
        if s.len() > MAX {
            let mut cut = MAX;
            while !s.is_char_boundary(cut) {
                cut -= 1;
            }
            s.truncate(cut);
            s.push_str("...");
        }
        s
    }

    fn render_into(&self, v: Val, s: &mut String, max: usize) {
        if s.len() > max {
            return;
        }
        match self.node(v) {
            Node::Unknown => s.push_str("uninitialised"),
            Node::Leaf { rank, input, idx } => {
                let b = if input { ".in" } else { "" };
                let _ = write!(s, "r{rank}{b}[{idx}]");
            }
            Node::Op(a, b) => {
                s.push('(');
                self.render_into(a, s, max);
                s.push_str(" + ");
                self.render_into(b, s, max);
                s.push(')');
            }
        }
    }

    /// Leaves of `v` into `out` (unsorted). Returns false when `v` contains uninitialised data
    /// or more than `limit` leaves.
    pub(super) fn leaves(&self, v: Val, out: &mut Vec<Val>, limit: usize) -> bool {
        out.clear();
        let mut stack = vec![v];
        while let Some(x) = stack.pop() {
            match self.node(x) {
                Node::Unknown => return false,
                Node::Leaf { .. } => {
                    out.push(x);
                    if out.len() > limit {
                        return false;
                    }
                }
                Node::Op(a, b) => {
                    stack.push(b);
                    stack.push(a);
                }
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expressions_are_hash_consed_and_commutative() {
        let mut e = Exprs::default();
        let a = leaf(0, Buf::Work, 3);
        let b = leaf(1, Buf::Work, 3);
        let c = leaf(2, Buf::Work, 3);
        assert_eq!(e.op(a, b), e.op(b, a));
        let ab_c = {
            let ab = e.op(a, b);
            e.op(ab, c)
        };
        let a_bc = {
            let bc = e.op(b, c);
            e.op(a, bc)
        };
        assert_ne!(ab_c, a_bc);
        assert_eq!(e.render(ab_c), "(r2[3] + (r0[3] + r1[3]))");
        assert_eq!(e.op(a, UNKNOWN), UNKNOWN);
        let mut v = Vec::new();
        assert!(e.leaves(a_bc, &mut v, 3));
        assert_eq!(v.len(), 3);
        assert!(!e.leaves(a_bc, &mut v, 2));
        // The largest leaf `check` admits (n < 2^30, buffers < 2^32 elements) is not an op id.
        let big = leaf((1 << 30) - 1, Buf::Input, (1 << 32) - 2);
        assert_eq!(big & OP_BIT, 0);
        assert!(matches!(
            e.node(big),
            Node::Leaf { rank, input: true, idx } if rank == (1 << 30) - 1 && idx == (1 << 32) - 2
        ));
    }
}

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

use crate::plan::{Buf, CollKind, Layout, Plan, Region, Step, Xfer};
use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;

/// Why a set of plans is wrong. Messages name the rank, step and element.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CheckError {
    #[error("invalid check input: {0}")]
    Input(String),
    #[error("rank {rank} step {step}: {msg}")]
    BadStep {
        rank: usize,
        step: usize,
        msg: String,
    },
    #[error(
        "rank {rank} step {step} receives {recv_len} elements from rank {src} on channel {chan}, \
         but the matching send (rank {src} step {send_step}) carries {send_len}"
    )]
    LenMismatch {
        rank: usize,
        step: usize,
        src: usize,
        chan: usize,
        send_step: usize,
        send_len: usize,
        recv_len: usize,
    },
    #[error(
        "rank {rank} step {step} and rank {other} step {other_step} disagree on an in-node \
         collective: {msg}"
    )]
    NodeMismatch {
        rank: usize,
        step: usize,
        other: usize,
        other_step: usize,
        msg: String,
    },
    #[error("deadlock: no rank can make progress\n{0}")]
    Deadlock(String),
    #[error("rank {rank}: work element {index}: expected {expected}, got {got}")]
    Wrong {
        rank: usize,
        index: usize,
        expected: String,
        got: String,
    },
    #[error(
        "ranks {rank} and {other} end with different reduction trees for work element {index}, \
         so their results are not bit-identical: {a} vs {b}"
    )]
    NotBitIdentical {
        rank: usize,
        other: usize,
        index: usize,
        a: String,
        b: String,
    },
}

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

// ---------------------------------------------------------------------------------------------
// Symbolic values

type Val = u64;
const UNKNOWN: Val = 0;
const OP_BIT: Val = 1 << 63;

fn leaf(rank: usize, buf: Buf, idx: usize) -> Val {
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
struct Summary {
    key: u64,
    leaves: u64,
    ranks: u64,
    dup: bool,
}

const MIXED: u64 = u64::MAX;

/// Hash-consed `Op` nodes (open addressing, linear probing: fast even without optimisation).
struct Exprs {
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
    fn with_capacity(ops: usize) -> Exprs {
        Exprs {
            ops: Vec::with_capacity(ops),
            sums: Vec::with_capacity(ops),
            table: vec![0; (2 * ops).next_power_of_two().max(1024)],
        }
    }

    fn op(&mut self, a: Val, b: Val) -> Val {
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
    fn summary(&self, v: Val) -> Summary {
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

    fn render(&self, v: Val) -> String {
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
    fn leaves(&self, v: Val, out: &mut Vec<Val>, limit: usize) -> bool {
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

// ---------------------------------------------------------------------------------------------
// Static validation

fn bad(rank: usize, step: usize, msg: impl Into<String>) -> CheckError {
    CheckError::BadStep {
        rank,
        step,
        msg: msg.into(),
    }
}

fn overlap(a: &Region, b: &Region) -> bool {
    a.buf == b.buf && a.len > 0 && b.len > 0 && a.offset < b.end() && b.offset < a.end()
}

fn validate(
    p: &Plan,
    layout: &Layout,
    n: usize,
    work_len: usize,
    input_len: usize,
) -> Result<(), CheckError> {
    let r = p.rank;
    let in_bounds = |step: usize, reg: &Region, writable: bool| -> Result<(), CheckError> {
        let (len, name) = match reg.buf {
            Buf::Work => (work_len, "work"),
            Buf::Input => (input_len, "input"),
        };
        if writable && reg.buf == Buf::Input && reg.len > 0 {
            return Err(bad(
                r,
                step,
                format!("writes {reg}: the input buffer is read-only"),
            ));
        }
        match reg.offset.checked_add(reg.len) {
            Some(end) if end <= len || reg.len == 0 => Ok(()),
            _ => Err(bad(
                r,
                step,
                format!("region {reg} is out of bounds ({name} buffer has {len} elements)"),
            )),
        }
    };
    let peer_ok = |step: usize, x: &Xfer| -> Result<(), CheckError> {
        if x.region.len == 0 {
            return Ok(());
        }
        if x.peer >= n {
            return Err(bad(
                r,
                step,
                format!("peer {} is not a rank (n = {n})", x.peer),
            ));
        }
        if x.peer == r {
            return Err(bad(r, step, "exchange with itself"));
        }
        Ok(())
    };
    for (i, s) in p.steps.iter().enumerate() {
        match s {
            Step::Exchange { send, recv, reduce } => {
                if let Some(x) = send {
                    peer_ok(i, x)?;
                    in_bounds(i, &x.region, false)?;
                }
                if let Some(x) = recv {
                    peer_ok(i, x)?;
                    in_bounds(i, &x.region, true)?;
                }
                if let (Some(s), Some(v), false) = (send, recv, reduce) {
                    if overlap(&s.region, &v.region) {
                        return Err(bad(
                            r,
                            i,
                            format!(
                                "send {} and receive {} overlap without reduce: an executor \
                                 receiving in place would corrupt the outgoing data",
                                s.region, v.region
                            ),
                        ));
                    }
                }
            }
            Step::Copy { src, dst } => {
                in_bounds(i, src, false)?;
                in_bounds(i, dst, true)?;
                if src.len != dst.len {
                    return Err(bad(r, i, format!("copy {src} -> {dst}: lengths differ")));
                }
            }
            Step::NodeReduceScatter { group, slices } | Step::NodeAllGather { group, slices } => {
                if !group.contains(&r) {
                    return Err(bad(
                        r,
                        i,
                        format!("node group {group:?} does not contain it"),
                    ));
                }
                if slices.len() != group.len() {
                    return Err(bad(
                        r,
                        i,
                        format!("{} slices for a group of {}", slices.len(), group.len()),
                    ));
                }
                let home = layout.locate(r).map(|x| x.0);
                for (j, &m) in group.iter().enumerate() {
                    if m >= n {
                        return Err(bad(r, i, format!("node group member {m} is not a rank")));
                    }
                    if group[..j].contains(&m) {
                        return Err(bad(r, i, format!("node group lists rank {m} twice")));
                    }
                    if layout.locate(m).map(|x| x.0) != home {
                        return Err(bad(
                            r,
                            i,
                            format!("node group {group:?}: rank {m} is on another node"),
                        ));
                    }
                }
                for (j, sl) in slices.iter().enumerate() {
                    in_bounds(i, sl, true)?;
                    if let Some(o) = slices[..j].iter().find(|o| overlap(o, sl)) {
                        return Err(bad(r, i, format!("node slices {o} and {sl} overlap")));
                    }
                }
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Simulation

/// (source rank, destination rank, channel)
type Key = (usize, usize, usize);

struct Msg {
    vals: Vec<Val>,
    step: usize,
}

#[derive(Clone, Default)]
struct ExState {
    posted: bool,
    /// Our send: key and sequence number; done when `consumed[key] > seq`.
    send: Option<(Key, u64)>,
    recv_done: bool,
}

struct Sim<'a> {
    plans: &'a [Plan],
    n: usize,
    count: usize,
    ex: Exprs,
    work: Vec<Vec<Val>>,
    input: Vec<Vec<Val>>,
    pc: Vec<usize>,
    st: Vec<ExState>,
    queues: HashMap<Key, VecDeque<Msg>>,
    posted: HashMap<Key, u64>,
    consumed: HashMap<Key, u64>,
}

fn nonempty(x: &Option<Xfer>) -> Option<&Xfer> {
    x.as_ref().filter(|x| x.region.len > 0)
}

impl<'a> Sim<'a> {
    fn new(
        kind: CollKind,
        plans: &'a [Plan],
        n: usize,
        count: usize,
        work_len: usize,
        input_len: usize,
    ) -> Sim<'a> {
        let work = (0..n)
            .map(|r| {
                (0..work_len)
                    .map(|i| match kind {
                        CollKind::AllGather if i / count.max(1) != r => UNKNOWN,
                        CollKind::AllToAll => UNKNOWN,
                        _ => leaf(r, Buf::Work, i),
                    })
                    .collect()
            })
            .collect();
        let input = (0..n)
            .map(|r| (0..input_len).map(|i| leaf(r, Buf::Input, i)).collect())
            .collect();
        Sim {
            plans,
            n,
            count,
            // Roughly one combine per element per rank, at most 2^22 up front.
            ex: Exprs::with_capacity((n * work_len).min(1 << 22)),
            work,
            input,
            pc: vec![0; n],
            st: vec![ExState::default(); n],
            queues: HashMap::new(),
            posted: HashMap::new(),
            consumed: HashMap::new(),
        }
    }

    fn read(&self, r: usize, reg: &Region) -> Vec<Val> {
        let b = match reg.buf {
            Buf::Work => &self.work[r],
            Buf::Input => &self.input[r],
        };
        b[reg.offset..reg.end()].to_vec()
    }

    fn current(&self, r: usize) -> Option<&'a Step> {
        self.plans[r].steps.get(self.pc[r])
    }

    fn run(&mut self) -> Result<(), CheckError> {
        loop {
            let mut progress = false;
            for r in 0..self.n {
                while self.advance(r)? {
                    progress = true;
                }
            }
            if !progress {
                break;
            }
        }
        if (0..self.n).any(|r| self.current(r).is_some()) {
            return Err(CheckError::Deadlock(self.describe_deadlock()));
        }
        if let Some((k, q)) = self.queues.iter().find(|(_, q)| !q.is_empty()) {
            let step = q.front().map_or(0, |m| m.step);
            return Err(bad(
                k.0,
                step,
                format!("send to rank {} on channel {} is never received", k.1, k.2),
            ));
        }
        Ok(())
    }

    /// Tries to make progress on rank `r`; true when something changed.
    fn advance(&mut self, r: usize) -> Result<bool, CheckError> {
        let pc = self.pc[r];
        let Some(step) = self.current(r) else {
            return Ok(false);
        };
        match step {
            Step::Copy { src, dst } => {
                let vals = self.read(r, src);
                self.work[r][dst.offset..dst.end()].copy_from_slice(&vals);
                self.pc[r] += 1;
                Ok(true)
            }
            Step::Exchange { send, recv, reduce } => {
                let mut changed = false;
                let send = nonempty(send);
                let recv = nonempty(recv);
                if !self.st[r].posted {
                    self.st[r].posted = true;
                    changed = true;
                    if let Some(x) = send {
                        let key = (r, x.peer, x.chan);
                        let seq = self.posted.entry(key).or_insert(0);
                        let my_seq = *seq;
                        *seq += 1;
                        let vals = self.read(r, &x.region);
                        self.queues
                            .entry(key)
                            .or_default()
                            .push_back(Msg { vals, step: pc });
                        self.st[r].send = Some((key, my_seq));
                    }
                }
                if let Some(x) = recv {
                    if !self.st[r].recv_done {
                        let key = (x.peer, r, x.chan);
                        if let Some(msg) = self.queues.get_mut(&key).and_then(|q| q.pop_front()) {
                            if msg.vals.len() != x.region.len {
                                return Err(CheckError::LenMismatch {
                                    rank: r,
                                    step: pc,
                                    src: x.peer,
                                    chan: x.chan,
                                    send_step: msg.step,
                                    send_len: msg.vals.len(),
                                    recv_len: x.region.len,
                                });
                            }
                            *self.consumed.entry(key).or_insert(0) += 1;
                            let dst = &mut self.work[r][x.region.offset..x.region.end()];
                            if *reduce {
                                for (d, v) in dst.iter_mut().zip(msg.vals) {
                                    *d = self.ex.op(*d, v);
                                }
                            } else {
                                dst.copy_from_slice(&msg.vals);
                            }
                            self.st[r].recv_done = true;
                            changed = true;
                        }
                    }
                }
                let send_ok = match self.st[r].send {
                    None => true,
                    Some((k, seq)) => self.consumed.get(&k).copied().unwrap_or(0) > seq,
                };
                let recv_ok = recv.is_none() || self.st[r].recv_done;
                if send_ok && recv_ok {
                    self.st[r] = ExState::default();
                    self.pc[r] += 1;
                    changed = true;
                }
                Ok(changed)
            }
            Step::NodeReduceScatter { group, slices } | Step::NodeAllGather { group, slices } => {
                let rs = matches!(step, Step::NodeReduceScatter { .. });
                for &m in group {
                    if m == r {
                        continue;
                    }
                    let other = match self.current(m) {
                        Some(s @ Step::NodeReduceScatter { .. })
                        | Some(s @ Step::NodeAllGather { .. }) => s,
                        _ => return Ok(false),
                    };
                    let (og, os) = match other {
                        Step::NodeReduceScatter { group, slices }
                        | Step::NodeAllGather { group, slices } => (group, slices),
                        _ => return Ok(false),
                    };
                    if !og.contains(&r) {
                        // m is busy with another group first.
                        return Ok(false);
                    }
                    let ors = matches!(other, Step::NodeReduceScatter { .. });
                    let msg = if og != group {
                        Some(format!("groups {group:?} vs {og:?}"))
                    } else if ors != rs {
                        let name = |b: bool| if b { "reduce-scatter" } else { "all-gather" };
                        Some(format!("{} vs {}", name(rs), name(ors)))
                    } else if os != slices {
                        Some(format!(
                            "slices {} vs {}",
                            fmt_regions(slices),
                            fmt_regions(os)
                        ))
                    } else {
                        None
                    };
                    if let Some(msg) = msg {
                        return Err(CheckError::NodeMismatch {
                            rank: r,
                            step: pc,
                            other: m,
                            other_step: self.pc[m],
                            msg,
                        });
                    }
                }
                for (i, sl) in slices.iter().enumerate() {
                    let range = sl.offset..sl.end();
                    if rs {
                        let mut acc = self.work[group[0]][range.clone()].to_vec();
                        for &m in &group[1..] {
                            for (a, &v) in acc.iter_mut().zip(&self.work[m][range.clone()]) {
                                *a = self.ex.op(*a, v);
                            }
                        }
                        self.work[group[i]][range].copy_from_slice(&acc);
                    } else {
                        let vals = self.work[group[i]][range.clone()].to_vec();
                        for &m in group {
                            if m != group[i] {
                                self.work[m][range.clone()].copy_from_slice(&vals);
                            }
                        }
                    }
                }
                for &m in group {
                    self.pc[m] += 1;
                }
                Ok(true)
            }
        }
    }

    fn describe_deadlock(&self) -> String {
        let mut out = String::new();
        let mut lines = 0;
        for r in 0..self.n {
            let Some(step) = self.current(r) else {
                continue;
            };
            lines += 1;
            if lines > 24 {
                out.push_str("  ...\n");
                break;
            }
            let pc = self.pc[r];
            let _ = write!(out, "  rank {r} step {pc}: ");
            match step {
                Step::Exchange { send, recv, .. } => {
                    out.push_str("exchange");
                    if let Some(x) = nonempty(send) {
                        let _ = write!(
                            out,
                            " send {} -> rank {} ch {} ({})",
                            x.region,
                            x.peer,
                            x.chan,
                            if self.st[r].send.is_some_and(|(k, seq)| {
                                self.consumed.get(&k).copied().unwrap_or(0) > seq
                            }) {
                                "received"
                            } else {
                                "not received yet"
                            }
                        );
                    }
                    if let Some(x) = nonempty(recv) {
                        let _ = write!(
                            out,
                            " recv {} <- rank {} ch {} ({})",
                            x.region,
                            x.peer,
                            x.chan,
                            if self.st[r].recv_done {
                                "done"
                            } else {
                                "nothing sent yet"
                            }
                        );
                    }
                }
                Step::NodeReduceScatter { group, .. } | Step::NodeAllGather { group, .. } => {
                    let what = if matches!(step, Step::NodeReduceScatter { .. }) {
                        "node reduce-scatter"
                    } else {
                        "node all-gather"
                    };
                    let _ = write!(out, "{what} over {group:?}, waiting for");
                    for &m in group {
                        match self.current(m) {
                            None => {
                                let _ = write!(out, " rank {m} (finished)");
                            }
                            Some(Step::NodeReduceScatter { .. } | Step::NodeAllGather { .. }) => {}
                            Some(_) => {
                                let _ = write!(out, " rank {m} (at step {})", self.pc[m]);
                            }
                        }
                    }
                }
                Step::Copy { .. } => out.push_str("copy"),
            }
            out.push('\n');
        }
        out
    }

    // -----------------------------------------------------------------------------------------
    // Postconditions

    fn postcondition(&self, kind: CollKind, root: usize) -> Result<(), CheckError> {
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

fn fmt_regions(r: &[Region]) -> String {
    r.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Algo;

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
}

//! The simulation: every rank runs its steps in order over symbolic values, with FIFO matching
//! per (source, destination, channel), rendezvous sends and in-node steps that run when the whole
//! group has reached them; no progress before all are done is a deadlock, described rank by rank.

use super::error::CheckError;
use super::expr::{leaf, Exprs, Val, UNKNOWN};
use super::validate::bad;
use crate::plan::{Buf, CollKind, Plan, Region, Step, Xfer};
use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;

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

pub(super) struct Sim<'a> {
    plans: &'a [Plan],
    pub(super) n: usize,
    pub(super) count: usize,
    pub(super) ex: Exprs,
    pub(super) work: Vec<Vec<Val>>,
    input: Vec<Vec<Val>>,
    /// Each rank's scratch space, uninitialised at the start.
    scratch: Vec<Vec<Val>>,
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
    pub(super) fn new(
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
        let scratch = plans
            .iter()
            .map(|p| vec![UNKNOWN; p.scratch_len()])
            .collect();
        Sim {
            plans,
            scratch,
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
            Buf::Scratch => &self.scratch[r],
        };
        b[reg.offset..reg.end()].to_vec()
    }

    /// The writable elements of rank `r`'s `reg` among `work` and `scratch` (validation keeps
    /// `Input` regions out of here); fields, not `self`, so a caller can combine into them.
    fn write<'b>(
        work: &'b mut [Vec<Val>],
        scratch: &'b mut [Vec<Val>],
        r: usize,
        reg: &Region,
    ) -> &'b mut [Val] {
        let b = match reg.buf {
            Buf::Scratch => &mut scratch[r],
            Buf::Work | Buf::Input => &mut work[r],
        };
        &mut b[reg.offset..reg.end()]
    }

    fn current(&self, r: usize) -> Option<&'a Step> {
        self.plans[r].steps.get(self.pc[r])
    }

    pub(super) fn run(&mut self) -> Result<(), CheckError> {
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
                Self::write(&mut self.work, &mut self.scratch, r, dst).copy_from_slice(&vals);
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
                            if *reduce {
                                let dst =
                                    Self::write(&mut self.work, &mut self.scratch, r, &x.region);
                                for (d, v) in dst.iter_mut().zip(msg.vals) {
                                    *d = self.ex.op(*d, v);
                                }
                            } else {
                                Self::write(&mut self.work, &mut self.scratch, r, &x.region)
                                    .copy_from_slice(&msg.vals);
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
            Step::NodeReduceScatter { .. }
            | Step::NodeAllGather { .. }
            | Step::NodeBroadcast { .. }
            | Step::NodeAllToAll { .. } => {
                let group = step.node_group().unwrap_or(&[]);
                for &m in group {
                    if m == r {
                        continue;
                    }
                    let Some(other) = self.current(m).filter(|s| s.node_group().is_some()) else {
                        return Ok(false);
                    };
                    let og = other.node_group().unwrap_or(&[]);
                    if !og.contains(&r) {
                        // m is busy with another group first.
                        return Ok(false);
                    }
                    let msg = if og != group {
                        Some(format!("groups {group:?} vs {og:?}"))
                    } else if std::mem::discriminant(other) != std::mem::discriminant(step) {
                        Some(format!("{} vs {}", step.kind_name(), other.kind_name()))
                    } else if other != step {
                        Some(format!(
                            "regions {} vs {}",
                            fmt_regions(&step.node_regions()),
                            fmt_regions(&other.node_regions())
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
                self.node_step(step);
                for &m in group {
                    self.pc[m] += 1;
                }
                Ok(true)
            }
        }
    }

    /// The effect of one in-node step on every member (all members are at this very step).
    fn node_step(&mut self, step: &Step) {
        match step {
            Step::NodeReduceScatter { group, slices } => {
                for (i, sl) in slices.iter().enumerate() {
                    let range = sl.offset..sl.end();
                    let mut acc = self.work[group[0]][range.clone()].to_vec();
                    for &m in &group[1..] {
                        for (a, &v) in acc.iter_mut().zip(&self.work[m][range.clone()]) {
                            *a = self.ex.op(*a, v);
                        }
                    }
                    self.work[group[i]][range].copy_from_slice(&acc);
                }
            }
            Step::NodeAllGather { group, slices } => {
                for (i, sl) in slices.iter().enumerate() {
                    let range = sl.offset..sl.end();
                    let vals = self.work[group[i]][range.clone()].to_vec();
                    for &m in group {
                        if m != group[i] {
                            self.work[m][range.clone()].copy_from_slice(&vals);
                        }
                    }
                }
            }
            Step::NodeBroadcast {
                group,
                root,
                region,
            } => {
                let range = region.offset..region.end();
                let vals = self.work[group[*root]][range.clone()].to_vec();
                for &m in group {
                    self.work[m][range.clone()].copy_from_slice(&vals);
                }
            }
            Step::NodeAllToAll {
                group,
                blocks,
                in_place,
            } => {
                // member i's Work blocks[j] <- member j's Input (in place: Work) at blocks[i]
                let mut out = Vec::new();
                for (i, &mi) in group.iter().enumerate() {
                    for (j, &mj) in group.iter().enumerate() {
                        let from = blocks[i];
                        let src = if *in_place {
                            &self.work[mj]
                        } else {
                            &self.input[mj]
                        };
                        let vals = src[from.offset..from.end()].to_vec();
                        out.push((mi, blocks[j], vals));
                    }
                }
                for (m, dst, vals) in out {
                    self.work[m][dst.offset..dst.end()].copy_from_slice(&vals);
                }
            }
            Step::Exchange { .. } | Step::Copy { .. } => {}
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
                Step::NodeReduceScatter { .. }
                | Step::NodeAllGather { .. }
                | Step::NodeBroadcast { .. }
                | Step::NodeAllToAll { .. } => {
                    let group = step.node_group().unwrap_or(&[]);
                    let _ = write!(out, "{} over {group:?}, waiting for", step.kind_name());
                    for &m in group {
                        match self.current(m) {
                            None => {
                                let _ = write!(out, " rank {m} (finished)");
                            }
                            Some(s) if s.node_group().is_some() => {}
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
}

fn fmt_regions(r: &[Region]) -> String {
    r.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(" ")
}

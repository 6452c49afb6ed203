//! Credit-based flow control for one RDMA link, as a pure state machine (no verbs calls), so it
//! can be tested against an in-memory model of the NIC (one concern; the tests against that
//! model are half the file).
//!
//! The protocol (both directions of a link run it independently):
//!
//! - The receiver owns a **ring** of `slots` slots of `slot_bytes` bytes, registered for remote
//!   write; its address and rkey are exchanged at connection time. The sender owns a staging ring
//!   of the same shape.
//! - A message with sequence number `s` is copied into local staging slot `s % slots` and written
//!   with **RDMA WRITE WITH IMMEDIATE** into the peer's ring slot `s % slots`; the immediate value
//!   is `s mod 2^32`, the completion's byte count is the message length. Each such write consumes
//!   one zero-length receive WR at the peer, which the peer re-posts at once.
//! - **Credits**: the sender may have at most `slots` messages that the receiver has not yet
//!   consumed: `next - peer_consumed < slots`. The receiver returns credits by RDMA-writing its
//!   absolute `consumed` counter (a u64) into the sender's **mailbox** (a plain RDMA write: no
//!   receive WR, no completion on the sender, so credit returns never beget more messages). It
//!   reports after every `report_every` consumed messages, and whenever it runs out of data to
//!   hand out (so a sender waiting for credit is never left behind).
//! - A staging slot is reused only after the send completion of the write that last used it;
//!   completions may be processed in any order (a watermark plus the set above it).
//! - The send queue holds at most `sq_depth` outstanding work requests; one entry is kept free
//!   for credit reports so data can never starve them.
//! - Arrivals are placed by sequence number, not by arrival order: the receiver hands out data
//!   strictly in sequence, and rejects writes outside its window (a peer that overran its
//!   credits) or twice into the same slot.
//!
//! Sequence numbers are u64 on both sides; only the immediate is 32 bits, and the receiver
//! rebuilds the full number from its window (`consumed .. consumed + slots`), so wraparound of
//! the immediate is harmless.

use std::collections::BTreeSet;
use std::fmt;

/// Shape of a link's rings and queues.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlowConfig {
    /// Ring slots per direction (= credits).
    pub slots: u32,
    /// Bytes per slot (the largest message).
    pub slot_bytes: u32,
    /// Send queue depth (outstanding work requests).
    pub sq_depth: u32,
    /// Report credits after this many consumed messages (also whenever the receiver is idle).
    pub report_every: u32,
}

impl FlowConfig {
    /// A configuration, checked: at least 2 slots and 2 send-queue entries, slots of at least one
    /// byte, and the window small enough that 32-bit immediates identify a message.
    pub fn new(slots: u32, slot_bytes: u32, sq_depth: u32) -> Result<FlowConfig, FlowError> {
        if !(2..=(1 << 20)).contains(&slots) {
            return Err(FlowError::Config(format!(
                "{slots} ring slots (need 2 ..= {})",
                1 << 20
            )));
        }
        if slot_bytes == 0 || slot_bytes > (1 << 30) {
            return Err(FlowError::Config(format!("{slot_bytes}-byte ring slots")));
        }
        if sq_depth < 2 {
            return Err(FlowError::Config(format!(
                "send queue depth {sq_depth} (need at least 2)"
            )));
        }
        Ok(FlowConfig {
            slots,
            slot_bytes,
            sq_depth,
            report_every: (slots / 4).max(1),
        })
    }
}

/// A protocol violation or misuse. The link reports it as an I/O error; it means a bug or a peer
/// that does not speak this protocol, never a condition to retry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FlowError {
    Config(String),
    /// `post_data` without capacity, or of a bad length.
    Misuse(String),
    /// The peer wrote outside the window it was granted.
    Overrun {
        seq: u64,
        consumed: u64,
        slots: u32,
    },
    /// Two arrivals for one slot.
    Duplicate {
        seq: u64,
    },
    /// A completion or credit report that cannot correspond to anything posted.
    Bogus(String),
}

impl fmt::Display for FlowError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FlowError::Config(s) => write!(f, "bad RDMA flow configuration: {s}"),
            FlowError::Misuse(s) => write!(f, "RDMA flow control misuse: {s}"),
            FlowError::Overrun {
                seq,
                consumed,
                slots,
            } => write!(
                f,
                "peer wrote message {seq} but only {consumed}..{} were granted (credit overrun)",
                consumed + *slots as u64
            ),
            FlowError::Duplicate { seq } => write!(f, "message {seq} arrived twice"),
            FlowError::Bogus(s) => write!(f, "unexpected RDMA event: {s}"),
        }
    }
}

impl std::error::Error for FlowError {}

/// What a work request was, encoded in its 64-bit `wr_id` (low 2 bits: kind).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WrKind {
    /// The data write of message `seq`.
    Data { seq: u64 },
    /// A credit report (mailbox write).
    Credit,
    /// A zero-length receive WR.
    Recv,
}

impl WrKind {
    pub fn encode(self) -> u64 {
        match self {
            WrKind::Data { seq } => seq << 2,
            WrKind::Credit => 1,
            WrKind::Recv => 2,
        }
    }
    pub fn decode(wr_id: u64) -> Option<WrKind> {
        match wr_id & 3 {
            0 => Some(WrKind::Data { seq: wr_id >> 2 }),
            1 => Some(WrKind::Credit),
            2 => Some(WrKind::Recv),
            _ => None,
        }
    }
}

/// A data write to post: copy `len` bytes into local staging offset `local_off`, then RDMA-write
/// them to the peer's ring at `remote_off` with immediate `imm` and work-request id `wr_id`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataPost {
    pub seq: u64,
    pub slot: u32,
    pub local_off: usize,
    pub remote_off: usize,
    pub len: u32,
    pub imm: u32,
    pub wr_id: u64,
}

/// Flow-control state of one link (both directions).
#[derive(Clone, Debug)]
pub struct Flow {
    cfg: FlowConfig,
    // sending direction
    next: u64,
    peer_consumed: u64,
    send_done: u64,
    send_done_ooo: BTreeSet<u64>,
    sq_inflight: u32,
    // receiving direction
    consumed: u64,
    offset: u32,
    /// Per ring slot: 0 = empty, else message length + 1.
    arrived: Vec<u64>,
    reported: u64,
    recv_posted: u32,
}

impl Flow {
    pub fn new(cfg: FlowConfig) -> Flow {
        Flow::with_initial_seq(cfg, 0)
    }

    /// Start both directions at sequence `s0` (both ends must agree; tests use it to cross the
    /// 32-bit immediate boundary quickly).
    pub fn with_initial_seq(cfg: FlowConfig, s0: u64) -> Flow {
        Flow {
            cfg,
            next: s0,
            peer_consumed: s0,
            send_done: s0,
            send_done_ooo: BTreeSet::new(),
            sq_inflight: 0,
            consumed: s0,
            offset: 0,
            arrived: vec![0; cfg.slots as usize],
            reported: s0,
            recv_posted: 0,
        }
    }

    pub fn config(&self) -> FlowConfig {
        self.cfg
    }

    /// Credits left: messages the peer can still take.
    pub fn credits(&self) -> u64 {
        (self.peer_consumed + self.cfg.slots as u64).saturating_sub(self.next)
    }

    /// Outstanding send-queue entries.
    pub fn sq_inflight(&self) -> u32 {
        self.sq_inflight
    }

    /// Messages posted whose completions have not all been seen.
    pub fn sends_pending(&self) -> u64 {
        self.next - self.send_done
    }

    /// Whether a data message can be posted now, and why not.
    pub fn send_blocker(&self) -> Option<&'static str> {
        if self.credits() == 0 {
            Some("no credits (the peer has not consumed earlier messages)")
        } else if self.next >= self.send_done + self.cfg.slots as u64 {
            Some("staging slot still in flight")
        } else if self.sq_inflight + 1 >= self.cfg.sq_depth {
            Some("send queue full")
        } else {
            None
        }
    }

    pub fn can_send(&self) -> bool {
        self.send_blocker().is_none()
    }

    /// Claim the next message of `len` bytes (1 ..= slot_bytes).
    pub fn post_data(&mut self, len: usize) -> Result<DataPost, FlowError> {
        if len == 0 || len > self.cfg.slot_bytes as usize {
            return Err(FlowError::Misuse(format!(
                "message of {len} bytes (slots hold 1..={})",
                self.cfg.slot_bytes
            )));
        }
        if let Some(why) = self.send_blocker() {
            return Err(FlowError::Misuse(format!("post_data while blocked: {why}")));
        }
        let seq = self.next;
        let slot = (seq % self.cfg.slots as u64) as u32;
        let off = slot as usize * self.cfg.slot_bytes as usize;
        self.next += 1;
        self.sq_inflight += 1;
        Ok(DataPost {
            seq,
            slot,
            local_off: off,
            remote_off: off,
            len: len as u32,
            imm: seq as u32,
            wr_id: WrKind::Data { seq }.encode(),
        })
    }

    /// A send-queue completion (data write or credit report), in any order.
    pub fn on_send_completion(&mut self, wr_id: u64) -> Result<(), FlowError> {
        if self.sq_inflight == 0 {
            return Err(FlowError::Bogus(format!(
                "send completion {wr_id:#x} with nothing outstanding"
            )));
        }
        match WrKind::decode(wr_id) {
            Some(WrKind::Data { seq }) => {
                if seq < self.send_done || seq >= self.next || self.send_done_ooo.contains(&seq) {
                    return Err(FlowError::Bogus(format!(
                        "completion for message {seq} (outstanding: {}..{})",
                        self.send_done, self.next
                    )));
                }
                self.send_done_ooo.insert(seq);
                while self.send_done_ooo.remove(&self.send_done) {
                    self.send_done += 1;
                }
            }
            Some(WrKind::Credit) => {}
            _ => {
                return Err(FlowError::Bogus(format!(
                    "send completion with wr_id {wr_id:#x}"
                )))
            }
        }
        self.sq_inflight -= 1;
        Ok(())
    }

    /// The peer's consumed counter, as read from the mailbox. Stale (lower) values are ignored.
    pub fn on_credit(&mut self, peer_consumed: u64) -> Result<(), FlowError> {
        if peer_consumed > self.next {
            return Err(FlowError::Bogus(format!(
                "peer reports {peer_consumed} messages consumed, only {} were sent",
                self.next
            )));
        }
        self.peer_consumed = self.peer_consumed.max(peer_consumed);
        Ok(())
    }

    /// A receive completion for a write with immediate `imm` of `len` bytes.
    pub fn on_arrival(&mut self, imm: u32, len: u32) -> Result<(), FlowError> {
        let seq = self.consumed + imm.wrapping_sub(self.consumed as u32) as u64;
        if seq >= self.consumed + self.cfg.slots as u64 {
            return Err(FlowError::Overrun {
                seq,
                consumed: self.consumed,
                slots: self.cfg.slots,
            });
        }
        if len == 0 || len > self.cfg.slot_bytes {
            return Err(FlowError::Bogus(format!(
                "message {seq} of {len} bytes (slots hold 1..={})",
                self.cfg.slot_bytes
            )));
        }
        let slot = (seq % self.cfg.slots as u64) as usize;
        if self.arrived[slot] != 0 {
            return Err(FlowError::Duplicate { seq });
        }
        self.arrived[slot] = len as u64 + 1;
        self.recv_posted = self.recv_posted.saturating_sub(1);
        Ok(())
    }

    /// The next bytes to hand out, in order: (byte offset in the ring, length).
    pub fn readable(&self) -> Option<(usize, usize)> {
        let slot = (self.consumed % self.cfg.slots as u64) as usize;
        match self.arrived[slot] {
            0 => None,
            l => Some((
                slot * self.cfg.slot_bytes as usize + self.offset as usize,
                (l - 1) as usize - self.offset as usize,
            )),
        }
    }

    /// `n` bytes of the current message were handed out; returns true when it is finished (its
    /// slot is free for the peer once credits are reported).
    pub fn consume(&mut self, n: usize) -> Result<bool, FlowError> {
        let Some((_, avail)) = self.readable() else {
            return Err(FlowError::Misuse("consume with nothing readable".into()));
        };
        if n > avail {
            return Err(FlowError::Misuse(format!(
                "consume {n} bytes of {avail} available"
            )));
        }
        self.offset += n as u32;
        if n == avail {
            let slot = (self.consumed % self.cfg.slots as u64) as usize;
            self.arrived[slot] = 0;
            self.consumed += 1;
            self.offset = 0;
            return Ok(true);
        }
        Ok(false)
    }

    /// Messages fully consumed so far (the value credit reports carry).
    pub fn consumed(&self) -> u64 {
        self.consumed
    }

    /// The credit report due now, if any: after `report_every` unreported messages, or when
    /// `idle` (nothing left to hand out) and anything is unreported, provided a send-queue entry
    /// is free. Post the mailbox write (`WrKind::Credit`), then call [`Flow::on_credit_posted`].
    pub fn credit_due(&self, idle: bool) -> Option<u64> {
        let pending = self.consumed - self.reported;
        if pending == 0 || self.sq_inflight >= self.cfg.sq_depth {
            return None;
        }
        (pending >= self.cfg.report_every as u64 || idle).then_some(self.consumed)
    }

    /// The credit report of `value` was posted (claims a send-queue entry until its completion).
    pub fn on_credit_posted(&mut self, value: u64) {
        self.reported = self.reported.max(value.min(self.consumed));
        self.sq_inflight += 1;
    }

    /// Receive WRs to post to keep one per slot.
    pub fn recv_to_post(&self) -> u32 {
        self.cfg.slots - self.recv_posted.min(self.cfg.slots)
    }

    pub fn on_recv_posted(&mut self, n: u32) {
        self.recv_posted = (self.recv_posted + n).min(self.cfg.slots);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    /// A tiny deterministic PRNG (xorshift64*), so failures reproduce.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n.max(1)
        }
    }

    /// In-memory model of one endpoint: its flow state, staging ring, receive ring and mailbox.
    struct End {
        flow: Flow,
        staging: Vec<u8>,
        ring: Vec<u8>,
        mailbox: u64,
        /// Application byte stream to send / received so far.
        to_send: Vec<u8>,
        sent_off: usize,
        received: Vec<u8>,
    }

    enum Op {
        /// A data write from `from`: the NIC reads the sender's staging memory when it executes.
        Write { from: usize, post: DataPost },
        /// Receive completion at `to`.
        Arrive { to: usize, imm: u32, len: u32 },
        /// Send completion at `at`.
        SendDone { at: usize, wr_id: u64 },
    }

    struct Model {
        ends: [End; 2],
        ops: Vec<Op>,
        /// Credit writes in flight per destination: RC executes writes on one QP in order.
        credit_q: [VecDeque<(u64, u64)>; 2],
        rng: Rng,
        reorder: bool,
    }

    impl Model {
        fn new(cfg: FlowConfig, s0: u64, bytes: usize, seed: u64, reorder: bool) -> Model {
            let mut rng = Rng(seed | 1);
            let mk = |rng: &mut Rng| End {
                flow: Flow::with_initial_seq(cfg, s0),
                staging: vec![0; cfg.slots as usize * cfg.slot_bytes as usize],
                ring: vec![0; cfg.slots as usize * cfg.slot_bytes as usize],
                mailbox: s0,
                to_send: (0..bytes).map(|_| rng.next() as u8).collect(),
                sent_off: 0,
                received: Vec::new(),
            };
            let a = mk(&mut rng);
            let b = mk(&mut rng);
            let mut m = Model {
                ends: [a, b],
                ops: Vec::new(),
                credit_q: [VecDeque::new(), VecDeque::new()],
                rng,
                reorder,
            };
            for e in &mut m.ends {
                let n = e.flow.recv_to_post();
                e.flow.on_recv_posted(n);
            }
            m
        }

        /// The application on `i` sends what it can (as `try_send` would).
        fn app_send(&mut self, i: usize) -> usize {
            let mut moved = 0;
            loop {
                let e = &mut self.ends[i];
                e.flow.on_credit(e.mailbox).unwrap();
                if e.sent_off == e.to_send.len() || !e.flow.can_send() {
                    return moved;
                }
                let want = (e.to_send.len() - e.sent_off)
                    .min(e.flow.config().slot_bytes as usize)
                    .min(1 + self.rng.below(e.flow.config().slot_bytes as u64) as usize);
                let post = e.flow.post_data(want).unwrap();
                e.staging[post.local_off..post.local_off + want]
                    .copy_from_slice(&e.to_send[e.sent_off..e.sent_off + want]);
                e.sent_off += want;
                moved += want;
                self.ops.push(Op::Write { from: i, post });
            }
        }

        /// The application on `i` reads up to `max` bytes (as `try_recv` would), then reports.
        fn app_recv(&mut self, i: usize, max: usize) -> usize {
            let mut moved = 0;
            let e = &mut self.ends[i];
            while moved < max {
                let Some((off, n)) = e.flow.readable() else {
                    break;
                };
                let n = n.min(max - moved);
                e.received.extend_from_slice(&e.ring[off..off + n]);
                // The slot may be overwritten as soon as its credit is reported: scribble over
                // it in the model once consumed, to catch any read-after-release.
                if e.flow.consume(n).unwrap() {
                    let cfg = e.flow.config();
                    let slot = off / cfg.slot_bytes as usize * cfg.slot_bytes as usize;
                    e.ring[slot..slot + cfg.slot_bytes as usize].fill(0xEE);
                }
                moved += n;
            }
            let idle = e.flow.readable().is_none();
            if let Some(v) = e.flow.credit_due(idle) {
                e.flow.on_credit_posted(v);
                self.credit_q[1 - i].push_back((v, WrKind::Credit.encode()));
            }
            moved
        }

        /// The NIC executes one pending operation (any of them when reordering).
        fn nic_step(&mut self) -> bool {
            // credit writes: in order per destination, interleaved randomly with the rest
            for to in 0..2 {
                if !self.credit_q[to].is_empty() && self.rng.below(3) == 0 {
                    let (v, wr) = self.credit_q[to].pop_front().unwrap();
                    self.ends[to].mailbox = v;
                    self.ops.push(Op::SendDone {
                        at: 1 - to,
                        wr_id: wr,
                    });
                    return true;
                }
            }
            if self.ops.is_empty() {
                for to in 0..2 {
                    if let Some((v, wr)) = self.credit_q[to].pop_front() {
                        self.ends[to].mailbox = v;
                        self.ops.push(Op::SendDone {
                            at: 1 - to,
                            wr_id: wr,
                        });
                        return true;
                    }
                }
                return false;
            }
            let k = if self.reorder {
                self.rng.below(self.ops.len() as u64) as usize
            } else {
                0
            };
            match self.ops.remove(k) {
                Op::Write { from, post } => {
                    let to = 1 - from;
                    let (l, r) = (post.local_off, post.remote_off);
                    let n = post.len as usize;
                    let data = self.ends[from].staging[l..l + n].to_vec();
                    self.ends[to].ring[r..r + n].copy_from_slice(&data);
                    self.ops.push(Op::Arrive {
                        to,
                        imm: post.imm,
                        len: post.len,
                    });
                    self.ops.push(Op::SendDone {
                        at: from,
                        wr_id: post.wr_id,
                    });
                }
                Op::Arrive { to, imm, len } => {
                    let f = &mut self.ends[to].flow;
                    f.on_arrival(imm, len).unwrap();
                    let n = f.recv_to_post();
                    f.on_recv_posted(n);
                }
                Op::SendDone { at, wr_id } => {
                    self.ends[at].flow.on_send_completion(wr_id).unwrap();
                }
            }
            true
        }

        fn done(&self) -> bool {
            self.ends
                .iter()
                .enumerate()
                .all(|(i, _)| self.ends[1 - i].received.len() == self.ends[i].to_send.len())
        }

        fn check(&self) {
            for i in 0..2 {
                let f = &self.ends[i].flow;
                assert!(f.sq_inflight() <= f.config().sq_depth, "SQ overflow");
                let got = &self.ends[1 - i].received;
                assert_eq!(
                    &self.ends[i].to_send[..got.len()],
                    &got[..],
                    "byte stream {i} -> {} corrupted",
                    1 - i
                );
            }
        }

        fn run(&mut self, max_steps: usize) {
            let mut steps = 0;
            while !self.done() {
                steps += 1;
                assert!(
                    steps < max_steps,
                    "no progress after {max_steps} steps (deadlock?)"
                );
                match self.rng.below(4) {
                    0 => {
                        let i = self.rng.below(2) as usize;
                        self.app_send(i);
                    }
                    1 => {
                        let i = self.rng.below(2) as usize;
                        let max = 1 + self.rng.below(3000) as usize;
                        self.app_recv(i, max);
                    }
                    _ => {
                        if !self.nic_step() {
                            // nothing in flight: the applications must move
                            self.app_send(0);
                            self.app_send(1);
                            self.app_recv(0, usize::MAX);
                            self.app_recv(1, usize::MAX);
                        }
                    }
                }
                self.check();
            }
            // drain: every completion arrives, nothing is left outstanding
            while self.nic_step() {}
            for e in &self.ends {
                assert_eq!(e.flow.sends_pending(), 0);
                assert_eq!(e.flow.sq_inflight(), 0);
            }
        }
    }

    fn cfg(slots: u32, slot_bytes: u32, sq: u32) -> FlowConfig {
        FlowConfig::new(slots, slot_bytes, sq).unwrap()
    }

    #[test]
    fn random_bidirectional_streams_in_order_nic() {
        for seed in 1..20 {
            let mut m = Model::new(cfg(4, 1024, 6), 0, 50_000, seed, false);
            m.run(2_000_000);
        }
    }

    #[test]
    fn random_bidirectional_streams_reordering_nic() {
        for seed in 1..20 {
            let mut m = Model::new(cfg(8, 512, 5), 0, 40_000, seed * 7919, true);
            m.run(2_000_000);
        }
    }

    #[test]
    fn immediate_wraparound() {
        // start just below 2^32 so the 32-bit immediates wrap mid-stream
        let s0 = (1u64 << 32) - 9;
        for seed in 1..10 {
            let mut m = Model::new(cfg(4, 64, 4), s0, 4_000, seed, true);
            m.run(2_000_000);
            assert!(m.ends[0].flow.consumed() > 1 << 32, "crossed the boundary");
        }
    }

    #[test]
    fn credit_exhaustion_blocks_then_resumes() {
        let c = cfg(4, 16, 64);
        let mut tx = Flow::new(c);
        let mut rx = Flow::new(c);
        let mut posts = Vec::new();
        for _ in 0..4 {
            assert!(tx.can_send());
            posts.push(tx.post_data(16).unwrap());
        }
        assert_eq!(tx.credits(), 0);
        assert_eq!(
            tx.send_blocker(),
            Some("no credits (the peer has not consumed earlier messages)")
        );
        assert!(
            tx.post_data(1).is_err(),
            "posting without credit is refused"
        );
        for p in &posts {
            tx.on_send_completion(p.wr_id).unwrap();
            rx.on_arrival(p.imm, p.len).unwrap();
        }
        // completions alone give no credit: the receiver has not consumed anything
        assert!(!tx.can_send());
        assert_eq!(rx.credit_due(true), None, "nothing consumed yet");
        assert!(rx.consume(16).unwrap());
        assert_eq!(
            rx.credit_due(false),
            Some(1),
            "4 slots: report after every message"
        );
        let v = rx.credit_due(true).expect("idle receiver reports");
        assert_eq!(v, 1);
        rx.on_credit_posted(v);
        assert_eq!(rx.credit_due(true), None, "reported");
        tx.on_credit(v).unwrap();
        assert_eq!(tx.credits(), 1);
        let p = tx.post_data(3).unwrap();
        assert_eq!(p.slot, 0, "slot 0 reused after wrap of the ring");
        assert_eq!(p.seq, 4);
    }

    #[test]
    fn credit_reports_are_batched_unless_idle() {
        let c = cfg(8, 4, 64);
        assert_eq!(c.report_every, 2);
        let mut rx = Flow::new(c);
        for i in 0..3 {
            rx.on_arrival(i, 4).unwrap();
        }
        rx.consume(4).unwrap();
        assert_eq!(rx.credit_due(false), None, "1 of 2, more to read: not due");
        assert_eq!(rx.credit_due(true), Some(1), "idle: due at once");
        rx.consume(4).unwrap();
        assert_eq!(rx.credit_due(false), Some(2), "2 of 2: due");
        rx.on_credit_posted(2);
        rx.consume(4).unwrap();
        assert_eq!(rx.credit_due(false), None);
        assert_eq!(rx.credit_due(true), Some(3));
    }

    #[test]
    fn staging_slot_waits_for_its_completion() {
        let c = cfg(2, 8, 16);
        let mut tx = Flow::new(c);
        let a = tx.post_data(8).unwrap();
        let b = tx.post_data(8).unwrap();
        tx.on_credit(2).unwrap(); // peer consumed both (credits back) ...
        assert_eq!(tx.send_blocker(), Some("staging slot still in flight"));
        // ... but slot 0 is reusable only after a's completion; b completing first is not enough
        tx.on_send_completion(b.wr_id).unwrap();
        assert!(!tx.can_send());
        tx.on_send_completion(a.wr_id).unwrap();
        assert!(tx.can_send());
        assert_eq!(tx.sends_pending(), 0);
    }

    #[test]
    fn send_queue_keeps_room_for_credit_reports() {
        let c = cfg(16, 8, 3);
        let mut f = Flow::new(c);
        f.post_data(1).unwrap();
        f.post_data(1).unwrap();
        assert_eq!(f.send_blocker(), Some("send queue full"));
        // the receiving direction can still report credit with the reserved entry
        f.on_arrival(0, 4).unwrap();
        f.consume(4).unwrap();
        assert_eq!(f.credit_due(true), Some(1));
        f.on_credit_posted(1);
        f.on_arrival(1, 4).unwrap();
        f.consume(4).unwrap();
        assert_eq!(f.credit_due(true), None, "SQ now full");
    }

    #[test]
    fn out_of_order_arrivals_are_handed_out_in_order() {
        let c = cfg(4, 8, 8);
        let mut rx = Flow::new(c);
        rx.on_arrival(2, 3).unwrap();
        rx.on_arrival(1, 2).unwrap();
        assert_eq!(rx.readable(), None, "message 0 not here yet");
        rx.on_arrival(0, 1).unwrap();
        assert_eq!(rx.readable(), Some((0, 1)));
        assert!(rx.consume(1).unwrap());
        assert_eq!(rx.readable(), Some((8, 2)));
        assert!(!rx.consume(1).unwrap(), "partial read");
        assert_eq!(rx.readable(), Some((9, 1)));
        assert!(rx.consume(1).unwrap());
        assert_eq!(rx.readable(), Some((16, 3)));
    }

    #[test]
    fn protocol_violations_are_errors() {
        let c = cfg(4, 8, 8);
        let mut rx = Flow::new(c);
        assert!(matches!(
            rx.on_arrival(4, 1),
            Err(FlowError::Overrun { .. })
        ));
        rx.on_arrival(1, 1).unwrap();
        assert_eq!(rx.on_arrival(1, 1), Err(FlowError::Duplicate { seq: 1 }));
        assert!(rx.on_arrival(2, 0).is_err(), "zero length");
        assert!(rx.on_arrival(2, 9).is_err(), "longer than a slot");
        assert!(rx.consume(1).is_err(), "message 0 is not readable");

        let mut tx = Flow::new(c);
        assert!(tx.on_credit(1).is_err(), "credit for unsent messages");
        assert!(tx
            .on_send_completion(WrKind::Data { seq: 0 }.encode())
            .is_err());
        let p = tx.post_data(1).unwrap();
        assert!(tx
            .on_send_completion(WrKind::Data { seq: 5 }.encode())
            .is_err());
        tx.on_send_completion(p.wr_id).unwrap();
        assert!(tx.on_send_completion(p.wr_id).is_err(), "completed twice");
        assert!(tx.post_data(0).is_err());
        assert!(tx.post_data(9).is_err());
        // stale credit is ignored, not an error
        tx.on_credit(1).unwrap();
        tx.on_credit(0).unwrap();
        assert_eq!(tx.credits(), 4);
    }

    #[test]
    fn wr_ids_round_trip() {
        for k in [
            WrKind::Data { seq: 0 },
            WrKind::Data { seq: (1 << 40) + 3 },
            WrKind::Credit,
            WrKind::Recv,
        ] {
            assert_eq!(WrKind::decode(k.encode()), Some(k));
        }
        assert_eq!(WrKind::decode(3), None);
    }

    #[test]
    fn config_is_checked() {
        assert!(FlowConfig::new(1, 8, 4).is_err());
        assert!(FlowConfig::new(4, 0, 4).is_err());
        assert!(FlowConfig::new(4, 8, 1).is_err());
        assert_eq!(FlowConfig::new(64, 8, 4).unwrap().report_every, 16);
        assert_eq!(FlowConfig::new(2, 8, 4).unwrap().report_every, 1);
    }
}

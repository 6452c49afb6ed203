//! The executor's point-to-point engine: one exchange — send a region to one peer and receive a
//! region from another, concurrently, from one thread, over non-blocking links — in named
//! parts: resolving the links, the snapshot of a send region the receive overwrites, the
//! staging area, the sending half ([`Sender`]), the receiving half (descriptor check, data
//! straight into place or reduced chunk by chunk), and the wait when neither half can move —
//! and a group of independent exchanges driven the same way at once ([`Executor::group_len`],
//! [`Executor::exchange_group`]).
//!
//! This is the hot path: each half's progress moves bytes with one link call per attempt and no
//! allocation; a small send's combined write reuses a buffer of the thread's (`COMBINED`), and
//! the only allocations are per exchange (a send snapshot when regions overlap, a group's
//! halves) or per wait.

use super::{Bufs, CallDesc, Executor};
use crate::error::{Error, Result};
use crate::transport::failover::RETAIN_TAIL;
use crate::transport::{Backoff, Link, LinkError, MemKind, DESC};
use railring_collectives::plan::{Step, Xfer};
use railring_collectives::{kernels, CollKind, DataType, ReduceOp};
use std::time::Duration;

/// Most consecutive exchanges run as one group.
const GROUP_MAX: usize = 64;
/// Largest send a group takes. A grouped send may reach its peer before the peer's plan
/// gets to it; the peer's kernel buffers it, as an eager message. A larger one could fill the
/// connection, and this side's acknowledgements to that peer travel on the same connection
/// behind it: a peer waiting for one (its own large send to us) would wait forever.
const GROUP_SEND_MAX: usize = 16 << 10;

/// Largest send written together with its descriptor (one write, one packet on TCP).
const COMBINED_MAX: usize = 16 << 10;

thread_local! {
    /// Buffers for combined writes, kept between exchanges (a call allocates none).
    static COMBINED: std::cell::RefCell<Vec<Vec<u8>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The send and receive links of one step of a group.
pub(super) type GroupLinks = (Option<*mut dyn Link>, Option<*mut dyn Link>);

/// One direction of an exchange: `len` bytes at `ptr` to or from `peer` on channel `chan`.
/// `hdr`: the call's descriptor goes first (the first transfer with this peer and channel in
/// the call).
#[derive(Clone, Copy)]
pub(super) struct Transfer<P> {
    pub peer: usize,
    pub chan: usize,
    pub ptr: P,
    pub len: usize,
    pub hdr: bool,
}

impl Transfer<*mut u8> {
    /// The same transfer, for sending (read only).
    pub fn read_only(self) -> Transfer<*const u8> {
        Transfer {
            peer: self.peer,
            chan: self.chan,
            ptr: self.ptr,
            len: self.len,
            hdr: self.hdr,
        }
    }
}

/// One exchange: what to send and to receive (either may be absent), and how.
pub(super) struct ExchangeOp<'d> {
    pub send: Option<Transfer<*const u8>>,
    pub recv: Option<Transfer<*mut u8>>,
    /// Reduce received data into the receive region (`op` over `dtype`) rather than overwrite it.
    pub reduce: bool,
    /// The descriptor sent first (and named when the exchange times out)...
    pub send_desc: &'d [u8; DESC],
    /// ...and the one the sender must have sent.
    pub recv_desc: &'d [u8; DESC],
    pub dtype: DataType,
    pub op: ReduceOp,
}

/// The sending half of an exchange in progress.
struct Sender<'d> {
    link: *mut dyn Link,
    peer: usize,
    ptr: *const u8,
    len: usize,
    /// Bytes of [descriptor | data] handed to the link.
    pos: usize,
    /// Descriptor bytes that go first (`DESC`, or 0 when none is due).
    h: usize,
    /// The link's stream offset of this send's first byte (a link that moves rails rewinds
    /// to an offset the peer states; see [`Link::rewound`]).
    base: u64,
    desc: &'d [u8; DESC],
    /// A small send with its descriptor goes out as one write (one packet on TCP).
    combined: Option<Vec<u8>>,
    /// Everything written; the receiver's acknowledgement is awaited.
    waiting: bool,
    acked: u64,
    done: bool,
}

impl Drop for Sender<'_> {
    fn drop(&mut self) {
        if let Some(v) = self.combined.take() {
            COMBINED.with(|c| {
                let mut c = c.borrow_mut();
                // as many as one group's sends at most
                if c.len() < GROUP_MAX {
                    c.push(v);
                }
            });
        }
    }
}

impl<'d> Sender<'d> {
    /// # Safety
    /// `t.ptr` valid for reads of `t.len` bytes of kind `kind`; the link alive.
    unsafe fn new(
        t: Transfer<*const u8>,
        link: *mut dyn Link,
        desc: &'d [u8; DESC],
        kind: MemKind,
    ) -> Sender<'d> {
        let combined = match t {
            Transfer {
                ptr,
                len: n,
                hdr: true,
                ..
            } if n <= COMBINED_MAX && kind == MemKind::Host => {
                let mut v = COMBINED
                    .with(|c| c.borrow_mut().pop())
                    .unwrap_or_else(|| Vec::with_capacity(DESC + COMBINED_MAX));
                v.clear();
                v.extend_from_slice(desc);
                v.extend_from_slice(std::slice::from_raw_parts(ptr, n));
                Some(v)
            }
            _ => None,
        };
        Sender {
            link,
            peer: t.peer,
            ptr: t.ptr,
            len: t.len,
            pos: 0,
            h: if t.hdr { DESC } else { 0 },
            base: (*link).bytes_sent(),
            desc,
            combined,
            waiting: false,
            acked: 0,
            done: false,
        }
    }

    /// Push what the link takes now: the descriptor, then the data (memory of kind `kind`);
    /// once all is written, finish when the receiver has acknowledged it — or when the
    /// unacknowledged tail is short enough for the link to keep a copy. True when anything
    /// moved.
    ///
    /// # Safety
    /// The link outlives the exchange; the region as in [`Sender::new`].
    #[inline]
    unsafe fn pump(&mut self, kind: MemKind) -> std::result::Result<bool, LinkError> {
        let l = &mut *self.link;
        let total = self.h + self.len;
        let mut progress = false;
        if let Some(at) = l.rewound() {
            // the link moved rails and the peer had not taken everything: send again from there
            self.pos = match at.checked_sub(self.base) {
                Some(p) if p <= total as u64 => p as usize,
                _ => {
                    return Err(LinkError::Io(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!(
                            "{}: resend from byte {at}, outside this send ({}..{})",
                            l.describe(),
                            self.base,
                            self.base + total as u64
                        ),
                    )))
                }
            };
            self.waiting = false;
            progress = true;
        }
        while self.pos < total {
            let n = if let Some(c) = &self.combined {
                l.try_send(&c[self.pos..])?
            } else if self.pos < self.h {
                l.try_send(&self.desc[self.pos..self.h])?
            } else {
                l.try_send_mem(
                    self.ptr.wrapping_add(self.pos - self.h),
                    total - self.pos,
                    kind,
                )?
            };
            if n == 0 {
                break;
            }
            self.pos += n;
            progress = true;
        }
        if self.pos == total {
            let end = self.base + total as u64;
            // read acknowledgements only when a copy cannot stand in for them
            let mut acked = l.acked();
            if acked < end && (end - acked.max(self.base) > RETAIN_TAIL as u64 || self.waiting) {
                acked = l.poll_acks()?;
            }
            if acked != self.acked {
                progress |= self.waiting;
                self.acked = acked;
            }
            if acked >= end {
                self.done = true;
                return Ok(true);
            }
            let unacked = end - acked.max(self.base);
            if unacked <= RETAIN_TAIL as u64 && kind == MemKind::Host {
                let data: &[u8] = match &self.combined {
                    Some(c) => c,
                    None => std::slice::from_raw_parts(self.ptr, self.len),
                };
                let desc: &[u8] = match &self.combined {
                    Some(_) => &[],
                    None => &self.desc[..self.h],
                };
                if l.retain(self.base, &[desc, data]) {
                    self.done = true;
                    return Ok(true);
                }
            }
            self.waiting = true;
        }
        Ok(progress)
    }
}

/// The receiving half of an exchange in progress.
struct Receiver<'d> {
    link: *mut dyn Link,
    peer: usize,
    dst: *mut u8,
    len: usize,
    /// Data bytes in place (received, or received and reduced).
    off: usize,
    /// Descriptor bytes received (`DESC` when none is due), into `hdr_buf`.
    hdr: usize,
    hdr_buf: [u8; DESC],
    /// The descriptor the sender must have sent.
    expect: &'d [u8; DESC],
    /// Reducing: received data lands in `stage` first, `chunk` bytes at a time (`fill` so far
    /// of the current chunk), and each complete chunk is reduced into place.
    reduce: bool,
    stage: *mut u8,
    chunk: usize,
    fill: usize,
    /// Data bytes in place when the link was last asked to acknowledge.
    acked_at: usize,
    done: bool,
}

impl<'d> Receiver<'d> {
    fn new(
        t: Transfer<*mut u8>,
        link: *mut dyn Link,
        expect: &'d [u8; DESC],
        reduce: bool,
        stage: *mut u8,
        chunk: usize,
    ) -> Receiver<'d> {
        Receiver {
            link,
            peer: t.peer,
            dst: t.ptr,
            len: t.len,
            off: 0,
            hdr: if t.hdr { 0 } else { DESC },
            hdr_buf: [0u8; DESC],
            expect,
            reduce,
            stage,
            chunk,
            fill: 0,
            acked_at: 0,
            done: false,
        }
    }
}

impl<'a> Executor<'a> {
    /// Send and receive concurrently (either may be absent): progress both halves until
    /// neither moves, then wait for the links; fail on a descriptor mismatch, a dead peer or
    /// the timeout.
    ///
    /// # Safety
    /// The regions must be valid for their lengths (reads to send, writes to receive).
    pub(super) unsafe fn exchange(&mut self, x: ExchangeOp<'_>) -> Result<()> {
        let sl = match x.send {
            Some(t) => Some(self.links.link(t.peer, t.chan)?),
            None => None,
        };
        let rl = match x.recv {
            Some(t) => Some(self.links.link(t.peer, t.chan)?),
            None => None,
        };
        let esz = x.dtype.size();
        // Where the data is: host memory, or (GPUDirect) memory only the links and `self.mem`
        // touch. Descriptors are always host memory.
        let kind = self.mem.as_ref().map(|m| m.kind()).unwrap_or(MemKind::Host);
        if kind != MemKind::Host {
            for (l, peer) in [(sl, x.send.map(|s| s.peer)), (rl, x.recv.map(|r| r.peer))] {
                if let (Some(l), Some(peer)) = (l, peer) {
                    if !(*l).supports(kind) {
                        return Err(Error::Plan(format!(
                            "the link to rank {peer} ({}) cannot move {kind:?} memory",
                            (*l).describe()
                        )));
                    }
                }
            }
        }
        let mut snapshot: Vec<u64> = Vec::new();
        let send = unaliased_send(x.send, x.recv, kind, &mut snapshot)?;
        let chunk = (self.chunk / esz).max(1) * esz;
        let stage = self.stage(x.reduce && x.recv.is_some(), chunk)?;
        let mut tx = match (send, sl) {
            (Some(t), Some(l)) => Some(Sender::new(t, l, x.send_desc, kind)),
            _ => None,
        };
        let mut rx = match (x.recv, rl) {
            (Some(t), Some(l)) => Some(Receiver::new(t, l, x.recv_desc, x.reduce, stage, chunk)),
            _ => None,
        };
        self.drive(
            tx.as_mut_slice(),
            rx.as_mut_slice(),
            kind,
            x.dtype,
            x.op,
            x.send_desc,
        )
    }

    /// Several independent exchanges at once (see [`Executor::group_len`]): every send and
    /// every receive progresses together, as the peers post theirs — the steps of a pairwise
    /// all-to-all or a tree's sends to its children cost one round of latency instead of one
    /// each. Host memory, no reduction, every link distinct per direction, no region written
    /// that another reads or writes.
    ///
    /// # Safety
    /// The regions valid for their lengths; the links alive.
    pub(super) unsafe fn exchange_group(
        &mut self,
        sends: &[(Transfer<*const u8>, *mut (dyn Link + 'static))],
        recvs: &[(Transfer<*mut u8>, *mut (dyn Link + 'static))],
        desc: &[u8; DESC],
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        let kind = MemKind::Host;
        let chunk = (self.chunk / dtype.size()).max(1) * dtype.size();
        let mut tx: Vec<Sender<'_>> = sends
            .iter()
            .map(|&(t, l)| Sender::new(t, l, desc, kind))
            .collect();
        let mut rx: Vec<Receiver<'_>> = recvs
            .iter()
            .map(|&(t, l)| Receiver::new(t, l, desc, false, std::ptr::null_mut(), chunk))
            .collect();
        self.drive(&mut tx, &mut rx, kind, dtype, op, desc)
    }

    /// How many of `steps` (the current one first) run as one group through
    /// [`Self::exchange_group`]; below 2, the current one runs alone. A step joins while it is a
    /// host-memory exchange without reduction, it sends at most [`GROUP_SEND_MAX`] bytes and
    /// nothing the group receives into, it receives into nothing the group reads or writes, and
    /// its links take early sends ([`Link::early_sends`]: TCP, shared memory) and differ from
    /// the group's in the same direction. Links of later steps must exist already (connecting
    /// out of plan order could wait on a peer that waits on us). `links` gets each grouped
    /// step's two links.
    ///
    /// Running them together lets transfers start earlier than one step at a time would (each
    /// link still carries its transfers in plan order): receives early cost nothing, and sends
    /// early are small enough for the peer's kernel to hold until its plan takes them, so a
    /// plan that completes step by step completes grouped.
    ///
    /// # Safety
    /// The links alive; the regions inside `bufs` (checked).
    pub(super) unsafe fn group_len(
        &mut self,
        steps: &[Step],
        bufs: &Bufs,
        esz: usize,
        links: &mut Vec<GroupLinks>,
    ) -> Result<usize> {
        let plain = |s: &Step| matches!(s, Step::Exchange { reduce: false, .. });
        if self.mem.is_some() || steps.len() < 2 || !plain(&steps[0]) || !plain(&steps[1]) {
            return Ok(0);
        }
        let span = |x: &Option<Xfer>| -> Result<Option<(usize, usize)>> {
            match x {
                Some(x) if x.region.len > 0 => {
                    let (p, n) = bufs.region(&x.region, esz)?;
                    Ok(Some((p as usize, p as usize + n)))
                }
                _ => Ok(None),
            }
        };
        let meet = |a: (usize, usize), b: &(usize, usize)| a.0 < b.1 && b.0 < a.1;
        // whether a step sending `s` and receiving `r` may join a group that receives into
        // `written` and sends from `read`
        let joins = |s: Option<(usize, usize)>,
                     r: Option<(usize, usize)>,
                     written: &[(usize, usize)],
                     read: &[(usize, usize)]| {
            !(s.is_some_and(|s| s.1 - s.0 > GROUP_SEND_MAX || written.iter().any(|w| meet(s, w)))
                || r.is_some_and(|r| {
                    written.iter().chain(read).any(|w| meet(r, w)) || s.is_some_and(|s| meet(r, &s))
                }))
        };
        // the common case of dependent steps (rings, chains) ends here, with nothing allocated
        // and no link looked up twice
        let spans = |step: &Step| match step {
            Step::Exchange { send, recv, .. } => Ok::<_, Error>((span(send)?, span(recv)?)),
            _ => Ok((None, None)),
        };
        let ((s0, r0), (s1, r1)) = (spans(&steps[0])?, spans(&steps[1])?);
        if !joins(s0, r0, &[], &[]) || !joins(s1, r1, r0.as_slice(), s0.as_slice()) {
            return Ok(0);
        }
        let mut written: Vec<(usize, usize)> = Vec::new();
        let mut read: Vec<(usize, usize)> = Vec::new();
        for (k, step) in steps.iter().take(GROUP_MAX).enumerate() {
            let Step::Exchange {
                send,
                recv,
                reduce: false,
            } = step
            else {
                break;
            };
            let (s, r) = (span(send)?, span(recv)?);
            if !joins(s, r, &written, &read) {
                break;
            }
            let mut link = |x: &Option<Xfer>, on: bool| -> Result<Option<Option<*mut dyn Link>>> {
                let Some(x) = x.as_ref().filter(|_| on) else {
                    return Ok(Some(None));
                };
                let l = if k == 0 {
                    self.links.link(x.peer, x.chan)?
                } else {
                    match self.links.existing(x.peer, x.chan) {
                        Some(l) => l,
                        None => return Ok(None),
                    }
                };
                Ok((*l).early_sends().then_some(Some(l)))
            };
            let (Some(sl), Some(rl)) = (link(send, s.is_some())?, link(recv, r.is_some())?) else {
                break;
            };
            let taken = |l: Option<*mut dyn Link>,
                         dir: fn(&GroupLinks) -> Option<*mut dyn Link>| {
                l.is_some_and(|l| {
                    links
                        .iter()
                        .filter_map(dir)
                        .any(|m| std::ptr::addr_eq(m, l))
                })
            };
            if taken(sl, |g| g.0) || taken(rl, |g| g.1) {
                break;
            }
            links.push((sl, rl));
            written.extend(r);
            read.extend(s);
        }
        Ok(links.len())
    }

    /// Progress every half until none moves, then wait for the links; done when all are.
    ///
    /// # Safety
    /// As [`Self::exchange`].
    unsafe fn drive(
        &mut self,
        tx: &mut [Sender<'_>],
        rx: &mut [Receiver<'_>],
        kind: MemKind,
        dtype: DataType,
        op: ReduceOp,
        what: &[u8; DESC],
    ) -> Result<()> {
        // a rank that only receives in a broadcast or a reduce holds no one up (Backoff::leaf)
        let rooted = matches!(
            CallDesc::kind_of(what),
            Some(CollKind::Broadcast | CollKind::Reduce)
        );
        let mut b = if tx.is_empty() && rooted {
            Backoff::leaf()
        } else {
            Backoff::new()
        };
        loop {
            let mut progress = false;
            for s in tx.iter_mut().filter(|s| !s.done) {
                progress |= s.pump(kind).map_err(|e| self.link_err(s.peer, e))?;
            }
            for r in rx.iter_mut().filter(|r| !r.done) {
                progress |= self.pump_recv(r, kind, dtype, op)?;
            }
            if progress {
                b.reset();
                continue;
            }
            if tx.iter().all(|s| s.done) && rx.iter().all(|r| r.done) {
                return Ok(());
            }
            self.wait(tx, rx, &mut b, what)?;
        }
    }

    /// The staging area received chunks land in before they are reduced (`chunk` bytes when
    /// `needed`): the [`crate::transport::DataMem`]'s, or the executor's host buffer, grown
    /// when short. Kept across calls.
    fn stage(&mut self, needed: bool, chunk: usize) -> Result<*mut u8> {
        Ok(match &mut self.mem {
            Some(m) if needed => m.stage(chunk)?,
            Some(_) => std::ptr::null_mut(),
            None => {
                if needed && self.staging.len() * 8 < chunk {
                    self.staging.resize(chunk.div_ceil(8), 0);
                }
                self.staging.as_mut_ptr() as *mut u8
            }
        })
    }

    /// Take what the link has now: the descriptor first (a mismatch fails the call naming
    /// both), then the data — straight into place, or through the staging area with each
    /// complete chunk reduced into place. True when anything moved.
    ///
    /// # Safety
    /// As [`Self::exchange`]; the staging area holds `r.chunk` bytes when reducing.
    #[inline]
    unsafe fn pump_recv(
        &mut self,
        r: &mut Receiver<'_>,
        kind: MemKind,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<bool> {
        let l = &mut *r.link;
        let peer = r.peer;
        let mut progress = false;
        loop {
            let n = if r.hdr < DESC {
                let n = l
                    .try_recv(&mut r.hdr_buf[r.hdr..])
                    .map_err(|e| self.link_err(peer, e))?;
                r.hdr += n;
                if r.hdr == DESC && &r.hdr_buf != r.expect {
                    return Err(Error::Mismatch {
                        rank: self.rank,
                        peer,
                        mine: CallDesc::describe_bytes(r.expect),
                        theirs: CallDesc::describe_bytes(&r.hdr_buf),
                    });
                }
                n
            } else if !r.reduce {
                let n = l
                    .try_recv_mem(r.dst.wrapping_add(r.off), r.len - r.off, kind)
                    .map_err(|e| self.link_err(peer, e))?;
                r.off += n;
                if r.off - r.acked_at >= r.chunk && r.off < r.len {
                    r.acked_at = r.off;
                    l.ack(true).map_err(|e| self.link_err(peer, e))?;
                }
                n
            } else {
                let want = r.chunk.min(r.len - r.off);
                let n = l
                    .try_recv_mem(r.stage.wrapping_add(r.fill), want - r.fill, kind)
                    .map_err(|e| self.link_err(peer, e))?;
                r.fill += n;
                if r.fill == want {
                    match &mut self.mem {
                        Some(m) => {
                            m.reduce_into(dtype, op, r.dst.wrapping_add(r.off), r.stage, want)?
                        }
                        None => {
                            kernels::reduce_into_raw(dtype, op, r.dst.add(r.off), r.stage, want)
                        }
                    }
                    r.off += want;
                    r.fill = 0;
                    if r.off < r.len {
                        // what is reduced cannot be lost: the sender may forget it
                        r.acked_at = r.off;
                        l.ack(true).map_err(|e| self.link_err(peer, e))?;
                    }
                }
                n
            };
            if n == 0 {
                break;
            }
            progress = true;
            if r.hdr == DESC && r.off == r.len {
                r.done = true;
                r.acked_at = r.off;
                // a sender of more than it may keep a copy of waits for this
                let urgent = r.len + DESC > RETAIN_TAIL;
                l.ack(urgent).map_err(|e| self.link_err(peer, e))?;
                break;
            }
        }
        Ok(progress)
    }

    /// Nothing moved: wait for the links ([`idle`]), then — now and then, and after
    /// every poll — check the peers and the timeout ([`Self::check_stall`]).
    ///
    /// # Safety
    /// The halves' links are alive.
    unsafe fn wait(
        &mut self,
        tx: &[Sender<'_>],
        rx: &[Receiver<'_>],
        b: &mut Backoff,
        what: &[u8; DESC],
    ) -> Result<()> {
        let fds = pending_fds(tx, rx);
        let need = tx.iter().filter(|s| !s.done).count() + rx.iter().filter(|r| !r.done).count();
        idle(tx, rx, &fds, need, b);
        if b.check_due() || fds.len() == need {
            self.check_stall(tx, rx, b, what)?;
            // links outside this exchange may owe a peer a resend or an answer to its move
            self.links.service()?;
        }
        Ok(())
    }

    /// Fail if a pending half's peer is gone, or if nothing moved for the timeout (naming the
    /// call `what` and the peers waited for).
    ///
    /// # Safety
    /// The halves' links are alive.
    unsafe fn check_stall(
        &self,
        tx: &[Sender<'_>],
        rx: &[Receiver<'_>],
        b: &Backoff,
        what: &[u8; DESC],
    ) -> Result<()> {
        let pending = || {
            tx.iter()
                .filter(|s| !s.done)
                .map(|s| (s.link, s.peer))
                .chain(rx.iter().filter(|r| !r.done).map(|r| (r.link, r.peer)))
        };
        for (k, (l, peer)) in pending().enumerate() {
            // each link once (a send and a receive may share one)
            if !pending().take(k).any(|(m, _)| std::ptr::addr_eq(m, l)) {
                (*l).heal(true).map_err(|e| self.link_err(peer, e))?;
            }
        }
        if b.waited() > self.timeout {
            let mut waiting = Vec::new();
            for (_, peer) in pending() {
                if !waiting.contains(&peer) {
                    waiting.push(peer);
                }
            }
            return Err(Error::Timeout {
                rank: self.rank,
                secs: self.timeout.as_secs(),
                waiting,
                what: CallDesc::describe_bytes(what),
            });
        }
        Ok(())
    }
}

/// Wait once. When every pending half has a file descriptor (`fds`, `need` halves pending)
/// they are polled (the kernel wakes us); a shared-memory link parks on its node's bell (only
/// when it is the one link waited on: the bell's check looks at one link);
/// otherwise back off (spin, yield, sleep).
///
/// # Safety
/// The halves' links are alive.
unsafe fn idle(
    tx: &[Sender<'_>],
    rx: &[Receiver<'_>],
    fds: &[(i32, i16)],
    need: usize,
    b: &mut Backoff,
) {
    // a drowsy leaf polls at once, and sleeps rather than park on a bell its producer would
    // ring for every message (Backoff::leaf)
    let drowsy = b.drowsy();
    if fds.len() == need && (drowsy || b.waited() > Duration::from_micros(50)) {
        let mut p: Vec<libc::pollfd> = fds
            .iter()
            .map(|&(fd, ev)| libc::pollfd {
                fd,
                events: ev,
                revents: 0,
            })
            .collect();
        libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, 100);
    } else if !drowsy && b.waited() > Duration::from_micros(20) && tx.len() <= 1 && rx.len() <= 1 {
        // A shared-memory link sleeps on its node's bell (woken by the peer's next
        // store); with a TCP link also pending, only briefly, then poll again.
        let (s_done, r_done) = (tx.iter().all(|s| s.done), rx.iter().all(|r| r.done));
        let (sl, rl) = (tx.first().map(|s| s.link), rx.first().map(|r| r.link));
        let short = if fds.is_empty() {
            Duration::from_millis(5)
        } else {
            Duration::from_micros(200)
        };
        let parked = match (s_done, r_done) {
            (false, _) if sl.is_some_and(|l| (*l).poll_fd().is_none()) => {
                sl.is_some_and(|l| (*l).park(true, !r_done && rl == sl, short))
            }
            (_, false) if rl.is_some_and(|l| (*l).poll_fd().is_none()) => {
                rl.is_some_and(|l| (*l).park(false, true, short))
            }
            _ => false,
        };
        if !parked {
            b.snooze();
        }
    } else {
        b.snooze();
    }
}

/// The file descriptors to poll for the pending halves (send: writable, receive: readable),
/// for links that have one.
///
/// # Safety
/// The halves' links are alive.
unsafe fn pending_fds(tx: &[Sender<'_>], rx: &[Receiver<'_>]) -> Vec<(i32, i16)> {
    tx.iter()
        .filter(|s| !s.done)
        .filter_map(|s| (*s.link).poll_events(true))
        .chain(
            rx.iter()
                .filter(|r| !r.done)
                .filter_map(|r| (*r.link).poll_events(false)),
        )
        .collect()
}

/// A send region that overlaps the receive region (recursive doubling exchanges whole
/// buffers) must not see received bytes: send from a snapshot, kept in `keep`. Device memory
/// cannot be snapshot here: overlapping regions on it are refused.
///
/// # Safety
/// The send region valid for reads.
unsafe fn unaliased_send(
    send: Option<Transfer<*const u8>>,
    recv: Option<Transfer<*mut u8>>,
    kind: MemKind,
    keep: &mut Vec<u64>,
) -> Result<Option<Transfer<*const u8>>> {
    match (send, recv) {
        (Some(s), Some(r))
            if (s.ptr as usize) < r.ptr as usize + r.len
                && (r.ptr as usize) < s.ptr as usize + s.len =>
        {
            if kind != MemKind::Host {
                return Err(Error::Plan(format!(
                    "overlapping send and receive regions on {kind:?} memory"
                )));
            }
            keep.resize(s.len.div_ceil(8), 0);
            std::ptr::copy_nonoverlapping(s.ptr, keep.as_mut_ptr() as *mut u8, s.len);
            Ok(Some(Transfer {
                ptr: keep.as_ptr() as *const u8,
                ..s
            }))
        }
        _ => Ok(send),
    }
}

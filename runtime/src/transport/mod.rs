//! Transports. A [`Link`] moves bytes to and from one peer, without blocking: the executor
//! drives many links at once (send to the next rank while receiving from the previous one) and
//! waits with [`Backoff`] or `poll(2)` when none can progress.
//!
//! The trait is written for more than host memory: every transfer names the memory it touches
//! ([`MemKind`]) so a CUDA IPC / NVLink link can accept device pointers and an ibverbs link can
//! require (and cache) registrations through [`Link::register`]. Host-only links (shm, tcp)
//! answer `supports(MemKind::Device{..}) == false` and the executor stages through host memory.
//!
//! In-node collectives do not go through links: a [`NodeFabric`] (the shared-memory
//! [`shm::ShmFabric`]) reads peers' data directly (each rank reduces its own slice), which is the
//! point of the two-level algorithm.

#[cfg(feature = "cuda")]
pub mod cuda;
mod fabric;
pub mod failover;
pub mod links;
pub mod pipe;
pub mod rails;
#[cfg(feature = "rdma")]
pub mod rdma;
pub mod shm;
pub mod tcp;

pub use fabric::{NodeFabric, NodeMode, NodeOp, DESC};
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

/// Which link: the communicator, this rank, the peer and the channel — the identity both ends
/// of a link agree on (TCP hellos and RDMA connection records carry it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkId {
    pub comm: u64,
    pub me: usize,
    pub peer: usize,
    pub chan: usize,
}

/// What kind of memory a transfer touches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemKind {
    Host,
    /// Device memory of the given CUDA ordinal (the `cuda` transport).
    Device {
        ordinal: i32,
    },
}

/// A registration handle a link may need before it can move a buffer (ibverbs MR keys).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Registration {
    pub key: u64,
}

/// Why a link operation failed.
#[derive(Debug)]
pub enum LinkError {
    /// The peer closed or reset the connection, or its process is gone.
    PeerGone(String),
    Io(std::io::Error),
}

impl std::fmt::Display for LinkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LinkError::PeerGone(s) => write!(f, "{s}"),
            LinkError::Io(e) => write!(f, "{e}"),
        }
    }
}

/// A connection to one peer.
pub trait Link: Send {
    /// Human description for logs and errors ("tcp rail1 10.77.11.11 -> 10.77.11.12").
    fn describe(&self) -> String;
    /// Queue as many bytes of `data` as possible without blocking; returns how many were taken.
    fn try_send(&mut self, data: &[u8]) -> Result<usize, LinkError>;
    /// Receive up to `buf.len()` bytes without blocking; 0 means nothing available now.
    fn try_recv(&mut self, buf: &mut [u8]) -> Result<usize, LinkError>;
    /// A file descriptor to `poll` on while waiting, if the link has one.
    fn poll_fd(&self) -> Option<RawFd> {
        None
    }
    /// The descriptor to poll while waiting to send (`send`) or to receive: a link striped over
    /// several connections waits on the one its next bytes go to or come from.
    fn poll_fd_for(&self, _send: bool) -> Option<RawFd> {
        self.poll_fd()
    }
    /// Whether the link can move memory of this kind directly.
    fn supports(&self, mem: MemKind) -> bool {
        mem == MemKind::Host
    }
    /// [`Link::try_send`] from memory of kind `mem` (device memory on a GPUDirect link). Links
    /// that only move host memory refuse other kinds.
    ///
    /// # Safety
    /// `ptr` valid for reads of `n` bytes of kind `mem`.
    unsafe fn try_send_mem(
        &mut self,
        ptr: *const u8,
        n: usize,
        mem: MemKind,
    ) -> Result<usize, LinkError> {
        match mem {
            MemKind::Host => self.try_send(std::slice::from_raw_parts(ptr, n)),
            _ => Err(host_only(&self.describe(), mem)),
        }
    }
    /// [`Link::try_recv`] into memory of kind `mem`.
    ///
    /// # Safety
    /// `ptr` valid for writes of `n` bytes of kind `mem`.
    unsafe fn try_recv_mem(
        &mut self,
        ptr: *mut u8,
        n: usize,
        mem: MemKind,
    ) -> Result<usize, LinkError> {
        match mem {
            MemKind::Host => self.try_recv(std::slice::from_raw_parts_mut(ptr, n)),
            _ => Err(host_only(&self.describe(), mem)),
        }
    }
    /// Register a buffer with the link (no-op for host-memory links).
    fn register(
        &mut self,
        _ptr: *const u8,
        _len: usize,
        _mem: MemKind,
    ) -> Result<Registration, LinkError> {
        Ok(Registration::default())
    }
    /// Check that the peer is still alive (links without a connection to watch use this).
    fn check_peer(&self) -> Result<(), LinkError> {
        Ok(())
    }
    /// Bytes sent so far: the stream offset of the next byte `try_send` takes (a link that
    /// moved rails may go back; see [`Link::rewound`]).
    fn bytes_sent(&self) -> u64;
    /// How the executor waits for this link: the descriptor and `poll(2)` events. A sender
    /// whose bytes are all written and that waits for acknowledgements waits to read.
    fn poll_events(&self, send: bool) -> Option<(RawFd, i16)> {
        self.poll_fd_for(send)
            .map(|fd| (fd, if send { libc::POLLOUT } else { libc::POLLIN }))
    }
    /// Stream offset up to which the peer has acknowledged taking our bytes. Links that cannot
    /// lose bytes they accepted (shared memory, RDMA) answer "everything".
    fn acked(&self) -> u64 {
        u64::MAX
    }
    /// Read the acknowledgements that have arrived; returns [`Link::acked`].
    fn poll_acks(&mut self) -> Result<u64, LinkError> {
        Ok(self.acked())
    }
    /// Keep a copy of the bytes from stream offset `start` (the concatenation of `parts`, which
    /// ends at [`Link::bytes_sent`]) that the peer has not acknowledged, so they can be resent
    /// after the caller reuses its memory. False when the link cannot (too much): wait for the
    /// acknowledgements instead.
    fn retain(&mut self, _start: u64, _parts: &[&[u8]]) -> bool {
        true
    }
    /// Acknowledge what this side has received so far: per chunk and at the end of a receive.
    /// `urgent`: the sender may be waiting for it (a long transfer), so it goes out now;
    /// otherwise it may ride on this side's next frame or go out when this side waits.
    fn ack(&mut self, _urgent: bool) -> Result<(), LinkError> {
        Ok(())
    }
    /// Whether a small send (at most 16 KiB) may go out before the peer's plan reaches it,
    /// in a group of exchanges the executor runs at once: true when such bytes wait in a
    /// buffer of their own (a socket's, a shared-memory ring) and nothing the peer needs from
    /// this side queues behind them for long. False (the default): one exchange at a time.
    fn early_sends(&self) -> bool {
        false
    }
    /// After moving rails, the stream offset the current send must continue from (taken once).
    fn rewound(&mut self) -> Option<u64> {
        None
    }
    /// Whether the link has work of its own pending (a move, a resend), so the executor's
    /// service should visit it again.
    fn busy(&self) -> bool {
        false
    }
    /// Health check and recovery, called while the executor waits: notice a lost rail, move
    /// to another, pick up a peer's move, resend. `needed`: the executor waits on this link
    /// (a failure it remembered is an error now); otherwise it is only serviced.
    fn heal(&mut self, needed: bool) -> Result<(), LinkError> {
        if needed {
            self.check_peer()
        } else {
            Ok(())
        }
    }
    /// The communicator aborted: when dropped, close at once (peers are to notice now), even
    /// with bytes the peer has not taken.
    fn abandon(&mut self) {}
    /// Sleep until this link may progress (space to send if `send`, data to receive if `recv`)
    /// or `timeout` passes. Returns false when the link cannot sleep this way (poll its fd, or
    /// back off, instead).
    fn park(&self, _send: bool, _recv: bool, _timeout: Duration) -> bool {
        false
    }
}

fn host_only(link: &str, mem: MemKind) -> LinkError {
    LinkError::Io(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        format!("{link} moves host memory only, not {mem:?}"),
    ))
}

/// Memory that is not host memory, as the executor sees it when a plan's network steps run on
/// it directly (GPUDirect RDMA: the buffers are device memory, the links' rings too). The
/// executor never dereferences such pointers: data moves through the links'
/// [`Link::try_send_mem`] / [`Link::try_recv_mem`], received chunks are reduced here.
pub trait DataMem: Send {
    /// The kind of memory the buffers are (never `Host`).
    fn kind(&self) -> MemKind;
    /// A staging area of at least `n` bytes of this kind, kept across calls.
    fn stage(&mut self, n: usize) -> crate::Result<*mut u8>;
    /// `dst[..n] = dst op src` elementwise, complete when this returns (the staging area is
    /// refilled next).
    ///
    /// # Safety
    /// `dst` and `src` valid for `n` bytes of this kind; `n` a multiple of the element size.
    unsafe fn reduce_into(
        &mut self,
        dtype: railring_collectives::DataType,
        op: railring_collectives::ReduceOp,
        dst: *mut u8,
        src: *const u8,
        n: usize,
    ) -> crate::Result<()>;
}

static OVERSUBSCRIBED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The CPUs the job's ranks on this machine share (0: not known yet), set at start-up.
static KERNEL_CPUS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Record how many CPUs the job's ranks on this machine share (the union of their CPU lists:
/// a rank bound to one core still shares the machine's).
pub fn set_kernel_cpus(n: usize) {
    KERNEL_CPUS.store(n, std::sync::atomic::Ordering::Relaxed);
}

/// See [`set_kernel_cpus`]; `None` before start-up recorded it.
pub fn kernel_cpus() -> Option<usize> {
    Some(KERNEL_CPUS.load(std::sync::atomic::Ordering::Relaxed)).filter(|&n| n > 0)
}

/// Record whether this machine runs more of the job's ranks than it has CPUs (set at start-up).
pub fn set_oversubscribed(v: bool) {
    OVERSUBSCRIBED.store(v, std::sync::atomic::Ordering::Relaxed);
}

/// Where this rank sits among the job's ranks on this kernel — (index, count) in rank order —
/// when several nodes share the kernel's CPUs (emulated hosts, containers) and ranks outnumber
/// them; set at start-up.
static KERNEL_SLOT: std::sync::OnceLock<(usize, usize)> = std::sync::OnceLock::new();

pub fn set_kernel_slot(index: usize, count: usize) {
    let _ = KERNEL_SLOT.set((index, count));
}

pub fn kernel_slot() -> Option<(usize, usize)> {
    KERNEL_SLOT.get().copied()
}

/// True when ranks on this machine outnumber its CPUs: waits then yield rather than spin.
pub fn oversubscribed() -> bool {
    OVERSUBSCRIBED.load(std::sync::atomic::Ordering::Relaxed)
}

/// Spin briefly, then yield, then sleep: ranks may outnumber cores, and a pure spin-wait turns
/// an oversubscribed run into a crawl.
pub struct Backoff {
    n: u32,
    /// When the wait began: read at the first snooze, not at each progress, so a wait that
    /// keeps finding work costs no clock read.
    start: Option<Instant>,
    /// Yields before sleeping when ranks outnumber CPUs ([`Self::leaf`]: a few).
    yields: u32,
}

/// Yields of an oversubscribed wait ([`Backoff::new`])...
const OVERSUBSCRIBED_YIELDS: u32 = 2048;
/// ...and of a leaf's ([`Backoff::leaf`]).
const LEAF_YIELDS: u32 = 8;

impl Default for Backoff {
    fn default() -> Self {
        Backoff::new()
    }
}

impl Backoff {
    pub fn new() -> Backoff {
        Backoff {
            n: 0,
            start: None,
            yields: OVERSUBSCRIBED_YIELDS,
        }
    }
    /// The wait of a rank that only receives in a rooted call (a broadcast's leaf, a reduce's
    /// root): nobody waits for it, in this call or the next. Where ranks outnumber CPUs it
    /// yields a few times, then sleeps: a process that yields keeps its fair share of the CPU
    /// (the scheduler picks it again, it has used little), and a sleeper that a producer wakes
    /// per message preempts that producer each time. 2 emulated hosts x 2 ranks on 2 CPUs,
    /// railperf broadcast 8 B, 5000 calls: the root's CPU was 59 % the root's and 41 % its
    /// idle local leaf's (woken per message); 12.5-15.8 us a call, 10.2-11.2 with leaves
    /// that yield 8 times and then sleep or poll.
    pub fn leaf() -> Backoff {
        Backoff {
            yields: LEAF_YIELDS,
            ..Backoff::new()
        }
    }
    /// A leaf's wait ([`Self::leaf`]) on an oversubscribed machine that has used its yields.
    pub fn drowsy(&self) -> bool {
        self.yields < OVERSUBSCRIBED_YIELDS && self.n >= self.yields && oversubscribed()
    }
    pub fn reset(&mut self) {
        self.n = 0;
        self.start = None;
    }
    /// Time since the wait began (the first snooze after the last progress).
    pub fn waited(&self) -> Duration {
        self.start.map(|t| t.elapsed()).unwrap_or_default()
    }
    pub fn snooze(&mut self) {
        self.n = self.n.saturating_add(1);
        let start = *self.start.get_or_insert_with(Instant::now);
        if oversubscribed() {
            // another rank may need this very CPU: hand it over at once
            if self.n < self.yields {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(20));
            }
            return;
        }
        if self.n < 128 {
            for _ in 0..32 {
                std::hint::spin_loop();
            }
        } else if self.n < 4096 && start.elapsed() < Duration::from_millis(2) {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(if self.n < 8192 { 20 } else { 200 }));
        }
    }
    /// True when the caller should spend a little time on expensive checks (peer liveness).
    pub fn check_due(&self) -> bool {
        self.n > 0 && self.n.is_multiple_of(1024)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leaf_stops_yielding_early_only_where_ranks_outnumber_cpus() {
        let was = oversubscribed();
        set_oversubscribed(true);
        let (mut leaf, mut other) = (Backoff::leaf(), Backoff::new());
        for _ in 0..LEAF_YIELDS {
            assert!(!leaf.drowsy());
            leaf.snooze();
            other.snooze();
        }
        assert!(
            leaf.drowsy(),
            "a leaf is drowsy after its {LEAF_YIELDS} yields"
        );
        assert!(!other.drowsy(), "any other wait keeps yielding");
        leaf.reset();
        assert!(!leaf.drowsy(), "progress starts the yields again");
        for _ in 0..LEAF_YIELDS {
            leaf.snooze();
        }
        set_oversubscribed(false);
        assert!(
            !leaf.drowsy(),
            "with a CPU per rank a leaf spins and yields as before"
        );
        set_oversubscribed(was);
    }
}

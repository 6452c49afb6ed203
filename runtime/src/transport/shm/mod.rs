//! Shared memory inside a node: one segment per (communicator, node) in `/dev/shm`, created by
//! the node's first rank, mapped by every local rank, and unlinked as soon as all have mapped it
//! (a crash leaves no file behind).
//!
//! Layout: a header; one control block per local rank (sequence flags on separate cache lines,
//! its pid, the descriptor of its current call); per rank three staging slots; one single-producer
//! ring per ordered pair of local ranks for point-to-point [`ShmLink`]s.
//!
//! In-node collectives ([`ShmFabric::run`], the [`super::NodeFabric`]) move data in chunks
//! through the staging slots: each rank copies its chunk in, then **each rank reduces its own
//! piece by reading every peer's slot directly** (no ring hops; its own piece straight from its
//! input), then every rank copies the reduced pieces out. The all-reduce is software-pipelined:
//! a rank copies chunk c+1 in before it waits for the peers' reductions of chunk c, so no phase
//! waits idle. The staging slots are sized to stay in the last-level cache, so the memory
//! traffic that reaches DRAM is about one read and one write of the user's buffer per rank.
//!
//! Files: this one (the segment, its layout and the node state: flags, bell, abort word),
//! `fabric.rs` (the collectives), `link.rs` (the point-to-point rings).

mod fabric;
mod link;

pub use fabric::ShmFabric;
pub use link::ShmLink;

use super::DESC;
use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const MAGIC: u64 = 0x5241_494c_5348_4d31; // "RAILSHM1"
const HDR: usize = 4096;
const CTL: usize = 448;
/// Staging slots per rank: the pipelined all-reduce fills slot c+1 while peers may still be
/// copying chunk c-1's results out of another (see [`ShmFabric::allreduce_chunks`]).
const NSLOT: usize = 3;
const RING_HDR: usize = 128;
/// Header line of a staging slot: generation, descriptor digest, and a small all-reduce's data
/// when it fits.
const SMALL_HDR: usize = 64;

/// A mapped shared-memory segment.
pub struct Segment {
    base: *mut u8,
    len: usize,
}
// SAFETY: a shared mapping; all concurrent access goes through atomics or is ordered by them.
unsafe impl Send for Segment {}
unsafe impl Sync for Segment {}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: base/len came from a successful mmap.
        unsafe {
            libc::munmap(self.base as *mut libc::c_void, self.len);
        }
    }
}

impl Segment {
    pub(crate) fn base(&self) -> *mut u8 {
        self.base
    }
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Create (`create`: new file, zero-filled) or open a file of at least `len` bytes and map
    /// it shared, read-write.
    pub(crate) fn map(path: &Path, len: usize, create: bool) -> std::io::Result<Segment> {
        let f = if create {
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(path)?;
            f.set_len(len as u64)?;
            f
        } else {
            let f = OpenOptions::new().read(true).write(true).open(path)?;
            let have = f.metadata()?.len();
            if have < len as u64 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("segment is {have} bytes, expected {len}"),
                ));
            }
            f
        };
        // SAFETY: mapping a regular file we just opened; the length was checked above.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Segment {
            base: p as *mut u8,
            len,
        })
    }
}

/// Geometry of a node segment.
#[derive(Clone, Copy, Debug)]
pub struct Geometry {
    pub local_size: usize,
    pub slot_bytes: usize,
    pub ring_bytes: usize,
}

impl Geometry {
    fn ctl_off(&self, i: usize) -> usize {
        HDR + i * CTL
    }
    fn stage_off(&self, i: usize, slot: usize) -> usize {
        HDR + self.local_size * CTL + (i * NSLOT + slot) * self.slot_bytes
    }
    fn ring_off(&self, from: usize, to: usize) -> usize {
        HDR + self.local_size * CTL
            + self.local_size * NSLOT * self.slot_bytes
            + (from * self.local_size + to) * (RING_HDR + self.ring_bytes)
    }
    pub fn total(&self) -> usize {
        self.ring_off(self.local_size, 0)
    }
}

/// The shared node state, shared by the fabric and the node's p2p links.
pub struct Node {
    seg: Segment,
    pub geo: Geometry,
    /// Local index → communicator rank.
    pub ranks: Vec<usize>,
    pub me: usize,
    pub host: String,
}

impl Node {
    /// Create (leader) or open (others) the node segment at `path`. The leader creates it; the
    /// caller unlinks it once every local rank has mapped it.
    pub fn open(
        path: &Path,
        geo: Geometry,
        ranks: Vec<usize>,
        me: usize,
        host: String,
        create: bool,
    ) -> std::io::Result<Arc<Node>> {
        let seg = Segment::map(path, geo.total(), create)?;
        let node = Node {
            seg,
            geo,
            ranks,
            me,
            host,
        };
        if create {
            // SAFETY: header is inside the mapping; the file was zero-filled by set_len.
            unsafe {
                std::ptr::write(node.seg.base() as *mut u64, MAGIC);
            }
        } else {
            // SAFETY: as above.
            let m = unsafe { std::ptr::read_volatile(node.seg.base() as *const u64) };
            if m != MAGIC {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "not a railring segment",
                ));
            }
        }
        node.pid(me).store(std::process::id(), Ordering::Release);
        Ok(Arc::new(node))
    }

    fn at<T>(&self, off: usize) -> &T {
        debug_assert!(off + std::mem::size_of::<T>() <= self.seg.len());
        // SAFETY: offsets computed from the geometry stay inside the mapping; atomics are
        // valid for any bit pattern and are aligned (all offsets are multiples of 8).
        unsafe { &*(self.seg.base().add(off) as *const T) }
    }
    fn ready(&self, i: usize) -> &AtomicU64 {
        self.at(self.geo.ctl_off(i))
    }
    fn reduced(&self, i: usize) -> &AtomicU64 {
        self.at(self.geo.ctl_off(i) + 64)
    }
    fn pid(&self, i: usize) -> &AtomicU32 {
        self.at(self.geo.ctl_off(i) + 192)
    }
    /// The descriptor of the call that uses staging slot `slot` (one per slot, so a rank that
    /// runs ahead into the next call cannot overwrite what a slower peer is about to compare).
    fn desc_ptr(&self, i: usize, slot: usize) -> *mut u8 {
        // SAFETY: bytes 256..448 of the control block.
        unsafe { self.seg.base().add(self.geo.ctl_off(i) + 256 + slot * DESC) }
    }
    fn stage(&self, i: usize, slot: usize) -> *mut u8 {
        // SAFETY: inside the mapping.
        unsafe { self.seg.base().add(self.geo.stage_off(i, slot)) }
    }
    /// The part of a staging slot used by chunked collectives (after the small header line).
    fn chunk_area(&self, i: usize, slot: usize) -> *mut u8 {
        // SAFETY: inside the slot.
        unsafe { self.stage(i, slot).add(SMALL_HDR) }
    }
    fn ring(&self, from: usize, to: usize) -> (&AtomicU64, &AtomicU64, *mut u8) {
        let off = self.geo.ring_off(from, to);
        // SAFETY: inside the mapping.
        (self.at(off), self.at(off + 64), unsafe {
            self.seg.base().add(off + RING_HDR)
        })
    }

    fn bell(&self) -> &AtomicU32 {
        self.at(128)
    }
    fn sleepers(&self) -> &AtomicU32 {
        self.at(192)
    }

    /// Publish a flag store: wake ranks sleeping on the bell (a futex shared by the node's
    /// processes). Costs one atomic add when nobody sleeps.
    pub fn ring_bell(&self) {
        // Callers store their flag with SeqCst first. A sleeper registers (SeqCst) before it
        // reads the bell and re-checks its condition, so either it sees the new flag or we see it
        // registered and move the bell; nobody sleeps through a store.
        if self.sleepers().load(Ordering::SeqCst) > 0 {
            self.bell().fetch_add(1, Ordering::SeqCst);
            // SAFETY: FUTEX_WAKE on a 4-byte aligned word inside the shared mapping.
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    self.bell() as *const AtomicU32,
                    libc::FUTEX_WAKE,
                    i32::MAX,
                    0,
                    0,
                    0,
                );
            }
        }
    }

    /// Sleep until the bell rings or `timeout` passes, unless `ready()` already holds.
    pub fn park(&self, ready: impl Fn() -> bool, timeout: Duration) {
        self.sleepers().fetch_add(1, Ordering::SeqCst);
        let seen = self.bell().load(Ordering::SeqCst);
        if !ready() {
            let ts = libc::timespec {
                tv_sec: timeout.as_secs() as libc::time_t,
                tv_nsec: timeout.subsec_nanos() as libc::c_long,
            };
            // SAFETY: FUTEX_WAIT on a word inside the shared mapping, with a relative timeout;
            // returns at once if the bell already moved past `seen`.
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    self.bell() as *const AtomicU32,
                    libc::FUTEX_WAIT,
                    seen,
                    &ts as *const libc::timespec,
                    0,
                    0,
                );
            }
        }
        self.sleepers().fetch_sub(1, Ordering::SeqCst);
    }

    /// Tell every local rank that this rank abandoned the current collective after an error, so
    /// peers waiting on it fail at once instead of at the timeout.
    pub fn abort(&self) {
        let a: &AtomicU64 = self.at(64);
        let _ = a.compare_exchange(
            0,
            self.ranks[self.me] as u64 + 1,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        self.ring_bell();
    }

    /// The communicator rank that aborted, if any.
    pub fn aborted(&self) -> Option<usize> {
        let a: &AtomicU64 = self.at(64);
        match a.load(Ordering::Acquire) {
            0 => None,
            r => Some(r as usize - 1),
        }
    }

    /// Is local rank `i` still alive?
    pub fn alive(&self, i: usize) -> bool {
        let pid = self.pid(i).load(Ordering::Acquire);
        if pid == 0 {
            return true; // not started yet
        }
        // SAFETY: kill with signal 0 only checks for existence.
        let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
        r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
    }
}

/// Where a node segment lives: `/dev/shm/railring-<job>-<comm>-<node>`.
pub fn segment_path(job: &str, comm: u64, node_key: &str) -> PathBuf {
    let clean: String = node_key
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .take(24)
        .collect();
    PathBuf::from(format!("/dev/shm/railring-{job}-{comm:x}-{clean}"))
}

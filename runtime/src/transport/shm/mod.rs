//! Shared memory inside a node: one segment per (communicator, node) in `/dev/shm`, created by
//! the node's first rank, mapped by every local rank, and unlinked as soon as all have mapped it
//! (a crash leaves no file behind).
//!
//! Layout: a header; one control block per local rank (sequence flags on separate cache lines:
//! `ready`, `reduced`, `pairs`; its pid; per generation mod 64 a call descriptor, a header line
//! and a 4 KiB small-data box); per rank three staging slots; one single-producer ring per
//! ordered pair of local ranks for point-to-point [`ShmLink`]s.
//!
//! Large all-to-all calls (and two ranks' mid-sized all-gathers) may skip the slots: when every
//! local rank agreed it can read every other's memory ([`Node::can_read`],
//! [`Node::single_copy`]), they read each other's buffers directly ([`Node::peer_read`],
//! `process_vm_readv`).
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
mod hint;
mod link;

pub use fabric::{ShmFabric, SINGLE_COPY_ALLTOALL_MIN};
pub use link::ShmLink;

use super::DESC;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The segment layout's version (2: 64 header lines and boxes per rank).
const MAGIC: u64 = 0x5241_494c_5348_4d32; // "RAILSHM2"
const HDR: usize = 4096;
/// Header lines (and descriptors) per rank: generation g uses line g mod NHDR, so a rank may run
/// that many small calls ahead of a slow peer (a small broadcast's root, a small reduce's other
/// ranks), while data in the staging slots limits it to [`NSLOT`]. 64 rather than 16: with 4
/// ranks on 2 cores a deeper run-ahead lets each rank take a longer turn per context switch
/// (railperf 8-64 B, 4 ranks: broadcast 0.73-0.96 -> 0.44-0.60 us, reduce 0.66-1.16 ->
/// 0.42-0.52; 2 ranks unchanged), for 200 KB more control block per rank.
const NHDR: usize = 64;
/// Bytes of a small call's data that ride with generation g in the rank's control block (in
/// its line up to 48 bytes, else in box g mod NHDR), so small calls up to this size run up to
/// NHDR - 1 calls ahead of a slow peer; larger ones use a staging slot.
const SMALL_BOX: usize = 4096;
/// Control block: flags (ready, reduced, pairs), pid, then NHDR descriptors, NHDR lines and NHDR
/// small-data boxes.
const CTL: usize = 256 + NHDR * (DESC + SMALL_HDR + SMALL_BOX);
/// Staging slots per rank: the pipelined all-reduce fills slot c+1 while peers may still be
/// copying chunk c-1's results out of another (see [`ShmFabric::allreduce_chunks`]).
const NSLOT: usize = 3;
const RING_HDR: usize = 128;
/// Header line of a staging slot: generation, descriptor digest, and a small all-reduce's data
/// when it fits.
const SMALL_HDR: usize = 64;
/// Bytes a staging slot holds before its data (its header line): a slot is this plus the
/// `RAILRING_SHM_SLOT` data bytes, so the knob's size is what one chunk carries.
pub const SLOT_LINE: usize = SMALL_HDR;

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
    /// Created files are private to this user (mode 0600, `O_EXCL`, never through a link);
    /// an opened one must be a regular file of this user (`private_fs::open_own`: a FIFO or
    /// another user's file under the name is refused, never blocked on).
    pub(crate) fn map(path: &Path, len: usize, create: bool) -> std::io::Result<Segment> {
        let f = if create {
            let f = crate::private_fs::create_new(path)?;
            // Reserve every page now: a sparse file on a full tmpfs maps fine and then kills
            // the process with SIGBUS in the middle of a collective.
            if let Err(e) = reserve(&f, len) {
                let _ = std::fs::remove_file(path);
                return Err(no_room(path, len, e));
            }
            f
        } else {
            let f = crate::private_fs::open_own(path, true)?;
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

/// Allocate `len` bytes of `f` for real (`posix_fallocate`).
fn reserve(f: &std::fs::File, len: usize) -> std::io::Result<()> {
    loop {
        // SAFETY: fallocate on a file descriptor we own; the length fits in off_t.
        let r = unsafe { libc::posix_fallocate(f.as_raw_fd(), 0, len as libc::off_t) };
        match r {
            0 => return Ok(()),
            libc::EINTR => continue,
            // A file system without fallocate: fall back to a sparse file.
            libc::EOPNOTSUPP | libc::EINVAL => return f.set_len(len as u64),
            e => return Err(std::io::Error::from_raw_os_error(e)),
        }
    }
}

/// The error for a segment that does not fit: how much it needs, what the file system has, and
/// what to do.
fn no_room(path: &Path, len: usize, e: std::io::Error) -> std::io::Error {
    let dir = path.parent().unwrap_or(Path::new("/dev/shm"));
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let room = statvfs(dir)
        .map(|(size, free)| {
            format!(
                "{} has {:.1} MiB free of {:.1} MiB",
                dir.display(),
                mib(free),
                mib(size)
            )
        })
        .unwrap_or_else(|| format!("{} is too small", dir.display()));
    std::io::Error::new(
        e.kind(),
        format!(
            "the node's shared-memory segment needs {:.1} MiB but {room} ({e}); enlarge it \
             (`docker run --shm-size=1g`, or `mount -o remount,size=1G {}`), lower \
             RAILRING_SHM_SLOT (three slots per local rank), or start fewer ranks per node",
            mib(len as u64),
            dir.display()
        ),
    )
}

/// (size, free) bytes of the file system holding `dir`.
fn statvfs(dir: &Path) -> Option<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid C string and an out-parameter of the right type.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    let f = st.f_frsize as u64;
    Some((st.f_blocks as u64 * f, st.f_bavail as u64 * f))
}

/// Where the creator of `path` builds it before renaming it into place:
/// `railring-<job>-<random>.init-<pid>` beside it. The random part is not the final name's, so
/// another user who sees the file being built learns nothing that lets them take the final
/// name first; the job prefix lets the job's teardown sweep find it.
fn init_path(path: &Path) -> std::io::Result<PathBuf> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // railring-<job>-<comm>-<node>-<tag>: keep `railring-<job>-`
    let job = name
        .strip_prefix("railring-")
        .and_then(|r| r.split('-').next())
        .unwrap_or("x");
    let tag = crate::private_fs::random_hex(8)?;
    Ok(path.with_file_name(format!("railring-{job}-{tag}.init-{}", std::process::id())))
}

/// This process's PID namespace (the inode of `/proc/self/ns/pid`; 0 when unknown): pids in a
/// segment are only meaningful to a process of the same namespace.
fn pid_ns() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/pid")
        .map(|m| m.ino())
        .unwrap_or(0)
}

/// Remove the segments in `dir` (`railring-*`) that a crash left behind: those whose every
/// recorded rank is dead (checked only when they were created in our PID namespace), and
/// half-created files (no header) older than a minute. Segments are unlinked as soon as every
/// local rank mapped them, so only a job that died during its start-up leaves one; the next
/// railring start on the node (a node's first rank, railrun and its agents at the end of a
/// job) sweeps it. Returns how many were removed.
pub fn sweep_stale(dir: &Path) -> usize {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    let ours = pid_ns();
    let mut removed = 0;
    for e in rd.flatten() {
        let name = e.file_name();
        if !name.to_string_lossy().starts_with("railring-") {
            continue;
        }
        let path = e.path();
        // Only this user's regular files: never open (or wait on) a FIFO, device or another
        // user's file that happens to carry the prefix.
        if !std::fs::symlink_metadata(&path).is_ok_and(|m| crate::private_fs::is_own_file(&m)) {
            continue;
        }
        if is_stale(&path, ours) && std::fs::remove_file(&path).is_ok() {
            tracing::info!(target: "railring::init", "removed a stale shared-memory segment {}", path.display());
            removed += 1;
        }
    }
    removed
}

/// The sweep of railrun's and its agents' teardown, once every process of job `job` (when one
/// was started) on the node is dead: every file of that job (`sweep_job`), then other jobs'
/// stale segments ([`sweep_stale`]). Returns how many were removed.
pub fn sweep_after_job(dir: &Path, job: Option<&str>) -> usize {
    job.map_or(0, |j| sweep_job(dir, j)) + sweep_stale(dir)
}

/// Remove every file job `job` made in `dir` (`railring-<job>-*`, `railring-gpu-<job>-*`),
/// whatever its age or state. (`sweep_stale` spares a segment still being built for a second,
/// in case its creator lives in another PID namespace; a rank killed while building one leaves
/// a file that young, and its own job knows it is garbage.) Returns how many were removed.
fn sweep_job(dir: &Path, job: &str) -> usize {
    let job = crate::bootstrap::launch::clean_id(job);
    if job.is_empty() {
        return 0;
    }
    let mine = [format!("railring-{job}-"), format!("railring-gpu-{job}-")];
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for e in rd.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if mine.iter().any(|p| name.starts_with(p.as_str()))
            && std::fs::symlink_metadata(e.path()).is_ok_and(|m| crate::private_fs::is_own_file(&m))
            && std::fs::remove_file(e.path()).is_ok()
        {
            tracing::info!(target: "railring::init", "removed the job's shared-memory file {name}");
            removed += 1;
        }
    }
    removed
}

fn is_stale(path: &Path, ours: u64) -> bool {
    use std::io::Read;
    // Non-blocking, no link, and checked to be this user's regular file on the descriptor.
    let Ok(mut f) = crate::private_fs::open_own(path, false) else {
        return false;
    };
    let Ok(meta) = f.metadata() else {
        return false;
    };
    let age = meta
        .modified()
        .ok()
        .and_then(|m| m.elapsed().ok())
        .unwrap_or_default();
    // A segment still being built: stale when its creator is dead (and it is not brand new,
    // in case the creator lives in another PID namespace sharing this /dev/shm).
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if let Some(pid) = name
        .rsplit_once(".init-")
        .and_then(|(_, p)| p.parse::<u32>().ok())
    {
        return age > Duration::from_secs(1) && !pid_alive(pid);
    }
    let old = age > Duration::from_secs(60);
    let mut hdr = [0u8; 24];
    if f.read_exact(&mut hdr).is_err() {
        return old;
    }
    let word = |i: usize| u64::from_le_bytes(hdr[i..i + 8].try_into().unwrap_or_default());
    if word(0) != MAGIC {
        return old;
    }
    let (local, ns) = (word(8) as usize, word(16));
    if ns == 0 || ns != ours || local == 0 || local > 4096 {
        return false;
    }
    if meta.len() < (HDR + local * CTL) as u64 {
        return false;
    }
    let mut any = false;
    for i in 0..local {
        let mut b = [0u8; 4];
        use std::os::unix::fs::FileExt;
        if f.read_exact_at(&mut b, (HDR + i * CTL + 192) as u64)
            .is_err()
        {
            return false;
        }
        let pid = u32::from_le_bytes(b);
        if pid == 0 {
            continue;
        }
        any = true;
        if pid_alive(pid) {
            return false;
        }
    }
    any || old
}

/// Does process `pid` exist (a zombie counts as alive: its parent has not reaped it yet)?
fn pid_alive(pid: u32) -> bool {
    if pid == 0 || pid > i32::MAX as u32 {
        return false;
    }
    // SAFETY: signal 0 only checks for existence.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// How many times longer the kernel takes to copy a 2 MiB block between processes
/// (`process_vm_readv`, here read from this process itself) than two memory copies in series
/// take (the staged path: into a slot, out of it): the least of 5 tries of each, measured once
/// per process (about 3 ms). Under 1 the single copy is the faster way to move a large block on
/// two ranks, each of which copies once either way. It depends on the machine: this 2-vCPU VM
/// (kernel 6.18, 480 MiB L3) measured 0.7-0.8 and railperf agreed (2 ranks, all-gather 4 MiB in
/// place 210 µs read directly against 310 staged); the VM these limits were first measured on
/// read 1 MiB blocks at 113-118 µs against 70-72 staged (a ratio near 1.6). `None`: the kernel
/// refused.
pub fn kernel_copy_ratio() -> Option<f64> {
    static RATIO: std::sync::OnceLock<Option<f64>> = std::sync::OnceLock::new();
    *RATIO.get_or_init(|| {
        const N: usize = 2 << 20;
        let src = vec![1u8; N];
        let mut mid = vec![2u8; N];
        let mut dst = vec![3u8; N];
        let (mut kernel, mut staged) = (f64::MAX, f64::MAX);
        for _ in 0..5 {
            kernel = kernel.min(self_read_secs(&mut dst, &src)?);
            let t = std::time::Instant::now();
            mid.copy_from_slice(std::hint::black_box(&src));
            dst.copy_from_slice(std::hint::black_box(&mid));
            staged = staged.min(t.elapsed().as_secs_f64());
            std::hint::black_box(&dst);
        }
        Some(kernel / staged.max(1e-9))
    })
}

/// Does the kernel copy between processes run far slower when the destination sits 1-31 bytes
/// past the source modulo a cache line? Its copy is `rep movsb`, which on AMD EPYC (Zen) then
/// runs at a sixteenth of its speed (see `kernels::copy`): `process_vm_readv` of 64 KiB took
/// 32.8 µs (2.0 GB/s) with the destination 16 bytes ahead against 7.2 aligned, 1 MiB 563
/// against 121. Timed once per process (64 KiB, this process's own memory, the least of 5
/// tries each way, about 0.2 ms): slow means over twice the aligned copy's time. `false` where
/// the kernel refused.
pub fn kernel_skew_slow() -> bool {
    static SLOW: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SLOW.get_or_init(|| {
        const N: usize = 64 << 10;
        let src = vec![1u8; N + 64];
        let mut dst = vec![3u8; N + 128];
        let base = src.as_ptr().align_offset(64);
        let at = dst.as_ptr().align_offset(64);
        let mut best = [f64::MAX; 2];
        for _ in 0..5 {
            for (k, skew) in [0usize, 16].into_iter().enumerate() {
                let to = &mut dst[at + skew..at + skew + N];
                match self_read_secs(to, &src[base..base + N]) {
                    Some(t) => best[k] = best[k].min(t),
                    None => return false,
                }
            }
        }
        best[1] > 2.0 * best[0]
    })
}

/// Seconds one `process_vm_readv` of this process's own `src` into `dst` (as long) took;
/// `None` where the kernel refused or copied less.
fn self_read_secs(dst: &mut [u8], src: &[u8]) -> Option<f64> {
    let n = src.len().min(dst.len());
    let here = libc::iovec {
        iov_base: dst.as_mut_ptr() as *mut libc::c_void,
        iov_len: n,
    };
    let far = libc::iovec {
        iov_base: src.as_ptr() as *mut libc::c_void,
        iov_len: n,
    };
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    let t = std::time::Instant::now();
    // SAFETY: both iovecs cover `n` bytes of live buffers of this process.
    let r = unsafe { libc::process_vm_readv(pid, &here, 1, &far, 1, 0) };
    let secs = t.elapsed().as_secs_f64();
    (r == n as isize).then_some(secs)
}

/// Bytes a skewed kernel copy between processes moves through its bounce buffer at a time
/// (`Node::peer_copy`): well inside this CPU's L2, where the bounce stays.
const SKEW_BOUNCE: usize = 128 << 10;

thread_local! {
    /// The bounce buffer of this thread's skewed kernel copies ([`SKEW_BOUNCE`] and a line).
    static BOUNCE: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
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
    /// A value only this process holds, at a fixed address: a peer that reads it through
    /// `process_vm_readv` and finds it proves it can read this process's memory.
    token: u64,
    /// Every local rank agreed it can read every other's memory ([`Node::peer_read`]): the
    /// fabric's large all-to-all and all-gather then copy once (see `fabric.rs`).
    single_copy: AtomicBool,
    /// The least all-to-all block the fabric reads directly when [`Node::single_copy`]: the
    /// same on every local rank (agreed with it).
    alltoall_single_min: AtomicUsize,
    /// On two ranks, the single copy has no upper size limit: the node measured the kernel's
    /// copy between processes at under two memory copies ([`kernel_copy_ratio`]; set with
    /// [`Node::set_single_copy`]).
    large_single: AtomicBool,
    /// The node's ranks outnumber its CPUs (agreed at set-up, as [`Node::set_single_copy`]
    /// records it): where its all-to-all reads directly, an out-of-place all-to-all reads larger
    /// blocks directly too once every local rank says it calls out of place (see `fabric.rs`).
    crowded: AtomicBool,
    /// How the fabric's small calls publish their flags: `Release` where this process is
    /// registered for the sleepers' expedited memory barriers ([`asymmetric_fence`]), else
    /// `SeqCst`.
    publish_order: Ordering,
}

/// membarrier(2) commands (linux/membarrier.h).
const MEMBARRIER_CMD_QUERY: libc::c_int = 0;
const MEMBARRIER_CMD_GLOBAL_EXPEDITED: libc::c_int = 1 << 1;
const MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED: libc::c_int = 1 << 2;

fn membarrier(cmd: libc::c_int) -> libc::c_long {
    // SAFETY: membarrier takes the command and two integer arguments and touches no memory of
    // ours.
    unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0, 0) }
}

/// Whether this process may publish a flag with a plain release store before it reads the
/// bell's sleeper count ([`Node::ring_bell`]): the store-then-load needs a full fence (an
/// `xchg` on x86, which waits for every store before it, the header line a peer polls among
/// them) unless every sleeper makes each running waker execute one for it. A sleeper does that
/// with an expedited global `membarrier` after it registers and before it re-checks its
/// condition ([`Node::park`]), which reaches every process registered here. Registered once
/// per process; false where the kernel lacks it (before Linux 4.16) or a filter refuses it.
pub fn asymmetric_fence() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        let both = MEMBARRIER_CMD_GLOBAL_EXPEDITED | MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED;
        let q = membarrier(MEMBARRIER_CMD_QUERY);
        q >= 0
            && q & both as libc::c_long == both as libc::c_long
            && membarrier(MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED) == 0
    })
}

/// The heavy side of [`asymmetric_fence`]: makes every running thread of every registered
/// process (this one's included) execute a full memory barrier before it returns. False when it
/// failed (or was never available): the caller must not rely on it then.
pub fn heavy_fence() -> bool {
    asymmetric_fence() && membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED) == 0
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
        if create {
            sweep_stale(path.parent().unwrap_or(Path::new("/dev/shm")));
        }
        // The creator builds the segment under a name of its own ([`init_path`]) and
        // renames it into place once its header and pid are written: a crash while reserving
        // or initialising leaves a file the sweep recognises by its dead creator's pid, and
        // a peer never opens a half-made segment.
        let init = if create {
            init_path(path)?
        } else {
            path.to_path_buf()
        };
        let seg = Segment::map(&init, geo.total(), create)?;
        let node = Node {
            seg,
            geo,
            ranks,
            me,
            host,
            token: probe_token(),
            single_copy: AtomicBool::new(false),
            large_single: AtomicBool::new(false),
            alltoall_single_min: AtomicUsize::new(usize::MAX),
            crowded: AtomicBool::new(false),
            publish_order: if asymmetric_fence() {
                Ordering::Release
            } else {
                Ordering::SeqCst
            },
        };
        if create {
            // SAFETY: header is inside the mapping; the file was zero-filled by set_len. The
            // local size and our PID namespace let a later sweep tell a dead job's segment.
            unsafe {
                std::ptr::write((node.seg.base() as *mut u64).add(1), geo.local_size as u64);
                std::ptr::write((node.seg.base() as *mut u64).add(2), pid_ns());
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
        if create {
            if let Err(e) = crate::private_fs::rename_new(&init, path) {
                let _ = std::fs::remove_file(&init);
                return Err(e);
            }
        }
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
    /// Pairwise progress of a single-copy all-to-all: `(generation << 24) | rounds done` (see
    /// `ShmFabric::pairwise_all_to_all`).
    fn pairs(&self, i: usize) -> &AtomicU64 {
        self.at(self.geo.ctl_off(i) + 128)
    }
    fn pid(&self, i: usize) -> &AtomicU32 {
        self.at(self.geo.ctl_off(i) + 192)
    }
    /// Whether rank `i` calls the all-to-all of generation `g` out of place, where the node must
    /// agree on it: `2 g + 1` if so, `2 g` if in place (`ShmFabric::all_out_of_place`).
    fn placement(&self, i: usize) -> &AtomicU64 {
        self.at(self.geo.ctl_off(i) + 200)
    }
    /// The descriptor of generation `g`'s call (one per header line, so a rank that runs ahead
    /// into later calls cannot overwrite what a slower peer is about to compare).
    fn desc_ptr(&self, i: usize, g: u64) -> *mut u8 {
        let h = (g % NHDR as u64) as usize;
        // SAFETY: inside the control block.
        unsafe { self.seg.base().add(self.geo.ctl_off(i) + 256 + h * DESC) }
    }
    /// Rank `i`'s small-data box for generation `g` ([`SMALL_BOX`] bytes).
    fn small_box(&self, i: usize, g: u64) -> *mut u8 {
        let h = (g % NHDR as u64) as usize;
        // SAFETY: inside the control block.
        unsafe {
            self.seg
                .base()
                .add(self.geo.ctl_off(i) + 256 + NHDR * (DESC + SMALL_HDR) + h * SMALL_BOX)
        }
    }
    /// Rank `i`'s header line for generation `g`: [generation | descriptor digest | 48 bytes:
    /// a small call's data, or the address of a single-copy call's input].
    fn line(&self, i: usize, g: u64) -> *mut u8 {
        let h = (g % NHDR as u64) as usize;
        // SAFETY: inside the control block.
        unsafe {
            self.seg
                .base()
                .add(self.geo.ctl_off(i) + 256 + NHDR * DESC + h * SMALL_HDR)
        }
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
    /// The tail a ring's producer sleeps until (in the tail's line; 0: any consumption wakes
    /// it). See [`link::ShmLink::park`].
    fn ring_want(&self, from: usize, to: usize) -> &AtomicU64 {
        self.at(self.geo.ring_off(from, to) + 72)
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
        // Callers store their flag with SeqCst first, or with [`Node::publish_order`]. A
        // sleeper registers (SeqCst), then has every registered running process execute a
        // full fence (`membarrier`), before it reads the bell and re-checks its condition, so
        // either it sees the new flag or we see it registered and move the bell; nobody sleeps
        // through a store. (The compiler must not read the count before the store either.)
        std::sync::atomic::compiler_fence(Ordering::SeqCst);
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
    /// `released`: the store that makes `ready()` true may be a release store
    /// ([`Node::publish_order`]), whose waker skipped the fence before reading the sleeper
    /// count; the sleeper then has every registered running process execute one
    /// ([`asymmetric_fence`]). That interrupts the other CPUs, so waits whose flags are stored
    /// sequentially consistent skip it: a 4-rank broadcast's waiters sleep once per chunk, and
    /// fencing every sleep took 16 MiB (railperf -n 40 -z 1, 4 ranks on 2 CPUs, medians of 4
    /// interleaved launches, out of place / in place) from 3775 / 2985 µs to 4179 / 3321;
    /// fencing only these, 3915 / 2960 (Open MPI 3826 / 3280).
    pub fn park(&self, ready: impl Fn() -> bool, timeout: Duration, released: bool) {
        self.sleepers().fetch_add(1, Ordering::SeqCst);
        // where the fence fails, a store may go unseen: sleep briefly
        let timeout = if !released || membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED) == 0 {
            timeout
        } else {
            timeout.min(Duration::from_millis(1))
        };
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

    /// What a peer needs to check it can read this process's memory: `(pid, address, value)`
    /// of the token ([`Node::can_read`]).
    pub fn probe(&self) -> (u32, usize, u64) {
        (
            std::process::id(),
            &self.token as *const u64 as usize,
            self.token,
        )
    }

    /// Can this process read the memory of local rank `i`, which published `probe` (its
    /// [`Node::probe`])? The pid must be the one in the segment and the token must read back:
    /// a pid of another PID namespace, a seccomp filter or a ptrace restriction all say no.
    pub fn can_read(&self, i: usize, probe: (u32, usize, u64)) -> bool {
        let (pid, addr, token) = probe;
        if i >= self.geo.local_size || pid == 0 || self.pid(i).load(Ordering::Acquire) != pid {
            return false;
        }
        let mut got = 0u64;
        // SAFETY: the destination is a local u64; the remote address is only read by the kernel,
        // which reports a bad one as an error.
        let r = unsafe { self.peer_read(i, &mut got as *mut u64 as *mut u8, addr, 8) };
        r.is_ok() && got == token
    }

    /// Record the node's agreement on single-copy reads (every local rank can read every
    /// other), from which all-to-all block size they are used (`usize::MAX`: never; a crowded
    /// node whose kernel copies slowly), whether a two-rank node uses them at every size
    /// from their least (`large`), and whether the node's ranks outnumber its CPUs (`crowded`).
    pub fn set_single_copy(&self, on: bool, alltoall_min: usize, large: bool, crowded: bool) {
        self.alltoall_single_min
            .store(alltoall_min, Ordering::Relaxed);
        self.large_single.store(on && large, Ordering::Relaxed);
        self.crowded.store(crowded, Ordering::Relaxed);
        self.single_copy.store(on, Ordering::Release);
    }

    /// Does a two-rank node read peers' blocks directly at every size (see
    /// [`Node::set_single_copy`])?
    pub fn large_single(&self) -> bool {
        self.large_single.load(Ordering::Relaxed)
    }

    /// Do the node's ranks outnumber its CPUs (see [`Node::set_single_copy`])?
    pub fn crowded(&self) -> bool {
        self.crowded.load(Ordering::Relaxed)
    }

    /// The least all-to-all block read directly (see [`Node::set_single_copy`]).
    pub fn alltoall_single_min(&self) -> usize {
        self.alltoall_single_min.load(Ordering::Relaxed)
    }

    /// The ordering of a small call's flag stores followed by [`Node::ring_bell`]: `Release`
    /// where sleepers fence for us ([`asymmetric_fence`]), else `SeqCst`.
    pub fn publish_order(&self) -> Ordering {
        self.publish_order
    }

    /// Did every local rank agree it can read every other's memory?
    pub fn single_copy(&self) -> bool {
        self.single_copy.load(Ordering::Acquire)
    }

    /// Copy `n` bytes at `remote` in local rank `i`'s address space to `dst`
    /// (`process_vm_readv`, one copy by the kernel).
    ///
    /// # Safety
    /// `dst` valid for `n` bytes of writes.
    pub unsafe fn peer_read(
        &self,
        i: usize,
        dst: *mut u8,
        remote: usize,
        n: usize,
    ) -> std::io::Result<()> {
        self.peer_copy(i, dst, remote, n, false)
    }

    /// Copy `n` bytes at `src` to `remote` in local rank `i`'s address space
    /// (`process_vm_writev`: the same permission as [`Node::peer_read`]).
    ///
    /// # Safety
    /// `src` valid for `n` bytes of reads; rank `i` must not touch `remote..remote + n` until
    /// told the write is over.
    pub unsafe fn peer_write(
        &self,
        i: usize,
        src: *const u8,
        remote: usize,
        n: usize,
    ) -> std::io::Result<()> {
        self.peer_copy(i, src as *mut u8, remote, n, true)
    }

    /// [`Node::peer_read`] (`write` false) or [`Node::peer_write`]. Where the kernel's copy
    /// is slow for a destination 1-31 bytes past its source modulo a line
    /// ([`kernel_skew_slow`]) and this copy is so placed, it goes through a bounce buffer
    /// placed like the remote buffer, [`SKEW_BOUNCE`] bytes at a time: the kernel copies
    /// between equally placed lines, and `kernels::copy` (a vector loop) moves the bytes
    /// between the bounce and `local`. railperf allgather -z 1, 2 ranks, heap buffers that
    /// met it, µs out of place: 128 KiB 31-48 direct against 9.8 staged.
    unsafe fn peer_copy(
        &self,
        i: usize,
        local: *mut u8,
        remote: usize,
        n: usize,
        write: bool,
    ) -> std::io::Result<()> {
        let skew = if write {
            remote.wrapping_sub(local as usize)
        } else {
            (local as usize).wrapping_sub(remote)
        } & 63;
        if n < railring_collectives::kernels::COPY_VECTOR_MIN
            || !(1..32).contains(&skew)
            || !kernel_skew_slow()
        {
            return self.kernel_copy(i, local, remote, n, write);
        }
        self.bounced_copy(i, local, remote, n, write)
    }

    /// [`Node::peer_copy`] through this thread's bounce buffer, placed as `remote` within a
    /// line, [`SKEW_BOUNCE`] bytes at a time.
    unsafe fn bounced_copy(
        &self,
        i: usize,
        local: *mut u8,
        remote: usize,
        n: usize,
        write: bool,
    ) -> std::io::Result<()> {
        BOUNCE.with(|b| {
            let mut b = b.borrow_mut();
            if b.len() < SKEW_BOUNCE + 64 {
                b.resize(SKEW_BOUNCE + 64, 0);
            }
            let base = b.as_mut_ptr();
            // the bounce placed as the remote buffer within a line
            let bounce = base.add(remote.wrapping_sub(base as usize) & 63);
            let mut done = 0;
            while done < n {
                let k = (n - done).min(SKEW_BOUNCE);
                let (here, far) = (local.add(done), remote.wrapping_add(done));
                if write {
                    railring_collectives::kernels::copy(bounce, here, k);
                    self.kernel_copy(i, bounce, far, k, true)?;
                } else {
                    self.kernel_copy(i, bounce, far, k, false)?;
                    railring_collectives::kernels::copy(here, bounce, k);
                }
                done += k;
            }
            Ok(())
        })
    }

    /// One kernel copy of [`Node::peer_copy`], resumed after a short copy or an interruption.
    unsafe fn kernel_copy(
        &self,
        i: usize,
        local: *mut u8,
        remote: usize,
        n: usize,
        write: bool,
    ) -> std::io::Result<()> {
        let pid = self.pid(i).load(Ordering::Acquire) as libc::pid_t;
        let mut done = 0usize;
        while done < n {
            let here = libc::iovec {
                iov_base: local.add(done) as *mut libc::c_void,
                iov_len: n - done,
            };
            let far = libc::iovec {
                iov_base: remote.wrapping_add(done) as *mut libc::c_void,
                iov_len: n - done,
            };
            // SAFETY: one local iovec inside the caller's buffer; the kernel checks the remote one.
            let r = if write {
                libc::process_vm_writev(pid, &here, 1, &far, 1, 0)
            } else {
                libc::process_vm_readv(pid, &here, 1, &far, 1, 0)
            };
            if r < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if r == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    if write {
                        "process_vm_writev wrote nothing"
                    } else {
                        "process_vm_readv read nothing"
                    },
                ));
            }
            done += r as usize;
        }
        Ok(())
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

/// A value no other process is likely to hold at the same address (time, pid, a stack address).
fn probe_token() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let local = 0u8;
    let mut h = t ^ ((std::process::id() as u64) << 32) ^ (&local as *const u8 as u64);
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h | 1
}

/// Where a node segment lives: `/dev/shm/railring-<job>-<comm>-<node>-<tag>`, where `tag` is
/// the random name its creator chose ([`segment_tag`]) and published to the node's other ranks
/// through the job's authenticated store: nobody outside the job can predict the name, so
/// nobody can take it first.
pub fn segment_path(job: &str, comm: u64, node_key: &str, tag: &str) -> PathBuf {
    let clean = |s: &str, n: usize| -> String {
        s.chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .take(n)
            .collect()
    };
    PathBuf::from(format!(
        "/dev/shm/railring-{job}-{comm:x}-{}-{}",
        clean(node_key, 24),
        clean(tag, 32)
    ))
}

/// A new random segment tag (16 hex digits from the kernel's random source).
pub fn segment_tag() -> std::io::Result<String> {
    crate::private_fs::random_hex(8)
}

/// Whether `tag`, read from the store, is one [`segment_tag`] could have made.
pub fn valid_tag(tag: &[u8]) -> bool {
    tag.len() == 16 && tag.iter().all(u8::is_ascii_hexdigit)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel-copy calibration is measured once per process and is a plain ratio: the
    /// set-up of every communicator of a process decides the same way.
    #[test]
    fn kernel_copy_ratio_is_measured_once_and_sane() {
        let first = kernel_copy_ratio();
        assert_eq!(first, kernel_copy_ratio());
        // reading this process's own memory is allowed wherever tests run (root, no seccomp)
        let r = first.expect("process_vm_readv of this process's own memory refused");
        assert!(r.is_finite() && r > 0.0 && r < 1000.0, "ratio {r}");
    }

    fn dir(tag: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("rr-shm-sweep-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn geo() -> Geometry {
        Geometry {
            local_size: 2,
            slot_bytes: 4096,
            ring_bytes: 4096,
        }
    }

    /// A pid that is surely dead: a child we started and reaped.
    fn dead_pid() -> u32 {
        let mut c = std::process::Command::new("true").spawn().unwrap();
        let pid = c.id();
        c.wait().unwrap();
        pid
    }

    #[test]
    fn the_sweep_removes_dead_jobs_segments_only() {
        let d = dir("a");
        // a live segment (this process is rank 0), a dead job's, a half-created one, a stranger
        let live = d.join("railring-live");
        let n = Node::open(&live, geo(), vec![0, 1], 0, "h".into(), true).unwrap();
        let dead = d.join("railring-dead");
        let m = Node::open(&dead, geo(), vec![0, 1], 0, "h".into(), true).unwrap();
        m.pid(0).store(dead_pid(), Ordering::Release);
        let half = d.join("railring-half");
        std::fs::write(&half, b"").unwrap();
        let other = d.join("not-ours");
        std::fs::write(&other, b"x").unwrap();
        // segments being built: by a dead creator (older than 1 s), by a live one (us)
        let dying = d.join(format!("railring-x.init-{}", dead_pid()));
        std::fs::write(&dying, b"").unwrap();
        let f = std::fs::File::options().write(true).open(&dying).unwrap();
        f.set_modified(std::time::SystemTime::now() - Duration::from_secs(5))
            .unwrap();
        let building = d.join(format!("railring-y.init-{}", std::process::id()));
        std::fs::write(&building, b"").unwrap();
        assert_eq!(sweep_stale(&d), 2);
        assert!(live.exists() && !dead.exists() && half.exists() && other.exists());
        assert!(!dying.exists() && building.exists());
        drop((n, m));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn the_jobs_own_files_go_whatever_their_age() {
        let d = std::env::temp_dir().join(format!("railring-sweepjob-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        // a segment its (killed) creator was still building, brand new; a GPU flag file; a
        // finished segment of the job; another job's segment, and one whose id extends ours
        let building = d.join(format!("railring-j0b-1f-ab.init-{}", dead_pid()));
        let flags = d.join("railring-gpu-j0b-1f-7-3");
        let done = d.join("railring-j0b-1f-ab");
        let other = d.join("railring-j0bx-1f-ab");
        let other2 = d.join("railring-k1-1f-ab.init-1");
        for f in [&building, &flags, &done, &other, &other2] {
            std::fs::write(f, b"").unwrap();
        }
        assert_eq!(sweep_stale(&d), 0, "too young for the general sweep");
        assert_eq!(sweep_job(&d, "j0b"), 3);
        assert!(!building.exists() && !flags.exists() && !done.exists());
        assert!(other.exists() && other2.exists());
        assert_eq!(sweep_job(&d, "-/"), 0, "an empty id removes nothing");
        assert!(other.exists() && other2.exists());
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A peer that publishes with [`Node::publish_order`] (a release store where this kernel
    /// has expedited membarriers) never leaves a parked peer asleep: 300 times a sleeper parks
    /// with a 5 s timeout and the publisher stores the flag once it is parked; a single lost
    /// wake-up would cost 5 s.
    #[test]
    fn a_parked_peer_wakes_for_every_published_flag() {
        let d = dir("bell");
        let path = d.join("railring-bell");
        let a = Node::open(&path, geo(), vec![0, 1], 0, "h".into(), true).unwrap();
        let b = Node::open(&path, geo(), vec![0, 1], 1, "h".into(), false).unwrap();
        assert_eq!(
            a.publish_order() == Ordering::Release,
            asymmetric_fence(),
            "release stores only with the sleepers' fence"
        );
        let rounds = 300u64;
        let sleeper = std::thread::spawn(move || {
            let t0 = std::time::Instant::now();
            let mut slowest = Duration::ZERO;
            for i in 1..=rounds {
                let t = std::time::Instant::now();
                while b.ready(0).load(Ordering::Acquire) < i {
                    b.park(
                        || b.ready(0).load(Ordering::Acquire) >= i,
                        Duration::from_secs(5),
                        true,
                    );
                }
                slowest = slowest.max(t.elapsed());
                b.ready(1).store(i, Ordering::SeqCst);
            }
            (slowest, t0.elapsed())
        });
        for i in 1..=rounds {
            // publish once the peer sleeps (or after 2 ms: it may not have got there yet)
            let t = std::time::Instant::now();
            while a.sleepers().load(Ordering::SeqCst) == 0 && t.elapsed() < Duration::from_millis(2)
            {
                std::hint::spin_loop();
            }
            a.ready(0).store(i, a.publish_order());
            a.ring_bell();
            while a.ready(1).load(Ordering::Acquire) < i {
                std::thread::yield_now();
            }
        }
        let (slowest, total) = sleeper.join().unwrap();
        assert!(
            slowest < Duration::from_secs(2),
            "a wake-up took {slowest:?} ({total:?} for {rounds})"
        );
        drop(a);
        let _ = std::fs::remove_dir_all(d);
    }

    /// Reads and writes between processes (here this process's own memory) land every byte
    /// whatever the placement of the two buffers within a line, directly and through the bounce
    /// buffer a skewed copy takes where the kernel copies such slowly, across its chunks.
    #[test]
    fn peer_copies_are_exact_at_every_placement() {
        let d = dir("skew");
        let node = Node::open(
            &d.join("railring-skew"),
            geo(),
            vec![0, 1],
            0,
            "h".into(),
            true,
        )
        .unwrap();
        let len = 2 * SKEW_BOUNCE + 4096;
        let src: Vec<u8> = (0..len as u32).map(|i| (i * 29 + 5) as u8).collect();
        let mut dst = vec![0u8; len + 128];
        let s0 = src.as_ptr().align_offset(64);
        let d0 = dst.as_ptr().align_offset(64);
        for skew in [0usize, 1, 16, 31, 32, 48] {
            for n in [1usize, 2048, 5000, SKEW_BOUNCE + 77, 2 * SKEW_BOUNCE + 100] {
                for write in [false, true] {
                    for bounce in [false, true] {
                        let from = s0 + 8;
                        let at = d0 + (8 + skew) % 64;
                        if from + n > len {
                            continue;
                        }
                        dst.fill(0xAA);
                        let (l, r) = (dst[at..].as_mut_ptr(), src[from..].as_ptr());
                        // SAFETY: both ranges lie inside live buffers of this process
                        let done = unsafe {
                            match (write, bounce) {
                                // a write copies from `local` to the "remote" range: here the
                                // destination is `dst` either way
                                (false, false) => node.peer_read(0, l, r as usize, n),
                                (false, true) => node.bounced_copy(0, l, r as usize, n, false),
                                (true, false) => node.peer_write(0, r, l as usize, n),
                                (true, true) => {
                                    node.bounced_copy(0, r as *mut u8, l as usize, n, true)
                                }
                            }
                        };
                        done.unwrap();
                        let what = format!("skew {skew} n {n} write {write} bounce {bounce}");
                        assert!(dst[at..at + n] == src[from..from + n], "{what}");
                        assert!(dst[..at].iter().all(|&b| b == 0xAA), "{what}");
                        assert!(dst[at + n..].iter().all(|&b| b == 0xAA), "{what}");
                    }
                }
            }
        }
        drop(node);
        let _ = std::fs::remove_dir_all(d);
    }

    #[test]
    fn a_segment_that_does_not_fit_is_a_clear_error() {
        // /dev/shm is a tmpfs; a segment larger than it is refused at creation, not by SIGBUS
        // (tmpfs refuses a fallocate larger than the whole file system before allocating).
        let Some((size, _)) = statvfs(Path::new("/dev/shm")) else {
            return;
        };
        let path = PathBuf::from(format!("/dev/shm/railring-fit-test-{}", std::process::id()));
        let too_big = Geometry {
            local_size: 1,
            slot_bytes: (size as usize / 2).next_multiple_of(4096),
            ring_bytes: 4096,
        };
        match Node::open(&path, too_big, vec![0], 0, "h".into(), true) {
            Ok(_) => panic!(
                "a {} byte segment fit in a {size} byte /dev/shm",
                too_big.total()
            ),
            Err(e) => {
                let m = e.to_string();
                assert!(
                    m.contains("needs")
                        && m.contains("MiB free")
                        && m.contains("RAILRING_SHM_SLOT"),
                    "{m}"
                );
            }
        }
        assert!(!path.exists(), "the failed segment was removed");
    }
}

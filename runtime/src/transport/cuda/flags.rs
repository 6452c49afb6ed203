//! The host flag segment of a node's GPU fabric: per local rank `ready`, `reduced` and `done`
//! generation counters, its pid and its call descriptors, in a small shared-memory mapping
//! ([`FlagSeg`]) — how local ranks synchronise around device copies and kernels. Created by
//! local rank 0, mapped by the others, unlinked once all have mapped it.

use super::setup::FabricSetup;
use crate::error::{Error, Result};
use crate::transport::DESC;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

const FMAGIC: u64 = 0x5241_494c_4750_5531; // "RAILGPU1"
const FHDR: usize = 64;
const FCTL: usize = 384;

/// Per local rank: `ready`, `reduced`, `done` generation counters on their own cache lines,
/// its pid, and the call descriptor of each slot.
pub(super) struct FlagSeg {
    seg: crate::transport::shm::Segment,
}

impl FlagSeg {
    pub(super) fn map(path: &std::path::Path, l: usize, create: bool) -> io::Result<FlagSeg> {
        let len = FHDR + l * FCTL;
        let seg = crate::transport::shm::Segment::map(path, len, create)?;
        let s = FlagSeg { seg };
        if create {
            s.at::<AtomicU64>(0).store(FMAGIC, Ordering::Release);
        } else if s.at::<AtomicU64>(0).load(Ordering::Acquire) != FMAGIC {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "not a railring GPU flag segment",
            ));
        }
        Ok(s)
    }
    fn at<T>(&self, off: usize) -> &T {
        debug_assert!(off + std::mem::size_of::<T>() <= self.seg.len());
        // SAFETY: offsets are inside the mapping and 8-aligned; atomics accept any bits.
        unsafe { &*(self.seg.base().add(off) as *const T) }
    }
    pub(super) fn ready(&self, i: usize) -> &AtomicU64 {
        self.at(FHDR + i * FCTL)
    }
    pub(super) fn reduced(&self, i: usize) -> &AtomicU64 {
        self.at(FHDR + i * FCTL + 64)
    }
    pub(super) fn done(&self, i: usize) -> &AtomicU64 {
        self.at(FHDR + i * FCTL + 128)
    }
    pub(super) fn pid(&self, i: usize) -> &AtomicU32 {
        self.at(FHDR + i * FCTL + 192)
    }
    pub(super) fn desc(&self, i: usize, slot: usize) -> *mut u8 {
        // SAFETY: bytes 256..384 of the control block.
        unsafe { self.seg.base().add(FHDR + i * FCTL + 256 + slot * DESC) }
    }
    pub(super) fn alive(&self, i: usize) -> bool {
        let pid = self.pid(i).load(Ordering::Acquire);
        if pid == 0 {
            return true;
        }
        // SAFETY: signal 0 only checks for existence.
        let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
        r == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
    }
}

fn fnv(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// Where a node's GPU flag segment lives: its `tag` is random, chosen by local rank 0 and
/// published through the job's store, so no other user can predict or take the name.
pub fn flags_path(job: &str, comm: u64, epoch: u64, host_id: &str, tag: &str) -> PathBuf {
    let clean = |s: &str| -> String {
        s.chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .take(32)
            .collect()
    };
    PathBuf::from(format!(
        "/dev/shm/railring-gpu-{}-{comm:x}-{epoch}-{:x}-{}",
        clean(job),
        fnv(host_id),
        clean(tag)
    ))
}

pub(super) fn open_flags(s: &FabricSetup<'_>, l: usize) -> Result<FlagSeg> {
    let rank = s.local[s.me];
    let prefix = s.prefix();
    let err = |what: &str, path: &std::path::Path, e: io::Error| Error::Shm {
        rank,
        what: format!("{what} {}", path.display()),
        err: e,
    };
    let (seg, path) = if s.me == 0 {
        let tag = crate::transport::shm::segment_tag()
            .map_err(|e| err("choosing a name for", std::path::Path::new("/dev/shm"), e))?;
        let path = flags_path(s.job, s.comm, s.epoch, s.host_id, &tag);
        let f = FlagSeg::map(&path, l, true).map_err(|e| err("creating", &path, e))?;
        s.store.set(&format!("{prefix}/flags"), tag.as_bytes())?;
        (f, path)
    } else {
        let tag = s.store.get(&format!("{prefix}/flags"), s.timeout)?;
        let path = flags_path(
            s.job,
            s.comm,
            s.epoch,
            s.host_id,
            &String::from_utf8_lossy(&tag),
        );
        if !crate::transport::shm::valid_tag(&tag) {
            let bad = io::Error::new(io::ErrorKind::InvalidData, "no valid name in the store");
            return Err(err("opening", &path, bad));
        }
        (
            FlagSeg::map(&path, l, false).map_err(|e| err("opening", &path, e))?,
            path,
        )
    };
    if s.store.add(&format!("{prefix}/flags-mapped"), 1)? == l as i64 {
        let _ = std::fs::remove_file(&path);
    }
    Ok(seg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_paths_are_clean() {
        let p = flags_path("job/../x y", 0x1f, 7, "host-a", "0a/1");
        let s = p.to_string_lossy();
        assert!(s.starts_with("/dev/shm/railring-gpu-jobxy-1f-7-"), "{s}");
        assert!(s.ends_with("-0a1"), "{s}");
        assert_ne!(
            flags_path("j", 1, 1, "a", "t"),
            flags_path("j", 1, 1, "b", "t")
        );
        assert_ne!(
            flags_path("j", 1, 1, "a", "t"),
            flags_path("j", 1, 1, "a", "u")
        );
    }

    #[test]
    fn flag_segment_round_trip() {
        let path = std::env::temp_dir().join(format!("rr-gpu-flags-test-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let a = FlagSeg::map(&path, 3, true).unwrap();
        let b = FlagSeg::map(&path, 3, false).unwrap();
        a.ready(2).store(9, Ordering::Release);
        assert_eq!(b.ready(2).load(Ordering::Acquire), 9);
        b.pid(1).store(std::process::id(), Ordering::Release);
        assert!(a.alive(1));
        assert!(a.alive(0), "unset pid counts as alive (not started)");
        assert!(
            FlagSeg::map(&path, 4, false).is_err(),
            "too small for 4 ranks"
        );
        std::fs::write(&path, vec![0u8; 4096]).unwrap();
        assert!(FlagSeg::map(&path, 3, false).is_err(), "wrong magic");
        let _ = std::fs::remove_file(&path);
    }
}

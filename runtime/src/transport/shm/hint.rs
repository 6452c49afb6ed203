//! Cache-line hand-over hints for the one-round small calls.
//!
//! A small call's data travels in one header line per rank: the writer stores it, the readers
//! load it, and the writer stores the line of a later generation after the readers read it.
//! Both moves cost a cross-core transfer on the critical path: a reader's load is served by a
//! snoop of the writer's private cache, and the writer's store needs the line back (the
//! request-for-ownership) before it leaves the store buffer — stores leave it in order, so
//! every store after it waits too. Two instructions take those transfers off the path:
//!
//! - `cldemote` (after publishing a line peers read): pushes it to the shared last-level cache,
//!   where the readers' loads find it;
//! - `prefetchw` (of this rank's next line): takes ownership of it now, while the call goes on,
//!   so the next call's stores find it writable;
//! - `prefetcht0` (a small reduce's root, of the lines it is about to wait for and read:
//!   [`fetch`]): starts their transfers at once, so they overlap.
//!
//! All are hints: they change no memory and cannot fault. The first two run only where the CPU
//! says it has them (CPUID; `prefetcht0` every x86-64 CPU has), and none but on x86-64. 2
//! ranks, 8 B broadcast: 0.09–0.10 µs a call without the first two, 0.07 with (Open MPI 0.08).

/// Which hints this CPU has (asked once).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Hints {
    demote: bool,
    own: bool,
}

impl Hints {
    #[allow(unused_unsafe)]
    pub(super) fn detect() -> Hints {
        #[cfg(target_arch = "x86_64")]
        {
            use core::arch::x86_64::__cpuid_count;
            // (CPUID became a safe function in later Rust releases than the oldest we build with)
            // SAFETY: CPUID exists on every x86-64 CPU; leaves above the maximum read as zero
            // or as the highest leaf, so each bit is checked against the leaf count first.
            let (max, max_ext) =
                unsafe { (__cpuid_count(0, 0).eax, __cpuid_count(0x8000_0000, 0).eax) };
            // CPUID.(EAX=7,ECX=0):ECX bit 25: CLDEMOTE
            let demote = max >= 7 && unsafe { __cpuid_count(7, 0).ecx } & (1 << 25) != 0;
            // CPUID.80000001H:ECX bit 8: PREFETCHW
            let own = max_ext >= 0x8000_0001
                && unsafe { __cpuid_count(0x8000_0001, 0).ecx } & (1 << 8) != 0;
            Hints { demote, own }
        }
        #[cfg(not(target_arch = "x86_64"))]
        Hints::default()
    }

    /// Push the `lines` cache lines from `p` towards the shared cache.
    #[inline]
    pub(super) fn demote(&self, p: *const u8, lines: usize) {
        // SAFETY (both hints): a hint on the line holding the address; it neither reads nor
        // writes memory and does not fault, whatever the address.
        #[cfg(target_arch = "x86_64")]
        each_line(self.demote, p, lines, |a| unsafe {
            std::arch::asm!("cldemote [{0}]", in(reg) a, options(nostack, preserves_flags, readonly))
        });
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (p, lines);
    }

    /// Ask for ownership of the `lines` cache lines from `p` ahead of writing them.
    #[inline]
    pub(super) fn own(&self, p: *const u8, lines: usize) {
        // SAFETY: as in `demote`.
        #[cfg(target_arch = "x86_64")]
        each_line(self.own, p, lines, |a| unsafe {
            std::arch::asm!("prefetchw [{0}]", in(reg) a, options(nostack, preserves_flags, readonly))
        });
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (p, lines);
    }
}

/// Start loading the `lines` cache lines from `p` into this CPU's cache (`prefetcht0`, in
/// every x86-64 CPU), for a read that waits on a flag first.
#[inline]
pub(super) fn fetch(p: *const u8, lines: usize) {
    #[cfg(target_arch = "x86_64")]
    each_line(true, p, lines, |a| unsafe {
        // SAFETY: a hint, as in `Hints::demote`.
        std::arch::asm!("prefetcht0 [{0}]", in(reg) a, options(nostack, preserves_flags, readonly))
    });
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, lines);
}

/// `hint` on each of the `lines` cache lines from `p`, when the CPU has it (`on`).
#[cfg(target_arch = "x86_64")]
#[inline]
fn each_line(on: bool, p: *const u8, lines: usize, hint: impl Fn(*const u8)) {
    if on {
        for k in 0..lines {
            hint(p.wrapping_add(k * 64));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_match_the_cpu_flags_and_change_no_memory() {
        let h = Hints::detect();
        let mut v = vec![7u8; 4096];
        let p = v.as_mut_ptr();
        h.demote(p, 64);
        h.own(p, 64);
        fetch(p, 64);
        assert!(v.iter().all(|&b| b == 7));
        // what CPUID says is what the kernel says (its flags for the two instructions)
        #[cfg(target_arch = "x86_64")]
        if let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") {
            let flags: Vec<&str> = info
                .lines()
                .find(|l| l.starts_with("flags"))
                .map(|l| l.split_whitespace().collect())
                .unwrap_or_default();
            assert_eq!(h.demote, flags.contains(&"cldemote"), "{h:?}");
            assert_eq!(h.own, flags.contains(&"3dnowprefetch"), "{h:?}");
        }
        #[cfg(not(target_arch = "x86_64"))]
        assert!(!h.demote && !h.own);
    }
}

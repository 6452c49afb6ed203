//! The registration cache ([`MrCache`]): memory registrations keyed by (ptr, len), reused for
//! requests inside them, LRU-bounded. Pure over the registration handle type (tested without an
//! HCA); the link's handles are verbs memory regions.

use crate::transport::MemKind;
use std::io;

/// A cache of memory registrations keyed by (ptr, len): a request inside an existing
/// registration reuses it; the least recently used entry is deregistered when full.
///
/// Registrations are not invalidated when memory is freed (verbs offers no hook): owners of
/// buffers that are freed and reallocated call [`MrCache::invalidate`].
pub struct MrCache<H> {
    entries: Vec<MrEntry<H>>,
    cap: usize,
    tick: u64,
    pub hits: u64,
    pub misses: u64,
}

struct MrEntry<H> {
    ptr: usize,
    len: usize,
    mem: MemKind,
    handle: H,
    used: u64,
}

impl<H: Clone> MrCache<H> {
    pub fn new(cap: usize) -> MrCache<H> {
        MrCache {
            entries: Vec::new(),
            cap: cap.max(1),
            tick: 0,
            hits: 0,
            misses: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The registration covering `[ptr, ptr+len)` of kind `mem`, registering it with `reg` on a
    /// miss (evicting with `dereg` when full).
    pub fn get_or_register(
        &mut self,
        ptr: usize,
        len: usize,
        mem: MemKind,
        reg: impl FnOnce(usize, usize) -> io::Result<H>,
        mut dereg: impl FnMut(H),
    ) -> io::Result<H> {
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "cannot register an empty buffer",
            ));
        }
        let end = ptr
            .checked_add(len)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "buffer wraps around"))?;
        self.tick += 1;
        if let Some(e) = self
            .entries
            .iter_mut()
            .find(|e| e.mem == mem && e.ptr <= ptr && end <= e.ptr + e.len)
        {
            e.used = self.tick;
            self.hits += 1;
            return Ok(e.handle.clone());
        }
        self.misses += 1;
        let handle = reg(ptr, len)?;
        if self.entries.len() >= self.cap {
            if let Some((i, _)) = self.entries.iter().enumerate().min_by_key(|(_, e)| e.used) {
                dereg(self.entries.swap_remove(i).handle);
            }
        }
        self.entries.push(MrEntry {
            ptr,
            len,
            mem,
            handle: handle.clone(),
            used: self.tick,
        });
        Ok(handle)
    }

    /// Drop every registration overlapping `[ptr, ptr+len)`.
    pub fn invalidate(&mut self, ptr: usize, len: usize, mut dereg: impl FnMut(H)) {
        let end = ptr.saturating_add(len);
        let mut i = 0;
        while i < self.entries.len() {
            let e = &self.entries[i];
            if e.ptr < end && ptr < e.ptr + e.len {
                dereg(self.entries.swap_remove(i).handle);
            } else {
                i += 1;
            }
        }
    }

    /// Remove everything (deregistering through `dereg`).
    pub fn clear(&mut self, mut dereg: impl FnMut(H)) {
        for e in self.entries.drain(..) {
            dereg(e.handle);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    #[test]
    fn mr_cache_hits_contained_ranges_and_evicts_lru() {
        let regs = RefCell::new(Vec::<(usize, usize)>::new());
        let deregs = RefCell::new(Vec::<u32>::new());
        let mut c: MrCache<u32> = MrCache::new(2);
        let mut next = 0u32;
        let mut get = |c: &mut MrCache<u32>, p: usize, l: usize| {
            c.get_or_register(
                p,
                l,
                MemKind::Host,
                |p, l| {
                    regs.borrow_mut().push((p, l));
                    next += 1;
                    Ok(next)
                },
                |h| deregs.borrow_mut().push(h),
            )
            .unwrap()
        };
        let a = get(&mut c, 0x1000, 0x1000);
        assert_eq!(get(&mut c, 0x1000, 0x1000), a, "exact hit");
        assert_eq!(get(&mut c, 0x1800, 0x100), a, "contained hit");
        let b = get(&mut c, 0x8000, 0x10);
        assert_ne!(a, b);
        assert_eq!(c.hits, 2);
        assert_eq!(c.misses, 2);
        get(&mut c, 0x1000, 0x10); // touch a: b is now the LRU
        let d = get(&mut c, 0x20000, 0x10);
        assert_eq!(*deregs.borrow(), vec![b], "LRU evicted");
        assert_eq!(c.len(), 2);
        // a range straddling a registration is a miss
        let e = get(&mut c, 0x1f00, 0x200);
        assert!(e != a && e != d);
        assert_eq!(regs.borrow().len(), 4);
        // invalidation removes overlapping entries
        c.invalidate(0x1f80, 1, |h| deregs.borrow_mut().push(h));
        assert_eq!(c.len(), 1);
        // device memory is keyed separately
        let dev = c
            .get_or_register(
                0x20000,
                0x10,
                MemKind::Device { ordinal: 0 },
                |_, _| Ok(99),
                |_| {},
            )
            .unwrap();
        assert_eq!(dev, 99);
        assert!(c
            .get_or_register(0x1, 0, MemKind::Host, |_, _| Ok(1), |_| {})
            .is_err());
        c.clear(|h| deregs.borrow_mut().push(h));
        assert!(c.is_empty());
    }
}

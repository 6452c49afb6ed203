//! The communicator's lock, biased to the thread that made the communicator.
//!
//! Nearly every program calls a communicator from one thread. A plain mutex costs that thread
//! two atomic read-modify-writes a call, and on x86 each is a full fence: it waits until every
//! store before it has left the store buffer — among them the header line a peer polls, whose
//! cache line the peer holds. For an 8-byte broadcast that wait is a large part of the call.
//!
//! Here the owner thread takes the lock with plain stores: it marks itself busy, then checks
//! that the bias still stands. Any other thread revokes the bias once and for all: it sets
//! `revoked`, makes every running thread execute a full barrier ([`shm::heavy_fence`], an
//! expedited `membarrier`) and waits until the owner is not busy; from then on every thread,
//! the owner included, takes the mutex. The barrier is what makes the owner's store-then-load
//! safe without a fence of its own (an asymmetric Dekker): after it, either the owner's busy
//! mark is visible to the revoker or the owner's check sees `revoked`. Where the kernel has no
//! expedited membarrier the lock starts revoked (a plain mutex).

use crate::transport::shm;
use std::cell::{Cell, UnsafeCell};
use std::sync::atomic::{compiler_fence, AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

/// A small number naming the calling thread (0 is never one): a thread-local read, where
/// `std::thread::current()` would clone an `Arc` (an atomic increment) every call.
fn thread_tag() -> u64 {
    thread_local! {
        static TAG: Cell<u64> = const { Cell::new(0) };
    }
    static NEXT: AtomicU64 = AtomicU64::new(1);
    TAG.with(|t| match t.get() {
        0 => {
            let v = NEXT.fetch_add(1, Ordering::Relaxed);
            t.set(v);
            v
        }
        v => v,
    })
}

pub(super) struct BiasedLock<T> {
    /// The thread the lock is biased to.
    owner: u64,
    /// The owner holds the lock without the mutex.
    busy: AtomicBool,
    /// Set once, by the first other thread that locks (or at creation without membarrier).
    revoked: AtomicBool,
    slow: Mutex<()>,
    cell: UnsafeCell<T>,
}

// SAFETY: the lock hands out `&mut T` to one thread at a time (see `lock`), so sharing it across
// threads is sound whenever `T` may be sent between them, as with `Mutex<T>`.
unsafe impl<T: Send> Sync for BiasedLock<T> {}

pub(super) struct BiasedGuard<'a, T> {
    lock: &'a BiasedLock<T>,
    /// `None`: held by the owner on the biased path.
    slow: Option<MutexGuard<'a, ()>>,
}

impl<T> BiasedLock<T> {
    /// A lock biased to the calling thread (unbiased where the asymmetric fence is missing).
    pub(super) fn new(v: T) -> BiasedLock<T> {
        BiasedLock {
            owner: thread_tag(),
            busy: AtomicBool::new(false),
            revoked: AtomicBool::new(!shm::asymmetric_fence()),
            slow: Mutex::new(()),
            cell: UnsafeCell::new(v),
        }
    }

    pub(super) fn lock(&self) -> BiasedGuard<'_, T> {
        if !self.revoked.load(Ordering::Relaxed) && self.owner == thread_tag() {
            self.busy.store(true, Ordering::Relaxed);
            // The revoker's barrier orders this store before the load on the hardware; the
            // compiler must not reorder them either.
            compiler_fence(Ordering::SeqCst);
            if !self.revoked.load(Ordering::Acquire) {
                return BiasedGuard {
                    lock: self,
                    slow: None,
                };
            }
            self.busy.store(false, Ordering::Release);
        }
        let m = self.slow.lock().unwrap_or_else(|e| e.into_inner());
        if !self.revoked.load(Ordering::Relaxed) {
            self.revoke();
        }
        BiasedGuard {
            lock: self,
            slow: Some(m),
        }
    }

    /// End the bias (called with the mutex held, once): afterwards the owner takes the mutex too.
    fn revoke(&self) {
        self.revoked.store(true, Ordering::SeqCst);
        if !shm::heavy_fence() {
            // Registered but refused (not expected): a store the owner made before its check
            // leaves its store buffer within nanoseconds, and a preempted thread's on the
            // context switch; wait well past that before trusting `busy`.
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        while self.busy.load(Ordering::Acquire) {
            std::thread::yield_now();
        }
    }

    /// Whether the owner still takes the lock without the mutex (tests).
    #[cfg(test)]
    fn biased(&self) -> bool {
        !self.revoked.load(Ordering::SeqCst)
    }
}

impl<T> std::ops::Deref for BiasedGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard is the only holder of the lock (see `BiasedLock::lock`).
        unsafe { &*self.lock.cell.get() }
    }
}

impl<T> std::ops::DerefMut for BiasedGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`; `&mut self` makes this borrow unique.
        unsafe { &mut *self.lock.cell.get() }
    }
}

impl<T> Drop for BiasedGuard<'_, T> {
    fn drop(&mut self) {
        if self.slow.is_none() {
            self.lock.busy.store(false, Ordering::Release);
        }
        // A mutex guard unlocks when it drops after this.
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Take the lock `n` times, each time checking that nobody else holds it (the `.1` mark)
    /// and counting (`.0`).
    fn hold_and_count(l: &BiasedLock<(u64, bool)>, n: usize) {
        for _ in 0..n {
            let mut g = l.lock();
            assert!(!g.1, "two holders at once");
            g.1 = true;
            g.0 += 1;
            std::hint::spin_loop();
            g.1 = false;
        }
    }

    #[test]
    fn the_owner_and_other_threads_never_hold_it_together() {
        let l = Arc::new(BiasedLock::new((0u64, false)));
        // The owner alone: the bias stands.
        for _ in 0..1000 {
            l.lock().0 += 1;
        }
        assert_eq!(l.biased(), shm::asymmetric_fence());
        // Others start while the owner keeps locking: every increment must count, and nobody
        // may find the lock taken (the `.1` mark) while holding it.
        let others: Vec<_> = (0..3)
            .map(|_| {
                let l = l.clone();
                std::thread::spawn(move || {
                    hold_and_count(&l, 20_000);
                })
            })
            .collect();
        hold_and_count(&l, 20_000);
        for t in others {
            t.join().unwrap();
        }
        assert_eq!(l.lock().0, 1000 + 4 * 20_000);
        assert!(!l.biased(), "another thread's lock ends the bias");
    }

    #[test]
    fn a_revoker_waits_for_the_owner_to_let_go() {
        let l = Arc::new(BiasedLock::new(0u32));
        let g = l.lock();
        let (tx, rx) = std::sync::mpsc::channel();
        let l2 = l.clone();
        let t = std::thread::spawn(move || {
            let mut g = l2.lock();
            *g += 1;
            tx.send(*g).unwrap();
        });
        // The other thread cannot get in while the owner holds it.
        assert!(rx
            .recv_timeout(std::time::Duration::from_millis(200))
            .is_err());
        drop(g);
        assert_eq!(rx.recv().unwrap(), 1);
        t.join().unwrap();
        *l.lock() += 1;
        assert_eq!(*l.lock(), 2);
    }
}

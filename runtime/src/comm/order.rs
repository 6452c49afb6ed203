//! Call ordering: calls run in the order they are made. Blocking calls run on the caller's
//! thread; `*_start` calls run on one worker thread; once a worker exists, every call takes a
//! ticket so blocking and non-blocking calls keep program order. [`Pending`] is the handle of a
//! started call.

use super::call::Inner;
use super::{Communicator, Shared};
use crate::error::{Error, Result};
use std::sync::{mpsc, Arc, Mutex};

/// Work for the communicator's worker thread.
pub(super) type Job = Box<dyn FnOnce() + Send>;

/// The call-order tickets: `next` is the next ticket to hand out, `now` the one whose turn it
/// is, `waiting` how many threads sleep on the turn's condition variable (a call's end wakes
/// them only when there are any: a wake is a system call even when nobody sleeps).
#[derive(Default)]
pub(super) struct Turn {
    next: u64,
    now: u64,
    waiting: u32,
}

/// Where a started call's result goes: filled once by the worker, taken once by its
/// [`Pending`]. The waiting thread parks only when the result is not there yet, and the worker
/// unparks it only then: a call that is already done when waited for costs two uncontended
/// locks, no system call and no allocation beyond this slot.
struct Slot<T> {
    state: Mutex<SlotState<T>>,
}

struct SlotState<T> {
    result: Option<Result<T>>,
    /// Set by a worker that ends without filling the slot (its thread is gone).
    abandoned: bool,
    waiter: Option<std::thread::Thread>,
}

impl<T> Slot<T> {
    fn new() -> Arc<Slot<T>> {
        Arc::new(Slot {
            state: Mutex::new(SlotState {
                result: None,
                abandoned: false,
                waiter: None,
            }),
        })
    }
    fn lock(&self) -> std::sync::MutexGuard<'_, SlotState<T>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
    fn fill(&self, r: Result<T>) {
        let waiter = {
            let mut st = self.lock();
            st.result = Some(r);
            st.waiter.take()
        };
        if let Some(t) = waiter {
            t.unpark();
        }
    }
}

/// Fills a slot on drop: the worker's job owns one, so a job dropped unrun (the worker is
/// gone) or one that panics still ends its [`Pending`] with an error instead of a hang.
struct Filler<T>(Option<Arc<Slot<T>>>);

impl<T> Filler<T> {
    fn fill(mut self, r: Result<T>) {
        if let Some(s) = self.0.take() {
            s.fill(r);
        }
    }
}

impl<T> Drop for Filler<T> {
    fn drop(&mut self) {
        if let Some(s) = self.0.take() {
            let waiter = {
                let mut st = s.lock();
                st.abandoned = true;
                st.waiter.take()
            };
            if let Some(t) = waiter {
                t.unpark();
            }
        }
    }
}

/// A non-blocking operation in flight. `wait` returns its buffer.
#[must_use = "a started collective must be waited for"]
pub struct Pending<T> {
    slot: Arc<Slot<T>>,
}

impl<T> Pending<T> {
    /// A pending call that has already ended with `r`.
    pub(super) fn done(r: Result<T>) -> Pending<T> {
        let slot = Slot::new();
        slot.fill(r);
        Pending { slot }
    }

    fn gone() -> Error {
        Error::Poisoned("the communicator's worker thread is gone".into())
    }

    /// Block until the operation completes.
    pub fn wait(self) -> Result<T> {
        let mut st = self.slot.lock();
        loop {
            if let Some(r) = st.result.take() {
                return r;
            }
            if st.abandoned {
                return Err(Self::gone());
            }
            st.waiter = Some(std::thread::current());
            drop(st);
            std::thread::park();
            st = self.slot.lock();
        }
    }

    /// The result if the operation has completed, else the pending operation back.
    pub fn test(self) -> std::result::Result<Result<T>, Pending<T>> {
        let r = {
            let mut st = self.slot.lock();
            match st.result.take() {
                Some(r) => Some(r),
                None if st.abandoned => Some(Err(Self::gone())),
                None => None,
            }
        };
        r.ok_or(self)
    }
}

impl Communicator {
    fn ticket(&self) -> u64 {
        let mut t = self.sh.turn.lock().unwrap_or_else(|e| e.into_inner());
        let k = t.next;
        t.next += 1;
        k
    }

    pub(super) fn run<R>(
        sh: &Shared,
        ticket: u64,
        f: impl FnOnce(&mut Inner) -> Result<R>,
    ) -> Result<R> {
        {
            let mut t = sh.turn.lock().unwrap_or_else(|e| e.into_inner());
            while t.now != ticket {
                t.waiting += 1;
                t = sh.turn_cv.wait(t).unwrap_or_else(|e| e.into_inner());
                t.waiting -= 1;
            }
        }
        let r = {
            let mut g = sh.inner.lock().unwrap_or_else(|e| e.into_inner());
            Inner::guarded(&mut g, f)
        };
        let mut t = sh.turn.lock().unwrap_or_else(|e| e.into_inner());
        t.now += 1;
        if t.waiting > 0 {
            sh.turn_cv.notify_all();
        }
        r
    }

    pub(super) fn blocking<R>(&self, f: impl FnOnce(&mut Inner) -> Result<R>) -> Result<R> {
        // Until a non-blocking call has started the worker, calls run in the caller's order and
        // need no tickets: the fast path for small messages is one uncontended lock.
        let worker_started = self
            .sh
            .worker_started
            .load(std::sync::atomic::Ordering::Acquire);
        if !worker_started {
            let mut g = self.lock();
            return Inner::guarded(&mut g, f);
        }
        let t = self.ticket();
        Self::run(&self.sh, t, f)
    }

    pub(super) fn submit<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Inner) -> Result<R> + Send + 'static,
    ) -> Pending<R> {
        let slot = Slot::new();
        let filler = Filler(Some(slot.clone()));
        let t = self.ticket();
        let sh = self.sh.clone();
        let job: Job = Box::new(move || {
            let r = Self::run(&sh, t, f);
            filler.fill(r);
        });
        let mut w = self.sh.worker.lock().unwrap_or_else(|e| e.into_inner());
        if w.is_none() {
            let (jtx, jrx) = mpsc::channel::<Job>();
            let spawned = std::thread::Builder::new()
                .name("railring-worker".into())
                .spawn(move || {
                    while let Ok(j) = jrx.recv() {
                        j();
                    }
                });
            if spawned.is_ok() {
                *w = Some(jtx);
                self.sh
                    .worker_started
                    .store(true, std::sync::atomic::Ordering::Release);
            }
        }
        match w.as_ref() {
            Some(s) => {
                if let Err(mpsc::SendError(j)) = s.send(job) {
                    j();
                }
            }
            None => job(),
        }
        Pending { slot }
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        // Stop the worker (pending jobs still run: the sender is dropped after them).
        if let Ok(mut w) = self.sh.worker.lock() {
            w.take();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_result_filled_before_or_after_the_wait_arrives_once() {
        let p = Pending::done(Ok(7u32));
        assert_eq!(p.wait().unwrap(), 7);
        // the waiter parks first, the worker fills later
        let slot = Slot::<Vec<u8>>::new();
        let f = Filler(Some(slot.clone()));
        let p = Pending { slot };
        let p = p.test().expect_err("nothing filled yet");
        let t = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(50));
            f.fill(Ok(vec![1, 2, 3]));
        });
        assert_eq!(p.wait().unwrap(), vec![1, 2, 3]);
        t.join().unwrap();
    }

    #[test]
    fn a_job_dropped_unrun_or_panicking_ends_its_pending_with_an_error() {
        let slot = Slot::<u8>::new();
        let f = Filler(Some(slot.clone()));
        let p = Pending { slot };
        let t = std::thread::spawn(move || {
            let _f = f;
            std::thread::sleep(std::time::Duration::from_millis(50));
            panic!("the job panicked");
        });
        let e = p.wait().unwrap_err().to_string();
        assert!(e.contains("worker thread is gone"), "{e}");
        assert!(t.join().is_err());
        let slot = Slot::<u8>::new();
        drop(Filler(Some(slot.clone())));
        let e = Pending { slot }
            .test()
            .ok()
            .unwrap()
            .unwrap_err()
            .to_string();
        assert!(e.contains("worker thread is gone"), "{e}");
    }
}

//! Call ordering: calls run in the order they are made. Blocking calls run on the caller's
//! thread; `*_start` calls run on one worker thread — or, when a host-memory call is waited for
//! before the worker has taken it up, on the waiting thread (it claims the call: a start
//! followed at once by its wait then costs no hand-over to the worker and back, which on a
//! rank pinned to one core is two context switches). Once a worker exists, every call takes a
//! ticket so blocking and non-blocking calls keep program order (a claimed call still waits for
//! its ticket's turn). [`Pending`] is the handle of a started call.

use super::call::Inner;
use super::{Communicator, Shared};
use crate::error::{Error, Result};
use std::sync::{mpsc, Arc, Mutex};

/// Work for the communicator's worker thread.
pub(super) type Job = Box<dyn FnOnce() + Send>;

/// A started call's work until someone runs it: the worker, or a thread that waits for the call
/// first ([`Pending::wait`]); whoever takes it out runs it, the other finds it gone.
type JobCell = Mutex<Option<Job>>;
/// What the worker's queue holds: a started call's [`JobCell`].
pub(super) type Queued = Arc<JobCell>;

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
    /// The call's work while nobody has taken it up, with the call order it waits its turn in
    /// (`None`: never claimable here, e.g. device calls, which run on the worker's thread and
    /// its CUDA context).
    job: Option<Claim>,
}

/// What a waiter needs to claim a started call: its work and its place in the call order.
struct Claim {
    cell: Arc<JobCell>,
    sh: Arc<Shared>,
    ticket: u64,
}

impl Claim {
    /// The call's work, when it is the call whose turn it is and the worker has not taken it
    /// up. (A call further back is left to the worker: waiting for its turn here would wake
    /// this thread at the end of every call before it.)
    fn take(&self) -> Option<Job> {
        let now = self.sh.turn.lock().unwrap_or_else(|e| e.into_inner()).now;
        if now == self.ticket {
            take_job(&self.cell)
        } else {
            None
        }
    }
}

impl<T> Pending<T> {
    /// A pending call that has already ended with `r`.
    pub(super) fn done(r: Result<T>) -> Pending<T> {
        let slot = Slot::new();
        slot.fill(r);
        Pending { slot, job: None }
    }

    fn gone() -> Error {
        Error::Poisoned("the communicator's worker thread is gone".into())
    }

    /// Block until the operation completes (running it on this thread when the worker has not
    /// taken it up yet).
    pub fn wait(self) -> Result<T> {
        let claimed = self.job.as_ref().and_then(Claim::take);
        if let Some(j) = claimed {
            j();
        }
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

fn take_job(cell: &JobCell) -> Option<Job> {
    cell.lock().unwrap_or_else(|e| e.into_inner()).take()
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
            let mut g = sh.inner.lock();
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
        // need no tickets: the fast path for small messages is one uncontended lock
        // (on the owner thread two plain stores: see `bias`).
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

    /// Start a host-memory call: on the worker, or on the thread that waits for it first.
    pub(super) fn submit<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Inner) -> Result<R> + Send + 'static,
    ) -> Pending<R> {
        self.submit_on(f, true)
    }

    /// Start a call that must run on the worker's thread (device calls: its CUDA context).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(super) fn submit_to_worker<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Inner) -> Result<R> + Send + 'static,
    ) -> Pending<R> {
        self.submit_on(f, false)
    }

    fn submit_on<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Inner) -> Result<R> + Send + 'static,
        claimable: bool,
    ) -> Pending<R> {
        let slot = Slot::new();
        let filler = Filler(Some(slot.clone()));
        let t = self.ticket();
        let sh = self.sh.clone();
        let job: Job = Box::new(move || {
            let r = Self::run(&sh, t, f);
            filler.fill(r);
        });
        let cell: Arc<JobCell> = Arc::new(Mutex::new(Some(job)));
        let mut w = self.sh.worker.lock().unwrap_or_else(|e| e.into_inner());
        if w.is_none() {
            let (jtx, jrx) = mpsc::channel::<Queued>();
            #[cfg(test)]
            let hold = self.sh.hold_worker.clone();
            let spawned = std::thread::Builder::new()
                .name("railring-worker".into())
                .spawn(move || {
                    loop {
                        let c = match jrx.try_recv() {
                            Ok(c) => c,
                            Err(mpsc::TryRecvError::Disconnected) => break,
                            Err(mpsc::TryRecvError::Empty) => {
                                let Ok(c) = jrx.recv() else { break };
                                // Just woken, on the caller's core (a pinned rank): let a caller
                                // that is about to wait claim the call first; one that computes
                                // meanwhile gets the core back at once and the call runs here.
                                std::thread::yield_now();
                                c
                            }
                        };
                        #[cfg(test)]
                        while hold.load(std::sync::atomic::Ordering::Acquire) {
                            std::thread::sleep(std::time::Duration::from_millis(1));
                        }
                        // (gone when a waiter claimed it first)
                        let j = take_job(&c);
                        if let Some(j) = j {
                            j();
                        }
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
                if let Err(mpsc::SendError(c)) = s.send(cell.clone()) {
                    if let Some(j) = take_job(&c) {
                        j();
                    }
                }
            }
            None => {
                if let Some(j) = take_job(&cell) {
                    j();
                }
            }
        }
        Pending {
            slot,
            job: claimable.then(|| Claim {
                cell,
                sh: self.sh.clone(),
                ticket: t,
            }),
        }
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
    fn a_call_waited_for_at_its_turn_runs_on_the_waiting_thread_else_on_the_worker() {
        crate::comm::binding::tests::world(1, |c| {
            let me = std::thread::current().id();
            let here = |_: &mut Inner| Ok(std::thread::current().id());
            // the worker is held: the first call, at its turn, is claimed by its wait
            c.sh.hold_worker
                .store(true, std::sync::atomic::Ordering::Release);
            // (should the wait not claim it, the worker runs it after 3 s: a failure, not a hang)
            let guard = c.sh.hold_worker.clone();
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_secs(3));
                guard.store(false, std::sync::atomic::Ordering::Release);
            });
            let p = c.submit(here);
            assert_eq!(p.wait().unwrap(), me, "claimed by the waiter");
            c.sh.hold_worker
                .store(false, std::sync::atomic::Ordering::Release);
            // a call behind another one is left to the worker (waiting for its turn here would
            // wake this thread at the end of every call before it)
            let (tx, rx) = mpsc::channel::<()>();
            let a = c.submit(move |_| {
                let _ = rx.recv();
                Ok(std::thread::current().id())
            });
            let b = c.submit(here);
            let t = std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(300));
                tx.send(()).unwrap();
            });
            let on_b = b.wait().unwrap();
            let on_a = a.wait().unwrap();
            t.join().unwrap();
            assert_ne!(on_a, me, "the worker ran the first call");
            assert_eq!(on_b, on_a, "the call behind it ran on the worker too");
            // device calls never run on the waiter, even at their turn with the worker held
            c.sh.hold_worker
                .store(true, std::sync::atomic::Ordering::Release);
            let d = c.submit_to_worker(here);
            let release = c.sh.hold_worker.clone();
            let t = std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(100));
                release.store(false, std::sync::atomic::Ordering::Release);
            });
            assert_eq!(d.wait().unwrap(), on_a, "a device call runs on the worker");
            t.join().unwrap();
        });
    }

    #[test]
    fn a_result_filled_before_or_after_the_wait_arrives_once() {
        let p = Pending::done(Ok(7u32));
        assert_eq!(p.wait().unwrap(), 7);
        // the waiter parks first, the worker fills later
        let slot = Slot::<Vec<u8>>::new();
        let f = Filler(Some(slot.clone()));
        let p = Pending { slot, job: None };
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
        let p = Pending { slot, job: None };
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
        let e = Pending { slot, job: None }
            .test()
            .ok()
            .unwrap()
            .unwrap_err()
            .to_string();
        assert!(e.contains("worker thread is gone"), "{e}");
    }
}

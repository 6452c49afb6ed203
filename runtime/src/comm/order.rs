//! Call ordering: calls run in the order they are made. Blocking calls run on the caller's
//! thread; `*_start` calls run on one worker thread; once a worker exists, every call takes a
//! ticket so blocking and non-blocking calls keep program order. [`Pending`] is the handle of a
//! started call.

use super::call::Inner;
use super::{Communicator, Shared};
use crate::error::{Error, Result};
use std::sync::mpsc;

/// Work for the communicator's worker thread.
pub(super) type Job = Box<dyn FnOnce() + Send>;

/// A non-blocking operation in flight. `wait` returns its buffer.
#[must_use = "a started collective must be waited for"]
pub struct Pending<T> {
    pub(crate) rx: mpsc::Receiver<Result<T>>,
}

impl<T> Pending<T> {
    /// Block until the operation completes.
    pub fn wait(self) -> Result<T> {
        self.rx.recv().unwrap_or_else(|_| {
            Err(Error::Poisoned(
                "the communicator's worker thread is gone".into(),
            ))
        })
    }
    /// The result if the operation has completed, else the pending operation back.
    pub fn test(self) -> std::result::Result<Result<T>, Pending<T>> {
        match self.rx.try_recv() {
            Ok(r) => Ok(r),
            Err(mpsc::TryRecvError::Empty) => Err(self),
            Err(mpsc::TryRecvError::Disconnected) => {
                Ok(Err(Error::Poisoned("worker thread is gone".into())))
            }
        }
    }
}

impl Communicator {
    fn ticket(&self) -> u64 {
        let mut t = self.sh.turn.lock().unwrap_or_else(|e| e.into_inner());
        let k = t.0;
        t.0 += 1;
        k
    }

    pub(super) fn run<R>(
        sh: &Shared,
        ticket: u64,
        f: impl FnOnce(&mut Inner) -> Result<R>,
    ) -> Result<R> {
        {
            let mut t = sh.turn.lock().unwrap_or_else(|e| e.into_inner());
            while t.1 != ticket {
                t = sh.turn_cv.wait(t).unwrap_or_else(|e| e.into_inner());
            }
        }
        let r = {
            let mut g = sh.inner.lock().unwrap_or_else(|e| e.into_inner());
            Inner::guarded(&mut g, f)
        };
        let mut t = sh.turn.lock().unwrap_or_else(|e| e.into_inner());
        t.1 += 1;
        sh.turn_cv.notify_all();
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
        let (tx, rx) = mpsc::channel();
        let t = self.ticket();
        let sh = self.sh.clone();
        let job: Job = Box::new(move || {
            let r = Self::run(&sh, t, f);
            let _ = tx.send(r);
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
        Pending { rx }
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

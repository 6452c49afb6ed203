//! `railring.Handle`: a non-blocking collective in flight.
//!
//! Safety argument for the zero-copy start calls (`Communicator.*_start` in comm.rs): the call
//! hands the runtime raw pointers into numpy arrays (`Communicator::*_start_ptr`, see
//! `runtime/src/comm/binding.rs`) together with a keep-alive box holding strong references to
//! those arrays. The runtime's worker thread drops that box only after the collective is done
//! with the memory, so the arrays cannot be freed while railring writes them — even when the
//! handle is dropped without `wait()` (their reference counts then fall through PyO3's deferred
//! reference pool the next time Python runs Rust code). The GIL is released only while `wait()`
//! blocks; Python code that reads or writes the arrays before `wait()` returns races with the
//! collective, exactly as with MPI's `Iallreduce`: the docs say not to.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use railring::Pending;
use std::sync::Mutex;

use crate::errors;

enum State {
    Running(Pending<()>),
    /// `wait()` is blocked in another thread.
    Waiting,
    Done,
    Failed(PyErr),
}

/// A non-blocking collective in flight (returned by `Communicator.*_start`).
///
/// `wait()` blocks until it completes (releasing the GIL) and returns the result array (or
/// None for `barrier_start`); `test()` says whether it has completed. Do not read or write the
/// arrays passed to the call before `wait()` returns. A handle dropped without `wait()` still
/// completes: railring keeps the arrays alive until then.
#[pyclass(frozen, module = "railring", name = "Handle")]
pub struct Handle {
    state: Mutex<State>,
    result: Option<Py<PyAny>>,
    what: &'static str,
}

impl Handle {
    pub(crate) fn new(p: Pending<()>, result: Option<Py<PyAny>>, what: &'static str) -> Handle {
        Handle {
            state: Mutex::new(State::Running(p)),
            result,
            what,
        }
    }
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
    fn result(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.result.as_ref().map(|r| r.clone_ref(py))
    }
    fn finish(&self, py: Python<'_>, r: railring::Result<()>) -> PyResult<Option<Py<PyAny>>> {
        match r {
            Ok(()) => {
                *self.lock() = State::Done;
                Ok(self.result(py))
            }
            Err(e) => {
                let e = errors::to_py(py, e);
                *self.lock() = State::Failed(e.clone_ref(py));
                Err(e)
            }
        }
    }
}

#[pymethods]
impl Handle {
    /// Block until the collective completes (the GIL is released meanwhile); return its result
    /// array (None for a barrier). Raises the collective's error. Calling it again returns the
    /// same result (or raises the same error).
    fn wait(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        let p = {
            let mut g = self.lock();
            match std::mem::replace(&mut *g, State::Waiting) {
                State::Running(p) => p,
                State::Waiting => {
                    return Err(PyRuntimeError::new_err(format!(
                        "{}: wait() is already running in another thread",
                        self.what
                    )))
                }
                State::Done => {
                    *g = State::Done;
                    return Ok(self.result(py));
                }
                State::Failed(e) => {
                    *g = State::Failed(e.clone_ref(py));
                    return Err(e);
                }
            }
        };
        let r = py.detach(move || p.wait());
        self.finish(py, r)
    }

    /// True when the collective has completed (then `wait()` returns at once); raises its error
    /// if it failed. Never blocks.
    fn test(&self, py: Python<'_>) -> PyResult<bool> {
        let p = {
            let mut g = self.lock();
            match std::mem::replace(&mut *g, State::Waiting) {
                State::Running(p) => p,
                State::Waiting => {
                    *g = State::Waiting;
                    return Ok(false);
                }
                State::Done => {
                    *g = State::Done;
                    return Ok(true);
                }
                State::Failed(e) => {
                    *g = State::Failed(e.clone_ref(py));
                    return Err(e);
                }
            }
        };
        match p.test() {
            Ok(r) => self.finish(py, r).map(|_| true),
            Err(p) => {
                *self.lock() = State::Running(p);
                Ok(false)
            }
        }
    }

    fn __repr__(&self) -> String {
        let s = match &*self.lock() {
            State::Running(_) | State::Waiting => "running",
            State::Done => "done",
            State::Failed(_) => "failed",
        };
        format!("<railring.Handle {} {s}>", self.what)
    }
}

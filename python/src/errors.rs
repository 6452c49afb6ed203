//! railring's errors as Python exceptions. The classes live in `railring/_errors.py` (so they
//! can also derive from Python's own `ValueError` / `TimeoutError`); the message is railring's,
//! word for word, and the fields become attributes (`rank`, `peer`, `waiting`, ...).

use pyo3::prelude::*;
use pyo3::types::PyDict;
use railring::Error;

/// An `InvalidArgumentError` (a `railring.Error` and a `ValueError`) with `msg`.
pub(crate) fn invalid(msg: impl std::fmt::Display) -> PyErr {
    Python::attach(|py| make(py, "InvalidArgumentError", msg.to_string(), |_| Ok(())))
}

/// The Python exception for a railring error.
pub(crate) fn to_py(py: Python<'_>, e: Error) -> PyErr {
    let msg = e.to_string();
    match e {
        Error::Mismatch {
            rank,
            peer,
            mine,
            theirs,
        } => make(py, "MismatchError", msg, |d| {
            d.set_item("rank", rank)?;
            d.set_item("peer", peer)?;
            d.set_item("mine", mine)?;
            d.set_item("theirs", theirs)
        }),
        Error::Timeout {
            rank,
            secs,
            waiting,
            what,
        } => make(py, "TimeoutError", msg, |d| {
            d.set_item("rank", rank)?;
            d.set_item("seconds", secs)?;
            d.set_item("waiting", waiting)?;
            d.set_item("call", what)
        }),
        Error::PeerDead {
            rank,
            peer,
            host,
            why,
        } => make(py, "PeerDeadError", msg, |d| {
            d.set_item("rank", rank)?;
            d.set_item("peer", peer)?;
            d.set_item("host", host)?;
            d.set_item("why", why)
        }),
        Error::Invalid(_) => make(py, "InvalidArgumentError", msg, |_| Ok(())),
        Error::Poisoned(_) => make(py, "PoisonedError", msg, |_| Ok(())),
        Error::Store(_) | Error::Env { .. } => make(py, "BootstrapError", msg, |_| Ok(())),
        _ => make(py, "Error", msg, |_| Ok(())),
    }
}

fn make(
    py: Python<'_>,
    class: &str,
    msg: String,
    attrs: impl FnOnce(&Bound<'_, PyDict>) -> PyResult<()>,
) -> PyErr {
    let build = || -> PyResult<PyErr> {
        let cls = py.import("railring._errors")?.getattr(class)?;
        let exc = cls.call1((msg.clone(),))?;
        let d = PyDict::new(py);
        attrs(&d)?;
        for (k, v) in d.iter() {
            exc.setattr(k.cast::<pyo3::types::PyString>()?, v)?;
        }
        Ok(PyErr::from_value(exc))
    };
    // Should the exception module be unimportable, the message still reaches the user.
    build().unwrap_or_else(|_| pyo3::exceptions::PyRuntimeError::new_err(msg))
}

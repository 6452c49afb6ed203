//! `railring._railring`: the native half of the `railring` Python package (PyO3).
//!
//! The rooms: `lib.rs` (here: the module and `init`), `comm.rs` (the `Communicator` class and
//! every collective), `arrays.rs` (numpy arrays and CPU torch tensors as memory railring can
//! use, without copying), `handle.rs` (non-blocking calls), `errors.rs` (railring's errors as
//! Python exceptions). The pure-Python half (`python/railring/`) holds the exception classes,
//! the torch interop helpers and the study runner.
//!
//! GIL rule: every call that may wait on other ranks (init, each collective, `Handle.wait`)
//! releases the GIL while it waits; arrays are kept alive by strong references for as long as
//! railring may touch their memory (see `handle.rs` and `runtime/src/comm/binding.rs`).

mod arrays;
mod comm;
mod errors;
mod handle;

use pyo3::prelude::*;
use std::sync::Mutex;

/// The world communicator of this process, made once by `init()`.
static WORLD: Mutex<Option<Py<comm::PyComm>>> = Mutex::new(None);

/// Join the job this process was started in and return its world communicator.
///
/// How the process was started is detected exactly as `railring::Communicator::init` does it
/// (it is that function): railrun's environment, a Slurm step (srun), torchrun-style variables
/// (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), or alone (a world of one). Calling `init()`
/// again returns the same communicator.
#[pyfunction]
fn init(py: Python<'_>) -> PyResult<Py<comm::PyComm>> {
    let mut w = WORLD.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(c) = w.as_ref() {
        return Ok(c.clone_ref(py));
    }
    let c = py
        .detach(railring::Communicator::init)
        .map_err(|e| errors::to_py(py, e))?;
    let c = Py::new(py, comm::PyComm::new(c))?;
    *w = Some(c.clone_ref(py));
    Ok(c)
}

/// The railring version this module was built from.
#[pyfunction]
fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

/// railring's native module. Use the `railring` package, which re-exports everything here.
#[pymodule]
fn _railring(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(init, m)?)?;
    m.add_function(wrap_pyfunction!(version, m)?)?;
    m.add_class::<comm::PyComm>()?;
    m.add_class::<handle::Handle>()?;
    m.add(
        "DTYPES",
        railring::DataType::ALL
            .iter()
            .map(|d| arrays::numpy_name(*d))
            .collect::<Vec<_>>(),
    )?;
    m.add("OPS", ["sum", "prod", "min", "max", "avg"])?;
    Ok(())
}

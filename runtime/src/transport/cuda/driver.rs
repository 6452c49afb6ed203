//! The CUDA driver at arm's length: whether `libcuda` / NVRTC can be loaded, the guard in front
//! of every CUDA call ([`require_driver`]), CUDA failures as runtime errors (a panic inside
//! cudarc included), a device's primary context and its PCI bus id.

use crate::error::{Error, Result};
use cudarc::driver::{sys, CudaContext};
use std::io;
use std::sync::Arc;

/// Is the CUDA driver library loadable? Never panics (only tries to dlopen it).
pub fn driver_present() -> bool {
    // SAFETY: is_culib_present only attempts to load the library and drops it.
    unsafe { sys::is_culib_present() }
}

/// Is NVRTC loadable?
pub fn nvrtc_present() -> bool {
    // SAFETY: as above.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

pub(super) fn io_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

/// A CUDA failure as a runtime error.
pub fn cuda_err(rank: usize, what: impl Into<String>, e: impl std::fmt::Display) -> Error {
    Error::Transport {
        rank,
        what: what.into(),
        err: io_err(e),
    }
}

/// `Err` unless the driver library can be loaded: the guard in front of every CUDA call.
pub fn require_driver(rank: usize) -> Result<()> {
    if driver_present() {
        return Ok(());
    }
    Err(Error::Transport {
        rank,
        what: "CUDA".into(),
        err: io::Error::new(
            io::ErrorKind::NotFound,
            "the CUDA driver library (libcuda.so.1) is not present: device collectives need an NVIDIA driver",
        ),
    })
}

/// Run a CUDA call that may panic inside cudarc (a missing symbol in an old driver), turning
/// the panic into an error.
pub(super) fn no_panic<T>(rank: usize, what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panic".into());
            Err(cuda_err(rank, what, msg))
        }
    }
}

/// The primary context of device `ordinal` (guarded: no driver, no device → `Err`).
pub fn context(rank: usize, ordinal: usize) -> Result<Arc<CudaContext>> {
    require_driver(rank)?;
    no_panic(rank, "creating a CUDA context", || {
        CudaContext::new(ordinal)
            .map_err(|e| cuda_err(rank, format!("CUDA context on device {ordinal}"), e))
    })
}

/// The PCI bus id of a device (`0000:3b:00.0`).
pub fn bus_id(dev: sys::CUdevice) -> io::Result<String> {
    let mut buf = [0 as std::ffi::c_char; 64];
    // SAFETY: buf holds 64 bytes as declared; the driver NUL-terminates.
    unsafe { sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as i32, dev) }
        .result()
        .map_err(io_err)?;
    // SAFETY: NUL-terminated by the driver (and the buffer is zeroed).
    let s = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    Ok(s.to_string_lossy().to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_driver_is_a_clean_error() {
        if driver_present() {
            eprintln!(
                "SKIPPED: a CUDA driver is present here; the no-driver path is not exercised"
            );
            return;
        }
        let e = require_driver(3).unwrap_err();
        assert!(e.to_string().contains("libcuda.so.1"), "{e}");
        assert!(e.to_string().starts_with("rank 3"), "{e}");
        let e = context(0, 0).unwrap_err();
        assert!(e.to_string().contains("not present"), "{e}");
    }

    #[test]
    fn panics_inside_cuda_calls_become_errors() {
        let r: Result<()> = no_panic(1, "x", || panic!("Missing symbol cuFoo"));
        let e = r.unwrap_err().to_string();
        assert!(e.contains("Missing symbol cuFoo"), "{e}");
    }
}

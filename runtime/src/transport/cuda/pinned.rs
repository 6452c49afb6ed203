//! Page-locked host memory ([`PinnedBuf`]): the staging buffer device collectives copy through
//! when the in-node path or the network cannot use device memory directly.

use cudarc::driver::{sys, CudaContext};
use std::sync::Arc;

/// Page-locked host memory from `cuMemHostAlloc`, grown on demand.
pub struct PinnedBuf {
    ptr: *mut u8,
    len: usize,
    ctx: Arc<CudaContext>,
}

// SAFETY: plain host memory owned by this value.
unsafe impl Send for PinnedBuf {}

impl PinnedBuf {
    pub fn new(ctx: Arc<CudaContext>) -> PinnedBuf {
        PinnedBuf {
            ptr: std::ptr::null_mut(),
            len: 0,
            ctx,
        }
    }

    /// At least `len` bytes (contents not preserved when it grows).
    pub fn ensure(
        &mut self,
        len: usize,
    ) -> std::result::Result<*mut u8, cudarc::driver::DriverError> {
        if len > self.len || self.ptr.is_null() {
            self.free();
            self.ctx.bind_to_thread()?;
            let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
            // SAFETY: allocating len.max(1) bytes of portable pinned memory.
            unsafe {
                sys::cuMemHostAlloc(&mut p, len.max(1), 0x1 /* PORTABLE */)
            }
            .result()?;
            self.ptr = p as *mut u8;
            self.len = len.max(1);
        }
        Ok(self.ptr)
    }

    fn free(&mut self) {
        if !self.ptr.is_null() {
            let _ = self.ctx.bind_to_thread();
            // SAFETY: allocated by cuMemHostAlloc above, freed once.
            unsafe {
                let _ = sys::cuMemFreeHost(self.ptr as *mut _);
            }
            self.ptr = std::ptr::null_mut();
            self.len = 0;
        }
    }
}

impl Drop for PinnedBuf {
    fn drop(&mut self) {
        self.free();
    }
}

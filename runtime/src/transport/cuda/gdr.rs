//! GPUDirect RDMA pieces on the CUDA side: device memory the executor's network steps run on
//! ([`CudaDataMem`]: a staging area and the reduction of received chunks with the NVRTC
//! kernels) and, with the `rdma` feature, device-resident rings for RDMA links
//! ([`CudaRings`]). Nothing here runs without a driver: callers hold a context, which
//! [`super::context`] only hands out when `libcuda` is present.

use super::launch::sm_count;
use super::{cuda_err, launch_reduce, op_kernels};
use crate::error::Result;
use crate::transport::{DataMem, MemKind};
use cudarc::driver::{sys, CudaContext, CudaStream};
use railring_collectives::{DataType, ReduceOp};
use std::io;
use std::sync::Arc;

/// Device memory from `cuMemAlloc`, freed on drop.
struct DevAlloc {
    ptr: u64,
    len: usize,
    ctx: Arc<CudaContext>,
}

impl DevAlloc {
    fn new(ctx: &Arc<CudaContext>, len: usize) -> io::Result<DevAlloc> {
        ctx.bind_to_thread().map_err(io::Error::other)?;
        let mut p: sys::CUdeviceptr = 0;
        // SAFETY: allocating len.max(1) bytes on the bound context.
        unsafe { sys::cuMemAlloc_v2(&mut p, len.max(1)) }
            .result()
            .map_err(|e| io::Error::other(format!("cuMemAlloc of {len} bytes: {e}")))?;
        Ok(DevAlloc {
            ptr: p,
            len: len.max(1),
            ctx: ctx.clone(),
        })
    }
}

impl Drop for DevAlloc {
    fn drop(&mut self) {
        // Links and device state may be dropped on any thread: free on our context, then give
        // the thread back the context it had.
        let mut prev: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: plain driver calls; `prev` is written by the driver. Allocated in new(),
        // freed once; errors at teardown are ignored.
        unsafe {
            let _ = sys::cuCtxGetCurrent(&mut prev);
            let _ = self.ctx.bind_to_thread();
            let _ = sys::cuMemFree_v2(self.ptr);
            if prev != self.ctx.cu_ctx() {
                let _ = sys::cuCtxSetCurrent(prev);
            }
        }
    }
}

/// Why this device cannot take part in GPUDirect RDMA (`None`: it can): the driver must report
/// GPUDirect RDMA support and be able to flush the NIC's writes from the host, which is how a
/// link makes received data visible before copying it out of its ring.
pub fn gdr_unsupported(ctx: &CudaContext) -> Option<String> {
    let attr = |a| ctx.attribute(a).unwrap_or(0);
    if attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED) == 0 {
        return Some(format!(
            "GPU {} does not support GPUDirect RDMA",
            ctx.ordinal()
        ));
    }
    let flush =
        attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS);
    if flush
        & sys::CUflushGPUDirectRDMAWritesOptions::CU_FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_HOST as i32
        == 0
    {
        return Some(format!(
            "the driver cannot flush GPUDirect RDMA writes on GPU {} (no cuFlushGPUDirectRDMAWrites)",
            ctx.ordinal()
        ));
    }
    None
}

/// Device memory for the executor's network steps: received chunks are staged in a device
/// buffer and reduced into the work buffer by the (dtype, op) kernel on `stream`.
pub struct CudaDataMem {
    rank: usize,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    stage: Option<DevAlloc>,
    /// Two source addresses for the reduction kernel (`dst`, `src`), device memory.
    table: DevAlloc,
    sms: u32,
}

// SAFETY: device pointers owned by the value; contexts and streams are thread safe.
unsafe impl Send for CudaDataMem {}

impl CudaDataMem {
    pub fn new(rank: usize, ctx: &Arc<CudaContext>, stream: Arc<CudaStream>) -> Result<Self> {
        let table = DevAlloc::new(ctx, 16)
            .map_err(|e| cuda_err(rank, "allocating the reduction table", e))?;
        Ok(CudaDataMem {
            rank,
            ctx: ctx.clone(),
            stream,
            stage: None,
            table,
            sms: sm_count(ctx),
        })
    }
}

impl CudaDataMem {
    /// Wait for everything queued on the stream this works on.
    pub fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(|e| cuda_err(self.rank, "waiting for the GPU", e))
    }

    /// Divide the `count` elements at `work` by `ranks` (finishing an average), on the stream.
    pub fn finish_avg(
        &mut self,
        work: u64,
        count: usize,
        dtype: DataType,
        ranks: usize,
    ) -> Result<()> {
        let k = op_kernels(self.rank, &self.ctx, dtype, ReduceOp::Avg)?;
        // SAFETY: work holds count elements of dtype (checked by the caller).
        unsafe { super::launch_avg(&self.stream, &k, self.sms, work, count as u64, ranks as u32) }
            .map_err(|e| cuda_err(self.rank, "average kernel", e))
    }
}

impl DataMem for CudaDataMem {
    fn kind(&self) -> MemKind {
        MemKind::Device {
            ordinal: self.ctx.ordinal() as i32,
        }
    }

    fn stage(&mut self, n: usize) -> Result<*mut u8> {
        if self.stage.as_ref().is_none_or(|s| s.len < n) {
            self.stage = None;
            self.stage = Some(DevAlloc::new(&self.ctx, n).map_err(|e| {
                cuda_err(
                    self.rank,
                    format!("allocating {n} bytes of device staging"),
                    e,
                )
            })?);
        }
        Ok(self.stage.as_ref().map(|s| s.ptr).unwrap_or(0) as *mut u8)
    }

    unsafe fn reduce_into(
        &mut self,
        dtype: DataType,
        op: ReduceOp,
        dst: *mut u8,
        src: *const u8,
        n: usize,
    ) -> Result<()> {
        let rank = self.rank;
        self.ctx
            .bind_to_thread()
            .map_err(|e| cuda_err(rank, "binding the CUDA context", e))?;
        let k = op_kernels(rank, &self.ctx, dtype, op)?;
        let bases = [dst as u64, src as u64];
        // Pageable host source: the call returns once the 16 bytes are staged, and the copy is
        // ordered before the kernel on the stream.
        sys::cuMemcpyHtoDAsync_v2(
            self.table.ptr,
            bases.as_ptr() as *const _,
            16,
            self.stream.cu_stream(),
        )
        .result()
        .map_err(|e| cuda_err(rank, "uploading the reduction table", e))?;
        let count = (n / dtype.size()) as u64;
        launch_reduce(
            &self.stream,
            &k,
            self.sms,
            dst as u64,
            self.table.ptr,
            0,
            2,
            count,
        )
        .map_err(|e| cuda_err(rank, "launching the reduction of a received chunk", e))?;
        // The staging area is refilled as soon as this returns.
        self.stream
            .synchronize()
            .map_err(|e| cuda_err(rank, "waiting for the reduction of a received chunk", e))
    }
}

/// A GPUDirect link's rings: two device buffers the NIC reads and writes, and the copies in and
/// out of them on the link's own stream.
#[cfg(feature = "rdma")]
pub struct CudaRings {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    send: DevAlloc,
    recv: DevAlloc,
}

// SAFETY: as for CudaDataMem.
#[cfg(feature = "rdma")]
unsafe impl Send for CudaRings {}

#[cfg(feature = "rdma")]
impl CudaRings {
    /// Two rings of [`crate::transport::rdma::ring_bytes`] on `ctx`'s device. The buffers get
    /// `CU_POINTER_ATTRIBUTE_SYNC_MEMOPS`, as GPUDirect RDMA asks of memory a NIC touches, so
    /// CUDA's synchronous copies stay ordered with the NIC's accesses.
    pub fn new(ctx: &Arc<CudaContext>) -> io::Result<CudaRings> {
        let len = crate::transport::rdma::ring_bytes();
        let send = DevAlloc::new(ctx, len)?;
        let recv = DevAlloc::new(ctx, len)?;
        for a in [send.ptr, recv.ptr] {
            let one: u32 = 1;
            // SAFETY: a live allocation on the bound context; the attribute takes a u32.
            unsafe {
                sys::cuPointerSetAttribute(
                    &one as *const u32 as *const _,
                    sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_SYNC_MEMOPS,
                    a,
                )
            }
            .result()
            .map_err(|e| io::Error::other(format!("setting SYNC_MEMOPS on a ring: {e}")))?;
        }
        let stream = ctx.new_stream().map_err(io::Error::other)?;
        Ok(CudaRings {
            ctx: ctx.clone(),
            stream,
            send,
            recv,
        })
    }
}

#[cfg(feature = "rdma")]
impl crate::transport::rdma::DeviceRings for CudaRings {
    fn ordinal(&self) -> i32 {
        self.ctx.ordinal() as i32
    }

    fn rings(&self) -> (u64, u64) {
        (self.send.ptr, self.recv.ptr)
    }

    unsafe fn copy(&mut self, list: &[(u64, u64, usize)]) -> io::Result<()> {
        self.ctx.bind_to_thread().map_err(io::Error::other)?;
        for &(dst, src, n) in list {
            // Unified addressing: the driver picks the direction from the addresses.
            if let Err(e) = sys::cuMemcpyAsync(dst, src, n, self.stream.cu_stream()).result() {
                // copies already queued must not outlive the failed call
                let _ = self.stream.synchronize();
                return Err(io::Error::other(format!("cuMemcpyAsync of {n} bytes: {e}")));
            }
        }
        self.stream.synchronize().map_err(io::Error::other)
    }

    fn flush_nic_writes(&mut self) -> io::Result<()> {
        self.ctx.bind_to_thread().map_err(io::Error::other)?;
        // SAFETY: plain driver call on the bound context.
        unsafe {
            sys::cuFlushGPUDirectRDMAWrites(
                sys::CUflushGPUDirectRDMAWritesTarget::CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX,
                sys::CUflushGPUDirectRDMAWritesScope::CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER,
            )
        }
        .result()
        .map_err(|e| io::Error::other(format!("cuFlushGPUDirectRDMAWrites: {e}")))
    }
}

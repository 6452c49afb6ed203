//! Collectives on device memory (cargo feature `cuda`).
//!
//! ```ignore
//! let stream = ctx.default_stream();
//! let mut grads: CudaSlice<f32> = stream.clone_htod(&host)?;
//! comm.all_reduce_device(&mut grads, ReduceOp::Sum, &stream)?;   // ordered on `stream`
//! let op = comm.all_reduce_device_start(grads, ReduceOp::Avg, stream.clone());
//! let grads = op.wait()?;                                         // or op.test()
//! ```
//!
//! Semantics: the collective reads the buffer after all work enqueued on `stream` before the
//! call (an event recorded on `stream`), and `stream` waits (an event, not a host
//! synchronisation) for the collective's last write, so kernels enqueued on `stream` afterwards
//! see the result. cudarc's own read/write tracking of the slice is honoured on both sides.
//! Calls are ordered with the communicator's host calls (blocking and non-blocking alike) and
//! must be made by every rank in the same order, like every collective.
//!
//! Paths: one node with several ranks uses the CUDA IPC fabric
//! ([`crate::transport::cuda::GpuFabric`]) through the same executor and two-level plan as host
//! buffers. Across nodes, when every node has that fabric, the in-node steps run on it and only
//! each rank's 1/L slice goes through pinned host memory for the network ring; otherwise (and
//! where GPUs cannot reach each other) whole buffers stage through pinned host memory and the
//! host path (shared memory + network). Supported types: every type
//! of the host API (i8, u8, i32, u32, i64, u64, f16, bf16, f32, f64) and every operator.

/// The cudarc this crate is built against (use it to make device buffers and streams).
pub use cudarc;

use super::device_state::{self as cuda_hook, DeviceBuf};
use crate::error::{Error, Result};
use crate::transport::cuda::{cuda_err, require_driver};
use crate::{Communicator, Element, Pending, ReduceOp};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtrMut, DeviceRepr};
use std::sync::Arc;

/// Element types usable in device collectives (every host element type).
pub trait DeviceElement: Element + DeviceRepr {}
impl<T: Element + DeviceRepr> DeviceElement for T {}

impl Communicator {
    /// In-place all-reduce of a device buffer, enqueued on `stream` (see the module docs).
    /// Returns when the collective has been carried out by this rank; `stream` is ordered after
    /// it. Without a CUDA driver this is an error, never a panic.
    pub fn all_reduce_device<T: DeviceElement>(
        &self,
        buf: &mut CudaSlice<T>,
        op: ReduceOp,
        stream: &CudaStream,
    ) -> Result<()> {
        let rank = self.rank();
        require_driver(rank)?;
        let ctx = stream.context().clone();
        if **buf.context() != *ctx {
            return Err(Error::Invalid(format!(
                "all_reduce_device: the buffer is on GPU {}, the stream on GPU {}",
                buf.context().ordinal(),
                ctx.ordinal()
            )));
        }
        let bytes = buf.num_bytes();
        let (ptr, written) = buf.device_ptr_mut(stream);
        let ready = stream
            .record_event(None)
            .map_err(|e| cuda_err(rank, "recording an event on the caller's stream", e))?;
        let target = DeviceBuf {
            ptr,
            bytes,
            dtype: T::DTYPE,
            op,
        };
        let done = cuda_hook::all_reduce_device(self, &ctx, target, &ready)?;
        stream
            .wait(&done)
            .map_err(|e| cuda_err(rank, "ordering the caller's stream after the collective", e))?;
        // Records the slice's write event on `stream`, after the wait above.
        drop(written);
        Ok(())
    }

    /// Non-blocking all-reduce of an owned device buffer; `wait()` returns it reduced, with
    /// `stream` ordered after the collective. Queued behind earlier non-blocking calls.
    pub fn all_reduce_device_start<T: DeviceElement>(
        &self,
        mut buf: CudaSlice<T>,
        op: ReduceOp,
        stream: Arc<CudaStream>,
    ) -> Pending<CudaSlice<T>> {
        let rank = self.rank();
        if let Err(e) = require_driver(rank) {
            return cuda_hook::failed(e);
        }
        let ctx = stream.context().clone();
        if **buf.context() != *ctx {
            return cuda_hook::failed(Error::Invalid(format!(
                "all_reduce_device_start: the buffer is on GPU {}, the stream on GPU {}",
                buf.context().ordinal(),
                ctx.ordinal()
            )));
        }
        let bytes = buf.num_bytes();
        let ptr = {
            let (ptr, _written) = buf.device_ptr_mut(&stream);
            ptr
        };
        let ready = match stream.record_event(None) {
            Ok(e) => e,
            Err(e) => {
                return cuda_hook::failed(cuda_err(
                    rank,
                    "recording an event on the caller's stream",
                    e,
                ))
            }
        };
        let target = DeviceBuf {
            ptr,
            bytes,
            dtype: T::DTYPE,
            op,
        };
        cuda_hook::all_reduce_device_start(self, ctx, target, ready, move |done| {
            stream.wait(&done).map_err(|e| {
                cuda_err(rank, "ordering the caller's stream after the collective", e)
            })?;
            {
                // Later users of the slice (on any stream) wait for this point.
                let (_p, _written) = buf.device_ptr_mut(&stream);
            }
            Ok(buf)
        })
    }
}

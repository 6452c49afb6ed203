//! The reduction kernels at run time: compiled with NVRTC once per (device, dtype, op) and
//! cached for the process ([`op_kernels`]; the CUDA source is in [`super::kernels`]), and
//! launched on a stream ([`launch_reduce`], [`launch_avg`]).

use super::driver::{cuda_err, no_panic, nvrtc_present};
use super::kernels::{self, HalfImpl};
use crate::error::{Error, Result};
use cudarc::driver::{sys, CudaContext, CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use railring_collectives::{DataType, ReduceOp};
use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex, OnceLock};

/// The compiled kernels of one (dtype, op).
#[derive(Clone)]
pub struct OpKernels {
    pub reduce: CudaFunction,
    pub avg: Option<CudaFunction>,
    pub half: HalfImpl,
}

type KernelKey = (usize, DataType, ReduceOp);

fn kernel_cache() -> &'static Mutex<HashMap<KernelKey, OpKernels>> {
    static C: OnceLock<Mutex<HashMap<KernelKey, OpKernels>>> = OnceLock::new();
    C.get_or_init(|| Mutex::new(HashMap::new()))
}

fn compile_one(
    ctx: &Arc<CudaContext>,
    d: DataType,
    op: ReduceOp,
    half: HalfImpl,
    arch: Option<(i32, i32)>,
    includes: &[String],
) -> std::result::Result<OpKernels, String> {
    use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
    let src = kernels::module_source(d, op, half);
    let opts = CompileOptions {
        options: kernels::compile_options(arch, includes),
        name: Some(format!("{}.cu", kernels::reduce_kernel_name(d, op))),
        ..Default::default()
    };
    let ptx = compile_ptx_with_opts(&src, opts).map_err(|e| format!("NVRTC: {e}"))?;
    let module = ctx
        .load_module(ptx)
        .map_err(|e| format!("loading PTX: {e}"))?;
    let reduce = module
        .load_function(&kernels::reduce_kernel_name(d, op))
        .map_err(|e| e.to_string())?;
    let avg = if op == ReduceOp::Avg {
        Some(
            module
                .load_function(&kernels::avg_kernel_name(d))
                .map_err(|e| e.to_string())?,
        )
    } else {
        None
    };
    Ok(OpKernels { reduce, avg, half })
}

/// The kernels for (dtype, op) on `ctx`'s device, compiling them with NVRTC on first use. Half
/// types try the toolkit headers first, then the built-in variant; a too-new architecture for
/// this NVRTC is retried with NVRTC's default.
pub fn op_kernels(
    rank: usize,
    ctx: &Arc<CudaContext>,
    d: DataType,
    op: ReduceOp,
) -> Result<OpKernels> {
    let key = (ctx.ordinal(), d, op);
    if let Some(k) = kernel_cache()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&key)
    {
        return Ok(k.clone());
    }
    if !nvrtc_present() {
        return Err(Error::Transport {
            rank,
            what: "compiling reduction kernels".into(),
            err: io::Error::new(
                io::ErrorKind::NotFound,
                "NVRTC is not present (looked for libnvrtc.so and libnvrtc.so.12 down to .9 on the \
                 loader's path): install the CUDA runtime compiler, or, where only libnvrtc.so.13 \
                 exists (CUDA 13), put a link named libnvrtc.so to it in a folder on \
                 LD_LIBRARY_PATH together with its own folder",
            ),
        });
    }
    let k = no_panic(rank, "compiling reduction kernels", || {
        let arch = ctx.compute_capability().ok();
        let includes = kernels::header_dirs();
        let halves: &[HalfImpl] =
            if matches!(d, DataType::F16 | DataType::Bf16) && !includes.is_empty() {
                &[HalfImpl::Headers, HalfImpl::Builtin]
            } else {
                &[HalfImpl::Builtin]
            };
        let mut errs = Vec::new();
        for &h in halves {
            for a in [arch, None] {
                match compile_one(ctx, d, op, h, a, &includes) {
                    Ok(k) => return Ok(k),
                    Err(e) => errs.push(format!("{h:?}/{a:?}: {e}")),
                }
                if arch.is_none() {
                    break;
                }
            }
        }
        Err(cuda_err(
            rank,
            format!("compiling the {d} {op} kernel"),
            errs.join("; "),
        ))
    })?;
    tracing::debug!(target: "railring::init", rank, "compiled {} ({:?} half types)", kernels::reduce_kernel_name(d, op), k.half);
    kernel_cache()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, k.clone());
    Ok(k)
}

pub(super) fn sm_count(ctx: &CudaContext) -> u32 {
    ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .map(|v| v.max(1) as u32)
        .unwrap_or(1)
}

fn launch_cfg(n: u64, sms: u32) -> LaunchConfig {
    let d = kernels::launch_dims(n, sms);
    LaunchConfig {
        grid_dim: (d.grid, 1, 1),
        block_dim: (d.block, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Enqueue `dst[i] = src_0[i] op ... op src_{k-1}[i]` for `n` elements, `src_j = bases_j + off`
/// where `table` is a device array of the k base addresses.
///
/// # Safety
/// Every address must be valid device memory for `n` elements on `stream`'s device.
// The arguments are the kernel's own parameter list, in its order.
#[allow(clippy::too_many_arguments)]
pub unsafe fn launch_reduce(
    stream: &CudaStream,
    k: &OpKernels,
    sms: u32,
    dst: u64,
    table: u64,
    off: u64,
    nsrc: i32,
    n: u64,
) -> std::result::Result<(), cudarc::driver::DriverError> {
    if n == 0 {
        return Ok(());
    }
    stream
        .launch_builder(&k.reduce)
        .arg(&dst)
        .arg(&table)
        .arg(&off)
        .arg(&nsrc)
        .arg(&n)
        .launch(launch_cfg(n, sms))
        .map(|_| ())
}

/// Enqueue the division finishing an average of `ranks` contributions over `n` elements.
///
/// # Safety
/// `buf` must be valid device memory for `n` elements.
pub unsafe fn launch_avg(
    stream: &CudaStream,
    k: &OpKernels,
    sms: u32,
    buf: u64,
    n: u64,
    ranks: u32,
) -> std::result::Result<(), cudarc::driver::DriverError> {
    let Some(f) = &k.avg else {
        return Ok(());
    };
    if n == 0 || ranks <= 1 {
        return Ok(());
    }
    stream
        .launch_builder(f)
        .arg(&buf)
        .arg(&n)
        .arg(&ranks)
        .launch(launch_cfg(n, sms))
        .map(|_| ())
}

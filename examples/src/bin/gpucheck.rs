//! gpucheck: device all-reduce on GPUs, checked and timed (cargo feature `cuda`).
//!
//! ```text
//! railrun -np 4 gpucheck --device 0            # 4 ranks sharing GPU 0 (the IPC path)
//! railrun -np 8 gpucheck                       # local rank i on GPU i mod #GPUs
//! ```
//!
//! 1. Every data type and operator, several sizes (one element, odd sizes, several pipeline
//!    chunks), blocking and non-blocking, element by element against a host reference built
//!    with the CPU kernels in the same order (so results must be bit-identical).
//!    Before that, on rank 0, the reduction the GPUDirect network path applies to each received
//!    chunk (`CudaDataMem`: device staging + kernel) for every type and operator, and whether
//!    the driver offers GPUDirect RDMA on this GPU.
//! 2. A railperf-style table (time, algbw, busbw with nccl-tests' formula) of float sum beside
//!    the device-to-device copy bandwidth (`cuMemcpyDtoD`) of the same size on rank 0.
//!
//! Exit status: 0 all correct, 1 a wrong result or an error, 2 usage or no CUDA driver.

use railring::device::cudarc::driver::{CudaSlice, CudaStream};
use railring::device::DeviceElement;
use railring::transport::cuda::{context, driver_present};
use railring::{Communicator, DataType, Element, ReduceOp};
use railring_collectives::{as_bytes, as_bytes_mut, kernels};
use railring_examples::perf::Coll;
use std::sync::Arc;
use std::time::Instant;

const USAGE: &str = "usage: gpucheck [--device N] [--min-bytes N] [--max-bytes N] [--iters N] [--warmup N] [--no-bench] [--quick]
  --device N     GPU ordinal (default: local rank mod number of GPUs)
  --min-bytes N  smallest benchmark size (default 1K; K/M/G suffixes)
  --max-bytes N  largest benchmark size (default 256M), sizes grow x4
  --iters N      timed iterations per size (default 20), --warmup N (default 5)
  --quick        fewer correctness sizes and a 16M benchmark cap
  --no-bench     correctness only";

struct Opts {
    device: Option<usize>,
    min_bytes: usize,
    max_bytes: usize,
    iters: usize,
    warmup: usize,
    bench: bool,
    quick: bool,
}

fn parse(args: &[String]) -> Result<Opts, String> {
    let mut o = Opts {
        device: None,
        min_bytes: 1 << 10,
        max_bytes: 256 << 20,
        iters: 20,
        warmup: 5,
        bench: true,
        quick: false,
    };
    let mut it = args.iter();
    let size = |v: Option<&String>, f: &str| -> Result<usize, String> {
        let v = v.ok_or(format!("{f} needs a value"))?;
        railring::config::parse_size(v)
            .map(|x| x as usize)
            .ok_or(format!("{f}: bad size {v:?}"))
    };
    while let Some(a) = it.next() {
        match a.as_str() {
            "--device" | "-g" => o.device = Some(size(it.next(), a)?),
            "--min-bytes" | "-b" => o.min_bytes = size(it.next(), a)?,
            "--max-bytes" | "-e" => o.max_bytes = size(it.next(), a)?,
            "--iters" | "-n" => o.iters = size(it.next(), a)?.max(1),
            "--warmup" | "-w" => o.warmup = size(it.next(), a)?,
            "--no-bench" => o.bench = false,
            "--quick" => o.quick = true,
            "-h" | "--help" => return Err(String::new()),
            _ => return Err(format!("unknown argument {a:?}")),
        }
    }
    if o.quick {
        o.max_bytes = o.max_bytes.min(16 << 20);
    }
    Ok(o)
}

/// The input of `rank` at element `i`: small positive integers, exact in every type.
fn value(rank: usize, i: usize) -> i64 {
    1 + ((rank * 7 + i * 13) % 5) as i64
}

/// The expected result: rank 0's input combined with every other rank's, in rank order, with
/// the CPU kernels (the GPU kernels and the staging path combine in the same order).
fn reference<T: Element>(size: usize, n: usize, op: ReduceOp) -> Vec<T> {
    let mut acc: Vec<T> = (0..n).map(|i| T::from_i64(value(0, i))).collect();
    for r in 1..size {
        let other: Vec<T> = (0..n).map(|i| T::from_i64(value(r, i))).collect();
        kernels::reduce_into(T::DTYPE, op, as_bytes_mut(&mut acc), as_bytes(&other));
    }
    if op == ReduceOp::Avg {
        kernels::finish_avg(T::DTYPE, as_bytes_mut(&mut acc), size);
    }
    acc
}

fn check<T: DeviceElement>(
    comm: &Communicator,
    stream: &Arc<CudaStream>,
    op: ReduceOp,
    n: usize,
    nonblocking: bool,
) -> Result<Option<String>, String> {
    let rank = comm.rank();
    let host: Vec<T> = (0..n).map(|i| T::from_i64(value(rank, i))).collect();
    let mut d: CudaSlice<T> = if n == 0 {
        stream.null().map_err(|e| e.to_string())?
    } else {
        stream.clone_htod(&host).map_err(|e| e.to_string())?
    };
    if nonblocking {
        d = comm
            .all_reduce_device_start(d, op, stream.clone())
            .wait()
            .map_err(|e| e.to_string())?;
    } else {
        comm.all_reduce_device(&mut d, op, stream)
            .map_err(|e| e.to_string())?;
    }
    let got: Vec<T> = if n == 0 {
        Vec::new()
    } else {
        stream.clone_dtoh(&d).map_err(|e| e.to_string())?
    };
    stream.synchronize().map_err(|e| e.to_string())?;
    let want = reference::<T>(comm.size(), n, op);
    if as_bytes(&got) != as_bytes(&want) {
        let bad = got.iter().zip(&want).position(|(a, b)| {
            as_bytes(std::slice::from_ref(a)) != as_bytes(std::slice::from_ref(b))
        });
        return Ok(Some(match bad {
            Some(i) => format!(
                "element {i} of {n}: got {:?}, expected {:?}",
                got[i], want[i]
            ),
            None => format!("length {} vs {}", got.len(), want.len()),
        }));
    }
    Ok(None)
}

fn check_dtype(
    comm: &Communicator,
    stream: &Arc<CudaStream>,
    d: DataType,
    op: ReduceOp,
    n: usize,
    nb: bool,
) -> Result<Option<String>, String> {
    match d {
        DataType::I8 => check::<i8>(comm, stream, op, n, nb),
        DataType::U8 => check::<u8>(comm, stream, op, n, nb),
        DataType::I32 => check::<i32>(comm, stream, op, n, nb),
        DataType::U32 => check::<u32>(comm, stream, op, n, nb),
        DataType::I64 => check::<i64>(comm, stream, op, n, nb),
        DataType::U64 => check::<u64>(comm, stream, op, n, nb),
        DataType::F16 => check::<half::f16>(comm, stream, op, n, nb),
        DataType::Bf16 => check::<half::bf16>(comm, stream, op, n, nb),
        DataType::F32 => check::<f32>(comm, stream, op, n, nb),
        DataType::F64 => check::<f64>(comm, stream, op, n, nb),
    }
}

/// Rank `r`'s input of `n` elements of type `d`, as bytes.
fn encode(d: DataType, n: usize, r: usize) -> Vec<u8> {
    fn enc<T: Element>(n: usize, r: usize) -> Vec<u8> {
        let v: Vec<T> = (0..n).map(|i| T::from_i64(value(r, i))).collect();
        as_bytes(&v).to_vec()
    }
    match d {
        DataType::I8 => enc::<i8>(n, r),
        DataType::U8 => enc::<u8>(n, r),
        DataType::I32 => enc::<i32>(n, r),
        DataType::U32 => enc::<u32>(n, r),
        DataType::I64 => enc::<i64>(n, r),
        DataType::U64 => enc::<u64>(n, r),
        DataType::F16 => enc::<half::f16>(n, r),
        DataType::Bf16 => enc::<half::bf16>(n, r),
        DataType::F32 => enc::<f32>(n, r),
        DataType::F64 => enc::<f64>(n, r),
    }
}

/// The GPUDirect network path's reduction of a received chunk (staged in device memory) into
/// the work buffer, for every type and operator, against the CPU kernels. Returns the failures.
fn check_chunk_reduction(
    rank: usize,
    ctx: &Arc<railring::device::cudarc::driver::CudaContext>,
    stream: &Arc<CudaStream>,
) -> Result<Vec<String>, String> {
    use railring::device::cudarc::driver::DevicePtrMut;
    use railring::transport::cuda::gdr::CudaDataMem;
    use railring::transport::DataMem;
    let mut mem = CudaDataMem::new(rank, ctx, stream.clone()).map_err(|e| e.to_string())?;
    let mut bad = Vec::new();
    for d in DataType::ALL {
        for op in ReduceOp::ALL {
            let n = 70_001usize;
            let esz = d.size();
            let (a, b) = (encode(d, n, 0), encode(d, n, 1));
            let mut want = a.clone();
            kernels::reduce_into(d, op, &mut want, &b);
            let mut dst = stream.clone_htod(&a).map_err(|e| e.to_string())?;
            stream.synchronize().map_err(|e| e.to_string())?;
            let stage = mem.stage(n * esz).map_err(|e| e.to_string())?;
            // SAFETY: the staging area holds at least n * esz bytes; b is that long.
            unsafe {
                railring::device::cudarc::driver::sys::cuMemcpyHtoD_v2(
                    stage as u64,
                    b.as_ptr() as *const _,
                    n * esz,
                )
            }
            .result()
            .map_err(|e| e.to_string())?;
            {
                let (p, _w) = dst.device_ptr_mut(stream);
                // SAFETY: both are device buffers of n * esz bytes on this stream's device.
                unsafe { mem.reduce_into(d, op, p as *mut u8, stage, n * esz) }
                    .map_err(|e| e.to_string())?;
            }
            let got = stream.clone_dtoh(&dst).map_err(|e| e.to_string())?;
            stream.synchronize().map_err(|e| e.to_string())?;
            if got != want {
                let i = got.iter().zip(&want).position(|(x, y)| x != y).unwrap_or(0) / esz;
                bad.push(format!(
                    "GPUDirect chunk reduction {d} {op}: element {i} differs"
                ));
            }
        }
    }
    Ok(bad)
}

fn fmt_size(b: usize) -> String {
    b.to_string()
}

fn run(o: &Opts) -> Result<bool, String> {
    let comm = Communicator::init().map_err(|e| e.to_string())?;
    let (rank, size) = (comm.rank(), comm.size());
    let ndev = railring::device::cudarc::driver::CudaContext::device_count()
        .map_err(|e| format!("counting GPUs: {e}"))?
        .max(0) as usize;
    if ndev == 0 {
        return Err("no CUDA device".into());
    }
    let dev = o.device.unwrap_or(comm.local_rank() % ndev);
    let ctx = context(rank, dev).map_err(|e| e.to_string())?;
    let stream = ctx.new_stream().map_err(|e| e.to_string())?;
    let name = ctx.name().unwrap_or_else(|_| "?".into());
    if rank == 0 {
        println!("# gpucheck: {size} ranks, rank 0 on GPU {dev} ({name}); RAILRING_DEBUG=INFO shows the in-node path");
    }

    // 1. correctness
    let sizes: Vec<usize> = if o.quick {
        vec![1, 1031, (1 << 20) + 7]
    } else {
        vec![1, 1031, 65_537, 3 * (1 << 20) + 5]
    };
    let mut cases = 0usize;
    let mut failures = Vec::new();
    let t0 = Instant::now();
    if rank == 0 {
        failures.extend(check_chunk_reduction(rank, &ctx, &stream)?);
        println!(
            "# GPUDirect chunk reduction: {} types x {} ops, {} wrong; GPUDirect RDMA on this GPU: {}",
            DataType::ALL.len(),
            ReduceOp::ALL.len(),
            failures.len(),
            railring::transport::cuda::gdr::gdr_unsupported(&ctx)
                .unwrap_or_else(|| "supported by the driver".into())
        );
    }
    // zero elements once
    if let Some(e) = check_dtype(&comm, &stream, DataType::F32, ReduceOp::Sum, 0, false)? {
        failures.push(format!("float sum, 0 elements: {e}"));
    }
    cases += 1;
    for d in DataType::ALL {
        for op in ReduceOp::ALL {
            for &n in &sizes {
                if let Some(e) = check_dtype(&comm, &stream, d, op, n, false)? {
                    failures.push(format!("{d} {op} n={n}: {e}"));
                }
                cases += 1;
            }
        }
        // the non-blocking API, once per type
        if let Some(e) = check_dtype(&comm, &stream, d, ReduceOp::Sum, 4099, true)? {
            failures.push(format!("{d} sum (non-blocking): {e}"));
        }
        cases += 1;
    }
    let mut bad = [failures.len() as f64];
    comm.all_reduce(&mut bad, ReduceOp::Sum)
        .map_err(|e| e.to_string())?;
    for f in &failures {
        eprintln!("gpucheck: rank {rank}: WRONG: {f}");
    }
    if rank == 0 {
        println!(
            "# correctness: {cases} cases x {size} ranks ({} types x {} ops x {} sizes + non-blocking + empty): {} wrong, {:.1} s",
            DataType::ALL.len(),
            ReduceOp::ALL.len(),
            sizes.len(),
            bad[0],
            t0.elapsed().as_secs_f64()
        );
    }
    let ok = bad[0] == 0.0;

    // 2. bandwidth
    if o.bench {
        if rank == 0 {
            println!("#");
            println!("# all_reduce_device, float sum, in place; d2d = cuMemcpyDtoD of the same size on rank 0 (bytes / time)");
            println!(
                "# {:>12} {:>12} {:>6} {:>6} {:>10} {:>8} {:>8} {:>10}",
                "size", "count", "type", "redop", "time(us)", "algbw", "busbw", "d2d(GB/s)"
            );
        }
        let mut bytes = o.min_bytes.max(4);
        while bytes <= o.max_bytes {
            let n = bytes / 4;
            let host: Vec<f32> = (0..n).map(|i| value(rank, i) as f32).collect();
            let mut d = stream.clone_htod(&host).map_err(|e| e.to_string())?;
            for _ in 0..o.warmup {
                comm.all_reduce_device(&mut d, ReduceOp::Sum, &stream)
                    .map_err(|e| e.to_string())?;
            }
            stream.synchronize().map_err(|e| e.to_string())?;
            comm.barrier().map_err(|e| e.to_string())?;
            let t = Instant::now();
            for _ in 0..o.iters {
                comm.all_reduce_device(&mut d, ReduceOp::Sum, &stream)
                    .map_err(|e| e.to_string())?;
            }
            stream.synchronize().map_err(|e| e.to_string())?;
            let mut secs = [t.elapsed().as_secs_f64() / o.iters as f64];
            comm.all_reduce(&mut secs, ReduceOp::Max)
                .map_err(|e| e.to_string())?;
            // device-to-device copy bandwidth on rank 0 alone (others wait)
            let mut d2d = 0.0;
            if rank == 0 {
                let mut dst = stream.clone_dtod(&d).map_err(|e| e.to_string())?;
                stream.synchronize().map_err(|e| e.to_string())?;
                let t = Instant::now();
                for _ in 0..o.iters {
                    stream
                        .memcpy_dtod(&d, &mut dst)
                        .map_err(|e| e.to_string())?;
                }
                stream.synchronize().map_err(|e| e.to_string())?;
                d2d = bytes as f64 / (t.elapsed().as_secs_f64() / o.iters as f64) / 1e9;
            }
            comm.barrier().map_err(|e| e.to_string())?;
            if rank == 0 {
                let algbw = bytes as f64 / secs[0] / 1e9;
                let busbw = algbw * Coll::AllReduce.bus_factor(size);
                println!(
                    "  {:>12} {:>12} {:>6} {:>6} {:>10.1} {:>8.2} {:>8.2} {:>10.2}",
                    fmt_size(bytes),
                    n,
                    "float",
                    "sum",
                    secs[0] * 1e6,
                    algbw,
                    busbw,
                    d2d
                );
            }
            bytes = bytes.saturating_mul(4);
        }
    }
    if rank == 0 {
        println!("# gpucheck: {}", if ok { "PASS" } else { "FAIL" });
    }
    Ok(ok)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let o = match parse(&args) {
        Ok(o) => o,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("gpucheck: {e}");
            }
            eprintln!("{USAGE}");
            std::process::exit(2);
        }
    };
    if !driver_present() {
        eprintln!("gpucheck: SKIPPED: no CUDA driver (libcuda.so.1) on this machine");
        std::process::exit(2);
    }
    match run(&o) {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("gpucheck: error: {e}");
            std::process::exit(1);
        }
    }
}

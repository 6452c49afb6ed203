//! The GPU data path without a GPU where possible (kernel sources, launch geometry, IPC records
//! through a real store, the no-driver errors), and with one when the machine has it (skipped
//! loudly otherwise). Multi-process IPC runs are `tests/gpu/run.sh` (gpucheck under railrun).
#![cfg(feature = "cuda")]

use railring::bootstrap::Rendezvous;
use railring::config::Config;
use railring::store::{self, Store, StoreClient};
use railring::transport::cuda::ipc::{self, GpuPeer, IpcHandle, Verdict};
use railring::transport::cuda::kernels::{self, HalfImpl};
use railring::transport::cuda::{context, driver_present, require_driver};
use railring::{Communicator, DataType, ReduceOp};
use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

#[test]
fn kernel_source_for_every_dtype_and_op() {
    for d in DataType::ALL {
        for op in ReduceOp::ALL {
            let s = kernels::module_source(d, op, HalfImpl::Headers);
            assert!(s.contains(&kernels::reduce_kernel_name(d, op)));
            let b = kernels::module_source(d, op, HalfImpl::Builtin);
            assert!(
                !b.contains("#include"),
                "{d} {op}: the built-in variant needs no headers"
            );
        }
    }
    let s = kernels::module_source(DataType::F16, ReduceOp::Max, HalfImpl::Headers);
    assert!(s.contains("cuda_fp16.h") && s.contains("__half"));
    let s = kernels::module_source(DataType::Bf16, ReduceOp::Sum, HalfImpl::Headers);
    assert!(s.contains("cuda_bf16.h") && s.contains("__nv_bfloat16"));
}

#[test]
fn launch_config_logic() {
    let d = kernels::launch_dims(10_000, 132);
    assert_eq!(d.block, 256);
    assert_eq!(d.grid, 40);
    assert_eq!(
        kernels::launch_dims(1 << 40, 132).grid,
        132 * kernels::BLOCKS_PER_SM
    );
}

#[test]
fn ipc_handles_through_a_real_bootstrap_store() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let srv = store::serve(l, "k", Store::new()).unwrap();
    let addr = srv.addr.to_string();
    let t = Duration::from_secs(20);
    let n = 3;
    let ths: Vec<_> = (0..n)
        .map(|i| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                let c = StoreClient::connect(&addr, "k", t).unwrap();
                let mut h = [0u8; ipc::HANDLE_BYTES];
                h[0] = 0xa0 + i as u8;
                h[63] = i as u8;
                let me = GpuPeer {
                    rank: i,
                    pid: 100 + i as u32,
                    bus_id: "0000:41:00.0".into(),
                    ordinal: 0,
                    handle: Some(IpcHandle(h)),
                    bytes: 8 << 20,
                    note: None,
                };
                let pre = ipc::prefix(7, 42);
                let all = ipc::exchange_peers(&c, &pre, i, n, &me, t).unwrap();
                // several ranks on one GPU: direct, no peer access needed
                let acc = ipc::plan_access(i, &all, &me.bus_id, |_| None).unwrap();
                assert_eq!(acc.len(), n);
                let v = Verdict {
                    rank: i,
                    problem: None,
                };
                assert_eq!(ipc::agree(&c, &pre, i, n, &v, t).unwrap(), Ok(()));
                all
            })
        })
        .collect();
    for th in ths {
        let all = th.join().unwrap();
        for (i, p) in all.iter().enumerate() {
            assert_eq!(p.handle.unwrap().0[0], 0xa0 + i as u8);
            assert_eq!(p.handle.unwrap().0[63], i as u8);
            assert_eq!(p.pid, 100 + i as u32);
        }
    }
}

#[test]
fn no_driver_means_errors_not_panics() {
    if driver_present() {
        eprintln!("SKIPPED: no_driver_means_errors_not_panics: this machine has a CUDA driver");
        return;
    }
    let e = require_driver(0).unwrap_err().to_string();
    assert!(e.contains("not present"), "{e}");
    assert!(context(0, 0).is_err());
    // The communicator itself is unaffected (host collectives still work).
    let c = Communicator::init().unwrap();
    let mut v = [1.0f32; 4];
    c.all_reduce(&mut v, ReduceOp::Sum).unwrap();
}

/// Two ranks as threads of this process on GPU 0. IPC between threads of one process is not
/// possible, so this exercises the agreed fallback (staging through pinned host memory) and the
/// stream semantics; the IPC path itself is covered by tests/gpu/run.sh.
#[test]
fn device_all_reduce_on_hardware() {
    if !driver_present() {
        eprintln!("SKIPPED: device_all_reduce_on_hardware: no CUDA driver on this machine");
        return;
    }
    if railring::device::cudarc::driver::CudaContext::device_count().unwrap_or(0) < 1 {
        eprintln!("SKIPPED: device_all_reduce_on_hardware: no CUDA device");
        return;
    }
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let srv = store::serve(l, "k", Store::new()).unwrap();
    let addr = srv.addr.to_string();
    let n = 2;
    let ths: Vec<_> = (0..n)
        .map(|r| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                let cfg = Config::from_env().unwrap();
                let st =
                    Arc::new(StoreClient::connect(&addr, "k", Duration::from_secs(20)).unwrap());
                let rv = Rendezvous {
                    rank: r,
                    size: n,
                    store: st,
                    secret: "k".into(),
                    job: "cudatest".into(),
                    server: None,
                };
                let comm = Communicator::from_rendezvous(rv, cfg).unwrap();
                let ctx = context(r, 0).unwrap();
                let stream = ctx.new_stream().unwrap();
                for op in ReduceOp::ALL {
                    let host: Vec<f32> = (0..10_000).map(|i| (1 + (i + r) % 3) as f32).collect();
                    let mut d = stream.clone_htod(&host).unwrap();
                    comm.all_reduce_device(&mut d, op, &stream).unwrap();
                    let got = stream.clone_dtoh(&d).unwrap();
                    stream.synchronize().unwrap();
                    for (i, g) in got.iter().enumerate() {
                        let (a, b) = ((1 + i % 3) as f32, (1 + (i + 1) % 3) as f32);
                        let want = match op {
                            ReduceOp::Sum => a + b,
                            ReduceOp::Prod => a * b,
                            ReduceOp::Min => a.min(b),
                            ReduceOp::Max => a.max(b),
                            ReduceOp::Avg => (a + b) / 2.0,
                        };
                        assert_eq!(*g, want, "{op} element {i}");
                    }
                }
                let host: Vec<i64> = vec![r as i64 + 1; 333];
                let d = stream.clone_htod(&host).unwrap();
                let d = comm
                    .all_reduce_device_start(d, ReduceOp::Sum, stream.clone())
                    .wait()
                    .unwrap();
                assert!(stream.clone_dtoh(&d).unwrap().iter().all(|&x| x == 3));
            })
        })
        .collect();
    for t in ths {
        t.join().unwrap();
    }
}

//! Every algorithm through the real executor: ranks are threads, network links are bounded
//! in-memory pipes, in-node steps run on real shared-memory segments. Results are checked element
//! by element against an exact reference, on every rank.

use railring::executor::{Bufs, CallDesc, Executor, Links};
use railring::transport::pipe::{pair, PipeLink};
use railring::transport::shm::{Geometry, Node, ShmFabric};
use railring::transport::{DataMem, Link, LinkError, MemKind};
use railring_collectives::build::{algorithms_for, build_plan};
use railring_collectives::plan::{Algo, CollKind, Layout};
use railring_collectives::{kernels, DataType, ReduceOp};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

type Mailbox = Arc<Mutex<HashMap<(usize, usize, usize), PipeLink>>>;

struct PipeLinks {
    me: usize,
    mailbox: Mailbox,
    map: HashMap<(usize, usize), Box<dyn Link>>,
    /// Hand out links that also move "device" memory (see [`DevLink`]), counting bytes here.
    device: Option<Arc<Counts>>,
}

/// Bytes links moved, by memory kind, and reductions done on "device" memory.
#[derive(Default)]
struct Counts {
    host_sent: AtomicU64,
    dev_sent: AtomicU64,
    dev_recv: AtomicU64,
    dev_reduced: AtomicU64,
}

const DEV: MemKind = MemKind::Device { ordinal: 0 };

/// A link that accepts "device" memory, which in this test is host memory: stands in for an
/// RDMA link with device-resident rings (GPUDirect) so the executor's device path runs on CPU.
struct DevLink {
    inner: PipeLink,
    counts: Arc<Counts>,
}

impl Link for DevLink {
    fn describe(&self) -> String {
        format!("gpudirect {}", self.inner.describe())
    }
    fn try_send(&mut self, data: &[u8]) -> Result<usize, LinkError> {
        let n = self.inner.try_send(data)?;
        self.counts.host_sent.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
    fn try_recv(&mut self, buf: &mut [u8]) -> Result<usize, LinkError> {
        self.inner.try_recv(buf)
    }
    fn supports(&self, mem: MemKind) -> bool {
        mem == MemKind::Host || mem == DEV
    }
    unsafe fn try_send_mem(
        &mut self,
        ptr: *const u8,
        n: usize,
        mem: MemKind,
    ) -> Result<usize, LinkError> {
        assert_eq!(mem, DEV, "data must move as device memory");
        let n = self.inner.try_send(std::slice::from_raw_parts(ptr, n))?;
        self.counts.dev_sent.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
    unsafe fn try_recv_mem(
        &mut self,
        ptr: *mut u8,
        n: usize,
        mem: MemKind,
    ) -> Result<usize, LinkError> {
        assert_eq!(mem, DEV, "data must move as device memory");
        let n = self
            .inner
            .try_recv(std::slice::from_raw_parts_mut(ptr, n))?;
        self.counts.dev_recv.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
    fn bytes_sent(&self) -> u64 {
        self.inner.bytes_sent()
    }
}

/// "Device" memory for the executor: host memory behind the `DataMem` interface.
struct FakeDevice {
    stage: Vec<u64>,
    counts: Arc<Counts>,
}

impl DataMem for FakeDevice {
    fn kind(&self) -> MemKind {
        DEV
    }
    fn stage(&mut self, n: usize) -> railring::Result<*mut u8> {
        if self.stage.len() * 8 < n {
            self.stage.resize(n.div_ceil(8), 0);
        }
        Ok(self.stage.as_mut_ptr() as *mut u8)
    }
    unsafe fn reduce_into(
        &mut self,
        dtype: DataType,
        op: ReduceOp,
        dst: *mut u8,
        src: *const u8,
        n: usize,
    ) -> railring::Result<()> {
        kernels::reduce_into_raw(dtype, op, dst, src, n);
        self.counts
            .dev_reduced
            .fetch_add(n as u64, Ordering::Relaxed);
        Ok(())
    }
}

impl Links for PipeLinks {
    fn link(&mut self, peer: usize, chan: usize) -> railring::Result<*mut dyn Link> {
        if !self.map.contains_key(&(peer, chan)) {
            let mut mb = self.mailbox.lock().unwrap();
            let l = match mb.remove(&(self.me, peer, chan)) {
                Some(l) => l,
                None => {
                    let (a, b) = pair(self.me, peer, 4096 + 17);
                    mb.insert((peer, self.me, chan), b);
                    a
                }
            };
            let l: Box<dyn Link> = match &self.device {
                Some(c) => Box::new(DevLink {
                    inner: l,
                    counts: c.clone(),
                }),
                None => Box::new(l),
            };
            self.map.insert((peer, chan), l);
        }
        Ok(&mut **self.map.get_mut(&(peer, chan)).unwrap() as *mut dyn Link)
    }
    fn host_of(&self, peer: usize) -> String {
        format!("thread-host-{peer}")
    }
}

/// Per-rank input: small integers so every reduction order is exact.
fn input(kind: CollKind, rank: usize, i: usize, op: ReduceOp) -> i64 {
    match op {
        ReduceOp::Prod => {
            if (rank + i).is_multiple_of(5) {
                2
            } else if (rank * 3 + i).is_multiple_of(7) {
                -1
            } else {
                1
            }
        }
        _ => {
            let k = if kind == CollKind::AllToAll { 13 } else { 7 };
            ((rank * k + i * 3) % 11) as i64
        }
    }
}

fn to_bytes(dtype: DataType, v: &[i64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len() * dtype.size());
    for &x in v {
        match dtype {
            DataType::I32 => out.extend_from_slice(&(x as i32).to_le_bytes()),
            DataType::F32 => out.extend_from_slice(&(x as f32).to_le_bytes()),
            DataType::F16 => out.extend_from_slice(&half::f16::from_f64(x as f64).to_le_bytes()),
            DataType::U8 => out.push(x as u8),
            DataType::F64 => out.extend_from_slice(&(x as f64).to_le_bytes()),
            DataType::I64 => out.extend_from_slice(&x.to_le_bytes()),
            _ => unimplemented!(),
        }
    }
    out
}

fn reference(op: ReduceOp, vals: &[i64], n: usize, dtype: DataType) -> i64 {
    let r = match op {
        ReduceOp::Sum | ReduceOp::Avg => vals.iter().sum(),
        ReduceOp::Prod => vals.iter().product(),
        ReduceOp::Min => *vals.iter().min().unwrap(),
        ReduceOp::Max => *vals.iter().max().unwrap(),
    };
    if op == ReduceOp::Avg {
        if dtype.is_float() {
            // exact reference computed the same way as the kernel (sum, then one division)
            return r; // compared separately below
        }
        return r / n as i64;
    }
    r
}

/// One case: a collective call of `count` elements (`root` where it has one) run with `algo`
/// by every rank of `layout`, twice, checked on every rank element by element.
struct Case<'a> {
    kind: CollKind,
    algo: Algo,
    layout: &'a Layout,
    count: usize,
    root: usize,
    dtype: DataType,
    op: ReduceOp,
    /// Bytes of a shared-memory staging slot.
    slot: usize,
}

impl Case<'_> {
    fn run(&self) {
        run_case(self, false);
    }

    /// Run the two-level all-reduce the way device collectives across nodes do — the plan
    /// split into in-node / network / in-node parts, the network part on "device" memory
    /// through a `DataMem` and device-capable links — and check that data crossed the links
    /// only as device memory (host bytes on the links are the call descriptors, nothing else).
    fn run_on_device(&self) {
        run_case(self, true);
    }
}

fn run_case(case: &Case<'_>, device: bool) {
    let &Case {
        kind,
        algo,
        layout,
        count,
        root,
        dtype,
        op,
        slot,
    } = case;
    let n = layout.size();
    let counts = Arc::new(Counts::default());
    let host_hdr_bytes = AtomicU64::new(0);
    let esz = dtype.size();
    let mailbox: Mailbox = Arc::new(Mutex::new(HashMap::new()));
    let tag = format!(
        "{}-{}-{}-{:?}",
        std::process::id(),
        kind,
        algo,
        std::thread::current().id()
    );
    let nodes: Vec<Option<(std::path::PathBuf, Geometry)>> = layout
        .nodes
        .iter()
        .enumerate()
        .map(|(k, ranks)| {
            (ranks.len() > 1).then(|| {
                let p = std::path::PathBuf::from(format!(
                    "/dev/shm/railring-test-{}-{k}",
                    tag.replace(['(', ')', ' '], "")
                ));
                let _ = std::fs::remove_file(&p);
                (
                    p,
                    Geometry {
                        local_size: ranks.len(),
                        slot_bytes: slot,
                        ring_bytes: 8192,
                    },
                )
            })
        })
        .collect();
    // remove the segment files however this case ends (a failed assertion panics)
    struct Cleanup(Vec<std::path::PathBuf>);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            for p in &self.0 {
                let _ = std::fs::remove_file(p);
            }
        }
    }
    let _cleanup = Cleanup(nodes.iter().flatten().map(|(p, _)| p.clone()).collect());
    // leaders create the segments first
    let mut created = Vec::new();
    for (k, nd) in nodes.iter().enumerate() {
        if let Some((p, g)) = nd {
            created.push(
                Node::open(p, *g, layout.nodes[k].clone(), 0, format!("node{k}"), true).unwrap(),
            );
        }
    }
    let barrier = Arc::new(Barrier::new(n));
    let results: Vec<(usize, Vec<u8>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                let mailbox = mailbox.clone();
                let nodes = &nodes;
                let barrier = barrier.clone();
                let counts = counts.clone();
                let host_hdr_bytes = &host_hdr_bytes;
                s.spawn(move || {
                    let (k, li) = layout.locate(rank).unwrap();
                    let node = nodes[k].as_ref().map(|(p, g)| {
                        Node::open(
                            p,
                            *g,
                            layout.nodes[k].clone(),
                            li,
                            format!("node{k}"),
                            false,
                        )
                        .unwrap()
                    });
                    let mut fabric = node.map(|nd| ShmFabric::new(nd, Duration::from_secs(20)));
                    let mut links = PipeLinks {
                        me: rank,
                        mailbox,
                        map: HashMap::new(),
                        device: device.then(|| counts.clone()),
                    };
                    let (work_len, input_len) = match kind {
                        CollKind::ReduceScatter | CollKind::AllGather => (count * n, 0),
                        CollKind::AllToAll => (count * n, count * n),
                        CollKind::Barrier => (count.max(1), 0),
                        _ => (count, 0),
                    };
                    let vals: Vec<i64> = match kind {
                        CollKind::AllGather => (0..work_len)
                            .map(|i| {
                                if i / count.max(1) == rank {
                                    input(kind, rank, i, op)
                                } else {
                                    -99
                                }
                            })
                            .collect(),
                        CollKind::Broadcast => (0..work_len)
                            .map(|i| {
                                if rank == root {
                                    input(kind, rank, i, op)
                                } else {
                                    -77
                                }
                            })
                            .collect(),
                        CollKind::AllToAll => vec![0; work_len],
                        _ => (0..work_len).map(|i| input(kind, rank, i, op)).collect(),
                    };
                    let mut work = to_bytes(dtype, &vals);
                    let inp = to_bytes(
                        dtype,
                        &(0..input_len)
                            .map(|i| input(kind, rank, i, op))
                            .collect::<Vec<_>>(),
                    );
                    let plan = build_plan(kind, algo, layout, rank, count, root).unwrap();
                    let split = device.then(|| {
                        plan.split_for_device()
                            .unwrap_or_else(|| panic!("layout {:?}: no device split", layout.nodes))
                    });
                    if let Some(sp) = &split {
                        // each (peer, channel) carries one descriptor per call, as host memory
                        let mut pairs = std::collections::HashSet::new();
                        for st in &sp.net.steps {
                            if let railring_collectives::plan::Step::Exchange {
                                send: Some(x),
                                ..
                            } = st
                            {
                                if x.region.len > 0 {
                                    pairs.insert((x.peer, x.chan));
                                }
                            }
                        }
                        host_hdr_bytes.fetch_add(
                            (2 * pairs.len() * railring::transport::DESC) as u64,
                            Ordering::Relaxed,
                        );
                    }
                    let mut fake = FakeDevice {
                        stage: Vec::new(),
                        counts: counts.clone(),
                    };
                    let mut staging = Vec::new();
                    let mut ex = Executor {
                        rank,
                        size: n,
                        links: &mut links,
                        fabric: fabric
                            .as_mut()
                            .map(|f| f as &mut (dyn railring::transport::NodeFabric + 'static)),
                        timeout: Duration::from_secs(20),
                        chunk: 1024,
                        staging: &mut staging,
                        mem: None,
                    };
                    barrier.wait();
                    for seq in 1..=2u64 {
                        // run twice to exercise slot reuse and sequence numbers
                        let mut w = work.clone();
                        let desc = CallDesc {
                            seq,
                            kind,
                            dtype,
                            op,
                            count: count as u64,
                            root: root as u32,
                            comm: 1,
                        };
                        let bufs = Bufs {
                            work: w.as_mut_ptr(),
                            work_bytes: w.len(),
                            input: inp.as_ptr(),
                            input_bytes: inp.len(),
                            src: None,
                            scratch: std::ptr::null_mut(),
                            scratch_bytes: 0,
                        };
                        let r = match &split {
                            None => unsafe { ex.run(&plan, &desc, op, bufs) },
                            Some(sp) => unsafe {
                                ex.run(&sp.pre, &desc, op, bufs)
                                    .and_then(|_| {
                                        let mut dev = Executor {
                                            rank,
                                            size: n,
                                            links: &mut *ex.links,
                                            fabric: None,
                                            timeout: Duration::from_secs(20),
                                            chunk: 1024,
                                            staging: &mut Vec::new(),
                                            mem: Some(&mut fake),
                                        };
                                        dev.run(&sp.net, &desc, op, bufs)
                                    })
                                    .and_then(|_| ex.run(&sp.post, &desc, op, bufs))
                            },
                        };
                        r.unwrap_or_else(|e| {
                            panic!("{kind} {algo} layout {:?} count {count}: {e}", layout.nodes)
                        });
                        if seq == 2 {
                            work = w;
                        }
                    }
                    if op == ReduceOp::Avg && matches!(kind, CollKind::AllReduce) {
                        kernels::finish_avg(dtype, &mut work, n);
                    }
                    (rank, work)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    drop(created);
    if device {
        let c = &*counts;
        let (sent, recv, red) = (
            c.dev_sent.load(Ordering::Relaxed),
            c.dev_recv.load(Ordering::Relaxed),
            c.dev_reduced.load(Ordering::Relaxed),
        );
        assert_eq!(
            c.host_sent.load(Ordering::Relaxed),
            host_hdr_bytes.load(Ordering::Relaxed),
            "layout {:?} count {count}: only descriptors may cross the links as host memory",
            layout.nodes
        );
        assert_eq!(
            sent, recv,
            "layout {:?}: device bytes sent and received",
            layout.nodes
        );
        if layout.nodes.len() > 1 && count >= n {
            assert!(
                sent > 0 && red > 0,
                "layout {:?} count {count}: no device traffic",
                layout.nodes
            );
        }
    }
    // check every rank, element by element
    for (rank, got) in results {
        let expect: Vec<Option<i64>> = match kind {
            CollKind::AllReduce => (0..count)
                .map(|i| {
                    Some(reference(
                        op,
                        &(0..n).map(|r| input(kind, r, i, op)).collect::<Vec<_>>(),
                        n,
                        dtype,
                    ))
                })
                .collect(),
            CollKind::ReduceScatter => (0..count * n)
                .map(|i| {
                    (i / count == rank).then(|| {
                        reference(
                            op,
                            &(0..n).map(|r| input(kind, r, i, op)).collect::<Vec<_>>(),
                            n,
                            dtype,
                        )
                    })
                })
                .collect(),
            CollKind::AllGather => (0..count * n)
                .map(|i| Some(input(kind, i / count, i, op)))
                .collect(),
            CollKind::Broadcast => (0..count).map(|i| Some(input(kind, root, i, op))).collect(),
            CollKind::Reduce => (0..count)
                .map(|i| {
                    (rank == root).then(|| {
                        reference(
                            op,
                            &(0..n).map(|r| input(kind, r, i, op)).collect::<Vec<_>>(),
                            n,
                            dtype,
                        )
                    })
                })
                .collect(),
            CollKind::AllToAll => (0..count * n)
                .map(|i| Some(input(kind, i / count, rank * count + i % count, op)))
                .collect(),
            _ => vec![],
        };
        let mut exp_bytes = Vec::new();
        for (i, e) in expect.iter().enumerate() {
            let Some(v) = e else { continue };
            let mut want = to_bytes(dtype, &[*v]);
            if op == ReduceOp::Avg && dtype.is_float() && kind == CollKind::AllReduce {
                let mut w = want.clone();
                kernels::finish_avg(dtype, &mut w, n);
                want = w;
            }
            let g = &got[i * esz..(i + 1) * esz];
            assert_eq!(g, &want[..], "{kind} {algo} n={n} layout={:?} count={count} root={root} {dtype} {op}: rank {rank} element {i}", layout.nodes);
            exp_bytes.push(i);
        }
    }
}

fn layouts(n: usize) -> Vec<Layout> {
    let mut v = vec![Layout::single_node(n), Layout::block(n, 1)];
    if n >= 4 {
        v.push(Layout::block(n, 2));
    }
    if n >= 8 {
        v.push(Layout::block(n, 4));
    }
    v
}

#[test]
fn all_reduce_every_algorithm_n_1_to_16() {
    for n in 1..=16 {
        for layout in layouts(n) {
            for &algo in algorithms_for(CollKind::AllReduce) {
                for count in [0, 1, n + 1, 1000] {
                    if build_plan(CollKind::AllReduce, algo, &layout, 0, count, 0).is_err() {
                        continue;
                    }
                    Case {
                        kind: CollKind::AllReduce,
                        algo,
                        layout: &layout,
                        count,
                        root: 0,
                        dtype: DataType::I32,
                        op: ReduceOp::Sum,
                        slot: 4096,
                    }
                    .run();
                }
            }
        }
    }
}

#[test]
fn all_reduce_dtypes_ops_and_multi_chunk() {
    for layout in [Layout::single_node(3), Layout::block(4, 2)] {
        for dtype in [
            DataType::F32,
            DataType::F16,
            DataType::U8,
            DataType::F64,
            DataType::I64,
        ] {
            for op in ReduceOp::ALL {
                Case {
                    kind: CollKind::AllReduce,
                    algo: Algo::TwoLevel,
                    layout: &layout,
                    count: 5003,
                    root: 0,
                    dtype,
                    op,
                    slot: 4096,
                }
                .run();
            }
        }
    }
}

#[test]
fn other_kinds_every_algorithm() {
    for n in [1, 2, 3, 4, 5, 8, 16] {
        for layout in layouts(n) {
            for kind in [
                CollKind::ReduceScatter,
                CollKind::AllGather,
                CollKind::Broadcast,
                CollKind::Reduce,
                CollKind::AllToAll,
                CollKind::Barrier,
            ] {
                for &algo in algorithms_for(kind) {
                    for count in [0, 1, 7, 300] {
                        let root = n.saturating_sub(1);
                        if build_plan(kind, algo, &layout, 0, count, root).is_err() {
                            continue;
                        }
                        Case {
                            kind,
                            algo,
                            layout: &layout,
                            count,
                            root,
                            dtype: DataType::F32,
                            op: ReduceOp::Sum,
                            slot: 4096,
                        }
                        .run();
                    }
                }
            }
        }
    }
}

#[test]
fn device_network_steps_move_device_memory_only() {
    // the shape of device all-reduce across nodes: in-node parts, then the network part on
    // "device" memory, every dtype and op, several layouts and counts (incl. empty slices)
    for layout in [
        Layout::block(4, 2),
        Layout::block(6, 3),
        Layout::block(6, 2),
        Layout::block(3, 1),
        Layout::block(8, 4),
    ] {
        for count in [0, 1, 5, 1000, 5003] {
            Case {
                kind: CollKind::AllReduce,
                algo: Algo::TwoLevel,
                layout: &layout,
                count,
                root: 0,
                dtype: DataType::F32,
                op: ReduceOp::Sum,
                slot: 4096,
            }
            .run_on_device();
        }
    }
    for dtype in [
        DataType::F16,
        DataType::U8,
        DataType::F64,
        DataType::I64,
        DataType::I32,
    ] {
        for op in ReduceOp::ALL {
            Case {
                kind: CollKind::AllReduce,
                algo: Algo::TwoLevel,
                layout: &Layout::block(4, 2),
                count: 3001,
                root: 0,
                dtype,
                op,
                slot: 4096,
            }
            .run_on_device();
        }
    }
}

#[test]
fn host_only_links_refuse_device_memory() {
    // the default memory-kind calls of a host link
    let (mut a, _b) = pair(0, 1, 64);
    let mut x = [0u8; 8];
    let e = unsafe { a.try_send_mem(x.as_ptr(), 8, DEV) }.unwrap_err();
    assert!(e.to_string().contains("host memory only"), "{e}");
    assert!(unsafe { a.try_recv_mem(x.as_mut_ptr(), 8, DEV) }.is_err());
    assert_eq!(
        unsafe { a.try_send_mem(x.as_ptr(), 8, MemKind::Host) }.unwrap(),
        8
    );
    // an executor on device memory fails the call up front, naming the link
    let layout = Layout::block(2, 1);
    let plan = build_plan(CollKind::AllReduce, Algo::Ring, &layout, 0, 64, 0).unwrap();
    let mut links = PipeLinks {
        me: 0,
        mailbox: Arc::new(Mutex::new(HashMap::new())),
        map: HashMap::new(),
        device: None,
    };
    let counts = Arc::new(Counts::default());
    let mut fake = FakeDevice {
        stage: Vec::new(),
        counts,
    };
    let mut staging = Vec::new();
    let mut ex = Executor {
        rank: 0,
        size: 2,
        links: &mut links,
        fabric: None,
        timeout: Duration::from_secs(5),
        chunk: 1024,
        staging: &mut staging,
        mem: Some(&mut fake),
    };
    let mut w = vec![0u8; 64 * 4];
    let desc = CallDesc {
        seq: 1,
        kind: CollKind::AllReduce,
        dtype: DataType::F32,
        op: ReduceOp::Sum,
        count: 64,
        root: 0,
        comm: 1,
    };
    let bufs = Bufs {
        work: w.as_mut_ptr(),
        work_bytes: w.len(),
        input: std::ptr::null(),
        input_bytes: 0,
        src: None,
        scratch: std::ptr::null_mut(),
        scratch_bytes: 0,
    };
    let e = unsafe { ex.run(&plan, &desc, ReduceOp::Sum, bufs) }.unwrap_err();
    assert!(e.to_string().contains("cannot move Device"), "{e}");
    // and refuses in-node steps on device memory
    let plan = build_plan(
        CollKind::AllReduce,
        Algo::TwoLevel,
        &Layout::single_node(2),
        0,
        64,
        0,
    )
    .unwrap();
    let e = unsafe { ex.run(&plan, &desc, ReduceOp::Sum, bufs) }.unwrap_err();
    assert!(e.to_string().contains("only network exchanges"), "{e}");
}

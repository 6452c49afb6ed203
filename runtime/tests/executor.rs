//! Every algorithm through the real executor: ranks are threads, network links are bounded
//! in-memory pipes, in-node steps run on real shared-memory segments. Results are checked element
//! by element against an exact reference, on every rank.

use railring::executor::{Bufs, CallDesc, Executor, Links};
use railring::transport::mem::{pair, MemLink};
use railring::transport::shm::{Geometry, Node, ShmFabric};
use railring::transport::Link;
use railring_collectives::build::{algorithms_for, build_plan};
use railring_collectives::plan::{Algo, CollKind, Layout};
use railring_collectives::{kernels, DataType, ReduceOp};
use std::collections::HashMap;
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

type Mailbox = Arc<Mutex<HashMap<(usize, usize, usize), MemLink>>>;

struct MemLinks {
    me: usize,
    mailbox: Mailbox,
    map: HashMap<(usize, usize), Box<dyn Link>>,
}

impl Links for MemLinks {
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
            self.map.insert((peer, chan), Box::new(l));
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
            if (rank + i) % 5 == 0 {
                2
            } else if (rank * 3 + i) % 7 == 0 {
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

#[allow(clippy::too_many_arguments)]
fn run_case(
    kind: CollKind,
    algo: Algo,
    layout: &Layout,
    count: usize,
    root: usize,
    dtype: DataType,
    op: ReduceOp,
    slot: usize,
) {
    let n = layout.size();
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
                    let mut links = MemLinks {
                        me: rank,
                        mailbox,
                        map: HashMap::new(),
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
                        };
                        unsafe { ex.run(&plan, &desc, op, bufs) }.unwrap_or_else(|e| {
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
                    run_case(
                        CollKind::AllReduce,
                        algo,
                        &layout,
                        count,
                        0,
                        DataType::I32,
                        ReduceOp::Sum,
                        4096,
                    );
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
                run_case(
                    CollKind::AllReduce,
                    Algo::TwoLevel,
                    &layout,
                    5003,
                    0,
                    dtype,
                    op,
                    4096,
                );
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
                        let root = if n > 1 { n - 1 } else { 0 };
                        if build_plan(kind, algo, &layout, 0, count, root).is_err() {
                            continue;
                        }
                        run_case(
                            kind,
                            algo,
                            &layout,
                            count,
                            root,
                            DataType::F32,
                            ReduceOp::Sum,
                            4096,
                        );
                    }
                }
            }
        }
    }
}

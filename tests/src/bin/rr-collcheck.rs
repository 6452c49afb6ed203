//! Test program: runs every collective through `railring::Communicator::init()` and checks every
//! element of every result against an exact reference (each rank can compute every rank's
//! input). Modes:
//!   all            every collective, dtype, op and awkward size; prints "OK rank R"
//!   allreduce N    one f32 all-reduce of N elements, checked (used by cluster tests)
//!   affinity       prints "AFFINITY rank R cpus LIST" (Cpus_allowed_list after init)
//!   mismatch       rank 1 calls all_reduce with another count; prints the error, exits 3
//!   mismatch-big   the same, rank 1's count large (1M elements) and rank 0's small
//!   die-before     rank 1 exits 7 before the collective; the others print their error, exit 3
//!   stall          rank 1 sleeps instead of calling; the others print their error, exit 3
//!   stall-split    the same with a split instead of an all-reduce
//!   run-ahead      one-way small calls (broadcasts, then reduces) of 2 to 1024 elements, each
//!                  call's values its own, where the ranks that only write run far ahead of the
//!                  readers, which pause now and then; every result checked; prints "OK rank R"
//!   broadcast-tree broadcasts of 64-256 KiB (a tree of direct reads on one node) from every
//!                  root, in place and out of place, each call's values its own, a rank
//!                  starting late now and then; prints "OK rank R broadcast-tree"
//!   broadcast-crowded broadcasts of 4-10 MB from every root, the root calling in place and out
//!                  of place by turns (a crowded node reads the out-of-place ones directly,
//!                  stages the others), and one just under 4 MiB; each call's values its own, a
//!                  rank starting late now and then; prints "OK rank R broadcast-crowded"
use half::{bf16, f16};
use railring::{Communicator, Element, ReduceOp};

fn val(r: usize, i: usize, op: ReduceOp) -> i64 {
    if op == ReduceOp::Prod {
        if (i + r).is_multiple_of(4) {
            2
        } else {
            1
        }
    } else {
        ((i * 5 + r * 3) % 9 + 1) as i64
    }
}

/// Call k's value at element i of rank r's buffer: distinct per call, so a reader that took a
/// line, box or slot a writer had already reused for a later call reads the wrong call's data.
fn call_value(k: usize, r: usize, i: usize) -> f32 {
    ((k * 7 + r * 3 + i) % 1000) as f32
}

fn reference(n: usize, i: usize, op: ReduceOp) -> i64 {
    let v: Vec<i64> = (0..n).map(|r| val(r, i, op)).collect();
    match op {
        ReduceOp::Sum => v.iter().sum(),
        ReduceOp::Avg => v.iter().sum::<i64>(), // divided by the caller per type
        ReduceOp::Prod => v.iter().product(),
        ReduceOp::Min => *v.iter().min().unwrap(),
        ReduceOp::Max => *v.iter().max().unwrap(),
    }
}

fn avg<T: Element>(sum: i64, n: usize) -> T {
    if T::DTYPE.is_float() {
        // the same computation the library does: one division of the exact sum
        let s = T::from_i64(sum);
        let mut b = [s];
        railring_collectives::kernels::finish_avg(
            T::DTYPE,
            railring_collectives::as_bytes_mut(&mut b),
            n,
        );
        b[0]
    } else {
        T::from_i64(sum / n as i64)
    }
}

fn expect<T: Element>(n: usize, i: usize, op: ReduceOp) -> T {
    let r = reference(n, i, op);
    if op == ReduceOp::Avg {
        avg::<T>(r, n)
    } else {
        T::from_i64(r)
    }
}

fn check<T: Element>(what: &str, got: &[T], want: impl Fn(usize) -> Option<T>) {
    for (i, g) in got.iter().enumerate() {
        if let Some(w) = want(i) {
            if *g != w {
                eprintln!("WRONG {what}: element {i}: got {g:?}, expected {w:?}");
                std::process::exit(1);
            }
        }
    }
}

/// An all-reduce of `count` elements with every op, in place and out of place, checked on
/// every rank.
fn big_all_reduce<T: Element>(c: &Communicator, count: usize) {
    for op in ReduceOp::ALL {
        all_reduces::<T>(c, count, op);
    }
}

/// An all-reduce of `count` elements with `op`, in place and out of place, checked on every
/// rank; returns this rank's input.
fn all_reduces<T: Element>(c: &Communicator, count: usize, op: ReduceOp) -> Vec<T> {
    let (n, me) = (c.size(), c.rank());
    let ty = T::DTYPE;
    let input: Vec<T> = (0..count).map(|i| T::from_i64(val(me, i, op))).collect();
    let mut buf = input.clone();
    c.all_reduce(&mut buf, op).unwrap();
    check(&format!("all_reduce {ty} {op} {count}"), &buf, |i| {
        Some(expect::<T>(n, i, op))
    });
    let mut out = vec![T::default(); count];
    c.all_reduce_into(&input, &mut out, op).unwrap();
    check(&format!("all_reduce_into {ty} {op} {count}"), &out, |i| {
        Some(expect::<T>(n, i, op))
    });
    input
}

/// All-gathers of `count` elements a rank: out of place, in place, and out of place on even
/// ranks only, checked element by element on every rank.
fn all_gathers<T: Element>(c: &Communicator, count: usize) {
    let (n, me) = (c.size(), c.rank());
    let ty = T::DTYPE;
    let op = ReduceOp::Sum;
    let mine: Vec<T> = (0..count)
        .map(|i| T::from_i64(val(me, me * count + i, op)))
        .collect();
    let mut all = vec![T::default(); count * n];
    c.all_gather(&mine, &mut all).unwrap();
    check(&format!("all_gather {ty} {count}"), &all, |i| {
        Some(T::from_i64(val(i / count, i, op)))
    });
    // in place, then made in place by odd ranks and out of place by even ones
    for mixed in [false, true] {
        let mut buf = vec![T::default(); count * n];
        buf[me * count..(me + 1) * count].copy_from_slice(&mine);
        if mixed && me % 2 == 0 {
            c.all_gather(&mine, &mut buf).unwrap();
        } else {
            c.all_gather_in_place(&mut buf).unwrap();
        }
        let what = if mixed { "mixed" } else { "in_place" };
        check(&format!("all_gather {what} {ty} {count}"), &buf, |i| {
            Some(T::from_i64(val(i / count, i, op)))
        });
    }
}

fn suite<T: Element>(c: &Communicator, sizes: &[usize]) {
    let (n, me) = (c.size(), c.rank());
    let ty = T::DTYPE;
    for &count in sizes {
        for op in ReduceOp::ALL {
            let input = all_reduces::<T>(c, count, op);
            // reduce-scatter: count per block
            let rs_in: Vec<T> = (0..count * n)
                .map(|i| T::from_i64(val(me, i, op)))
                .collect();
            let mut rs_out = vec![T::default(); count];
            c.reduce_scatter(&rs_in, &mut rs_out, op).unwrap();
            check(&format!("reduce_scatter {ty} {op} {count}"), &rs_out, |i| {
                Some(expect::<T>(n, me * count + i, op))
            });
            for root in [0, n - 1] {
                let mut red = vec![T::default(); count];
                c.reduce(&input, &mut red, op, root).unwrap();
                if me == root {
                    check(
                        &format!("reduce {ty} {op} {count} root {root}"),
                        &red,
                        |i| Some(expect::<T>(n, i, op)),
                    );
                }
                // in place: the root's buffer gets the reduction, the others' stay as they were
                let mut buf = input.clone();
                c.reduce_in_place(&mut buf, op, root).unwrap();
                check(
                    &format!("reduce_in_place {ty} {op} {count} root {root}"),
                    &buf,
                    |i| {
                        Some(if me == root {
                            expect::<T>(n, i, op)
                        } else {
                            input[i]
                        })
                    },
                );
            }
        }
        let op = ReduceOp::Sum;
        all_gathers::<T>(c, count);
        // broadcast from every root
        for root in 0..n {
            let mut b: Vec<T> = if me == root {
                (0..count).map(|i| T::from_i64(val(root, i, op))).collect()
            } else {
                vec![T::default(); count]
            };
            c.broadcast(&mut b, root).unwrap();
            check(&format!("broadcast {ty} {count} root {root}"), &b, |i| {
                Some(T::from_i64(val(root, i, op)))
            });
            // out of place: only the root's input is read; every output (the root's too) is
            // written over what it held
            let inp: Vec<T> = (0..count).map(|i| T::from_i64(val(me, i, op))).collect();
            let mut out: Vec<T> = (0..count)
                .map(|i| T::from_i64(val(me + 1, i, op)))
                .collect();
            c.broadcast_into(&inp, &mut out, root).unwrap();
            check(
                &format!("broadcast_into {ty} {count} root {root}"),
                &out,
                |i| Some(T::from_i64(val(root, i, op))),
            );
        }
        // all-to-all: block j of rank r holds val(r, j*count + t)
        let a2a_in: Vec<T> = (0..count * n)
            .map(|i| T::from_i64(val(me, i, op)))
            .collect();
        let mut a2a_out = vec![T::default(); count * n];
        c.all_to_all(&a2a_in, &mut a2a_out).unwrap();
        let a2a_want = |i: usize| {
            Some(T::from_i64(val(
                i / count.max(1),
                me * count + i % count.max(1),
                op,
            )))
        };
        check(&format!("all_to_all {ty} {count}"), &a2a_out, a2a_want);
        let mut a2a_buf = a2a_in.clone();
        c.all_to_all_in_place(&mut a2a_buf).unwrap();
        check(
            &format!("all_to_all_in_place {ty} {count}"),
            &a2a_buf,
            a2a_want,
        );
        // one call, made in place by odd ranks and out of place by even ones
        let mut a2a_buf = a2a_in.clone();
        if me % 2 == 1 {
            c.all_to_all_in_place(&mut a2a_buf).unwrap();
        } else {
            c.all_to_all(&a2a_in, &mut a2a_buf).unwrap();
        }
        check(
            &format!("all_to_all mixed {ty} {count}"),
            &a2a_buf,
            a2a_want,
        );
        // send/recv around the ring, and send_recv
        let next = (me + 1) % n;
        let prev = (me + n - 1) % n;
        let s: Vec<T> = (0..count).map(|i| T::from_i64(val(me, i, op))).collect();
        let mut r = vec![T::default(); count];
        c.send_recv(&s, next, &mut r, prev).unwrap();
        check(&format!("send_recv {ty} {count}"), &r, |i| {
            Some(T::from_i64(val(prev, i, op)))
        });
        if n > 1 {
            if me % 2 == 0 {
                if next != me {
                    c.send(&s, next).unwrap();
                }
                c.recv(&mut r, prev).unwrap();
            } else {
                c.recv(&mut r, prev).unwrap();
                c.send(&s, next).unwrap();
            }
            check(&format!("send/recv {ty} {count}"), &r, |i| {
                Some(T::from_i64(val(prev, i, op)))
            });
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = args.first().map(String::as_str).unwrap_or("all");
    let c = match Communicator::init() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("init failed: {e}");
            std::process::exit(2);
        }
    };
    let (n, me) = (c.size(), c.rank());
    match mode {
        "all" => {
            let sizes = [
                0usize,
                1,
                n.saturating_sub(1).max(1),
                n + 1,
                13,
                1000,
                // 16 KiB: the largest all-to-all block the executor sends grouped
                4096,
                // 24 KiB: a one-round reduce on 3 ranks, the pipelined one on 4 or more
                6001,
                8209,
                16_411,
                70_001,
            ];
            suite::<f32>(&c, &sizes);
            // a broadcast of several staging slots' worth, out of place
            {
                let count = 600_000usize;
                let root = n - 1;
                let inp: Vec<f32> = (0..count).map(|i| (i % 1000 + me) as f32).collect();
                let mut out = vec![-1.0f32; count];
                c.broadcast_into(&inp, &mut out, root).unwrap();
                check("broadcast_into 600000 floats", &out, |i| {
                    Some((i % 1000 + root) as f32)
                });
            }
            suite::<i32>(&c, &[0, 1, 7, 1000]);
            suite::<f16>(&c, &[1, 7, 1000]);
            suite::<bf16>(&c, &[1, 7, 1000]);
            suite::<f64>(&c, &[3, 1000]);
            suite::<i8>(&c, &[5, 300]);
            suite::<u8>(&c, &[5, 300]);
            suite::<u32>(&c, &[5]);
            suite::<i64>(&c, &[5]);
            suite::<u64>(&c, &[5, 70_001]);
            // a large out-of-place all-reduce (results written with streaming stores)
            let big = 3 << 20;
            let input: Vec<f32> = (0..big).map(|i| val(me, i, ReduceOp::Sum) as f32).collect();
            let mut out = vec![0f32; big];
            c.all_reduce_into(&input, &mut out, ReduceOp::Sum).unwrap();
            check("large all_reduce_into", &out, |i| {
                Some(expect::<f32>(n, i, ReduceOp::Sum))
            });
            // all-reduces from 12 KiB, every op, in place and out of place, with counts that
            // split unevenly between ranks and halves of several 128 KiB pieces: on two ranks
            // whose kernel copies fast each reads its peer's half and writes the result into
            // it (the single-copy all-reduce)
            big_all_reduce::<f32>(&c, 300_007);
            big_all_reduce::<f16>(&c, 20_001);
            big_all_reduce::<i8>(&c, 50_003);
            big_all_reduce::<f64>(&c, 40_009);
            // all-gather blocks of 1.2 MB with an odd count: on two ranks whose kernel copies
            // fast each writes its block into its peer's result (process_vm_writev)
            all_gathers::<f32>(&c, 300_001);
            // a large reduce, out of place and in place: many chunks through the slots, the
            // reduced pieces written into the root's result by the others
            let root = n - 1;
            let mut red = vec![-1f32; big];
            c.reduce(&input, &mut red, ReduceOp::Sum, root).unwrap();
            if me == root {
                check("large reduce", &red, |i| {
                    Some(expect::<f32>(n, i, ReduceOp::Sum))
                });
            }
            let mut buf = input.clone();
            c.reduce_in_place(&mut buf, ReduceOp::Max, 0).unwrap();
            check("large reduce_in_place", &buf, |i| {
                Some(if me == 0 {
                    expect::<f32>(n, i, ReduceOp::Max)
                } else {
                    input[i]
                })
            });
            // non-blocking: several in flight, computing meanwhile, waited in order
            let ops: Vec<_> = (0..4)
                .map(|k| {
                    c.all_reduce_start(
                        (0..1000 + k)
                            .map(|i| val(me, i, ReduceOp::Sum) as f32)
                            .collect::<Vec<f32>>(),
                        ReduceOp::Sum,
                    )
                })
                .collect();
            let mut busy = 0u64;
            for i in 0..100_000u64 {
                busy = busy.wrapping_add(i * i);
            }
            std::hint::black_box(busy);
            for (k, p) in ops.into_iter().enumerate() {
                let b = p.wait().unwrap();
                assert_eq!(b.len(), 1000 + k);
                check("all_reduce_start", &b, |i| {
                    Some(expect::<f32>(n, i, ReduceOp::Sum))
                });
            }
            // small rooted calls running ahead: the root of a broadcast (the others start late)
            // and the others of a reduce (the root starts late) go through 200 calls without
            // waiting for the slow side, past every header line, box and slot more than once
            for len in [2usize, 256, 4096] {
                if me != 0 {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                for i in 0..200usize {
                    let mut b: Vec<f32> = if me == 0 {
                        (0..len).map(|j| (i * 7 + j) as f32).collect()
                    } else {
                        vec![-1.0; len]
                    };
                    c.broadcast(&mut b, 0).unwrap();
                    check(&format!("broadcast ahead {len} call {i}"), &b, |j| {
                        Some((i * 7 + j) as f32)
                    });
                }
                if me == 0 {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                for i in 0..200usize {
                    let input: Vec<f32> = (0..len).map(|j| (i + j + me) as f32).collect();
                    let mut out = vec![-1.0f32; len];
                    c.reduce(&input, &mut out, ReduceOp::Sum, 0).unwrap();
                    if me == 0 {
                        check(&format!("reduce ahead {len} call {i}"), &out, |j| {
                            Some((n * (i + j) + n * (n - 1) / 2) as f32)
                        });
                    }
                }
            }
            // non-blocking all-to-all: the vector comes back holding the received blocks
            let k = 5000;
            let a2a: Vec<u32> = (0..k * n)
                .map(|i| val(me, i, ReduceOp::Sum) as u32)
                .collect();
            let got = c.all_to_all_start(a2a).wait().unwrap();
            check("all_to_all_start", &got, |i| {
                Some(val(i / k, me * k + i % k, ReduceOp::Sum) as u32)
            });
            // non-blocking out of place: the four *_into_start calls in flight together; each
            // output checked, each input handed back unchanged
            let m = 3001;
            let inp = |len: usize| -> Vec<f32> {
                (0..len).map(|i| val(me, i, ReduceOp::Sum) as f32).collect()
            };
            let ar = c.all_reduce_into_start(inp(m), vec![-1.0f32; m], ReduceOp::Sum);
            let ag = c.all_gather_into_start(inp(m), vec![-1.0f32; m * n]);
            let rd = c.reduce_into_start(inp(m), vec![-1.0f32; m], ReduceOp::Sum, n - 1);
            let aa = c.all_to_all_into_start(inp(m * n), vec![-1.0f32; m * n]);
            let (i, o) = ar.wait().unwrap();
            assert!(i == inp(m), "all_reduce_into_start changed its input");
            check("all_reduce_into_start", &o, |i| {
                Some(expect::<f32>(n, i, ReduceOp::Sum))
            });
            let (i, o) = ag.wait().unwrap();
            assert!(i == inp(m), "all_gather_into_start changed its input");
            check("all_gather_into_start", &o, |i| {
                Some(val(i / m, i % m, ReduceOp::Sum) as f32)
            });
            let (i, o) = rd.wait().unwrap();
            assert!(i == inp(m), "reduce_into_start changed its input");
            if me == n - 1 {
                check("reduce_into_start", &o, |i| {
                    Some(expect::<f32>(n, i, ReduceOp::Sum))
                });
            }
            let (i, o) = aa.wait().unwrap();
            assert!(i == inp(m * n), "all_to_all_into_start changed its input");
            check("all_to_all_into_start", &o, |i| {
                Some(val(i / m, me * m + i % m, ReduceOp::Sum) as f32)
            });
            // lengths that disagree fail at once, naming the call, and the next call still runs
            let e = c
                .all_reduce_into_start(vec![1.0f32; 3], vec![0.0f32; 4], ReduceOp::Sum)
                .wait()
                .unwrap_err()
                .to_string();
            assert!(e.contains("all_reduce_into_start"), "{e}");
            if n > 1 {
                let e = c
                    .all_gather_into_start(vec![1.0f32; 3], vec![0.0f32; 3])
                    .wait()
                    .unwrap_err()
                    .to_string();
                assert!(e.contains("all_gather_into_start"), "{e}");
            }
            c.barrier().unwrap();
            c.barrier_start().wait().unwrap();
            // split: even and odd ranks, reversed order by key
            let sub = c
                .split(Some((me % 2) as u32), -(me as i64))
                .unwrap()
                .expect("member");
            let members: Vec<usize> = (0..n).filter(|r| r % 2 == me % 2).rev().collect();
            assert_eq!(sub.size(), members.len());
            assert_eq!(members[sub.rank()], me);
            let mut b: Vec<f32> = vec![me as f32 + 1.0; 777];
            sub.all_reduce(&mut b, ReduceOp::Sum).unwrap();
            let want: f32 = members.iter().map(|&r| r as f32 + 1.0).sum();
            check("split all_reduce", &b, |_| Some(want));
            let none = c.split(if me == 0 { None } else { Some(0) }, 0).unwrap();
            assert_eq!(none.is_none(), me == 0);
            println!(
                "OK rank {me} of {n} (node {}/{}, local {}/{})",
                c.node(),
                c.nnodes(),
                c.local_rank(),
                c.local_size()
            );
        }
        "affinity" => {
            let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
            let cpus = status
                .lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .unwrap_or("?")
                .trim()
                .to_string();
            c.barrier().unwrap();
            println!("AFFINITY rank {me} cpus {cpus}");
        }
        "allreduce" => {
            let count: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1 << 20);
            let mut b: Vec<f32> = (0..count)
                .map(|i| val(me, i, ReduceOp::Sum) as f32)
                .collect();
            for _ in 0..3 {
                b = (0..count)
                    .map(|i| val(me, i, ReduceOp::Sum) as f32)
                    .collect();
                c.all_reduce(&mut b, ReduceOp::Sum).unwrap();
            }
            check("allreduce", &b, |i| {
                Some(expect::<f32>(n, i, ReduceOp::Sum))
            });
            let (rail, name) = c.rail();
            println!(
                "OK rank {me} of {n} node {} local {} rail {rail} {} net_bytes {}",
                c.node(),
                c.local_rank(),
                name.unwrap_or_default(),
                c.net_bytes_sent()
            );
        }
        "broadcast-tree" => {
            let v = call_value;
            let mut k = 0;
            // 16 411 floats: just over 64 KiB; 65 536: 256 KiB, the tree's limit on more than
            // 4 ranks
            for count in [16_411usize, 50_001, 65_536] {
                for root in 0..n {
                    for rep in 0..3 {
                        k += 1;
                        // a different rank arrives late each call: its parent or children wait
                        if me == (root + k) % n && rep != 1 {
                            std::thread::sleep(std::time::Duration::from_millis(2));
                        }
                        let mut b: Vec<f32> = if me == root {
                            (0..count).map(|i| v(k, root, i)).collect()
                        } else {
                            vec![-1.0; count]
                        };
                        c.broadcast(&mut b, root).unwrap();
                        check(
                            &format!("broadcast {count} root {root} call {k}"),
                            &b,
                            |i| Some(v(k, root, i)),
                        );
                        let inp: Vec<f32> = (0..count).map(|i| v(k, me, i)).collect();
                        let mut out = vec![-1.0f32; count];
                        c.broadcast_into(&inp, &mut out, root).unwrap();
                        check(
                            &format!("broadcast_into {count} root {root} call {k}"),
                            &out,
                            |i| Some(v(k, root, i)),
                        );
                    }
                }
            }
            println!("OK rank {me} broadcast-tree");
        }
        "broadcast-crowded" => {
            let v = call_value;
            let mut k = 0;
            // 4 MiB + 4 B (the direct reads' least size), 10 MB, and 4 MiB - 4 B (staged)
            for count in [1_048_577usize, 2_500_001, 1_048_575] {
                for root in 0..n {
                    for out_of_place in [k % 2 == 0, k % 2 != 0] {
                        k += 1;
                        if me == (root + k) % n && k % 3 == 0 {
                            std::thread::sleep(std::time::Duration::from_millis(2));
                        }
                        let inp: Vec<f32> = (0..count).map(|i| v(k, me, i)).collect();
                        let mut out = vec![-1.0f32; count];
                        let what = if out_of_place {
                            c.broadcast_into(&inp, &mut out, root).unwrap();
                            "broadcast_into"
                        } else {
                            if me == root {
                                out.copy_from_slice(&inp);
                            }
                            c.broadcast(&mut out, root).unwrap();
                            "broadcast"
                        };
                        check(&format!("{what} {count} root {root} call {k}"), &out, |i| {
                            Some(v(k, root, i))
                        });
                        if me == root && out_of_place {
                            check(&format!("{what} input kept, call {k}"), &inp, |i| {
                                Some(v(k, me, i))
                            });
                        }
                    }
                }
            }
            println!("OK rank {me} broadcast-crowded");
        }
        "run-ahead" => {
            let v = call_value;
            let pause = |k: usize| {
                if k.is_multiple_of(97) {
                    std::thread::sleep(std::time::Duration::from_millis(3));
                }
            };
            for count in [2usize, 16, 128, 1024] {
                for k in 0..300 {
                    // root 0 writes and returns; the others read (and pause)
                    let mut b: Vec<f32> = if me == 0 {
                        (0..count).map(|i| v(k, 0, i)).collect()
                    } else {
                        vec![-1.0; count]
                    };
                    if me != 0 {
                        pause(k);
                    }
                    c.broadcast(&mut b, 0).unwrap();
                    check(&format!("broadcast {count} call {k}"), &b, |i| {
                        Some(v(k, 0, i))
                    });
                }
                for k in 0..300 {
                    // the others write and return; the root reads (and pauses)
                    let input: Vec<f32> = (0..count).map(|i| v(k, me, i)).collect();
                    let mut out = vec![-1.0f32; count];
                    if me == 0 {
                        pause(k);
                    }
                    c.reduce(&input, &mut out, ReduceOp::Sum, 0).unwrap();
                    if me == 0 {
                        check(&format!("reduce {count} call {k}"), &out, |i| {
                            Some((0..n).map(|r| v(k, r, i)).sum())
                        });
                    }
                }
            }
            // staged broadcasts of more chunks than staging slots: the root fills slot after
            // slot while the others start late, so it must wait before refilling a slot a
            // late reader has not copied out yet (48 KiB: above the one-round broadcast, below
            // the tree of direct reads, so staged however the node reads)
            for count in [12_000usize, 1_000_000] {
                for k in 0..24 {
                    let mut b: Vec<f32> = if me == 0 {
                        (0..count).map(|i| v(k, 0, i)).collect()
                    } else {
                        vec![-1.0; count]
                    };
                    if me != 0 && k.is_multiple_of(3) {
                        std::thread::sleep(std::time::Duration::from_millis(3));
                    }
                    c.broadcast(&mut b, 0).unwrap();
                    check(&format!("broadcast {count} call {k}"), &b, |i| {
                        Some(v(k, 0, i))
                    });
                }
            }
            println!("OK rank {me} run-ahead");
        }
        "mismatch" | "mismatch-big" => {
            // -big: rank 1's call is large (chunked in shared memory), rank 0's small
            let other = if mode == "mismatch" { 20 } else { 1 << 20 };
            let count = if me == 1 { other } else { 10 };
            let mut b = vec![1.0f32; count];
            match c.all_reduce(&mut b, ReduceOp::Sum) {
                Ok(()) => println!("rank {me}: no error"),
                Err(e) => {
                    println!("rank {me}: ERROR {e}");
                    std::process::exit(3);
                }
            }
        }
        "mismatch-kinds" => {
            // one-round small exchanges of different kinds at the same point: rank 0 gathers,
            // rank 1 exchanges all-to-all (40 bytes each: both beside the header lines)
            let r = if me == 0 {
                let mut out = vec![0.0f32; 5 * n];
                c.all_gather(&[1.0f32; 5], &mut out)
            } else {
                let mut out = vec![0.0f32; 5 * n];
                c.all_to_all(&vec![1.0f32; 5 * n], &mut out)
            };
            match r {
                Ok(()) => println!("rank {me}: no error"),
                Err(e) => {
                    println!("rank {me}: ERROR {e}");
                    std::process::exit(3);
                }
            }
        }
        "stall-split" => {
            let mut b = vec![1.0f32; 1 << 10];
            c.all_reduce(&mut b, ReduceOp::Sum).unwrap();
            if me == 1 {
                std::thread::sleep(std::time::Duration::from_secs(8));
                return;
            }
            match c.split(Some(0), me as i64) {
                Ok(_) => println!("rank {me}: no error"),
                Err(e) => {
                    println!("rank {me}: ERROR: {e}");
                    std::process::exit(3);
                }
            }
        }
        "die-before" | "stall" => {
            let mut b = vec![1.0f32; 1 << 16];
            c.all_reduce(&mut b, ReduceOp::Sum).unwrap();
            println!("rank {me}: warm");
            if me == 1 {
                if mode == "die-before" {
                    std::process::exit(7);
                }
                // stall well past the peers' RAILRING_TIMEOUT, then leave quietly
                std::thread::sleep(std::time::Duration::from_secs(8));
                return;
            }
            let t = std::time::Instant::now();
            match c.all_reduce(&mut b, ReduceOp::Sum) {
                Ok(()) => println!("rank {me}: no error"),
                Err(e) => {
                    println!(
                        "rank {me}: ERROR after {:.1}s: {e}",
                        t.elapsed().as_secs_f64()
                    );
                    std::process::exit(3);
                }
            }
        }
        m => {
            eprintln!("unknown mode {m}");
            std::process::exit(2);
        }
    }
}

//! rr-soak: random collectives, every element checked, for the soak (`scripts/soak`) and the
//! fault-injection suite (`tests/tests/faults.rs`).
//!
//! Usage: `rr-soak [--calls N] [--seconds S] [--seed X] [--max-count N] [--progress K]`
//!
//! Every rank draws the same sequence of calls from the seed: collective (all-reduce and
//! broadcast in and out of place, reduce-scatter, all-gather, reduce, all-to-all, send/recv,
//! barrier), dtype, op, root, count (0, 1, odd and awkward counts up to `--max-count`) and, now
//! and then, a communicator split the next calls run on. Inputs are small integers, so every
//! result has an exact reference that each rank computes for every element. It stops after N
//! calls or S seconds (whichever first; the ranks agree through an all-reduce of "time is up"
//! flags every 64 calls). Output: `PROGRESS rank R calls C` every K calls, `WRONG ...` (exit 1) for a wrong
//! element, `ERROR after C calls: ...` (exit 3) for an error, and at the end
//! `SOAK rank R calls C wrong 0 bytes B seconds T peak_rss_kib K`.

use half::{bf16, f16};
use railring::{Communicator, Element, ReduceOp};
use std::time::{Duration, Instant};

/// splitmix64: the same sequence on every rank.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Rank `r`'s input element `i` for `op` (small: sums and products stay exact in every dtype).
fn val(r: usize, i: usize, op: ReduceOp, salt: usize) -> i64 {
    if op == ReduceOp::Prod {
        if (i + r + salt).is_multiple_of(5) {
            2
        } else {
            1
        }
    } else {
        ((i * 5 + r * 3 + salt) % 7 + 1) as i64
    }
}

fn reduced<T: Element>(ranks: &[usize], i: usize, op: ReduceOp, salt: usize) -> T {
    let v: Vec<i64> = ranks.iter().map(|&r| val(r, i, op, salt)).collect();
    let n = v.len();
    let x = match op {
        ReduceOp::Sum | ReduceOp::Avg => v.iter().sum(),
        ReduceOp::Prod => v.iter().product(),
        ReduceOp::Min => *v.iter().min().unwrap_or(&0),
        ReduceOp::Max => *v.iter().max().unwrap_or(&0),
    };
    if op != ReduceOp::Avg {
        return T::from_i64(x);
    }
    if T::DTYPE.is_float() {
        let mut b = [T::from_i64(x)];
        railring_collectives::kernels::finish_avg(
            T::DTYPE,
            railring_collectives::as_bytes_mut(&mut b),
            n,
        );
        b[0]
    } else {
        T::from_i64(x / n as i64)
    }
}

struct Ctx<'a> {
    c: &'a Communicator,
    /// World ranks of this communicator's ranks, in its rank order (inputs are keyed by world rank).
    world: Vec<usize>,
    calls: u64,
    bytes: u64,
}

fn fail(calls: u64, what: &str) -> ! {
    eprintln!("WRONG after {calls} calls: {what}");
    println!("WRONG after {calls} calls: {what}");
    std::process::exit(1);
}

fn check<T: Element>(x: &Ctx<'_>, what: &str, got: &[T], want: impl Fn(usize) -> T) {
    for (i, g) in got.iter().enumerate() {
        let w = want(i);
        if *g != w {
            fail(
                x.calls,
                &format!(
                    "{what}: element {i} of {}: got {g:?}, expected {w:?}",
                    got.len()
                ),
            );
        }
    }
}

fn ok<R>(x: &Ctx<'_>, what: &str, r: railring::Result<R>) -> R {
    match r {
        Ok(v) => v,
        Err(e) => {
            let me = x.world[x.c.rank()];
            eprintln!("ERROR after {} calls: rank {me}: {what}: {e}", x.calls);
            println!("ERROR after {} calls: rank {me}: {what}: {e}", x.calls);
            std::process::exit(3);
        }
    }
}

/// One random call on `x.c`, of dtype `T`.
fn one<T: Element>(x: &mut Ctx<'_>, rng: &mut Rng, count: usize) {
    let (n, me) = (x.c.size(), x.c.rank());
    let wme = x.world[me];
    let op = ReduceOp::ALL[rng.below(5) as usize];
    let root = rng.below(n as u64) as usize;
    let salt = rng.below(1000) as usize;
    let kind = rng.below(10);
    let ty = T::DTYPE;
    let world = x.world.clone();
    let input = |r: usize, len: usize, op: ReduceOp| -> Vec<T> {
        (0..len).map(|i| T::from_i64(val(r, i, op, salt))).collect()
    };
    let what = |k: &str| format!("{k} {ty} {op} count {count} root {root} on {n} ranks");
    match kind {
        0 | 1 => {
            let mut b = input(wme, count, op);
            ok(x, &what("all_reduce"), x.c.all_reduce(&mut b, op));
            check(x, &what("all_reduce"), &b, |i| reduced(&world, i, op, salt));
        }
        2 => {
            let inp = input(wme, count, op);
            let mut out = vec![T::default(); count];
            ok(
                x,
                &what("all_reduce_into"),
                x.c.all_reduce_into(&inp, &mut out, op),
            );
            check(x, &what("all_reduce_into"), &out, |i| {
                reduced(&world, i, op, salt)
            });
        }
        3 => {
            let inp = input(wme, count * n, op);
            let mut out = vec![T::default(); count];
            ok(
                x,
                &what("reduce_scatter"),
                x.c.reduce_scatter(&inp, &mut out, op),
            );
            check(x, &what("reduce_scatter"), &out, |i| {
                reduced(&world, me * count + i, op, salt)
            });
        }
        4 => {
            let mine: Vec<T> = (0..count)
                .map(|i| T::from_i64(val(wme, me * count + i, ReduceOp::Sum, salt)))
                .collect();
            let mut all = vec![T::default(); count * n];
            ok(x, &what("all_gather"), x.c.all_gather(&mine, &mut all));
            check(x, &what("all_gather"), &all, |i| {
                T::from_i64(val(world[i / count.max(1)], i, ReduceOp::Sum, salt))
            });
        }
        5 if salt.is_multiple_of(2) => {
            let mut b = if me == root {
                input(wme, count, ReduceOp::Sum)
            } else {
                vec![T::default(); count]
            };
            ok(x, &what("broadcast"), x.c.broadcast(&mut b, root));
            check(x, &what("broadcast"), &b, |i| {
                T::from_i64(val(world[root], i, ReduceOp::Sum, salt))
            });
        }
        5 => {
            // out of place (every rank passes an input; only the root's is read)
            let inp = input(wme, count, ReduceOp::Sum);
            let mut out = vec![T::default(); count];
            ok(
                x,
                &what("broadcast_into"),
                x.c.broadcast_into(&inp, &mut out, root),
            );
            check(x, &what("broadcast_into"), &out, |i| {
                T::from_i64(val(world[root], i, ReduceOp::Sum, salt))
            });
        }
        6 => {
            let inp = input(wme, count, op);
            let mut out = vec![T::default(); count];
            ok(x, &what("reduce"), x.c.reduce(&inp, &mut out, op, root));
            if me == root {
                check(x, &what("reduce"), &out, |i| reduced(&world, i, op, salt));
            }
        }
        7 => {
            let inp = input(wme, count * n, ReduceOp::Sum);
            let mut out = vec![T::default(); count * n];
            ok(x, &what("all_to_all"), x.c.all_to_all(&inp, &mut out));
            check(x, &what("all_to_all"), &out, |i| {
                let c = count.max(1);
                T::from_i64(val(world[i / c], me * count + i % c, ReduceOp::Sum, salt))
            });
        }
        8 => {
            let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
            let s = input(wme, count, ReduceOp::Sum);
            let mut r = vec![T::default(); count];
            ok(x, &what("send_recv"), x.c.send_recv(&s, next, &mut r, prev));
            check(x, &what("send_recv"), &r, |i| {
                T::from_i64(val(world[prev], i, ReduceOp::Sum, salt))
            });
        }
        _ => ok(x, "barrier", x.c.barrier()),
    }
    x.calls += 1;
    x.bytes += (count * ty.size()) as u64;
}

fn count_for(rng: &mut Rng, max: usize) -> usize {
    match rng.below(8) {
        0 => 0,
        1 => 1,
        2 => 2 * rng.below(50) as usize + 1,
        3 => 4096 * (1 + rng.below(4) as usize) + 1,
        4 => rng.below(max as u64 / 4 + 1) as usize,
        5 => max - rng.below(7) as usize,
        _ => rng.below(4096) as usize,
    }
    .min(max)
}

fn call(x: &mut Ctx<'_>, rng: &mut Rng, max: usize) {
    let count = count_for(rng, max);
    match rng.below(7) {
        0 => one::<f32>(x, rng, count),
        1 => one::<f64>(x, rng, count),
        2 => one::<i32>(x, rng, count),
        3 => one::<u8>(x, rng, count.min(max / 4)),
        4 => one::<i64>(x, rng, count),
        5 => one::<f16>(x, rng, count),
        _ => one::<bf16>(x, rng, count),
    }
}

fn arg<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> T {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let calls: u64 = arg(&args, "--calls", 1000);
    let seconds: f64 = arg(&args, "--seconds", 1e9);
    let seed: u64 = arg(&args, "--seed", 1);
    let max: usize = arg(&args, "--max-count", 1 << 18).max(8);
    let progress: u64 = arg(&args, "--progress", 0);
    let t0 = Instant::now();
    let c = match Communicator::init() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ERROR init: {e}");
            println!("ERROR init: {e}");
            std::process::exit(2);
        }
    };
    let world_me = c.rank();
    let mut rng = Rng(seed);
    let mut x = Ctx {
        c: &c,
        world: (0..c.size()).collect(),
        calls: 0,
        bytes: 0,
    };
    let limit = Duration::from_secs_f64(seconds.clamp(0.0, 1e9));
    let mut stop = [0u32];
    while x.calls < calls {
        // Now and then run a stretch of calls on a split communicator (random colours, keys).
        if rng.below(200) == 0 && c.size() > 1 {
            let colors = 1 + rng.below(2) as u32;
            let keyseed = rng.next();
            let color: Vec<u32> = (0..c.size())
                .map(|r| (r as u32 + (keyseed as u32)) % colors)
                .collect();
            let key = |r: usize| ((r as u64).wrapping_mul(keyseed | 1) % 1000) as i64;
            let sub = ok(&x, "split", c.split(Some(color[world_me]), key(world_me)));
            let Some(sub) = sub else {
                fail(x.calls, "split left this rank out")
            };
            let mut members: Vec<usize> = (0..c.size())
                .filter(|&r| color[r] == color[world_me])
                .collect();
            members.sort_by_key(|&r| (key(r), r));
            if sub.size() != members.len() || members[sub.rank()] != world_me {
                fail(
                    x.calls,
                    &format!(
                        "split: rank {} of {} but members {members:?}",
                        sub.rank(),
                        sub.size()
                    ),
                );
            }
            let stretch = 1 + rng.below(20);
            // every member draws the same calls: a fork of the main sequence, seeded by colour
            let mut sub_rng = Rng(keyseed ^ color[world_me] as u64);
            let mut sx = Ctx {
                c: &sub,
                world: members,
                calls: x.calls,
                bytes: 0,
            };
            for _ in 0..stretch {
                call(&mut sx, &mut sub_rng, max);
            }
            x.calls = sx.calls;
            x.bytes += sx.bytes;
        } else {
            call(&mut x, &mut rng, max);
        }
        if progress > 0 && x.calls.is_multiple_of(progress) {
            println!("PROGRESS rank {world_me} calls {}", x.calls);
        }
        if x.calls.is_multiple_of(64) {
            stop[0] = (t0.elapsed() >= limit) as u32;
            ok(&x, "stop vote", c.all_reduce(&mut stop, ReduceOp::Max));
            if stop[0] > 0 {
                break;
            }
        }
    }
    // peak resident memory (what a staging area sized by a knob instead of the call shows)
    let peak_kib = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .unwrap_or(0);
    println!(
        "SOAK rank {world_me} calls {} wrong 0 bytes {} seconds {:.1} peak_rss_kib {peak_kib}",
        x.calls,
        x.bytes,
        t0.elapsed().as_secs_f64()
    );
}

//! The benchmark driver behind `railperf`, written against a small [`Backend`] trait so the same
//! table, JSON and checks serve railring and the MPI peer.
//!
//! Flags, defaults, columns and bandwidth formulas follow nccl-tests:
//! `algbw = size / time`; `busbw = algbw * factor` with factor 2(n-1)/n for all-reduce, (n-1)/n
//! for reduce-scatter, all-gather and all-to-all, and 1 for broadcast, reduce and send/recv.
//! Inputs are small integers (deterministic per rank and index), so every reduction is exact in
//! any order and every element of every rank's result is compared with an exact reference.

use railring::{DataType, ReduceOp};
use railring_collectives::kernels;
use std::fmt::Write as _;
use std::time::Instant;

pub const USAGE: &str = "usage: railperf COLLECTIVE [options]
collectives: allreduce reducescatter allgather broadcast reduce alltoall sendrecv
  -b, --minbytes N      smallest size (default 32M; K/M/G suffixes)
  -e, --maxbytes N      largest size (default 32M)
  -i, --stepbytes N     size increment (default 1M)
  -f, --stepfactor N    size multiplication factor (overrides -i)
  -n, --iters N         timed iterations per size (default 20)
  -w, --warmup_iters N  warmup iterations (default 5)
  -c, --check 0/1       check results (default 1)
  -o, --op OP           sum|prod|min|max|avg|all (default sum)
  -d, --datatype T      int8 uint8 int32 uint32 int64 uint64 half bfloat16 float double|all (default float)
  -r, --root N          root for broadcast/reduce (default 0)
  -a, --average 0-3     time reported: 0 rank 0, 1 average, 2 minimum, 3 maximum (default 1)
  -z, --blocking 0/1    0: start all iterations then wait (non-blocking API); 1: blocking calls (default 0)
  -J, --output_file F   also write results as JSON rows to F
  -h, --help";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coll {
    AllReduce,
    ReduceScatter,
    AllGather,
    Broadcast,
    Reduce,
    AllToAll,
    SendRecv,
}

impl Coll {
    pub fn parse(s: &str) -> Option<Coll> {
        Some(
            match s
                .to_ascii_lowercase()
                .replace(['_', '-'], "")
                .trim_end_matches("perf")
            {
                "allreduce" => Coll::AllReduce,
                "reducescatter" => Coll::ReduceScatter,
                "allgather" => Coll::AllGather,
                "broadcast" | "bcast" => Coll::Broadcast,
                "reduce" => Coll::Reduce,
                "alltoall" => Coll::AllToAll,
                "sendrecv" => Coll::SendRecv,
                _ => return None,
            },
        )
    }
    pub fn name(self) -> &'static str {
        match self {
            Coll::AllReduce => "allreduce",
            Coll::ReduceScatter => "reducescatter",
            Coll::AllGather => "allgather",
            Coll::Broadcast => "broadcast",
            Coll::Reduce => "reduce",
            Coll::AllToAll => "alltoall",
            Coll::SendRecv => "sendrecv",
        }
    }
    fn reduces(self) -> bool {
        matches!(self, Coll::AllReduce | Coll::ReduceScatter | Coll::Reduce)
    }
    fn rooted(self) -> bool {
        matches!(self, Coll::Broadcast | Coll::Reduce)
    }
    /// nccl-tests' bus bandwidth factor.
    pub fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            Coll::AllReduce => 2.0 * (n - 1.0) / n,
            Coll::ReduceScatter | Coll::AllGather | Coll::AllToAll => (n - 1.0) / n,
            Coll::Broadcast | Coll::Reduce | Coll::SendRecv => 1.0,
        }
    }
}

#[derive(Clone, Debug)]
pub struct Options {
    pub coll: Coll,
    pub minbytes: u64,
    pub maxbytes: u64,
    pub stepbytes: u64,
    pub stepfactor: Option<u64>,
    pub iters: usize,
    pub warmup: usize,
    pub check: bool,
    pub ops: Vec<ReduceOp>,
    pub dtypes: Vec<DataType>,
    pub root: usize,
    pub average: u8,
    pub blocking: bool,
    pub json: Option<String>,
    pub help: bool,
    /// Extra flags not from nccl-tests (handled by the callers).
    pub rest: Vec<String>,
}

impl Options {
    pub fn parse(args: &[String]) -> Result<Options, String> {
        let mut o = Options {
            coll: Coll::AllReduce,
            minbytes: 32 << 20,
            maxbytes: 32 << 20,
            stepbytes: 1 << 20,
            stepfactor: None,
            iters: 20,
            warmup: 5,
            check: true,
            ops: vec![ReduceOp::Sum],
            dtypes: vec![DataType::F32],
            root: 0,
            average: 1,
            blocking: false,
            json: None,
            help: false,
            rest: vec![],
        };
        let mut coll = None;
        let mut it = args.iter().peekable();
        while let Some(a) = it.next() {
            let (flag, inline) = match a.split_once('=') {
                Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
                _ => (a.clone(), None),
            };
            let mut val = |name: &str| -> Result<String, String> {
                match &inline {
                    Some(v) => Ok(v.clone()),
                    None => it
                        .next()
                        .cloned()
                        .ok_or_else(|| format!("{name} needs a value")),
                }
            };
            let size = |v: String, name: &str| {
                railring::config::parse_size(&v)
                    .ok_or_else(|| format!("{name}: '{v}' is not a size (e.g. 8, 64K, 256M)"))
            };
            let num = |v: String, name: &str| {
                v.trim()
                    .parse::<u64>()
                    .map_err(|_| format!("{name}: '{v}' is not a number"))
            };
            match flag.as_str() {
                "-b" | "--minbytes" => o.minbytes = size(val("-b")?, "-b")?,
                "-e" | "--maxbytes" => o.maxbytes = size(val("-e")?, "-e")?,
                "-i" | "--stepbytes" => o.stepbytes = size(val("-i")?, "-i")?,
                "-f" | "--stepfactor" => o.stepfactor = Some(num(val("-f")?, "-f")?),
                "-n" | "--iters" => o.iters = num(val("-n")?, "-n")? as usize,
                "-w" | "--warmup_iters" => o.warmup = num(val("-w")?, "-w")? as usize,
                "-c" | "--check" => o.check = num(val("-c")?, "-c")? != 0,
                "-o" | "--op" => {
                    let v = val("-o")?;
                    o.ops = if v == "all" {
                        ReduceOp::ALL.to_vec()
                    } else {
                        vec![v.parse::<ReduceOp>()?]
                    };
                }
                "-d" | "--datatype" => {
                    let v = val("-d")?;
                    o.dtypes = if v == "all" {
                        DataType::ALL.to_vec()
                    } else {
                        vec![v.parse::<DataType>()?]
                    };
                }
                "-r" | "--root" => o.root = num(val("-r")?, "-r")? as usize,
                "-a" | "--average" => {
                    o.average = num(val("-a")?, "-a")? as u8;
                    if o.average > 3 {
                        return Err("-a must be 0, 1, 2 or 3".into());
                    }
                }
                "-z" | "--blocking" => o.blocking = num(val("-z")?, "-z")? != 0,
                "-J" | "--output_file" => o.json = Some(val("-J")?),
                "-h" | "--help" => o.help = true,
                // accepted for command-line compatibility with nccl-tests; no meaning here
                "-t" | "--nthreads" | "-g" | "--ngpus" | "-m" | "--agg_iters" | "-G"
                | "--cudagraph" | "-p" | "--parallel_init" => {
                    val(&flag)?;
                }
                f if f.starts_with("--") => o.rest.push(a.clone()),
                f if coll.is_none() && !f.starts_with('-') => {
                    coll = Some(Coll::parse(f).ok_or_else(|| format!("unknown collective '{f}'"))?);
                }
                f => return Err(format!("unknown option '{f}'")),
            }
        }
        o.coll = coll.unwrap_or(Coll::AllReduce);
        if o.iters == 0 {
            return Err("-n must be at least 1".into());
        }
        if o.minbytes > o.maxbytes {
            return Err(format!(
                "-b {} is larger than -e {}",
                o.minbytes, o.maxbytes
            ));
        }
        if o.maxbytes > 1 << 40 {
            return Err("-e above 1T".into());
        }
        if o.stepfactor == Some(0) || o.stepfactor == Some(1) && o.minbytes != o.maxbytes {
            return Err("-f must be at least 2".into());
        }
        if o.stepfactor.is_none() && o.stepbytes == 0 && o.minbytes != o.maxbytes {
            return Err("-i must be at least 1".into());
        }
        Ok(o)
    }

    /// The sizes to run, in bytes.
    pub fn sizes(&self) -> Vec<u64> {
        let mut v = Vec::new();
        let mut s = self.minbytes;
        while s <= self.maxbytes && v.len() < 4096 {
            v.push(s);
            let next = match self.stepfactor {
                Some(f) => s.saturating_mul(f.max(2)),
                None => s.saturating_add(self.stepbytes.max(1)),
            };
            if next == s {
                break;
            }
            s = next;
        }
        v
    }
}

/// What one call does: the collective, the element type, the operator (ignored unless the
/// collective reduces) and the root (ignored unless it is rooted).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Call {
    pub coll: Coll,
    pub dtype: DataType,
    pub op: ReduceOp,
    pub root: usize,
}

/// What a benchmark needs from a communication library. Buffers are bytes plus a dtype.
pub trait Backend {
    fn name(&self) -> String;
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// One call. Out-of-place when `input` is `Some` (its length depends on the collective; see
    /// [`Layout`]), in-place otherwise.
    fn call(&self, call: &Call, input: Option<&[u8]>, output: &mut [u8]) -> Result<(), String>;
    /// `iters` calls back to back (non-blocking implementations may overlap them).
    fn calls(
        &self,
        iters: usize,
        call: &Call,
        input: Option<&[u8]>,
        output: &mut [u8],
    ) -> Result<(), String> {
        for _ in 0..iters {
            self.call(call, input, output)?;
        }
        Ok(())
    }
    fn barrier(&self) -> Result<(), String>;
    /// Reduce one f64 over ranks (sum, min or max), result everywhere.
    fn reduce_f64(&self, v: f64, op: ReduceOp) -> Result<f64, String>;
    /// Gather one short line per rank to rank 0 (others get an empty list).
    fn gather_lines(&self, line: &str) -> Result<Vec<String>, String>;
    /// What kind of buffers / data path it uses (printed in the preamble).
    fn describe_buffers(&self) -> String;
}

/// Element counts for one size: (count per rank block as the library sees it, input bytes,
/// output bytes).
pub struct Layout {
    pub count: usize,
    pub in_bytes: usize,
    pub out_bytes: usize,
    pub size_bytes: usize,
}

pub fn layout(c: Coll, size: u64, dtype: DataType, n: usize) -> Layout {
    let t = dtype.size();
    let total = (size as usize) / t;
    match c {
        Coll::AllReduce | Coll::Broadcast | Coll::Reduce | Coll::SendRecv => Layout {
            count: total,
            in_bytes: total * t,
            out_bytes: total * t,
            size_bytes: total * t,
        },
        Coll::ReduceScatter => {
            let per = total / n;
            Layout {
                count: per,
                in_bytes: per * n * t,
                out_bytes: per * n * t,
                size_bytes: per * n * t,
            }
        }
        Coll::AllGather => {
            let per = total / n;
            Layout {
                count: per,
                in_bytes: per * t,
                out_bytes: per * n * t,
                size_bytes: per * n * t,
            }
        }
        Coll::AllToAll => {
            let per = total / n;
            Layout {
                count: per,
                in_bytes: per * n * t,
                out_bytes: per * n * t,
                size_bytes: per * n * t,
            }
        }
    }
}

/// Input value of rank `r` at (global) index `k`: a small integer. Period 1021 in `k`.
fn value(op: ReduceOp, r: usize, k: usize) -> i64 {
    let k = k % 1021;
    if op == ReduceOp::Prod {
        if (k + r).is_multiple_of(3) {
            2
        } else {
            1
        }
    } else {
        ((k * 7 + r * 13) % 11 + 1) as i64
    }
}

fn encode(dtype: DataType, v: i64, out: &mut [u8]) {
    match dtype {
        DataType::I8 => out[0] = v as i8 as u8,
        DataType::U8 => out[0] = v as u8,
        DataType::I32 => out.copy_from_slice(&(v as i32).to_le_bytes()),
        DataType::U32 => out.copy_from_slice(&(v as u32).to_le_bytes()),
        DataType::I64 => out.copy_from_slice(&v.to_le_bytes()),
        DataType::U64 => out.copy_from_slice(&(v as u64).to_le_bytes()),
        DataType::F16 => out.copy_from_slice(&half::f16::from_f64(v as f64).to_le_bytes()),
        DataType::Bf16 => out.copy_from_slice(&half::bf16::from_f64(v as f64).to_le_bytes()),
        DataType::F32 => out.copy_from_slice(&(v as f32).to_le_bytes()),
        DataType::F64 => out.copy_from_slice(&(v as f64).to_le_bytes()),
    }
}

/// Fill `buf` with rank `r`'s values for global indices `base..`.
fn fill(buf: &mut [u8], dtype: DataType, op: ReduceOp, r: usize, base: usize) {
    let t = dtype.size();
    // The pattern repeats every 1021 elements: encode one period, then copy it.
    let period: Vec<u8> = (0..1021)
        .flat_map(|k| {
            let mut e = vec![0u8; t];
            encode(dtype, value(op, r, base + k), &mut e);
            e
        })
        .collect();
    for (i, ch) in buf.chunks_mut(1021 * t).enumerate() {
        let _ = i;
        ch.copy_from_slice(&period[..ch.len()]);
    }
}

/// The reduction over ranks of one period of values, computed with the library-independent
/// kernels (exact: small integers), as bytes: `table[k]` for `k` in 0..1021.
fn reduced_period(dtype: DataType, op: ReduceOp, n: usize) -> Vec<u8> {
    let t = dtype.size();
    let mut acc = vec![0u8; 1021 * t];
    fill(&mut acc, dtype, op, 0, 0);
    for r in 1..n {
        let mut b = vec![0u8; 1021 * t];
        fill(&mut b, dtype, op, r, 0);
        kernels::reduce_into(dtype, op, &mut acc, &b);
    }
    if op == ReduceOp::Avg {
        kernels::finish_avg(dtype, &mut acc, n);
    }
    acc
}

struct Buffers {
    input: Vec<u64>,
    output: Vec<u64>,
}

fn bytes(v: &mut [u64], n: usize) -> &mut [u8] {
    // SAFETY: u64 storage reinterpreted as bytes; n <= 8 * len.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, n) }
}

/// Set up buffers for a run of rank `me`. For in-place runs the input is placed inside the
/// output buffer the way each in-place collective expects it.
fn prepare(call: &Call, l: &Layout, me: usize, b: &mut Buffers, inplace: bool) {
    let Call {
        coll: c,
        dtype,
        op,
        root,
    } = *call;
    let t = dtype.size();
    let (inb, outb) = (l.in_bytes, l.out_bytes);
    let input = bytes(&mut b.input, inb);
    match c {
        Coll::AllGather => fill(input, dtype, op, me, me * l.count),
        Coll::Broadcast => fill(input, dtype, op, me, 0),
        _ => fill(input, dtype, op, me, 0),
    }
    if c == Coll::Broadcast && me != root {
        input.fill(0);
    }
    let inp_copy: Vec<u8> = input.to_vec();
    let output = bytes(&mut b.output, outb);
    output.fill(0xEE);
    if inplace {
        match c {
            Coll::AllGather => {
                output[me * l.count * t..(me + 1) * l.count * t].copy_from_slice(&inp_copy)
            }
            _ => output[..inb].copy_from_slice(&inp_copy),
        }
    }
}

/// Count wrong elements of rank `me`'s result (of `n` ranks).
fn check(call: &Call, l: &Layout, me: usize, n: usize, out: &[u8], table: &[u8]) -> u64 {
    let Call {
        coll: c,
        dtype,
        op,
        root,
    } = *call;
    let t = dtype.size();
    let mut wrong = 0u64;
    let mut e = vec![0u8; t];
    let mut cmp = |i: usize, want: &[u8]| {
        if &out[i * t..(i + 1) * t] != want {
            wrong += 1;
        }
    };
    match c {
        Coll::AllReduce => {
            (0..l.count).for_each(|i| cmp(i, &table[(i % 1021) * t..(i % 1021 + 1) * t]))
        }
        Coll::Reduce => {
            if me == root {
                (0..l.count).for_each(|i| cmp(i, &table[(i % 1021) * t..(i % 1021 + 1) * t]))
            }
        }
        Coll::ReduceScatter => {
            // the rank's block: in-place at offset me*count of the buffer; out-of-place at 0
            let base = me * l.count;
            for i in 0..l.count {
                let k = (base + i) % 1021;
                let want = &table[k * t..(k + 1) * t];
                if &out[i * t..(i + 1) * t] != want {
                    wrong += 1;
                }
            }
        }
        Coll::AllGather => {
            for i in 0..l.count * n {
                encode(dtype, value(op, i / l.count.max(1), i), &mut e);
                cmp(i, &e.clone());
            }
        }
        Coll::Broadcast => {
            for i in 0..l.count {
                encode(dtype, value(op, root, i), &mut e);
                cmp(i, &e.clone());
            }
        }
        Coll::AllToAll => {
            for i in 0..l.count * n {
                let j = i / l.count.max(1);
                encode(
                    dtype,
                    value(op, j, me * l.count + i % l.count.max(1)),
                    &mut e,
                );
                cmp(i, &e.clone());
            }
        }
        Coll::SendRecv => {
            let prev = (me + n - 1) % n;
            for i in 0..l.count {
                encode(dtype, value(op, prev, i), &mut e);
                cmp(i, &e.clone());
            }
        }
    }
    wrong
}

/// One measured row.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Row {
    pub collective: String,
    pub library: String,
    pub nranks: usize,
    pub size: usize,
    pub count: usize,
    #[serde(rename = "type")]
    pub dtype: String,
    pub redop: String,
    pub root: i64,
    pub oop_time_us: f64,
    pub oop_algbw: f64,
    pub oop_busbw: f64,
    pub oop_wrong: u64,
    pub ip_time_us: f64,
    pub ip_algbw: f64,
    pub ip_busbw: f64,
    pub ip_wrong: u64,
}

/// Time one variant (out-of-place or in-place) of one size; returns (time in µs, wrong).
/// `table` is the reference period of reduced values (`reduced_period`).
pub fn measure(
    be: &dyn Backend,
    o: &Options,
    call: &Call,
    size: u64,
    inplace: bool,
    table: &[u8],
) -> Result<(f64, u64), String> {
    let n = be.size();
    let me = be.rank();
    let Call { coll: c, dtype, .. } = *call;
    let l = layout(c, size, dtype, n);
    let mut b = Buffers {
        input: vec![0u64; l.in_bytes.div_ceil(8)],
        output: vec![0u64; l.out_bytes.div_ceil(8)],
    };
    prepare(call, &l, me, &mut b, inplace);
    let in_bytes = l.in_bytes;
    let out_bytes = l.out_bytes;
    let input_copy: Vec<u64> = b.input.clone();
    let run = |iters: usize, out: &mut Vec<u64>| -> Result<(), String> {
        let ob = bytes(out, out_bytes);
        let inp = if inplace {
            None
        } else {
            // SAFETY: reading our own u64 storage as bytes
            Some(unsafe { std::slice::from_raw_parts(input_copy.as_ptr() as *const u8, in_bytes) })
        };
        if o.blocking {
            for _ in 0..iters {
                be.call(call, inp, ob)?;
            }
            Ok(())
        } else {
            be.calls(iters, call, inp, ob)
        }
    };
    let mut out = b.output.clone();
    run(o.warmup, &mut out)?;
    be.barrier()?;
    let t0 = Instant::now();
    run(o.iters, &mut out)?;
    let us = t0.elapsed().as_secs_f64() * 1e6 / o.iters as f64;
    let us = match o.average {
        0 => us,
        1 => be.reduce_f64(us, ReduceOp::Sum)? / n as f64,
        2 => be.reduce_f64(us, ReduceOp::Min)?,
        _ => be.reduce_f64(us, ReduceOp::Max)?,
    };
    let mut wrong = 0;
    if o.check {
        // a fresh run on fresh data, checked element by element on this rank
        let mut b2 = Buffers {
            input: vec![0u64; in_bytes.div_ceil(8)],
            output: vec![0u64; out_bytes.div_ceil(8)],
        };
        prepare(call, &l, me, &mut b2, inplace);
        let inp: Vec<u8> = bytes(&mut b2.input, in_bytes).to_vec();
        let ob = bytes(&mut b2.output, out_bytes);
        be.call(call, if inplace { None } else { Some(&inp) }, ob)?;
        let res: &[u8] = match (c, inplace) {
            (Coll::ReduceScatter, true) => {
                &ob[me * l.count * dtype.size()..(me + 1) * l.count * dtype.size()]
            }
            _ => ob,
        };
        wrong = check(call, &l, me, n, res, table);
        wrong = be.reduce_f64(wrong as f64, ReduceOp::Sum)? as u64;
    }
    Ok((us, wrong))
}

/// Run the whole benchmark; prints the nccl-tests table on rank 0; returns the wrong-element total.
pub fn run_with(be: &dyn Backend, o: &Options) -> Result<u64, String> {
    let n = be.size();
    let me = be.rank();
    let c = o.coll;
    if c.rooted() && o.root >= n {
        return Err(format!("root {} is not a rank (world size {n})", o.root));
    }
    let host = railring::host::hostname();
    let lines = be.gather_lines(&format!(
        "#  Rank {me:2} Group  0 Pid {:6} on {host:>10} device  0 [cpu] {}",
        std::process::id(),
        be.describe_buffers()
    ))?;
    let mut rows = Vec::new();
    let mut total_wrong = 0u64;
    let mut bus_sum = 0.0;
    let mut bus_n = 0usize;
    if me == 0 {
        let mut h = String::new();
        let step = match o.stepfactor {
            Some(f) => format!("{f}(factor)"),
            None => format!("{}(bytes)", o.stepbytes),
        };
        let _ = writeln!(
            h,
            "# nThread 1 nGpus 1 minBytes {} maxBytes {} step: {step} warmup iters: {} iters: {} agg iters: 1 validation: {} graph: 0",
            o.minbytes, o.maxbytes, o.warmup, o.iters, u8::from(o.check)
        );
        let _ = writeln!(
            h,
            "#\n# {} {} over {n} ranks ({})\n#\n# Using devices",
            be.name(),
            c.name(),
            if o.blocking {
                "blocking calls"
            } else {
                "non-blocking calls"
            }
        );
        for l in &lines {
            let _ = writeln!(h, "{l}");
        }
        let _ = writeln!(h, "#");
        let _ = writeln!(h, "#                                                              out-of-place                       in-place          ");
        let _ = writeln!(h, "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong");
        let _ = writeln!(h, "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       ");
        print!("{h}");
    }
    for &dtype in &o.dtypes {
        let ops: Vec<ReduceOp> = if c.reduces() {
            o.ops.clone()
        } else {
            vec![ReduceOp::Sum]
        };
        for &op in &ops {
            let table = if c.reduces() {
                reduced_period(dtype, op, n)
            } else {
                Vec::new()
            };
            for &size in &o.sizes() {
                let l = layout(c, size, dtype, n);
                let call = Call {
                    coll: c,
                    dtype,
                    op,
                    root: o.root,
                };
                let (t_oop, w_oop) = measure(be, o, &call, size, false, &table)?;
                let (t_ip, w_ip) = measure(be, o, &call, size, true, &table)?;
                let sz = l.size_bytes as f64;
                let alg = |t: f64| if t > 0.0 { sz / t / 1e3 } else { 0.0 };
                let f = c.bus_factor(n);
                let row = Row {
                    collective: c.name().into(),
                    library: be.name(),
                    nranks: n,
                    size: l.size_bytes,
                    count: l.size_bytes / dtype.size(),
                    dtype: dtype.name().into(),
                    redop: if c.reduces() {
                        op.name().into()
                    } else {
                        "none".into()
                    },
                    root: if c.rooted() { o.root as i64 } else { -1 },
                    oop_time_us: t_oop,
                    oop_algbw: alg(t_oop),
                    oop_busbw: alg(t_oop) * f,
                    oop_wrong: w_oop,
                    ip_time_us: t_ip,
                    ip_algbw: alg(t_ip),
                    ip_busbw: alg(t_ip) * f,
                    ip_wrong: w_ip,
                };
                total_wrong += w_oop + w_ip;
                bus_sum += row.oop_busbw + row.ip_busbw;
                bus_n += 2;
                if me == 0 {
                    println!("{}", format_row(&row));
                }
                rows.push(row);
            }
        }
    }
    if me == 0 {
        println!(
            "# Out of bounds values : {} {}",
            total_wrong,
            if total_wrong == 0 { "OK" } else { "FAILED" }
        );
        println!(
            "# Avg bus bandwidth    : {:.4} ",
            if bus_n > 0 {
                bus_sum / bus_n as f64
            } else {
                0.0
            }
        );
        println!("#");
        if let Some(path) = &o.json {
            let js = serde_json::to_string_pretty(&rows).map_err(|e| e.to_string())?;
            std::fs::write(path, js + "\n").map_err(|e| format!("writing {path}: {e}"))?;
        }
    }
    Ok(total_wrong)
}

pub fn format_row(r: &Row) -> String {
    let root = if r.root < 0 {
        "-1".to_string()
    } else {
        r.root.to_string()
    };
    format!(
        "{:>12}  {:>12}  {:>8}  {:>6}  {:>6}  {} {} {} {:>6}  {} {} {} {:>6}",
        r.size,
        r.count,
        r.dtype,
        r.redop,
        root,
        fmt_time(r.oop_time_us),
        fmt_bw(r.oop_algbw),
        fmt_bw(r.oop_busbw),
        r.oop_wrong,
        fmt_time(r.ip_time_us),
        fmt_bw(r.ip_algbw),
        fmt_bw(r.ip_busbw),
        r.ip_wrong
    )
}

fn fmt_time(us: f64) -> String {
    if us >= 1e4 {
        format!("{:>7.0}", us)
    } else if us >= 100.0 {
        format!("{:>7.1}", us)
    } else {
        format!("{:>7.2}", us)
    }
}

fn fmt_bw(bw: f64) -> String {
    format!("{:>7.2}", bw)
}

/// railring as a [`Backend`].
pub struct Railring {
    pub comm: railring::Communicator,
}

impl Backend for Railring {
    fn name(&self) -> String {
        "railring".into()
    }
    fn rank(&self) -> usize {
        self.comm.rank()
    }
    fn size(&self) -> usize {
        self.comm.size()
    }
    fn call(&self, call: &Call, input: Option<&[u8]>, out: &mut [u8]) -> Result<(), String> {
        let Call {
            coll: c,
            dtype,
            op,
            root,
        } = *call;
        let n = self.comm.size();
        let me = self.comm.rank();
        let e = |e: railring::Error| e.to_string();
        match c {
            Coll::AllReduce => match input {
                Some(i) => self.comm.all_reduce_into_raw(i, out, dtype, op).map_err(e),
                None => self.comm.all_reduce_raw(out, dtype, op).map_err(e),
            },
            Coll::ReduceScatter => match input {
                // out-of-place: reduce a copy of the input, keep this rank's block at the start
                Some(i) => {
                    out.copy_from_slice(i);
                    self.comm.reduce_scatter_raw(out, dtype, op).map_err(e)?;
                    let b = out.len() / n;
                    out.copy_within(me * b..(me + 1) * b, 0);
                    Ok(())
                }
                None => self.comm.reduce_scatter_raw(out, dtype, op).map_err(e),
            },
            Coll::AllGather => {
                if let Some(i) = input {
                    out[me * i.len()..(me + 1) * i.len()].copy_from_slice(i);
                }
                self.comm.all_gather_raw(out, dtype).map_err(e)
            }
            Coll::Broadcast => {
                if let Some(i) = input {
                    if me == root {
                        out.copy_from_slice(i);
                    }
                }
                self.comm.broadcast_raw(out, dtype, root).map_err(e)
            }
            Coll::Reduce => {
                if let Some(i) = input {
                    out.copy_from_slice(i);
                }
                self.comm.reduce_raw(out, dtype, op, root).map_err(e)
            }
            Coll::AllToAll => match input {
                Some(i) => self.comm.all_to_all_raw(i, out, dtype).map_err(e),
                None => {
                    let tmp = out.to_vec();
                    self.comm.all_to_all_raw(&tmp, out, dtype).map_err(e)
                }
            },
            Coll::SendRecv => {
                let next = (me + 1) % n;
                let prev = (me + n - 1) % n;
                let tmp;
                let src = match input {
                    Some(i) => i,
                    None => {
                        tmp = out.to_vec();
                        &tmp
                    }
                };
                self.comm
                    .send_recv_raw(src, next, out, prev, dtype)
                    .map_err(e)
            }
        }
    }
    fn barrier(&self) -> Result<(), String> {
        self.comm.barrier().map_err(|e| e.to_string())
    }
    fn reduce_f64(&self, v: f64, op: ReduceOp) -> Result<f64, String> {
        let mut b = [v];
        self.comm
            .all_reduce(&mut b, op)
            .map_err(|e| e.to_string())?;
        Ok(b[0])
    }
    fn gather_lines(&self, line: &str) -> Result<Vec<String>, String> {
        let n = self.comm.size();
        let mut mine = [0u8; 160];
        let lb = line.as_bytes();
        let k = lb.len().min(160);
        mine[..k].copy_from_slice(&lb[..k]);
        let mut all = vec![0u8; 160 * n];
        self.comm
            .all_gather(&mine, &mut all)
            .map_err(|e| e.to_string())?;
        if self.comm.rank() != 0 {
            return Ok(vec![]);
        }
        Ok(all
            .chunks(160)
            .map(|c| {
                String::from_utf8_lossy(c)
                    .trim_end_matches('\0')
                    .to_string()
            })
            .collect())
    }
    fn describe_buffers(&self) -> String {
        let (rail, name) = self.comm.rail();
        format!(
            "node {}/{} local {}/{} rail {rail} ({}) heap buffers via shm staging",
            self.comm.node(),
            self.comm.nnodes(),
            self.comm.local_rank(),
            self.comm.local_size(),
            name.unwrap_or_else(|| "-".into())
        )
    }
}

/// Run railperf over railring.
pub fn run(o: &Options) -> Result<u64, String> {
    let comm = railring::Communicator::init().map_err(|e| e.to_string())?;
    run_with(&Railring { comm }, o)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn options_and_sizes() {
        let a: Vec<String> = "allreduce -b 8 -e 64 -f 2 -n 3 -w 1 -c 1 -d half -o all"
            .split(' ')
            .map(String::from)
            .collect();
        let o = Options::parse(&a).unwrap();
        assert_eq!(o.sizes(), vec![8, 16, 32, 64]);
        assert_eq!(o.dtypes, vec![DataType::F16]);
        assert_eq!(o.ops.len(), 5);
        let o = Options::parse(&[
            "-b".into(),
            "1K".into(),
            "-e".into(),
            "3K".into(),
            "-i".into(),
            "1K".into(),
        ])
        .unwrap();
        assert_eq!(o.sizes(), vec![1024, 2048, 3072]);
        assert!(Options::parse(&["-b".into(), "9".into(), "-e".into(), "8".into()]).is_err());
        assert!(Options::parse(&["bogus".into()]).is_err());
        assert!(Options::parse(&["-n".into()]).is_err());
    }
    #[test]
    fn bus_factors() {
        assert_eq!(Coll::AllReduce.bus_factor(4), 1.5);
        assert_eq!(Coll::AllGather.bus_factor(4), 0.75);
        assert_eq!(Coll::Broadcast.bus_factor(4), 1.0);
    }
}

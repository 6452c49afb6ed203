//! The timing loop (warm-up, timed iterations, the time statistic over ranks, a checked run),
//! the sweep over types, operators and sizes, and the nccl-tests table and JSON rows.

use super::data::{bytes, check, layout, prepare, reduced_period, Buffers};
use super::{Backend, Call, Coll, Options};
use railring::ReduceOp;
use std::fmt::Write as _;
use std::time::Instant;

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
    discard_first: bool,
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
    be.expect_calls(o.iters.max(o.warmup));
    run(o.warmup, &mut out)?;
    be.barrier()?;
    if discard_first {
        // the run's first timed loop, untimed (see `--discard-first`)
        run(o.iters, &mut out)?;
        be.barrier()?;
    }
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
        let inp = if inplace { None } else { Some(&inp[..]) };
        // The checked call goes the way the timed ones went.
        if o.blocking {
            be.call(call, inp, ob)?;
        } else {
            be.calls(1, call, inp, ob)?;
        }
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
    let host = railring::machine::hostname();
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
                "blocking calls".to_string()
            } else {
                be.calls_label(c)
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
            for (i, &size) in o.sizes().iter().enumerate() {
                let first = o.discard_first && i == 0 && rows.is_empty();
                let l = layout(c, size, dtype, n);
                let call = Call {
                    coll: c,
                    dtype,
                    op,
                    root: o.root,
                };
                let (t_oop, w_oop) = measure(be, o, &call, size, false, &table, first)?;
                let (t_ip, w_ip) = measure(be, o, &call, size, true, &table, false)?;
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
        if let Some(path) = &o.csv {
            let calls = if o.blocking || c == Coll::SendRecv {
                "blocking"
            } else {
                "non-blocking"
            };
            std::fs::write(path, csv(&rows, calls)).map_err(|e| format!("writing {path}: {e}"))?;
        }
        if let Some(path) = &o.json {
            let js = serde_json::to_string_pretty(&rows).map_err(|e| e.to_string())?;
            std::fs::write(path, js + "\n").map_err(|e| format!("writing {path}: {e}"))?;
        }
    }
    Ok(total_wrong)
}

/// The CSV columns of `--csv`, one row per measurement (each row of the table is two: out of
/// place and in place).
pub const CSV_HEADER: &str =
    "collective,library,nranks,size,count,type,redop,root,placement,time_us,algbw,busbw,wrong,calls";

/// `rows` as CSV (header line first); `calls` is `blocking` or `non-blocking`.
pub fn csv(rows: &[Row], calls: &str) -> String {
    let mut out = String::from(CSV_HEADER);
    out.push('\n');
    for r in rows {
        for (place, t, alg, bus, wrong) in [
            (
                "out-of-place",
                r.oop_time_us,
                r.oop_algbw,
                r.oop_busbw,
                r.oop_wrong,
            ),
            ("in-place", r.ip_time_us, r.ip_algbw, r.ip_busbw, r.ip_wrong),
        ] {
            let _ = writeln!(
                out,
                "{},{},{},{},{},{},{},{},{place},{t:.3},{alg:.4},{bus:.4},{wrong},{calls}",
                r.collective, r.library, r.nranks, r.size, r.count, r.dtype, r.redop, r.root
            );
        }
    }
    out
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

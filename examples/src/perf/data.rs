//! The data: how many elements and bytes each size means per collective, the small integers
//! every rank sends (exact under any reduction order), buffers prepared for out-of-place and
//! in-place runs, and the element-by-element check against an exact reference.

use super::{Call, Coll};
use railring::{DataType, ReduceOp};
use railring_collectives::kernels;

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
pub(super) fn reduced_period(dtype: DataType, op: ReduceOp, n: usize) -> Vec<u8> {
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

pub(super) struct Buffers {
    pub(super) input: Vec<u64>,
    pub(super) output: Vec<u64>,
}

pub(super) fn bytes(v: &mut [u64], n: usize) -> &mut [u8] {
    // SAFETY: u64 storage reinterpreted as bytes; n <= 8 * len.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, n) }
}

/// Set up buffers for a run of rank `me`. For in-place runs the input is placed inside the
/// output buffer the way each in-place collective expects it.
pub(super) fn prepare(call: &Call, l: &Layout, me: usize, b: &mut Buffers, inplace: bool) {
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
pub(super) fn check(call: &Call, l: &Layout, me: usize, n: usize, out: &[u8], table: &[u8]) -> u64 {
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

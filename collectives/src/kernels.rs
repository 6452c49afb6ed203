//! Reduction kernels over raw bytes. The data type and operator are dispatched once per call;
//! the inner loops are plain slice loops the compiler vectorizes.

use crate::dtype::{DataType, ReduceOp};
use half::{bf16, f16};

/// Elements per block in [`reduce_many`]: the accumulator block stays in L1.
const BLOCK_BYTES: usize = 4096;

trait Arith: Copy + Default {
    fn sum(a: Self, b: Self) -> Self;
    fn prod(a: Self, b: Self) -> Self;
    fn min(a: Self, b: Self) -> Self;
    fn max(a: Self, b: Self) -> Self;
    fn div(a: Self, n: usize) -> Self;
}

macro_rules! arith_int {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            #[inline(always)] fn sum(a: Self, b: Self) -> Self { a.wrapping_add(b) }
            #[inline(always)] fn prod(a: Self, b: Self) -> Self { a.wrapping_mul(b) }
            #[inline(always)] fn min(a: Self, b: Self) -> Self { if b < a { b } else { a } }
            #[inline(always)] fn max(a: Self, b: Self) -> Self { if b > a { b } else { a } }
            #[inline(always)] fn div(a: Self, n: usize) -> Self { a.wrapping_div(n as $t) }
        }
    )*};
}
arith_int!(i8, u8, i32, u32, i64, u64);

macro_rules! arith_float {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            #[inline(always)] fn sum(a: Self, b: Self) -> Self { a + b }
            #[inline(always)] fn prod(a: Self, b: Self) -> Self { a * b }
            #[inline(always)] fn min(a: Self, b: Self) -> Self { if b < a { b } else { a } }
            #[inline(always)] fn max(a: Self, b: Self) -> Self { if b > a { b } else { a } }
            #[inline(always)] fn div(a: Self, n: usize) -> Self { a / (n as $t) }
        }
    )*};
}
arith_float!(f32, f64);

macro_rules! arith_half {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            #[inline(always)] fn sum(a: Self, b: Self) -> Self { <$t>::from_f32(a.to_f32() + b.to_f32()) }
            #[inline(always)] fn prod(a: Self, b: Self) -> Self { <$t>::from_f32(a.to_f32() * b.to_f32()) }
            #[inline(always)] fn min(a: Self, b: Self) -> Self { if b < a { b } else { a } }
            #[inline(always)] fn max(a: Self, b: Self) -> Self { if b > a { b } else { a } }
            #[inline(always)] fn div(a: Self, n: usize) -> Self { <$t>::from_f32(a.to_f32() / n as f32) }
        }
    )*};
}
arith_half!(f16, bf16);

#[inline(always)]
fn combine<T: Arith>(dst: &mut [T], src: &[T], f: impl Fn(T, T) -> T) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = f(*d, *s);
    }
}

#[inline(always)]
fn combine_op<T: Arith>(op: ReduceOp, dst: &mut [T], src: &[T]) {
    match op.combiner() {
        ReduceOp::Sum | ReduceOp::Avg => combine(dst, src, T::sum),
        ReduceOp::Prod => combine(dst, src, T::prod),
        ReduceOp::Min => combine(dst, src, T::min),
        ReduceOp::Max => combine(dst, src, T::max),
    }
}

/// Reinterpret raw bytes as `T`, copying through an aligned scratch when the bytes are unaligned.
unsafe fn typed<'a, T>(p: *const u8, n: usize) -> &'a [T] {
    std::slice::from_raw_parts(p as *const T, n)
}
unsafe fn typed_mut<'a, T>(p: *mut u8, n: usize) -> &'a mut [T] {
    std::slice::from_raw_parts_mut(p as *mut T, n)
}

fn aligned<T>(p: *const u8) -> bool {
    (p as usize).is_multiple_of(std::mem::align_of::<T>())
}

/// `dst[i] = dst[i] op src[i]` for every element. `dst` and `src` must have the same length, a
/// multiple of the element size. Unaligned buffers are handled (more slowly).
pub fn reduce_into(dtype: DataType, op: ReduceOp, dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "reduce_into: length mismatch");
    // SAFETY: both slices are valid for their lengths and do not overlap (borrow rules).
    unsafe { reduce_into_raw(dtype, op, dst.as_mut_ptr(), src.as_ptr(), dst.len()) }
}

/// Raw-pointer form of [`reduce_into`]; `dst` and `src` may not partially overlap (equal is fine).
///
/// # Safety
/// `dst` must be valid for writes and `src` for reads of `bytes` bytes.
pub unsafe fn reduce_into_raw(
    dtype: DataType,
    op: ReduceOp,
    dst: *mut u8,
    src: *const u8,
    bytes: usize,
) {
    macro_rules! go {
        ($t:ty) => {{
            let n = bytes / std::mem::size_of::<$t>();
            if aligned::<$t>(dst) && aligned::<$t>(src) {
                combine_op::<$t>(op, typed_mut::<$t>(dst, n), typed::<$t>(src, n));
            } else {
                let mut a = vec![<$t>::default(); n.min(BLOCK_BYTES)];
                let mut b = vec![<$t>::default(); n.min(BLOCK_BYTES)];
                let mut done = 0;
                while done < n {
                    let k = (n - done).min(a.len());
                    let sz = std::mem::size_of::<$t>();
                    std::ptr::copy_nonoverlapping(
                        dst.add(done * sz),
                        a.as_mut_ptr() as *mut u8,
                        k * sz,
                    );
                    std::ptr::copy_nonoverlapping(
                        src.add(done * sz),
                        b.as_mut_ptr() as *mut u8,
                        k * sz,
                    );
                    combine_op::<$t>(op, &mut a[..k], &b[..k]);
                    std::ptr::copy_nonoverlapping(
                        a.as_ptr() as *const u8,
                        dst.add(done * sz),
                        k * sz,
                    );
                    done += k;
                }
            }
        }};
    }
    dispatch!(dtype, go);
}

macro_rules! dispatch {
    ($dtype:expr, $go:ident) => {
        match $dtype {
            DataType::I8 => $go!(i8),
            DataType::U8 => $go!(u8),
            DataType::I32 => $go!(i32),
            DataType::U32 => $go!(u32),
            DataType::I64 => $go!(i64),
            DataType::U64 => $go!(u64),
            DataType::F16 => $go!(f16),
            DataType::Bf16 => $go!(bf16),
            DataType::F32 => $go!(f32),
            DataType::F64 => $go!(f64),
        }
    };
}
use dispatch;

/// `dst = srcs[0] op srcs[1] op ... op srcs[k-1]`, combined in that order for every element (so
/// every rank that uses the same order gets bit-identical results). `dst` may alias any source.
/// Works block by block so the accumulator stays in L1.
///
/// # Safety
/// `dst` must be valid for writes and every source for reads of `bytes` bytes; sources may be
/// shared memory that other processes do not write during the call.
pub unsafe fn reduce_many_raw(
    dtype: DataType,
    op: ReduceOp,
    dst: *mut u8,
    srcs: &[*const u8],
    bytes: usize,
) {
    reduce_many_dual(dtype, op, dst, None, srcs, bytes)
}

/// [`reduce_many_raw`] that also writes the result to a second destination in the same pass
/// (`(dst2, streaming)`: with streaming stores when `streaming`), saving a later copy that
/// would read the result back. `dst2` may alias one source exactly (an in-place result).
///
/// # Safety
/// As [`reduce_many_raw`]; `dst2` valid for writes of `bytes` bytes and not overlapping `dst`.
pub unsafe fn reduce_many_dual(
    dtype: DataType,
    op: ReduceOp,
    dst: *mut u8,
    dst2: Option<(*mut u8, bool)>,
    srcs: &[*const u8],
    bytes: usize,
) {
    if srcs.is_empty() || bytes == 0 {
        return;
    }
    let put2 = |off: usize, from: *const u8, k: usize| {
        if let Some((d2, streaming)) = dst2 {
            if streaming {
                copy_streaming(d2.add(off), from, k)
            } else if !std::ptr::eq(from, d2.add(off)) {
                std::ptr::copy(from, d2.add(off), k)
            }
        }
    };
    if srcs.len() == 1 {
        if !std::ptr::eq(srcs[0], dst) {
            std::ptr::copy(srcs[0], dst, bytes);
        }
        put2(0, dst, bytes);
        return;
    }
    #[repr(C, align(64))]
    struct Block([u8; BLOCK_BYTES]);
    // Left uninitialised: every byte used is first written by the copy below (zeroing the block
    // cost a memset of BLOCK_BYTES per call, a visible share of a small all-reduce).
    let mut acc = std::mem::MaybeUninit::<Block>::uninit();
    let acc = acc.as_mut_ptr() as *mut u8;
    let esz = dtype.size();
    // (every dtype's alignment equals its size)
    let al = |p: *const u8| (p as usize).is_multiple_of(esz);
    let d = dst as *const u8;
    let overlaps = |s: *const u8| s < d.add(bytes) && d < s.add(bytes);
    let aligned_all = al(d) && srcs.iter().all(|&s| al(s));
    let fused = aligned_all && !srcs.iter().any(|&s| overlaps(s));
    // `dst` is the first source exactly and overlaps no other: combine the others into it where
    // it is (the same order, so the same bits), not through the accumulator's two copies
    let in_place =
        aligned_all && std::ptr::eq(srcs[0], d) && !srcs[1..].iter().any(|&s| overlaps(s));
    let mut off = 0;
    while off < bytes {
        let k = (bytes - off).min(BLOCK_BYTES);
        if in_place {
            for s in &srcs[1..] {
                reduce_into_raw(dtype, op, dst.add(off), s.add(off), k);
            }
            put2(off, dst.add(off), k);
        } else if fused {
            // aligned and `dst` overlaps no source: combine two operands per pass, the first
            // and last straight from and to memory (same order as below, so the same bits)
            let last = srcs.len() - 1;
            if last == 1 {
                reduce3_raw(
                    dtype,
                    op,
                    dst.add(off),
                    srcs[0].add(off),
                    srcs[1].add(off),
                    k,
                );
            } else {
                reduce3_raw(dtype, op, acc, srcs[0].add(off), srcs[1].add(off), k);
                for s in &srcs[2..last] {
                    reduce_into_raw(dtype, op, acc, s.add(off), k);
                }
                reduce3_raw(dtype, op, dst.add(off), acc, srcs[last].add(off), k);
            }
            put2(off, dst.add(off), k);
        } else {
            std::ptr::copy_nonoverlapping(srcs[0].add(off), acc, k);
            for s in &srcs[1..] {
                reduce_into_raw(dtype, op, acc, s.add(off), k);
            }
            std::ptr::copy_nonoverlapping(acc as *const u8, dst.add(off), k);
            put2(off, acc, k);
        }
        off += k;
    }
}

/// `out[i] = a[i] op b[i]`.
///
/// # Safety
/// All three aligned for `dtype`, valid for `bytes` bytes; `out` overlaps neither input.
unsafe fn reduce3_raw(
    dtype: DataType,
    op: ReduceOp,
    out: *mut u8,
    a: *const u8,
    b: *const u8,
    bytes: usize,
) {
    #[inline(always)]
    fn zip3<T: Arith>(o: &mut [T], a: &[T], b: &[T], f: impl Fn(T, T) -> T) {
        for ((o, a), b) in o.iter_mut().zip(a).zip(b) {
            *o = f(*a, *b);
        }
    }
    macro_rules! go {
        ($t:ty) => {{
            let n = bytes / std::mem::size_of::<$t>();
            let (o, a, b) = (
                typed_mut::<$t>(out, n),
                typed::<$t>(a, n),
                typed::<$t>(b, n),
            );
            match op.combiner() {
                ReduceOp::Sum | ReduceOp::Avg => zip3(o, a, b, <$t as Arith>::sum),
                ReduceOp::Prod => zip3(o, a, b, <$t as Arith>::prod),
                ReduceOp::Min => zip3(o, a, b, <$t as Arith>::min),
                ReduceOp::Max => zip3(o, a, b, <$t as Arith>::max),
            }
        }};
    }
    dispatch!(dtype, go);
}

/// Finish an average: divide every element by `n` (integer division for integer types).
pub fn finish_avg(dtype: DataType, buf: &mut [u8], n: usize) {
    if n <= 1 {
        return;
    }
    macro_rules! go {
        ($t:ty) => {{
            let sz = std::mem::size_of::<$t>();
            let count = buf.len() / sz;
            if aligned::<$t>(buf.as_ptr()) {
                // SAFETY: aligned, in bounds, POD.
                let s = unsafe { typed_mut::<$t>(buf.as_mut_ptr(), count) };
                for x in s {
                    *x = <$t as Arith>::div(*x, n);
                }
            } else {
                for c in buf.chunks_exact_mut(sz) {
                    // SAFETY: c holds exactly one element.
                    unsafe {
                        let v = std::ptr::read_unaligned(c.as_ptr() as *const $t);
                        std::ptr::write_unaligned(
                            c.as_mut_ptr() as *mut $t,
                            <$t as Arith>::div(v, n),
                        );
                    }
                }
            }
        }};
    }
    dispatch!(dtype, go);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::{as_bytes, as_bytes_mut};

    #[test]
    fn every_dtype_and_op() {
        for op in ReduceOp::ALL {
            let mut a: Vec<f32> = (0..37).map(|i| i as f32).collect();
            let b: Vec<f32> = (0..37).map(|i| (40 - i) as f32).collect();
            let want: Vec<f32> = a
                .iter()
                .zip(&b)
                .map(|(x, y)| match op {
                    ReduceOp::Sum | ReduceOp::Avg => x + y,
                    ReduceOp::Prod => x * y,
                    ReduceOp::Min => x.min(*y),
                    ReduceOp::Max => x.max(*y),
                })
                .collect();
            reduce_into(DataType::F32, op, as_bytes_mut(&mut a), as_bytes(&b));
            assert_eq!(a, want, "{op}");
        }
        let mut a = [100i8, -128, 5];
        let b = [100i8, -1, 7];
        reduce_into(
            DataType::I8,
            ReduceOp::Sum,
            as_bytes_mut(&mut a),
            as_bytes(&b),
        );
        assert_eq!(a, [-56, 127, 12], "wrapping");
        let mut h = [f16::from_f32(3.0), f16::from_f32(-2.0)];
        let g = [f16::from_f32(4.0), f16::from_f32(8.0)];
        reduce_into(
            DataType::F16,
            ReduceOp::Prod,
            as_bytes_mut(&mut h),
            as_bytes(&g),
        );
        assert_eq!(h, [f16::from_f32(12.0), f16::from_f32(-16.0)]);
        let mut u = [5u64, 9];
        reduce_into(
            DataType::U64,
            ReduceOp::Max,
            as_bytes_mut(&mut u),
            as_bytes(&[7u64, 1]),
        );
        assert_eq!(u, [7, 9]);
    }

    fn put_small(dtype: DataType, x: u8, c: &mut [u8]) {
        match dtype {
            DataType::I8 | DataType::U8 => c[0] = x,
            DataType::I32 | DataType::U32 => c.copy_from_slice(&(x as u32).to_le_bytes()),
            DataType::I64 | DataType::U64 => c.copy_from_slice(&(x as u64).to_le_bytes()),
            DataType::F16 => c.copy_from_slice(&f16::from_f32(x as f32).to_le_bytes()),
            DataType::Bf16 => c.copy_from_slice(&bf16::from_f32(x as f32).to_le_bytes()),
            DataType::F32 => c.copy_from_slice(&(x as f32).to_le_bytes()),
            DataType::F64 => c.copy_from_slice(&(x as f64).to_le_bytes()),
        }
    }

    #[test]
    fn fused_and_blocked_paths_agree_with_a_sequential_fold() {
        // every dtype and op, 1..=5 sources, lengths around the block size; bytes 0..4 chosen
        // so every dtype's values are small integers (exact in f16/bf16)
        for dtype in DataType::ALL {
            for op in ReduceOp::ALL {
                for l in 1..=5usize {
                    for elems in [1usize, 7, 2048 + 3] {
                        let bytes = elems * dtype.size();
                        let srcs: Vec<Vec<u8>> = (0..l)
                            .map(|r| {
                                let mut v = vec![0u8; bytes];
                                for (i, c) in v.chunks_mut(dtype.size()).enumerate() {
                                    put_small(dtype, ((i * 3 + r * 5) % 4 + 1) as u8, c);
                                }
                                v
                            })
                            .collect();
                        let mut want = srcs[0].clone();
                        for s in &srcs[1..] {
                            reduce_into(dtype, op, &mut want, s);
                        }
                        let ptrs: Vec<*const u8> = srcs.iter().map(|s| s.as_ptr()).collect();
                        let mut got = vec![0u8; bytes];
                        unsafe { reduce_many_raw(dtype, op, got.as_mut_ptr(), &ptrs, bytes) };
                        assert_eq!(got, want, "{dtype:?} {op:?} l={l} n={elems}");
                        // the same with the destination aliasing source 0 (combined where it
                        // is) and the last source (through the accumulator)
                        for at in [0, l - 1] {
                            let mut alias = srcs[at].clone();
                            let mut ptrs2 = ptrs.clone();
                            ptrs2[at] = alias.as_ptr();
                            unsafe {
                                reduce_many_raw(dtype, op, alias.as_mut_ptr(), &ptrs2, bytes)
                            };
                            assert_eq!(
                                alias, want,
                                "aliasing source {at}: {dtype:?} {op:?} l={l} n={elems}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn dual_destination_matches_and_may_alias_a_source() {
        // 9000 elements: two full 4 KiB blocks (streaming path) and a ragged tail
        let n = 9000usize;
        let srcs: Vec<Vec<i32>> = (0..3)
            .map(|r| (0..n as i32).map(|i| i * (r + 1) - 7).collect())
            .collect();
        for streaming in [false, true] {
            let mut own = srcs[1].clone(); // the second destination aliases source 1
            let mut slot = vec![0i32; n];
            let ptrs = [
                srcs[0].as_ptr() as *const u8,
                own.as_ptr() as *const u8,
                srcs[2].as_ptr() as *const u8,
            ];
            unsafe {
                reduce_many_dual(
                    DataType::I32,
                    ReduceOp::Sum,
                    slot.as_mut_ptr() as *mut u8,
                    Some((own.as_mut_ptr() as *mut u8, streaming)),
                    &ptrs,
                    n * 4,
                )
            };
            for i in 0..n {
                let want = i as i32 * 6 - 21;
                assert_eq!(
                    (slot[i], own[i]),
                    (want, want),
                    "element {i}, streaming {streaming}"
                );
            }
        }
    }

    #[test]
    fn many_sources_aliasing_and_unaligned() {
        let n = 5000usize;
        let srcs: Vec<Vec<i32>> = (0..4)
            .map(|r| (0..n as i32).map(|i| i * (r + 1)).collect())
            .collect();
        let mut dst = srcs[2].clone();
        let ptrs: Vec<*const u8> = srcs
            .iter()
            .enumerate()
            .map(|(i, s)| {
                if i == 2 {
                    dst.as_ptr() as *const u8
                } else {
                    s.as_ptr() as *const u8
                }
            })
            .collect();
        unsafe {
            reduce_many_raw(
                DataType::I32,
                ReduceOp::Sum,
                dst.as_mut_ptr() as *mut u8,
                &ptrs,
                n * 4,
            )
        };
        for (i, v) in dst.iter().enumerate() {
            assert_eq!(*v, i as i32 * 10);
        }
        // unaligned byte buffers
        let mut raw = [0u8; 8 * 3 + 1];
        let src = [1.5f64, 2.0, -3.0];
        raw[1..].copy_from_slice(as_bytes(&[1.0f64, 1.0, 1.0]));
        reduce_into(DataType::F64, ReduceOp::Sum, &mut raw[1..], as_bytes(&src));
        let got: Vec<f64> = raw[1..]
            .chunks(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(got, [2.5, 3.0, -2.0]);
        let mut avg = [7i32, -9, 8];
        finish_avg(DataType::I32, as_bytes_mut(&mut avg), 2);
        assert_eq!(avg, [3, -4, 4]);
    }
}

/// Least bytes of a [`copy`] that may take the vector loop: glibc copies smaller ones with
/// vector moves itself (its `rep movsb` starts above 2 KiB).
pub const COPY_VECTOR_MIN: usize = 2 << 10;
/// Bytes from which [`copy`] leaves every copy to `memcpy`: glibc stops using `rep movsb` below
/// this (on AMD at its L2 size or under: a 512 KiB copy with the destination 16 bytes ahead ran
/// 18.5 µs, as fast as aligned) and from its non-temporal threshold streams, which the loop does
/// not.
pub const COPY_VECTOR_MAX: usize = 1 << 20;

/// Copy `n` bytes from `src` to `dst` (as `std::ptr::copy_nonoverlapping`), robust to how the
/// two are placed within a cache line. glibc copies 2 KiB-256 KiB with `rep movsb`, which on
/// AMD EPYC (Zen) runs at a sixteenth of its speed when the destination sits 1-31 bytes past
/// the source modulo 64: 64 KiB in L2 took 22-36 µs (2.9 GB/s) against 1.3 µs aligned (49 GB/s)
/// or 32-63 bytes apart (1.5-2.7 µs). Buffers from the heap (16-byte aligned: a Vec, a Python
/// array) meet it by chance. A copy whose ends are not 64-byte congruent, from
/// [`COPY_VECTOR_MIN`] to under [`COPY_VECTOR_MAX`] bytes, runs a vector loop instead
/// (unaligned loads, stores aligned to the destination): 1.45 µs at 64 KiB however placed.
///
/// # Safety
/// `src` valid for reads and `dst` for writes of `n` bytes; the ranges do not overlap.
#[inline]
pub unsafe fn copy(dst: *mut u8, src: *const u8, n: usize) {
    #[cfg(target_arch = "x86_64")]
    if (COPY_VECTOR_MIN..COPY_VECTOR_MAX).contains(&n)
        && (dst as usize).wrapping_sub(src as usize) & 63 != 0
    {
        return copy_vector(dst, src, n);
    }
    std::ptr::copy_nonoverlapping(src, dst, n)
}

/// [`copy`]'s vector loop: AVX where the CPU has it, else SSE2 (the x86_64 baseline).
#[cfg(target_arch = "x86_64")]
unsafe fn copy_vector(dst: *mut u8, src: *const u8, n: usize) {
    // stores aligned to 32 bytes; the head up to there copied plainly (under 32 bytes)
    let head = dst.align_offset(32).min(n);
    std::ptr::copy_nonoverlapping(src, dst, head);
    let body = (n - head) & !63;
    let (d, s) = (dst.add(head), src.add(head));
    if std::arch::is_x86_feature_detected!("avx") {
        copy_lines_avx(d, s, body)
    } else {
        lines_sse2::<false>(d, s, body)
    }
    std::ptr::copy_nonoverlapping(s.add(body), d.add(body), n - head - body);
}

/// [`lines_sse2`]'s plain moves with AVX (`dst` 32-byte aligned).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn copy_lines_avx(dst: *mut u8, src: *const u8, n: usize) {
    use std::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm256_store_si256};
    for k in (0..n).step_by(64) {
        let (s, d) = (src.add(k), dst.add(k));
        let a = _mm256_loadu_si256(s as *const __m256i);
        let b = _mm256_loadu_si256(s.add(32) as *const __m256i);
        _mm256_store_si256(d as *mut __m256i, a);
        _mm256_store_si256(d.add(32) as *mut __m256i, b);
    }
}

/// Copy `n` bytes at `src` to both `a` and `b`, reading the input once: blocks small enough for
/// the first level cache are copied to `a`, then from there to `b`.
///
/// # Safety
/// `src` valid for reads and `a`, `b` for writes of `n` bytes; none of the ranges overlap.
pub unsafe fn copy_twice(a: *mut u8, b: *mut u8, src: *const u8, n: usize) {
    const BLOCK: usize = 16 << 10;
    let mut k = 0;
    while k < n {
        let m = (n - k).min(BLOCK);
        copy(a.add(k), src.add(k), m);
        copy(b.add(k), a.add(k), m);
        k += m;
    }
}

/// Copy `n` bytes with non-temporal (streaming) stores where the CPU has them: the destination
/// lines are written without first being read into the cache. For large copies into memory that
/// is not cached (an out-of-place result buffer) this saves the read-for-ownership pass, about a
/// third of the memory traffic. With AVX-512 one store writes a whole line (`stream_width`):
/// 4 ranks on 2 CPUs, out of place, railperf -n 20 -z 1, medians of 4-6 launches against SSE2's
/// four stores a line: all-to-all 32 MiB 11.5 ms against 13.6, all-reduce 32 MiB 15.6 against
/// 17.5 (2 ranks: 16 MiB 2.84 against 3.03, 32 MiB 5.85 against 6.30); 16 MiB on 4 ranks within
/// the noise. Small copies and unaligned heads/tails use a plain copy.
///
/// # Safety
/// `src` valid for reads and `dst` for writes of `n` bytes; the ranges do not overlap.
pub unsafe fn copy_streaming(dst: *mut u8, src: *const u8, n: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        copy_streaming_as(stream_width(), dst, src, n)
    }
    #[cfg(not(target_arch = "x86_64"))]
    std::ptr::copy_nonoverlapping(src, dst, n);
}

/// Bytes of the streaming store [`copy_streaming`] uses on this CPU: 64 with AVX-512, else
/// SSE2's 16 (AVX's 32, two a line, measured no faster than SSE2's four: 4 ranks, a 32 MiB
/// all-reduce out of place 18.5 ms against 18.2, AVX-512 16.6).
#[cfg(target_arch = "x86_64")]
fn stream_width() -> usize {
    if std::arch::is_x86_feature_detected!("avx512f") {
        64
    } else {
        16
    }
}

/// [`copy_streaming`] with stores of `width` bytes (one [`stream_width`] allows).
#[cfg(target_arch = "x86_64")]
unsafe fn copy_streaming_as(width: usize, dst: *mut u8, src: *const u8, n: usize) {
    if n < 4096 {
        std::ptr::copy_nonoverlapping(src, dst, n);
        return;
    }
    // the stores need destinations aligned to their width
    let head = dst.align_offset(width).min(n);
    std::ptr::copy_nonoverlapping(src, dst, head);
    let body = (n - head) & !63;
    let (d, s) = (dst.add(head), src.add(head));
    if width == 64 {
        stream_lines_avx512(d, s, body)
    } else {
        lines_sse2::<true>(d, s, body)
    }
    std::ptr::copy_nonoverlapping(s.add(body), d.add(body), n - head - body);
    // streaming stores are weakly ordered: fence before anyone is told the data is there
    std::arch::x86_64::_mm_sfence();
}

/// Copy `n` bytes (a multiple of 64) to `dst` (16-byte aligned) with SSE2, part of the x86_64
/// baseline: streaming stores when `STREAM` ([`copy_streaming`]), else plain ones ([`copy`]).
#[cfg(target_arch = "x86_64")]
unsafe fn lines_sse2<const STREAM: bool>(dst: *mut u8, src: *const u8, n: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_store_si128, _mm_stream_si128};
    for k in (0..n).step_by(64) {
        let (s, d) = (src.add(k), dst.add(k));
        let v = [0, 16, 32, 48].map(|o| _mm_loadu_si128(s.add(o) as *const __m128i));
        for (o, v) in [0, 16, 32, 48].into_iter().zip(v) {
            let at = d.add(o) as *mut __m128i;
            if STREAM {
                _mm_stream_si128(at, v)
            } else {
                _mm_store_si128(at, v)
            }
        }
    }
}

/// [`lines_sse2`]'s streaming stores with AVX-512, one a line (`dst` 64-byte aligned).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn stream_lines_avx512(dst: *mut u8, src: *const u8, n: usize) {
    use std::arch::x86_64::{__m512i, _mm512_loadu_si512, _mm512_stream_si512};
    for k in (0..n).step_by(64) {
        let v = _mm512_loadu_si512(src.add(k) as *const __m512i);
        _mm512_stream_si512(dst.add(k) as *mut __m512i, v);
    }
}

#[cfg(test)]
mod streaming_tests {
    /// The store widths to test: every one this CPU has (0: [`super::copy_streaming`] itself,
    /// whichever it picks).
    fn widths() -> Vec<usize> {
        #[cfg(target_arch = "x86_64")]
        {
            let top = super::stream_width();
            [0, 16, 64].into_iter().filter(|&w| w <= top).collect()
        }
        #[cfg(not(target_arch = "x86_64"))]
        vec![0]
    }

    unsafe fn copy(width: usize, dst: *mut u8, src: *const u8, n: usize) {
        #[cfg(target_arch = "x86_64")]
        if width > 0 {
            return super::copy_streaming_as(width, dst, src, n);
        }
        let _ = width;
        super::copy_streaming(dst, src, n)
    }

    #[test]
    fn streaming_copy_matches_for_every_alignment_and_length() {
        let src: Vec<u8> = (0..20_000u32).map(|i| (i * 7 + 3) as u8).collect();
        for off_s in [0usize, 1, 5, 16] {
            for off_d in [0usize, 3, 8, 15] {
                for n in [0usize, 1, 63, 4095, 4096, 4097, 4421, 10_007, 19_000] {
                    for width in widths() {
                        let mut dst = vec![0xAAu8; 20_100];
                        unsafe {
                            copy(
                                width,
                                dst.as_mut_ptr().add(off_d),
                                src.as_ptr().add(off_s),
                                n,
                            )
                        };
                        assert_eq!(
                            &dst[off_d..off_d + n],
                            &src[off_s..off_s + n],
                            "s{off_s} d{off_d} n{n} width {width}"
                        );
                        assert!(dst[..off_d].iter().all(|&b| b == 0xAA));
                        assert!(dst[off_d + n..].iter().all(|&b| b == 0xAA));
                    }
                }
            }
        }
    }

    /// `copy` at every placement of destination against source within a line (the vector loop
    /// takes those not congruent), across its size limits, and nothing outside the range.
    #[test]
    fn copy_matches_for_every_placement_and_length() {
        use super::{COPY_VECTOR_MAX, COPY_VECTOR_MIN};
        let len = COPY_VECTOR_MAX + 256;
        let src: Vec<u8> = (0..len as u32).map(|i| (i * 31 + 7) as u8).collect();
        let mut dst = vec![0u8; len + 128];
        let sizes = [
            0,
            1,
            31,
            COPY_VECTOR_MIN - 1,
            COPY_VECTOR_MIN,
            COPY_VECTOR_MIN + 1,
            4096 + 13,
            (64 << 10) + 5,
            COPY_VECTOR_MAX - 1,
            COPY_VECTOR_MAX,
        ];
        let s0 = src.as_ptr().align_offset(64);
        let d0 = dst.as_ptr().align_offset(64);
        for off_s in [0usize, 8, 16, 40] {
            for skew in [0usize, 1, 16, 31, 32, 33, 48, 63] {
                for n in sizes {
                    let off_d = d0 + (off_s + skew) % 64;
                    let from = s0 + off_s;
                    if from + n > len {
                        continue;
                    }
                    dst.fill(0xAA);
                    unsafe { super::copy(dst.as_mut_ptr().add(off_d), src.as_ptr().add(from), n) };
                    assert!(
                        dst[off_d..off_d + n] == src[from..from + n],
                        "s{off_s} skew {skew} n{n}"
                    );
                    assert!(
                        dst[..off_d].iter().all(|&b| b == 0xAA),
                        "s{off_s} skew {skew} n{n}"
                    );
                    assert!(
                        dst[off_d + n..].iter().all(|&b| b == 0xAA),
                        "s{off_s} skew {skew} n{n}"
                    );
                }
            }
        }
    }

    #[test]
    fn copy_twice_fills_both_destinations_across_its_blocks() {
        let src: Vec<u8> = (0..70_000u32).map(|i| (i * 13 + 1) as u8).collect();
        for n in [0usize, 1, 16 << 10, (16 << 10) + 1, 40_003, 70_000] {
            let mut a = vec![0xAAu8; 70_001];
            let mut b = vec![0x55u8; 70_001];
            unsafe { super::copy_twice(a.as_mut_ptr(), b.as_mut_ptr(), src.as_ptr(), n) };
            assert_eq!(&a[..n], &src[..n], "a n{n}");
            assert_eq!(&b[..n], &src[..n], "b n{n}");
            assert!(a[n..].iter().all(|&x| x == 0xAA) && b[n..].iter().all(|&x| x == 0x55));
        }
    }
}

//! Reduction kernels for the GPU data path, as CUDA C source compiled at run time by NVRTC (no
//! CUDA toolkit at build time), and the host-side launch geometry. Everything here is pure
//! string and arithmetic work, tested without a GPU.
//!
//! Each (data type, operator) gets its own small module with:
//!
//! - `rr_reduce_<dtype>_<op>(T* dst, const unsigned long long* bases, unsigned long long off,
//!   int nsrc, unsigned long long n)`: `dst[i] = src0[i] op src1[i] op ...` with
//!   `src_k = (const T*)(bases[k] + off)`, combined in source order (so every rank that reduces
//!   the same piece gets bit-identical results, and results match the CPU kernels);
//! - for `Avg` also `rr_avg_<dtype>(T* buf, unsigned long long n, unsigned int ranks)`, the
//!   division that finishes an average (integer division for integer types, like the CPU path).
//!
//! Arithmetic follows `railring_collectives::kernels` exactly: integers wrap (computed in the
//! unsigned type of the same width: signed overflow is undefined in C++), half and bfloat16 are
//! widened to float for each operation and rounded back to nearest-even, min/max keep the
//! accumulator unless the new value compares strictly smaller/greater (NaN behaves as on CPU).
//!
//! Half types come from `cuda_fp16.h` / `cuda_bf16.h` ([`HalfImpl::Headers`]) when NVRTC finds
//! them; otherwise the same arithmetic is written out with PTX conversions and bit operations
//! ([`HalfImpl::Builtin`]), so a driver without the toolkit headers still works.

use railring_collectives::{DataType, ReduceOp};

/// How half-precision types are spelled in the generated source.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HalfImpl {
    /// `#include <cuda_fp16.h>` / `<cuda_bf16.h>` (`__half`, `__nv_bfloat16`).
    Headers,
    /// No headers: 16-bit storage with PTX `cvt` for f16 and bit operations for bf16.
    Builtin,
}

/// Short name used in kernel symbols (`f32`, `bf16`, ...).
pub fn dtype_tag(d: DataType) -> &'static str {
    match d {
        DataType::I8 => "i8",
        DataType::U8 => "u8",
        DataType::I32 => "i32",
        DataType::U32 => "u32",
        DataType::I64 => "i64",
        DataType::U64 => "u64",
        DataType::F16 => "f16",
        DataType::Bf16 => "bf16",
        DataType::F32 => "f32",
        DataType::F64 => "f64",
    }
}

pub fn op_tag(op: ReduceOp) -> &'static str {
    match op {
        ReduceOp::Sum => "sum",
        ReduceOp::Prod => "prod",
        ReduceOp::Min => "min",
        ReduceOp::Max => "max",
        ReduceOp::Avg => "avg",
    }
}

/// The CUDA C element type.
pub fn ctype(d: DataType, half: HalfImpl) -> &'static str {
    match (d, half) {
        (DataType::I8, _) => "signed char",
        (DataType::U8, _) => "unsigned char",
        (DataType::I32, _) => "int",
        (DataType::U32, _) => "unsigned int",
        (DataType::I64, _) => "long long",
        (DataType::U64, _) => "unsigned long long",
        (DataType::F16, HalfImpl::Headers) => "__half",
        (DataType::Bf16, HalfImpl::Headers) => "__nv_bfloat16",
        (DataType::F16 | DataType::Bf16, HalfImpl::Builtin) => "unsigned short",
        (DataType::F32, _) => "float",
        (DataType::F64, _) => "double",
    }
}

/// The unsigned type integer arithmetic wraps in.
fn utype(d: DataType) -> Option<&'static str> {
    match d {
        DataType::I8 | DataType::U8 => Some("unsigned char"),
        DataType::I32 | DataType::U32 => Some("unsigned int"),
        DataType::I64 | DataType::U64 => Some("unsigned long long"),
        _ => None,
    }
}

/// Symbol of the reduce kernel.
pub fn reduce_kernel_name(d: DataType, op: ReduceOp) -> String {
    format!("rr_reduce_{}_{}", dtype_tag(d), op_tag(op))
}

/// Symbol of the average-finishing kernel.
pub fn avg_kernel_name(d: DataType) -> String {
    format!("rr_avg_{}", dtype_tag(d))
}

/// Conversions to/from float for the half types (None for other types).
fn half_conv(d: DataType, half: HalfImpl) -> Option<(&'static str, &'static str)> {
    match (d, half) {
        (DataType::F16, HalfImpl::Headers) => Some(("__half2float", "__float2half_rn")),
        (DataType::Bf16, HalfImpl::Headers) => Some(("__bfloat162float", "__float2bfloat16_rn")),
        (DataType::F16, HalfImpl::Builtin) => Some(("rr_h2f", "rr_f2h")),
        (DataType::Bf16, HalfImpl::Builtin) => Some(("rr_b2f", "rr_f2b")),
        _ => None,
    }
}

/// Source prologue: headers or the built-in conversions the type needs.
fn prologue(d: DataType, half: HalfImpl) -> String {
    match (d, half) {
        (DataType::F16, HalfImpl::Headers) => "#include <cuda_fp16.h>\n".into(),
        (DataType::Bf16, HalfImpl::Headers) => "#include <cuda_bf16.h>\n".into(),
        (DataType::F16, HalfImpl::Builtin) => r#"__device__ __forceinline__ float rr_h2f(unsigned short h) {
  float f; asm("{ .reg .b16 t; mov.b16 t, %1; cvt.f32.f16 %0, t; }" : "=f"(f) : "h"(h)); return f;
}
__device__ __forceinline__ unsigned short rr_f2h(float f) {
  unsigned short h; asm("{ .reg .b16 t; cvt.rn.f16.f32 t, %1; mov.b16 %0, t; }" : "=h"(h) : "f"(f)); return h;
}
"#
        .into(),
        (DataType::Bf16, HalfImpl::Builtin) => r#"__device__ __forceinline__ float rr_b2f(unsigned short b) {
  return __uint_as_float(((unsigned int)b) << 16);
}
__device__ __forceinline__ unsigned short rr_f2b(float f) {
  unsigned int x = __float_as_uint(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((x >> 16) | 0x0040u);
  unsigned int r = 0x00008000u;
  if ((x & r) != 0u && (x & (3u * r - 1u)) != 0u) return (unsigned short)((x >> 16) + 1u);
  return (unsigned short)(x >> 16);
}
"#
        .into(),
        _ => String::new(),
    }
}

/// The expression combining accumulator `a` with `b` (both of the element type).
pub fn combine_expr(d: DataType, op: ReduceOp, half: HalfImpl) -> String {
    let t = ctype(d, half);
    if let Some((to_f, from_f)) = half_conv(d, half) {
        return match op {
            ReduceOp::Sum | ReduceOp::Avg => format!("{from_f}({to_f}(a) + {to_f}(b))"),
            ReduceOp::Prod => format!("{from_f}({to_f}(a) * {to_f}(b))"),
            ReduceOp::Min => format!("(({to_f}(b) < {to_f}(a)) ? b : a)"),
            ReduceOp::Max => format!("(({to_f}(b) > {to_f}(a)) ? b : a)"),
        };
    }
    match (op, utype(d)) {
        (ReduceOp::Sum | ReduceOp::Avg, Some(u)) => format!("({t})({u})(({u})a + ({u})b)"),
        (ReduceOp::Prod, Some(u)) => format!("({t})({u})(({u})a * ({u})b)"),
        (ReduceOp::Sum | ReduceOp::Avg, None) => "(a + b)".into(),
        (ReduceOp::Prod, None) => "(a * b)".into(),
        (ReduceOp::Min, _) => "((b < a) ? b : a)".into(),
        (ReduceOp::Max, _) => "((b > a) ? b : a)".into(),
    }
}

/// The expression dividing `a` by `n` (the rank count) for averages.
pub fn avg_expr(d: DataType, half: HalfImpl) -> String {
    let t = ctype(d, half);
    if let Some((to_f, from_f)) = half_conv(d, half) {
        return format!("{from_f}({to_f}(a) / (float)n)");
    }
    match d {
        DataType::F32 => "(a / (float)n)".into(),
        DataType::F64 => "(a / (double)n)".into(),
        // Rust's wrapping_div(n as T): the rank count converted to T first.
        _ => format!("({t})(a / ({t})n)"),
    }
}

/// The complete NVRTC source for one (dtype, op): the reduce kernel and, for `Avg`, the
/// average-finishing kernel.
pub fn module_source(d: DataType, op: ReduceOp, half: HalfImpl) -> String {
    let t = ctype(d, half);
    let mut s = String::new();
    s.push_str(&format!(
        "// railring reduction kernels: {} {} (generated)\n",
        d.name(),
        op_tag(op)
    ));
    s.push_str(&prologue(d, half));
    s.push_str(&format!(
        r#"__device__ __forceinline__ {t} rr_combine({t} a, {t} b) {{ return {expr}; }}
extern "C" __global__ void {name}({t}* dst, const unsigned long long* bases,
    unsigned long long off, int nsrc, unsigned long long n) {{
  unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {{
    {t} a = ((const {t}*)(bases[0] + off))[i];
    for (int k = 1; k < nsrc; ++k) {{
      {t} b = ((const {t}*)(bases[k] + off))[i];
      a = rr_combine(a, b);
    }}
    dst[i] = a;
  }}
}}
"#,
        expr = combine_expr(d, op, half),
        name = reduce_kernel_name(d, op),
    ));
    if op == ReduceOp::Avg {
        s.push_str(&format!(
            r#"extern "C" __global__ void {name}({t}* buf, unsigned long long count, unsigned int n) {{
  unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {{
    {t} a = buf[i];
    buf[i] = {expr};
  }}
}}
"#,
            name = avg_kernel_name(d),
            expr = avg_expr(d, half),
        ));
    }
    s
}

/// NVRTC options: exact IEEE arithmetic (no FMA contraction, IEEE division), the device's
/// virtual architecture when known, and include directories for the half headers.
pub fn compile_options(arch: Option<(i32, i32)>, include_dirs: &[String]) -> Vec<String> {
    let mut o = vec![
        "--fmad=false".to_string(),
        "--prec-div=true".to_string(),
        "--ftz=false".to_string(),
        "--std=c++14".to_string(),
    ];
    if let Some((maj, min)) = arch {
        o.push(format!("--gpu-architecture=compute_{maj}{min}"));
    }
    for d in include_dirs {
        o.push(format!("--include-path={d}"));
    }
    o
}

/// Directories that may hold `cuda_fp16.h`: `$CUDA_HOME`, `$CUDA_PATH`, `/usr/local/cuda*`,
/// `/usr/include` (Debian's nvidia-cuda-toolkit), in that order; only those that exist.
pub fn header_dirs() -> Vec<String> {
    let mut cands: Vec<std::path::PathBuf> = Vec::new();
    for v in ["CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"] {
        if let Ok(p) = std::env::var(v) {
            if !p.trim().is_empty() {
                cands.push(std::path::Path::new(p.trim()).join("include"));
            }
        }
    }
    cands.push("/usr/local/cuda/include".into());
    if let Ok(rd) = std::fs::read_dir("/usr/local") {
        let mut v: Vec<_> = rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("cuda-"))
            })
            .map(|p| p.join("include"))
            .collect();
        v.sort();
        v.reverse();
        cands.extend(v);
    }
    cands.push("/usr/include".into());
    let mut out = Vec::new();
    for c in cands {
        if c.join("cuda_fp16.h").is_file() {
            let s = c.to_string_lossy().into_owned();
            if !out.contains(&s) {
                out.push(s);
            }
        }
    }
    out
}

/// Grid and block size for an element-wise kernel over `n` elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchDims {
    pub grid: u32,
    pub block: u32,
}

/// Threads per block for the element-wise kernels.
pub const BLOCK: u32 = 256;
/// Resident blocks per SM the grid is capped at (the kernels are grid-stride loops).
pub const BLOCKS_PER_SM: u32 = 8;

/// One thread per element up to `sm_count * BLOCKS_PER_SM` blocks of [`BLOCK`] threads (beyond
/// that, threads loop); at least one block; `sm_count` 0 (unknown) counts as 1.
pub fn launch_dims(n: u64, sm_count: u32) -> LaunchDims {
    let cap = sm_count.max(1).saturating_mul(BLOCKS_PER_SM) as u64;
    let want = n.div_ceil(BLOCK as u64).max(1);
    LaunchDims {
        grid: want.min(cap).min(i32::MAX as u64) as u32,
        block: BLOCK,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_and_op_has_a_kernel() {
        for d in DataType::ALL {
            for op in ReduceOp::ALL {
                for h in [HalfImpl::Headers, HalfImpl::Builtin] {
                    let s = module_source(d, op, h);
                    let name = reduce_kernel_name(d, op);
                    assert!(
                        s.contains(&format!("extern \"C\" __global__ void {name}(")),
                        "{name}"
                    );
                    assert!(s.contains(ctype(d, h)), "{d} {op}");
                    assert_eq!(
                        s.contains(&avg_kernel_name(d)),
                        op == ReduceOp::Avg,
                        "{d} {op}: avg kernel only for Avg"
                    );
                    // balanced braces and parentheses (a cheap syntax sanity check)
                    assert_eq!(s.matches('{').count(), s.matches('}').count(), "{d} {op}");
                    assert_eq!(s.matches('(').count(), s.matches(')').count(), "{d} {op}");
                    assert!(!s.contains('\0'));
                }
            }
        }
    }

    #[test]
    fn kernel_names() {
        assert_eq!(
            reduce_kernel_name(DataType::Bf16, ReduceOp::Max),
            "rr_reduce_bf16_max"
        );
        assert_eq!(
            reduce_kernel_name(DataType::U8, ReduceOp::Sum),
            "rr_reduce_u8_sum"
        );
        assert_eq!(avg_kernel_name(DataType::F64), "rr_avg_f64");
        let names: std::collections::HashSet<String> = DataType::ALL
            .iter()
            .flat_map(|&d| ReduceOp::ALL.iter().map(move |&o| reduce_kernel_name(d, o)))
            .collect();
        assert_eq!(names.len(), 50, "distinct symbols");
    }

    #[test]
    fn integer_arithmetic_wraps_in_unsigned() {
        let s = combine_expr(DataType::I32, ReduceOp::Sum, HalfImpl::Headers);
        assert_eq!(s, "(int)(unsigned int)((unsigned int)a + (unsigned int)b)");
        let s = combine_expr(DataType::I8, ReduceOp::Prod, HalfImpl::Headers);
        assert_eq!(
            s,
            "(signed char)(unsigned char)((unsigned char)a * (unsigned char)b)"
        );
        let s = combine_expr(DataType::U64, ReduceOp::Avg, HalfImpl::Builtin);
        assert!(s.contains("unsigned long long"));
        assert_eq!(
            combine_expr(DataType::I64, ReduceOp::Min, HalfImpl::Headers),
            "((b < a) ? b : a)"
        );
        assert_eq!(
            avg_expr(DataType::I32, HalfImpl::Headers),
            "(int)(a / (int)n)"
        );
    }

    #[test]
    fn floats_are_plain_ieee() {
        assert_eq!(
            combine_expr(DataType::F32, ReduceOp::Sum, HalfImpl::Headers),
            "(a + b)"
        );
        assert_eq!(
            combine_expr(DataType::F64, ReduceOp::Prod, HalfImpl::Headers),
            "(a * b)"
        );
        assert_eq!(
            combine_expr(DataType::F64, ReduceOp::Max, HalfImpl::Headers),
            "((b > a) ? b : a)"
        );
        assert_eq!(avg_expr(DataType::F32, HalfImpl::Headers), "(a / (float)n)");
        let o = compile_options(None, &[]);
        assert!(
            o.contains(&"--fmad=false".to_string()),
            "no FMA contraction"
        );
        assert!(o.contains(&"--prec-div=true".to_string()));
    }

    #[test]
    fn half_types_widen_to_float_and_round_back() {
        let s = module_source(DataType::F16, ReduceOp::Sum, HalfImpl::Headers);
        assert!(s.starts_with("// railring"));
        assert!(s.contains("#include <cuda_fp16.h>"));
        assert!(s.contains("__float2half_rn(__half2float(a) + __half2float(b))"));
        let s = module_source(DataType::Bf16, ReduceOp::Prod, HalfImpl::Headers);
        assert!(s.contains("#include <cuda_bf16.h>"));
        assert!(s.contains("__float2bfloat16_rn(__bfloat162float(a) * __bfloat162float(b))"));
        let s = module_source(DataType::Bf16, ReduceOp::Min, HalfImpl::Headers);
        assert!(s.contains("((__bfloat162float(b) < __bfloat162float(a)) ? b : a)"));
        // no headers in the built-in variant
        for d in [DataType::F16, DataType::Bf16] {
            let s = module_source(d, ReduceOp::Avg, HalfImpl::Builtin);
            assert!(!s.contains("#include"), "{d}");
            assert!(s.contains("unsigned short"));
        }
        let s = module_source(DataType::F16, ReduceOp::Sum, HalfImpl::Builtin);
        assert!(s.contains("cvt.rn.f16.f32"), "round to nearest even");
        assert!(s.contains("cvt.f32.f16"));
        let s = module_source(DataType::Bf16, ReduceOp::Avg, HalfImpl::Builtin);
        assert!(s.contains("rr_f2b(rr_b2f(a) / (float)n)"));
        // no header for non-half types
        assert!(
            !module_source(DataType::F32, ReduceOp::Sum, HalfImpl::Headers).contains("#include")
        );
    }

    /// The built-in bf16 rounding written in the kernel, transcribed to Rust, agrees with the
    /// `half` crate the CPU path uses (so GPU and CPU results are bit-identical).
    #[test]
    fn builtin_bf16_rounding_matches_the_half_crate() {
        fn f2b(f: f32) -> u16 {
            let x = f.to_bits();
            if (x & 0x7fff_ffff) > 0x7f80_0000 {
                return ((x >> 16) | 0x0040) as u16;
            }
            let r = 0x0000_8000u32;
            if (x & r) != 0 && (x & (3 * r - 1)) != 0 {
                return ((x >> 16) + 1) as u16;
            }
            (x >> 16) as u16
        }
        let mut x: u32 = 0x1234_5678;
        for _ in 0..200_000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let f = f32::from_bits(x);
            assert_eq!(f2b(f), half::bf16::from_f32(f).to_bits(), "{f:e} ({x:#x})");
        }
        for f in [
            0.0f32,
            -0.0,
            1.0,
            f32::from_bits(0x3f80_8000), // exactly halfway: ties to even (down)
            f32::from_bits(0x3f81_8000), // exactly halfway: ties to even (up)
            f32::MAX,
            f32::INFINITY,
            -f32::INFINITY,
        ] {
            assert_eq!(f2b(f), half::bf16::from_f32(f).to_bits(), "{f}");
        }
    }

    #[test]
    fn launch_geometry() {
        assert_eq!(
            launch_dims(0, 132),
            LaunchDims {
                grid: 1,
                block: 256
            }
        );
        assert_eq!(
            launch_dims(1, 132),
            LaunchDims {
                grid: 1,
                block: 256
            }
        );
        assert_eq!(launch_dims(256, 132).grid, 1);
        assert_eq!(launch_dims(257, 132).grid, 2);
        assert_eq!(
            launch_dims(1 << 30, 132).grid,
            132 * BLOCKS_PER_SM,
            "capped"
        );
        assert_eq!(
            launch_dims(1 << 30, 0).grid,
            BLOCKS_PER_SM,
            "unknown SM count"
        );
        assert_eq!(launch_dims(u64::MAX, u32::MAX).grid, i32::MAX as u32);
    }

    #[test]
    fn options_carry_arch_and_includes() {
        let o = compile_options(Some((9, 0)), &["/usr/local/cuda/include".into()]);
        assert!(o.contains(&"--gpu-architecture=compute_90".to_string()));
        assert!(o.contains(&"--include-path=/usr/local/cuda/include".to_string()));
        // header discovery only returns directories that have the header
        for d in header_dirs() {
            assert!(std::path::Path::new(&d).join("cuda_fp16.h").is_file());
        }
    }
}

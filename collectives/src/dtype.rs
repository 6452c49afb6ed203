//! Element types and reduction operators.

use std::fmt;
use std::str::FromStr;

/// Every element type a collective can carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DataType {
    I8 = 0,
    U8 = 1,
    I32 = 2,
    U32 = 3,
    I64 = 4,
    U64 = 5,
    F16 = 6,
    Bf16 = 7,
    F32 = 8,
    F64 = 9,
}

impl DataType {
    pub const ALL: [DataType; 10] = [
        DataType::I8,
        DataType::U8,
        DataType::I32,
        DataType::U32,
        DataType::I64,
        DataType::U64,
        DataType::F16,
        DataType::Bf16,
        DataType::F32,
        DataType::F64,
    ];

    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DataType::I8 | DataType::U8 => 1,
            DataType::F16 | DataType::Bf16 => 2,
            DataType::I32 | DataType::U32 | DataType::F32 => 4,
            DataType::I64 | DataType::U64 | DataType::F64 => 8,
        }
    }

    /// The nccl-tests name (`float`, `half`, `bfloat16`, `int32`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DataType::I8 => "int8",
            DataType::U8 => "uint8",
            DataType::I32 => "int32",
            DataType::U32 => "uint32",
            DataType::I64 => "int64",
            DataType::U64 => "uint64",
            DataType::F16 => "half",
            DataType::Bf16 => "bfloat16",
            DataType::F32 => "float",
            DataType::F64 => "double",
        }
    }

    pub const fn is_float(self) -> bool {
        matches!(
            self,
            DataType::F16 | DataType::Bf16 | DataType::F32 | DataType::F64
        )
    }

    pub fn from_u8(v: u8) -> Option<DataType> {
        DataType::ALL.get(v as usize).copied()
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DataType {
    type Err = String;
    /// Accepts nccl-tests names (`float`, `half`, `bfloat16`, `int8`, ...) and Rust names (`f32`, `bf16`, ...).
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "int8" | "i8" | "char" => DataType::I8,
            "uint8" | "u8" => DataType::U8,
            "int32" | "i32" | "int" => DataType::I32,
            "uint32" | "u32" => DataType::U32,
            "int64" | "i64" => DataType::I64,
            "uint64" | "u64" => DataType::U64,
            "half" | "f16" | "float16" | "fp16" => DataType::F16,
            "bfloat16" | "bf16" => DataType::Bf16,
            "float" | "f32" | "float32" | "fp32" => DataType::F32,
            "double" | "f64" | "float64" | "fp64" => DataType::F64,
            _ => {
                return Err(format!(
                "unknown data type '{s}' (expected one of int8 uint8 int32 uint32 int64 uint64 half bfloat16 float double)"
            ))
            }
        })
    }
}

/// Reduction operators.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ReduceOp {
    Sum = 0,
    Prod = 1,
    Min = 2,
    Max = 3,
    /// Sum, then divided by the number of contributions (integer division for integer types).
    Avg = 4,
}

impl ReduceOp {
    pub const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
    ];
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Avg => "avg",
        }
    }
    pub fn from_u8(v: u8) -> Option<ReduceOp> {
        ReduceOp::ALL.get(v as usize).copied()
    }
    /// The operator applied pairwise while combining (avg combines as sum).
    pub const fn combiner(self) -> ReduceOp {
        match self {
            ReduceOp::Avg => ReduceOp::Sum,
            o => o,
        }
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ReduceOp {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "sum" => ReduceOp::Sum,
            "prod" => ReduceOp::Prod,
            "min" => ReduceOp::Min,
            "max" => ReduceOp::Max,
            "avg" => ReduceOp::Avg,
            _ => {
                return Err(format!(
                    "unknown reduction op '{s}' (expected sum, prod, min, max or avg)"
                ))
            }
        })
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A Rust type that is one of the [`DataType`]s. Implemented for i8, u8, i32, u32, i64, u64,
/// `half::f16`, `half::bf16`, f32, f64. Every bit pattern is a valid value (plain old data).
pub trait Element:
    Copy + Send + Sync + Default + PartialEq + fmt::Debug + 'static + sealed::Sealed
{
    const DTYPE: DataType;
    /// Exact conversion of a small integer (tests and benchmarks build exact references with it).
    fn from_i64(v: i64) -> Self;
    fn to_f64(self) -> f64;
}

macro_rules! element_int {
    ($t:ty, $d:expr) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DataType = $d;
            fn from_i64(v: i64) -> Self {
                v as $t
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
        }
    };
}
element_int!(i8, DataType::I8);
element_int!(u8, DataType::U8);
element_int!(i32, DataType::I32);
element_int!(u32, DataType::U32);
element_int!(i64, DataType::I64);
element_int!(u64, DataType::U64);

impl sealed::Sealed for f32 {}
impl Element for f32 {
    const DTYPE: DataType = DataType::F32;
    fn from_i64(v: i64) -> Self {
        v as f32
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
}
impl sealed::Sealed for f64 {}
impl Element for f64 {
    const DTYPE: DataType = DataType::F64;
    fn from_i64(v: i64) -> Self {
        v as f64
    }
    fn to_f64(self) -> f64 {
        self
    }
}
impl sealed::Sealed for half::f16 {}
impl Element for half::f16 {
    const DTYPE: DataType = DataType::F16;
    fn from_i64(v: i64) -> Self {
        half::f16::from_f64(v as f64)
    }
    fn to_f64(self) -> f64 {
        half::f16::to_f64(self)
    }
}
impl sealed::Sealed for half::bf16 {}
impl Element for half::bf16 {
    const DTYPE: DataType = DataType::Bf16;
    fn from_i64(v: i64) -> Self {
        half::bf16::from_f64(v as f64)
    }
    fn to_f64(self) -> f64 {
        half::bf16::to_f64(self)
    }
}

/// View a slice of elements as bytes.
pub fn as_bytes<T: Element>(s: &[T]) -> &[u8] {
    // SAFETY: Element types are plain old data without padding.
    unsafe { std::slice::from_raw_parts(s.as_ptr() as *const u8, std::mem::size_of_val(s)) }
}

/// View a mutable slice of elements as bytes.
pub fn as_bytes_mut<T: Element>(s: &mut [T]) -> &mut [u8] {
    // SAFETY: Element types are plain old data; every byte pattern is a valid value.
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr() as *mut u8, std::mem::size_of_val(s)) }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn names_round_trip() {
        for d in DataType::ALL {
            assert_eq!(d.name().parse::<DataType>().unwrap(), d);
            assert_eq!(DataType::from_u8(d as u8), Some(d));
        }
        for o in ReduceOp::ALL {
            assert_eq!(o.name().parse::<ReduceOp>().unwrap(), o);
            assert_eq!(ReduceOp::from_u8(o as u8), Some(o));
        }
        assert!("float7".parse::<DataType>().is_err());
        assert_eq!(DataType::from_u8(10), None);
    }
}

//! Python arrays as memory railring can use in place: numpy arrays (through the `numpy` crate)
//! and CPU `torch.Tensor`s (through a zero-copy numpy view made by `railring._interop`).
//!
//! Nothing is copied: railring reads and writes the array's own memory. So an array must be
//! C-contiguous (a clear error otherwise, saying what to pass instead), writeable when railring
//! writes it, in native byte order, and of a type railring reduces.

use numpy::npyffi::{self, NPY_ARRAY_WRITEABLE};
use numpy::{PyArrayDescr, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use railring::DataType;

use crate::errors::invalid;

/// A region of an array's memory. Only valid while the array it came from is alive and not
/// resized: every user keeps a strong reference to the array (`Arr::view`) meanwhile.
#[derive(Clone, Copy)]
pub(crate) struct Mem {
    pub ptr: *mut u8,
    pub len: usize,
    pub dtype: DataType,
}

// SAFETY: a `Mem` crosses into a GIL-released section or the worker thread only together with a
// strong reference to its array, which outlives that use (see comm.rs and handle.rs).
unsafe impl Send for Mem {}
unsafe impl Sync for Mem {}

impl Mem {
    /// The elements' bytes.
    ///
    /// # Safety
    /// The array must be alive and unshared for `'a` (see the type's comment).
    pub unsafe fn bytes_mut<'a>(&self) -> &'a mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: by the caller's promise; numpy's data pointer covers `len` bytes.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
    /// # Safety
    /// As [`Mem::bytes_mut`], for reading.
    pub unsafe fn bytes<'a>(&self) -> &'a [u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: as above.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
    pub fn count(&self) -> usize {
        self.len / self.dtype.size()
    }
    pub fn overlaps(&self, o: &Mem) -> bool {
        let (a, b) = (self.ptr as usize, o.ptr as usize);
        self.len > 0 && o.len > 0 && a < b + o.len && b < a + self.len
    }
}

/// An argument of a collective: the object the caller passed (returned to them), the numpy array
/// whose memory is used (the same object for numpy; a view for a torch tensor), and that memory.
pub(crate) struct Arr<'py> {
    pub obj: Bound<'py, PyAny>,
    pub view: Bound<'py, PyAny>,
    pub mem: Mem,
}

/// numpy's name for a railring type (`DTYPES` in the module).
pub(crate) fn numpy_name(d: DataType) -> &'static str {
    match d {
        DataType::I8 => "int8",
        DataType::U8 => "uint8",
        DataType::I32 => "int32",
        DataType::U32 => "uint32",
        DataType::I64 => "int64",
        DataType::U64 => "uint64",
        DataType::F16 => "float16",
        DataType::Bf16 => "bfloat16",
        DataType::F32 => "float32",
        DataType::F64 => "float64",
        // a type added to railring later shows its own name until it gets a numpy one
        #[allow(unreachable_patterns)]
        d => d.name(),
    }
}

const SUPPORTED: &str =
    "int8, uint8, int32, uint32, int64, uint64, float16, bfloat16 (ml_dtypes), float32, float64";

/// railring's type for a numpy dtype, or why there is none.
fn dtype_of(d: &Bound<'_, PyArrayDescr>) -> Result<DataType, String> {
    let name = || {
        d.str()
            .map(|s| s.to_string())
            .unwrap_or_else(|_| "?".into())
    };
    if d.is_native_byteorder() == Some(false) {
        return Err(format!(
            "dtype {} is not in this machine's byte order; convert with arr.astype(arr.dtype.newbyteorder('='))",
            name()
        ));
    }
    let t = match (d.kind(), d.itemsize()) {
        (b'i', 1) => DataType::I8,
        (b'u', 1) => DataType::U8,
        (b'i', 4) => DataType::I32,
        (b'u', 4) => DataType::U32,
        (b'i', 8) => DataType::I64,
        (b'u', 8) => DataType::U64,
        (b'f', 2) => DataType::F16,
        (b'f', 4) => DataType::F32,
        (b'f', 8) => DataType::F64,
        (_, 2) if is_bfloat16(d) => DataType::Bf16,
        _ => {
            return Err(format!(
                "railring does not reduce dtype {}; supported: {SUPPORTED}",
                name()
            ))
        }
    };
    Ok(t)
}

/// ml_dtypes' bfloat16 (a user-defined numpy type named `bfloat16`, from a module `ml_dtypes…`).
fn is_bfloat16(d: &Bound<'_, PyArrayDescr>) -> bool {
    if d.has_fields() || d.has_subarray() {
        return false;
    }
    let t = d.typeobj();
    let attr = |a: &str| {
        t.getattr(a)
            .and_then(|v| v.extract::<String>())
            .unwrap_or_default()
    };
    attr("__name__") == "bfloat16" && attr("__module__").starts_with("ml_dtypes")
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

/// The memory of `obj`, argument `arg` of `call`; `write`: railring writes it.
pub(crate) fn array<'py>(
    obj: &Bound<'py, PyAny>,
    call: &str,
    arg: &str,
    write: bool,
) -> PyResult<Arr<'py>> {
    if let Ok(a) = obj.cast::<PyUntypedArray>() {
        let mem = numpy_mem(a, None, call, arg, write)?;
        return Ok(Arr {
            obj: obj.clone(),
            view: obj.clone(),
            mem,
        });
    }
    // Not a numpy array: a CPU torch tensor (or anything else `_interop` knows), as a numpy view.
    let py = obj.py();
    let interop = py.import("railring._interop")?;
    let got = interop.call_method1("as_numpy", (obj, call, arg))?;
    if got.is_none() {
        return Err(PyTypeError::new_err(format!(
            "{call}: argument '{arg}' must be a numpy.ndarray or a CPU torch.Tensor, not {}",
            type_name(obj)
        )));
    }
    let t = got.cast::<PyTuple>()?;
    let view = t.get_item(0)?;
    let dtype: Option<String> = t.get_item(1)?.extract()?;
    let dtype = dtype
        .map(|s| s.parse::<DataType>().map_err(invalid))
        .transpose()?;
    let a = view.cast::<PyUntypedArray>()?;
    let mem = numpy_mem(a, dtype, call, arg, write)?;
    Ok(Arr {
        obj: obj.clone(),
        view,
        mem,
    })
}

fn numpy_mem(
    a: &Bound<'_, PyUntypedArray>,
    dtype: Option<DataType>,
    call: &str,
    arg: &str,
    write: bool,
) -> PyResult<Mem> {
    let dtype = match dtype {
        Some(d) => d,
        None => {
            dtype_of(&a.dtype()).map_err(|e| invalid(format!("{call}: argument '{arg}': {e}")))?
        }
    };
    if !a.is_c_contiguous() {
        return Err(invalid(format!(
            "{call}: argument '{arg}' is not C-contiguous (shape {}, strides {}); railring works \
             in place on the array's own memory and never copies it: pass numpy.ascontiguousarray({arg}) \
             (or tensor.contiguous()) and use that array",
            py_tuple(a.shape()),
            py_tuple(a.strides())
        )));
    }
    // SAFETY: `a` is a live numpy array and we are attached to the interpreter.
    let fields = unsafe { &*npyffi::_PyArray_GET_ITEM_DATA(a.as_array_ptr()) };
    if write && fields.flags & NPY_ARRAY_WRITEABLE == 0 {
        return Err(invalid(format!(
            "{call}: argument '{arg}' is read-only (railring writes the result into it); pass a \
             writeable copy, e.g. {arg}.copy()"
        )));
    }
    let len = a.len().checked_mul(dtype.size()).filter(|_| {
        // the view's own item size must match (a torch bf16 tensor arrives as int16)
        a.dtype().itemsize() == dtype.size()
    });
    let len =
        len.ok_or_else(|| invalid(format!("{call}: argument '{arg}': item size mismatch")))?;
    Ok(Mem {
        ptr: fields.data as *mut u8,
        len,
        dtype,
    })
}

/// `(1, 2)` / `(5,)` as Python prints tuples.
fn py_tuple<T: std::fmt::Display>(v: &[T]) -> String {
    let items: Vec<String> = v.iter().map(|x| x.to_string()).collect();
    match items.len() {
        1 => format!("({},)", items[0]),
        _ => format!("({})", items.join(", ")),
    }
}

/// A new array shaped `shape` of `like`'s type (numpy or torch, as `like` is).
pub(crate) fn empty_like<'py>(like: &Arr<'py>, shape: Vec<usize>) -> PyResult<Bound<'py, PyAny>> {
    let py = like.obj.py();
    py.import("railring._interop")?
        .call_method1("empty_like", (&like.obj, shape))
}

/// The shape of `arr` (numpy view) as a vector.
pub(crate) fn shape_of(arr: &Arr<'_>) -> Vec<usize> {
    match arr.view.cast::<PyUntypedArray>() {
        Ok(a) => a.shape().to_vec(),
        Err(_) => vec![arr.mem.count()],
    }
}

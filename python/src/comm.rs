//! `railring.Communicator`: every collective of `railring::Communicator` on numpy arrays and
//! CPU torch tensors, in place and out of place, blocking and started (`*_start` → `Handle`).
//!
//! Blocking calls release the GIL while they run; the arrays they touch are held by the
//! caller's frame (`Arr` keeps a strong reference) for the whole call. Started calls go through
//! the runtime's pointer API with a keep-alive box (see handle.rs for the safety argument).

use pyo3::prelude::*;
use railring::{Communicator, ReduceOp};

use crate::arrays::{array, empty_like, shape_of, Arr, Mem};
use crate::errors::{invalid, to_py};
use crate::handle::Handle;

/// A group of ranks running collectives together (from `railring.init()` or `split`).
///
/// Every rank must make the same calls in the same order; calls run in the order they are made,
/// started ones included. Arrays must be C-contiguous numpy arrays (or CPU torch tensors) of a
/// type railring supports (`railring.DTYPES`); railring works on their memory directly and
/// never copies them. `op` is one of "sum", "prod", "min", "max", "avg".
#[pyclass(frozen, module = "railring", name = "Communicator")]
pub struct PyComm {
    comm: Communicator,
}

impl PyComm {
    pub(crate) fn new(comm: Communicator) -> PyComm {
        PyComm { comm }
    }

    /// Run `f` on the communicator with the GIL released; railring errors become exceptions.
    fn run<R: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&Communicator) -> railring::Result<R> + Send,
    ) -> PyResult<R> {
        let c = &self.comm;
        py.detach(move || f(c)).map_err(|e| to_py(py, e))
    }
}

fn op_of(op: &str) -> PyResult<ReduceOp> {
    op.parse::<ReduceOp>().map_err(invalid)
}

fn same_type(call: &str, a: &Mem, b: &Mem) -> PyResult<()> {
    if a.dtype != b.dtype {
        return Err(invalid(format!(
            "{call}: input is {} but output is {}; both must have the same dtype",
            crate::arrays::numpy_name(a.dtype),
            crate::arrays::numpy_name(b.dtype)
        )));
    }
    if a.overlaps(b) {
        return Err(invalid(format!(
            "{call}: input and output share memory; use the in-place form"
        )));
    }
    Ok(())
}

fn count_is(call: &str, arg: &str, m: &Mem, want: usize, why: &str) -> PyResult<()> {
    if m.count() != want {
        return Err(invalid(format!(
            "{call}: '{arg}' has {} elements, expected {want} ({why})",
            m.count()
        )));
    }
    Ok(())
}

/// The output argument, or a new array like `like` shaped `shape`.
fn output<'py>(
    out: Option<&Bound<'py, PyAny>>,
    like: &Arr<'py>,
    shape: Vec<usize>,
    call: &str,
) -> PyResult<Arr<'py>> {
    match out {
        Some(o) => array(o, call, "output", true),
        None => array(&empty_like(like, shape)?, call, "output", true),
    }
}

/// What keeps the arrays of a started call alive on the worker thread.
fn keep(arrs: &[&Arr<'_>]) -> Box<dyn Send> {
    let refs: Vec<Py<PyAny>> = arrs.iter().map(|a| a.view.clone().unbind()).collect();
    Box::new(refs)
}

#[pymethods]
impl PyComm {
    /// This process's rank in the communicator (0-based).
    #[getter]
    fn rank(&self) -> usize {
        self.comm.rank()
    }
    /// The number of ranks.
    #[getter]
    fn size(&self) -> usize {
        self.comm.size()
    }
    /// This rank's index among the ranks of its node.
    #[getter]
    fn local_rank(&self) -> usize {
        self.comm.local_rank()
    }
    /// The number of ranks on this rank's node.
    #[getter]
    fn local_size(&self) -> usize {
        self.comm.local_size()
    }
    /// This rank's node (nodes are numbered by their lowest rank).
    #[getter]
    fn node(&self) -> usize {
        self.comm.node()
    }
    /// The number of nodes.
    #[getter]
    fn nnodes(&self) -> usize {
        self.comm.nnodes()
    }
    /// The rail this rank's network traffic uses: (index, interface name or None).
    #[getter]
    fn rail(&self) -> (usize, Option<String>) {
        self.comm.rail()
    }

    fn __repr__(&self) -> String {
        format!(
            "<railring.Communicator rank {} of {} (node {} of {}, local rank {} of {})>",
            self.comm.rank(),
            self.comm.size(),
            self.comm.node(),
            self.comm.nnodes(),
            self.comm.local_rank(),
            self.comm.local_size()
        )
    }

    /// In-place all-reduce: every rank's `buf` becomes the reduction of all ranks' `buf`.
    /// Returns `buf`.
    #[pyo3(signature = (buf, op = "sum"))]
    fn all_reduce<'py>(&self, buf: &Bound<'py, PyAny>, op: &str) -> PyResult<Bound<'py, PyAny>> {
        let op = op_of(op)?;
        let b = array(buf, "all_reduce", "buf", true)?;
        let m = b.mem;
        // SAFETY: `b` holds the array for the whole call.
        self.run(buf.py(), |c| {
            c.all_reduce_raw(unsafe { m.bytes_mut() }, m.dtype, op)
        })?;
        Ok(b.obj)
    }

    /// Out-of-place all-reduce: `output` (allocated when None) receives the reduction of every
    /// rank's `input`. Returns `output`.
    #[pyo3(signature = (input, output = None, op = "sum"))]
    fn all_reduce_into<'py>(
        &self,
        input: &Bound<'py, PyAny>,
        output: Option<&Bound<'py, PyAny>>,
        op: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        const C: &str = "all_reduce_into";
        let op = op_of(op)?;
        let i = array(input, C, "input", false)?;
        let o = self::output(output, &i, shape_of(&i), C)?;
        same_type(C, &i.mem, &o.mem)?;
        count_is(C, "output", &o.mem, i.mem.count(), "as many as 'input'")?;
        let (im, om) = (i.mem, o.mem);
        // SAFETY: `i` and `o` hold the arrays for the call; they do not overlap (checked).
        self.run(input.py(), |c| {
            c.all_reduce_into_raw(
                unsafe { im.bytes() },
                unsafe { om.bytes_mut() },
                im.dtype,
                op,
            )
        })?;
        Ok(o.obj)
    }

    /// Reduce-scatter: `input` holds `size` equal blocks; `output` (allocated when None)
    /// receives the reduction of block `rank` over all ranks. Returns `output`.
    #[pyo3(signature = (input, output = None, op = "sum"))]
    fn reduce_scatter<'py>(
        &self,
        input: &Bound<'py, PyAny>,
        output: Option<&Bound<'py, PyAny>>,
        op: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        const C: &str = "reduce_scatter";
        let op = op_of(op)?;
        let n = self.comm.size();
        let i = array(input, C, "input", false)?;
        if !i.mem.count().is_multiple_of(n) {
            return Err(invalid(format!(
                "{C}: 'input' has {} elements, not {n} equal blocks",
                i.mem.count()
            )));
        }
        let k = i.mem.count() / n;
        let mut shape = shape_of(&i);
        match shape.first_mut() {
            Some(d) if *d % n == 0 => *d /= n,
            _ => shape = vec![k],
        }
        let o = self::output(output, &i, shape, C)?;
        same_type(C, &i.mem, &o.mem)?;
        count_is(C, "output", &o.mem, k, "one block of 'input'")?;
        let (im, om) = (i.mem, o.mem);
        // SAFETY: as in all_reduce_into. The runtime reduce-scatters a copy of the input it
        // keeps between calls (as the Rust API's out-of-place form does).
        self.run(input.py(), |c| {
            c.reduce_scatter_into_raw(
                unsafe { im.bytes() },
                unsafe { om.bytes_mut() },
                im.dtype,
                op,
            )
        })?;
        Ok(o.obj)
    }

    /// In-place reduce-scatter: `buf` holds `size` equal blocks; afterwards block `rank` holds
    /// the reduction (the other blocks are scratch). Returns `buf`.
    #[pyo3(signature = (buf, op = "sum"))]
    fn reduce_scatter_in_place<'py>(
        &self,
        buf: &Bound<'py, PyAny>,
        op: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        let op = op_of(op)?;
        let b = array(buf, "reduce_scatter_in_place", "buf", true)?;
        let m = b.mem;
        // SAFETY: `b` holds the array for the call.
        self.run(buf.py(), |c| {
            c.reduce_scatter_raw(unsafe { m.bytes_mut() }, m.dtype, op)
        })?;
        Ok(b.obj)
    }

    /// All-gather: `output` (allocated when None, shaped `(size, *input.shape)`) receives every
    /// rank's `input`, in rank order. Returns `output`.
    #[pyo3(signature = (input, output = None))]
    fn all_gather<'py>(
        &self,
        input: &Bound<'py, PyAny>,
        output: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        const C: &str = "all_gather";
        let (n, r) = (self.comm.size(), self.comm.rank());
        let i = array(input, C, "input", false)?;
        let mut shape = vec![n];
        shape.extend(shape_of(&i));
        let o = self::output(output, &i, shape, C)?;
        same_type(C, &i.mem, &o.mem)?;
        count_is(C, "output", &o.mem, i.mem.count() * n, "size x len(input)")?;
        let (im, om) = (i.mem, o.mem);
        // SAFETY: as in all_reduce_into.
        self.run(input.py(), |c| {
            let out = unsafe { om.bytes_mut() };
            out[r * im.len..(r + 1) * im.len].copy_from_slice(unsafe { im.bytes() });
            c.all_gather_raw(out, im.dtype)
        })?;
        Ok(o.obj)
    }

    /// In-place all-gather: `buf` holds `size` equal blocks; block `rank` is this rank's
    /// contribution, and afterwards every block holds its rank's. Returns `buf`.
    fn all_gather_in_place<'py>(&self, buf: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let b = array(buf, "all_gather_in_place", "buf", true)?;
        let m = b.mem;
        // SAFETY: `b` holds the array for the call.
        self.run(buf.py(), |c| {
            c.all_gather_raw(unsafe { m.bytes_mut() }, m.dtype)
        })?;
        Ok(b.obj)
    }

    /// Broadcast `root`'s `buf` to every rank (in place). Returns `buf`.
    #[pyo3(signature = (buf, root = 0))]
    fn broadcast<'py>(&self, buf: &Bound<'py, PyAny>, root: usize) -> PyResult<Bound<'py, PyAny>> {
        let b = array(buf, "broadcast", "buf", true)?;
        let m = b.mem;
        // SAFETY: `b` holds the array for the call.
        self.run(buf.py(), |c| {
            c.broadcast_raw(unsafe { m.bytes_mut() }, m.dtype, root)
        })?;
        Ok(b.obj)
    }

    /// Reduce to `root`: on the root, `output` (allocated when None) receives the reduction of
    /// every rank's `input`; on other ranks `output` is scratch. Returns `output`.
    #[pyo3(signature = (input, output = None, op = "sum", root = 0))]
    fn reduce<'py>(
        &self,
        input: &Bound<'py, PyAny>,
        output: Option<&Bound<'py, PyAny>>,
        op: &str,
        root: usize,
    ) -> PyResult<Bound<'py, PyAny>> {
        const C: &str = "reduce";
        let op = op_of(op)?;
        let i = array(input, C, "input", false)?;
        let o = self::output(output, &i, shape_of(&i), C)?;
        same_type(C, &i.mem, &o.mem)?;
        count_is(C, "output", &o.mem, i.mem.count(), "as many as 'input'")?;
        let (im, om) = (i.mem, o.mem);
        // SAFETY: as in all_reduce_into.
        self.run(input.py(), |c| {
            let out = unsafe { om.bytes_mut() };
            out.copy_from_slice(unsafe { im.bytes() });
            c.reduce_raw(out, im.dtype, op, root)
        })?;
        Ok(o.obj)
    }

    /// In-place reduce: the root's `buf` receives the reduction; other ranks' `buf` is left
    /// unchanged. Returns `buf`.
    #[pyo3(signature = (buf, op = "sum", root = 0))]
    fn reduce_in_place<'py>(
        &self,
        buf: &Bound<'py, PyAny>,
        op: &str,
        root: usize,
    ) -> PyResult<Bound<'py, PyAny>> {
        let op = op_of(op)?;
        let b = array(buf, "reduce_in_place", "buf", true)?;
        let m = b.mem;
        let me = self.comm.rank();
        // SAFETY: `b` holds the array for the call.
        self.run(buf.py(), |c| {
            let bytes = unsafe { m.bytes_mut() };
            if me == root {
                c.reduce_raw(bytes, m.dtype, op, root)
            } else {
                let mut tmp = bytes.to_vec();
                c.reduce_raw(&mut tmp, m.dtype, op, root)
            }
        })?;
        Ok(b.obj)
    }

    /// All-to-all: `input` holds `size` equal blocks (block j goes to rank j); `output`
    /// (allocated when None, shaped like `input`) receives block j from rank j. Returns `output`.
    #[pyo3(signature = (input, output = None))]
    fn all_to_all<'py>(
        &self,
        input: &Bound<'py, PyAny>,
        output: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        const C: &str = "all_to_all";
        let i = array(input, C, "input", false)?;
        let o = self::output(output, &i, shape_of(&i), C)?;
        same_type(C, &i.mem, &o.mem)?;
        count_is(C, "output", &o.mem, i.mem.count(), "as many as 'input'")?;
        let (im, om) = (i.mem, o.mem);
        // SAFETY: as in all_reduce_into.
        self.run(input.py(), |c| {
            c.all_to_all_raw(unsafe { im.bytes() }, unsafe { om.bytes_mut() }, im.dtype)
        })?;
        Ok(o.obj)
    }

    /// Send `buf` to rank `peer` (matched in order with that rank's `recv` from this rank).
    fn send(&self, buf: &Bound<'_, PyAny>, peer: usize) -> PyResult<()> {
        let b = array(buf, "send", "buf", false)?;
        let m = b.mem;
        // SAFETY: `b` holds the array for the call.
        self.run(buf.py(), |c| {
            c.send_raw(unsafe { m.bytes() }, peer, m.dtype)
        })
    }

    /// Receive `buf`'s size of elements from rank `peer` into `buf`. Returns `buf`.
    fn recv<'py>(&self, buf: &Bound<'py, PyAny>, peer: usize) -> PyResult<Bound<'py, PyAny>> {
        let b = array(buf, "recv", "buf", true)?;
        let m = b.mem;
        // SAFETY: `b` holds the array for the call.
        self.run(buf.py(), |c| {
            c.recv_raw(unsafe { m.bytes_mut() }, peer, m.dtype)
        })?;
        Ok(b.obj)
    }

    /// Send `send` to rank `dest` while receiving `recv` from rank `src` (no deadlock when
    /// ranks pair up). Returns `recv`.
    fn send_recv<'py>(
        &self,
        send: &Bound<'py, PyAny>,
        dest: usize,
        recv: &Bound<'py, PyAny>,
        src: usize,
    ) -> PyResult<Bound<'py, PyAny>> {
        const C: &str = "send_recv";
        let s = array(send, C, "send", false)?;
        let r = array(recv, C, "recv", true)?;
        same_type(C, &s.mem, &r.mem)?;
        let (sm, rm) = (s.mem, r.mem);
        // SAFETY: `s` and `r` hold the arrays for the call; they do not overlap (checked).
        self.run(send.py(), |c| {
            c.send_recv_raw(
                unsafe { sm.bytes() },
                dest,
                unsafe { rm.bytes_mut() },
                src,
                sm.dtype,
            )
        })?;
        Ok(r.obj)
    }

    /// Benchmark aid (not API): `iters` in-place all-reduces of `buf` run in a Rust loop behind
    /// one binding crossing — the baseline `examples/python/perf.py --paired` compares the
    /// Python call path against, in the same job, interleaved.
    #[pyo3(signature = (buf, iters, op = "sum"))]
    fn _repeat_all_reduce(&self, buf: &Bound<'_, PyAny>, iters: usize, op: &str) -> PyResult<()> {
        let op = op_of(op)?;
        let b = array(buf, "_repeat_all_reduce", "buf", true)?;
        let m = b.mem;
        // SAFETY: `b` holds the array for the call.
        self.run(buf.py(), |c| {
            let bytes = unsafe { m.bytes_mut() };
            for _ in 0..iters {
                c.all_reduce_raw(bytes, m.dtype, op)?;
            }
            Ok(())
        })
    }

    /// Wait until every rank has called `barrier`.
    fn barrier(&self, py: Python<'_>) -> PyResult<()> {
        self.run(py, |c| c.barrier())
    }

    /// Split like MPI_Comm_split: ranks passing the same `color` (an int >= 0) form a new
    /// communicator, ordered by (`key`, old rank). Every rank must call it; a rank passing
    /// `color=None` takes part but gets None.
    #[pyo3(signature = (color, key = 0))]
    fn split(&self, py: Python<'_>, color: Option<u32>, key: i64) -> PyResult<Option<PyComm>> {
        Ok(self.run(py, |c| c.split(color, key))?.map(PyComm::new))
    }

    // ---- started (non-blocking) calls ----

    /// Start an in-place all-reduce of `buf`; `Handle.wait()` returns `buf` reduced. Do not
    /// touch `buf` until then.
    #[pyo3(signature = (buf, op = "sum"))]
    fn all_reduce_start(&self, buf: &Bound<'_, PyAny>, op: &str) -> PyResult<Handle> {
        let op = op_of(op)?;
        let b = array(buf, "all_reduce_start", "buf", true)?;
        let m = b.mem;
        // SAFETY: `keep` holds the array until the worker is done with it (handle.rs).
        let p = unsafe {
            self.comm
                .all_reduce_start_ptr(m.ptr, m.len, m.dtype, op, keep(&[&b]))
        };
        Ok(Handle::new(p, Some(b.obj.unbind()), "all_reduce_start"))
    }

    /// Start an out-of-place all-reduce; `Handle.wait()` returns `output` (allocated when None).
    #[pyo3(signature = (input, output = None, op = "sum"))]
    fn all_reduce_into_start(
        &self,
        input: &Bound<'_, PyAny>,
        output: Option<&Bound<'_, PyAny>>,
        op: &str,
    ) -> PyResult<Handle> {
        const C: &str = "all_reduce_into_start";
        let op = op_of(op)?;
        let i = array(input, C, "input", false)?;
        let o = self::output(output, &i, shape_of(&i), C)?;
        same_type(C, &i.mem, &o.mem)?;
        count_is(C, "output", &o.mem, i.mem.count(), "as many as 'input'")?;
        let k = keep(&[&i, &o]);
        // SAFETY: `k` holds both arrays until the worker is done with them.
        let p = unsafe {
            self.comm
                .all_reduce_into_start_ptr(i.mem.ptr, o.mem.ptr, i.mem.len, i.mem.dtype, op, k)
        };
        Ok(Handle::new(p, Some(o.obj.unbind()), C))
    }

    /// Start an in-place reduce-scatter of `buf` (`size` equal blocks); `Handle.wait()` returns
    /// `buf`, whose block `rank` then holds the reduction.
    #[pyo3(signature = (buf, op = "sum"))]
    fn reduce_scatter_start(&self, buf: &Bound<'_, PyAny>, op: &str) -> PyResult<Handle> {
        let op = op_of(op)?;
        let b = array(buf, "reduce_scatter_start", "buf", true)?;
        let m = b.mem;
        // SAFETY: as in all_reduce_start.
        let p = unsafe {
            self.comm
                .reduce_scatter_start_ptr(m.ptr, m.len, m.dtype, op, keep(&[&b]))
        };
        Ok(Handle::new(p, Some(b.obj.unbind()), "reduce_scatter_start"))
    }

    /// Start an in-place all-gather of `buf` (`size` equal blocks, block `rank` this rank's).
    fn all_gather_start(&self, buf: &Bound<'_, PyAny>) -> PyResult<Handle> {
        let b = array(buf, "all_gather_start", "buf", true)?;
        let m = b.mem;
        // SAFETY: as in all_reduce_start.
        let p = unsafe {
            self.comm
                .all_gather_start_ptr(m.ptr, m.len, m.dtype, keep(&[&b]))
        };
        Ok(Handle::new(p, Some(b.obj.unbind()), "all_gather_start"))
    }

    /// Start a broadcast of `root`'s `buf` (in place).
    #[pyo3(signature = (buf, root = 0))]
    fn broadcast_start(&self, buf: &Bound<'_, PyAny>, root: usize) -> PyResult<Handle> {
        let b = array(buf, "broadcast_start", "buf", true)?;
        let m = b.mem;
        // SAFETY: as in all_reduce_start.
        let p = unsafe {
            self.comm
                .broadcast_start_ptr(m.ptr, m.len, m.dtype, root, keep(&[&b]))
        };
        Ok(Handle::new(p, Some(b.obj.unbind()), "broadcast_start"))
    }

    /// Start an in-place reduce to `root` (other ranks' `buf` is scratch).
    #[pyo3(signature = (buf, op = "sum", root = 0))]
    fn reduce_start(&self, buf: &Bound<'_, PyAny>, op: &str, root: usize) -> PyResult<Handle> {
        let op = op_of(op)?;
        let b = array(buf, "reduce_start", "buf", true)?;
        let m = b.mem;
        // SAFETY: as in all_reduce_start.
        let p = unsafe {
            self.comm
                .reduce_start_ptr(m.ptr, m.len, m.dtype, op, root, keep(&[&b]))
        };
        Ok(Handle::new(p, Some(b.obj.unbind()), "reduce_start"))
    }

    /// Start an all-to-all; `Handle.wait()` returns `output` (allocated when None).
    #[pyo3(signature = (input, output = None))]
    fn all_to_all_start(
        &self,
        input: &Bound<'_, PyAny>,
        output: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Handle> {
        const C: &str = "all_to_all_start";
        let i = array(input, C, "input", false)?;
        let o = self::output(output, &i, shape_of(&i), C)?;
        same_type(C, &i.mem, &o.mem)?;
        count_is(C, "output", &o.mem, i.mem.count(), "as many as 'input'")?;
        let k = keep(&[&i, &o]);
        // SAFETY: `k` holds both arrays until the worker is done with them.
        let p = unsafe {
            self.comm
                .all_to_all_start_ptr(i.mem.ptr, o.mem.ptr, i.mem.len, i.mem.dtype, k)
        };
        Ok(Handle::new(p, Some(o.obj.unbind()), C))
    }

    /// Start a barrier; `Handle.wait()` returns None.
    fn barrier_start(&self) -> Handle {
        Handle::new(self.comm.barrier_start(), None, "barrier_start")
    }
}

//! MPI as a [`perf::Backend`](crate::perf::Backend): the peer `mpiperf` measures, with the same
//! driver, table, JSON and element-by-element checks as railperf (cargo feature `mpi`).
//!
//! Every call is one real MPI collective on `MPI_COMM_WORLD`:
//!
//! | collective    | out-of-place                         | in-place (`MPI_IN_PLACE`)                     |
//! |---------------|--------------------------------------|-----------------------------------------------|
//! | allreduce     | `MPI_Allreduce`                      | `MPI_Allreduce(MPI_IN_PLACE, buf)`            |
//! | reducescatter | `MPI_Reduce_scatter_block`           | same with `MPI_IN_PLACE`; the result (MPI puts it at the start of the buffer) is moved to this rank's block, where the driver (and NCCL) expect it |
//! | allgather     | `MPI_Allgather`                      | `MPI_Allgather(MPI_IN_PLACE, buf)`            |
//! | broadcast     | root copies input to output, `MPI_Bcast` | `MPI_Bcast`                               |
//! | reduce        | `MPI_Reduce`                         | root: `MPI_Reduce(MPI_IN_PLACE, buf)`         |
//! | alltoall      | `MPI_Alltoall`                       | `MPI_Alltoall(MPI_IN_PLACE, buf)`             |
//! | sendrecv      | `MPI_Sendrecv` (to rank+1, from rank-1) | `MPI_Sendrecv_replace`                     |
//!
//! Out-of-place calls go through the mpi crate (`all_reduce_into` with a `SystemOperation`,
//! `reduce_scatter_block_into`, ...); the crate has no `MPI_IN_PLACE`, so in-place calls use its
//! raw bindings with the implementation's `MPI_IN_PLACE` value (`(void*)1` in Open MPI,
//! `(void*)-1` in MPICH and its derivatives, told apart by `MPI_Get_library_version`). With an
//! MPI that is neither, in-place calls copy the buffer and run out-of-place (the preamble says so).
//!
//! Types: MPI's native int8/uint8/int32/uint32/int64/uint64/float/double. MPI has no native
//! half or bfloat16 type: those are reported as unsupported (a clear error, or skipped with a
//! note for `-d all` in mpiperf). Ops: `MPI_SUM`, `MPI_PROD`, `MPI_MIN`, `MPI_MAX`; **avg** has no
//! MPI operation, so it is `MPI_SUM` followed by a division by the rank count on the ranks that
//! hold a result (like NCCL's reference for `ncclAvg`), with railring's own division kernel so
//! both libraries round the same way. Non-blocking mode (`-z 0`) is the same as blocking here:
//! the iterations are issued back to back.

use crate::perf::{Backend, Call, Coll};
use mpi::collective::{CommunicatorCollectives, Root, SystemOperation};
use mpi::datatype::{DatatypeRef, Equivalence, MutView, View};
use mpi::environment::Universe;
use mpi::point_to_point as p2p;
use mpi::raw::AsRaw;
use mpi::topology::{Communicator as _, SimpleCommunicator};
use railring::{DataType, ReduceOp};
use railring_collectives::kernels;
use std::os::raw::{c_int, c_void};

/// MPI (`MPI_COMM_WORLD`) as a benchmark backend. Owns MPI: dropping it finalizes MPI.
pub struct Mpi {
    world: SimpleCommunicator,
    in_place: Option<*mut c_void>,
    library: String,
    // Last: MPI_Finalize after everything else.
    _universe: Universe,
}

/// MPI's native datatype for a railring type; `Err` for f16 / bf16.
pub fn datatype(d: DataType) -> Result<DatatypeRef<'static>, String> {
    Ok(match d {
        DataType::I8 => i8::equivalent_datatype(),
        DataType::U8 => u8::equivalent_datatype(),
        DataType::I32 => i32::equivalent_datatype(),
        DataType::U32 => u32::equivalent_datatype(),
        DataType::I64 => i64::equivalent_datatype(),
        DataType::U64 => u64::equivalent_datatype(),
        DataType::F32 => f32::equivalent_datatype(),
        DataType::F64 => f64::equivalent_datatype(),
        DataType::F16 | DataType::Bf16 => return Err(unsupported(d)),
    })
}

/// Whether MPI has a native datatype for `d`.
pub fn supported(d: DataType) -> bool {
    !matches!(d, DataType::F16 | DataType::Bf16)
}

fn unsupported(d: DataType) -> String {
    format!(
        "MPI has no native {} datatype (MPI_Allreduce cannot reduce it without a user-defined type and op, \
         which would not be a fair peer); use -d float, double, int8, uint8, int32, uint32, int64 or uint64",
        d.name()
    )
}

fn operation(op: ReduceOp) -> SystemOperation {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => SystemOperation::sum(),
        ReduceOp::Prod => SystemOperation::product(),
        ReduceOp::Min => SystemOperation::min(),
        ReduceOp::Max => SystemOperation::max(),
    }
}

fn count(bytes: usize, d: DataType) -> Result<c_int, String> {
    c_int::try_from(bytes / d.size()).map_err(|_| {
        format!(
            "{bytes} bytes of {} is more elements than MPI's int count allows",
            d.name()
        )
    })
}

fn rc(what: &str, r: c_int) -> Result<(), String> {
    if r == 0 {
        Ok(())
    } else {
        Err(format!("{what} failed with MPI error {r}"))
    }
}

impl Mpi {
    /// Initialize MPI (`MPI_Init`). Fails when MPI was already initialized in this process.
    #[allow(clippy::manual_dangling_ptr)] // MPI_IN_PLACE *is* the address 1 (Open MPI) or -1 (MPICH)
    pub fn init() -> Result<Mpi, String> {
        let universe = mpi::initialize().ok_or("MPI was already initialized in this process")?;
        let world = universe.world();
        let library = mpi::environment::library_version()
            .map(|s| {
                // "Open MPI v4.1.4, package: ..." / "MPICH Version: 4.0 ...": the first phrase
                let s = s.replace('\0', "");
                let first = s
                    .lines()
                    .next()
                    .unwrap_or("")
                    .split(',')
                    .next()
                    .unwrap_or("")
                    .trim();
                first.chars().take(60).collect::<String>()
            })
            .unwrap_or_else(|_| "MPI".into());
        // MPI_IN_PLACE is a macro (a special address) the mpi crate does not export.
        let in_place = if library.contains("Open MPI") {
            Some(1usize as *mut c_void)
        } else if ["MPICH", "Intel(R) MPI", "MVAPICH", "CRAY MPICH"]
            .iter()
            .any(|s| library.contains(s))
        {
            Some(usize::MAX as *mut c_void)
        } else {
            None
        };
        Ok(Mpi {
            world,
            in_place,
            library,
            _universe: universe,
        })
    }

    pub fn library(&self) -> &str {
        &self.library
    }

    fn n(&self) -> usize {
        self.world.size() as usize
    }
    fn me(&self) -> usize {
        self.world.rank() as usize
    }

    /// One out-of-place call through the mpi crate. `out` receives the result in the driver's
    /// layout (reduce-scatter: this rank's block at the start).
    fn out_of_place(
        &self,
        c: Coll,
        dt: DataType,
        op: ReduceOp,
        root: usize,
        input: &[u8],
        out: &mut [u8],
    ) -> Result<(), String> {
        let d = datatype(dt)?;
        let (n, me) = (self.n(), self.me());
        let w = &self.world;
        // SAFETY (all views): `d` describes `dt`, whose size divides the byte counts given.
        unsafe {
            match c {
                Coll::AllReduce => {
                    let s = View::with_count_and_datatype(input, count(input.len(), dt)?, &d);
                    let mut r = MutView::with_count_and_datatype(out, count(input.len(), dt)?, &d);
                    w.all_reduce_into(&s, &mut r, operation(op));
                }
                Coll::ReduceScatter => {
                    let per = input.len() / n;
                    let s = View::with_count_and_datatype(input, count(per * n, dt)?, &d);
                    let mut r =
                        MutView::with_count_and_datatype(&mut out[..per], count(per, dt)?, &d);
                    w.reduce_scatter_block_into(&s, &mut r, operation(op));
                }
                Coll::AllGather => {
                    let s = View::with_count_and_datatype(input, count(input.len(), dt)?, &d);
                    let mut r = MutView::with_count_and_datatype(out, count(out.len(), dt)?, &d);
                    w.all_gather_into(&s, &mut r);
                }
                Coll::Broadcast => {
                    if me == root {
                        out.copy_from_slice(input);
                    }
                    let k = count(out.len(), dt)?;
                    let mut b = MutView::with_count_and_datatype(out, k, &d);
                    w.process_at_rank(root as i32).broadcast_into(&mut b);
                }
                Coll::Reduce => {
                    let k = count(input.len(), dt)?;
                    let s = View::with_count_and_datatype(input, k, &d);
                    let rp = w.process_at_rank(root as i32);
                    if me == root {
                        let mut r = MutView::with_count_and_datatype(out, k, &d);
                        rp.reduce_into_root(&s, &mut r, operation(op));
                    } else {
                        rp.reduce_into(&s, operation(op));
                    }
                }
                Coll::AllToAll => {
                    let k = count(input.len(), dt)?;
                    let s = View::with_count_and_datatype(input, k, &d);
                    let mut r = MutView::with_count_and_datatype(out, k, &d);
                    w.all_to_all_into(&s, &mut r);
                }
                Coll::SendRecv => {
                    let k = count(input.len(), dt)?;
                    let s = View::with_count_and_datatype(input, k, &d);
                    let mut r = MutView::with_count_and_datatype(out, k, &d);
                    let next = w.process_at_rank(((me + 1) % n) as i32);
                    let prev = w.process_at_rank(((me + n - 1) % n) as i32);
                    p2p::send_receive_into(&s, &next, &mut r, &prev);
                }
            }
        }
        Ok(())
    }

    /// One in-place call with `MPI_IN_PLACE` (raw bindings).
    fn in_place(
        &self,
        ip: *mut c_void,
        c: Coll,
        dt: DataType,
        op: ReduceOp,
        root: usize,
        buf: &mut [u8],
    ) -> Result<(), String> {
        use mpi::ffi;
        let d = datatype(dt)?.as_raw();
        let o = operation(op).as_raw();
        let comm = self.world.as_raw();
        let (n, me) = (self.n(), self.me());
        let p = buf.as_mut_ptr() as *mut c_void;
        // SAFETY: `buf` is valid for its length; counts are derived from it; MPI_IN_PLACE is the
        // implementation's own value (see `init`).
        unsafe {
            match c {
                Coll::AllReduce => rc(
                    "MPI_Allreduce",
                    ffi::MPI_Allreduce(ip, p, count(buf.len(), dt)?, d, o, comm),
                ),
                Coll::ReduceScatter => {
                    let per = buf.len() / n;
                    rc(
                        "MPI_Reduce_scatter_block",
                        ffi::MPI_Reduce_scatter_block(ip, p, count(per, dt)?, d, o, comm),
                    )?;
                    buf.copy_within(0..per, me * per);
                    Ok(())
                }
                Coll::AllGather => {
                    let per = count(buf.len() / n, dt)?;
                    rc(
                        "MPI_Allgather",
                        ffi::MPI_Allgather(ip, 0, d, p, per, d, comm),
                    )
                }
                Coll::Broadcast => rc(
                    "MPI_Bcast",
                    ffi::MPI_Bcast(p, count(buf.len(), dt)?, d, root as c_int, comm),
                ),
                Coll::Reduce => {
                    let k = count(buf.len(), dt)?;
                    if me == root {
                        rc(
                            "MPI_Reduce",
                            ffi::MPI_Reduce(ip, p, k, d, o, root as c_int, comm),
                        )
                    } else {
                        rc(
                            "MPI_Reduce",
                            ffi::MPI_Reduce(p, std::ptr::null_mut(), k, d, o, root as c_int, comm),
                        )
                    }
                }
                Coll::AllToAll => {
                    let per = count(buf.len() / n, dt)?;
                    rc("MPI_Alltoall", ffi::MPI_Alltoall(ip, 0, d, p, per, d, comm))
                }
                Coll::SendRecv => {
                    let k = count(buf.len(), dt)?;
                    let mut st = std::mem::MaybeUninit::<ffi::MPI_Status>::uninit();
                    rc(
                        "MPI_Sendrecv_replace",
                        ffi::MPI_Sendrecv_replace(
                            p,
                            k,
                            d,
                            ((me + 1) % n) as c_int,
                            0,
                            ((me + n - 1) % n) as c_int,
                            0,
                            comm,
                            st.as_mut_ptr(),
                        ),
                    )
                }
            }
        }
    }

    /// Avg = sum, then divide where a result is.
    fn finish_avg(&self, c: Coll, dt: DataType, root: usize, out: &mut [u8], inplace: bool) {
        let (n, me) = (self.n(), self.me());
        match c {
            Coll::AllReduce => kernels::finish_avg(dt, out, n),
            Coll::Reduce if me == root => kernels::finish_avg(dt, out, n),
            Coll::ReduceScatter => {
                let per = out.len() / n;
                let at = if inplace { me * per } else { 0 };
                kernels::finish_avg(dt, &mut out[at..at + per], n);
            }
            _ => {}
        }
    }
}

impl Backend for Mpi {
    fn name(&self) -> String {
        "mpi".into()
    }
    fn rank(&self) -> usize {
        self.me()
    }
    fn size(&self) -> usize {
        self.n()
    }
    fn call(&self, call: &Call, input: Option<&[u8]>, output: &mut [u8]) -> Result<(), String> {
        let Call {
            coll: c,
            dtype,
            op,
            root,
        } = *call;
        datatype(dtype)?;
        match (input, self.in_place) {
            (Some(i), _) => self.out_of_place(c, dtype, op, root, i, output)?,
            (None, Some(ip)) => self.in_place(ip, c, dtype, op, root, output)?,
            (None, None) => {
                // No known MPI_IN_PLACE: emulate with a copy.
                let tmp = output.to_vec();
                let inp: &[u8] = match c {
                    Coll::AllGather => {
                        let per = tmp.len() / self.n();
                        &tmp[self.me() * per..(self.me() + 1) * per]
                    }
                    _ => &tmp,
                };
                self.out_of_place(c, dtype, op, root, inp, output)?;
                if c == Coll::ReduceScatter {
                    let per = output.len() / self.n();
                    output.copy_within(0..per, self.me() * per);
                }
            }
        }
        if op == ReduceOp::Avg {
            self.finish_avg(c, dtype, root, output, input.is_none());
        }
        Ok(())
    }
    fn barrier(&self) -> Result<(), String> {
        self.world.barrier();
        Ok(())
    }
    fn reduce_f64(&self, v: f64, op: ReduceOp) -> Result<f64, String> {
        let mut r = 0f64;
        self.world.all_reduce_into(&v, &mut r, operation(op));
        if op == ReduceOp::Avg {
            r /= self.n() as f64;
        }
        Ok(r)
    }
    fn gather_lines(&self, line: &str) -> Result<Vec<String>, String> {
        let mut mine = [0u8; 160];
        let lb = line.as_bytes();
        let k = lb.len().min(160);
        mine[..k].copy_from_slice(&lb[..k]);
        let root = self.world.process_at_rank(0);
        if self.me() != 0 {
            root.gather_into(&mine[..]);
            return Ok(vec![]);
        }
        let mut all = vec![0u8; 160 * self.n()];
        root.gather_into_root(&mine[..], &mut all[..]);
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
        format!(
            "{}, heap buffers, in-place {}",
            self.library,
            if self.in_place.is_some() {
                "via MPI_IN_PLACE"
            } else {
                "emulated by a copy (unknown MPI_IN_PLACE)"
            }
        )
    }
}

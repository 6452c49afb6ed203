//! railring as a [`Backend`]: each collective through the communicator's raw-byte calls
//! (blocking, `-z 1`), or through its non-blocking `*_start` calls (`-z 0`, the default): every
//! timed iteration is started first, then all are waited for ([`Railring::calls`]).
//!
//! The `*_start` calls take owned, typed buffers, so the non-blocking mode keeps a pool of
//! such buffers per output buffer (made during the warm-up, from the prepared data, as many as
//! the timed batch will use: [`Backend::expect_calls`]): at most [`NONBLOCKING_BUDGET`] bytes
//! and [`NONBLOCKING_MAX_CALLS`] calls of them, so large sizes have fewer calls in flight (one
//! at 4 MiB and up); when the window is full the older half is waited for at once. Out of
//! place, all-reduce, all-gather, reduce and all-to-all go through their `*_into_start` calls,
//! each on a pooled (input, output) pair whose input was copied once (an out-of-place call
//! leaves it untouched), so the input is read where it is, as blocking calls read theirs;
//! reduce-scatter and broadcast have no out-of-place non-blocking form and work on a buffer
//! that first gets a copy of the input (their blocking calls here go out of place:
//! `reduce_scatter_into_raw`, `broadcast_into_raw`). The last call's result is copied to
//! the output once per batch, so the checked run goes through this mode too.
//! `sendrecv` has no non-blocking call: it is timed with blocking calls, and the table's
//! header says so.

use super::{run_with, Backend, Call, Coll, Options};
use railring::{DataType, Element, Pending, ReduceOp};
use railring_collectives::{as_bytes, as_bytes_mut};
use std::any::Any;
use std::cell::RefCell;

/// Most bytes of owned buffers the non-blocking mode keeps in flight: about what a core's share
/// of the last-level cache holds, so the buffers cycled through stay cached as the one buffer of
/// nccl-tests' stream-ordered calls (or of a blocking run) does. With 64 MiB the calls read and
/// wrote cold memory: 2 ranks, all-reduce 2 MiB, 441-518 / 250-384 µs against 253-271 / 146-174
/// with 4 MiB (16 MiB: 6.4-10.1 ms against 5.1 out of place).
pub const NONBLOCKING_BUDGET: usize = 4 << 20;
/// Most calls the non-blocking mode keeps in flight (as a GPU stream's launch queue bounds
/// nccl-tests': more only grows the queue of pending buffers and results).
pub const NONBLOCKING_MAX_CALLS: usize = 1024;

/// Owned buffers of the non-blocking mode, keyed by the addresses of the (input, output)
/// buffers they were made for (input 0: in place).
type BufferPool = ((usize, usize), Box<dyn Any>);

/// railring as a [`Backend`].
pub struct Railring {
    pub comm: railring::Communicator,
    /// The owned buffers of the non-blocking mode ([`Railring::pooled`]): `Vec<Vec<T>>` for
    /// in-place calls, `Vec<(Vec<T>, Vec<T>)>` (input, output) for out-of-place `*_into_start`
    /// calls, with the addresses of the (input, output) buffers they were made for.
    pool: RefCell<Option<BufferPool>>,
    /// The most calls one batch will make ([`Backend::expect_calls`]): the warm-up makes the
    /// pool that large, so the timed batch allocates nothing.
    expected: std::cell::Cell<usize>,
}

impl Railring {
    pub fn new(comm: railring::Communicator) -> Railring {
        Railring {
            comm,
            pool: RefCell::new(None),
            expected: std::cell::Cell::new(0),
        }
    }

    /// How many calls may be in flight for buffers of `bytes`.
    pub fn window(iters: usize, bytes: usize) -> usize {
        (NONBLOCKING_BUDGET / bytes.max(1)).clamp(1, iters.clamp(1, NONBLOCKING_MAX_CALLS))
    }

    /// The pooled owned buffers of type `P` for the buffers at `key` (made by `make` unless the
    /// pool has fitting ones: `fits`). Emptied by [`Backend::expect_calls`] before each
    /// measurement: within one, a buffer's address names its contents (the timed buffers and
    /// the checked run's are different buffers, alive together).
    fn pooled<P: 'static>(
        &self,
        key: (usize, usize),
        fits: impl Fn(&P) -> bool,
        make: impl FnOnce() -> P,
    ) -> Result<std::cell::RefMut<'_, P>, String> {
        let mut slot = self.pool.borrow_mut();
        let ok = slot
            .as_ref()
            .filter(|(k, _)| *k == key)
            .and_then(|(_, b)| b.downcast_ref::<P>())
            .is_some_and(fits);
        if !ok {
            *slot = Some((key, Box::new(make())));
        }
        std::cell::RefMut::filter_map(slot, |s| {
            s.as_mut().and_then(|(_, b)| b.downcast_mut::<P>())
        })
        .map_err(|_| "non-blocking buffer pool".to_string())
    }

    /// `iters` calls started by `start` on owned buffers taken from `free`: up to the pool's
    /// size of them in flight; when none is free, wait for the older half, the newest of them
    /// first (calls end in order, so the rest are done by then): this thread sleeps once per
    /// half window instead of once per call, and leaves the CPU to the calls meanwhile. At the
    /// end the last call is waited for first (one wake-up per batch) and its buffer returned;
    /// every other buffer goes back to `free`.
    fn windowed<B>(
        iters: usize,
        free: &mut Vec<B>,
        mut start: impl FnMut(B) -> Result<Pending<B>, String>,
    ) -> Result<Option<B>, String> {
        let e = |e: railring::Error| e.to_string();
        let mut inflight: std::collections::VecDeque<Pending<B>> = Default::default();
        for _ in 0..iters {
            if free.is_empty() {
                let k = inflight.len().div_ceil(2);
                let mut older: Vec<Pending<B>> = inflight.drain(..k).collect();
                let newest = older.pop().ok_or("no call in flight")?;
                free.push(newest.wait().map_err(e)?);
                for p in older {
                    free.push(p.wait().map_err(e)?);
                }
            }
            let b = free.pop().ok_or("no buffer")?;
            inflight.push_back(start(b)?);
        }
        let mut inflight: Vec<Pending<B>> = inflight.into();
        let last = match inflight.pop() {
            Some(p) => Some(p.wait().map_err(e)?),
            None => None,
        };
        for p in inflight {
            free.push(p.wait().map_err(e)?);
        }
        Ok(last)
    }

    /// `iters` calls through the `*_start` API on owned `Vec<T>` buffers ([`Self::windowed`],
    /// at most [`Railring::window`] in flight).
    fn start_all<T: Element>(
        &self,
        iters: usize,
        call: &Call,
        input: Option<&[u8]>,
        out: &mut [u8],
    ) -> Result<(), String> {
        let n = out.len() / std::mem::size_of::<T>();
        let window = Railring::window(iters, out.len());
        let pool_len = Railring::window(iters.max(self.expected.get()), out.len());
        let mut pool = self.pooled(
            (0, out.as_ptr() as usize),
            |p: &Vec<Vec<T>>| p.len() >= window && p.first().is_none_or(|v| v.len() == n),
            // In place, every buffer starts as the prepared data (later calls reuse results).
            || (0..pool_len).map(|_| owned::<T>(out, n)).collect(),
        )?;
        let mut free: Vec<Vec<T>> = std::mem::take(&mut *pool);
        let Call { op, root, .. } = *call;
        let last = Self::windowed(iters, &mut free, |mut buf| {
            if let Some(i) = input {
                fill(&mut buf, i);
            }
            Ok(match call.coll {
                Coll::AllReduce => self.comm.all_reduce_start(buf, op),
                Coll::ReduceScatter => self.comm.reduce_scatter_start(buf, op),
                Coll::AllGather => self.comm.all_gather_start(buf),
                Coll::Broadcast => self.comm.broadcast_start(buf, root),
                Coll::Reduce => self.comm.reduce_start(buf, op, root),
                Coll::AllToAll => self.comm.all_to_all_start(buf),
                Coll::SendRecv => return Err("sendrecv has no non-blocking call".into()),
            })
        })?;
        // The last call's result is the output (one copy per batch of calls), so a checked
        // run of this mode is checked like a blocking one.
        if let Some(b) = last {
            copy_out(out, &b);
            free.push(b);
        }
        *pool = free;
        Ok(())
    }

    /// [`Railring::start_all`] for an out-of-place call that has a non-blocking out-of-place
    /// form (`*_into_start`: all-reduce, all-gather, reduce, all-to-all): each call reads an
    /// owned copy of `input` where it is, as the blocking call reads `input`, instead of first
    /// copying it into the buffer it works on. The copies are made with the pool, once per
    /// measurement: an out-of-place call leaves its input unchanged.
    fn start_all_into<T: Element>(
        &self,
        iters: usize,
        call: &Call,
        input: &[u8],
        out: &mut [u8],
    ) -> Result<(), String> {
        let size_t = std::mem::size_of::<T>();
        let (ni, no) = (input.len() / size_t, out.len() / size_t);
        let per_call = input.len() + out.len();
        let window = Railring::window(iters, per_call);
        let pool_len = Railring::window(iters.max(self.expected.get()), per_call);
        let mut pool = self.pooled(
            (input.as_ptr() as usize, out.as_ptr() as usize),
            |p: &Vec<(Vec<T>, Vec<T>)>| {
                p.len() >= window && p.iter().all(|(i, o)| i.len() == ni && o.len() == no)
            },
            || {
                (0..pool_len)
                    .map(|_| (owned::<T>(input, ni), owned::<T>(out, no)))
                    .collect()
            },
        )?;
        let mut free: Vec<(Vec<T>, Vec<T>)> = std::mem::take(&mut *pool);
        let Call { op, root, .. } = *call;
        let last = Self::windowed(iters, &mut free, |(i, o)| {
            Ok(match call.coll {
                Coll::AllReduce => self.comm.all_reduce_into_start(i, o, op),
                Coll::AllGather => self.comm.all_gather_into_start(i, o),
                Coll::Reduce => self.comm.reduce_into_start(i, o, op, root),
                Coll::AllToAll => self.comm.all_to_all_into_start(i, o),
                c => return Err(format!("{c:?} has no out-of-place non-blocking call")),
            })
        })?;
        // the last call's output is the result (see start_all)
        if let Some((i, o)) = last {
            copy_out(out, &o);
            free.push((i, o));
        }
        *pool = free;
        Ok(())
    }
}

/// `n` elements holding the first bytes of `src` (zeros past its end).
fn owned<T: Element>(src: &[u8], n: usize) -> Vec<T> {
    let mut v = vec![T::default(); n];
    fill(&mut v, src);
    v
}

/// Copy as much of `src` as fits into `buf`'s bytes.
fn fill<T: Element>(buf: &mut [T], src: &[u8]) {
    let b = as_bytes_mut(buf);
    let k = src.len().min(b.len());
    b[..k].copy_from_slice(&src[..k]);
}

/// Copy as much of `buf`'s bytes as fits into `out`.
fn copy_out<T: Element>(out: &mut [u8], buf: &[T]) {
    let b = as_bytes(buf);
    let k = out.len().min(b.len());
    out[..k].copy_from_slice(&b[..k]);
}

/// `$body` with the element type `$t` of `$dtype`.
macro_rules! by_dtype {
    ($dtype:expr, $t:ident => $body:expr) => {
        match $dtype {
            DataType::I8 => {
                type $t = i8;
                $body
            }
            DataType::U8 => {
                type $t = u8;
                $body
            }
            DataType::I32 => {
                type $t = i32;
                $body
            }
            DataType::U32 => {
                type $t = u32;
                $body
            }
            DataType::I64 => {
                type $t = i64;
                $body
            }
            DataType::U64 => {
                type $t = u64;
                $body
            }
            DataType::F16 => {
                type $t = half::f16;
                $body
            }
            DataType::Bf16 => {
                type $t = half::bf16;
                $body
            }
            DataType::F32 => {
                type $t = f32;
                $body
            }
            DataType::F64 => {
                type $t = f64;
                $body
            }
        }
    };
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
                // out of place: this rank's block of the reduction at the start of `out`
                Some(i) => {
                    let b = out.len() / n;
                    self.comm
                        .reduce_scatter_into_raw(i, &mut out[..b], dtype, op)
                        .map_err(e)
                }
                None => self.comm.reduce_scatter_raw(out, dtype, op).map_err(e),
            },
            Coll::AllGather => match input {
                Some(i) => self.comm.all_gather_into_raw(i, out, dtype).map_err(e),
                None => self.comm.all_gather_raw(out, dtype).map_err(e),
            },
            Coll::Broadcast => match input {
                Some(i) => self.comm.broadcast_into_raw(i, out, dtype, root).map_err(e),
                None => self.comm.broadcast_raw(out, dtype, root).map_err(e),
            },
            Coll::Reduce => match input {
                Some(i) => self
                    .comm
                    .reduce_into_raw(i, out, dtype, op, root)
                    .map_err(e),
                None => self.comm.reduce_raw(out, dtype, op, root).map_err(e),
            },
            Coll::AllToAll => match input {
                Some(i) => self.comm.all_to_all_raw(i, out, dtype).map_err(e),
                None => self.comm.all_to_all_in_place_raw(out, dtype).map_err(e),
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
    fn calls(
        &self,
        iters: usize,
        call: &Call,
        input: Option<&[u8]>,
        output: &mut [u8],
    ) -> Result<(), String> {
        if call.coll == Coll::SendRecv {
            for _ in 0..iters {
                self.call(call, input, output)?;
            }
            return Ok(());
        }
        // Out of place with a non-blocking out-of-place call: the input is read where it is.
        if let (Some(i), Coll::AllReduce | Coll::AllGather | Coll::Reduce | Coll::AllToAll) =
            (input, call.coll)
        {
            return by_dtype!(call.dtype, T => self.start_all_into::<T>(iters, call, i, output));
        }
        // The input of an out-of-place call in its in-place form: what `call` would reduce.
        let input = match (call.coll, input) {
            (Coll::AllGather, Some(i)) => {
                // this rank's block at its place in the output
                let me = self.comm.rank();
                let mut v = output.to_vec();
                v[me * i.len()..(me + 1) * i.len()].copy_from_slice(i);
                Some(v)
            }
            // only the root's input matters
            (Coll::Broadcast, Some(_)) if self.comm.rank() != call.root => None,
            (_, Some(i)) => Some(i.to_vec()),
            (_, None) => None,
        };
        let oop = input.is_some();
        let input = input.as_deref();
        let out = &mut *output;
        let r = by_dtype!(call.dtype, T => self.start_all::<T>(iters, call, input, out));
        if r.is_ok() && oop && call.coll == Coll::ReduceScatter {
            // out of place, this rank's block goes first (as the blocking form leaves it)
            let n = self.comm.size();
            let b = output.len() / n;
            let me = self.comm.rank();
            output.copy_within(me * b..(me + 1) * b, 0);
        }
        r
    }
    fn expect_calls(&self, iters: usize) {
        self.expected.set(iters);
        self.pool.borrow_mut().take();
    }
    fn calls_label(&self, coll: Coll) -> String {
        if coll == Coll::SendRecv {
            return "blocking calls: sendrecv has no non-blocking call".into();
        }
        format!(
            "non-blocking calls: every iteration started with *_start, then waited for; at most {} MiB of buffers in flight",
            NONBLOCKING_BUDGET >> 20
        )
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

/// Run railperf over railring. With `RAILRING_STRAGGLER` set, rank 0 ends with the per-rank
/// view of the last calls: who arrived last, how late, and how long each rank waited.
pub fn run(o: &Options) -> Result<u64, String> {
    let comm = railring::Communicator::init().map_err(|e| e.to_string())?;
    let be = Railring::new(comm);
    let wrong = run_with(&be, o)?;
    if be.comm.straggler_every() > 0 {
        let rows = be.comm.stragglers().map_err(|e| e.to_string())?;
        if be.comm.rank() == 0 {
            let calls = rows.first().map(|r| r.calls).unwrap_or(0);
            print!(
                "# Arrival per rank over the last {calls} calls (late: behind the first rank, when last; wait: for the last rank)\n{}#\n",
                railring::comm::straggler::table(&rows)
            );
        }
    }
    Ok(wrong)
}

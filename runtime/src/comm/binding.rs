//! What language bindings need beyond [`raw`](super::raw): non-blocking collectives on memory the
//! caller owns (raw pointers guarded by a keep-alive owner) and one-sided `send`/`recv` on bytes.
//!
//! The typed `*_start` calls take owned `Vec`s, which a binding cannot hand over without copying
//! (a numpy array's memory belongs to the array). The calls here take pointers instead, plus a
//! `keep` value that owns whatever keeps that memory alive (for the Python binding: strong
//! references to the arrays). The worker thread drops `keep` only after the collective has
//! finished with the memory — whether or not anyone waits for the [`Pending`] — so dropping the
//! handle early can never turn into a write to freed memory.
//!
//! Hidden from the documentation: these are for bindings, and their contracts are `unsafe`.

use super::Communicator;
use super::Pending;
use crate::error::{Error, Result};
use railring_collectives::{DataType, ReduceOp};

/// Memory a started call reads or writes, with what keeps it alive. Sent to the worker thread.
struct Region {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: a `Region` is only created by the `unsafe` start functions below, whose callers promise
// that the memory stays valid and unaliased until the call finishes (while `keep` lives); the
// worker thread is then the only user of the pointer.
unsafe impl Send for Region {}

impl Region {
    /// # Safety
    /// `ptr..ptr+len` valid for writes, and not accessed by anyone else, for `'a`.
    unsafe fn bytes_mut<'a>(&self) -> &'a mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: by the caller's promise (see the start functions' contracts).
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
    /// # Safety
    /// `ptr..ptr+len` valid for reads, and not written by anyone else, for `'a`.
    unsafe fn bytes<'a>(&self) -> &'a [u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: by the caller's promise.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
    fn overlaps(&self, other: &Region) -> bool {
        let (a, b) = (self.ptr as usize, other.ptr as usize);
        self.len > 0 && other.len > 0 && a < b + other.len && b < a + self.len
    }
}

/// What keeps a started call's memory alive; dropped on the worker thread after the call.
pub type KeepAlive = Box<dyn Send>;

fn whole(len: usize, dtype: DataType) -> Result<()> {
    if !len.is_multiple_of(dtype.size()) {
        return Err(Error::Invalid(format!(
            "{len} bytes is not a whole number of {dtype} elements"
        )));
    }
    Ok(())
}

/// A started call that failed its argument checks before it was queued.
fn failed(e: Error) -> Pending<()> {
    Pending::done(Err(e))
}

/// Started collectives on caller-owned memory, for language bindings.
///
/// # Safety (every function here)
/// Each pointer must be valid for `len` bytes (reads for inputs, writes for outputs) and must
/// not be read or written by anyone else from the call until the collective has finished, that is
/// until the worker thread drops `keep`. The caller makes `keep` own whatever keeps the memory
/// alive; the worker drops it after the call whether or not the [`Pending`] is waited for.
/// Inputs and outputs may not overlap (checked: overlapping regions fail the call).
#[doc(hidden)]
impl Communicator {
    /// Check that `len` is whole elements of `dtype`, then run `f` on the caller's `len` bytes at
    /// `buf` in call order, dropping `keep` after it.
    ///
    /// # Safety
    /// See the impl block.
    unsafe fn in_place(
        &self,
        buf: *mut u8,
        len: usize,
        dtype: DataType,
        keep: KeepAlive,
        f: impl FnOnce(&mut super::call::Inner, &mut [u8]) -> Result<()> + Send + 'static,
    ) -> Pending<()> {
        if let Err(e) = whole(len, dtype) {
            return failed(e);
        }
        let b = Region { ptr: buf, len };
        self.submit(move |g| {
            let _keep = keep;
            // SAFETY: the caller's contract.
            f(g, unsafe { b.bytes_mut() })
        })
    }

    /// In-place all-reduce of `len` bytes at `buf`.
    ///
    /// # Safety
    /// See the impl block: `buf` valid and unshared until `keep` is dropped.
    pub unsafe fn all_reduce_start_ptr(
        &self,
        buf: *mut u8,
        len: usize,
        dtype: DataType,
        op: ReduceOp,
        keep: KeepAlive,
    ) -> Pending<()> {
        // SAFETY: the caller's contract (see the impl block).
        unsafe {
            self.in_place(buf, len, dtype, keep, move |g, b| {
                g.all_reduce(b, dtype, op)
            })
        }
    }

    /// Out-of-place all-reduce: `output` receives the reduction of every rank's `input`.
    ///
    /// # Safety
    /// See the impl block.
    pub unsafe fn all_reduce_into_start_ptr(
        &self,
        input: *const u8,
        output: *mut u8,
        len: usize,
        dtype: DataType,
        op: ReduceOp,
        keep: KeepAlive,
    ) -> Pending<()> {
        let (i, o) = (
            Region {
                ptr: input as *mut u8,
                len,
            },
            Region { ptr: output, len },
        );
        if let Err(e) = whole(len, dtype).and_then(|_| no_overlap(&i, &o, "all_reduce_into")) {
            return failed(e);
        }
        self.submit(move |g| {
            let _keep = keep;
            // SAFETY: the caller's contract; the regions do not overlap (checked above).
            g.all_reduce_from(
                unsafe { o.bytes_mut() },
                Some(unsafe { i.bytes() }),
                dtype,
                op,
            )
        })
    }

    /// In-place reduce-scatter: `buf` holds `size` blocks; this rank's block receives the result.
    ///
    /// # Safety
    /// See the impl block.
    pub unsafe fn reduce_scatter_start_ptr(
        &self,
        buf: *mut u8,
        len: usize,
        dtype: DataType,
        op: ReduceOp,
        keep: KeepAlive,
    ) -> Pending<()> {
        // SAFETY: the caller's contract (see the impl block).
        unsafe {
            self.in_place(buf, len, dtype, keep, move |g, b| {
                g.reduce_scatter(b, dtype, op)
            })
        }
    }

    /// In-place all-gather: this rank's block of `buf` is its contribution.
    ///
    /// # Safety
    /// See the impl block.
    pub unsafe fn all_gather_start_ptr(
        &self,
        buf: *mut u8,
        len: usize,
        dtype: DataType,
        keep: KeepAlive,
    ) -> Pending<()> {
        // SAFETY: the caller's contract (see the impl block).
        unsafe { self.in_place(buf, len, dtype, keep, move |g, b| g.all_gather(b, dtype)) }
    }

    /// Broadcast `root`'s `buf`.
    ///
    /// # Safety
    /// See the impl block.
    pub unsafe fn broadcast_start_ptr(
        &self,
        buf: *mut u8,
        len: usize,
        dtype: DataType,
        root: usize,
        keep: KeepAlive,
    ) -> Pending<()> {
        // SAFETY: the caller's contract (see the impl block).
        unsafe {
            self.in_place(buf, len, dtype, keep, move |g, b| {
                g.broadcast(b, dtype, root)
            })
        }
    }

    /// In-place reduce to `root` (non-root buffers are scratch).
    ///
    /// # Safety
    /// See the impl block.
    pub unsafe fn reduce_start_ptr(
        &self,
        buf: *mut u8,
        len: usize,
        dtype: DataType,
        op: ReduceOp,
        root: usize,
        keep: KeepAlive,
    ) -> Pending<()> {
        // SAFETY: the caller's contract (see the impl block).
        unsafe {
            self.in_place(buf, len, dtype, keep, move |g, b| {
                g.reduce(b, dtype, op, root)
            })
        }
    }

    /// All-to-all from `input` into `output` (both `len` bytes, `size` blocks).
    ///
    /// # Safety
    /// See the impl block.
    pub unsafe fn all_to_all_start_ptr(
        &self,
        input: *const u8,
        output: *mut u8,
        len: usize,
        dtype: DataType,
        keep: KeepAlive,
    ) -> Pending<()> {
        let (i, o) = (
            Region {
                ptr: input as *mut u8,
                len,
            },
            Region { ptr: output, len },
        );
        let n = self.size();
        let check = whole(len, dtype)
            .and_then(|_| no_overlap(&i, &o, "all_to_all"))
            .and_then(|_| {
                if (len / dtype.size()).is_multiple_of(n) {
                    Ok(())
                } else {
                    Err(Error::Invalid(format!(
                        "all_to_all: {} elements are not {n} equal blocks",
                        len / dtype.size()
                    )))
                }
            });
        if let Err(e) = check {
            return failed(e);
        }
        self.submit(move |g| {
            let _keep = keep;
            // SAFETY: the caller's contract; the regions do not overlap (checked above).
            g.all_to_all(unsafe { i.bytes() }, unsafe { o.bytes_mut() }, dtype)
        })
    }

    /// Send `buf` to `peer` (blocking; matched in order with the peer's receive from this rank).
    pub fn send_raw(&self, buf: &[u8], peer: usize, dtype: DataType) -> Result<()> {
        whole(buf.len(), dtype)?;
        self.blocking(|g| g.p2p(Some((buf, peer)), None, dtype))
    }

    /// Receive `buf.len()` bytes from `peer` (blocking).
    pub fn recv_raw(&self, buf: &mut [u8], peer: usize, dtype: DataType) -> Result<()> {
        whole(buf.len(), dtype)?;
        self.blocking(|g| g.p2p(None, Some((buf, peer)), dtype))
    }
}

fn no_overlap(i: &Region, o: &Region, what: &str) -> Result<()> {
    if i.overlaps(o) {
        return Err(Error::Invalid(format!(
            "{what}: input and output overlap; use the in-place form"
        )));
    }
    Ok(())
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::bootstrap::Rendezvous;
    use crate::config::Config;
    use crate::store::{self, Store, StoreClient};
    use std::net::TcpListener;
    use std::sync::Arc;
    use std::time::Duration;

    /// `n` ranks as threads of this process over a real store; `f` runs on each.
    pub(in crate::comm) fn world(n: usize, f: impl Fn(Communicator) + Send + Sync + 'static) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let srv = store::serve(l, "k", Store::new()).unwrap();
        let addr = srv.addr.to_string();
        let f = Arc::new(f);
        let ths: Vec<_> = (0..n)
            .map(|r| {
                let (addr, f) = (addr.clone(), f.clone());
                std::thread::spawn(move || {
                    let st = StoreClient::connect(&addr, "k", Duration::from_secs(20)).unwrap();
                    let rv = Rendezvous {
                        rank: r,
                        size: n,
                        store: Arc::new(st),
                        secret: "k".into(),
                        job: format!("bindtest{}", std::process::id()),
                        server: None,
                    };
                    let cfg = Config::from_env().unwrap();
                    f(Communicator::from_rendezvous(rv, cfg).unwrap())
                })
            })
            .collect();
        for t in ths {
            t.join().unwrap();
        }
    }

    #[test]
    fn started_on_pointers_keep_memory_alive_until_the_call_ends() {
        world(2, |c| {
            let r = c.rank();
            let mut v: Vec<f32> = (0..10_000).map(|i| (i % 7 + r) as f32).collect();
            let keep = Arc::new(());
            let watch = keep.clone();
            // SAFETY: `v` outlives the wait below and nothing touches it meanwhile.
            let p = unsafe {
                c.all_reduce_start_ptr(
                    v.as_mut_ptr() as *mut u8,
                    v.len() * 4,
                    DataType::F32,
                    ReduceOp::Sum,
                    Box::new(keep),
                )
            };
            p.wait().expect("all-reduce");
            for (i, x) in v.iter().enumerate() {
                assert_eq!(*x, (2 * (i % 7) + 1) as f32, "element {i}");
            }
            // the worker drops the keep-alive once the call is over
            let t = std::time::Instant::now();
            while Arc::strong_count(&watch) > 1 && t.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(1));
            }
            assert_eq!(Arc::strong_count(&watch), 1);

            let input: Vec<i64> = (0..999).map(|i| i * (r as i64 + 1)).collect();
            let mut out = vec![0i64; 999];
            // SAFETY: both vectors outlive the wait; they do not overlap.
            let p = unsafe {
                c.all_reduce_into_start_ptr(
                    input.as_ptr() as *const u8,
                    out.as_mut_ptr() as *mut u8,
                    999 * 8,
                    DataType::I64,
                    ReduceOp::Max,
                    Box::new(()),
                )
            };
            p.wait().expect("out of place");
            for (i, x) in out.iter().enumerate() {
                assert_eq!(*x, 2 * i as i64, "element {i}");
            }

            // all-to-all: block j of rank r holds 100*r + j
            let input: Vec<u32> = (0..8).map(|i| (100 * r + i / 4) as u32).collect();
            let mut out = vec![0u32; 8];
            // SAFETY: as above.
            let p = unsafe {
                c.all_to_all_start_ptr(
                    input.as_ptr() as *const u8,
                    out.as_mut_ptr() as *mut u8,
                    32,
                    DataType::U32,
                    Box::new(()),
                )
            };
            p.wait().expect("all-to-all");
            let want: Vec<u32> = (0..8).map(|i| (100 * (i / 4) + r) as u32).collect();
            assert_eq!(out, want);

            // one-sided send / recv
            let mut got = [0u8; 5];
            if r == 0 {
                c.send_raw(&[1, 2, 3, 4, 5], 1, DataType::U8).unwrap();
                c.recv_raw(&mut got, 1, DataType::U8).unwrap();
                assert_eq!(got, [5, 4, 3, 2, 1]);
            } else {
                c.recv_raw(&mut got, 0, DataType::U8).unwrap();
                assert_eq!(got, [1, 2, 3, 4, 5]);
                got.reverse();
                c.send_raw(&got, 0, DataType::U8).unwrap();
            }
        });
    }

    #[test]
    fn overlap_and_partial_elements_are_refused() {
        world(1, |c| {
            let mut v = vec![0u8; 64];
            let p = v.as_mut_ptr();
            // SAFETY: refused before anything touches the memory.
            let e = unsafe {
                c.all_reduce_into_start_ptr(
                    p,
                    p.wrapping_add(8),
                    32,
                    DataType::U8,
                    ReduceOp::Sum,
                    Box::new(()),
                )
            }
            .wait()
            .unwrap_err();
            assert!(e.to_string().contains("overlap"), "{e}");
            // SAFETY: refused before anything touches the memory.
            let e =
                unsafe { c.all_reduce_start_ptr(p, 6, DataType::F32, ReduceOp::Sum, Box::new(())) }
                    .wait()
                    .unwrap_err();
            assert!(e.to_string().contains("whole number"), "{e}");
        });
    }
}

//! The benchmark driver behind `railperf`, written against a small [`Backend`] trait so the same
//! table, JSON and checks serve railring and the MPI peer.
//!
//! Flags, defaults, columns and bandwidth formulas follow nccl-tests:
//! `algbw = size / time`; `busbw = algbw * factor` with factor 2(n-1)/n for all-reduce, (n-1)/n
//! for reduce-scatter, all-gather and all-to-all, and 1 for broadcast, reduce and send/recv.
//! Inputs are small integers (deterministic per rank and index), so every reduction is exact in
//! any order and every element of every rank's result is compared with an exact reference.
//!
//! Files: this one holds the interface a library implements ([`Backend`], [`Call`]);
//! `options.rs` the command line, `data.rs` the inputs every rank sends and the exact results it
//! must get, `driver.rs` the timing loop, the table and the JSON rows, `railring_backend.rs`
//! railring as a backend.

mod data;
mod driver;
mod options;
mod railring_backend;

pub use data::{layout, Layout};
pub use driver::{csv, format_row, measure, run_with, Row, CSV_HEADER};
pub use options::{Coll, Options, USAGE};
pub use railring_backend::{run, Railring};

use railring::{DataType, ReduceOp};

/// What one call does: the collective, the element type, the operator (ignored unless the
/// collective reduces) and the root (ignored unless it is rooted).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Call {
    pub coll: Coll,
    pub dtype: DataType,
    pub op: ReduceOp,
    pub root: usize,
}

/// What a benchmark needs from a communication library. Buffers are bytes plus a dtype.
pub trait Backend {
    fn name(&self) -> String;
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// One call. Out-of-place when `input` is `Some` (its length depends on the collective; see
    /// [`Layout`]), in-place otherwise.
    fn call(&self, call: &Call, input: Option<&[u8]>, output: &mut [u8]) -> Result<(), String>;
    /// `iters` calls back to back (`-z 0`; non-blocking implementations overlap them and
    /// say so in [`Backend::calls_label`]).
    fn calls(
        &self,
        iters: usize,
        call: &Call,
        input: Option<&[u8]>,
        output: &mut [u8],
    ) -> Result<(), String> {
        for _ in 0..iters {
            self.call(call, input, output)?;
        }
        Ok(())
    }
    /// Told before the warm-up how many calls one [`Backend::calls`] will make at most, so it
    /// can make what it needs then, outside the timed calls.
    fn expect_calls(&self, iters: usize) {
        let _ = iters;
    }
    /// How [`Backend::calls`] makes its calls, for the table's header: the default `calls` is
    /// blocking calls back to back.
    fn calls_label(&self, coll: Coll) -> String {
        let _ = coll;
        "blocking calls".into()
    }
    fn barrier(&self) -> Result<(), String>;
    /// Reduce one f64 over ranks (sum, min or max), result everywhere.
    fn reduce_f64(&self, v: f64, op: ReduceOp) -> Result<f64, String>;
    /// Gather one short line per rank to rank 0 (others get an empty list).
    fn gather_lines(&self, line: &str) -> Result<Vec<String>, String>;
    /// What kind of buffers / data path it uses (printed in the preamble).
    fn describe_buffers(&self) -> String;
}

//! The collectives on untyped buffers: bytes plus a [`DataType`] (benchmarks and language
//! bindings use these).

use super::Communicator;
use crate::error::{Error, Result};
use railring_collectives::{DataType, ReduceOp};

/// Untyped forms of the collectives: buffers as bytes plus a [`DataType`]. Lengths must be
/// multiples of the element size.
impl Communicator {
    fn check_len(buf: &[u8], dtype: DataType) -> Result<()> {
        if !buf.len().is_multiple_of(dtype.size()) {
            return Err(Error::Invalid(format!(
                "{} bytes is not a whole number of {dtype} elements",
                buf.len()
            )));
        }
        Ok(())
    }
    pub fn all_reduce_raw(&self, buf: &mut [u8], dtype: DataType, op: ReduceOp) -> Result<()> {
        Self::check_len(buf, dtype)?;
        self.blocking(|g| g.all_reduce(buf, dtype, op))
    }
    /// Out of place: `output` receives the reduction of every rank's `input`.
    pub fn all_reduce_into_raw(
        &self,
        input: &[u8],
        output: &mut [u8],
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        Self::check_len(input, dtype)?;
        // lengths: checked by the call itself (Inner::all_reduce_from)
        self.blocking(|g| g.all_reduce_from(output, Some(input), dtype, op))
    }
    /// [`Communicator::reduce_scatter`] on bytes: `input` holds `size` blocks, `output` (one
    /// block) receives this rank's block of the reduction.
    pub fn reduce_scatter_into_raw(
        &self,
        input: &[u8],
        output: &mut [u8],
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        Self::check_len(input, dtype)?;
        Self::check_len(output, dtype)?;
        self.blocking(|g| g.reduce_scatter_into(input, output, dtype, op))
    }
    /// In place: `buf` holds `size` blocks; this rank's block receives the reduction.
    pub fn reduce_scatter_raw(&self, buf: &mut [u8], dtype: DataType, op: ReduceOp) -> Result<()> {
        Self::check_len(buf, dtype)?;
        self.blocking(|g| g.reduce_scatter(buf, dtype, op))
    }
    /// [`Communicator::all_gather`] on bytes: `input` is this rank's block, `output` receives
    /// every rank's block in rank order.
    pub fn all_gather_into_raw(
        &self,
        input: &[u8],
        output: &mut [u8],
        dtype: DataType,
    ) -> Result<()> {
        Self::check_len(input, dtype)?;
        self.blocking(|g| g.all_gather_into(input, output, dtype))
    }
    /// In place: this rank's block of `buf` is its contribution.
    pub fn all_gather_raw(&self, buf: &mut [u8], dtype: DataType) -> Result<()> {
        Self::check_len(buf, dtype)?;
        self.blocking(|g| g.all_gather(buf, dtype))
    }
    pub fn broadcast_raw(&self, buf: &mut [u8], dtype: DataType, root: usize) -> Result<()> {
        Self::check_len(buf, dtype)?;
        self.blocking(|g| g.broadcast(buf, dtype, root))
    }
    /// [`Communicator::broadcast_into`] on bytes: every rank's `output` receives the root's
    /// `input` (read only on the root; the same length as `output` everywhere).
    pub fn broadcast_into_raw(
        &self,
        input: &[u8],
        output: &mut [u8],
        dtype: DataType,
        root: usize,
    ) -> Result<()> {
        Self::check_len(output, dtype)?;
        self.blocking(|g| g.broadcast_from(output, Some(input), dtype, root))
    }
    /// [`Communicator::reduce`] on bytes: `input` reduced into the root's `output`.
    pub fn reduce_into_raw(
        &self,
        input: &[u8],
        output: &mut [u8],
        dtype: DataType,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        Self::check_len(input, dtype)?;
        self.blocking(|g| g.reduce_from(output, Some(input), dtype, op, root))
    }
    /// In place; non-root buffers are used as scratch.
    pub fn reduce_raw(
        &self,
        buf: &mut [u8],
        dtype: DataType,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        Self::check_len(buf, dtype)?;
        self.blocking(|g| g.reduce(buf, dtype, op, root))
    }
    pub fn all_to_all_raw(&self, input: &[u8], output: &mut [u8], dtype: DataType) -> Result<()> {
        Self::check_len(input, dtype)?;
        if input.len() != output.len() || !(input.len() / dtype.size()).is_multiple_of(self.size())
        {
            return Err(Error::Invalid(
                "all_to_all: input and output must be equal and divisible by the world size".into(),
            ));
        }
        self.blocking(|g| g.all_to_all(input, output, dtype))
    }
    /// [`Communicator::all_to_all_in_place`] on bytes of `dtype`.
    pub fn all_to_all_in_place_raw(&self, buf: &mut [u8], dtype: DataType) -> Result<()> {
        Self::check_len(buf, dtype)?;
        if !(buf.len() / dtype.size()).is_multiple_of(self.size()) {
            return Err(Error::Invalid(
                "all_to_all_in_place: the buffer must be divisible by the world size".into(),
            ));
        }
        self.blocking(|g| g.all_to_all_in_place(buf, dtype))
    }
    pub fn send_recv_raw(
        &self,
        send: &[u8],
        dest: usize,
        recv: &mut [u8],
        src: usize,
        dtype: DataType,
    ) -> Result<()> {
        Self::check_len(send, dtype)?;
        Self::check_len(recv, dtype)?;
        self.blocking(|g| g.p2p(Some((send, dest)), Some((recv, src)), dtype))
    }
}

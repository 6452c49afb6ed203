//! railring as a [`Backend`]: each collective through the communicator's raw-byte calls.

use super::{run_with, Backend, Call, Coll, Options};
use railring::ReduceOp;

/// railring as a [`Backend`].
pub struct Railring {
    pub comm: railring::Communicator,
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
                // out-of-place: reduce a copy of the input, keep this rank's block at the start
                Some(i) => {
                    out.copy_from_slice(i);
                    self.comm.reduce_scatter_raw(out, dtype, op).map_err(e)?;
                    let b = out.len() / n;
                    out.copy_within(me * b..(me + 1) * b, 0);
                    Ok(())
                }
                None => self.comm.reduce_scatter_raw(out, dtype, op).map_err(e),
            },
            Coll::AllGather => {
                if let Some(i) = input {
                    out[me * i.len()..(me + 1) * i.len()].copy_from_slice(i);
                }
                self.comm.all_gather_raw(out, dtype).map_err(e)
            }
            Coll::Broadcast => {
                if let Some(i) = input {
                    if me == root {
                        out.copy_from_slice(i);
                    }
                }
                self.comm.broadcast_raw(out, dtype, root).map_err(e)
            }
            Coll::Reduce => {
                if let Some(i) = input {
                    out.copy_from_slice(i);
                }
                self.comm.reduce_raw(out, dtype, op, root).map_err(e)
            }
            Coll::AllToAll => match input {
                Some(i) => self.comm.all_to_all_raw(i, out, dtype).map_err(e),
                None => {
                    let tmp = out.to_vec();
                    self.comm.all_to_all_raw(&tmp, out, dtype).map_err(e)
                }
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
    let be = Railring { comm };
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

//! This node's ranks: the one code path that railrun uses for the ranks on its own machine and
//! every `railrun --agent` uses for the ranks of its node. It serves the bootstrap store the
//! ranks connect to on `127.0.0.1` (railrun's store itself, or the agent's relay), starts the
//! ranks in order, notes their exits and signals their process groups. Where output and exits
//! go is the caller's [`RankEvents`]; when to kill is the caller's lifecycle.

use crate::proto::RankSpec;
use crate::spawn::{self, RankCommand, RankEvents};
use railring::store::{self, Backend, ServerHandle};
use railring::vars;
use std::io;
use std::net::TcpListener;
use std::process::ChildStdin;
use std::sync::Arc;

/// Why the store endpoint for this node's ranks could not be opened.
#[derive(Debug)]
pub enum ServeError {
    /// No port on `127.0.0.1`.
    Bind(io::Error),
    /// The listener was there but the store could not be served on it.
    Serve(io::Error),
}

impl ServeError {
    /// The system's error, whichever step failed.
    pub fn into_cause(self) -> io::Error {
        match self {
            ServeError::Bind(e) | ServeError::Serve(e) => e,
        }
    }
}

/// A rank that could not be started; the ranks after it were not tried.
#[derive(Debug)]
pub struct NotStarted {
    /// Its position in the list given to [`NodeRanks::start`].
    pub index: usize,
    pub rank: u32,
    /// `cannot start PROGRAM: CAUSE`.
    pub message: String,
    pub cause: io::Error,
}

struct Started {
    rank: u32,
    pid: u32,
    exited: bool,
}

/// The ranks started on this node and the store endpoint they connect to.
#[derive(Default)]
pub struct NodeRanks {
    started: Vec<Started>,
    /// Rank 0's stdin until the caller takes it.
    stdin: Option<ChildStdin>,
    server: Option<ServerHandle>,
    /// `RAILRING_STORE_ADDR` and `RAILRING_JOB_SECRET`, once the store is served.
    store_env: Vec<(String, String)>,
}

impl NodeRanks {
    pub fn new() -> NodeRanks {
        NodeRanks::default()
    }

    /// Serve `backend` to this node's ranks on `127.0.0.1`, guarded by the job secret; the ranks
    /// started afterwards get its address and the secret.
    pub fn serve_store(
        &mut self,
        secret: &str,
        backend: Arc<dyn Backend>,
    ) -> Result<(), ServeError> {
        let listener = TcpListener::bind("127.0.0.1:0").map_err(ServeError::Bind)?;
        let server = store::serve(listener, secret, backend).map_err(ServeError::Serve)?;
        self.store_env = vec![
            (vars::STORE_ADDR.to_string(), server.addr.to_string()),
            (vars::JOB_SECRET.to_string(), secret.to_string()),
        ];
        self.server = Some(server);
        Ok(())
    }

    /// Stop serving the store (the job is over on this node).
    pub fn close_store(&mut self) {
        self.server = None;
    }

    /// Start `ranks` in order, their output and exits going to `events`. Stops at the first rank
    /// that cannot start; the ranks started before it keep running. Must be called from the
    /// thread that lives for the whole job (see [`spawn::spawn_rank`]).
    pub fn start(
        &mut self,
        cmd: &RankCommand<'_>,
        ranks: &[RankSpec],
        events: &Arc<dyn RankEvents>,
    ) -> Result<(), NotStarted> {
        for (index, spec) in ranks.iter().enumerate() {
            match spawn::spawn_rank(cmd, spec, &self.store_env, events.clone()) {
                Ok(p) => {
                    self.started.push(Started {
                        rank: p.rank,
                        pid: p.pid,
                        exited: false,
                    });
                    if p.stdin.is_some() {
                        self.stdin = p.stdin;
                    }
                }
                Err(cause) => {
                    return Err(NotStarted {
                        index,
                        rank: spec.rank,
                        message: format!("cannot start {}: {cause}", cmd.program.display()),
                        cause,
                    })
                }
            }
        }
        Ok(())
    }

    /// Rank 0's stdin, when rank 0 was started here (once).
    pub fn take_stdin(&mut self) -> Option<ChildStdin> {
        self.stdin.take()
    }

    /// (rank, pid) of every rank started, in start order.
    pub fn pids(&self) -> Vec<(u32, u32)> {
        self.started.iter().map(|s| (s.rank, s.pid)).collect()
    }

    /// How many ranks were started.
    pub fn len(&self) -> usize {
        self.started.len()
    }

    pub fn is_empty(&self) -> bool {
        self.started.is_empty()
    }

    /// Note that `rank` ended (or is given up on). True the first time for a rank started here.
    pub fn mark_exited(&mut self, rank: u32) -> bool {
        match self.started.iter_mut().find(|s| s.rank == rank) {
            Some(s) if !s.exited => {
                s.exited = true;
                true
            }
            _ => false,
        }
    }

    /// Is a rank started here still running?
    pub fn any_running(&self) -> bool {
        self.started.iter().any(|s| !s.exited)
    }

    /// Send `sig` to the process group of every rank still running; with `include_exited`, of
    /// every rank started (a group outlives its leader: this takes leftover descendants along).
    pub fn signal(&self, sig: i32, include_exited: bool) {
        for s in &self.started {
            if include_exited || !s.exited {
                spawn::kill_group(s.pid, sig);
            }
        }
    }
}

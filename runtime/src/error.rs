//! The runtime's errors. Each says what failed, where (rank, host, peer) and what to try.

use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("bootstrap: {0}")]
    Store(#[from] StoreError),
    #[error("bad environment: {var}={value:?}: {why}")]
    Env {
        var: String,
        value: String,
        why: String,
    },
    #[error(
        "rank {rank}: collective mismatch: this rank called {mine}, rank {peer} called {theirs}"
    )]
    Mismatch {
        rank: usize,
        peer: usize,
        mine: String,
        theirs: String,
    },
    #[error("rank {rank}: peer rank {peer} on {host} is gone ({why}); the job cannot continue")]
    PeerDead {
        rank: usize,
        peer: usize,
        host: String,
        why: String,
    },
    #[error("rank {rank}: no progress for {secs} s (RAILRING_TIMEOUT) while waiting for rank(s) {waiting:?} in {what}")]
    Timeout {
        rank: usize,
        secs: u64,
        waiting: Vec<usize>,
        what: String,
    },
    #[error("rank {rank}: transport: {what}: {err}")]
    Transport {
        rank: usize,
        what: String,
        err: std::io::Error,
    },
    #[error("rank {rank}: shared memory: {what}: {err}")]
    Shm {
        rank: usize,
        what: String,
        err: std::io::Error,
    },
    #[error("invalid argument: {0}")]
    Invalid(String),
    #[error("plan: {0}")]
    Plan(String),
    #[error("communicator is unusable after an earlier error: {0}")]
    Poisoned(String),
    #[error("topology: {0}")]
    Topology(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

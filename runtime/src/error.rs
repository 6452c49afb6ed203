//! The runtime's errors. Each says what failed, where (rank, host, peer) and what to try.

use crate::store::StoreError;

/// A failed railring call. The message says what failed, where and what to try; the fields are
/// there for programs that react to a kind of failure. New kinds may be added in any release,
/// so a `match` needs a `_` arm.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Joining the job failed: the bootstrap store could not be reached or authenticated.
    #[error("bootstrap: {0}")]
    Store(#[from] StoreError),
    /// A launcher or `RAILRING_*` variable could not be used.
    #[error("bad environment: {var}={value:?}: {why}")]
    Env {
        var: String,
        value: String,
        why: String,
    },
    /// Ranks made different calls at the same point: `mine` (this rank's call) and `theirs`
    /// (rank `peer`'s) spell out kind, count, type, op and root.
    #[error(
        "rank {rank}: collective mismatch: this rank called {mine}, rank {peer} called {theirs}"
    )]
    Mismatch {
        rank: usize,
        peer: usize,
        mine: String,
        theirs: String,
    },
    /// Rank `peer` on `host` died or its connection broke.
    #[error("rank {rank}: peer rank {peer} on {host} is gone ({why}); the job cannot continue")]
    PeerDead {
        rank: usize,
        peer: usize,
        host: String,
        why: String,
    },
    /// Nothing moved for `secs` seconds (`RAILRING_TIMEOUT`); `waiting` names the ranks not
    /// heard from.
    #[error("rank {rank}: no progress for {secs} s (RAILRING_TIMEOUT) while waiting for rank(s) {waiting:?} in {what}")]
    Timeout {
        rank: usize,
        secs: u64,
        waiting: Vec<usize>,
        what: String,
    },
    /// A network link failed.
    #[error("rank {rank}: transport: {what}: {err}")]
    Transport {
        rank: usize,
        what: String,
        err: std::io::Error,
    },
    /// The node's shared-memory segment could not be made or used.
    #[error("rank {rank}: shared memory: {what}: {err}")]
    Shm {
        rank: usize,
        what: String,
        err: std::io::Error,
    },
    /// The call's arguments were rejected before anything moved; the communicator stays usable.
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// No plan could be built for the call.
    #[error("plan: {0}")]
    Plan(String),
    /// The communicator failed earlier and refuses further calls; the text is the first failure.
    #[error("communicator is unusable after an earlier error: {0}")]
    Poisoned(String),
    /// A topology file or the machine's topology could not be used.
    #[error("topology: {0}")]
    Topology(String),
}

/// railring's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

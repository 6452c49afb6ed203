//! [`CheckError`]: why a set of plans is wrong.

/// Why a set of plans is wrong. Messages name the rank, step and element.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CheckError {
    #[error("invalid check input: {0}")]
    Input(String),
    #[error("rank {rank} step {step}: {msg}")]
    BadStep {
        rank: usize,
        step: usize,
        msg: String,
    },
    #[error(
        "rank {rank} step {step} receives {recv_len} elements from rank {src} on channel {chan}, \
         but the matching send (rank {src} step {send_step}) carries {send_len}"
    )]
    LenMismatch {
        rank: usize,
        step: usize,
        src: usize,
        chan: usize,
        send_step: usize,
        send_len: usize,
        recv_len: usize,
    },
    #[error(
        "rank {rank} step {step} and rank {other} step {other_step} disagree on an in-node \
         collective: {msg}"
    )]
    NodeMismatch {
        rank: usize,
        step: usize,
        other: usize,
        other_step: usize,
        msg: String,
    },
    #[error("deadlock: no rank can make progress\n{0}")]
    Deadlock(String),
    #[error("rank {rank}: work element {index}: expected {expected}, got {got}")]
    Wrong {
        rank: usize,
        index: usize,
        expected: String,
        got: String,
    },
    #[error(
        "ranks {rank} and {other} end with different reduction trees for work element {index}, \
         so their results are not bit-identical: {a} vs {b}"
    )]
    NotBitIdentical {
        rank: usize,
        other: usize,
        index: usize,
        a: String,
        b: String,
    },
}

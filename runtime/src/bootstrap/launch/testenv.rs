//! Environments for the launch-detection tests: a map as an [`Env`](super::Env), and what srun
//! and torchrun set for a typical task.

use super::{Detected, Launch};
use crate::error::{Error, Result};
use std::collections::HashMap;

pub fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let m: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| m.get(k).cloned()
}

pub fn with(base: &[(&str, &str)], extra: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let mut v: Vec<(&str, &str)> = base
        .iter()
        .filter(|(k, _)| !extra.iter().any(|(e, _)| e == k))
        .copied()
        .collect();
    v.extend_from_slice(extra);
    env_of(&v)
}

pub fn hosted(d: &Detected) -> (usize, usize, &str, &str, &str, &str) {
    match &d.launch {
        Launch::HostedStore {
            rank,
            size,
            store_addr,
            serve_on,
            secret,
            job_id,
            ..
        } => (
            *rank,
            *size,
            store_addr.as_str(),
            serve_on.as_str(),
            secret.as_str(),
            job_id.as_str(),
        ),
        other => panic!("expected HostedStore, got {other:?}"),
    }
}

pub fn err_var(r: Result<Option<Detected>>) -> (String, String) {
    match r {
        Err(Error::Env { var, why, .. }) => (var, why),
        other => panic!("expected an Env error, got {other:?}"),
    }
}

// What srun sets for task 2 of `srun -N2 --ntasks-per-node=2` in job 1234 step 0 (no HOME:
// the key-file default must not be picked up from the machine running the tests).
pub const SRUN: &[(&str, &str)] = &[
    ("SLURM_PROCID", "2"),
    ("SLURM_NTASKS", "4"),
    ("SLURM_STEP_NUM_TASKS", "4"),
    ("SLURM_LOCALID", "0"),
    ("SLURM_NODEID", "1"),
    ("SLURM_STEP_NODELIST", "node[07-08]"),
    ("SLURM_JOB_NODELIST", "node[06-08]"),
    ("SLURM_JOB_ID", "1234"),
    ("SLURM_STEP_ID", "0"),
    ("SLURM_STEPID", "0"),
];

pub const TORCH: &[(&str, &str)] = &[
    ("RANK", "3"),
    ("WORLD_SIZE", "8"),
    ("LOCAL_RANK", "3"),
    ("LOCAL_WORLD_SIZE", "4"),
    ("MASTER_ADDR", "10.1.2.3"),
    ("MASTER_PORT", "29500"),
];

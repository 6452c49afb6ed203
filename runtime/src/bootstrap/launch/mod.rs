//! How this process was started — the one place that reads the launcher's variables and decides.
//! First match wins:
//!
//! 1. `RAILRING_STORE_ADDR` (railrun, or anything imitating it): [`Launch::Store`]
//!    ([`railrun`]).
//! 2. An MPI launcher (`mpirun` / `mpiexec`, not railrun, not a plain Slurm direct launch):
//!    with the `mpi` feature [`Launch::Mpi`] ([`mpirun`]; the bootstrap itself is
//!    [`crate::bootstrap::mpi`]); without it [`Launch::Pmi`] when the launcher pre-connected a
//!    PMI-1 socket (MPICH's `mpiexec`; [`crate::bootstrap::pmi`]), a world of one when it
//!    started one rank, and otherwise an error that says what to do
//!    ([`mpirun::without_mpi_feature`]).
//! 3. A Slurm job step (`srun ./prog`), then torchrun-style `RANK`/`WORLD_SIZE`/`MASTER_ADDR`/
//!    `MASTER_PORT` (torchrun first when it runs inside the step): [`Launch::HostedStore`]
//!    ([`slurm`], [`torchrun`]; the job secret without a launcher: [`secret`]).
//! 4. Otherwise [`Launch::Alone`].
//!
//! Everything here reads the environment through an [`Env`] lookup function so it can be tested
//! without touching the process environment; [`from_process_env`] passes the real one. Nothing
//! here panics on what it reads: bad values are [`Error::Env`] naming the variable.
//!
//! The variables of each launch and how the store address, port and secret follow from them are
//! described in the submodules and in `docs/slurm.md`.

pub mod mpirun;
pub mod railrun;
pub mod secret;
pub mod slurm;
#[cfg(test)]
mod testenv;
pub mod torchrun;

use crate::error::{Error, Result};

pub use slurm::{slurm_port, SLURM_PORT_BASE, SLURM_PORT_SPAN};

/// A string every railring program carries (the bootstrap refers to it): railrun finds it in a
/// program that links Open MPI to tell a railring program built with the `mpi` feature (which
/// bootstraps from railrun's store) from an Open MPI program (which needs Open MPI's mpirun).
pub const PROGRAM_MARKER: &str = "railring-program:bootstraps-from-railrun-store:v1";

/// Keep [`PROGRAM_MARKER`] in the program's binary (called on every bootstrap path).
pub fn keep_program_marker() {
    std::hint::black_box(PROGRAM_MARKER.as_ptr());
}

/// How this process learned who it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Launch {
    /// Started alone: a world of one.
    Alone,
    /// Started by railrun (or anything that sets `RAILRING_STORE_ADDR`).
    Store {
        rank: usize,
        size: usize,
        store_addr: String,
        secret: String,
        job_id: String,
        source: &'static str,
    },
    /// Started without railrun (srun direct launch, torchrun-style env): rank 0 serves the
    /// bootstrap store on `serve_on`; every rank (rank 0 too) connects to `store_addr`.
    /// See [`slurm`], [`torchrun`] and `docs/slurm.md` for the variables, the port derivation
    /// and how `secret` is chosen; `source` is `"Slurm step"` or `"torchrun-style env"`.
    HostedStore {
        rank: usize,
        size: usize,
        store_addr: String,
        serve_on: String,
        secret: String,
        job_id: String,
        source: &'static str,
    },
    /// Started by an MPI launcher (feature `mpi`): the store's address travels over MPI
    /// ([`crate::bootstrap::mpi`]). `source` names the variable that gave it away.
    Mpi { source: &'static str },
    /// Started by a launcher that pre-connected a PMI-1 socket (`PMI_FD`, e.g. MPICH's
    /// `mpiexec`): the store's address travels through its key-value space
    /// ([`crate::bootstrap::pmi`]).
    Pmi { rank: usize, size: usize, fd: i32 },
}

/// The environment, as a lookup function (tests pass a map).
pub type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// What detection found: the launch, plus a warning for the user (printed by the caller).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Detected {
    pub launch: Launch,
    pub warning: Option<String>,
}

/// Decide how the process described by `env` was started (the order is in the module docs).
pub fn detect(env: Env) -> Result<Detected> {
    if let Some(l) = railrun::railrun(env)? {
        return Ok(Detected {
            launch: l,
            warning: None,
        });
    }
    if let Some(source) = mpirun::launcher_of(env) {
        #[cfg(feature = "mpi")]
        let launch = Launch::Mpi { source };
        #[cfg(not(feature = "mpi"))]
        let launch = mpirun::without_mpi_feature(env, source)?;
        return Ok(Detected {
            launch,
            warning: None,
        });
    }
    Ok(direct(env)?.unwrap_or(Detected {
        launch: Launch::Alone,
        warning: None,
    }))
}

/// [`detect`] on this process's environment. A warning is printed loud on rank 0 (once per
/// job) and quiet elsewhere.
pub fn from_process_env() -> Result<Launch> {
    keep_program_marker();
    let d = detect(&process_env)?;
    if let Some(w) = &d.warning {
        if matches!(d.launch, Launch::HostedStore { rank: 0, .. }) {
            tracing::warn!(target: "railring::bootstrap", "{w}");
        } else {
            tracing::debug!(target: "railring::bootstrap", "{w}");
        }
    }
    Ok(d.launch)
}

/// This process's environment as an [`Env`].
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// A launch without a launcher that hands out a store: a Slurm step, then torchrun-style env
/// (torchrun first when it runs inside the step, see [`torchrun::inside_slurm`]); `None` when
/// neither applies.
pub fn direct(env: Env) -> Result<Option<Detected>> {
    if get(env, "SLURM_PROCID").is_some()
        && slurm::step_id(env)?.is_some()
        && torchrun::inside_slurm(env)
    {
        return torchrun::torchrun(env);
    }
    if let Some(d) = slurm::slurm(env)? {
        return Ok(Some(d));
    }
    torchrun::torchrun(env)
}

pub(crate) fn get(env: Env, name: &str) -> Option<String> {
    env(name).filter(|v| !v.trim().is_empty())
}

pub(crate) fn env_err(var: &str, value: &str, why: impl Into<String>) -> Error {
    let value: String = value.chars().take(200).collect();
    Error::Env {
        var: var.into(),
        value,
        why: why.into(),
    }
}

pub(crate) fn parse_u64(env: Env, name: &str, max: u64) -> Result<Option<u64>> {
    let Some(v) = get(env, name) else {
        return Ok(None);
    };
    match v.trim().parse::<u64>() {
        Ok(n) if n <= max => Ok(Some(n)),
        _ => Err(env_err(
            name,
            &v,
            format!("expected a non-negative integer up to {max}"),
        )),
    }
}

pub(crate) fn required_u64(env: Env, name: &str, max: u64, why_needed: &str) -> Result<u64> {
    parse_u64(env, name, max)?.ok_or_else(|| env_err(name, "", format!("not set ({why_needed})")))
}

pub(crate) fn parse_port(env: Env, name: &str) -> Result<Option<u16>> {
    let Some(v) = get(env, name) else {
        return Ok(None);
    };
    match v.trim().parse::<u16>() {
        Ok(p) if p > 0 => Ok(Some(p)),
        _ => Err(env_err(name, &v, "expected a TCP port, 1 to 65535")),
    }
}

/// A host name or address usable in `host:port`: no whitespace, no control characters.
pub(crate) fn check_host(var: &str, v: &str) -> Result<String> {
    let h = v.trim();
    let h = h
        .strip_prefix('[')
        .and_then(|x| x.strip_suffix(']'))
        .unwrap_or(h);
    if h.is_empty()
        || h.len() > 255
        || h.chars()
            .any(|c| c.is_whitespace() || c.is_control() || c == '/')
    {
        return Err(env_err(var, v, "expected a host name or IP address"));
    }
    Ok(h.to_string())
}

/// `host:port`, with brackets around IPv6 literals.
pub fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

pub(crate) fn clean_id(s: &str) -> String {
    s.chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .take(32)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::testenv::*;
    use super::*;

    #[test]
    fn order_between_slurm_and_torchrun() {
        // Plain srun: Slurm.
        let d = direct(&env_of(SRUN)).unwrap().unwrap();
        assert!(matches!(
            d.launch,
            Launch::HostedStore {
                source: "Slurm step",
                ..
            }
        ));
        // railrun-style agreement (RANK = SLURM_PROCID, same size): still Slurm.
        let d = direct(&with(SRUN, &[("RANK", "2"), ("WORLD_SIZE", "4")]))
            .unwrap()
            .unwrap();
        assert!(matches!(
            d.launch,
            Launch::HostedStore {
                source: "Slurm step",
                ..
            }
        ));
        // torchrun inside an srun step: the workers' torchrun variables win.
        let mut both: Vec<(&str, &str)> = SRUN.to_vec();
        both.extend_from_slice(TORCH);
        let d = direct(&env_of(&both)).unwrap().unwrap();
        assert!(matches!(
            d.launch,
            Launch::HostedStore {
                source: "torchrun-style env",
                rank: 3,
                size: 8,
                ..
            }
        ));
        let d = direct(&with(
            &both,
            &[
                ("RANK", "2"),
                ("WORLD_SIZE", "4"),
                ("TORCHELASTIC_RUN_ID", "r1"),
            ],
        ))
        .unwrap()
        .unwrap();
        assert!(matches!(
            d.launch,
            Launch::HostedStore {
                source: "torchrun-style env",
                ..
            }
        ));
        // torchrun env alone; nothing at all.
        assert!(direct(&env_of(TORCH)).unwrap().is_some());
        assert_eq!(direct(&env_of(&[])).unwrap(), None);
    }

    #[test]
    fn hostile_values_do_not_panic() {
        let long = "9".repeat(10_000);
        let weird = [
            "",
            " ",
            "-0",
            "+1",
            "1e3",
            "\u{0}",
            "99999999999999999999999999",
            long.as_str(),
            "n[1-99999999999]",
        ];
        let names = [
            "SLURM_PROCID",
            "SLURM_NTASKS",
            "SLURM_STEP_NUM_TASKS",
            "SLURM_STEP_ID",
            "SLURM_JOB_ID",
            "SLURM_NODEID",
            "SLURM_STEP_NODELIST",
            "RAILRING_STORE_PORT",
            "RAILRING_STORE_HOST",
            "RANK",
            "WORLD_SIZE",
            "MASTER_ADDR",
            "MASTER_PORT",
            "LOCAL_RANK",
            "LOCAL_WORLD_SIZE",
        ];
        let mut both: Vec<(&str, &str)> = SRUN.to_vec();
        both.extend_from_slice(TORCH);
        for n in names {
            for w in weird {
                let _ = direct(&with(&both, &[(n, w)]));
                let _ = direct(&with(SRUN, &[(n, w)]));
                let _ = direct(&with(TORCH, &[(n, w)]));
            }
        }
    }
}

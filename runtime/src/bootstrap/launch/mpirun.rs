//! Started by an MPI launcher (`mpirun` / `mpiexec` of Open MPI, MPICH, Intel MPI, or
//! `srun --mpi=pmix` under some conditions) rather than by railrun: the variables that give it
//! away, the world size it announces, the PMI-1 socket it may offer (MPICH's Hydra: `PMI_FD`),
//! and what a program without the `mpi` feature does there ([`without_mpi_feature`]).

use super::{env_err, get, parse_u64, Env, Launch};
use crate::error::Result;
use crate::vars;

/// Environment variables that say "this process was started by an MPI launcher".
pub const MPI_LAUNCH_VARS: [&str; 3] = [vars::OMPI_COMM_WORLD_SIZE, "PMI_RANK", "PMIX_RANK"];

/// The MPI launcher variable that is set, when the process was started by one and not by
/// railrun (`RAILRING_STORE_ADDR` wins: railrun sets Open MPI's names too).
///
/// `srun` started straight from Slurm (`srun --mpi=pmix ./prog`: `PMIX_RANK` inside a job step,
/// no `OMPI_COMM_WORLD_SIZE`) is left to the Slurm direct launch, which needs no MPI, when the
/// step's task count is the MPI world size (or MPI does not say): that decision is the same on
/// every rank. `mpirun` inside an allocation sets `OMPI_COMM_WORLD_SIZE` and stays MPI's.
pub fn launcher_of(env: Env) -> Option<&'static str> {
    let var = |n: &str| get(env, n);
    if var(vars::STORE_ADDR).is_some() {
        return None;
    }
    let found = MPI_LAUNCH_VARS.into_iter().find(|v| var(v).is_some())?;
    let slurm_step = var("SLURM_PROCID").is_some()
        && (var("SLURM_STEP_ID").is_some() || var("SLURM_STEPID").is_some());
    if slurm_step && var(vars::OMPI_COMM_WORLD_SIZE).is_none() {
        let tasks = var("SLURM_STEP_NUM_TASKS").or_else(|| var("SLURM_NTASKS"));
        let mpi_size = var("PMI_SIZE").or_else(|| var("PMIX_SIZE"));
        match (tasks, mpi_size) {
            (_, None) => return None,
            (Some(t), Some(m)) if t.trim() == m.trim() => return None,
            _ => {}
        }
    }
    Some(found)
}

/// The world size the launcher announced, if it says: the variable and its value.
pub fn world_size(env: Env) -> Option<(&'static str, usize)> {
    [vars::OMPI_COMM_WORLD_SIZE, "PMI_SIZE", "PMIX_SIZE"]
        .into_iter()
        .find_map(|v| Some((v, get(env, v)?.trim().parse::<usize>().ok()?)))
}

/// The PMI-1 socket the launcher pre-connected: `PMI_FD`, with `PMI_RANK` and `PMI_SIZE`
/// (Hydra, Flux, Slurm's PMI-1 plugin). `None` when `PMI_FD` is not set.
pub fn pmi_fd(env: Env) -> Result<Option<Launch>> {
    let Some(v) = get(env, "PMI_FD") else {
        return Ok(None);
    };
    let fd = v
        .trim()
        .parse::<i32>()
        .ok()
        .filter(|&f| f >= 0)
        .ok_or_else(|| env_err("PMI_FD", &v, "expected a file descriptor number"))?;
    let need = "set by the launcher beside PMI_FD";
    let rank = super::required_u64(env, "PMI_RANK", 1 << 24, need)? as usize;
    let size = super::required_u64(env, "PMI_SIZE", 1 << 24, need)? as usize;
    if size == 0 || rank >= size {
        return Err(env_err(
            "PMI_RANK",
            &rank.to_string(),
            format!("must be below PMI_SIZE={size}"),
        ));
    }
    Ok(Some(Launch::Pmi { rank, size, fd }))
}

/// A program built without the `mpi` feature, started by an MPI launcher (`source` is the
/// variable that says so): over the launcher's PMI-1 socket when it offers one, a world of one
/// when the launcher started one rank, and otherwise an error that says what to do — never N
/// separate worlds of one.
pub fn without_mpi_feature(env: Env, source: &'static str) -> Result<Launch> {
    if let Some(l) = pmi_fd(env)? {
        return Ok(l);
    }
    let (var, n) =
        match world_size(env) {
            Some(x) => x,
            None => {
                let v = get(env, source).unwrap_or_default();
                match parse_u64(env, "PMIX_SIZE", 1 << 24) {
                    Ok(Some(n)) => ("PMIX_SIZE", n as usize),
                    _ => return Err(env_err(
                        source,
                        &v,
                        "started by an MPI launcher that does not say how many ranks it started \
                         (no OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_SIZE)",
                    )),
                }
            }
        };
    if n <= 1 {
        return Ok(Launch::Alone);
    }
    let pmi_port = if get(env, "PMI_PORT").is_some() {
        " (PMI_PORT is set: railring speaks PMI-1 only over a pre-connected PMI_FD, which is \
         what MPICH's mpiexec gives by default)"
    } else {
        ""
    };
    Err(env_err(
        var,
        &n.to_string(),
        format!(
            "started by an MPI launcher ({n} ranks), but this program was built without \
             railring's `mpi` feature and the launcher offers no PMI-1 socket (PMI_FD){pmi_port}: \
             each rank would be a world of one. Rebuild with `--features mpi` to bootstrap over \
             MPI under this mpirun (docs/mpi.md), or start the program with railrun"
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::super::testenv::env_of;
    use super::*;
    use crate::error::Error;

    #[test]
    fn pmi_socket_and_the_program_without_mpi() {
        let hydra = [("PMI_FD", "6"), ("PMI_RANK", "1"), ("PMI_SIZE", "2")];
        assert_eq!(
            without_mpi_feature(&env_of(&hydra), "PMI_RANK").unwrap(),
            Launch::Pmi {
                rank: 1,
                size: 2,
                fd: 6
            }
        );
        for bad in [
            [("PMI_FD", "x"), ("PMI_RANK", "1"), ("PMI_SIZE", "2")],
            [("PMI_FD", "6"), ("PMI_RANK", "2"), ("PMI_SIZE", "2")],
            [("PMI_FD", "6"), ("PMI_RANK", "1"), ("PMI_SIZE", "")],
        ] {
            assert!(matches!(
                without_mpi_feature(&env_of(&bad), "PMI_RANK"),
                Err(Error::Env { .. })
            ));
        }
        // Open MPI's mpirun: no PMI-1 socket. One rank is a world of one; more is an error
        // that says what to do.
        let one = [("OMPI_COMM_WORLD_SIZE", "1"), ("PMIX_RANK", "0")];
        assert_eq!(
            without_mpi_feature(&env_of(&one), "OMPI_COMM_WORLD_SIZE").unwrap(),
            Launch::Alone
        );
        let four = [("OMPI_COMM_WORLD_SIZE", "4"), ("PMIX_RANK", "2")];
        let e = without_mpi_feature(&env_of(&four), "OMPI_COMM_WORLD_SIZE")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("OMPI_COMM_WORLD_SIZE")
                && e.contains("--features mpi")
                && e.contains("railrun"),
            "{e}"
        );
        let e = without_mpi_feature(
            &env_of(&[("PMIX_RANK", "0"), ("PMIX_SIZE", "3")]),
            "PMIX_RANK",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("PMIX_SIZE"), "{e}");
        let e = without_mpi_feature(
            &env_of(&[("PMI_PORT", "h:1"), ("PMI_RANK", "0"), ("PMI_SIZE", "2")]),
            "PMI_RANK",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("PMI_PORT"), "{e}");
    }

    #[test]
    fn who_started_us() {
        let env = env_of;
        assert_eq!(launcher_of(&env(&[])), None);
        assert_eq!(
            launcher_of(&env(&[("OMPI_COMM_WORLD_SIZE", "4")])),
            Some("OMPI_COMM_WORLD_SIZE")
        );
        assert_eq!(
            launcher_of(&env(&[("PMI_RANK", "1"), ("PMI_SIZE", "4")])),
            Some("PMI_RANK")
        );
        // railrun sets Open MPI's names too
        assert_eq!(
            launcher_of(&env(&[
                ("OMPI_COMM_WORLD_SIZE", "4"),
                ("RAILRING_STORE_ADDR", "h:1")
            ])),
            None
        );
        // srun --mpi=pmix ./prog: Slurm's direct launch
        let srun = [
            ("PMIX_RANK", "1"),
            ("SLURM_PROCID", "1"),
            ("SLURM_STEP_ID", "0"),
            ("SLURM_STEP_NUM_TASKS", "4"),
        ];
        assert_eq!(launcher_of(&env(&srun)), None);
        // mpirun inside an allocation (ranks inherit the daemons' step)
        let mpirun = [
            ("OMPI_COMM_WORLD_SIZE", "8"),
            ("PMIX_RANK", "5"),
            ("SLURM_PROCID", "1"),
            ("SLURM_STEP_ID", "0"),
            ("SLURM_STEP_NUM_TASKS", "2"),
        ];
        assert_eq!(launcher_of(&env(&mpirun)), Some("OMPI_COMM_WORLD_SIZE"));
        // mpiexec (Hydra) through srun-started proxies: sizes differ, MPI it is
        let hydra = [
            ("PMI_RANK", "5"),
            ("PMI_SIZE", "8"),
            ("SLURM_PROCID", "1"),
            ("SLURM_STEP_ID", "0"),
            ("SLURM_STEP_NUM_TASKS", "2"),
        ];
        assert_eq!(launcher_of(&env(&hydra)), Some("PMI_RANK"));
        assert_eq!(world_size(&env(&hydra)), Some(("PMI_SIZE", 8)));
        assert_eq!(world_size(&env(&[("PMIX_SIZE", "x")])), None);
    }
}

//! Started by an MPI launcher (`mpirun` / `mpiexec` of Open MPI, MPICH, Intel MPI, or
//! `srun --mpi=pmix` under some conditions) rather than by railrun: the variables that give it
//! away, and the world size it announces.

use super::{get, Env};
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

#[cfg(test)]
mod tests {
    use super::super::testenv::env_of;
    use super::*;

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

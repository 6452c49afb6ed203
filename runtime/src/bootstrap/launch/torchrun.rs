//! torchrun-style environment (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`) becomes
//! [`Launch::HostedStore`]: rank 0 serves the bootstrap store, every rank connects to it.
//!
//! Detected when `RANK` or `WORLD_SIZE` is set (then `RANK`, `WORLD_SIZE`, `MASTER_ADDR` and
//! `MASTER_PORT` are all required; `LOCAL_RANK`/`LOCAL_WORLD_SIZE` are checked when present).
//! Rank 0 serves on `0.0.0.0:PORT`, every rank connects to `MASTER_ADDR:PORT`, where PORT is
//! `RAILRING_STORE_PORT`, else `MASTER_PORT` — except under torchrun's agent store
//! (`TORCHELASTIC_USE_AGENT_STORE=True`, torch ≥ 2), where torchrun's own TCPStore already
//! listens on `MASTER_PORT` and railring uses `MASTER_PORT + 1`.
//!
//! A torchrun started inside a Slurm step (`srun torchrun ...`) leaves its workers both sets of
//! variables; the torchrun ones describe the workers, so they win over Slurm's when
//! `TORCHELASTIC_RUN_ID` is set or when `RANK`/`WORLD_SIZE` disagree with
//! `SLURM_PROCID`/the step's task count.

use super::secret::{secret, sha_hex};
use super::{check_host, env_err, get, host_port, parse_port, parse_u64, required_u64};
use super::{Detected, Env, Launch};
use crate::error::Result;
use crate::vars;

fn truthy(v: Option<String>) -> bool {
    matches!(
        v.as_deref()
            .map(|s| s.trim().to_ascii_lowercase())
            .as_deref(),
        Some("1" | "true" | "yes")
    )
}

/// torchrun-style variables (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`)? Then the
/// launch they describe.
pub fn torchrun(env: Env) -> Result<Option<Detected>> {
    if get(env, vars::TORCHRUN_RANK).is_none() && get(env, vars::TORCHRUN_WORLD_SIZE).is_none() {
        return Ok(None);
    }
    let why = "RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT go together (torchrun-style launch)";
    let rank = required_u64(env, vars::TORCHRUN_RANK, (1 << 24) - 1, why)?;
    let size = required_u64(env, vars::TORCHRUN_WORLD_SIZE, 1 << 24, why)?;
    if size == 0 || rank >= size {
        return Err(env_err(
            vars::TORCHRUN_RANK,
            &rank.to_string(),
            format!("must be below WORLD_SIZE={size}"),
        ));
    }
    let local_rank = parse_u64(env, vars::TORCHRUN_LOCAL_RANK, (1 << 24) - 1)?;
    let local_size = parse_u64(env, vars::TORCHRUN_LOCAL_WORLD_SIZE, 1 << 24)?;
    if let Some(ls) = local_size {
        if ls == 0 || ls > size {
            return Err(env_err(
                vars::TORCHRUN_LOCAL_WORLD_SIZE,
                &ls.to_string(),
                format!("must be between 1 and WORLD_SIZE={size}"),
            ));
        }
        if let Some(lr) = local_rank {
            if lr >= ls {
                return Err(env_err(
                    vars::TORCHRUN_LOCAL_RANK,
                    &lr.to_string(),
                    format!("must be below LOCAL_WORLD_SIZE={ls}"),
                ));
            }
        }
    }
    let addr_raw = get(env, vars::MASTER_ADDR)
        .ok_or_else(|| env_err(vars::MASTER_ADDR, "", format!("not set ({why})")))?;
    let addr = check_host(vars::MASTER_ADDR, &addr_raw)?;
    let master_port = parse_port(env, vars::MASTER_PORT)?
        .ok_or_else(|| env_err(vars::MASTER_PORT, "", format!("not set ({why})")))?;
    let port = match parse_port(env, vars::STORE_PORT)? {
        Some(p) => p,
        None if truthy(env("TORCHELASTIC_USE_AGENT_STORE")) => master_port.checked_add(1).ok_or_else(|| {
            env_err(
                vars::MASTER_PORT,
                &master_port.to_string(),
                "torchrun's agent store holds MASTER_PORT and railring would use MASTER_PORT+1, which is not a port; set RAILRING_STORE_PORT",
            )
        })?,
        None => master_port,
    };
    let run_id = get(env, "TORCHELASTIC_RUN_ID").unwrap_or_default();
    let identity = format!("railring torchrun {addr} {port} {size} {run_id}");
    let (secret, warning) = secret(
        env,
        identity.as_bytes(),
        "MASTER_ADDR, the port, WORLD_SIZE and TORCHELASTIC_RUN_ID",
    )?;
    let job_id = format!("torch{}", &sha_hex(&[identity.as_bytes()])[..16]);
    Ok(Some(Detected {
        launch: Launch::HostedStore {
            rank: rank as usize,
            size: size as usize,
            store_addr: host_port(&addr, port),
            serve_on: format!("0.0.0.0:{port}"),
            secret,
            job_id,
            source: "torchrun-style env",
        },
        warning,
    }))
}

/// Do the torchrun variables describe this process better than Slurm's? True when the process
/// was started by torchrun (`TORCHELASTIC_RUN_ID`) or `RANK`/`WORLD_SIZE` disagree with the
/// Slurm step (a launcher inside the step re-ranked its children).
pub(crate) fn inside_slurm(env: Env) -> bool {
    if get(env, vars::TORCHRUN_RANK).is_none() && get(env, vars::TORCHRUN_WORLD_SIZE).is_none() {
        return false;
    }
    if get(env, "TORCHELASTIC_RUN_ID").is_some() {
        return true;
    }
    let t = |n: &str| get(env, n).map(|v| v.trim().to_string());
    let slurm_size = t("SLURM_STEP_NUM_TASKS").or_else(|| t("SLURM_NTASKS"));
    t(vars::TORCHRUN_RANK) != t("SLURM_PROCID") || t(vars::TORCHRUN_WORLD_SIZE) != slurm_size
}

#[cfg(test)]
mod tests {
    use super::super::testenv::*;
    use super::*;

    #[test]
    fn torchrun_env() {
        let d = torchrun(&env_of(TORCH)).unwrap().unwrap();
        let (rank, size, addr, serve, secret, job) = hosted(&d);
        assert_eq!(
            (rank, size, addr, serve),
            (3, 8, "10.1.2.3:29500", "0.0.0.0:29500")
        );
        assert!(job.starts_with("torch") && job.len() <= 32, "{job}");
        assert!(d.warning.is_some());
        let d0 = torchrun(&with(TORCH, &[("RANK", "0"), ("LOCAL_RANK", "0")]))
            .unwrap()
            .unwrap();
        assert_eq!(hosted(&d0).4, secret);
        assert_eq!(hosted(&d0).5, job);

        let d = torchrun(&with(
            TORCH,
            &[("RAILRING_JOB_SECRET", "abc"), ("MASTER_ADDR", "::1")],
        ))
        .unwrap()
        .unwrap();
        assert_eq!((hosted(&d).2, hosted(&d).4), ("[::1]:29500", "abc"));
        assert_eq!(d.warning, None);
        // torchrun's agent store owns MASTER_PORT.
        let d = torchrun(&with(TORCH, &[("TORCHELASTIC_USE_AGENT_STORE", "True")]))
            .unwrap()
            .unwrap();
        assert_eq!(hosted(&d).2, "10.1.2.3:29501");
        let d = torchrun(&with(
            TORCH,
            &[
                ("TORCHELASTIC_USE_AGENT_STORE", "True"),
                ("RAILRING_STORE_PORT", "3000"),
            ],
        ))
        .unwrap()
        .unwrap();
        assert_eq!(
            (hosted(&d).2, hosted(&d).3),
            ("10.1.2.3:3000", "0.0.0.0:3000")
        );
        // Local variables are optional.
        let bare: Vec<(&str, &str)> = TORCH
            .iter()
            .copied()
            .filter(|(k, _)| !k.starts_with("LOCAL"))
            .collect();
        assert!(torchrun(&env_of(&bare)).unwrap().is_some());
        assert_eq!(
            torchrun(&env_of(&[("MASTER_ADDR", "x"), ("MASTER_PORT", "1")])).unwrap(),
            None
        );
    }

    #[test]
    fn torchrun_errors_name_the_variable() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (&[("RANK", "8")], "RANK"),
            (&[("RANK", "")], "RANK"),
            (&[("WORLD_SIZE", "")], "WORLD_SIZE"),
            (&[("WORLD_SIZE", "0")], "RANK"),
            (&[("MASTER_ADDR", "")], "MASTER_ADDR"),
            (&[("MASTER_ADDR", "a\tb")], "MASTER_ADDR"),
            (&[("MASTER_PORT", "")], "MASTER_PORT"),
            (&[("MASTER_PORT", "http")], "MASTER_PORT"),
            (&[("LOCAL_RANK", "4")], "LOCAL_RANK"),
            (&[("LOCAL_WORLD_SIZE", "9")], "LOCAL_WORLD_SIZE"),
            (&[("LOCAL_WORLD_SIZE", "x")], "LOCAL_WORLD_SIZE"),
            (
                &[
                    ("MASTER_PORT", "65535"),
                    ("TORCHELASTIC_USE_AGENT_STORE", "true"),
                ],
                "MASTER_PORT",
            ),
        ];
        for (extra, var) in cases {
            let (got, why) = err_var(torchrun(&with(TORCH, extra)));
            assert_eq!(&got, var, "{extra:?}: {why}");
        }
    }
}

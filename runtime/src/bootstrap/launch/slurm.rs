//! Slurm direct launch (`srun ./prog`): a Slurm job step becomes [`Launch::HostedStore`]:
//! rank 0 serves the bootstrap store, every rank connects to it.
//!
//! Detected when `SLURM_PROCID` and `SLURM_STEP_ID` (or `SLURM_STEPID`) are set, i.e. inside a
//! job step started by `srun`. A batch script itself (the batch step) has `SLURM_PROCID=0` but
//! no step id: a program run there without `srun` is not a Slurm launch (it runs alone, or as
//! torchrun-style env says).
//!
//! * rank `SLURM_PROCID`, size `SLURM_STEP_NUM_TASKS` (else `SLURM_NTASKS`).
//! * store host: `RAILRING_STORE_HOST`, else the first node of `SLURM_STEP_NODELIST` (else
//!   `SLURM_JOB_NODELIST`, `SLURM_NODELIST`), expanded with [`crate::hostlist::expand`]. Task 0
//!   runs on that node for every standard distribution (block, cyclic, plane); rank 0 checks
//!   `SLURM_NODEID=0` and otherwise asks for `RAILRING_STORE_HOST`. The node name must resolve
//!   to an address reachable from every node (Slurm node names usually do; where `NodeAddr`
//!   differs from the name, set `RAILRING_STORE_HOST` to an address or resolvable name).
//! * port: `RAILRING_STORE_PORT`, else [`slurm_port`]`(SLURM_JOB_ID, step id)`:
//!   `20000 + (job_id * 31 + step_id) % 20000`, i.e. 20000–39999. Concurrent steps of one job
//!   get different ports; two jobs whose first nodes and ports collide fail with "address in
//!   use" on rank 0 — set `RAILRING_STORE_PORT` then.
//! * rank 0 binds `0.0.0.0:PORT`.

use super::secret::secret;
use super::{check_host, clean_id, env_err, get, host_port, parse_port, parse_u64, required_u64};
use super::{Detected, Env, Launch};
use crate::error::Result;
use crate::vars;

/// First port of the range derived for Slurm steps.
pub const SLURM_PORT_BASE: u16 = 20000;
/// Number of ports in that range (20000–39999).
pub const SLURM_PORT_SPAN: u64 = 20000;

/// Step ids at or above this are Slurm's special steps (batch, extern, interactive, pending).
const SLURM_SPECIAL_STEP: u64 = 0xffff_fff0;

/// The store port of a Slurm step when `RAILRING_STORE_PORT` is not set:
/// `20000 + (job_id * 31 + step_id) % 20000`.
pub fn slurm_port(job_id: u64, step_id: u64) -> u16 {
    let x = (job_id as u128 * 31 + step_id as u128) % SLURM_PORT_SPAN as u128;
    SLURM_PORT_BASE + x as u16
}

/// Slurm step id from `SLURM_STEP_ID` / `SLURM_STEPID`; `None` outside a parallel step.
pub(crate) fn step_id(env: Env) -> Result<Option<u64>> {
    for name in ["SLURM_STEP_ID", "SLURM_STEPID"] {
        if let Some(id) = parse_u64(env, name, u32::MAX as u64)? {
            return Ok((id < SLURM_SPECIAL_STEP).then_some(id));
        }
    }
    Ok(None)
}

/// Inside a Slurm job step (`srun`)? Then the launch it describes.
pub fn slurm(env: Env) -> Result<Option<Detected>> {
    if get(env, "SLURM_PROCID").is_none() {
        return Ok(None);
    }
    let Some(step_id) = step_id(env)? else {
        // The batch step (the job script itself) or a special step: not an srun launch.
        return Ok(None);
    };
    let rank = required_u64(env, "SLURM_PROCID", (1 << 24) - 1, "inside a Slurm step")?;
    let (size_var, size) = match parse_u64(env, "SLURM_STEP_NUM_TASKS", 1 << 24)? {
        Some(n) => ("SLURM_STEP_NUM_TASKS", n),
        None => (
            "SLURM_NTASKS",
            required_u64(
                env,
                "SLURM_NTASKS",
                1 << 24,
                "SLURM_STEP_NUM_TASKS is not set either",
            )?,
        ),
    };
    if size == 0 || rank >= size {
        return Err(env_err(
            "SLURM_PROCID",
            &rank.to_string(),
            format!("must be below {size_var}={size}"),
        ));
    }
    let job = required_u64(
        env,
        "SLURM_JOB_ID",
        u32::MAX as u64,
        "needed for the store port and the job secret",
    )?;

    let explicit_host = match get(env, vars::STORE_HOST) {
        Some(h) => Some(check_host(vars::STORE_HOST, &h)?),
        None => None,
    };
    let host = match explicit_host {
        Some(h) => h,
        None => {
            let (var, list) = [
                "SLURM_STEP_NODELIST",
                "SLURM_JOB_NODELIST",
                "SLURM_NODELIST",
            ]
            .into_iter()
            .find_map(|v| get(env, v).map(|s| (v, s)))
            .ok_or_else(|| {
                env_err(
                    "SLURM_STEP_NODELIST",
                    "",
                    "not set (nor SLURM_JOB_NODELIST); set RAILRING_STORE_HOST to rank 0's node",
                )
            })?;
            let names =
                crate::hostlist::expand(&list).map_err(|e| env_err(var, &list, e.to_string()))?;
            let first = names
                .into_iter()
                .next()
                .ok_or_else(|| env_err(var, &list, "lists no node"))?;
            if rank == 0 {
                if let Some(node) = parse_u64(env, "SLURM_NODEID", u32::MAX as u64)? {
                    if node != 0 {
                        return Err(env_err(
                            "SLURM_NODEID",
                            &node.to_string(),
                            format!(
                                "rank 0 runs on node {node} of the step, not on its first node `{first}` ({var}), \
                                 where the other ranks look for the store; set RAILRING_STORE_HOST to rank 0's node \
                                 or use a block or cyclic distribution"
                            ),
                        ));
                    }
                }
            }
            check_host(var, &first)?
        }
    };
    let port = match parse_port(env, vars::STORE_PORT)? {
        Some(p) => p,
        None => slurm_port(job, step_id),
    };
    let identity = format!("railring slurm job {job} step {step_id}");
    let (secret, warning) = secret(env, identity.as_bytes(), "the Slurm job and step ids")?;
    Ok(Some(Detected {
        launch: Launch::HostedStore {
            rank: rank as usize,
            size: size as usize,
            store_addr: host_port(&host, port),
            serve_on: format!("0.0.0.0:{port}"),
            secret,
            job_id: clean_id(&format!("slurm{job}s{step_id}")),
            source: "Slurm step",
        },
        warning,
    }))
}

#[cfg(test)]
mod tests {
    use super::super::testenv::*;
    use super::*;

    #[test]
    fn port_derivation() {
        assert_eq!(slurm_port(1234, 0), 20000 + (1234 * 31) % 20000);
        assert_eq!(slurm_port(0, 0), 20000);
        assert_ne!(slurm_port(1234, 0), slurm_port(1234, 1));
        for (j, s) in [
            (u32::MAX as u64, u32::MAX as u64 - 16),
            (u64::MAX, u64::MAX),
            (7, 3),
        ] {
            let p = slurm_port(j, s);
            assert!((20000..40000).contains(&p), "{p}");
        }
    }

    #[test]
    fn slurm_step() {
        let d = slurm(&env_of(SRUN)).unwrap().unwrap();
        let (rank, size, addr, serve, secret, job) = hosted(&d);
        assert_eq!((rank, size), (2, 4));
        let port = slurm_port(1234, 0);
        assert_eq!(
            addr,
            format!("node07:{port}"),
            "first node of the step, not of the job"
        );
        assert_eq!(serve, format!("0.0.0.0:{port}"));
        assert_eq!(job, "slurm1234s0");
        assert_eq!(secret.len(), 64);
        let w = d.warning.clone().expect("a derived secret must warn");
        assert!(
            w.contains("RAILRING_JOB_SECRET") && w.contains("other users"),
            "{w}"
        );

        // Every task derives the same secret and store; another step or job does not.
        let d0 = slurm(&with(SRUN, &[("SLURM_PROCID", "0"), ("SLURM_NODEID", "0")]))
            .unwrap()
            .unwrap();
        assert_eq!(hosted(&d0).4, secret);
        assert_eq!(hosted(&d0).2, addr);
        let s1 = slurm(&with(SRUN, &[("SLURM_STEP_ID", "1")]))
            .unwrap()
            .unwrap();
        assert_ne!(hosted(&s1).4, secret);
        assert_ne!(hosted(&s1).2, addr);
        let j2 = slurm(&with(SRUN, &[("SLURM_JOB_ID", "1235")]))
            .unwrap()
            .unwrap();
        assert_ne!(hosted(&j2).4, secret);
    }

    #[test]
    fn slurm_fallbacks_and_overrides() {
        // Job node list when the step's is missing; SLURM_NTASKS when the step count is.
        let env = env_of(&[
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_JOB_NODELIST", "a[3-4],b"),
            ("SLURM_JOB_ID", "9"),
            ("SLURM_STEPID", "5"),
        ]);
        let d = slurm(&env).unwrap().unwrap();
        assert_eq!(hosted(&d).0..hosted(&d).1, 1..2);
        assert_eq!(hosted(&d).2, format!("a3:{}", slurm_port(9, 5)));

        let d = slurm(&with(
            SRUN,
            &[
                ("RAILRING_STORE_PORT", "4242"),
                ("RAILRING_STORE_HOST", "n1-ib"),
                ("RAILRING_JOB_SECRET", "s3cret"),
            ],
        ))
        .unwrap()
        .unwrap();
        let (_, _, addr, serve, secret, _) = hosted(&d);
        assert_eq!(
            (addr, serve, secret),
            ("n1-ib:4242", "0.0.0.0:4242", "s3cret")
        );
        assert_eq!(d.warning, None);

        let d = slurm(&with(SRUN, &[("RAILRING_STORE_HOST", "fe80::1")]))
            .unwrap()
            .unwrap();
        assert!(hosted(&d).2.starts_with("[fe80::1]:"), "{}", hosted(&d).2);
    }

    #[test]
    fn not_a_slurm_step() {
        // Outside Slurm, in the batch script (no step id), in special steps.
        assert_eq!(slurm(&env_of(&[])).unwrap(), None);
        assert_eq!(
            slurm(&env_of(&[
                ("SLURM_JOB_ID", "3"),
                ("SLURM_JOB_NODELIST", "n1")
            ]))
            .unwrap(),
            None
        );
        let batch: Vec<(&str, &str)> = SRUN
            .iter()
            .copied()
            .filter(|(k, _)| !k.starts_with("SLURM_STEP"))
            .collect();
        assert_eq!(slurm(&env_of(&batch)).unwrap(), None);
        assert_eq!(
            slurm(&with(
                SRUN,
                &[
                    ("SLURM_STEP_ID", "4294967294"),
                    ("SLURM_STEPID", "4294967294")
                ]
            ))
            .unwrap(),
            None
        );
        assert_eq!(super::super::direct(&env_of(&batch)).unwrap(), None);
    }

    #[test]
    fn slurm_errors_name_the_variable() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (&[("SLURM_PROCID", "x")], "SLURM_PROCID"),
            (&[("SLURM_PROCID", "4")], "SLURM_PROCID"),
            (&[("SLURM_STEP_NUM_TASKS", "-1")], "SLURM_STEP_NUM_TASKS"),
            (&[("SLURM_JOB_ID", "")], "SLURM_JOB_ID"),
            (&[("SLURM_JOB_ID", "12a")], "SLURM_JOB_ID"),
            (&[("SLURM_STEP_ID", "zero")], "SLURM_STEP_ID"),
            (&[("SLURM_STEP_NODELIST", "n[3-1]")], "SLURM_STEP_NODELIST"),
            (
                &[
                    ("SLURM_STEP_NODELIST", "n[1-2"),
                    ("SLURM_JOB_NODELIST", "x"),
                ],
                "SLURM_STEP_NODELIST",
            ),
            (&[("RAILRING_STORE_PORT", "0")], "RAILRING_STORE_PORT"),
            (&[("RAILRING_STORE_PORT", "70000")], "RAILRING_STORE_PORT"),
            (&[("RAILRING_STORE_HOST", "a b")], "RAILRING_STORE_HOST"),
            (
                &[("SLURM_PROCID", "0"), ("SLURM_NODEID", "1")],
                "SLURM_NODEID",
            ),
        ];
        for (extra, var) in cases {
            let (got, why) = err_var(slurm(&with(SRUN, extra)));
            assert_eq!(&got, var, "{extra:?}: {why}");
        }
        let no_lists: Vec<(&str, &str)> = SRUN
            .iter()
            .copied()
            .filter(|(k, _)| !k.ends_with("NODELIST"))
            .collect();
        let (var, why) = err_var(slurm(&env_of(&no_lists)));
        assert_eq!(var, "SLURM_STEP_NODELIST");
        assert!(why.contains("RAILRING_STORE_HOST"), "{why}");
        // ... which RAILRING_STORE_HOST fixes.
        let mut fixed = no_lists.clone();
        fixed.push(("RAILRING_STORE_HOST", "10.0.0.1"));
        assert!(hosted(&slurm(&env_of(&fixed)).unwrap().unwrap())
            .2
            .starts_with("10.0.0.1:"));
        // Rank 0 off the first node is fine with an explicit store host.
        assert!(slurm(&with(
            SRUN,
            &[("SLURM_PROCID", "0"), ("RAILRING_STORE_HOST", "node08")]
        ))
        .unwrap()
        .is_some());
    }
}

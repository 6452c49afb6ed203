//! Started by railrun (or anything that sets `RAILRING_STORE_ADDR`): rank, size, the store's
//! address and the job secret come straight from the environment railrun gives every rank.

use super::{clean_id, env_err, get, Env, Launch};
use crate::error::Result;
use crate::vars;

/// `Some` when `RAILRING_STORE_ADDR` is set: then `RAILRING_RANK`, `RAILRING_WORLD_SIZE` and
/// `RAILRING_JOB_SECRET` must be too (`RAILRING_JOB_ID` is optional).
pub fn railrun(env: Env) -> Result<Option<Launch>> {
    let Some(store_addr) = get(env, vars::STORE_ADDR) else {
        return Ok(None);
    };
    let rank = required(env, vars::RANK)?;
    let size = required(env, vars::WORLD_SIZE)?;
    if size == 0 || rank >= size {
        return Err(env_err(
            vars::RANK,
            &rank.to_string(),
            format!("must be below RAILRING_WORLD_SIZE={size}"),
        ));
    }
    let secret = get(env, vars::JOB_SECRET).ok_or_else(|| {
        env_err(
            vars::JOB_SECRET,
            "",
            "must be set when RAILRING_STORE_ADDR is",
        )
    })?;
    let job_id = clean_id(&get(env, vars::JOB_ID).unwrap_or_else(|| "job".into()));
    Ok(Some(Launch::Store {
        rank,
        size,
        store_addr,
        secret,
        job_id,
        source: "railrun",
    }))
}

/// The CPUs railrun bound this rank to before exec (`RAILRING_BOUND_CPUS`), when it did; a
/// value that does not parse is ignored (the runtime then binds as it would alone).
pub fn bound_cpus(env: Env) -> Option<Vec<usize>> {
    let v = get(env, vars::BOUND_CPUS)?;
    if v.len() > 64 << 10 {
        return None;
    }
    crate::topology::parse_cpulist(v.trim())
        .ok()
        .filter(|c| !c.is_empty())
}

fn required(env: Env, name: &str) -> Result<usize> {
    let v = get(env, name).ok_or_else(|| env_err(name, "", "not set"))?;
    v.trim()
        .parse::<usize>()
        .ok()
        .filter(|&n| n < (1 << 24))
        .ok_or_else(|| env_err(name, &v, "expected a non-negative integer below 2^24"))
}

#[cfg(test)]
mod tests {
    use super::super::testenv::env_of;
    use super::*;
    use crate::error::Error;

    const RAILRUN: &[(&str, &str)] = &[
        ("RAILRING_STORE_ADDR", "127.0.0.1:5000"),
        ("RAILRING_RANK", "1"),
        ("RAILRING_WORLD_SIZE", "4"),
        ("RAILRING_JOB_SECRET", "s"),
        ("RAILRING_JOB_ID", "j-1/x"),
    ];

    #[test]
    fn bound_cpus_from_railrun() {
        assert_eq!(
            bound_cpus(&env_of(&[("RAILRING_BOUND_CPUS", "0-2,5")])),
            Some(vec![0, 1, 2, 5])
        );
        assert_eq!(bound_cpus(&env_of(&[("RAILRING_BOUND_CPUS", "x")])), None);
        assert_eq!(bound_cpus(&env_of(&[])), None);
    }

    #[test]
    fn railrun_env() {
        let l = railrun(&env_of(RAILRUN)).unwrap().unwrap();
        assert_eq!(
            l,
            Launch::Store {
                rank: 1,
                size: 4,
                store_addr: "127.0.0.1:5000".into(),
                secret: "s".into(),
                job_id: "j1x".into(),
                source: "railrun",
            }
        );
        assert_eq!(railrun(&env_of(&[])).unwrap(), None);
        for (k, v) in [
            ("RAILRING_RANK", "4"),
            ("RAILRING_RANK", "x"),
            ("RAILRING_WORLD_SIZE", ""),
            ("RAILRING_JOB_SECRET", " "),
        ] {
            let mut e: Vec<(&str, &str)> = RAILRUN.iter().filter(|p| p.0 != k).copied().collect();
            e.push((k, v));
            match railrun(&env_of(&e)) {
                Err(Error::Env { var, .. }) => {
                    assert!(var == k || var == "RAILRING_RANK", "{k}={v}: {var}")
                }
                other => panic!("{k}={v}: {other:?}"),
            }
        }
    }
}

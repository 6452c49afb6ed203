//! Starting without railrun: a Slurm job step (`srun ./prog`) or a torchrun-style environment
//! (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`). Both become
//! [`Launch::HostedStore`]: rank 0 serves the bootstrap store, every rank connects to it.
//!
//! Everything here reads the environment through a `&dyn Fn(&str) -> Option<String>` so it can
//! be tested without touching the process environment; [`crate::config::launch_from_env`] passes
//! the real one. Nothing here panics on what it reads: bad values are [`Error::Env`] naming the
//! variable.
//!
//! # Slurm direct launch
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
//!
//! # torchrun-style environment
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
//!
//! # The job secret
//!
//! Every connection to the store and between ranks proves knowledge of the job secret. Without
//! railrun nobody hands one out, so every task must derive the same value on its own, and
//! other users must not be able to. In order:
//!
//! 1. `RAILRING_JOB_SECRET` when set (e.g. exported by the batch script from
//!    `/dev/urandom`; srun and torchrun pass the environment on). Best choice.
//! 2. A per-user key file: `RAILRING_JOB_SECRET_FILE`, else `$HOME/.railring/secret` when it
//!    exists. It must be a regular file owned by this user and not readable by group or others
//!    (like an ssh key), on a path every node sees (a shared home). The secret is
//!    HMAC-SHA256(key, job identity) — per job and step, never the key itself.
//! 3. Otherwise a hash of public facts (job id, step id, uid / master address and port). Any
//!    user who can see the job (`squeue`) can compute it: the store and data connections of
//!    this job are then only protected against accidents, not against other users. A WARN says
//!    so on rank 0.

use crate::config::Launch;
use crate::error::{Error, Result};
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The environment, as a lookup function (tests pass a map).
pub type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// First port of the range derived for Slurm steps.
pub const SLURM_PORT_BASE: u16 = 20000;
/// Number of ports in that range (20000–39999).
pub const SLURM_PORT_SPAN: u64 = 20000;
/// Largest key file read for the secret.
pub const MAX_KEY_FILE: u64 = 64 << 10;
/// Default per-user key file, relative to `$HOME`.
pub const DEFAULT_KEY_FILE: &str = ".railring/secret";

/// Step ids at or above this are Slurm's special steps (batch, extern, interactive, pending).
const SLURM_SPECIAL_STEP: u64 = 0xffff_fff0;

/// What detection found: the launch, plus a warning for the user (printed by the caller).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Detected {
    pub launch: Launch,
    pub warning: Option<String>,
}

fn get(env: Env, name: &str) -> Option<String> {
    env(name).filter(|v| !v.trim().is_empty())
}

fn env_err(var: &str, value: &str, why: impl Into<String>) -> Error {
    let value: String = value.chars().take(200).collect();
    Error::Env {
        var: var.into(),
        value,
        why: why.into(),
    }
}

fn parse_u64(env: Env, name: &str, max: u64) -> Result<Option<u64>> {
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

fn required_u64(env: Env, name: &str, max: u64, why_needed: &str) -> Result<u64> {
    parse_u64(env, name, max)?.ok_or_else(|| env_err(name, "", format!("not set ({why_needed})")))
}

fn parse_port(env: Env, name: &str) -> Result<Option<u16>> {
    let Some(v) = get(env, name) else {
        return Ok(None);
    };
    match v.trim().parse::<u16>() {
        Ok(p) if p > 0 => Ok(Some(p)),
        _ => Err(env_err(name, &v, "expected a TCP port, 1 to 65535")),
    }
}

/// A host name or address usable in `host:port`: no whitespace, no control characters.
fn check_host(var: &str, v: &str) -> Result<String> {
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

/// The store port of a Slurm step when `RAILRING_STORE_PORT` is not set:
/// `20000 + (job_id * 31 + step_id) % 20000`.
pub fn slurm_port(job_id: u64, step_id: u64) -> u16 {
    let x = (job_id as u128 * 31 + step_id as u128) % SLURM_PORT_SPAN as u128;
    SLURM_PORT_BASE + x as u16
}

fn hmac_hex(key: &[u8], msg: &[u8]) -> String {
    match <Hmac<Sha256> as KeyInit>::new_from_slice(key) {
        Ok(mut m) => {
            m.update(msg);
            super::auth::hex(&m.finalize().into_bytes())
        }
        // HMAC takes keys of any length; hash instead if that ever changed.
        Err(_) => sha_hex(&[key, msg]),
    }
}

fn sha_hex(parts: &[&[u8]]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p);
    }
    super::auth::hex(&h.finalize())
}

fn current_uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

/// Read a per-user key file, refusing files other users could read.
fn read_key_file(var: &str, path: &Path) -> Result<Vec<u8>> {
    let shown = path.display().to_string();
    let md = std::fs::metadata(path)
        .map_err(|e| env_err(var, &shown, format!("cannot read the key file: {e}")))?;
    if !md.is_file() {
        return Err(env_err(var, &shown, "not a regular file"));
    }
    let uid = current_uid();
    if md.uid() != uid {
        return Err(env_err(
            var,
            &shown,
            format!(
                "the key file belongs to uid {}, not to this user (uid {uid})",
                md.uid()
            ),
        ));
    }
    if md.mode() & 0o077 != 0 {
        return Err(env_err(
            var,
            &shown,
            format!("the key file is readable or writable by group or others (mode {:o}); `chmod 600` it", md.mode() & 0o777),
        ));
    }
    if md.len() > MAX_KEY_FILE {
        return Err(env_err(
            var,
            &shown,
            format!("the key file is larger than {MAX_KEY_FILE} bytes"),
        ));
    }
    let data = std::fs::read(path)
        .map_err(|e| env_err(var, &shown, format!("cannot read the key file: {e}")))?;
    let trimmed = data.trim_ascii();
    if trimmed.len() < 16 {
        return Err(env_err(
            var,
            &shown,
            "the key file holds fewer than 16 bytes; put a long random string in it",
        ));
    }
    Ok(trimmed.to_vec())
}

/// The key file to use, if any: `RAILRING_JOB_SECRET_FILE`, else `$HOME/.railring/secret` when
/// it exists. Returns the variable to blame in errors along with the path.
fn key_file(env: Env) -> Option<(&'static str, PathBuf)> {
    if let Some(p) = get(env, "RAILRING_JOB_SECRET_FILE") {
        return Some(("RAILRING_JOB_SECRET_FILE", PathBuf::from(p)));
    }
    let home = get(env, "HOME")?;
    let p = Path::new(&home).join(DEFAULT_KEY_FILE);
    // symlink_metadata: a dangling link is still "present" and then reported, not ignored.
    std::fs::symlink_metadata(&p).ok().map(|_| ("HOME", p))
}

/// The job secret: explicit, from the key file, or guessable (with a warning).
/// `identity` names the job (same on every task); `what` describes it for the warning.
fn secret(env: Env, identity: &[u8], what: &str) -> Result<(String, Option<String>)> {
    if let Some(s) = get(env, "RAILRING_JOB_SECRET") {
        return Ok((s.trim().to_string(), None));
    }
    if let Some((var, path)) = key_file(env) {
        let key = read_key_file(var, &path)?;
        return Ok((hmac_hex(&key, identity), None));
    }
    let uid = current_uid().to_string();
    let s = sha_hex(&[b"railring guessable job secret", identity, uid.as_bytes()]);
    let warning = format!(
        "no RAILRING_JOB_SECRET and no key file (RAILRING_JOB_SECRET_FILE or ~/{DEFAULT_KEY_FILE}): \
         the job secret is derived from {what} and the uid, which other users of this cluster can \
         see, so they could connect to this job's bootstrap store and data connections. Export \
         RAILRING_JOB_SECRET (e.g. `export RAILRING_JOB_SECRET=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n')` \
         in the batch script) or create a private key file (`umask 077; mkdir -p ~/.railring; \
         head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n' > ~/{DEFAULT_KEY_FILE}`)"
    );
    Ok((s, Some(warning)))
}

fn clean_id(s: &str) -> String {
    s.chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .take(32)
        .collect()
}

/// Slurm step id from `SLURM_STEP_ID` / `SLURM_STEPID`; `None` outside a parallel step.
fn slurm_step_id(env: Env) -> Result<Option<u64>> {
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
    let Some(step_id) = slurm_step_id(env)? else {
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

    let explicit_host = match get(env, "RAILRING_STORE_HOST") {
        Some(h) => Some(check_host("RAILRING_STORE_HOST", &h)?),
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
    let port = match parse_port(env, "RAILRING_STORE_PORT")? {
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
    if get(env, "RANK").is_none() && get(env, "WORLD_SIZE").is_none() {
        return Ok(None);
    }
    let why = "RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT go together (torchrun-style launch)";
    let rank = required_u64(env, "RANK", (1 << 24) - 1, why)?;
    let size = required_u64(env, "WORLD_SIZE", 1 << 24, why)?;
    if size == 0 || rank >= size {
        return Err(env_err(
            "RANK",
            &rank.to_string(),
            format!("must be below WORLD_SIZE={size}"),
        ));
    }
    let local_rank = parse_u64(env, "LOCAL_RANK", (1 << 24) - 1)?;
    let local_size = parse_u64(env, "LOCAL_WORLD_SIZE", 1 << 24)?;
    if let Some(ls) = local_size {
        if ls == 0 || ls > size {
            return Err(env_err(
                "LOCAL_WORLD_SIZE",
                &ls.to_string(),
                format!("must be between 1 and WORLD_SIZE={size}"),
            ));
        }
        if let Some(lr) = local_rank {
            if lr >= ls {
                return Err(env_err(
                    "LOCAL_RANK",
                    &lr.to_string(),
                    format!("must be below LOCAL_WORLD_SIZE={ls}"),
                ));
            }
        }
    }
    let addr_raw = get(env, "MASTER_ADDR")
        .ok_or_else(|| env_err("MASTER_ADDR", "", format!("not set ({why})")))?;
    let addr = check_host("MASTER_ADDR", &addr_raw)?;
    let master_port = parse_port(env, "MASTER_PORT")?
        .ok_or_else(|| env_err("MASTER_PORT", "", format!("not set ({why})")))?;
    let port = match parse_port(env, "RAILRING_STORE_PORT")? {
        Some(p) => p,
        None if truthy(env("TORCHELASTIC_USE_AGENT_STORE")) => master_port.checked_add(1).ok_or_else(|| {
            env_err(
                "MASTER_PORT",
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
fn torchrun_inside_slurm(env: Env) -> bool {
    if get(env, "RANK").is_none() && get(env, "WORLD_SIZE").is_none() {
        return false;
    }
    if get(env, "TORCHELASTIC_RUN_ID").is_some() {
        return true;
    }
    let t = |n: &str| get(env, n).map(|v| v.trim().to_string());
    let slurm_size = t("SLURM_STEP_NUM_TASKS").or_else(|| t("SLURM_NTASKS"));
    t("RANK") != t("SLURM_PROCID") || t("WORLD_SIZE") != slurm_size
}

/// Slurm step, then torchrun-style env (torchrun first when it runs inside the step, see
/// [`torchrun_inside_slurm`]); `None` when neither applies. `RAILRING_STORE_ADDR` (railrun) is
/// checked by the caller before this.
pub fn detect(env: Env) -> Result<Option<Detected>> {
    if get(env, "SLURM_PROCID").is_some()
        && slurm_step_id(env)?.is_some()
        && torchrun_inside_slurm(env)
    {
        return torchrun(env);
    }
    if let Some(d) = slurm(env)? {
        return Ok(Some(d));
    }
    torchrun(env)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::os::unix::fs::PermissionsExt;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    fn with(base: &[(&str, &str)], extra: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let mut v: Vec<(&str, &str)> = base
            .iter()
            .filter(|(k, _)| !extra.iter().any(|(e, _)| e == k))
            .copied()
            .collect();
        v.extend_from_slice(extra);
        env_of(&v)
    }

    fn hosted(d: &Detected) -> (usize, usize, &str, &str, &str, &str) {
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

    fn err_var(r: Result<Option<Detected>>) -> (String, String) {
        match r {
            Err(Error::Env { var, why, .. }) => (var, why),
            other => panic!("expected an Env error, got {other:?}"),
        }
    }

    // What srun sets for task 2 of `srun -N2 --ntasks-per-node=2` in job 1234 step 0 (no HOME:
    // the key-file default must not be picked up from the machine running the tests).
    const SRUN: &[(&str, &str)] = &[
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
        assert_eq!(detect(&env_of(&batch)).unwrap(), None);
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

    const TORCH: &[(&str, &str)] = &[
        ("RANK", "3"),
        ("WORLD_SIZE", "8"),
        ("LOCAL_RANK", "3"),
        ("LOCAL_WORLD_SIZE", "4"),
        ("MASTER_ADDR", "10.1.2.3"),
        ("MASTER_PORT", "29500"),
    ];

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

    #[test]
    fn order_between_slurm_and_torchrun() {
        // Plain srun: Slurm.
        let d = detect(&env_of(SRUN)).unwrap().unwrap();
        assert!(matches!(
            d.launch,
            Launch::HostedStore {
                source: "Slurm step",
                ..
            }
        ));
        // railrun-style agreement (RANK = SLURM_PROCID, same size): still Slurm.
        let d = detect(&with(SRUN, &[("RANK", "2"), ("WORLD_SIZE", "4")]))
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
        let d = detect(&env_of(&both)).unwrap().unwrap();
        assert!(matches!(
            d.launch,
            Launch::HostedStore {
                source: "torchrun-style env",
                rank: 3,
                size: 8,
                ..
            }
        ));
        let d = detect(&with(
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
        assert!(detect(&env_of(TORCH)).unwrap().is_some());
        assert_eq!(detect(&env_of(&[])).unwrap(), None);
    }

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("rr-launch-env-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn secret_from_key_file() {
        let dir = tmpdir("key");
        let key = dir.join("key");
        std::fs::write(&key, "0123456789abcdef0123456789abcdef\n").unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        let k = key.to_str().unwrap();
        let a = slurm(&with(SRUN, &[("RAILRING_JOB_SECRET_FILE", k)]))
            .unwrap()
            .unwrap();
        assert_eq!(a.warning, None);
        let b = slurm(&with(
            SRUN,
            &[("RAILRING_JOB_SECRET_FILE", k), ("SLURM_PROCID", "3")],
        ))
        .unwrap()
        .unwrap();
        assert_eq!(hosted(&a).4, hosted(&b).4, "same job: same secret");
        let c = slurm(&with(
            SRUN,
            &[("RAILRING_JOB_SECRET_FILE", k), ("SLURM_JOB_ID", "99")],
        ))
        .unwrap()
        .unwrap();
        assert_ne!(hosted(&a).4, hosted(&c).4, "per job");
        assert!(
            !hosted(&a).4.contains("0123456789abcdef"),
            "the key itself never becomes the secret"
        );
        let guessable = slurm(&env_of(SRUN)).unwrap().unwrap();
        assert_ne!(hosted(&a).4, hosted(&guessable).4);
        // An explicit secret beats the file.
        let e = slurm(&with(
            SRUN,
            &[
                ("RAILRING_JOB_SECRET_FILE", k),
                ("RAILRING_JOB_SECRET", "x"),
            ],
        ))
        .unwrap()
        .unwrap();
        assert_eq!(hosted(&e).4, "x");

        // The default ~/.railring/secret is used when present.
        let home = dir.join("home");
        std::fs::create_dir_all(home.join(".railring")).unwrap();
        let h = home.to_str().unwrap();
        let none = slurm(&with(SRUN, &[("HOME", h)])).unwrap().unwrap();
        assert!(none.warning.is_some(), "no key file yet");
        std::fs::copy(&key, home.join(DEFAULT_KEY_FILE)).unwrap();
        std::fs::set_permissions(
            home.join(DEFAULT_KEY_FILE),
            std::fs::Permissions::from_mode(0o400),
        )
        .unwrap();
        let dflt = slurm(&with(SRUN, &[("HOME", h)])).unwrap().unwrap();
        assert_eq!(dflt.warning, None);
        assert_eq!(hosted(&dflt).4, hosted(&a).4);

        // Insecure, missing, short or odd files are errors, never silent fallbacks.
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let (var, why) = err_var(slurm(&with(SRUN, &[("RAILRING_JOB_SECRET_FILE", k)])));
        assert_eq!(var, "RAILRING_JOB_SECRET_FILE");
        assert!(why.contains("group or others"), "{why}");
        std::fs::set_permissions(
            home.join(DEFAULT_KEY_FILE),
            std::fs::Permissions::from_mode(0o640),
        )
        .unwrap();
        assert_eq!(err_var(slurm(&with(SRUN, &[("HOME", h)]))).0, "HOME");
        let missing = dir.join("nope");
        let (var, _) = err_var(slurm(&with(
            SRUN,
            &[("RAILRING_JOB_SECRET_FILE", missing.to_str().unwrap())],
        )));
        assert_eq!(var, "RAILRING_JOB_SECRET_FILE");
        std::fs::write(&key, "short").unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(
            err_var(slurm(&with(SRUN, &[("RAILRING_JOB_SECRET_FILE", k)]))).0,
            "RAILRING_JOB_SECRET_FILE"
        );
        assert_eq!(
            err_var(torchrun(&with(TORCH, &[("RAILRING_JOB_SECRET_FILE", k)]))).0,
            "RAILRING_JOB_SECRET_FILE"
        );
        let d = dir.to_str().unwrap();
        assert_eq!(
            err_var(slurm(&with(SRUN, &[("RAILRING_JOB_SECRET_FILE", d)]))).0,
            "RAILRING_JOB_SECRET_FILE"
        );
        let _ = std::fs::remove_dir_all(&dir);
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
                let _ = detect(&with(&both, &[(n, w)]));
                let _ = detect(&with(SRUN, &[(n, w)]));
                let _ = detect(&with(TORCH, &[(n, w)]));
            }
        }
    }
}

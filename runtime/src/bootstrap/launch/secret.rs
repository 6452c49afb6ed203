//! The job secret without a launcher to hand one out.
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

use super::{env_err, get, Env};
use crate::error::Result;
use crate::vars;
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Largest key file read for the secret.
pub const MAX_KEY_FILE: u64 = 64 << 10;
/// Default per-user key file, relative to `$HOME`.
pub const DEFAULT_KEY_FILE: &str = ".railring/secret";

fn hmac_hex(key: &[u8], msg: &[u8]) -> String {
    match <Hmac<Sha256> as KeyInit>::new_from_slice(key) {
        Ok(mut m) => {
            m.update(msg);
            crate::store::auth::hex(&m.finalize().into_bytes())
        }
        // HMAC takes keys of any length; hash instead if that ever changed.
        Err(_) => sha_hex(&[key, msg]),
    }
}

pub(crate) fn sha_hex(parts: &[&[u8]]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p);
    }
    crate::store::auth::hex(&h.finalize())
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
    if let Some(p) = get(env, vars::JOB_SECRET_FILE) {
        return Some((vars::JOB_SECRET_FILE, PathBuf::from(p)));
    }
    let home = get(env, "HOME")?;
    let p = Path::new(&home).join(DEFAULT_KEY_FILE);
    // symlink_metadata: a dangling link is still "present" and then reported, not ignored.
    std::fs::symlink_metadata(&p).ok().map(|_| ("HOME", p))
}

/// The job secret: explicit, from the key file, or guessable (with a warning).
/// `identity` names the job (same on every task); `what` describes it for the warning.
pub(crate) fn secret(env: Env, identity: &[u8], what: &str) -> Result<(String, Option<String>)> {
    if let Some(s) = get(env, vars::JOB_SECRET) {
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

#[cfg(test)]
mod tests {
    use super::super::slurm::slurm;
    use super::super::testenv::*;
    use super::super::torchrun::torchrun;
    use super::*;
    use std::os::unix::fs::PermissionsExt;

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
}

//! Running the tools a cluster needs (`ip`, `unshare`, `nsenter`, `sshd`, ...) and writing its
//! files.

use super::Tools;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

pub(super) fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        let a = a.to_string_lossy();
        if a.is_empty() || a.contains(|c: char| c.is_whitespace() || c == '\'' || c == '"') {
            s.push('\'');
            s.push_str(&a.replace('\'', "'\\''"));
            s.push('\'');
        } else {
            s.push_str(&a);
        }
    }
    s
}

/// Run a command to completion, feeding `input` on stdin; Ok(stdout) on
/// success, otherwise an error naming the command, its status and stderr.
pub(super) fn run_cmd(cmd: &mut Command, input: Option<&str>) -> Result<String, String> {
    let what = describe(cmd);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.stdin(if input.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot run `{what}`: {e}"))?;
    if let Some(input) = input {
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(input.as_bytes())
                .map_err(|e| format!("writing stdin of `{what}`: {e}"))?;
        }
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("waiting for `{what}`: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        let mut msg = format!(
            "`{what}` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
        if let Some(input) = input {
            msg.push_str(&format!("\n  input was:\n{input}"));
        }
        Err(msg)
    }
}

pub(super) fn find_tool(name: &str) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    for d in [
        "/usr/local/sbin",
        "/usr/local/bin",
        "/usr/sbin",
        "/usr/bin",
        "/sbin",
        "/bin",
    ] {
        dirs.push(PathBuf::from(d));
    }
    dirs.into_iter().map(|d| d.join(name)).find(|p| {
        fs::metadata(p)
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    })
}

pub(super) fn resolve_tools(need_tc: bool) -> Result<Tools, String> {
    let mut missing = Vec::new();
    let mut get = |name: &str, pkg: &str| match find_tool(name) {
        Some(p) => p,
        None => {
            missing.push(format!("`{name}` (package {pkg})"));
            PathBuf::new()
        }
    };
    let tools = Tools {
        ip: get("ip", "iproute2"),
        tc: None,
        unshare: get("unshare", "util-linux"),
        nsenter: get("nsenter", "util-linux"),
        sshd: get("sshd", "openssh-server"),
        ssh_keygen: get("ssh-keygen", "openssh-client"),
    };
    get("ssh", "openssh-client");
    let tc = find_tool("tc");
    if need_tc && tc.is_none() {
        missing.push("`tc` (package iproute2)".into());
    }
    if !missing.is_empty() {
        return Err(format!(
            "missing {}; install with `apt-get install -y openssh-server openssh-client iproute2 util-linux`",
            missing.join(", ")
        ));
    }
    Ok(Tools { tc, ..tools })
}

pub(super) fn check_dir_path(p: &Path) -> Result<(), String> {
    let s = p
        .to_str()
        .ok_or_else(|| format!("cluster dir {} is not UTF-8", p.display()))?;
    if s.contains(|c: char| c.is_whitespace() || c == '"' || c == '\'' || c == '%' || c == '\\') {
        return Err(format!(
            "cluster dir {s:?} must not contain whitespace, quotes, backslash or % (it goes into ssh/sshd configs)"
        ));
    }
    Ok(())
}

pub(super) fn write_file(path: &Path, content: &str, mode: u32) -> Result<(), String> {
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)
        .map_err(|e| format!("create {}: {e}", path.display()))?;
    f.write_all(content.as_bytes())
        .map_err(|e| format!("write {}: {e}", path.display()))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .map_err(|e| format!("chmod {}: {e}", path.display()))
}

pub(super) fn is_ci() -> bool {
    match std::env::var("CI") {
        Ok(v) => !(v.is_empty() || v == "0" || v.eq_ignore_ascii_case("false")),
        Err(_) => false,
    }
}

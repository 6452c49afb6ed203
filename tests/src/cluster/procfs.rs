//! Processes and network namespaces as /proc shows them: start times (to recognise a pid
//! again), zombies, command lines, which processes live in which namespace, and running code
//! inside a namespace.

use super::NETNS_DIR;
use std::collections::HashSet;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// (start time in clock ticks) of a live process, from /proc/PID/stat.
pub(super) fn proc_starttime(pid: u32) -> Option<u64> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 1..];
    // fields after comm: state(3) ppid(4) ... starttime(22) => index 19 here
    rest.split_whitespace().nth(19)?.parse().ok()
}

pub(super) fn proc_is_zombie(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rfind(')')
                .map(|i| s[i + 1..].trim_start().starts_with(['Z', 'X']))
        })
        .unwrap_or(true)
}

pub(super) fn proc_cmdline(pid: u32) -> String {
    match fs::read(format!("/proc/{pid}/cmdline")) {
        Ok(b) if !b.is_empty() => {
            let parts: Vec<String> = b
                .split(|c| *c == 0)
                .filter(|p| !p.is_empty())
                .map(|p| String::from_utf8_lossy(p).into_owned())
                .collect();
            parts.join(" ")
        }
        _ => fs::read_to_string(format!("/proc/{pid}/comm"))
            .map(|s| format!("[{}]", s.trim()))
            .unwrap_or_default(),
    }
}

/// (dev, ino) identifying a namespace file (`/run/netns/X`, `/proc/P/ns/net`).
pub(super) fn ns_id(path: &Path) -> Option<(u64, u64)> {
    fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

fn all_pids() -> Vec<u32> {
    let Ok(rd) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

/// Processes whose network namespace is one of `ids` (zombies excluded:
/// their namespace links are gone).
pub(super) fn pids_in_netns(ids: &HashSet<(u64, u64)>) -> Vec<u32> {
    if ids.is_empty() {
        return Vec::new();
    }
    let me = std::process::id();
    all_pids()
        .into_iter()
        .filter(|&p| p != me)
        .filter(|&p| {
            ns_id(Path::new(&format!("/proc/{p}/ns/net")))
                .map(|id| ids.contains(&id))
                .unwrap_or(false)
        })
        .collect()
}

pub(super) fn netns_path(ns: &str) -> PathBuf {
    Path::new(NETNS_DIR).join(ns)
}

/// Run `f` on a fresh thread that has joined the network namespace at
/// `path`. Sockets created there stay in that namespace for their lifetime.
pub(super) fn in_netns_path<R: Send, F: FnOnce() -> R + Send>(
    path: &Path,
    f: F,
) -> Result<R, String> {
    let file = fs::File::open(path).map_err(|e| format!("open {}: {e}", path.display()))?;
    std::thread::scope(|s| {
        s.spawn(move || {
            // SAFETY: plain syscall on a valid fd; affects only this thread.
            let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            if rc != 0 {
                return Err(format!(
                    "setns({}) failed: {}",
                    path.display(),
                    std::io::Error::last_os_error()
                ));
            }
            Ok(f())
        })
        .join()
        .map_err(|_| format!("thread in netns {} panicked", path.display()))?
    })
}

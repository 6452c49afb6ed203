//! The registry of live clusters (one file per tag under [`REGISTRY_DIR`]) and teardown by tag,
//! shared by `Drop`, `attach`/`down` and garbage collection of clusters whose owner died.

use super::cmd::{find_tool, run_cmd, write_file};
use super::procfs::{
    netns_path, ns_id, pids_in_netns, proc_cmdline, proc_is_zombie, proc_starttime,
};
use super::{KILL_WAIT, NETNS_DIR, REGISTRY_DIR};
use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

struct RegEntry {
    tag: String,
    owner: u32,
    start: u64,
    dir: PathBuf,
}

fn registry_path(tag: &str) -> PathBuf {
    Path::new(REGISTRY_DIR).join(tag)
}

pub(super) fn write_registry(tag: &str, owner: u32, dir: &Path) -> Result<(), String> {
    fs::create_dir_all(REGISTRY_DIR).map_err(|e| format!("mkdir {REGISTRY_DIR}: {e}"))?;
    let start = if owner == 0 {
        0
    } else {
        proc_starttime(owner).unwrap_or(0)
    };
    write_file(
        &registry_path(tag),
        &format!("owner={owner}\nstart={start}\ndir={}\n", dir.display()),
        0o644,
    )
}

fn read_registry() -> Vec<RegEntry> {
    let Ok(rd) = fs::read_dir(REGISTRY_DIR) else {
        return Vec::new();
    };
    let mut v = Vec::new();
    for e in rd.flatten() {
        let Some(tag) = e.file_name().to_str().map(str::to_string) else {
            continue;
        };
        let Ok(s) = fs::read_to_string(e.path()) else {
            continue;
        };
        let kv = parse_kv(&s);
        let get = |k: &str| {
            kv.iter()
                .find(|(a, _)| a == k)
                .map(|(_, b)| b.clone())
                .unwrap_or_default()
        };
        v.push(RegEntry {
            tag,
            owner: get("owner").parse().unwrap_or(0),
            start: get("start").parse().unwrap_or(0),
            dir: PathBuf::from(get("dir")),
        });
    }
    v
}

pub(super) fn parse_kv(s: &str) -> Vec<(String, String)> {
    s.lines()
        .filter_map(|l| {
            l.split_once('=')
                .map(|(a, b)| (a.trim().to_string(), b.trim().to_string()))
        })
        .collect()
}

pub(super) fn namespaces_of(tag: &str) -> Vec<String> {
    let prefix = format!("rr{tag}-");
    let Ok(rd) = fs::read_dir(NETNS_DIR) else {
        return Vec::new();
    };
    let mut v: Vec<String> = rd
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|n| n.starts_with(&prefix))
        .collect();
    v.sort();
    v
}

/// Kill every process in the cluster's namespaces, delete the namespaces,
/// the cluster directory and the registry entry. Idempotent; keeps going
/// after errors and reports them all at the end.
pub(super) fn teardown_tag(
    tag: &str,
    ip: Option<&Path>,
    dir: Option<&Path>,
    extra_pids: &[(u32, u64)],
    children: &mut Vec<Child>,
) -> Result<(), String> {
    let mut errors = Vec::new();
    let nss = namespaces_of(tag);
    let ids: HashSet<(u64, u64)> = nss.iter().filter_map(|n| ns_id(&netns_path(n))).collect();

    // 1. kill processes: our own children, remembered pids (if still the same
    //    process), and everything living in the cluster's network namespaces.
    for c in children.iter_mut() {
        let _ = c.kill();
    }
    for &(pid, start) in extra_pids {
        if pid != 0 && start != 0 && proc_starttime(pid) == Some(start) {
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
    }
    let deadline = Instant::now() + KILL_WAIT;
    loop {
        for c in children.iter_mut() {
            let _ = c.try_wait();
        }
        let live: Vec<u32> = pids_in_netns(&ids)
            .into_iter()
            .filter(|&p| !proc_is_zombie(p))
            .collect();
        if live.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            errors.push(format!(
                "processes survived SIGKILL for {KILL_WAIT:?}: {:?}",
                live.iter()
                    .map(|&p| (p, proc_cmdline(p)))
                    .collect::<Vec<_>>()
            ));
            break;
        }
        for p in live {
            // SAFETY: plain kill(2).
            unsafe { libc::kill(p as i32, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    for mut c in children.drain(..) {
        let _ = c.kill();
        let _ = c.wait();
    }

    // 2. delete namespaces (this destroys the veths and bridges with them).
    let ip = ip.map(Path::to_path_buf).or_else(|| find_tool("ip"));
    for ns in &nss {
        let res = match &ip {
            Some(ip) => run_cmd(Command::new(ip).args(["netns", "delete", ns]), None).map(|_| ()),
            None => Err("`ip` not found".to_string()),
        };
        if let Err(e) = res {
            if netns_path(ns).exists() && !e.contains("No such file") {
                errors.push(e);
            }
        }
    }

    // 3. files.
    if let Some(dir) = dir {
        if dir.exists() {
            if let Err(e) = fs::remove_dir_all(dir) {
                errors.push(format!("rm -r {}: {e}", dir.display()));
            }
        }
    }
    let reg = registry_path(tag);
    if reg.exists() {
        if let Err(e) = fs::remove_file(&reg) {
            errors.push(format!("rm {}: {e}", reg.display()));
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(format!("teardown of cluster {tag}: {}", errors.join("; ")))
    }
}

pub(super) fn extra_pids_from_state(dir: &Path) -> Vec<(u32, u64)> {
    let Ok(s) = fs::read_to_string(dir.join("state")) else {
        return Vec::new();
    };
    let kv = parse_kv(&s);
    kv.iter()
        .filter(|(k, _)| k.starts_with("pid."))
        .filter_map(|(_, v)| {
            let (p, st) = v.split_once(':')?;
            Some((p.parse().ok()?, st.parse().ok()?))
        })
        .collect()
}

/// Tear down clusters whose owning process is gone (and that were not
/// detached on purpose). Returns the tags it removed.
pub fn gc_stale() -> Result<Vec<String>, String> {
    let mut removed = Vec::new();
    let mut errors = Vec::new();
    for e in read_registry() {
        if e.owner == 0 {
            continue; // detached (emucluster up): only `emucluster down` removes it
        }
        let alive = proc_starttime(e.owner)
            .map(|s| e.start == 0 || s == e.start)
            .unwrap_or(false);
        if alive {
            continue;
        }
        let dir = (!e.dir.as_os_str().is_empty()).then_some(e.dir.as_path());
        let extra = dir.map(extra_pids_from_state).unwrap_or_default();
        match teardown_tag(&e.tag, None, dir, &extra, &mut Vec::new()) {
            Ok(()) => removed.push(e.tag),
            Err(err) => errors.push(err),
        }
    }
    if errors.is_empty() {
        Ok(removed)
    } else {
        Err(errors.join("\n"))
    }
}

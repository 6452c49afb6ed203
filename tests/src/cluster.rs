//! Emulated cluster: network namespaces + real OpenSSH `sshd` + veth/bridges.
//!
//! See `tests/cluster/README.md` for the layout. In short, a cluster with tag
//! `T` consists of:
//!
//! * namespace `rrT-sw`: the "switch"; it holds the bridges `br-mgmt` and
//!   `br-rail<r>` plus the switch-side veth ends `m-<host>` / `r<r>-<host>`.
//!   No process runs in it and it has no addresses.
//! * namespace `rrT-head`, `rrT-n1` .. `rrT-nN`: one per host. Each host has
//!   a holder process (`sleep infinity`) that owns a private UTS namespace
//!   (hostname = host name) and a private mount namespace (own tmpfs on
//!   `/dev/shm`, `/etc/hosts` bind-mounted from the cluster directory), plus
//!   a real `sshd -D` listening on the host's management address.
//!
//! Addresses (10.77.0.0/16, never routed from the root namespace — the root
//! namespace gets `unreachable 10.77.0.0/16`):
//!
//! * management `mgmt0`: head 10.77.0.1, nK 10.77.0.(10+K), /24
//! * rail r `rail<r>` (nK only): 10.77.(10+r).(10+K), /24
//!
//! Everything is torn down by [`Cluster::down`] (idempotent), which `Drop`
//! calls, so a failing/panicking test does not leak namespaces or processes.
//! Clusters whose owning process died without tearing down (SIGKILL) are
//! garbage-collected by the next [`Cluster::up`] (or `emucluster gc`).

use std::collections::HashSet;
use std::ffi::OsStr;
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

/// Name of the host the launcher runs on.
pub const HEAD: &str = "head";
/// The address range every cluster uses (inside its own namespaces only).
pub const RANGE: &str = "10.77.0.0/16";
/// Where the per-process registry of live clusters lives (used for GC).
pub const REGISTRY_DIR: &str = "/run/railring-emucluster";
/// Maximum number of compute hosts (nK gets 10.77.x.(10+K) ≤ .254).
pub const MAX_HOSTS: usize = 200;
/// Maximum number of rails (rail r uses 10.77.(10+r).0/24).
pub const MAX_RAILS: usize = 64;

const NETNS_DIR: &str = "/run/netns";
const SSHD_WAIT: Duration = Duration::from_secs(15);
const HOLDER_WAIT: Duration = Duration::from_secs(10);
const KILL_WAIT: Duration = Duration::from_secs(5);

/// What to build.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterSpec {
    /// Number of compute hosts `n1`..`nN` (the `head` host is always there).
    pub hosts: usize,
    /// Number of rails per compute host (`rail0`..).
    pub rails: usize,
    /// Optional `tc tbf` rate applied to both directions of every rail link,
    /// in tc syntax, e.g. `"1gbit"`, `"500mbit"`, `"100mbps"`.
    pub rail_rate: Option<String>,
}

impl Default for ClusterSpec {
    fn default() -> Self {
        ClusterSpec {
            hosts: 2,
            rails: 2,
            rail_rate: None,
        }
    }
}

/// Extra knobs for [`Cluster::up_with`].
#[derive(Clone, Debug, Default)]
pub struct UpOptions {
    /// Use this directory (must not exist or be empty; no whitespace, `"`,
    /// `'` or `%` in the path) instead of a fresh temp dir. It is removed by
    /// `down`.
    pub dir: Option<PathBuf>,
    /// Start holders/sshd in their own process group, so the cluster
    /// survives the creating process (used by `emucluster up`).
    pub detached: bool,
}

#[derive(Clone, Debug)]
struct Host {
    name: String,
    /// 0 = head, K = nK
    index: usize,
    ns: String,
    holder: u32,
    sshd: u32,
}

#[derive(Clone, Debug)]
struct Tools {
    ip: PathBuf,
    tc: Option<PathBuf>,
    unshare: PathBuf,
    nsenter: PathBuf,
    sshd: PathBuf,
    ssh_keygen: PathBuf,
}

/// A running emulated cluster. Tears itself down on drop (unless it was
/// obtained through [`Cluster::attach`] or turned into a detached cluster
/// with [`Cluster::detach`]).
pub struct Cluster {
    tag: String,
    hosts_n: usize,
    rails: usize,
    rail_rate: Option<String>,
    dir: PathBuf,
    ssh_cfg: PathBuf,
    hosts: Vec<Host>,
    tools: Tools,
    children: Mutex<Vec<Child>>,
    down_done: Mutex<bool>,
    teardown_on_drop: bool,
}

// ---------------------------------------------------------------------------
// small helpers
// ---------------------------------------------------------------------------

fn describe(cmd: &Command) -> String {
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
fn run_cmd(cmd: &mut Command, input: Option<&str>) -> Result<String, String> {
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

fn find_tool(name: &str) -> Option<PathBuf> {
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

fn resolve_tools(need_tc: bool) -> Result<Tools, String> {
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

/// (start time in clock ticks) of a live process, from /proc/PID/stat.
fn proc_starttime(pid: u32) -> Option<u64> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 1..];
    // fields after comm: state(3) ppid(4) ... starttime(22) => index 19 here
    rest.split_whitespace().nth(19)?.parse().ok()
}

fn proc_is_zombie(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rfind(')')
                .map(|i| s[i + 1..].trim_start().starts_with(['Z', 'X']))
        })
        .unwrap_or(true)
}

fn proc_cmdline(pid: u32) -> String {
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
fn ns_id(path: &Path) -> Option<(u64, u64)> {
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
fn pids_in_netns(ids: &HashSet<(u64, u64)>) -> Vec<u32> {
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

fn netns_path(ns: &str) -> PathBuf {
    Path::new(NETNS_DIR).join(ns)
}

/// Run `f` on a fresh thread that has joined the network namespace at
/// `path`. Sockets created there stay in that namespace for their lifetime.
fn in_netns_path<R: Send, F: FnOnce() -> R + Send>(path: &Path, f: F) -> Result<R, String> {
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

fn mgmt_addr_of(index: usize) -> Ipv4Addr {
    if index == 0 {
        Ipv4Addr::new(10, 77, 0, 1)
    } else {
        Ipv4Addr::new(10, 77, 0, (10 + index) as u8)
    }
}

fn rail_addr_of(index: usize, rail: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 77, (10 + rail) as u8, (10 + index) as u8)
}

fn bad_unit(rate: &str) -> String {
    format!("bad rail rate {rate:?}: unit must be bit/kbit/mbit/gbit/tbit or bps/kbps/mbps/gbps")
}

/// Parse a tc rate ("1gbit", "500mbit", "100mbps", "1000000") into bytes/s.
fn rate_bytes_per_sec(rate: &str) -> Result<f64, String> {
    let r = rate.trim().to_ascii_lowercase();
    let split = r
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(r.len());
    let (num, unit) = r.split_at(split);
    let n: f64 = num.parse().map_err(|_| format!("bad rail rate {rate:?}"))?;
    let bits_mult = match unit {
        "" | "bit" => 1.0,
        "kbit" => 1e3,
        "mbit" => 1e6,
        "gbit" => 1e9,
        "tbit" => 1e12,
        "bps" => 8.0,
        "kbps" => 8e3,
        "mbps" => 8e6,
        "gbps" => 8e9,
        "tbps" => 8e12,
        _ => return Err(bad_unit(rate)),
    };
    let bps = n * bits_mult / 8.0;
    if bps < 1000.0 {
        return Err(format!("rail rate {rate:?} is too small"));
    }
    Ok(bps)
}

fn check_dir_path(p: &Path) -> Result<(), String> {
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

fn write_file(path: &Path, content: &str, mode: u32) -> Result<(), String> {
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

fn is_ci() -> bool {
    match std::env::var("CI") {
        Ok(v) => !(v.is_empty() || v == "0" || v.eq_ignore_ascii_case("false")),
        Err(_) => false,
    }
}

// ---------------------------------------------------------------------------
// root-namespace safety
// ---------------------------------------------------------------------------

fn in_range(a: Ipv4Addr) -> bool {
    let o = a.octets();
    o[0] == 10 && o[1] == 77
}

/// Ensure the root namespace blackholes 10.77.0.0/16 and has no address or
/// other route in it. Never adds anything else to the root namespace.
fn ensure_root_safety(ip: &Path) -> Result<(), String> {
    let mut add = Command::new(ip);
    add.args(["route", "add", "unreachable", RANGE]);
    if let Err(e) = run_cmd(&mut add, None) {
        if !e.contains("File exists") {
            return Err(format!("network safety: {e}"));
        }
    }
    let exact = run_cmd(
        Command::new(ip).args(["-4", "route", "show", "exact", RANGE]),
        None,
    )?;
    if !exact
        .lines()
        .any(|l| l.trim_start().starts_with("unreachable"))
    {
        return Err(format!(
            "network safety: the root namespace has a route for {RANGE} that is not `unreachable`:\n{exact}\nrefusing to build a cluster"
        ));
    }
    let inner = run_cmd(
        Command::new(ip).args(["-4", "route", "show", "root", RANGE]),
        None,
    )?;
    let bad: Vec<&str> = inner
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with("unreachable 10.77.0.0/16"))
        .collect();
    if !bad.is_empty() {
        return Err(format!(
            "network safety: the root namespace has routes inside {RANGE}: {bad:?}; refusing to build a cluster"
        ));
    }
    for (dev, a) in root_addrs(ip)? {
        if in_range(a) {
            return Err(format!(
                "network safety: the root namespace has address {a} on {dev} inside {RANGE}; refusing to build a cluster"
            ));
        }
    }
    Ok(())
}

/// IPv4 addresses of the root namespace, as (device, address).
pub fn root_addrs(ip: &Path) -> Result<Vec<(String, Ipv4Addr)>, String> {
    let out = run_cmd(Command::new(ip).args(["-4", "-o", "addr", "show"]), None)?;
    let mut v = Vec::new();
    for line in out.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if let Some(i) = f.iter().position(|x| *x == "inet") {
            if let Some(a) = f
                .get(i + 1)
                .and_then(|s| s.split('/').next())
                .and_then(|s| s.parse().ok())
            {
                v.push((
                    f.get(1).unwrap_or(&"?").trim_end_matches(':').to_string(),
                    a,
                ));
            }
        }
    }
    Ok(v)
}

// ---------------------------------------------------------------------------
// registry + teardown by tag (shared by Drop, attach/down and GC)
// ---------------------------------------------------------------------------

struct RegEntry {
    tag: String,
    owner: u32,
    start: u64,
    dir: PathBuf,
}

fn registry_path(tag: &str) -> PathBuf {
    Path::new(REGISTRY_DIR).join(tag)
}

fn write_registry(tag: &str, owner: u32, dir: &Path) -> Result<(), String> {
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

fn parse_kv(s: &str) -> Vec<(String, String)> {
    s.lines()
        .filter_map(|l| {
            l.split_once('=')
                .map(|(a, b)| (a.trim().to_string(), b.trim().to_string()))
        })
        .collect()
}

fn namespaces_of(tag: &str) -> Vec<String> {
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
fn teardown_tag(
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

fn extra_pids_from_state(dir: &Path) -> Vec<(u32, u64)> {
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

// ---------------------------------------------------------------------------
// the cluster
// ---------------------------------------------------------------------------

static COUNTER: AtomicUsize = AtomicUsize::new(0);

impl Cluster {
    /// Ok if this machine can run an emulated cluster, otherwise why not.
    pub fn available() -> Result<(), String> {
        // SAFETY: trivial syscall.
        if unsafe { libc::geteuid() } != 0 {
            return Err("emulated cluster needs root (network namespaces, mounts)".into());
        }
        if !Path::new("/proc/self/ns/net").exists() || !Path::new("/proc/self/ns/uts").exists() {
            return Err("kernel lacks network/UTS namespaces (/proc/self/ns/{net,uts})".into());
        }
        resolve_tools(false).map(|_| ())
    }

    /// For tests: `true` if the cluster can be used. Otherwise prints
    /// `SKIPPED: <test>: <why>` (uncaptured, so it shows up in `cargo test`
    /// output) and returns `false` — unless the `CI`
    /// environment variable is set, in which case it panics (a missing
    /// prerequisite is a failure in CI).
    pub fn check_or_skip(test: &str) -> bool {
        match Self::available() {
            Ok(()) => true,
            Err(why) if is_ci() => panic!("{test}: emulated cluster unavailable under CI: {why}"),
            Err(why) => {
                // Straight to fd 2: libtest captures eprintln! of passing tests.
                let _ = writeln!(
                    std::io::stderr(),
                    "SKIPPED: {test}: emulated cluster unavailable: {why}"
                );
                false
            }
        }
    }

    /// Build a cluster in a fresh temp dir; it is torn down on drop.
    pub fn up(spec: ClusterSpec) -> Result<Cluster, String> {
        Self::up_with(spec, UpOptions::default())
    }

    /// Build a cluster with extra options (see [`UpOptions`]).
    pub fn up_with(spec: ClusterSpec, opts: UpOptions) -> Result<Cluster, String> {
        Self::available()?;
        if spec.hosts == 0 || spec.hosts > MAX_HOSTS {
            return Err(format!("hosts must be 1..={MAX_HOSTS}, got {}", spec.hosts));
        }
        if spec.rails > MAX_RAILS {
            return Err(format!("rails must be 0..={MAX_RAILS}, got {}", spec.rails));
        }
        let rate_bps = spec
            .rail_rate
            .as_deref()
            .map(rate_bytes_per_sec)
            .transpose()?;
        let tools = resolve_tools(rate_bps.is_some())?;

        if let Err(e) = gc_stale() {
            eprintln!("emucluster: warning: garbage-collecting stale clusters: {e}");
        }
        ensure_root_safety(&tools.ip)?;
        fs::create_dir_all("/run/sshd").map_err(|e| format!("mkdir /run/sshd: {e}"))?;

        let tag = format!(
            "{}c{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::SeqCst)
        );
        let dir = match &opts.dir {
            Some(d) => {
                let d = if d.is_absolute() {
                    d.clone()
                } else {
                    std::env::current_dir()
                        .map_err(|e| format!("cwd: {e}"))?
                        .join(d)
                };
                if d.exists()
                    && fs::read_dir(&d)
                        .map(|mut r| r.next().is_some())
                        .unwrap_or(true)
                {
                    return Err(format!("state dir {} exists and is not empty", d.display()));
                }
                d
            }
            None => std::env::temp_dir().join(format!("rrcluster-{tag}")),
        };
        check_dir_path(&dir)?;
        fs::create_dir_all(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
        if !namespaces_of(&tag).is_empty() {
            return Err(format!(
                "namespaces rr{tag}-* already exist; run `emucluster gc`"
            ));
        }
        write_registry(&tag, std::process::id(), &dir)?;

        let mut hosts = vec![Host {
            name: HEAD.to_string(),
            index: 0,
            ns: format!("rr{tag}-{HEAD}"),
            holder: 0,
            sshd: 0,
        }];
        for k in 1..=spec.hosts {
            hosts.push(Host {
                name: format!("n{k}"),
                index: k,
                ns: format!("rr{tag}-n{k}"),
                holder: 0,
                sshd: 0,
            });
        }
        let mut cluster = Cluster {
            tag,
            hosts_n: spec.hosts,
            rails: spec.rails,
            rail_rate: spec.rail_rate.clone(),
            ssh_cfg: dir.join("ssh_config"),
            dir,
            hosts,
            tools,
            children: Mutex::new(Vec::new()),
            down_done: Mutex::new(false),
            teardown_on_drop: true,
        };
        // From here on, `cluster` owns everything: an error drops it, which
        // tears down whatever was created so far.
        cluster.build(rate_bps, opts.detached)?;
        Ok(cluster)
    }

    fn sw_ns(&self) -> String {
        format!("rr{}-sw", self.tag)
    }

    fn build(&mut self, rate_bps: Option<f64>, detached: bool) -> Result<(), String> {
        let ip = self.tools.ip.clone();
        let dir = self.dir.clone();

        // keys, configs, /etc/hosts
        for key in ["ssh_host_ed25519_key", "id_ed25519"] {
            run_cmd(
                Command::new(&self.tools.ssh_keygen)
                    .args([
                        "-q",
                        "-t",
                        "ed25519",
                        "-N",
                        "",
                        "-C",
                        &format!("railring-emucluster-{}", self.tag),
                        "-f",
                    ])
                    .arg(dir.join(key)),
                None,
            )?;
            fs::set_permissions(dir.join(key), fs::Permissions::from_mode(0o600))
                .map_err(|e| format!("chmod {key}: {e}"))?;
        }
        let pubkey = fs::read_to_string(dir.join("id_ed25519.pub"))
            .map_err(|e| format!("read id_ed25519.pub: {e}"))?;
        write_file(&dir.join("authorized_keys"), &pubkey, 0o600)?;

        let mut etc_hosts = String::from("127.0.0.1\tlocalhost\n");
        for h in &self.hosts {
            etc_hosts.push_str(&format!("{}\t{}\n", mgmt_addr_of(h.index), h.name));
        }
        for h in self.hosts.iter().skip(1) {
            for r in 0..self.rails {
                etc_hosts.push_str(&format!(
                    "{}\t{}-rail{r}\n",
                    rail_addr_of(h.index, r),
                    h.name
                ));
            }
        }
        write_file(&dir.join("hosts"), &etc_hosts, 0o644)?;

        let mut ssh_config = String::new();
        for h in &self.hosts {
            ssh_config.push_str(&format!(
                "Host {name}\n  HostName {addr}\n  User root\n  IdentityFile {id}\n  IdentitiesOnly yes\n  \
                 StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  BatchMode yes\n  LogLevel ERROR\n  \
                 ConnectTimeout 5\n\n",
                name = h.name,
                addr = mgmt_addr_of(h.index),
                id = dir.join("id_ed25519").display()
            ));
        }
        write_file(&dir.join("ssh_config"), &ssh_config, 0o644)?;

        for h in &self.hosts {
            let hd = dir.join(&h.name);
            fs::create_dir_all(&hd).map_err(|e| format!("mkdir {}: {e}", hd.display()))?;
            let cfg = format!(
                "# railring emulated cluster {tag}, host {name}\n\
                 ListenAddress {addr}\n\
                 Port 22\n\
                 HostKey {dir}/ssh_host_ed25519_key\n\
                 PidFile {hd}/sshd.pid\n\
                 UsePAM no\n\
                 StrictModes no\n\
                 AuthorizedKeysFile {dir}/authorized_keys\n\
                 PermitRootLogin prohibit-password\n\
                 PubkeyAuthentication yes\n\
                 PasswordAuthentication no\n\
                 KbdInteractiveAuthentication no\n\
                 UseDNS no\n\
                 PrintMotd no\n\
                 PrintLastLog no\n\
                 MaxStartups 256\n\
                 MaxSessions 256\n\
                 LogLevel INFO\n",
                tag = self.tag,
                name = h.name,
                addr = mgmt_addr_of(h.index),
                dir = dir.display(),
                hd = hd.display()
            );
            write_file(&hd.join("sshd_config"), &cfg, 0o644)?;
        }

        // namespaces
        let sw = self.sw_ns();
        let mut all_ns = vec![sw.clone()];
        all_ns.extend(self.hosts.iter().map(|h| h.ns.clone()));
        for ns in &all_ns {
            run_cmd(Command::new(&ip).args(["netns", "add", ns]), None)?;
        }
        // switch: no IPv6 chatter on the links (keeps rail counters clean)
        run_cmd(
            Command::new(&ip).args(["netns", "exec", &sw, "sh", "-c"]).arg(
                "for f in /proc/sys/net/ipv6/conf/all/disable_ipv6 /proc/sys/net/ipv6/conf/default/disable_ipv6; \
                 do [ -e $f ] && echo 1 > $f; done; true",
            ),
            None,
        )?;

        // holders: own UTS + mount namespaces, inside the host's netns
        let script = "set -e\n\
            for f in /proc/sys/net/ipv6/conf/all/disable_ipv6 /proc/sys/net/ipv6/conf/default/disable_ipv6; do\n\
              if [ -e $f ]; then echo 1 > $f; fi\n\
            done\n\
            echo \"$1\" > /proc/sys/kernel/hostname\n\
            mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /dev/shm\n\
            mount --bind \"$2\" /etc/hosts\n\
            echo ready\n\
            exec sleep infinity\n";
        let (tx, rx) = mpsc::channel::<(usize, String)>();
        for i in 0..self.hosts.len() {
            let h = self.hosts[i].clone();
            let log = fs::File::create(dir.join(&h.name).join("holder.log"))
                .map_err(|e| format!("create holder.log: {e}"))?;
            let mut cmd = Command::new(&ip);
            cmd.args(["netns", "exec", &h.ns])
                .arg(&self.tools.unshare)
                .args([
                    "--uts",
                    "--mount",
                    "--propagation",
                    "private",
                    "sh",
                    "-c",
                    script,
                    "holder",
                ])
                .arg(&h.name)
                .arg(dir.join("hosts"))
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(log);
            if detached {
                cmd.process_group(0);
            }
            let what = describe(&cmd);
            let mut child = cmd
                .spawn()
                .map_err(|e| format!("cannot run `{what}`: {e}"))?;
            self.hosts[i].holder = child.id();
            let stdout = child.stdout.take();
            self.children
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(child);
            let tx = tx.clone();
            std::thread::spawn(move || {
                let mut line = String::new();
                if let Some(out) = stdout {
                    let _ = BufReader::new(out).read_line(&mut line);
                }
                let _ = tx.send((i, line));
            });
        }
        drop(tx);
        let deadline = Instant::now() + HOLDER_WAIT;
        let mut ready = vec![false; self.hosts.len()];
        while ready.iter().any(|r| !r) {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok((i, line)) if line.trim() == "ready" => ready[i] = true,
                Ok((i, line)) => {
                    let h = &self.hosts[i];
                    let log = fs::read_to_string(dir.join(&h.name).join("holder.log"))
                        .unwrap_or_default();
                    return Err(format!(
                        "holder for host {} (netns {}) failed (said {:?}): {}",
                        h.name,
                        h.ns,
                        line.trim(),
                        log.trim()
                    ));
                }
                Err(_) => {
                    let late: Vec<&str> = self
                        .hosts
                        .iter()
                        .zip(&ready)
                        .filter(|(_, r)| !**r)
                        .map(|(h, _)| h.name.as_str())
                        .collect();
                    return Err(format!(
                        "holders for {late:?} not ready after {HOLDER_WAIT:?}"
                    ));
                }
            }
        }

        // links: everything is created from the switch namespace, with the
        // peer end created directly in the host namespace.
        let mut swb =
            String::from("link set lo up\nlink add br-mgmt type bridge\nlink set br-mgmt up\n");
        for r in 0..self.rails {
            swb.push_str(&format!(
                "link add br-rail{r} type bridge\nlink set br-rail{r} up\n"
            ));
        }
        for h in &self.hosts {
            swb.push_str(&format!(
                "link add m-{n} type veth peer name mgmt0 netns {ns}\nlink set m-{n} master br-mgmt up\n",
                n = h.name,
                ns = h.ns
            ));
            if h.index > 0 {
                for r in 0..self.rails {
                    swb.push_str(&format!(
                        "link add r{r}-{n} type veth peer name rail{r} netns {ns}\nlink set r{r}-{n} master br-rail{r} up\n",
                        n = h.name,
                        ns = h.ns
                    ));
                }
            }
        }
        run_cmd(
            Command::new(&ip).args(["-n", &sw, "-batch", "-"]),
            Some(&swb),
        )?;
        for h in &self.hosts {
            let mut hb = format!(
                "link set lo up\naddr add {}/24 dev mgmt0\nlink set mgmt0 up\n",
                mgmt_addr_of(h.index)
            );
            if h.index > 0 {
                for r in 0..self.rails {
                    hb.push_str(&format!(
                        "addr add {}/24 dev rail{r}\nlink set rail{r} up\n",
                        rail_addr_of(h.index, r)
                    ));
                }
            }
            run_cmd(
                Command::new(&ip).args(["-n", &h.ns, "-batch", "-"]),
                Some(&hb),
            )?;
        }
        if let Some(bps) = rate_bps {
            let tc = self.tools.tc.clone().ok_or("tc not found")?;
            let rate = self.rail_rate.clone().unwrap_or_default();
            // burst: 10 ms worth of traffic, at least 128 KiB (veth GSO packets)
            let burst = ((bps * 0.010) as u64).max(128 * 1024);
            let qdisc = |dev: &str| {
                format!("qdisc add dev {dev} root tbf rate {rate} burst {burst} latency 50ms\n")
            };
            let mut swt = String::new();
            for h in self.hosts.iter().skip(1) {
                let mut ht = String::new();
                for r in 0..self.rails {
                    swt.push_str(&qdisc(&format!("r{r}-{}", h.name)));
                    ht.push_str(&qdisc(&format!("rail{r}")));
                }
                if !ht.is_empty() {
                    run_cmd(
                        Command::new(&tc).args(["-n", &h.ns, "-batch", "-"]),
                        Some(&ht),
                    )?;
                }
            }
            if !swt.is_empty() {
                run_cmd(
                    Command::new(&tc).args(["-n", &sw, "-batch", "-"]),
                    Some(&swt),
                )?;
            }
        }

        // sshd per host (in the holder's namespaces), then wait for banners
        for i in 0..self.hosts.len() {
            let h = self.hosts[i].clone();
            let hd = dir.join(&h.name);
            let log = fs::File::create(hd.join("sshd.log"))
                .map_err(|e| format!("create sshd.log: {e}"))?;
            let log2 = log.try_clone().map_err(|e| format!("dup sshd.log: {e}"))?;
            let mut cmd = Command::new(&self.tools.nsenter);
            cmd.arg("-t")
                .arg(h.holder.to_string())
                .args(["-n", "-u", "-m", "--"])
                .arg(&self.tools.sshd)
                .args(["-D", "-e", "-f"])
                .arg(hd.join("sshd_config"))
                .stdin(Stdio::null())
                .stdout(log)
                .stderr(log2);
            if detached {
                cmd.process_group(0);
            }
            let what = describe(&cmd);
            let child = cmd
                .spawn()
                .map_err(|e| format!("cannot run `{what}`: {e}"))?;
            self.hosts[i].sshd = child.id();
            self.children
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(child);
        }
        self.wait_sshd()?;
        self.write_state()?;
        Ok(())
    }

    /// Poll (from inside the head namespace) until every sshd answers with
    /// its SSH banner.
    fn wait_sshd(&self) -> Result<(), String> {
        let targets: Vec<(String, Ipv4Addr)> = self
            .hosts
            .iter()
            .map(|h| (h.name.clone(), mgmt_addr_of(h.index)))
            .collect();
        let deadline = Instant::now() + SSHD_WAIT;
        let mut pending: Vec<(String, Ipv4Addr)> = targets;
        let head = netns_path(&self.hosts[0].ns);
        loop {
            let still = in_netns_path(&head, || {
                pending
                    .iter()
                    .filter(|(_, a)| !ssh_banner_ok(SocketAddr::V4(SocketAddrV4::new(*a, 22))))
                    .cloned()
                    .collect::<Vec<_>>()
            })?;
            if still.is_empty() {
                return Ok(());
            }
            // an sshd that exited is not going to come up
            {
                let mut ch = self.children.lock().unwrap_or_else(|e| e.into_inner());
                for h in &self.hosts {
                    if let Some(c) = ch.iter_mut().find(|c| c.id() == h.sshd) {
                        if let Ok(Some(st)) = c.try_wait() {
                            let log = fs::read_to_string(self.dir.join(&h.name).join("sshd.log"))
                                .unwrap_or_default();
                            return Err(format!(
                                "sshd on {} exited ({st}): {}",
                                h.name,
                                log.trim()
                            ));
                        }
                    }
                }
            }
            if Instant::now() > deadline {
                let logs: Vec<String> = still
                    .iter()
                    .map(|(n, _)| {
                        let log = fs::read_to_string(self.dir.join(n).join("sshd.log"))
                            .unwrap_or_default();
                        format!("{n}: {}", log.trim())
                    })
                    .collect();
                return Err(format!(
                    "sshd not answering after {SSHD_WAIT:?}: {}",
                    logs.join("; ")
                ));
            }
            pending = still;
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn write_state(&self) -> Result<(), String> {
        let mut s = format!(
            "tag={}\nhosts={}\nrails={}\nrate={}\n",
            self.tag,
            self.hosts_n,
            self.rails,
            self.rail_rate.clone().unwrap_or_default()
        );
        for h in &self.hosts {
            s.push_str(&format!(
                "holder.{}={}\nsshd.{}={}\n",
                h.name, h.holder, h.name, h.sshd
            ));
            for p in [h.holder, h.sshd] {
                if let Some(st) = proc_starttime(p) {
                    s.push_str(&format!("pid.{p}={p}:{st}\n"));
                }
            }
        }
        write_file(&self.dir.join("state"), &s, 0o644)
    }

    /// Re-open a cluster created by `emucluster up --state DIR` (or any
    /// cluster whose directory is `dir`). The returned handle does NOT tear
    /// the cluster down on drop; call [`Cluster::down`] for that.
    pub fn attach(dir: &Path) -> Result<Cluster, String> {
        let text = fs::read_to_string(dir.join("state")).map_err(|e| {
            format!(
                "{}: no cluster state here ({e})",
                dir.join("state").display()
            )
        })?;
        let kv = parse_kv(&text);
        let get = |k: &str| kv.iter().find(|(a, _)| a == k).map(|(_, b)| b.clone());
        let tag = get("tag").ok_or("state file lacks tag")?;
        let hosts_n: usize = get("hosts")
            .and_then(|s| s.parse().ok())
            .ok_or("state file lacks hosts")?;
        let rails: usize = get("rails")
            .and_then(|s| s.parse().ok())
            .ok_or("state file lacks rails")?;
        let rate = get("rate").filter(|s| !s.is_empty());
        let mut hosts = Vec::new();
        for k in 0..=hosts_n {
            let name = if k == 0 {
                HEAD.to_string()
            } else {
                format!("n{k}")
            };
            let pid = |what: &str| {
                get(&format!("{what}.{name}"))
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0u32)
            };
            hosts.push(Host {
                ns: format!("rr{tag}-{name}"),
                holder: pid("holder"),
                sshd: pid("sshd"),
                name,
                index: k,
            });
        }
        let tools = resolve_tools(false)?;
        let dir = if dir.is_absolute() {
            dir.to_path_buf()
        } else {
            std::env::current_dir()
                .map_err(|e| format!("cwd: {e}"))?
                .join(dir)
        };
        Ok(Cluster {
            tag,
            hosts_n,
            rails,
            rail_rate: rate,
            ssh_cfg: dir.join("ssh_config"),
            dir,
            hosts,
            tools,
            children: Mutex::new(Vec::new()),
            down_done: Mutex::new(false),
            teardown_on_drop: false,
        })
    }

    /// Keep the cluster running after this handle (and this process) goes
    /// away: marks it as detached in the registry so GC leaves it alone.
    /// Tear it down later with `Cluster::attach(dir)?.down()` /
    /// `emucluster down --state DIR`.
    pub fn detach(mut self) -> Result<PathBuf, String> {
        write_registry(&self.tag, 0, &self.dir)?;
        self.teardown_on_drop = false;
        // Dropping `Child` handles neither kills nor waits.
        self.children
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        Ok(self.dir.clone())
    }

    /// Tear everything down: kill all processes in the hosts' namespaces,
    /// delete the namespaces (and with them all links), the cluster
    /// directory and the registry entry. Idempotent. The root namespace's
    /// `unreachable 10.77.0.0/16` route is left in place on purpose (it is
    /// shared by concurrent clusters and harmless).
    pub fn down(&self) -> Result<(), String> {
        let mut done = self.down_done.lock().unwrap_or_else(|e| e.into_inner());
        if *done {
            return Ok(());
        }
        let mut children = self.children.lock().unwrap_or_else(|e| e.into_inner());
        let extra = extra_pids_from_state(&self.dir);
        let res = teardown_tag(
            &self.tag,
            Some(&self.tools.ip),
            Some(&self.dir),
            &extra,
            &mut children,
        );
        *done = true;
        res
    }

    // ---------------------------------------------------------------- queries

    fn host(&self, name: &str) -> &Host {
        self.hosts
            .iter()
            .find(|h| h.name == name)
            .unwrap_or_else(|| {
                panic!(
                    "emulated cluster {}: unknown host {name:?} (have {:?})",
                    self.tag,
                    self.hosts.iter().map(|h| &h.name).collect::<Vec<_>>()
                )
            })
    }

    /// The cluster's unique tag (namespace names are `rr<tag>-<host>`).
    pub fn tag(&self) -> &str {
        &self.tag
    }

    /// The cluster directory (keys, configs, logs, hostfiles).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Compute host names `n1`..`nN` (without `head`).
    pub fn host_names(&self) -> Vec<String> {
        self.hosts.iter().skip(1).map(|h| h.name.clone()).collect()
    }

    /// Number of rails per compute host.
    pub fn rails(&self) -> usize {
        self.rails
    }

    /// The network namespace name of a host (`"head"`, `"n1"`, ...).
    pub fn netns(&self, host: &str) -> String {
        self.host(host).ns.clone()
    }

    /// PID of the holder process of a host (target for `nsenter -t`).
    pub fn holder_pid(&self, host: &str) -> u32 {
        self.host(host).holder
    }

    /// PID of the sshd listener of a host.
    pub fn sshd_pid(&self, host: &str) -> u32 {
        self.host(host).sshd
    }

    /// The ssh client config (`Host head`, `Host n1`, ...).
    pub fn ssh_config(&self) -> &Path {
        &self.ssh_cfg
    }

    /// `"ssh -F <dir>/ssh_config"`: a launcher's remote-shell command.
    pub fn ssh_command(&self) -> String {
        format!("ssh -F {}", self.ssh_cfg.display())
    }

    /// Management address of a host (head: 10.77.0.1, nK: 10.77.0.(10+K)).
    pub fn mgmt_addr(&self, host: &str) -> Ipv4Addr {
        mgmt_addr_of(self.host(host).index)
    }

    /// Address of compute host `host` on rail `rail`: 10.77.(10+rail).(10+K).
    /// Panics for `head` (no rail addresses) or a rail out of range.
    pub fn rail_addr(&self, host: &str, rail: usize) -> Ipv4Addr {
        let h = self.host(host);
        assert!(
            h.index > 0,
            "emulated cluster: {host} has no rail addresses"
        );
        assert!(
            rail < self.rails,
            "emulated cluster: rail {rail} out of range (rails = {})",
            self.rails
        );
        rail_addr_of(h.index, rail)
    }

    /// A command that runs `argv` inside `host`'s network, UTS and mount
    /// namespaces (via `nsenter -t <holder>`), in the caller's current
    /// directory. Add env/stdio and spawn it as usual. An empty `argv` runs
    /// `$SHELL`.
    pub fn exec(&self, host: &str, argv: &[&str]) -> Command {
        self.exec_os(host, argv)
    }

    /// Like [`Cluster::exec`] for non-UTF-8 arguments.
    pub fn exec_os<S: AsRef<OsStr>>(&self, host: &str, argv: &[S]) -> Command {
        let h = self.host(host);
        let mut c = Command::new(&self.tools.nsenter);
        c.arg("-t")
            .arg(h.holder.to_string())
            .args(["-n", "-u", "-m", "--wd=.", "--"]);
        c.args(argv);
        c
    }

    /// Run `f` on a thread inside `host`'s network namespace (sockets made
    /// there stay there). Name resolution inside `f` still uses the root
    /// namespace's /etc/hosts: use addresses.
    pub fn in_netns<R: Send, F: FnOnce() -> R + Send>(
        &self,
        host: &str,
        f: F,
    ) -> Result<R, String> {
        in_netns_path(&netns_path(&self.host(host).ns), f)
    }

    /// Processes living in `host`'s network namespace, except the harness's
    /// own holder and sshd listener. Per-connection sshd processes of live
    /// ssh sessions are included. Zombies are not listed.
    pub fn pids_on(&self, host: &str) -> Vec<(u32, String)> {
        let h = self.host(host);
        let Some(id) = ns_id(&netns_path(&h.ns)) else {
            return Vec::new();
        };
        let ids: HashSet<(u64, u64)> = [id].into_iter().collect();
        let mut v: Vec<(u32, String)> = pids_in_netns(&ids)
            .into_iter()
            .filter(|&p| p != h.holder && p != h.sshd && !proc_is_zombie(p))
            .map(|p| (p, proc_cmdline(p)))
            .filter(|(_, c)| !c.is_empty())
            .collect();
        v.sort();
        v
    }

    /// Poll [`Cluster::pids_on`] until it is empty; Err(survivors) after
    /// `timeout`.
    pub fn wait_no_survivors(
        &self,
        host: &str,
        timeout: Duration,
    ) -> Result<(), Vec<(u32, String)>> {
        let deadline = Instant::now() + timeout;
        loop {
            let v = self.pids_on(host);
            if v.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(v);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Write an Open MPI hostfile (`n1 slots=S` per line) into the cluster
    /// directory and return its path.
    pub fn hostfile(&self, slots_per_host: usize) -> Result<PathBuf, String> {
        let path = self.dir.join(format!("hostfile-{slots_per_host}"));
        let mut s = String::new();
        for n in self.host_names() {
            s.push_str(&format!("{n} slots={slots_per_host}\n"));
        }
        write_file(&path, &s, 0o644)?;
        Ok(path)
    }

    /// (tx_bytes, rx_bytes) of `rail<rail>` on `host`, read from
    /// `/sys/class/net/rail<rail>/statistics` as seen inside the host.
    pub fn rail_bytes(&self, host: &str, rail: usize) -> Result<(u64, u64), String> {
        let h = self.host(host);
        let base = PathBuf::from(format!(
            "/proc/{}/root/sys/class/net/rail{rail}/statistics",
            h.holder
        ));
        let read = |f: &str| -> Result<u64, String> {
            let p = base.join(f);
            fs::read_to_string(&p)
                .map_err(|e| format!("read {} (host {host}): {e}", p.display()))?
                .trim()
                .parse()
                .map_err(|e| format!("parse {}: {e}", p.display()))
        };
        Ok((read("tx_bytes")?, read("rx_bytes")?))
    }

    /// Human-readable summary (used by `emucluster up`).
    pub fn describe(&self) -> String {
        let mut s = format!(
            "emulated cluster {} ({} hosts x {} rails{}), dir {}\n",
            self.tag,
            self.hosts_n,
            self.rails,
            self.rail_rate
                .as_deref()
                .map(|r| format!(", rails shaped to {r}"))
                .unwrap_or_default(),
            self.dir.display()
        );
        for h in &self.hosts {
            s.push_str(&format!(
                "  {:<5} netns {:<16} mgmt0 {:<12} holder pid {:<7} sshd pid {}",
                h.name,
                h.ns,
                mgmt_addr_of(h.index).to_string(),
                h.holder,
                h.sshd
            ));
            if h.index > 0 {
                let rails: Vec<String> = (0..self.rails)
                    .map(|r| format!("rail{r} {}", rail_addr_of(h.index, r)))
                    .collect();
                s.push_str(&format!("  {}", rails.join("  ")));
            }
            s.push('\n');
        }
        s
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.teardown_on_drop {
            if let Err(e) = self.down() {
                eprintln!("emucluster: {e}");
            }
        }
    }
}

fn ssh_banner_ok(addr: SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    let mut buf = [0u8; 8];
    let mut got = 0;
    while got < 4 {
        match s.read(&mut buf[got..]) {
            Ok(0) | Err(_) => return false,
            Ok(n) => got += n,
        }
    }
    buf.starts_with(b"SSH-")
}

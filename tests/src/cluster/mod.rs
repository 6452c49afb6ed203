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
//!
//! Files: this one holds the public types and the lifecycle (up, attach, detach, down);
//! `build.rs` brings a cluster up step by step, `query.rs` answers questions about a running
//! one (addresses, commands inside a host, processes, counters), `registry.rs` records live
//! clusters and tears them down by tag (also for GC), `net.rs` holds the addressing plan, rail
//! rates and the root-namespace safety checks, `procfs.rs` processes and namespaces as /proc
//! shows them, `cmd.rs` running tools and writing files.

mod build;
mod cmd;
mod fabric;
mod net;
mod procfs;
mod query;
mod registry;

pub use fabric::MAX_UPLINKS;
pub use net::root_addrs;
pub use registry::gc_stale;

use cmd::{check_dir_path, is_ci, resolve_tools};
use net::{ensure_root_safety, rate_bytes_per_sec};
use registry::{extra_pids_from_state, namespaces_of, parse_kv, teardown_tag, write_registry};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

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
    /// TCP congestion control of the hosts' namespaces: a name from the kernel's
    /// `tcp_available_congestion_control`, or `"inherit"` for whatever the root namespace uses.
    /// `None`: [`DEFAULT_TCP_CC`] where the kernel has it, else inherited.
    pub tcp_cc: Option<String>,
}

/// The hosts' TCP congestion control unless [`UpOptions::tcp_cc`] says otherwise: CUBIC, the
/// kernel's own default and what cluster distributions ship. A namespace inherits the root's
/// algorithm when it is created; on a machine that runs BBR, BBR's delivery-rate model meets the
/// rails' token-bucket shapers, whose bursts pass at veth speed (`ss` shows estimates of 0.5 to
/// 65 Gbit/s on 500 Mbit/s rails), which no switched link does (docs/fabric.md).
pub const DEFAULT_TCP_CC: &str = "cubic";

/// The congestion control `asked` resolves to (`None`: leave the inherited one), checked against
/// the algorithms the kernel offers (`available`, as in `tcp_available_congestion_control`).
fn resolve_tcp_cc(asked: Option<&str>, available: &str) -> Result<Option<String>, String> {
    let has = |n: &str| available.split_whitespace().any(|a| a == n);
    match asked {
        Some("inherit") => Ok(None),
        Some(n) if has(n) => Ok(Some(n.to_string())),
        Some(n) => Err(format!(
            "TCP congestion control {n:?} is not available in this kernel (it offers: {}); \
             load its module (modprobe tcp_{n}) or pick one of those, or \"inherit\"",
            available.trim()
        )),
        None => Ok(has(DEFAULT_TCP_CC).then(|| DEFAULT_TCP_CC.to_string())),
    }
}

/// A namespace other than the root one may only make an algorithm its default when the kernel
/// lists it in `tcp_allowed_congestion_control` (the write fails with EPERM, which a shell shows
/// as "I/O error"); kernels whose default is BBR may list only `reno bbr`. Adds `cc` to that
/// machine-wide list when it is missing: it only widens what sockets may pick.
fn allow_tcp_cc(cc: &str) -> Result<(), String> {
    const ALLOWED: &str = "/proc/sys/net/ipv4/tcp_allowed_congestion_control";
    let now = fs::read_to_string(ALLOWED).unwrap_or_default();
    match allowed_with(&now, cc) {
        None => Ok(()),
        Some(list) => fs::write(ALLOWED, &list).map_err(|e| {
            format!(
                "the hosts' TCP congestion control {cc:?} is not in {ALLOWED} ({}), and adding \
                 it failed: {e}; run as root, or pass --tcp-cc inherit",
                now.trim()
            )
        }),
    }
}

/// `allowed` (as in `tcp_allowed_congestion_control`) with `cc` added, or `None` when it is there.
fn allowed_with(allowed: &str, cc: &str) -> Option<String> {
    let mut names: Vec<&str> = allowed.split_whitespace().collect();
    if names.contains(&cc) {
        return None;
    }
    names.push(cc);
    Some(names.join(" "))
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
    /// The hosts' TCP congestion control (`None`: inherited from the root namespace).
    tcp_cc: Option<String>,
    dir: PathBuf,
    ssh_cfg: PathBuf,
    hosts: Vec<Host>,
    tools: Tools,
    children: Mutex<Vec<Child>>,
    down_done: Mutex<bool>,
    teardown_on_drop: bool,
    /// Leaves and spines instead of one flat switch per rail (`fabric.rs`).
    fabric: Option<fabric::Emu>,
}

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
        Self::up_impl(spec, opts, None)
    }

    /// Build a cluster whose hosts sit under the leaf and spine switches of `fabric` (a 2-tier
    /// fabric of at most [`MAX_HOSTS`] nodes: host nK is the fabric's node K-1, its rails are the
    /// node's NICs); see `fabric.rs` and docs/fabric.md.
    pub fn up_fabric(
        fabric: &railring_collectives::fabric::Fabric,
        opts: UpOptions,
    ) -> Result<Cluster, String> {
        let emu = fabric::Emu::of(fabric)?;
        let spec = ClusterSpec {
            hosts: emu.nodes,
            rails: emu.nics,
            rail_rate: None,
        };
        Self::up_impl(spec, opts, Some(emu))
    }

    fn up_impl(
        spec: ClusterSpec,
        opts: UpOptions,
        fab: Option<fabric::Emu>,
    ) -> Result<Cluster, String> {
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
        let tools = resolve_tools(rate_bps.is_some() || fab.is_some())?;
        let tcp_cc = resolve_tcp_cc(
            opts.tcp_cc.as_deref(),
            &fs::read_to_string("/proc/sys/net/ipv4/tcp_available_congestion_control")
                .unwrap_or_default(),
        )?;
        if let Some(cc) = &tcp_cc {
            allow_tcp_cc(cc)?;
        }

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
            tcp_cc,
            ssh_cfg: dir.join("ssh_config"),
            dir,
            hosts,
            tools,
            children: Mutex::new(Vec::new()),
            down_done: Mutex::new(false),
            teardown_on_drop: true,
            fabric: fab,
        };
        // From here on, `cluster` owns everything: an error drops it, which
        // tears down whatever was created so far.
        cluster.build(rate_bps, opts.detached)?;
        Ok(cluster)
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
        let tcp_cc = get("tcp_cc").filter(|s| !s.is_empty());
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
            tcp_cc,
            ssh_cfg: dir.join("ssh_config"),
            dir,
            hosts,
            tools,
            children: Mutex::new(Vec::new()),
            down_done: Mutex::new(false),
            teardown_on_drop: false,
            fabric: fabric::Emu::from_state(&kv),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn congestion_control_default_explicit_inherit_and_missing() {
        let avail = "reno bbr cubic\n";
        assert_eq!(resolve_tcp_cc(None, avail), Ok(Some("cubic".to_string())));
        assert_eq!(resolve_tcp_cc(None, "reno bbr"), Ok(None));
        assert_eq!(resolve_tcp_cc(Some("bbr"), avail), Ok(Some("bbr".into())));
        assert_eq!(resolve_tcp_cc(Some("inherit"), avail), Ok(None));
        let e = resolve_tcp_cc(Some("vegas"), avail).unwrap_err();
        assert!(
            e.contains("\"vegas\"") && e.contains("reno bbr cubic"),
            "{e}"
        );
        // a name is matched whole, never as a part of another
        assert!(resolve_tcp_cc(Some("cub"), avail).is_err());
        assert_eq!(
            allowed_with("reno bbr\n", "cubic"),
            Some("reno bbr cubic".into())
        );
        assert_eq!(allowed_with("reno cubic", "cubic"), None);
    }
}

//! Every `RAILRING_*` knob the runtime reads, parsed once, in one place (the README's table
//! lists them), into a [`Config`] that is passed down. Bad values are errors naming the
//! variable, never panics. The other readers of the environment are the launch detection
//! (`bootstrap::launch`: the launcher's variables) and the CUDA kernel compiler (the toolkit's
//! `CUDA_HOME`); `tests/tests/architecture.rs` keeps it that way.

use crate::error::{Error, Result};
use crate::topology::{BindVars, PathClass, TopoError, Topology};
use crate::vars;
use railring_collectives::plan::Algo;
use std::path::PathBuf;
use std::time::Duration;

pub use crate::knobs::{MAX_NET_CHUNK, MAX_STREAMS};

/// Runtime settings from the environment.
#[derive(Clone, Debug)]
pub struct Config {
    /// `RAILRING_TIMEOUT` (seconds, default 600): a collective with no progress for this long fails.
    pub timeout: Duration,
    /// `RAILRING_RAIL_TIMEOUT` (seconds, default 10): a TCP rail whose connection carries data
    /// the peer's host has not acknowledged for this long is dropped and its links move to
    /// another rail (`transport::failover`).
    pub rail_timeout: Duration,
    /// `RAILRING_STRAGGLER` (default 0: off): every N collective calls, rank 0 prints the ranks
    /// that most often arrived last and how late (`comm::straggler`).
    pub straggler: u64,
    /// `RAILRING_ALGO`: force an algorithm (`two_level`, `ring`, `recursive_doubling`, `tree`).
    pub algo: Option<Algo>,
    /// `RAILRING_SOCKET_IFNAME`: which interfaces carry TCP rails (NCCL grammar).
    pub socket_ifname: Option<String>,
    /// `RAILRING_SHM_SLOT` (bytes, default 1 MiB): data bytes of one shared-memory staging slot
    /// per rank (its 64-byte header line comes on top).
    pub shm_slot: usize,
    /// `RAILRING_SHM_SINGLE_COPY` (`auto` default, `on`, `off`): large in-node all-to-all and
    /// all-gather read peers' buffers directly (`process_vm_readv`, one copy instead of two
    /// through the staging slots) when every local rank can read every other's memory.
    pub shm_single_copy: SingleCopy,
    /// `RAILRING_SHM_SINGLE_COPY_LARGE` (`auto` default, `on`, `off`): on a node of two ranks
    /// that reads directly, read blocks of every size directly (`on`), only up to the staged
    /// path's crossover measured on a slow kernel copy (`off`), or as the node's measured
    /// kernel copy says (`auto`: `transport::shm::kernel_copy_ratio`); on a node whose ranks
    /// outnumber its CPUs, the same decides whether the all-to-all reads directly, and a large
    /// broadcast whose root calls out of place.
    pub shm_single_copy_large: SingleCopy,
    /// `RAILRING_NET_CHUNK` (bytes, default 512 KiB): pipelining chunk on network links.
    pub net_chunk: usize,
    /// `RAILRING_CONNECT_TIMEOUT` (seconds, default 30): bootstrap and data-plane connects.
    pub connect_timeout: Duration,
    /// `RAILRING_NET_STREAMS` (default 1, at most 16): TCP connections per peer and rail; data
    /// is striped over them in 64 KiB stripes (more in-flight windows on a fast NIC).
    pub net_streams: usize,
    /// `RAILRING_RAILS_PER_RANK` (default 0: automatic; at most 16): how many TCP rails each
    /// rank's links to other nodes are striped over. Automatic: `rails / local ranks` when a
    /// node has fewer ranks than rails (rank i drives rails i, i+L, ...), else 1.
    pub rails_per_rank: usize,
    /// The cost model the algorithm choice uses: defaults, then `RAILRING_COST` overrides
    /// (`net_beta=1.25e8,net_alpha=5e-5,...`); the communicator raises the in-node latency where
    /// ranks outnumber a machine's CPUs (`comm::setup`).
    pub cost: railring_collectives::cost::CostModel,
    /// Whether `RAILRING_COST` set `rails`; otherwise the communicator sets it to the rails
    /// every rank has (`comm::setup`).
    pub cost_rails_given: bool,
    /// Whether `RAILRING_COST` set `local_alpha` (then it is never raised for oversubscription).
    pub cost_local_alpha_given: bool,
    /// `RAILRING_PIPELINE_SEG` (bytes, default 4 MiB; 0 disables): segment size of the
    /// pipelined two-level all-reduce across nodes.
    pub pipeline_seg: usize,
    /// `RAILRING_NET_GDR_LEVEL` (default PXB; `None`: never): the farthest GPU–NIC path class
    /// at which device collectives hand GPU memory to the NIC (GPUDirect RDMA).
    pub gdr_level: Option<PathClass>,
    /// The log filter from `RAILRING_DEBUG` (level: TRACE, DEBUG, INFO, WARN (default), ERROR)
    /// and `RAILRING_DEBUG_SUBSYS` (comma-separated subsystems: init, net, topo, tune, ...).
    pub log_filter: String,
    /// Whether log lines carry ANSI colour: `RAILRING_LOG_COLOR` `always` / `never`, or `auto`
    /// (default): only when stderr is a terminal and `NO_COLOR` is unset or empty. railrun
    /// sets it for its ranks (their stderr is a pipe to railrun) from its own terminal.
    pub log_color: bool,
    /// `RAILRING_HOST_ID`: ranks with different values are different nodes even on one machine
    /// (printable ASCII, at most 128 characters; see [`crate::machine::host_id`]).
    pub host_id: Option<String>,
    /// `RAILRING_TOPO_FILE`: an NCCL or hwloc topology XML used instead of sysfs.
    pub topo_file: Option<PathBuf>,
    /// `RAILRING_BIND_TO`, `RAILRING_NIC_MAP` and `CUDA_VISIBLE_DEVICES`, as read; the topology
    /// parses them when it binds ([`BindVars::options`]).
    pub bind: BindVars,
    /// `RAILRING_NET` (`ib`, `socket`, `auto`) and `RAILRING_IB_HCA` (NCCL grammar), parsed by
    /// `transport::rdma` when it selects the network (feature `rdma`).
    pub net: Option<String>,
    pub ib_hca: Option<String>,
    /// `RAILRING_IB_GID_INDEX` (RoCE; default 0).
    pub ib_gid_index: u8,
    /// `RAILRING_GPU_SLOT` (bytes; the CUDA fabric clamps it to 64 KiB..1 GiB).
    pub gpu_slot: Option<u64>,
    /// CUDA's `CUDA_MPS_PIPE_DIRECTORY` (where an MPS control daemon listens), read so the CUDA
    /// fabric can tell whether ranks sharing a GPU run under MPS.
    pub mps_pipe_dir: Option<std::ffi::OsString>,
}

/// `RAILRING_NET_GDR_LEVEL` (NCCL's `NCCL_NET_GDR_LEVEL` grammar): `LOC` (never), `PIX`,
/// `PXB` (default), `PHB`, `NODE` or `SYS`, or NCCL's numbers 0..=5 for the same. `Ok(None)`:
/// never.
pub fn parse_gdr_level(v: Option<&str>) -> std::result::Result<Option<PathClass>, String> {
    let Some(v) = v.map(str::trim).filter(|v| !v.is_empty()) else {
        return Ok(Some(PathClass::Pxb));
    };
    Ok(Some(match v.to_ascii_uppercase().as_str() {
        "LOC" | "0" => return Ok(None),
        "PIX" | "1" => PathClass::Pix,
        "PXB" | "2" => PathClass::Pxb,
        "PHB" | "3" => PathClass::Phb,
        "NODE" | "4" => PathClass::Node,
        "SYS" | "5" => PathClass::Sys,
        _ => return Err("expected LOC, PIX, PXB, PHB, NODE or SYS (or 0-5)".into()),
    }))
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// A number knob (declared in [`crate::knobs::KNOBS`]): its value, or the declared default.
fn num(name: &str) -> Result<u64> {
    let v = var(name);
    let k = crate::knobs::knob(name);
    k.number(v.as_deref(), k.default_number()).map_err(env_err)
}

/// A seconds knob (declared in [`crate::knobs::KNOBS`]): its value, or the declared default.
fn secs(name: &str) -> Result<Duration> {
    let v = var(name);
    let k = crate::knobs::knob(name);
    k.seconds(v.as_deref(), k.default_seconds())
        .map_err(env_err)
}

/// A knob's value error as the runtime's [`Error::Env`].
fn env_err(e: crate::knobs::KnobError) -> Error {
    Error::Env {
        var: e.name.into(),
        value: e.value,
        why: e.why,
    }
}

/// The `tracing` filter `RAILRING_DEBUG` and `RAILRING_DEBUG_SUBSYS` ask for; a level that is
/// none of the declared words is an error (not a silent WARN).
fn log_filter() -> Result<String> {
    let v = var(vars::DEBUG);
    let level = crate::knobs::knob(vars::DEBUG)
        .choice(v.as_deref())
        .map_err(env_err)?
        .to_ascii_lowercase();
    Ok(match var(vars::DEBUG_SUBSYS) {
        Some(s) => s
            .split(',')
            .map(|x| format!("railring::{}={level}", x.trim().to_ascii_lowercase()))
            .collect::<Vec<_>>()
            .join(","),
        None => format!("railring={level}"),
    })
}

/// `RAILRING_LOG_COLOR` (`auto`, `always`, `never`) and `NO_COLOR` (<https://no-color.org>):
/// whether log lines on stderr carry colour (see [`Config::log_color`]).
pub fn log_color() -> Result<bool> {
    let no_color = std::env::var_os(vars::NO_COLOR).is_some_and(|v| !v.is_empty());
    let v = var(vars::LOG_COLOR);
    match crate::knobs::knob(vars::LOG_COLOR)
        .choice(v.as_deref())
        .map_err(env_err)?
    {
        "always" => Ok(true),
        "never" => Ok(false),
        _ => Ok(!no_color && std::io::IsTerminal::is_terminal(&std::io::stderr())),
    }
}

/// When the in-node fabric reads peers' buffers directly (`RAILRING_SHM_SINGLE_COPY`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum SingleCopy {
    /// Never: always stage.
    Off,
    /// Where it measured faster: all-to-all blocks of 32 KiB to 4 MiB, except where the node's
    /// ranks outnumber its CPUs (see `transport::shm::fabric`).
    Auto,
    /// All-to-all blocks of 32 KiB to 4 MiB even when ranks outnumber CPUs.
    On,
}

/// `RAILRING_SHM_SINGLE_COPY` or `RAILRING_SHM_SINGLE_COPY_LARGE` (`name`): `auto` (default),
/// `on` or `off`.
fn single_copy(name: &str) -> Result<SingleCopy> {
    match var(name).map(|v| v.trim().to_ascii_lowercase()) {
        None => Ok(SingleCopy::Auto),
        Some(v) if v == "auto" => Ok(SingleCopy::Auto),
        Some(v) if ["1", "on", "yes", "always"].contains(&v.as_str()) => Ok(SingleCopy::On),
        Some(v) if ["off", "0", "no", "never"].contains(&v.as_str()) => Ok(SingleCopy::Off),
        Some(v) => Err(Error::Env {
            var: name.into(),
            value: v,
            why: "expected auto, on or off".into(),
        }),
    }
}

/// The server address of `SSH_CONNECTION` (`client-ip client-port server-ip server-port`, set
/// by OpenSSH for the processes it starts): this node's management interface, which the
/// automatic rail choice leaves out (`transport::rails`).
pub fn ssh_server_addr() -> Option<std::net::Ipv4Addr> {
    let v = std::env::var(vars::SSH_CONNECTION).ok()?;
    if v.len() > 256 {
        return None;
    }
    v.split_whitespace().nth(2)?.parse().ok()
}

/// `RAILRING_TOPO_FILE` (non-empty), for [`Config::topo_file`] and `railrun topo`.
pub fn topo_file_from_env() -> Option<PathBuf> {
    std::env::var_os(vars::TOPO_FILE)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// The binding variables, for [`Config::bind`] and `railrun topo`.
pub fn bind_vars_from_env() -> BindVars {
    BindVars {
        bind_to: std::env::var_os(vars::BIND_TO),
        map_by: std::env::var_os(vars::MAP_BY),
        nic_map: std::env::var_os(vars::NIC_MAP),
        cuda_visible_devices: std::env::var_os("CUDA_VISIBLE_DEVICES"),
    }
}

/// The in-node latency the cost model assumes where ranks outnumber a machine's CPUs (every
/// in-node round then waits for descheduled peers; measured here: an in-node flag round costs a
/// few context switches, ~5-20 us).
pub(crate) const OVERSUBSCRIBED_LOCAL_ALPHA: f64 = 20e-6;

/// `RAILRING_SOCKET_IFNAME` (NCCL grammar: an optional `^` (exclude) and `=` (exact), then
/// comma-separated interface names or prefixes): a value that names no interface (`^`, `=`,
/// `,`) or a name no interface can have is an error, not "every interface".
fn socket_ifname() -> Result<Option<String>> {
    let Some(v) = var(vars::SOCKET_IFNAME) else {
        return Ok(None);
    };
    let bad = |why: &str| Error::Env {
        var: vars::SOCKET_IFNAME.into(),
        value: v.clone(),
        why: why.into(),
    };
    let body = v.trim();
    let body = body.strip_prefix('^').unwrap_or(body);
    let body = body.strip_prefix('=').unwrap_or(body);
    let names: Vec<&str> = body
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .collect();
    if names.is_empty() {
        return Err(bad(
            "names no interface: expected [^][=]name[,name...] (e.g. `rail`, `^docker,lo`, `=eth0`)",
        ));
    }
    if let Some(n) = names
        .iter()
        .find(|n| n.len() > 15 || n.contains(['/', ' ', '^', '=']))
    {
        return Err(bad(&format!(
            "`{n}` cannot be an interface name (at most 15 characters, no `/`, `^`, `=` or blank)"
        )));
    }
    Ok(Some(v))
}

/// Whether `RAILRING_COST` sets `key`.
fn cost_key_given(key: &str) -> bool {
    var(vars::COST).is_some_and(|v| {
        v.split(',')
            .any(|i| i.split_once('=').is_some_and(|(k, _)| k.trim() == key))
    })
}

fn cost_model() -> Result<railring_collectives::cost::CostModel> {
    // (in-node latency where ranks outnumber a machine's CPUs: comm::setup, once every rank's
    // CPUs are known)
    let mut m = railring_collectives::cost::CostModel::default_cpu();
    if let Some(v) = var(vars::COST) {
        for item in v.split(',').map(str::trim).filter(|x| !x.is_empty()) {
            let bad = |why: String| Error::Env {
                var: vars::COST.into(),
                value: v.clone(),
                why,
            };
            let (k, x) = item
                .split_once('=')
                .ok_or_else(|| bad(format!("'{item}' is not key=value")))?;
            let x: f64 = x
                .trim()
                .parse()
                .map_err(|_| bad(format!("'{x}' is not a number")))?;
            m.set(k.trim(), x).map_err(bad)?;
        }
    }
    Ok(m)
}

pub use crate::knobs::parse_size;

impl Config {
    /// This machine's topology, from [`Config::topo_file`] or sysfs.
    pub fn topology(&self) -> std::result::Result<Topology, TopoError> {
        Topology::discover_from(self.topo_file.as_deref())
    }

    pub fn from_env() -> Result<Config> {
        let algo = match var(vars::ALGO) {
            None => None,
            Some(v) => Some(Algo::parse(&v).ok_or_else(|| Error::Env {
                var: vars::ALGO.into(),
                value: v.clone(),
                why: "expected two_level, ring, recursive_doubling or tree".into(),
            })?),
        };
        Ok(Config {
            timeout: secs(vars::TIMEOUT)?,
            rail_timeout: secs(vars::RAIL_TIMEOUT)?,
            straggler: num(vars::STRAGGLER)?,
            algo,
            socket_ifname: socket_ifname()?,
            shm_slot: num(vars::SHM_SLOT)? as usize,
            shm_single_copy: single_copy(vars::SHM_SINGLE_COPY)?,
            shm_single_copy_large: single_copy(vars::SHM_SINGLE_COPY_LARGE)?,
            net_chunk: num(vars::NET_CHUNK)? as usize,
            net_streams: num(vars::NET_STREAMS)? as usize,
            rails_per_rank: num(vars::RAILS_PER_RANK)? as usize,
            connect_timeout: secs(vars::CONNECT_TIMEOUT)?,
            pipeline_seg: num(vars::PIPELINE_SEG)? as usize,
            cost: cost_model()?,
            cost_rails_given: cost_key_given("rails"),
            cost_local_alpha_given: cost_key_given("local_alpha"),
            gdr_level: {
                let v = var(vars::NET_GDR_LEVEL);
                parse_gdr_level(v.as_deref()).map_err(|why| Error::Env {
                    var: vars::NET_GDR_LEVEL.into(),
                    value: v.unwrap_or_default(),
                    why,
                })?
            },
            log_filter: log_filter()?,
            log_color: log_color()?,
            host_id: var(vars::HOST_ID)
                .map(|v| {
                    v.chars()
                        .filter(|c| c.is_ascii_graphic())
                        .take(128)
                        .collect::<String>()
                })
                .filter(|v| !v.is_empty()),
            topo_file: topo_file_from_env(),
            bind: bind_vars_from_env(),
            net: var(vars::NET),
            ib_hca: var(vars::IB_HCA),
            ib_gid_index: num(vars::IB_GID_INDEX)? as u8,
            gpu_slot: match var(vars::GPU_SLOT) {
                None => None,
                Some(v) => Some(
                    crate::knobs::knob(vars::GPU_SLOT)
                        .number(Some(&v), 0)
                        .map_err(env_err)?,
                ),
            },
            mps_pipe_dir: std::env::var_os("CUDA_MPS_PIPE_DIRECTORY"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gdr_level_parses_like_nccl() {
        assert_eq!(parse_gdr_level(None), Ok(Some(PathClass::Pxb)));
        assert_eq!(parse_gdr_level(Some(" ")), Ok(Some(PathClass::Pxb)));
        assert_eq!(parse_gdr_level(Some("loc")), Ok(None));
        assert_eq!(parse_gdr_level(Some("0")), Ok(None));
        assert_eq!(parse_gdr_level(Some("PIX")), Ok(Some(PathClass::Pix)));
        assert_eq!(parse_gdr_level(Some("3")), Ok(Some(PathClass::Phb)));
        assert_eq!(parse_gdr_level(Some("node")), Ok(Some(PathClass::Node)));
        assert_eq!(parse_gdr_level(Some("sys")), Ok(Some(PathClass::Sys)));
        assert!(parse_gdr_level(Some("fast")).is_err());
        assert!(parse_gdr_level(Some("6")).is_err());
    }
}

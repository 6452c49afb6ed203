//! Before a job starts: what pasted mpirun / Hydra options become. The hosts (with this
//! machine's shape for Open MPI hostfile lines without `slots=` and for `ppr:N:socket`),
//! `--nolocal`, the placement, the binding a `--map-by` object implies, `-wdir`, `-genvall`,
//! and whether ranks' log lines may carry colour.

use crate::cli::{BindTo, EnvSpec, RunOpts};
use crate::host_source::{self, Family, HostfileRules};
use crate::placement::{self, MapBy, NodeObj, Placement, PlacementRequest};
use railring::topology::Topology;
use railring::vars;
use std::io::IsTerminal;

/// This machine's cores, sockets and NUMA nodes (railrun's stand-in for hosts it cannot ask
/// before the job starts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalShape {
    pub cores: usize,
    pub sockets: Option<usize>,
    pub numas: Option<usize>,
}

impl LocalShape {
    /// From the topology railrun itself sees (`RAILRING_TOPO_FILE`, else sysfs); CPU count
    /// when that fails.
    pub fn of_this_machine() -> LocalShape {
        let topo = Topology::discover_from(railring::config::topo_file_from_env().as_deref()).ok();
        LocalShape::of(topo.as_ref())
    }

    fn of(topo: Option<&Topology>) -> LocalShape {
        let fallback = host_source::local_cpu_count();
        let Some(t) = topo else {
            return LocalShape {
                cores: fallback,
                sockets: None,
                numas: None,
            };
        };
        let mut sockets: Vec<(bool, usize)> = t
            .numa_nodes
            .iter()
            .map(|n| match n.package {
                Some(p) => (true, p),
                None => (false, n.id),
            })
            .collect();
        sockets.sort_unstable();
        sockets.dedup();
        let cores = if t.cores.is_empty() {
            fallback
        } else {
            t.cores.len()
        };
        let nz = |n: usize| (n > 0).then_some(n);
        LocalShape {
            cores: cores.max(1),
            sockets: nz(sockets.len()),
            numas: nz(t.numa_nodes.len()),
        }
    }
}

/// The fabric of a run (`--fabric` / `RAILRING_FABRIC`): the file and its path as given.
pub type RunFabric = Option<(crate::plan::fabric_file::FabricFile, String)>;

/// Say the warnings (and, with `-v`, the notes) of the command line, resolve the hosts, order
/// them by the fabric (unless `--fabric-keep-order`), place the ranks, and set what the mapping
/// implies (see [`mapping`]).
pub fn place(opts: &mut RunOpts) -> Result<(Placement, RunFabric), String> {
    for w in &opts.warnings {
        eprintln!("railrun: {w}");
    }
    if opts.verbose > 0 {
        for n in &opts.notes {
            eprintln!("railrun: {n}");
        }
    }
    let here = LocalShape::of_this_machine();
    let env = |k: &str| std::env::var(k).ok();
    let rules = HostfileRules {
        openmpi_bare_slots: here.cores,
        hint: opts.hydra_hint.then_some(Family::Hydra),
    };
    let mut src = host_source::resolve_hosts_with(
        opts.hostfile.as_deref(),
        opts.hosts.as_deref(),
        &env,
        &rules,
    )
    .map_err(|e| e.to_string())?;
    if opts.nolocal {
        src = src
            .without_local(host_source::is_local)
            .map_err(|e| e.to_string())?;
    }
    for n in &src.notes {
        eprintln!("railrun: {n}");
    }
    // --fabric / RAILRING_FABRIC: hosts in the fabric's node order (docs/fabric.md)
    let fabric = crate::plan::order::fabric_of_run(opts.fabric.as_deref())?;
    if let Some((ff, path)) = &fabric {
        if !opts.fabric_keep_order {
            crate::plan::order::fabric_order(&mut src, ff, path)?;
        }
    }
    let req = PlacementRequest {
        np: opts.np,
        ppn: opts.ppn,
        map_by: opts.map_by,
        rank_by: opts.rank_by,
        oversubscribe: opts.oversubscribe,
        sockets: here.sockets,
        numas: here.numas,
    };
    let pl = placement::place(&src, &req).map_err(|e| e.to_string())?;
    mapping(opts, &pl, &here);
    Ok((pl, fabric))
}

/// What `--map-by` / `--rank-by` imply for the ranks: the binding (Open MPI binds to the
/// mapped object when `--bind-to` is not given) and `RAILRING_MAP_BY`, the spread inside each
/// node, for every rank, the binding before exec and `--report-bindings`.
pub fn mapping(opts: &mut RunOpts, pl: &Placement, here: &LocalShape) {
    if opts.bind_to.is_none() {
        if let Some(o) = opts.map_by.and_then(MapBy::bind_object) {
            opts.bind_to = Some(match o {
                NodeObj::Core => BindTo::Core,
                NodeObj::Socket => BindTo::Socket,
                NodeObj::Numa => BindTo::Numa,
            });
        }
    }
    let Some(spread) = placement::node_spread(opts.map_by, opts.rank_by) else {
        return;
    };
    if let Some(MapBy::PprObj(n, o)) = opts.map_by {
        if pl.ranks.iter().any(|r| !host_source::is_local(&r.host)) {
            let (count, what) = match o {
                NodeObj::Numa => (here.numas, "NUMA node(s)"),
                _ => (here.sockets, "socket(s)"),
            };
            eprintln!(
                "railrun: --map-by ppr:{n}:{}: this machine has {} {what}, so {} rank(s) per host; every host is assumed to be alike (a host with fewer stops at start, naming itself)",
                o.as_str(),
                count.unwrap_or(0),
                n * count.unwrap_or(0)
            );
        }
    }
    // The ranks, the binding before exec and --report-bindings all read it from the job's
    // variables.
    set_env(opts, vars::MAP_BY, spread);
}

/// `-x NAME=value` unless the user gave NAME.
fn set_env(opts: &mut RunOpts, name: &str, value: String) {
    if !opts.env.iter().any(|e| e.name == name) {
        opts.env.push(EnvSpec {
            name: name.to_string(),
            value: Some(value),
        });
    }
}

/// Variables `-genvall` does not forward: railrun sets them per job or rank, or they
/// describe this machine's login, not the job.
fn forwarded_by_genvall(name: &str) -> bool {
    const OWN: &[&str] = &[
        vars::RANK,
        vars::WORLD_SIZE,
        vars::LOCAL_RANK,
        vars::LOCAL_SIZE,
        vars::NODE_RANK,
        vars::NNODES,
        vars::JOB_ID,
        vars::STORE_ADDR,
        vars::JOB_SECRET,
        vars::TORCHRUN_RANK,
        vars::TORCHRUN_WORLD_SIZE,
        vars::TORCHRUN_LOCAL_RANK,
        vars::TORCHRUN_LOCAL_WORLD_SIZE,
        vars::MASTER_ADDR,
        vars::MASTER_PORT,
        vars::BOUND_CPUS,
        vars::MPI_LOCALRANKID,
        vars::MPI_LOCALNRANKS,
        "HOSTNAME",
        "PWD",
        "OLDPWD",
        "SHLVL",
        "_",
    ];
    const PREFIXES: &[&str] = &["SSH_", "OMPI_", "PMI_", "PMIX_", "SLURM_"];
    !OWN.contains(&name) && !PREFIXES.iter().any(|p| name.starts_with(p))
}

/// Just before the job starts: `--output-dir` made absolute, `-wdir` (railrun moves there, so
/// the program name, this machine's ranks and every agent's ranks start there, as with
/// mpirun), `-genvall`, and the ranks' log colour.
pub fn before_start(opts: &mut RunOpts) -> Result<(), String> {
    if let Some(w) = opts.wdir.clone() {
        if let Some(d) = &opts.output_dir {
            if d.is_relative() {
                let cwd = std::env::current_dir()
                    .map_err(|e| format!("cannot read the current directory: {e}"))?;
                opts.output_dir = Some(cwd.join(d));
            }
        }
        std::env::set_current_dir(&w)
            .map_err(|e| format!("-wdir {}: cannot change to it: {e}", w.display()))?;
    }
    if opts.env_all {
        for (k, v) in std::env::vars_os() {
            let (Ok(k), Ok(v)) = (k.into_string(), v.into_string()) else {
                continue;
            };
            if forwarded_by_genvall(&k) && !opts.env.iter().any(|e| e.name == k) {
                opts.env.push(EnvSpec {
                    name: k,
                    value: Some(v),
                });
            }
        }
    }
    // Ranks write their log lines into pipes to railrun: railrun tells them whether its own
    // terminal wants colour.
    let user_set = std::env::var_os(vars::LOG_COLOR).is_some();
    if !user_set {
        let no_color = std::env::var_os(vars::NO_COLOR).is_some_and(|v| !v.is_empty());
        let tty = if opts.merge_stderr {
            std::io::stdout().is_terminal()
        } else {
            std::io::stderr().is_terminal()
        };
        let colour = tty && !no_color && opts.output_dir.is_none();
        set_env(
            opts,
            vars::LOG_COLOR,
            if colour { "always" } else { "never" }.into(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_from_a_two_socket_file() {
        let t = Topology::from_file(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/topology/24em64t-2n6c2t-pci.xml"
        ))
        .unwrap();
        let s = LocalShape::of(Some(&t));
        assert_eq!((s.cores, s.sockets, s.numas), (12, Some(2), Some(2)));
        let s = LocalShape::of(None);
        assert_eq!(s.sockets, None);
        assert!(s.cores >= 1);
    }

    #[test]
    fn genvall_leaves_out_what_railrun_sets_and_logins() {
        for n in [
            "RANK",
            "RAILRING_RANK",
            "SSH_CONNECTION",
            "OMPI_COMM_WORLD_SIZE",
            "PWD",
        ] {
            assert!(!forwarded_by_genvall(n), "{n}");
        }
        for n in [
            "PATH",
            "LD_LIBRARY_PATH",
            "RAILRING_DEBUG",
            "OMP_NUM_THREADS",
        ] {
            assert!(forwarded_by_genvall(n), "{n}");
        }
    }
}

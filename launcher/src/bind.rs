//! Binding ranks before exec: the one computation behind `--report-bindings` and the CPU mask
//! every rank gets from the process that spawns it ([`crate::node_ranks`]: railrun for its own
//! machine, each agent for its node), whatever the program is.
//!
//! The binding comes from the node's topology ([`railring::topology`]) for the node's number of
//! local ranks, with the mode `--bind-to` gives (passed to ranks as `RAILRING_BIND_TO`), else a
//! `RAILRING_BIND_TO` the ranks will see, else `auto` (the runtime's default: `numa`, or a core
//! each where a NUMA node's ranks outnumber its CPUs evenly). Inputs are read
//! as the ranks will see them: the job's variables (`-x`, railrun's own) over the spawner's
//! environment ([`Lookup`]). `none` leaves affinity alone.
//!
//! A bound rank also gets `RAILRING_BOUND_CPUS` (so the railring runtime keeps this binding
//! instead of computing its own, see `comm/setup.rs`) and, when `OMP_NUM_THREADS` is unset
//! and the rank's CPUs are fewer than the spawner's, `OMP_NUM_THREADS` = its number of CPUs.

use railring::topology::{
    format_cpulist, process_allowed_cpus, render, BindOptions, BindTo, Binding, Topology,
};
use railring::vars;
use std::path::PathBuf;

/// Variables as a rank will see them.
pub type Lookup<'a> = &'a dyn Fn(&str) -> Option<String>;

/// `name` from `job` (later entries win), else from this process's environment.
pub fn job_lookup<'a>(job: &'a [(String, String)]) -> impl Fn(&str) -> Option<String> + 'a {
    move |name: &str| {
        job.iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .or_else(|| std::env::var(name).ok())
    }
}

/// The binding mode ranks get: `RAILRING_BIND_TO` as they see it, else `auto`.
pub fn mode(lookup: Lookup) -> Result<BindTo, String> {
    match lookup(vars::BIND_TO).filter(|v| !v.trim().is_empty()) {
        Some(v) => v
            .parse::<BindTo>()
            .map_err(|e| format!("{}={v:?}: {e}", vars::BIND_TO)),
        None => Ok(BindTo::default()),
    }
}

/// The topology and binding options ranks see (`RAILRING_TOPO_FILE`, `RAILRING_NIC_MAP`,
/// `CUDA_VISIBLE_DEVICES`, the mode, this process's CPUs).
pub fn options(lookup: Lookup) -> Result<(Topology, BindOptions), String> {
    let topo_file = lookup(vars::TOPO_FILE)
        .filter(|v| !v.trim().is_empty())
        .map(PathBuf::from);
    let topo = Topology::discover_from(topo_file.as_deref()).map_err(|e| e.to_string())?;
    let m = mode(lookup)?;
    let mut opts = BindOptions::from_values(
        Some(m.as_str()),
        lookup(vars::NIC_MAP).as_deref(),
        lookup("CUDA_VISIBLE_DEVICES").as_deref(),
        process_allowed_cpus().ok(),
    )
    .map_err(|e| e.to_string())?;
    // --map-by / --rank-by: how the ranks spread over cores, sockets, NUMA nodes.
    if let Some(m) = lookup(vars::MAP_BY).filter(|v| !v.trim().is_empty()) {
        opts.map = Some(railring::topology::NodeMap::parse(&m).map_err(|e| e.to_string())?);
    }
    Ok((topo, opts))
}

/// One line of the report: `  rank R on HOST (local rank l/L): <binding>`.
pub fn report_line(
    rank: usize,
    host: &str,
    local_rank: usize,
    local_size: usize,
    b: &str,
) -> String {
    format!("  rank {rank} on {host} (local rank {local_rank}/{local_size}): {b}\n")
}

/// The binding's text in the report (the runtime's wording).
pub fn describe(b: &Binding) -> String {
    render::binding_report(b)
}

/// What the spawner does for one rank before exec.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RankBinding {
    /// CPUs to bind to; empty: leave affinity alone.
    pub cpus: Vec<usize>,
    /// Variables for the rank (`RAILRING_BOUND_CPUS`, `OMP_NUM_THREADS`).
    pub env: Vec<(String, String)>,
    /// `OMP_NUM_THREADS` was set here (for the one INFO line).
    pub omp: Option<usize>,
}

/// The rank's [`RankBinding`] from its binding, the CPUs this process may use, and whether
/// `OMP_NUM_THREADS` is already set for the ranks.
pub fn for_rank(b: &Binding, allowed: &[usize], omp_set: bool) -> RankBinding {
    if b.cpus.is_empty() {
        return RankBinding::default();
    }
    let mut env = vec![(vars::BOUND_CPUS.to_string(), format_cpulist(&b.cpus))];
    let narrower = allowed.is_empty() || b.cpus.len() < allowed.len();
    let omp = (!omp_set && narrower).then_some(b.cpus.len());
    if let Some(n) = omp {
        env.push(("OMP_NUM_THREADS".to_string(), n.to_string()));
    }
    RankBinding {
        cpus: b.cpus.clone(),
        env,
        omp,
    }
}

/// A CPU set for `sched_setaffinity`, built before fork (nothing is allocated after it).
pub fn cpu_set(cpus: &[usize]) -> Result<libc::cpu_set_t, String> {
    // SAFETY: cpu_set_t is plain bits; CPU_ZERO / CPU_SET only write inside it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let max = 8 * std::mem::size_of::<libc::cpu_set_t>();
    for &c in cpus {
        if c >= max {
            return Err(format!("CPU {c} is beyond the {max} CPUs a CPU set holds"));
        }
        // SAFETY: c < the set's size, checked above.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    Ok(set)
}

#[cfg(test)]
mod tests {
    use super::*;
    use railring::topology::Binding;

    fn binding(cpus: &[usize]) -> Binding {
        let t = Topology::from_file(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/topology/aws-p4d-24xl-topo.xml"
        ))
        .unwrap();
        let o = BindOptions::from_values(Some("core"), None, None, None).unwrap();
        let mut b = t.bindings(1, &o).unwrap().remove(0);
        b.cpus = cpus.to_vec();
        b
    }

    #[test]
    fn what_a_rank_gets() {
        let all: Vec<usize> = (0..8).collect();
        let r = for_rank(&binding(&[2, 3]), &all, false);
        assert_eq!(r.cpus, vec![2, 3]);
        assert_eq!(
            r.env,
            vec![
                ("RAILRING_BOUND_CPUS".to_string(), "2-3".to_string()),
                ("OMP_NUM_THREADS".to_string(), "2".to_string())
            ]
        );
        assert_eq!(r.omp, Some(2));
        // OMP_NUM_THREADS already set: left alone.
        assert_eq!(for_rank(&binding(&[2, 3]), &all, true).omp, None);
        // Bound to everything it may use: no OMP_NUM_THREADS (the OpenMP default already).
        assert_eq!(for_rank(&binding(&all), &all, false).omp, None);
        // Not bound (bind-to none): nothing.
        assert_eq!(for_rank(&binding(&[]), &all, false), RankBinding::default());
    }

    #[test]
    fn modes_and_lookup() {
        let job = vec![(vars::BIND_TO.to_string(), "core".to_string())];
        let l = job_lookup(&job);
        assert_eq!(mode(&l).unwrap(), BindTo::Core);
        let job = vec![(vars::BIND_TO.to_string(), "sideways".to_string())];
        let e = mode(&job_lookup(&job)).unwrap_err();
        assert!(e.contains("RAILRING_BIND_TO"), "{e}");
        let none = |_: &str| None;
        assert_eq!(mode(&none).unwrap(), BindTo::Auto);
        assert!(cpu_set(&[0, 3]).is_ok());
        assert!(cpu_set(&[1 << 20]).is_err());
    }
}

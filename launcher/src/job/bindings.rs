//! `railrun --report-bindings`: each rank's GPU / NIC(s) / CPUs, computed from this machine's
//! topology for the ranks on local hosts; the agent of every other node prints its ranks' lines
//! when it starts them. It is the binding each rank gets before exec, whatever the program
//! ([`crate::bind`]: the same computation, with the variables the ranks will see). The wording
//! of one binding is the runtime's (`topology::render::binding_report`).

use crate::bind;
use crate::cli::RunOpts;
use crate::host_source;
use crate::placement::Placement;
use railring::topology::{BindOptions, Binding, Topology};
use railring::vars;
use std::collections::HashMap;

/// The report for `pl` run with `opts`: a heading, then one line per rank.
pub fn report_bindings(pl: &Placement, opts: &RunOpts) -> String {
    let mut job = super::launch::user_env(opts);
    if let Some(b) = opts.bind_to {
        job.push((vars::BIND_TO.to_string(), b.as_str().to_string()));
    }
    let lookup = bind::job_lookup(&job);
    report_with(pl, host_source::is_local, || bind::options(&lookup))
}

/// The report, with `is_local` saying which hosts are this machine and `topology` giving its
/// topology and binding options (asked once, and only when a rank is local).
fn report_with(
    pl: &Placement,
    is_local: impl Fn(&str) -> bool,
    mut topology: impl FnMut() -> Result<(Topology, BindOptions), String>,
) -> String {
    let mut out = String::from("railrun: bindings:\n");
    let mut local: Option<Result<(Topology, BindOptions), String>> = None;
    let mut per_size: HashMap<usize, Result<Vec<Binding>, String>> = HashMap::new();
    for r in &pl.ranks {
        let head = format!(
            "  rank {} on {} (local rank {}/{})",
            r.rank, r.host, r.local_rank, r.local_size
        );
        if !is_local(&r.host) {
            out.push_str(&format!(
                "{head}: (remote: computed and reported by its node's agent when the job starts)\n"
            ));
            continue;
        }
        let (t, o) = match local.get_or_insert_with(&mut topology) {
            Ok(x) => x,
            Err(e) => {
                out.push_str(&format!("{head}: topology unavailable: {e}\n"));
                continue;
            }
        };
        let b = per_size
            .entry(r.local_size)
            .or_insert_with(|| t.bindings(r.local_size, o).map_err(|e| e.to_string()));
        match b {
            Ok(v) => match v.get(r.local_rank) {
                Some(b) => out.push_str(&format!("{head}: {}\n", bind::describe(b))),
                None => out.push_str(&format!("{head}: no binding computed\n")),
            },
            Err(e) => out.push_str(&format!("{head}: cannot compute a binding: {e}\n")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host_source::{parse_host_arg, HostSource, SourceKind};
    use crate::placement::{place, PlacementRequest};

    const P4D: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/topology/aws-p4d-24xl-topo.xml"
    );

    fn placement(hosts: &str, np: usize) -> Placement {
        let src = HostSource::new(parse_host_arg(hosts).unwrap(), SourceKind::HostArg);
        let req = PlacementRequest {
            np: Some(np),
            ..Default::default()
        };
        place(&src, &req).unwrap()
    }

    fn p4d(bind_to: &str) -> Result<(Topology, BindOptions), String> {
        let t = Topology::from_file(P4D).map_err(|e| e.to_string())?;
        let o =
            BindOptions::from_values(Some(bind_to), None, None, None).map_err(|e| e.to_string())?;
        Ok((t, o))
    }

    #[test]
    fn local_ranks_get_a_binding_line_remote_ranks_a_note() {
        let pl = placement("here:2,there:1", 3);
        let text = report_with(&pl, |h| h == "here", || p4d("none"));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert_eq!(lines[0], "railrun: bindings:");
        assert!(
            lines[2].starts_with(
                "  rank 1 on here (local rank 1/2): GPU 1 (cuda 1, 0000:10:1d.0) | NIC 0000:10:1b.0 (PIX) | CPUs unbound (NUMA 0) | GPU1 (0000:10:1d.0): "
            ),
            "{}",
            lines[2]
        );
        assert_eq!(
            lines[3],
            "  rank 2 on there (local rank 0/1): (remote: computed and reported by its node's agent when the job starts)"
        );
    }

    #[test]
    fn a_missing_topology_is_said_per_rank() {
        let pl = placement("here:2", 2);
        let text = report_with(&pl, |_| true, || Err("no sysfs".into()));
        assert_eq!(
            text,
            "railrun: bindings:\n  rank 0 on here (local rank 0/2): topology unavailable: no sysfs\n  rank 1 on here (local rank 1/2): topology unavailable: no sysfs\n"
        );
        // No local rank: the topology is not even looked at.
        let pl = placement("there:1", 1);
        let text = report_with(&pl, |_| false, || panic!("asked for the topology"));
        assert!(text.ends_with("when the job starts)\n"), "{text}");
    }
}

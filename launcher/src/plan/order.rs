//! Fabric-aware node order: with `--fabric F` (or `RAILRING_FABRIC`), railrun lists the job's
//! hosts in the fabric's node order before placing ranks — nodes of one leaf (or one scalable
//! unit) next to each other, leaves of one pod next to each other — so that every ring of the
//! job (the flat ring and each rail's two-level ring) leaves a leaf as few times as possible. A
//! ring's hop between two nodes under different leaves goes up to the spines and down again;
//! [`crossings`] counts those hops per ring for `--dry-run`.

use super::fabric_file::FabricFile;
use crate::host_source::HostSource;
use crate::placement::Placement;
use std::collections::HashMap;

/// The fabric of a run: `--fabric`, else `RAILRING_FABRIC` (empty: none), read and checked.
pub fn fabric_of_run(
    flag: Option<&std::path::Path>,
) -> Result<Option<(FabricFile, String)>, String> {
    let path = match flag {
        Some(p) => p.to_path_buf(),
        None => match std::env::var_os("RAILRING_FABRIC").filter(|v| !v.is_empty()) {
            Some(v) => std::path::PathBuf::from(v),
            None => return Ok(None),
        },
    };
    let ff = super::fabric_file::load(&path)?;
    Ok(Some((ff, path.display().to_string())))
}

/// Reorders `src`'s hosts by their node index in the fabric. Every host must be one of the
/// fabric's (by name); `Err` names the first that is not.
pub fn fabric_order(src: &mut HostSource, ff: &FabricFile, path: &str) -> Result<(), String> {
    let Some(names) = &ff.hosts else {
        return Err(format!(
            "--fabric {path}: the fabric file names no hosts (give \"hosts\": a hostlist in node order)"
        ));
    };
    let index: HashMap<&str, usize> = names
        .iter()
        .enumerate()
        .map(|(i, h)| (h.as_str(), i))
        .collect();
    let mut keyed = Vec::with_capacity(src.hosts.len());
    for (i, h) in src.hosts.iter().enumerate() {
        let Some(&k) = index.get(h.name.as_str()) else {
            return Err(format!(
                "--fabric {path}: host {} is not in the fabric ({} hosts: {}...)",
                h.name,
                names.len(),
                names.iter().take(3).cloned().collect::<Vec<_>>().join(",")
            ));
        };
        keyed.push((k, i));
    }
    keyed.sort_unstable();
    let old = std::mem::take(&mut src.hosts);
    let mut slots: Vec<Option<crate::host_source::HostEntry>> = old.into_iter().map(Some).collect();
    src.hosts = keyed
        .into_iter()
        .filter_map(|(_, i)| slots[i].take())
        .collect();
    Ok(())
}

/// One ring of a job and the hops it makes between leaves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RingCrossings {
    pub name: String,
    /// Hops between consecutive nodes of the ring (its wrap-around included).
    pub hops: usize,
    /// Of those, hops between nodes on different leaves (each one flow up and down a spine).
    pub crossings: usize,
}

/// The leaf-to-leaf hops of the job's rings: the two-level ring of each local rank (on its
/// rail, local rank i mod NICs, the runtime's fallback binding) and the flat ring (its node
/// boundaries use the rail of the boundary's lower rank: the last local rank's, and local rank
/// 0's for the wrap-around).
pub fn crossings(
    pl: &Placement,
    ff: &FabricFile,
) -> Result<(Vec<usize>, Vec<RingCrossings>), String> {
    let f = &ff.fabric;
    let names = ff.hosts.as_ref().ok_or("the fabric file names no hosts")?;
    let index: HashMap<&str, usize> = names
        .iter()
        .enumerate()
        .map(|(i, h)| (h.as_str(), i))
        .collect();
    let nodes: Vec<usize> = pl
        .hosts
        .iter()
        .map(|h| {
            index
                .get(h.as_str())
                .copied()
                .ok_or_else(|| format!("host {h} is not in fabric {}", f.name))
        })
        .collect::<Result<_, _>>()?;
    let nn = nodes.len();
    let per_node: Vec<usize> = (0..nn)
        .map(|k| pl.ranks.iter().filter(|r| r.node_rank == k).count())
        .collect();
    let mut out = Vec::new();
    let hop = |a: usize, b: usize, nic: usize| f.leaf_of(nodes[a], nic) != f.leaf_of(nodes[b], nic);
    let l = per_node.iter().copied().max().unwrap_or(1);
    if nn > 1 {
        for i in 0..l.min(f.ranks_per_node) {
            let nic = i % f.nics;
            let ring: Vec<usize> = (0..nn).filter(|&k| per_node[k] > i).collect();
            if ring.len() < 2 {
                continue;
            }
            let c = (0..ring.len())
                .filter(|&j| hop(ring[j], ring[(j + 1) % ring.len()], nic))
                .count();
            out.push(RingCrossings {
                name: format!("two-level ring {i} (rail {nic})"),
                hops: ring.len(),
                crossings: c,
            });
        }
        let c = (0..nn)
            .filter(|&k| {
                let next = (k + 1) % nn;
                // the hop's connecting rank: the last rank of node k, or rank 0 for the wrap
                let nic = if next == 0 {
                    0
                } else {
                    (per_node[k] - 1) % f.ranks_per_node % f.nics
                };
                hop(k, next, nic)
            })
            .count();
        out.push(RingCrossings {
            name: "flat ring".into(),
            hops: nn,
            crossings: c,
        });
    }
    Ok((nodes, out))
}

/// The `--dry-run` lines: the node order with each node's leaf, and the crossings per ring.
pub fn describe(
    pl: &Placement,
    ff: &FabricFile,
    path: &str,
    ordered: bool,
) -> Result<String, String> {
    let f = &ff.fabric;
    let (nodes, rings) = crossings(pl, ff)?;
    let mut s = format!(
        "fabric {} ({path}): {} order\n  nodes:",
        f.name,
        if ordered {
            "fabric-aware"
        } else {
            "host source"
        }
    );
    for (k, h) in pl.hosts.iter().enumerate() {
        let leaves: Vec<String> = (0..f.nics.min(4))
            .map(|r| f.leaf_of(nodes[k], r).to_string())
            .collect();
        s.push_str(&format!(" {h}[leaf {}]", leaves.join("/")));
        if k >= 63 && pl.hosts.len() > 64 {
            s.push_str(&format!(" ... {} more", pl.hosts.len() - 64));
            break;
        }
    }
    s.push('\n');
    s.push_str("  leaf uplink crossings per ring (a crossing: a hop between nodes on different leaves, one flow up to the spines and down):\n");
    for r in &rings {
        s.push_str(&format!(
            "    {:<28} {} of {} hops\n",
            r.name, r.crossings, r.hops
        ));
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host_source::{parse_host_arg, SourceKind};
    use crate::placement::{place, PlacementRequest};

    fn ff() -> FabricFile {
        super::super::fabric_file::parse(
            r#"{"name": "t", "hosts": "n[1-8]", "ranks_per_node": 2,
                "node_link": {"gbyte_per_s": 5}, "nics_per_node": 2, "nic": {"gbit_per_s": 0.1},
                "wiring": {"nodes_per_leaf": 4}, "spine": {"spines": 2, "oversubscription": 3}}"#,
            "t.json",
        )
        .unwrap()
    }

    fn placed(hosts: &str) -> (HostSource, Placement) {
        let src = HostSource::new(parse_host_arg(hosts).unwrap(), SourceKind::HostArg);
        let pl = place(&src, &PlacementRequest::default()).unwrap();
        (src, pl)
    }

    #[test]
    fn scrambled_hosts_cross_leaves_on_every_hop_until_ordered() {
        let f = ff();
        let scrambled = "n1:2,n5:2,n2:2,n6:2,n3:2,n7:2,n4:2,n8:2";
        let (mut src, pl) = placed(scrambled);
        let (_, rings) = crossings(&pl, &f).unwrap();
        assert!(
            rings.iter().all(|r| r.crossings == 8 && r.hops == 8),
            "{rings:?}"
        );
        fabric_order(&mut src, &f, "t.json").unwrap();
        let names: Vec<&str> = src.hosts.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(names, ["n1", "n2", "n3", "n4", "n5", "n6", "n7", "n8"]);
        let pl = place(&src, &PlacementRequest::default()).unwrap();
        let (_, rings) = crossings(&pl, &f).unwrap();
        assert_eq!(rings.len(), 3);
        assert!(rings.iter().all(|r| r.crossings == 2), "{rings:?}");
        let text = describe(&pl, &f, "t.json", true).unwrap();
        assert!(
            text.contains("n4[leaf 1/1] n5[leaf 1/1]")
                || text.contains("n4[leaf 0/0] n5[leaf 1/1]"),
            "{text}"
        );
        assert!(
            text.contains("flat ring                    2 of 8 hops"),
            "{text}"
        );
    }

    #[test]
    fn unknown_hosts_are_refused() {
        let f = ff();
        let (mut src, _) = placed("n1,x9");
        let e = fabric_order(&mut src, &f, "t.json").unwrap_err();
        assert!(e.contains("host x9 is not in the fabric"), "{e}");
    }
}

//! The Slurm allocation as a host source: `SLURM_JOB_NODELIST` (or `SLURM_NODELIST`) expanded
//! with `railring::hostlist`, with `SLURM_TASKS_PER_NODE` (or `SLURM_JOB_CPUS_PER_NODE`) as slots.

use railring::hostlist;

use super::{preview, valid_hostname, HostEntry, HostError, Merger, MAX_SLOTS};

/// Slurm's own limit on the nodes of one allocation (`MaxNodeCount`'s ceiling): a longer node
/// list is not an allocation, it is a mistake.
pub const MAX_SLURM_NODES: usize = 65_536;

/// Hosts of the Slurm allocation, from `SLURM_JOB_NODELIST` (or
/// `SLURM_NODELIST`) and `SLURM_TASKS_PER_NODE` (or
/// `SLURM_JOB_CPUS_PER_NODE`; 1 slot each when neither is set).
/// `Ok(None)` when no node list is set (not inside an allocation).
/// Nodes with a count of 0 are left out.
pub fn hosts_from_slurm_env(
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<Vec<HostEntry>>, HostError> {
    let (var, list) = match ["SLURM_JOB_NODELIST", "SLURM_NODELIST"]
        .into_iter()
        .find_map(|v| env(v).filter(|s| !s.trim().is_empty()).map(|s| (v, s)))
    {
        Some(x) => x,
        None => return Ok(None),
    };
    let names = hostlist::expand(&list).map_err(|source| HostError::Slurm {
        var,
        value: preview(&list),
        source,
    })?;
    if names.len() > MAX_SLURM_NODES {
        return Err(HostError::SlurmAllocation(format!(
            "{var}=`{}` names {} hosts; a Slurm allocation has at most {MAX_SLURM_NODES} nodes",
            preview(&list),
            names.len()
        )));
    }
    if let Some(bad) = names.iter().find(|n| !valid_hostname(n)) {
        return Err(HostError::SlurmAllocation(format!(
            "{var} contains `{}`, expected host names of letters, digits, `-`, `_` or `.`, not starting with `-`",
            preview(bad)
        )));
    }
    let counts = match ["SLURM_TASKS_PER_NODE", "SLURM_JOB_CPUS_PER_NODE"]
        .into_iter()
        .find_map(|v| env(v).filter(|s| !s.trim().is_empty()).map(|s| (v, s)))
    {
        Some((cvar, s)) => {
            let c = hostlist::parse_tasks_per_node(&s).map_err(|source| HostError::Slurm {
                var: cvar,
                value: preview(&s),
                source,
            })?;
            if c.len() != names.len() {
                return Err(HostError::SlurmAllocation(format!(
                    "{var} lists {} nodes but {cvar}=`{}` gives {} counts; expected one count per node",
                    names.len(),
                    preview(&s),
                    c.len()
                )));
            }
            c
        }
        None => vec![1; names.len()],
    };
    let mut m = Merger::new();
    for (name, slots) in names.into_iter().zip(counts) {
        if slots == 0 {
            continue;
        }
        let slots = slots.min(MAX_SLOTS);
        m.add(HostEntry::new(name, slots))
            .map_err(|(found, expected)| {
                HostError::SlurmAllocation(format!("{found}; expected {expected}"))
            })?;
    }
    if m.hosts.is_empty() {
        return Err(HostError::SlurmAllocation(format!(
            "{var}=`{}` gives no node with a task count above 0",
            preview(&list)
        )));
    }
    Ok(Some(m.hosts))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host_source::tests::{env_of, names_slots, no_env, ns};

    #[test]
    fn slurm_env() {
        let env = env_of(&[
            ("SLURM_JOB_NODELIST", "rack[1-2]-node[01-02],login1"),
            ("SLURM_TASKS_PER_NODE", "2(x4),1"),
        ]);
        let h = hosts_from_slurm_env(&env).unwrap().unwrap();
        assert_eq!(
            names_slots(&h),
            ns(&[
                ("rack1-node01", 2),
                ("rack1-node02", 2),
                ("rack2-node01", 2),
                ("rack2-node02", 2),
                ("login1", 1)
            ])
        );
        let env = env_of(&[
            ("SLURM_JOB_NODELIST", "n[1-3],x"),
            ("SLURM_TASKS_PER_NODE", "2(x3),1"),
        ]);
        let h = hosts_from_slurm_env(&env).unwrap().unwrap();
        assert_eq!(
            names_slots(&h),
            ns(&[("n1", 2), ("n2", 2), ("n3", 2), ("x", 1)])
        );
        // SLURM_NODELIST and SLURM_JOB_CPUS_PER_NODE fallbacks.
        let env = env_of(&[
            ("SLURM_NODELIST", "n[01-02]"),
            ("SLURM_JOB_CPUS_PER_NODE", "36(x2)"),
        ]);
        let h = hosts_from_slurm_env(&env).unwrap().unwrap();
        assert_eq!(names_slots(&h), ns(&[("n01", 36), ("n02", 36)]));
        // No counts at all: one slot per node.
        let env = env_of(&[("SLURM_JOB_NODELIST", "n[1-2]")]);
        let h = hosts_from_slurm_env(&env).unwrap().unwrap();
        assert_eq!(names_slots(&h), ns(&[("n1", 1), ("n2", 1)]));
        // Not in an allocation.
        assert!(hosts_from_slurm_env(&no_env).unwrap().is_none());
    }

    #[test]
    fn slurm_env_errors() {
        let env = env_of(&[
            ("SLURM_JOB_NODELIST", "n[1-3"),
            ("SLURM_TASKS_PER_NODE", "1"),
        ]);
        let e = hosts_from_slurm_env(&env).unwrap_err().to_string();
        assert!(e.starts_with("SLURM_JOB_NODELIST=`n[1-3`: "), "{e}");
        let env = env_of(&[
            ("SLURM_JOB_NODELIST", "n[1-3]"),
            ("SLURM_TASKS_PER_NODE", "2(x2)"),
        ]);
        let e = hosts_from_slurm_env(&env).unwrap_err().to_string();
        assert!(e.contains("3 nodes") && e.contains("2 counts"), "{e}");
        let env = env_of(&[
            ("SLURM_JOB_NODELIST", "n[1-3]"),
            ("SLURM_TASKS_PER_NODE", "2(x"),
        ]);
        let e = hosts_from_slurm_env(&env).unwrap_err().to_string();
        assert!(e.starts_with("SLURM_TASKS_PER_NODE="), "{e}");
        let env = env_of(&[("SLURM_JOB_NODELIST", "n[1-100000000]")]);
        assert!(hosts_from_slurm_env(&env).is_err());
    }
}

//! What railrun gives every rank besides its command line, seen by programs that are not
//! railring programs (a shell reading `/proc/self/status`):
//!
//! * the CPU binding before exec: `--bind-to core|numa|none` and `--report-bindings` agree with
//!   `Cpus_allowed_list` of every rank, locally and on the emulated cluster (2 hosts x 2 ranks,
//!   where each node's agent reports its ranks); `OMP_NUM_THREADS` is set to the rank's CPUs
//!   only when unset (one line says so); a railring program keeps the mask railrun gave;
//! * the `-x` rule for variables railrun sets itself (docs/railrun.md, "Variables"): the user's
//!   value wins for `MASTER_ADDR` / `MASTER_PORT` (railring still works), a value equal to
//!   railrun's is accepted, a rank, size or railrun-only variable that differs is refused.

use railring_tests::bins;
use railring_tests::cluster::{Cluster, ClusterSpec};
use railring_tests::proc::{collect, wait_timeout};
use std::collections::BTreeMap;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

const COLLCHECK: &str = env!("CARGO_BIN_EXE_rr-collcheck");

/// Each rank prints its rank, CPUs, OMP_NUM_THREADS, MASTER_ADDR and MASTER_PORT.
const PROBE: &str = r#"echo "PROBE $RAILRING_RANK $(grep Cpus_allowed_list /proc/self/status | cut -f2) ${OMP_NUM_THREADS:-unset} ${MASTER_ADDR:-none} ${MASTER_PORT:-none} ${RAILRING_BOUND_CPUS:-none}""#;

fn clean(mut c: Command) -> Command {
    for (k, _) in std::env::vars() {
        if k.starts_with("RAILRING_")
            || k.starts_with("PMI")
            || k.starts_with("OMPI_")
            || k == "OMP_NUM_THREADS"
            || k.starts_with("MASTER_")
        {
            c.env_remove(k);
        }
    }
    c.stdin(Stdio::null());
    c
}

fn railrun(args: &[&str]) -> Command {
    let mut c = clean(Command::new(bins::railrun()));
    c.args(args);
    c
}

fn run(mut cmd: Command, what: &str) -> Output {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("{what}: {e}"));
    let (o, e) = collect(&mut child);
    let Some(status) = wait_timeout(&mut child, Duration::from_secs(120)) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("{what}: no end within 120 s; stderr: {}", e.join().unwrap());
    };
    Output {
        status,
        stdout: o.join().unwrap().into_bytes(),
        stderr: e.join().unwrap().into_bytes(),
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `0-2,5` → [0, 1, 2, 5].
fn cpus(list: &str) -> Vec<usize> {
    railring::topology::parse_cpulist(list.trim())
        .unwrap_or_else(|e| panic!("cpu list {list:?}: {e}"))
}

/// This process's CPUs (what railrun, started from here, may use).
fn my_cpus() -> Vec<usize> {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let l = s
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap();
    cpus(l)
}

struct Probe {
    cpus: Vec<usize>,
    omp: String,
    master: (String, String),
    bound: String,
}

/// The PROBE lines by rank (exactly `np`, each rank once).
fn probes(o: &Output, np: usize, what: &str) -> Vec<Probe> {
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{what}: {:?}\n{out}\n{err}", o.status);
    let mut by: BTreeMap<usize, Probe> = BTreeMap::new();
    for l in out.lines().filter_map(|l| l.strip_prefix("PROBE ")) {
        let w: Vec<&str> = l.split_whitespace().collect();
        assert_eq!(w.len(), 6, "{what}: {l:?}");
        let r: usize = w[0].parse().unwrap();
        let p = Probe {
            cpus: cpus(w[1]),
            omp: w[2].into(),
            master: (w[3].into(), w[4].into()),
            bound: w[5].into(),
        };
        assert!(by.insert(r, p).is_none(), "{what}: rank {r} twice\n{out}");
    }
    assert_eq!(by.len(), np, "{what}:\n{out}\n{err}");
    by.into_values().collect()
}

/// `--report-bindings` lines with CPUs (railrun's and the agents'): rank → CPUs (`None`:
/// unbound).
fn reported(err: &str) -> BTreeMap<usize, Option<Vec<usize>>> {
    let mut m = BTreeMap::new();
    for l in err.lines() {
        // An agent's lines come as "railrun: [HOST]   rank ...".
        let l = match l.strip_prefix("railrun: [") {
            Some(x) => x.split_once("] ").map(|y| y.1).unwrap_or(l),
            None => l,
        };
        let Some(rest) = l.trim_start().strip_prefix("rank ") else {
            continue;
        };
        let Some((_, c)) = l.split_once("| CPUs ") else {
            continue;
        };
        let r: usize = rest.split_whitespace().next().unwrap().parse().unwrap();
        let c = c.split([' ', '|']).next().unwrap();
        let v = if c == "unbound" { None } else { Some(cpus(c)) };
        assert!(m.insert(r, v).is_none(), "rank {r} reported twice:\n{err}");
    }
    m
}

/// What OMP_NUM_THREADS a rank bound to `c` gets when the user did not set it.
fn omp_for(c: &[usize], allowed: &[usize]) -> String {
    if c.len() < allowed.len() {
        c.len().to_string()
    } else {
        "unset".into()
    }
}

#[test]
fn bind_to_core_binds_every_program_as_reported() {
    let allowed = my_cpus();
    let o = run(
        railrun(&[
            "--report-bindings",
            "--bind-to",
            "core",
            "-H",
            "localhost:2",
            "-np",
            "2",
            "sh",
            "-c",
            PROBE,
        ]),
        "railrun --bind-to core sh",
    );
    let err = text(&o.stderr);
    let p = probes(&o, 2, "--bind-to core");
    let rep = reported(&err);
    assert_eq!(rep.len(), 2, "{err}");
    for (r, probe) in p.iter().enumerate() {
        let want = rep[&r]
            .clone()
            .unwrap_or_else(|| panic!("rank {r} unbound:\n{err}"));
        assert_eq!(
            probe.cpus, want,
            "rank {r}: sees CPUs the report did not show\n{err}"
        );
        assert_eq!(probe.omp, omp_for(&want, &allowed), "rank {r}\n{err}");
        assert_eq!(cpus(&probe.bound), want, "RAILRING_BOUND_CPUS of rank {r}");
    }
    let said = err.matches("OMP_NUM_THREADS is not set").count();
    let set = p.iter().any(|q| q.omp != "unset");
    assert_eq!(said, usize::from(set), "{err}");
    // The user's OMP_NUM_THREADS wins, and nothing is said.
    let o = run(
        railrun(&[
            "--bind-to",
            "core",
            "-x",
            "OMP_NUM_THREADS=3",
            "-np",
            "2",
            "sh",
            "-c",
            PROBE,
        ]),
        "railrun -x OMP_NUM_THREADS=3",
    );
    for q in probes(&o, 2, "-x OMP_NUM_THREADS=3") {
        assert_eq!(q.omp, "3");
    }
    assert!(
        !text(&o.stderr).contains("OMP_NUM_THREADS"),
        "{}",
        text(&o.stderr)
    );
}

#[test]
fn default_auto_and_none_bind_as_reported() {
    let allowed = my_cpus();
    // No --bind-to: the runtime's default (auto: numa for 2 ranks on 2 or more CPUs),
    // reported and applied.
    let o = run(
        railrun(&["--report-bindings", "-np", "2", "sh", "-c", PROBE]),
        "railrun (default binding) sh",
    );
    let err = text(&o.stderr);
    let rep = reported(&err);
    for (r, q) in probes(&o, 2, "default binding").iter().enumerate() {
        let want = rep[&r].clone().unwrap_or_else(|| allowed.clone());
        assert_eq!(q.cpus, want, "rank {r}\n{err}");
    }
    // Twice as many ranks as CPUs on one NUMA node (this machine, if it is small enough):
    // auto gives each rank one core, two ranks per core, reported and applied before exec.
    let numa_nodes = std::fs::read_dir("/sys/devices/system/node")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| {
                    let n = e.file_name();
                    let n = n.to_string_lossy();
                    n.starts_with("node") && n[4..].parse::<usize>().is_ok()
                })
                .count()
        })
        .unwrap_or(1);
    if allowed.len() <= 4 && numa_nodes <= 1 {
        let np = 2 * allowed.len();
        let o = run(
            railrun(&[
                "--report-bindings",
                "--oversubscribe",
                "-np",
                &np.to_string(),
                "sh",
                "-c",
                PROBE,
            ]),
            "railrun (default binding, twice as many ranks as CPUs) sh",
        );
        let err = text(&o.stderr);
        let rep = reported(&err);
        let mut per_cpu: BTreeMap<Vec<usize>, usize> = BTreeMap::new();
        for (r, q) in probes(&o, np, "default binding, oversubscribed")
            .iter()
            .enumerate()
        {
            let want = rep[&r].clone().expect("bound");
            assert_eq!(q.cpus, want, "rank {r}\n{err}");
            assert!(
                !q.cpus.is_empty() && q.cpus.len() < allowed.len().max(2),
                "rank {r}: {:?}\n{err}",
                q.cpus
            );
            *per_cpu.entry(q.cpus.clone()).or_default() += 1;
        }
        assert!(err.contains("(bind-to auto; numa keeps them all)"), "{err}");
        assert!(
            per_cpu.values().all(|&n| n * per_cpu.len() == np),
            "an even share: {per_cpu:?}\n{err}"
        );
    } else {
        eprintln!(
            "default_auto_and_none_bind_as_reported: {} CPUs on {numa_nodes} NUMA node(s): the oversubscribed default is checked on machines of at most 4 CPUs on one node",
            allowed.len()
        );
    }
    // --bind-to none: affinity left as railrun's, reported as unbound, no variables.
    let o = run(
        railrun(&[
            "--report-bindings",
            "--bind-to",
            "none",
            "-np",
            "2",
            "sh",
            "-c",
            PROBE,
        ]),
        "railrun --bind-to none sh",
    );
    let err = text(&o.stderr);
    let rep = reported(&err);
    for (r, q) in probes(&o, 2, "--bind-to none").iter().enumerate() {
        assert_eq!(rep[&r], None, "{err}");
        assert_eq!(q.cpus, allowed, "rank {r}");
        assert_eq!((q.omp.as_str(), q.bound.as_str()), ("unset", "none"));
    }
}

/// A railring program keeps the mask railrun gave it (the runtime does not narrow an explicit
/// binding): 4 ranks sharing the NUMA node's CPUs stay on all of them.
#[test]
fn a_railring_program_keeps_the_binding_railrun_gave() {
    let o = run(
        railrun(&[
            "--report-bindings",
            "--bind-to",
            "numa",
            "--oversubscribe",
            "-H",
            "localhost:4",
            "-np",
            "4",
            COLLCHECK,
            "affinity",
        ]),
        "railrun --bind-to numa rr-collcheck affinity",
    );
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{out}\n{err}");
    let rep = reported(&err);
    let mut seen = 0;
    for l in out.lines().filter_map(|l| l.strip_prefix("AFFINITY rank ")) {
        let (r, c) = l.split_once(" cpus ").unwrap();
        let r: usize = r.parse().unwrap();
        let want = rep[&r].clone().expect("bound");
        assert_eq!(cpus(c), want, "rank {r} after Communicator::init\n{err}");
        seen += 1;
    }
    assert_eq!(seen, 4, "{out}\n{err}");
}

#[test]
fn binding_on_cluster_hosts_as_each_agent_reports() {
    let test = "binding_on_cluster_hosts_as_each_agent_reports";
    if !Cluster::check_or_skip(test) {
        return;
    }
    let c = Cluster::up(ClusterSpec {
        hosts: 2,
        rails: 1,
        rail_rate: None,
    })
    .unwrap_or_else(|e| panic!("{test}: cluster up: {e}"));
    let hf = c.hostfile(2).unwrap();
    let ssh = c.ssh_command();
    let rr = bins::railrun().to_str().unwrap().to_string();
    let argv = [
        rr.as_str(),
        "--ssh",
        &ssh,
        "--connect-timeout",
        "15",
        "--hostfile",
        hf.to_str().unwrap(),
        "--report-bindings",
        "--bind-to",
        "core",
        "-np",
        "4",
        "sh",
        "-c",
        PROBE,
    ];
    let cmd = clean(c.exec("head", &argv));
    let o = run(cmd, "railrun on head --bind-to core x4");
    let err = text(&o.stderr);
    let p = probes(&o, 4, "cluster --bind-to core");
    for h in ["n1", "n2"] {
        assert!(err.contains(&format!("railrun: [{h}] bindings:")), "{err}");
    }
    let rep = reported(&err);
    assert_eq!(rep.len(), 4, "{err}");
    for (r, q) in p.iter().enumerate() {
        let want = rep[&r]
            .clone()
            .unwrap_or_else(|| panic!("rank {r} unbound:\n{err}"));
        assert_eq!(q.cpus, want, "rank {r}\n{err}");
        assert_eq!(cpus(&q.bound), want);
    }
    for h in ["head", "n1", "n2"] {
        if let Err(left) = c.wait_no_survivors(h, Duration::from_secs(5)) {
            panic!("processes left on {h}: {left:?}");
        }
    }
}

#[test]
fn x_values_for_variables_railrun_sets() {
    // The user's MASTER_ADDR / MASTER_PORT win (their own torch code), and railring still works.
    let o = run(
        railrun(&[
            "-x",
            "MASTER_ADDR=10.1.2.3",
            "-x",
            "MASTER_PORT=4242",
            "-np",
            "2",
            "sh",
            "-c",
            PROBE,
        ]),
        "railrun -x MASTER_ADDR -x MASTER_PORT",
    );
    for q in probes(&o, 2, "-x MASTER_*") {
        assert_eq!(q.master, ("10.1.2.3".to_string(), "4242".to_string()));
    }
    let o = run(
        railrun(&[
            "-x",
            "MASTER_ADDR=10.1.2.3",
            "-x",
            "MASTER_PORT=4242",
            "-np",
            "2",
            COLLCHECK,
            "allreduce",
            "1000",
        ]),
        "railrun -x MASTER_* rr-collcheck",
    );
    let out = text(&o.stdout);
    assert!(
        o.status.success() && out.matches("OK rank").count() == 2,
        "{out}\n{}",
        text(&o.stderr)
    );

    // A value equal to railrun's own is accepted.
    let o = run(
        railrun(&["-x", "WORLD_SIZE=2", "-np", "2", "sh", "-c", PROBE]),
        "-x WORLD_SIZE=2",
    );
    probes(&o, 2, "-x WORLD_SIZE=2");

    // What cannot be honoured is refused before anything starts, naming the variable.
    for (x, want) in [
        (
            "RANK=3",
            "-x RANK=3: railrun gives every rank its own RANK (rank 0 gets 0)",
        ),
        (
            "WORLD_SIZE=8",
            "-x WORLD_SIZE=8: this job's ranks get WORLD_SIZE=2 from railrun",
        ),
        (
            "OMPI_COMM_WORLD_RANK=1",
            "railrun gives every rank its own OMPI_COMM_WORLD_RANK",
        ),
        (
            "RAILRING_JOB_SECRET=abc",
            "-x RAILRING_JOB_SECRET: railrun sets RAILRING_JOB_SECRET itself",
        ),
        ("PMI_FD=3", "-x PMI_FD: railrun sets PMI_FD itself"),
    ] {
        let o = run(
            railrun(&["-x", x, "-np", "2", "sh", "-c", "echo STARTED"]),
            &format!("-x {x}"),
        );
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "-x {x}: {err}");
        assert!(
            err.contains(want) && err.contains("docs/railrun.md"),
            "-x {x}: {err}"
        );
        assert!(
            !text(&o.stdout).contains("STARTED"),
            "-x {x} started the job"
        );
    }

    // RAILRING_BIND_TO from -x drives the binding (as --bind-to would); contradicting
    // --bind-to is refused.
    let o = run(
        railrun(&[
            "--report-bindings",
            "-x",
            "RAILRING_BIND_TO=core",
            "-np",
            "2",
            "sh",
            "-c",
            PROBE,
        ]),
        "-x RAILRING_BIND_TO=core",
    );
    let err = text(&o.stderr);
    let rep = reported(&err);
    for (r, q) in probes(&o, 2, "-x RAILRING_BIND_TO=core").iter().enumerate() {
        assert_eq!(Some(q.cpus.clone()), rep[&r], "rank {r}\n{err}");
    }
    assert!(err.contains("bind-to core"), "{err}");
    let o = run(
        railrun(&[
            "--bind-to",
            "numa",
            "-x",
            "RAILRING_BIND_TO=core",
            "-np",
            "2",
            "true",
        ]),
        "-x RAILRING_BIND_TO=core --bind-to numa",
    );
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("contradicts --bind-to numa"), "{err}");
}

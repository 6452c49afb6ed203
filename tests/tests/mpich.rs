//! MPI programs under railrun, and railring programs under MPI launchers:
//!
//! * a real MPICH program (`tests/programs/mpi_check.c`, compiled here with `mpicc.mpich`)
//!   under railrun through its PMI-1 server, locally and across the emulated cluster (2 hosts x
//!   2 ranks, MPICH's data over the rail): ranks, size, hosts and an `MPI_Allreduce` checked
//!   element by element;
//!   `MPI_Abort` ends the job with its error code; mpi4py built against MPICH when it is
//!   installed (`RAILRING_TEST_MPI4PY_MPICH`, see scripts/test; otherwise `SKIPPED`);
//! * the same program built with Open MPI's `mpicc`: refused before the start with a message
//!   pointing to mpirun, and caught in `MPI_Init` when a script hides it;
//! * railring programs built without the `mpi` feature: under MPICH's `mpiexec` they bootstrap
//!   through its PMI-1 server; under Open MPI's `mpirun` they stop with an error that says what
//!   to do (rr-collcheck and the shipped railperf).
//!
//! Missing MPICH or Open MPI prints `SKIPPED` (and fails under `CI`, where scripts/test
//! installs them); the cluster test needs root.

use railring_tests::bins;
use railring_tests::cluster::{Cluster, ClusterSpec};
use railring_tests::proc::{collect, wait_timeout};
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

const MPI_CHECK_C: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/programs/mpi_check.c");
const MPI4PY_CHECK: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/programs/mpi4py_check.py");

fn skip(test: &str, why: &str) {
    if std::env::var_os("CI").is_some() {
        panic!("{test}: {why} (scripts/test installs it)");
    }
    let _ = writeln!(std::io::stderr(), "SKIPPED: {test}: {why}");
}

/// `name` in `$PATH`.
fn which(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| {
            std::fs::metadata(p)
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        })
}

/// Compiler → the program it built (`None`: no such compiler).
type Built = Vec<(String, Option<PathBuf>)>;

/// `tests/programs/mpi_check.c` built with `cc` (`mpicc.mpich` or `mpicc`), once per run.
fn mpi_check(cc: &str) -> Option<PathBuf> {
    static BUILT: OnceLock<Mutex<Built>> = OnceLock::new();
    let built = BUILT.get_or_init(|| Mutex::new(Vec::new()));
    let mut b = built.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, p)) = b.iter().find(|(c, _)| c == cc) {
        return p.clone();
    }
    let p = which(cc).map(|compiler| {
        let dir = bins::profile_dir().join("mpi-programs");
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join(format!("mpi_check-{}", cc.replace('.', "-")));
        let st = Command::new(compiler)
            .args(["-O2", "-o"])
            .arg(&out)
            .arg(MPI_CHECK_C)
            .status()
            .unwrap_or_else(|e| panic!("run {cc}: {e}"));
        assert!(st.success(), "{cc} {MPI_CHECK_C} failed");
        out
    });
    b.push((cc.to_string(), p.clone()));
    p
}

fn railrun() -> Command {
    let mut c = Command::new(bins::railrun());
    for (k, _) in std::env::vars() {
        if k.starts_with("RAILRING_") || k.starts_with("PMI") || k.starts_with("OMPI_") {
            c.env_remove(k);
        }
    }
    c.stdin(Stdio::null());
    c
}

/// Run `cmd` with a limit; the output, and how long it took.
fn run(cmd: Command, limit: Duration, what: &str) -> (Output, Duration) {
    let t0 = Instant::now();
    let (out, ended) = run_or_stop(cmd, limit);
    assert!(
        ended,
        "{what} did not finish within {limit:?}; stderr: {}",
        text(&out.stderr)
    );
    (out, t0.elapsed())
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Run `cmd`; stop it after `limit`. The output, and whether it ended by itself.
fn run_or_stop(mut cmd: Command, limit: Duration) -> (Output, bool) {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn");
    let (o, e) = collect(&mut child);
    let (status, ended) = match wait_timeout(&mut child, limit) {
        Some(st) => (st, true),
        None => {
            let _ = child.kill();
            (child.wait().expect("wait"), false)
        }
    };
    let out = Output {
        status,
        stdout: o.join().unwrap().into_bytes(),
        stderr: e.join().unwrap().into_bytes(),
    };
    (out, ended)
}

/// Whether MPICH's own `mpiexec.mpich` (Hydra over the cluster's ssh) runs `prog` on the same
/// 2 hosts x 2 ranks to its end within 60 s.
fn hydra_finishes(c: &Cluster, prog: &std::path::Path) -> bool {
    let dir = std::env::temp_dir().join(format!("rr-hydra-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let hf = dir.join("hosts");
    std::fs::write(&hf, "n1:2\nn2:2\n").unwrap();
    let wrapper = dir.join("ssh");
    std::fs::write(
        &wrapper,
        format!("#!/bin/sh\nexec {} \"$@\"\n", c.ssh_command()),
    )
    .unwrap();
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let argv = [
        "mpiexec.mpich",
        "-launcher",
        "ssh",
        "-launcher-exec",
        wrapper.to_str().unwrap(),
        "-f",
        hf.to_str().unwrap(),
        "-n",
        "4",
        "-genv",
        "UCX_TLS",
        "tcp,self",
        "-genv",
        "UCX_NET_DEVICES",
        "rail0",
        prog.to_str().unwrap(),
        "check",
        "300000",
    ];
    let mut cmd = c.exec("head", &argv);
    cmd.stdin(Stdio::null());
    let (o, ended) = run_or_stop(cmd, Duration::from_secs(60));
    let _ = std::fs::remove_dir_all(&dir);
    ended && o.status.success()
}

/// Every rank's line `rank R size S host H pmi_rank P allreduce N ok`: one per rank 0..np, each
/// with size np, its own PMI rank and a correct all-reduce. Returns the host of every rank.
fn check_ranks(o: &Output, np: usize, n: usize, what: &str) -> Vec<String> {
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(
        o.status.success(),
        "{what}: {:?}\nstdout:\n{out}\nstderr:\n{err}",
        o.status
    );
    let mut hosts = vec![None; np];
    for l in out.lines().filter(|l| l.starts_with("rank ")) {
        let w: Vec<&str> = l.split_whitespace().collect();
        assert_eq!(w.len(), 11, "{what}: line {l:?}");
        let r: usize = w[1].parse().unwrap();
        assert!(r < np, "{what}: {l}");
        assert_eq!(w[3], np.to_string(), "{what}: size in {l}");
        assert_eq!(w[7], r.to_string(), "{what}: PMI_RANK in {l}");
        assert_eq!((w[9], w[10]), (n.to_string().as_str(), "ok"), "{what}: {l}");
        assert!(hosts[r].is_none(), "{what}: rank {r} twice:\n{out}");
        hosts[r] = Some(w[5].to_string());
    }
    hosts
        .into_iter()
        .enumerate()
        .map(|(r, h)| h.unwrap_or_else(|| panic!("{what}: no line from rank {r}:\n{out}\n{err}")))
        .collect()
}

#[test]
fn mpich_program_runs_as_one_job_locally() {
    let Some(prog) = mpi_check("mpicc.mpich") else {
        return skip(
            "mpich_program_runs_as_one_job_locally",
            "mpicc.mpich not found",
        );
    };
    let mut c = railrun();
    c.args(["-H", "localhost:3", "-np", "3"])
        .arg(&prog)
        .args(["check", "200000"]);
    let (o, _) = run(c, Duration::from_secs(60), "railrun -np 3 mpi_check");
    check_ranks(&o, 3, 200_000, "railrun -np 3 mpi_check (MPICH)");
}

#[test]
fn mpi_abort_ends_the_job_with_its_code() {
    let Some(prog) = mpi_check("mpicc.mpich") else {
        return skip(
            "mpi_abort_ends_the_job_with_its_code",
            "mpicc.mpich not found",
        );
    };
    let mut c = railrun();
    c.args(["-H", "localhost:3", "-np", "3"])
        .arg(&prog)
        .args(["abort", "5"]);
    // The other ranks would wait 60 s: the abort must end them.
    let (o, took) = run(c, Duration::from_secs(50), "railrun mpi_check abort");
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(5), "{err}");
    assert!(
        err.contains("rank 1 called MPI_Abort (PMI abort) with error code 5; ending the job"),
        "{err}"
    );
    assert!(took < Duration::from_secs(30), "took {took:?}: {err}");
}

#[test]
fn mpich_program_across_cluster_hosts() {
    let test = "mpich_program_across_cluster_hosts";
    let Some(prog) = mpi_check("mpicc.mpich") else {
        return skip(test, "mpicc.mpich not found");
    };
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
    // UCX (MPICH's network layer) over TCP on the rail: the emulated hosts share one kernel,
    // and UCX's shared-memory transports would otherwise carry data between them.
    let argv = [
        "--connect-timeout",
        "15",
        "--hostfile",
        hf.to_str().unwrap(),
        "-x",
        "UCX_TLS=tcp,self",
        "-x",
        "UCX_NET_DEVICES=rail0",
        "-np",
        "4",
        prog.to_str().unwrap(),
        "check",
        "300000",
    ];
    let (tx0, _) = c.rail_bytes("n1", 0).unwrap();
    let (mut o, mut ended) = run_or_stop(c.railrun_on("head", &[], &argv), Duration::from_secs(60));
    if !ended {
        // Debian's MPICH 4.0.2 over UCX/TCP sometimes hangs in MPI_Finalize between these
        // emulated hosts, under MPICH's own mpiexec too: caught with gdb, two ranks spin in
        // ucp_worker_progress inside PMPI_Finalize (waiting on endpoint closes) while the other
        // two wait in the PMI barrier, every rank's result printed first; with railrun's binding
        // off too. On a fresh VM it hit about half of railrun's runs and fewer of mpiexec's.
        // When mpiexec.mpich finishes, railrun gets two more tries; if all three hang, every
        // rank must still have reported (the results are checked below, the exit status not).
        let hydra_ok = hydra_finishes(&c, &prog);
        if hydra_ok {
            let first = o;
            (o, ended) = run_or_stop(c.railrun_on("head", &[], &argv), Duration::from_secs(60));
            if !ended {
                (o, ended) = run_or_stop(c.railrun_on("head", &[], &argv), Duration::from_secs(60));
            }
            let reported = |o: &std::process::Output| {
                text(&o.stdout)
                    .lines()
                    .filter(|l| l.starts_with("rank "))
                    .count()
            };
            assert!(
                ended || reported(&o) >= 4,
                "railrun hung three times (stopped after 60 s each) where mpiexec.mpich finished, \
                 not every rank reporting:\n{}\n{}\nlast try:\n{}\n{}",
                text(&first.stdout),
                text(&first.stderr),
                text(&o.stdout),
                text(&o.stderr)
            );
        }
        if !ended {
            let lines = text(&o.stdout)
                .lines()
                .filter(|l| l.starts_with("rank "))
                .count();
            if lines < 4 {
                eprintln!(
                    "SKIPPED: {test}: MPICH hung before every rank reported, under railrun and under \
                     mpiexec.mpich alike (MPICH/UCX on the emulated hosts)"
                );
                return;
            }
            eprintln!(
                "WARNING: {test}: MPI_Finalize hung under railrun{} (MPICH 4.0.2/UCX on the emulated \
                 hosts); the ranks' results are checked, the exit status is not",
                if hydra_ok {
                    " three times, where one mpiexec.mpich run finished"
                } else {
                    " and under mpiexec.mpich alike"
                }
            );
            o.status = std::os::unix::process::ExitStatusExt::from_raw(0);
        }
    }
    let hosts = check_ranks(&o, 4, 300_000, "mpi_check on n1, n2 (MPICH)");
    assert_eq!(hosts, ["n1", "n1", "n2", "n2"], "{}", text(&o.stderr));
    // The all-reduce crossed the emulated network between the hosts (at least half of the
    // 2.4 MB leaves n1 on its rail).
    let (tx1, _) = c.rail_bytes("n1", 0).unwrap();
    assert!(
        tx1 - tx0 >= 300_000 * 8 / 2,
        "n1 sent {} bytes on rail0",
        tx1 - tx0
    );
    // a stopped job's agents end their ranks once railrun is gone (heartbeat: 9 s)
    let grace = Duration::from_secs(if ended { 5 } else { 20 });
    for h in ["head", "n1", "n2"] {
        if let Err(left) = c.wait_no_survivors(h, grace) {
            panic!("processes left on {h}: {left:?}");
        }
    }
}

/// mpi4py built against MPICH (scripts/test builds it into a directory and names it in
/// `RAILRING_TEST_MPI4PY_MPICH`); without it this test is SKIPPED, also under CI.
#[test]
fn mpi4py_on_mpich_runs_as_one_job() {
    let test = "mpi4py_on_mpich_runs_as_one_job";
    let Some(dir) = std::env::var_os("RAILRING_TEST_MPI4PY_MPICH").map(PathBuf::from) else {
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: {test}: RAILRING_TEST_MPI4PY_MPICH (a directory with mpi4py built against MPICH) is not set"
        );
        return;
    };
    assert!(
        dir.join("mpi4py").is_dir(),
        "{}: no mpi4py in it",
        dir.display()
    );
    let mut c = railrun();
    c.args(["-H", "localhost:2", "-np", "2", "-x"])
        .arg(format!("PYTHONPATH={}", dir.display()))
        .args(["python3", MPI4PY_CHECK, "5000"]);
    let (o, _) = run(c, Duration::from_secs(90), "railrun python3 mpi4py_check");
    let out = text(&o.stdout);
    assert!(
        o.status.success(),
        "{:?}\n{out}\n{}",
        o.status,
        text(&o.stderr)
    );
    for r in 0..2 {
        let want = format!("rank {r} size 2 vendor MPICH ");
        let l = out
            .lines()
            .find(|l| l.starts_with(&want))
            .unwrap_or_else(|| panic!("no line of rank {r}:\n{out}\n{}", text(&o.stderr)));
        assert!(l.ends_with("allreduce 5000 ok"), "{l}");
    }
}

#[test]
fn open_mpi_program_is_refused_before_it_starts() {
    let test = "open_mpi_program_is_refused_before_it_starts";
    let Some(prog) = mpi_check("mpicc") else {
        return skip(test, "Open MPI's mpicc not found");
    };
    let mut c = railrun();
    c.args(["-H", "localhost:2", "-np", "2"])
        .arg(&prog)
        .args(["check", "10"]);
    let (o, _) = run(c, Duration::from_secs(30), "railrun Open MPI program");
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("is an Open MPI program (it links libmpi.so.40)")
            && err.contains(&format!("mpirun -np 2 {}", prog.display()))
            && err.contains("docs/mpi.md"),
        "{err}"
    );
    assert!(text(&o.stdout).is_empty(), "it ran: {}", text(&o.stdout));

    // Behind a shell railrun cannot see it: Open MPI's MPI_Init fails naming why, instead of
    // every rank being a world of one.
    let mut c = railrun();
    c.args(["-H", "localhost:2", "-np", "2", "sh", "-c"])
        .arg(format!("exec {} check 10", prog.display()));
    let (o, _) = run(c, Duration::from_secs(60), "railrun sh -c Open MPI program");
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(!o.status.success(), "{out}\n{err}");
    assert!(
        !out.contains("allreduce"),
        "a rank ran as a singleton:\n{out}"
    );
    assert!(
        err.contains("railrun-cannot-start-Open-MPI-programs/use-Open-MPI-mpirun"),
        "{err}"
    );
}

/// railring programs of the default build (no `mpi` feature) under MPI launchers.
#[cfg(not(feature = "mpi"))]
mod without_the_mpi_feature {
    use super::*;
    use railring_tests::proc::ScratchDir;
    use std::path::Path;

    const COLLCHECK: &str = env!("CARGO_BIN_EXE_rr-collcheck");

    /// Clean environment for an MPI launcher run from the tests.
    fn mpi_launcher(bin: &Path) -> Command {
        let mut c = Command::new(bin);
        for (k, _) in std::env::vars() {
            if k.starts_with("RAILRING_") || k.starts_with("PMI") || k.starts_with("OMPI_") {
                c.env_remove(k);
            }
        }
        c.stdin(Stdio::null());
        c
    }

    /// Without the `mpi` feature, `Communicator::init` under MPICH's mpiexec bootstraps through its
    /// PMI-1 server: one job of three ranks, every element of an all-reduce checked.
    #[test]
    fn railring_program_under_mpich_mpiexec() {
        let test = "railring_program_under_mpich_mpiexec";
        let Some(mpiexec) = which("mpiexec.mpich") else {
            return skip(test, "mpiexec.mpich not found");
        };
        let mut c = mpi_launcher(&mpiexec);
        c.args(["-n", "3", COLLCHECK, "allreduce", "100000"]);
        let (o, _) = run(
            c,
            Duration::from_secs(60),
            "mpiexec.mpich -n 3 rr-collcheck",
        );
        let out = text(&o.stdout);
        assert!(
            o.status.success(),
            "{:?}\n{out}\n{}",
            o.status,
            text(&o.stderr)
        );
        for r in 0..3 {
            assert!(
                out.lines()
                    .any(|l| l.starts_with(&format!("OK rank {r} of 3 "))),
                "rank {r}:\n{out}\n{}",
                text(&o.stderr)
            );
        }
    }

    /// Without the `mpi` feature, under Open MPI's mpirun (no PMI-1 socket): a clear error, never
    /// two worlds of one — for a test program and for the shipped railperf.
    #[test]
    fn railring_program_under_open_mpi_mpirun_says_what_to_do() {
        let test = "railring_program_under_open_mpi_mpirun_says_what_to_do";
        let Some(mpirun) = which("mpirun") else {
            return skip(test, "Open MPI's mpirun not found");
        };
        let railperf = bins::workspace_bin("railring-examples", "railperf");
        for prog in [
            vec![COLLCHECK.to_string(), "allreduce".into(), "1000".into()],
            vec![
                railperf.to_str().unwrap().to_string(),
                "-b".into(),
                "8".into(),
                "-e".into(),
                "8".into(),
            ],
        ] {
            let tmp = ScratchDir::new("rr-mpirun");
            let mut c = mpi_launcher(&mpirun);
            c.args([
                "--allow-run-as-root",
                "--oversubscribe",
                "--mca",
                "orte_tmpdir_base",
            ])
            .arg(tmp.path())
            .args(["-np", "2"])
            .args(&prog);
            let what = format!("mpirun -np 2 {}", prog.join(" "));
            let (o, _) = run(c, Duration::from_secs(60), &what);
            let (out, err) = (text(&o.stdout), text(&o.stderr));
            assert!(!o.status.success(), "{what} succeeded:\n{out}\n{err}");
            assert!(
                err.contains("OMPI_COMM_WORLD_SIZE")
                    && err.contains("built without railring's `mpi` feature")
                    && err.contains("--features mpi")
                    && err.contains("railrun"),
                "{what}:\n{err}"
            );
            assert!(!out.contains("OK rank"), "{what} ran:\n{out}");
        }
    }
}

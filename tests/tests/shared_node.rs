//! A shared node: another, unprivileged local user (`rrother`, made by scripts/test) attacks a
//! root job the way docs/security.md lists — plants links and FIFOs where railrun writes or
//! sweeps, reads segments, takes segment names first — and a signal or a typo meets a huge job.
//! Each test first shows that its attack took place (the planted file is there, the watcher saw
//! the job's segments), then that the job neither followed, blocked, leaked nor died. Needs
//! root (to be two users); elsewhere each test prints SKIPPED.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The rank program: this build's rr-soak, or `RR_SOAK_BIN` (with `RAILRUN_BIN`, to run these
/// tests against another build, e.g. to show that they fail on an older one).
fn soak() -> String {
    std::env::var("RR_SOAK_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_rr-soak").to_string())
}
/// The second user scripts/test creates.
const OTHER: &str = "rrother";

fn railrun() -> Command {
    let mut c = Command::new(railring_tests::bins::railrun());
    c.env_remove("SLURM_JOB_NODELIST")
        .env_remove("SLURM_NODELIST")
        .env_remove("RAILRING_TOPO_FILE")
        .stdin(Stdio::null());
    c
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The other user's uid, or None (and SKIPPED) when this test cannot be two users.
fn other_uid(test: &str) -> Option<u32> {
    if railring::private_fs::euid() != 0 {
        println!("SKIPPED: {test} needs root (to act as a second user, {OTHER})");
        return None;
    }
    let o = Command::new("id")
        .args(["-u", OTHER])
        .output()
        .expect("run id");
    assert!(
        o.status.success(),
        "user {OTHER} does not exist: scripts/test creates it (useradd --system {OTHER})"
    );
    Some(String::from_utf8_lossy(&o.stdout).trim().parse().unwrap())
}

/// `sh -c script` as the other user (no supplementary groups).
fn as_other(script: &str) -> Command {
    let mut c = Command::new("setpriv");
    c.args([
        &format!("--reuid={OTHER}"),
        &format!("--regid={OTHER}"),
        "--clear-groups",
        "sh",
        "-c",
        script,
    ]);
    c.current_dir("/");
    c
}

fn run_other(script: &str) -> Output {
    as_other(script).output().expect("run setpriv")
}

/// A root-owned file in a directory only root can enter, holding `content`: what a planted
/// link points at.
fn victim(tag: &str, content: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("rr-victim-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    // the other user may traverse to the file (so a link works) but not list or write it
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o711)).unwrap();
    let f = d.join("precious");
    std::fs::write(&f, content).unwrap();
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
    f
}

/// Finding 1: `railrun doctor` (as root) must not write through another user's links: the
/// other user plants `/tmp/railrun-doctor-<pid>/rank.0.out -> victim` for the next 400 pids
/// (the old predictable name) and keeps re-planting while doctor runs.
#[test]
fn doctor_never_writes_through_another_users_link() {
    if other_uid("doctor_never_writes_through_another_users_link").is_none() {
        return;
    }
    let v = victim("doctor", "precious\n");
    let roots_before = root_doctor_dirs();
    let next: u32 = std::fs::read_to_string("/proc/sys/kernel/ns_last_pid")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let (lo, hi) = (next + 1, next + 400);
    let plant = format!(
        "for p in $(seq {lo} {hi}); do d=/tmp/railrun-doctor-$p; mkdir -p $d 2>/dev/null && ln -sf {v} $d/rank.0.out 2>/dev/null; done",
        v = v.display()
    );
    let o = run_other(&plant);
    assert!(o.status.success(), "{}", text(&o));
    let planted = Path::new("/tmp").join(format!("railrun-doctor-{lo}/rank.0.out"));
    assert!(
        std::fs::symlink_metadata(&planted).is_ok_and(|m| m.file_type().is_symlink()),
        "the attack did not happen: no link at {}",
        planted.display()
    );
    // ... and keeps planting while doctor runs (the old code removed the directory first)
    let mut racer = as_other(&format!(
        "end=$(($(date +%s) + 8)); while [ $(date +%s) -lt $end ]; do {plant}; done"
    ))
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    for _ in 0..3 {
        let o = railrun()
            .args([
                "doctor",
                "-H",
                "localhost",
                "--ifname",
                "lo",
                "--duration",
                "0.05",
            ])
            .output()
            .unwrap();
        assert!(o.status.code().is_some(), "{}", text(&o));
    }
    let _ = racer.kill();
    let _ = racer.wait();
    assert_eq!(
        std::fs::read_to_string(&v).unwrap(),
        "precious\n",
        "doctor wrote through a planted link"
    );
    // no doctor directory of root's is left behind (older ones, of a killed run, aside)
    let left: Vec<String> = root_doctor_dirs()
        .into_iter()
        .filter(|d| !roots_before.contains(d))
        .collect();
    assert!(left.is_empty(), "doctor left {left:?} behind");
    for e in std::fs::read_dir("/tmp").unwrap().flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        if n.starts_with("railrun-doctor-") && !roots_before.contains(&n) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
    let _ = std::fs::remove_dir_all(v.parent().unwrap());
}

/// The `railrun-doctor-*` directories of root's in /tmp.
fn root_doctor_dirs() -> Vec<String> {
    std::fs::read_dir("/tmp")
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("railrun-doctor-")
        })
        .filter(|e| std::fs::symlink_metadata(e.path()).is_ok_and(|m| m.uid() == 0))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// `railrun --output-dir dir -np 1 echo OUT`.
fn echo_into(dir: &Path) -> Output {
    railrun()
        .args([
            "--output-dir",
            dir.to_str().unwrap(),
            "-np",
            "1",
            "echo",
            "OUT",
        ])
        .output()
        .unwrap()
}

/// `--output-dir`: a directory of another user is refused, and so is a planted link or hard
/// link in a directory of ours; the file it points at keeps its content.
#[test]
fn output_dir_refuses_foreign_directories_and_links() {
    if other_uid("output_dir_refuses_foreign_directories_and_links").is_none() {
        return;
    }
    let v = victim("outdir", "precious\n");
    let theirs = PathBuf::from(format!("/tmp/rr-their-outdir-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&theirs);
    let o = run_other(&format!(
        "mkdir -m 777 {d} && ln -s {v} {d}/rank.0.out",
        d = theirs.display(),
        v = v.display()
    ));
    assert!(o.status.success(), "{}", text(&o));
    let o = echo_into(&theirs);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(
        t.contains(&format!("user {OTHER}")) && t.contains("refusing"),
        "{t}"
    );
    // a directory of ours where the other user planted links (it was world-writable)
    let ours = PathBuf::from(format!("/tmp/rr-our-outdir-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&ours);
    std::fs::create_dir_all(&ours).unwrap();
    std::fs::set_permissions(&ours, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let o = run_other(&format!(
        "ln -s {} {}/rank.0.out",
        v.display(),
        ours.display()
    ));
    assert!(o.status.success(), "{}", text(&o));
    let o = echo_into(&ours);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(t.contains("symbolic link"), "{t}");
    assert_eq!(std::fs::read_to_string(&v).unwrap(), "precious\n");
    // without the link the same directory works, and the file is private
    std::fs::remove_file(ours.join("rank.0.out")).unwrap();
    let o = echo_into(&ours);
    assert!(o.status.success(), "{}", text(&o));
    let f = ours.join("rank.0.out");
    assert_eq!(std::fs::read_to_string(&f).unwrap().trim(), "OUT");
    assert_eq!(
        std::fs::metadata(&f).unwrap().permissions().mode() & 0o777,
        0o600
    );
    for d in [&theirs, &ours] {
        let _ = std::fs::remove_dir_all(d);
    }
    let _ = std::fs::remove_dir_all(v.parent().unwrap());
}

/// A 2-rank job with collectives on this node (its ranks build a shared-memory segment).
fn shm_job(extra: &[&str]) -> Output {
    let mut c = railrun();
    c.args(["--timeout", "60"])
        .args(extra)
        .args(["-np", "2", &soak(), "--calls", "5"]);
    c.output().unwrap()
}

/// Finding 2: a FIFO another user named `/dev/shm/railring-*` neither hangs a job (the leader's
/// sweep at init, railrun's sweep at the end) nor is removed by it.
#[test]
fn a_planted_fifo_does_not_stall_a_job() {
    if other_uid("a_planted_fifo_does_not_stall_a_job").is_none() {
        return;
    }
    let fifo = format!("/dev/shm/railring-fifo{}", std::process::id());
    let o = run_other(&format!("rm -f {fifo}; mkfifo {fifo}"));
    assert!(o.status.success(), "{}", text(&o));
    let m = std::fs::symlink_metadata(&fifo).unwrap();
    assert!(
        std::os::unix::fs::FileTypeExt::is_fifo(&m.file_type()),
        "no FIFO planted"
    );
    let t0 = Instant::now();
    let o = shm_job(&[]);
    let took = t0.elapsed();
    let _ = std::fs::remove_file(&fifo);
    assert!(o.status.success(), "{}", text(&o));
    assert!(took < Duration::from_secs(30), "the job took {took:?}");
    assert!(m.uid() != 0);
}

/// A watcher, as the other user, for `secs` seconds: every `railring-*` name it sees in
/// /dev/shm is printed (`SEEN`), every one it can read (`READ`), and for a segment being built
/// (`*.init-*`) it creates the final name the old code renamed to (`TOOK`).
fn watcher(secs: u32) -> std::process::Child {
    as_other(&format!(
        "cd /dev/shm; end=$(($(date +%s) + {secs})); \
         while [ $(date +%s) -lt $end ]; do \
           for f in railring-*; do [ -e \"$f\" ] || continue; \
             [ -O \"$f\" ] && continue; \
             echo \"SEEN $f\"; \
             if dd if=\"$f\" of=/dev/null bs=64 count=1 iflag=nonblock 2>/dev/null; then echo \"READ $f\"; fi; \
             case \"$f\" in *.init-*) t=${{f%.init-*}}; : > \"$t\" 2>/dev/null && echo \"TOOK $t\";; esac; \
           done; \
         done"
    ))
    .stdout(Stdio::piped())
    .stderr(Stdio::null())
    .spawn()
    .unwrap()
}

/// Findings 3 and 4: while root runs jobs, the other user can read none of their segments,
/// and taking the name a segment being built would be renamed to kills none of them. The
/// watcher must have seen at least one segment (else the test proved nothing: it fails).
#[test]
fn segments_are_private_and_their_names_cannot_be_taken() {
    if other_uid("segments_are_private_and_their_names_cannot_be_taken").is_none() {
        return;
    }
    let w = watcher(40);
    let t0 = Instant::now();
    let mut jobs = 0;
    let mut failed = Vec::new();
    // up to 40 jobs, and at least 6: until the watcher has had a fair chance to see some
    while jobs < 40 && (jobs < 6 || t0.elapsed() < Duration::from_secs(20)) {
        let o = shm_job(&["-x", "RAILRING_SHM_SLOT=64M"]);
        if !o.status.success() {
            failed.push(text(&o));
        }
        jobs += 1;
        if jobs >= 6 && t0.elapsed() > Duration::from_secs(20) {
            break;
        }
    }
    // end the watcher early: its output so far is what counts
    let pid = w.id();
    let _ = Command::new("kill").arg(pid.to_string()).status();
    let out = w.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stdout).into_owned();
    let seen = log.lines().filter(|l| l.starts_with("SEEN ")).count();
    let mut read: Vec<&str> = log.lines().filter(|l| l.starts_with("READ ")).collect();
    for l in log.lines().filter(|l| l.starts_with("TOOK ")) {
        let _ = std::fs::remove_file(format!("/dev/shm/{}", &l[5..]));
    }
    assert!(
        failed.is_empty(),
        "{} of {jobs} jobs failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
    assert!(
        seen > 0,
        "the watcher saw no segment in {jobs} jobs: the test proved nothing"
    );
    read.dedup();
    assert!(
        read.is_empty(),
        "another user read {} segment(s): {:?}",
        read.len(),
        &read[..read.len().min(5)]
    );
}

/// A segment made by the runtime is mode 0600 and the other user can open it neither for
/// reading nor for writing (checked on a segment kept in place, not only in a race).
#[test]
fn a_segment_is_mode_0600() {
    if other_uid("a_segment_is_mode_0600").is_none() {
        return;
    }
    use railring::transport::shm::{Geometry, Node};
    let path = PathBuf::from(format!("/dev/shm/railring-modetest-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let geo = Geometry {
        local_size: 2,
        slot_bytes: 4096,
        ring_bytes: 4096,
    };
    let n = Node::open(&path, geo, vec![0, 1], 0, "h".into(), true).unwrap();
    let m = std::fs::metadata(&path).unwrap();
    assert_eq!(m.permissions().mode() & 0o777, 0o600);
    let o = run_other(&format!("cat {} > /dev/null", path.display()));
    assert!(!o.status.success(), "the other user read the segment");
    assert!(text(&o).contains("Permission denied"), "{}", text(&o));
    drop(n);
    let _ = std::fs::remove_file(&path);
}

/// Finding 5: SIGTERM and SIGINT end a job that is still starting 100 000 local ranks within
/// a few seconds (the old spawn loop ignored them for its whole length), and `-np 1000000`
/// without `--oversubscribe` is refused at once.
#[test]
fn signals_end_a_huge_local_start_at_once() {
    let o = railrun()
        .args(["-np", "1000000", "/bin/true"])
        .output()
        .unwrap();
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(t.contains("needs --oversubscribe"), "{t}");
    for (sig, name, code) in [
        (libc::SIGTERM, "SIGTERM", 143),
        (libc::SIGINT, "SIGINT", 130),
    ] {
        let mut c = railrun()
            .args(["--oversubscribe", "-np", "100000", "/bin/true"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(1500));
        assert!(
            c.try_wait().unwrap().is_none(),
            "railrun ended before the signal"
        );
        // SAFETY: signalling our own child.
        unsafe { libc::kill(c.id() as i32, sig) };
        let t0 = Instant::now();
        let st = loop {
            if let Some(st) = c.try_wait().unwrap() {
                break Some(st);
            }
            if t0.elapsed() > Duration::from_secs(15) {
                let _ = c.kill();
                let _ = c.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let took = t0.elapsed();
        let st = st.unwrap_or_else(|| panic!("railrun ignored {name} for 15 s"));
        let mut err = String::new();
        std::io::Read::read_to_string(c.stderr.as_mut().unwrap(), &mut err).unwrap();
        assert_eq!(st.code(), Some(code), "{name}: {err}");
        assert!(err.contains(&format!("got {name}")), "{err}");
        // within a second of the signal, plus the grace its ranks may need on a loaded CI
        assert!(
            took < Duration::from_secs(5),
            "{name}: railrun took {took:?} to end"
        );
    }
}

/// Finding 6: every knob out of its range is an error (not rc 0) naming the variable, the
/// value and the bound — railrun's own knobs before anything starts, the runtime's in every
/// rank.
#[test]
fn knobs_out_of_range_are_errors_naming_the_bound() {
    for (var, value, says) in [
        ("RAILRUN_HEARTBEAT", "0", "0 is less than the minimum 1 s"),
        (
            "RAILRUN_HEARTBEAT",
            "1e300",
            "1e300 is more than the maximum 3600 s",
        ),
        (
            "RAILRUN_HEARTBEAT",
            "3601",
            "3601 is more than the maximum 3600 s",
        ),
        ("RAILRUN_FANOUT", "0", "0 is less than the minimum 1"),
        ("RAILRUN_FANOUT", "-1", "-1 is less than the minimum 1"),
        (
            "RAILRUN_FANOUT",
            "1e20",
            "1e20 is more than the maximum 4096",
        ),
        ("RAILRUN_KILL_GRACE", "0", ""),
        (
            "RAILRUN_KILL_GRACE",
            "-1",
            "-1 is less than the minimum 0 s",
        ),
        (
            "RAILRUN_KILL_GRACE",
            "1e300",
            "1e300 is more than the maximum 3600 s",
        ),
    ] {
        let o = railrun()
            .env(var, value)
            .args(["-np", "1", "true"])
            .output()
            .unwrap();
        let t = text(&o);
        if says.is_empty() {
            assert!(o.status.success(), "{var}={value}: {t}");
            continue;
        }
        assert_eq!(o.status.code(), Some(1), "{var}={value}: {t}");
        assert!(
            t.contains(&format!("{var}=`{value}`")) && t.contains(says),
            "{var}={value}: {t}"
        );
    }
    for (var, value, says) in [
        (
            "RAILRING_DEBUG",
            "bogus",
            "expected one of WARN, ERROR, INFO, DEBUG, TRACE",
        ),
        ("RAILRING_SOCKET_IFNAME", "^", "names no interface"),
        (
            "RAILRING_PIPELINE_SEG",
            "1T",
            "1T is more than the maximum 1073741824",
        ),
        (
            "RAILRING_COST",
            "rails=1e9",
            "expected a whole number of rails from 1 to 64",
        ),
        (
            "RAILRING_TIMEOUT",
            "1e300",
            "1e300 is more than the maximum 31536000 s",
        ),
        (
            "RAILRING_RAIL_TIMEOUT",
            "0.000001",
            "0.000001 is less than the minimum 1 s",
        ),
    ] {
        let kv = format!("{var}={value}");
        let o = railrun()
            .args(["-np", "2", "-x", &kv, &soak(), "--calls", "1"])
            .output()
            .unwrap();
        let t = text(&o);
        assert!(!o.status.success(), "{kv}: {t}");
        assert!(
            t.contains(var) && t.contains(value) && t.contains(says),
            "{kv}: {t}"
        );
    }
    let o = railrun()
        .args(["--timeout", "1e300", "true"])
        .output()
        .unwrap();
    let t = text(&o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(
        t.contains("1e300 is more than the maximum 10000000 s"),
        "{t}"
    );
}

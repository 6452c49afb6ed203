//! Bad input everywhere, through the real railrun and real ranks on this machine: absurd knobs,
//! binary and huge hostfiles, deeply nested and billion-laughs XML, a 70 000-host Slurm node list,
//! a host name that would be an ssh option. Each gets a clear error naming its source (variable,
//! file, flag), never a panic or a signal; and a huge `RAILRING_NET_CHUNK` costs no memory beyond
//! the call's own size.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

const SOAK: &str = env!("CARGO_BIN_EXE_rr-soak");

fn railrun(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(railring_tests::bins::railrun());
    c.args(args)
        .env_remove("SLURM_JOB_NODELIST")
        .env_remove("SLURM_NODELIST")
        .env_remove("RAILRING_TOPO_FILE")
        .stdin(Stdio::null());
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run railrun")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn no_crash(t: &str) {
    assert!(
        !t.contains("panicked") && !t.contains("overflowed its stack") && !t.contains("by signal"),
        "{t}"
    );
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("rr-badinput-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

#[test]
fn absurd_knobs_are_errors_naming_the_variable() {
    for (var, value) in [
        ("RAILRING_SHM_SLOT", "0"),
        ("RAILRING_SHM_SLOT", "1T"),
        ("RAILRING_NET_STREAMS", "0"),
        ("RAILRING_TIMEOUT", "-1"),
        ("RAILRING_NET_CHUNK", "1"),
        ("RAILRING_NET_CHUNK", "1G"),
        ("RAILRING_IB_GID_INDEX", "x"),
        ("RAILRING_CONNECT_TIMEOUT", "99999999999999999999"),
    ] {
        let kv = format!("{var}={value}");
        let o = railrun(&["-np", "2", "-x", &kv, SOAK, "--calls", "1"], &[]);
        let t = text(&o);
        assert!(!o.status.success(), "{kv}: {t}");
        assert!(
            t.contains(var) && t.contains(value),
            "{kv}: the error does not name it: {t}"
        );
        assert!(t.contains("exited with code 2"), "{kv}: {t}");
        no_crash(&t);
    }
    // railrun checks its own knobs before it starts anything, even those this job (one local
    // node, no agent) would never read
    let o = railrun(&["-np", "1", "true"], &[("RAILRUN_HEARTBEAT", "0")]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(
        t.contains("RAILRUN_HEARTBEAT=`0`: 0 is less than the minimum 1 s"),
        "{t}"
    );
}

#[test]
fn binary_and_huge_hostfiles_are_refused_naming_the_file() {
    let bin = scratch("binary-hostfile");
    let junk: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(&bin, &junk).unwrap();
    let huge = scratch("huge-hostfile");
    let f = std::fs::File::create(&huge).unwrap();
    f.set_len(100 << 20).unwrap(); // sparse: 100 MiB of zero bytes
    for p in [&bin, &huge] {
        let o = railrun(
            &["--hostfile", p.to_str().unwrap(), "-np", "1", "true"],
            &[],
        );
        let t = text(&o);
        assert_eq!(o.status.code(), Some(1), "{t}");
        assert!(t.contains(p.to_str().unwrap()), "{t}");
        no_crash(&t);
    }
    let _ = std::fs::remove_file(&bin);
    let _ = std::fs::remove_file(&huge);
}

#[test]
fn a_70000_host_slurm_list_and_dash_hosts_are_refused() {
    let o = railrun(
        &["-np", "1", "true"],
        &[("SLURM_JOB_NODELIST", "n[0-69999]")],
    );
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(
        t.contains("SLURM_JOB_NODELIST") && t.contains("65536"),
        "{t}"
    );
    for h in [
        "-Gx",
        "-oProxyCommand=touch /tmp/rr-pwned",
        "a,-b:2",
        "-u@n1",
    ] {
        let o = railrun(&["-H", h, "-np", "1", "true"], &[]);
        let t = text(&o);
        assert_eq!(o.status.code(), Some(1), "-H {h}: {t}");
        assert!(t.contains("--host"), "-H {h}: {t}");
    }
}

#[test]
fn deep_and_exploding_xml_is_an_error_everywhere_it_is_read() {
    let deep = scratch("deep.xml");
    std::fs::write(
        &deep,
        format!(
            "<system version=\"1\">{}{}</system>",
            "<cpu>".repeat(25_000),
            "</cpu>".repeat(25_000)
        ),
    )
    .unwrap();
    let deep_hwloc = scratch("deep-hwloc.xml");
    std::fs::write(
        &deep_hwloc,
        format!(
            "<topology version=\"2.0\">{}{}</topology>",
            "<object type=\"Machine\">".repeat(25_000),
            "</object>".repeat(25_000)
        ),
    )
    .unwrap();
    let laughs = scratch("laughs.xml");
    let mut ents = vec!["<!ENTITY l0 \"lol\">".to_string()];
    for i in 1..10 {
        ents.push(format!(
            "<!ENTITY l{i} \"{}\">",
            format!("&l{};", i - 1).repeat(10)
        ));
    }
    std::fs::write(
        &laughs,
        format!("<?xml version=\"1.0\"?>\n<!DOCTYPE system [\n{}\n]>\n<system version=\"1\"><cpu affinity=\"&l9;\"/></system>\n", ents.join("\n")),
    )
    .unwrap();
    for (f, why) in [
        (&deep, "nest deeper"),
        (&deep_hwloc, "nest deeper"),
        (&laughs, "entity"),
    ] {
        let fs = f.to_str().unwrap();
        // railrun topo
        let o = railrun(&["topo"], &[("RAILRING_TOPO_FILE", fs)]);
        let t = text(&o);
        assert_eq!(o.status.code(), Some(1), "{t}");
        assert!(t.contains(fs) && t.contains(why), "{t}");
        no_crash(&t);
        // --report-bindings
        let o = railrun(
            &["--report-bindings", "-np", "1", "true"],
            &[("RAILRING_TOPO_FILE", fs)],
        );
        let t = text(&o);
        assert!(o.status.success() && t.contains(why), "{t}");
        no_crash(&t);
        // a rank: the topology is unavailable (a warning naming the file), the job runs
        let o = railrun(
            &["-np", "2", SOAK, "--calls", "5"],
            &[("RAILRING_TOPO_FILE", fs)],
        );
        let t = text(&o);
        assert!(o.status.success(), "{t}");
        assert!(t.contains(fs) && t.matches("SOAK rank").count() == 2, "{t}");
        no_crash(&t);
    }
    for f in [deep, deep_hwloc, laughs] {
        let _ = std::fs::remove_file(f);
    }
}

/// Defect: `RAILRING_NET_CHUNK=1G` made every rank allocate 1.09 GB even for a 4 MB all-reduce.
/// Now the knob is capped (256 MiB) and each call stages at most its own size: two ranks as two
/// nodes (the network path, received data reduced through the staging area) with the largest
/// chunk stay far below it.
#[test]
fn a_huge_net_chunk_costs_no_memory_beyond_the_call() {
    let o = railrun(
        &[
            "-np",
            "2",
            "-x",
            "RAILRING_NET_CHUNK=256M",
            "sh",
            "-c",
            &format!("RAILRING_HOST_ID=h$RAILRING_RANK exec {SOAK} --calls 60 --max-count 1000000 --seed 3"),
        ],
        &[],
    );
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    let peaks: Vec<u64> = t
        .lines()
        .filter(|l| l.starts_with("SOAK rank"))
        .filter_map(|l| l.split_whitespace().last()?.parse().ok())
        .collect();
    assert_eq!(peaks.len(), 2, "{t}");
    for p in peaks {
        assert!(
            p < 200 << 10,
            "a rank peaked at {} MiB with RAILRING_NET_CHUNK=256M:\n{t}",
            p >> 10
        );
    }
}

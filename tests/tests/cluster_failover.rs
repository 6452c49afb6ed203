//! Rails and stragglers on the emulated cluster (2 hosts x 2 rails, 2 ranks per host: local
//! rank i rings over rail i): a rail pulled out of one host in the middle of a run of every
//! collective (large and small calls in flight) — the job finishes with every element right,
//! one WARN names the host, the rail interface and the peer, and the link goes back to the rail
//! when it returns; and a host whose ranks arrive late at every call is named by the straggler
//! report. Needs root; prints SKIPPED otherwise (and fails under CI).

use railring_tests::cluster::{Cluster, ClusterSpec};
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};

const RAILCHECK: &str = env!("CARGO_BIN_EXE_rr-railcheck");
const COLLCHECK: &str = env!("CARGO_BIN_EXE_rr-collcheck");

fn railrun_cmd(c: &Cluster, np: &str, env: &[&str], prog: &[&str]) -> std::process::Command {
    railrun_cmd_ifname(c, np, "rail", env, prog)
}

fn railrun_cmd_ifname(
    c: &Cluster,
    np: &str,
    ifname: &str,
    env: &[&str],
    prog: &[&str],
) -> std::process::Command {
    let hf = c
        .hostfile(np.parse::<usize>().unwrap().div_ceil(2))
        .expect("hostfile");
    let mut argv: Vec<String> = vec![
        "--connect-timeout".into(),
        "15".into(),
        "--timeout".into(),
        "150".into(),
        "-np".into(),
        np.into(),
        "--hostfile".into(),
        hf.to_str().unwrap().into(),
        "-x".into(),
        format!("RAILRING_SOCKET_IFNAME={ifname}"),
    ];
    for e in env {
        argv.push("-x".into());
        argv.push(e.to_string());
    }
    argv.extend(prog.iter().map(|s| s.to_string()));
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    c.railrun_on("head", &[], &argv)
}

/// The cluster every test here runs on (2 hosts x 2 rails, unshaped) with railrun built; `None`
/// (the test skipped, saying so) where the emulated cluster cannot run.
fn two_hosts(test: &str) -> Option<Cluster> {
    if !Cluster::check_or_skip(test) {
        return None;
    }
    railring_tests::bins::railrun();
    Some(
        Cluster::up(ClusterSpec {
            hosts: 2,
            rails: 2,
            rail_rate: None,
        })
        .expect("cluster up"),
    )
}

#[test]
fn a_rail_pulled_mid_run_fails_over_and_comes_back() {
    let Some(c) = two_hosts("a_rail_pulled_mid_run_fails_over_and_comes_back") else {
        return;
    };
    let mut child = railrun_cmd(
        &c,
        "4",
        &["RAILRING_RAIL_TIMEOUT=2", "RAILRING_TIMEOUT=60"],
        &[RAILCHECK, "loop", "16"],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("railrun");
    let (tx, rx) = mpsc::channel::<String>();
    let out = child.stdout.take().unwrap();
    let tx2 = tx.clone();
    let t_out = std::thread::spawn(move || {
        let mut all = String::new();
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx2.send(l.clone());
            all.push_str(&l);
            all.push('\n');
        }
        all
    });
    let err = child.stderr.take().unwrap();
    let t_err = std::thread::spawn(move || {
        let mut all = String::new();
        for l in BufReader::new(err).lines().map_while(Result::ok) {
            all.push_str(&l);
            all.push('\n');
        }
        all
    });
    drop(tx);
    // pull n1's rail1 once the job is past its second round of every collective
    let start = Instant::now();
    let mut pulled = None;
    while start.elapsed() < Duration::from_secs(60) {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(l) if l.trim() == "round 2" => {
                c.set_rail_up("n1", 1, false).expect("rail1 down");
                pulled = Some(Instant::now());
                break;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            _ => {}
        }
    }
    let pulled = pulled.expect("the job never reached round 2");
    // rounds go on while the rail is out
    let mut rounds_during = 0;
    while pulled.elapsed() < Duration::from_secs(5) {
        if let Ok(l) = rx.recv_timeout(Duration::from_millis(100)) {
            if l.starts_with("round ") {
                rounds_during += 1;
            }
        }
    }
    c.set_rail_up("n1", 1, true).expect("rail1 up");
    let status =
        railring_tests::proc::wait_timeout(&mut child, Duration::from_secs(120)).expect("job ends");
    let so = t_out.join().unwrap();
    let se = t_err.join().unwrap();
    assert!(status.success(), "{status:?}\n{so}\n{se}");
    assert_eq!(so.matches("OK rank").count(), 4, "{so}\n{se}");
    assert!(
        rounds_during >= 1,
        "no round finished while rail1 was out:\n{so}\n{se}"
    );
    // one WARN, from the rank that noticed: its host, the rail interface, the peer and why
    let warns: Vec<&str> = se
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("link moved to rail"))
        .collect();
    assert_eq!(warns.len(), 1, "one WARN for the lost rail:\n{se}");
    let w = warns[0];
    assert!(
        w.contains("rank 1 on n1 -> rank ")
            && w.contains(" on n2")
            && w.contains("rail rail1")
            && w.contains("interface rail1 is down on n1")
            && w.contains("link moved to rail rail0"),
        "the WARN names host, rail, peer and cause: {w}"
    );
    // after the rail came back, the links went home, said once
    let back: Vec<&str> = se
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("rail rail1 is back"))
        .collect();
    assert_eq!(back.len(), 1, "the links did not return to rail1:\n{se}");
}

#[test]
fn a_late_host_is_named_by_the_straggler_report() {
    let Some(c) = two_hosts("a_late_host_is_named_by_the_straggler_report") else {
        return;
    };
    // ranks 2 and 3 (host n2) sleep 30 ms before each of 40 calls; reports every 20 calls
    let out = railrun_cmd(
        &c,
        "4",
        &["RAILRING_STRAGGLER=20"],
        &[RAILCHECK, "straggle", "30", "40", "2", "3"],
    )
    .output()
    .expect("railrun");
    let so = String::from_utf8_lossy(&out.stdout);
    let se = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{so}\n{se}");
    let reports: Vec<&str> = se
        .lines()
        .filter(|l| l.contains("straggler report"))
        .collect();
    assert_eq!(reports.len(), 2, "{se}");
    for r in reports {
        // the host is named first with every call; only its ranks are named
        assert!(r.contains("by host: n2 20 of 20"), "{r}");
        let ranks = r.split("last to arrive:").nth(1).unwrap();
        assert!(
            !ranks.contains("rank 0 ") && !ranks.contains("rank 1 "),
            "names a punctual rank: {r}"
        );
    }
}

#[test]
fn a_last_rail_without_a_route_at_connect_time_is_waited_for() {
    let Some(c) = two_hosts("a_last_rail_without_a_route_at_connect_time_is_waited_for") else {
        return;
    };
    // one rank per host, on rail0 only: when the job starts, neither host has a route to the
    // other's rail0 (a connect fails at once: "No route to host"); it returns 3 s later, well
    // within the connect timeout (15 s), as a flapping link does
    let route = |op: &str| {
        for (h, other) in [("n1", "n2"), ("n2", "n1")] {
            let to = format!("{}/32", c.rail_addr(other, 0));
            let st = c
                .exec(h, &["ip", "route", op, "unreachable", &to])
                .status()
                .expect("ip route");
            assert!(st.success(), "ip route {op} unreachable {to} on {h}");
        }
    };
    route("add");
    let child = railrun_cmd_ifname(&c, "2", "=rail0", &[], &[COLLCHECK, "allreduce", "1000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("railrun");
    std::thread::sleep(Duration::from_secs(3));
    route("del");
    let out = child.wait_with_output().expect("railrun");
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{so}\n{se}");
    for r in 0..2 {
        assert!(so.contains(&format!("OK rank {r} of 2 ")), "{so}\n{se}");
    }
}

#[test]
fn a_dead_last_rail_is_named_well_before_the_timeout() {
    let Some(c) = two_hosts("a_dead_last_rail_is_named_well_before_the_timeout") else {
        return;
    };
    // one rank per host, one rail: nothing to move to
    let mut child = railrun_cmd_ifname(
        &c,
        "2",
        "=rail0",
        &["RAILRING_RAIL_TIMEOUT=2", "RAILRING_TIMEOUT=120"],
        &[RAILCHECK, "loop", "60"],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("railrun");
    let out = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel::<String>();
    let t_out = std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    let t_err = railring_tests::proc::read_text(child.stderr.take().unwrap());
    let start = Instant::now();
    let mut pulled = None;
    while start.elapsed() < Duration::from_secs(60) {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(l) if l.trim() == "round 2" => {
                // rail0's switch dies: both interfaces stay up, only the acks stop
                c.set_rail_switch_up(0, false).expect("switch down");
                pulled = Some(Instant::now());
                break;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            _ => {}
        }
    }
    let pulled = pulled.expect("the job never reached round 2");
    let status =
        railring_tests::proc::wait_timeout(&mut child, Duration::from_secs(100)).expect("job ends");
    let took = pulled.elapsed();
    let _ = t_out.join();
    let se = t_err.join().unwrap();
    assert!(!status.success(), "{se}");
    assert!(
        took < Duration::from_secs(30),
        "took {took:?} (RAILRING_TIMEOUT is 120 s):\n{se}"
    );
    assert!(
        se.contains("no rail left between n1 and n2")
            || se.contains("no rail left between n2 and n1"),
        "{se}"
    );
    assert!(
        se.contains("rail0") && se.contains("no acknowledgement from"),
        "{se}"
    );
    eprintln!(
        "{}",
        se.lines()
            .find(|l| l.contains("no rail left"))
            .unwrap_or_default()
    );
    eprintln!("dead last rail named {took:?} after the port went down");
}

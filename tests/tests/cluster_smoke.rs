//! Smoke test of the emulated cluster harness: real sshd, real veth/bridges,
//! private UTS/mount namespaces, rails, teardown.
//!
//! Needs root + iproute2, util-linux, openssh-server/client. Without them it
//! prints `SKIPPED: ...` (or fails when `CI` is set).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use railring_tests::cluster::{Cluster, ClusterSpec};

fn ok(out: std::io::Result<Output>, what: &str) -> String {
    let out = out.unwrap_or_else(|e| panic!("{what}: spawn failed: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn root_ip(args: &[&str]) -> String {
    ok(
        Command::new("ip").args(args).output(),
        &format!("ip {args:?}"),
    )
}

/// Accept one connection on `l` (in whatever netns it was made) and return
/// everything read from it.
fn accept_all(l: &TcpListener) -> (SocketAddr, Vec<u8>) {
    l.set_nonblocking(false).unwrap();
    let (mut s, peer) = l.accept().expect("accept");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).expect("read");
    (peer, buf)
}

/// Wait until `pid` runs `sleep` inside `host` (nsenter has entered and exec'd).
fn wait_listed(c: &Cluster, host: &str, pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !c
        .pids_on(host)
        .iter()
        .any(|(p, cmd)| *p == pid && cmd.starts_with("sleep"))
    {
        assert!(
            Instant::now() < deadline,
            "pid {pid} not listed on {host}: {:?}",
            c.pids_on(host)
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn cluster_smoke() {
    if !Cluster::check_or_skip("cluster_smoke") {
        return;
    }
    let t0 = Instant::now();
    let c = Cluster::up(ClusterSpec {
        hosts: 2,
        rails: 2,
        rail_rate: Some("1gbit".into()),
    })
    .expect("cluster up");
    eprintln!("up took {:?}", t0.elapsed());
    assert_eq!(c.host_names(), vec!["n1".to_string(), "n2".to_string()]);

    // --- root namespace safety
    let addrs = root_ip(&["-4", "-o", "addr", "show"]);
    assert!(
        !addrs.contains(" 10.77."),
        "root namespace has an address in 10.77/16:\n{addrs}"
    );
    let route = root_ip(&["-4", "route", "show", "exact", "10.77.0.0/16"]);
    assert!(
        route.trim_start().starts_with("unreachable"),
        "root route for 10.77/16: {route:?}"
    );

    // --- ssh from head to every host, by name (head's /etc/hosts + ssh_config)
    let cfg = c.ssh_config().to_str().unwrap().to_string();
    assert_eq!(c.ssh_command(), format!("ssh -F {cfg}"));
    for h in c.host_names() {
        let out = ok(
            c.exec("head", &["ssh", "-F", &cfg, &h, "hostname"])
                .output(),
            &format!("ssh {h} hostname"),
        );
        assert_eq!(out.trim(), h, "ssh {h} hostname");
    }
    // launcher-style: the ssh_command string through a shell, remote sees its own names
    let out = ok(
        c.exec(
            "head",
            &[
                "sh",
                "-c",
                &format!("{} n2 'hostname; getent hosts n1'", c.ssh_command()),
            ],
        )
        .output(),
        "ssh_command n2",
    );
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some("n2"));
    assert!(
        lines.next().unwrap_or("").starts_with("10.77.0.11"),
        "n2 resolves n1: {out}"
    );
    // exec gives each host its own hostname
    for h in ["head", "n1", "n2"] {
        assert_eq!(ok(c.exec(h, &["hostname"]).output(), "hostname").trim(), h);
    }

    // --- the hosts run the cluster's TCP congestion control (CUBIC where the kernel has it),
    // not whatever this machine's root namespace happens to use
    let avail = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_congestion_control")
        .unwrap_or_default();
    if avail.split_whitespace().any(|a| a == "cubic") {
        assert_eq!(c.tcp_cc(), Some("cubic"));
    }
    if let Some(cc) = c.tcp_cc() {
        for h in ["head", "n1", "n2"] {
            let got = ok(
                c.exec(h, &["cat", "/proc/sys/net/ipv4/tcp_congestion_control"])
                    .output(),
                "tcp_congestion_control",
            );
            assert_eq!(got.trim(), cc, "congestion control on {h}");
        }
    }

    // --- /dev/shm is private per host
    let name = format!("railring-smoke-{}", c.tag());
    ok(
        c.exec("n1", &["sh", "-c", &format!("echo hi > /dev/shm/{name}")])
            .output(),
        "write shm on n1",
    );
    assert_eq!(
        ok(
            c.exec("n1", &["cat", &format!("/dev/shm/{name}")]).output(),
            "cat on n1"
        )
        .trim(),
        "hi"
    );
    let st = c
        .exec("n2", &["test", "-e", &format!("/dev/shm/{name}")])
        .status()
        .unwrap();
    assert!(!st.success(), "n1's /dev/shm file is visible on n2");
    assert!(
        !Path::new(&format!("/dev/shm/{name}")).exists(),
        "n1's /dev/shm file is visible in the root namespace"
    );

    // --- head has management only, no rail addresses
    let head_addrs = ok(
        c.exec("head", &["ip", "-4", "-o", "addr", "show"]).output(),
        "ip addr on head",
    );
    assert!(
        head_addrs.contains("10.77.0.1/24") && !head_addrs.contains("rail"),
        "head addrs: {head_addrs}"
    );

    // --- rails: n1 -> n2 over rail0 (bash /dev/tcp via exec) and rail1 (socket in n1's netns)
    let before: Vec<(u64, u64)> = (0..2).map(|r| c.rail_bytes("n1", r).unwrap()).collect();
    let before_n2: Vec<(u64, u64)> = (0..2).map(|r| c.rail_bytes("n2", r).unwrap()).collect();

    let a0 = c.rail_addr("n2", 0);
    assert_eq!(a0.to_string(), "10.77.10.12");
    let l0 = c
        .in_netns("n2", || TcpListener::bind((a0, 0)))
        .unwrap()
        .expect("bind on n2 rail0");
    let p0 = l0.local_addr().unwrap().port();
    let sender = c
        .exec(
            "n1",
            &[
                "bash",
                "-c",
                &format!("echo over-rail0 > /dev/tcp/{a0}/{p0}"),
            ],
        )
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let (peer, got) = accept_all(&l0);
    assert_eq!(sender.wait_with_output().unwrap().status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&got).trim(), "over-rail0");
    assert_eq!(
        peer.ip().to_string(),
        c.rail_addr("n1", 0).to_string(),
        "rail0 traffic came from n1's rail0"
    );

    let a1 = c.rail_addr("n2", 1);
    let l1 = c
        .in_netns("n2", || TcpListener::bind((a1, 0)))
        .unwrap()
        .expect("bind on n2 rail1");
    let dst = l1.local_addr().unwrap();
    const N: usize = 1 << 20;
    let stream = c
        .in_netns("n1", || {
            TcpStream::connect_timeout(&dst, Duration::from_secs(2))
        })
        .unwrap()
        .expect("connect");
    let writer = std::thread::spawn(move || {
        let mut s = stream;
        s.write_all(&vec![0x5a; N]).unwrap();
    });
    let (peer, got) = accept_all(&l1);
    writer.join().unwrap();
    assert_eq!(got.len(), N);
    assert_eq!(peer.ip().to_string(), c.rail_addr("n1", 1).to_string());

    let after: Vec<(u64, u64)> = (0..2).map(|r| c.rail_bytes("n1", r).unwrap()).collect();
    let after_n2: Vec<(u64, u64)> = (0..2).map(|r| c.rail_bytes("n2", r).unwrap()).collect();
    assert!(
        after[0].0 > before[0].0,
        "n1 rail0 tx did not grow: {before:?} -> {after:?}"
    );
    assert!(after_n2[0].1 > before_n2[0].1, "n2 rail0 rx did not grow");
    assert!(
        after[1].0 >= before[1].0 + N as u64,
        "n1 rail1 tx grew by < 1 MiB: {before:?} -> {after:?}"
    );
    assert!(
        after_n2[1].1 >= before_n2[1].1 + N as u64,
        "n2 rail1 rx grew by < 1 MiB"
    );

    // --- hostfile
    let hf = c.hostfile(2).unwrap();
    assert_eq!(
        std::fs::read_to_string(&hf).unwrap(),
        "n1 slots=2\nn2 slots=2\n"
    );

    // --- process listing: a stray process shows up, and goes away
    let mut stray = c.exec("n2", &["sleep", "30"]).spawn().unwrap();
    wait_listed(&c, "n2", stray.id());
    assert!(c.pids_on("n1").iter().all(|(p, _)| *p != stray.id()));
    stray.kill().unwrap();
    stray.wait().unwrap();
    for h in ["head", "n1", "n2"] {
        c.wait_no_survivors(h, Duration::from_secs(5))
            .unwrap_or_else(|v| panic!("survivors on {h}: {v:?}"));
    }

    // --- teardown
    let namespaces: Vec<String> = ["head", "n1", "n2"].iter().map(|h| c.netns(h)).collect();
    let daemons: Vec<u32> = ["head", "n1", "n2"]
        .iter()
        .flat_map(|h| [c.holder_pid(h), c.sshd_pid(h)])
        .collect();
    let dir = c.dir().to_path_buf();
    let lingering = c.exec("n1", &["sleep", "60"]).spawn().unwrap(); // must be killed by down
    wait_listed(&c, "n1", lingering.id());
    let t1 = Instant::now();
    drop(c);
    eprintln!("down took {:?}", t1.elapsed());
    let mut lingering = lingering;
    let st = lingering.wait().unwrap();
    assert!(!st.success(), "process on n1 survived down: {st}");
    for ns in &namespaces {
        assert!(
            !Path::new("/run/netns").join(ns).exists(),
            "netns {ns} survived teardown"
        );
    }
    for p in daemons {
        let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
        let state = stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .chars()
            .next();
        assert!(
            matches!(state, None | Some('Z') | Some('X')),
            "pid {p} survived: {stat}"
        );
    }
    assert!(!dir.exists(), "cluster dir {} survived", dir.display());
    eprintln!("total {:?}", t0.elapsed());
}

#[test]
#[allow(clippy::zombie_processes)] // the child is deliberately abandoned by the panic
fn cluster_teardown_after_panic_and_idempotent_down() {
    if !Cluster::check_or_skip("cluster_teardown_after_panic_and_idempotent_down") {
        return;
    }
    let mut names = Vec::new();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let c = Cluster::up(ClusterSpec {
            hosts: 1,
            rails: 1,
            rail_rate: None,
        })
        .expect("cluster up");
        names.push(c.netns("n1"));
        names.push(c.netns("head"));
        let child = c.exec("n1", &["sleep", "60"]).spawn().unwrap();
        wait_listed(&c, "n1", child.id());
        panic!("deliberate test panic (the cluster must still be torn down)");
    }));
    assert!(r.is_err());
    assert_eq!(names.len(), 2);
    for ns in &names {
        assert!(
            !Path::new("/run/netns").join(ns).exists(),
            "netns {ns} survived a panic"
        );
    }

    let c = Cluster::up(ClusterSpec {
        hosts: 1,
        rails: 0,
        rail_rate: None,
    })
    .expect("cluster up");
    assert_eq!(
        ok(c.exec("n1", &["hostname"]).output(), "hostname").trim(),
        "n1"
    );
    c.down().expect("first down");
    c.down().expect("second down is a no-op");
    assert!(!Path::new("/run/netns").join(c.netns("n1")).exists());
}

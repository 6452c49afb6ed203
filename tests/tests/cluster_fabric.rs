//! An emulated leaf/spine fabric (fabrics/emu-4n-3to1.json: 4 hosts, 2 leaves, 2 spines, NICs at
//! 300 Mbit/s, leaf-spine links at 100 Mbit/s): traffic between leaves is routed through the
//! spines and between hosts of one leaf is not; the 3:1 oversubscription is real (a transfer
//! across leaves cannot beat the uplink rate); the leaves spread connections over both spines
//! (ECMP on the 5-tuple); and railring's all-reduce, with railrun's fabric-aware node order (and
//! its agents started one at a time, `RAILRUN_FANOUT=1`), gives exact results on every rank
//! across it. Needs root; prints SKIPPED otherwise (fails under CI).

use railring_tests::cluster::{Cluster, UpOptions};
use std::io::{Read, Write};
use std::net::{SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

const COLLCHECK: &str = env!("CARGO_BIN_EXE_rr-collcheck");

fn fabric_file() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fabrics/emu-4n-3to1.json")
}

/// Sends `bytes` from `from` to `to` (rail 0 addresses) over `conns` TCP connections, one after
/// the other; returns the seconds the transfers took.
fn send(c: &Cluster, from: &str, to: &str, bytes: usize, conns: usize) -> f64 {
    let dst = c.rail_addr(to, 0);
    let src = c.rail_addr(from, 0);
    let listener = c
        .in_netns(to, move || {
            TcpListener::bind(SocketAddrV4::new(dst, 0)).unwrap()
        })
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        for _ in 0..conns {
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = vec![0u8; 1 << 16];
            let mut got = 0;
            while got < bytes {
                let n = s.read(&mut buf).unwrap();
                assert!(n > 0, "early EOF");
                got += n;
            }
            s.write_all(b"k").unwrap();
        }
    });
    let t = c
        .in_netns(from, move || {
            let t0 = Instant::now();
            for _ in 0..conns {
                // a fresh ephemeral port per connection: a fresh 5-tuple for the ECMP hash
                let mut s = TcpStream::connect_timeout(
                    &SocketAddr::V4(SocketAddrV4::new(dst, port)),
                    Duration::from_secs(5),
                )
                .unwrap();
                assert_eq!(s.local_addr().unwrap().ip(), std::net::IpAddr::V4(src));
                let chunk = vec![7u8; 1 << 16];
                let mut sent = 0;
                while sent < bytes {
                    let n = chunk.len().min(bytes - sent);
                    s.write_all(&chunk[..n]).unwrap();
                    sent += n;
                }
                let mut ack = [0u8; 1];
                s.read_exact(&mut ack).unwrap();
            }
            t0.elapsed().as_secs_f64()
        })
        .unwrap();
    server.join().unwrap();
    t
}

/// (leaf 0 → spine 0, leaf 0 → spine 1) bytes.
fn uplinks(c: &Cluster) -> (u64, u64) {
    (
        c.uplink_tx_bytes(0, 0).unwrap(),
        c.uplink_tx_bytes(0, 1).unwrap(),
    )
}

#[test]
fn leaf_spine_fabric_routes_shapes_spreads_and_carries_collectives() {
    if !Cluster::check_or_skip("leaf_spine_fabric_routes_shapes_spreads_and_carries_collectives") {
        return;
    }
    railring_tests::bins::railrun();
    let ff = railrun::plan::fabric_file::load(&fabric_file()).unwrap();
    let c = Cluster::up_fabric(&ff.fabric, UpOptions::default()).expect("fabric up");
    assert_eq!(c.fabric_size(), Some((2, 2)));
    assert_eq!((c.leaf_of("n1", 0), c.leaf_of("n3", 0)), (Some(0), Some(1)));

    // same leaf: nothing goes up to the spines
    let before = uplinks(&c);
    send(&c, "n1", "n2", 1 << 20, 1);
    let after = uplinks(&c);
    assert!(
        after.0 + after.1 - before.0 - before.1 < 64 << 10,
        "n1 -> n2 went through the spines: {before:?} -> {after:?}"
    );

    // across leaves: through the spines, and no faster than one 100 Mbit/s uplink (3:1)
    let bytes = 3 << 20;
    let before = uplinks(&c);
    let secs = send(&c, "n1", "n3", bytes, 1);
    let after = uplinks(&c);
    let up = after.0 + after.1 - before.0 - before.1;
    assert!(up >= bytes as u64, "{up} bytes went up for {bytes}");
    let uplink_rate = 100e6 / 8.0;
    assert!(
        secs > 0.9 * bytes as f64 / uplink_rate,
        "{bytes} bytes across leaves in {secs:.3} s: faster than the 100 Mbit/s uplink"
    );

    // ECMP: 24 connections (24 source ports) land on both spines
    let before = uplinks(&c);
    send(&c, "n1", "n4", 64 << 10, 24);
    let after = uplinks(&c);
    let (s0, s1) = (after.0 - before.0, after.1 - before.1);
    assert!(
        s0 > 64 << 10 && s1 > 64 << 10,
        "every connection took one spine: {s0} and {s1} bytes (hash policy not L4?)"
    );

    // railring across the fabric: hosts listed scrambled, railrun --fabric orders them
    let hf = c.dir().join("hostfile-scrambled");
    std::fs::write(&hf, "n3 slots=2\nn1 slots=2\nn4 slots=2\nn2 slots=2\n").unwrap();
    let bin = railring_tests::bins::railrun()
        .to_str()
        .unwrap()
        .to_string();
    let ssh = c.ssh_command();
    let fabric = fabric_file().display().to_string();
    let hf = hf.display().to_string();
    let base = [
        bin.as_str(),
        "--ssh",
        &ssh,
        "--connect-timeout",
        "15",
        "--timeout",
        "120",
        "-np",
        "8",
        "--hostfile",
        &hf,
        "--fabric",
        &fabric,
        "-x",
        "RAILRING_SOCKET_IFNAME=rail",
    ];
    let mut dry: Vec<&str> = base.to_vec();
    dry.extend(["--dry-run", COLLCHECK]);
    let out = c.exec("head", &dry).stdin(Stdio::null()).output().unwrap();
    let so = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{so}");
    assert!(
        so.contains("n1[leaf 0] n2[leaf 0] n3[leaf 1] n4[leaf 1]"),
        "{so}"
    );
    assert!(
        so.contains("flat ring                    2 of 4 hops"),
        "{so}"
    );
    let mut run: Vec<&str> = base.to_vec();
    run.extend([COLLCHECK, "allreduce", "1000003"]);
    // one agent connecting at a time: the next starts when the previous says hello
    let out = c
        .exec("head", &run)
        .env_remove("RAILRING_FABRIC")
        .env("RAILRUN_FANOUT", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let so = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{so}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for r in 0..8 {
        // fabric order: ranks 0-1 on n1, 2-3 on n2, ...
        let want = format!("OK rank {r} of 8 node {} local {}", r / 2, r % 2);
        assert!(so.contains(&want), "missing '{want}' in:\n{so}");
    }
    for h in c.host_names() {
        c.wait_no_survivors(&h, Duration::from_secs(10)).unwrap();
    }
}

//! Collectives across the emulated cluster: real hosts (network namespaces with their own
//! hostname and /dev/shm), railrun over real sshd, TCP over two veth rails per host.
//! Needs root; prints SKIPPED otherwise (and fails under CI).

use railring_tests::cluster::{Cluster, ClusterSpec};

const COLLCHECK: &str = env!("CARGO_BIN_EXE_rr-collcheck");

fn railrun_on_head(c: &Cluster, hostfile: &str, np: &str, extra: &[&str]) -> std::process::Output {
    let mut argv: Vec<&str> = vec![
        "--connect-timeout",
        "15",
        "--timeout",
        "120",
        "-np",
        np,
        "--hostfile",
        hostfile,
    ];
    argv.extend_from_slice(&["-x", "RAILRING_SOCKET_IFNAME=rail"]);
    argv.extend_from_slice(extra);
    c.railrun_on("head", &[], &argv)
        .output()
        .expect("run railrun on head")
}

#[test]
fn two_level_allreduce_uses_both_rails_on_two_hosts() {
    if !Cluster::check_or_skip("two_level_allreduce_uses_both_rails_on_two_hosts") {
        return;
    }
    railring_tests::bins::railrun();
    let c = Cluster::up(ClusterSpec {
        hosts: 2,
        rails: 2,
        rail_rate: None,
    })
    .expect("cluster up");
    let hf = c.hostfile(2).expect("hostfile");
    let hf = hf.to_str().unwrap();
    let before: Vec<(u64, u64)> = ["n1", "n2"]
        .iter()
        .flat_map(|h| (0..2).map(move |r| (h, r)))
        .map(|(h, r)| c.rail_bytes(h, r).unwrap())
        .collect();
    // 4 Mi f32 = 16 MiB per rank: each local rank's ring moves its half over its own rail
    let out = railrun_on_head(&c, hf, "4", &[COLLCHECK, "allreduce", "4194304"]);
    let so = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{so}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for r in 0..4 {
        let node = r / 2;
        let local = r % 2;
        let want = format!("OK rank {r} of 4 node {node} local {local} rail {local} rail{local} ");
        assert!(so.contains(&want), "missing '{want}' in:\n{so}");
    }
    let after: Vec<(u64, u64)> = ["n1", "n2"]
        .iter()
        .flat_map(|h| (0..2).map(move |r| (h, r)))
        .map(|(h, r)| c.rail_bytes(h, r).unwrap())
        .collect();
    for (i, (b, a)) in before.iter().zip(&after).enumerate() {
        let tx = a.0 - b.0;
        let rx = a.1 - b.1;
        // 3 all-reduces x 8 MiB per direction per rail (ring of 2 nodes over a 8 MiB slice)
        assert!(
            tx > 16 << 20 && rx > 16 << 20,
            "host n{} rail{}: tx {tx} rx {rx} bytes",
            i / 2 + 1,
            i % 2
        );
    }
}

#[test]
fn one_rank_per_host_drives_both_rails() {
    if !Cluster::check_or_skip("one_rank_per_host_drives_both_rails") {
        return;
    }
    railring_tests::bins::railrun();
    let c = Cluster::up(ClusterSpec {
        hosts: 2,
        rails: 2,
        rail_rate: None,
    })
    .expect("cluster up");
    let hf = c.hostfile(1).expect("hostfile");
    let hf = hf.to_str().unwrap();
    let bytes = |c: &Cluster| -> Vec<(u64, u64)> {
        ["n1", "n2"]
            .iter()
            .flat_map(|h| (0..2).map(move |r| (h, r)))
            .map(|(h, r)| c.rail_bytes(h, r).unwrap())
            .collect()
    };
    let before = bytes(&c);
    // one rank per host, two rails: the rank's links stripe over both (RAILRING_RAILS_PER_RANK
    // automatic); 4 Mi f32 = 16 MiB, 3 calls, each moving 16 MiB per direction between the hosts
    let out = railrun_on_head(&c, hf, "2", &[COLLCHECK, "allreduce", "4194304"]);
    let so = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{so}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for r in 0..2 {
        assert!(so.contains(&format!("OK rank {r} of 2 ")), "{so}");
    }
    let after = bytes(&c);
    for (i, (b, a)) in before.iter().zip(&after).enumerate() {
        let (tx, rx) = (a.0 - b.0, a.1 - b.1);
        // half of the 48 MiB each way on each rail (an even share: at least 16 MiB)
        assert!(
            tx > 16 << 20 && rx > 16 << 20,
            "host n{} rail{}: tx {tx} rx {rx} bytes: one rank per host should drive both rails",
            i / 2 + 1,
            i % 2
        );
    }
    // every collective, striped, element by element
    let out = railrun_on_head(&c, hf, "2", &[COLLCHECK, "all"]);
    let so = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{so}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(so.matches("OK rank").count(), 2, "{so}");
    // RAILRING_RAILS_PER_RANK=1: one rail only (the other carries next to nothing)
    let before = bytes(&c);
    let out = railrun_on_head(
        &c,
        hf,
        "2",
        &[
            "-x",
            "RAILRING_RAILS_PER_RANK=1",
            COLLCHECK,
            "allreduce",
            "4194304",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let after = bytes(&c);
    let tx1 = after[1].0 - before[1].0;
    let tx0 = after[0].0 - before[0].0;
    assert!(
        tx0 > 40 << 20 && tx1 < 4 << 20,
        "rail0 {tx0} rail1 {tx1} bytes"
    );
}

#[test]
fn every_collective_across_two_hosts() {
    if !Cluster::check_or_skip("every_collective_across_two_hosts") {
        return;
    }
    railring_tests::bins::railrun();
    let c = Cluster::up(ClusterSpec {
        hosts: 2,
        rails: 2,
        rail_rate: None,
    })
    .expect("cluster up");
    let hf = c.hostfile(2).expect("hostfile");
    let out = railrun_on_head(&c, hf.to_str().unwrap(), "4", &[COLLCHECK, "all"]);
    let so = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{so}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for r in 0..4 {
        assert!(
            so.contains(&format!(
                "OK rank {r} of 4 (node {}/2, local {}/2)",
                r / 2,
                r % 2
            )),
            "{so}"
        );
    }
    // uneven: 3 ranks over 2 hosts (2 + 1)
    let out = railrun_on_head(&c, hf.to_str().unwrap(), "3", &[COLLCHECK, "all"]);
    let so = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{so}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(so.matches("OK rank").count(), 3, "{so}");
}

//! The automatic rail choice on the emulated cluster, without `RAILRING_SOCKET_IFNAME`: every
//! host has `mgmt0` (the network ssh and railrun's agents use) and `rail0`, `rail1`. Both
//! rails carry the collective and `mgmt0` carries none of it (interface byte counters); a job
//! with a rank on `head` (which has only `mgmt0`) still runs, over the fallback addresses.
//! Needs root; prints SKIPPED otherwise.

use railring_tests::cluster::{Cluster, ClusterSpec};
use std::path::PathBuf;
use std::process::Output;

const COLLCHECK: &str = env!("CARGO_BIN_EXE_rr-collcheck");

fn railrun_on_head(c: &Cluster, args: &[&str]) -> Output {
    let mut argv: Vec<&str> = vec![
        "--connect-timeout",
        "15",
        "--timeout",
        "120",
        "-x",
        "RAILRING_DEBUG=INFO",
        "-x",
        "RAILRING_DEBUG_SUBSYS=net",
    ];
    argv.extend_from_slice(args);
    let mut cmd = c.railrun_on("head", &[], &argv);
    cmd.env_remove("RAILRING_SOCKET_IFNAME");
    cmd.output().expect("run railrun on head")
}

/// (tx, rx) bytes of interface `ifname` on `host`.
fn if_bytes(c: &Cluster, host: &str, ifname: &str) -> (u64, u64) {
    let base = PathBuf::from(format!(
        "/proc/{}/root/sys/class/net/{ifname}/statistics",
        c.holder_pid(host)
    ));
    let read = |f: &str| -> u64 {
        std::fs::read_to_string(base.join(f))
            .unwrap_or_else(|e| panic!("{host} {ifname} {f}: {e}"))
            .trim()
            .parse()
            .unwrap()
    };
    (read("tx_bytes"), read("rx_bytes"))
}

#[test]
fn automatic_rails_leave_management_alone() {
    if !Cluster::check_or_skip("automatic_rails_leave_management_alone") {
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
    let ifs = ["mgmt0", "rail0", "rail1"];
    let counters = || -> Vec<(u64, u64)> {
        ["n1", "n2"]
            .iter()
            .flat_map(|h| ifs.iter().map(move |i| (*h, *i)))
            .map(|(h, i)| if_bytes(&c, h, i))
            .collect()
    };
    let before = counters();
    // 4 Mi f32 = 16 MiB per rank, three checked all-reduces.
    let out = railrun_on_head(
        &c,
        &[
            "-np",
            "4",
            "--hostfile",
            hf.to_str().unwrap(),
            COLLCHECK,
            "allreduce",
            "4194304",
        ],
    );
    let after = counters();
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{so}\n{se}");
    // Local rank i on rail i (rail0 / rail1), on both nodes: the same fabric for rail i.
    for r in 0..4 {
        let local = r % 2;
        let want = format!(
            "OK rank {r} of 4 node {} local {local} rail {local} rail{local} ",
            r / 2
        );
        assert!(so.contains(&want), "missing '{want}' in:\n{so}\n{se}");
    }
    // INFO says which interfaces and why.
    assert!(
        se.contains("rails (automatic, by subnet): rail0")
            && se.contains("not rails, management: mgmt0"),
        "{se}"
    );
    for (k, (b, a)) in before.iter().zip(&after).enumerate() {
        let (host, ifname) = (["n1", "n2"][k / 3], ifs[k % 3]);
        let (tx, rx) = (a.0 - b.0, a.1 - b.1);
        if ifname == "mgmt0" {
            // ssh only: the agent protocol, the store relay, a few lines of output.
            assert!(
                tx + rx < 4 << 20,
                "{host} mgmt0 carried collective traffic: tx {tx} rx {rx} bytes"
            );
        } else {
            assert!(
                tx > 16 << 20 && rx > 16 << 20,
                "{host} {ifname}: tx {tx} rx {rx} bytes"
            );
        }
    }

    // head has only mgmt0: a job across head and n1 still runs (n1 publishes mgmt0 as a
    // fallback address), and the result is checked element by element.
    let out = railrun_on_head(
        &c,
        &[
            "-H",
            "head:1,n1:1",
            "-np",
            "2",
            COLLCHECK,
            "allreduce",
            "65536",
        ],
    );
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{so}\n{se}");
    assert_eq!(so.matches("OK rank").count(), 2, "{so}\n{se}");
}

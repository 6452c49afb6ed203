//! `railrun doctor` on the emulated cluster: 4 hosts x 2 rails, every rail link shaped to
//! 200 Mbit/s. A healthy cluster: exit 0, nothing named, the JSON and the SVG written. One
//! host's rail1 shaped to a quarter: exactly that host and rail named. A different MTU on one
//! interface and another host's rail down: exactly those two named. Needs root; prints SKIPPED
//! otherwise (and fails under CI).

use railring_tests::cluster::{Cluster, ClusterSpec};
use std::time::{Duration, Instant};

fn doctor(c: &Cluster, dir: &std::path::Path) -> (i32, String, serde_json::Value, Duration) {
    let hf = c.hostfile(1).expect("hostfile");
    let json = dir.join("doctor.json");
    let svg = dir.join("doctor.svg");
    let _ = std::fs::remove_file(&json);
    let _ = std::fs::remove_file(&svg);
    let t = Instant::now();
    let out = c
        .railrun_on(
            "head",
            &["doctor"],
            &[
                "--hostfile",
                hf.to_str().unwrap(),
                "--ifname",
                "rail",
                "--duration",
                "0.3",
                "--json",
                json.to_str().unwrap(),
                "--svg",
                svg.to_str().unwrap(),
            ],
        )
        .output()
        .expect("railrun doctor");
    let took = t.elapsed();
    let so = String::from_utf8_lossy(&out.stdout).into_owned();
    let se = String::from_utf8_lossy(&out.stderr);
    let code = out.status.code().unwrap_or(-1);
    assert!(code == 0 || code == 1, "exit {code}\n{so}\n{se}");
    let js: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&json).unwrap_or_else(|e| panic!("no JSON ({e}):\n{so}\n{se}")),
    )
    .expect("JSON report");
    let svg = std::fs::read_to_string(&svg).expect("SVG written");
    assert!(svg.starts_with("<svg") && svg.contains("rail1"), "{svg}");
    eprintln!(
        "railrun doctor, 4 hosts x 2 rails: {:.1} s, exit {code}",
        took.as_secs_f64()
    );
    (code, so, js, took)
}

/// The findings as (kind, host, interface).
/// A sweep whose findings should be `want`; one more sweep when they are not (a 0.3 s pair test
/// on this shared 2-core machine is sometimes > 20 % below the median for no reason of the
/// network's). The caller asserts on the result of the last sweep.
fn sweep_expect(
    c: &Cluster,
    dir: &std::path::Path,
    want: &[(&str, &str, &str)],
) -> (i32, String, serde_json::Value) {
    let want: Vec<(String, String, String)> = want
        .iter()
        .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
        .collect();
    let (code, so, js, _) = doctor(c, dir);
    if named(&js) == want {
        return (code, so, js);
    }
    eprintln!(
        "findings {:?}, expected {want:?}; sweeping again:\n{so}",
        named(&js)
    );
    let (code, so, js, _) = doctor(c, dir);
    (code, so, js)
}

fn named(js: &serde_json::Value) -> Vec<(String, String, String)> {
    js["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["kind"].as_str().unwrap_or("").to_string(),
                f["host"].as_str().unwrap_or("").to_string(),
                f["interface"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

#[test]
fn doctor_names_exactly_the_slow_the_mismatched_and_the_down() {
    if !Cluster::check_or_skip("doctor_names_exactly_the_slow_the_mismatched_and_the_down") {
        return;
    }
    railring_tests::bins::railrun();
    let c = Cluster::up(ClusterSpec {
        hosts: 4,
        rails: 2,
        rail_rate: Some("200mbit".into()),
    })
    .expect("cluster up");
    let dir = c.dir().to_path_buf();
    // healthy
    let (code, so, js) = sweep_expect(&c, &dir, &[]);
    assert_eq!(code, 0, "{so}");
    assert!(so.contains("findings: none"), "{so}");
    assert_eq!(js["nodes"].as_array().unwrap().len(), 4);
    assert_eq!(js["rails"], serde_json::json!(["rail0", "rail1"]));
    // every ordered pair of every rail measured
    assert_eq!(js["pairs"].as_array().unwrap().len(), 2 * 4 * 3, "{so}");
    // n3's rail1 at a quarter of the others
    c.shape_rail("n3", 1, "50mbit").expect("shape");
    let (code, so, js) = sweep_expect(&c, &dir, &[("slow-link", "n3", "rail1")]);
    assert_eq!(code, 1, "{so}");
    assert_eq!(
        named(&js),
        vec![("slow-link".into(), "n3".into(), "rail1".into())],
        "{so}"
    );
    assert!(so.contains("n3 rail1: slow-link"), "{so}");
    c.shape_rail("n3", 1, "200mbit").expect("shape back");
    // n2's rail0 with another MTU, n4's rail1 down
    c.set_rail_mtu("n2", 0, 1400).expect("mtu");
    c.set_rail_up("n4", 1, false).expect("down");
    let (code, so, js) = sweep_expect(&c, &dir, &[("mtu", "n2", "rail0"), ("down", "n4", "rail1")]);
    assert_eq!(code, 1, "{so}");
    assert_eq!(
        named(&js),
        vec![
            ("mtu".into(), "n2".into(), "rail0".into()),
            ("down".into(), "n4".into(), "rail1".into())
        ],
        "{so}"
    );
    assert!(so.contains("measured MTU 1400; expected MTU 1500"), "{so}");
}

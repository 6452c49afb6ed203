//! `scripts/scoreboard-table` on railcompare results made up for the wire bound of a 2-host
//! shape at 500 Mbit/s per rail: a cell where both libraries sit within 1.03 x the wire time at
//! the rails' sustained rate is marked `=` (also when one of them got below it on the shaper's
//! burst), a cell faster than the wire and its burst allow `†`, both are left out of the row's
//! minimum, and an ordinary cell below 1 stays in it.

use railring_tests::proc::ScratchDir;
use std::path::Path;
use std::process::Command;

/// One railcompare row: size, ratio, and each library's time per call (both halves alike).
fn row(size: u64, ratio: f64, mpi_us: f64, rr_us: f64) -> String {
    let lib = |t: f64| {
        format!(
            r#"{{"ip_time_us": {t}, "oop_time_us": {t}, "ip_busbw": 0, "oop_busbw": 0, "ip_wrong": 0, "oop_wrong": 0, "rounds": 2}}"#
        )
    };
    format!(
        r#"{{"size": {size}, "count": {}, "type": "float", "redop": "none", "root": 0, "ratio_oop_busbw": {ratio}, "ratio_ip_busbw": {ratio}, "mpi": {}, "railring": {}}}"#,
        size / 4,
        lib(mpi_us),
        lib(rr_us)
    )
}

#[test]
fn cells_at_the_wire_ceiling_for_both_are_marked_and_left_out_of_the_minimum() {
    let dir = ScratchDir::new("rr-scoreboard-table");
    // 2 rails x 500 Mbit/s x 0.956 = 119.5 MB/s; -n 40 spreads the shaper's 2 x 625 KB burst
    // as 31 250 bytes a call. A broadcast moves its size from the root (sustained: the wire
    // time without the burst):
    //   2 MiB:   17 296 us, sustained 17 550; both within 1.03 x          -> "="
    //   1 MiB:    8 514 us, sustained  8 775; 8 000 (below it, on the burst) and 8 900 -> "="
    //   256 KiB:  1 932 us, sustained  2 194; 2 400 / 2 600 us, an ordinary 0.92
    //   32 KiB:      13 us, sustained    274; 5 us is faster than the wire -> "†"
    let rows = [
        row(32 << 10, 0.5, 5.0, 10.0),
        row(256 << 10, 0.92, 2400.0, 2600.0),
        row(1 << 20, 0.90, 8000.0, 8900.0),
        row(2 << 20, 0.90, 17400.0, 17700.0),
    ];
    let doc = format!(
        r#"{{"collective": "broadcast", "nranks": 2, "rounds": 2, "statistic": "median", "order": "ABBA", "runs": [], "commands": {{"mpi": "mpirun -np 2 mpiperf broadcast -n 40 -w 5", "railring": "railrun -np 2 railperf broadcast -n 40 -w 5"}}, "rows": [{}]}}"#,
        rows.join(", ")
    );
    std::fs::write(dir.path().join("2h1-broadcast.json"), doc).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/scoreboard-table");
    let out = Command::new("python3")
        .arg(&script)
        .arg(dir.path())
        .arg("500mbit")
        .output()
        .expect("python3 runs the table script");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = text
        .lines()
        .find(|l| l.starts_with("| 2 hosts x 1 rank | broadcast |"))
        .unwrap_or_else(|| panic!("no broadcast row in:\n{text}"));
    let cells: Vec<&str> = line.split('|').map(str::trim).collect();
    // | shape | collective | 32K | 256K | 1M | 2M | min |
    assert_eq!(cells[3], "0.50† / 0.50†", "{line}");
    assert_eq!(cells[4], "0.92 / 0.92", "{line}");
    assert_eq!(cells[5], "0.90= / 0.90=", "{line}");
    assert_eq!(cells[6], "0.90= / 0.90=", "{line}");
    assert_eq!(
        cells[7], "0.92",
        "the minimum leaves the marked cells out: {line}"
    );
    assert!(
        text.contains(
            "=: both libraries take at most 1.03 x the wire time at the rails' sustained rate"
        ),
        "{text}"
    );
}

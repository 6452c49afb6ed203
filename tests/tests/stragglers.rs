//! Straggler detection on one machine: four ranks under railrun, one of them sleeping before
//! every call — `RAILRING_STRAGGLER` names exactly that rank, with its delay; railperf's
//! per-rank view lists every rank.

use std::process::{Command, Stdio};

const RAILCHECK: &str = env!("CARGO_BIN_EXE_rr-railcheck");

fn railrun() -> Command {
    let mut c = Command::new(railring_tests::bins::railrun());
    c.env_remove("SLURM_JOB_NODELIST")
        .env_remove("SLURM_NODELIST")
        .env_remove("RAILRUN_SSH")
        .args(["--timeout", "120"]);
    c.stdin(Stdio::null());
    c
}

#[test]
fn the_rank_that_sleeps_before_every_call_is_named() {
    let out = railrun()
        .args(["-np", "4", "-x", "RAILRING_STRAGGLER=25", RAILCHECK])
        .args(["straggle", "25", "50", "2"])
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
        let named = r
            .split("last to arrive: ")
            .nth(1)
            .and_then(|x| x.split(';').next())
            .unwrap_or_default();
        // exactly rank 2, in every call, about 25 ms late
        assert!(named.starts_with("rank 2 on "), "{r}");
        assert!(named.contains(" in 25 of 25 calls"), "{r}");
        assert!(
            !named.contains("rank 0 ") && !named.contains("rank 1 ") && !named.contains("rank 3 "),
            "{r}"
        );
        let mean: f64 = named
            .split("late by mean ")
            .nth(1)
            .and_then(|x| x.split(' ').next())
            .and_then(|x| x.parse().ok())
            .unwrap_or(0.0);
        assert!(mean >= 15.0, "late by {mean} ms, expected about 25: {r}");
    }
}

#[test]
fn railperf_shows_every_rank_s_arrival() {
    let perf = railring_tests::bins::workspace_bin("railring-examples", "railperf");
    let out = railrun()
        .args(["-np", "3", "-x", "RAILRING_STRAGGLER=1000"])
        .arg(perf)
        .args(["allreduce", "-b", "4K", "-e", "4K", "-n", "5", "-w", "1"])
        .output()
        .expect("railrun");
    let so = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{so}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(so.contains("# Arrival per rank over the last"), "{so}");
    for r in 0..3 {
        assert!(
            so.lines()
                .any(|l| l.split_whitespace().take(2).collect::<Vec<_>>() == ["#", &r.to_string()]),
            "no row for rank {r}:\n{so}"
        );
    }
}

//! Every collective across real processes on this machine, checked element by element on every
//! rank (rr-collcheck), through railrun and through a hand-made launch; and the promised errors:
//! mismatched calls, a dead peer, a stalled peer — over shared memory and over TCP.

use railring::store::{self, auth, Store};
use railring_tests::proc::read_text;
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn bin(name: &str) -> String {
    match name {
        "rr-collcheck" => env!("CARGO_BIN_EXE_rr-collcheck").to_string(),
        _ => unreachable!(),
    }
}

fn railrun() -> String {
    railring_tests::bins::railrun()
        .to_string_lossy()
        .into_owned()
}

struct Out {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Start `n` ranks of rr-collcheck ourselves (no launcher): a store in this process, the
/// `RAILRING_*` variables, and per-rank extra env. Waits (bounded) for all of them.
fn direct(
    n: usize,
    args: &[&str],
    env: &[(&str, &str)],
    host_of: impl Fn(usize) -> String,
    limit: Duration,
) -> Vec<Out> {
    let secret = auth::new_secret().unwrap();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let h = store::serve(l, &secret, Store::new()).unwrap();
    let job = format!(
        "t{}{}",
        std::process::id(),
        Instant::now().elapsed().subsec_nanos()
    );
    let mut kids: Vec<_> = (0..n)
        .map(|r| {
            let mut c = Command::new(bin("rr-collcheck"));
            c.args(args)
                .env("RAILRING_RANK", r.to_string())
                .env("RAILRING_WORLD_SIZE", n.to_string())
                .env("RAILRING_STORE_ADDR", h.addr.to_string())
                .env("RAILRING_JOB_SECRET", &secret)
                .env("RAILRING_JOB_ID", &job)
                .env("RAILRING_HOST_ID", host_of(r))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            for (k, v) in env {
                c.env(k, v);
            }
            c.spawn().unwrap()
        })
        .collect();
    // Read every rank's output while it runs (a rank printing more than a pipe buffer would
    // otherwise block until the limit).
    let mut readers: Vec<Option<(ReadJoin, ReadJoin)>> = kids
        .iter_mut()
        .map(|k| {
            Some((
                read_text(k.stdout.take().unwrap()),
                read_text(k.stderr.take().unwrap()),
            ))
        })
        .collect();
    let start = Instant::now();
    let mut codes: Vec<Option<Option<i32>>> = (0..n).map(|_| None).collect();
    while codes.iter().any(|c| c.is_none()) {
        for (i, k) in kids.iter_mut().enumerate() {
            if codes[i].is_none() {
                if let Ok(Some(st)) = k.try_wait() {
                    codes[i] = Some(st.code());
                }
            }
        }
        if start.elapsed() > limit {
            for k in kids.iter_mut() {
                let _ = k.kill();
                let _ = k.wait();
            }
            // say who hung and what everyone said (the first failure is usually the cause)
            let mut report = String::new();
            for (i, c) in codes.iter().enumerate() {
                let (so, se) = readers[i].take().map(join_output).unwrap_or_default();
                let state = match c {
                    None => "still running (killed)".to_string(),
                    Some(c) => format!("exit {c:?}"),
                };
                report.push_str(&format!(
                    "rank {i}: {state}\n{}{}\n",
                    so.chars().take(2000).collect::<String>(),
                    se.chars().take(2000).collect::<String>()
                ));
            }
            panic!("ranks did not finish within {limit:?}:\n{report}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    codes
        .into_iter()
        .zip(readers)
        .map(|(c, r)| {
            let (stdout, stderr) = r.map(join_output).unwrap_or_default();
            Out {
                code: c.flatten(),
                stdout,
                stderr,
            }
        })
        .collect()
}

type ReadJoin = std::thread::JoinHandle<String>;

fn join_output((o, e): (ReadJoin, ReadJoin)) -> (String, String) {
    (o.join().unwrap_or_default(), e.join().unwrap_or_default())
}

fn all_ok(outs: &[Out]) {
    for (r, o) in outs.iter().enumerate() {
        assert_eq!(
            o.code,
            Some(0),
            "rank {r} failed:\n{}\n{}",
            o.stdout,
            o.stderr
        );
        assert!(
            o.stdout.contains(&format!("OK rank {r} ")),
            "rank {r}: {}",
            o.stdout
        );
    }
}

#[test]
fn every_collective_four_ranks_through_railrun() {
    let out = Command::new(railrun())
        .args(["-np", "4", &bin("rr-collcheck"), "all"])
        .output()
        .unwrap();
    let so = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{so}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for r in 0..4 {
        assert!(
            so.contains(&format!("OK rank {r} of 4 (node 0/1, local {r}/4)")),
            "{so}"
        );
    }
}

/// The in-node fabric's two paths for large all-to-all and all-gather — peers' buffers read
/// directly (`process_vm_readv`) and the copy through the staging slots — each checked element
/// by element, with what every rank logs proving which path ran; ranks started with different
/// settings agree on the staged one, and where ranks outnumber CPUs the all-to-all reads
/// directly if the kernel copies fast (`auto` times it, `RAILRING_SHM_SINGLE_COPY_LARGE=on|off`
/// decides instead) and always with `on`. On two ranks the blocks above the staged
/// path's crossover (all-gather and all-to-all blocks of 280 and 560 KiB, a 2.4 MB broadcast)
/// go both ways too: read directly with `RAILRING_SHM_SINGLE_COPY_LARGE=on`, staged with `off`
/// (from one rank alone as well), and `auto` names the measured kernel copy it went by.
#[test]
fn in_node_single_copy_and_staged_paths_are_both_exact() {
    let prog = bin("rr-collcheck");
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    // Four ranks on fewer CPUs: the kernel copy's speed decides the all-to-all (`auto`: either
    // way, checked below by `CROWDED`), `RAILRING_SHM_SINGLE_COPY_LARGE` overrides it.
    const CROWDED: &str = "crowded";
    let crowded = 4 > cpus;
    let auto4 = if crowded { CROWDED } else { "on" };
    let (direct4, staged4) = if crowded {
        (
            format!(
                "on, all-to-all read directly though 4 ranks share {cpus} CPUs \
                 (RAILRING_SHM_SINGLE_COPY_LARGE=on)"
            ),
            format!(
                "on, all-to-all staged (4 ranks share {cpus} CPUs; \
                 RAILRING_SHM_SINGLE_COPY_LARGE=off)"
            ),
        )
    } else {
        ("on".to_string(), "on".to_string())
    };
    let auto2 = "on";
    let large_on = format!("{auto2}, every size (RAILRING_SHM_SINGLE_COPY_LARGE=on)");
    let large_off = format!("{auto2}, large blocks staged (RAILRING_SHM_SINGLE_COPY_LARGE=off)");
    let large = |s: &str| format!("export RAILRING_SHM_SINGLE_COPY_LARGE={s}; exec {prog} all");
    let cases = [
        // the kernel copy's measured speed decides (either way: a prefix)
        (2, "auto", format!("exec {prog} all"), "on, "),
        (2, "auto", large("on"), large_on.as_str()),
        (2, "auto", large("off"), large_off.as_str()),
        (
            2,
            "auto",
            format!(
                "if [ \"$RAILRING_RANK\" = 1 ]; then export RAILRING_SHM_SINGLE_COPY_LARGE=off; \
                 else export RAILRING_SHM_SINGLE_COPY_LARGE=on; fi; exec {prog} all"
            ),
            large_off.as_str(),
        ),
        (4, "auto", format!("exec {prog} all"), auto4),
        (4, "auto", large("on"), direct4.as_str()),
        (4, "auto", large("off"), staged4.as_str()),
        (4, "on", format!("exec {prog} all"), "on"),
        (4, "off", format!("exec {prog} all"), "off (RAILRING_SHM_SINGLE_COPY=off)"),
        // rank 0 alone says off: everyone stages
        (
            4,
            "auto",
            format!(
                "if [ \"$RAILRING_RANK\" = 0 ]; then export RAILRING_SHM_SINGLE_COPY=off; fi; exec {prog} all"
            ),
            "off (a peer cannot read its peers' memory, or was told not to)",
        ),
    ];
    for (np, setting, script, want) in cases {
        let out = Command::new(railrun())
            .args(["-np", &np.to_string(), "sh", "-c", &script])
            .env("RAILRING_SHM_SINGLE_COPY", setting)
            .env("RAILRING_DEBUG", "INFO")
            .env("RAILRING_DEBUG_SUBSYS", "init")
            .output()
            .unwrap();
        let so = String::from_utf8_lossy(&out.stdout);
        let se = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{setting} {script}: {so}\n{se}");
        for r in 0..np {
            assert!(so.contains(&format!("OK rank {r} of {np}")), "{so}");
            // the world communicator's line (split communicators log their own after it)
            let line = se
                .lines()
                .find(|l| l.contains("single-copy reads") && l.ends_with(&format!("rank={r}")))
                .unwrap_or_else(|| panic!("no single-copy line for rank {r}: {se}"));
            let want = if r == 0 && script.contains("export RAILRING_SHM_SINGLE_COPY=off") {
                "off (RAILRING_SHM_SINGLE_COPY=off)"
            } else {
                want
            };
            // `auto` names the kernel copy it timed, after one of the ways it can go
            let kernel = "a kernel copy takes ";
            let ways = match want {
                CROWDED => vec![
                    format!(
                        "on, all-to-all read directly though 4 ranks share {cpus} CPUs ({kernel}"
                    ),
                    format!("on, all-to-all staged (4 ranks share {cpus} CPUs; {kernel}"),
                ],
                "on, " => vec![
                    format!("{auto2}, every size ({kernel}"),
                    format!("{auto2}, large blocks staged ({kernel}"),
                ],
                _ => Vec::new(),
            };
            if !ways.is_empty() {
                assert!(
                    ways.iter()
                        .any(|w| line.contains(&format!("(process_vm_readv): {w}")))
                        && line.contains(
                            "x two memory copies here; \
                             RAILRING_SHM_SINGLE_COPY_LARGE=on|off overrides)"
                        ),
                    "rank {r}: {line}"
                );
                continue;
            }
            assert!(
                line.contains(&format!("(process_vm_readv): {want} rank={r}")),
                "rank {r}: {line}"
            );
        }
    }
}

#[test]
fn every_collective_two_nodes_over_tcp_and_uneven_nodes() {
    // 2 + 2, the cost model's choices: the two-level algorithm with a TCP ring per local rank,
    // recursive doubling, Bruck's all-to-all for small blocks
    all_ok(&direct(
        4,
        &["all"],
        &[],
        |r| format!("h{}", r / 2),
        Duration::from_secs(120),
    ));
    // the two-level all-to-all's small exchanges with the other node run as one group (the
    // cost model gives small all-to-alls across nodes to Bruck's plan, whose rounds depend on
    // each other)
    let outs = direct(
        4,
        &["all"],
        &[
            ("RAILRING_ALGO", "two_level"),
            ("RAILRING_DEBUG", "DEBUG"),
            ("RAILRING_DEBUG_SUBSYS", "exec"),
        ],
        |r| format!("h{}", r / 2),
        Duration::from_secs(120),
    );
    all_ok(&outs);
    for (r, o) in outs.iter().enumerate() {
        assert!(
            o.stderr
                .lines()
                .any(|l| l.contains("all_to_all") && l.contains("exchanges as one group")),
            "rank {r}: no grouped all-to-all exchanges:\n{}",
            o.stderr.chars().take(3000).collect::<String>()
        );
    }
    // the same with tiny pipeline segments: every all-reduce above 8 KiB runs pipelined
    all_ok(&direct(
        4,
        &["all"],
        &[("RAILRING_PIPELINE_SEG", "4096")],
        |r| format!("h{}", r / 2),
        Duration::from_secs(120),
    ));
    // 3 + 2 + 1 ranks on three "nodes": non-uniform, the flat ring and trees over shm + TCP,
    // every TCP link striped over three connections
    all_ok(&direct(
        6,
        &["all"],
        &[("RAILRING_NET_STREAMS", "3")],
        |r| format!("h{}", [0, 0, 0, 1, 1, 2][r]),
        Duration::from_secs(180),
    ));
}

/// One-way small calls on one node let the writers run ahead of the readers by up to a ring of
/// header lines (and, where the node is not crowded, wait for half a ring at once when they get
/// there): a broadcast's root and a reduce's other ranks write call after call while the
/// readers pause now and then. Every call's values are its own, so a line or box reused before
/// its reader took it shows as a wrong element. 2 ranks, and 3 (a reduce with two writers).
/// Then staged broadcasts (also one way) of more chunks than staging slots, the readers
/// starting late: with the default slots (4 chunks) and with 16 KiB ones (hundreds).
#[test]
fn one_way_small_calls_whose_writers_run_ahead_stay_exact() {
    for (n, env) in [
        (2, &[][..]),
        (3, &[][..]),
        (3, &[("RAILRING_SHM_SLOT", "16384")][..]),
    ] {
        let outs = direct(
            n,
            &["run-ahead"],
            env,
            |_| "same".into(),
            Duration::from_secs(120),
        );
        all_ok(&outs);
    }
}

/// Broadcasts of 64-256 KiB on more than two ranks of a node go down a binomial tree of
/// direct reads: on 5 ranks a parent below the root (local 1 of root 0) serves two children,
/// on 8 the tree is three deep; from every root, in place and out of place, with a rank
/// arriving late now and then.
#[test]
fn tree_broadcasts_on_one_node_are_exact_from_every_root() {
    for n in [5, 8] {
        let outs = direct(
            n,
            &["broadcast-tree"],
            &[],
            |_| "same".into(),
            Duration::from_secs(120),
        );
        all_ok(&outs);
        for (r, o) in outs.iter().enumerate() {
            assert!(
                o.stdout.contains(&format!("OK rank {r} broadcast-tree")),
                "rank {r}: {}",
                o.stdout
            );
        }
    }
}

/// Where four ranks share fewer CPUs and read each other's memory directly
/// (`RAILRING_SHM_SINGLE_COPY_LARGE=on`; `auto` when the kernel copies fast), a broadcast of 4
/// MiB and more whose root calls out of place has every rank read the root's input directly,
/// and stages when the root calls in place: the root says which, the others follow. From every
/// root, the root switching between the two call by call, a rank arriving late now and then,
/// every element checked; the ranks' debug lines prove which way each call went.
#[test]
fn crowded_broadcasts_follow_the_root_in_or_out_of_place() {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let outs = direct(
        4,
        &["broadcast-crowded"],
        &[
            ("RAILRING_SHM_SINGLE_COPY_LARGE", "on"),
            ("RAILRING_DEBUG", "DEBUG"),
            ("RAILRING_DEBUG_SUBSYS", "exec"),
        ],
        |_| "same".into(),
        Duration::from_secs(120),
    );
    all_ok(&outs);
    for (r, o) in outs.iter().enumerate() {
        assert!(
            o.stdout.contains(&format!("OK rank {r} broadcast-crowded")),
            "rank {r}: {}",
            o.stdout
        );
        let count = |what: &str| {
            o.stderr
                .lines()
                .filter(|l| l.contains("in-node broadcast of") && l.contains(what))
                .count()
        };
        let (direct, staged) = (
            count("every rank reads its input directly"),
            count("in place, staged"),
        );
        if 4 > cpus {
            // 2 sizes x 4 roots, each once out of place and once in place; not the 4 MiB - 4 B
            assert_eq!((direct, staged), (8, 8), "rank {r}:\n{}", o.stderr);
        } else {
            assert_eq!((direct, staged), (0, 0), "rank {r}: not crowded here");
        }
    }
}

#[test]
fn every_collective_odd_sizes_single_node_and_forced_algorithms() {
    all_ok(&direct(
        3,
        &["all"],
        &[],
        |_| "same".into(),
        Duration::from_secs(120),
    ));
    for algo in ["ring", "recursive_doubling", "tree", "bruck"] {
        all_ok(&direct(
            4,
            &["all"],
            &[("RAILRING_ALGO", algo)],
            |r| format!("h{}", r % 2),
            Duration::from_secs(120),
        ));
    }
    // Bruck's all-to-all on rank counts that are not a power of two (shifts, not swaps): one
    // rank a host (every block crosses TCP, packed with others through the scratch space), and
    // 5 ranks on hosts of 2, 2 and 1 (shared-memory and TCP links in one call).
    for (n, per_host) in [(3, 1), (5, 2)] {
        all_ok(&direct(
            n,
            &["all"],
            &[("RAILRING_ALGO", "bruck")],
            |r| format!("h{}", r / per_host),
            Duration::from_secs(120),
        ));
    }
}

#[test]
fn mismatched_calls_name_both_calls_and_ranks() {
    for (label, host, mode, mine, other) in [
        ("shm", "same", "mismatch", "10 x float", "20 x float"),
        ("tcp", "", "mismatch", "10 x float", "20 x float"),
        // a small call against a large (chunked) one: neither may wait for the other's flag
        (
            "shm small/large",
            "same",
            "mismatch-big",
            "10 x float",
            "1048576 x float",
        ),
        // two one-round exchanges of different kinds
        (
            "shm exchanges",
            "same",
            "mismatch-kinds",
            "all_gather",
            "all_to_all",
        ),
    ] {
        let outs = direct(
            2,
            &[mode],
            &[],
            |r| {
                if host.is_empty() {
                    format!("h{r}")
                } else {
                    host.into()
                }
            },
            Duration::from_secs(60),
        );
        let mut seen = 0;
        for (r, o) in outs.iter().enumerate() {
            assert_eq!(
                o.code,
                Some(3),
                "{label} rank {r}: {}{}",
                o.stdout,
                o.stderr
            );
            let line = &o.stdout;
            assert!(line.contains("collective mismatch"), "{label}: {line}");
            if line.contains(mine) && line.contains(other) {
                seen += 1;
            }
            let other = 1 - r;
            assert!(
                line.contains(&format!("rank {other} called")),
                "{label}: {line}"
            );
        }
        assert_eq!(seen, 2, "{label}: both ranks name both calls");
    }
}

#[test]
fn a_dead_peer_is_named_on_every_rank_within_seconds() {
    for (label, hosts) in [
        ("shm", ["a", "a", "a"]),
        ("tcp", ["a", "b", "c"]),
        ("mixed", ["a", "a", "b"]),
    ] {
        let t = Instant::now();
        let outs = direct(
            3,
            &["die-before"],
            &[],
            |r| hosts[r].to_string(),
            Duration::from_secs(60),
        );
        assert_eq!(outs[1].code, Some(7));
        for r in [0, 2] {
            let o = &outs[r];
            assert_eq!(
                o.code,
                Some(3),
                "{label} rank {r}: {}{}",
                o.stdout,
                o.stderr
            );
            assert!(
                o.stdout.contains("rank 1"),
                "{label} rank {r} does not name rank 1: {}",
                o.stdout
            );
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "{label}: took {:?}",
            t.elapsed()
        );
    }
}

#[test]
fn a_stalled_peer_becomes_a_timeout_naming_it() {
    for (label, hosts) in [("shm", ["a", "a"]), ("tcp", ["a", "b"])] {
        let outs = direct(
            2,
            &["stall"],
            &[("RAILRING_TIMEOUT", "2")],
            |r| hosts[r].to_string(),
            Duration::from_secs(60),
        );
        let o = &outs[0];
        assert_eq!(o.code, Some(3), "{label}: {}{}", o.stdout, o.stderr);
        assert!(
            o.stdout.contains("no progress for 2 s"),
            "{label}: {}",
            o.stdout
        );
        assert!(o.stdout.contains("[1]"), "{label}: {}", o.stdout);
    }
    // a rank that never comes to a split is named the same way, not as a store key
    let outs = direct(
        3,
        &["stall-split"],
        &[("RAILRING_TIMEOUT", "2")],
        |r| ["a", "a", "b"][r].to_string(),
        Duration::from_secs(60),
    );
    for r in [0, 2] {
        let o = &outs[r];
        assert_eq!(o.code, Some(3), "rank {r}: {}{}", o.stdout, o.stderr);
        assert!(
            o.stdout.contains(
                "no progress for 2 s (RAILRING_TIMEOUT) while waiting for rank(s) [1] in split"
            ),
            "rank {r}: {}",
            o.stdout
        );
    }
}

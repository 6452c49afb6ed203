//! rr-testprog: a small rank program for railrun's integration tests.
//!
//! Usage: `rr-testprog MODE [ARGS...] [anything else is ignored, e.g. a marker]`
//!
//! Modes:
//! * `env`: print the launcher-provided variables as `KEY=VALUE` lines (plus `HOST=` and `PID=`).
//! * `exit N`: exit with code N.
//! * `exit-rank R N`: rank R exits with N after 200 ms; the others sleep 60 s.
//! * `sleep S`: sleep S seconds (fractions allowed), then exit 0.
//! * `echo-stdin`: copy stdin to stdout.
//! * `lines N`: print N long lines, as fast as possible, alternating stdout and stderr.
//! * `store`: use the bootstrap store: add("count", 1), set("rank/R"), wait for every rank's
//!   key, print what it read.
//! * `kill-self SIG`: send itself signal SIG (a number).
//! * `ignore-term S`: ignore SIGTERM, then sleep S seconds.
//! * `orphan S`: start a grandchild (`rr-testprog sleep S` + the extra args) in its own session,
//!   print `ORPHAN=<pid>`, and exit 0 (the grandchild is re-parented).

use std::io::{Read, Write};
use std::time::Duration;

const VARS: &[&str] = &[
    "RAILRING_RANK",
    "RAILRING_WORLD_SIZE",
    "RAILRING_LOCAL_RANK",
    "RAILRING_LOCAL_SIZE",
    "RAILRING_NODE_RANK",
    "RAILRING_NNODES",
    "RAILRING_STORE_ADDR",
    "RAILRING_JOB_SECRET",
    "RAILRING_JOB_ID",
    "RAILRING_BIND_TO",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
];

fn var(k: &str) -> String {
    std::env::var(k).unwrap_or_default()
}

fn rank() -> usize {
    var("RAILRING_RANK").parse().unwrap_or(0)
}

fn hostname() -> String {
    let mut b = [0u8; 256];
    // SAFETY: buffer and length match.
    let r = unsafe { libc::gethostname(b.as_mut_ptr() as *mut libc::c_char, b.len()) };
    if r != 0 {
        return "?".into();
    }
    let n = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..n]).into_owned()
}

fn secs(s: Option<&String>) -> Duration {
    Duration::from_secs_f64(
        s.and_then(|s| s.parse::<f64>().ok())
            .unwrap_or(60.0)
            .clamp(0.0, 1e6),
    )
}

fn num(s: Option<&String>, what: &str) -> i64 {
    match s.and_then(|s| s.parse::<i64>().ok()) {
        Some(n) => n,
        None => {
            eprintln!("rr-testprog: missing or bad {what}");
            std::process::exit(2)
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = args.first().map(String::as_str).unwrap_or("");
    match mode {
        "env" => {
            let mut out = String::new();
            for k in VARS {
                if let Ok(v) = std::env::var(k) {
                    out.push_str(&format!("{k}={v}\n"));
                }
            }
            for (k, v) in std::env::vars() {
                if k.starts_with("RRTEST_") {
                    out.push_str(&format!("{k}={v}\n"));
                }
            }
            out.push_str(&format!(
                "HOST={}\nPID={}\n",
                hostname(),
                std::process::id()
            ));
            print!("{out}");
        }
        "exit" => std::process::exit(num(args.get(1), "exit code") as i32),
        "exit-rank" => {
            let r = num(args.get(1), "rank");
            let code = num(args.get(2), "exit code");
            if rank() as i64 == r {
                std::thread::sleep(Duration::from_millis(200));
                std::process::exit(code as i32);
            }
            std::thread::sleep(Duration::from_secs(60));
        }
        "sleep" => std::thread::sleep(secs(args.get(1))),
        "echo-stdin" => {
            let mut buf = Vec::new();
            let _ = std::io::stdin().read_to_end(&mut buf);
            let _ = std::io::stdout().write_all(&buf);
        }
        "lines" => {
            let n = num(args.get(1), "line count").max(0) as usize;
            let r = rank();
            let payload: String = (0..300)
                .map(|i| (b'a' + ((i + r) % 26) as u8) as char)
                .collect();
            let out = std::io::stdout();
            let err = std::io::stderr();
            for i in 0..n {
                // Each line is written with several small writes, so a launcher that forwarded
                // raw chunks would interleave them.
                if i % 2 == 0 {
                    let mut o = out.lock();
                    let _ = write!(o, "BEGIN rank={r} i={i} stream=out ");
                    let _ = o.flush();
                    let _ = write!(o, "{payload}");
                    let _ = o.flush();
                    let _ = writeln!(o, " END");
                    let _ = o.flush();
                } else {
                    let mut e = err.lock();
                    let _ = write!(e, "BEGIN rank={r} i={i} stream=err ");
                    let _ = write!(e, "{payload}");
                    let _ = writeln!(e, " END");
                }
            }
        }
        "store" => store(),
        "kill-self" => {
            let sig = num(args.get(1), "signal") as i32;
            // SAFETY: plain syscalls.
            unsafe {
                // Rust installs its own SIGSEGV/SIGBUS handlers: die the default way.
                libc::signal(sig, libc::SIG_DFL);
                libc::kill(libc::getpid(), sig);
            }
            std::thread::sleep(Duration::from_secs(5));
            std::process::exit(3);
        }
        "ignore-term" => {
            // SAFETY: setting a signal disposition.
            unsafe {
                libc::signal(libc::SIGTERM, libc::SIG_IGN);
            }
            std::thread::sleep(secs(args.get(1)));
        }
        "orphan" => {
            use std::os::unix::process::CommandExt;
            let exe = std::env::current_exe().expect("current_exe");
            let mut c = std::process::Command::new(exe);
            c.arg("sleep")
                .arg(args.get(1).cloned().unwrap_or_else(|| "60".into()))
                .args(args.iter().skip(2));
            c.stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null());
            // SAFETY: setsid is async-signal-safe.
            unsafe {
                c.pre_exec(|| {
                    libc::setsid();
                    Ok(())
                });
            }
            let child = c.spawn().expect("spawn grandchild");
            println!("ORPHAN={}", child.id());
            std::mem::forget(child);
        }
        _ => {
            eprintln!("usage: rr-testprog env|exit N|exit-rank R N|sleep S|echo-stdin|lines N|store|kill-self SIG|ignore-term S|orphan S");
            std::process::exit(2);
        }
    }
}

fn store() {
    use railring::store::StoreClient;
    let addr = var("RAILRING_STORE_ADDR");
    let secret = var("RAILRING_JOB_SECRET");
    let world: usize = var("RAILRING_WORLD_SIZE").parse().unwrap_or(1);
    let r = rank();
    let fail = |what: &str, e: &dyn std::fmt::Display| -> ! {
        eprintln!("rr-testprog store: rank {r}: {what}: {e}");
        std::process::exit(4)
    };
    let c = StoreClient::connect(&addr, &secret, Duration::from_secs(10))
        .unwrap_or_else(|e| fail("connect", &e));
    let n = c.add("count", 1).unwrap_or_else(|e| fail("add", &e));
    c.set(
        &format!("rank/{r}"),
        format!("hello from rank {r} on {}", hostname()).as_bytes(),
    )
    .unwrap_or_else(|e| fail("set", &e));
    let keys: Vec<String> = (0..world).map(|i| format!("rank/{i}")).collect();
    c.wait(&keys, Duration::from_secs(30))
        .unwrap_or_else(|e| fail("wait", &e));
    let mut out = format!("STORE rank={r} add={n}\n");
    for k in &keys {
        let v = c
            .get(k, Duration::from_secs(5))
            .unwrap_or_else(|e| fail("get", &e));
        out.push_str(&format!(
            "STORE rank={r} {k}={}\n",
            String::from_utf8_lossy(&v)
        ));
    }
    let total = c
        .get("count", Duration::from_secs(5))
        .unwrap_or_else(|e| fail("get count", &e));
    out.push_str(&format!(
        "STORE rank={r} count={}\n",
        String::from_utf8_lossy(&total)
    ));
    print!("{out}");
}

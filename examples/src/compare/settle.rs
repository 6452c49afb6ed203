//! The host's cross-core latency, probed around every launch: the guard against spells of a
//! slow host.
//!
//! On a virtual machine the hypervisor may, for tens of seconds at a time, run our vCPUs where
//! moving a cache line from one to the other costs several times its usual price (measured on
//! the 2-vCPU machines railring is developed on: a ping-pong between CPU 0 and CPU 1 goes from
//! 50-80 ns to 330-370 ns for 20-40 s, a 2 MiB hand-over from 125 µs to 900 µs, one CPU's own
//! copy speed unchanged; every shared-memory or loopback benchmark then runs 2-3× slower, MPI's
//! and railring's alike). A launch caught by such a spell measures the host, and an ABBA pair
//! half inside it skews the ratio. So railcompare probes before and after every launch and
//! compares with the fastest probe it has seen: it waits (up to a limit) while the host is
//! slow, and runs a launch again when the probe after it was slow.

use super::args::Args;
use super::runs::{run_one, Run, Tools};
use super::Lib;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Round trips per batch of a probe (a probe is 5 batches: about 7 ms on a quiet host).
const ROUNDS: u64 = 20_000;

#[repr(align(128))]
struct Line(AtomicU64);

/// Nanoseconds of one cache-line round trip between the first two CPUs this process may run
/// on (median of 5 batches); `None` with fewer than two CPUs, or when a batch cannot finish
/// within a second (the other thread did not get its CPU).
pub fn cross_core_ns() -> Option<f64> {
    let cpus = railring::topology::process_allowed_cpus().ok()?;
    if cpus.len() < 2 {
        return None;
    }
    let (a, b) = (cpus[0], cpus[1]);
    let line = Arc::new(Line(AtomicU64::new(0)));
    let stop = Arc::new(AtomicBool::new(false));
    let (l2, s2) = (line.clone(), stop.clone());
    let peer = std::thread::spawn(move || {
        if railring::topology::apply_cpu_binding(&[b]).is_err() {
            s2.store(true, Ordering::Relaxed);
            return;
        }
        // answer every odd value with the next even one, until told to stop
        while !s2.load(Ordering::Relaxed) {
            let v = l2.0.load(Ordering::Acquire);
            if v % 2 == 1 {
                l2.0.store(v + 1, Ordering::Release);
            } else {
                std::hint::spin_loop();
            }
        }
    });
    // the probing thread is a fresh one too, so the caller's affinity stays as it was
    let (l1, s1) = (line, stop.clone());
    let me = std::thread::spawn(move || -> Option<f64> {
        railring::topology::apply_cpu_binding(&[a]).ok()?;
        let mut batches = Vec::new();
        let mut v = 0u64;
        for _ in 0..5 {
            let t0 = Instant::now();
            for _ in 0..ROUNDS {
                v += 1;
                l1.0.store(v, Ordering::Release);
                let mut spins = 0u32;
                while l1.0.load(Ordering::Acquire) != v + 1 {
                    spins = spins.wrapping_add(1);
                    if spins.is_multiple_of(4096)
                        && (s1.load(Ordering::Relaxed) || t0.elapsed() > Duration::from_secs(1))
                    {
                        return None;
                    }
                    std::hint::spin_loop();
                }
                v += 1;
            }
            batches.push(t0.elapsed().as_nanos() as f64 / ROUNDS as f64);
        }
        batches.sort_by(f64::total_cmp);
        Some(batches[2])
    });
    let r = me.join().ok().flatten();
    stop.store(true, Ordering::Relaxed);
    let _ = peer.join();
    r
}

/// The fastest probe seen so far and the rule that calls a probe slow.
#[derive(Debug, Default, Clone, Copy)]
pub struct Baseline {
    pub best_ns: Option<f64>,
}

/// A probe under this fraction of the baseline is not the same host going quiet but its two
/// CPUs placed otherwise (a VM whose vCPUs now and then share one core: 17 ns against its usual
/// 105-130), and does not lower the baseline: against 17 ns every usual probe above 117 was
/// slow, and a scoreboard's launches waited and ran again one after another.
const OTHER_PLACEMENT: f64 = 1.0 / 3.0;

impl Baseline {
    /// Takes a probe into the baseline (not one far under it: [`OTHER_PLACEMENT`]).
    pub fn note(&mut self, ns: f64) {
        self.best_ns = Some(match self.best_ns {
            Some(b) if ns < b * OTHER_PLACEMENT => b,
            Some(b) => b.min(ns),
            None => ns,
        });
    }
    /// A probe is slow when it is more than twice the best and more than 100 ns above it
    /// (quiet probes of one host vary by about ±30 %; a spell is 4-6×).
    pub fn is_slow(&self, ns: f64) -> bool {
        self.best_ns.is_some_and(|b| ns > 2.0 * b && ns > b + 100.0)
    }
}

/// Seconds between probes while waiting for a slow host.
const WAIT_STEP: u64 = 2;
/// Launches run again at most this many times because the host turned slow during them.
const RETRIES: usize = 2;

fn ns(p: Option<f64>) -> String {
    p.map_or("-".into(), |v| format!("{v:.0} ns"))
}

/// Probes until the host is not slow or `max_wait` seconds have passed; returns the last probe.
fn wait_quiet(base: &mut Baseline, max_wait: u64, what: &str) -> Option<f64> {
    let mut waited = 0;
    loop {
        let p = cross_core_ns();
        if let Some(v) = p {
            base.note(v);
        }
        match p {
            Some(v) if base.is_slow(v) => {
                if waited >= max_wait {
                    println!(
                        "# {what}: the host is still slow after {waited} s (cross-core {} against {}): running anyway",
                        ns(p),
                        ns(base.best_ns)
                    );
                    return p;
                }
            }
            _ => {
                if waited > 0 {
                    println!("# {what}: waited {waited} s for the host's cross-core latency to settle ({} against {})", ns(p), ns(base.best_ns));
                }
                return p;
            }
        }
        std::thread::sleep(Duration::from_secs(WAIT_STEP));
        waited += WAIT_STEP;
    }
}

/// One launch with the guard around it (`max_wait` None: no guard, one plain launch): wait
/// while the host is slow, launch, probe again (a slow probe is taken again after
/// [`WAIT_STEP`] seconds, as the launch's processes may still be ending); a launch with a slow
/// probe after it runs again (at most [`RETRIES`] times).
pub fn run_guarded(
    lib: Lib,
    round: usize,
    a: &Args,
    t: &Tools,
    base: &mut Baseline,
    max_wait: Option<u64>,
) -> Result<Run, String> {
    let Some(max_wait) = max_wait else {
        return run_one(lib, round, a, t);
    };
    let what = format!("round {} {}", round + 1, lib.name());
    let mut tries = 0;
    loop {
        let before = wait_quiet(base, max_wait, &what);
        let mut r = run_one(lib, round, a, t)?;
        let mut after = cross_core_ns();
        if after.is_some_and(|v| base.is_slow(v)) {
            // The launch's own processes may still be ending (remote ranks, agents, a spinning
            // finalize) and hold a CPU: a spell of the host outlasts a second look.
            std::thread::sleep(Duration::from_secs(WAIT_STEP));
            after = cross_core_ns();
        }
        if let Some(v) = after {
            base.note(v);
        }
        r.probes = (before, after);
        if after.is_some_and(|v| base.is_slow(v)) && tries < RETRIES {
            tries += 1;
            println!(
                "# {what}: the host turned slow during the run (cross-core {} against {}): running it again",
                ns(after),
                ns(base.best_ns)
            );
            continue;
        }
        return Ok(r);
    }
}

/// Whether a run's probes were slow against the baseline as it stands now (a run made before
/// the first quiet probe was seen passed its own check).
pub fn ran_slow(r: &Run, base: &Baseline) -> bool {
    [r.probes.0, r.probes.1]
        .into_iter()
        .flatten()
        .any(|v| base.is_slow(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spell_is_slow_and_quiet_noise_is_not() {
        let mut b = Baseline::default();
        assert!(!b.is_slow(350.0), "no baseline yet: nothing is slow");
        b.note(60.0);
        b.note(75.0);
        assert_eq!(b.best_ns, Some(60.0));
        assert!(!b.is_slow(80.0));
        assert!(!b.is_slow(150.0), "within 100 ns of the best");
        assert!(b.is_slow(350.0));
        // a host whose usual latency is high (two sockets): the factor decides
        let mut s = Baseline::default();
        s.note(300.0);
        assert!(!s.is_slow(420.0));
        assert!(s.is_slow(700.0));
        // a probe far under the baseline is the CPUs placed otherwise, not the quiet state
        let mut v = Baseline::default();
        v.note(104.0);
        v.note(17.0);
        assert_eq!(v.best_ns, Some(104.0));
        assert!(!v.is_slow(130.0));
        v.note(90.0);
        assert_eq!(v.best_ns, Some(90.0));
    }

    #[test]
    fn the_probe_measures_something_on_two_cpus() {
        match railring::topology::process_allowed_cpus() {
            Ok(c) if c.len() >= 2 => {
                let ns = cross_core_ns().expect("probe on two CPUs");
                assert!(ns > 1.0 && ns < 1e6, "{ns} ns");
            }
            _ => assert!(cross_core_ns().is_none()),
        }
    }
}

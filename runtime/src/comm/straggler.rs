//! Who arrives last at collectives, and how late (`RAILRING_STRAGGLER`, [`Communicator::stragglers`]).
//!
//! Every rank keeps how long each of its recent collective calls took, on its own monotonic
//! clock, from entering the call to leaving it. A collective ends at about the same moment on
//! every rank (no rank's result is complete before the last rank's data is in), so the rank that
//! arrived last spent the least time in the call, and a rank's arrival relative to the others is
//! the difference of durations: `late(r) = max(d) - d(r)` behind the first arrival, and the last
//! arriver is `argmin d`. No clocks are compared, so clock offsets between hosts do not matter.
//! (Rooted calls — broadcast, reduce — end less evenly; their figures are approximate.)
//!
//! Every `RAILRING_STRAGGLER` = N calls the ranks exchange their last N durations (one small
//! all-gather) and rank 0 prints one line naming the ranks that most often arrived last, with
//! their mean and maximum delay, and the hosts they are on.
//!
//! Timing costs two clock reads per call, so on a sub-microsecond call the clock matters: where
//! the kernel itself keeps time with the CPU's time-stamp counter ([`machine::tsc_clock`]) the
//! recorder reads the counter directly and converts ticks to microseconds only when durations
//! are read out, at the rate measured against [`Instant`] since the recorder started. Even so
//! a read costs 17 ns on this project's VMs (a loop of them), and the two reads took a 2-rank
//! 8 B reduce from 0.11 to 0.17 µs. So unless `RAILRING_STRAGGLER` asks for the report, calls
//! of fewer than [`TIME_ALWAYS`] bytes are timed one in [`SAMPLE`] (by the count of calls,
//! so every rank times the same calls and the durations still line up call by call); larger
//! calls, and every call with the report on, are always timed.
//!
//! [`Communicator::stragglers`]: super::Communicator::stragglers

use crate::machine;
use std::time::Instant;

/// Calls remembered per rank (the per-rank view covers at most this many recent calls).
pub const WINDOW: usize = 4096;

/// Calls of at least this many bytes are always timed: two clock reads are under 1 % of them.
pub const TIME_ALWAYS: usize = 64 << 10;
/// Smaller calls are timed one in this many when the report is off (see the module's comment).
pub const SAMPLE: u64 = 16;

/// The recorder's clock: time-stamp counter ticks, or nanoseconds since `t0`.
struct Ticks {
    tsc: bool,
    t0: Instant,
    c0: u64,
}

impl Ticks {
    fn new(tsc: bool) -> Ticks {
        let t0 = Instant::now();
        let mut t = Ticks { tsc, t0, c0: 0 };
        t.c0 = t.now();
        t
    }

    #[inline]
    fn now(&self) -> u64 {
        #[cfg(target_arch = "x86_64")]
        if self.tsc {
            // SAFETY: RDTSC has no preconditions; `tsc` is set only on x86-64
            return unsafe { core::arch::x86_64::_rdtsc() };
        }
        self.t0.elapsed().as_nanos() as u64
    }

    /// Ticks per microsecond, measured over the time since `t0` (at least a millisecond, so
    /// the two clocks' read-out jitter stays below 0.01 %; nanoseconds: 1000).
    fn per_us(&self) -> f64 {
        if !self.tsc {
            return 1000.0;
        }
        let least = std::time::Duration::from_millis(1);
        if let Some(wait) = least.checked_sub(self.t0.elapsed()) {
            std::thread::sleep(wait);
        }
        let ns = self.t0.elapsed().as_nanos() as f64;
        self.now().saturating_sub(self.c0) as f64 / (ns / 1000.0)
    }
}

/// This rank's durations of its recent collective calls.
pub(super) struct Recorder {
    /// Clock ticks, ring buffer of the last [`WINDOW`] calls.
    durs: Vec<u64>,
    /// Calls recorded so far.
    pub calls: u64,
    /// Calls started so far, timed or not (which ones are sampled).
    started: u64,
    /// Calls made by the report itself are not recorded.
    pub internal: bool,
    clock: Ticks,
}

impl Recorder {
    pub fn new() -> Recorder {
        Recorder::with_tsc(machine::tsc_clock())
    }

    fn with_tsc(tsc: bool) -> Recorder {
        Recorder {
            durs: Vec::new(),
            calls: 0,
            started: 0,
            internal: false,
            clock: Ticks::new(tsc),
        }
    }

    /// The clock now (a timed call's start: [`Recorder::start`]).
    #[inline]
    fn now(&self) -> u64 {
        self.clock.now()
    }

    /// A call of `bytes` starts: the clock now if this call is timed — every call when `all`
    /// (the report is on), else those of at least [`TIME_ALWAYS`] bytes and one in [`SAMPLE`]
    /// of the others. Every rank makes the same calls, so every rank times the same ones.
    #[inline]
    pub fn start(&mut self, bytes: usize, all: bool) -> Option<u64> {
        self.started += 1;
        (all || bytes >= TIME_ALWAYS || self.started.is_multiple_of(SAMPLE)).then(|| self.now())
    }

    /// Record a call that started at `start` (what [`Recorder::start`] returned).
    pub fn record_since(&mut self, start: u64) {
        self.record(self.clock.now().saturating_sub(start));
    }

    /// Record a call that took `d` ticks.
    fn record(&mut self, d: u64) {
        if self.durs.len() < WINDOW {
            self.durs.push(d);
        } else {
            self.durs[(self.calls % WINDOW as u64) as usize] = d;
        }
        self.calls += 1;
    }

    /// The last `n` durations in microseconds (at most [`WINDOW`] and at most the calls made),
    /// oldest first.
    pub fn last(&self, n: usize) -> Vec<u32> {
        let per_us = self.clock.per_us();
        let have = self.durs.len();
        let n = n.min(have);
        let end = (self.calls % WINDOW as u64) as usize;
        (0..n)
            .map(|k| {
                let i = if have < WINDOW {
                    have - n + k
                } else {
                    (end + WINDOW - n + k) % WINDOW
                };
                (self.durs[i] as f64 / per_us).min(u32::MAX as f64) as u32
            })
            .collect()
    }
}

/// One rank's row of the per-rank view.
#[derive(Clone, Debug, PartialEq)]
pub struct StragglerRow {
    pub rank: usize,
    pub host: String,
    /// Calls in the window.
    pub calls: usize,
    /// Calls this rank arrived last at.
    pub last: usize,
    /// How late it was behind the first arrival when it was last (µs).
    pub late_mean_us: f64,
    pub late_max_us: f64,
    /// How long it waited in a call for the last arrival (µs), over all calls.
    pub wait_mean_us: f64,
    pub wait_max_us: f64,
}

/// The per-rank view of `durs[rank][call]` (µs; every rank the same number of calls).
pub fn analyze(durs: &[Vec<u32>], hosts: &[String]) -> Vec<StragglerRow> {
    let n = durs.len();
    let calls = durs.iter().map(|d| d.len()).min().unwrap_or(0);
    let mut rows: Vec<StragglerRow> = (0..n)
        .map(|r| StragglerRow {
            rank: r,
            host: hosts.get(r).cloned().unwrap_or_default(),
            calls,
            last: 0,
            late_mean_us: 0.0,
            late_max_us: 0.0,
            wait_mean_us: 0.0,
            wait_max_us: 0.0,
        })
        .collect();
    if n == 0 {
        return rows;
    }
    for c in 0..calls {
        let (mut lo, mut hi, mut last) = (u32::MAX, 0u32, 0usize);
        for (r, d) in durs.iter().enumerate() {
            if d[c] < lo {
                lo = d[c];
                last = r;
            }
            hi = hi.max(d[c]);
        }
        let late = (hi - lo) as f64;
        let row = &mut rows[last];
        row.last += 1;
        row.late_mean_us += late;
        row.late_max_us = row.late_max_us.max(late);
        for (r, d) in durs.iter().enumerate() {
            let w = (d[c] - lo) as f64;
            rows[r].wait_mean_us += w;
            rows[r].wait_max_us = rows[r].wait_max_us.max(w);
        }
    }
    for r in &mut rows {
        if r.last > 0 {
            r.late_mean_us /= r.last as f64;
        }
        if calls > 0 {
            r.wait_mean_us /= calls as f64;
        }
    }
    rows
}

fn ms(us: f64) -> String {
    format!("{:.2} ms", us / 1e3)
}

/// The one-line report: the ranks that most often arrived last (up to three), then the hosts.
pub fn report_line(rows: &[StragglerRow], first_call: u64, comm: u64) -> String {
    let calls = rows.first().map(|r| r.calls).unwrap_or(0);
    let mut by: Vec<&StragglerRow> = rows.iter().filter(|r| r.last > 0).collect();
    by.sort_by(|a, b| {
        b.last
            .cmp(&a.last)
            .then(b.late_mean_us.total_cmp(&a.late_mean_us))
    });
    let ranks: Vec<String> = by
        .iter()
        .take(3)
        .map(|r| {
            format!(
                "rank {} on {} in {} of {calls} calls (late by mean {}, max {})",
                r.rank,
                r.host,
                r.last,
                ms(r.late_mean_us),
                ms(r.late_max_us)
            )
        })
        .collect();
    let mut hosts: Vec<(String, usize)> = Vec::new();
    for r in rows {
        match hosts.iter_mut().find(|h| h.0 == r.host) {
            Some(h) => h.1 += r.last,
            None => hosts.push((r.host.clone(), r.last)),
        }
    }
    hosts.sort_by_key(|h| std::cmp::Reverse(h.1));
    let hosts: Vec<String> = hosts
        .iter()
        .filter(|h| h.1 > 0)
        .take(3)
        .map(|(h, k)| format!("{h} {k} of {calls}"))
        .collect();
    format!(
        "railring: straggler report (communicator {comm:x}, calls {}-{}): last to arrive: {}; by host: {}",
        first_call,
        first_call + calls as u64 - 1,
        ranks.join(", "),
        hosts.join(", ")
    )
}

/// The per-rank table (railperf prints it).
pub fn table(rows: &[StragglerRow]) -> String {
    let mut s = String::from(
        "#  rank  host              calls   last  late mean   late max  wait mean   wait max\n",
    );
    for r in rows {
        s.push_str(&format!(
            "#  {:>4}  {:<16} {:>6} {:>6} {:>10} {:>10} {:>10} {:>10}\n",
            r.rank,
            r.host,
            r.calls,
            r.last,
            ms(r.late_mean_us),
            ms(r.late_max_us),
            ms(r.wait_mean_us),
            ms(r.wait_max_us)
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rank_with_the_shortest_calls_arrived_last() {
        // rank 2 arrives 10 ms late at every call: it spends ~10 ms less in each
        let durs = vec![
            vec![10_500, 10_300, 10_400],
            vec![10_450, 10_350, 10_420],
            vec![500, 300, 400],
            vec![10_400, 10_310, 10_380],
        ];
        let hosts: Vec<String> = ["a", "a", "b", "b"].iter().map(|s| s.to_string()).collect();
        let rows = analyze(&durs, &hosts);
        assert_eq!(rows[2].last, 3);
        assert_eq!(rows[2].late_max_us, 10_050.0);
        assert_eq!(rows[2].wait_max_us, 0.0);
        assert_eq!(rows[0].wait_max_us, 10_000.0);
        let line = report_line(&rows, 1, 1);
        assert!(
            line.contains(
                "last to arrive: rank 2 on b in 3 of 3 calls (late by mean 10.02 ms, max 10.05 ms)"
            ),
            "{line}"
        );
        assert!(line.contains("by host: b 3 of 3"), "{line}");
        assert!(table(&rows).lines().count() == 5);
    }

    #[test]
    fn the_ring_buffer_keeps_the_last_calls_in_order() {
        // the nanosecond clock (the counter's rate is measured, not exact)
        let mut r = Recorder::with_tsc(false);
        for i in 0..(WINDOW as u64 + 10) {
            r.record(i * 1000);
        }
        let l = r.last(3);
        assert_eq!(
            l,
            vec![WINDOW as u32 + 7, WINDOW as u32 + 8, WINDOW as u32 + 9]
        );
        let mut r = Recorder::with_tsc(false);
        r.record(5000);
        assert_eq!(r.last(10), vec![5]);
        // the counter's rate, measured: a 2 ms sleep reads as about 2000 us
        let mut r = Recorder::new();
        let t = r.now();
        std::thread::sleep(std::time::Duration::from_millis(2));
        r.record_since(t);
        let us = r.last(1)[0];
        assert!((1900..20_000).contains(&us), "{us} us");
        assert!(analyze(&[], &[]).is_empty());
    }

    #[test]
    fn small_calls_are_timed_one_in_sample_unless_the_report_is_on() {
        // the report off: calls under TIME_ALWAYS bytes every SAMPLE-th call, by the count of
        // calls (a large one in between counts too), larger ones always
        let mut r = Recorder::with_tsc(false);
        let sizes = |k: u64| {
            if k.is_multiple_of(5) {
                TIME_ALWAYS
            } else {
                TIME_ALWAYS - 1
            }
        };
        let timed: Vec<u64> = (1..=4 * SAMPLE)
            .filter(|&k| r.start(sizes(k), false).is_some())
            .collect();
        let want: Vec<u64> = (1..=4 * SAMPLE)
            .filter(|&k| k.is_multiple_of(SAMPLE) || k.is_multiple_of(5))
            .collect();
        assert_eq!(timed, want);
        // the report on: every call
        let mut r = Recorder::with_tsc(false);
        assert!((0..2 * SAMPLE).all(|_| r.start(8, true).is_some()));
    }
}

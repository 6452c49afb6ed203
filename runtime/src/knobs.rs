//! The declaration of every numeric and enumerated knob: its name, what it takes, its default,
//! its range and one line of doc — the one place a range lives. `config` (the runtime's
//! `RAILRING_*` knobs) and railrun (its `RAILRUN_*` knobs) parse values only through
//! [`Knob::seconds`], [`Knob::number`] and [`Knob::choice`], so a value out of range is the same
//! error everywhere, naming the variable, the value and the bound it broke ("1e300 is more than
//! the maximum 31536000 s"). README's knob table states each default; a test keeps the two
//! equal. Nothing here reads the environment: callers pass the value they read.

use crate::vars;
use std::time::Duration;

/// What a knob takes.
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    /// Seconds from `min` to `max`; `whole`: no fraction.
    Seconds { min: f64, max: f64, whole: bool },
    /// A whole number from `min` to `max`; `bytes`: K/M/G/T suffixes (binary) allowed.
    Number { min: u64, max: u64, bytes: bool },
    /// One of these words (case-insensitive).
    Choice(&'static [&'static str]),
}

/// One knob's declaration.
#[derive(Clone, Copy, Debug)]
pub struct Knob {
    pub name: &'static str,
    pub kind: Kind,
    /// The default as README's table writes it (`` `600` ``, `` `4M` ``).
    pub default: &'static str,
    pub doc: &'static str,
}

/// Most TCP connections one link may be striped over (`RAILRING_NET_STREAMS`).
pub const MAX_STREAMS: usize = 16;

/// Largest `RAILRING_NET_CHUNK` (256 MiB): a larger chunk only costs memory (each call's staging
/// is also bounded by the call's size).
pub const MAX_NET_CHUNK: u64 = 256 << 20;

/// A year: the largest timeout anyone means.
pub const YEAR_SECS: f64 = 365.0 * 86400.0;

const fn secs(
    name: &'static str,
    min: f64,
    max: f64,
    whole: bool,
    default: &'static str,
    doc: &'static str,
) -> Knob {
    Knob {
        name,
        kind: Kind::Seconds { min, max, whole },
        default,
        doc,
    }
}
const fn num(
    name: &'static str,
    min: u64,
    max: u64,
    bytes: bool,
    default: &'static str,
    doc: &'static str,
) -> Knob {
    Knob {
        name,
        kind: Kind::Number { min, max, bytes },
        default,
        doc,
    }
}

/// Every declared knob.
pub const KNOBS: &[Knob] = &[
    secs(
        vars::TIMEOUT,
        1.0,
        YEAR_SECS,
        true,
        "600",
        "seconds without progress before a collective fails",
    ),
    secs(
        vars::RAIL_TIMEOUT,
        1.0,
        3600.0,
        true,
        "10",
        "seconds a rail may carry unacknowledged data before its links move",
    ),
    secs(
        vars::CONNECT_TIMEOUT,
        1.0,
        3600.0,
        true,
        "30",
        "seconds to reach the bootstrap store and data-plane peers",
    ),
    num(
        vars::STRAGGLER,
        0,
        1 << 30,
        false,
        "0",
        "every N calls, report the ranks that arrived last",
    ),
    num(
        vars::SHM_SLOT,
        4096,
        1 << 30,
        true,
        "1M",
        "data bytes of one shared-memory staging slot",
    ),
    num(
        vars::NET_CHUNK,
        4096,
        MAX_NET_CHUNK,
        true,
        "512K",
        "bytes per pipelined chunk on network links",
    ),
    num(
        vars::NET_STREAMS,
        1,
        MAX_STREAMS as u64,
        false,
        "1",
        "TCP connections per peer and rail",
    ),
    num(
        vars::RAILS_PER_RANK,
        0,
        MAX_STREAMS as u64,
        false,
        "0",
        "TCP rails each rank's links stripe over (0: automatic)",
    ),
    num(
        vars::PIPELINE_SEG,
        0,
        1 << 30,
        true,
        "4M",
        "segment of the pipelined two-level all-reduce (0: off)",
    ),
    num(vars::IB_GID_INDEX, 0, 255, false, "0", "GID index for RoCE"),
    num(
        vars::GPU_SLOT,
        1,
        1 << 30,
        true,
        "",
        "staging slot of the CUDA in-node fabric",
    ),
    Knob {
        name: vars::DEBUG,
        kind: Kind::Choice(&["WARN", "ERROR", "INFO", "DEBUG", "TRACE"]),
        default: "WARN",
        doc: "log level",
    },
    Knob {
        name: vars::LOG_COLOR,
        kind: Kind::Choice(&["auto", "always", "never"]),
        default: "auto",
        doc: "colour in log lines",
    },
    secs(
        RAILRUN_HEARTBEAT,
        1.0,
        3600.0,
        false,
        "6",
        "seconds of silence after which a node agent counts as lost",
    ),
    secs(
        RAILRUN_KILL_GRACE,
        0.0,
        3600.0,
        false,
        "3",
        "seconds between SIGTERM and SIGKILL when a job is ended",
    ),
    num(
        RAILRUN_FANOUT,
        1,
        4096,
        false,
        "64",
        "node agents connecting at once",
    ),
];

/// railrun's own knobs (read by the launcher, declared here beside the runtime's).
pub const RAILRUN_HEARTBEAT: &str = "RAILRUN_HEARTBEAT";
pub const RAILRUN_KILL_GRACE: &str = "RAILRUN_KILL_GRACE";
pub const RAILRUN_FANOUT: &str = "RAILRUN_FANOUT";

/// The declaration of `name`. Panics for a name that is not declared: a programming error that
/// every test run meets at once.
pub fn knob(name: &str) -> &'static Knob {
    KNOBS
        .iter()
        .find(|k| k.name == name)
        .unwrap_or_else(|| panic!("knob {name} is not declared in knobs::KNOBS"))
}

fn show(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{}", x as i64)
    } else {
        format!("{x}")
    }
}

/// A value a knob cannot take: the variable, the value as given (trimmed) and why. Displayed
/// as ``NAME=`value`: why``.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KnobError {
    pub name: &'static str,
    pub value: String,
    pub why: String,
}

impl std::fmt::Display for KnobError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}=`{}`: {}", self.name, self.value, self.why)
    }
}

impl From<KnobError> for String {
    fn from(e: KnobError) -> String {
        e.to_string()
    }
}

impl Knob {
    fn error(&self, value: &str, why: String) -> KnobError {
        KnobError {
            name: self.name,
            value: value.to_string(),
            why,
        }
    }

    /// The declared default of a seconds knob.
    pub fn default_seconds(&self) -> Duration {
        let x: f64 = self
            .default
            .parse()
            .unwrap_or_else(|_| panic!("{}: default", self.name));
        Duration::from_secs_f64(x)
    }

    /// The declared default of a number knob.
    pub fn default_number(&self) -> u64 {
        parse_size(self.default).unwrap_or_else(|| panic!("{}: default", self.name))
    }

    /// `value` (None or blank: the default) as a duration; `Err` says what is wrong, naming
    /// the variable, the value and the bound.
    pub fn seconds(&self, value: Option<&str>, default: Duration) -> Result<Duration, KnobError> {
        let Kind::Seconds { min, max, whole } = self.kind else {
            panic!("{} is not declared as seconds", self.name)
        };
        let Some(v) = value.map(str::trim).filter(|v| !v.is_empty()) else {
            return Ok(default);
        };
        let what = if whole {
            "a whole number of seconds"
        } else {
            "a number of seconds"
        };
        let bad = |why: String| self.error(v, why);
        let x: f64 = v
            .parse()
            .ok()
            .filter(|x: &f64| !x.is_nan())
            .ok_or_else(|| {
                bad(format!(
                    "expected {what} from {} to {}",
                    show(min),
                    show(max)
                ))
            })?;
        if x > max {
            return Err(bad(format!("{v} is more than the maximum {} s", show(max))));
        }
        if x < min {
            return Err(bad(format!("{v} is less than the minimum {} s", show(min))));
        }
        if whole && x.fract() != 0.0 {
            return Err(bad(format!(
                "expected {what} (from {} to {})",
                show(min),
                show(max)
            )));
        }
        Ok(Duration::from_secs_f64(x))
    }

    /// `value` (None or blank: `default`) as a whole number, with K/M/G/T suffixes where the
    /// knob counts bytes.
    pub fn number(&self, value: Option<&str>, default: u64) -> Result<u64, KnobError> {
        let Kind::Number { min, max, bytes } = self.kind else {
            panic!("{} is not declared as a number", self.name)
        };
        let Some(v) = value.map(str::trim).filter(|v| !v.is_empty()) else {
            return Ok(default);
        };
        let bad = |why: String| self.error(v, why);
        let unit = if bytes {
            " (K/M/G suffixes allowed)"
        } else {
            ""
        };
        let range = format!("from {min} to {max}");
        let n = if bytes {
            parse_size(v)
        } else {
            v.parse::<u64>().ok()
        };
        let Some(n) = n else {
            // A number too large for 64 bits, or a negative one, still gets its bound named.
            let f = v
                .trim_end_matches(['k', 'K', 'm', 'M', 'g', 'G', 't', 'T'])
                .parse::<f64>();
            return Err(match f {
                Ok(f) if f > max as f64 => bad(format!("{v} is more than the maximum {max}")),
                Ok(f) if f < min as f64 => bad(format!("{v} is less than the minimum {min}")),
                _ => bad(format!("expected a whole number {range}{unit}")),
            });
        };
        if n > max {
            return Err(bad(format!("{v} is more than the maximum {max}")));
        }
        if n < min {
            return Err(bad(format!("{v} is less than the minimum {min}")));
        }
        Ok(n)
    }

    /// `value` (None or blank: the first, default word) as one of the knob's words.
    pub fn choice(&self, value: Option<&str>) -> Result<&'static str, KnobError> {
        let Kind::Choice(words) = self.kind else {
            panic!("{} is not declared as a choice", self.name)
        };
        let Some(v) = value.map(str::trim).filter(|v| !v.is_empty()) else {
            return Ok(words[0]);
        };
        words
            .iter()
            .find(|w| w.eq_ignore_ascii_case(v))
            .copied()
            .ok_or_else(|| self.error(v, format!("expected one of {}", words.join(", "))))
    }
}

/// `8`, `64K`, `2M`, `1G`, `1T` → bytes (binary multiples, as nccl-tests); None for anything
/// else or a value over 64 bits.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mul) = match s.chars().last()? {
        'k' | 'K' => (&s[..s.len() - 1], 1u64 << 10),
        'm' | 'M' => (&s[..s.len() - 1], 1 << 20),
        'g' | 'G' => (&s[..s.len() - 1], 1 << 30),
        't' | 'T' => (&s[..s.len() - 1], 1 << 40),
        _ => (s, 1),
    };
    num.trim().parse::<u64>().ok()?.checked_mul(mul)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_name_the_bound_they_break() {
        let t = knob(vars::TIMEOUT);
        let d = Duration::from_secs(600);
        assert_eq!(t.seconds(None, d), Ok(d));
        assert_eq!(t.seconds(Some(" "), d), Ok(d));
        assert_eq!(t.seconds(Some("5"), d), Ok(Duration::from_secs(5)));
        let e = t.seconds(Some("1e300"), d).unwrap_err().to_string();
        assert!(
            e.contains("RAILRING_TIMEOUT=`1e300`: 1e300 is more than the maximum 31536000 s"),
            "{e}"
        );
        let e = t.seconds(Some("inf"), d).unwrap_err().to_string();
        assert!(e.contains("more than the maximum"), "{e}");
        let e = t.seconds(Some("2.5"), d).unwrap_err().to_string();
        assert!(e.contains("whole number of seconds"), "{e}");
        let e = t.seconds(Some("NaN"), d).unwrap_err().to_string();
        assert!(
            e.contains("expected a whole number of seconds from 1 to 31536000"),
            "{e}"
        );
        let r = knob(vars::RAIL_TIMEOUT);
        let e = r.seconds(Some("0.000001"), d).unwrap_err().to_string();
        assert!(e.contains("0.000001 is less than the minimum 1 s"), "{e}");
        let h = knob(RAILRUN_HEARTBEAT);
        assert_eq!(h.seconds(Some("1.5"), d), Ok(Duration::from_millis(1500)));
        for bad in ["0", "1e300", "3601", "-1", "x"] {
            assert!(h.seconds(Some(bad), d).is_err(), "{bad}");
        }
        let g = knob(RAILRUN_KILL_GRACE);
        assert_eq!(g.seconds(Some("0"), d), Ok(Duration::ZERO));
        assert!(g
            .seconds(Some("-1"), d)
            .unwrap_err()
            .to_string()
            .contains("less than the minimum 0 s"));
    }

    #[test]
    fn numbers_name_the_bound_they_break() {
        let f = knob(RAILRUN_FANOUT);
        assert_eq!(f.number(Some("8"), 64), Ok(8));
        let e = f.number(Some("0"), 64).unwrap_err().to_string();
        assert!(e.contains("0 is less than the minimum 1"), "{e}");
        let e = f.number(Some("-1"), 64).unwrap_err().to_string();
        assert!(e.contains("-1 is less than the minimum 1"), "{e}");
        let e = f.number(Some("1e20"), 64).unwrap_err().to_string();
        assert!(e.contains("1e20 is more than the maximum 4096"), "{e}");
        let p = knob(vars::PIPELINE_SEG);
        assert_eq!(p.number(Some("0"), 1), Ok(0));
        assert_eq!(p.number(Some("8M"), 1), Ok(8 << 20));
        let e = p.number(Some("1T"), 1).unwrap_err().to_string();
        assert!(e.contains("1T is more than the maximum 1073741824"), "{e}");
        let e = p
            .number(Some("99999999999999999999G"), 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("more than the maximum"), "{e}");
        assert!(p
            .number(Some("x"), 1)
            .unwrap_err()
            .to_string()
            .contains("expected a whole number"));
    }

    #[test]
    fn choices_list_their_words() {
        let d = knob(vars::DEBUG);
        assert_eq!(d.choice(None), Ok("WARN"));
        assert_eq!(d.choice(Some("info")), Ok("INFO"));
        let e = d.choice(Some("bogus")).unwrap_err().to_string();
        assert!(
            e.contains("RAILRING_DEBUG=`bogus`: expected one of WARN, ERROR, INFO, DEBUG, TRACE"),
            "{e}"
        );
    }

    #[test]
    fn every_knob_is_declared_once() {
        let mut names: Vec<&str> = KNOBS.iter().map(|k| k.name).collect();
        names.sort();
        let n = names.len();
        names.dedup();
        assert_eq!(n, names.len(), "a knob is declared twice");
    }

    /// README's knob table gives every declared default (no drift between the two), and
    /// every declared default is inside its own range.
    #[test]
    fn readme_states_every_declared_default() {
        let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
            .expect("README.md");
        for k in KNOBS.iter().filter(|k| !k.default.is_empty()) {
            let row = readme
                .lines()
                .find(|l| l.starts_with(&format!("| `{}` |", k.name)))
                .unwrap_or_else(|| panic!("README's knob table has no row for {}", k.name));
            let cell = row.split('|').nth(2).unwrap_or("").trim();
            assert!(
                cell.starts_with(&format!("`{}`", k.default)),
                "README gives {} the default {cell}, the declaration {}",
                k.name,
                k.default
            );
            match k.kind {
                Kind::Seconds { .. } => {
                    let d = k.default_seconds();
                    assert_eq!(
                        k.seconds(Some(k.default), Duration::ZERO),
                        Ok(d),
                        "{}",
                        k.name
                    );
                }
                Kind::Number { .. } => {
                    let d = k.default_number();
                    assert_eq!(k.number(Some(k.default), 0), Ok(d), "{}", k.name);
                }
                Kind::Choice(_) => assert!(k.choice(Some(k.default)).is_ok(), "{}", k.name),
            }
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("8"), Some(8));
        assert_eq!(parse_size("64K"), Some(65536));
        assert_eq!(parse_size("256M"), Some(256 << 20));
        assert_eq!(parse_size("1G"), Some(1 << 30));
        assert_eq!(parse_size("x"), None);
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("99999999999999999999G"), None);
    }
}

//! Where railrun's hosts come from: the [`HostSource`] every source produces, the precedence
//! between `--hostfile`, `-H/--host`, the Slurm allocation and the implicit localhost
//! ([`resolve_hosts`]), and which hosts are this machine ([`is_local`]).
//!
//! The grammars live beside this file: [`hostfile`] (Open MPI and Hydra hostfiles, `-H`) and
//! [`slurm`] (`SLURM_JOB_NODELIST` + `SLURM_TASKS_PER_NODE`).
//!
//! Nothing read from a file or the environment can panic or allocate without
//! bound: files are capped at [`MAX_HOSTFILE_BYTES`], lines at
//! [`MAX_LINE_LEN`], hosts at [`MAX_HOSTS`] and slots at [`MAX_SLOTS`].

pub mod hostfile;
pub mod slurm;

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use railring::hostlist;
use serde::Serialize;

pub use hostfile::{
    parse_host_arg, parse_hostfile, parse_hostfile_str, parse_hostfile_text, read_hostfile, Family,
    Hostfile, HostfileRules,
};
pub use slurm::hosts_from_slurm_env;

/// Largest hostfile read, in bytes.
pub const MAX_HOSTFILE_BYTES: u64 = 16 << 20;
/// Longest hostfile line, in bytes.
pub const MAX_LINE_LEN: usize = 4096;
/// Most distinct hosts from any source.
pub const MAX_HOSTS: usize = 1_000_000;
/// Most slots (or max_slots) one host may have, after merging repeats.
pub const MAX_SLOTS: usize = 1_000_000;
/// Longest host name (DNS limit).
pub const MAX_HOSTNAME_LEN: usize = 253;

/// One host with its slot counts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HostEntry {
    /// Host name as written (without `user@`).
    pub name: String,
    /// Login user, from `user@host` or `user=`.
    pub user: Option<String>,
    /// Ranks this host takes before it counts as oversubscribed.
    pub slots: usize,
    /// Hard limit even with `--oversubscribe`; `None` = unlimited.
    pub max_slots: Option<usize>,
    /// File and 1-based line where the host first appeared, if from a file.
    pub origin: Option<(PathBuf, usize)>,
}

impl HostEntry {
    /// A host with `slots` slots, no user, no limit, no origin.
    pub fn new(name: impl Into<String>, slots: usize) -> Self {
        HostEntry {
            name: name.into(),
            user: None,
            slots,
            max_slots: None,
            origin: None,
        }
    }

    /// `user@name`, or `name` without a user.
    pub fn display_name(&self) -> String {
        match &self.user {
            Some(u) => format!("{u}@{}", self.name),
            None => self.name.clone(),
        }
    }
}

/// Where the host list came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceKind {
    /// `--hostfile FILE` alone.
    Hostfile(PathBuf),
    /// `-H/--host` alone.
    HostArg,
    /// `--hostfile FILE` narrowed by `-H/--host`.
    HostfileSubset(PathBuf),
    /// The Slurm allocation (`SLURM_JOB_NODELIST`).
    Slurm,
    /// No host source at all: this machine, oversubscription allowed.
    ImplicitLocalhost,
}

/// The resolved host list plus its provenance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostSource {
    pub hosts: Vec<HostEntry>,
    pub kind: SourceKind,
    /// Whose placement rules apply by default: Hydra for a Hydra hostfile (ranks cycle over
    /// its lines), Open MPI otherwise.
    pub family: Family,
    /// The hosts line by line (hostfile lines or `-H` items, in order): (index into `hosts`,
    /// count). Hydra's cycle and `--map-by seq` follow it.
    pub lines: Vec<(usize, usize)>,
    /// What railrun assumed while reading the source, for the user to see (one line each).
    pub notes: Vec<String>,
}

impl HostSource {
    /// `hosts` in order, one line each, Open MPI rules.
    pub fn new(hosts: Vec<HostEntry>, kind: SourceKind) -> Self {
        let lines = hosts
            .iter()
            .enumerate()
            .map(|(i, h)| (i, h.slots))
            .collect();
        HostSource {
            hosts,
            kind,
            family: Family::OpenMpi,
            lines,
            notes: Vec::new(),
        }
    }

    /// A hostfile's hosts, lines and family.
    fn from_hostfile(hf: Hostfile, kind: SourceKind) -> Self {
        HostSource {
            hosts: hf.hosts,
            kind,
            family: hf.family,
            lines: hf.lines,
            notes: Vec::new(),
        }
    }

    /// The implicit localhost source with `slots` slots.
    pub fn implicit_localhost(slots: usize) -> Self {
        HostSource::new(
            vec![HostEntry::new("localhost", slots.max(1))],
            SourceKind::ImplicitLocalhost,
        )
    }

    /// Leave out the hosts `drop` says (their lines too).
    fn retain_hosts(&mut self, keep: impl Fn(&HostEntry) -> bool) {
        let mut new_index = vec![usize::MAX; self.hosts.len()];
        let mut hosts = Vec::new();
        for (i, h) in std::mem::take(&mut self.hosts).into_iter().enumerate() {
            if keep(&h) {
                new_index[i] = hosts.len();
                hosts.push(h);
            }
        }
        self.hosts = hosts;
        self.lines = self
            .lines
            .iter()
            .filter(|(h, _)| new_index[*h] != usize::MAX)
            .map(|&(h, c)| (new_index[h], c))
            .collect();
    }

    /// `--nolocal`: leave out every host that is this machine. No host left is an error.
    pub fn without_local(mut self, is_local: impl Fn(&str) -> bool) -> Result<Self, HostError> {
        if self.is_implicit() {
            return Err(HostError::NoLocal {
                why: "no host source was given, so the only host is this machine; give --hostfile or -H".into(),
            });
        }
        let before = self.hosts.len();
        self.retain_hosts(|h| !is_local(&h.name));
        if self.hosts.is_empty() {
            return Err(HostError::NoLocal {
                why: format!("all {before} host(s) of the {} are this machine", self.kind),
            });
        }
        Ok(self)
    }

    /// True when no host source was given: placement then allows
    /// oversubscription without `--oversubscribe`.
    pub fn is_implicit(&self) -> bool {
        self.kind == SourceKind::ImplicitLocalhost
    }

    /// Sum of all hosts' slots (saturating).
    pub fn total_slots(&self) -> usize {
        self.hosts
            .iter()
            .fold(0usize, |a, h| a.saturating_add(h.slots))
    }
}

impl fmt::Display for SourceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SourceKind::Hostfile(p) => write!(f, "hostfile {}", p.display()),
            SourceKind::HostArg => write!(f, "--host"),
            SourceKind::HostfileSubset(p) => write!(f, "--host subset of hostfile {}", p.display()),
            SourceKind::Slurm => write!(f, "Slurm allocation"),
            SourceKind::ImplicitLocalhost => write!(f, "localhost (no host source given)"),
        }
    }
}

/// Why a host source could not be used.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The hostfile could not be opened or read.
    #[error("{}: cannot read hostfile: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The hostfile is larger than [`MAX_HOSTFILE_BYTES`].
    #[error("{}: hostfile is larger than {limit} bytes", path.display())]
    FileTooLarge { path: PathBuf, limit: u64 },
    /// A malformed hostfile line: `file:line: found ..., expected ...`.
    #[error("{file}:{line}: {found}; expected {expected}")]
    Syntax {
        file: String,
        line: usize,
        found: String,
        expected: String,
    },
    /// A malformed `-H/--host` item.
    #[error("--host `{item}`: {found}; expected {expected}")]
    HostArg {
        item: String,
        found: String,
        expected: String,
    },
    /// `-H` names a host that the hostfile does not list.
    #[error("--host {host}: not in hostfile {} (it lists {available}); with both --hostfile and --host, --host selects hosts from the hostfile", path.display())]
    NotInHostfile {
        host: String,
        path: PathBuf,
        available: String,
    },
    /// `-H host:N` asks for more than the hostfile's `max_slots`.
    #[error("--host {host}:{slots}: more than max_slots={max_slots} given for it in hostfile {}", path.display())]
    HostArgExceedsMaxSlots {
        host: String,
        slots: usize,
        max_slots: usize,
        path: PathBuf,
    },
    /// `--nolocal` leaves no host.
    #[error("--nolocal: {why}")]
    NoLocal { why: String },
    /// `-H ^host` names a host the source does not have.
    #[error("--host ^{host}: not among the hosts to exclude it from ({available})")]
    ExcludeUnknown { host: String, available: String },
    /// `-H` lists only exclusions and there is nothing to exclude from.
    #[error("--host {arg}: only exclusions (`^host`), but there is no --hostfile or Slurm allocation to exclude them from")]
    ExcludeFromNothing { arg: String },
    /// An explicitly given hostfile lists no hosts.
    #[error("{}: hostfile lists no hosts; expected at least one `host [slots=N]` or `host:N` line", path.display())]
    EmptyHostfile { path: PathBuf },
    /// A Slurm variable could not be parsed.
    #[error("{var}=`{value}`: {source}")]
    Slurm {
        var: &'static str,
        value: String,
        #[source]
        source: hostlist::HostlistError,
    },
    /// A Slurm allocation that does not make sense.
    #[error("Slurm allocation: {0}")]
    SlurmAllocation(String),
}

fn preview(s: &str) -> String {
    const N: usize = 60;
    let mut out: String = s.chars().take(N).collect();
    if s.chars().nth(N).is_some() {
        out.push_str("...");
    }
    out.escape_debug().to_string()
}

/// Letters, digits, `-`, `.` and `_`, and no leading `-`: a name starting with `-` would reach
/// ssh (or srun) as an option (`-H -oProxyCommand=...`).
fn valid_hostname(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with('-')
        && s.len() <= MAX_HOSTNAME_LEN
        && s.bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_'))
}

/// A problem inside one line or `-H` item: (found, expected).
type Problem = (String, String);

fn problem(found: impl Into<String>, expected: impl Into<String>) -> Problem {
    (found.into(), expected.into())
}
/// Accumulates hosts, merging repeated names (slots add up).
struct Merger {
    hosts: Vec<HostEntry>,
    index: HashMap<String, usize>,
}

impl Merger {
    fn new() -> Self {
        Merger {
            hosts: Vec::new(),
            index: HashMap::new(),
        }
    }

    /// Add `e`; on failure returns the problem (found, expected).
    fn add(&mut self, e: HostEntry) -> Result<(), Problem> {
        match self.index.get(&e.name) {
            Some(&i) => {
                let h = &mut self.hosts[i];
                match (&h.user, &e.user) {
                    (Some(a), Some(b)) if a != b => {
                        return Err(problem(
                            format!(
                                "host `{}` again with user `{b}`, earlier with user `{a}`",
                                e.name
                            ),
                            "the same user on every line of a host",
                        ))
                    }
                    (None, Some(b)) => h.user = Some(b.clone()),
                    _ => {}
                }
                let slots = h.slots.saturating_add(e.slots);
                if slots > MAX_SLOTS {
                    return Err(problem(
                        format!("{slots} slots in total for host `{}`", e.name),
                        format!("at most {MAX_SLOTS} slots per host"),
                    ));
                }
                h.slots = slots;
                h.max_slots = match (h.max_slots, e.max_slots) {
                    (Some(a), Some(b)) => Some(a.saturating_add(b).min(MAX_SLOTS)),
                    _ => None,
                };
            }
            None => {
                if self.hosts.len() >= MAX_HOSTS {
                    return Err(problem(
                        format!("more than {MAX_HOSTS} hosts"),
                        format!("at most {MAX_HOSTS} distinct hosts"),
                    ));
                }
                self.index.insert(e.name.clone(), self.hosts.len());
                self.hosts.push(e);
            }
        }
        Ok(())
    }
}

fn short_name(s: &str) -> &str {
    s.split('.').next().unwrap_or(s)
}

/// True for `localhost`, loopback addresses, and this machine's own host name
/// (full or short form, case-insensitive).
pub fn is_local(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    if n == "localhost"
        || n.starts_with("localhost.")
        || n == "::1"
        || n.starts_with("127.")
        || n == "0.0.0.0"
    {
        return true;
    }
    let Ok(hn) = nix::unistd::gethostname() else {
        return false;
    };
    let Some(hn) = hn.to_str().map(|s| s.to_ascii_lowercase()) else {
        return false;
    };
    if hn.is_empty() {
        return false;
    }
    n == hn
        || (!n.contains('.') && n == short_name(&hn))
        || (!hn.contains('.') && short_name(&n) == hn)
}

/// Number of CPUs this process may run on (affinity/cgroup aware), at least 1.
pub fn local_cpu_count() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

fn same_host(a: &str, b: &str) -> bool {
    a.eq_ignore_ascii_case(b) || (is_local(a) && is_local(b))
}

/// Apply host-source precedence:
///
/// 1. `--hostfile` and `-H`: `-H` selects a subset of the hostfile's hosts
///    (kept in hostfile order, slots from the hostfile unless `-H host:N`
///    overrides them); a `-H` host not in the file is an error.
/// 2. `-H` alone.
/// 3. `--hostfile` alone (a file listing no hosts is an error).
/// 4. The Slurm allocation when `SLURM_JOB_NODELIST`/`SLURM_NODELIST` is set.
/// 5. Implicit localhost with [`local_cpu_count`] slots, flagged so placement
///    allows oversubscription.
///
/// `-H ^host` items remove hosts from what the other items (or the hostfile, or the Slurm
/// allocation) give. Hostfile lines without a count follow [`HostfileRules::default`] here;
/// [`resolve_hosts_with`] takes the rules.
pub fn resolve_hosts(
    hostfile: Option<&Path>,
    host_arg: Option<&str>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<HostSource, HostError> {
    resolve_hosts_with(hostfile, host_arg, env, &HostfileRules::default())
}

/// [`resolve_hosts`] with the rules for hostfile lines without a count.
pub fn resolve_hosts_with(
    hostfile: Option<&Path>,
    host_arg: Option<&str>,
    env: &dyn Fn(&str) -> Option<String>,
    rules: &HostfileRules,
) -> Result<HostSource, HostError> {
    let (include, exclude) = match host_arg {
        Some(arg) => {
            let (inc, exc) = split_exclusions(arg);
            if exc.is_empty() {
                (Some(arg.to_string()), exc)
            } else if inc.is_empty() {
                if hostfile.is_none() && hosts_from_slurm_env(env)?.is_none() {
                    return Err(HostError::ExcludeFromNothing { arg: preview(arg) });
                }
                (None, exc)
            } else {
                (Some(inc.join(",")), exc)
            }
        }
        None => (None, Vec::new()),
    };
    let mut src = match (hostfile, include.as_deref()) {
        (Some(path), Some(arg)) => hostfile_subset(path, arg, rules)?,
        (None, Some(arg)) => HostSource::new(parse_host_arg(arg)?, SourceKind::HostArg),
        (Some(path), None) => {
            let hf = read_hostfile(path, rules)?;
            if hf.hosts.is_empty() {
                return Err(HostError::EmptyHostfile {
                    path: path.to_path_buf(),
                });
            }
            let mut src =
                HostSource::from_hostfile(hf.clone(), SourceKind::Hostfile(path.to_path_buf()));
            src.notes.extend(bare_note(&hf, rules));
            src
        }
        (None, None) => match hosts_from_slurm_env(env)? {
            Some(hosts) => HostSource::new(hosts, SourceKind::Slurm),
            None => HostSource::implicit_localhost(local_cpu_count()),
        },
    };
    for host in exclude {
        if !src.hosts.iter().any(|h| same_host(&h.name, &host)) {
            let mut avail: Vec<&str> = src.hosts.iter().take(8).map(|h| h.name.as_str()).collect();
            if src.hosts.len() > 8 {
                avail.push("...");
            }
            return Err(HostError::ExcludeUnknown {
                host,
                available: avail.join(", "),
            });
        }
        src.retain_hosts(|h| !same_host(&h.name, &host));
    }
    if src.hosts.is_empty() {
        return Err(HostError::HostArg {
            item: preview(host_arg.unwrap_or_default()),
            found: "every host excluded".into(),
            expected: "at least one host left after the `^host` exclusions".into(),
        });
    }
    Ok(src)
}

/// `-H` items that start with `^` (exclusions, without the `^`) apart from the others.
fn split_exclusions(arg: &str) -> (Vec<String>, Vec<String>) {
    let mut inc = Vec::new();
    let mut exc = Vec::new();
    for item in arg.split(',') {
        match item.trim().strip_prefix('^') {
            Some(h) => exc.push(h.trim().to_string()),
            None => inc.push(item.to_string()),
        }
    }
    (inc, exc)
}

/// The note for an Open MPI hostfile's lines without `slots=` (their slot count is assumed).
fn bare_note(hf: &Hostfile, rules: &HostfileRules) -> Option<String> {
    let first = *hf.bare_lines.first()?;
    let (file, _) = hf
        .hosts
        .iter()
        .find_map(|h| h.origin.clone())
        .unwrap_or_default();
    let n = hf.bare_lines.len();
    Some(match hf.family {
        Family::OpenMpi => format!(
            "{}:{first}: {n} line(s) without slots=: {} slot(s) each, this machine's cores (Open MPI counts each host's cores; railrun cannot ask a host before it starts: write slots=N to say otherwise) [{}]",
            file.display(),
            rules.openmpi_bare_slots.max(1),
            hf.family_reason
        ),
        Family::Hydra if hf.family_from_syntax => return None,
        Family::Hydra => format!(
            "{}:{first}: {n} line(s) without a count: one rank per host per pass, cycling over the lines (Hydra) [{}]",
            file.display(),
            hf.family_reason
        ),
    })
}

/// `--hostfile` narrowed by `-H`: the hostfile's hosts that `-H` names, in hostfile order, with
/// the hostfile's slots unless `-H host:N` overrides them (within `max_slots`).
fn hostfile_subset(path: &Path, arg: &str, rules: &HostfileRules) -> Result<HostSource, HostError> {
    let hf = read_hostfile(path, rules)?;
    let family = hf.family;
    let note = bare_note(&hf, rules);
    let file_hosts = hf.hosts;
    if file_hosts.is_empty() {
        return Err(HostError::EmptyHostfile {
            path: path.to_path_buf(),
        });
    }
    let items = hostfile::parse_host_arg_items(arg)?;
    // index in file_hosts -> (selected, explicit slots sum)
    let mut chosen: Vec<Option<Option<usize>>> = vec![None; file_hosts.len()];
    let mut by_name: HashMap<String, usize> = HashMap::new();
    for (i, h) in file_hosts.iter().enumerate() {
        by_name.entry(h.name.to_ascii_lowercase()).or_insert(i);
    }
    let mut users: Vec<Option<String>> = vec![None; file_hosts.len()];
    for (e, explicit) in items {
        let idx = by_name
            .get(&e.name.to_ascii_lowercase())
            .copied()
            .or_else(|| file_hosts.iter().position(|h| same_host(&h.name, &e.name)));
        let Some(idx) = idx else {
            let mut avail: Vec<&str> = file_hosts.iter().take(8).map(|h| h.name.as_str()).collect();
            if file_hosts.len() > 8 {
                avail.push("...");
            }
            return Err(HostError::NotInHostfile {
                host: e.name,
                path: path.to_path_buf(),
                available: avail.join(", "),
            });
        };
        let slot = &mut chosen[idx];
        *slot = Some(match (*slot, explicit) {
            (Some(Some(a)), true) => Some(a.saturating_add(e.slots)),
            (Some(prev), false) => prev,
            (None, true) | (Some(None), true) => Some(e.slots),
            (None, false) => None,
        });
        if e.user.is_some() {
            users[idx] = e.user;
        }
    }
    let mut hosts = Vec::new();
    for (i, mut h) in file_hosts.into_iter().enumerate() {
        let Some(explicit) = chosen[i] else { continue };
        if let Some(n) = explicit {
            if let Some(max) = h.max_slots {
                if n > max {
                    return Err(HostError::HostArgExceedsMaxSlots {
                        host: h.name,
                        slots: n,
                        max_slots: max,
                        path: path.to_path_buf(),
                    });
                }
            }
            h.slots = n.min(MAX_SLOTS);
        }
        if let Some(u) = users[i].take() {
            h.user = Some(u);
        }
        hosts.push(h);
    }
    let mut src = HostSource::new(hosts, SourceKind::HostfileSubset(path.to_path_buf()));
    src.family = family;
    src.notes.extend(note);
    Ok(src)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEFAULT_HOSTFILE: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/hostfiles/openmpi-default-hostfile"
    );

    pub(in crate::host_source) fn names_slots(h: &[HostEntry]) -> Vec<(String, usize)> {
        h.iter().map(|e| (e.name.clone(), e.slots)).collect()
    }

    pub(in crate::host_source) fn ns(v: &[(&str, usize)]) -> Vec<(String, usize)> {
        v.iter().map(|(n, s)| (n.to_string(), *s)).collect()
    }

    pub(in crate::host_source) fn no_env(_: &str) -> Option<String> {
        None
    }

    pub(in crate::host_source) fn env_of(
        pairs: &'static [(&'static str, &'static str)],
    ) -> impl Fn(&str) -> Option<String> {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    fn tmpfile(tag: &str, text: &str) -> PathBuf {
        let p =
            std::env::temp_dir().join(format!("railrun-hosts-test-{}-{tag}", std::process::id()));
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn openmpi_default_hostfile_has_no_hosts() {
        let hosts = parse_hostfile(Path::new(DEFAULT_HOSTFILE)).unwrap();
        assert!(hosts.is_empty());
        // ... but naming it explicitly as the only host source is an error.
        let e = resolve_hosts(Some(Path::new(DEFAULT_HOSTFILE)), None, &no_env).unwrap_err();
        assert!(matches!(e, HostError::EmptyHostfile { .. }), "{e}");
    }

    #[test]
    fn precedence() {
        let slurm = env_of(&[
            ("SLURM_JOB_NODELIST", "s[1-2]"),
            ("SLURM_TASKS_PER_NODE", "4(x2)"),
        ]);
        let hf = tmpfile("prec", "a slots=2\nb slots=2 max_slots=3\nc slots=4\n");

        // Hostfile alone beats Slurm.
        let s = resolve_hosts(Some(&hf), None, &slurm).unwrap();
        assert_eq!(s.kind, SourceKind::Hostfile(hf.clone()));
        assert_eq!(names_slots(&s.hosts), ns(&[("a", 2), ("b", 2), ("c", 4)]));
        assert!(!s.is_implicit());

        // -H alone beats Slurm.
        let s = resolve_hosts(None, Some("x,y:2"), &slurm).unwrap();
        assert_eq!(s.kind, SourceKind::HostArg);
        assert_eq!(names_slots(&s.hosts), ns(&[("x", 1), ("y", 2)]));

        // -H with a hostfile selects a subset, hostfile order and slots.
        let s = resolve_hosts(Some(&hf), Some("c,a"), &slurm).unwrap();
        assert_eq!(s.kind, SourceKind::HostfileSubset(hf.clone()));
        assert_eq!(names_slots(&s.hosts), ns(&[("a", 2), ("c", 4)]));
        // ... -H host:N overrides the slots, within max_slots.
        let s = resolve_hosts(Some(&hf), Some("b:3,u@c:1"), &no_env).unwrap();
        assert_eq!(names_slots(&s.hosts), ns(&[("b", 3), ("c", 1)]));
        assert_eq!(s.hosts[1].user.as_deref(), Some("u"));
        let e = resolve_hosts(Some(&hf), Some("b:4"), &no_env).unwrap_err();
        assert!(matches!(e, HostError::HostArgExceedsMaxSlots { .. }), "{e}");
        // ... and a host not in the file fails.
        let e = resolve_hosts(Some(&hf), Some("a,zzz"), &no_env).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, HostError::NotInHostfile { .. }), "{msg}");
        assert!(msg.contains("zzz") && msg.contains("a, b, c"), "{msg}");

        // Slurm when nothing else.
        let s = resolve_hosts(None, None, &slurm).unwrap();
        assert_eq!(s.kind, SourceKind::Slurm);
        assert_eq!(names_slots(&s.hosts), ns(&[("s1", 4), ("s2", 4)]));

        // Nothing at all: implicit localhost with the CPU count.
        let s = resolve_hosts(None, None, &no_env).unwrap();
        assert!(s.is_implicit());
        assert_eq!(
            names_slots(&s.hosts),
            ns(&[("localhost", local_cpu_count())])
        );

        // Errors in the hostfile surface with file:line.
        let bad = tmpfile("bad", "a\nb slots=-1\n");
        let e = resolve_hosts(Some(&bad), None, &no_env)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with(&format!("{}:2: ", bad.display())), "{e}");
        let _ = std::fs::remove_file(hf);
        let _ = std::fs::remove_file(bad);
    }

    #[test]
    fn caret_items_of_host_exclude() {
        let hf = tmpfile("excl", "a slots=2\nb slots=2\nc slots=1\n");
        let slurm = env_of(&[
            ("SLURM_JOB_NODELIST", "s[1-3]"),
            ("SLURM_TASKS_PER_NODE", "2(x3)"),
        ]);
        // From the hostfile.
        let s = resolve_hosts(Some(&hf), Some("^b"), &no_env).unwrap();
        assert_eq!(names_slots(&s.hosts), ns(&[("a", 2), ("c", 1)]));
        assert_eq!(s.lines, [(0, 2), (1, 1)]);
        // With a subset.
        let s = resolve_hosts(Some(&hf), Some("a,b,^b"), &no_env).unwrap();
        assert_eq!(names_slots(&s.hosts), ns(&[("a", 2)]));
        // From the Slurm allocation.
        let s = resolve_hosts(None, Some("^s2"), &slurm).unwrap();
        assert_eq!(names_slots(&s.hosts), ns(&[("s1", 2), ("s3", 2)]));
        // Nothing to exclude from; unknown host; everything excluded.
        let e = resolve_hosts(None, Some("^x"), &no_env).unwrap_err();
        assert!(matches!(e, HostError::ExcludeFromNothing { .. }), "{e}");
        let e = resolve_hosts(Some(&hf), Some("^zz"), &no_env).unwrap_err();
        assert!(
            e.to_string().contains("^zz") && e.to_string().contains("a, b, c"),
            "{e}"
        );
        let e = resolve_hosts(None, Some("x,^x"), &no_env).unwrap_err();
        assert!(e.to_string().contains("every host excluded"), "{e}");
        let _ = std::fs::remove_file(hf);
    }

    #[test]
    fn openmpi_bare_lines_count_cores_and_say_so() {
        let hf = tmpfile("bare", "n1\nn2 slots=1\n");
        let rules = HostfileRules {
            openmpi_bare_slots: 6,
            hint: None,
        };
        let s = resolve_hosts_with(Some(&hf), None, &no_env, &rules).unwrap();
        assert_eq!(names_slots(&s.hosts), ns(&[("n1", 6), ("n2", 1)]));
        assert_eq!(s.notes.len(), 1);
        assert!(
            s.notes[0].contains(":1: 1 line(s) without slots=: 6 slot(s) each"),
            "{:?}",
            s.notes
        );
        // A Hydra file says nothing (its syntax shows its rule).
        let hf2 = tmpfile("hyd", "n1\nn2:2\n");
        let s = resolve_hosts_with(Some(&hf2), None, &no_env, &rules).unwrap();
        assert_eq!(s.family, Family::Hydra);
        assert!(s.notes.is_empty(), "{:?}", s.notes);
        let _ = std::fs::remove_file(hf);
        let _ = std::fs::remove_file(hf2);
    }

    #[test]
    fn nolocal_leaves_out_this_machine() {
        let s = HostSource::new(
            parse_host_arg("localhost:2,nodeB:2").unwrap(),
            SourceKind::HostArg,
        );
        let s = s.without_local(is_local).unwrap();
        assert_eq!(names_slots(&s.hosts), ns(&[("nodeB", 2)]));
        assert_eq!(s.lines, [(0, 2)]);
        let only = HostSource::new(parse_host_arg("localhost").unwrap(), SourceKind::HostArg);
        assert!(only
            .without_local(is_local)
            .unwrap_err()
            .to_string()
            .contains("--nolocal"));
        let e = HostSource::implicit_localhost(2)
            .without_local(is_local)
            .unwrap_err();
        assert!(e.to_string().contains("give --hostfile or -H"), "{e}");
    }

    #[test]
    fn locality() {
        assert!(is_local("localhost"));
        assert!(is_local("LOCALHOST"));
        assert!(is_local("127.0.0.1"));
        assert!(!is_local("definitely-not-this-host.example"));
        let hn = nix::unistd::gethostname().unwrap();
        let hn = hn.to_str().unwrap();
        assert!(is_local(hn));
        assert!(is_local(hn.split('.').next().unwrap()));
    }
}

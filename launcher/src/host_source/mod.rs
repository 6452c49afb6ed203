//! Host sources for railrun: Open MPI and Hydra hostfiles, `-H/--host`,
//! the Slurm allocation (`SLURM_JOB_NODELIST` + `SLURM_TASKS_PER_NODE`), and
//! the implicit localhost fallback.
//!
//! Hostfile syntax (detected per line, both may be mixed in one file):
//!
//! * Open MPI: `[user@]host [slots=N] [max_slots=M] [user=NAME]`
//!   (also `slots = N`, `count=`/`cpu=` for slots, `max-slots=`,
//!   `slots_max=`, `slots-max=`, `username=`); no `slots=` means 1 slot, or
//!   `max_slots` when only that is given (as Open MPI does).
//! * Hydra: `[user@]host:N` (no `:N` means 1 slot).
//! * `#` starts a comment anywhere on a line; blank lines are ignored.
//! * A host named on several lines gets the sum of their slots (Open MPI);
//!   its `max_slots` is the sum too, or unlimited if any line left it out.
//!
//! Nothing read from a file or the environment can panic or allocate without
//! bound: files are capped at [`MAX_HOSTFILE_BYTES`], lines at
//! [`MAX_LINE_LEN`], hosts at [`MAX_HOSTS`] and slots at [`MAX_SLOTS`].

use std::collections::HashMap;
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

use railring::hostlist;
use serde::Serialize;

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
}

impl HostSource {
    pub fn new(hosts: Vec<HostEntry>, kind: SourceKind) -> Self {
        HostSource { hosts, kind }
    }

    /// The implicit localhost source with `slots` slots.
    pub fn implicit_localhost(slots: usize) -> Self {
        HostSource {
            hosts: vec![HostEntry::new("localhost", slots.max(1))],
            kind: SourceKind::ImplicitLocalhost,
        }
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

fn valid_hostname(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_HOSTNAME_LEN
        && s.bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_'))
}

fn valid_user(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_'))
}

/// A problem inside one line or `-H` item: (found, expected).
type Problem = (String, String);

fn problem(found: impl Into<String>, expected: impl Into<String>) -> Problem {
    (found.into(), expected.into())
}

/// Parse a positive count no larger than [`MAX_SLOTS`].
fn parse_count(what: &str, s: &str) -> Result<usize, Problem> {
    let expected = format!("a positive whole number of at most {MAX_SLOTS} for {what}");
    if s.is_empty() {
        return Err(problem(format!("no value for {what}"), expected));
    }
    if !s.bytes().all(|c| c.is_ascii_digit()) {
        return Err(problem(format!("{what} value `{}`", preview(s)), expected));
    }
    match s.parse::<usize>() {
        Ok(0) => Err(problem(format!("{what}=0"), expected)),
        Ok(v) if v <= MAX_SLOTS => Ok(v),
        _ => Err(problem(
            format!("{what} value `{}` too large", preview(s)),
            expected,
        )),
    }
}

/// Parse `[user@]host` into (user, host).
fn parse_user_host(s: &str) -> Result<(Option<String>, String), Problem> {
    let (user, host) = match s.split_once('@') {
        Some((u, h)) => {
            if !valid_user(u) {
                return Err(problem(
                    format!("user name `{}`", preview(u)),
                    "a user name of letters, digits, `-`, `_` or `.` before `@`",
                ));
            }
            (Some(u.to_string()), h)
        }
        None => (None, s),
    };
    if !valid_hostname(host) {
        let found = if host.is_empty() {
            "an empty host name".to_string()
        } else {
            format!("host name `{}`", preview(host))
        };
        return Err(problem(
            found,
            format!(
                "a host name of letters, digits, `-`, `_` or `.` (at most {MAX_HOSTNAME_LEN} bytes)"
            ),
        ));
    }
    Ok((user, host.to_string()))
}

/// Parse `[user@]host[:N]`; the bool says whether `:N` was given.
fn parse_hydra_item(s: &str) -> Result<(HostEntry, bool), Problem> {
    let (spec, count) = match s.rsplit_once(':') {
        Some((h, n)) => (h, Some(n)),
        None => (s, None),
    };
    let (user, name) = parse_user_host(spec)?;
    let slots = match count {
        Some(n) => parse_count("the slot count after `:`", n)?,
        None => 1,
    };
    Ok((
        HostEntry {
            name,
            user,
            slots,
            max_slots: None,
            origin: None,
        },
        count.is_some(),
    ))
}

/// Remove whitespace around `=` so `slots = 4` reads as `slots=4`.
fn join_equals(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut pending_ws = false;
    for c in s.chars() {
        if c.is_whitespace() {
            pending_ws = true;
            continue;
        }
        if pending_ws && c != '=' && !out.ends_with('=') && !out.is_empty() {
            out.push(' ');
        }
        pending_ws = false;
        out.push(c);
    }
    out
}

/// Parse one comment-stripped, non-blank hostfile line.
fn parse_line(line: &str) -> Result<HostEntry, Problem> {
    let norm = join_equals(line);
    let mut toks = norm.split(' ');
    let first = toks.next().unwrap_or("");
    if first.starts_with('=') || first.contains('=') {
        return Err(problem(
            format!("`{}` where the host name should be", preview(first)),
            "a line `host [slots=N] [max_slots=M]` or `host:N`",
        ));
    }
    if first.contains(':') {
        // Hydra `host:N`; nothing may follow.
        let (entry, _) = parse_hydra_item(first)?;
        if let Some(extra) = toks.next() {
            return Err(problem(
                format!("`{}` after Hydra-style `{first}`", preview(extra)),
                "end of line (use either `host:N` or `host slots=N`, not both)",
            ));
        }
        return Ok(entry);
    }
    let (mut user, name) = parse_user_host(first)?;
    let mut slots: Option<usize> = None;
    let mut max_slots: Option<usize> = None;
    for tok in toks {
        let Some((key, value)) = tok.split_once('=') else {
            return Err(problem(
                format!("`{}` after the host name", preview(tok)),
                "`slots=N`, `max_slots=M` or `user=NAME` (one host per line)",
            ));
        };
        let canon = key.to_ascii_lowercase();
        match canon.as_str() {
            "slots" | "count" | "cpu" => {
                if slots.is_some() {
                    return Err(problem("`slots` given twice", "at most one `slots=N`"));
                }
                slots = Some(parse_count("slots", value)?);
            }
            "max_slots" | "max-slots" | "slots_max" | "slots-max" => {
                if max_slots.is_some() {
                    return Err(problem(
                        "`max_slots` given twice",
                        "at most one `max_slots=M`",
                    ));
                }
                max_slots = Some(parse_count("max_slots", value)?);
            }
            "user" | "username" | "user_name" => {
                if !valid_user(value) {
                    return Err(problem(
                        format!("user name `{}`", preview(value)),
                        "a user name of letters, digits, `-`, `_` or `.`",
                    ));
                }
                if let Some(u) = &user {
                    if u != value {
                        return Err(problem(
                            format!("user `{value}` but the host is written `{u}@{name}`"),
                            "one user per host",
                        ));
                    }
                }
                user = Some(value.to_string());
            }
            _ => {
                return Err(problem(
                    format!("unknown attribute `{}`", preview(key)),
                    "`slots=N`, `max_slots=M` or `user=NAME`",
                ))
            }
        }
    }
    // Open MPI: max_slots alone sets slots to max_slots.
    let slots = slots.or(max_slots).unwrap_or(1);
    if let Some(m) = max_slots {
        if m < slots {
            return Err(problem(
                format!("max_slots={m} below slots={slots}"),
                "max_slots >= slots",
            ));
        }
    }
    Ok(HostEntry {
        name,
        user,
        slots,
        max_slots,
        origin: None,
    })
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

/// Parse hostfile text; `name` is used in error messages and origins.
/// Returns hosts in order of first appearance, repeats merged.
pub fn parse_hostfile_str(text: &str, name: &str) -> Result<Vec<HostEntry>, HostError> {
    parse_hostfile_bytes(text.as_bytes(), name)
}

fn parse_hostfile_bytes(bytes: &[u8], name: &str) -> Result<Vec<HostEntry>, HostError> {
    let mut m = Merger::new();
    let err = |line: usize, (found, expected): Problem| HostError::Syntax {
        file: name.to_string(),
        line,
        found,
        expected,
    };
    for (i, raw) in bytes.split(|&c| c == b'\n').enumerate() {
        let lineno = i + 1;
        if raw.len() > MAX_LINE_LEN {
            return Err(err(
                lineno,
                problem(
                    format!("a line of {} bytes", raw.len()),
                    format!("lines of at most {MAX_LINE_LEN} bytes"),
                ),
            ));
        }
        let line = std::str::from_utf8(raw).map_err(|_| {
            err(
                lineno,
                problem("bytes that are not UTF-8", "a UTF-8 text line"),
            )
        })?;
        let line = match line.find('#') {
            Some(p) => &line[..p],
            None => line,
        };
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let mut entry = parse_line(line).map_err(|p| err(lineno, p))?;
        entry.origin = Some((PathBuf::from(name), lineno));
        m.add(entry).map_err(|p| err(lineno, p))?;
    }
    Ok(m.hosts)
}

/// Read and parse a hostfile (Open MPI and Hydra syntax, auto-detected per
/// line). A file with only comments gives `Ok(vec![])`.
pub fn parse_hostfile(path: &Path) -> Result<Vec<HostEntry>, HostError> {
    let f = std::fs::File::open(path).map_err(|source| HostError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let mut buf = Vec::new();
    f.take(MAX_HOSTFILE_BYTES + 1)
        .read_to_end(&mut buf)
        .map_err(|source| HostError::Io {
            path: path.to_path_buf(),
            source,
        })?;
    if buf.len() as u64 > MAX_HOSTFILE_BYTES {
        return Err(HostError::FileTooLarge {
            path: path.to_path_buf(),
            limit: MAX_HOSTFILE_BYTES,
        });
    }
    parse_hostfile_bytes(&buf, &path.display().to_string())
}

/// Parse the items of `-H/--host`, keeping whether each gave `:N`.
fn parse_host_arg_items(arg: &str) -> Result<Vec<(HostEntry, bool)>, HostError> {
    if arg.len() > MAX_HOSTFILE_BYTES as usize {
        return Err(HostError::HostArg {
            item: preview(arg),
            found: format!("{} bytes", arg.len()),
            expected: "a shorter host list".into(),
        });
    }
    let mut out = Vec::new();
    for item in arg.split(',') {
        let t = item.trim();
        if t.is_empty() {
            return Err(HostError::HostArg {
                item: preview(arg),
                found: "an empty entry".into(),
                expected: "a comma-separated list like `a,b:2,user@c:3`".into(),
            });
        }
        if out.len() >= MAX_HOSTS {
            return Err(HostError::HostArg {
                item: preview(t),
                found: format!("more than {MAX_HOSTS} entries"),
                expected: format!("at most {MAX_HOSTS} hosts"),
            });
        }
        let parsed = parse_hydra_item(t).map_err(|(found, expected)| HostError::HostArg {
            item: preview(t),
            found,
            expected,
        })?;
        out.push(parsed);
    }
    Ok(out)
}

/// Parse `-H/--host a,b:2,user@c:3`. A host without `:N` has 1 slot; a host
/// named more than once gets the sum (`-H a,a` = `-H a:2`).
pub fn parse_host_arg(arg: &str) -> Result<Vec<HostEntry>, HostError> {
    let mut m = Merger::new();
    for (e, _) in parse_host_arg_items(arg)? {
        let item = e.display_name();
        m.add(e).map_err(|(found, expected)| HostError::HostArg {
            item,
            found,
            expected,
        })?;
    }
    Ok(m.hosts)
}

/// Hosts of the Slurm allocation, from `SLURM_JOB_NODELIST` (or
/// `SLURM_NODELIST`) and `SLURM_TASKS_PER_NODE` (or
/// `SLURM_JOB_CPUS_PER_NODE`; 1 slot each when neither is set).
/// `Ok(None)` when no node list is set (not inside an allocation).
/// Nodes with a count of 0 are left out.
pub fn hosts_from_slurm_env(
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<Vec<HostEntry>>, HostError> {
    let (var, list) = match ["SLURM_JOB_NODELIST", "SLURM_NODELIST"]
        .into_iter()
        .find_map(|v| env(v).filter(|s| !s.trim().is_empty()).map(|s| (v, s)))
    {
        Some(x) => x,
        None => return Ok(None),
    };
    let names = hostlist::expand(&list).map_err(|source| HostError::Slurm {
        var,
        value: preview(&list),
        source,
    })?;
    if let Some(bad) = names.iter().find(|n| !valid_hostname(n)) {
        return Err(HostError::SlurmAllocation(format!(
            "{var} contains `{}`, expected host names of letters, digits, `-`, `_` or `.`",
            preview(bad)
        )));
    }
    let counts = match ["SLURM_TASKS_PER_NODE", "SLURM_JOB_CPUS_PER_NODE"]
        .into_iter()
        .find_map(|v| env(v).filter(|s| !s.trim().is_empty()).map(|s| (v, s)))
    {
        Some((cvar, s)) => {
            let c = hostlist::parse_tasks_per_node(&s).map_err(|source| HostError::Slurm {
                var: cvar,
                value: preview(&s),
                source,
            })?;
            if c.len() != names.len() {
                return Err(HostError::SlurmAllocation(format!(
                    "{var} lists {} nodes but {cvar}=`{}` gives {} counts; expected one count per node",
                    names.len(),
                    preview(&s),
                    c.len()
                )));
            }
            c
        }
        None => vec![1; names.len()],
    };
    let mut m = Merger::new();
    for (name, slots) in names.into_iter().zip(counts) {
        if slots == 0 {
            continue;
        }
        let slots = slots.min(MAX_SLOTS);
        m.add(HostEntry::new(name, slots))
            .map_err(|(found, expected)| {
                HostError::SlurmAllocation(format!("{found}; expected {expected}"))
            })?;
    }
    if m.hosts.is_empty() {
        return Err(HostError::SlurmAllocation(format!(
            "{var}=`{}` gives no node with a task count above 0",
            preview(&list)
        )));
    }
    Ok(Some(m.hosts))
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
pub fn resolve_hosts(
    hostfile: Option<&Path>,
    host_arg: Option<&str>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<HostSource, HostError> {
    match (hostfile, host_arg) {
        (Some(path), Some(arg)) => {
            let file_hosts = parse_hostfile(path)?;
            if file_hosts.is_empty() {
                return Err(HostError::EmptyHostfile {
                    path: path.to_path_buf(),
                });
            }
            let items = parse_host_arg_items(arg)?;
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
                    let mut avail: Vec<&str> =
                        file_hosts.iter().take(8).map(|h| h.name.as_str()).collect();
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
            Ok(HostSource::new(
                hosts,
                SourceKind::HostfileSubset(path.to_path_buf()),
            ))
        }
        (None, Some(arg)) => Ok(HostSource::new(parse_host_arg(arg)?, SourceKind::HostArg)),
        (Some(path), None) => {
            let hosts = parse_hostfile(path)?;
            if hosts.is_empty() {
                return Err(HostError::EmptyHostfile {
                    path: path.to_path_buf(),
                });
            }
            Ok(HostSource::new(
                hosts,
                SourceKind::Hostfile(path.to_path_buf()),
            ))
        }
        (None, None) => match hosts_from_slurm_env(env)? {
            Some(hosts) => Ok(HostSource::new(hosts, SourceKind::Slurm)),
            None => Ok(HostSource::implicit_localhost(local_cpu_count())),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEFAULT_HOSTFILE: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/hostfiles/openmpi-default-hostfile"
    );
    const EXAMPLE_OMPI: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../hostfiles/two-nodes");
    const EXAMPLE_HYDRA: &str =
        concat!(env!("CARGO_MANIFEST_DIR"), "/../hostfiles/two-nodes.hydra");

    fn parse(text: &str) -> Vec<HostEntry> {
        parse_hostfile_str(text, "hf").unwrap_or_else(|e| panic!("{e}"))
    }

    fn names_slots(h: &[HostEntry]) -> Vec<(String, usize)> {
        h.iter().map(|e| (e.name.clone(), e.slots)).collect()
    }

    fn ns(v: &[(&str, usize)]) -> Vec<(String, usize)> {
        v.iter().map(|(n, s)| (n.to_string(), *s)).collect()
    }

    fn syntax_err(text: &str) -> (usize, String) {
        match parse_hostfile_str(text, "hf") {
            Err(e @ HostError::Syntax { line, .. }) => (line, e.to_string()),
            other => panic!("{text:?}: expected a syntax error, got {other:?}"),
        }
    }

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
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
    fn example_hostfiles_parse() {
        let a = parse_hostfile(Path::new(EXAMPLE_OMPI)).unwrap();
        let b = parse_hostfile(Path::new(EXAMPLE_HYDRA)).unwrap();
        assert_eq!(a.len(), 2);
        assert_eq!(names_slots(&a), names_slots(&b));
        assert_eq!(a[0].origin.as_ref().unwrap().0, PathBuf::from(EXAMPLE_OMPI));
    }

    #[test]
    fn openmpi_syntax() {
        let h = parse(
            "# cluster\n\
             \n\
             node1 slots=2 max_slots=4   # trailing comment\n\
             alice@node2 slots=8\n\
             node3\n\
             \tnode4   slots = 3  max-slots = 3\r\n\
             node5 max_slots=6\n\
             node6 slots=1 user=bob\n",
        );
        assert_eq!(
            names_slots(&h),
            ns(&[
                ("node1", 2),
                ("node2", 8),
                ("node3", 1),
                ("node4", 3),
                ("node5", 6),
                ("node6", 1)
            ])
        );
        assert_eq!(h[0].max_slots, Some(4));
        assert_eq!(h[0].origin, Some((PathBuf::from("hf"), 3)));
        assert_eq!(h[1].user.as_deref(), Some("alice"));
        assert_eq!(h[1].max_slots, None);
        assert_eq!(h[3].max_slots, Some(3));
        assert_eq!(h[4].max_slots, Some(6));
        assert_eq!(h[5].user.as_deref(), Some("bob"));
    }

    #[test]
    fn hydra_syntax_and_mixed() {
        let h = parse("a:4\nbob@b:2 # two\nc\nd slots=3\n");
        assert_eq!(
            names_slots(&h),
            ns(&[("a", 4), ("b", 2), ("c", 1), ("d", 3)])
        );
        assert_eq!(h[1].user.as_deref(), Some("bob"));
    }

    #[test]
    fn repeated_names_add_up() {
        let h = parse("a slots=2\nb\na slots=3\nb:2\n");
        assert_eq!(names_slots(&h), ns(&[("a", 5), ("b", 3)]));
        assert_eq!(h[0].origin, Some((PathBuf::from("hf"), 1)));
        let h = parse("a slots=2 max_slots=2\na slots=1 max_slots=3\n");
        assert_eq!((h[0].slots, h[0].max_slots), (3, Some(5)));
        let h = parse("a slots=2 max_slots=2\na slots=1\n");
        assert_eq!((h[0].slots, h[0].max_slots), (3, None));
        let (line, e) = syntax_err("u@a\nv@a\n");
        assert_eq!(line, 2, "{e}");
    }

    #[test]
    fn syntax_errors_name_file_line_and_expectation() {
        let (line, e) = syntax_err("a slots=2\n\nb slots=x\n");
        assert_eq!(line, 3);
        assert!(e.starts_with("hf:3: "), "{e}");
        assert!(
            e.contains("slots value `x`") && e.contains("expected a positive"),
            "{e}"
        );

        let (line, e) = syntax_err("# c\na slots=4 max_slots=2\n");
        assert_eq!(line, 2);
        assert!(e.contains("max_slots=2 below slots=4"), "{e}");

        for (text, needle) in [
            ("a slots=0", "slots=0"),
            ("a slots=", "no value for slots"),
            ("a b", "`b` after the host name"),
            ("a foo=1", "unknown attribute `foo`"),
            ("a slots=1 slots=2", "given twice"),
            ("a:x", "slot count"),
            ("a:", "no value"),
            ("a:2 slots=3", "after Hydra-style"),
            ("a!b", "host name `a!b`"),
            ("@a", "user name"),
            ("slots=2", "where the host name should be"),
            ("a slots=99999999999999999999999", "too large"),
            ("a slots=1000001", "too large"),
            ("fe80::1", "host name"),
            ("u@a user=v", "one user per host"),
        ] {
            let (line, e) = syntax_err(text);
            assert_eq!(line, 1);
            assert!(e.contains(needle), "{text:?}: {e}");
            assert!(e.contains("expected"), "{text:?}: {e}");
        }
    }

    #[test]
    fn hostile_input_is_bounded() {
        let long = format!("a slots=1 {}\n", "x".repeat(MAX_LINE_LEN));
        let (_, e) = syntax_err(&long);
        assert!(e.contains("bytes"), "{e}");
        let bin = parse_hostfile_bytes(b"a\n\xff\xfe\n", "bin").unwrap_err();
        assert!(bin.to_string().starts_with("bin:2: "), "{bin}");
        // Repeats cannot push slots past the cap.
        let text = "a slots=1000000\na slots=1\n";
        let (line, e) = syntax_err(text);
        assert_eq!(line, 2, "{e}");
        let missing = parse_hostfile(Path::new("/nonexistent/railrun-hostfile")).unwrap_err();
        assert!(matches!(missing, HostError::Io { .. }));
        assert!(missing
            .to_string()
            .contains("/nonexistent/railrun-hostfile"));
    }

    #[test]
    fn host_arg() {
        let h = parse_host_arg("a,b:2,c:3").unwrap();
        assert_eq!(names_slots(&h), ns(&[("a", 1), ("b", 2), ("c", 3)]));
        let h = parse_host_arg("a,a,u@b:2").unwrap();
        assert_eq!(names_slots(&h), ns(&[("a", 2), ("b", 2)]));
        assert_eq!(h[1].user.as_deref(), Some("u"));
        for bad in ["", "a,,b", "a:0", "a:x", "a b", "a,"] {
            let e = parse_host_arg(bad).unwrap_err();
            assert!(matches!(e, HostError::HostArg { .. }), "{bad:?}: {e}");
            assert!(e.to_string().contains("expected"), "{e}");
        }
    }

    #[test]
    fn slurm_env() {
        let env = env_of(&[
            ("SLURM_JOB_NODELIST", "rack[1-2]-node[01-02],login1"),
            ("SLURM_TASKS_PER_NODE", "2(x4),1"),
        ]);
        let h = hosts_from_slurm_env(&env).unwrap().unwrap();
        assert_eq!(
            names_slots(&h),
            ns(&[
                ("rack1-node01", 2),
                ("rack1-node02", 2),
                ("rack2-node01", 2),
                ("rack2-node02", 2),
                ("login1", 1)
            ])
        );
        let env = env_of(&[
            ("SLURM_JOB_NODELIST", "n[1-3],x"),
            ("SLURM_TASKS_PER_NODE", "2(x3),1"),
        ]);
        let h = hosts_from_slurm_env(&env).unwrap().unwrap();
        assert_eq!(
            names_slots(&h),
            ns(&[("n1", 2), ("n2", 2), ("n3", 2), ("x", 1)])
        );
        // SLURM_NODELIST and SLURM_JOB_CPUS_PER_NODE fallbacks.
        let env = env_of(&[
            ("SLURM_NODELIST", "n[01-02]"),
            ("SLURM_JOB_CPUS_PER_NODE", "36(x2)"),
        ]);
        let h = hosts_from_slurm_env(&env).unwrap().unwrap();
        assert_eq!(names_slots(&h), ns(&[("n01", 36), ("n02", 36)]));
        // No counts at all: one slot per node.
        let env = env_of(&[("SLURM_JOB_NODELIST", "n[1-2]")]);
        let h = hosts_from_slurm_env(&env).unwrap().unwrap();
        assert_eq!(names_slots(&h), ns(&[("n1", 1), ("n2", 1)]));
        // Not in an allocation.
        assert!(hosts_from_slurm_env(&no_env).unwrap().is_none());
    }

    #[test]
    fn slurm_env_errors() {
        let env = env_of(&[
            ("SLURM_JOB_NODELIST", "n[1-3"),
            ("SLURM_TASKS_PER_NODE", "1"),
        ]);
        let e = hosts_from_slurm_env(&env).unwrap_err().to_string();
        assert!(e.starts_with("SLURM_JOB_NODELIST=`n[1-3`: "), "{e}");
        let env = env_of(&[
            ("SLURM_JOB_NODELIST", "n[1-3]"),
            ("SLURM_TASKS_PER_NODE", "2(x2)"),
        ]);
        let e = hosts_from_slurm_env(&env).unwrap_err().to_string();
        assert!(e.contains("3 nodes") && e.contains("2 counts"), "{e}");
        let env = env_of(&[
            ("SLURM_JOB_NODELIST", "n[1-3]"),
            ("SLURM_TASKS_PER_NODE", "2(x"),
        ]);
        let e = hosts_from_slurm_env(&env).unwrap_err().to_string();
        assert!(e.starts_with("SLURM_TASKS_PER_NODE="), "{e}");
        let env = env_of(&[("SLURM_JOB_NODELIST", "n[1-100000000]")]);
        assert!(hosts_from_slurm_env(&env).is_err());
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

//! The hostfile and `-H/--host` grammars.
//!
//! Hostfile syntax (detected per line, both may be mixed in one file):
//!
//! * Open MPI: `[user@]host [slots=N] [max_slots=M] [user=NAME]`
//!   (also `slots = N`, `count=`/`cpu=` for slots, `max-slots=`,
//!   `slots_max=`, `slots-max=`, `username=`); `max_slots` alone sets the slots too.
//! * Hydra: `[user@]host:N`.
//! * `^host` (Open MPI): leave `host` out, although another line lists it.
//! * `#` starts a comment anywhere on a line; blank lines are ignored.
//! * A host named on several lines gets the sum of their slots (Open MPI);
//!   its `max_slots` is the sum too, or unlimited if any line left it out.
//!
//! Where the families disagree — a line that gives no count — the file follows the family its
//! syntax shows ([`Family`]): the first line written in one family's syntax decides; a file of
//! bare host names follows the command line's hint (Hydra-only options), else Open MPI. An
//! Open MPI line without a count has as many slots as the host has cores (Open MPI 4 and 5;
//! railrun counts this machine's cores, see [`HostfileRules`]); a Hydra line without a count
//! takes one rank per pass (1 slot), and Hydra cycles over the lines ([`Hostfile::lines`]).
//!
//! `-H a,b:2,user@c:3` items are Hydra items; a host named twice gets the sum.

use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{
    preview, problem, valid_hostname, HostEntry, HostError, Merger, Problem, MAX_HOSTFILE_BYTES,
    MAX_HOSTNAME_LEN, MAX_HOSTS, MAX_LINE_LEN, MAX_SLOTS,
};

fn valid_user(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with('-')
        && s.len() <= 64
        && s.bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_'))
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
                    "a user name of letters, digits, `-`, `_` or `.` (not starting with `-`) before `@`",
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
                "a host name of letters, digits, `-`, `_` or `.`, not starting with `-` (at most {MAX_HOSTNAME_LEN} bytes)"
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

/// Which MPI family's rules a hostfile follows where the two disagree (lines without a count,
/// and how ranks go round the hosts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// `host slots=N`: a line without a count has the host's cores as slots; by-slot filling.
    #[default]
    OpenMpi,
    /// `host:N`: a line without a count takes one rank per pass; ranks cycle over the lines.
    Hydra,
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Family::OpenMpi => "Open MPI",
            Family::Hydra => "Hydra",
        })
    }
}

/// How to read the lines of a hostfile that give no count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostfileRules {
    /// Slots of an Open MPI line without `slots=`. Open MPI counts each host's cores; railrun
    /// cannot ask a host before it starts, so it counts this machine's cores.
    pub openmpi_bare_slots: usize,
    /// The family of a file whose syntax shows none (bare host names only): Hydra when the
    /// command line uses Hydra-only options, else `None` (Open MPI).
    pub hint: Option<Family>,
}

impl Default for HostfileRules {
    fn default() -> Self {
        HostfileRules {
            openmpi_bare_slots: 1,
            hint: None,
        }
    }
}

/// A parsed hostfile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hostfile {
    /// Hosts in order of first appearance, repeats merged (slots summed).
    pub hosts: Vec<HostEntry>,
    /// Every host line in file order: (index into `hosts`, its count).
    pub lines: Vec<(usize, usize)>,
    pub family: Family,
    /// Why the file follows `family` (for messages).
    pub family_reason: String,
    /// Whether a line's syntax decided the family (else the command line or the default did).
    pub family_from_syntax: bool,
    /// Line numbers of host lines that gave no count.
    pub bare_lines: Vec<usize>,
}

/// What a line's syntax shows.
struct Line {
    entry: HostEntry,
    /// The count it gave (`slots=`, `max_slots=` or `:N`).
    count: Option<usize>,
    /// The family its syntax shows, if any.
    syntax: Option<Family>,
}

/// Parse one comment-stripped, non-blank hostfile line.
fn parse_line(line: &str) -> Result<Line, Problem> {
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
        return Ok(Line {
            count: Some(entry.slots),
            entry,
            syntax: Some(Family::Hydra),
        });
    }
    let mut attrs = false;
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
        attrs = true;
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
                        "a user name of letters, digits, `-`, `_` or `.`, not starting with `-`",
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
    let count = slots.or(max_slots);
    if let (Some(m), Some(s)) = (max_slots, count) {
        if m < s {
            return Err(problem(
                format!("max_slots={m} below slots={s}"),
                "max_slots >= slots",
            ));
        }
    }
    Ok(Line {
        entry: HostEntry {
            name,
            user,
            slots: count.unwrap_or(1),
            max_slots,
            origin: None,
        },
        count,
        syntax: attrs.then_some(Family::OpenMpi),
    })
}

/// Parse hostfile text with the default rules (a line without a count has 1 slot); `name` is
/// used in error messages and origins. Returns hosts in order of first appearance, repeats
/// merged.
pub fn parse_hostfile_str(text: &str, name: &str) -> Result<Vec<HostEntry>, HostError> {
    Ok(parse_hostfile_bytes(text.as_bytes(), name, &HostfileRules::default())?.hosts)
}

/// Parse hostfile text under `rules` (see [`Family`]).
pub fn parse_hostfile_text(
    text: &str,
    name: &str,
    rules: &HostfileRules,
) -> Result<Hostfile, HostError> {
    parse_hostfile_bytes(text.as_bytes(), name, rules)
}

fn parse_hostfile_bytes(
    bytes: &[u8],
    name: &str,
    rules: &HostfileRules,
) -> Result<Hostfile, HostError> {
    let err = |line: usize, (found, expected): Problem| HostError::Syntax {
        file: name.to_string(),
        line,
        found,
        expected,
    };
    let mut lines: Vec<(usize, Line)> = Vec::new();
    let mut excluded: Vec<(usize, String)> = Vec::new();
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
        if let Some(rest) = line.strip_prefix('^') {
            let (_, host) = parse_user_host(rest.trim()).map_err(|p| err(lineno, p))?;
            excluded.push((lineno, host));
            continue;
        }
        if lines.len() >= MAX_HOSTS {
            return Err(err(
                lineno,
                problem(
                    format!("more than {MAX_HOSTS} host lines"),
                    format!("at most {MAX_HOSTS} lines"),
                ),
            ));
        }
        let mut l = parse_line(line).map_err(|p| err(lineno, p))?;
        l.entry.origin = Some((PathBuf::from(name), lineno));
        lines.push((lineno, l));
    }
    // The family: the first line whose syntax shows one; else the command line's hint.
    let shown = lines.iter().find_map(|(n, l)| l.syntax.map(|f| (*n, f)));
    let (family, family_reason) = match shown {
        Some((n, f)) => (
            f,
            format!(
                "{name}:{n} uses {f} syntax (`{}`)",
                if f == Family::Hydra {
                    "host:N"
                } else {
                    "host slots=N"
                }
            ),
        ),
        None => match rules.hint {
            Some(f) => (
                f,
                format!("{name} gives no counts and the command line uses {f} options"),
            ),
            None => (
                Family::OpenMpi,
                format!("{name} gives no counts: Open MPI's rules (railrun's default family)"),
            ),
        },
    };
    let bare_slots = match family {
        Family::OpenMpi => rules.openmpi_bare_slots.clamp(1, MAX_SLOTS),
        Family::Hydra => 1,
    };
    let mut m = Merger::new();
    let mut seq = Vec::with_capacity(lines.len());
    let mut bare_lines = Vec::new();
    for (lineno, mut l) in lines {
        if l.count.is_none() {
            l.entry.slots = bare_slots;
            bare_lines.push(lineno);
        }
        let count = l.entry.slots;
        let host = l.entry.name.clone();
        m.add(l.entry).map_err(|p| err(lineno, p))?;
        seq.push((m.index[&host], count));
    }
    let mut hf = Hostfile {
        hosts: m.hosts,
        lines: seq,
        family,
        family_reason,
        family_from_syntax: shown.is_some(),
        bare_lines,
    };
    for (lineno, host) in excluded {
        let Some(i) = hf
            .hosts
            .iter()
            .position(|h| h.name.eq_ignore_ascii_case(&host))
        else {
            return Err(err(
                lineno,
                problem(
                    format!("`^{host}` excludes a host no line lists"),
                    "`^host` naming a host of this file (or remove the line)",
                ),
            ));
        };
        hf.remove_host(i);
    }
    Ok(hf)
}

impl Hostfile {
    /// Leave host `i` out (an exclusion).
    pub fn remove_host(&mut self, i: usize) {
        self.hosts.remove(i);
        self.lines.retain(|&(h, _)| h != i);
        for l in &mut self.lines {
            if l.0 > i {
                l.0 -= 1;
            }
        }
    }
}

/// Read and parse a hostfile (Open MPI and Hydra syntax, auto-detected per
/// line) with the default rules. A file with only comments gives `Ok(vec![])`.
pub fn parse_hostfile(path: &Path) -> Result<Vec<HostEntry>, HostError> {
    Ok(read_hostfile(path, &HostfileRules::default())?.hosts)
}

/// Read and parse a hostfile under `rules` (see [`Family`]).
pub fn read_hostfile(path: &Path, rules: &HostfileRules) -> Result<Hostfile, HostError> {
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
    parse_hostfile_bytes(&buf, &path.display().to_string(), rules)
}

/// Parse the items of `-H/--host`, keeping whether each gave `:N`.
pub(super) fn parse_host_arg_items(arg: &str) -> Result<Vec<(HostEntry, bool)>, HostError> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host_source::tests::{names_slots, ns};

    const EXAMPLE_OMPI: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../hostfiles/two-nodes");
    const EXAMPLE_HYDRA: &str =
        concat!(env!("CARGO_MANIFEST_DIR"), "/../hostfiles/two-nodes.hydra");

    fn parse(text: &str) -> Vec<HostEntry> {
        parse_hostfile_str(text, "hf").unwrap_or_else(|e| panic!("{e}"))
    }

    fn syntax_err(text: &str) -> (usize, String) {
        match parse_hostfile_str(text, "hf") {
            Err(e @ HostError::Syntax { line, .. }) => (line, e.to_string()),
            other => panic!("{text:?}: expected a syntax error, got {other:?}"),
        }
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

    /// A name starting with `-` would reach ssh as an option (`-H -oProxyCommand=...`).
    #[test]
    fn names_starting_with_a_dash_are_refused() {
        for bad in [
            "-Gx\n",
            "a\n-oProxyCommand slots=2\n",
            "-o@n1\n",
            "n1 user=-F\n",
            "-x:2\n",
        ] {
            let (_, e) = syntax_err(bad);
            assert!(e.contains("not starting with `-`"), "{bad:?}: {e}");
        }
        syntax_err("-oProxyCommand=x\n");
        assert_eq!(
            names_slots(&parse("a-b\nn-1:2\n")),
            ns(&[("a-b", 1), ("n-1", 2)])
        );
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
        let bin =
            parse_hostfile_bytes(b"a\n\xff\xfe\n", "bin", &HostfileRules::default()).unwrap_err();
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

    fn rules(cores: usize, hint: Option<Family>) -> HostfileRules {
        HostfileRules {
            openmpi_bare_slots: cores,
            hint,
        }
    }

    #[test]
    fn lines_without_counts_follow_the_family_the_file_shows() {
        // Open MPI syntax anywhere: bare lines get the cores (Open MPI 4/5), the lines stay
        // in order for --map-by seq.
        let hf = parse_hostfile_text("a\nb slots=2\nc\n", "hf", &rules(8, None)).unwrap();
        assert_eq!(hf.family, Family::OpenMpi);
        assert!(hf.family_from_syntax);
        assert!(hf.family_reason.contains("hf:2"), "{}", hf.family_reason);
        assert_eq!(names_slots(&hf.hosts), ns(&[("a", 8), ("b", 2), ("c", 8)]));
        assert_eq!(hf.bare_lines, [1, 3]);
        assert_eq!(hf.lines, [(0, 8), (1, 2), (2, 8)]);
        // Hydra syntax: bare lines take 1 (one rank per pass); repeated hosts keep their lines.
        let hf = parse_hostfile_text("a:2\nb\na\n", "hf", &rules(8, None)).unwrap();
        assert_eq!(hf.family, Family::Hydra);
        assert_eq!(names_slots(&hf.hosts), ns(&[("a", 3), ("b", 1)]));
        assert_eq!(hf.lines, [(0, 2), (1, 1), (0, 1)]);
        // Only bare names: the command line's hint, else Open MPI.
        let hf = parse_hostfile_text("a\nb\n", "hf", &rules(4, Some(Family::Hydra))).unwrap();
        assert_eq!((hf.family, hf.family_from_syntax), (Family::Hydra, false));
        assert_eq!(names_slots(&hf.hosts), ns(&[("a", 1), ("b", 1)]));
        let hf = parse_hostfile_text("a\nb\n", "hf", &rules(4, None)).unwrap();
        assert_eq!(hf.family, Family::OpenMpi);
        assert_eq!(names_slots(&hf.hosts), ns(&[("a", 4), ("b", 4)]));
        // A user= attribute shows Open MPI syntax without giving a count.
        let hf = parse_hostfile_text("a user=bob\nb:3\n", "hf", &rules(6, None)).unwrap();
        assert_eq!(hf.family, Family::OpenMpi);
        assert_eq!(names_slots(&hf.hosts), ns(&[("a", 6), ("b", 3)]));
        // max_slots still bounds a bare Open MPI line's count? It gives the count itself.
        let hf = parse_hostfile_text("a max_slots=3\n", "hf", &rules(6, None)).unwrap();
        assert_eq!((hf.hosts[0].slots, hf.hosts[0].max_slots), (3, Some(3)));
    }

    #[test]
    fn a_host_listed_twice_sums_its_slots() {
        // Open MPI sums; the same rule for bare lines (cores each).
        let hf = parse_hostfile_text("a slots=2\nb\na\n", "hf", &rules(4, None)).unwrap();
        assert_eq!(names_slots(&hf.hosts), ns(&[("a", 6), ("b", 4)]));
    }

    #[test]
    fn caret_lines_exclude_hosts() {
        let hf =
            parse_hostfile_text("a slots=2\nb slots=2\nc\n^b\n", "hf", &rules(1, None)).unwrap();
        assert_eq!(names_slots(&hf.hosts), ns(&[("a", 2), ("c", 1)]));
        assert_eq!(hf.lines, [(0, 2), (1, 1)]);
        let (line, e) = match parse_hostfile_text("a\n^zz\n", "hf", &rules(1, None)) {
            Err(e @ HostError::Syntax { line, .. }) => (line, e.to_string()),
            other => panic!("{other:?}"),
        };
        assert_eq!(line, 2);
        assert!(e.contains("`^zz` excludes a host no line lists"), "{e}");
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
}

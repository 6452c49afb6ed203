//! The hostfile and `-H/--host` grammars.
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
//! `-H a,b:2,user@c:3` items are Hydra items; a host named twice gets the sum.

use std::io::Read;
use std::path::{Path, PathBuf};

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
}

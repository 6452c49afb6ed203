//! Slurm hostlist grammar: `SLURM_JOB_NODELIST`-style lists and
//! `SLURM_TASKS_PER_NODE`-style counts.
//!
//! Grammar accepted by [`expand`] (the one Slurm's `scontrol show hostnames`
//! understands):
//!
//! * top-level items separated by `,` (or whitespace): `a[1-2],b3 c`
//! * an item is literal text mixed with any number of bracket groups; each
//!   group is a comma-separated list of numbers and `lo-hi` ranges:
//!   `n[1,3-5]`, `rack[1-2]-node[01-03]`, `n[1-2]-ib`
//! * the width of `lo` sets zero padding: `n[08-10]` gives `n08 n09 n10`,
//!   `n[8-10]` gives `n8 n9 n10`
//! * several groups expand as a cartesian product, the leftmost group varying
//!   slowest (`r[1-2]n[1-2]` gives `r1n1 r1n2 r2n1 r2n2`)
//! * order and duplicates are kept as written
//!
//! Everything here is bounded: the input length, the number of names
//! ([`MAX_NAMES`]), the length of one name ([`MAX_NAME_LEN`]) and the total
//! size of the expansion ([`MAX_TOTAL_BYTES`]) are checked *before* anything
//! is allocated, so a hostile environment variable cannot make us panic or
//! allocate without limit.

use std::fmt::Write as _;

/// Most names one hostlist (or one tasks-per-node list) may expand to.
pub const MAX_NAMES: usize = 1_000_000;
/// Longest hostlist string accepted, in bytes.
pub const MAX_INPUT_LEN: usize = 1 << 20;
/// Longest single expanded host name, in bytes.
pub const MAX_NAME_LEN: usize = 255;
/// Most bytes all expanded names together may take.
pub const MAX_TOTAL_BYTES: usize = 64 << 20;
/// Most digits in one bracket number (keeps values inside `u64`).
pub const MAX_DIGITS: usize = 18;
/// Largest per-node count accepted by [`parse_tasks_per_node`].
pub const MAX_TASKS_PER_NODE: usize = 1_000_000;

/// Why a hostlist or tasks-per-node string was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostlistError {
    /// Malformed text; `pos` is the byte offset in the input.
    #[error("at byte {pos}: found {found}, expected {expected}")]
    Syntax {
        pos: usize,
        found: String,
        expected: &'static str,
    },
    /// A range whose low end is above its high end, e.g. `n[5-3]`.
    #[error("at byte {pos}: range `{lo}-{hi}` is reversed, expected lo <= hi")]
    ReversedRange { pos: usize, lo: String, hi: String },
    /// The input string itself is too long.
    #[error("input is {len} bytes, more than the {limit}-byte limit")]
    InputTooLong { len: usize, limit: usize },
    /// The expansion would produce too many names.
    #[error("expands to more than {limit} entries")]
    TooManyNames { limit: usize },
    /// One expanded name would be too long.
    #[error("at byte {pos}: expands to a name of {len} bytes, more than the {limit}-byte limit")]
    NameTooLong {
        pos: usize,
        len: usize,
        limit: usize,
    },
    /// The whole expansion would be too large.
    #[error("expands to more than {limit} bytes of names")]
    TooLarge { limit: usize },
    /// A count in a tasks-per-node list is too large.
    #[error("at byte {pos}: count {value} is larger than the limit {limit}")]
    CountTooLarge {
        pos: usize,
        value: String,
        limit: usize,
    },
}

fn syntax(pos: usize, found: impl Into<String>, expected: &'static str) -> HostlistError {
    HostlistError::Syntax {
        pos,
        found: found.into(),
        expected,
    }
}

/// Describe the character at `pos` (or the end of input) for error messages.
fn found_at(s: &str, pos: usize) -> String {
    match s[pos..].chars().next() {
        Some(c) => format!("`{}`", c.escape_debug()),
        None => "end of input".to_string(),
    }
}

#[derive(Debug, Clone, Copy)]
struct Range {
    lo: u64,
    hi: u64,
    width: usize,
}

impl Range {
    fn len(&self) -> u64 {
        self.hi - self.lo + 1
    }
}

#[derive(Debug)]
enum Part {
    Lit(String),
    Set(Vec<Range>),
}

/// Number of decimal digits of `v`.
fn digits(mut v: u64) -> usize {
    let mut n = 1;
    while v >= 10 {
        v /= 10;
        n += 1;
    }
    n
}

/// Parse one bracket-free-at-top-level item (`rack[1-2]-node[01-03]`).
/// `base` is the byte offset of `item` in the original input.
fn parse_item(item: &str, base: usize) -> Result<Vec<Part>, HostlistError> {
    let b = item.as_bytes();
    let mut parts = Vec::new();
    let mut i = 0;
    let mut lit_start = 0;
    while i < b.len() {
        match b[i] {
            b'[' => {
                if lit_start < i {
                    parts.push(Part::Lit(item[lit_start..i].to_string()));
                }
                let open = i;
                i += 1;
                let mut ranges = Vec::new();
                loop {
                    // lo
                    let lo_start = i;
                    while i < b.len() && b[i].is_ascii_digit() {
                        i += 1;
                    }
                    if i == lo_start {
                        return Err(syntax(
                            base + i,
                            found_at(item, i),
                            "a number inside `[...]`",
                        ));
                    }
                    let lo_s = &item[lo_start..i];
                    let mut hi_s = lo_s;
                    if i < b.len() && b[i] == b'-' {
                        i += 1;
                        let hi_start = i;
                        while i < b.len() && b[i].is_ascii_digit() {
                            i += 1;
                        }
                        if i == hi_start {
                            return Err(syntax(
                                base + i,
                                found_at(item, i),
                                "the upper end of a `lo-hi` range",
                            ));
                        }
                        hi_s = &item[hi_start..i];
                    }
                    for (s, at) in [(lo_s, lo_start), (hi_s, i - hi_s.len())] {
                        if s.len() > MAX_DIGITS {
                            return Err(syntax(
                                base + at,
                                format!("a {}-digit number", s.len()),
                                "at most 18 digits in a range bound",
                            ));
                        }
                    }
                    // Both fit in u64 thanks to MAX_DIGITS.
                    let lo: u64 = lo_s.parse().unwrap_or(0);
                    let hi: u64 = hi_s.parse().unwrap_or(0);
                    if lo > hi {
                        return Err(HostlistError::ReversedRange {
                            pos: base + lo_start,
                            lo: lo_s.to_string(),
                            hi: hi_s.to_string(),
                        });
                    }
                    if hi - lo >= MAX_NAMES as u64 {
                        return Err(HostlistError::TooManyNames { limit: MAX_NAMES });
                    }
                    ranges.push(Range {
                        lo,
                        hi,
                        width: lo_s.len(),
                    });
                    match b.get(i) {
                        Some(b',') => i += 1,
                        Some(b']') => {
                            i += 1;
                            break;
                        }
                        None => {
                            return Err(syntax(
                                base + open,
                                "`[` that is never closed",
                                "a matching `]`",
                            ))
                        }
                        Some(_) => {
                            return Err(syntax(
                                base + i,
                                found_at(item, i),
                                if hi_s.as_ptr() == lo_s.as_ptr() {
                                    "`,`, `-` or `]` after a number inside `[...]`"
                                } else {
                                    "`,` or `]` after a `lo-hi` range"
                                },
                            ))
                        }
                    }
                }
                parts.push(Part::Set(ranges));
                lit_start = i;
            }
            b']' => {
                return Err(syntax(
                    base + i,
                    "`]` without a matching `[`",
                    "a host name or `[`",
                ))
            }
            _ => i += 1,
        }
    }
    if lit_start < b.len() {
        parts.push(Part::Lit(item[lit_start..].to_string()));
    }
    Ok(parts)
}

/// Split the input into items: `,` at bracket depth 0 separates items, as
/// does whitespace. Returns `(byte offset, item)` pairs.
fn split_items(list: &str) -> Result<Vec<(usize, &str)>, HostlistError> {
    let b = list.as_bytes();
    let mut items = Vec::new();
    let mut depth = 0usize;
    let mut seg_start = 0;
    let mut i = 0;
    let mut flush = |start: usize, end: usize, at_comma: bool| -> Result<(), HostlistError> {
        let seg = &list[start..end];
        let mut any = false;
        let mut off = start;
        for w in seg.split(|c: char| c.is_ascii_whitespace()) {
            if !w.is_empty() {
                items.push((off, w));
                any = true;
            }
            off += w.len() + 1;
        }
        if !any && at_comma {
            return Err(syntax(end, "an empty entry between commas", "a host name"));
        }
        Ok(())
    };
    while i < b.len() {
        match b[i] {
            b'[' => {
                if depth > 0 {
                    return Err(syntax(i, "`[` inside `[...]`", "a number, `,`, `-` or `]`"));
                }
                depth = 1;
            }
            b']' => depth = depth.saturating_sub(1),
            c if depth > 0 && c.is_ascii_whitespace() => {
                return Err(syntax(
                    i,
                    "whitespace inside `[...]`",
                    "a number, `,`, `-` or `]`",
                ))
            }
            b',' if depth == 0 => {
                flush(seg_start, i, true)?;
                seg_start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    let trailing_comma = seg_start > 0;
    if seg_start < b.len() || trailing_comma {
        flush(seg_start, b.len(), trailing_comma)?;
    }
    Ok(items)
}

/// Expand a Slurm hostlist (`rack[1-2]-node[01-03],login1`) into host names,
/// in order, duplicates kept. An empty or all-blank string gives no names.
pub fn expand(list: &str) -> Result<Vec<String>, HostlistError> {
    if list.len() > MAX_INPUT_LEN {
        return Err(HostlistError::InputTooLong {
            len: list.len(),
            limit: MAX_INPUT_LEN,
        });
    }
    let mut parsed = Vec::new();
    let mut total_names: usize = 0;
    let mut total_bytes: usize = 0;
    for (off, item) in split_items(list)? {
        let parts = parse_item(item, off)?;
        let mut count: usize = 1;
        let mut max_len: usize = 0;
        for p in &parts {
            match p {
                Part::Lit(s) => max_len += s.len(),
                Part::Set(ranges) => {
                    let mut n: u64 = 0;
                    let mut w = 0;
                    for r in ranges {
                        n = n.saturating_add(r.len());
                        w = w.max(r.width.max(digits(r.hi)));
                    }
                    max_len += w;
                    count = usize::try_from(n)
                        .ok()
                        .and_then(|n| count.checked_mul(n))
                        .filter(|&c| c <= MAX_NAMES)
                        .ok_or(HostlistError::TooManyNames { limit: MAX_NAMES })?;
                }
            }
            if max_len > MAX_NAME_LEN {
                return Err(HostlistError::NameTooLong {
                    pos: off,
                    len: max_len,
                    limit: MAX_NAME_LEN,
                });
            }
        }
        total_names = total_names
            .checked_add(count)
            .filter(|&c| c <= MAX_NAMES)
            .ok_or(HostlistError::TooManyNames { limit: MAX_NAMES })?;
        // Upper bound on the bytes this item takes (names + String headers).
        total_bytes = total_bytes
            .saturating_add(count.saturating_mul(max_len + std::mem::size_of::<String>()));
        if total_bytes > MAX_TOTAL_BYTES {
            return Err(HostlistError::TooLarge {
                limit: MAX_TOTAL_BYTES,
            });
        }
        parsed.push((parts, max_len));
    }
    let mut out = Vec::with_capacity(total_names);
    for (parts, max_len) in &parsed {
        expand_parts(parts, *max_len, &mut out);
    }
    Ok(out)
}

/// Odometer over the bracket groups of one item, leftmost slowest.
fn expand_parts(parts: &[Part], max_len: usize, out: &mut Vec<String>) {
    // Per set: (range index, current value).
    let mut state: Vec<(usize, u64)> = parts
        .iter()
        .filter_map(|p| match p {
            Part::Set(r) => Some((0, r[0].lo)),
            Part::Lit(_) => None,
        })
        .collect();
    let sets: Vec<&Vec<Range>> = parts
        .iter()
        .filter_map(|p| match p {
            Part::Set(r) => Some(r),
            Part::Lit(_) => None,
        })
        .collect();
    loop {
        let mut name = String::with_capacity(max_len);
        let mut k = 0;
        for p in parts {
            match p {
                Part::Lit(s) => name.push_str(s),
                Part::Set(r) => {
                    let (ri, v) = state[k];
                    let _ = write!(name, "{:0w$}", v, w = r[ri].width);
                    k += 1;
                }
            }
        }
        out.push(name);
        // Advance the rightmost set; carry to the left.
        let mut j = sets.len();
        loop {
            if j == 0 {
                return;
            }
            j -= 1;
            let (ri, v) = state[j];
            let r = sets[j];
            if v < r[ri].hi {
                state[j] = (ri, v + 1);
                break;
            } else if ri + 1 < r.len() {
                state[j] = (ri + 1, r[ri + 1].lo);
                break;
            } else {
                state[j] = (0, r[0].lo);
            }
        }
    }
}

/// Parse a Slurm per-node count list such as `SLURM_TASKS_PER_NODE` or
/// `SLURM_JOB_CPUS_PER_NODE`: `2(x3),1` gives `[2, 2, 2, 1]`.
/// Counts may be 0; each must be at most [`MAX_TASKS_PER_NODE`] and the list
/// may expand to at most [`MAX_NAMES`] entries.
pub fn parse_tasks_per_node(s: &str) -> Result<Vec<usize>, HostlistError> {
    if s.len() > MAX_INPUT_LEN {
        return Err(HostlistError::InputTooLong {
            len: s.len(),
            limit: MAX_INPUT_LEN,
        });
    }
    let mut out = Vec::new();
    let mut off = 0;
    for raw in s.split(',') {
        let item = raw.trim();
        let lead = raw.len() - raw.trim_start().len();
        let at = off + lead;
        off += raw.len() + 1;
        if item.is_empty() {
            return Err(syntax(
                at,
                if s.trim().is_empty() {
                    "an empty list".to_string()
                } else {
                    "an empty entry".to_string()
                },
                "a count such as `4` or `4(x2)`",
            ));
        }
        let b = item.as_bytes();
        let mut i = 0;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i == 0 {
            return Err(syntax(
                at,
                found_at(item, 0),
                "a count such as `4` or `4(x2)`",
            ));
        }
        let value = parse_bounded(&item[..i], at, MAX_TASKS_PER_NODE)?;
        let mut reps = 1usize;
        if i < b.len() {
            let rest = &item[i..];
            let inner = rest
                .strip_prefix("(x")
                .and_then(|r| r.strip_suffix(')'))
                .filter(|r| !r.is_empty() && r.bytes().all(|c| c.is_ascii_digit()))
                .ok_or_else(|| {
                    syntax(
                        at + i,
                        format!("`{}`", rest.escape_debug()),
                        "nothing or a repeat count `(xN)` after the count",
                    )
                })?;
            reps = parse_bounded(inner, at + i + 2, MAX_NAMES)?;
            if reps == 0 {
                return Err(syntax(at + i + 2, "`(x0)`", "a repeat count of at least 1"));
            }
        }
        if out.len() + reps > MAX_NAMES {
            return Err(HostlistError::TooManyNames { limit: MAX_NAMES });
        }
        out.resize(out.len() + reps, value);
    }
    Ok(out)
}

fn parse_bounded(digits_str: &str, pos: usize, limit: usize) -> Result<usize, HostlistError> {
    match digits_str.parse::<usize>() {
        Ok(v) if v <= limit => Ok(v),
        _ => Err(HostlistError::CountTooLarge {
            pos,
            value: digits_str.to_string(),
            limit,
        }),
    }
}

/// Split `name` into (prefix, trailing digits) when it ends in digits.
fn split_numeric(name: &str) -> Option<(&str, &str, u64)> {
    let b = name.as_bytes();
    let mut i = b.len();
    while i > 0 && b[i - 1].is_ascii_digit() {
        i -= 1;
    }
    let digs = &name[i..];
    if digs.is_empty() || digs.len() > MAX_DIGITS {
        return None;
    }
    let prefix = &name[..i];
    if prefix.contains(['[', ']', ',']) {
        return None;
    }
    digs.parse().ok().map(|v| (prefix, digs, v))
}

/// Compress names into a hostlist that [`expand`]s back to exactly `names`
/// (same order, same duplicates). Only runs of adjacent names sharing a
/// prefix, a zero-padding width and increasing trailing numbers are merged:
/// `n01 n02 n03 n07` gives `n[01-03,07]`.
pub fn compress(names: &[String]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < names.len() {
        if !out.is_empty() {
            out.push(',');
        }
        let Some((prefix, digs, v0)) = split_numeric(&names[i]) else {
            out.push_str(&names[i]);
            i += 1;
            continue;
        };
        let width = digs.len();
        let mut vals = vec![v0];
        let mut j = i + 1;
        while j < names.len() {
            match split_numeric(&names[j]) {
                Some((p, d, v))
                    if p == prefix
                        && v > *vals.last().unwrap_or(&0)
                        && format!("{:0w$}", v, w = width) == d =>
                {
                    vals.push(v);
                    j += 1;
                }
                _ => break,
            }
        }
        if vals.len() == 1 {
            out.push_str(&names[i]);
        } else {
            out.push_str(prefix);
            out.push('[');
            let mut k = 0;
            while k < vals.len() {
                let mut e = k;
                while e + 1 < vals.len() && vals[e + 1] == vals[e] + 1 {
                    e += 1;
                }
                if k > 0 {
                    out.push(',');
                }
                let _ = write!(out, "{:0w$}", vals[k], w = width);
                if e > k {
                    let _ = write!(out, "-{:0w$}", vals[e], w = width);
                }
                k = e + 1;
            }
            out.push(']');
        }
        i = j;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ex(s: &str) -> Vec<String> {
        expand(s).unwrap_or_else(|e| panic!("expand({s:?}) failed: {e}"))
    }

    fn v(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn plain_names() {
        assert_eq!(ex("node1"), v(&["node1"]));
        assert_eq!(ex("a,b,c"), v(&["a", "b", "c"]));
        assert_eq!(ex("a b\tc"), v(&["a", "b", "c"]));
        assert_eq!(ex("a, b"), v(&["a", "b"]));
        assert_eq!(ex(""), Vec::<String>::new());
        assert_eq!(ex("   "), Vec::<String>::new());
    }

    #[test]
    fn simple_range() {
        assert_eq!(ex("n[1-3]"), v(&["n1", "n2", "n3"]));
        assert_eq!(ex("n[8-11]"), v(&["n8", "n9", "n10", "n11"]));
        assert_eq!(ex("n[5]"), v(&["n5"]));
    }

    #[test]
    fn zero_padding() {
        assert_eq!(ex("n[01-03]"), v(&["n01", "n02", "n03"]));
        assert_eq!(ex("n[08-10]"), v(&["n08", "n09", "n10"]));
        assert_eq!(ex("n[098-101]"), v(&["n098", "n099", "n100", "n101"]));
        assert_eq!(ex("n[99-101]"), v(&["n99", "n100", "n101"]));
        assert_eq!(ex("n[001-2]"), v(&["n001", "n002"]));
        assert_eq!(ex("n[0-1]"), v(&["n0", "n1"]));
    }

    #[test]
    fn comma_lists_in_brackets() {
        assert_eq!(ex("n[1,3-5]"), v(&["n1", "n3", "n4", "n5"]));
        assert_eq!(ex("n[1,03,7-8]"), v(&["n1", "n03", "n7", "n8"]));
        assert_eq!(ex("n[5,1]"), v(&["n5", "n1"]));
    }

    #[test]
    fn several_groups_and_suffixes() {
        assert_eq!(
            ex("rack[1-2]-node[01-03]"),
            v(&[
                "rack1-node01",
                "rack1-node02",
                "rack1-node03",
                "rack2-node01",
                "rack2-node02",
                "rack2-node03"
            ])
        );
        assert_eq!(ex("n[1-2]-ib"), v(&["n1-ib", "n2-ib"]));
        assert_eq!(ex("[1-2]x"), v(&["1x", "2x"]));
        assert_eq!(
            ex("r[1-2]c[3,5]s"),
            v(&["r1c3s", "r1c5s", "r2c3s", "r2c5s"])
        );
    }

    #[test]
    fn top_level_items() {
        assert_eq!(ex("a[1-2],b3"), v(&["a1", "a2", "b3"]));
        assert_eq!(
            ex("gpu[1-2],cpu[01,03],login"),
            v(&["gpu1", "gpu2", "cpu01", "cpu03", "login"])
        );
        assert_eq!(ex("a,a"), v(&["a", "a"]));
    }

    #[test]
    fn syntax_errors() {
        for bad in [
            "n[1-3", "n1-3]", "n[]", "n[a-b]", "n[1-]", "n[-3]", "n[1,]", "n[1 2]", "n[[1]]",
            "a,,b", ",a", "a,", "n[1-2-3]", "n[1]x]",
        ] {
            assert!(
                matches!(expand(bad), Err(HostlistError::Syntax { .. })),
                "{bad:?} gave {:?}",
                expand(bad)
            );
        }
        assert!(matches!(
            expand("n[5-3]"),
            Err(HostlistError::ReversedRange { .. })
        ));
        let e = expand("n[1-3").unwrap_err().to_string();
        assert!(e.contains("never closed") && e.contains("`]`"), "{e}");
        let e = expand("n[1x]").unwrap_err().to_string();
        assert!(e.contains("at byte 3") && e.contains("`x`"), "{e}");
    }

    #[test]
    fn caps_hold_without_allocating() {
        // One range at the limit is fine; one more name is not.
        assert_eq!(ex("n[1-1000000]").len(), MAX_NAMES);
        assert!(matches!(
            expand("n[0-1000000]"),
            Err(HostlistError::TooManyNames { .. })
        ));
        assert!(matches!(
            expand("n[1-1000000],x"),
            Err(HostlistError::TooManyNames { .. })
        ));
        // Product of groups is checked before expanding.
        assert!(matches!(
            expand("a[1-1000]b[1-1000]c[1-1000]"),
            Err(HostlistError::TooManyNames { .. })
        ));
        assert!(matches!(
            expand("n[0-999999999999999999]"),
            Err(HostlistError::TooManyNames { .. })
        ));
        assert!(matches!(
            expand("n[1-99999999999999999999]"),
            Err(HostlistError::Syntax { .. })
        ));
        let long = "x".repeat(300);
        assert!(matches!(
            expand(&long),
            Err(HostlistError::NameTooLong { .. })
        ));
        let huge = "a,".repeat(MAX_INPUT_LEN);
        assert!(matches!(
            expand(&huge),
            Err(HostlistError::InputTooLong { .. })
        ));
        // Many groups of one element stay bounded by the name length.
        let many = "[1]".repeat(300);
        assert!(matches!(
            expand(&many),
            Err(HostlistError::NameTooLong { .. })
        ));
        // 200k items x long names exceeds the byte budget.
        let wide = format!("{}[1-300000]", "y".repeat(240));
        assert!(matches!(expand(&wide), Err(HostlistError::TooLarge { .. })));
    }

    #[test]
    fn tasks_per_node() {
        assert_eq!(parse_tasks_per_node("2(x3),1").unwrap(), vec![2, 2, 2, 1]);
        assert_eq!(parse_tasks_per_node("16").unwrap(), vec![16]);
        assert_eq!(parse_tasks_per_node("4,4").unwrap(), vec![4, 4]);
        assert_eq!(
            parse_tasks_per_node("72(x2), 36").unwrap(),
            vec![72, 72, 36]
        );
        assert_eq!(parse_tasks_per_node("0").unwrap(), vec![0]);
        for bad in [
            "", "x", "2(x)", "2(3)", "2(x3", "2x3", "2(x0)", "1,,2", "-1", "2(x3)4",
        ] {
            assert!(parse_tasks_per_node(bad).is_err(), "{bad:?}");
        }
        assert!(matches!(
            parse_tasks_per_node("99999999999999999999999"),
            Err(HostlistError::CountTooLarge { .. })
        ));
        assert!(matches!(
            parse_tasks_per_node("1(x1000001)"),
            Err(HostlistError::CountTooLarge { .. })
        ));
        assert!(matches!(
            parse_tasks_per_node("1(x1000000),1"),
            Err(HostlistError::TooManyNames { .. })
        ));
    }

    #[test]
    fn compress_roundtrips() {
        let cases: Vec<Vec<String>> = vec![
            v(&["n1", "n2", "n3"]),
            v(&["n01", "n02", "n03", "n07"]),
            v(&["n9", "n10", "n11"]),
            v(&["n09", "n10"]),
            v(&["n3", "n1"]),
            v(&["a", "b", "a"]),
            v(&["login", "gpu1", "gpu2", "cpu01", "cpu03"]),
            v(&["rack1-node01", "rack1-node02", "rack2-node01"]),
            v(&["n1-ib", "n2-ib"]),
            v(&["n1", "n01", "n001"]),
            v(&[]),
        ];
        for names in cases {
            let c = compress(&names);
            assert_eq!(ex(&c), names, "compress gave {c:?}");
        }
        assert_eq!(compress(&v(&["n01", "n02", "n03", "n07"])), "n[01-03,07]");
        assert_eq!(compress(&v(&["n1", "n2", "x"])), "n[1-2],x");
        assert_eq!(compress(&ex("n[1-1000]")), "n[1-1000]");
    }
}

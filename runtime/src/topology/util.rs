//! Small, bounded parsers shared by the loaders: CPU lists, CPU masks, PCI
//! bus ids, link speeds, bounded file reads, and the XML nesting pre-scan.

use std::cmp::Ordering;
use std::io::Read;
use std::path::Path;

/// CPU numbers must be below this (Linux NR_CPUS is at most 8192).
pub const MAX_CPU_ID: usize = 8192;
/// Largest number of bytes read from one sysfs attribute file.
pub const MAX_ATTR_BYTES: u64 = 64 * 1024;
/// Largest number of comma-separated 32-bit words in a CPU mask.
pub const MAX_MASK_WORDS: usize = MAX_CPU_ID / 32;

/// Parses a Linux CPU list (`0-3,8,10-11`, also `0-7:2` strides are rejected).
/// Returns a sorted, de-duplicated list. Empty input yields an empty list.
pub fn parse_cpulist(s: &str) -> Result<Vec<usize>, String> {
    let s = s.trim();
    let mut out = Vec::new();
    if s.is_empty() {
        return Ok(out);
    }
    for part in s.split(',') {
        let part = part.trim();
        if part.is_empty() {
            continue;
        }
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (parse_cpu_id(a)?, parse_cpu_id(b)?),
            None => {
                let v = parse_cpu_id(part)?;
                (v, v)
            }
        };
        if lo > hi {
            return Err(format!("range {part:?} is reversed"));
        }
        // Every id is <= MAX_CPU_ID, so this stays bounded.
        out.extend(lo..=hi);
        if out.len() > 4 * MAX_CPU_ID {
            return Err("too many CPUs".into());
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

fn parse_cpu_id(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let v: usize = s
        .parse()
        .map_err(|_| format!("{s:?} is not a CPU number"))?;
    if v >= MAX_CPU_ID {
        return Err(format!(
            "CPU {v} is above the supported maximum {MAX_CPU_ID}"
        ));
    }
    Ok(v)
}

/// Formats a sorted CPU list compactly: `[0,1,2,3,8]` → `0-3,8`.
pub fn format_cpulist(cpus: &[usize]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < cpus.len() {
        let start = cpus[i];
        let mut end = start;
        while i + 1 < cpus.len() && cpus[i + 1] == end + 1 {
            i += 1;
            end = cpus[i];
        }
        if !out.is_empty() {
            out.push(',');
        }
        if start == end {
            out.push_str(&start.to_string());
        } else {
            out.push_str(&format!("{start}-{end}"));
        }
        i += 1;
    }
    out
}

/// Parses a CPU (or NUMA node) mask in the Linux / NCCL form
/// (`00000000,00ffffff`, most significant 32-bit word first) or the hwloc
/// form (`0x00000003,0xffffffff`). A single word may be longer than 8 hex
/// digits. hwloc's infinite prefix `0xf...f` contributes no bits.
pub fn parse_mask(s: &str) -> Result<Vec<usize>, String> {
    let s = s.trim();
    if s.is_empty() {
        return Ok(Vec::new());
    }
    let words: Vec<&str> = s.split(',').collect();
    if words.len() > MAX_MASK_WORDS {
        return Err(format!(
            "mask has {} words, at most {MAX_MASK_WORDS} are supported",
            words.len()
        ));
    }
    let single = words.len() == 1;
    let mut out = Vec::new();
    for (k, w) in words.iter().rev().enumerate() {
        let w = w.trim();
        let w = w
            .strip_prefix("0x")
            .or_else(|| w.strip_prefix("0X"))
            .unwrap_or(w);
        if w.is_empty() {
            continue; // hwloc may leave zero words empty
        }
        if w.eq_ignore_ascii_case("f...f") {
            continue;
        }
        if !single && w.len() > 8 {
            return Err(format!("mask word {w:?} is longer than 32 bits"));
        }
        if w.len() > MAX_CPU_ID / 4 {
            return Err("mask is too long".into());
        }
        let base = k * 32;
        for (j, c) in w.chars().rev().enumerate() {
            let d = c
                .to_digit(16)
                .ok_or_else(|| format!("{c:?} is not a hex digit"))?;
            for bit in 0..4 {
                if d & (1 << bit) != 0 {
                    let cpu = base + j * 4 + bit;
                    if cpu >= MAX_CPU_ID {
                        return Err(format!("bit {cpu} is above the supported maximum"));
                    }
                    out.push(cpu);
                }
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// Normalizes a PCI bus id to `dddd:bb:dd.f` (lower case). Accepts a missing
/// domain (`bb:dd.f`) and domains longer than 4 hex digits (VMD: `10000:…`).
pub fn normalize_busid(s: &str) -> Option<String> {
    let s = s.trim();
    let (rest, func) = s.rsplit_once('.')?;
    let parts: Vec<&str> = rest.split(':').collect();
    let (dom, bus, dev) = match parts.as_slice() {
        [d, b, v] => (*d, *b, *v),
        [b, v] => ("0", *b, *v),
        _ => return None,
    };
    let hex = |t: &str, max_len: usize| -> Option<u32> {
        if t.is_empty() || t.len() > max_len || !t.chars().all(|c| c.is_ascii_hexdigit()) {
            return None;
        }
        u32::from_str_radix(t, 16).ok()
    };
    let dom = hex(dom, 8)?;
    let bus = hex(bus, 2)?;
    let dev = hex(dev, 2)?;
    let func = hex(func, 1)?;
    if dev > 0x1f || func > 7 {
        return None;
    }
    Some(format!("{dom:04x}:{bus:02x}:{dev:02x}.{func:x}"))
}

/// The PCI domain part of a normalized bus id.
pub fn busid_domain(busid: &str) -> &str {
    busid.split(':').next().unwrap_or("")
}

/// Parses a hex number with optional `0x` prefix.
pub fn parse_hex(s: &str) -> Option<u64> {
    let t = s.trim();
    let t = t
        .strip_prefix("0x")
        .or_else(|| t.strip_prefix("0X"))
        .unwrap_or(t);
    if t.is_empty() || t.len() > 16 {
        return None;
    }
    u64::from_str_radix(t, 16).ok()
}

/// PCIe link bandwidth in Mbit/s from a transfer rate (`"16 GT/s"`,
/// `"16.0 GT/s PCIe"`, `"8.0 GT/s"`) and a width (`"16"`), after line coding.
pub fn pcie_link_mbps(speed: &str, width: &str) -> Option<u64> {
    let gts: f64 = speed.split_whitespace().next()?.parse().ok()?;
    let width: f64 = width.trim().trim_start_matches('x').parse().ok()?;
    if !(gts.is_finite() && gts > 0.0 && gts <= 1024.0 && width > 0.0 && width <= 64.0) {
        return None;
    }
    let coding = if gts < 8.0 { 0.8 } else { 128.0 / 130.0 };
    Some((gts * 1000.0 * width * coding).round() as u64)
}

/// Mbit/s from an InfiniBand port rate such as `"200 Gb/sec (4X HDR)"`.
pub fn ib_rate_mbps(rate: &str) -> Option<u64> {
    let mut it = rate.split_whitespace();
    let v: f64 = it.next()?.parse().ok()?;
    let unit = it.next().unwrap_or("Gb/sec");
    let mult = if unit.starts_with("Gb") {
        1000.0
    } else if unit.starts_with("Mb") {
        1.0
    } else {
        return None;
    };
    if !(v.is_finite() && v > 0.0 && v < 1.0e7) {
        return None;
    }
    Some((v * mult).round() as u64)
}

/// Reads a small text file (sysfs attribute), at most [`MAX_ATTR_BYTES`].
/// Returns `None` when it cannot be read or is not UTF-8.
pub fn read_attr(path: &Path) -> Option<String> {
    let f = std::fs::File::open(path).ok()?;
    let mut buf = Vec::new();
    f.take(MAX_ATTR_BYTES).read_to_end(&mut buf).ok()?;
    let s = String::from_utf8(buf).ok()?;
    Some(s.trim().to_string())
}

/// Natural ordering: `mlx5_2` < `mlx5_10`.
pub fn natural_cmp(a: &str, b: &str) -> Ordering {
    let (mut ai, mut bi) = (a.chars().peekable(), b.chars().peekable());
    loop {
        match (ai.peek().copied(), bi.peek().copied()) {
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(x), Some(y)) if x.is_ascii_digit() && y.is_ascii_digit() => {
                let mut na = String::new();
                while let Some(c) = ai.peek().copied().filter(char::is_ascii_digit) {
                    na.push(c);
                    ai.next();
                }
                let mut nb = String::new();
                while let Some(c) = bi.peek().copied().filter(char::is_ascii_digit) {
                    nb.push(c);
                    bi.next();
                }
                let ta = na.trim_start_matches('0');
                let tb = nb.trim_start_matches('0');
                let ord = ta.len().cmp(&tb.len()).then_with(|| ta.cmp(tb));
                if ord != Ordering::Equal {
                    return ord;
                }
            }
            (Some(x), Some(y)) => {
                if x != y {
                    return x.cmp(&y);
                }
                ai.next();
                bi.next();
            }
        }
    }
}

/// Sorted intersection of two sorted lists.
pub fn intersect(a: &[usize], b: &[usize]) -> Vec<usize> {
    a.iter()
        .copied()
        .filter(|x| b.binary_search(x).is_ok())
        .collect()
}

/// The first place where elements nest deeper than `max` in `text`: (line, depth). A lexical
/// pre-scan run before the XML parser, whose recursion would otherwise overflow the stack on
/// a file nested tens of thousands of levels deep. It skips comments, CDATA, processing
/// instructions, the DOCTYPE (with its internal subset) and quoted attribute values; on
/// malformed input it may stop early, which is harmless: the parser then reports the error.
pub fn xml_too_deep(text: &str, max: usize) -> Option<(u32, usize)> {
    let b = text.as_bytes();
    let find = |from: usize, pat: &[u8]| -> Option<usize> {
        b.get(from..)?
            .windows(pat.len())
            .position(|w| w == pat)
            .map(|p| from + p + pat.len())
    };
    let (mut i, mut depth, mut line) = (0usize, 0usize, 1u32);
    while i < b.len() {
        if b[i] == b'\n' {
            line += 1;
        }
        if b[i] != b'<' {
            i += 1;
            continue;
        }
        let rest = &b[i + 1..];
        let end = if rest.starts_with(b"!--") {
            find(i + 4, b"-->")
        } else if rest.starts_with(b"![CDATA[") {
            find(i + 9, b"]]>")
        } else if rest.starts_with(b"?") {
            find(i + 2, b"?>")
        } else if rest.starts_with(b"!") {
            // <!DOCTYPE ... [ internal subset ] >: skip brackets and quotes
            let (mut j, mut br, mut q) = (i + 2, 0usize, 0u8);
            loop {
                match b.get(j) {
                    None => break None,
                    Some(&c) if q != 0 && c == q => q = 0,
                    Some(_) if q != 0 => {}
                    Some(&c) if c == b'"' || c == b'\'' => q = c,
                    Some(b'[') => br += 1,
                    Some(b']') => br = br.saturating_sub(1),
                    Some(b'>') if br == 0 => break Some(j + 1),
                    _ => {}
                }
                j += 1;
            }
        } else {
            // a start or end tag: to its '>', outside quotes
            let (mut j, mut q) = (i + 1, 0u8);
            let close = loop {
                match b.get(j) {
                    None => break None,
                    Some(&c) if q != 0 && c == q => q = 0,
                    Some(_) if q != 0 => {}
                    Some(&c) if c == b'"' || c == b'\'' => q = c,
                    Some(b'>') => break Some(j),
                    _ => {}
                }
                j += 1;
            };
            let close = close?;
            if rest.starts_with(b"/") {
                depth = depth.saturating_sub(1);
            } else if b[close - 1] != b'/' {
                depth += 1;
                if depth > max {
                    return Some((line, depth));
                }
            }
            Some(close + 1)
        };
        let end = end?;
        line += b[i + 1..end].iter().filter(|&&c| c == b'\n').count() as u32;
        i = end;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xml_nesting_is_measured_lexically() {
        let deep = format!("<a>{}{}</a>", "<b x='>'>".repeat(300), "</b>".repeat(300));
        assert_eq!(xml_too_deep(&deep, 256), Some((1, 257)));
        assert_eq!(xml_too_deep(&deep, 400), None);
        let flat = "<?xml version='1.0'?>\n<!DOCTYPE s [<!ENTITY e '<<'>]>\n<s><!-- <x><x> --><![CDATA[<y><y>]]><c/><c/></s>";
        assert_eq!(xml_too_deep(flat, 1), None);
        assert_eq!(xml_too_deep("<a>\n<b>\n<c>", 2), Some((3, 3)));
        for junk in [
            "<",
            "<a",
            "<!--",
            "<![CDATA[",
            "<!DOCTYPE [",
            "<a b='",
            "\u{0}<>",
        ] {
            let _ = xml_too_deep(junk, 1);
        }
    }

    #[test]
    fn cpulists() {
        assert_eq!(
            parse_cpulist("0-3,8,10-11").unwrap(),
            vec![0, 1, 2, 3, 8, 10, 11]
        );
        assert_eq!(parse_cpulist("").unwrap(), Vec::<usize>::new());
        assert!(parse_cpulist("3-1").is_err());
        assert!(parse_cpulist("0-99999999").is_err());
        assert!(parse_cpulist("x").is_err());
        assert_eq!(format_cpulist(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(format_cpulist(&[]), "");
    }

    #[test]
    fn masks() {
        assert_eq!(parse_mask("00000000,00000003").unwrap(), vec![0, 1]);
        assert_eq!(parse_mask("0x00000001,0x00000000").unwrap(), vec![32]);
        assert_eq!(parse_mask("0x00555555").unwrap().len(), 12);
        assert_eq!(parse_mask("0xf...f,0x00000001").unwrap(), vec![0]);
        assert_eq!(parse_mask("100000000").unwrap(), vec![32]);
        assert!(parse_mask("123456789,1").is_err());
        assert!(parse_mask("zz").is_err());
        let ndv4 = parse_mask("000000ff,ffff0000,00000000").unwrap();
        assert_eq!(ndv4.first(), Some(&48));
        assert_eq!(ndv4.last(), Some(&71));
    }

    #[test]
    fn busids() {
        assert_eq!(
            normalize_busid("0000:10:1C.0").as_deref(),
            Some("0000:10:1c.0")
        );
        assert_eq!(normalize_busid("10:1c.0").as_deref(), Some("0000:10:1c.0"));
        assert_eq!(
            normalize_busid("10000:00:01.0").as_deref(),
            Some("10000:00:01.0")
        );
        assert_eq!(normalize_busid("0000:10:1c"), None);
        assert_eq!(normalize_busid("0000:10:3f.0"), None);
        assert_eq!(normalize_busid("pci0000:00"), None);
    }

    #[test]
    fn speeds() {
        assert_eq!(pcie_link_mbps("16 GT/s", "16"), Some(252062));
        assert_eq!(pcie_link_mbps("16.0 GT/s PCIe", "16"), Some(252062));
        assert_eq!(pcie_link_mbps("2.5 GT/s", "1"), Some(2000));
        assert_eq!(pcie_link_mbps("Unknown", "16"), None);
        assert_eq!(ib_rate_mbps("200 Gb/sec (4X HDR)"), Some(200000));
        assert_eq!(ib_rate_mbps("junk"), None);
    }

    #[test]
    fn natural() {
        assert_eq!(natural_cmp("mlx5_2", "mlx5_10"), Ordering::Less);
        assert_eq!(natural_cmp("eth0", "eth0"), Ordering::Equal);
        assert_eq!(natural_cmp("eth", "eth0"), Ordering::Less);
    }
}

//! The addressing plan (management and rail addresses), rail rates for `tc tbf`, and the
//! root-namespace safety checks: 10.77.0.0/16 is blackholed there and never gets an address.

use super::cmd::run_cmd;
use super::RANGE;
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;

pub(super) fn mgmt_addr_of(index: usize) -> Ipv4Addr {
    if index == 0 {
        Ipv4Addr::new(10, 77, 0, 1)
    } else {
        Ipv4Addr::new(10, 77, 0, (10 + index) as u8)
    }
}

pub(super) fn rail_addr_of(index: usize, rail: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 77, (10 + rail) as u8, (10 + index) as u8)
}

fn bad_unit(rate: &str) -> String {
    format!("bad rail rate {rate:?}: unit must be bit/kbit/mbit/gbit/tbit or bps/kbps/mbps/gbps")
}

/// Parse a tc rate ("1gbit", "500mbit", "100mbps", "1000000") into bytes/s.
pub(super) fn rate_bytes_per_sec(rate: &str) -> Result<f64, String> {
    let r = rate.trim().to_ascii_lowercase();
    let split = r
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(r.len());
    let (num, unit) = r.split_at(split);
    let n: f64 = num.parse().map_err(|_| format!("bad rail rate {rate:?}"))?;
    let bits_mult = match unit {
        "" | "bit" => 1.0,
        "kbit" => 1e3,
        "mbit" => 1e6,
        "gbit" => 1e9,
        "tbit" => 1e12,
        "bps" => 8.0,
        "kbps" => 8e3,
        "mbps" => 8e6,
        "gbps" => 8e9,
        "tbps" => 8e12,
        _ => return Err(bad_unit(rate)),
    };
    let bps = n * bits_mult / 8.0;
    if bps < 1000.0 {
        return Err(format!("rail rate {rate:?} is too small"));
    }
    Ok(bps)
}

// ---------------------------------------------------------------------------
// root-namespace safety
// ---------------------------------------------------------------------------

fn in_range(a: Ipv4Addr) -> bool {
    let o = a.octets();
    o[0] == 10 && o[1] == 77
}

/// Ensure the root namespace blackholes 10.77.0.0/16 and has no address or
/// other route in it. Never adds anything else to the root namespace.
pub(super) fn ensure_root_safety(ip: &Path) -> Result<(), String> {
    let mut add = Command::new(ip);
    add.args(["route", "add", "unreachable", RANGE]);
    if let Err(e) = run_cmd(&mut add, None) {
        if !e.contains("File exists") {
            return Err(format!("network safety: {e}"));
        }
    }
    let exact = run_cmd(
        Command::new(ip).args(["-4", "route", "show", "exact", RANGE]),
        None,
    )?;
    if !exact
        .lines()
        .any(|l| l.trim_start().starts_with("unreachable"))
    {
        return Err(format!(
            "network safety: the root namespace has a route for {RANGE} that is not `unreachable`:\n{exact}\nrefusing to build a cluster"
        ));
    }
    let inner = run_cmd(
        Command::new(ip).args(["-4", "route", "show", "root", RANGE]),
        None,
    )?;
    let bad: Vec<&str> = inner
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with("unreachable 10.77.0.0/16"))
        .collect();
    if !bad.is_empty() {
        return Err(format!(
            "network safety: the root namespace has routes inside {RANGE}: {bad:?}; refusing to build a cluster"
        ));
    }
    for (dev, a) in root_addrs(ip)? {
        if in_range(a) {
            return Err(format!(
                "network safety: the root namespace has address {a} on {dev} inside {RANGE}; refusing to build a cluster"
            ));
        }
    }
    Ok(())
}

/// IPv4 addresses of the root namespace, as (device, address).
pub fn root_addrs(ip: &Path) -> Result<Vec<(String, Ipv4Addr)>, String> {
    let out = run_cmd(Command::new(ip).args(["-4", "-o", "addr", "show"]), None)?;
    let mut v = Vec::new();
    for line in out.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if let Some(i) = f.iter().position(|x| *x == "inet") {
            if let Some(a) = f
                .get(i + 1)
                .and_then(|s| s.split('/').next())
                .and_then(|s| s.parse().ok())
            {
                v.push((
                    f.get(1).unwrap_or(&"?").trim_end_matches(':').to_string(),
                    a,
                ));
            }
        }
    }
    Ok(v)
}

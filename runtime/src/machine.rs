//! This machine's identity: hostname, kernel boot id, network namespace. Two processes are on
//! the same node when they share hostname, kernel boot id and network namespace: emulated hosts
//! (namespaces on one kernel) share the boot id but not the network namespace; two real machines
//! can share a hostname but not a boot id. Also the one clock fact the runtime needs: whether
//! the CPU's time-stamp counter is a valid clock here ([`tsc_clock`]).

use std::os::unix::fs::MetadataExt;

/// A string identifying this process's node. An override (`RAILRING_HOST_ID`, from
/// [`Config::host_id`](crate::config::Config::host_id)) makes ranks with different values
/// different nodes even on one machine (the TCP path and the two-level algorithm can then be
/// exercised on a laptop).
pub fn host_id(id_override: Option<&str>) -> String {
    if let Some(v) = id_override {
        return format!("override:{v}");
    }
    let hostname = hostname();
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let netns = std::fs::metadata("/proc/self/ns/net")
        .map(|m| m.ino())
        .unwrap_or(0);
    format!("{hostname}/{boot}/{netns}")
}

/// This kernel's boot id: processes in different network namespaces of one machine (emulated
/// hosts, containers) share it — and share its CPUs.
pub fn kernel_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

pub fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "unknown-host".into())
}

/// Whether the kernel keeps time with the CPU's time-stamp counter. It does so only when the
/// counter runs at a constant rate, does not stop in idle states and agrees across CPUs, so
/// reading it directly (a few nanoseconds, no vDSO call) is then a valid monotonic clock on
/// any CPU this process moves to.
pub fn tsc_clock() -> bool {
    cfg!(target_arch = "x86_64")
        && std::fs::read_to_string(
            "/sys/devices/system/clocksource/clocksource0/current_clocksource",
        )
        .is_ok_and(|s| s.trim() == "tsc")
}

//! What the failover links of this process know about rails: which were found dead toward
//! which peer host (and which WARNs were printed), whether an interface is up (`SIOCGIFFLAGS`),
//! and what the kernel says of a connection (`TCP_INFO`).

use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long a dropped rail stays out of use for a peer host before links try it again.
pub fn retry_after(rail_timeout: Duration) -> Duration {
    (rail_timeout * 3).clamp(Duration::from_secs(3), Duration::from_secs(60))
}

/// Rails found dead, per (local interface, peer host), and the WARNs already printed: shared by
/// every link of this process, so new links start on a rail that works and each lost rail is
/// reported once per peer host.
#[derive(Default)]
pub(super) struct Health {
    pub dead: HashMap<(String, String), (Instant, String)>,
    /// Whether a WARN said the rail toward the peer host was lost (true) or back (false).
    pub warned: HashMap<(String, String), bool>,
}

pub(super) fn health() -> std::sync::MutexGuard<'static, Health> {
    static H: OnceLock<Mutex<Health>> = OnceLock::new();
    H.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// Why `ifname` should not be used toward `peer` now: its interface is down here, or a link
/// found it dead within `retry`.
pub(super) fn rail_unusable(ifname: &str, peer: &str, retry: Duration) -> Option<String> {
    if iface_state(ifname) == Some(false) {
        return Some(format!("interface {ifname} is down"));
    }
    let h = health();
    match h.dead.get(&(ifname.to_string(), peer.to_string())) {
        Some((t, why)) if t.elapsed() < retry => Some(why.clone()),
        _ => None,
    }
}

/// Whether the interface is up with a carrier (`None`: cannot tell).
pub(super) fn iface_state(ifname: &str) -> Option<bool> {
    if ifname.is_empty() || ifname.len() >= libc::IFNAMSIZ || ifname == "lo" {
        return None;
    }
    // One datagram socket for the process's life: the rail keeper asks about every link's
    // interfaces at each tick, and a socket opened and closed per question was two of the
    // three system calls (76 a second per rank on 4 emulated hosts).
    static SOCK: OnceLock<Option<OwnedFd>> = OnceLock::new();
    let fd = SOCK
        .get_or_init(|| {
            // SAFETY: socket(2) returns a new descriptor we own, or -1.
            let fd =
                unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
            // SAFETY: fd is open and ours alone.
            (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
        })
        .as_ref()?
        .as_raw_fd();
    // SAFETY: ifreq is plain data; SIOCGIFFLAGS writes only into it.
    unsafe {
        let mut ifr: libc::ifreq = std::mem::zeroed();
        for (d, s) in ifr.ifr_name.iter_mut().zip(ifname.bytes()) {
            *d = s as libc::c_char;
        }
        if libc::ioctl(fd, libc::SIOCGIFFLAGS as _, &mut ifr) < 0 {
            return None;
        }
        let f = ifr.ifr_ifru.ifru_flags as libc::c_int;
        Some(f & libc::IFF_UP != 0 && f & libc::IFF_RUNNING != 0)
    }
}

/// The start of Linux's `struct tcp_info` (the kernel copies as much as asked for).
#[repr(C)]
#[derive(Default)]
pub(super) struct TcpInfo {
    pub state: u8,
    pub ca_state: u8,
    pub retransmits: u8,
    pub probes: u8,
    pub backoff: u8,
    pub options: u8,
    pub wscale: u8,
    pub flags: u8,
    pub rto: u32,
    pub ato: u32,
    pub snd_mss: u32,
    pub rcv_mss: u32,
    pub unacked: u32,
    pub sacked: u32,
    pub lost: u32,
    pub retrans: u32,
    pub fackets: u32,
    pub last_data_sent: u32,
    pub last_ack_sent: u32,
    pub last_data_recv: u32,
    pub last_ack_recv: u32,
}

pub(super) fn tcp_info(fd: RawFd) -> Option<TcpInfo> {
    let mut ti = TcpInfo::default();
    let mut len = std::mem::size_of::<TcpInfo>() as libc::socklen_t;
    // SAFETY: ti is valid for len bytes.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            &mut ti as *mut TcpInfo as *mut libc::c_void,
            &mut len,
        )
    };
    (r == 0).then_some(ti)
}

pub(super) fn mark_dead(ifname: &str, peer: &str, why: &str) {
    health().dead.insert(
        (ifname.to_string(), peer.to_string()),
        (Instant::now(), why.to_string()),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_never_reported_down() {
        assert_eq!(iface_state("lo"), None);
        assert_eq!(iface_state("no-such-if0"), None);
    }
}

//! Rank 0's offer of a bootstrap store, for launchers that carry a few bytes to every rank but
//! no store of their own: MPI (`MPI_Bcast`, [`super::mpi`], feature `mpi`) and a PMI-1 key-value
//! space ([`super::pmi`], e.g. MPICH's `mpiexec`).
//!
//! 1. Rank 0 starts a bootstrap store on `0.0.0.0:<any port>` (the same authenticated
//!    [`store`](crate::store) railrun serves) with a fresh job secret and a random job id, and
//!    describes it in a [`StoreOffer`]: every IPv4 address of its non-loopback interfaces with the
//!    store's port, `127.0.0.1:<port>`, an identity of its network namespace, the secret and the
//!    job id. (If rank 0 cannot start the store, the offer carries the error instead, so no rank
//!    is left waiting.)
//! 2. The launcher's channel carries the encoded offer to every rank.
//! 3. Every rank tries the candidates: loopback first when it shares rank 0's network
//!    namespace (and only then), then addresses on a subnet it is directly attached to, then the
//!    rest; a new candidate is started every 250 ms while earlier ones are still trying, and the
//!    first that passes the secret handshake wins. Wrong hosts (say a docker bridge address that
//!    exists on every node) are harmless: they refuse the connection or fail the handshake.
//!
//! The secret travels inside the launcher's own channel, which has the same trust as railrun's
//! environment (both come from the launcher that started the job).

use super::Rendezvous;
use crate::error::{Error, Result};
use crate::store::{self, auth, StoreClient};
use serde::{Deserialize, Serialize};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener};
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};
/// Largest rendezvous record rank 0 broadcasts (addresses are dropped to fit).
const MAX_RECORD: usize = 64 << 10;

/// Delay between starting successive store address candidates.
const STAGGER: Duration = Duration::from_millis(250);

/// What rank 0 offers: where the store is and how to prove the secret.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct StoreOffer {
    v: u32,
    /// `ip:port` candidates for the store (non-loopback, then `127.0.0.1`).
    addrs: Vec<String>,
    /// Rank 0's network namespace identity: ranks sharing it use `127.0.0.1`.
    netns: String,
    secret: String,
    job: String,
    /// Set instead of the rest when rank 0 could not start the store.
    error: Option<String>,
}

/// This network namespace (boot id + namespace inode): `127.0.0.1` reaches rank 0's store only
/// from the same one. (Not `machine::host_id`: `RAILRING_HOST_ID` may split one machine.)
fn netns_id() -> String {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let ns = std::fs::metadata("/proc/self/ns/net")
        .map(|m| m.ino())
        .unwrap_or(0);
    format!("{boot}/{ns}")
}

/// IPv4 addresses (with netmasks) of this host's up, non-loopback interfaces, in interface order.
fn local_ipv4() -> Vec<(String, Ipv4Addr, Ipv4Addr)> {
    let mut v = Vec::new();
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return v;
    };
    for ifa in addrs {
        if !ifa.flags.contains(nix::net::if_::InterfaceFlags::IFF_UP)
            || ifa
                .flags
                .contains(nix::net::if_::InterfaceFlags::IFF_LOOPBACK)
        {
            continue;
        }
        let Some(ip) = ifa
            .address
            .as_ref()
            .and_then(|a| a.as_sockaddr_in())
            .map(|s| s.ip())
        else {
            continue;
        };
        if ip.is_loopback() || ip.is_unspecified() || ip.is_link_local() {
            continue;
        }
        let mask = ifa
            .netmask
            .as_ref()
            .and_then(|a| a.as_sockaddr_in())
            .map(|s| s.ip())
            .unwrap_or(Ipv4Addr::BROADCAST);
        if !v.iter().any(|(_, a, _)| *a == ip) {
            v.push((ifa.interface_name.clone(), ip, mask));
        }
    }
    v
}

/// Order the candidates for this rank: loopback only (and first) when in rank 0's network
/// namespace; then addresses on a directly attached subnet; then the rest (stable).
fn order_candidates(r: &StoreOffer, same_netns: bool) -> Vec<String> {
    let mine = local_ipv4();
    let attached = |a: &str| -> bool {
        let Ok(sa) = a.parse::<SocketAddrV4>() else {
            return false;
        };
        let ip = u32::from(*sa.ip());
        mine.iter().any(|(_, me, mask)| {
            let m = u32::from(*mask);
            ip & m == u32::from(*me) & m
        })
    };
    let mut out: Vec<String> = Vec::new();
    let is_lo = |a: &String| {
        a.parse::<SocketAddrV4>()
            .map(|s| s.ip().is_loopback())
            .unwrap_or(false)
    };
    if same_netns {
        out.extend(r.addrs.iter().filter(|a| is_lo(a)).cloned());
    }
    out.extend(r.addrs.iter().filter(|a| !is_lo(a) && attached(a)).cloned());
    out.extend(
        r.addrs
            .iter()
            .filter(|a| !is_lo(a) && !attached(a))
            .cloned(),
    );
    out
}

/// Connect to the first candidate that answers and proves the secret (see the module docs).
fn connect_any(
    rank: usize,
    cands: &[String],
    secret: &str,
    connect_timeout: Duration,
    via: &str,
) -> Result<StoreClient> {
    if cands.is_empty() {
        return Err(Error::Invalid(format!(
            "rank {rank}: rank 0 announced no address for its bootstrap store that this rank can use \
             (it has no up, non-loopback IPv4 interface and runs in another network namespace)"
        )));
    }
    let deadline = Instant::now() + connect_timeout;
    let done = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel::<(String, std::result::Result<StoreClient, String>)>();
    for (i, addr) in cands.iter().enumerate() {
        let err_tx = tx.clone();
        let (addr, secret, done, tx) = (addr.clone(), secret.to_string(), done.clone(), tx.clone());
        let start = Instant::now() + STAGGER * i as u32;
        let spawned = std::thread::Builder::new()
            .name("rr-offer-store".into())
            .spawn(move || {
                let mut last = String::from("not tried");
                while Instant::now() < start {
                    if done.load(Ordering::SeqCst) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                while !done.load(Ordering::SeqCst) && Instant::now() < deadline {
                    let left = deadline.saturating_duration_since(Instant::now());
                    match StoreClient::connect(&addr, &secret, left.min(Duration::from_secs(1))) {
                        Ok(c) => {
                            let _ = tx.send((addr, Ok(c)));
                            return;
                        }
                        // Something else listens there (another job, another host): give up on it.
                        Err(e @ crate::store::StoreError::Auth { .. }) => {
                            let _ = tx.send((addr, Err(e.to_string())));
                            return;
                        }
                        Err(e) => last = e.to_string(),
                    }
                }
                let _ = tx.send((addr, Err(last)));
            });
        if let Err(e) = spawned {
            let _ = err_tx.send((
                addr_of(cands, i),
                Err(format!("cannot start a thread: {e}")),
            ));
        }
    }
    drop(tx);
    let mut errors = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now()) + Duration::from_secs(2);
        match rx.recv_timeout(left) {
            Ok((addr, Ok(c))) => {
                done.store(true, Ordering::SeqCst);
                tracing::info!(target: "railring::bootstrap", rank, "{via} bootstrap: store at {addr}");
                return Ok(c);
            }
            Ok((addr, Err(e))) => errors.push(format!("{addr}: {e}")),
            Err(_) => break,
        }
        if errors.len() == cands.len() {
            break;
        }
    }
    done.store(true, Ordering::SeqCst);
    Err(Error::Transport {
        rank,
        what: format!(
            "reaching rank 0's bootstrap store (announced over {via}) within {} s (RAILRING_CONNECT_TIMEOUT); \
             tried: {}",
            connect_timeout.as_secs(),
            errors.join("; ")
        ),
        err: std::io::Error::new(std::io::ErrorKind::TimedOut, "no candidate address worked"),
    })
}

fn addr_of(c: &[String], i: usize) -> String {
    c.get(i).cloned().unwrap_or_default()
}

/// Rank 0: start the store and describe it. Errors are returned as text (they are broadcast).
fn serve_store() -> std::result::Result<(StoreOffer, store::ServerHandle), String> {
    let secret = auth::new_secret().map_err(|e| format!("generating a job secret: {e}"))?;
    let mut id = [0u8; 6];
    auth::random_bytes(&mut id).map_err(|e| format!("generating a job id: {e}"))?;
    let job = format!("rr{}", auth::hex(&id));
    let l = TcpListener::bind("0.0.0.0:0")
        .map_err(|e| format!("rank 0: listening for the bootstrap store on 0.0.0.0: {e}"))?;
    let port = l
        .local_addr()
        .map_err(|e| format!("rank 0: bootstrap store address: {e}"))?
        .port();
    let server = store::serve(l, &secret, store::Store::new())
        .map_err(|e| format!("rank 0: starting the bootstrap store: {e}"))?;
    let mut r = StoreOffer {
        v: 1,
        addrs: Vec::new(),
        netns: netns_id(),
        secret,
        job,
        error: None,
    };
    for (_, ip, _) in local_ipv4() {
        r.addrs.push(SocketAddrV4::new(ip, port).to_string());
    }
    r.addrs
        .push(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port).to_string());
    // Keep the record small: drop non-loopback candidates beyond what fits.
    while serde_json::to_vec(&r).map(|v| v.len()).unwrap_or(0) > MAX_RECORD && r.addrs.len() > 1 {
        r.addrs.remove(r.addrs.len() - 2);
    }
    Ok((r, server))
}

/// Rank 0: start the store and describe it; when that fails, an offer that carries the error
/// (so the other ranks learn it instead of waiting).
pub(crate) fn host() -> (StoreOffer, Option<store::ServerHandle>) {
    match serve_store() {
        Ok((r, s)) => (r, Some(s)),
        Err(e) => (
            StoreOffer {
                v: 1,
                addrs: vec![],
                netns: String::new(),
                secret: String::new(),
                job: String::new(),
                error: Some(e),
            },
            None,
        ),
    }
}

impl StoreOffer {
    /// The offer as JSON bytes (never fails: an encoding error becomes an offer of that error).
    pub(crate) fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_else(|e| {
            format!("{{\"v\":1,\"addrs\":[],\"netns\":\"\",\"secret\":\"\",\"job\":\"\",\"error\":\"encoding: {e}\"}}")
                .into_bytes()
        })
    }

    /// Parse rank 0's offer as carried by `via` (`MPI`, `PMI`): its error, a wrong version and
    /// bytes that do not parse are errors naming `via`.
    pub(crate) fn decode(bytes: &[u8], via: &str) -> Result<StoreOffer> {
        let rec: StoreOffer = serde_json::from_slice(bytes).map_err(|e| {
            Error::Invalid(format!(
                "{via} bootstrap: rank 0's record does not parse ({e}): mismatched railring versions?"
            ))
        })?;
        if let Some(e) = &rec.error {
            return Err(Error::Invalid(format!(
                "{via} bootstrap: rank 0 could not start the bootstrap store: {e}"
            )));
        }
        if rec.v != 1 {
            return Err(Error::Invalid(format!(
                "{via} bootstrap: rank 0 speaks record version {} (this rank: 1): mismatched railring versions",
                rec.v
            )));
        }
        Ok(rec)
    }
}

/// Join the store `rec` offers (rank 0 passes the `server` it started, which must live as long
/// as the communicator): the [`Rendezvous`] of `rank` of `size`.
pub(crate) fn join(
    rank: usize,
    size: usize,
    rec: StoreOffer,
    server: Option<store::ServerHandle>,
    connect_timeout: Duration,
    via: &str,
) -> Result<Rendezvous> {
    let cands = order_candidates(&rec, rec.netns == netns_id());
    let store = Arc::new(connect_any(
        rank,
        &cands,
        &rec.secret,
        connect_timeout,
        via,
    )?);
    let job: String = rec
        .job
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .take(32)
        .collect();
    tracing::info!(target: "railring::init", rank, size, "bootstrap via {via}: store at {}", store.addr());
    Ok(Rendezvous {
        rank,
        size,
        store,
        secret: rec.secret,
        job,
        server,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(addrs: &[&str]) -> StoreOffer {
        StoreOffer {
            v: 1,
            addrs: addrs.iter().map(|s| s.to_string()).collect(),
            netns: String::new(),
            secret: "s".into(),
            job: "j".into(),
            error: None,
        }
    }

    #[test]
    fn loopback_only_in_the_same_namespace_and_first() {
        let r = rec(&["203.0.113.9:5000", "127.0.0.1:5000"]);
        assert_eq!(order_candidates(&r, true)[0], "127.0.0.1:5000");
        assert_eq!(
            order_candidates(&r, false),
            vec!["203.0.113.9:5000".to_string()]
        );
    }

    #[test]
    fn attached_subnets_first() {
        let mine = local_ipv4();
        let Some((_, ip, _)) = mine.first() else {
            return; // no non-loopback interface here: nothing to order
        };
        let near = SocketAddrV4::new(*ip, 7).to_string();
        let r = rec(&["203.0.113.9:7", &near]);
        assert_eq!(order_candidates(&r, false)[0], near);
    }

    #[test]
    fn store_over_the_candidates() {
        // A store on loopback; a dead candidate first: the second one wins.
        let (r, _server) = serve_store().expect("store");
        let dead = TcpListener::bind("127.0.0.1:0").unwrap();
        let dead_addr = dead.local_addr().unwrap().to_string();
        drop(dead);
        let mut cands = vec![dead_addr];
        cands.extend(r.addrs.iter().filter(|a| a.starts_with("127.")).cloned());
        let c = connect_any(1, &cands, &r.secret, Duration::from_secs(5), "test").expect("connect");
        c.set("k", b"v").unwrap();
        // Wrong secret: a clear error naming the candidates, not a hang.
        let e = connect_any(1, &cands[1..], "wrong", Duration::from_secs(1), "test")
            .err()
            .expect("must fail");
        assert!(e.to_string().contains("127.0.0.1"), "{e}");
    }
}

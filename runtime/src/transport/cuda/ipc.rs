//! What local ranks exchange through the bootstrap store to build the GPU fabric: each rank's
//! device (PCI bus id), the CUDA IPC handle of its staging buffer, and afterwards its verdict on
//! whether it can reach every peer's buffer directly. Pure data plus store I/O: tested with a
//! real store on 127.0.0.1 and no GPU.
//!
//! Keys live under `c<comm>/gpu/<epoch>/`: `desc/<local index>` and `verdict/<local index>`.
//! Every member reads every record, so all ranks take the same decision (direct or staged).

use crate::error::{Error, Result};
use crate::store::StoreClient;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Bytes in a `CUipcMemHandle`.
pub const HANDLE_BYTES: usize = 64;

/// A CUDA IPC memory handle (opaque 64 bytes), carried as hex in the store.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct IpcHandle(pub [u8; HANDLE_BYTES]);

impl std::fmt::Debug for IpcHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "IpcHandle({}..)", &self.to_hex()[..16])
    }
}

impl IpcHandle {
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    pub fn from_hex(s: &str) -> Option<IpcHandle> {
        let s = s.trim();
        if s.len() != 2 * HANDLE_BYTES || !s.is_ascii() {
            return None;
        }
        let mut h = [0u8; HANDLE_BYTES];
        for (i, b) in h.iter_mut().enumerate() {
            *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(IpcHandle(h))
    }
}

impl Serialize for IpcHandle {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> Deserialize<'de> for IpcHandle {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        IpcHandle::from_hex(&s).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "an IPC handle is {} hex digits, got {:?}",
                2 * HANDLE_BYTES,
                s.chars().take(20).collect::<String>()
            ))
        })
    }
}

/// One local rank's GPU record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuPeer {
    /// Communicator rank.
    pub rank: usize,
    pub pid: u32,
    /// PCI bus id of its device (`0000:3b:00.0`), the process-independent device name
    /// (ordinals depend on `CUDA_VISIBLE_DEVICES`).
    pub bus_id: String,
    /// Its device ordinal, in its own numbering (for messages only).
    pub ordinal: i32,
    /// IPC handle of its staging buffer (None when it could not export one: then everyone
    /// stages through host memory).
    pub handle: Option<IpcHandle>,
    /// Bytes of the staging buffer.
    pub bytes: usize,
    /// Why it has no handle.
    pub note: Option<String>,
}

impl GpuPeer {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
    pub fn decode(b: &[u8]) -> Result<GpuPeer> {
        serde_json::from_slice(b)
            .map_err(|e| Error::Invalid(format!("GPU fabric record from the store: {e}")))
    }
}

/// A rank's verdict after trying to reach every peer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    pub rank: usize,
    /// None: every peer reachable directly; Some(reason): this rank needs staging.
    pub problem: Option<String>,
}

/// Store key prefix of one fabric set-up.
pub fn prefix(comm: u64, epoch: u64) -> String {
    format!("c{comm:x}/gpu/{epoch}")
}

fn all_keys(prefix: &str, what: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}/{what}/{i}")).collect()
}

fn gather_raw(
    store: &StoreClient,
    prefix: &str,
    what: &str,
    me: usize,
    n: usize,
    mine: &[u8],
    timeout: Duration,
) -> Result<Vec<Vec<u8>>> {
    store.set(&format!("{prefix}/{what}/{me}"), mine)?;
    let keys = all_keys(prefix, what, n);
    store.wait(&keys, timeout)?;
    keys.iter()
        .map(|k| store.get(k, timeout).map_err(Error::from))
        .collect()
}

/// Publish this local rank's record and read all `n` (in local order).
pub fn exchange_peers(
    store: &StoreClient,
    prefix: &str,
    me: usize,
    n: usize,
    mine: &GpuPeer,
    timeout: Duration,
) -> Result<Vec<GpuPeer>> {
    gather_raw(store, prefix, "desc", me, n, &mine.encode(), timeout)?
        .iter()
        .map(|b| GpuPeer::decode(b))
        .collect()
}

/// Publish this rank's verdict and combine everyone's: Ok(()) when every rank can go direct,
/// else the first problem (with its rank), identical on every member.
pub fn agree(
    store: &StoreClient,
    prefix: &str,
    me: usize,
    n: usize,
    mine: &Verdict,
    timeout: Duration,
) -> Result<std::result::Result<(), String>> {
    let raw = gather_raw(
        store,
        prefix,
        "verdict",
        me,
        n,
        &serde_json::to_vec(mine).unwrap_or_default(),
        timeout,
    )?;
    let mut vs = Vec::with_capacity(n);
    for b in raw {
        let v: Verdict = serde_json::from_slice(&b)
            .map_err(|e| Error::Invalid(format!("GPU fabric verdict from the store: {e}")))?;
        vs.push(v);
    }
    Ok(combine(&vs))
}

/// The common decision from every rank's verdict.
pub fn combine(vs: &[Verdict]) -> std::result::Result<(), String> {
    match vs
        .iter()
        .find_map(|v| v.problem.as_ref().map(|p| (v.rank, p)))
    {
        None => Ok(()),
        Some((r, p)) => Err(format!("rank {r}: {p}")),
    }
}

/// How this rank reaches one peer's buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Access {
    /// Itself.
    Local,
    /// Same device, other process: IPC within one device.
    SameDevice,
    /// Another device with peer access (NVLink or PCIe P2P).
    Peer,
}

/// Decide from what the driver said: for each peer, `same` (same bus id as ours) and
/// `can_access` (cuDeviceCanAccessPeer, or None when the peer's device is not visible to this
/// process). Pure, so the policy is tested without a GPU.
pub fn plan_access(
    me: usize,
    peers: &[GpuPeer],
    my_bus: &str,
    can_access: impl Fn(&GpuPeer) -> Option<bool>,
) -> std::result::Result<Vec<Access>, String> {
    let norm = |s: &str| s.trim().to_ascii_lowercase();
    let mut out = Vec::with_capacity(peers.len());
    for (i, p) in peers.iter().enumerate() {
        if i == me {
            out.push(Access::Local);
            continue;
        }
        if p.handle.is_none() {
            return Err(format!(
                "rank {} exported no IPC handle ({})",
                p.rank,
                p.note.as_deref().unwrap_or("unknown reason")
            ));
        }
        if norm(&p.bus_id) == norm(my_bus) {
            out.push(Access::SameDevice);
            continue;
        }
        match can_access(p) {
            Some(true) => out.push(Access::Peer),
            Some(false) => {
                return Err(format!(
                "no peer access from GPU {my_bus} to GPU {} (rank {}): cuDeviceCanAccessPeer = 0",
                p.bus_id, p.rank
            ))
            }
            None => {
                return Err(format!(
                    "GPU {} of rank {} is not visible to this process (CUDA_VISIBLE_DEVICES?)",
                    p.bus_id, p.rank
                ))
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::serve;
    use crate::store::Store;
    use std::net::TcpListener;
    use std::sync::Arc;

    fn peer(rank: usize, bus: &str, h: Option<u8>) -> GpuPeer {
        GpuPeer {
            rank,
            pid: 1000 + rank as u32,
            bus_id: bus.into(),
            ordinal: 0,
            handle: h.map(|b| {
                let mut x = [0u8; HANDLE_BYTES];
                for (i, v) in x.iter_mut().enumerate() {
                    *v = b.wrapping_add(i as u8);
                }
                IpcHandle(x)
            }),
            bytes: 1 << 20,
            note: None,
        }
    }

    #[test]
    fn handle_hex_round_trip() {
        let p = peer(3, "0000:3b:00.0", Some(0xf0));
        let h = p.handle.unwrap();
        assert_eq!(h.to_hex().len(), 128);
        assert_eq!(IpcHandle::from_hex(&h.to_hex()), Some(h));
        assert_eq!(IpcHandle::from_hex("abc"), None);
        assert_eq!(IpcHandle::from_hex(&"zz".repeat(64)), None);
        assert_eq!(
            IpcHandle::from_hex(&"é".repeat(64)),
            None,
            "non-ASCII never panics"
        );
        let d = GpuPeer::decode(&p.encode()).unwrap();
        assert_eq!(d, p);
        assert!(GpuPeer::decode(b"{\"rank\":1}").is_err());
        let mut js: serde_json::Value = serde_json::from_slice(&p.encode()).unwrap();
        js["handle"] = serde_json::Value::String("00".into());
        assert!(GpuPeer::decode(&serde_json::to_vec(&js).unwrap()).is_err());
    }

    #[test]
    fn exchange_through_a_real_store() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let srv = serve(l, "s3cret", Store::new()).unwrap();
        let addr = srv.addr.to_string();
        let n = 4;
        let t = Duration::from_secs(20);
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let addr = addr.clone();
                std::thread::spawn(move || {
                    let c = Arc::new(StoreClient::connect(&addr, "s3cret", t).unwrap());
                    let pre = prefix(0x1f, 1);
                    // two ranks per GPU, as on a 2-GPU node with 4 ranks
                    let mine = peer(10 + i, &format!("0000:{:02x}:00.0", i / 2), Some(i as u8));
                    let all = exchange_peers(&c, &pre, i, n, &mine, t).unwrap();
                    assert_eq!(all[i], mine);
                    let acc = plan_access(i, &all, &mine.bus_id, |_| Some(i != 3));
                    let v = Verdict {
                        rank: 10 + i,
                        problem: acc.as_ref().err().cloned(),
                    };
                    let d = agree(&c, &pre, i, n, &v, t).unwrap();
                    (all, d)
                })
            })
            .collect();
        let res: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        for (all, d) in &res {
            assert_eq!(all.len(), n);
            for (i, p) in all.iter().enumerate() {
                assert_eq!(p.rank, 10 + i);
                assert_eq!(p.handle.unwrap().0[0], i as u8);
            }
            // rank 13 cannot reach the other GPU: everyone agrees to stage, with its reason
            let e = d.clone().unwrap_err();
            assert!(e.starts_with("rank 13: no peer access"), "{e}");
        }
    }

    #[test]
    fn access_policy() {
        let ps = vec![
            peer(0, "0000:3B:00.0", Some(1)),
            peer(1, "0000:3b:00.0", Some(2)),
            peer(2, "0000:5e:00.0", Some(3)),
        ];
        let a = plan_access(0, &ps, "0000:3b:00.0", |_| Some(true)).unwrap();
        assert_eq!(a, vec![Access::Local, Access::SameDevice, Access::Peer]);
        let e = plan_access(0, &ps, "0000:3b:00.0", |_| Some(false)).unwrap_err();
        assert!(e.contains("cuDeviceCanAccessPeer = 0"), "{e}");
        let e = plan_access(0, &ps, "0000:3b:00.0", |_| None).unwrap_err();
        assert!(e.contains("not visible"), "{e}");
        // several ranks on one GPU never need peer access
        let one = vec![
            peer(0, "x", Some(1)),
            peer(1, "x", Some(2)),
            peer(2, "x", Some(3)),
        ];
        let a = plan_access(2, &one, "x", |_| panic!("not asked")).unwrap();
        assert_eq!(
            a,
            vec![Access::SameDevice, Access::SameDevice, Access::Local]
        );
        let mut no = one.clone();
        no[1].handle = None;
        no[1].note = Some("cuIpcGetMemHandle failed".into());
        let e = plan_access(0, &no, "x", |_| Some(true)).unwrap_err();
        assert!(
            e.contains("exported no IPC handle (cuIpcGetMemHandle failed)"),
            "{e}"
        );
    }

    #[test]
    fn verdicts_combine_identically() {
        let ok = |r| Verdict {
            rank: r,
            problem: None,
        };
        assert_eq!(combine(&[ok(0), ok(1)]), Ok(()));
        let bad = Verdict {
            rank: 5,
            problem: Some("x".into()),
        };
        assert_eq!(
            combine(&[ok(0), bad.clone(), ok(2)]),
            Err("rank 5: x".into())
        );
        assert_eq!(combine(&[]), Ok(()));
    }
}

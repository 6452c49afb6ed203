//! Connection records: what each side of an RDMA link publishes in the bootstrap store
//! ([`ConnInfo`]: queue pair, addressing, ring and mailbox) and under which keys
//! ([`conn_keys`]).

use serde::{Deserialize, Serialize};
use std::io;

/// What each side of a link publishes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnInfo {
    pub qpn: u32,
    pub lid: u16,
    /// GID as 32 hex digits (all zero on InfiniBand without routing).
    pub gid: String,
    pub psn: u32,
    /// `ibv_mtu` enum value of the active MTU.
    pub mtu: u32,
    pub ring_addr: u64,
    pub ring_rkey: u32,
    pub mailbox_addr: u64,
    pub mailbox_rkey: u32,
    pub slots: u32,
    pub slot_bytes: u32,
}

impl ConnInfo {
    pub fn gid_bytes(&self) -> Option<[u8; 16]> {
        let s = self.gid.trim();
        if s.len() != 32 {
            return None;
        }
        let mut g = [0u8; 16];
        for (i, b) in g.iter_mut().enumerate() {
            *b = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(g)
    }

    pub fn gid_hex(g: &[u8; 16]) -> String {
        g.iter().map(|b| format!("{b:02x}")).collect()
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    pub fn decode(b: &[u8]) -> io::Result<ConnInfo> {
        let c: ConnInfo = serde_json::from_slice(b).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("bad RDMA connection record: {e}"),
            )
        })?;
        if c.gid_bytes().is_none() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("bad GID {:?} in RDMA connection record", c.gid),
            ));
        }
        Ok(c)
    }
}

/// Store keys of the record `from` publishes for `to` on channel `chan`, and its "RTR" flag.
pub fn conn_keys(comm: u64, chan: usize, from: usize, to: usize) -> (String, String) {
    let k = format!("c{comm:x}/ib/{chan}/{from}-{to}");
    let r = format!("{k}/rtr");
    (k, r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conn_info_round_trips_and_rejects_garbage() {
        let c = ConnInfo {
            qpn: 0x1234,
            lid: 7,
            gid: ConnInfo::gid_hex(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8]),
            psn: 0xabcdef,
            mtu: 5,
            ring_addr: 0x7f00_0000_1000,
            ring_rkey: 0x55,
            mailbox_addr: 0x7f00_0000_9000,
            mailbox_rkey: 0x66,
            slots: 8,
            slot_bytes: 1 << 19,
        };
        let d = ConnInfo::decode(&c.encode()).unwrap();
        assert_eq!(d, c);
        assert_eq!(d.gid_bytes().unwrap()[0], 0xfe);
        assert!(ConnInfo::decode(b"{").is_err());
        let mut bad = c.clone();
        bad.gid = "zz".into();
        assert!(ConnInfo::decode(&bad.encode()).is_err());
        let (k, r) = conn_keys(0x1f, 3, 0, 5);
        assert_eq!(k, "c1f/ib/3/0-5");
        assert_eq!(r, "c1f/ib/3/0-5/rtr");
    }
}

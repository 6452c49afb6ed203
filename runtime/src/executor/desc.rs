//! The call descriptor ([`CallDesc`]): the identity of one collective call (sequence number,
//! kind, dtype, count, op, root, communicator), encoded into the [`DESC`] bytes that the first
//! transfer with each peer carries and in-node fabrics compare, decoded and described for
//! mismatch and timeout errors.

use crate::transport::DESC;
use railring_collectives::plan::CollKind;
use railring_collectives::{DataType, ReduceOp};

/// The identity of one collective call, compared across ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallDesc {
    pub seq: u64,
    pub kind: CollKind,
    pub dtype: DataType,
    pub op: ReduceOp,
    pub count: u64,
    pub root: u32,
    pub comm: u64,
}

const HDR_MAGIC: u32 = 0x5252_4844; // "RRHD"

impl CallDesc {
    pub fn encode(&self) -> [u8; DESC] {
        let mut b = [0u8; DESC];
        b[0..4].copy_from_slice(&HDR_MAGIC.to_le_bytes());
        b[4] = self.kind as u8;
        b[5] = self.dtype as u8;
        b[6] = self.op as u8;
        b[8..16].copy_from_slice(&self.seq.to_le_bytes());
        b[16..24].copy_from_slice(&self.count.to_le_bytes());
        b[24..28].copy_from_slice(&self.root.to_le_bytes());
        b[32..40].copy_from_slice(&self.comm.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; DESC]) -> Option<CallDesc> {
        if u32::from_le_bytes(b[0..4].try_into().ok()?) != HDR_MAGIC {
            return None;
        }
        Some(CallDesc {
            kind: CallDesc::kind_of(b)?,
            dtype: DataType::from_u8(b[5])?,
            op: ReduceOp::from_u8(b[6])?,
            seq: u64::from_le_bytes(b[8..16].try_into().ok()?),
            count: u64::from_le_bytes(b[16..24].try_into().ok()?),
            root: u32::from_le_bytes(b[24..28].try_into().ok()?),
            comm: u64::from_le_bytes(b[32..40].try_into().ok()?),
        })
    }

    /// The collective an encoded descriptor names, without decoding the rest.
    pub fn kind_of(b: &[u8; DESC]) -> Option<CollKind> {
        CollKind::from_u8(b[4])
    }

    pub fn describe(&self) -> String {
        let mut s = format!(
            "{} #{} ({} x {}",
            self.kind, self.seq, self.count, self.dtype
        );
        if matches!(
            self.kind,
            CollKind::AllReduce | CollKind::ReduceScatter | CollKind::Reduce
        ) {
            s.push_str(&format!(", op {}", self.op));
        }
        if matches!(self.kind, CollKind::Broadcast | CollKind::Reduce) {
            s.push_str(&format!(", root {}", self.root));
        }
        s.push(')');
        s
    }

    pub fn describe_bytes(b: &[u8; DESC]) -> String {
        match CallDesc::decode(b) {
            Some(d) => d.describe(),
            None => "an unknown call (corrupt descriptor)".into(),
        }
    }
}

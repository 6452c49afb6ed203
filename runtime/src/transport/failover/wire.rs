//! The failover link's frames: a 16-byte header `magic "RR" | kind | 0 | u32 | u64` for data
//! (`len`, stream offset), acknowledgements (offset taken) and `RESUME` (generation, offset
//! taken), with the checks that refuse anything else.

/// Largest data frame (payload bytes).
pub const FRAME_MAX: usize = 256 << 10;
pub(super) const HDR: usize = 16;
const MAGIC: [u8; 2] = *b"RR";
const DATA: u8 = 1;
const ACK: u8 = 2;
const RESUME: u8 = 3;
/// Generations live in the top byte of the hello's channel.
pub(super) const MAX_GEN: u32 = 255;

/// A decoded frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Frame {
    Data { len: u32, seq: u64 },
    Ack { upto: u64 },
    Resume { gen: u32, consumed: u64 },
}

pub(super) fn encode(f: Frame) -> [u8; HDR] {
    let (kind, a, b) = match f {
        Frame::Data { len, seq } => (DATA, len, seq),
        Frame::Ack { upto } => (ACK, 0, upto),
        Frame::Resume { gen, consumed } => (RESUME, gen, consumed),
    };
    let mut h = [0u8; HDR];
    h[..2].copy_from_slice(&MAGIC);
    h[2] = kind;
    h[4..8].copy_from_slice(&a.to_le_bytes());
    h[8..16].copy_from_slice(&b.to_le_bytes());
    h
}

pub(super) fn decode(h: &[u8; HDR]) -> Result<Frame, String> {
    if h[..2] != MAGIC || h[3] != 0 {
        return Err(format!("bad frame header {:02x?}", &h[..4]));
    }
    let a = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
    let mut b8 = [0u8; 8];
    b8.copy_from_slice(&h[8..16]);
    let b = u64::from_le_bytes(b8);
    match h[2] {
        DATA if a > 0 && a as usize <= FRAME_MAX => Ok(Frame::Data { len: a, seq: b }),
        DATA => Err(format!("data frame of {a} bytes")),
        ACK => Ok(Frame::Ack { upto: b }),
        RESUME if (1..=MAX_GEN).contains(&a) => Ok(Frame::Resume {
            gen: a,
            consumed: b,
        }),
        k => Err(format!("frame kind {k} (generation {a})")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_garbage_is_refused() {
        for f in [
            Frame::Data { len: 1, seq: 0 },
            Frame::Data {
                len: FRAME_MAX as u32,
                seq: u64::MAX - 5,
            },
            Frame::Ack { upto: 77 },
            Frame::Resume {
                gen: 3,
                consumed: 1 << 40,
            },
        ] {
            assert_eq!(decode(&encode(f)), Ok(f));
        }
        let mut h = encode(Frame::Ack { upto: 1 });
        h[0] = b'X';
        assert!(decode(&h).is_err());
        let mut h = encode(Frame::Data { len: 1, seq: 0 });
        h[4..8].copy_from_slice(&((FRAME_MAX + 1) as u32).to_le_bytes());
        assert!(decode(&h).is_err());
        h[4..8].copy_from_slice(&0u32.to_le_bytes());
        assert!(decode(&h).is_err());
        let mut h = encode(Frame::Resume {
            gen: 1,
            consumed: 0,
        });
        h[4..8].copy_from_slice(&0u32.to_le_bytes());
        assert!(decode(&h).is_err());
        h[2] = 9;
        assert!(decode(&h).is_err());
    }
}

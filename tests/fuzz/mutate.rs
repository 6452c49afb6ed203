//! Mutations: small random edits of a seed, biased towards what breaks parsers (boundary
//! numbers, grammar tokens, repeated ranges that deepen nesting).

pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

const NUMBERS: &[&str] = &[
    "0",
    "-1",
    "1",
    "255",
    "256",
    "65535",
    "65536",
    "65537",
    "2147483647",
    "4294967295",
    "4294967296",
    "9223372036854775807",
    "18446744073709551615",
    "18446744073709551616",
    "99999999999999999999999",
    "1e308",
    "nan",
    "-0",
    "0x",
    "1T",
    "1G",
    "0.5",
];
const BYTES: &[u8] = &[
    0, 0xff, 0x7f, 0x80, b'\n', b'\r', b' ', b'\t', b'"', b'\'', b'<', b'>', b'/', b'=', b':',
    b',', b'-', b'[', b']', b'@', b'#', b'&', b';', b'%', b'\\',
];

/// Mutate `data` in place (1 to 8 edits), using `dict` tokens and `others` for splices.
pub fn mutate(rng: &mut Rng, data: &mut Vec<u8>, dict: &[&str], others: &[Vec<u8>]) {
    let n = 1 + rng.below(8);
    for _ in 0..n {
        let len = data.len();
        match rng.below(11) {
            0 if len > 0 => {
                let i = rng.below(len);
                data[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                data[i] = BYTES[rng.below(BYTES.len())];
            }
            2 => {
                let i = rng.below(len + 1);
                let t = NUMBERS[rng.below(NUMBERS.len())].as_bytes();
                data.splice(i..i, t.iter().copied());
            }
            3 if !dict.is_empty() => {
                let i = rng.below(len + 1);
                let t = dict[rng.below(dict.len())].as_bytes();
                data.splice(i..i, t.iter().copied());
            }
            4 if len > 0 => {
                let a = rng.below(len);
                let b = (a + 1 + rng.below(64)).min(len);
                data.drain(a..b);
            }
            5 if len > 0 => {
                // repeat a range a few or many times (deep nesting, long lists)
                let a = rng.below(len);
                let b = (a + 1 + rng.below(32)).min(len);
                let piece = data[a..b].to_vec();
                let times = if rng.below(8) == 0 {
                    1 + rng.below(2000)
                } else {
                    1 + rng.below(4)
                };
                let rep: Vec<u8> = piece
                    .iter()
                    .copied()
                    .cycle()
                    .take(piece.len() * times)
                    .collect();
                data.splice(b..b, rep);
            }
            6 if !others.is_empty() => {
                let o = &others[rng.below(others.len())];
                if !o.is_empty() {
                    let a = rng.below(o.len());
                    let b = (a + 1 + rng.below(256)).min(o.len());
                    let i = rng.below(len + 1);
                    data.splice(i..i, o[a..b].iter().copied());
                }
            }
            7 if len > 0 => {
                // replace a run of digits with a boundary number
                let i = rng.below(len);
                if let Some(s) = (i..len).find(|&k| data[k].is_ascii_digit()) {
                    let e = (s..len).find(|&k| !data[k].is_ascii_digit()).unwrap_or(len);
                    let t = NUMBERS[rng.below(NUMBERS.len())].as_bytes();
                    data.splice(s..e, t.iter().copied());
                }
            }
            8 => {
                let i = rng.below(len + 1);
                let k = 1 + rng.below(16);
                let r: Vec<u8> = (0..k).map(|_| rng.next() as u8).collect();
                data.splice(i..i, r);
            }
            9 if len > 1 => data.truncate(rng.below(len)),
            _ => {
                if len >= 4 {
                    // a little-endian length or count field set to a boundary
                    let i = rng.below(len - 3);
                    let v: u32 =
                        [0, 1, 0x7fff_ffff, 0xffff_ffff, 64 << 20, (64 << 20) + 4097][rng.below(6)];
                    data[i..i + 4].copy_from_slice(&v.to_le_bytes());
                }
            }
        }
        if data.len() > 4 << 20 {
            data.truncate(4 << 20);
        }
    }
}

//! [`FxMap`] and [`FxSet`]: hash maps and sets keyed by small integers that the library itself makes.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// A fast hasher for small integer keys (FxHash's multiply-rotate): the fabric schedule hashes a
/// few million queue keys for 100 000 ranks, and the runtime looks a call's plan and links up in
/// maps on every call; SipHash's resistance to hostile keys is not needed for keys the plans and
/// the runtime make.
#[derive(Default, Clone, Copy)]
pub struct Fx(u64);

impl Hasher for Fx {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    fn write_u32(&mut self, v: u32) {
        self.write_u64(v as u64);
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// A hash map with [`Fx`].
pub type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<Fx>>;

/// A hash set with [`Fx`] (made without reading any random keys).
pub type FxSet<K> = HashSet<K, BuildHasherDefault<Fx>>;

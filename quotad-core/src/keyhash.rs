//! The hasher of the in-memory maps whose keys carry their hash already: the limiter's entries
//! and the usage history's rows hash a key's strings once, and the map takes that hash as it
//! is. It sits below both, so neither needs the other to build its maps.

use std::hash::{BuildHasher, Hasher};

/// The maps' hasher: keys carry their hash already.
#[derive(Clone, Copy, Default)]
pub struct KeyHash(u64);

impl Hasher for KeyHash {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used; anything else still hashes soundly.
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

#[derive(Clone, Copy, Default)]
pub struct BuildKeyHash;

impl BuildHasher for BuildKeyHash {
    type Hasher = KeyHash;
    fn build_hasher(&self) -> KeyHash {
        KeyHash::default()
    }
}

//! Test-only helpers: a deterministic RNG and a byte-string mutator for the
//! property tests (no extra crates needed).

/// xorshift64: tiny, deterministic, good enough to shake out parser edge cases.
pub(crate) struct XorShift(pub(crate) u64);

impl XorShift {
    pub(crate) fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// Uniform-ish in `0..n` (0 when `n == 0`).
    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next() % (n.max(1) as u64)) as usize
    }
}

/// Applies 1-5 random edits (bit flips, inserts of syntax-relevant bytes,
/// deletions, duplications, truncation) to `seed`.
pub(crate) fn mutate(rng: &mut XorShift, seed: &[u8]) -> Vec<u8> {
    const INTERESTING: &[u8] = b"\r\n \t:;,=\0\x7f\x80\xff/?*#@\"\\0aAfF-";
    let mut v = seed.to_vec();
    for _ in 0..=rng.below(4) {
        let at = rng.below(v.len() + 1);
        match rng.below(6) {
            0 if at < v.len() => v[at] ^= 1 << rng.below(8),
            1 => v.insert(at, INTERESTING[rng.below(INTERESTING.len())]),
            2 => v.insert(at, rng.next() as u8),
            3 if at < v.len() => {
                v.remove(at);
            }
            4 => {
                let end = (at + rng.below(8)).min(v.len());
                let dup = v[at..end].to_vec();
                v.splice(at..at, dup);
            }
            _ => v.truncate(at.max(1)),
        }
    }
    v
}

//! FNV-1a, 64 bits: the hash shaper places things by where the placement must be the same
//! in every build (a subscriber's entry, a plan's slots, an attachment in the change log).
//! Not for anything an adversary could choose to collide at a cost to others than itself.

/// FNV-1a of `bytes`.
pub fn fnv1a(bytes: impl IntoIterator<Item = u8>) -> u64 {
    bytes.into_iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn known_values() {
        // From the FNV reference (draft-eastlake-fnv): "" and "a".
        assert_eq!(super::fnv1a(*b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(super::fnv1a(*b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}

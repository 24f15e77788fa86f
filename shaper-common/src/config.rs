//! Building a [`Config`] in userspace: the limit, the key and the prefix masks the
//! per-packet path ANDs addresses with (so it never loops over bits).

use core::fmt;

use crate::{
    gcra::{Limit, LimitError},
    maps::{Config, DEFAULT_PREFIX_V4, DEFAULT_PREFIX_V6, KEY_BY_DST, KEY_BY_SRC},
};

/// Why the values asked for cannot form a [`Config`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigError {
    Limit(LimitError),
    /// Not one of the `KEY_BY_*` values.
    KeyBy(u32),
    /// An IPv4 prefix longer than 32 bits.
    PrefixV4(u32),
    /// An IPv6 prefix longer than 128 bits.
    PrefixV6(u32),
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Limit(e) => e.fmt(f),
            Self::KeyBy(k) => write!(f, "unknown key {k} (0 = source, 1 = destination)"),
            Self::PrefixV4(p) => write!(f, "IPv4 prefix /{p} is longer than 32 bits"),
            Self::PrefixV6(p) => write!(f, "IPv6 prefix /{p} is longer than 128 bits"),
        }
    }
}

impl From<LimitError> for ConfigError {
    fn from(e: LimitError) -> Self {
        Self::Limit(e)
    }
}

/// The mask of an IPv4 prefix of `prefix` bits (at most 32) in the form of
/// [`Config::mask_v4`]: its bytes in network order, read as a native u32.
pub fn mask_v4(prefix: u32) -> u32 {
    let bits = u32::MAX.checked_shl(32 - prefix.min(32)).unwrap_or(0);
    u32::from_ne_bytes(bits.to_be_bytes())
}

/// The mask of an IPv6 prefix of `prefix` bits (at most 128), bytes in network order.
pub fn mask_v6(prefix: u32) -> [u8; 16] {
    let bits = u128::MAX.checked_shl(128 - prefix.min(128)).unwrap_or(0);
    bits.to_be_bytes()
}

impl Config {
    /// An active policy: `rate_bps` bits per second and `burst_bytes` bytes per key, keyed
    /// by `key_by` (`KEY_BY_*`) masked to `prefix_v4` / `prefix_v6` bits, attached in
    /// `xdp_mode` (`XDP_MODE_*`, or 0 while not yet known).
    pub fn new(
        rate_bps: u64,
        burst_bytes: u64,
        key_by: u32,
        prefix_v4: u32,
        prefix_v6: u32,
        xdp_mode: u32,
    ) -> Result<Self, ConfigError> {
        let limit = Limit::new(rate_bps, burst_bytes)?;
        if key_by != KEY_BY_SRC && key_by != KEY_BY_DST {
            return Err(ConfigError::KeyBy(key_by));
        }
        if prefix_v4 > 32 {
            return Err(ConfigError::PrefixV4(prefix_v4));
        }
        if prefix_v6 > 128 {
            return Err(ConfigError::PrefixV6(prefix_v6));
        }
        Ok(Self {
            limit,
            rate_bps,
            burst_bytes,
            xdp_mode,
            active: 1,
            key_by,
            prefix_v4,
            prefix_v6,
            mask_v4: mask_v4(prefix_v4),
            mask_v6: mask_v6(prefix_v6),
        })
    }

    /// [`Config::new`] with the defaults: keyed by source address at /32 and /64, attach
    /// mode not yet known.
    pub fn per_source(rate_bps: u64, burst_bytes: u64) -> Result<Self, ConfigError> {
        Self::new(
            rate_bps,
            burst_bytes,
            KEY_BY_SRC,
            DEFAULT_PREFIX_V4,
            DEFAULT_PREFIX_V6,
            0,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The mask bytes in network order, as an operator writes them.
    fn v4_bytes(prefix: u32) -> [u8; 4] {
        mask_v4(prefix).to_ne_bytes()
    }

    #[test]
    fn ipv4_masks() {
        assert_eq!(v4_bytes(0), [0, 0, 0, 0]);
        assert_eq!(v4_bytes(1), [0x80, 0, 0, 0]);
        assert_eq!(v4_bytes(24), [255, 255, 255, 0]);
        assert_eq!(v4_bytes(31), [255, 255, 255, 254]);
        assert_eq!(v4_bytes(32), [255, 255, 255, 255]);
        // Applied the way the program applies it: to the address bytes read as a u32.
        let addr = u32::from_ne_bytes([198, 51, 100, 77]);
        assert_eq!((addr & mask_v4(24)).to_ne_bytes(), [198, 51, 100, 0]);
        assert_eq!((addr & mask_v4(12)).to_ne_bytes(), [198, 48, 0, 0]);
    }

    #[test]
    fn ipv6_masks() {
        let ff = 0xff;
        assert_eq!(mask_v6(0), [0; 16]);
        assert_eq!(
            mask_v6(1),
            [0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(
            mask_v6(48),
            [ff, ff, ff, ff, ff, ff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(
            mask_v6(64),
            [ff, ff, ff, ff, ff, ff, ff, ff, 0, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(
            mask_v6(65),
            [ff, ff, ff, ff, ff, ff, ff, ff, 0x80, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(mask_v6(127)[15], 0xfe);
        assert_eq!(mask_v6(128), [ff; 16]);
    }

    #[test]
    fn config_validates_and_carries_masks() {
        let c = Config::new(
            10_000_000,
            65_536,
            KEY_BY_DST,
            DEFAULT_PREFIX_V4,
            DEFAULT_PREFIX_V6,
            0,
        )
        .unwrap();
        assert_eq!(c.active, 1);
        assert_eq!((c.key_by, c.prefix_v4, c.prefix_v6), (KEY_BY_DST, 32, 64));
        assert_eq!(c.mask_v4, u32::MAX);
        assert_eq!(c.mask_v6, mask_v6(64));
        assert_eq!(c.limit, Limit::new(10_000_000, 65_536).unwrap());

        assert_eq!(
            Config::new(10_000_000, 65_536, 2, 32, 64, 0),
            Err(ConfigError::KeyBy(2))
        );
        assert_eq!(
            Config::new(10_000_000, 65_536, KEY_BY_SRC, 33, 64, 0),
            Err(ConfigError::PrefixV4(33))
        );
        assert_eq!(
            Config::new(10_000_000, 65_536, KEY_BY_SRC, 32, 129, 0),
            Err(ConfigError::PrefixV6(129))
        );
        assert_eq!(
            Config::new(7, 65_536, KEY_BY_SRC, 32, 64, 0),
            Err(ConfigError::Limit(LimitError::RateTooLow))
        );
        assert!(Config::new(10_000_000, 65_536, KEY_BY_SRC, 0, 0, 0).is_ok());
        assert!(Config::new(10_000_000, 65_536, KEY_BY_SRC, 32, 128, 0).is_ok());
    }
}

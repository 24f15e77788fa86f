//! Layout 6 (shaper as of commit b3662dc, before the second meter): the settings and
//! counters' values as those builds wrote them, and what they become now. Layout 7
//! appended the second meter to each of them and changed nothing before it, so a layout-6
//! value is today's first bytes (the offsets asserted in `shaper_common::maps` and below),
//! and what it becomes is today's value with a zero tail: no second meter, nothing it
//! counted. Every other value type of layout 6 is today's.

use std::mem::offset_of;

use shaper_common::maps::{Config, Counters, Policy, PolicyStats};

/// A layout-6 value of today's type `T`: its first `N` bytes, aligned as `T`.
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prefix<const N: usize>(pub [u8; N]);

impl<const N: usize> Default for Prefix<N> {
    fn default() -> Self {
        Self([0; N])
    }
}

// SAFETY: #[repr(C)], bytes only, its size a multiple of its alignment (asserted below).
unsafe impl<const N: usize> aya::Pod for Prefix<N> {}

/// `SHAPER_CONFIG`'s value in layout 6 (184 bytes).
pub type Config6 = Prefix<184>;
/// `SHAPER_POLICIES`' value in layout 6 (184 bytes).
pub type Policy6 = Prefix<184>;
/// `SHAPER_COUNTERS`' (and the carried counters') value in layout 6 (464 bytes).
pub type Counters6 = Prefix<464>;
/// `SHAPER_POLICY_STATS`' (and the carried ones') value in layout 6 (152 bytes).
pub type PolicyStats6 = Prefix<152>;

const _: () = assert!(offset_of!(Config, meter2) == size_of::<Config6>());
const _: () = assert!(offset_of!(Policy, meter2) == size_of::<Policy6>());
const _: () = assert!(offset_of!(Counters, meter2) == size_of::<Counters6>());
const _: () = assert!(offset_of!(PolicyStats, meter2) == size_of::<PolicyStats6>());
// The second meter is the last field of each: nothing after it for layout 6 to hold.
const _: () = assert!(offset_of!(Config, meter2) + 88 == size_of::<Config>());
const _: () = assert!(offset_of!(Policy, meter2) + 88 == size_of::<Policy>());
const _: () = assert!(offset_of!(Counters, meter2) + 32 == size_of::<Counters>());
const _: () = assert!(offset_of!(PolicyStats, meter2) + 32 == size_of::<PolicyStats>());

impl<const N: usize> Prefix<N> {
    /// Today's value of type `T` whose first `N` bytes these are, the rest zero (the
    /// default of the second meter's fields: none, nothing counted).
    pub fn current<T: Copy + Default>(&self) -> T {
        const { assert!(N <= size_of::<T>()) };
        let mut value = T::default();
        // SAFETY: `T` is one of the #[repr(C)] integer-only map value types above, whose
        // first N bytes layout 6 wrote; N is at most its size (asserted).
        unsafe {
            std::ptr::copy_nonoverlapping(self.0.as_ptr(), (&raw mut value).cast::<u8>(), N);
        }
        value
    }
}

#[cfg(test)]
mod tests {
    use shaper_common::maps::Meter2;

    use super::*;

    #[test]
    fn a_layout6_value_is_todays_without_the_second_meter() {
        let mut config = Config::per_source(8_000_000, 65_536).unwrap();
        config.trace_seed = 0x0123_4567_89ab_cdef;
        // SAFETY: Config is #[repr(C)] of integers; its first 184 bytes.
        let bytes: [u8; 184] = unsafe { *(&raw const config).cast::<[u8; 184]>() };
        let back: Config = Config6::default().current();
        assert_eq!(back, Config::default());
        let back: Config = Prefix(bytes).current();
        assert_eq!(back, config);
        assert_eq!(back.meter2, Meter2::default());
    }
}

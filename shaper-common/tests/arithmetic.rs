//! The arithmetic's edges the unit tests beside it left open, found by `cargo xtask
//! mutants` (docs/contributing/testing.md): the clock's conversion to ticks, an empty
//! cell's boundaries, the dither's exact function and spread, a cost's rounding at its
//! dither, the configuration's accessors and defaults, and rescaling's exact quotients.

use shaper_common::{
    config::{ConfigError, RateLimit, ShapeError},
    gcra::{
        Limit, LimitError, MAX_FRAME_BYTES, STALE_AHEAD_TICKS, TICK_SHIFT, TICKS_PER_SEC, dither,
        drained, ticks_from_ns,
    },
    maps::{Admission, Config, DEFAULT_PREFIX_V4, DEFAULT_PREFIX_V6, KEY_BY_SRC},
    rescale::mul_div_up,
};

#[test]
fn nanoseconds_become_ticks() {
    assert_eq!(ticks_from_ns(0), 0);
    assert_eq!(ticks_from_ns(1), 1 << TICK_SHIFT);
    assert_eq!(ticks_from_ns(1_000_000_000), TICKS_PER_SEC);
    assert_eq!(ticks_from_ns(3), 3 << TICK_SHIFT);
}

#[test]
fn a_cell_is_drained_when_behind_now_or_stale() {
    let now = 1_000_000_u64 << TICK_SHIFT;
    assert!(drained(now, now), "a TAT at now is empty");
    assert!(drained(now - 1, now));
    assert!(!drained(now + 1, now));
    // Up to STALE_AHEAD_TICKS ahead is a debt; past it, a stale cell.
    assert!(!drained(now + STALE_AHEAD_TICKS, now));
    assert!(drained(now + STALE_AHEAD_TICKS + 1, now));
}

#[test]
fn dither_is_splitmix64s_finalizer_of_tat_xor_now() {
    // Worked out apart from the crate (the finalizer's constants, then the low 32 bits).
    assert_eq!(dither(0, 1), 0x100b_05e5);
    assert_eq!(dither(1, 0), 0x100b_05e5);
    assert_eq!(
        dither(0x0123_4567_89ab_cdef, 0xfedc_ba98_7654_3210),
        0xf2cb_bd7b
    );
    assert_eq!(dither(1 << 40, 3), 0x20f0_6e57);
    // Spread: over successive TATs one cost apart, the mean is half the range and each
    // bit is set half the time (within 3% over 4,096 draws).
    let n = 4096u64;
    let draws: Vec<u32> = (0..n).map(|i| dither(1_000 + i * 64_123, 777)).collect();
    let mean = draws.iter().map(|&d| f64::from(d)).sum::<f64>() / n as f64;
    assert!(
        (mean / f64::from(u32::MAX) - 0.5).abs() < 0.03,
        "mean {mean}"
    );
    for bit in 0..32 {
        let set = draws.iter().filter(|&&d| d >> bit & 1 == 1).count() as f64;
        assert!(
            (set / n as f64 - 0.5).abs() < 0.03,
            "bit {bit}: {set} of {n}"
        );
    }
}

#[test]
fn a_cost_rounds_up_when_its_fraction_exceeds_the_dither() {
    let half = Limit {
        byte_ticks: 1,
        byte_ticks_frac: 1 << 31,
        _pad: 0,
        tau_ticks: 100,
    };
    assert_eq!(half.cost(1, (1 << 31) - 1), 2);
    assert_eq!(half.cost(1, 1 << 31), 1);
    assert_eq!(half.cost(2, 0), 3);
    // Frames past the largest are charged as the largest.
    assert_eq!(
        half.cost(MAX_FRAME_BYTES + 1, 0),
        half.cost(MAX_FRAME_BYTES, 0)
    );
    assert!(half.cost(MAX_FRAME_BYTES, 0) > half.cost(MAX_FRAME_BYTES - 1, 0));
}

#[test]
fn a_rate_limit_keeps_what_it_was_given() {
    let r = RateLimit::new(8_000_000, 65_536).unwrap();
    assert_eq!(r.rate_bps(), 8_000_000);
    assert_eq!(r.burst_bytes(), 65_536);
    assert_eq!(r.limit(), Limit::new(8_000_000, 65_536).unwrap());
    assert_ne!(r.limit(), Limit::default());
}

#[test]
fn per_source_is_keyed_by_source_at_the_default_prefixes() {
    let c = Config::per_source(8_000_000, 65_536).unwrap();
    assert_eq!(
        c,
        Config::new(
            RateLimit::new(8_000_000, 65_536).unwrap(),
            KEY_BY_SRC,
            DEFAULT_PREFIX_V4,
            DEFAULT_PREFIX_V6,
            0
        )
        .unwrap()
    );
    assert_eq!((c.rate_bps, c.burst_bytes), (8_000_000, 65_536));
    assert_eq!(c.key_by, KEY_BY_SRC);
    assert_eq!((c.prefix_v4, c.prefix_v6), (32, 64));
    assert_eq!(c.active, 1);
    assert!(Config::per_source(0, 65_536).is_err());
}

#[test]
fn the_first_sighting_allowance_is_a_64th_and_at_least_one() {
    assert_eq!(Admission::first_sightings_per_sec(6_400), 100);
    assert_eq!(Admission::first_sightings_per_sec(128), 2);
    assert_eq!(Admission::first_sightings_per_sec(127), 1);
    assert_eq!(Admission::first_sightings_per_sec(10), 1);
}

#[test]
fn errors_say_what_was_refused() {
    for text in [
        ConfigError::KeyBy(7).to_string(),
        ConfigError::PrefixV4(33).to_string(),
        ShapeError::HorizonZero.to_string(),
        LimitError::BurstZero.to_string(),
        LimitError::RateTooLow.to_string(),
    ] {
        assert!(!text.is_empty());
    }
    assert!(ConfigError::KeyBy(7).to_string().contains('7'));
    assert!(ConfigError::PrefixV4(33).to_string().contains("33"));
}

#[test]
fn exact_quotients_are_not_rounded_up() {
    // a x b fits, c is cut to its top 32 bits: the quotient shifted back down, exact.
    assert_eq!(mul_div_up(1 << 20, 1 << 20, 1 << 40), 1);
    assert_eq!(mul_div_up(3 << 20, 1 << 20, 1 << 40), 3);
    // A numerator cut to its top bits with nothing lost below them is not rounded up.
    assert_eq!(mul_div_up(1 << 40, 1 << 30, 1 << 30), 1 << 40);
    assert_eq!(mul_div_up(1 << 30, 1 << 40, 1 << 30), 1 << 40);
    // And what is lost is.
    assert_eq!(mul_div_up((1 << 20) + 1, 1 << 20, 1 << 40), 2);
}

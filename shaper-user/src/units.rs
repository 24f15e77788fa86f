//! Rates and sizes as the `shaper` command line reads and prints them.
//!
//! The syntax is tc(8)'s (iproute2 `get_rate64()` and `get_size64()`), so an operator can
//! reuse the values they already write for `tc qdisc ... rate 10mbit burst 64k`:
//!
//! * **Rates** (tc(8) "RATES") are bits per second. A bare number is bit/s; the units,
//!   matched case-insensitively, are `bit`, the SI bit units `kbit mbit gbit tbit`
//!   (×1000ⁿ), the IEC bit units `kibit mibit gibit tibit` (×1024ⁿ), and the *bytes* per
//!   second units `bps kbps mbps gbps tbps` (×8·1000ⁿ) and `kibps mibps gibps tibps`
//!   (×8·1024ⁿ).
//! * **Sizes** (tc(8) "SIZES") are bytes. A bare number is bytes; the units, matched
//!   case-insensitively, are `b`, `k`/`kb`, `m`/`mb`, `g`/`gb` (×1024ⁿ) and `kbit`,
//!   `mbit`, `gbit` (1024ⁿ *bits*, i.e. ÷8).
//!
//! Where tc leans on `strtod()` and doubles, this module is stricter and exact:
//!
//! * The number is plain decimal digits with at most one `.` (`1.5mbit`, `.5k`, `10.`).
//!   tc would also take whitespace, signs, exponents and hex; none of those is accepted.
//! * Arithmetic is done on the decimal digits, so `0.1mbit` is exactly 100000 bit/s. A
//!   fractional result is rounded to the nearest bit/s or byte, halves up (tc truncates,
//!   after a double rounding that can land either side).
//! * Zero, and anything that does not fit a `u64`, is an error rather than a silent 0 or a
//!   wrapped value.
//!
//! [`Rate`] and [`Size`] print in the largest unit that represents them exactly, in the
//! same syntax, so whatever `shaper` prints can be pasted back into it. For tables that
//! only need to be read, [`human_rate`] and [`human_bytes`] give three significant
//! figures instead.

use std::fmt;
use std::str::FromStr;

/// A unit name (lowercase) and how many base units (bit/s or bytes) one of it is.
type Unit = (&'static str, u64);

const KILO: u64 = 1000;
const MEGA: u64 = KILO * KILO;
const GIGA: u64 = MEGA * KILO;
const TERA: u64 = GIGA * KILO;
const KIBI: u64 = 1024;
const MEBI: u64 = KIBI * KIBI;
const GIBI: u64 = MEBI * KIBI;
const TEBI: u64 = GIBI * KIBI;

/// Every rate unit tc(8) knows, in bit/s. The order is the one error messages list them in.
const RATE_UNITS: &[Unit] = &[
    ("bit", 1),
    ("kbit", KILO),
    ("mbit", MEGA),
    ("gbit", GIGA),
    ("tbit", TERA),
    ("kibit", KIBI),
    ("mibit", MEBI),
    ("gibit", GIBI),
    ("tibit", TEBI),
    ("bps", 8),
    ("kbps", 8 * KILO),
    ("mbps", 8 * MEGA),
    ("gbps", 8 * GIGA),
    ("tbps", 8 * TERA),
    ("kibps", 8 * KIBI),
    ("mibps", 8 * MEBI),
    ("gibps", 8 * GIBI),
    ("tibps", 8 * TEBI),
];

/// Every size unit tc(8) knows, in bytes. The bit units are 1024-based too, as in tc.
const SIZE_UNITS: &[Unit] = &[
    ("b", 1),
    ("k", KIBI),
    ("kb", KIBI),
    ("m", MEBI),
    ("mb", MEBI),
    ("g", GIBI),
    ("gb", GIBI),
    ("kbit", KIBI / 8),
    ("mbit", MEBI / 8),
    ("gbit", GIBI / 8),
];

/// The units [`Rate`] prints in, largest first. Only SI bit units: they are what people
/// write most, and a bit/s value always has an exact spelling in one of them.
const RATE_DISPLAY_UNITS: &[Unit] = &[
    ("tbit", TERA),
    ("gbit", GIGA),
    ("mbit", MEGA),
    ("kbit", KILO),
    ("bit", 1),
];

/// The units [`Size`] prints in, largest first; `b` makes a bare byte count explicit.
const SIZE_DISPLAY_UNITS: &[Unit] = &[("g", GIBI), ("m", MEBI), ("k", KIBI), ("b", 1)];

/// Which kind of value failed to parse; names it in [`UnitError`] messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Quantity {
    /// A [`Rate`].
    Rate,
    /// A [`Size`].
    Size,
}

impl Quantity {
    /// The units this quantity accepts after the number.
    const fn units(self) -> &'static [Unit] {
        match self {
            Self::Rate => RATE_UNITS,
            Self::Size => SIZE_UNITS,
        }
    }

    /// The accepted units as a comma-separated list, for error messages.
    fn unit_list(self) -> String {
        let names: Vec<&str> = self.units().iter().map(|&(name, _)| name).collect();
        names.join(", ")
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Rate => "rate",
            Self::Size => "size",
        })
    }
}

/// Why a rate or size could not be parsed.
///
/// Each message is one line that quotes the offending input (with control characters and
/// quotes escaped, so the message stays on one line whatever was typed).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UnitError {
    /// The value was the empty string.
    #[error("invalid {quantity} '': empty")]
    Empty {
        /// What was being parsed.
        quantity: Quantity,
    },
    /// The value does not start with a plain decimal number.
    #[error("invalid {quantity} '{}': not a number", .input.escape_debug())]
    NotANumber {
        /// What was being parsed.
        quantity: Quantity,
        /// The whole value as given.
        input: String,
    },
    /// The number is followed by something that is not one of the quantity's units.
    #[error(
        "invalid {quantity} '{}': unknown unit '{}' (expected {})",
        .input.escape_debug(),
        .unit.escape_debug(),
        .quantity.unit_list()
    )]
    UnknownUnit {
        /// What was being parsed.
        quantity: Quantity,
        /// The whole value as given.
        input: String,
        /// The part after the number.
        unit: String,
    },
    /// The value is zero, or a fraction that rounds to zero.
    #[error("invalid {quantity} '{}': must be greater than zero", .input.escape_debug())]
    Zero {
        /// What was being parsed.
        quantity: Quantity,
        /// The whole value as given.
        input: String,
    },
    /// The value does not fit in 64 bits (of bit/s or of bytes).
    #[error("invalid {quantity} '{}': too large", .input.escape_debug())]
    TooLarge {
        /// What was being parsed.
        quantity: Quantity,
        /// The whole value as given.
        input: String,
    },
}

/// A rate in bits per second, written and printed as tc(8) does (`10mbit`, `1.5gbit`,
/// `100kbps`).
///
/// Parsing rejects zero, so a parsed `Rate` is always positive; [`Rate::from_bps`] does not
/// check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Rate(u64);

impl Rate {
    /// A rate of `bits_per_sec` bits (not bytes) per second.
    #[must_use]
    pub const fn from_bps(bits_per_sec: u64) -> Self {
        Self(bits_per_sec)
    }

    /// This rate in bits (not bytes) per second.
    #[must_use]
    pub const fn bits_per_sec(self) -> u64 {
        self.0
    }
}

impl FromStr for Rate {
    type Err = UnitError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse(Quantity::Rate, s).map(Self)
    }
}

impl fmt::Display for Rate {
    /// The largest SI bit unit that divides the rate exactly: `10mbit`, `1500kbit`, `8bit`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&exact_spelling(self.0, RATE_DISPLAY_UNITS))
    }
}

/// A size in bytes, written and printed as tc(8) does (`64k`, `1514b`, `1.5m`).
///
/// Parsing rejects zero, so a parsed `Size` is always positive; [`Size::from_bytes`] does
/// not check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Size(u64);

impl Size {
    /// A size of `bytes` bytes.
    #[must_use]
    pub const fn from_bytes(bytes: u64) -> Self {
        Self(bytes)
    }

    /// This size in bytes.
    #[must_use]
    pub const fn bytes(self) -> u64 {
        self.0
    }
}

impl FromStr for Size {
    type Err = UnitError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse(Quantity::Size, s).map(Self)
    }
}

impl fmt::Display for Size {
    /// The largest of `g`, `m`, `k` that divides the size exactly, else bytes: `64k`,
    /// `1514b`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&exact_spelling(self.0, SIZE_DISPLAY_UNITS))
    }
}

/// A count of packets (a packet rate, per second, or a packet burst), written `20000`,
/// `20k` or `1m` (1000-based, as tc's `pkts_rate` counts); parsing rejects zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Packets(u64);

/// Why a text is not a count of packets.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "not a count of packets: give a positive whole number, with k or m for thousands or millions"
)]
pub struct PacketsError;

impl Packets {
    #[must_use]
    pub const fn from_count(n: u64) -> Self {
        Self(n)
    }

    #[must_use]
    pub const fn count(self) -> u64 {
        self.0
    }
}

impl FromStr for Packets {
    type Err = PacketsError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (digits, scale) = match s.as_bytes().last() {
            Some(b'k' | b'K') => (&s[..s.len() - 1], 1_000),
            Some(b'm' | b'M') => (&s[..s.len() - 1], 1_000_000),
            _ => (s, 1),
        };
        match digits
            .parse::<u64>()
            .ok()
            .and_then(|n| n.checked_mul(scale))
        {
            Some(n) if n > 0 && digits.bytes().all(|b| b.is_ascii_digit()) => Ok(Self(n)),
            _ => Err(PacketsError),
        }
    }
}

impl fmt::Display for Packets {
    /// `m` or `k` when it divides the count exactly: `20k`, `1500`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            n if n % 1_000_000 == 0 => write!(f, "{}m", n / 1_000_000),
            n if n % 1_000 == 0 => write!(f, "{}k", n / 1_000),
            n => write!(f, "{n}"),
        }
    }
}

/// serde on the units: each is read from the text its flag takes (`FromStr`, so a file
/// and the command line accept and refuse the same values, with the same message), and
/// written as it prints (`Display`), so `config show` writes what `apply` reads back.
/// `integers`: a bare TOML integer is taken too (as its digits).
macro_rules! serde_by_text {
    ($t:ty, $expecting:literal, integers: $integers:literal) => {
        impl<'de> serde::Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct Visitor;
                impl serde::de::Visitor<'_> for Visitor {
                    type Value = $t;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str($expecting)
                    }
                    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<$t, E> {
                        s.parse().map_err(E::custom)
                    }
                    fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<$t, E> {
                        if $integers {
                            self.visit_str(&n.to_string())
                        } else {
                            Err(E::invalid_type(serde::de::Unexpected::Signed(n), &self))
                        }
                    }
                    fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<$t, E> {
                        if $integers {
                            self.visit_str(&n.to_string())
                        } else {
                            Err(E::invalid_type(serde::de::Unexpected::Unsigned(n), &self))
                        }
                    }
                }
                d.deserialize_any(Visitor)
            }
        }

        impl serde::Serialize for $t {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
    };
}

serde_by_text!(Rate, "a rate in tc units, as a string (\"10mbit\")", integers: false);
serde_by_text!(Size, "a size in tc units, as a string (\"64k\")", integers: false);
serde_by_text!(Packets, "a count of packets (2000 or \"2k\")", integers: true);

/// A rate for reading rather than pasting: three significant figures in SI (1000-based)
/// units, e.g. `9.98 Mbit/s`, `812 kbit/s`, `1.00 Gbit/s`, `56 bit/s`.
#[must_use]
pub fn human_rate(bits_per_sec: u64) -> String {
    approximate(
        bits_per_sec,
        1000,
        &[
            "bit/s", "kbit/s", "Mbit/s", "Gbit/s", "Tbit/s", "Pbit/s", "Ebit/s",
        ],
    )
}

/// A byte count for reading rather than pasting: three significant figures in IEC
/// (1024-based) units, e.g. `1.50 MiB`, `812 B`. Between 1000 and 1023 of a unit it shows
/// all four digits (`1023 KiB`) rather than switching to a unit where it would be `0.999`.
#[must_use]
pub fn human_bytes(bytes: u64) -> String {
    approximate(
        bytes,
        1024,
        &["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"],
    )
}

/// Parses `input` as a `quantity`: a decimal number, then optionally one of its units.
fn parse(quantity: Quantity, input: &str) -> Result<u64, UnitError> {
    if input.is_empty() {
        return Err(UnitError::Empty { quantity });
    }
    let owned = || input.to_owned();
    let (number, unit) = split_number(input);
    let Some((whole, fraction)) = decimal_parts(number) else {
        return Err(UnitError::NotANumber {
            quantity,
            input: owned(),
        });
    };
    let Some(scale) = unit_scale(quantity, unit) else {
        return Err(UnitError::UnknownUnit {
            quantity,
            input: owned(),
            unit: unit.to_owned(),
        });
    };
    match scale_decimal(whole, fraction, scale) {
        None => Err(UnitError::TooLarge {
            quantity,
            input: owned(),
        }),
        Some(0) => Err(UnitError::Zero {
            quantity,
            input: owned(),
        }),
        Some(value) => Ok(value),
    }
}

/// Splits `input` after its leading run of digits and dots. Malformed runs (`1.2.3`) are
/// left to [`decimal_parts`] so they are reported as bad numbers, not as odd units.
fn split_number(input: &str) -> (&str, &str) {
    let end = input
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(input.len());
    input.split_at(end)
}

/// The digits before and after the decimal point of `number`, if it is a plain decimal
/// with at least one digit and at most one point (`12`, `1.5`, `.5`, `5.` as strtod takes).
fn decimal_parts(number: &str) -> Option<(&str, &str)> {
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let all_digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    let has_digit = !(whole.is_empty() && fraction.is_empty());
    (has_digit && all_digits(whole) && all_digits(fraction)).then_some((whole, fraction))
}

/// How many base units one `unit` is, matching case-insensitively as tc does with
/// strcasecmp(); no unit at all means the base unit.
fn unit_scale(quantity: Quantity, unit: &str) -> Option<u64> {
    if unit.is_empty() {
        return Some(1);
    }
    quantity
        .units()
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(unit))
        .map(|&(_, scale)| scale)
}

/// `whole.fraction × scale`, rounded to the nearest integer (halves up), or `None` if that
/// does not fit a `u64`. `whole` and `fraction` are ASCII digit strings, either may be empty.
///
/// Works on the digits rather than a float so that e.g. `0.1mbit` is exactly 100000.
fn scale_decimal(whole: &str, fraction: &str, scale: u64) -> Option<u64> {
    let scale = u128::from(scale);
    let mut whole_value: u128 = 0;
    for digit in whole.bytes() {
        whole_value = whole_value
            .checked_mul(10)?
            .checked_add(u128::from(digit - b'0'))?;
    }
    let fraction_value = scale_fraction(fraction, scale);
    let total = whole_value
        .checked_mul(scale)?
        .checked_add(fraction_value)?;
    u64::try_from(total).ok()
}

/// `0.fraction × scale` rounded to the nearest integer (halves up), exactly, for a fraction
/// of any length.
///
/// This is schoolbook multiplication of the digit string by `scale`, least significant
/// digit first: the carry left at the end is the whole part of the product, and the last
/// digit written is the first digit after the point, which alone decides the rounding.
/// The carry stays below `scale`, so nothing here can overflow.
fn scale_fraction(fraction: &str, scale: u128) -> u128 {
    let mut carry: u128 = 0;
    let mut first_decimal: u128 = 0;
    for digit in fraction.bytes().rev() {
        let product = u128::from(digit - b'0') * scale + carry;
        first_decimal = product % 10;
        carry = product / 10;
    }
    carry + u128::from(first_decimal >= 5)
}

/// `value` in the first of `units` (largest first, ending with a unit of 1) that divides
/// it exactly, e.g. `10mbit`. Zero has no meaningful unit and takes the last one.
fn exact_spelling(value: u64, units: &[Unit]) -> String {
    let (name, scale) = units
        .iter()
        .find(|&&(_, scale)| value != 0 && value.is_multiple_of(scale))
        .or(units.last())
        .copied()
        .unwrap_or(("", 1));
    format!("{}{name}", value / scale)
}

/// `value` to three significant figures in the largest of `units` (powers of `base`,
/// starting at 1) in which it is below `base` once rounded.
///
/// Integer arithmetic throughout, so a value just under a unit boundary (999 999 bit/s)
/// rounds up into the next unit (`1.00 Mbit/s`) instead of showing as `1000 kbit/s`.
fn approximate(value: u64, base: u64, units: &[&str]) -> String {
    let value = u128::from(value);
    let base = u128::from(base);
    let mut divisor: u128 = 1;
    let mut units = units.iter().peekable();
    while let Some(unit) = units.next() {
        let is_last = units.peek().is_none();
        if div_round(value, divisor) < base || is_last {
            return three_figures(value, divisor, unit);
        }
        divisor *= base;
    }
    value.to_string()
}

/// `value / divisor` with the decimals that make three significant figures (2 below 10,
/// 1 below 100, none above), then `unit`. Whole base units (`divisor` 1) need none.
fn three_figures(value: u128, divisor: u128, unit: &str) -> String {
    if divisor == 1 {
        return format!("{value} {unit}");
    }
    let hundredths = div_round(value * 100, divisor);
    if hundredths < 1000 {
        return format!("{}.{:02} {unit}", hundredths / 100, hundredths % 100);
    }
    let tenths = div_round(value * 10, divisor);
    if tenths < 1000 {
        return format!("{}.{} {unit}", tenths / 10, tenths % 10);
    }
    format!("{} {unit}", div_round(value, divisor))
}

/// `numerator / denominator` rounded to the nearest integer, halves up.
fn div_round(numerator: u128, denominator: u128) -> u128 {
    (2 * numerator + denominator) / (2 * denominator)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(s: &str) -> u64 {
        match s.parse::<Rate>() {
            Ok(rate) => rate.bits_per_sec(),
            Err(e) => panic!("{s:?} should parse as a rate: {e}"),
        }
    }

    fn size(s: &str) -> u64 {
        match s.parse::<Size>() {
            Ok(size) => size.bytes(),
            Err(e) => panic!("{s:?} should parse as a size: {e}"),
        }
    }

    fn rate_error(s: &str) -> UnitError {
        match s.parse::<Rate>() {
            Ok(rate) => panic!("{s:?} should not parse as a rate, got {rate:?}"),
            Err(e) => e,
        }
    }

    fn size_error(s: &str) -> UnitError {
        match s.parse::<Size>() {
            Ok(size) => panic!("{s:?} should not parse as a size, got {size:?}"),
            Err(e) => e,
        }
    }

    /// `name` as given, all upper case, and capitalised: `10mbit`, `10MBIT`, `10Mbit`.
    fn spellings(name: &str) -> [String; 3] {
        let mut capitalised = name.to_owned();
        capitalised[..1].make_ascii_uppercase();
        [name.to_owned(), name.to_ascii_uppercase(), capitalised]
    }

    #[test]
    fn packet_counts_take_k_and_m_and_refuse_zero_and_junk() {
        assert_eq!("20k".parse(), Ok(Packets::from_count(20_000)));
        assert_eq!("1m".parse(), Ok(Packets::from_count(1_000_000)));
        assert_eq!("1500".parse(), Ok(Packets::from_count(1500)));
        for bad in ["0", "0k", "", "k", "1.5k", "-3", "3x", "+5"] {
            assert_eq!(bad.parse::<Packets>(), Err(PacketsError), "{bad}");
        }
        assert_eq!(Packets::from_count(20_000).to_string(), "20k");
        assert_eq!(Packets::from_count(1500).to_string(), "1500");
        assert_eq!(Packets::from_count(2_000_000).to_string(), "2m");
        assert_eq!(Packets::from_count(1_500_000).to_string(), "1500k");
    }

    #[test]
    fn every_rate_unit_in_every_case() {
        let expected: &[(&str, u64)] = &[
            ("bit", 1),
            ("kbit", 1_000),
            ("mbit", 1_000_000),
            ("gbit", 1_000_000_000),
            ("tbit", 1_000_000_000_000),
            ("kibit", 1024),
            ("mibit", 1024 * 1024),
            ("gibit", 1024 * 1024 * 1024),
            ("tibit", 1024 * 1024 * 1024 * 1024),
            ("bps", 8),
            ("kbps", 8_000),
            ("mbps", 8_000_000),
            ("gbps", 8_000_000_000),
            ("tbps", 8_000_000_000_000),
            ("kibps", 8 * 1024),
            ("mibps", 8 * 1024 * 1024),
            ("gibps", 8 * 1024 * 1024 * 1024),
            ("tibps", 8 * 1024 * 1024 * 1024 * 1024),
        ];
        assert_eq!(expected.len(), RATE_UNITS.len(), "every unit is tested");
        for &(unit, scale) in expected {
            for spelling in spellings(unit) {
                assert_eq!(rate(&format!("1{spelling}")), scale, "1{spelling}");
                assert_eq!(rate(&format!("10{spelling}")), 10 * scale, "10{spelling}");
            }
        }
    }

    #[test]
    fn tc_mixed_case_spellings() {
        // The spellings tc's own table and man page use.
        assert_eq!(rate("10Kibit"), 10_240);
        assert_eq!(rate("1KBps"), 8_000);
        assert_eq!(rate("1MiBps"), 8 * 1024 * 1024);
        assert_eq!(rate("1GBps"), 8_000_000_000);
        assert_eq!(rate("10mBiT"), 10_000_000);
        assert_eq!(size("64Kb"), 65_536);
        assert_eq!(size("1mB"), 1_048_576);
    }

    #[test]
    fn bytes_per_second_units_are_bytes() {
        assert_eq!(rate("1bps"), 8);
        assert_eq!(rate("1kbps"), 8_000);
        assert_eq!(rate("1kibps"), 8_192);
        assert_eq!(rate("100mbps"), 800_000_000);
    }

    #[test]
    fn bare_numbers() {
        assert_eq!(rate("1"), 1);
        assert_eq!(rate("8"), 8);
        assert_eq!(rate("1000000"), 1_000_000);
        assert_eq!(rate("007"), 7);
        assert_eq!(size("1"), 1);
        assert_eq!(size("1514"), 1514);
        assert_eq!(size("65536"), 65_536);
    }

    #[test]
    fn every_size_unit_in_every_case() {
        let expected: &[(&str, u64)] = &[
            ("b", 1),
            ("k", 1024),
            ("kb", 1024),
            ("m", 1024 * 1024),
            ("mb", 1024 * 1024),
            ("g", 1024 * 1024 * 1024),
            ("gb", 1024 * 1024 * 1024),
            ("kbit", 128),
            ("mbit", 1024 * 1024 / 8),
            ("gbit", 1024 * 1024 * 1024 / 8),
        ];
        assert_eq!(expected.len(), SIZE_UNITS.len(), "every unit is tested");
        for &(unit, scale) in expected {
            for spelling in spellings(unit) {
                assert_eq!(size(&format!("1{spelling}")), scale, "1{spelling}");
                assert_eq!(size(&format!("10{spelling}")), 10 * scale, "10{spelling}");
            }
        }
        assert_eq!(size("64k"), 65_536);
    }

    #[test]
    fn fractions_are_exact() {
        assert_eq!(rate("1.5mbit"), 1_500_000);
        assert_eq!(rate("0.1mbit"), 100_000);
        assert_eq!(rate("0.3mbit"), 300_000);
        assert_eq!(rate("2.675kbit"), 2_675);
        assert_eq!(rate(".5mbit"), 500_000);
        assert_eq!(rate("5.mbit"), 5_000_000);
        assert_eq!(rate("1.000000000000000000000000000001gbit"), 1_000_000_000);
        assert_eq!(rate("0.000001tbit"), 1_000_000);
        assert_eq!(rate("1.5kibit"), 1_536);
        assert_eq!(rate("0.5kbps"), 4_000);
        assert_eq!(size("1.5k"), 1_536);
        assert_eq!(size("0.5m"), 524_288);
        assert_eq!(size("1.5kbit"), 192);
        assert_eq!(size("2.5"), 3, "a fractional byte rounds half up");
    }

    #[test]
    fn fractions_round_to_nearest() {
        assert_eq!(rate("1.4"), 1);
        assert_eq!(rate("1.5"), 2);
        assert_eq!(rate("1.49999999999999999999999"), 1);
        assert_eq!(rate("1.50000000000000000000001"), 2);
        assert_eq!(rate("0.0015kbit"), 2);
        assert_eq!(rate("0.0014999kbit"), 1);
        assert_eq!(size("0.1k"), 102, "102.4 bytes");
        assert_eq!(size("0.6k"), 614, "614.4 bytes");
        assert_eq!(size("0.0005k"), 1, "0.512 bytes");
        // A half that needs every one of its many digits to be seen: 2^-44 × 8·1024^4 = 0.5.
        assert_eq!(
            rate("0.00000000000005684341886080801486968994140625tibps"),
            1
        );
        assert!(matches!(
            rate_error("0.00000000000005684341886080801486968994140624tibps"),
            UnitError::Zero { .. }
        ));
    }

    #[test]
    fn empty_is_an_error() {
        assert_eq!(rate_error("").to_string(), "invalid rate '': empty");
        assert_eq!(size_error("").to_string(), "invalid size '': empty");
    }

    #[test]
    fn unknown_unit_lists_the_units() {
        assert_eq!(
            rate_error("10xbit").to_string(),
            "invalid rate '10xbit': unknown unit 'xbit' (expected bit, kbit, mbit, gbit, tbit, \
             kibit, mibit, gibit, tibit, bps, kbps, mbps, gbps, tbps, kibps, mibps, gibps, tibps)"
        );
        assert_eq!(
            size_error("64q").to_string(),
            "invalid size '64q': unknown unit 'q' (expected b, k, kb, m, mb, g, gb, kbit, mbit, \
             gbit)"
        );
    }

    #[test]
    fn units_of_the_other_quantity_are_unknown() {
        for input in [
            "10k", "10m", "10b", "10kb", "1e6", "10 mbit", "10mbit ", "10mbit/s",
        ] {
            assert!(
                matches!(rate_error(input), UnitError::UnknownUnit { .. }),
                "{input:?}"
            );
        }
        for input in ["64kbps", "64t", "64tb", "64bit", "64kib", "64 k", "64k "] {
            assert!(
                matches!(size_error(input), UnitError::UnknownUnit { .. }),
                "{input:?}"
            );
        }
    }

    #[test]
    fn not_a_number() {
        assert_eq!(
            rate_error("-5mbit").to_string(),
            "invalid rate '-5mbit': not a number"
        );
        for input in [
            "+5mbit",
            "mbit",
            " 5mbit",
            ".",
            ".mbit",
            "1.2.3mbit",
            "..5",
            "abc",
        ] {
            let error = rate_error(input);
            assert!(matches!(error, UnitError::NotANumber { .. }), "{input:?}");
            assert_eq!(
                error.to_string(),
                format!("invalid rate '{input}': not a number")
            );
        }
        for input in ["-1k", "k", "\t64k", "1..5k"] {
            assert!(
                matches!(size_error(input), UnitError::NotANumber { .. }),
                "{input:?}"
            );
        }
        // No hex, unlike strtod(): the "x10" is what comes after the number "0".
        assert!(matches!(
            size_error("0x10"),
            UnitError::UnknownUnit { ref unit, .. } if unit == "x10"
        ));
    }

    #[test]
    fn zero_is_an_error() {
        assert_eq!(
            rate_error("0mbit").to_string(),
            "invalid rate '0mbit': must be greater than zero"
        );
        assert_eq!(
            size_error("0").to_string(),
            "invalid size '0': must be greater than zero"
        );
        for input in ["0", "0bit", "0.0gbit", "000", "0.4bit", "0.0000000001kbit"] {
            assert!(
                matches!(rate_error(input), UnitError::Zero { .. }),
                "{input:?}"
            );
        }
        for input in ["0b", "0k", "0.0g", "0.001kbit", "0.4"] {
            assert!(
                matches!(size_error(input), UnitError::Zero { .. }),
                "{input:?}"
            );
        }
    }

    #[test]
    fn too_large_is_an_error() {
        assert_eq!(
            size_error("99999999999g").to_string(),
            "invalid size '99999999999g': too large"
        );
        assert_eq!(
            rate_error("18446744073709551616").to_string(),
            "invalid rate '18446744073709551616': too large"
        );
    }

    #[test]
    fn u64_boundary() {
        assert_eq!(rate("18446744073709551615"), u64::MAX);
        assert_eq!(rate("18446744073709551615bit"), u64::MAX);
        assert_eq!(rate("18446744073709551614.5"), u64::MAX, "rounds up to MAX");
        assert_eq!(size("18446744073709551615b"), u64::MAX);
        assert_eq!(size("17179869183.999999999g"), u64::MAX, "rounds to MAX");
        // Exactly MAX - 0.5 and MAX + 0.5 bytes: halves round up, so in and just out.
        assert_eq!(size("17592186044415.999998569488525390625m"), u64::MAX);
        assert!(matches!(
            size_error("17592186044415.999999523162841796875m"),
            UnitError::TooLarge { .. }
        ));
        for input in [
            "18446744073709551616",
            "18446744073709551615.5",
            "18446744073709551615.5bit",
            "18446744073709551616bit",
            "18446744073709551615kbit",
            "18446744073709552tbit",
            "2305843009213693952bps",
            "99999999999999999999999999999999999999999999999999",
        ] {
            assert!(
                matches!(rate_error(input), UnitError::TooLarge { .. }),
                "{input:?}"
            );
        }
        assert_eq!(
            rate("2305843009213693951bps"),
            2_305_843_009_213_693_951 * 8
        );
        assert_eq!(rate("18446744tbit"), 18_446_744_000_000_000_000);
        assert!(matches!(
            rate_error("18446745tbit"),
            UnitError::TooLarge { .. }
        ));
        for input in [
            "17179869184g",
            "18446744073709551616",
            "147573952589676412928kbit",
        ] {
            assert!(
                matches!(size_error(input), UnitError::TooLarge { .. }),
                "{input:?}"
            );
        }
        assert_eq!(size("17179869183g"), 17_179_869_183 * 1024 * 1024 * 1024);
    }

    #[test]
    fn errors_are_one_line_and_quote_the_input() {
        let inputs = [
            "",
            "10xbit",
            "-5mbit",
            "0mbit",
            "99999999999tbit",
            "1\n0mbit",
            "10mbit\n",
            "it's",
        ];
        for input in inputs {
            for error in [rate_error(input), size_error(input)] {
                let message = error.to_string();
                assert!(!message.contains('\n'), "{message:?}");
                assert!(message.starts_with("invalid "), "{message:?}");
                if !input.contains(['\n', '\'']) {
                    assert!(message.contains(&format!("'{input}'")), "{message:?}");
                }
            }
        }
        assert!(rate_error("10mbit\n").to_string().contains("'10mbit\\n'"));
    }

    #[test]
    fn error_type_fits_anyhow() {
        fn assert_error<E: std::error::Error + Send + Sync + 'static>(_: &E) {}
        let error = rate_error("fast");
        assert_error(&error);
        let error = anyhow::Error::from(error);
        assert_eq!(error.to_string(), "invalid rate 'fast': not a number");
    }

    #[derive(Debug, clap::Parser)]
    struct Args {
        #[arg(long)]
        rate: Rate,
        #[arg(long)]
        burst: Size,
    }

    #[test]
    fn clap_parses_rate_and_size() {
        use clap::Parser as _;
        let args = Args::try_parse_from(["shaper", "--rate", "10mbit", "--burst", "64k"])
            .expect("valid arguments parse");
        assert_eq!(args.rate, Rate::from_bps(10_000_000));
        assert_eq!(args.burst, Size::from_bytes(65_536));

        let error = Args::try_parse_from(["shaper", "--rate", "10xbit", "--burst", "64k"])
            .expect_err("a bad unit is rejected");
        assert!(
            error
                .to_string()
                .contains("invalid rate '10xbit': unknown unit 'xbit'"),
            "{error}"
        );
    }

    #[test]
    fn rate_display() {
        let cases: &[(u64, &str)] = &[
            (10_000_000, "10mbit"),
            (1_500_000, "1500kbit"),
            (1_234_567, "1234567bit"),
            (8, "8bit"),
            (1, "1bit"),
            (1000, "1kbit"),
            (1024, "1024bit"),
            (1_000_000_000, "1gbit"),
            (2_500_000_000, "2500mbit"),
            (40_000_000_000_000, "40tbit"),
            (u64::MAX, "18446744073709551615bit"),
            (18_000_000_000_000_000_000, "18000000tbit"),
            (0, "0bit"),
        ];
        for &(bps, text) in cases {
            assert_eq!(Rate::from_bps(bps).to_string(), text);
        }
        assert_eq!(format!("[{:>8}]", Rate::from_bps(10_000_000)), "[  10mbit]");
    }

    #[test]
    fn size_display() {
        let cases: &[(u64, &str)] = &[
            (65_536, "64k"),
            (1514, "1514b"),
            (1_048_576, "1m"),
            (1, "1b"),
            (1000, "1000b"),
            (1024, "1k"),
            (1536, "1536b"),
            (1_572_864, "1536k"),
            (1 << 30, "1g"),
            (1 << 40, "1024g"),
            (u64::MAX, "18446744073709551615b"),
            (0, "0b"),
        ];
        for &(bytes, text) in cases {
            assert_eq!(Size::from_bytes(bytes).to_string(), text);
        }
        assert_eq!(format!("[{:<5}]", Size::from_bytes(65_536)), "[64k  ]");
    }

    /// Values around every power of 2 and 10, and their neighbours, up to `u64::MAX`.
    fn interesting_values() -> Vec<u64> {
        let mut values = vec![1, 3, 7, 8, 125, 1500, 1514, 9000, u64::MAX];
        for shift in 0..64 {
            values.push(1 << shift);
            values.push(3 << shift.min(62));
        }
        let mut power: u64 = 1;
        while let Some(next) = power.checked_mul(10) {
            power = next;
            values.extend([power, power / 2 * 3, power / 1000 * 999]);
        }
        let neighbours: Vec<u64> = values
            .iter()
            .flat_map(|&v| [v.saturating_sub(1), v, v.saturating_add(1)])
            .collect();
        neighbours.into_iter().filter(|&v| v != 0).collect()
    }

    #[test]
    fn rate_display_round_trips() {
        for bps in interesting_values() {
            let rate = Rate::from_bps(bps);
            let text = rate.to_string();
            assert_eq!(text.parse::<Rate>(), Ok(rate), "{bps} printed as {text}");
            assert_eq!(text.to_uppercase().parse::<Rate>(), Ok(rate), "{text}");
        }
    }

    #[test]
    fn size_display_round_trips() {
        for bytes in interesting_values() {
            let size = Size::from_bytes(bytes);
            let text = size.to_string();
            assert_eq!(text.parse::<Size>(), Ok(size), "{bytes} printed as {text}");
            assert_eq!(text.to_uppercase().parse::<Size>(), Ok(size), "{text}");
        }
    }

    #[test]
    fn accessors() {
        const RATE: Rate = Rate::from_bps(42);
        const SIZE: Size = Size::from_bytes(42);
        assert_eq!(RATE.bits_per_sec(), 42);
        assert_eq!(SIZE.bytes(), 42);
        assert!(Rate::from_bps(1) < Rate::from_bps(2));
        assert!(Size::from_bytes(1) < Size::from_bytes(2));
    }

    #[test]
    fn human_rate_three_significant_figures() {
        let cases: &[(u64, &str)] = &[
            (0, "0 bit/s"),
            (1, "1 bit/s"),
            (56, "56 bit/s"),
            (999, "999 bit/s"),
            (1000, "1.00 kbit/s"),
            (1234, "1.23 kbit/s"),
            (1235, "1.24 kbit/s"),
            (9_994, "9.99 kbit/s"),
            (9_995, "10.0 kbit/s"),
            (12_345, "12.3 kbit/s"),
            (99_949, "99.9 kbit/s"),
            (99_950, "100 kbit/s"),
            (812_000, "812 kbit/s"),
            (999_499, "999 kbit/s"),
            (999_500, "1.00 Mbit/s"),
            (999_999, "1.00 Mbit/s"),
            (9_980_000, "9.98 Mbit/s"),
            (9_984_999, "9.98 Mbit/s"),
            (1_000_000_000, "1.00 Gbit/s"),
            (40_000_000_000_000, "40.0 Tbit/s"),
            (1_000_000_000_000_000, "1.00 Pbit/s"),
            (u64::MAX, "18.4 Ebit/s"),
        ];
        for &(bps, text) in cases {
            assert_eq!(human_rate(bps), text, "{bps}");
        }
    }

    #[test]
    fn human_bytes_three_significant_figures() {
        let cases: &[(u64, &str)] = &[
            (0, "0 B"),
            (812, "812 B"),
            (1000, "1000 B"),
            (1023, "1023 B"),
            (1024, "1.00 KiB"),
            (1536, "1.50 KiB"),
            (10_240, "10.0 KiB"),
            (65_536, "64.0 KiB"),
            (1023 * 1024, "1023 KiB"),
            (1024 * 1024 - 1, "1.00 MiB"),
            (1_572_864, "1.50 MiB"),
            (1 << 30, "1.00 GiB"),
            (1 << 40, "1.00 TiB"),
            (1 << 50, "1.00 PiB"),
            (1 << 60, "1.00 EiB"),
            (u64::MAX, "16.0 EiB"),
        ];
        for &(bytes, text) in cases {
            assert_eq!(human_bytes(bytes), text, "{bytes}");
        }
    }
}

/// A time span in nanoseconds, written as tc(8) writes times: a whole number and one of
/// `s`, `ms`, `us`, `ns` (`5ms`, `50ms`, `1s`); `0` alone is zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Delay(u64);

/// Why a time span was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid time '{0}' (expected a whole number and s, ms, us or ns: 5ms, 50ms, 1s)")]
pub struct DelayError(String);

const DELAY_UNITS: &[(&str, u64)] = &[
    ("s", 1_000_000_000),
    ("ms", 1_000_000),
    ("us", 1_000),
    ("ns", 1),
];

impl Delay {
    #[must_use]
    pub const fn from_ns(ns: u64) -> Self {
        Self(ns)
    }

    #[must_use]
    pub const fn ns(self) -> u64 {
        self.0
    }
}

impl FromStr for Delay {
    type Err = DelayError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || DelayError(s.to_owned());
        if s == "0" {
            return Ok(Self(0));
        }
        let digits = s.bytes().take_while(u8::is_ascii_digit).count();
        let (number, unit) = s.split_at(digits);
        let n: u64 = number.parse().map_err(|_| err())?;
        let &(_, per) = DELAY_UNITS
            .iter()
            .find(|(name, _)| *name == unit)
            .ok_or_else(err)?;
        n.checked_mul(per).map(Self).ok_or_else(err)
    }
}

impl fmt::Display for Delay {
    /// The largest unit that divides the span exactly: `5ms`, `1500us`, `0`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 == 0 {
            return f.pad("0");
        }
        let (name, per) = DELAY_UNITS
            .iter()
            .find(|(_, per)| self.0.is_multiple_of(*per))
            .copied()
            .unwrap_or(("ns", 1));
        f.pad(&format!("{}{name}", self.0 / per))
    }
}

#[cfg(test)]
mod delay_tests {
    use super::*;

    #[test]
    fn delays_parse_and_print_as_tc_writes_them() {
        for (s, ns) in [
            ("5ms", 5_000_000),
            ("50ms", 50_000_000),
            ("1s", 1_000_000_000),
            ("1500us", 1_500_000),
            ("7ns", 7),
            ("0", 0),
        ] {
            let d: Delay = s.parse().unwrap();
            assert_eq!(d.ns(), ns, "{s}");
            assert_eq!(d.to_string(), s);
        }
        for bad in [
            "",
            "5",
            "ms",
            "5 ms",
            "1.5ms",
            "-1ms",
            "5min",
            "99999999999999s",
        ] {
            assert!(bad.parse::<Delay>().is_err(), "{bad}");
        }
        assert_eq!(Delay::from_ns(1_000_000_000).to_string(), "1s");
    }
}

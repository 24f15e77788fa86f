//! New-source admission as an operator asks for it: `--new-sources N|unlimited` with
//! `--new-sources-burst N` on `attach` and `policy set`, `new_sources` and
//! `new_sources_burst` in the file. One value type and one set of rules; each edge says a
//! refusal in its own words (a flag, a file field).

use std::{fmt, str::FromStr};

use serde::{Serialize, Serializer};
use shaper_common::{config::ConfigError, maps::Admission};

use crate::setting::Setting;

/// Keys a second given a cell of their own; 0: unlimited (no admission control).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeysPerSec(pub u64);

impl KeysPerSec {
    pub const UNLIMITED: Self = Self(0);
}

/// Not a positive whole number, nor `unlimited`: the word as given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotKeysPerSec(pub String);

impl fmt::Display for NotKeysPerSec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "'{}' is not a positive whole number of keys a second, or unlimited",
            self.0.escape_debug()
        )
    }
}

impl std::error::Error for NotKeysPerSec {}

impl FromStr for KeysPerSec {
    type Err = NotKeysPerSec;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "unlimited" {
            return Ok(Self::UNLIMITED);
        }
        match s.parse::<u64>() {
            Ok(n) if n > 0 => Ok(Self(n)),
            _ => Err(NotKeysPerSec(s.to_owned())),
        }
    }
}

impl fmt::Display for KeysPerSec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            0 => f.write_str("unlimited"),
            n => write!(f, "{n}"),
        }
    }
}

/// As the file writes it: a number, or `"unlimited"`.
impl Serialize for KeysPerSec {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            0 => s.serialize_str("unlimited"),
            n => s.serialize_u64(n),
        }
    }
}

/// Why an admission cannot be as asked. The setting at fault is the one each variant
/// names ([`NewSourcesError::setting`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NewSourcesError {
    /// new_sources_burst without new_sources.
    BurstAlone { burst: u64 },
    /// new_sources_burst with new_sources unlimited.
    BurstWhenUnlimited { burst: u64 },
    /// A policy's new_sources unlimited: a policy without one shares the interface's.
    UnlimitedPolicy,
    /// Out of range: the setting named, and why.
    Invalid {
        setting: Setting,
        given: u64,
        reason: ConfigError,
    },
}

impl NewSourcesError {
    /// The setting a refusal is about.
    pub fn setting(&self) -> Setting {
        match self {
            Self::UnlimitedPolicy => Setting::NewSources,
            Self::BurstAlone { .. } | Self::BurstWhenUnlimited { .. } => Setting::NewSourcesBurst,
            Self::Invalid { setting, .. } => *setting,
        }
    }
}

/// An interface's admission from `n` and `burst` (the burst defaults to `n`): `None` when
/// neither is given (the default for its source maps); unlimited for [`KeysPerSec::UNLIMITED`].
pub fn of_interface(
    n: Option<KeysPerSec>,
    burst: Option<u64>,
) -> Result<Option<Admission>, NewSourcesError> {
    match (n, burst) {
        (None, None) => Ok(None),
        (Some(KeysPerSec::UNLIMITED), Some(burst)) => {
            Err(NewSourcesError::BurstWhenUnlimited { burst })
        }
        (Some(KeysPerSec::UNLIMITED), None) => Ok(Some(Admission::default())),
        (n, burst) => limited(n, burst).map(Some),
    }
}

/// A policy's own admission from `n` and `burst` (the burst defaults to `n`); none of its
/// own (it shares the interface's) when neither is given.
pub fn of_policy(n: Option<KeysPerSec>, burst: Option<u64>) -> Result<Admission, NewSourcesError> {
    match (n, burst) {
        (None, None) => Ok(Admission::default()),
        (Some(KeysPerSec::UNLIMITED), Some(burst)) => {
            Err(NewSourcesError::BurstWhenUnlimited { burst })
        }
        (Some(KeysPerSec::UNLIMITED), None) => Err(NewSourcesError::UnlimitedPolicy),
        (n, burst) => limited(n, burst),
    }
}

/// `n` keys a second (not unlimited), `burst` at once.
fn limited(n: Option<KeysPerSec>, burst: Option<u64>) -> Result<Admission, NewSourcesError> {
    let Some(KeysPerSec(n)) = n else {
        return Err(NewSourcesError::BurstAlone {
            burst: burst.unwrap_or_default(),
        });
    };
    let given = burst.unwrap_or(n);
    Admission::new(n, given).map_err(|reason| match reason {
        ConfigError::NewSources(_) => NewSourcesError::Invalid {
            setting: Setting::NewSourcesBurst,
            given,
            reason,
        },
        reason => NewSourcesError::Invalid {
            setting: Setting::NewSources,
            given: n,
            reason,
        },
    })
}

/// `second sighting, 1000/s burst 5000` for `n` keys a second and `burst`, or `unlimited`
/// (`n` zero).
pub fn describe(n: u64, burst: u64) -> String {
    if n != 0 {
        format!("second sighting, {n}/s burst {burst}")
    } else {
        "unlimited".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_per_second_read_and_write_as_operators_give_them() {
        assert_eq!("unlimited".parse(), Ok(KeysPerSec::UNLIMITED));
        assert_eq!("2000".parse(), Ok(KeysPerSec(2000)));
        for bad in ["0", "-1", "lots", ""] {
            assert_eq!(
                bad.parse::<KeysPerSec>(),
                Err(NotKeysPerSec(bad.to_owned()))
            );
        }
        assert_eq!(KeysPerSec(2000).to_string(), "2000");
        assert_eq!(KeysPerSec::UNLIMITED.to_string(), "unlimited");
        // The refusal names the word (found by cargo xtask mutants).
        assert_eq!(
            NotKeysPerSec("lots".to_owned()).to_string(),
            "'lots' is not a positive whole number of keys a second, or unlimited"
        );
    }

    #[test]
    fn an_admission_is_described_as_stats_shows_it() {
        assert_eq!(describe(1000, 5000), "second sighting, 1000/s burst 5000");
        assert_eq!(describe(0, 0), "unlimited");
    }

    #[test]
    fn the_burst_defaults_to_the_rate_and_goes_with_it() {
        let admission =
            |n, b| of_interface(n, b).map(|a| a.map(|a| (a.new_sources, a.new_sources_burst)));
        assert_eq!(admission(None, None), Ok(None));
        assert_eq!(
            admission(Some(KeysPerSec(2000)), None),
            Ok(Some((2000, 2000)))
        );
        assert_eq!(
            admission(Some(KeysPerSec(2000)), Some(100_000)),
            Ok(Some((2000, 100_000)))
        );
        assert_eq!(
            admission(Some(KeysPerSec::UNLIMITED), None),
            Ok(Some((0, 0)))
        );
        assert_eq!(
            admission(Some(KeysPerSec::UNLIMITED), Some(5)),
            Err(NewSourcesError::BurstWhenUnlimited { burst: 5 })
        );
        assert_eq!(
            admission(None, Some(5)),
            Err(NewSourcesError::BurstAlone { burst: 5 })
        );
        assert_eq!(
            of_interface(Some(KeysPerSec(10)), Some(0))
                .unwrap_err()
                .setting(),
            Setting::NewSourcesBurst
        );
        assert_eq!(
            of_policy(Some(KeysPerSec::UNLIMITED), None),
            Err(NewSourcesError::UnlimitedPolicy)
        );
        assert_eq!(of_policy(None, None), Ok(Admission::default()));
    }
}

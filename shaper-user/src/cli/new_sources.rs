//! `--new-sources N|unlimited` and `--new-sources-burst N`, taken by `attach` and
//! `policy set`: how many keys a second may get a cell of their own, on their second
//! sighting; or, `unlimited`, every key on its first frame.

use std::{fmt, str::FromStr};

use anyhow::{Result, anyhow};
use shaper_common::{config::ConfigError, maps::Admission};

/// Keys a second, or unlimited (0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeysPerSec(pub u64);

impl FromStr for KeysPerSec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "unlimited" {
            return Ok(Self(0));
        }
        match s.parse::<u64>() {
            Ok(n) if n > 0 => Ok(Self(n)),
            _ => Err(format!(
                "'{}' is not a positive whole number of keys a second, or unlimited",
                s.escape_debug()
            )),
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

#[derive(Debug, clap::Args)]
pub struct Flags {
    /// A key new to the table gets a cell of its own on its second sighting within 10 s,
    /// and at most N keys a second do; the frames of the others share one cell at the
    /// per-source rate. "unlimited": every key gets a cell on its first frame (no defence
    /// against a spoofed flood) [default: the interface's; attach: a tenth of the table
    /// a second, the whole table at once]
    #[arg(long, value_name = "N|unlimited")]
    pub new_sources: Option<KeysPerSec>,
    /// How many keys may get a cell at once [default: N]
    #[arg(long, value_name = "N", requires = "new_sources", value_parser = clap::value_parser!(u64).range(1..))]
    pub new_sources_burst: Option<u64>,
}

impl Flags {
    /// The admission asked for; `None` when neither flag was given.
    pub fn admission(&self) -> Result<Option<Admission>> {
        let Some(KeysPerSec(n)) = self.new_sources else {
            return Ok(None);
        };
        let burst = match (n, self.new_sources_burst) {
            (0, Some(b)) => {
                return Err(anyhow!(
                    "--new-sources-burst {b} has no meaning with --new-sources unlimited"
                ));
            }
            (_, Some(b)) => b,
            (n, None) => n,
        };
        Admission::new(n, burst).map(Some).map_err(|e| match e {
            ConfigError::NewSources(e) => anyhow!("invalid --new-sources-burst {burst}: {e}"),
            e => anyhow!("invalid --new-sources {n}: {e}"),
        })
    }
}

/// `second sighting, 1000/s burst 5000` for `n` keys a second and `burst`, or
/// `unlimited` (`n` zero).
pub fn describe(n: u64, burst: u64) -> String {
    if n != 0 {
        format!("second sighting, {n}/s burst {burst}")
    } else {
        "unlimited".to_owned()
    }
}

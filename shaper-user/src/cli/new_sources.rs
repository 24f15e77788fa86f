//! `--new-sources N|unlimited` and `--new-sources-burst N`, taken by `attach` and
//! `policy set`: how many keys a second may get a cell of their own, on their second
//! sighting; or, `unlimited`, every key on its first frame.

use anyhow::{Error, Result, anyhow};
use shaper_common::{config::ConfigError, maps::Admission};
use shaper_user::admission::{self, KeysPerSec, NewSourcesError};

#[derive(Debug, clap::Args)]
pub struct Flags {
    /// A key new to the table gets a cell of its own on its second sighting within 10 s
    /// (on its first, within a 64th of N a second), and at most N keys a second do; the
    /// frames of the others share one cell at the per-source rate. "unlimited": every key
    /// gets a cell on its first frame, no defence against a spoofed flood [default: the
    /// interface's; attach: a tenth of the table a second, the whole table at once]
    #[arg(long, value_name = "N|unlimited")]
    pub new_sources: Option<KeysPerSec>,
    /// How many keys may get a cell at once [default: N]
    #[arg(long, value_name = "N", requires = "new_sources", value_parser = clap::value_parser!(u64).range(1..))]
    pub new_sources_burst: Option<u64>,
}

impl Flags {
    /// The interface's admission asked for; `None` when neither flag was given.
    pub fn of_interface(&self) -> Result<Option<Admission>> {
        admission::of_interface(self.new_sources, self.new_sources_burst).map_err(flagged)
    }

    /// A policy's own admission; none of its own when neither flag was given.
    pub fn of_policy(&self) -> Result<Admission> {
        admission::of_policy(self.new_sources, self.new_sources_burst).map_err(flagged)
    }
}

/// A refusal, the setting named by its flag.
fn flagged(e: NewSourcesError) -> Error {
    match e {
        NewSourcesError::BurstAlone { .. } => anyhow!("--new-sources-burst needs --new-sources"),
        NewSourcesError::BurstWhenUnlimited { burst } => {
            anyhow!("--new-sources-burst {burst} has no meaning with --new-sources unlimited")
        }
        NewSourcesError::UnlimitedPolicy => anyhow!(
            "--new-sources unlimited: a policy without --new-sources shares the interface's admission"
        ),
        // The burst's own error: the flag already says what it is about.
        NewSourcesError::Invalid {
            setting,
            given,
            reason: ConfigError::NewSources(reason),
        } => anyhow!("invalid {} {given}: {reason}", super::flag(setting)),
        NewSourcesError::Invalid {
            setting,
            given,
            reason,
        } => anyhow!("invalid {} {given}: {reason}", super::flag(setting)),
    }
}

//! Growth with use: the per-source tables of an attachment `shaper run` makes start small
//! and grow in place as sources arrive, up to the file's `max_sources`.
//!
//! A new attachment of the daemon's gets tables of [`initial_sources`] of that ceiling
//! (16,384 keys a family at the default 262,144: a sixteenth of the memory). Every
//! [`GROW_EVERY`] the daemon counts the keys each table holds (a batch read of its
//! buckets, [`maps::count_sources`]); tables of which either family holds more than half
//! its room are grown fourfold, or to the ceiling, in place ([`upgrade::grow_sources`]:
//! every key moved with its cell and counters, the program switched through its link). A
//! key takes a way only once new-source admission lets it in, so a table fills, and grows,
//! no faster than admission admits: a spoofed flood's keys that admission refuses take no
//! room. A clsact attachment has no link to switch: its tables are made at the ceiling
//! ([`starts_small`]).
//!
//! `attach` and `apply` make tables of the size asked (`--max-sources`); nothing grows them
//! but a bigger size asked.

use std::time::Duration;

use shaper_common::{
    maps::DEFAULT_MAX_SOURCES,
    sources::{SOURCE_WAYS, source_buckets, source_room},
};

use crate::{
    maps::{self, PinnedMapError},
    pins::Attachment,
    request::{AttachRequest, Hook},
    tc::{TcAttachMode, has_tcx},
    upgrade::{self, UpgradeError},
};

/// How often the daemon counts its tables' keys.
pub const GROW_EVERY: Duration = Duration::from_secs(2);

/// The most keys a family a growing attachment's tables start with.
const INITIAL_AT_MOST: u32 = 16_384;

/// How many times its room a table grows to at once.
const GROWTH: u32 = 4;

/// The room a growing attachment's tables start with, under the ceiling `max_sources`: a
/// sixteenth of it, at least a bucket and at most `INITIAL_AT_MOST`.
pub fn initial_sources(max_sources: u32) -> u32 {
    (max_sources / 16)
        .clamp(SOURCE_WAYS as u32, INITIAL_AT_MOST)
        .min(max_sources.max(1))
}

/// Whether `req`'s new attachment, on `hook`, may start small: it grows with use, and will
/// have a link to switch (XDP, or tc through TCX).
pub fn starts_small(req: &AttachRequest, hook: Hook) -> bool {
    req.growing
        && (hook == Hook::Xdp
            || match req.tc_mode {
                TcAttachMode::Tcx => true,
                TcAttachMode::Clsact => false,
                TcAttachMode::Auto => has_tcx(),
            })
}

/// The keys a new attachment's tables on `hook` have room for: `max_sources` (the
/// default's), or where they start if they grow with use.
pub fn new_table_size(req: &AttachRequest, hook: Hook) -> u32 {
    let max_sources = req.max_sources.unwrap_or(DEFAULT_MAX_SOURCES);
    if starts_small(req, hook) {
        initial_sources(max_sources)
    } else {
        max_sources
    }
}

/// The room to grow tables of room `room` to, the fuller family holding `held` keys, under
/// the ceiling `max_sources`: `GROWTH` times it once more than half is taken.
pub fn next_room(room: u32, held: u64, max_sources: u32) -> Option<u32> {
    let ceiling = source_room(source_buckets(max_sources));
    (2 * held > u64::from(room) && room < ceiling).then(|| room.saturating_mul(GROWTH).min(ceiling))
}

#[derive(Debug, thiserror::Error)]
pub enum GrowError {
    #[error(transparent)]
    Maps(#[from] PinnedMapError),
    #[error(transparent)]
    Upgrade(#[from] UpgradeError),
}

/// Grows `at`'s tables if either family holds more than half their room, up to
/// `max_sources` (see the module); the caller holds the host lock. Returns the room they
/// were grown to, if they were.
pub fn grow_if_full(at: &Attachment, max_sources: u32) -> Result<Option<u32>, GrowError> {
    let room = maps::sources_capacity(at)?;
    let (v4, v6) = maps::count_sources(at)?;
    let Some(next) = next_room(room, v4.max(v6), max_sources) else {
        return Ok(None);
    };
    crate::crash::hold("grow");
    upgrade::grow_sources(at, next)?;
    Ok(Some(next))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_start_at_a_sixteenth_of_the_ceiling_within_bounds() {
        assert_eq!(initial_sources(262_144), 16_384);
        assert_eq!(initial_sources(1_000_000), 16_384);
        assert_eq!(initial_sources(4_096), 256);
        assert_eq!(initial_sources(64), 8);
        assert_eq!(initial_sources(5), 5);
    }

    #[test]
    fn tables_grow_fourfold_past_half_their_room_up_to_the_ceiling() {
        assert_eq!(next_room(256, 128, 4_096), None, "half is not past half");
        assert_eq!(next_room(256, 129, 4_096), Some(1_024));
        assert_eq!(next_room(1_024, 600, 4_096), Some(4_096));
        assert_eq!(next_room(4_096, 4_000, 4_096), None, "at the ceiling");
        // A ceiling that is not a whole number of buckets: its room.
        assert_eq!(next_room(16_384, 9_000, 20_001), Some(20_008));
    }
}

//! Layout 8 (shaper as of commit d879af3, before layout 9 took the subscribers' ids and
//! names out of their entries): `SHAPER_SUBS`' entry of 160 bytes, its id and name in it.
//! It is [`crate::subscriber::Entry`] (the journal keeps an entry in that layout too), so a
//! layout-8 entry becomes today's entry and record by [`crate::subscriber::record::split`].
//!
//! `SHAPER_SUBS` holds cells, which an upgrade otherwise carries only by reusing the map:
//! this one is copied into the new map while the old program still meters (its cells,
//! counts, plan), just before the program is switched. What the old program charged and
//! counted in between (the moments of the copy and the switch) is then carried by
//! [`top_up`], after the switch, for the cells; the counts of those moments are not.

use aya::maps::{Array, IterableMap as _, MapData};
use shaper_common::maps::{PIN_SUBSCRIBERS, Subscriber};

use crate::{
    pins::Attachment,
    subscriber::{
        Entry,
        record::{self, Records},
    },
};

/// The value size of `SHAPER_SUBS` in layout 8.
pub const ENTRY_BYTES: u32 = 160;

/// Copies the subscribers of the layout-8 table `old` into today's `new` (just made, of
/// the same size: its pin `new_pin`), their ids and names into `at`'s records, made anew.
pub fn copy(
    at: &Attachment,
    old: &Array<MapData, Entry>,
    new: &MapData,
    new_pin: &std::path::Path,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    // No room for any subscriber (`--max-subscribers 0`): none to copy, no records (as
    // `record::make` leaves none).
    if old.len() <= 1 {
        record::forget(at);
        return Ok(());
    }
    let entries = crate::maps::read_batched::<u32, Entry>(old.map())?;
    let map_id = crate::bpf::map_info(new_pin)?.id;
    let records = Records::create(&record::path_of(at), map_id)?;
    // Every entry ever used (in use, or a tombstone the probes go past), and entry 0's
    // marker.
    let used: Vec<(u32, Entry)> = entries
        .into_iter()
        .filter(|(_, e)| *e != Entry::default())
        .collect();
    let mut recs: Vec<_> = used
        .iter()
        .filter(|(i, _)| *i != 0)
        .map(|(i, e)| (*i, record::split(*i, e).1))
        .collect();
    records.write_many(&mut recs, old.len())?;
    let kernel: Vec<(u32, Subscriber)> = used
        .iter()
        .map(|(i, e)| (*i, record::split(*i, e).0))
        .collect();
    crate::maps::write_batched(new, &kernel)?;
    Ok(())
}

/// After the switch (no CPU runs the old program): each cell of today's table `new` that
/// the old table `old` has later (charged more, between the copy and the switch) takes
/// the old one's. Idempotent (a later cell is kept), so a killed upgrade does it again.
pub fn top_up(
    old: &Array<MapData, Entry>,
    new: &mut Array<MapData, Subscriber>,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let was = crate::maps::read_batched::<u32, Entry>(old.map())?;
    for (i, o) in was.into_iter().filter(|(i, e)| *i != 0 && e.in_use != 0) {
        let n = new.get(&i, 0)?;
        if n.in_use == 0 || (o.cell.tat <= n.cell.tat && o.excess.tat <= n.excess.tat) {
            continue;
        }
        let mut later = n;
        later.cell.tat = later.cell.tat.max(o.cell.tat);
        later.excess.tat = later.excess.tat.max(o.excess.tat);
        new.set(i, later, 0)?;
    }
    Ok(())
}

/// The pin of the subscribers' table in `dir`, if its entries are layout 8's.
pub fn is_layout8(dir: &std::path::Path) -> bool {
    crate::bpf::map_info(&dir.join(PIN_SUBSCRIBERS)).is_ok_and(|i| i.value_size == ENTRY_BYTES)
}

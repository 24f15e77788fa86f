//! Where a subscriber's entry is, so that finding one by id reads a few entries, not the
//! table: an open-addressed hash table over `SHAPER_SUBS`, in place, the pinned layout
//! unchanged.
//!
//! A subscriber is placed at the first entry not in use from its id's home ([`home`]: a
//! stable hash of the id, FNV-1a, over the `room` entries 1..=room), going on entry by
//! entry ([`after`], wrapping). A removed subscriber leaves a tombstone: its entry not in
//! use (the kernel tests `in_use` alone) but its id kept, so the subscribers placed past it
//! are still found; a new subscriber may take a tombstone once its id is known to be
//! absent. Finding an id ([`probe`]) reads from its home, a run of entries a call (runs
//! growing from [`FIRST_RUN`]), until the id or an entry never used (id all zero): then
//! it is absent. A table whose every entry was used is read whole, which says as much.
//!
//! Entry 0 is never a subscriber (no route points at it): its id [`MARKER`] says the table
//! places by hash. An attachment without it (its subscribers placed first-free by an older
//! shaper) is searched whole, as before, until it has no subscriber: the first change
//! that finds it empty marks it.

use shaper_common::maps::SUBSCRIBER_ID_BYTES;

use super::record::Entry;

/// The id of entry 0 in a table that places subscribers by hash.
pub const MARKER: [u8; SUBSCRIBER_ID_BYTES] = *b"shaper: placed by id hash, v1\0\0\0";

/// Entries read by the first call of a probe; each next call reads twice as many, up to
/// [`MAX_RUN`].
pub const FIRST_RUN: u32 = 16;
pub const MAX_RUN: u32 = 8192;

/// The entry where subscriber `id`'s probe starts, in a table of `room` subscribers
/// (entries 1..=room): FNV-1a (64 bits) of its bytes, stable across builds and hosts.
pub fn home(id: &[u8], room: u32) -> u32 {
    let h = crate::fnv::fnv1a(id.iter().copied().take_while(|&b| b != 0));
    (h % u64::from(room.max(1))) as u32 + 1
}

/// The entry after `i` in a probe of a table of `room` subscribers: entry 1 after the last.
pub fn after(i: u32, room: u32) -> u32 {
    if i >= room { 1 } else { i + 1 }
}

/// What an entry is to a probe for `id`.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    /// The subscriber sought, in use.
    Found,
    /// Never used: the probe ends.
    Never,
    /// Not in use but once was: a new subscriber may take it; the probe goes on.
    Tombstone,
    /// Another subscriber's.
    Other,
}

fn seen(entry: &Entry, id: &[u8; SUBSCRIBER_ID_BYTES]) -> Seen {
    match (entry.in_use != 0, entry.id == [0; SUBSCRIBER_ID_BYTES]) {
        (true, _) if entry.id == *id => Seen::Found,
        (true, _) => Seen::Other,
        (false, true) => Seen::Never,
        (false, false) => Seen::Tombstone,
    }
}

/// What a probe found.
#[derive(Debug, PartialEq, Eq)]
pub enum Probe {
    /// The subscriber's index and entry.
    Found(u32, Entry),
    /// Absent: the entry a new subscriber of the id takes (the first tombstone or never
    /// used entry from its home), `None` if the table is full.
    Absent(Option<u32>),
}

/// Looks for subscriber `id` in a table of `room` subscribers whose entries `read(start,
/// n)` gives (`n` entries from `start`, fewer only where the table ends): from its home,
/// in runs, until found or an entry never used, at most the whole table once.
pub fn probe<E>(
    id: &[u8; SUBSCRIBER_ID_BYTES],
    room: u32,
    mut read: impl FnMut(u32, u32) -> Result<Vec<Entry>, E>,
) -> Result<Probe, E> {
    let mut at = home(id, room);
    let (mut free, mut seen_n, mut run) = (None, 0u32, FIRST_RUN);
    while seen_n < room {
        // Not past the table's end (the probe wraps to entry 1), nor past where it began.
        let n = run.min(room - seen_n).min(room + 1 - at);
        let entries = read(at, n)?;
        if entries.is_empty() {
            break;
        }
        for (k, e) in entries.iter().enumerate() {
            let i = at + k as u32;
            match seen(e, id) {
                Seen::Found => return Ok(Probe::Found(i, *e)),
                Seen::Never => return Ok(Probe::Absent(free.or(Some(i)))),
                Seen::Tombstone => {
                    free.get_or_insert(i);
                }
                Seen::Other => {}
            }
        }
        let got = entries.len() as u32;
        seen_n += got;
        at = after(at + got - 1, room);
        run = (run * 2).min(MAX_RUN);
    }
    Ok(Probe::Absent(free))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> [u8; SUBSCRIBER_ID_BYTES] {
        let mut out = [0; SUBSCRIBER_ID_BYTES];
        out[..s.len()].copy_from_slice(s.as_bytes());
        out
    }

    fn used(s: &str) -> Entry {
        Entry {
            in_use: 1,
            id: id(s),
            ..Entry::default()
        }
    }

    /// A table of `room` entries (index 0 unused) read as the kernel's batch would,
    /// counting the calls.
    fn reader(table: &[Entry], calls: &mut u32) -> impl FnMut(u32, u32) -> Result<Vec<Entry>, ()> {
        move |start, n| {
            *calls += 1;
            let end = (start + n).min(table.len() as u32);
            Ok(table[start as usize..end as usize].to_vec())
        }
    }

    #[test]
    fn home_is_stable_and_in_range() {
        // FNV-1a of "c1" (known value): the placement must not change across builds.
        assert_eq!(home(b"c1", u32::MAX), 3_186_419_553);
        for room in [1, 2, 8, 1_000_000] {
            for n in 0..1000 {
                let h = home(format!("c{n}").as_bytes(), room);
                assert!((1..=room).contains(&h), "{h} of {room}");
            }
        }
        // NUL padding is not part of the id.
        assert_eq!(home(&id("abc"), 1000), home(b"abc", 1000));
    }

    #[test]
    fn after_wraps_to_the_first_entry() {
        assert_eq!(after(1, 8), 2);
        assert_eq!(after(7, 8), 8);
        assert_eq!(after(8, 8), 1);
        assert_eq!(after(1, 1), 1);
    }

    #[test]
    fn a_probe_goes_past_others_and_tombstones_to_the_id() {
        let room = 8;
        let target = id("x");
        let h = home(&target, room);
        let mut table = vec![Entry::default(); room as usize + 1];
        // Home taken by another, the next a tombstone, the next the subscriber.
        table[h as usize] = used("other");
        let t = after(h, room);
        table[t as usize] = Entry {
            id: id("gone"),
            ..Entry::default()
        };
        let x = after(t, room);
        table[x as usize] = used("x");
        let mut calls = 0;
        let found = probe(&target, room, reader(&table, &mut calls)).unwrap();
        assert_eq!(found, Probe::Found(x, used("x")));
        // Absent: the tombstone is where it would go.
        let mut calls = 0;
        table[x as usize] = Entry::default();
        assert_eq!(
            probe(&target, room, reader(&table, &mut calls)).unwrap(),
            Probe::Absent(Some(t))
        );
    }

    #[test]
    fn a_full_table_is_read_once_whole() {
        let room = 8;
        let mut table = vec![Entry::default(); room as usize + 1];
        for (i, e) in table.iter_mut().enumerate().skip(1) {
            *e = used(&format!("s{i}"));
        }
        let mut entries = 0;
        let got = probe(&id("absent"), room, |s, n| {
            let end = (s + n).min(table.len() as u32);
            entries += (end - s) as usize;
            Ok::<_, ()>(table[s as usize..end as usize].to_vec())
        })
        .unwrap();
        assert_eq!(got, Probe::Absent(None));
        assert_eq!(entries, room as usize, "every entry once");
        // One tombstone anywhere: it is where a new one goes.
        table[3] = Entry {
            id: id("s3"),
            ..Entry::default()
        };
        let mut calls = 0;
        assert_eq!(
            probe(&id("absent"), room, reader(&table, &mut calls)).unwrap(),
            Probe::Absent(Some(3))
        );
    }

    #[test]
    fn runs_grow_and_wrap() {
        let room = 1000;
        let mut table = vec![Entry::default(); room as usize + 1];
        for (i, e) in table.iter_mut().enumerate().skip(1) {
            *e = used(&format!("s{i}"));
        }
        table[home(b"y", room) as usize - 1
            + if home(b"y", room) == 1 {
                room as usize
            } else {
                0
            }] = Entry::default();
        let mut calls = 0;
        let got = probe(&id("y"), room, reader(&table, &mut calls)).unwrap();
        // The never-used entry just before its home: found after a wrap, in a few calls.
        assert!(matches!(got, Probe::Absent(Some(_))), "{got:?}");
        assert!(calls <= 12, "{calls} calls");
    }
}

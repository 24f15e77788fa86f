//! A LibreQoS file applied again: only the rows that changed since the last apply read.
//!
//! An apply that reads an `[interface.libreqos]` file whole saves, once committed, a
//! digest of each of its device rows with the index of its circuit's subscriber entry
//! ([`Saved`], a root-only file beside the saved routes, [`crate::subscriber::known`]),
//! with a digest of everything else that made the subscribers what they are (the
//! interface's settings and policies, its other subscribers, the plan options, the CSV's
//! header, the MTU: [`context`]). The next apply of the interface hashes the file's rows
//! (cheap), compares them with the saved digests, and reads, checks and compares with
//! their entries only the circuits whose rows changed ([`reapply`]): the subscribers'
//! table and tries are not read whole.
//!
//! The saved digests are a copy, never the state: trusted only if no change since the
//! apply that saved them may have touched the attachment (the lock's change log:
//! [`crate::system::Lock::touched_since`]: a `subscriber set`, an API call, a RADIUS CoA,
//! a rollback, a detach all log theirs) and its maps are the same (their ids). Whatever
//! the fast way cannot do alone (a circuit new or removed with `prune_subscribers`, a
//! prefix changed, many rows changed, any error) is done the whole way, which is never
//! wrong, only slower: [`reapply`] says `None`, and the caller reads the file whole.

use std::{
    fs,
    hash::BuildHasher as _,
    io::{self, Read as _},
    path::PathBuf,
};

use foldhash::HashSet;

use crate::{
    import,
    libreqos::{self, Partial},
    maps::Pinned,
    pins::Attachment,
    request::AttachRequest,
    subscriber::{Batch, SubscriberSpec, SubscriberTable, known},
    system,
};

/// The largest LibreQoS file read: 1 GiB (a million circuits take about 100 MB).
pub const MAX_CSV_BYTES: u64 = 1 << 30;

/// Most rows changed for [`reapply`]: more are read the whole way.
pub const MOST_CHANGED: usize = 4096;

/// A 128-bit digest of `bytes`, the same in every run of this build (foldhash's quality
/// hash, fixed seeds: a saved file of another build has another [`MAGIC`]).
pub fn digest(bytes: &[u8]) -> u128 {
    let h = |seed| foldhash::quality::FixedState::with_seed(seed).hash_one(bytes);
    u128::from(h(0x5368_6170_6572_0001)) << 64 | u128::from(h(0x5368_6170_6572_0002))
}

/// Each line of `buf` (without its line feed) with its number, from 1, and where it
/// starts.
pub fn lines(buf: &[u8]) -> impl Iterator<Item = (usize, usize, &[u8])> {
    let mut start = 0;
    let mut n = 0;
    std::iter::from_fn(move || {
        if start >= buf.len() {
            return None;
        }
        let len = buf[start..]
            .iter()
            .position(|&b| b == b'\n')
            .unwrap_or(buf.len() - start);
        let at = start;
        start += len + 1;
        n += 1;
        Some((n, at, &buf[at..at + len]))
    })
}

/// Whether a line is certainly no row (empty, or a comment): the CSV reader skips it.
pub fn skipped(line: &[u8]) -> bool {
    line.first().is_none_or(|&b| b == b'#')
}

/// The line starting at `at` in `buf`, without its line feed.
fn line_at(buf: &[u8], at: usize) -> &[u8] {
    let rest = &buf[at..];
    &rest[..rest.iter().position(|&b| b == b'\n').unwrap_or(rest.len())]
}

/// A configuration file's `[interface.libreqos]`: the CSV and how its circuits become
/// subscribers, and its rows once read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CsvFile {
    pub path: PathBuf,
    /// As errors name it.
    pub shown: String,
    pub plan: import::Plan,
    /// `None`: not read yet (the file's subscribers are its other ones alone).
    pub rows: Option<RowDigests>,
}

/// A LibreQoS file's rows as read whole.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowDigests {
    /// The header row's digest.
    pub header: u128,
    /// Each device row's digest and circuit: an index among the file's subscribers
    /// (its other subscribers first).
    pub rows: Vec<(u128, u32)>,
    /// How many circuits.
    pub circuits: u32,
}

impl RowDigests {
    /// The digests of the rows `read` found in a file whose lines' digests are `lines`
    /// ([`line_digests`]), its circuits being subscribers `first..` of the file.
    pub fn of(lines: &[u128], read: &libreqos::Rows, first: usize) -> Self {
        let at = |line: usize| lines.get(line.wrapping_sub(1)).copied().unwrap_or(0);
        Self {
            header: at(read.header),
            rows: read
                .rows
                .iter()
                .map(|&(line, circuit)| (at(line as usize), first as u32 + circuit))
                .collect(),
            circuits: read.circuits.len() as u32,
        }
    }
}

/// The digest of each line of `buf`, line 1 first: taken while the file is read (on
/// another thread), not after it.
pub fn line_digests(buf: &[u8]) -> Vec<u128> {
    lines(buf).map(|(_, _, text)| digest(text)).collect()
}

/// What an apply of a LibreQoS file leaves for the next one: each row's digest with its
/// subscriber's entry, and what they were read against.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Saved {
    /// The host's change count of the apply that saved it.
    pub generation: u64,
    /// The ids of the subscribers' table and of the IPv4 and IPv6 tries.
    pub maps: [u32; 3],
    /// [`context`] of the apply.
    pub context: u128,
    /// How many circuits the file had.
    pub circuits: u32,
    /// Each row's digest and the index of its subscriber's entry, sorted.
    pub rows: Vec<(u128, u32)>,
}

const MAGIC: &[u8; 8] = b"shrows1\n";
const HEADER_BYTES: usize = 8 + 8 + 12 + 16 + 4;
const ROW_BYTES: usize = 20;

/// The file of attachment `at`'s saved rows.
pub fn path_of(at: &Attachment) -> PathBuf {
    let mut p = known::path_of(at).into_os_string();
    p.push(".rows");
    p.into()
}

/// Removes the saved rows of `at` (gone, or not to be trusted), if any.
pub fn forget(at: &Attachment) {
    let _ = fs::remove_file(path_of(at));
}

impl Saved {
    /// What `at`'s last apply saved, if anything (whether to trust it is
    /// [`trusted`]'s to say).
    pub fn load(at: &Attachment) -> Option<Self> {
        let path = path_of(at);
        if !crate::owned::check_dir_of(&path).unwrap_or(false) {
            return None;
        }
        let mut f = crate::owned::open_private_to_read(&path).ok()?;
        let mut buf = Vec::new();
        f.read_to_end(&mut buf).ok()?;
        let (head, body) = buf.split_at_checked(HEADER_BYTES)?;
        if &head[..8] != MAGIC || body.len() % ROW_BYTES != 0 {
            return None;
        }
        let word = |at: usize, n: usize| &head[at..at + n];
        let u32_at = |at| u32::from_le_bytes(word(at, 4).try_into().unwrap_or_default());
        let rows = body
            .chunks_exact(ROW_BYTES)
            .map(|r| {
                let d = u128::from_le_bytes(r[..16].try_into().unwrap_or_default());
                (
                    d,
                    u32::from_le_bytes(r[16..].try_into().unwrap_or_default()),
                )
            })
            .collect();
        Some(Self {
            generation: u64::from_le_bytes(word(8, 8).try_into().unwrap_or_default()),
            maps: [u32_at(16), u32_at(20), u32_at(24)],
            context: u128::from_le_bytes(word(28, 16).try_into().unwrap_or_default()),
            circuits: u32_at(44),
            rows,
        })
    }

    /// Saves it as `at`'s: written beside, then renamed over, root-only.
    pub fn save(&self, at: &Attachment) -> io::Result<()> {
        let path = path_of(at);
        let mut out = Vec::with_capacity(HEADER_BYTES + ROW_BYTES * self.rows.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.generation.to_le_bytes());
        for id in self.maps {
            out.extend_from_slice(&id.to_le_bytes());
        }
        out.extend_from_slice(&self.context.to_le_bytes());
        out.extend_from_slice(&self.circuits.to_le_bytes());
        for (d, index) in &self.rows {
            out.extend_from_slice(&d.to_le_bytes());
            out.extend_from_slice(&index.to_le_bytes());
        }
        crate::owned::save_private(&path, &out)
    }
}

/// What `at`'s last apply saved, if no change since may have touched `at` (`lock`'s
/// change log, read under it before this change moves it on).
pub fn trusted(lock: &system::Lock, at: &Attachment) -> Option<Saved> {
    let saved = Saved::load(at)?;
    let touched = lock.touched_since(saved.generation).ok()??;
    (!touched.contains(&system::digest(&at.label()))).then_some(saved)
}

/// The ids of the maps the saved rows describe, as `pinned` opened them.
pub fn map_ids(pinned: &Pinned) -> Option<[u32; 3]> {
    known::map_ids(pinned)
}

/// A digest of everything but its LibreQoS file's rows that made the subscribers of
/// interface `d` what they are: its settings and policies, its other subscribers
/// (`others`) and whether it prunes, the plan options, the CSV's header (`header`, its
/// digest) and the MTU (the bursts were checked against it).
pub fn context(
    d: &AttachRequest,
    others: &[SubscriberSpec],
    csv: &CsvFile,
    header: u128,
    mtu: u32,
) -> u128 {
    let prune = d.subscribers.as_ref().is_some_and(|s| s.prune);
    let text = format!(
        "{:?}\n{others:?}\n{prune}\n{:?}\n{header}\n{mtu}",
        d.for_attach(d.at.clone()),
        csv.plan
    );
    digest(text.as_bytes())
}

/// What [`reapply`] makes of an interface: the batch of the circuits that changed, and
/// the rows to save once it is committed (their generation and maps still to fill in).
pub struct Reapplied {
    pub batch: Batch<'static>,
    pub saved: Saved,
}

/// The subscribers of interface `d` (whose `[interface.libreqos]` is `csv`, not read)
/// as the rows that changed since `saved` make them, read through `pinned`; `None` where
/// that is not all there is to it (see the module's documentation): the caller reads the
/// file whole.
pub fn reapply(
    d: &AttachRequest,
    csv: &CsvFile,
    saved: Saved,
    pinned: &Pinned,
) -> Option<Reapplied> {
    let subs = d.subscribers.as_ref()?;
    if map_ids(pinned)? != saved.maps {
        return None;
    }
    let table = SubscriberTable::of(pinned).ok()?;
    let config = table.config().ok()?;
    let keys = (config.prefix_v4, config.prefix_v6);
    let mtu = system::mtu(&d.at.iface).ok()?;
    let file = fs::File::open(&csv.path).ok()?;
    if file.metadata().ok()?.len() > MAX_CSV_BYTES.min(libreqos::MAX_FILE_BYTES) {
        return None;
    }
    let mut buf = Vec::new();
    io::BufReader::new(file).read_to_end(&mut buf).ok()?;
    let mut rows = lines(&buf).filter(|(_, _, text)| !skipped(text));
    let (header_line, _, header) = rows.next()?;
    if context(d, &subs.specs, csv, digest(header), mtu) != saved.context {
        return None;
    }
    // Each row's digest, line and start, sorted as the saved ones are.
    let mut now: Vec<(u128, u32, u32)> = rows
        .map(|(n, at, text)| (digest(text), n as u32, at as u32))
        .collect();
    if now.len() > libreqos::MAX_ROWS {
        return None;
    }
    now.sort_unstable();
    let diff = Diff::of(&now, &saved.rows)?;
    let mut partial = Partial::new(header, header_line).ok()?;
    // The circuits changed: those of the rows gone, by their entries, and those of the
    // rows new, by their ids.
    let mut ids: Vec<(String, u32)> = Vec::new();
    for &(_, index) in &diff.gone {
        let id = table.id_at(index).ok()??;
        if !ids.iter().any(|(i, _)| *i == id) {
            ids.push((id, index));
        }
    }
    let mut new_ids = Vec::new();
    for &(digest, line, at) in &diff.new {
        let text = line_at(&buf, at as usize);
        let Some(id) = partial.circuit_id(text, line as usize).ok()? else {
            continue;
        };
        if ids.iter().any(|(i, _)| *i == id) {
            new_ids.push((digest, line, at, id));
            continue;
        }
        // A circuit new to the file: its subscriber may not be (and is if it was the
        // file's before: its rows were all changed).
        let index = table.index_of(&id).ok()??;
        ids.push((id.clone(), index));
        new_ids.push((digest, line, at, id));
    }
    let indices: HashSet<u32> = ids.iter().map(|(_, i)| *i).collect();
    // Every row of those circuits, in file order: the new ones, and those kept.
    let mut read: Vec<(u32, u32)> = new_ids.iter().map(|(_, l, at, _)| (*l, *at)).collect();
    read.extend(
        diff.kept
            .iter()
            .filter(|(_, _, _, index)| indices.contains(index))
            .map(|(_, line, at, _)| (*line, *at)),
    );
    read.sort_unstable();
    for (line, at) in read {
        partial
            .add(line_at(&buf, at as usize), line as usize)
            .ok()?;
    }
    let circuits = partial.finish().ok()?;
    // A circuit no longer in the file stays (pruning is the whole way's).
    let gone = ids.len() - circuits.len();
    if gone > 0 && subs.prune {
        return None;
    }
    let mut specs = Vec::with_capacity(circuits.len());
    let mut index_of = Vec::with_capacity(circuits.len());
    for c in circuits {
        let spec = import::subscriber(c, &csv.plan).ok()?;
        spec.check(keys).ok()?;
        if subs.specs.iter().any(|o| o.id == spec.id) || !bursts_fit(&d.at.iface, &spec) {
            return None;
        }
        index_of.push(ids.iter().find(|(i, _)| *i == spec.id)?.1);
        specs.push(spec);
    }
    let circuits_now = (saved.circuits as usize).checked_sub(gone)?;
    let others = (subs.specs.len() + circuits_now).checked_sub(specs.len())?;
    let batch = table.batch_known(&specs, others).ok()??;
    // The rows to save: those kept, and the new ones under their circuits' entries.
    let mut rows: Vec<(u128, u32)> = diff.kept.iter().map(|(d, _, _, i)| (*d, *i)).collect();
    for (digest, _, _, id) in &new_ids {
        let k = specs.iter().position(|s| s.id == *id)?;
        rows.push((*digest, index_of[k]));
    }
    rows.sort_unstable();
    Some(Reapplied {
        batch,
        saved: Saved {
            context: saved.context,
            circuits: circuits_now as u32,
            rows,
            ..Saved::default()
        },
    })
}

/// Whether every burst of `spec`'s plan holds a full-size frame on `iface`.
fn bursts_fit(iface: &str, spec: &SubscriberSpec) -> bool {
    let p = &spec.plan;
    [
        p.aggregate_burst_bytes,
        p.burst_bytes,
        p.meter2.excess_burst_bytes,
    ]
    .into_iter()
    .filter(|&b| b != 0)
    .all(|b| system::check_burst_fits(iface, b).is_ok())
}

/// The rows now against those saved.
struct Diff {
    /// Rows in both: digest, line, start, entry.
    kept: Vec<(u128, u32, u32, u32)>,
    /// Saved rows no longer in the file: digest, entry.
    gone: Vec<(u128, u32)>,
    /// Rows not saved: digest, line, start.
    new: Vec<(u128, u32, u32)>,
}

impl Diff {
    /// Both sorted; `None` if more than [`MOST_CHANGED`] rows differ.
    fn of(now: &[(u128, u32, u32)], saved: &[(u128, u32)]) -> Option<Self> {
        let mut diff = Diff {
            kept: Vec::with_capacity(now.len()),
            gone: Vec::new(),
            new: Vec::new(),
        };
        let (mut i, mut j) = (0, 0);
        while i < now.len() || j < saved.len() {
            match (now.get(i), saved.get(j)) {
                (Some(a), Some(b)) if a.0 == b.0 => {
                    diff.kept.push((a.0, a.1, a.2, b.1));
                    i += 1;
                    j += 1;
                }
                (Some(a), Some(b)) if a.0 < b.0 => {
                    diff.new.push(*a);
                    i += 1;
                }
                (Some(a), None) => {
                    diff.new.push(*a);
                    i += 1;
                }
                (_, Some(b)) => {
                    diff.gone.push(*b);
                    j += 1;
                }
                (None, None) => break,
            }
            if diff.new.len() + diff.gone.len() > MOST_CHANGED {
                return None;
            }
        }
        Some(diff)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_numbered_and_split_at_line_feeds() {
        let buf = b"a,b\r\n\n#c\nd";
        let got: Vec<_> = lines(buf).collect();
        assert_eq!(
            got,
            [
                (1, 0, &b"a,b\r"[..]),
                (2, 5, &b""[..]),
                (3, 6, &b"#c"[..]),
                (4, 9, &b"d"[..])
            ]
        );
        assert!(skipped(b"") && skipped(b"#c") && !skipped(b"\r"));
        assert_eq!(line_at(buf, 6), b"#c");
    }

    #[test]
    fn the_diff_keeps_what_both_have_and_counts_twice_what_is_twice() {
        let now = [(1, 10, 100), (2, 11, 110), (2, 12, 120), (5, 13, 130)];
        let saved = [(1, 7), (2, 8), (3, 9)];
        let d = Diff::of(&now, &saved).unwrap();
        assert_eq!(d.kept, [(1, 10, 100, 7), (2, 11, 110, 8)]);
        assert_eq!(d.new, [(2, 12, 120), (5, 13, 130)]);
        assert_eq!(d.gone, [(3, 9)]);
    }

    #[test]
    fn a_digest_is_stable_and_tells_rows_apart() {
        assert_eq!(digest(b"s1,,d1"), digest(b"s1,,d1"));
        assert_ne!(digest(b"s1,,d1"), digest(b"s1,,d2"));
    }
}

//! The subscribers' ids and names, out of the kernel's entries: a root-only file of fixed
//! records ([`Records`]) beside the routes' files, one a subscriber's index, so that
//! `SHAPER_SUBS` holds what the kernel reads and an 8-byte hash of the id
//! ([`Subscriber::id_hash`]) — 112 bytes an entry, not 160.
//!
//! The file is state, not a copy: each record is written by the change that writes its
//! entry (under the host lock, journaled with it: [`Entry`] is what the journal keeps),
//! the record before an entry that comes into use, after one that goes out of use. Every
//! read of an entry is checked against its record's id ([`join`]): an entry in use whose
//! record does not hash to its `id_hash` (the file lost, cut, or another table's) is an
//! error naming the file, never an id made up. Record 0 (entry 0 is never a subscriber)
//! is the file's header: its magic and the id of the map it describes.
//!
//! Records are written in place (`pwrite` at index × [`RECORD`]): a `subscriber set` at a
//! million subscribers writes 56 bytes, not the file.

use std::{
    fs::{self, File, OpenOptions},
    io,
    os::unix::fs::{FileExt as _, OpenOptionsExt as _},
    path::{Path, PathBuf},
};

use shaper_common::maps::{Cell, Outcomes, SUBSCRIBER_ID_BYTES, SUBSCRIBER_NAME_BYTES, Subscriber};

use crate::pins::Attachment;

/// A subscriber as userspace sees it: its kernel entry's fields with its id and name
/// (NUL-padded) from its record. The layout of `SHAPER_SUBS`' entries before layout 9,
/// which the journal keeps a subscriber's entry as.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Entry {
    pub cell: Cell,
    pub excess: Cell,
    pub plan: u32,
    pub in_use: u32,
    pub outcomes: Outcomes,
    pub yellow_packets: u64,
    pub yellow_bytes: u64,
    pub id: [u8; SUBSCRIBER_ID_BYTES],
    pub name: [u8; SUBSCRIBER_NAME_BYTES],
}

// Layout 8's entry, frozen (the journal and `upgrade::layout8` read these bytes).
const _: () = assert!(size_of::<Entry>() == 160);
const _: () = assert!(std::mem::offset_of!(Entry, plan) == 32);
const _: () = assert!(std::mem::offset_of!(Entry, outcomes) == 40);
const _: () = assert!(std::mem::offset_of!(Entry, yellow_packets) == 88);
const _: () = assert!(std::mem::offset_of!(Entry, id) == 104);
const _: () = assert!(std::mem::offset_of!(Entry, name) == 136);

// SAFETY: #[repr(C)], integers and byte arrays only, no padding (160 = its fields' sum).
unsafe impl aya::Pod for Entry {}

/// Bytes a record: the id, then the name, NUL-padded.
pub const RECORD: usize = SUBSCRIBER_ID_BYTES + SUBSCRIBER_NAME_BYTES;

/// Record 0's first bytes.
const MAGIC: &[u8; 8] = b"shsubid1";

/// The id of entry 0 in a table placed by hash (`super::place::MARKER`), as its entry
/// holds it: a hash no id has (FNV-1a of the marker, which is no id).
pub fn marker_hash() -> u64 {
    id_hash(&super::place::MARKER)
}

/// The hash an entry holds of `id` (NUL-padded or not): FNV-1a, never zero (zero is an
/// entry never used).
pub fn id_hash(id: &[u8]) -> u64 {
    match crate::fnv::fnv1a(id.iter().copied().take_while(|&b| b != 0)) {
        0 => 1,
        h => h,
    }
}

/// One record: an id and a name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record(pub [u8; RECORD]);

impl Default for Record {
    fn default() -> Self {
        Self([0; RECORD])
    }
}

impl Record {
    fn of(e: &Entry) -> Self {
        let mut r = [0; RECORD];
        r[..SUBSCRIBER_ID_BYTES].copy_from_slice(&e.id);
        r[SUBSCRIBER_ID_BYTES..].copy_from_slice(&e.name);
        Self(r)
    }

    fn id(&self) -> [u8; SUBSCRIBER_ID_BYTES] {
        self.0[..SUBSCRIBER_ID_BYTES].try_into().unwrap_or_default()
    }

    fn name(&self) -> [u8; SUBSCRIBER_NAME_BYTES] {
        self.0[SUBSCRIBER_ID_BYTES..].try_into().unwrap_or_default()
    }
}

/// Entry `index` as the kernel holds it and its record.
pub fn split(index: u32, e: &Entry) -> (Subscriber, Record) {
    let id_hash = match (index, e.id == [0; SUBSCRIBER_ID_BYTES]) {
        (_, true) => 0,
        (0, false) if e.id == super::place::MARKER => marker_hash(),
        (_, false) => id_hash(&e.id),
    };
    let s = Subscriber {
        cell: e.cell,
        excess: e.excess,
        plan: e.plan,
        in_use: e.in_use,
        outcomes: e.outcomes,
        yellow_packets: e.yellow_packets,
        yellow_bytes: e.yellow_bytes,
        id_hash,
    };
    (s, Record::of(e))
}

/// Why an entry and its record disagree.
#[derive(Debug, PartialEq, Eq)]
pub struct Disagree {
    pub index: u32,
}

/// Entry `index` (`s`, as the kernel holds it) with its record `r`. An entry not in use
/// whose record is not its id's (a change under way wrote the record of the subscriber it
/// puts there first) keeps an id no subscriber has: a tombstone still. An entry in use
/// whose record is not its id's is an error.
pub fn join(index: u32, s: &Subscriber, r: &Record) -> Result<Entry, Disagree> {
    let mut e = Entry {
        cell: s.cell,
        excess: s.excess,
        plan: s.plan,
        in_use: s.in_use,
        outcomes: s.outcomes,
        yellow_packets: s.yellow_packets,
        yellow_bytes: s.yellow_bytes,
        id: [0; SUBSCRIBER_ID_BYTES],
        name: [0; SUBSCRIBER_NAME_BYTES],
    };
    match s.id_hash {
        0 => {}
        h if index == 0 => {
            if h == marker_hash() {
                e.id = super::place::MARKER;
            }
        }
        h if id_hash(&r.id()) == h && r.id() != [0; SUBSCRIBER_ID_BYTES] => {
            (e.id, e.name) = (r.id(), r.name());
        }
        _ if s.in_use != 0 => return Err(Disagree { index }),
        _ => e.id[0] = 1,
    }
    Ok(e)
}

/// Where the records of attachment `at` are: beside its routes' file.
pub fn path_of(at: &Attachment) -> PathBuf {
    let mut p = super::known::path_of(at).into_os_string();
    p.push(".ids");
    PathBuf::from(p)
}

/// Makes the records of `at`'s subscribers' table anew (its pins just made: none in use),
/// if it has room for any; removes any left otherwise.
pub fn make(at: &Attachment) -> Result<(), RecordsError> {
    let pin = at.dir().join(shaper_common::maps::PIN_SUBSCRIBERS);
    let info = crate::bpf::map_info(&pin).map_err(|source| RecordsError::Io {
        what: "read the table of",
        path: path_of(at).display().to_string(),
        source,
    })?;
    if info.max_entries <= 1 {
        forget(at);
        return Ok(());
    }
    Records::create(&path_of(at), info.id).map(drop)
}

/// Removes the records of `at` (its attachment is gone), if there are any.
pub fn forget(at: &Attachment) {
    let _ = fs::remove_file(path_of(at));
}

#[derive(Debug, thiserror::Error)]
pub enum RecordsError {
    #[error(
        "the subscribers' ids and names ({path}) are missing: this attachment's subscribers cannot be named (detach and attach it again to start with none)"
    )]
    Missing { path: String },
    #[error(
        "the subscribers' ids and names ({path}) are not this attachment's: {what} (detach and attach it again to start with none)"
    )]
    Other { path: String, what: String },
    #[error("cannot {what} the subscribers' ids and names ({path}): {source}")]
    Io {
        what: &'static str,
        path: String,
        source: io::Error,
    },
}

/// An attachment's records, open.
#[derive(Debug)]
pub struct Records {
    file: File,
    path: PathBuf,
}

impl Records {
    fn io(&self, what: &'static str) -> impl FnOnce(io::Error) -> RecordsError + '_ {
        move |source| RecordsError::Io {
            what,
            path: self.path.display().to_string(),
            source,
        }
    }

    fn header(map_id: u32) -> Record {
        let mut r = Record::default();
        r.0[..8].copy_from_slice(MAGIC);
        r.0[8..12].copy_from_slice(&map_id.to_le_bytes());
        r
    }

    /// Makes the records of the subscribers' table `map_id` at `path` anew (none yet):
    /// root-only, in a root-only directory.
    pub fn create(path: &Path, map_id: u32) -> Result<Self, RecordsError> {
        let io = |what| {
            move |source| RecordsError::Io {
                what,
                path: path.display().to_string(),
                source,
            }
        };
        crate::owned::make_dir_of(path).map_err(io("make the directory of"))?;
        let file = crate::owned::create_private(path).map_err(io("make"))?;
        file.write_all_at(&Self::header(map_id).0, 0)
            .map_err(io("write"))?;
        drop(file);
        Self::open(path, map_id)
    }

    /// The records at `path` of the subscribers' table `map_id`.
    pub fn open(path: &Path, map_id: u32) -> Result<Self, RecordsError> {
        let name = || path.display().to_string();
        let file = match crate::owned::open_private_existing(path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(RecordsError::Missing { path: name() });
            }
            Err(source) => {
                return Err(RecordsError::Io {
                    what: "open",
                    path: name(),
                    source,
                });
            }
        };
        let records = Self {
            file,
            path: path.to_owned(),
        };
        let header = records.read_run(0, 1)?[0];
        if header != Self::header(map_id) {
            let what = match header.0[..8] == *MAGIC {
                true => "they describe another subscribers' table".to_owned(),
                false => "their header is not shaper's".to_owned(),
            };
            return Err(RecordsError::Other { path: name(), what });
        }
        Ok(records)
    }

    /// Records nowhere but in this process (a loaded object's table: `test_run`,
    /// benchmarks): an unnamed file.
    pub fn anonymous() -> Result<Self, RecordsError> {
        let dir = std::env::temp_dir();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_TMPFILE)
            .mode(0o600)
            .open(&dir)
            .map_err(|source| RecordsError::Io {
                what: "make",
                path: dir.display().to_string(),
                source,
            })?;
        Ok(Self {
            file,
            path: dir.join("(unnamed)"),
        })
    }

    /// The same records, opened again (the same file).
    pub fn try_clone(&self) -> Result<Self, RecordsError> {
        Ok(Self {
            file: self.file.try_clone().map_err(self.io("open again"))?,
            path: self.path.clone(),
        })
    }

    /// Where they are.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records `start..start + n` (past the file's end: none, zero).
    pub fn read_run(&self, start: u32, n: u32) -> Result<Vec<Record>, RecordsError> {
        let mut buf = vec![0u8; n as usize * RECORD];
        let mut at = 0;
        while at < buf.len() {
            let got = self
                .file
                .read_at(&mut buf[at..], (start as usize * RECORD + at) as u64)
                .map_err(self.io("read"))?;
            if got == 0 {
                break;
            }
            at += got;
        }
        Ok(buf
            .chunks_exact(RECORD)
            .map(|c| Record(c.try_into().unwrap_or([0; RECORD])))
            .collect())
    }

    /// The first record from 1 whose id is `id` (NUL-padded), if any: the file read in
    /// runs of records into one buffer, not all of it held at once.
    pub fn find_id(&self, id: &[u8; SUBSCRIBER_ID_BYTES]) -> Result<Option<u32>, RecordsError> {
        const RUN: usize = 65_536;
        let mut buf = vec![0u8; RUN * RECORD];
        let mut start = 1usize;
        loop {
            let got = self.read_into(&mut buf, start)?;
            let found = buf[..got - got % RECORD]
                .chunks_exact(RECORD)
                .position(|r| r[..SUBSCRIBER_ID_BYTES] == id[..]);
            if let Some(k) = found {
                return Ok(Some((start + k) as u32));
            }
            if got < buf.len() {
                return Ok(None);
            }
            start += RUN;
        }
    }

    /// Reads the records from `start` into `buf` as far as it goes: the bytes read (fewer
    /// only where the file ends).
    fn read_into(&self, buf: &mut [u8], start: usize) -> Result<usize, RecordsError> {
        let mut at = 0;
        while at < buf.len() {
            let got = self
                .file
                .read_at(&mut buf[at..], (start * RECORD + at) as u64)
                .map_err(self.io("read"))?;
            if got == 0 {
                break;
            }
            at += got;
        }
        Ok(at)
    }

    /// Writes record `index`.
    pub fn write(&self, index: u32, r: &Record) -> Result<(), RecordsError> {
        self.file
            .write_all_at(&r.0, index as u64 * RECORD as u64)
            .map_err(self.io("write"))
    }

    /// Writes many records (sorted here): each run of consecutive indices in one write;
    /// where they are many of `len` records, the file read and written whole.
    pub fn write_many(&self, records: &mut [(u32, Record)], len: u32) -> Result<(), RecordsError> {
        records.sort_unstable_by_key(|(i, _)| *i);
        if records.len() as u64 * 8 > u64::from(len) {
            let mut all = self.read_run(0, len)?;
            for (i, r) in records.iter() {
                if let Some(slot) = all.get_mut(*i as usize) {
                    *slot = *r;
                }
            }
            let bytes: Vec<u8> = all.iter().flat_map(|r| r.0).collect();
            return self.file.write_all_at(&bytes, 0).map_err(self.io("write"));
        }
        let mut k = 0;
        while k < records.len() {
            let start = records[k].0;
            let mut bytes = Vec::new();
            while k < records.len() && records[k].0 == start + (bytes.len() / RECORD) as u32 {
                bytes.extend_from_slice(&records[k].1.0);
                k += 1;
            }
            self.file
                .write_all_at(&bytes, start as u64 * RECORD as u64)
                .map_err(self.io("write"))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: &str, name: &str) -> Entry {
        let mut e = Entry {
            in_use: 2,
            plan: 7,
            ..Entry::default()
        };
        e.id[..id.len()].copy_from_slice(id.as_bytes());
        e.name[..name.len()].copy_from_slice(name.as_bytes());
        e.cell.tat = 12345;
        e.outcomes.passed_bytes = 99;
        e
    }

    #[test]
    fn an_entry_split_and_joined_is_itself() {
        for (i, e) in [
            (5, entry("sub-1", "Alice")),
            (0, Entry::default()),
            (
                0,
                Entry {
                    id: super::super::place::MARKER,
                    ..Entry::default()
                },
            ),
            (3, Entry::default()),
            // A tombstone.
            (
                3,
                Entry {
                    in_use: 0,
                    ..entry("gone", "")
                },
            ),
        ] {
            let (s, r) = split(i, &e);
            assert_eq!(join(i, &s, &r), Ok(e), "{i} {e:?}");
        }
    }

    #[test]
    fn an_entry_in_use_whose_record_is_not_its_ids_is_refused() {
        let (s, _) = split(5, &entry("sub-1", "Alice"));
        let (_, other) = split(5, &entry("sub-2", "Alice"));
        assert_eq!(join(5, &s, &other), Err(Disagree { index: 5 }));
        assert_eq!(join(5, &s, &Record::default()), Err(Disagree { index: 5 }));
        // Not in use: a tombstone still, of no id.
        let t = Subscriber { in_use: 0, ..s };
        let e = join(5, &t, &other).unwrap();
        assert_eq!((e.in_use, e.id[0]), (0, 1));
    }

    #[test]
    fn records_come_back_from_the_file_and_only_for_their_table() {
        let dir = std::env::temp_dir().join(format!("shaper-records-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let path = dir.join("r.ids");
        let records = Records::create(&path, 42).unwrap();
        let (_, a) = split(1, &entry("a", "A"));
        let (_, b) = split(1, &entry("b", ""));
        records.write(3, &a).unwrap();
        let mut many = vec![(9, b), (7, a), (8, b)];
        records.write_many(&mut many, 100).unwrap();
        let got = Records::open(&path, 42).unwrap().read_run(2, 9).unwrap();
        let want = [
            Record::default(),
            a,
            Record::default(),
            Record::default(),
            Record::default(),
            a,
            b,
            b,
            Record::default(),
        ];
        assert_eq!(got, want);
        // Whole: many of few.
        let mut many = vec![(1, b), (2, b)];
        records.write_many(&mut many, 4).unwrap();
        assert_eq!(records.read_run(1, 3).unwrap(), [b, b, a]);
        // Found by id from record 1 on (the header is none), the first of two.
        let id = |r: &Record| r.id();
        assert_eq!(records.find_id(&id(&a)).unwrap(), Some(3));
        assert_eq!(records.find_id(&id(&b)).unwrap(), Some(1));
        assert_eq!(records.find_id(&[7; SUBSCRIBER_ID_BYTES]).unwrap(), None);
        let mut header = [0; SUBSCRIBER_ID_BYTES];
        header.copy_from_slice(&Records::header(42).0[..SUBSCRIBER_ID_BYTES]);
        assert_eq!(records.find_id(&header).unwrap(), None);
        // Past a run of records.
        records.write(70_000, &b).unwrap();
        let (_, c) = split(1, &entry("c", ""));
        records.write(70_001, &c).unwrap();
        assert_eq!(records.find_id(&id(&c)).unwrap(), Some(70_001));
        assert!(matches!(
            Records::open(&path, 43),
            Err(RecordsError::Other { .. })
        ));
        fs::remove_file(&path).unwrap();
        assert!(matches!(
            Records::open(&path, 42),
            Err(RecordsError::Missing { .. })
        ));
        fs::remove_dir_all(&dir).unwrap();
    }
}

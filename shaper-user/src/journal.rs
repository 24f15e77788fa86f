//! The journal of a change under way, so that a change killed half way is rolled back
//! whole by the next command rather than left half made.
//!
//! Before `attach`, `policy set|del` or `apply` writes anything, it records under the host
//! lock, in [`JOURNAL_PATH`], how to put back every attachment it may touch: the settings
//! and every policy slot as they are ([`Undo::Restore`]), or only the slots it may write
//! where it knows them (one subscriber's plans: [`Undo::Slots`]); where a deleted interface left
//! this build's pins, the same and that whatever links the program is to be taken off,
//! the maps kept ([`Undo::Unlink`]); where nothing is attached, that it is to be detached
//! ([`Undo::Detach`]). The file is replaced whole (written
//! beside it, then renamed), and removed once the change is complete. A failed change
//! runs its journal before it returns; a killed one leaves the journal, and the next
//! shaper command (any command that needs privileges) runs it before anything else, under
//! the lock, and says so. (Commands that only read take the lock only when a journal is
//! there: then a change is under way, and they wait for it, or it was interrupted.) Undoing needs the pins only, not the interface or its namespace.
//!
//! An upgrade in place has its own staging and recovery (`crate::upgrade`) and keeps the
//! settings as they were, so the journal records nothing for it.

use std::{fs, io};

use serde::{Deserialize, Serialize};
use shaper_common::maps::{Config, PIN_SOURCES, Policy};

use crate::{
    bpf,
    detach::{self, DetachError},
    maps::Pinned,
    pins::{Attachment, Direction},
    policy::{PolicyError, PolicyTable},
    subscriber::{Before, Entry as SubscriberEntry, SubscriberTable},
};

/// Where the journal of the change under way lives: beside the lock, on tmpfs (like the
/// pins, it does not outlive a reboot).
pub const JOURNAL_PATH: &str = "/run/shaper.journal";

#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    // The causes are in the messages, so that a change's own error can carry this one
    // as its message on one line.
    #[error("cannot write the journal {JOURNAL_PATH}: {0}")]
    Write(io::Error),
    #[error("cannot read the journal {JOURNAL_PATH} (remove it to go on): {0}")]
    Read(Box<dyn std::error::Error + Send + Sync>),
    #[error("cannot read what to put back on {label}: {error}")]
    Snapshot {
        label: String,
        error: Box<PolicyError>,
    },
    #[error("cannot tell whether {label} is attached: {error}")]
    Liveness { label: String, error: io::Error },
}

/// How to put one attachment back as it was before the change.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Undo {
    /// Nothing (or only the pins of a deleted interface) was there: detach.
    Detach {
        iface: String,
        netns: Option<String>,
        /// Absent from the journal of a shaper before directions: ingress.
        #[serde(default)]
        direction: Direction,
    },
    /// Pins that held nothing on the interface (it was deleted, or made again, or its
    /// filter removed), with these settings and policy slots: take off whatever links
    /// the program now, keep every map (the cells in them), and put the entries back.
    Unlink {
        iface: String,
        netns: Option<String>,
        direction: Direction,
        /// The id of the sources map pinned then: pins made anew since (the change found
        /// these of no use) held nothing of before, and are detached instead.
        sources_map: u32,
        config: Vec<u8>,
        slots: Slots,
    },
    /// Attached with these settings and policy slots (the maps' entries, as bytes).
    Restore {
        iface: String,
        netns: Option<String>,
        #[serde(default)]
        direction: Direction,
        config: Vec<u8>,
        slots: Vec<(u32, Vec<u8>)>,
    },
    /// Attached, and the change writes only these policy slots and no policy's route (one
    /// subscriber's plans): the settings and these slots' entries, every other slot and
    /// route left as it is.
    Slots {
        iface: String,
        netns: Option<String>,
        direction: Direction,
        config: Vec<u8>,
        slots: Slots,
    },
    /// One subscriber's entry and the routes a subscriber change touches, as they were
    /// (`crate::subscriber::Before`): run before the attachment's `Restore`.
    Subscriber {
        iface: String,
        netns: Option<String>,
        #[serde(default)]
        direction: Direction,
        index: u32,
        /// Its bytes; empty for a free entry (the subscriber was added).
        entry: Vec<u8>,
        routes: Vec<(String, Option<u32>)>,
    },
}

fn bytes<T: aya::Pod>(v: &T) -> Vec<u8> {
    // SAFETY: a Pod value is plain bytes.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }.to_vec()
}

/// The policy slots of an attachment a change knows under the lock, with their entries.
pub enum Known {
    /// Every slot in use (the daemon's index; a read of the array): the others are free.
    Every(Vec<(u32, Policy)>),
    /// Only those it may write, in use or not ([`Undo::Slots`]).
    Only(Vec<(u32, Policy)>),
}

fn value<T: aya::Pod>(b: &[u8]) -> Option<T> {
    // SAFETY: any bytes of the right length are a Pod value.
    (b.len() == size_of::<T>()).then(|| unsafe { b.as_ptr().cast::<T>().read_unaligned() })
}

impl Undo {
    /// What puts `at` back as it is now, read through its pins as the change opened them
    /// (`live`: its link holds the program; `pinned`: its pins, `None` where they are not
    /// this shaper's layout: an upgrade is due, which keeps the settings and recovers
    /// itself, so nothing is to be put back; `known`: its policy slots as the caller
    /// knows them under this lock, otherwise read). The caller holds the lock.
    pub fn of(
        at: &Attachment,
        live: bool,
        pinned: Option<&Pinned>,
        known: Option<Known>,
    ) -> Result<Option<Self>, JournalError> {
        let (iface, netns, direction) = (at.iface.clone(), at.netns.clone(), at.direction);
        if !at.exists() {
            return Ok(Some(Self::Detach {
                iface,
                netns,
                direction,
            }));
        }
        if !live {
            // This build's pins hold cells worth keeping: a failed `attach` over them
            // leaves them as it found them, for the next to link again over. Others
            // (an older layout's, or unreadable) are only ever replaced: detach.
            let Ok(pinned) = Pinned::open(at) else {
                return Ok(Some(Self::Detach {
                    iface,
                    netns,
                    direction,
                }));
            };
            let Some(sources) = pinned.info(PIN_SOURCES) else {
                return Ok(Some(Self::Detach {
                    iface,
                    netns,
                    direction,
                }));
            };
            let (config, slots) = snapshot(at, &pinned, None)?.1;
            return Ok(Some(Self::Unlink {
                iface,
                netns,
                direction,
                sources_map: sources.id,
                config,
                slots,
            }));
        }
        let Some(pinned) = pinned else {
            return Ok(None);
        };
        let (only, (config, slots)) = snapshot(at, pinned, known)?;
        Ok(Some(match only {
            true => Self::Slots {
                iface,
                netns,
                direction,
                config,
                slots,
            },
            false => Self::Restore {
                iface,
                netns,
                direction,
                config,
                slots,
            },
        }))
    }

    pub fn attachment(&self) -> Attachment {
        match self {
            Self::Detach {
                iface,
                netns,
                direction,
            }
            | Self::Unlink {
                iface,
                netns,
                direction,
                ..
            }
            | Self::Restore {
                iface,
                netns,
                direction,
                ..
            }
            | Self::Slots {
                iface,
                netns,
                direction,
                ..
            }
            | Self::Subscriber {
                iface,
                netns,
                direction,
                ..
            } => Attachment::toward(iface, netns.as_deref(), *direction),
        }
    }

    /// Puts the attachment back. `opened`: the subscriber table the last step opened, kept
    /// for the next steps of the same attachment (a batch of a million subscribers opens
    /// its pins once, not once a subscriber).
    fn run(&self, opened: &mut Option<(Attachment, SubscriberTable)>) -> Result<(), Failure> {
        let at = self.attachment();
        match self {
            Self::Detach { .. } => detach_any(&at),
            Self::Unlink {
                sources_map,
                config,
                slots,
                ..
            } => {
                let now = bpf::map_info(&at.dir().join(PIN_SOURCES)).map(|m| m.id);
                if now.ok() != Some(*sources_map) {
                    return detach_any(&at);
                }
                detach::unlink(&at)?;
                restore(&at, config, slots, false)
            }
            Self::Restore { config, slots, .. } => restore(&at, config, slots, false),
            Self::Slots { config, slots, .. } => restore(&at, config, slots, true),
            Self::Subscriber {
                index,
                entry,
                routes,
                ..
            } => {
                let before = Before {
                    by_lookup: false,
                    index: *index,
                    entry: match entry.len() {
                        0 => SubscriberEntry::default(),
                        _ => value(entry).ok_or("a subscriber entry of another size")?,
                    },
                    routes: routes
                        .iter()
                        .map(|(p, v)| p.parse().map(|p| (p, *v)))
                        .collect::<Result<_, _>>()?,
                };
                let mut table = match opened.take() {
                    Some((was, table)) if was == at => table,
                    _ => SubscriberTable::of(&Pinned::open(&at)?)?,
                };
                let result = table.restore(&before).map_err(Into::into);
                *opened = Some((at, table));
                result
            }
        }
    }

    /// What puts back one subscriber of `at` as `before` read it.
    pub fn subscriber(at: &Attachment, before: &Before) -> Self {
        Self::Subscriber {
            iface: at.iface.clone(),
            netns: at.netns.clone(),
            direction: at.direction,
            index: before.index,
            // A never-used entry (a subscriber added) as none: a million added journal
            // small. A removed subscriber's tombstone is kept as it is (`place`).
            entry: match before.entry == SubscriberEntry::default() {
                true => Vec::new(),
                false => bytes(&before.entry),
            },
            routes: before
                .routes
                .iter()
                .map(|(p, v)| (p.to_string(), *v))
                .collect(),
        }
    }
}

/// Detaches `at`, if anything is there.
fn detach_any(at: &Attachment) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    match detach::detach(at) {
        Ok(()) | Err(DetachError::NotAttached(_)) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Policy slots as journaled: each slot's number and its entry's bytes.
type Slots = Vec<(u32, Vec<u8>)>;

/// The settings and policy slots of `at`, as bytes, read through its pins (the slots
/// `known` taken as they are), and whether they are only some of the slots
/// ([`Known::Only`]).
fn snapshot(
    at: &Attachment,
    pinned: &Pinned,
    known: Option<Known>,
) -> Result<(bool, (Vec<u8>, Slots)), JournalError> {
    let read = || -> Result<_, PolicyError> {
        match known {
            Some(Known::Every(slots)) => Ok((false, pinned.config()?, slots)),
            Some(Known::Only(slots)) => Ok((true, pinned.config()?, slots)),
            None => {
                let table = PolicyTable::of(pinned)?;
                Ok((false, table.config()?, table.slots()?))
            }
        }
    };
    let (only, config, slots) = read().map_err(|error| JournalError::Snapshot {
        label: at.label(),
        error: Box::new(error),
    })?;
    let slots = slots.iter().map(|(s, p)| (*s, bytes(p))).collect();
    Ok((only, (bytes(&config), slots)))
}

/// Writes the settings and policy slots [`snapshot`] read back into `at`'s pins: `only`
/// those slots, or exactly those (the others freed, the routes made theirs).
fn restore(
    at: &Attachment,
    config: &[u8],
    slots: &[(u32, Vec<u8>)],
    only: bool,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let config: Config = value(config).ok_or("a settings entry of another size")?;
    let slots = slots
        .iter()
        .map(|(s, b)| value::<Policy>(b).map(|p| (*s, p)))
        .collect::<Option<Vec<_>>>()
        .ok_or("a policy entry of another size")?;
    let mut table = PolicyTable::open(at)?;
    match only {
        true => table.restore_slots(&config, &slots)?,
        false => table.restore(&config, &slots)?,
    }
    Ok(())
}

#[derive(Debug, Serialize, Deserialize)]
struct Record {
    /// `policy set`, `apply`, ...: for the operator.
    command: String,
    undo: Vec<Undo>,
}

/// A change under way, journaled. Dropped without [`Change::commit`] (an error returned
/// half way), it rolls back.
pub struct Change {
    record: Option<Record>,
}

/// Journals `command` about to change the attachments `undo` puts back. The caller
/// holds the lock and has recovered what a killed change left ([`crate::change::begin`]).
pub fn begin(command: &str, undo: Vec<Undo>) -> Result<Change, JournalError> {
    let record = Record {
        command: command.to_owned(),
        undo,
    };
    write(&record)?;
    crate::crash::point("journal-written");
    Ok(Change {
        record: Some(record),
    })
}

/// Writes the journal beside it, made anew root's with mode 0600 (no other user reads
/// what is to be put back), then renames it into place.
fn write(record: &Record) -> Result<(), JournalError> {
    use io::Write as _;
    let text = serde_json::to_vec(record).map_err(|e| JournalError::Write(e.into()))?;
    let tmp = format!("{JOURNAL_PATH}.tmp");
    crate::owned::create_private(std::path::Path::new(&tmp))
        .and_then(|mut file| file.write_all(&text))
        .map_err(JournalError::Write)?;
    fs::rename(&tmp, JOURNAL_PATH).map_err(JournalError::Write)
}

impl Change {
    /// The change is complete: forget how to undo it.
    pub fn commit(mut self) -> Result<(), JournalError> {
        self.record = None;
        crate::crash::point("journal-commit");
        remove()
    }
}

impl Drop for Change {
    fn drop(&mut self) {
        if let Some(record) = self.record.take() {
            // Best effort: the error that caused it is the one worth reporting; what
            // cannot be put back now is left in the journal for the next command.
            if roll_back(&record).is_empty() {
                let _ = remove();
            }
        }
    }
}

fn remove() -> Result<(), JournalError> {
    match fs::remove_file(JOURNAL_PATH) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(JournalError::Write(e)),
        _ => Ok(()),
    }
}

type Failure = Box<dyn std::error::Error + Send + Sync>;

/// Runs every undo step, newest first; returns the failures, by attachment.
fn roll_back(record: &Record) -> Vec<String> {
    let mut failed = Vec::new();
    let mut opened = None;
    for undo in record.undo.iter().rev() {
        if !matches!(undo, Undo::Subscriber { .. }) {
            // Other steps may make the pins anew: what was opened is stale.
            opened = None;
        }
        if let Err(e) = undo.run(&mut opened) {
            failed.push(format!("{}: {e}", undo.attachment().label()));
        }
    }
    failed
}

/// Whether a journal is there: a change under way, or one killed half way.
pub fn pending() -> bool {
    std::path::Path::new(JOURNAL_PATH).exists()
}

/// Rolls back a change that was killed half way, if the journal holds one, and says what
/// was put back (one line). The caller holds the lock.
pub fn recover() -> Result<Option<String>, JournalError> {
    // Never through a symlink; one another user owns is refused, one an earlier build
    // left readable to others is made 0600 first.
    let read = |mut file: fs::File| {
        let mut text = Vec::new();
        io::Read::read_to_end(&mut file, &mut text).map(|_| text)
    };
    let opened = crate::owned::open_private_to_read(std::path::Path::new(JOURNAL_PATH));
    let text = match opened.and_then(read) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(JournalError::Read(e.into())),
    };
    let record: Record = serde_json::from_slice(&text).map_err(|e| JournalError::Read(e.into()))?;
    let failed = roll_back(&record);
    remove()?;
    let labels: Vec<String> = record.undo.iter().map(|u| u.attachment().label()).collect();
    let mut line = format!(
        "`{}` was interrupted; rolled back: {} as before it",
        record.command,
        labels.join(", ")
    );
    if !failed.is_empty() {
        line += &format!(" (could not put back {})", failed.join("; "));
    }
    Ok(Some(line))
}

//! `shaper apply`: bring every interface a configuration file names to what it says, as
//! one change ([`crate::change`]). Everything is checked first (the file, then each
//! interface and its MTU); then the interfaces are changed one by one, journaled, and if
//! one fails (or the command is killed), every interface is put back: a new attachment is
//! detached, an updated one gets its previous settings and policies again, an upgraded
//! one stays upgraded (with the settings it had).

use ipnet::IpNet;
use shaper_common::maps::Config;

use crate::{
    attach::{self, AttachError, Attached},
    change::{self, ChangeError},
    journal::{self, Undo},
    maps::Pinned,
    pins::Attachment,
    policy::{PolicySet, PolicySpec, PolicyTable},
    request::{AttachRequest, RequestError, SubscriberRequest},
    rows::{self, CsvFile, Saved},
    subscriber::{Batch, SubscriberTable, Summary},
    system::{self, SystemError},
};

#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// `field` names the setting (`policy 203.0.113.0/24 burst`) when one is at fault.
    // `error` rather than `source`: the message carries it, and a source would be
    // printed again by every `{:#}` of the chain.
    #[error("interface {iface}: {}{error}", field.as_ref().map(|f| format!("{f}: ")).unwrap_or_default())]
    System {
        iface: String,
        field: Option<String>,
        error: SystemError,
    },
    /// A setting the kernel side refused is named as in the file:
    /// `interface[0].max_sources: ...`.
    #[error("interface {iface}: {} (nothing was changed)", attach_message(*.index, .error))]
    Attach {
        index: usize,
        iface: String,
        error: Box<AttachError>,
    },
    #[error("{}{error}", if iface.is_empty() { String::new() } else { format!("interface {iface}: ") })]
    Journal {
        iface: String,
        error: Box<journal::JournalError>,
    },
    /// The lock, or what a killed change or upgrade left, or the pins.
    #[error(transparent)]
    Change(Box<ChangeError>),
    /// The file's subscribers against those in force (an overlap with one that `subscriber
    /// set` made, no room): nothing was changed.
    #[error("interface {iface}: subscribers: {error} (nothing was changed)")]
    Subscribers {
        iface: String,
        error: Box<ChangeError>,
    },
    /// An `[interface.libreqos]` file not read
    /// ([`crate::config_file::parse_deferring`]) whose rows cannot be taken from the last
    /// apply's ([`crate::rows`]): read the file whole ([`crate::config_file::parse`]) and
    /// apply again. Nothing was changed.
    #[error("interface {0}: its LibreQoS file is to be read whole")]
    Reread(String),
}

impl From<ChangeError> for ApplyError {
    fn from(e: ChangeError) -> Self {
        match e {
            ChangeError::Journal(error) => Self::Journal {
                iface: String::new(),
                error: Box::new(error),
            },
            e => Self::Change(Box::new(e)),
        }
    }
}

/// The attach error with its whole chain, a setting named as in the file.
fn attach_message(index: usize, e: &AttachError) -> String {
    if let AttachError::Request(RequestError::Setting { setting, problem }) = e {
        return format!("interface[{index}].{setting}: {problem}");
    }
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        text += &format!(": {c}");
        cause = c.source();
    }
    text
}

/// What was done to one interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applied {
    pub iface: String,
    pub outcome: Attached,
    pub policies: usize,
    /// False when an existing attachment already was as the file says.
    pub changed: bool,
    /// What was done to its subscribers; `None` where the file gives none.
    pub subscribers: Option<Summary>,
}

/// Checks what needs the interfaces themselves: that they exist, and that every burst
/// holds one full-size frame.
pub fn check_interfaces(desired: &[AttachRequest]) -> Result<(), ApplyError> {
    for d in desired {
        let iface = &d.at.iface;
        let sys = |field: Option<String>| {
            move |error| ApplyError::System {
                iface: iface.clone(),
                field,
                error,
            }
        };
        system::ifindex(iface).map_err(sys(None))?;
        let mut bursts = vec![("burst".to_owned(), d.rate.burst_bytes())];
        for p in d.policies.iter().flat_map(PolicySet::specs) {
            for (what, bytes) in [
                ("burst", p.limits.burst_bytes),
                ("aggregate_burst", p.limits.aggregate_burst_bytes),
            ] {
                if bytes != 0 {
                    bursts.push((format!("policy {} {what}", p.prefix), bytes));
                }
            }
        }
        // Each subscriber's bursts: the smallest of each kind stands for all.
        let subs = d.subscribers.iter().flat_map(|s| &s.specs);
        for (what, least) in [
            (
                "burst",
                subs.clone().map(|s| s.plan.aggregate_burst_bytes).min(),
            ),
            (
                "per_address_burst",
                subs.clone().map(|s| s.plan.burst_bytes).min(),
            ),
            (
                "excess_burst",
                subs.map(|s| s.plan.meter2.excess_burst_bytes)
                    .filter(|&b| b != 0)
                    .min(),
            ),
        ] {
            if let Some(bytes) = least {
                bursts.push((format!("subscriber {what}"), bytes));
            }
        }
        for (field, burst) in bursts {
            system::check_burst_fits(iface, burst).map_err(sys(Some(field)))?;
        }
    }
    Ok(())
}

/// Applies `desired` (requests as [`crate::config_file::parse`] makes them) in the
/// current network namespace (named `netns` in pin paths), as one change (which takes the
/// lock). The caller has checked privileges and bpffs. `progress` is told how many of how
/// many subscribers are written (an interface at a time).
pub fn apply(
    desired: &[AttachRequest],
    netns: Option<&str>,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Vec<Applied>, ApplyError> {
    let lock = system::lock().map_err(ChangeError::from)?;
    apply_holding(desired, netns, lock, progress)
}

/// [`apply`] with the lock taken already ([`change::begin_holding`]).
///
/// The subscribers of an attachment live before the change are checked against its table
/// ([`SubscriberTable::batch`]: only those that differ are written, and what they touch
/// journaled) before anything is written; those of an attachment made (or upgraded) by
/// the change are checked and written after its `attach`, the whole change rolled back
/// on an error.
///
/// An `[interface.libreqos]` file not read ([`crate::config_file::parse_deferring`]) is
/// read as far as it changed since the last apply ([`rows::reapply`]), or the apply is
/// refused with [`ApplyError::Reread`] before anything is written. A file read whole
/// leaves its rows for the next apply, once committed.
pub fn apply_holding(
    desired: &[AttachRequest],
    netns: Option<&str>,
    lock: system::Lock,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Vec<Applied>, ApplyError> {
    check_interfaces(desired)?;
    let ats: Vec<Attachment> = desired
        .iter()
        .map(|d| Attachment {
            netns: netns.map(str::to_owned),
            ..d.at.clone()
        })
        .collect();
    // The rows each file not read left, if no change since may have touched its
    // interface (the change log read before this change moves it on).
    let mut trusted = Vec::new();
    for (d, at) in desired.iter().zip(&ats) {
        trusted.push(match deferred(d) {
            Some(_) => Some(rows::trusted(&lock, at).ok_or_else(|| reread(d))?),
            None => None,
        });
    }
    let prepared = change::begin_holding("apply", &ats, lock)?;
    let mut batches = Vec::new();
    let mut undo = Vec::new();
    let mut saves = Vec::new();
    for ((d, at), trusted) in desired.iter().zip(&ats).zip(trusted) {
        let mut saved = None;
        let batch = match (&d.subscribers, prepared.pinned(at), trusted) {
            (Some(s), Some(pinned), Some(trusted)) => {
                let csv = s.csv.as_ref().ok_or_else(|| reread(d))?;
                let again = rows::reapply(d, csv, trusted, pinned).ok_or_else(|| reread(d))?;
                saved = Some(again.saved);
                Some(again.batch)
            }
            (_, _, Some(_)) => return Err(reread(d)),
            (Some(s), Some(pinned), None) => {
                let policies = d.policies.as_ref().map(policy_prefixes);
                let batch = subscriber_batch(pinned, s, policies.as_deref(), false);
                Some(batch.map_err(|e| subscriber_err(d, e))?)
            }
            _ => None,
        };
        saves.push(saved);
        if let Some(b) = &batch {
            undo.extend(b.befores().map(|before| Undo::subscriber(at, before)));
        }
        batches.push(batch);
    }
    let change = prepared.journal_with(undo)?;
    let mut applied = Vec::new();
    let mut to_save = Vec::new();
    for (index, (((d, at), batch), saved)) in
        desired.iter().zip(&ats).zip(batches).zip(saves).enumerate()
    {
        // Read through the pins the change opened (an error here drops `change`, which
        // puts back what was changed).
        let pinned = change.pinned(at);
        let previous = if change.live(at) {
            Some(snapshot(at, pinned).map_err(|e| attach_err(index, d, e))?)
        } else {
            None
        };
        let req = d.for_attach(at.clone());
        let outcome = attach::attach(&req, pinned).map_err(|e| attach_err(index, d, e))?;
        let changed = match &previous {
            Some(before) => !snapshot(at, pinned).is_ok_and(|after| same(before, &after)),
            None => true,
        };
        let made = matches!(outcome, Attached::New { .. });
        let (subscribers, saved) =
            write_subscribers(d, at, (pinned, made), batch, saved, progress)?;
        if let Some(saved) = saved {
            to_save.push((at, saved));
        }
        applied.push(Applied {
            iface: d.at.label(),
            outcome,
            policies: d.policies.as_ref().map_or(0, PolicySet::len),
            changed: changed || subscribers.is_some_and(|s| s.added + s.changed + s.removed > 0),
            subscribers,
        });
        crate::crash::point("apply-interface");
    }
    let lock = change.commit_holding()?;
    // Saved under the lock, with this change's count: a change after it logs its own.
    let generation = lock.generation().ok();
    let fast = saves_fast(desired);
    for (at, mut saved) in to_save {
        match generation {
            Some(g) => {
                saved.generation = g;
                if saved.save(at).is_err() {
                    rows::forget(at);
                }
            }
            None => rows::forget(at),
        }
    }
    drop(lock);
    // Where the tests see that a file was read as far as it changed: all done.
    if fast {
        crate::crash::point("apply-rows");
    }
    Ok(applied)
}

/// Whether a LibreQoS file of `desired` was read as far as it changed (not whole).
fn saves_fast(desired: &[AttachRequest]) -> bool {
    desired.iter().any(|d| deferred(d).is_some())
}

/// The `[interface.libreqos]` file of `d` if it is not read yet.
fn deferred(d: &AttachRequest) -> Option<&CsvFile> {
    let csv = d.subscribers.as_ref()?.csv.as_ref()?;
    csv.rows.is_none().then_some(csv)
}

fn reread(d: &AttachRequest) -> ApplyError {
    ApplyError::Reread(d.at.label())
}

/// What setting `s` on the attachment of `pinned` writes, checked against the prefix
/// policies `policies` (the file's, which `attach` writes first), or those in force;
/// `made`: the change made the attachment (its subscribers' table is not read).
fn subscriber_batch<'s>(
    pinned: &Pinned,
    s: &'s SubscriberRequest,
    policies: Option<&[IpNet]>,
    made: bool,
) -> Result<Batch<'s>, ChangeError> {
    let table = match made {
        true => SubscriberTable::of(pinned)?.made_now(),
        false => SubscriberTable::of(pinned)?,
    };
    Ok(table.batch_against(&s.specs, s.prune, policies)?)
}

/// The prefixes of a set of policies.
fn policy_prefixes(set: &PolicySet) -> Vec<IpNet> {
    set.specs().map(|p| p.prefix).collect()
}

/// Writes the subscribers of `d` (its batch, checked before the change was journaled; or,
/// for an attachment the change made, checked now through its new pins): what was done,
/// and the rows of its LibreQoS file to save for the next apply (`saved`, those the
/// batch was made from where the file was read as far as it changed).
fn write_subscribers(
    d: &AttachRequest,
    at: &Attachment,
    (pinned, made): (Option<&Pinned>, bool),
    batch: Option<Batch>,
    saved: Option<Saved>,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<(Option<Summary>, Option<Saved>), ApplyError> {
    let Some(s) = &d.subscribers else {
        return Ok((None, None));
    };
    let opened;
    let pinned = match pinned {
        Some(p) => p,
        None => {
            opened = Pinned::open(at).map_err(|e| subscriber_err(d, e.into()))?;
            &opened
        }
    };
    let batch = match batch {
        Some(b) => b,
        // A file not read whole is batched before the change is journaled, or not at all.
        None if deferred(d).is_some() => return Err(reread(d)),
        None => subscriber_batch(pinned, s, None, made).map_err(|e| subscriber_err(d, e))?,
    };
    let mut table = SubscriberTable::of(pinned).map_err(|e| subscriber_err(d, e.into()))?;
    let summary = table
        .write_batch(&batch, progress)
        .map_err(|e| subscriber_err(d, e.into()))?;
    let saved = saved.or_else(|| rows_read(d, s, &batch)).and_then(|saved| {
        Some(Saved {
            maps: rows::map_ids(pinned)?,
            ..saved
        })
    });
    Ok((Some(summary), saved))
}

/// The rows of `d`'s LibreQoS file read whole, each with its subscriber's entry as
/// `batch` found or placed it.
fn rows_read(d: &AttachRequest, s: &SubscriberRequest, batch: &Batch) -> Option<Saved> {
    let csv = s.csv.as_ref()?;
    let read = csv.rows.as_ref()?;
    let indices = batch.indices();
    let first = s.specs.len().checked_sub(read.circuits as usize)?;
    if indices.len() != s.specs.len() {
        return None;
    }
    let mtu = system::mtu(&d.at.iface).ok()?;
    let mut rows: Vec<(u128, u32)> = read
        .rows
        .iter()
        .map(|&(digest, k)| Some((digest, *indices.get(k as usize)?)))
        .collect::<Option<_>>()?;
    rows.sort_unstable();
    Some(Saved {
        context: rows::context(d, &s.specs[..first], csv, read.header, mtu),
        circuits: read.circuits,
        rows,
        ..Saved::default()
    })
}

fn subscriber_err(d: &AttachRequest, e: ChangeError) -> ApplyError {
    ApplyError::Subscribers {
        iface: d.at.label(),
        error: Box::new(e),
    }
}

/// An attachment's settings and policies, read through its pins as the change opened
/// them (`None`: opened here, which says why they cannot be read).
fn snapshot(
    at: &Attachment,
    pinned: Option<&Pinned>,
) -> Result<(Config, Vec<PolicySpec>), AttachError> {
    let table = match pinned {
        Some(pinned) => PolicyTable::of(pinned)?,
        None => PolicyTable::open(at)?,
    };
    let config = table.config()?;
    let policies = table.list()?.into_iter().map(|i| i.spec).collect();
    Ok((config, policies))
}

/// Whether two snapshots hold the same settings and policies (the generation, which only
/// says how often the policies were written, aside).
fn same(a: &(Config, Vec<PolicySpec>), b: &(Config, Vec<PolicySpec>)) -> bool {
    let settings = |c: &Config| Config {
        policy_gen: 0,
        ..*c
    };
    settings(&a.0) == settings(&b.0) && a.1 == b.1
}

fn attach_err(index: usize, d: &AttachRequest, source: AttachError) -> ApplyError {
    ApplyError::Attach {
        index,
        iface: d.at.iface.clone(),
        error: Box::new(source),
    }
}

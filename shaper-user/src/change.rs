//! One change of the attachments on this host, made whole or not at all: the one way every
//! caller that changes them goes (`attach`, `policy set|del`, `apply`, `detach`, the
//! daemon's reloads; later ones too), each step once:
//!
//! 1. [`begin`]: take the host lock ([`system::lock`]), roll back a change killed half
//!    way ([`journal::recover`]), finish an upgrade killed half way ([`upgrade::recover`]),
//!    move the host's change count on ([`system::Lock::bump`]), and open the pins of each
//!    attachment the change may touch, once ([`Pinned`]: their layout checked once; the
//!    daemon's RADIUS listener keeps them, and an index of the subscribers, from one of
//!    its changes to the next while the count says no one else changed anything:
//!    [`Kept`]). What the change checks before it writes, it reads through these
//!    ([`Prepared`]); an error here has written nothing.
//! 2. [`Prepared::journal`]: journal how to put each attachment back
//!    ([`journal::Undo`], read through the same pins).
//! 3. Write through the same pins ([`Change::pinned`], [`PolicyTable::of`]), then
//!    [`Change::commit`]. A [`Change`] dropped without it (an error returned half way)
//!    rolls every attachment back before it lets the lock go; a process killed half way
//!    leaves the journal, and the next command rolls back.
//!
//! [`attach`], [`set_policy`], [`del_policy`] and [`detach`] are whole changes;
//! [`crate::apply::apply`] is one over every interface of a file.

use std::sync::Arc;

use ipnet::IpNet;
use shaper_common::{config::PolicyLimits, maps::MODE_SHAPE};

use crate::{
    attach::{self, AttachError, Attached},
    detach::{self, DetachError},
    journal::{self, JournalError, Known, Undo},
    link,
    maps::{Pinned, PinnedMapError},
    pins::Attachment,
    policy::{Changes, CheckedPolicy, PolicyError, PolicyTable},
    request::{self, AttachRequest, Hook, RequestError},
    subscriber::{
        Before, Changed, Index, SubscriberError, SubscriberSpec, SubscriberTable, Summary,
    },
    system::{self, SystemError},
    upgrade::{self, UpgradeError},
};

#[derive(Debug, thiserror::Error)]
pub enum ChangeError {
    #[error("shaper is not attached to {0}")]
    NotAttached(String),
    /// Its interface was deleted: what [`link::gone`] says.
    #[error("{0}")]
    Gone(String),
    #[error(transparent)]
    System(#[from] SystemError),
    #[error(transparent)]
    Journal(#[from] JournalError),
    #[error(transparent)]
    Upgrade(#[from] UpgradeError),
    #[error(transparent)]
    Pinned(#[from] PinnedMapError),
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error(transparent)]
    Attach(#[from] AttachError),
    #[error(transparent)]
    Detach(#[from] DetachError),
    #[error(transparent)]
    Subscriber(#[from] SubscriberError),
}

/// An attachment a change may touch, as [`begin`] found it.
struct Opened {
    at: Attachment,
    /// Its link held the program.
    live: bool,
    /// Its pins, opened once (or kept from the daemon's last change: [`Kept`]): `None`
    /// where it is not live, or its pins are not this shaper's layout (an upgrade is due).
    pinned: Option<Arc<Pinned>>,
}

fn find<'a>(opened: &'a [Opened], at: &Attachment) -> Option<&'a Opened> {
    opened.iter().find(|o| o.at == *at)
}

/// A change under the lock, recovered and opened, not yet journaled: what it reads here
/// decides whether it goes on. Dropped, it lets the lock go, having written nothing.
pub struct Prepared {
    command: String,
    opened: Vec<Opened>,
    lock: system::Lock,
}

/// Begins the change `command` (`policy set`, `apply`, ...: the journal names it) of
/// `attachments`: takes the lock, recovers what a killed change or upgrade left, and opens
/// the pins of each live attachment once.
pub fn begin(command: &str, attachments: &[Attachment]) -> Result<Prepared, ChangeError> {
    begin_holding(command, attachments, system::lock()?)
}

/// [`begin`] with the lock taken already (the daemon tries it for a bounded time rather
/// than wait: `system::try_lock`).
pub fn begin_holding(
    command: &str,
    attachments: &[Attachment],
    lock: system::Lock,
) -> Result<Prepared, ChangeError> {
    begin_keeping(command, attachments, lock, &mut Kept::default())
}

/// What the daemon keeps of the attachments it changes from one of its changes to the
/// next: each one's pins, opened once, and its subscribers' [`Index`], read once. Good
/// while no change since may have touched that attachment: every change moves the host's
/// change count ([`system::Lock::generation`]) on under the lock before it writes
/// anything (at [`begin`]), and logs the attachments it may touch
/// ([`system::Lock::bump_logging`]), so a change of that attachment made by any other
/// command or thread, or rolled back, makes the daemon open and read it again (and any
/// change it cannot account for, every attachment); its own changes keep what it kept up
/// to date as they write.
#[derive(Default)]
pub struct Kept {
    generation: Option<u64>,
    held: Vec<Held>,
    /// How many times an attachment's subscribers were read whole into an index.
    reads: u64,
}

struct Held {
    at: Attachment,
    pinned: Arc<Pinned>,
    index: Option<Index>,
}

impl Kept {
    /// The pins of `at`, kept or opened now (and kept).
    fn pins(&mut self, at: &Attachment) -> Result<Arc<Pinned>, PinnedMapError> {
        if let Some(h) = self.held.iter().find(|h| h.at == *at) {
            return Ok(h.pinned.clone());
        }
        let pinned = Arc::new(Pinned::open(at)?);
        self.held.push(Held {
            at: at.clone(),
            pinned: pinned.clone(),
            index: None,
        });
        Ok(pinned)
    }

    /// The subscriber index of `at` (whose pins are kept), built from `table` if there is
    /// none.
    fn index(
        &mut self,
        at: &Attachment,
        table: &SubscriberTable,
    ) -> Result<&mut Index, ChangeError> {
        let held = self
            .held
            .iter_mut()
            .find(|h| h.at == *at)
            .ok_or_else(|| ChangeError::NotAttached(at.label()))?;
        if held.index.is_none() {
            held.index = Some(table.index()?);
            self.reads += 1;
        }
        Ok(held.index.get_or_insert_default())
    }

    /// Reads the subscriber index (with its prefixes) of each of `attachments` whose pins
    /// are kept and that has none, without the change lock: what the daemon's listener
    /// reads at start (0.5 to 1 s an attachment at 100,000 subscribers), other commands'
    /// changes going on meanwhile. It holds only as far as the change log allows: the
    /// next [`begin_edits`] drops the index of an attachment that a change since the one
    /// that kept these pins may have touched (every change logs that before it writes),
    /// and that change reads it again under the lock. One that cannot be read (a change
    /// half way through it) is left for the next change to read. `after_each` runs after
    /// each attachment is read (a test's changes meanwhile).
    pub fn read_unlocked(&mut self, attachments: &[Attachment], mut after_each: impl FnMut()) {
        for held in &mut self.held {
            if held.index.is_some() || !attachments.contains(&held.at) {
                continue;
            }
            let Ok(table) = SubscriberTable::of(&held.pinned) else {
                continue;
            };
            let Ok(mut index) = table.index() else {
                continue;
            };
            if table.index_routes(&mut index).is_ok() {
                held.index = Some(index);
                self.reads += 1;
            }
            after_each();
        }
    }

    /// How many times the subscribers of an attachment were read whole (into an index):
    /// at the first change, and after every change another command made.
    pub fn reads(&self) -> u64 {
        self.reads
    }

    /// The policy slots of `at` as its index has them, if it has one.
    fn slots(&self, at: &Attachment) -> Option<Known> {
        let held = self.held.iter().find(|h| h.at == *at)?;
        held.index.as_ref().map(|index| Known::Every(index.slots()))
    }
}

/// [`begin_holding`], reusing what `kept` holds if the host's change count is the one it
/// was kept at (and dropping it otherwise).
fn begin_keeping(
    command: &str,
    attachments: &[Attachment],
    lock: system::Lock,
    kept: &mut Kept,
) -> Result<Prepared, ChangeError> {
    begin_logging(command, attachments, attachments, lock, kept)
}

/// [`begin_keeping`], logging the change as one that may touch `logged` (every
/// attachment if empty) rather than the attachments it opens.
fn begin_logging(
    command: &str,
    attachments: &[Attachment],
    logged: &[Attachment],
    lock: system::Lock,
    kept: &mut Kept,
) -> Result<Prepared, ChangeError> {
    // One left by a command killed after this one's entry point checked: it may have
    // touched any attachment, and so may this change.
    let recovered = journal::recover()?.is_some();
    for at in attachments {
        upgrade::recover(at)?;
    }
    // What was kept of an attachment is good only if no change since may have touched it,
    // recoveries included (a killed change moved the count on, and logged what it may
    // touch, before it wrote). This change does the same before it writes anything; the
    // daemon's own writes keep what it kept up to date.
    let seen = lock.generation()?;
    let touched_since = match kept.generation {
        Some(since) if since <= seen => lock.touched_since(since)?,
        _ => None,
    };
    match touched_since {
        Some(touched) => kept
            .held
            .retain(|h| !touched.contains(&system::digest(&h.at.label()))),
        None => kept.held.clear(),
    }
    let touched: Vec<u64> = match recovered {
        true => Vec::new(),
        false => logged
            .iter()
            .map(|at| system::digest(&at.label()))
            .collect(),
    };
    kept.generation = Some(lock.bump_logging(seen, &touched)?);
    let mut opened = Vec::new();
    for at in attachments {
        // "Could not tell" is refused, never taken for gone: the journal would detach it.
        let live = match at.exists().then(|| link::liveness(at)) {
            None | Some(link::Liveness::Gone) => false,
            Some(link::Liveness::Live) => true,
            Some(link::Liveness::Unknown(error)) => {
                return Err(JournalError::Liveness {
                    label: at.label(),
                    error,
                }
                .into());
            }
        };
        let pinned = match live.then(|| kept.pins(at)) {
            Some(Ok(pinned)) => Some(pinned),
            // Older pins: attach upgrades them; a policy change says so (`attached`).
            None | Some(Err(PinnedMapError::Layout(_))) => None,
            Some(Err(e)) => return Err(e.into()),
        };
        opened.push(Opened {
            at: at.clone(),
            live,
            pinned,
        });
    }
    Ok(Prepared {
        command: command.to_owned(),
        opened,
        lock,
    })
}

impl Prepared {
    /// The pins of `at` as opened: `None` where it is not live or not this shaper's layout.
    pub fn pinned(&self, at: &Attachment) -> Option<&Pinned> {
        find(&self.opened, at).and_then(|o| o.pinned.as_deref())
    }

    /// The pins of `at`, which must be attached, with its link live (a policy written
    /// into the pins of a deleted interface would be in force nowhere) and this shaper's
    /// layout; otherwise the one-line error that says so.
    pub fn attached(&self, at: &Attachment) -> Result<&Pinned, ChangeError> {
        if let Some(pinned) = self.pinned(at) {
            return Ok(pinned);
        }
        if !at.exists() {
            return Err(ChangeError::NotAttached(at.label()));
        }
        // Older pins say what to run; this shaper's, that the interface is gone.
        Pinned::open(at)?;
        Err(ChangeError::Gone(link::gone(at)))
    }

    /// Journals how to put each attachment back: from here on, what is written is undone
    /// unless [`Change::commit`] is reached.
    pub fn journal(self) -> Result<Change, ChangeError> {
        self.journal_with(Vec::new())
    }

    /// [`Prepared::journal`], with `extra` steps run first when rolling back (one
    /// subscriber's entry and routes: [`Undo::subscriber`]).
    pub fn journal_with(self, extra: Vec<Undo>) -> Result<Change, ChangeError> {
        self.journal_knowing(extra, |_| None)
    }

    /// [`Prepared::journal_with`], each attachment's policy slots taken from `slots`
    /// where it knows them (the daemon's index), read otherwise.
    fn journal_knowing(
        self,
        extra: Vec<Undo>,
        mut slots: impl FnMut(&Attachment) -> Option<Known>,
    ) -> Result<Change, ChangeError> {
        let mut undo = Vec::new();
        for o in &self.opened {
            let known = o.pinned.as_ref().and_then(|_| slots(&o.at));
            undo.extend(Undo::of(&o.at, o.live, o.pinned.as_deref(), known)?);
        }
        undo.extend(extra);
        let journal = journal::begin(&self.command, undo)?;
        Ok(Change {
            journal,
            opened: self.opened,
            _lock: self.lock,
        })
    }
}

/// A change journaled: written through [`Change::pinned`], then committed. Dropped
/// without [`Change::commit`], it rolls back, then lets the lock go.
pub struct Change {
    // Dropped in this order: rolled back while the lock is held.
    journal: journal::Change,
    opened: Vec<Opened>,
    _lock: system::Lock,
}

impl Change {
    /// The pins of `at` as [`begin`] opened them (see [`Prepared::pinned`]).
    pub fn pinned(&self, at: &Attachment) -> Option<&Pinned> {
        find(&self.opened, at).and_then(|o| o.pinned.as_deref())
    }

    /// Whether `at`'s link held the program when the change began.
    pub fn live(&self, at: &Attachment) -> bool {
        find(&self.opened, at).is_some_and(|o| o.live)
    }

    /// [`Change::commit`], the lock kept: what the caller saves of the change (the rows
    /// an apply read: [`crate::rows`]) is saved before another change may begin.
    pub fn commit_holding(self) -> Result<system::Lock, ChangeError> {
        let Self {
            journal,
            opened,
            _lock,
        } = self;
        journal.commit()?;
        drop(opened);
        Ok(_lock)
    }

    /// The change is complete: forget how to undo it, and let the lock go.
    pub fn commit(self) -> Result<(), ChangeError> {
        self.commit_holding().map(drop)
    }
}

/// `shaper attach`: attaches as asked, or updates, upgrades or relinks in place
/// ([`attach::attach`]), as one change.
pub fn attach(req: &AttachRequest) -> Result<Attached, ChangeError> {
    let change = begin("attach", std::slice::from_ref(&req.at))?.journal()?;
    let attached = attach::attach(req, change.pinned(&req.at))?;
    change.commit()?;
    Ok(attached)
}

/// `shaper policy set`: adds `policy` to `at`, or replaces the policy of its prefix.
pub fn set_policy(at: &Attachment, policy: CheckedPolicy) -> Result<Changes, ChangeError> {
    set_policy_holding(at, policy, system::lock()?)
}

/// [`set_policy`] under `lock`, taken already (the daemon's API tries it for a bounded
/// time rather than wait).
pub fn set_policy_holding(
    at: &Attachment,
    policy: CheckedPolicy,
    lock: system::Lock,
) -> Result<Changes, ChangeError> {
    let prepared = begin_holding("policy set", std::slice::from_ref(at), lock)?;
    let pinned = prepared.attached(at)?;
    let mut table = PolicyTable::of(pinned)?;
    let config = table.config()?;
    let spec = *policy.spec();
    request::check_shape(at, Hook::of_mode(config.xdp_mode), &config, [spec].iter())?;
    // The second meter's maps are made small where no policy has one: grown first (every
    // map the table holds is kept).
    if spec.limits.meter2.any() && !pinned.meter2_room() {
        upgrade::make_room_for_meter2(at)?;
    }
    let change = prepared.journal()?;
    let changes = table.set(policy)?;
    change.commit()?;
    Ok(changes)
}

/// `shaper policy del`: removes the policy of `prefix` from `at`.
pub fn del_policy(at: &Attachment, prefix: IpNet) -> Result<Changes, ChangeError> {
    del_policy_holding(at, prefix, system::lock()?)
}

/// [`del_policy`] under `lock`, taken already.
pub fn del_policy_holding(
    at: &Attachment,
    prefix: IpNet,
    lock: system::Lock,
) -> Result<Changes, ChangeError> {
    let prepared = begin_holding("policy del", std::slice::from_ref(at), lock)?;
    let mut table = PolicyTable::of(prepared.attached(at)?)?;
    let change = prepared.journal()?;
    let changes = table.del(prefix)?;
    change.commit()?;
    Ok(changes)
}

/// `shaper subscriber set`: adds `spec` to `at`, or replaces the subscriber of its id,
/// writing that subscriber alone.
pub fn set_subscriber(at: &Attachment, spec: &SubscriberSpec) -> Result<Changed, ChangeError> {
    set_subscriber_holding(at, spec, system::lock()?)
}

/// [`set_subscriber`] under `lock`, taken already.
pub fn set_subscriber_holding(
    at: &Attachment,
    spec: &SubscriberSpec,
    lock: system::Lock,
) -> Result<Changed, ChangeError> {
    let prepared = begin_holding("subscriber set", std::slice::from_ref(at), lock)?;
    let mut table = SubscriberTable::of(prepared.attached(at)?)?;
    check_subscribers_shape(at, &table, std::slice::from_ref(spec))?;
    let before = table.before(&spec.id, Some(spec))?;
    // The policy slots the plan may take, read once: journaled, and where the plan is
    // found or goes (its window's, or where that is full, every slot).
    let (slots, known): (_, fn(_) -> _) = match table.plan_slots(spec, &before)? {
        Some(window) => (window, Known::Only),
        None => (table.slots()?, Known::Every),
    };
    let undo = vec![Undo::subscriber(at, &before)];
    let change = prepared.journal_knowing(undo, |_| Some(known(slots.clone())))?;
    let changed = table.set_among(spec, &before, &slots)?;
    change.commit()?;
    Ok(changed)
}

/// `shaper subscriber import`, and the subscribers of a configuration file: sets each of
/// `specs` on `at`, writing only those that differ (with `prune`, removing those not in
/// `specs`); every one checked before anything is written. `progress` is told how many of
/// how many are written.
pub fn set_subscribers(
    at: &Attachment,
    specs: &[SubscriberSpec],
    prune: bool,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Summary, ChangeError> {
    let prepared = begin("subscriber import", std::slice::from_ref(at))?;
    let mut table = SubscriberTable::of(prepared.attached(at)?)?;
    check_subscribers_shape(at, &table, specs)?;
    let batch = table.batch(specs, prune)?;
    if batch.befores().next().is_none() {
        return Ok(batch.summary());
    }
    let undo = batch.befores().map(|b| Undo::subscriber(at, b)).collect();
    let change = prepared.journal_with(undo)?;
    let summary = table.write_batch(&batch, progress)?;
    change.commit()?;
    Ok(summary)
}

/// Refuses subscribers whose plan shapes where `at` (whose subscribers `table` holds)
/// cannot shape (`request::check_shape`), each such subscriber checked first (a plan that
/// could not shape anywhere is refused as such).
fn check_subscribers_shape(
    at: &Attachment,
    table: &SubscriberTable,
    specs: &[SubscriberSpec],
) -> Result<(), ChangeError> {
    let mut shaping = specs
        .iter()
        .filter(|s| s.plan.mode == MODE_SHAPE)
        .peekable();
    if shaping.peek().is_none() {
        return Ok(());
    }
    let config = table.config()?;
    for s in shaping {
        s.check((config.prefix_v4, config.prefix_v6))?;
    }
    let hook = Hook::of_mode(config.xdp_mode);
    request::check_subscribers_shape(at, hook, specs.iter())?;
    Ok(())
}

/// `shaper subscriber del`: removes the subscriber `id` from `at`.
pub fn del_subscriber(at: &Attachment, id: &str) -> Result<Changed, ChangeError> {
    del_subscriber_holding(at, id, system::lock()?)
}

/// [`del_subscriber`] under `lock`, taken already.
pub fn del_subscriber_holding(
    at: &Attachment,
    id: &str,
    lock: system::Lock,
) -> Result<Changed, ChangeError> {
    let prepared = begin_holding("subscriber del", std::slice::from_ref(at), lock)?;
    let mut table = SubscriberTable::of(prepared.attached(at)?)?;
    let before = table.before(id, None)?;
    // The one policy slot it may write: its plan's (its count, or freed), journaled
    // alone, the array not read.
    let slot = before.entry.plan;
    let slots = vec![(slot, table.plan_now(slot)?)];
    let undo = vec![Undo::subscriber(at, &before)];
    let change = prepared.journal_knowing(undo, |_| Some(Known::Only(slots.clone())))?;
    let changed = table.del(&before)?;
    change.commit()?;
    Ok(changed)
}

/// What [`Edits::apply`] does to the subscriber of one attachment.
pub enum Edit<'a> {
    /// Gives subscriber `id` the plan `plan` makes of the one in force, its prefixes and
    /// name kept (a plan change: its bucket carried over, no refill).
    Plan {
        id: String,
        plan: &'a dyn Fn(&PolicyLimits) -> PolicyLimits,
    },
    /// Removes subscriber `id`.
    Del { id: String },
}

/// A RADIUS CoA or Disconnect begun ([`begin_edits`]): under the lock, recovered, with
/// the pins and subscriber indexes the daemon kept ([`Kept`]) where nothing changed since,
/// opened and read again otherwise.
pub struct Edits<'k> {
    prepared: Prepared,
    kept: &'k mut Kept,
}

/// Begins a RADIUS change of the subscribers of `attachments` under `lock` (taken
/// already), through what `kept` holds.
pub fn begin_edits<'k>(
    command: &str,
    attachments: &[Attachment],
    lock: system::Lock,
    kept: &'k mut Kept,
) -> Result<Edits<'k>, ChangeError> {
    let prepared = begin_keeping(command, attachments, lock, kept)?;
    Ok(Edits { prepared, kept })
}

impl Edits<'_> {
    /// Whether subscriber `id` is set on `at` (which must be attached): its index, read
    /// once.
    pub fn has(&mut self, at: &Attachment, id: &str) -> Result<bool, ChangeError> {
        let table = SubscriberTable::of(self.prepared.attached(at)?)?;
        Ok(self.kept.index(at, &table)?.contains(id))
    }

    /// How many subscribers `at` (which must be attached) has, by its index, with their
    /// prefixes: read now if it was not kept.
    pub fn indexed(&mut self, at: &Attachment) -> Result<usize, ChangeError> {
        let table = SubscriberTable::of(self.prepared.attached(at)?)?;
        let index = self.kept.index(at, &table)?;
        table.index_routes(index)?;
        Ok(index.len())
    }

    /// The id of the subscriber whose prefix holds `net` on `at` (which must be
    /// attached), if any: a lookup in the tries and one entry read.
    pub fn id_holding(&self, at: &Attachment, net: &IpNet) -> Result<Option<String>, ChangeError> {
        let table = SubscriberTable::of(self.prepared.attached(at)?)?;
        Ok(table.id_holding(net)?)
    }

    /// Makes `edits` of the subscribers of the attachments begun, as one change: each
    /// read, journaled and written, all or none. A subscriber gone is
    /// [`SubscriberError::NotFound`], nothing written. Attachments not edited are not
    /// journaled. After an error, what was kept is opened and read again next time.
    pub fn apply(self, edits: &[(Attachment, Edit<'_>)]) -> Result<Vec<Changed>, ChangeError> {
        let Self { mut prepared, kept } = self;
        prepared
            .opened
            .retain(|o| edits.iter().any(|(at, _)| *at == o.at));
        let result = apply_edits(prepared, kept, edits);
        if result.is_err() {
            kept.generation = None;
        }
        result
    }
}

/// What an edit writes: the plan it gives, and the subscriber as it was.
type Step = (SubscriberTable, Option<PolicyLimits>, Before);

fn apply_edits(
    prepared: Prepared,
    kept: &mut Kept,
    edits: &[(Attachment, Edit<'_>)],
) -> Result<Vec<Changed>, ChangeError> {
    let mut steps: Vec<Step> = Vec::new();
    for (at, edit) in edits {
        let table = SubscriberTable::of(prepared.attached(at)?)?;
        let index = kept.index(at, &table)?;
        // A plan change reads and writes the entry alone, never the tries; a removal,
        // the entry and its routes, by one lookup each (the prefixes from its record,
        // or from the index, the tries read for them once). An entry not as the index
        // has it is read again, once.
        let (plan, before) = match edit {
            Edit::Plan { id, plan } => {
                let (before, now) = match table.plan_before(index, id) {
                    Err(SubscriberError::Stale(_)) => {
                        *index = table.index()?;
                        kept.reads += 1;
                        table.plan_before(kept.index(at, &table)?, id)
                    }
                    other => other,
                }?;
                let plan = plan(&now);
                if plan.mode == MODE_SHAPE {
                    let hook = Hook::of_mode(table.config()?.xdp_mode);
                    request::check_shaping(at, hook, true)?;
                }
                (Some(plan), before)
            }
            Edit::Del { id } => (None, del_before(kept, at, &table, id)?),
        };
        steps.push((table, plan, before));
    }
    let undo = edits
        .iter()
        .zip(&steps)
        .map(|((at, _), (_, _, before))| Undo::subscriber(at, before))
        .collect();
    let change = prepared.journal_knowing(undo, |at| kept.slots(at))?;
    let mut changed = Vec::new();
    for ((at, _), (mut table, plan, before)) in edits.iter().zip(steps) {
        let index = kept.index(at, &table)?;
        changed.push(match plan {
            Some(plan) => table.set_plan(index, &before, &plan)?,
            None => table.del_indexed(index, &before)?,
        });
    }
    change.commit()?;
    Ok(changed)
}

/// What the removal of subscriber `id` from `at` (whose table is `table`) may touch, read
/// through `kept`'s index: its prefixes from its record if it holds them all
/// ([`SubscriberTable::del_before_recorded`]), the index's (the tries read for them once)
/// otherwise. An entry not as the index has it is read again, once.
fn del_before(
    kept: &mut Kept,
    at: &Attachment,
    table: &SubscriberTable,
    id: &str,
) -> Result<Before, ChangeError> {
    let index = kept.index(at, table)?;
    if let Some(before) = table.del_before_recorded(index, id) {
        return Ok(before);
    }
    table.index_routes(index)?;
    let before = match table.del_before(index, id) {
        Err(SubscriberError::Stale(_)) => {
            *index = table.index()?;
            kept.reads += 1;
            let index = kept.index(at, table)?;
            table.index_routes(index)?;
            table.del_before(index, id)
        }
        other => other,
    }?;
    Ok(before)
}

/// `shaper detach`: takes the program off and removes every pin. Not journaled: what it
/// removes cannot be put back. Logged as a change of `at` alone (whatever kept `at`'s
/// pins reads them again; what other attachments kept stays good), its pins not opened
/// (a detach works whatever state they are in).
pub fn detach(at: &Attachment) -> Result<(), ChangeError> {
    let _prepared = begin_logging(
        "detach",
        &[],
        std::slice::from_ref(at),
        system::lock()?,
        &mut Kept::default(),
    )?;
    detach::detach(at)?;
    Ok(())
}

//! Many subscribers in one change (an import, a configuration file): the table read once,
//! every subscriber checked and the overlaps of the end state refused before anything is
//! written ([`SubscriberTable::batch`]), then only the subscribers that differ written
//! ([`SubscriberTable::write_batch`]). [`Batch::befores`] is what the journal keeps to put
//! them back.
//!
//! The overlap rule is the one of [`SubscriberTable::set`], judged on the end state by
//! lookup: for each route, its covering prefixes of the lengths subscribers use.

use std::{borrow::BorrowMut, ops::Deref, sync::Arc};

use foldhash::{HashMap, HashMapExt as _, HashSet, HashSetExt as _};
use ipnet::IpNet;
use shaper_common::{
    config::PolicyLimits,
    maps::{Policy, SUBSCRIBER_BIT, SUBSCRIBER_ID_BYTES},
};

use super::{
    Before, Entry, SubscriberError, SubscriberSpec, SubscriberTable, map_err, padded, place,
    plan_entry, same_plan, unpadded,
};
use crate::policy::PolicyTable;

/// What a batch does, by subscriber.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Summary {
    pub added: usize,
    pub changed: usize,
    pub unchanged: usize,
    pub removed: usize,
}

/// One subscriber to write: what it becomes, its plan's entry (shared by the writes of one
/// plan: a million writes hold a few plans), and what it may touch as it is.
#[derive(Debug)]
struct Write<'s> {
    spec: Spec<'s>,
    plan: Arc<Policy>,
    before: Before,
}

/// A write's spec: the caller's, borrowed where the batch was made from the caller's (a
/// million not copied), or its own.
#[derive(Debug)]
enum Spec<'s> {
    Borrowed(&'s SubscriberSpec),
    Owned(Box<SubscriberSpec>),
}

impl Deref for Spec<'_> {
    type Target = SubscriberSpec;

    fn deref(&self) -> &SubscriberSpec {
        match self {
            Spec::Borrowed(s) => s,
            Spec::Owned(s) => s,
        }
    }
}

impl Write<'_> {
    /// Whether it moves a subscriber in force to other prefixes found by lookups alone
    /// ([`SubscriberTable::batch_known`]): its new ones are checked when written, as a
    /// `subscriber set` checks them.
    fn moves_by_lookup(&self) -> bool {
        self.before.by_lookup
            && self.before.entry.in_use != 0
            && (self.before.prefixes().count() != self.spec.prefixes.len()
                || self
                    .before
                    .prefixes()
                    .any(|p| !self.spec.prefixes.contains(p)))
    }

    /// The routes to write: each of its prefixes not routed to it already.
    fn routes_to_write(&self) -> impl Iterator<Item = (IpNet, u32)> + '_ {
        let value = self.before.index | SUBSCRIBER_BIT;
        self.before
            .routes
            .iter()
            .filter(move |(p, v)| self.spec.prefixes.contains(p) && *v != Some(value))
            .map(move |(p, _)| (*p, value))
    }
}

/// Subscribers checked against the table as it was read: those to write and to remove
/// (`'s`: the specs it was made from, which it borrows).
#[derive(Debug)]
pub struct Batch<'s> {
    writes: Vec<Write<'s>>,
    removes: Vec<Before>,
    summary: Summary,
    /// The plans of the subscribers it leaves alone, with how many each.
    kept_plans: HashMap<u32, u32>,
    /// The table places by hash ([`place`]), and is to be marked so first (it has no
    /// subscriber yet).
    hashed: bool,
    mark: bool,
    /// The subscribers' prefixes before it: with its own, what it leaves
    /// ([`super::known`]).
    prefixes_before: Prefixes,
    /// The entry of each subscriber it was given, in order (those it leaves unchanged
    /// too); empty for [`SubscriberTable::batch_known`]'s.
    indices: Vec<u32>,
    /// Made by [`SubscriberTable::batch_known`]: routes change only for subscribers moved
    /// to other prefixes (checked when written), and the saved routes
    /// ([`super::known`]) are not written (a change of routes moves the policy generation
    /// on, which they no longer match).
    partial: bool,
    /// Made from every route of the tries: `prefixes_before` holds every subscriber's
    /// prefixes, and the records of prefixes ([`super::prefixes`]) are written whole.
    complete: bool,
}

impl Batch<'_> {
    /// What puts each subscriber the batch touches back (`crate::journal::Undo`).
    pub fn befores(&self) -> impl Iterator<Item = &Before> {
        self.writes
            .iter()
            .map(|w| &w.before)
            .chain(self.removes.iter())
    }

    /// What writing it does.
    pub fn summary(&self) -> Summary {
        self.summary
    }

    /// The entry of each subscriber it was given, in the order given.
    pub fn indices(&self) -> &[u32] {
        &self.indices
    }

    /// Whether each entry up to `len` (and past it, none) is one it rewrites: a bitmap,
    /// not a set of a million.
    fn rewritten(&self, len: usize) -> Vec<bool> {
        let mut out = vec![false; len];
        for b in self.befores() {
            if let Some(r) = out.get_mut(b.index as usize) {
                *r = true;
            }
        }
        out
    }

    /// Whether writing it changes a route.
    fn routes_change(&self) -> bool {
        !self.removes.is_empty()
            || self.writes.iter().any(|w| {
                w.routes_to_write().next().is_some()
                    || w.before.prefixes().any(|p| !w.spec.prefixes.contains(p))
            })
    }
}

/// The table as a batch reads it once.
struct Read {
    /// `routes` holds every route of the tries; otherwise the subscribers' alone, as the
    /// last batch left them ([`super::known`]), trusted only for subscribers whose
    /// prefixes a batch keeps.
    complete: bool,
    /// Every entry, free ones too, by index; empty for a table made by this change (every
    /// entry free: not a million default entries made and read).
    all: Vec<Entry>,
    /// How many entries the table has.
    len: usize,
    /// The indices of the entries in use, in order.
    in_use: Vec<u32>,
    routes: HashMap<IpNet, u32>,
    /// Each subscriber's prefixes, by index.
    prefixes: Prefixes,
    plans: Vec<(u32, Policy)>,
}

/// The subscribers' routes by index, as two lists: where each subscriber's prefixes start
/// in `net` (`start[i]..start[i + 1]`), and the prefixes in the order of their
/// subscribers: a million subscribers' prefixes without a list each, found without a
/// search.
#[derive(Debug, Default)]
struct Prefixes {
    start: Vec<u32>,
    net: Vec<IpNet>,
}

impl Prefixes {
    fn of(routes: &HashMap<IpNet, u32>) -> Self {
        let of = |v: u32| (v & SUBSCRIBER_BIT != 0).then_some((v & !SUBSCRIBER_BIT) as usize);
        let last = routes.values().filter_map(|v| of(*v)).max().unwrap_or(0);
        // Counted, then placed (a counting sort): two passes over the routes.
        let mut start = vec![0u32; last + 2];
        for i in routes.values().filter_map(|v| of(*v)) {
            start[i + 1] += 1;
        }
        for i in 1..start.len() {
            start[i] += start[i - 1];
        }
        let mut at = start.clone();
        let mut net = vec![IpNet::default(); start[last + 1] as usize];
        for (p, i) in routes.iter().filter_map(|(p, v)| Some((p, of(*v)?))) {
            net[at[i] as usize] = *p;
            at[i] += 1;
        }
        Prefixes { start, net }
    }

    /// One more than the last index with a prefix.
    fn len(&self) -> u32 {
        self.start.len().saturating_sub(1) as u32
    }

    /// Subscriber `index`'s prefixes, in no particular order.
    fn of_index(&self, index: u32) -> &[IpNet] {
        let i = index as usize;
        match (self.start.get(i), self.start.get(i + 1)) {
            (Some(&a), Some(&b)) => &self.net[a as usize..b as usize],
            _ => &[],
        }
    }
}

fn same_set(a: &[IpNet], b: &[IpNet]) -> bool {
    a.len() == b.len() && a.iter().all(|p| b.contains(p))
}

impl Read {
    /// Entry `i` as read (a free one past those read).
    fn at(&self, i: u32) -> Entry {
        self.all.get(i as usize).copied().unwrap_or_default()
    }
}

impl<P: BorrowMut<PolicyTable>> SubscriberTable<P> {
    /// The table with `routes` as the routes (all of them if `complete`).
    fn read_with(
        &self,
        routes: Vec<(IpNet, u32)>,
        complete: bool,
    ) -> Result<Read, SubscriberError> {
        let routes: HashMap<IpNet, u32> = routes.into_iter().collect();
        let len = self.subs.len() as usize;
        let mut all = Vec::new();
        if !self.made_now {
            all = self.all()?;
        }
        let in_use = (1..all.len() as u32)
            .filter(|&i| all[i as usize].in_use != 0)
            .collect();
        Ok(Read {
            complete,
            all,
            len,
            in_use,
            prefixes: Prefixes::of(&routes),
            routes,
            plans: self.p().plans()?,
        })
    }

    /// Checks `specs` (each id once) against the table: what writing them changes. With
    /// `prune`, the subscribers not in `specs` are removed. Writes nothing.
    pub fn batch<'s>(
        &self,
        specs: &'s [SubscriberSpec],
        prune: bool,
    ) -> Result<Batch<'s>, SubscriberError> {
        self.batch_against(specs, prune, None)
    }

    /// [`Self::batch`], its overlaps checked against the prefix policies `policies` instead
    /// of those in force: the policies a change writes before the batch (a file's, which
    /// may give a policy's prefix to a subscriber).
    pub fn batch_against<'s>(
        &self,
        specs: &'s [SubscriberSpec],
        prune: bool,
        policies: Option<&[IpNet]>,
    ) -> Result<Batch<'s>, SubscriberError> {
        let config = self.p().config()?;
        let known = self.known.as_ref().and_then(|k| k.load(config.policy_gen));
        if let Some(routes) = known {
            let value = |(net, i): (IpNet, u32)| (net, i | SUBSCRIBER_BIT);
            let read = self.read_with(routes.into_iter().map(value).collect(), false)?;
            if let Some(batch) = self.batch_read(specs, prune, policies, &config, read)? {
                return Ok(batch);
            }
        }
        let read = self.read_with(self.p().routes()?, true)?;
        self.batch_read(specs, prune, policies, &config, read)?
            .ok_or_else(|| SubscriberError::Stale("(every route read)".to_owned()))
    }

    /// [`Self::batch_against`] on the table as `read`: `None` if `read` is not complete and
    /// the batch needs more than it holds (a new subscriber, one whose prefixes change, or
    /// one whose count of prefixes is not as it says).
    fn batch_read<'s>(
        &self,
        specs: &'s [SubscriberSpec],
        prune: bool,
        policies: Option<&[IpNet]>,
        config: &shaper_common::maps::Config,
        read: Read,
    ) -> Result<Option<Batch<'s>>, SubscriberError> {
        // By the id as the entry holds it, to the entry as read: no string made and no entry
        // copied for each of a million.
        let by_id: HashMap<&[u8; SUBSCRIBER_ID_BYTES], u32> = read
            .in_use
            .iter()
            .map(|&i| (&read.all[i as usize].id, i))
            .collect();
        let mut first_free = (1..=self.room()).filter(|&i| read.at(i).in_use == 0);
        let marked = read.len > 0 && read.at(0).id == place::MARKER;
        let empty = self.room() > 0 && read.in_use.is_empty();
        // Where the new subscribers go, in a table placed by hash (made at the first).
        let mut free: Option<Free> = None;
        let mut plans = Plans::default();
        let mut seen = HashSet::with_capacity(specs.len());
        let mut batch = Batch {
            // Room for every one (a new attachment's): not grown and copied twenty times.
            writes: Vec::with_capacity(specs.len()),
            removes: Vec::new(),
            summary: Summary::default(),
            kept_plans: HashMap::new(),
            hashed: marked || empty,
            mark: !marked && empty,
            prefixes_before: Prefixes::default(),
            indices: Vec::with_capacity(specs.len()),
            partial: false,
            complete: read.complete,
        };
        for spec in specs {
            spec.check_shape((config.prefix_v4, config.prefix_v6))?;
            let plan = plans.entry(spec)?;
            // By the id itself: checked above to be what its padded entry holds (at
            // most SUBSCRIBER_ID_BYTES, no NUL), so equal ids are equal entries' ids.
            if !seen.insert(spec.id.as_str()) {
                return Err(SubscriberError::Overlap(format!(
                    "subscriber {} is given twice",
                    spec.id
                )));
            }
            let (index, entry) = match by_id.get(&padded(&spec.id)) {
                Some(&i) => (i, read.at(i)),
                None if batch.hashed => {
                    let i = free
                        .get_or_insert_with(|| Free::of(&read))
                        .take(place::home(spec.id.as_bytes(), self.room()))
                        .ok_or(SubscriberError::Full { room: self.room() })?;
                    (i, read.at(i))
                }
                None => match first_free.next() {
                    Some(i) => (i, Entry::default()),
                    None => return Err(SubscriberError::Full { room: self.room() }),
                },
            };
            let old = read.prefixes.of_index(index);
            let known = entry.in_use != 0
                && entry.in_use as usize == old.len()
                && same_set(old, &spec.prefixes);
            if !read.complete && !known {
                return Ok(None);
            }
            batch.indices.push(index);
            if entry.in_use != 0 && unchanged(spec, &plan, &entry, old, &read.plans) {
                batch.summary.unchanged += 1;
                continue;
            }
            match entry.in_use {
                0 => batch.summary.added += 1,
                _ => batch.summary.changed += 1,
            }
            batch.writes.push(Write {
                before: before_of(index, entry, old, &spec.prefixes, &read.routes),
                spec: Spec::Borrowed(spec),
                plan,
            });
        }
        if prune {
            for &index in &read.in_use {
                let entry = read.at(index);
                if !seen.contains(id_text(&entry.id)) {
                    let old = read.prefixes.of_index(index);
                    if !read.complete && entry.in_use as usize != old.len() {
                        return Ok(None);
                    }
                    batch
                        .removes
                        .push(before_of(index, entry, old, &[], &read.routes));
                }
            }
            batch.summary.removed = batch.removes.len();
        }
        check_end_state(&batch, &read, policies)?;
        self.check_plan_room(&batch, &read.plans)?;
        let touched = batch.rewritten(read.len);
        for i in read.in_use.iter().filter(|i| !touched[**i as usize]) {
            *batch.kept_plans.entry(read.at(*i).plan).or_default() += 1;
        }
        batch.prefixes_before = read.prefixes;
        Ok(Some(batch))
    }

    /// A batch of `specs`, each the subscriber of its id in force, found by lookups in a
    /// table placed by hash: its entry by a probe, and either its prefixes as given, each
    /// its route, as many as the entry counts (a change of plans or names), or, for a few
    /// moved to other prefixes ([`MOVES_BY_LOOKUP`]), those of its record
    /// ([`SubscriberTable::before_recorded`]), the new ones to be checked by lookups when
    /// written. Nothing else is read (neither the table nor the tries), so `others` more
    /// subscribers (those a caller knows are as it wants them) are counted unchanged.
    /// `None` if one of `specs` is not such a subscriber (new, without a record, or moved
    /// onto or around another moved one's prefixes): [`Self::batch`] it.
    pub fn batch_known(
        &self,
        specs: &[SubscriberSpec],
        others: usize,
    ) -> Result<Option<Batch<'static>>, SubscriberError> {
        if !self.hashed()? {
            return Ok(None);
        }
        let config = self.p().config()?;
        let in_force = self.p().plans()?;
        let mut plans = Plans::default();
        let mut seen = HashSet::with_capacity(specs.len());
        let mut batch = Batch {
            writes: Vec::new(),
            removes: Vec::new(),
            summary: Summary {
                unchanged: others,
                ..Summary::default()
            },
            kept_plans: HashMap::new(),
            hashed: true,
            mark: false,
            prefixes_before: Prefixes::default(),
            indices: Vec::new(),
            partial: true,
            complete: false,
        };
        for spec in specs {
            spec.check_shape((config.prefix_v4, config.prefix_v6))?;
            let plan = plans.entry(spec)?;
            if !seen.insert(spec.id.as_str()) {
                return Ok(None);
            }
            let place::Probe::Found(index, entry) = self.probe(&spec.id)? else {
                return Ok(None);
            };
            if entry.in_use == 0 {
                return Ok(None);
            }
            let before = match self.before_by_lookup(index, entry, spec.prefixes.iter())? {
                Some(before) => before,
                None => match self.before_recorded(index, entry, Some(spec))? {
                    Some(before) => before,
                    None => return Ok(None),
                },
            };
            let now: Vec<IpNet> = before.prefixes().copied().collect();
            if unchanged(spec, &plan, &entry, &now, &in_force) {
                batch.summary.unchanged += 1;
                continue;
            }
            batch.summary.changed += 1;
            batch.writes.push(Write {
                spec: Spec::Owned(Box::new(spec.clone())),
                plan,
                before,
            });
        }
        if !moves_apart(&batch.writes) {
            return Ok(None);
        }
        // The subscribers left alone on each plan: its count, less those rewritten.
        for (slot, p) in &in_force {
            let rewritten = batch
                .writes
                .iter()
                .filter(|w| w.before.entry.plan == *slot)
                .count() as u32;
            let n = super::plan_users(p).saturating_sub(rewritten);
            if n > 0 {
                batch.kept_plans.insert(*slot, n);
            }
        }
        self.check_plan_room(&batch, &in_force)?;
        Ok(Some(batch))
    }

    /// Refuses a batch whose new plans would not fit the policy slots (plans and prefix
    /// policies share them): found before anything is written, not when the first one
    /// fails and the whole batch is rolled back.
    fn check_plan_room(
        &self,
        batch: &Batch,
        in_force: &[(u32, Policy)],
    ) -> Result<(), SubscriberError> {
        let max = self.p().room() as usize;
        let room = max.saturating_sub(self.p().slots()?.len());
        // Plans are few (tens): a list, counted no further than one over the room.
        let mut new: Vec<&Policy> = Vec::new();
        for w in &batch.writes {
            if !in_force.iter().any(|(_, p)| same_plan(p, &w.plan)) && !new.contains(&&*w.plan) {
                new.push(&w.plan);
                if new.len() > room {
                    break;
                }
            }
        }
        if new.len() > room {
            return Err(SubscriberError::PlanRoom { room, max });
        }
        Ok(())
    }

    /// Writes `batch` (as [`SubscriberTable::batch`] read the table, under the same lock):
    /// routes that go first, then the new subscribers (entries, then routes, in batches),
    /// then each changed subscriber's entry and its routes, then the removed subscribers'
    /// entries and the plans no subscriber has any more. `progress` is told how many of
    /// how many are written.
    pub fn write_batch(
        &mut self,
        batch: &Batch,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Summary, SubscriberError> {
        let total = batch.writes.len() + batch.removes.len();
        if batch.mark {
            self.mark_hashed()?;
        }
        // A subscriber moved to other prefixes by lookups: its new ones checked as a
        // `subscriber set` checks them, before any route of the batch goes.
        for w in batch.writes.iter().filter(|w| w.moves_by_lookup()) {
            self.check_by_lookup(&w.spec, &w.before)?;
        }
        // Every route that goes, first: a prefix moved to another subscriber is routed to
        // it below, never removed after.
        for w in &batch.writes {
            for p in w.before.prefixes().filter(|p| !w.spec.prefixes.contains(p)) {
                self.pm().unroute_if_there(*p)?;
            }
        }
        for b in &batch.removes {
            for (p, v) in &b.routes {
                if *v == Some(b.index | SUBSCRIBER_BIT) {
                    self.pm().unroute_if_there(*p)?;
                }
            }
        }
        let mut plans = self.p().plans()?;
        let (mut v4, mut v6) = (false, false);
        let mut used = batch.kept_plans.clone();
        let (new, changed): (Vec<&Write>, Vec<&Write>) = batch
            .writes
            .iter()
            .partition(|w| w.before.entry.in_use == 0);
        for w in &batch.writes {
            v4 |= w.spec.prefixes.iter().any(|p| p.addr().is_ipv4());
            v6 |= w.spec.prefixes.iter().any(|p| p.addr().is_ipv6());
        }
        self.write_new(&new, &mut plans, &mut used)?;
        progress(new.len(), total);
        for (done, w) in changed.iter().enumerate() {
            *used.entry(self.write_one(w, &mut plans)?).or_default() += 1;
            crate::crash::point("subscriber-step");
            if done % 1024 == 0 {
                progress(new.len() + done, total);
            }
        }
        for b in &batch.removes {
            let free = self.freed(&b.entry)?;
            self.put(b.index, &free, Some(&b.entry))?;
        }
        // Every key resolves again where a route changed (a change of plans alone keeps
        // them: the kernel reads the plan through the entry).
        if batch.routes_change() {
            self.pm().subscribers_routed(v4, v6)?;
        }
        // The plans no subscriber has any more, known without reading the table again;
        // in a table placed by hash, each plan's count of subscribers.
        for (slot, p) in &plans {
            match used.get(slot).copied().unwrap_or(0) {
                0 => self.pm().drop_plan(*slot)?,
                n if batch.hashed && super::plan_users(p) != n => {
                    let counted = Policy {
                        prefix_len: n,
                        ..*p
                    };
                    self.pm().rewrite_plan(*slot, &counted)?;
                }
                _ => {}
            }
        }
        self.record_batch(batch);
        self.remember(batch);
        progress(total, total);
        Ok(batch.summary)
    }

    /// Writes the records of prefixes ([`super::prefixes`]) of the subscribers `batch`
    /// wrote and removed; of every subscriber, the file whole, where it read every route.
    fn record_batch(&mut self, batch: &Batch) {
        use super::prefixes::encode;
        let written = batch
            .writes
            .iter()
            .map(|w| (w.before.index, encode(&w.spec.prefixes)));
        let removed = batch.removes.iter().map(|b| (b.index, encode(&[])));
        let mut records: Vec<_> = written.chain(removed).collect();
        if batch.complete {
            let p = &batch.prefixes_before;
            let rewritten = batch.rewritten(p.len() as usize);
            records.extend(
                (1..p.len())
                    .filter(|i| !rewritten[*i as usize] && !p.of_index(*i).is_empty())
                    .map(|i| (i, encode(p.of_index(i)))),
            );
        }
        self.record_prefixes(&mut records, batch.complete);
    }

    /// Saves the subscribers' routes `batch` left ([`super::known`]), for the policy
    /// generation it ended at; the file goes if they cannot be saved.
    fn remember(&self, batch: &Batch) {
        let Some(known) = &self.known else {
            return;
        };
        // No route changed, and the generation did not move: the file is as true as it was.
        if batch.partial {
            return;
        }
        let p = &batch.prefixes_before;
        let rewritten = batch.rewritten(p.len() as usize);
        let kept = (0..p.len())
            .filter(|i| !rewritten[*i as usize])
            .flat_map(|i| p.of_index(i).iter().map(move |net| (*net, i)));
        let written = batch.writes.iter().flat_map(|w| {
            let i = w.before.index;
            w.spec.prefixes.iter().map(move |net| (*net, i))
        });
        let saved = match self.p().config() {
            Ok(config) => known.save(config.policy_gen, kept.chain(written)).is_ok(),
            Err(_) => false,
        };
        if !saved {
            known.drop_file();
        }
    }

    /// Writes new subscribers (no route points at their entries yet, so the kernel meters
    /// nothing with them meanwhile): their plans' slots, then every entry, then every
    /// route, in batches; `used` counts each plan's subscribers.
    fn write_new(
        &mut self,
        new: &[&Write],
        plans: &mut Vec<(u32, Policy)>,
        used: &mut HashMap<u32, u32>,
    ) -> Result<(), SubscriberError> {
        use aya::maps::IterableMap as _;
        if new.is_empty() {
            return Ok(());
        }
        // Their ids and names first: an entry in use always has its record.
        let mut records: Vec<_> = new
            .iter()
            .map(|w| {
                let e = Entry {
                    id: padded(&w.spec.id),
                    name: padded(&w.spec.name),
                    ..Entry::default()
                };
                (w.before.index, super::record::split(w.before.index, &e).1)
            })
            .collect();
        self.records.write_many(&mut records, self.subs.len())?;
        drop(records);
        // The entries made and written a batch at a time: not a million entries' copy.
        let mut entries = Vec::with_capacity(new.len().min(crate::maps::BATCH as usize));
        let mut routes = Vec::with_capacity(2 * new.len());
        for chunk in new.chunks(crate::maps::BATCH as usize) {
            entries.clear();
            for w in chunk {
                let slot = self.plan_slot(&w.plan, plans)?;
                *used.entry(slot).or_default() += 1;
                let index = w.before.index;
                let e = self.entry_for(&w.spec, index, &w.before.entry, slot)?;
                entries.push((index, super::record::split(index, &e).0));
                routes.extend(w.routes_to_write());
            }
            crate::maps::write_batched(self.subs.map(), &entries)
                .map_err(map_err("write the new subscribers"))?;
        }
        crate::crash::point("subscriber-step");
        self.pm().route_many(&routes)?;
        crate::crash::point("subscriber-step");
        Ok(())
    }

    /// The slot of `plan`: one already in `plans`, or a new one added to them.
    fn plan_slot(
        &mut self,
        plan: &Policy,
        plans: &mut Vec<(u32, Policy)>,
    ) -> Result<u32, SubscriberError> {
        if let Some((slot, _)) = plans.iter().find(|(_, p)| same_plan(p, plan)) {
            return Ok(*slot);
        }
        let slot = self.pm().add_plan(plan)?;
        plans.push((slot, *plan));
        Ok(slot)
    }

    /// Writes one subscriber's entry (its cell carried over), then its routes: its plan's
    /// slot.
    fn write_one(
        &mut self,
        w: &Write,
        plans: &mut Vec<(u32, Policy)>,
    ) -> Result<u32, SubscriberError> {
        let slot = self.plan_slot(&w.plan, plans)?;
        let index = w.before.index;
        let entry = self.entry_for(&w.spec, index, &w.before.entry, slot)?;
        self.put(index, &entry, Some(&w.before.entry))?;
        for (p, value) in w.routes_to_write() {
            self.pm().route_value(p, value)?;
        }
        Ok(slot)
    }
}

/// The most subscribers a batch made by lookups moves to other prefixes: more is the
/// whole batch's work ([`SubscriberTable::batch`]).
pub const MOVES_BY_LOOKUP: usize = 64;

/// Whether the subscribers `writes` moves to other prefixes by lookups are few and apart:
/// no prefix of one of them, new or old, overlaps another's. Each is then checked against
/// the tries as they are before the batch ([`SubscriberTable::check_by_lookup`]), which is
/// the end state for it: what it could meet there is no other write's.
fn moves_apart(writes: &[Write]) -> bool {
    let moving: Vec<&Write> = writes.iter().filter(|w| w.moves_by_lookup()).collect();
    if moving.len() > MOVES_BY_LOOKUP {
        return false;
    }
    let all = |w: &Write| -> Vec<IpNet> {
        let mut nets: Vec<IpNet> = w.before.prefixes().copied().collect();
        nets.extend(w.spec.prefixes.iter().copied());
        nets
    };
    let nets: Vec<Vec<IpNet>> = moving.iter().map(|w| all(w)).collect();
    nets.iter().enumerate().all(|(i, a)| {
        nets[i + 1..].iter().all(|b| {
            a.iter()
                .all(|p| b.iter().all(|q| !p.contains(q) && !q.contains(p)))
        })
    })
}

/// The plans' entries of a batch's subscribers: each made once for the last few distinct
/// plans seen (a file has a few plans for a million subscribers), not once a subscriber.
#[derive(Default)]
struct Plans(Vec<(PolicyLimits, Arc<Policy>)>);

impl Plans {
    /// How many distinct plans it keeps.
    const KEPT: usize = 16;

    /// The entry of `spec`'s plan ([`SubscriberSpec::check`]'s).
    fn entry(&mut self, spec: &SubscriberSpec) -> Result<Arc<Policy>, SubscriberError> {
        if let Some((_, p)) = self.0.iter().find(|(l, _)| *l == spec.plan) {
            return Ok(p.clone());
        }
        let p = Arc::new(plan_entry(&spec.id, &spec.plan)?);
        if self.0.len() < Self::KEPT {
            self.0.push((spec.plan, p.clone()));
        }
        Ok(p)
    }
}

/// The entries not in use of a table placed by hash, as a batch gives them to new
/// subscribers: each the first from the subscriber's home not in use nor given already,
/// as a probe finds it, in near constant time however full the table (each entry points
/// at the first one free from it, paths halved as they are followed), where probing
/// entry by entry takes a million subscribers into a table of a million in minutes.
struct Free {
    next: Vec<u32>,
    left: usize,
    room: u32,
}

impl Free {
    fn of(read: &Read) -> Self {
        let room = (read.len as u32).saturating_sub(1);
        let next = (0..read.len as u32)
            .map(|i| match read.at(i).in_use {
                0 => i,
                _ => place::after(i, room),
            })
            .collect();
        // Entry 0 is never given (it is not in `in_use` either).
        let left = (room as usize).saturating_sub(read.in_use.len());
        Self { next, left, room }
    }

    /// The first entry from `home` not in use nor given, now given.
    fn take(&mut self, home: u32) -> Option<u32> {
        if self.left == 0 {
            return None;
        }
        let mut i = home as usize;
        while self.next[i] as usize != i {
            let n = self.next[i] as usize;
            self.next[i] = self.next[n];
            i = n;
        }
        self.next[i] = place::after(i as u32, self.room);
        self.left -= 1;
        Some(i as u32)
    }
}

/// The id an entry holds, up to its padding (`""` if it is not UTF-8, which no spec's id
/// is).
fn id_text(id: &[u8; SUBSCRIBER_ID_BYTES]) -> &str {
    let end = id.iter().position(|&b| b == 0).unwrap_or(id.len());
    std::str::from_utf8(&id[..end]).unwrap_or_default()
}

/// Whether subscriber `entry` (with prefixes `old`) is `spec` already.
fn unchanged(
    spec: &SubscriberSpec,
    plan: &Policy,
    entry: &Entry,
    old: &[IpNet],
    plans: &[(u32, Policy)],
) -> bool {
    let plan_kept = plans
        .iter()
        .any(|(slot, p)| *slot == entry.plan && same_plan(p, plan));
    plan_kept
        && entry.id == padded(&spec.id)
        && entry.name == padded(&spec.name)
        && same_set(old, &spec.prefixes)
}

/// What subscriber `index` may touch, as it is: its prefixes `old`, and the `new` ones.
fn before_of(
    index: u32,
    entry: Entry,
    old: &[IpNet],
    new: &[IpNet],
    routes: &HashMap<IpNet, u32>,
) -> Before {
    let mut touched: Vec<IpNet> = old.to_vec();
    touched.extend(new.iter().filter(|p| !old.contains(p)));
    Before {
        by_lookup: false,
        index,
        entry,
        routes: touched
            .into_iter()
            .map(|p| (p, routes.get(&p).copied()))
            .collect(),
    }
}

/// Refuses an end state where a route is inside (or is) another subscriber's prefix, and
/// a subscriber's prefix inside another subscriber's (the rule of `set`).
///
/// The end state is the routes as read, less those of the subscribers the batch rewrites
/// (and the policies, if `policies` replaces them), under an overlay of the batch's routes
/// and the policies: not a copy of the routes. The routes in force keep the rule, so an end
/// state without a route that is not in force already (the same prefixes, to the same
/// subscribers and policies: a change of plans or names) keeps it too, and is not walked.
fn check_end_state(
    batch: &Batch,
    read: &Read,
    policies: Option<&[IpNet]>,
) -> Result<(), SubscriberError> {
    let rewritten = batch.rewritten(read.len);
    let kept = |v: u32| match v & SUBSCRIBER_BIT {
        0 => policies.is_none(),
        _ => !rewritten
            .get((v & !SUBSCRIBER_BIT) as usize)
            .copied()
            .unwrap_or(false),
    };
    // The policies to be in force (their slots do not matter here: a route without
    // SUBSCRIBER_BIT is a policy's).
    // Made for every route the batch writes: a million not rehashed at every doubling.
    let writes: usize = batch.writes.iter().map(|w| w.spec.prefixes.len()).sum();
    let mut over: HashMap<IpNet, u32> =
        HashMap::with_capacity(policies.map_or(0, <[IpNet]>::len) + writes);
    let mut fresh = false;
    for p in policies.unwrap_or_default() {
        let p = p.trunc();
        fresh |= !matches!(read.routes.get(&p), Some(v) if v & SUBSCRIBER_BIT == 0);
        over.insert(p, 0);
    }
    // For the error only: searched, not indexed.
    let id_of = |v: u32| -> String {
        let i = v & !SUBSCRIBER_BIT;
        batch
            .writes
            .iter()
            .find(|w| w.before.index == i)
            .map(|w| w.spec.id.clone())
            .or_else(|| (i < read.len as u32).then(|| unpadded(&read.at(i).id)))
            .unwrap_or_else(|| "?".to_owned())
    };
    for w in &batch.writes {
        let value = w.before.index | SUBSCRIBER_BIT;
        for p in &w.spec.prefixes {
            let was = read.routes.get(p).copied();
            fresh |= was != Some(value);
            let other = over.insert(*p, value).or_else(|| was.filter(|v| kept(*v)));
            if let Some(other) = other {
                let what = describe(*p, other, &id_of);
                return Err(SubscriberError::Overlap(format!(
                    "{what} is subscriber {}'s prefix too: its traffic would escape a subscriber's bucket",
                    w.spec.id
                )));
            }
        }
    }
    if !fresh {
        return Ok(());
    }
    let end_get = |p: &IpNet| {
        over.get(p)
            .copied()
            .or_else(|| read.routes.get(p).copied().filter(|v| kept(*v)))
    };
    let end = || {
        over.iter().map(|(p, v)| (*p, *v)).chain(
            read.routes
                .iter()
                .filter(|(p, v)| kept(**v) && !over.contains_key(*p))
                .map(|(p, v)| (*p, *v)),
        )
    };
    let lengths = subscriber_lengths(end());
    for (r, v) in end() {
        for len in lengths
            .iter()
            .filter(|l| l.0 == r.addr().is_ipv4() && l.1 < r.prefix_len())
        {
            let Ok(cover) = r.supernet_of_len(len.1) else {
                continue;
            };
            match end_get(&cover) {
                Some(o) if o & SUBSCRIBER_BIT != 0 && o != v => {
                    let what = describe(r, v, &id_of);
                    return Err(SubscriberError::Overlap(format!(
                        "{what} is inside subscriber {}'s prefix {cover}: its traffic would escape that subscriber's bucket",
                        id_of(o)
                    )));
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// `subscriber c1's prefix 10.0.0.0/24` or `policy 10.0.0.0/24`.
fn describe(p: IpNet, value: u32, id_of: &impl Fn(u32) -> String) -> String {
    if value & SUBSCRIBER_BIT != 0 {
        format!("subscriber {}'s prefix {p}", id_of(value))
    } else {
        format!("policy {p}")
    }
}

/// The (IPv4?, length) pairs of the subscribers' prefixes.
fn subscriber_lengths(end: impl Iterator<Item = (IpNet, u32)>) -> Vec<(bool, u8)> {
    let set: HashSet<(bool, u8)> = end
        .filter(|(_, v)| *v & SUBSCRIBER_BIT != 0)
        .map(|(p, _)| (p.addr().is_ipv4(), p.prefix_len()))
        .collect();
    set.into_iter().collect()
}

trait Supernet {
    fn supernet_of_len(&self, len: u8) -> Result<IpNet, ipnet::PrefixLenError>;
}

impl Supernet for IpNet {
    fn supernet_of_len(&self, len: u8) -> Result<IpNet, ipnet::PrefixLenError> {
        IpNet::new(self.addr(), len).map(|n| n.trunc())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each subscriber's prefixes, and none for a policy's route, an index without routes
    /// or one past the last.
    #[test]
    fn prefixes_are_found_by_index() {
        let net = |s: &str| s.parse::<IpNet>().unwrap();
        let routes: HashMap<IpNet, u32> = [
            (net("100.64.0.1/32"), 3 | SUBSCRIBER_BIT),
            (net("fdd7::/56"), 3 | SUBSCRIBER_BIT),
            (net("100.64.0.2/32"), 1 | SUBSCRIBER_BIT),
            (net("10.0.0.0/8"), 5),
            (net("fdd8::/48"), 7 | SUBSCRIBER_BIT),
        ]
        .into_iter()
        .collect();
        let p = Prefixes::of(&routes);
        let mut three = p.of_index(3).to_vec();
        three.sort();
        assert_eq!(three, [net("100.64.0.1/32"), net("fdd7::/56")]);
        assert_eq!(p.of_index(1), [net("100.64.0.2/32")]);
        assert_eq!(p.of_index(7), [net("fdd8::/48")]);
        for none in [0, 2, 5, 8, 1_000_000] {
            assert!(p.of_index(none).is_empty(), "{none}");
        }
    }

    /// The table `all` as read (every entry; or, `made`, none read: a table made by the
    /// change, every entry free).
    fn read_of(all: Vec<Entry>, made: bool) -> Read {
        let len = all.len();
        let all = if made { Vec::new() } else { all };
        Read {
            complete: true,
            in_use: (1..all.len() as u32)
                .filter(|&i| all[i as usize].in_use != 0)
                .collect(),
            all,
            len,
            routes: HashMap::new(),
            prefixes: Prefixes::default(),
            plans: Vec::new(),
        }
    }

    /// [`Free::take`] gives what probing entry by entry would: the first from the home
    /// not in use nor given, wrapping; none once all are given.
    #[test]
    fn free_entries_are_given_as_a_probe_finds_them() {
        let room = 64u32;
        let mut all = vec![Entry::default(); room as usize + 1];
        for i in (1..=room).filter(|i| i % 3 == 0 || i % 7 == 0) {
            all[i as usize].in_use = 1;
        }
        free_as_probed(all, false);
        // A table made by the change: none read, every entry free, all given.
        free_as_probed(vec![Entry::default(); room as usize + 1], true);
    }

    fn free_as_probed(all: Vec<Entry>, made: bool) {
        let room = all.len() as u32 - 1;
        let mut given = all.iter().map(|e| e.in_use != 0).collect::<Vec<_>>();
        let mut free = Free::of(&read_of(all, made));
        let mut seed = 12345u64;
        loop {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
            let home = (seed >> 33) as u32 % room + 1;
            let mut want = None;
            let mut i = home;
            for _ in 0..room {
                if !given[i as usize] {
                    want = Some(i);
                    break;
                }
                i = place::after(i, room);
            }
            let got = free.take(home);
            assert_eq!(got, want, "from {home}");
            match got {
                Some(i) => given[i as usize] = true,
                None => break,
            }
        }
        assert!(given.iter().skip(1).all(|g| *g));
    }
}

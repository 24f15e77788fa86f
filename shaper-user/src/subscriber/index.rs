//! The daemon's index of one attachment's subscribers ([`Index`]), so that a RADIUS CoA
//! at 100,000 subscribers reads one entry, not the whole table, and a Disconnect that
//! entry and a lookup of each of its prefixes, not the tries: built from one batched
//! read of the entries and one of the policy slots, and kept up to date by the changes
//! made through it. It is only as good as the host's change log says (`crate::change::Kept`
//! drops it when another change may have touched its attachment); the
//! entry it names is read and checked against it before anything is written.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use ipnet::IpNet;
use shaper_common::{
    config::PolicyLimits,
    maps::{Policy, SUBSCRIBER_BIT},
};

use super::{
    Before, Changed, SubscriberError, SubscriberTable, map_err, plan_entry, same_plan, unpadded,
};

/// One attachment's subscribers as last read, and what changes made through it did.
#[derive(Debug, Default)]
pub struct Index {
    /// Each subscriber's index in the map, by id.
    ids: HashMap<String, u32>,
    /// Each index's plan slot.
    plan_of: HashMap<u32, u32>,
    /// How many subscribers each plan slot has.
    users: HashMap<u32, u32>,
    /// Every policy slot in use with its entry (plans and prefix policies), as
    /// [`crate::policy::PolicyTable::slots`] reads them: where a new plan goes, and what the journal
    /// puts back.
    slots: BTreeMap<u32, Policy>,
    /// Each index's prefixes (its routes in the tries), once read: the tries are read
    /// whole for them, at the listener's start ([`SubscriberTable::index_routes`]) or at
    /// the first Disconnect after the index was read again, not for a CoA.
    routes: Option<HashMap<u32, Vec<IpNet>>>,
}

impl Index {
    /// Whether subscriber `id` is set.
    pub fn contains(&self, id: &str) -> bool {
        self.ids.contains_key(id)
    }

    /// How many subscribers it holds.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Every policy slot in use with its entry, in slot order (as [`crate::policy::PolicyTable::slots`]).
    pub fn slots(&self) -> Vec<(u32, Policy)> {
        self.slots.iter().map(|(s, p)| (*s, *p)).collect()
    }

    /// The slot of the plan whose entry is `entry`, if one is in force.
    fn plan_slot(&self, entry: &Policy) -> Option<u32> {
        self.slots
            .iter()
            .find(|(_, p)| p.plan != 0 && same_plan(p, entry))
            .map(|(slot, _)| *slot)
    }

    /// Subscriber `index` moved from plan slot `from` to `to`: whether `from` has no
    /// subscriber left.
    fn moved(&mut self, index: u32, from: u32, to: u32) -> bool {
        self.plan_of.insert(index, to);
        *self.users.entry(to).or_default() += 1;
        self.left(from)
    }

    /// One subscriber left plan slot `slot`: whether it has none now.
    fn left(&mut self, slot: u32) -> bool {
        let n = self.users.entry(slot).or_default();
        *n = n.saturating_sub(1);
        if *n > 0 {
            return false;
        }
        self.users.remove(&slot);
        true
    }

    /// Subscriber `before` was removed (by [`SubscriberTable::del`], which freed its plan's
    /// slot if it was the last on it, and counted it off otherwise: `plan`, the plan's
    /// entry as it is now, its count of subscribers with it).
    pub fn forget(&mut self, before: &Before, plan: Option<Policy>) {
        self.ids.remove(&unpadded(&before.entry.id));
        self.plan_of.remove(&before.index);
        if let Some(routes) = self.routes.as_mut() {
            routes.remove(&before.index);
        }
        let slot = before.entry.plan;
        if self.left(slot) {
            self.slots.remove(&slot);
        } else if let Some(p) = plan.filter(|p| p.in_use != 0) {
            self.slots.insert(slot, p);
        }
    }
}

impl SubscriberTable {
    /// The index of its subscribers: the entries read in batches once, and the policy
    /// slots.
    pub fn index(&self) -> Result<Index, SubscriberError> {
        let mut index = Index {
            slots: self.p().slots()?.into_iter().collect(),
            ..Index::default()
        };
        for (i, s) in self.entries()? {
            index.ids.insert(unpadded(&s.id), i);
            index.plan_of.insert(i, s.plan);
            *index.users.entry(s.plan).or_default() += 1;
        }
        Ok(index)
    }

    /// For a change of subscriber `id`'s plan alone ([`SubscriberTable::set_plan`]), read
    /// through `index`: its entry as it is (to journal: its routes are not touched) and
    /// its plan in force; one lookup of the entry, no table or trie read.
    /// [`SubscriberError::Stale`] if the entry is not what `index` says (build it again).
    pub fn plan_before(
        &self,
        index: &Index,
        id: &str,
    ) -> Result<(Before, PolicyLimits), SubscriberError> {
        let &i = index
            .ids
            .get(id)
            .ok_or_else(|| SubscriberError::NotFound(id.to_owned()))?;
        let entry = self.entry(i)?;
        if entry.in_use == 0
            || unpadded(&entry.id) != id
            || index.plan_of.get(&i) != Some(&entry.plan)
        {
            return Err(SubscriberError::Stale(id.to_owned()));
        }
        let plan = index
            .slots
            .get(&entry.plan)
            .filter(|p| p.plan != 0)
            .map(super::plan_limits)
            .unwrap_or_default();
        let before = Before {
            index: i,
            entry,
            routes: Vec::new(),
            by_lookup: true,
        };
        Ok((before, plan))
    }

    /// Reads every subscriber's prefixes into `index` (the tries read whole, in
    /// batches), if it has none yet.
    pub fn index_routes(&self, index: &mut Index) -> Result<(), SubscriberError> {
        if index.routes.is_some() {
            return Ok(());
        }
        let mut routes: HashMap<u32, Vec<IpNet>> = HashMap::new();
        for (net, i) in self.p().subscriber_routes()? {
            routes.entry(i).or_default().push(net);
        }
        index.routes = Some(routes);
        Ok(())
    }

    /// For the removal of subscriber `id` ([`SubscriberTable::del_indexed`]), read
    /// through `index` (which must hold the prefixes: [`SubscriberTable::index_routes`]):
    /// its entry and routes as they are, to journal; one lookup of the entry and one of
    /// each of its prefixes, no table or trie read. [`SubscriberError::Stale`] if the
    /// entry or a route is not what `index` says (build it again).
    pub fn del_before(&self, index: &Index, id: &str) -> Result<Before, SubscriberError> {
        let (before, _) = self.plan_before(index, id)?;
        let stale = || SubscriberError::Stale(id.to_owned());
        let nets = index
            .routes
            .as_ref()
            .ok_or_else(stale)?
            .get(&before.index)
            .map_or(&[][..], Vec::as_slice);
        let value = before.index | SUBSCRIBER_BIT;
        // A subscriber's prefix is inside no other's, and no other's or a policy's is
        // inside it: the lookup of the prefix itself is its own route, or it has none.
        if nets
            .iter()
            .any(|net| self.p().longest_route(*net) != Some(value))
        {
            return Err(stale());
        }
        Ok(Before {
            routes: nets.iter().map(|net| (*net, Some(value))).collect(),
            ..before
        })
    }

    /// [`Self::del_before`] from the subscriber's record of prefixes
    /// ([`super::prefixes`]), if it holds them all: `index` need not hold the prefixes,
    /// and the tries are not read for them. `None` where the record cannot be trusted, or
    /// the entry is not what `index` says.
    pub fn del_before_recorded(&self, index: &Index, id: &str) -> Option<Before> {
        let (before, _) = self.plan_before(index, id).ok()?;
        let nets = self.recorded_prefixes(before.index, &before.entry).ok()??;
        let value = Some(before.index | SUBSCRIBER_BIT);
        Some(Before {
            routes: nets.into_iter().map(|net| (net, value)).collect(),
            ..before
        })
    }

    /// Removes the subscriber `before` read (by [`SubscriberTable::del_before`]) with
    /// [`SubscriberTable::del`]: its routes, then its entry, then its plan's slot if it
    /// was the last on it (its count, in a table placed by hash: no table read). `index`
    /// follows, with the plan's entry as it is now.
    pub fn del_indexed(
        &mut self,
        index: &mut Index,
        before: &Before,
    ) -> Result<Changed, SubscriberError> {
        let done = self.del(before)?;
        index.forget(before, Some(self.plan_now(before.entry.plan)?));
        Ok(done)
    }

    /// Gives the subscriber `before` read (by [`SubscriberTable::plan_before`]) the plan
    /// `plan`, its prefixes and name untouched: one write of its entry, its cell carried
    /// over (no refill), a new plan's slot written first, the old plan's slot freed if
    /// `index` counts no one else on it. `index` follows every write.
    pub fn set_plan(
        &mut self,
        index: &mut Index,
        before: &Before,
        plan: &PolicyLimits,
    ) -> Result<Changed, SubscriberError> {
        let entry_plan = plan_entry(&unpadded(&before.entry.id), plan)?;
        let slot = match index.plan_slot(&entry_plan) {
            Some(slot) => slot,
            None => {
                let used: BTreeSet<u32> = index.slots.keys().copied().collect();
                let slot = self.pm().add_plan_among(&entry_plan, &used)?;
                index.slots.insert(slot, entry_plan);
                slot
            }
        };
        let old = before.entry.plan;
        if slot == old {
            return Ok(Changed::Unchanged);
        }
        // The kernel's entry alone: its id and name are not touched.
        let now = self
            .subs
            .get(&before.index, 0)
            .map_err(map_err("read the subscribers"))?;
        self.subs
            .set(
                before.index,
                shaper_common::maps::Subscriber { plan: slot, ..now },
                0,
            )
            .map_err(map_err("write a subscriber's plan"))?;
        crate::crash::point("subscriber-step");
        let last = index.moved(before.index, old, slot);
        if self.hashed()? {
            // The counts in the plans' entries, and the index's copies of them (what the
            // journal of the next change keeps).
            self.plan_joined(slot)?;
            self.plan_left(old)?;
            for s in [slot, old] {
                match self.p().slot(s)? {
                    p if p.in_use != 0 => index.slots.insert(s, p),
                    _ => index.slots.remove(&s),
                };
            }
        } else if last {
            self.pm().drop_plan(old)?;
            index.slots.remove(&old);
        }
        Ok(Changed::Changed)
    }

    /// The entry of plan slot `slot` as it is now (after a removal: what
    /// [`Index::forget`] keeps).
    pub fn plan_now(&self, slot: u32) -> Result<Policy, SubscriberError> {
        Ok(self.p().slot(slot)?)
    }
}

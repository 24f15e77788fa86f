//! Subscribers: an id, an optional name, prefixes of either family and a plan; every frame
//! of any of its prefixes (in one attachment's direction) draws from one bucket, the
//! subscriber's cell in `SHAPER_SUBS` ([`Subscriber`]).
//!
//! A plan is a policy slot marked as one ([`Policy::plan`]): what a policy carries, its
//! aggregate being the subscriber's rate and burst and its per-source limit the per-address
//! one; identical plans share a slot, freed when no subscriber points at it. A subscriber's
//! prefixes are routes of the prefix tries whose value is its index with `SUBSCRIBER_BIT`.
//!
//! A change writes that subscriber alone: its entry, its routes, its plan's slot if the plan
//! is new. A plan change is one write of its entry (its keys keep the cached route, and the
//! kernel carries its cell over to the new rate: no refill); a change of its prefixes moves
//! the policy generation on, as a policy change does.
//!
//! Overlaps that would let a subscriber's traffic escape its bucket are refused: a prefix of
//! another subscriber or a prefix policy equal to or inside one of its prefixes, and its
//! prefix inside another subscriber's. A subscriber's prefix inside a prefix policy is
//! allowed: the longest prefix wins, and it is the subscriber's.

mod sync;

use std::borrow::BorrowMut;

use aya::maps::{Array, MapData, MapError};
use ipnet::IpNet;
use shaper_common::{
    config::PolicyLimits,
    maps::{
        ACTION_LIMIT, MODE_SHAPE, Outcomes, PIN_SUBSCRIBERS, Policy, SUBSCRIBER_BIT,
        SUBSCRIBER_ID_BYTES, SUBSCRIBER_NAME_BYTES, Subscriber,
    },
};

use crate::{
    maps::{Pinned, PinnedMapError},
    policy::{PolicyError, PolicyTable, table::keyed_whole},
};

pub use sync::{Batch, Summary};

#[derive(Debug, thiserror::Error)]
pub enum SubscriberError {
    #[error("invalid subscriber id '{0}': 1 to 32 bytes of letters, digits and . _ - : /")]
    Id(String),
    #[error("invalid subscriber name '{0}': at most 24 bytes, no control characters")]
    Name(String),
    #[error("subscriber {0} has no prefix")]
    NoPrefix(String),
    #[error("{prefix} is listed twice")]
    Duplicate { prefix: IpNet },
    #[error("{prefix} is longer than the /{key_len} keys are masked to, so it could never match")]
    LongerThanKey { prefix: IpNet, key_len: u32 },
    #[error("invalid plan of subscriber {id}: {reason}")]
    Plan { id: String, reason: String },
    #[error("{0}")]
    Overlap(String),
    #[error("no subscriber {0}")]
    NotFound(String),
    #[error(
        "no room for another subscriber ({room} in use, the --max-subscribers of the attachment); detach and attach again with a larger --max-subscribers"
    )]
    Full { room: u32 },
    #[error("cannot {what}")]
    Map { what: String, source: MapError },
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error(transparent)]
    Pinned(#[from] PinnedMapError),
}

fn map_err(what: impl Into<String>) -> impl FnOnce(MapError) -> SubscriberError {
    let what = what.into();
    move |source| SubscriberError::Map { what, source }
}

/// A subscriber as an operator states it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubscriberSpec {
    pub id: String,
    /// Empty for none.
    pub name: String,
    pub prefixes: Vec<IpNet>,
    /// Its plan: `aggregate_*` the subscriber's rate and burst, `rate_bps` and
    /// `burst_bytes` each address's (or each key's: a /64 in IPv6 by default).
    pub plan: PolicyLimits,
}

/// A subscriber in force: its index, what it was set to, and what its frames became.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Installed {
    pub index: u32,
    pub spec: SubscriberSpec,
    pub plan_slot: u32,
    pub outcomes: Outcomes,
    /// Of its passed frames, those its excess rate passed (yellow, marked): packets, bytes.
    pub yellow: (u64, u64),
}

/// What a change did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Changed {
    Added,
    Changed,
    Unchanged,
    Removed,
}

fn check_id(id: &str) -> Result<(), SubscriberError> {
    let ok = !id.is_empty()
        && id.len() <= SUBSCRIBER_ID_BYTES
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-:/".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(SubscriberError::Id(id.to_owned()))
    }
}

fn check_name(name: &str) -> Result<(), SubscriberError> {
    if name.len() > SUBSCRIBER_NAME_BYTES || name.chars().any(char::is_control) {
        return Err(SubscriberError::Name(name.to_owned()));
    }
    Ok(())
}

fn padded<const N: usize>(s: &str) -> [u8; N] {
    let mut out = [0u8; N];
    out[..s.len()].copy_from_slice(s.as_bytes());
    out
}

fn unpadded(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

impl SubscriberSpec {
    /// Checks the subscriber for an attachment whose keys are masked to `key_prefixes`
    /// (IPv4, IPv6 lengths): its plan's policy entry.
    pub fn check(&self, key_prefixes: (u32, u32)) -> Result<Policy, SubscriberError> {
        check_id(&self.id)?;
        check_name(&self.name)?;
        if self.prefixes.is_empty() {
            return Err(SubscriberError::NoPrefix(self.id.clone()));
        }
        for (i, p) in self.prefixes.iter().enumerate() {
            if self.prefixes[..i].contains(p) {
                return Err(SubscriberError::Duplicate { prefix: *p });
            }
            let key_len = match p {
                IpNet::V4(_) => key_prefixes.0,
                IpNet::V6(_) => key_prefixes.1,
            };
            if u32::from(p.prefix_len()) > key_len && !keyed_whole(p) {
                return Err(SubscriberError::LongerThanKey {
                    prefix: *p,
                    key_len,
                });
            }
        }
        plan_entry(&self.id, &self.plan)
    }
}

/// Checks a plan on its own (a configuration file's `[plan.NAME]`): why it cannot be one.
pub fn check_plan(plan: &PolicyLimits) -> Result<(), String> {
    match plan_entry("", plan) {
        Ok(_) => Ok(()),
        Err(SubscriberError::Plan { reason, .. }) => Err(reason),
        Err(e) => Err(e.to_string()),
    }
}

/// The plan's policy entry: a limit with a subscriber's rate (the aggregate), enforced or
/// monitored; its excess rate, if any, is the subscriber's (a committed and a peak rate),
/// not each address's.
fn plan_entry(id: &str, plan: &PolicyLimits) -> Result<Policy, SubscriberError> {
    let refuse = |reason: &str| SubscriberError::Plan {
        id: id.to_owned(),
        reason: reason.to_owned(),
    };
    if plan.action != ACTION_LIMIT || plan.aggregate_rate_bps == 0 {
        return Err(refuse("a plan limits: it needs a rate"));
    }
    if plan.mode == MODE_SHAPE {
        return Err(refuse(
            "shape mode is not for subscribers yet (their bucket is policed)",
        ));
    }
    if plan.meter2.packet_rate != 0 {
        return Err(refuse("a packet rate is not for subscribers yet"));
    }
    let mut entry = Policy::new(4, [0; 16], 0, plan).map_err(|e| refuse(&e.to_string()))?;
    entry.family = 0;
    entry.plan = 1;
    Ok(entry)
}

/// What a plan's entry says of its limits (as [`SubscriberSpec::plan`]).
fn plan_limits(p: &Policy) -> PolicyLimits {
    p.limits()
}

/// A subscriber's entry and routes as they were before a change, to put back
/// (`crate::journal`).
#[derive(Clone, Debug)]
pub struct Before {
    pub index: u32,
    pub entry: Subscriber,
    /// Each prefix the change may touch, with the value it routed to (`None`: no route).
    pub routes: Vec<(IpNet, Option<u32>)>,
}

/// An attachment's subscribers: their map, and the policy maps their plans and routes live
/// in.
pub struct SubscriberTable<P = PolicyTable> {
    subs: Array<MapData, Subscriber>,
    policies: P,
}

impl SubscriberTable {
    /// The maps of an attachment's pins as opened (no pin is opened again).
    pub fn of(pinned: &Pinned) -> Result<Self, SubscriberError> {
        Ok(Self {
            subs: pinned.map(PIN_SUBSCRIBERS)?,
            policies: PolicyTable::of(pinned)?,
        })
    }
}

impl<P: BorrowMut<PolicyTable>> SubscriberTable<P> {
    /// The subscribers' map `subs` beside the policy maps `policies` (of a loaded object:
    /// `test_run` and benchmarks).
    pub fn new(subs: Array<MapData, Subscriber>, policies: P) -> Self {
        Self { subs, policies }
    }

    fn p(&self) -> &PolicyTable {
        self.policies.borrow()
    }

    fn pm(&mut self) -> &mut PolicyTable {
        self.policies.borrow_mut()
    }

    /// Subscribers it has room for.
    fn room(&self) -> u32 {
        self.subs.len().saturating_sub(1)
    }

    /// Every index in use with its entry, read in batches.
    fn entries(&self) -> Result<Vec<(u32, Subscriber)>, SubscriberError> {
        use aya::maps::IterableMap as _;
        Ok(
            crate::maps::read_batched::<u32, Subscriber>(self.subs.map())
                .map_err(map_err("read the subscribers"))?
                .into_iter()
                .filter(|(i, s)| *i != 0 && s.in_use != 0)
                .collect(),
        )
    }

    fn find(&self, id: &str) -> Result<Option<(u32, Subscriber)>, SubscriberError> {
        Ok(self
            .entries()?
            .into_iter()
            .find(|(_, s)| unpadded(&s.id) == id))
    }

    /// Every subscriber in force, by id.
    pub fn list(&self) -> Result<Vec<Installed>, SubscriberError> {
        let routes = self.p().subscriber_routes()?;
        let plans = self.p().plans()?;
        let mut found: Vec<Installed> = self
            .entries()?
            .into_iter()
            .map(|(index, s)| {
                let mut prefixes: Vec<IpNet> = routes
                    .iter()
                    .filter(|(_, i)| *i == index)
                    .map(|(net, _)| *net)
                    .collect();
                prefixes.sort();
                let plan = plans
                    .iter()
                    .find(|(slot, _)| *slot == s.plan)
                    .map(|(_, p)| plan_limits(p))
                    .unwrap_or_default();
                Installed {
                    index,
                    spec: SubscriberSpec {
                        id: unpadded(&s.id),
                        name: unpadded(&s.name),
                        prefixes,
                        plan,
                    },
                    plan_slot: s.plan,
                    outcomes: s.outcomes,
                    yellow: (s.yellow_packets, s.yellow_bytes),
                }
            })
            .collect();
        found.sort_by(|a, b| a.spec.id.cmp(&b.spec.id));
        Ok(found)
    }

    /// The subscriber `id`.
    pub fn get(&self, id: &str) -> Result<Installed, SubscriberError> {
        check_id(id)?;
        self.list()?
            .into_iter()
            .find(|s| s.spec.id == id)
            .ok_or_else(|| SubscriberError::NotFound(id.to_owned()))
    }

    /// What [`SubscriberTable::set`] of `spec` (or `del` with `None`) of subscriber `id`
    /// may touch, as it is: to journal before writing. Checks `spec` as `set` would.
    pub fn before(
        &self,
        id: &str,
        spec: Option<&SubscriberSpec>,
    ) -> Result<Before, SubscriberError> {
        let (index, entry) = match self.find(id)? {
            Some(found) => found,
            None if spec.is_none() => return Err(SubscriberError::NotFound(id.to_owned())),
            None => (self.free_index()?, Subscriber::default()),
        };
        let routes = self.p().routes()?;
        let mut touched: Vec<IpNet> = routes
            .iter()
            .filter(|(_, v)| *v == index | SUBSCRIBER_BIT)
            .map(|(net, _)| *net)
            .collect();
        for p in spec.iter().flat_map(|s| &s.prefixes) {
            if !touched.contains(p) {
                touched.push(*p);
            }
        }
        let routes = touched
            .into_iter()
            .map(|net| {
                let value = routes.iter().find(|(r, _)| *r == net).map(|(_, v)| *v);
                (net, value)
            })
            .collect();
        Ok(Before {
            index,
            entry,
            routes,
        })
    }

    fn free_index(&self) -> Result<u32, SubscriberError> {
        let used: std::collections::BTreeSet<u32> =
            self.entries()?.into_iter().map(|(i, _)| i).collect();
        (1..=self.room())
            .find(|i| !used.contains(i))
            .ok_or(SubscriberError::Full { room: self.room() })
    }

    /// Refuses a prefix of `spec` (subscriber `index`) that would let traffic escape a
    /// subscriber's bucket (see the module docs).
    fn check_overlaps(&self, spec: &SubscriberSpec, index: u32) -> Result<(), SubscriberError> {
        let names: Vec<(u32, String)> = self
            .entries()?
            .into_iter()
            .map(|(i, s)| (i, unpadded(&s.id)))
            .collect();
        let name = |v: u32| {
            names
                .iter()
                .find(|(i, _)| *i == v & !SUBSCRIBER_BIT)
                .map_or_else(|| "?".to_owned(), |(_, id)| id.clone())
        };
        for (route, value) in self.p().routes()? {
            if value == index | SUBSCRIBER_BIT {
                continue;
            }
            let theirs = value & SUBSCRIBER_BIT != 0;
            for p in &spec.prefixes {
                let what = if theirs {
                    format!("subscriber {}'s prefix {route}", name(value))
                } else {
                    format!("policy {route}")
                };
                if p.contains(&route) {
                    return Err(SubscriberError::Overlap(format!(
                        "{what} is inside subscriber {}'s prefix {p}: its traffic would escape the subscriber's bucket",
                        spec.id
                    )));
                }
                if theirs && route.contains(p) {
                    return Err(SubscriberError::Overlap(format!(
                        "subscriber {}'s prefix {p} is inside {what}: its traffic would escape that subscriber's bucket",
                        spec.id
                    )));
                }
            }
        }
        Ok(())
    }

    /// Adds subscriber `spec`, or replaces the subscriber of its id: its entry, its routes
    /// and its plan's slot if new. `before` is what [`SubscriberTable::before`] read.
    pub fn set(
        &mut self,
        spec: &SubscriberSpec,
        before: &Before,
    ) -> Result<Changed, SubscriberError> {
        let config = self.p().config()?;
        let entry_plan = spec.check((config.prefix_v4, config.prefix_v6))?;
        let index = before.index;
        self.check_overlaps(spec, index)?;
        let old = before.entry;
        let old_prefixes: Vec<IpNet> = before
            .routes
            .iter()
            .filter(|(_, v)| *v == Some(index | SUBSCRIBER_BIT))
            .map(|(net, _)| *net)
            .collect();
        let plans = self.p().plans()?;
        let plan = match plans.iter().find(|(_, p)| *p == entry_plan) {
            Some((slot, _)) => *slot,
            None => self.pm().add_plan(&entry_plan)?,
        };
        let same_prefixes = old_prefixes.len() == spec.prefixes.len()
            && spec.prefixes.iter().all(|p| old_prefixes.contains(p));
        // The cell and counts as they are now (the kernel keeps charging meanwhile).
        let now = match old.in_use {
            0 => Subscriber::default(),
            _ => self
                .subs
                .get(&index, 0)
                .map_err(map_err("read the subscribers"))?,
        };
        let entry = Subscriber {
            plan,
            in_use: 1,
            id: padded(&spec.id),
            name: padded(&spec.name),
            ..now
        };
        if old.in_use != 0
            && (entry.plan, entry.id, entry.name) == (old.plan, old.id, old.name)
            && same_prefixes
        {
            return Ok(Changed::Unchanged);
        }
        // The entry first: a new subscriber's before any route points at it.
        self.subs
            .set(index, entry, 0)
            .map_err(map_err(format!("write subscriber {}", spec.id)))?;
        crate::crash::point("subscriber-step");
        if !same_prefixes {
            for p in &spec.prefixes {
                self.pm().route_value(*p, index | SUBSCRIBER_BIT)?;
            }
            for p in old_prefixes.iter().filter(|p| !spec.prefixes.contains(p)) {
                self.pm().unroute_if_there(*p)?;
            }
            let family = |v4: bool| spec.prefixes.iter().any(|p| p.addr().is_ipv4() == v4);
            self.pm().subscribers_routed(family(true), family(false))?;
        }
        if old.in_use != 0 && old.plan != plan {
            self.drop_plan_if_unused(old.plan)?;
        }
        Ok(if old.in_use == 0 {
            Changed::Added
        } else {
            Changed::Changed
        })
    }

    /// Removes subscriber `id` (as `before` read it): its routes, then its entry, then its
    /// plan if no other subscriber has it.
    pub fn del(&mut self, before: &Before) -> Result<Changed, SubscriberError> {
        for (p, v) in &before.routes {
            if *v == Some(before.index | SUBSCRIBER_BIT) {
                self.pm().unroute_if_there(*p)?;
            }
        }
        self.pm().subscribers_routed(false, false)?;
        crate::crash::point("subscriber-step");
        self.subs
            .set(before.index, Subscriber::default(), 0)
            .map_err(map_err("clear a subscriber"))?;
        self.drop_plan_if_unused(before.entry.plan)?;
        Ok(Changed::Removed)
    }

    fn drop_plan_if_unused(&mut self, slot: u32) -> Result<(), SubscriberError> {
        if self.entries()?.iter().all(|(_, s)| s.plan != slot) {
            self.pm().drop_plan(slot)?;
        }
        Ok(())
    }

    /// Puts back what `before` read: the entry (its cell as it was then), and each route.
    /// The policy generation moves on so every key resolves again.
    pub fn restore(&mut self, before: &Before) -> Result<(), SubscriberError> {
        self.subs
            .set(before.index, before.entry, 0)
            .map_err(map_err("put a subscriber back"))?;
        for (p, v) in &before.routes {
            match v {
                Some(v) => self.pm().route_value(*p, *v)?,
                None => self.pm().unroute_if_there(*p)?,
            }
        }
        self.pm().subscribers_routed(false, false)?;
        Ok(())
    }
}

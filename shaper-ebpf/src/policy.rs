//! Which policy a source falls under.
//!
//! The prefix tries are consulted only when a source is new or the policies have changed
//! since it was last resolved: the slot found is cached in the source's state together
//! with the generation it was found under (`SourceState::policy`), and the per-packet path
//! compares one number. Reading a slot's policy is an array access, not a search.

use aya_ebpf::maps::lpm_trie::Key;
use shaper_common::{
    gcra::{Limit, ticks_from_ns},
    maps::{
        ACTION_LIMIT, Admission, Cell, Config, DEFAULT_SLOT, Ipv4Key, Ipv6Key, METER2_EXCESS,
        METER2_PACKETS, MODE_MONITOR, MODE_SHAPE, Meter2, SUBSCRIBER_BIT, SourceState,
    },
};

use crate::maps::{AGGREGATES, POLICIES, PREFIXES_V4, PREFIXES_V6, SUBSCRIBERS};

/// What to do with a source's packet.
#[derive(Clone, Copy)]
pub struct Rule<'a> {
    /// `ACTION_*`.
    pub action: u32,
    /// Count what would be dropped, drop nothing.
    pub monitor: bool,
    /// Shaping (`MODE_SHAPE`, with `ACTION_LIMIT`): how far past the burst a packet may
    /// be held back, in ticks (the interface's horizon); 0 when policing.
    pub slack: u64,
    pub limit: &'a Limit,
    /// The prefix's shared cell, null if the policy has none, and its limit (the
    /// per-source one when there is none). Not an `Option` of the pair: LLVM leaves the
    /// pointer of a `None` undefined and may spill it, which the verifier refuses.
    pub aggregate_cell: *mut Cell,
    pub aggregate_limit: &'a Limit,
    /// The second meter (`meter2`): excess rate and packet rate, if it has them.
    pub meter2: &'a Meter2,
    /// Whether a key's own cell is charged beside the aggregate: false for a plan whose
    /// per-address limit is the whole plan (`Policy::per_address_is_whole`), which never
    /// refuses what the subscriber's buckets pass. Read by `meter::shaper_subscriber`
    /// alone (a prefix policy's frame charges both cells whatever its limits).
    pub per_key: bool,
}

/// The slot of the longest prefix policy covering an IPv4 key, or the default; no search
/// while the family has no prefix policy.
#[inline(always)]
pub fn slot_v4(key: &Ipv4Key, config: &Config) -> u32 {
    if config.prefixes_v4 == 0 {
        return DEFAULT_SLOT;
    }
    PREFIXES_V4
        .get(Key::new(32, *key))
        .copied()
        .unwrap_or(DEFAULT_SLOT)
}

/// The slot of the longest prefix policy covering an IPv6 key, or the default.
#[inline(always)]
pub fn slot_v6(key: &Ipv6Key, config: &Config) -> u32 {
    if config.prefixes_v6 == 0 {
        return DEFAULT_SLOT;
    }
    PREFIXES_V6
        .get(Key::new(128, *key))
        .copied()
        .unwrap_or(DEFAULT_SLOT)
}

/// The cached-policy word of a key resolved to `value` (a policy slot, or a subscriber
/// with `SUBSCRIBER_BIT`) under `config`'s generation.
#[inline(always)]
pub fn cache_word(config: &Config, value: u32) -> u64 {
    (u64::from(config.policy_gen) << 32) | u64::from(value)
}

/// Whether a trie value is a subscriber's (`SUBSCRIBER_BIT`), not a policy slot.
#[inline(always)]
pub fn is_subscriber(value: u32) -> bool {
    value & SUBSCRIBER_BIT != 0
}

/// The policy slot of a trie value: a slot is itself; a subscriber's is its plan's (read
/// on every frame: a plan change is one write of the subscriber's entry), or the default
/// if the index holds no subscriber (deleted while its keys still cache it).
#[inline(always)]
pub fn slot_of(value: u32) -> u32 {
    if !is_subscriber(value) {
        return value;
    }
    match SUBSCRIBERS.get(value & !SUBSCRIBER_BIT) {
        Some(s) if s.in_use != 0 => s.plan,
        _ => DEFAULT_SLOT,
    }
}

/// The subscriber entry of a trie value, null unless it is a subscriber's in use.
#[inline(always)]
pub fn subscriber(value: u32) -> *mut shaper_common::maps::Subscriber {
    if !is_subscriber(value) {
        return core::ptr::null_mut();
    }
    match SUBSCRIBERS.get_ptr_mut(value & !SUBSCRIBER_BIT) {
        // SAFETY: a live map value.
        Some(s) if unsafe { (*s).in_use } != 0 => s,
        _ => core::ptr::null_mut(),
    }
}

/// The rule of a subscriber's frame (`value` has `SUBSCRIBER_BIT`), its plan's slot, the
/// subscriber's second cell and its entry: its plan's rule with the subscriber's cell in
/// the aggregate's place, so every prefix of the subscriber draws from one bucket; the
/// default's if it is gone (the entry null). The second cell (`Subscriber::excess`) is
/// null when the rule has no aggregate cell; whether it is used, and as what, [`has_excess`]
/// and [`has_packets`] say. The entry is what its frames are counted in, looked up once.
#[inline(always)]
pub fn subscriber_rule(
    config: &Config,
    value: u32,
) -> (
    Rule<'_>,
    u32,
    *mut Cell,
    *mut shaper_common::maps::Subscriber,
) {
    let s = subscriber(value);
    if s.is_null() {
        return (
            rule(config, DEFAULT_SLOT),
            DEFAULT_SLOT,
            core::ptr::null_mut(),
            s,
        );
    }
    // SAFETY: a live map value.
    let slot = unsafe { (*s).plan };
    // The subscriber's cell in the aggregate's place: the plan's own (`AGGREGATES`) is
    // never looked up for a subscriber's frame.
    // SAFETY: a live map value.
    let r = rule_with(config, slot, |_| unsafe { &raw mut (*s).cell });
    if r.aggregate_cell.is_null() {
        return (r, slot, core::ptr::null_mut(), s);
    }
    // SAFETY: a live map value.
    (r, slot, unsafe { &raw mut (*s).excess }, s)
}

/// Whether a subscriber's frame has an excess rate: [`subscriber_rule`]'s excess cell and
/// its plan's excess limit. Not folded into that cell's pointer (null when none): LLVM
/// would mask the pointer with the flag, arithmetic the verifier refuses on a pointer.
#[inline(always)]
pub fn has_excess(rule: &Rule, excess: *mut Cell) -> bool {
    !excess.is_null() && rule.meter2.meters & METER2_EXCESS != 0
}

/// Whether a subscriber's frame has a packet rate: [`subscriber_rule`]'s second cell is
/// then its packet bucket (one per subscriber, all its prefixes and both families), in the
/// excess rate's place: userspace refuses a plan with both, the subscriber's entry having
/// room for one second bucket.
#[inline(always)]
pub fn has_packets(rule: &Rule, second: *mut Cell) -> bool {
    !second.is_null() && rule.meter2.meters & METER2_PACKETS != 0
}

/// The source's policy slot: the cached one while the generation holds, otherwise looked
/// up again (with `lookup`) and cached.
///
/// # Safety
/// `state` points to a live map value.
#[inline(always)]
pub unsafe fn resolve(
    state: *mut SourceState,
    config: &Config,
    lookup: impl FnOnce() -> u32,
) -> u32 {
    // SAFETY: the caller's; racing CPUs store the same value, and a u64 store is atomic.
    unsafe {
        let cached = core::ptr::read_volatile(&raw const (*state).policy);
        if (cached >> 32) as u32 == config.policy_gen {
            return cached as u32;
        }
        let slot = lookup();
        core::ptr::write_volatile(&raw mut (*state).policy, cache_word(config, slot));
        slot
    }
}

/// 1 for [`MODE_SHAPE`], 0 for the other modes, without a branch: a branch here would
/// fork every path through the cell code into a policing and a shaping copy for the
/// verifier (whose budget the programs nearly fill), where arithmetic on a value read
/// from a map forks nothing. Userspace refuses shape mode without `ACTION_LIMIT` (and with
/// an aggregate, but for a subscribers' plan: its aggregate, the subscriber's bucket, is
/// what shapes, in `meter::shaper_subscriber`), so the mode alone says whether a rule
/// shapes.
#[inline(always)]
fn shapes(mode: u32) -> u64 {
    const _: () = assert!(MODE_SHAPE == 2 && MODE_MONITOR == 1);
    u64::from((mode >> 1) & 1)
}

/// 1 for [`MODE_MONITOR`] (which overrides shaping as it does enforcing), 0 for the other
/// modes, without a branch (see [`shapes`]).
#[inline(always)]
fn monitors(mode: u32) -> u64 {
    u64::from(mode & 1)
}

/// The rule of `slot`: the default (from `config`) for slot 0 or a slot no longer in use
/// (deleted while this source's cache was being revalidated).
#[inline(always)]
pub fn rule(config: &Config, slot: u32) -> Rule<'_> {
    rule_with(config, slot, |slot| {
        AGGREGATES
            .get_ptr_mut(slot)
            .unwrap_or(core::ptr::null_mut())
    })
}

/// [`rule`], the aggregate cell of a policy that has one (a limit with an aggregate rate)
/// found by `aggregate` from the slot.
#[inline(always)]
fn rule_with(config: &Config, slot: u32, aggregate: impl FnOnce(u32) -> *mut Cell) -> Rule<'_> {
    let interface_monitor = config.mode == MODE_MONITOR;
    let horizon = ticks_from_ns(config.shape.horizon_ns);
    if slot != DEFAULT_SLOT
        && let Some(p) = POLICIES.get(slot)
        && p.in_use != 0
    {
        let aggregate_cell = if p.action == ACTION_LIMIT && p.aggregate_rate_bps != 0 {
            aggregate(slot)
        } else {
            core::ptr::null_mut()
        };
        return Rule {
            action: p.action,
            monitor: interface_monitor || p.mode == MODE_MONITOR,
            slack: horizon * shapes(p.mode) * (1 - monitors(config.mode)),
            limit: &p.limit,
            aggregate_cell,
            aggregate_limit: &p.aggregate,
            meter2: &p.meter2,
            per_key: !p.per_address_is_whole(),
        };
    }
    Rule {
        action: ACTION_LIMIT,
        monitor: interface_monitor,
        slack: horizon * shapes(config.mode),
        limit: &config.limit,
        aggregate_cell: core::ptr::null_mut(),
        aggregate_limit: &config.limit,
        meter2: &config.meter2,
        per_key: true,
    }
}

/// The second meter of policy `slot` (as [`rule`] finds it).
#[inline(always)]
pub fn meter2(config: &Config, slot: u32) -> &Meter2 {
    if slot != DEFAULT_SLOT
        && let Some(p) = POLICIES.get(slot)
        && p.in_use != 0
    {
        return &p.meter2;
    }
    &config.meter2
}

/// How keys new to the table under policy `slot` get a cell: the policy's own admission,
/// or the interface's; and the slot whose admission cell meters it.
#[inline(always)]
pub fn admission(config: &Config, slot: u32) -> (&Admission, u32) {
    if slot != DEFAULT_SLOT
        && let Some(p) = POLICIES.get(slot)
        && p.in_use != 0
        && p.admission.limited()
    {
        return (&p.admission, slot);
    }
    (&config.admission, DEFAULT_SLOT)
}

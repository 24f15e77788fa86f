//! Metering one frame of a key: find its state, or admit a key new to the table; resolve
//! its policy (`policy`); let the rule decide (`cell`); count it in the key's counters;
//! sample it for `shaper watch` if it was refused (`watch`).
//!
//! A known key's frame is metered with one function call, the scan of its buckets
//! (`sources::shaper_find4`, `shaper_find6`: its answer one scalar, so what follows is one
//! path for the verifier whichever way matched; the LRU hash it replaced cost a call into
//! the kernel's lookup too): [`meter`] is inlined into the entry point, the rule's decision
//! into it, one copy for both families (and another for the shared cell of the policy's
//! unadmitted frames). On the hot path a BPF-to-BPF call costs a call and a return, which
//! mitigations of speculative execution can make dear. What is rare is a global function of
//! its own, verified once: new-source admission ([`shaper_admit`]), a way given to a new
//! key (`sources::shaper_claim4`, `shaper_claim6`), a lost compare-and-swap
//! (`cell::shaper_retry`), a rate change (`cell::shaper_carry_over`), a sample
//! (`watch::shaper_sample`). A subscriber's frame is one call ([`shaper_subscriber`]: the
//! verifier then walks the rest once, not in each of the entry point's states), a second
//! if its plan has a packet rate ([`shaper_subscriber_packet`]), and after its plan
//! changed two more ([`shaper_subscriber_prepare`], then the first again), so that no
//! chain of calls is three frames deep below the entry point's (6.1 allows 512 bytes of
//! stack to a chain, each frame rounded up to 32 bytes: the entry point's 288 bytes and
//! [`shaper_subscriber`]'s 184, 192 rounded, leave 32 to each function it calls).
//! A global function takes only scalars and pointers to memory and returns one scalar.

use core::ptr;

use shaper_common::{
    gcra,
    maps::{
        CAS_TRIES, Cell, Config, Counters, Ipv4Key, METER2_PACKETS, Meter2, SourceState, Subscriber,
    },
};

use shaper_ebpf::atomic;

use crate::{
    cell::{Count, carried, carry_over, carry_over_rule, count_policy, decide, scaled, take},
    key::join,
    maps::{ADMISSION, CONFIG, FIRSTS, POLICY_STATS},
    meter2::{self, AGAIN, shaper_meter2, shaper_meter2_prepare},
    outcome::{AGGREGATE, Metered, Outcome, PACKET_RATE, Reason, outcome_counters},
    policy::{self, Rule},
    sources,
    trace::{self, Sighting},
    watch,
};

/// A frame's key, as the entry point read it: an IPv6 key travels as two `u64` halves (its
/// bytes in memory order, as `u64::from_ne_bytes` reads them).
#[derive(Clone, Copy)]
pub enum Key {
    V4(Ipv4Key),
    V6(u64, u64),
}

impl Key {
    /// The key's state in its family's table, if it has one (`sources`: a call, whose
    /// answer makes one path of every way for the verifier, and an inlined lookup).
    #[inline(always)]
    fn state(self, hash: u64) -> Option<*mut SourceState> {
        match self {
            Self::V4(key) => sources::state_v4(sources::shaper_find4(key, hash)),
            Self::V6(hi, lo) => sources::state_v6(sources::shaper_find6(hi, lo, hash)),
        }
    }

    /// Gives the key a way of its table, its state fresh but for `policy` (the cache
    /// word): its state, and whether the way is new to it (or another CPU gave it one
    /// first); `None` if its bucket had no free or idle way.
    #[inline(always)]
    fn claim(self, hash: u64, policy: u64, now: u64) -> Option<(*mut SourceState, bool)> {
        let answer = match self {
            Self::V4(key) => sources::shaper_claim4(key, hash, policy, now),
            Self::V6(hi, lo) => sources::shaper_claim6(hi, lo, hash, policy, now),
        };
        let new = answer != sources::NO_WAY && answer & sources::CLAIMED_NEW != 0;
        let state = match self {
            Self::V4(_) => sources::state_v4(answer),
            Self::V6(..) => sources::state_v6(answer),
        }?;
        Some((state, new))
    }

    /// The slot of the policy covering the key (`policy`).
    #[inline(always)]
    fn slot(self, config: &Config) -> u32 {
        match self {
            Self::V4(key) => policy::slot_v4(&key, config),
            Self::V6(hi, lo) => policy::slot_v6(&join(hi, lo), config),
        }
    }

    /// The hash that places the key's trace (`trace`).
    #[inline(always)]
    fn hash(self, config: &Config) -> u64 {
        match self {
            Self::V4(key) => trace::hash_v4(key, config),
            Self::V6(hi, lo) => trace::hash_v6(hi, lo, config),
        }
    }

    /// The halves and family `watch::shaper_sample` and `meter2::shaper_meter2` take.
    #[inline(always)]
    pub fn halves(self) -> (u64, u64, u8) {
        match self {
            Self::V4(key) => (u64::from(key), 0, 4),
            Self::V6(hi, lo) => (hi, lo, 6),
        }
    }
}

/// Whether new-source admission gives a key new to the table a cell.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Admitted {
    /// Not: a first sighting, or over the admission rate.
    Not,
    /// Its policy has no admission: every new key gets a cell.
    Freely,
    /// On its second sighting (the doorkeeper found its trace), within the admission rate.
    Again,
    /// On its first sighting, within the first-sighting allowance and the admission rate.
    First,
}

/// Meters a `len`-byte frame of `key` at `now` (ticks) under `config`, counted in this
/// CPU's global `counters`: what became of it, and the slot of its policy.
#[inline(always)]
pub fn meter(
    key: Key,
    len: u32,
    now: u64,
    config: &Config,
    counters: &mut Counters,
) -> (Metered, u32) {
    // The trie's value: a policy slot, or a subscriber (`SUBSCRIBER_BIT`) metered under
    // its plan's slot.
    let hash = key.hash(config);
    let (metered, slot) = match key.state(hash) {
        Some(state) => {
            // SAFETY: a live map value.
            let value = unsafe { policy::resolve(state, config, || key.slot(config)) };
            let slot = policy::slot_of(value);
            (
                known::<true>(state, key, config, value, slot, len, now, counters),
                slot,
            )
        }
        None => {
            let value = key.slot(config);
            let slot = policy::slot_of(value);
            (
                new_key(key, hash, config, (value, slot), len, now, counters),
                slot,
            )
        }
    };
    if watch::watched(metered, now) {
        let (hi, lo, family) = key.halves();
        watch::shaper_sample(hi, lo, watch::info(metered, slot, len, family), now);
    }
    (metered, slot)
}

/// Meters a frame of a subscriber (`value`, with `SUBSCRIBER_BIT`) in `cell` (a live map
/// value or the caller's own) under its plan's rule, its cell in the aggregate's place
/// (`policy::subscriber_rule`): in a global function, verified once, so a policy's frame
/// pays one branch for subscribers. In order: the plan's packet rate, if any, in the
/// subscriber's packet bucket (refused: red, reason packet rate; given back if a later
/// step refuses the frame); then the plan decides ([`metered_by_plan`]): its excess rate
/// if any in the committed one's place, the subscriber's bucket alone where the key's own
/// cell has no say (shaping, or a per-address limit that is the whole plan), the key's
/// cell and the bucket otherwise.
/// `frame` is the length in bits 0–31 and the [`Count`] in 32–33. Returns a [`Metered`],
/// which it also counts in the subscriber's counters (atomically: every CPU shares them),
/// by [`counted`];
/// or, charging nothing, [`AGAIN`] if a cell is still in a former plan's scale
/// ([`shaper_subscriber_prepare`]).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn shaper_subscriber(
    cell: *mut Cell,
    value: u32,
    frame: u64,
    now: u64,
    counters: *mut Counters,
) -> u64 {
    let Some(config) = CONFIG.get(0) else {
        return Metered::UNTRACKED.0;
    };
    // SAFETY: a global function's pointer arguments are null or point to whole values.
    let Some(counters) = (unsafe { counters.as_mut() }) else {
        return Metered::UNTRACKED.0;
    };
    if cell.is_null() {
        return Metered::UNTRACKED.0;
    }
    let (rule, slot, second, entry) = policy::subscriber_rule(config, value);
    let peak = policy::has_excess(&rule, second);
    let packets = policy::has_packets(&rule, second);
    // SAFETY: checked above; the second cell is null or a live map value.
    if unsafe {
        !carried(cell, &rule)
            || peak && !scaled(second, &rule.meter2.excess)
            || packets && !scaled(second, &rule.meter2.packets)
    } {
        return if frame & PREPARED == 0 {
            AGAIN
        } else {
            Metered::UNTRACKED.0
        };
    }
    let len = frame as u32;
    // Called only if the plan has a packet rate: a plan without one charges nothing, and
    // its frame pays no call.
    let packet = if packets {
        match shaper_subscriber_packet(second, rule.meter2, now, ptr::from_mut(counters)) {
            0 => None,
            charged => Some(charged - 1),
        }
    } else {
        Some(0)
    };
    let (metered, yellow) = match packet {
        None => (refused(rule.monitor, PACKET_RATE), false),
        // SAFETY: checked above; the second cell is null or a live map value.
        Some(_) => unsafe {
            metered_by_plan(cell, &rule, (slot, second, peak), len, now, counters)
        },
    };
    match packet {
        None => count_packet_refused(slot, len, counters),
        // SAFETY: a live map value, or nothing charged.
        Some(cost) if metered.outcome() != Outcome::Passed => unsafe {
            meter2::give_back(second, cost)
        },
        Some(_) => {}
    }
    counted(entry, metered, (frame, yellow), slot, counters)
}

/// Counts a subscriber's frame, `metered` by [`shaper_subscriber`], in its plan `slot`'s
/// counters as the [`Count`] in `frame` (bits 32–33) says, and in its entry (null: gone)
/// and, if `yellow`, in this CPU's `counters` as yellow; the frame's length in bits 0–31.
/// Returns the [`Metered`], unadmitted if it was. Inlined: the verifier walks it once for
/// each way the plan decided, a few thousand instructions in all, where a call of its own
/// cost every subscriber's frame a call and a return.
#[inline(always)]
fn counted(
    entry: *mut Subscriber,
    mut metered: Metered,
    (frame, yellow): (u64, bool),
    slot: u32,
    counters: &mut Counters,
) -> u64 {
    let len = frame as u32;
    let count = (frame >> 32) & COUNT_MASK;
    if count == COUNT_UNADMITTED {
        metered = metered.unadmitted();
    }
    if count != COUNT_LATER {
        count_policy(slot, metered, len);
    }
    count_subscriber(entry, metered, yellow, len, counters);
    metered.0
}

/// Charges one packet to a subscriber's packet bucket `cell` (its second cell, a live map
/// value, or null: gone) under its plan's second meter `meter2` at `now`, if the plan has
/// a packet rate (nothing is charged without one) and the packet conforms: 1 + what it was
/// charged (ticks, to give back if the frame is refused after all; 1 when nothing was), or
/// 0 if it does not conform or every try of the compare-and-swap lost. A global
/// function, verified once: inlined, its compare-and-swap's outcomes would each walk the
/// rest of [`shaper_subscriber`] again for the verifier; and its retries are its own
/// (`cell::shaper_retry` would be a third frame of calls).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn shaper_subscriber_packet(
    cell: *mut Cell,
    meter2: *const Meter2,
    now: u64,
    counters: *mut Counters,
) -> u64 {
    // SAFETY: a global function's pointer arguments are null or point to whole values.
    let (Some(m), Some(counters)) = (unsafe { meter2.as_ref() }, unsafe { counters.as_mut() })
    else {
        return 1;
    };
    if cell.is_null() || m.meters & METER2_PACKETS == 0 {
        return 1;
    }
    let limit = &m.packets;
    // SAFETY: a live map value, checked above.
    let tat = unsafe { &raw mut (*cell).tat };
    // SAFETY: as above.
    let mut old = unsafe { atomic::load(tat) };
    for try_ in 0..CAS_TRIES {
        let Some(new) = limit.admit(old, now, 1) else {
            return 0;
        };
        // SAFETY: as above.
        match unsafe { atomic::compare_exchange(tat, old, new) } {
            Ok(()) => {
                if let Some(won) = counters.cas_won.get_mut(try_) {
                    *won += 1;
                }
                return 1 + new.wrapping_sub(gcra::base(old, now));
            }
            Err(found) => old = found,
        }
    }
    counters.cas_exhausted += 1;
    0
}

/// A frame refused (red) for `reason`: dropped, or passed as would-drop if `monitor`.
#[inline(always)]
fn refused(monitor: bool, reason: Reason) -> Metered {
    let outcome = if monitor {
        Outcome::WouldDrop
    } else {
        Outcome::Dropped
    };
    Metered::new(outcome, reason, 0)
}

/// A subscriber's frame under its plan: over the committed rate with an excess one
/// (`peak`), the excess bucket (`second`) in the committed one's place, the frame yellow
/// if it passes (another CPU may fill the committed bucket after this look and before the
/// charge: the frame is then red). Then, where the key's own cell has no say (a plan in
/// shape mode, unless the interface monitors: userspace requires its per-address limit to
/// be the whole plan, which would only make two departure times of one; or a plan whose
/// per-address limit is the whole plan: `Rule::per_key`), the subscriber's bucket alone
/// decides, in the key's cell's place (shaping holds the frame back as long as it says, or
/// drops it past the horizon; a refusal is the bucket's, reason aggregate); otherwise both
/// the key's cell and the bucket (`cell::decide`). Whether it is yellow (and passed) too.
///
/// # Safety
/// `cell` points to a live map value, or to a value of the caller's own; the rule's
/// aggregate cell and `second` are null or live map values.
#[inline(always)]
unsafe fn metered_by_plan(
    cell: *mut Cell,
    rule: &Rule,
    (slot, second, peak): (u32, *mut Cell, bool),
    len: u32,
    now: u64,
    counters: &mut Counters,
) -> (Metered, bool) {
    // SAFETY: a live map value (`peak`: the subscriber's, as the aggregate cell is).
    let mut yellow = peak && unsafe { !fits(rule.aggregate_cell, rule.aggregate_limit, len, now) };
    let (bucket, limit) = if yellow {
        (second, &rule.meter2.excess)
    } else {
        (rule.aggregate_cell, rule.aggregate_limit)
    };
    // Where the key's own cell has no say, the subscriber's bucket is metered in its place
    // and alone: `cell::decide` then takes it as a key's cell without an aggregate (its
    // burst stretched by the horizon if the plan shapes), one compare-and-swap, not two.
    let alone = (rule.slack != 0 || !rule.per_key) && !bucket.is_null();
    let (target, chosen) = if alone {
        let aggregate_cell = ptr::null_mut();
        (
            bucket,
            Rule {
                limit,
                aggregate_cell,
                aggregate_limit: limit,
                ..*rule
            },
        )
    } else {
        (
            cell,
            Rule {
                aggregate_cell: bucket,
                aggregate_limit: limit,
                ..*rule
            },
        )
    };
    // SAFETY: the caller's (the bucket checked non-null).
    let mut metered =
        unsafe { decide::<false>(target, &chosen, slot, Count::Later, len, now, counters) };
    if alone && metered.outcome() != Outcome::Passed {
        // Refused by the subscriber's bucket, not by a key's own limit.
        metered = refused(rule.monitor, AGGREGATE);
    }
    yellow = yellow && metered.outcome() == Outcome::Passed;
    if yellow && !rule.monitor {
        metered = metered.remark();
    }
    (metered, yellow)
}

/// Counts a frame the packet rate refused, in this CPU's counters and its plan `slot`'s
/// (as `meter2` counts a policy's).
#[inline(always)]
fn count_packet_refused(slot: u32, len: u32, counters: &mut Counters) {
    let bytes = u64::from(len);
    counters.meter2.packet_rate_refused_packets += 1;
    counters.meter2.packet_rate_refused_bytes += bytes;
    if let Some(s) = POLICY_STATS.get_ptr_mut(slot) {
        // SAFETY: this CPU's entry (see `cell::count_policy`).
        unsafe {
            (*s).meter2.packet_rate_refused_packets += 1;
            (*s).meter2.packet_rate_refused_bytes += bytes;
        }
    }
}

/// Whether `len` bytes fit `cell` under `limit` at `now`, nothing charged.
///
/// # Safety
/// `cell` points to a live map value.
#[inline(always)]
unsafe fn fits(cell: *mut Cell, limit: &gcra::Limit, len: u32, now: u64) -> bool {
    // SAFETY: the caller's.
    let tat = unsafe { atomic::load(&raw const (*cell).tat) };
    limit.admit(tat, now, len).is_some()
}

/// Counts a subscriber's frame in its entry `s` (null: gone) atomically, every CPU sharing
/// it, and a yellow one in this CPU's counters too.
#[inline(always)]
fn count_subscriber(
    s: *mut Subscriber,
    metered: Metered,
    yellow: bool,
    len: u32,
    counters: &mut Counters,
) {
    if s.is_null() {
        return;
    }
    let bytes = u64::from(len);
    // SAFETY: a live map value.
    unsafe {
        let (packets, total) = outcome_counters(&raw mut (*s).outcomes, metered.outcome());
        atomic::add(packets, 1);
        atomic::add(total, bytes);
        if yellow {
            atomic::add(&raw mut (*s).yellow_packets, 1);
            atomic::add(&raw mut (*s).yellow_bytes, bytes);
            counters.meter2.yellow_packets += 1;
            counters.meter2.yellow_bytes += bytes;
        }
    }
}

/// What [`shaper_subscriber`] leaves to its caller: a cell charged under another rate
/// (the plan changed) carried over to the plan's, before the frame is metered again. A
/// global function of its own, so that the carry-over's (`cell::shaper_carry_over`) is
/// not a third frame of calls below [`shaper_subscriber`]'s: the entry point's frame and
/// the two would not fit the 512 bytes of stack the kernel allows a chain (6.1 rounds
/// each frame up to 32 bytes).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn shaper_subscriber_prepare(cell: *mut Cell, value: u32, now: u64) -> u32 {
    let Some(config) = CONFIG.get(0) else {
        return 0;
    };
    if cell.is_null() {
        return 0;
    }
    let (rule, _, second, _) = policy::subscriber_rule(config, value);
    // SAFETY: a global function's pointer argument is null or points to a whole value
    // (checked above); the second cell is null or a live map value.
    unsafe {
        carry_over_rule(cell, &rule, now);
        if policy::has_excess(&rule, second) {
            carry_over(second, &rule.meter2.excess, now);
        }
        if policy::has_packets(&rule, second) {
            carry_over(second, &rule.meter2.packets, now);
        }
    }
    1
}

/// [`shaper_subscriber`]'s frame word: the [`Count`] in bits 32–33.
const COUNT_POLICY: u64 = 0;
const COUNT_UNADMITTED: u64 = 1;
const COUNT_LATER: u64 = 2;
const COUNT_MASK: u64 = 3;
/// [`shaper_subscriber`]'s frame word, bit 34: its second try, after
/// [`shaper_subscriber_prepare`]; a cell still in another scale (the plan changed again
/// meanwhile) makes the frame untracked rather than [`AGAIN`], so the caller's paths
/// after the call are one for the verifier, not one a result.
const PREPARED: u64 = 1 << 34;

/// The rule of policy `slot` on a `len`-byte frame of `key` metered in `cell` at `now`,
/// counted as `count` says: `cell::decide`; or, if `SECOND` and the policy has a second
/// meter, `meter2::shaper_meter2`. The rule's one byte is all a policy without one pays:
/// no call, no lookup. A caller that is itself a global function passes `false` (a third
/// frame of calls would not fit the stack) and must not meter such a policy.
///
/// # Safety
/// `cell` points to a live map value, or to a value of this program's own.
#[expect(
    clippy::too_many_arguments,
    reason = "the frame's whole state, inlined"
)]
#[inline(always)]
unsafe fn metered<const SECOND: bool>(
    cell: *mut Cell,
    key: Key,
    config: &Config,
    (value, slot): (u32, u32),
    count: Count,
    len: u32,
    now: u64,
    counters: &mut Counters,
) -> Metered {
    if policy::is_subscriber(value) {
        if !SECOND {
            // In a global function already (a call more would not fit the stack).
            // Its excess rate is not applied (a frame over the committed rate is red):
            // a frame of a key two CPUs created at once.
            let (rule, slot, _, _) = policy::subscriber_rule(config, value);
            // SAFETY: the caller's.
            return unsafe { decide::<true>(cell, &rule, slot, count, len, now, counters) };
        }
        let count = match count {
            Count::Policy => COUNT_POLICY,
            Count::Unadmitted => COUNT_UNADMITTED,
            Count::Later => COUNT_LATER,
        };
        let frame = u64::from(len) | count << 32;
        let counters = ptr::from_mut(counters);
        let mut metered = shaper_subscriber(cell, value, frame, now, counters);
        if metered == AGAIN {
            shaper_subscriber_prepare(cell, value, now);
            metered = shaper_subscriber(cell, value, frame | PREPARED, now, counters);
        }
        return Metered(metered);
    }
    let rule = policy::rule(config, slot);
    if SECOND && rule.meter2.any() {
        let (hi, lo, family) = key.halves();
        let frame = meter2::frame(len, slot, family, count);
        let mut metered = shaper_meter2(cell, hi, lo, frame, now);
        if metered == AGAIN {
            shaper_meter2_prepare(cell, hi, lo, frame, now);
            metered = shaper_meter2(cell, hi, lo, frame, now);
        }
        return if metered == AGAIN {
            Metered::UNTRACKED
        } else {
            Metered(metered)
        };
    }
    // SAFETY: the caller's.
    unsafe { decide::<true>(cell, &rule, slot, count, len, now, counters) }
}

/// Meters the frame of a key with an entry of its own, `state` (a live map value), under
/// policy `slot` (of trie value `value`): the hot path ([`metered`] says what `SECOND` is).
#[expect(
    clippy::too_many_arguments,
    reason = "the frame's whole state, inlined"
)]
#[inline(always)]
fn known<const SECOND: bool>(
    state: *mut SourceState,
    key: Key,
    config: &Config,
    value: u32,
    slot: u32,
    len: u32,
    now: u64,
    counters: &mut Counters,
) -> Metered {
    // SAFETY: a live map value (found by this program run).
    unsafe {
        let cell = &raw mut (*state).cell;
        let metered = metered::<SECOND>(
            cell,
            key,
            config,
            (value, slot),
            Count::Policy,
            len,
            now,
            counters,
        );
        count_source(state, metered.outcome(), len);
        metered
    }
}

/// Meters the frame of a key new to the table (of `hash`) under policy `slot`: in a way of
/// its own if new-source admission lets it have one and its bucket has a free or idle way
/// (`sources`), as a known key's; otherwise in the shared cell of its policy's unadmitted
/// frames. `value` is what its prefix resolved to (`slot`, or a subscriber of plan `slot`).
#[inline(always)]
fn new_key(
    key: Key,
    hash: u64,
    config: &Config,
    (value, slot): (u32, u32),
    len: u32,
    now: u64,
    counters: &mut Counters,
) -> Metered {
    let admitted = admit(hash, config, slot, now, counters);
    if admitted != Admitted::Not
        && let Some((state, new)) = key.claim(hash, policy::cache_word(config, value), now)
    {
        let metered = known::<true>(state, key, config, value, slot, len, now, counters);
        if new {
            count_new_source(admitted, slot, counters);
        }
        return metered;
    }
    let Some(cells) = ADMISSION.get_ptr_mut(slot) else {
        return Metered::UNTRACKED;
    };
    // SAFETY: a live map value.
    unsafe {
        metered::<true>(
            &raw mut (*cells).unadmitted,
            key,
            config,
            (value, slot),
            Count::Unadmitted,
            len,
            now,
            counters,
        )
    }
}

/// Counts a key new to the table, `admitted` as it was, in this CPU's counters and its
/// policy `slot`'s.
#[inline(always)]
fn count_new_source(admitted: Admitted, slot: u32, counters: &mut Counters) {
    let again = u64::from(admitted == Admitted::Again);
    let first = u64::from(admitted == Admitted::First);
    counters.new_sources += 1;
    counters.sightings.admitted += again;
    counters.sightings.first_admitted += first;
    if let Some(stats) = POLICY_STATS.get_ptr_mut(slot) {
        // SAFETY: this CPU's entry (see `cell::count_policy`).
        unsafe {
            (*stats).new_sources += 1;
            (*stats).sightings.admitted += again;
            (*stats).sightings.first_admitted += first;
        }
    }
}

/// Adds the frame to the key's own counters, atomically: every CPU shares them.
///
/// # Safety
/// `state` points to a live map value, or to a value of this program's own.
#[inline(always)]
unsafe fn count_source(state: *mut SourceState, outcome: Outcome, len: u32) {
    unsafe {
        let (packets, bytes) = outcome_counters(&raw mut (*state).outcomes, outcome);
        atomic::add(packets, 1);
        atomic::add(bytes, u64::from(len));
    }
}

/// Whether new-source admission gives `key`, new to the table under policy `slot`, a cell
/// at `now`: freely if the policy (or the interface) has no admission, otherwise
/// [`shaper_admit`]'s answer.
#[inline(always)]
fn admit(hash: u64, config: &Config, slot: u32, now: u64, counters: &mut Counters) -> Admitted {
    if !policy::admission(config, slot).0.limited() {
        return Admitted::Freely;
    }
    match shaper_admit(hash, slot, now, ptr::from_mut(counters)) {
        ADMIT_AGAIN => Admitted::Again,
        ADMIT_FIRST => Admitted::First,
        _ => Admitted::Not,
    }
}

/// [`shaper_admit`]'s answers: the key may have a cell, on its second sighting, or on its
/// first.
const ADMIT_AGAIN: u32 = 1;
const ADMIT_FIRST: u32 = 2;

/// New-source admission of a key (whose trace `hash` places) new to the table under policy
/// `slot`, whose admission is limited. The doorkeeper (`trace`) looks for the key's trace,
/// left by an earlier frame within the window, and leaves it if it is not there; a key
/// seen again may have a cell ([`ADMIT_AGAIN`]), a key seen for the first time only within
/// the first-sighting allowance ([`ADMIT_FIRST`]), and either only if the policy's
/// admission (or the interface's) lets one more key in at `now`. Returns 0 if not. Counts
/// the sightings in `counters` (this CPU's) and the policy's counters.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn shaper_admit(hash: u64, slot: u32, now: u64, counters: *mut Counters) -> u32 {
    let Some(config) = CONFIG.get(0) else {
        return 0;
    };
    // SAFETY: a global function's pointer argument is null or points to a whole value:
    // here this CPU's counters.
    let Some(counters) = (unsafe { counters.as_mut() }) else {
        return 0;
    };
    let (admission, admission_slot) = policy::admission(config, slot);
    let sighting = trace::sight(hash, now);
    let answer = if sighting == Sighting::Again {
        ADMIT_AGAIN
    } else {
        let displaced = u64::from(sighting == Sighting::Displacing);
        counters.sightings.first += 1;
        counters.sightings.displaced += displaced;
        if let Some(stats) = POLICY_STATS.get_ptr_mut(slot) {
            // SAFETY: this CPU's entry (see `cell::count_policy`).
            unsafe {
                (*stats).sightings.first += 1;
                (*stats).sightings.displaced += displaced;
            }
        }
        let Some(first) = FIRSTS.get_ptr_mut(admission_slot) else {
            return 0;
        };
        // SAFETY: a live map value.
        if unsafe { take::<true>(first, &admission.first, 1, now, 0, counters) }.is_none() {
            return 0;
        }
        ADMIT_FIRST
    };
    let Some(cells) = ADMISSION.get_ptr_mut(admission_slot) else {
        return 0;
    };
    // SAFETY: a live map value.
    let room = unsafe {
        take::<true>(
            &raw mut (*cells).admit,
            &admission.limit,
            1,
            now,
            0,
            counters,
        )
    };
    if room.is_some() { answer } else { 0 }
}

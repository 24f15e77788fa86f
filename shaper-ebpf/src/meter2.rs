//! The second meter of a key whose policy has one (`shaper_common::maps::Meter2`): the
//! excess rate of RFC 4115's colour-blind two-rate three-colour marker, and a packet rate.
//!
//! A frame of such a policy is decided here, in a global function verified once, rather
//! than by the rule's inlined decision (`cell::decide`), so a key without a second meter
//! pays for none of it: not a lookup, not an instruction of the verifier's budget. In order:
//!
//! 1. The packet meter, if any: the frame is refused (red, reason packet rate) unless it
//!    fits; otherwise it is charged one packet, given back if a later step refuses it.
//! 2. The colour: green if the frame fits the committed cell (the key's own, as a policy
//!    without a second meter charges it); else yellow if it fits the excess cell; else red
//!    (reason source). The two buckets are independent: a green frame never drains the
//!    excess one.
//! 3. The prefix's aggregate, if the policy has one: it meters what the policy passes,
//!    green and yellow alike, and refuses the frame (red, reason aggregate) when full.
//! 4. The colour's cell is charged (compare-and-swap); if another CPU took the room
//!    meanwhile, the frame is red after all and the charges above are given back.
//!
//! A yellow frame is passed with its DSCP to be rewritten by the entry point (the rewrite
//! needs the packet, which a global function cannot be given), except in monitor mode,
//! where it is counted and left alone. A red one is dropped, or passed as would-drop in
//! monitor mode; nothing is charged for it.
//!
//! The excess and packet cells of a key live in the LRU hashes `SHAPER_METER2` (IPv4) and
//! `SHAPER_METER2_6` (IPv6), keyed as the sources maps are, made on the key's first frame
//! under such a policy; those of a policy's unadmitted frames (keys refused a cell by
//! new-source admission), which share one committed cell, share one entry of
//! `SHAPER_METER2_U` too. Yellow frames and packet-rate refusals are counted here: in this
//! CPU's global and policy counters and, yellow, in the key's entry. A key's frame counted
//! here is counted once more in the rare race where two CPUs create its entry at once
//! (the cell a fresh key was metered in is then dropped, and the frame metered again in the
//! other CPU's: see `meter`).

use shaper_common::{
    gcra::Limit,
    maps::{Cell, Config, Counters, METER2_EXCESS, METER2_PACKETS, Meter2, Meter2Cells},
};
use shaper_ebpf::atomic;

use crate::{
    cell::{carry_over, count_policy, publish},
    maps::{CONFIG, COUNTERS, METER2, METER2_6, METER2_SHARED, POLICY_STATS},
    meter::join,
    outcome::{AGGREGATE, Metered, Outcome, PACKET_RATE, Reason, SOURCE},
    policy,
};

/// BPF_NOEXIST: another CPU's entry, if it made one first, is the key's.
const BPF_NOEXIST: u64 = 1;

/// What [`shaper_meter2`] is told of a frame, packed in one `u64`: its length in bits 0–31,
/// its policy slot in 32–47, and flags.
const SLOT_SHIFT: u32 = 32;
/// The key is IPv6 (its two halves), not IPv4 (the low 32 bits of the first).
const IPV6: u64 = 1 << 48;
/// An unadmitted frame: metered in its policy's shared cells.
const UNADMITTED: u64 = 1 << 49;
/// Count the frame in its policy's counters too (`cell::count_policy`).
const COUNT_POLICY: u64 = 1 << 50;

/// A frame for [`shaper_meter2`]: `len` bytes under policy `slot`, of a key of `family` (4
/// or 6), unadmitted or not, and whether to count it in its policy's counters.
#[inline(always)]
pub fn frame(len: u32, slot: u32, family: u8, unadmitted: bool, count: bool) -> u64 {
    u64::from(len)
        | u64::from(slot & 0xffff) << SLOT_SHIFT
        | if family == 6 { IPV6 } else { 0 }
        | if unadmitted { UNADMITTED } else { 0 }
        | if count { COUNT_POLICY } else { 0 }
}

/// Whether the frames of policy `slot` have a second meter.
#[inline(always)]
pub fn configured(config: &Config, slot: u32) -> bool {
    policy::meter2(config, slot).any()
}

/// Decides a frame (`frame`, see [`frame`]) of the key `hi` ‖ `lo` at `now`, whose
/// committed cell is `cell` (a live map value, or a value on the caller's stack), under
/// a policy with a second meter (see the module docs). Returns a [`Metered`]: its outcome,
/// reason, whether its DSCP is to be rewritten, and what the aggregate was charged.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn shaper_meter2(cell: *mut Cell, hi: u64, lo: u64, frame: u64, now: u64) -> u64 {
    let (Some(config), Some(counters)) = (CONFIG.get(0), COUNTERS.get_ptr_mut(0)) else {
        return Metered::UNTRACKED.0;
    };
    let len = frame as u32;
    let slot = (frame >> SLOT_SHIFT) as u32 & 0xffff;
    let cells = if frame & UNADMITTED != 0 {
        METER2_SHARED.get_ptr_mut(slot)
    } else {
        cells_of(hi, lo, frame & IPV6 != 0)
    };
    // SAFETY: a global function's pointer arguments are null or point to whole values:
    // here a live map value or a caller's own; this CPU's counters (see `entry`).
    let (Some(cells), false) = (cells, cell.is_null()) else {
        return Metered::UNTRACKED.0;
    };
    let counters = unsafe { &mut *counters };
    let rule = policy::rule(config, slot);
    let m = rule.meter2;
    // SAFETY: live map values, or the caller's.
    let colour = unsafe { colour(cell, cells, &rule, m, len, now, counters) };
    let (outcome, reason) = match colour {
        Ok(_) => (Outcome::Passed, SOURCE),
        Err(reason) if rule.monitor => (Outcome::WouldDrop, reason),
        Err(reason) => (Outcome::Dropped, reason),
    };
    let mut metered = Metered::new(outcome, reason, 0);
    let bytes = u64::from(len);
    let stats = POLICY_STATS.get_ptr_mut(slot);
    match colour {
        Ok(Colour { yellow, aggregate }) => {
            if aggregate != 0 {
                metered = metered.charged_aggregate(aggregate);
            }
            if yellow {
                if !rule.monitor {
                    metered = metered.remark();
                }
                counters.meter2.yellow_packets += 1;
                counters.meter2.yellow_bytes += bytes;
                if let Some(s) = stats {
                    // SAFETY: this CPU's entry (see `cell::count_policy`).
                    unsafe {
                        (*s).meter2.yellow_packets += 1;
                        (*s).meter2.yellow_bytes += bytes;
                    }
                }
                // SAFETY: a live map value; every CPU shares it.
                unsafe {
                    atomic::add(&raw mut (*cells).yellow_packets, 1);
                    atomic::add(&raw mut (*cells).yellow_bytes, bytes);
                }
            }
        }
        Err(PACKET_RATE) => {
            counters.meter2.packet_rate_refused_packets += 1;
            counters.meter2.packet_rate_refused_bytes += bytes;
            if let Some(s) = stats {
                // SAFETY: this CPU's entry.
                unsafe {
                    (*s).meter2.packet_rate_refused_packets += 1;
                    (*s).meter2.packet_rate_refused_bytes += bytes;
                }
            }
        }
        Err(_) => {}
    }
    if frame & UNADMITTED != 0 {
        metered = metered.unadmitted();
    }
    if frame & COUNT_POLICY != 0 {
        count_policy(slot, metered, len);
    }
    metered.0
}

/// The key's cells (made if it has none yet), or `None` if none could be made.
#[inline(always)]
fn cells_of(hi: u64, lo: u64, ipv6: bool) -> Option<*mut Meter2Cells> {
    let key4 = hi as u32;
    let key6 = join(hi, lo);
    let found = if ipv6 {
        METER2_6.get_ptr_mut(&key6)
    } else {
        METER2.get_ptr_mut(&key4)
    };
    if found.is_some() {
        return found;
    }
    let fresh = Meter2Cells::default();
    // Another CPU's entry made meanwhile is as good: the key's either way.
    let _ = if ipv6 {
        METER2_6.insert(&key6, &fresh, BPF_NOEXIST)
    } else {
        METER2.insert(&key4, &fresh, BPF_NOEXIST)
    };
    if ipv6 {
        METER2_6.get_ptr_mut(&key6)
    } else {
        METER2.get_ptr_mut(&key4)
    }
}

/// A frame that passed: yellow or green, and what the aggregate was charged (ticks; 0 for
/// none).
struct Colour {
    yellow: bool,
    aggregate: u64,
}

/// Steps 1 to 4 of the module docs: the frame's colour, or why it is red. Whatever was
/// charged for a frame found red is given back.
///
/// # Safety
/// `cell` and `cells` point to live map values, or to values of a caller's own.
#[inline(always)]
unsafe fn colour(
    cell: *mut Cell,
    cells: *mut Meter2Cells,
    rule: &policy::Rule,
    m: &Meter2,
    len: u32,
    now: u64,
    counters: &mut Counters,
) -> Result<Colour, Reason> {
    unsafe {
        let packets = &raw mut (*cells).packets;
        let packet = if m.meters & METER2_PACKETS != 0 {
            charge(packets, &m.packets, 1, now, counters).ok_or(PACKET_RATE)?
        } else {
            0
        };
        // Gives back what was charged when the frame turns out red.
        let refuse = |reason: Reason, aggregate: u64| {
            give_back(packets, packet);
            give_back(rule.aggregate_cell, aggregate);
            reason
        };
        carry_over(cell, rule.limit, now);
        let tat = &raw mut (*cell).tat;
        let old = atomic::load(tat);
        let (tat, old, new, limit, yellow) = match rule.limit.admit(old, now, len) {
            Some(new) => (tat, old, new, rule.limit, false),
            None if m.meters & METER2_EXCESS != 0 => {
                let excess = &raw mut (*cells).excess;
                carry_over(excess, &m.excess, now);
                let tat = &raw mut (*excess).tat;
                let old = atomic::load(tat);
                match m.excess.admit(old, now, len) {
                    Some(new) => (tat, old, new, &m.excess, true),
                    None => return Err(refuse(SOURCE, 0)),
                }
            }
            None => return Err(refuse(SOURCE, 0)),
        };
        let aggregate = if rule.aggregate_cell.is_null() {
            0
        } else {
            match charge(rule.aggregate_cell, rule.aggregate_limit, len, now, counters) {
                Some(cost) => cost,
                None => return Err(refuse(AGGREGATE, 0)),
            }
        };
        if publish(tat, old, new, limit, len, now, 0, counters).is_none() {
            return Err(refuse(SOURCE, aggregate));
        }
        Ok(Colour { yellow, aggregate })
    }
}

/// Charges `len` to `cell` under `limit` if it conforms (policing): what it was charged
/// (ticks), or `None`.
///
/// # Safety
/// `cell` points to a live map value, or to a value of a caller's own.
#[inline(always)]
unsafe fn charge(
    cell: *mut Cell,
    limit: &Limit,
    len: u32,
    now: u64,
    counters: &mut Counters,
) -> Option<u64> {
    unsafe {
        carry_over(cell, limit, now);
        let tat = &raw mut (*cell).tat;
        let old = atomic::load(tat);
        let new = limit.admit(old, now, len)?;
        publish(tat, old, new, limit, len, now, 0, counters).map(|(_, cost)| cost)
    }
}

/// Gives `cost` ticks back to `cell` (null, or nothing charged: nothing to do).
///
/// # Safety
/// `cell` is null or points to a live map value, or to a value of a caller's own.
#[inline(always)]
unsafe fn give_back(cell: *mut Cell, cost: u64) {
    if cost != 0 && !cell.is_null() {
        // SAFETY: the caller's.
        unsafe { atomic::add(&raw mut (*cell).tat, cost.wrapping_neg()) };
    }
}

/// The DSCP policy `slot`'s yellow frames are marked with.
#[inline(always)]
pub fn dscp(config: &Config, slot: u32) -> u8 {
    policy::meter2(config, slot).excess_dscp
}

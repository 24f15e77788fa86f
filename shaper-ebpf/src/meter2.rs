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
//! What is rare is not done here but in [`shaper_meter2_prepare`], which the caller calls
//! when [`shaper_meter2`] answers [`AGAIN`] (before charging anything), and then
//! [`shaper_meter2`] once more: making a key's cells on its first frame, and carrying a
//! cell over to a changed rate (`cell::shaper_carry_over`). So the only call below
//! [`shaper_meter2`] is a lost compare-and-swap's retries, and the three frames of calls
//! (the entry point's, this one's, the retries') fit the 512 bytes of stack the kernel
//! allows a chain.
//!
//! A yellow frame is passed with its DSCP to be rewritten by the entry point (the rewrite
//! needs the packet: `xdp::shaper_remark_xdp`, `tc::shaper_remark_tc`), except in monitor mode,
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
    maps::{Cell, Counters, METER2_EXCESS, METER2_PACKETS, Meter2Cells},
};
use shaper_ebpf::atomic;

use crate::{
    cell::{Count, carry_over, count_policy, publish},
    key::join,
    maps::{CONFIG, COUNTERS, METER2, METER2_6, METER2_SHARED, POLICY_STATS},
    outcome::{AGGREGATE, Metered, Outcome, PACKET_RATE, SOURCE},
    policy::{self, Rule},
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

/// [`shaper_meter2`]'s answer when the frame's cells are not ready: the key has none yet,
/// or one was charged under another rate. Nothing was charged or counted; the caller
/// calls [`shaper_meter2_prepare`], then [`shaper_meter2`] again. Not a [`Metered`] (whose
/// amount is below 2^54).
pub const AGAIN: u64 = u64::MAX;

/// A frame for [`shaper_meter2`]: `len` bytes under policy `slot`, of a key of `family` (4
/// or 6), counted as `count` says (as `cell::decide` counts).
#[inline(always)]
pub fn frame(len: u32, slot: u32, family: u8, count: Count) -> u64 {
    u64::from(len)
        | u64::from(slot & 0xffff) << SLOT_SHIFT
        | if family == 6 { IPV6 } else { 0 }
        | if count == Count::Unadmitted {
            UNADMITTED
        } else {
            0
        }
        | if count == Count::Later {
            0
        } else {
            COUNT_POLICY
        }
}

/// What a frame that passed was: yellow (bit 0), and what the aggregate was charged (the
/// rest, ticks; 0 for none); or why it is red.
type Colour = Result<u64, u8>;
const YELLOW: u64 = 1;

/// Decides a frame (`frame`, see [`frame`]) of the key `hi` ‖ `lo` at `now`, whose
/// committed cell is `cell` (a live map value, or a value on the caller's stack), under
/// a policy with a second meter (see the module docs). Returns a [`Metered`]: its outcome,
/// reason, whether its DSCP is to be rewritten, and what the aggregate was charged; or
/// [`AGAIN`].
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn shaper_meter2(cell: *mut Cell, hi: u64, lo: u64, frame: u64, now: u64) -> u64 {
    let (Some(config), Some(counters)) = (CONFIG.get(0), COUNTERS.get_ptr_mut(0)) else {
        return Metered::UNTRACKED.0;
    };
    if cell.is_null() {
        return Metered::UNTRACKED.0;
    }
    let len = frame as u32;
    let slot = (frame >> SLOT_SHIFT) as u32 & 0xffff;
    let Some(cells) = cells_of(hi, lo, frame) else {
        return AGAIN;
    };
    let rule = policy::rule(config, slot);
    // SAFETY: a global function's pointer arguments are null or point to whole values:
    // here a live map value or a caller's own; live map values.
    if unsafe { !ready(cell, cells, &rule) } {
        return AGAIN;
    }
    // SAFETY: this CPU's counters (see `entry`).
    let counters = unsafe { &mut *counters };
    let monitor = rule.monitor;
    // SAFETY: live map values, or the caller's.
    let colour = unsafe { colour(cell, cells, &rule, len, now, counters) };
    let mut metered = match colour {
        Ok(passed) => {
            let m = Metered::new(Outcome::Passed, SOURCE, 0);
            let aggregate = passed >> 1;
            if aggregate != 0 {
                m.charged_aggregate(aggregate)
            } else {
                m
            }
        }
        Err(reason) if monitor => Metered::new(Outcome::WouldDrop, reason, 0),
        Err(reason) => Metered::new(Outcome::Dropped, reason, 0),
    }
    .second();
    count(colour, cells, slot, len, counters);
    if colour.is_ok_and(|c| c & YELLOW != 0) && !monitor {
        metered = metered.remark();
    }
    if frame & UNADMITTED != 0 {
        metered = metered.unadmitted();
    }
    if frame & COUNT_POLICY != 0 {
        count_policy(slot, metered, len);
    }
    metered.0
}

/// Makes what [`shaper_meter2`] found not ready for the frame `frame` of the key `hi` ‖
/// `lo` whose committed cell is `cell`: the key's second cells (unless another CPU made
/// them first: the key's either way), and every cell of the frame carried over to its
/// limit's rate. Returns 1 if the key has its cells.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn shaper_meter2_prepare(
    cell: *mut Cell,
    hi: u64,
    lo: u64,
    frame: u64,
    now: u64,
) -> u32 {
    let Some(config) = CONFIG.get(0) else {
        return 0;
    };
    if frame & (UNADMITTED | IPV6) == IPV6 {
        let _ = METER2_6.insert(join(hi, lo), Meter2Cells::default(), BPF_NOEXIST);
    } else if frame & UNADMITTED == 0 {
        let _ = METER2.insert(hi as u32, Meter2Cells::default(), BPF_NOEXIST);
    }
    let Some(cells) = cells_of(hi, lo, frame) else {
        return 0;
    };
    if cell.is_null() {
        return 0;
    }
    let rule = policy::rule(config, (frame >> SLOT_SHIFT) as u32 & 0xffff);
    let m = rule.meter2;
    // SAFETY: a global function's pointer argument is null or points to a whole value
    // (checked above); live map values.
    unsafe {
        carry_over(cell, rule.limit, now);
        carry_over(&raw mut (*cells).excess, &m.excess, now);
        carry_over(&raw mut (*cells).packets, &m.packets, now);
        if !rule.aggregate_cell.is_null() {
            carry_over(rule.aggregate_cell, rule.aggregate_limit, now);
        }
    }
    1
}

/// The frame's second cells: its key's, or its policy's unadmitted frames' (`frame`, see
/// [`frame`]); `None` if the key has none yet.
#[inline(always)]
fn cells_of(hi: u64, lo: u64, frame: u64) -> Option<*mut Meter2Cells> {
    if frame & UNADMITTED != 0 {
        METER2_SHARED.get_ptr_mut((frame >> SLOT_SHIFT) as u32 & 0xffff)
    } else if frame & IPV6 != 0 {
        METER2_6.get_ptr_mut(join(hi, lo))
    } else {
        METER2.get_ptr_mut(hi as u32)
    }
}

/// Whether every cell the frame may be charged to is expressed in its limit's scale
/// (`cell::carry_over`).
///
/// # Safety
/// `cell` and `cells` point to live map values, or to values of a caller's own.
#[inline(always)]
unsafe fn ready(cell: *mut Cell, cells: *mut Meter2Cells, rule: &Rule) -> bool {
    let m = rule.meter2;
    // SAFETY: the caller's.
    let scale = |cell: *mut Cell| unsafe { atomic::load(&raw const (*cell).scale) };
    unsafe {
        scale(cell) == rule.limit.scale()
            && (m.meters & METER2_EXCESS == 0
                || scale(&raw mut (*cells).excess) == m.excess.scale())
            && (m.meters & METER2_PACKETS == 0
                || scale(&raw mut (*cells).packets) == m.packets.scale())
            && (rule.aggregate_cell.is_null()
                || scale(rule.aggregate_cell) == rule.aggregate_limit.scale())
    }
}

/// Counts yellow frames (in this CPU's global and policy counters, and the key's) and the
/// packet-rate meter's refusals (this CPU's global and policy counters).
#[inline(always)]
fn count(colour: Colour, cells: *mut Meter2Cells, slot: u32, len: u32, counters: &mut Counters) {
    let bytes = u64::from(len);
    match colour {
        Ok(c) if c & YELLOW != 0 => {
            counters.meter2.yellow_packets += 1;
            counters.meter2.yellow_bytes += bytes;
            // SAFETY: this CPU's entry (see `cell::count_policy`); a live map value that
            // every CPU shares.
            unsafe {
                if let Some(s) = POLICY_STATS.get_ptr_mut(slot) {
                    (*s).meter2.yellow_packets += 1;
                    (*s).meter2.yellow_bytes += bytes;
                }
                atomic::add(&raw mut (*cells).yellow_packets, 1);
                atomic::add(&raw mut (*cells).yellow_bytes, bytes);
            }
        }
        Err(PACKET_RATE) => {
            counters.meter2.packet_rate_refused_packets += 1;
            counters.meter2.packet_rate_refused_bytes += bytes;
            if let Some(s) = POLICY_STATS.get_ptr_mut(slot) {
                // SAFETY: this CPU's entry.
                unsafe {
                    (*s).meter2.packet_rate_refused_packets += 1;
                    (*s).meter2.packet_rate_refused_bytes += bytes;
                }
            }
        }
        _ => {}
    }
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
    rule: &Rule,
    len: u32,
    now: u64,
    counters: &mut Counters,
) -> Colour {
    let m = rule.meter2;
    unsafe {
        let packets = &raw mut (*cells).packets;
        let packet = if m.meters & METER2_PACKETS != 0 {
            charge(packets, &m.packets, 1, now, counters).ok_or(PACKET_RATE)?
        } else {
            0
        };
        let mut tat = &raw mut (*cell).tat;
        let mut old = atomic::load(tat);
        let mut limit = rule.limit;
        let mut yellow = 0;
        let new = match rule.limit.admit(old, now, len) {
            Some(new) => new,
            None => {
                if m.meters & METER2_EXCESS == 0 {
                    give_back(packets, packet);
                    return Err(SOURCE);
                }
                tat = &raw mut (*cells).excess.tat;
                old = atomic::load(tat);
                limit = &m.excess;
                yellow = YELLOW;
                match m.excess.admit(old, now, len) {
                    Some(new) => new,
                    None => {
                        give_back(packets, packet);
                        return Err(SOURCE);
                    }
                }
            }
        };
        let aggregate = if rule.aggregate_cell.is_null() {
            0
        } else {
            match charge(
                rule.aggregate_cell,
                rule.aggregate_limit,
                len,
                now,
                counters,
            ) {
                Some(cost) => cost,
                None => {
                    give_back(packets, packet);
                    return Err(AGGREGATE);
                }
            }
        };
        if publish(tat, old, new, limit, len, now, 0, counters).is_none() {
            give_back(packets, packet);
            give_back(rule.aggregate_cell, aggregate);
            return Err(SOURCE);
        }
        Ok(yellow | aggregate << 1)
    }
}

/// Charges `len` to `cell` under `limit` if it conforms (policing; the cell is in the
/// limit's scale, see [`ready`]): what it was charged (ticks), or `None`.
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
pub unsafe fn give_back(cell: *mut Cell, cost: u64) {
    if cost != 0 && !cell.is_null() {
        // SAFETY: the caller's.
        unsafe { atomic::add(&raw mut (*cell).tat, cost.wrapping_neg()) };
    }
}

/// The DSCP policy `slot`'s yellow frames are marked with.
#[inline(always)]
pub fn dscp(slot: u32) -> Option<u8> {
    CONFIG
        .get(0)
        .map(|config| policy::meter2(config, slot).excess_dscp)
}

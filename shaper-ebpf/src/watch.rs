//! Sampled events of refused frames, for `shaper watch`.
//!
//! The entry (`entry::meter_frame`) calls [`refused`] with each metered frame's outcome;
//! a passed frame returns at once. For a frame dropped (or that would have been, in
//! monitor mode) while nobody watches, it costs one array lookup and one compare: the
//! lease in the control entry of `SHAPER_WATCH` has run out, or was never taken. While a
//! watcher holds it, each refused frame is metered in the watch's GCRA cell (an event
//! counts as one byte, at the watcher's events per second and burst) and, if it
//! conforms, described and written to the ring buffer `SHAPER_EVENTS`: the ring buffer
//! receives at most rate × time + burst events however hard the interface is flooded,
//! and only those frames pay for the description.
//!
//! The description is found again rather than carried out of the metering (which would
//! cost the per-packet path registers and the verifier states): the policy slot from the
//! prefix tries, the reason from the policy (blocked), the key's cell (full: its own
//! limit; room left: its prefix's aggregate) and the unadmitted flag.

use shaper_common::{
    gcra::TICK_SHIFT,
    maps::{
        ACTION_DROP, Config, Ipv4Key, Ipv6Key, REASON_AGGREGATE, REASON_BLOCKED, REASON_SOURCE,
        REASON_UNADMITTED, SourceState, WATCH_CONTROL, WATCH_METER, WatchEvent,
    },
};
use shaper_ebpf::atomic;

use crate::{
    cell::{Metered, Outcome},
    maps::{EVENTS, SOURCES, SOURCES6, WATCH},
    policy,
};

/// `sample_*`'s `info`: the frame's length in the low 32 bits, and these flags: the key
/// was refused a cell, the frame was passed in monitor mode.
const UNADMITTED: u64 = 1 << 32;
const WOULD_DROP: u64 = 1 << 33;

/// A metered frame of `len` bytes at `now` (ticks): if it was refused and someone
/// watches, `sample` (`sample_v4` or `sample_v6` with the key) is called with its `info`.
///
/// Called where the key is still at hand, as a scalar or on the stack: the sampling
/// function then takes no packet pointer, so the verifier's states at its call prune
/// as well as the rest of the per-packet path's.
#[inline(always)]
pub fn refused(metered: &Metered, len: u32, now: u64, sample: impl FnOnce(u64)) {
    if matches!(metered.outcome, Outcome::Passed) {
        return;
    }
    let Some(control) = WATCH.get(WATCH_CONTROL) else {
        return;
    };
    // The one check the refused path pays while nobody watches.
    if now >= control.until {
        return;
    }
    let mut info = u64::from(len);
    if metered.unadmitted {
        info |= UNADMITTED;
    }
    if matches!(metered.outcome, Outcome::WouldDrop) {
        info |= WOULD_DROP;
    }
    sample(info);
}

/// Samples a refused frame of IPv4 key `key` (see [`sample`]). A function of its own (a
/// BPF-to-BPF call): none of it is inlined into the per-packet path.
#[inline(never)]
pub fn sample_v4(key: Ipv4Key, config: &Config, info: u64, now: u64) {
    let Some(mut event) = take(info, now) else {
        return;
    };
    event.key[..4].copy_from_slice(&key.to_ne_bytes());
    event.family = 4;
    event.slot = policy::slot_v4(&key, config);
    let state = SOURCES.get_ptr_mut(key);
    emit(event, config, info, state, now);
}

/// Samples a refused frame of IPv6 key `key`, as [`sample_v4`].
#[inline(never)]
pub fn sample_v6(key: &Ipv6Key, config: &Config, info: u64, now: u64) {
    let Some(mut event) = take(info, now) else {
        return;
    };
    event.key = *key;
    event.family = 6;
    event.slot = policy::slot_v6(key, config);
    let state = SOURCES6.get_ptr_mut(key);
    emit(event, config, info, state, now);
}

/// Meters an event in the watch's cell: the event to fill in if it conforms.
#[inline(always)]
fn take(info: u64, now: u64) -> Option<WatchEvent> {
    let control = WATCH.get(WATCH_CONTROL)?;
    let meter = WATCH.get_ptr_mut(WATCH_METER)?;
    // SAFETY: `meter` points to a live map value; its TAT is only ever swapped.
    unsafe {
        let tat = &raw mut (*meter).cell.tat;
        let old = atomic::load(tat);
        // One try: a lost race means another CPU just took an event, and a sample may
        // miss one.
        let new = control.limit.admit(old, now, 1)?;
        atomic::compare_exchange(tat, old, new).ok()?;
    }
    Some(WatchEvent {
        time_ns: now >> TICK_SHIFT,
        bytes: info as u32,
        would_drop: u8::from(info & WOULD_DROP != 0),
        ..WatchEvent::default()
    })
}

/// Gives the event its reason and writes it to the ring buffer.
#[inline(always)]
fn emit(
    mut event: WatchEvent,
    config: &Config,
    info: u64,
    state: Option<*mut SourceState>,
    now: u64,
) {
    event.reason = if info & UNADMITTED != 0 {
        REASON_UNADMITTED
    } else {
        reason(config, event.slot, state, info as u32, now)
    };
    if EVENTS.output::<WatchEvent>(&event, 0).is_err()
        && let Some(meter) = WATCH.get_ptr_mut(WATCH_METER)
    {
        // SAFETY: a live map value.
        unsafe { atomic::add(&raw mut (*meter).lost, 1) };
    }
}
/// Why a frame of a key with a cell of its own (`state`) was refused under the policy
/// of `slot`: blocked, or its own cell full, or else its prefix's aggregate.
#[inline(always)]
fn reason(config: &Config, slot: u32, state: Option<*mut SourceState>, len: u32, now: u64) -> u8 {
    let rule = policy::rule(config, slot);
    if rule.action == ACTION_DROP {
        return REASON_BLOCKED;
    }
    if rule.aggregate_cell.is_null() {
        return REASON_SOURCE;
    }
    // The source's cell had room for the frame: its prefix's cell had not.
    let Some(state) = state else {
        return REASON_SOURCE;
    };
    // SAFETY: a live map value; a racy read is good enough for a description.
    let tat = unsafe { atomic::load(&raw const (*state).cell.tat) };
    if rule.limit.admit(tat, now, len).is_some() {
        REASON_AGGREGATE
    } else {
        REASON_SOURCE
    }
}

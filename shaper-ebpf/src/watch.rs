//! Sampled events of refused frames, for `shaper watch`.
//!
//! The metering functions (`meter`) ask [`watched`] about each frame they metered; a
//! passed frame returns at once. For a frame dropped (or that would have been, in monitor
//! mode) while nobody watches, it costs one array lookup and one compare: the lease in the
//! control entry of `SHAPER_WATCH` has run out, or was never taken. While a watcher holds
//! it, the metering function describes the frame (key, policy slot, reason, bytes: all
//! known to it already) and hands it to [`shaper_sample`], which meters the event in the
//! watch's GCRA cell (an event counts as one byte, at the watcher's events per second and
//! burst) and, if it conforms, writes it to the ring buffer `SHAPER_EVENTS`: the ring
//! buffer receives at most rate × time + burst events however hard the interface is
//! flooded.

use shaper_common::{
    gcra::TICK_SHIFT,
    maps::{REASON_UNADMITTED, WATCH_CONTROL, WATCH_METER, WatchEvent},
};
use shaper_ebpf::atomic;

use crate::{
    maps::{EVENTS, WATCH},
    outcome::{Metered, Outcome},
};

/// Whether a frame metered at `now` (ticks) was refused while someone watches.
#[inline(always)]
pub fn watched(metered: Metered, now: u64) -> bool {
    if metered.outcome() == Outcome::Passed {
        return false;
    }
    // The one check the refused path pays while nobody watches.
    WATCH
        .get(WATCH_CONTROL)
        .is_some_and(|control| now < control.until)
}

/// A refused frame of `len` bytes under policy `slot`, for [`shaper_sample`]: its length in
/// bits 0–31, the slot in 32–47, the `REASON_*` in 48–55, would-drop in bit 56 and an IPv6
/// key in bit 57.
#[inline(always)]
pub fn info(metered: Metered, slot: u32, len: u32, family: u8) -> u64 {
    let reason = if metered.is_unadmitted() {
        REASON_UNADMITTED
    } else {
        metered.reason()
    };
    u64::from(len)
        | u64::from(slot & 0xffff) << 32
        | u64::from(reason) << 48
        | u64::from(metered.outcome() == Outcome::WouldDrop) << 56
        | u64::from(family == 6) << 57
}

/// Meters the event of a refused frame seen at `now` (key `hi` ‖ `lo`: an IPv4 key in
/// the low 32 bits of `hi`; the rest in `info`, see [`info`]) in the watch's cell and, if
/// it conforms, writes it to the ring buffer. A global function, called only while
/// someone watches: none of it is inlined into the per-packet path. Returns 1 if the event
/// was written.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn shaper_sample(hi: u64, lo: u64, info: u64, now: u64) -> u32 {
    let (Some(control), Some(meter)) = (WATCH.get(WATCH_CONTROL), WATCH.get_ptr_mut(WATCH_METER))
    else {
        return 0;
    };
    // SAFETY: `meter` points to a live map value; its TAT is only ever swapped.
    unsafe {
        let tat = &raw mut (*meter).cell.tat;
        let old = atomic::load(tat);
        // One try: a lost race means another CPU just took an event, and a sample may
        // miss one.
        let Some(new) = control.limit.admit(old, now, 1) else {
            return 0;
        };
        if atomic::compare_exchange(tat, old, new).is_err() {
            return 0;
        }
    }
    let ipv6 = info >> 57 & 1 != 0;
    let mut event = WatchEvent {
        time_ns: now >> TICK_SHIFT,
        bytes: info as u32,
        slot: (info >> 32) as u32 & 0xffff,
        reason: (info >> 48) as u8,
        would_drop: (info >> 56) as u8 & 1,
        family: if ipv6 { 6 } else { 4 },
        ..WatchEvent::default()
    };
    if ipv6 {
        event.key[..8].copy_from_slice(&hi.to_ne_bytes());
        event.key[8..].copy_from_slice(&lo.to_ne_bytes());
    } else {
        event.key[..4].copy_from_slice(&(hi as u32).to_ne_bytes());
    }
    if EVENTS.output::<WatchEvent>(&event, 0).is_err() {
        // SAFETY: a live map value.
        unsafe { atomic::add(&raw mut (*meter).lost, 1) };
        return 0;
    }
    1
}

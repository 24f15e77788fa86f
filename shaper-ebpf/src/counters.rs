//! Global per-CPU counters: plain increments, since each CPU owns its entry.

use shaper_common::maps::Counters;

use crate::maps::COUNTERS;

/// Applies `f` to this CPU's counters (a no-op if the map lookup fails, which it cannot
/// for index 0 of a one-entry array).
#[inline(always)]
pub fn bump(f: impl FnOnce(&mut Counters)) {
    if let Some(c) = COUNTERS.get_ptr_mut(0) {
        // SAFETY: a per-CPU entry is only touched by programs on this CPU, and BPF
        // programs are not preempted by each other on one CPU.
        f(unsafe { &mut *c });
    }
}

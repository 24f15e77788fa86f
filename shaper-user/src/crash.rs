//! Crash points for the fault tests: `SHAPER_TEST_CRASH_AT=STEP` (or `STEP#N`, the Nth
//! time the step is reached) makes the binary SIGKILL itself there, so a test can stop a
//! change at every step in turn and check what the next command finds. Compiled only
//! into debug builds (the tests'); a release build ignores the variable.

/// The environment variable naming the step to die at.
pub const CRASH_AT_VAR: &str = "SHAPER_TEST_CRASH_AT";

/// Dies by SIGKILL here if [`CRASH_AT_VAR`] names `step` (and this is its Nth time).
#[cfg(debug_assertions)]
pub fn point(step: &str) {
    use std::{cell::RefCell, collections::HashMap};
    thread_local! {
        static REACHED: RefCell<HashMap<String, u32>> = RefCell::new(HashMap::new());
    }
    let Some(wanted) = std::env::var_os(CRASH_AT_VAR) else {
        return;
    };
    let wanted = wanted.to_string_lossy();
    let (name, nth) = match wanted.split_once('#') {
        Some((name, n)) => (name, n.parse().unwrap_or(1)),
        None => (&*wanted, 1),
    };
    if name != step {
        return;
    }
    let count = REACHED.with_borrow_mut(|r| {
        let c = r.entry(step.to_owned()).or_default();
        *c += 1;
        *c
    });
    if count == nth {
        // SAFETY: signalling ourselves.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    }
}

#[cfg(not(debug_assertions))]
#[inline(always)]
pub fn point(_step: &str) {}

//! Crash points for the fault tests: `SHAPER_TEST_CRASH_AT=STEP` (or `STEP#N`, the Nth
//! time the step is reached) makes the binary SIGKILL itself there, so a test can stop a
//! change at every step in turn and check what the next command finds. Hold points:
//! `SHAPER_TEST_HOLD_AT=STEP:PATH[,STEP:PATH...]` keeps the thread that reaches a step
//! there while its file PATH exists, so a test can order what happens meanwhile without
//! timing it.
//! Compiled only into debug builds (the tests'); a release build ignores the variables.

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

/// The environment variable naming the step to hold at and the file that holds it.
pub const HOLD_AT_VAR: &str = "SHAPER_TEST_HOLD_AT";

/// The longest a hold point holds, whatever its file: a test that forgets it does not
/// leave a daemon stuck.
#[cfg(debug_assertions)]
const HOLD_AT_MOST: std::time::Duration = std::time::Duration::from_secs(60);

/// Waits here while the file [`HOLD_AT_VAR`] names exists, if it names `step`; before
/// waiting, makes the file `PATH.held`, so the test knows the hold is reached.
#[cfg(debug_assertions)]
pub fn hold(step: &str) {
    let Some(wanted) = std::env::var_os(HOLD_AT_VAR) else {
        return;
    };
    let wanted = wanted.to_string_lossy();
    let Some((_, path)) = wanted
        .split(',')
        .filter_map(|pair| pair.split_once(':'))
        .find(|(name, _)| *name == step)
    else {
        return;
    };
    let path = std::path::Path::new(path);
    let mut held = path.as_os_str().to_owned();
    held.push(".held");
    let _ = std::fs::write(held, b"");
    let since = std::time::Instant::now();
    while path.exists() && since.elapsed() < HOLD_AT_MOST {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

#[cfg(not(debug_assertions))]
#[inline(always)]
pub fn hold(_step: &str) {}

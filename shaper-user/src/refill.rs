//! Map writes the kernel refuses for want of memory it has: from Linux 6.13 a prefix trie
//! takes its nodes (and from 6.1 a hash map without preallocation its entries) from a
//! per-CPU cache that the kernel refills asynchronously, and a write that finds the cache
//! empty fails with ENOMEM with memory to spare (seen here once on 6.18, adding one route
//! in a bench run; the amazonlinux/amazon-linux-2023 issue 1129, on arm64, where a batch
//! fails at its second entry). A moment later the same write succeeds, so every write of
//! such a map goes through [`refilled`] or [`refilled_map`]: tried again a few times, a
//! quarter of a second in all, before its error is told.

use aya::maps::MapError;

/// How many times [`refilled`] tries a write again, and how long it waits before the first
/// retry (doubled before each next one): 1 + 2 + ... + 128 ms, a quarter second in all.
const REFILL_TRIES: u32 = 8;
const REFILL_WAIT: std::time::Duration = std::time::Duration::from_millis(1);

/// Runs the map write `write` until it succeeds, fails otherwise than with ENOMEM, or has
/// been refused [`REFILL_TRIES`] times more. `write` keeps its own place, so a retry
/// writes only what was not written.
pub fn refilled<T>(write: impl FnMut() -> std::io::Result<T>) -> std::io::Result<T> {
    retried(
        |e: &std::io::Error| e.raw_os_error() == Some(libc::ENOMEM),
        write,
    )
}

/// [`refilled`] for aya's own writes (`insert`, `set`), whose errors are [`MapError`]s.
pub fn refilled_map<T>(write: impl FnMut() -> Result<T, MapError>) -> Result<T, MapError> {
    retried(
        |e: &MapError| matches!(e, MapError::SyscallError(s) if s.io_error.raw_os_error() == Some(libc::ENOMEM)),
        write,
    )
}

/// Writes `n` entries by `write(done, left)`, which writes up to `left` of them from entry
/// `done` in one call and says how many it wrote and its call's result (a batch), through
/// [`refilled`]: a call refused in part goes on from where it stopped at once, one refused
/// at its first entry waits as [`refilled`] does.
pub fn resumed(
    n: usize,
    mut write: impl FnMut(usize, usize) -> (usize, std::io::Result<()>),
) -> std::io::Result<()> {
    let mut done = 0;
    while done < n {
        refilled(|| {
            let left = n - done;
            let (written, result) = write(done, left);
            done += written.min(left);
            match result {
                // Written in part: go on from there (the next refusal waits afresh).
                Err(e) if written > 0 && e.raw_os_error() == Some(libc::ENOMEM) => Ok(()),
                Ok(()) if written < left => Err(std::io::Error::other(format!(
                    "{written} of {left} entries written"
                ))),
                result => result,
            }
        })?;
    }
    Ok(())
}

fn retried<T, E>(
    refused: impl Fn(&E) -> bool,
    mut write: impl FnMut() -> Result<T, E>,
) -> Result<T, E> {
    let mut wait = REFILL_WAIT;
    for _ in 0..REFILL_TRIES {
        match write() {
            Err(e) if refused(&e) => std::thread::sleep(wait),
            result => return result,
        }
        wait *= 2;
    }
    write()
}

#[cfg(test)]
mod tests {
    use std::io;

    use super::*;

    fn enomem() -> io::Error {
        io::Error::from_raw_os_error(libc::ENOMEM)
    }

    #[test]
    fn a_refused_write_is_tried_again_until_it_succeeds() {
        let mut calls = 0;
        let r = refilled(|| {
            calls += 1;
            if calls < 4 { Err(enomem()) } else { Ok(calls) }
        });
        assert_eq!(r.unwrap(), 4);
    }

    #[test]
    fn another_error_is_told_at_once() {
        let mut calls = 0;
        let r: io::Result<()> = refilled(|| {
            calls += 1;
            Err(io::Error::from_raw_os_error(libc::ENOSPC))
        });
        assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::ENOSPC));
        assert_eq!(calls, 1);
    }

    #[test]
    fn a_write_always_refused_is_told_after_the_last_try() {
        let mut calls = 0;
        let r: io::Result<()> = refilled(|| {
            calls += 1;
            Err(enomem())
        });
        assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::ENOMEM));
        assert_eq!(calls, REFILL_TRIES + 1);
    }

    #[test]
    fn a_batch_refused_in_part_goes_on_from_where_it_stopped() {
        // Each call writes at most 3 entries, then is refused: more refusals in a row than
        // a write is tried, each from where the last stopped; then one refused at its first
        // entry, retried from the same place.
        let n = 3 * (REFILL_TRIES as usize + 2) + 1;
        let (mut calls, mut starts) = (0, Vec::new());
        let r = resumed(n, |done, left| {
            calls += 1;
            starts.push(done);
            match (calls, left) {
                (c, _) if c == REFILL_TRIES + 3 => (0, Err(enomem())),
                (_, left) if left > 3 => (3, Err(enomem())),
                (_, left) => (left, Ok(())),
            }
        });
        assert!(r.is_ok());
        let mut expected: Vec<usize> = (0..n).step_by(3).collect();
        expected.insert(REFILL_TRIES as usize + 2, 3 * (REFILL_TRIES as usize + 2));
        assert_eq!(starts, expected);
        let (mut calls, mut starts) = (0, Vec::new());
        resumed(4, |done, left| {
            calls += 1;
            starts.push(done);
            match calls {
                1 => (2, Err(enomem())),
                2 => (0, Err(enomem())),
                _ => (left, Ok(())),
            }
        })
        .unwrap();
        assert_eq!(starts, [0, 2, 2]);
    }

    #[test]
    fn a_batch_that_writes_nothing_and_says_so_fails() {
        let r = resumed(4, |_, _| (0, Ok(())));
        assert!(
            r.unwrap_err()
                .to_string()
                .contains("0 of 4 entries written")
        );
        let r = resumed(4, |_, _| {
            (0, Err(io::Error::from_raw_os_error(libc::E2BIG)))
        });
        assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::E2BIG));
    }

    #[test]
    fn an_aya_write_refused_is_tried_again() {
        let mut calls = 0;
        let r = refilled_map(|| {
            calls += 1;
            match calls {
                1 => Err(MapError::SyscallError(aya::sys::SyscallError {
                    call: "bpf_map_update_elem",
                    io_error: enomem(),
                })),
                _ => Ok(()),
            }
        });
        assert!(r.is_ok());
        assert_eq!(calls, 2);
        let r: Result<(), MapError> = refilled_map(|| Err(MapError::KeyNotFound));
        assert!(matches!(r, Err(MapError::KeyNotFound)));
    }
}

//! The watcher's side of the sampled events of refused frames (`shaper watch`): the lease
//! in the pinned control map `SHAPER_WATCH` that switches sampling on, and the events read
//! from the ring buffer `SHAPER_EVENTS` (see `shaper-ebpf/src/watch.rs`).
//!
//! A watcher takes the lease under the host lock, for [`LEASE`], and renews it every
//! [`RENEW`]; it clears it when it exits. A watcher killed without a word (SIGKILL, a
//! crash) leaves sampling on until its lease runs out, at most [`LEASE`]. One watcher at
//! a time per attachment: a second is refused while the lease is held by a live process
//! (the ring buffer has one reader, and the events would be split between two).

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    time::Duration,
};

use aya::maps::{Array, Map, MapData, MapError, RingBuf};
use shaper_common::{
    gcra::{Limit, ticks_from_ns},
    maps::{
        Config, REASON_AGGREGATE, REASON_BLOCKED, REASON_PACKET_RATE, REASON_SOURCE,
        REASON_UNADMITTED, WATCH_CONTROL, WATCH_METER, Watch, WatchEvent,
    },
};

use crate::{maps::KeyNet, pins::Attachment, system, upgrade};

/// How long a lease lasts without renewal: how long sampling stays on after a watcher is
/// killed.
pub const LEASE: Duration = Duration::from_secs(3);
/// How often a watcher renews its lease.
pub const RENEW: Duration = Duration::from_secs(1);
/// The most events a second a watcher may ask for (the ring buffer holds 5461).
pub const MAX_EVENTS_PER_SEC: u32 = 100_000;

#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error(
        "{label} is already watched by process {pid} (`shaper watch`, {rate} events/s): one watcher at a time; stop that one first"
    )]
    Busy { label: String, pid: u32, rate: u32 },
    #[error("invalid --rate {0}: events per second from 1 to {MAX_EVENTS_PER_SEC}")]
    Rate(u32),
    #[error("invalid --burst {0}: at least 1 event")]
    Burst(u32),
    #[error("cannot {what} ({path})")]
    Map {
        what: &'static str,
        path: String,
        source: MapError,
    },
    #[error(transparent)]
    Layout(#[from] upgrade::UpgradeError),
    #[error(transparent)]
    System(#[from] system::SystemError),
}

/// CLOCK_MONOTONIC, which `bpf_ktime_get_ns` reads, in nanoseconds.
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// CLOCK_REALTIME in nanoseconds since the epoch.
pub fn realtime_ns() -> u64 {
    clock_ns(libc::CLOCK_REALTIME)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write to.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Whether process `pid` exists (in this PID namespace).
fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists and may be signalled.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// The control map of an attachment.
pub struct Control {
    at: Attachment,
    map: Array<MapData, Watch>,
    control: Watch,
}

fn map_err(what: &'static str, at: &Attachment) -> impl FnOnce(MapError) -> WatchError {
    let path = at.watch().display().to_string();
    move |source| WatchError::Map { what, path, source }
}

/// The control entry of `at`'s pins as it is (for tests and `status`-like reads).
pub fn read_control(at: &Attachment) -> Result<(Watch, Watch), WatchError> {
    upgrade::require_current(at)?;
    let map = open_control(at)?;
    let control = map
        .get(&WATCH_CONTROL, 0)
        .map_err(map_err("read the watch control", at))?;
    let meter = map
        .get(&WATCH_METER, 0)
        .map_err(map_err("read the watch meter", at))?;
    Ok((control, meter))
}

fn open_control(at: &Attachment) -> Result<Array<MapData, Watch>, WatchError> {
    let open = || -> Result<_, MapError> {
        let data = MapData::from_pin(at.watch())?;
        Array::try_from(Map::from_map_data(data)?)
    };
    open().map_err(map_err("open the watch control", at))
}

impl Control {
    /// Takes the lease of `at` for this process, sampling up to `rate` events a second and
    /// `burst` at once; refused while another live watcher holds it.
    pub fn take(at: &Attachment, rate: u32, burst: u32) -> Result<Self, WatchError> {
        if rate == 0 || rate > MAX_EVENTS_PER_SEC {
            return Err(WatchError::Rate(rate));
        }
        if burst == 0 {
            return Err(WatchError::Burst(burst));
        }
        upgrade::require_current(at)?;
        let limit = Limit::new(8 * u64::from(rate), u64::from(burst))
            .map_err(|_| WatchError::Rate(rate))?;
        // Two watchers starting at once: one takes the lease, the other sees it taken.
        let _lock = system::lock()?;
        let mut map = open_control(at)?;
        let held = map
            .get(&WATCH_CONTROL, 0)
            .map_err(map_err("read the watch control", at))?;
        let me = std::process::id();
        let now = ticks_from_ns(monotonic_ns());
        if held.until > now && held.pid != 0 && held.pid != me && alive(held.pid) {
            return Err(WatchError::Busy {
                label: at.label(),
                pid: held.pid,
                rate: held.events_per_sec,
            });
        }
        // A fresh meter (the program writes it only while a lease is held: none is).
        map.set(WATCH_METER, Watch::default(), 0)
            .map_err(map_err("reset the watch meter", at))?;
        let control = Watch {
            limit,
            pid: me,
            events_per_sec: rate,
            burst,
            ..Watch::default()
        };
        let mut c = Self {
            at: at.clone(),
            map,
            control,
        };
        c.renew()?;
        Ok(c)
    }

    /// Extends the lease by [`LEASE`] from now.
    pub fn renew(&mut self) -> Result<(), WatchError> {
        self.control.until = ticks_from_ns(monotonic_ns() + LEASE.as_nanos() as u64);
        self.map
            .set(WATCH_CONTROL, self.control, 0)
            .map_err(map_err("write the watch control", &self.at))
    }

    /// Events the ring buffer had no room for so far.
    pub fn lost(&self) -> u64 {
        self.map
            .get(&WATCH_METER, 0)
            .map(|m| m.lost)
            .unwrap_or_default()
    }

    /// Ends the lease: sampling stops at once.
    pub fn release(&mut self) -> Result<(), WatchError> {
        self.control.until = 0;
        self.control.pid = 0;
        self.map
            .set(WATCH_CONTROL, self.control, 0)
            .map_err(map_err("clear the watch control", &self.at))
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        if self.control.pid != 0 {
            let _ = self.release();
        }
    }
}

/// The ring buffer of `at`'s events.
pub fn open_events(at: &Attachment) -> Result<RingBuf<MapData>, WatchError> {
    let path = at.events();
    let open = || -> Result<_, MapError> {
        let data = MapData::from_pin(&path)?;
        RingBuf::try_from(Map::from_map_data(data)?)
    };
    open().map_err(|source| WatchError::Map {
        what: "open the events ring buffer",
        path: path.display().to_string(),
        source,
    })
}

/// An event as read from the ring buffer, `None` if the record is not one.
pub fn decode(bytes: &[u8]) -> Option<WatchEvent> {
    if bytes.len() < size_of::<WatchEvent>() {
        return None;
    }
    // SAFETY: WatchEvent is plain old data of this size; read unaligned.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<WatchEvent>()) })
}

/// The event's key as an operator reads it (masked to the configured prefix, or whole:
/// [`KeyNet::of_key`]).
pub fn key_of(event: &WatchEvent, config: &Config) -> KeyNet {
    let addr = if event.family == 4 {
        let b = &event.key;
        IpAddr::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3]))
    } else {
        IpAddr::V6(Ipv6Addr::from(event.key))
    };
    KeyNet::of_key(addr, config)
}

/// The reason's name in JSON (`source_limit`, `aggregate`, `blocked`, `unadmitted`,
/// `packet_rate`).
pub fn reason_name(reason: u8) -> &'static str {
    match reason {
        REASON_SOURCE => "source_limit",
        REASON_AGGREGATE => "aggregate",
        REASON_BLOCKED => "blocked",
        REASON_UNADMITTED => "unadmitted",
        REASON_PACKET_RATE => "packet_rate",
        _ => "unknown",
    }
}

//! Which LRU the per-source map should use, measured under a flood of new sources from
//! every CPU: the common LRU (one list for all CPUs, map flags 0, what shaper uses) or
//! per-CPU LRU lists (`BPF_F_NO_COMMON_LRU`).
//!
//! aya cannot set a map's flags, but it reuses a map already pinned where
//! `map_pin_path` points. So the source map is created here with `bpf(BPF_MAP_CREATE)`,
//! with the flags under test, pinned in a directory of its own on bpffs (removed
//! afterwards), and the object loaded on it; the program is the product's, unchanged.
//!
//! Each measurement: a map of `entries` keys; `entries / 16` *real* sources, each owned
//! by one CPU (as RSS would spread them), get their first frame, then one thread per
//! online CPU, pinned to it (`BPF_PROG_TEST_RUN` runs on the calling CPU), sends frames of
//! distinct never-seen sources, all at once, admission unlimited (the worst case: every
//! frame inserts). After every `every` of its flood frames a thread sends a frame of its
//! next real source, so each real source is refreshed once per `refresh_every` flood
//! frames over all CPUs (`real × every`). A table that kept the most recently seen keys
//! would then never lose a real source while `refresh_every + real` stays below its
//! size. Afterwards every real source is looked up from userspace (which does not mark
//! entries referenced): one whose passed-packet count is short of what it sent lost its
//! entry at least once (evicted, then created again), one missing lost it at the end.
//!
//! Costs: a flood frame is timed single shot and reported as its excess over a no-op
//! timed the same way, added to the no-op's loop figure (as in `per_packet`); a known
//! source's pass is a short loop measurement (`PASS_REPEAT` runs) taken quietly before
//! the flood and again every `PROBE_EVERY` flood frames during it. No asserts on timing.

use std::{
    net::Ipv4Addr,
    os::fd::{FromRawFd as _, OwnedFd},
    path::{Path, PathBuf},
    sync::Barrier,
    thread,
};

use anyhow::{Context as _, Result, bail, ensure};
use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap, MapData, MapError},
    programs::Xdp,
};
use serde::Serialize;
use shaper_common::{
    bench::PROG_NOOP,
    maps::{Ipv4Key, MAP_SOURCES, PROG_XDP, SourceState},
};
use shaper_user::object;

use super::{builds::single_rate, spread::median};
use crate::{
    frame,
    testrun::{XDP_PASS, key, noop, open, test_run_xdp},
};

/// `BPF_MAP_CREATE`, `BPF_MAP_TYPE_LRU_HASH` and the flag under test (uapi/linux/bpf.h).
const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_TYPE_LRU_HASH: u32 = 9;
pub const BPF_F_NO_COMMON_LRU: u32 = 2;

const FRAME_BYTES: usize = 64;
/// Runs of a known source's frame per pass-cost probe.
const PASS_REPEAT: u32 = 1_000;
/// Flood frames between two pass-cost probes, per thread.
const PROBE_EVERY: usize = 1_024;
/// Frames per no-op baseline (single shot), and runs per no-op loop figure.
const NOOP_FRAMES: usize = 2_000;
const NOOP_REPEAT: u32 = 100_000;

#[derive(Clone, Debug)]
pub struct Options {
    /// Map sizes.
    pub entries: Vec<u32>,
    /// Flood frames between two frames of a real source's, per thread, over the number
    /// of real sources a thread owns: each real source is refreshed every
    /// `real × every` flood frames (all CPUs together).
    pub every: Vec<usize>,
    /// Flood frames per measurement, as a multiple of the map size.
    pub flood_tables: usize,
    /// Measurements per configuration.
    pub reps: usize,
}

impl Options {
    pub fn new(quick: bool) -> Self {
        Options {
            entries: if quick {
                vec![4_096]
            } else {
                vec![4_096, 65_536]
            },
            every: vec![8, 12, 16, 24],
            flood_tables: 4,
            reps: if quick { 1 } else { 3 },
        }
    }
}

/// One measurement.
#[derive(Clone, Debug, Serialize)]
pub struct Measurement {
    pub map_flags: u32,
    pub entries: u32,
    pub real_sources: u32,
    /// Flood frames (all CPUs) between two frames of one real source.
    pub refresh_every: u64,
    pub flood_frames: u64,
    /// Real sources that lost their entry at least once, and those without one at the end.
    pub evicted: u32,
    pub missing_at_end: u32,
    /// Entries in the map at the end (flood and real).
    pub entries_at_end: u32,
    /// A flood frame: noop(loop) + (flood(single) − noop(single)), mean over CPUs.
    pub flood_ns: f64,
    pub noop_ns: f64,
    /// A known source's pass (loop), before the flood and during it (medians).
    pub pass_quiet_ns: f64,
    pub pass_flood_ns: f64,
}

/// What one thread measured.
#[derive(Default)]
struct ThreadResult {
    noop_loop: f64,
    noop_single: f64,
    flood_single: f64,
    pass_quiet: f64,
    pass_flood: Vec<f64>,
    /// (real source, frames sent).
    sent: Vec<(Ipv4Addr, u64)>,
}

/// A directory on bpffs for this process's pins, removed (with what is in it) when
/// dropped.
struct PinDir(PathBuf);

impl PinDir {
    fn new() -> Result<Self> {
        let dir = PathBuf::from(format!(
            "/sys/fs/bpf/shaper-bench-lru-{}",
            std::process::id()
        ));
        std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(PinDir(dir))
    }
}

impl Drop for PinDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0) {
            eprintln!(
                "shaper-lab: warning: cannot remove {}: {e}",
                self.0.display()
            );
        }
    }
}

/// The head of `union bpf_attr` for `BPF_MAP_CREATE`, up to the name; the kernel reads
/// the fields after it as zero.
#[repr(C)]
struct MapCreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    inner_map_fd: u32,
    numa_node: u32,
    map_name: [u8; 16],
}

/// A source map as the object declares it (IPv4 keys), but with `map_flags`, pinned at
/// `path`.
fn create_sources(path: &Path, entries: u32, map_flags: u32) -> Result<()> {
    let mut map_name = [0; 16];
    map_name[..MAP_SOURCES.len()].copy_from_slice(MAP_SOURCES.as_bytes());
    let attr = MapCreateAttr {
        map_type: BPF_MAP_TYPE_LRU_HASH,
        key_size: size_of::<Ipv4Key>() as u32,
        value_size: size_of::<SourceState>() as u32,
        max_entries: entries,
        map_flags,
        inner_map_fd: 0,
        numa_node: 0,
        map_name,
    };
    // SAFETY: `attr` is a valid, initialised bpf_attr prefix of the size passed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_CREATE,
            &raw const attr,
            size_of::<MapCreateAttr>() as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("BPF_MAP_CREATE");
    }
    // SAFETY: the kernel just returned this descriptor to us, and nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let map = MapData::from_fd(fd)?;
    map.pin(path)
        .with_context(|| format!("pinning at {}", path.display()))?;
    Ok(())
}

/// The object loaded on the source map pinned at `path` (the IPv6 one sized alike),
/// with both programs and the open policy.
fn load_on(path: &Path, entries: u32) -> Result<Ebpf> {
    let mut loader = EbpfLoader::new();
    loader.map_pin_path(MAP_SOURCES, path);
    single_rate(entries).apply(&mut loader);
    let ebpf = loader
        .load(object::EBPF_OBJECT)
        .context("loading the object on the pinned map")?;
    open(ebpf)
}

/// Pins the calling thread to `cpu` (`BPF_PROG_TEST_RUN` runs on the calling CPU).
pub fn pin_to_cpu(cpu: usize) -> Result<()> {
    // SAFETY: a zeroed cpu_set_t filled by the libc helper, valid for the call.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("pinning a thread to CPU {cpu}"));
        }
    }
    Ok(())
}

/// CPUs online now.
pub fn online_cpus() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(n).unwrap_or(1).max(1)
}

/// Real source `i` (198.18.0.0/15), the known source of CPU `cpu` (198.19.255.0/24) and
/// flood source `i` of CPU `cpu` (`cpu + 1`.0.0.0/8).
fn real(i: u32) -> Ipv4Addr {
    Ipv4Addr::from(0xC612_0000 + i)
}

fn known(cpu: usize) -> Ipv4Addr {
    Ipv4Addr::from(0xC613_FF00 + cpu as u32)
}

fn flood(cpu: usize, i: usize) -> Ipv4Addr {
    Ipv4Addr::from(((cpu as u32 + 1) << 24) + i as u32)
}

/// What every thread of a measurement does.
#[derive(Clone, Copy)]
struct Plan {
    cpus: usize,
    real_sources: u32,
    /// Flood frames between two real-source frames, per thread.
    every: usize,
    /// Flood frames per thread.
    flood_frames: usize,
}

/// One thread's part, on CPU `cpu`: its real sources' first frames, the quiet baselines,
/// then (once every thread is ready) its share of the flood.
fn flood_thread(
    prog: &Xdp,
    noop: &Xdp,
    barrier: &Barrier,
    cpu: usize,
    plan: Plan,
) -> Result<ThreadResult> {
    let Plan {
        cpus,
        real_sources,
        every,
        flood_frames,
    } = plan;
    pin_to_cpu(cpu)?;
    let run = |f: &[u8], repeat| test_run_xdp(prog, f, repeat, XDP_PASS);
    let mut r = ThreadResult::default();
    let mut real_frames = Vec::new();
    for i in (0..real_sources).filter(|i| *i as usize % cpus == cpu) {
        let f = frame::ipv4_udp(real(i), FRAME_BYTES);
        run(&f, 1)?;
        r.sent.push((real(i), 1));
        real_frames.push(f);
    }
    let known = frame::ipv4_udp(known(cpu), FRAME_BYTES);
    run(&known, 1)?;
    r.noop_loop = test_run_xdp(noop, &known, NOOP_REPEAT, XDP_PASS)?;
    let mut total = 0.0;
    for _ in 0..NOOP_FRAMES {
        total += test_run_xdp(noop, &known, 1, XDP_PASS)?;
    }
    r.noop_single = total / NOOP_FRAMES as f64;
    let quiet = (0..16)
        .map(|_| run(&known, PASS_REPEAT))
        .collect::<Result<Vec<_>>>()?;
    r.pass_quiet = median(&quiet);

    barrier.wait();
    let mut total = 0.0;
    let mut next_real = 0;
    for i in 0..flood_frames {
        total += run(&frame::ipv4_udp(flood(cpu, i), FRAME_BYTES), 1)?;
        if i % every == every - 1 && !real_frames.is_empty() {
            run(&real_frames[next_real], 1)?;
            r.sent[next_real].1 += 1;
            next_real = (next_real + 1) % real_frames.len();
        }
        if i % PROBE_EVERY == PROBE_EVERY / 2 {
            r.pass_flood.push(run(&known, PASS_REPEAT)?);
        }
    }
    r.flood_single = total / flood_frames as f64;
    Ok(r)
}

/// One measurement on a fresh map of `entries` keys with `map_flags`.
fn measure(entries: u32, map_flags: u32, every: usize, flood_tables: usize) -> Result<Measurement> {
    let cpus = online_cpus();
    let real_sources = entries / 16;
    let flood_per_cpu = entries as usize * flood_tables / cpus;
    let dir = PinDir::new()?;
    let path = dir.0.join("sources");
    create_sources(&path, entries, map_flags)?;
    let ebpf = load_on(&path, entries)?;
    let info = MapData::from_pin(&path)?.info()?;
    ensure!(
        info.map_flags() == map_flags && info.max_entries() == entries,
        "the pinned map has flags {:#x} and {} entries, not {map_flags:#x} and {entries}",
        info.map_flags(),
        info.max_entries()
    );
    let prog: &Xdp = ebpf
        .program(PROG_XDP)
        .context("program missing")?
        .try_into()?;
    let baseline = noop()?;
    let noop: &Xdp = baseline
        .program(PROG_NOOP)
        .context("program missing")?
        .try_into()?;
    let barrier = Barrier::new(cpus);
    let plan = Plan {
        cpus,
        real_sources,
        every,
        flood_frames: flood_per_cpu,
    };
    let results = thread::scope(|s| {
        let handles: Vec<_> = (0..cpus)
            .map(|cpu| {
                let barrier = &barrier;
                s.spawn(move || flood_thread(prog, noop, barrier, cpu, plan))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| match h.join() {
                Ok(r) => r,
                Err(_) => bail!("a flood thread panicked"),
            })
            .collect::<Result<Vec<_>>>()
    })?;

    let map: HashMap<&MapData, Ipv4Key, SourceState> =
        HashMap::try_from(ebpf.map(MAP_SOURCES).context("sources map missing")?)?;
    let (mut evicted, mut missing) = (0, 0);
    for (addr, sent) in results.iter().flat_map(|r| &r.sent) {
        match map.get(&key(*addr), 0) {
            Ok(state) if state.outcomes.passed_packets >= *sent => {}
            Ok(_) => evicted += 1,
            Err(MapError::KeyNotFound) => {
                evicted += 1;
                missing += 1;
            }
            Err(e) => return Err(e.into()),
        }
    }
    let entries_at_end = map.keys().count() as u32;
    let mean = |f: fn(&ThreadResult) -> f64| results.iter().map(f).sum::<f64>() / cpus as f64;
    let noop_ns = mean(|r| r.noop_loop);
    let pass_flood: Vec<f64> = results.iter().flat_map(|r| r.pass_flood.clone()).collect();
    Ok(Measurement {
        map_flags,
        entries,
        real_sources,
        refresh_every: (real_sources as usize * every) as u64,
        flood_frames: (flood_per_cpu * cpus) as u64,
        evicted,
        missing_at_end: missing,
        entries_at_end,
        flood_ns: noop_ns + mean(|r| r.flood_single - r.noop_single),
        noop_ns,
        pass_quiet_ns: mean(|r| r.pass_quiet),
        pass_flood_ns: median(&pass_flood),
    })
}

/// Every measurement: each size, refresh interval and flag value, `reps` times,
/// interleaving the flag values.
pub fn run(opts: &Options) -> Result<Vec<Measurement>> {
    ensure!(opts.reps > 0 && opts.flood_tables > 0);
    ensure!(
        opts.every.iter().all(|&e| e > 0),
        "every must be at least 1"
    );
    let mut out = Vec::new();
    for &entries in &opts.entries {
        for &every in &opts.every {
            for _ in 0..opts.reps {
                for flags in [0, BPF_F_NO_COMMON_LRU] {
                    out.push(measure(entries, flags, every, opts.flood_tables)?);
                }
            }
        }
    }
    Ok(out)
}

fn flavour(map_flags: u32) -> &'static str {
    if map_flags & BPF_F_NO_COMMON_LRU != 0 {
        "per-CPU"
    } else {
        "common"
    }
}

/// A table: one row per configuration and flag value, medians over repetitions with
/// their range.
pub fn summary_lines(results: &[Measurement]) -> Vec<String> {
    let mut lines = vec![
        format!(
            "LRU under a flood of new sources from {} CPUs (admission unlimited; medians, [min..max] over reps)",
            online_cpus()
        ),
        format!(
            "{:<8} {:>7} {:>6} {:>8} {:>8} {:>17} {:>17} {:>14} {:>14} {:>8}",
            "lru",
            "entries",
            "real",
            "refresh",
            "flood",
            "real evicted",
            "missing at end",
            "flood ns/x",
            "pass quiet",
            "pass flood"
        ),
    ];
    let mut seen = Vec::new();
    for m in results {
        let id = (m.entries, m.refresh_every, m.map_flags);
        if seen.contains(&id) {
            continue;
        }
        seen.push(id);
        let same: Vec<&Measurement> = results
            .iter()
            .filter(|o| (o.entries, o.refresh_every, o.map_flags) == id)
            .collect();
        let stat = |f: fn(&Measurement) -> f64| {
            let v: Vec<f64> = same.iter().map(|m| f(m)).collect();
            let (lo, hi) = v
                .iter()
                .fold((f64::MAX, f64::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)));
            (median(&v), lo, hi)
        };
        let range = |(m, lo, hi): (f64, f64, f64)| format!("{m:.0} [{lo:.0}..{hi:.0}]");
        let flood = stat(|m| m.flood_ns);
        let noop = stat(|m| m.noop_ns).0;
        lines.push(format!(
            "{:<8} {:>7} {:>6} {:>8} {:>8} {:>17} {:>17} {:>14} {:>14} {:>10}",
            flavour(m.map_flags),
            m.entries,
            m.real_sources,
            m.refresh_every,
            m.flood_frames,
            range(stat(|m| f64::from(m.evicted))),
            range(stat(|m| f64::from(m.missing_at_end))),
            format!("{:.0} ({:.1}x)", flood.0, flood.0 / noop),
            format!("{:.1}", stat(|m| m.pass_quiet_ns).0),
            format!("{:.1}", stat(|m| m.pass_flood_ns).0),
        ));
    }
    lines
}

//! How shaper scales with the number of tracked sources: kernel memory per source, from
//! the map's own accounting, and per-packet cost on an existing source as the map grows.
//!
//! Memory is the `memlock:` figure of the map's `/proc/self/fdinfo` entry (what
//! `bpftool map show` prints as `memlock`): since Linux 6.4 it is the map type's own
//! estimate of the memory it uses. The per-source map is a preallocated LRU hash, so the
//! figure is set when the map is created; it is read both empty and filled to show that.
//!
//! The hot figure here is the loop method of `per_packet` (one key, `repeat` runs); the
//! cold figure for the same maps (keys drawn at random over the whole population) is the
//! `cold_*` case of `per_packet`, measured on these same populations.

use anyhow::{Result, ensure};
use serde::Serialize;
use shaper_common::{bench::PROG_NOOP, maps::PROG_XDP};

use super::{
    builds::Build,
    population::{Population, SIZES},
    spread::median,
};
use crate::{
    frame,
    testrun::{XDP_PASS, noop, test_run},
};

#[derive(Clone, Debug, Serialize)]
pub struct ScaleRow {
    /// The map's max_entries.
    pub capacity: u32,
    /// Entries present after filling it from userspace.
    pub entries: u32,
    pub memlock_empty_bytes: u64,
    pub memlock_filled_bytes: u64,
    /// memlock of both maps (filled) / capacity: what a tracked source costs, the IPv6
    /// map's share included.
    pub bytes_per_source: f64,
    pub fill_secs: f64,
    /// Loop method, one existing key: median ns per packet and the no-op's in the same runs.
    pub hot_pass_ns: f64,
    pub hot_noop_ns: f64,
    pub hot_ratio_to_noop: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct ScaleResults {
    pub repeat: u32,
    pub runs: usize,
    pub rows: Vec<ScaleRow>,
}

/// Fills one map per size in [`SIZES`].
pub fn populations(build: &Build) -> Result<Vec<Population>> {
    SIZES
        .iter()
        .map(|&n| Population::filled(build, n))
        .collect()
}

/// Memory per source and hot per-packet cost for each population.
pub fn run(populations: &mut [Population], repeat: u32, runs: usize) -> Result<ScaleResults> {
    ensure!(runs > 0 && repeat > 0);
    let mut baseline = noop()?;
    let mut samples = vec![(Vec::new(), Vec::new()); populations.len()];
    for _ in 0..runs {
        for (p, (pass, noop)) in populations.iter_mut().zip(&mut samples) {
            let data = frame::ipv4_udp(p.keys[0], 64);
            noop.push(test_run(&mut baseline, PROG_NOOP, &data, repeat, XDP_PASS)?);
            pass.push(test_run(&mut p.ebpf, PROG_XDP, &data, repeat, XDP_PASS)?);
        }
    }
    let rows = populations
        .iter()
        .zip(samples)
        .map(|(p, (pass, noop))| {
            let ratios: Vec<f64> = pass.iter().zip(&noop).map(|(p, n)| p / n).collect();
            ScaleRow {
                capacity: p.capacity,
                entries: p.entries,
                memlock_empty_bytes: p.memlock_empty_bytes,
                memlock_filled_bytes: p.memlock_filled_bytes,
                bytes_per_source: p.memlock_filled_bytes as f64 / f64::from(p.capacity),
                fill_secs: p.fill_secs,
                hot_pass_ns: median(&pass),
                hot_noop_ns: median(&noop),
                hot_ratio_to_noop: median(&ratios),
            }
        })
        .collect();
    Ok(ScaleResults { repeat, runs, rows })
}

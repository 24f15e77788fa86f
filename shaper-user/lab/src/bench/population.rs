//! Source maps filled to a size from userspace, for the cases that depend on how many
//! sources are tracked (`scale`, and the cold-key cases of `per_packet`).

use std::{net::Ipv4Addr, time::Instant};

use anyhow::{Result, ensure};
use aya::Ebpf;

use super::builds::{Build, single_rate};
use crate::{
    frame,
    rng::Rng,
    testrun::{ipv4_keys, open, prefill, sources_memlock},
};

/// Map sizes measured: 1K, 64K and 1M sources.
pub const SIZES: [u32; 3] = [1 << 10, 1 << 16, 1 << 20];

/// A loaded object whose per-source map holds `capacity` sources, filled from userspace
/// with idle cells for 10.0.0.0 + i.
pub struct Population {
    pub ebpf: Ebpf,
    pub capacity: u32,
    /// Entries actually in the map after filling (a key whose two buckets are full is
    /// left out; an older build's LRU map may evict a few of its own entries).
    pub entries: u32,
    /// Kernel memory of both per-source maps (IPv4 and IPv6: attach creates both at
    /// `--max-sources` entries, preallocated), empty and after filling the IPv4 one.
    pub memlock_empty_bytes: u64,
    pub memlock_filled_bytes: u64,
    pub fill_secs: f64,
    pub keys: Vec<Ipv4Addr>,
}

const BASE: u32 = 0x0A00_0000;

impl Population {
    /// An object of `build` whose map holds `capacity` sources.
    pub fn filled(build: &Build, capacity: u32) -> Result<Self> {
        let mut ebpf = open(build.load(single_rate(capacity))?)?;
        let memlock_empty_bytes = memlock(&ebpf)?;
        let start = Instant::now();
        prefill(&mut ebpf, (0..capacity).map(|i| Ipv4Addr::from(BASE + i)))?;
        let fill_secs = start.elapsed().as_secs_f64();
        let memlock_filled_bytes = memlock(&ebpf)?;
        // The keys still present: the cold case must only draw existing sources.
        let keys: Vec<Ipv4Addr> = ipv4_keys(&ebpf)?
            .into_iter()
            .map(|k| Ipv4Addr::from(k.to_ne_bytes()))
            .collect();
        ensure!(
            !keys.is_empty(),
            "the {capacity}-entry map is empty after filling"
        );
        Ok(Population {
            ebpf,
            capacity,
            entries: keys.len() as u32,
            memlock_empty_bytes,
            memlock_filled_bytes,
            fill_secs,
            keys,
        })
    }

    /// `cold_1k`, `cold_64k`, `cold_1m`.
    pub fn cold_id(&self) -> &'static str {
        match self.capacity {
            1024 => "cold_1k",
            65_536 => "cold_64k",
            1_048_576 => "cold_1m",
            _ => "cold_other",
        }
    }

    pub fn cold_name(&self) -> &'static str {
        match self.capacity {
            1024 => "pass, existing source drawn at random from 1K tracked",
            65_536 => "pass, existing source drawn at random from 64K tracked",
            1_048_576 => "pass, existing source drawn at random from 1M tracked",
            _ => "pass, existing source drawn at random",
        }
    }

    /// `n` frames from existing sources: the keys in a fresh shuffled order, cycled, so
    /// no two consecutive frames share a source (unless there is only one).
    pub fn sample_frames(&self, rng: &mut Rng, n: usize, frame_bytes: usize) -> Vec<Vec<u8>> {
        let mut out = Vec::with_capacity(n);
        let mut order: Vec<usize> = (0..self.keys.len()).collect();
        while out.len() < n {
            rng.shuffle(&mut order);
            out.extend(
                order
                    .iter()
                    .take(n - out.len())
                    .map(|&i| frame::ipv4_udp(self.keys[i], frame_bytes)),
            );
        }
        out
    }
}

/// The `memlock:` lines of both per-source maps' fdinfo (IPv4 and IPv6), in bytes.
fn memlock(ebpf: &Ebpf) -> Result<u64> {
    sources_memlock(ebpf)
}

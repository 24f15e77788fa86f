//! The XDP program loaded into the kernel but attached nowhere, driven frame by frame with
//! `BPF_PROG_TEST_RUN`: what the kernel tests, the fuzzer and the benchmarks run frames
//! through, and how they read back what the program recorded. The bench object's no-op
//! ([`noop`]) is loaded the same way, as the benchmarks' baseline.

use std::{
    net::Ipv4Addr,
    os::fd::{AsFd as _, AsRawFd as _},
};

use anyhow::{Context as _, Result, ensure};
use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, MapData, PerCpuArray, PerCpuValues},
    programs::{TestRun as _, TestRunOptions, Xdp},
};
use shaper_common::{
    bench::{PROG_FLOOR, PROG_NOOP},
    gcra::MAX_RATE_BPS,
    maps::{
        Config, Counters, Ipv4Key, Ipv6Key, MAP_CONFIG, MAP_COUNTERS, MAP_PREFIXES_V4,
        MAP_PREFIXES_V6, MAP_SOURCES, MAP_SOURCES6, MAP_SUBSCRIBERS, PROG_XDP, SourceState,
        Subscriber, sum_per_cpu,
    },
    sources::{SourceBucket4, SourceBucket6},
};
use shaper_user::{
    maps::read_batched,
    object,
    policy::PolicyTable,
    subscriber::{SubscriberTable, record::Records},
    table,
};

/// The benchmark's kernel object (`shaper-ebpf`'s `shaper-ebpf-bench`), built by
/// shaper-user's build.rs (see build.rs).
pub static BENCH_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("SHAPER_EBPF_DIR"), "/shaper-ebpf-bench"));

/// The bench object with its no-op and floor XDP programs loaded: the baselines of
/// per-packet costs.
pub fn noop() -> Result<Ebpf> {
    let mut ebpf = EbpfLoader::new()
        .load(BENCH_OBJECT)
        .context("cannot load the bench object")?;
    object::xdp_program(&mut ebpf, PROG_NOOP)?;
    object::xdp_program(&mut ebpf, PROG_FLOOR)?;
    Ok(ebpf)
}

/// A loaded XDP program of `ebpf`, to attach or run.
pub fn xdp_mut<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut Xdp> {
    Ok(ebpf
        .program_mut(name)
        .with_context(|| format!("program {name} missing from the object"))?
        .try_into()?)
}

/// XDP verdicts (`enum xdp_action`).
pub const XDP_ABORTED: u32 = 0;
pub const XDP_DROP: u32 = 1;
pub const XDP_PASS: u32 = 2;

/// The global counters of a loaded object, summed over CPUs.
pub fn counters(ebpf: &Ebpf) -> Result<Counters> {
    let map: PerCpuArray<&MapData, Counters> =
        PerCpuArray::try_from(ebpf.map(MAP_COUNTERS).context("counters map missing")?)?;
    Ok(sum_per_cpu(map.get(&0, 0)?.iter()))
}

pub struct Harness {
    ebpf: Ebpf,
    table: PolicyTable,
    /// The prefix tries (the table holds them), by name, for [`Harness::memlock`].
    tries: Vec<(&'static str, MapData)>,
    /// The subscribers' ids and names (an unnamed file: the pins' file of an attachment).
    records: Records,
}

impl Harness {
    /// The program loaded with per-source maps of `max_sources` entries and `config` as
    /// its settings and default policy, or none at all.
    pub fn new(config: Option<&Config>, max_sources: u32) -> Result<Self> {
        Self::with_subscribers(config, max_sources, 0)
    }

    /// [`Harness::new`] with room for `max_subscribers` subscribers.
    pub fn with_subscribers(
        config: Option<&Config>,
        max_sources: u32,
        max_subscribers: u32,
    ) -> Result<Self> {
        let mut ebpf = object::load(object::Sizes {
            max_subscribers,
            ..object::Sizes::full(max_sources)
        })?;
        object::xdp_program(&mut ebpf, PROG_XDP)?;
        let tries = [MAP_PREFIXES_V4, MAP_PREFIXES_V6]
            .into_iter()
            .map(|name| Ok((name, map_data(&ebpf, name)?)))
            .collect::<Result<_>>()?;
        let table = PolicyTable::take(&mut ebpf)?;
        let records = Records::anonymous()?;
        let mut h = Self {
            ebpf,
            table,
            tries,
            records,
        };
        if let Some(config) = config {
            h.configure(config)?;
        }
        Ok(h)
    }

    /// The loaded object (to run its programs).
    pub fn ebpf_mut(&mut self) -> &mut Ebpf {
        &mut self.ebpf
    }

    /// Replaces the settings and default policy, as `attach` on a live attachment does.
    pub fn configure(&mut self, config: &Config) -> Result<()> {
        Ok(self.table.set_config(config)?)
    }

    /// The prefix policies, to set and read as `shaper policy` does.
    pub fn policies(&mut self) -> &mut PolicyTable {
        &mut self.table
    }

    /// The subscribers, to set and read as `shaper subscriber` does.
    pub fn subscribers(&mut self) -> Result<SubscriberTable<&mut PolicyTable>> {
        let subs = self.subscriber_entries()?;
        let records = self.records.try_clone()?;
        Ok(SubscriberTable::new(subs, &mut self.table, records))
    }

    /// The subscribers' ids and names, to write in bulk beside [`Self::subscriber_entries`].
    pub fn subscriber_records(&self) -> &Records {
        &self.records
    }

    /// The subscribers' map itself (`SHAPER_SUBS`), to write entries in bulk.
    pub fn subscriber_entries(&self) -> Result<Array<MapData, Subscriber>> {
        let data = map_data(&self.ebpf, MAP_SUBSCRIBERS)?;
        Ok(Array::try_from(aya::maps::Map::Array(data))?)
    }

    /// The kernel memory charged to map `name` (its fdinfo's `memlock:`), in bytes.
    pub fn memlock(&self, name: &str) -> Result<u64> {
        match self.tries.iter().find(|(n, _)| *n == name) {
            Some((_, data)) => memlock_of(data),
            None => memlock_of(&map_data(&self.ebpf, name)?),
        }
    }

    /// The loaded program, for running it from several threads at once.
    pub fn program(&self) -> Result<&Xdp> {
        Ok(self
            .ebpf
            .program(PROG_XDP)
            .context("program missing")?
            .try_into()?)
    }

    /// Runs the program once on `frame`; returns its verdict.
    pub fn run(&mut self, frame: &[u8]) -> Result<u32> {
        let prog: &mut Xdp = self
            .ebpf
            .program_mut(PROG_XDP)
            .context("program missing")?
            .try_into()?;
        let mut opts = TestRunOptions::new();
        opts.data_in = Some(frame);
        let result = prog
            .test_run(opts)
            .with_context(|| format!("BPF_PROG_TEST_RUN on a {}-byte frame", frame.len()))?;
        Ok(result.return_value)
    }

    /// [`Harness::run`], with the frame as the program left it.
    pub fn run_out(&mut self, frame: &[u8]) -> Result<(u32, Vec<u8>)> {
        let prog: &mut Xdp = self
            .ebpf
            .program_mut(PROG_XDP)
            .context("program missing")?
            .try_into()?;
        let mut out = vec![0u8; frame.len()];
        let mut opts = TestRunOptions::new();
        opts.data_in = Some(frame);
        opts.data_out = Some(&mut out);
        let result = prog
            .test_run(opts)
            .with_context(|| format!("BPF_PROG_TEST_RUN on a {}-byte frame", frame.len()))?;
        Ok((result.return_value, out))
    }

    /// The global counters, summed over CPUs.
    pub fn counters(&self) -> Result<Counters> {
        counters(&self.ebpf)
    }

    /// Every IPv4 key tracked, with its cell.
    pub fn sources(&self) -> Result<Vec<(Ipv4Key, SourceState)>> {
        Ok(table::read_v4(&map_data(&self.ebpf, MAP_SOURCES)?)?)
    }

    /// Every IPv6 key tracked, with its cell.
    pub fn sources6(&self) -> Result<Vec<(Ipv6Key, SourceState)>> {
        Ok(table::read_v6(&map_data(&self.ebpf, MAP_SOURCES6)?)?)
    }

    /// The IPv4 keys of each bucket of the table, by bucket (where the program put them).
    pub fn buckets(&self) -> Result<Vec<Vec<Ipv4Key>>> {
        let map = map_data(&self.ebpf, MAP_SOURCES)?;
        Ok(read_batched::<u32, SourceBucket4>(&map)?
            .iter()
            .map(|(_, b)| table::ways_v4(b).map(|(k, _)| k).collect())
            .collect())
    }

    /// The IPv6 keys of each bucket of the table, by bucket.
    pub fn buckets6(&self) -> Result<Vec<Vec<Ipv6Key>>> {
        let map = map_data(&self.ebpf, MAP_SOURCES6)?;
        Ok(read_batched::<u32, SourceBucket6>(&map)?
            .iter()
            .map(|(_, b)| table::ways_v6(b).map(|(k, _)| k).collect())
            .collect())
    }

    /// Places IPv4 keys with their states where the program looks for them.
    pub fn seed_sources(&self, entries: &[(Ipv4Key, SourceState)]) -> Result<table::Placed> {
        let map = map_data(&self.ebpf, MAP_SOURCES)?;
        Ok(table::write_v4(&map, self.seed()?, entries)?)
    }

    /// Places IPv6 keys with their states where the program looks for them.
    pub fn seed_sources6(&self, entries: &[(Ipv6Key, SourceState)]) -> Result<table::Placed> {
        let map = map_data(&self.ebpf, MAP_SOURCES6)?;
        Ok(table::write_v6(&map, self.seed()?, entries)?)
    }

    /// The hash seed of the loaded settings (`Config::trace_seed`).
    pub fn seed(&self) -> Result<u64> {
        Ok(self.table.config()?.trace_seed)
    }

    /// Forgets every tracked source and zeroes the global counters, so one loaded program
    /// serves many independent cases: a load costs a verification, which takes seconds in
    /// an emulated guest.
    pub fn reset(&mut self) -> Result<()> {
        table::clear_v4(&map_data(&self.ebpf, MAP_SOURCES)?)?;
        table::clear_v6(&map_data(&self.ebpf, MAP_SOURCES6)?)?;
        let cpus = aya::util::nr_cpus()
            .map_err(|(_, e)| e)
            .context("counting CPUs")?;
        let mut map: PerCpuArray<&mut MapData, Counters> = PerCpuArray::try_from(
            self.ebpf
                .map_mut(MAP_COUNTERS)
                .context("counters map missing")?,
        )?;
        map.set(
            0,
            PerCpuValues::try_from(vec![Counters::default(); cpus])?,
            0,
        )?;
        Ok(())
    }
}

/// The hash seed of `ebpf`'s settings entry.
pub fn seed_of(ebpf: &Ebpf) -> Result<u64> {
    let map: Array<&MapData, Config> =
        Array::try_from(ebpf.map(MAP_CONFIG).context("config map missing")?)?;
    Ok(map.get(&0, 0)?.trace_seed)
}

pub fn config(rate_bps: u64, burst_bytes: u64) -> Result<Config> {
    Config::per_source(rate_bps, burst_bytes).map_err(|e| anyhow::anyhow!("{e}"))
}

/// Never limited: the fastest rate with a burst no run can exhaust.
pub fn open_config() -> Result<Config> {
    config(MAX_RATE_BPS, 1 << 40)
}

/// Loads the object with a `max_sources` map, its XDP program, and the open policy.
pub fn load_open(max_sources: u32) -> Result<Ebpf> {
    open(object::load(object::Sizes::full(max_sources))?)
}

/// Loads the XDP program of an object and sets the open policy.
pub fn open(mut ebpf: Ebpf) -> Result<Ebpf> {
    object::xdp_program(&mut ebpf, PROG_XDP)?;
    object::configure(&mut ebpf, &open_config()?)?;
    Ok(ebpf)
}

/// One BPF_PROG_TEST_RUN; returns the kernel's mean ns per run. Checks the verdict.
pub fn test_run(
    ebpf: &mut Ebpf,
    program: &str,
    data: &[u8],
    repeat: u32,
    want: u32,
) -> Result<f64> {
    let prog: &Xdp = ebpf
        .program(program)
        .context("program missing")?
        .try_into()?;
    test_run_xdp(prog, data, repeat, want).with_context(|| program.to_owned())
}

/// [`test_run`] on a loaded program (which several threads may share).
pub fn test_run_xdp(prog: &Xdp, data: &[u8], repeat: u32, want: u32) -> Result<f64> {
    let mut opts = TestRunOptions::new();
    opts.data_in = Some(data);
    opts.repeat = repeat;
    let result = prog.test_run(opts).context("BPF_PROG_TEST_RUN")?;
    ensure!(
        result.return_value == want,
        "returned {} instead of {want}",
        result.return_value
    );
    Ok(result.duration.as_nanos() as f64)
}

pub fn key(addr: Ipv4Addr) -> Ipv4Key {
    u32::from_ne_bytes(addr.octets())
}

/// Places an idle cell for each address, as the program would create it: in the table of
/// buckets (a key whose two buckets are full is left out: a few percent of a table filled
/// to its room), or in an older build's LRU hash map. Returns how many were placed.
pub fn prefill(ebpf: &mut Ebpf, addrs: impl IntoIterator<Item = Ipv4Addr>) -> Result<usize> {
    let entries: Vec<_> = addrs
        .into_iter()
        .map(|a| (key(a), SourceState::default()))
        .collect();
    if let Some(aya::maps::Map::LruHashMap(_)) = ebpf.map(MAP_SOURCES) {
        let mut map: aya::maps::HashMap<&mut MapData, Ipv4Key, SourceState> =
            aya::maps::HashMap::try_from(ebpf.map_mut(MAP_SOURCES).context("sources map")?)?;
        for (k, s) in &entries {
            map.insert(k, s, 0)?;
        }
        return Ok(entries.len());
    }
    let map = map_data(ebpf, MAP_SOURCES)?;
    let seed = seed_of(ebpf).unwrap_or(0);
    Ok(table::write_v4(&map, seed, &entries)?.placed)
}

/// The IPv4 keys in `ebpf`'s table (or an older build's LRU hash map).
pub fn ipv4_keys(ebpf: &Ebpf) -> Result<Vec<Ipv4Key>> {
    if let Some(aya::maps::Map::LruHashMap(_)) = ebpf.map(MAP_SOURCES) {
        let map: aya::maps::HashMap<&MapData, Ipv4Key, SourceState> =
            aya::maps::HashMap::try_from(ebpf.map(MAP_SOURCES).context("sources map")?)?;
        return Ok(map.keys().collect::<Result<_, _>>()?);
    }
    let map = map_data(ebpf, MAP_SOURCES)?;
    Ok(table::read_v4(&map)?.into_iter().map(|(k, _)| k).collect())
}

/// The `memlock:` of both per-source maps (IPv4 and IPv6) of `ebpf`, in bytes.
pub fn sources_memlock(ebpf: &Ebpf) -> Result<u64> {
    Ok(memlock_of(&map_data(ebpf, MAP_SOURCES)?)? + memlock_of(&map_data(ebpf, MAP_SOURCES6)?)?)
}

/// A map of `ebpf` by name, on a descriptor of its own.
fn map_data(ebpf: &Ebpf, name: &str) -> Result<MapData> {
    let map = ebpf.map(name).with_context(|| format!("{name} missing"))?;
    let fd = match map {
        aya::maps::Map::Array(d) | aya::maps::Map::LpmTrie(d) | aya::maps::Map::HashMap(d) => d,
        aya::maps::Map::LruHashMap(d) | aya::maps::Map::PerCpuArray(d) => d,
        _ => anyhow::bail!("{name}: not a map kind read here"),
    }
    .fd()
    .as_fd()
    .try_clone_to_owned()?;
    Ok(MapData::from_fd(fd)?)
}

/// The `memlock:` line of one map's fdinfo, in bytes: the kernel memory charged to it.
pub fn memlock_of(map: &MapData) -> Result<u64> {
    let fd = map.fd().as_fd().as_raw_fd();
    let path = format!("/proc/self/fdinfo/{fd}");
    let info = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    info.lines()
        .find_map(|l| l.strip_prefix("memlock:"))
        .with_context(|| format!("no memlock line in {path}"))?
        .trim()
        .parse()
        .with_context(|| format!("memlock in {path}"))
}

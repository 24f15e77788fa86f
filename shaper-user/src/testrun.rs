//! The XDP program loaded into the kernel but attached nowhere, driven frame by frame with
//! `BPF_PROG_TEST_RUN`: what the kernel tests and the fuzzer run frames through, and how
//! they read back what the program recorded.

use anyhow::{Context as _, Result};
use aya::{
    Ebpf,
    maps::{HashMap, MapData, PerCpuArray},
    programs::{TestRun as _, TestRunOptions, Xdp},
};
use shaper_common::maps::{
    Config, Counters, Ipv4Key, Ipv6Key, MAP_COUNTERS, MAP_SOURCES, MAP_SOURCES6, PROG_XDP,
    SourceState, sum_per_cpu,
};

use crate::{loader, policy::PolicyTable};

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
}

impl Harness {
    /// The program loaded with per-source maps of `max_sources` entries and `config` as
    /// its settings and default policy, or none at all.
    pub fn new(config: Option<&Config>, max_sources: u32) -> Result<Self> {
        let mut ebpf = loader::load(max_sources)?;
        loader::xdp_program(&mut ebpf, PROG_XDP)?;
        let table = PolicyTable::take(&mut ebpf)?;
        let mut h = Self { ebpf, table };
        if let Some(config) = config {
            h.configure(config)?;
        }
        Ok(h)
    }

    /// Replaces the settings and default policy, as `attach` on a live attachment does.
    pub fn configure(&mut self, config: &Config) -> Result<()> {
        Ok(self.table.set_config(config)?)
    }

    /// The prefix policies, to set and read as `shaper policy` does.
    pub fn policies(&mut self) -> &mut PolicyTable {
        &mut self.table
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

    /// The global counters, summed over CPUs.
    pub fn counters(&self) -> Result<Counters> {
        counters(&self.ebpf)
    }

    /// Every IPv4 key tracked, with its cell.
    pub fn sources(&self) -> Result<Vec<(Ipv4Key, SourceState)>> {
        self.entries(MAP_SOURCES)
    }

    /// Every IPv6 key tracked, with its cell.
    pub fn sources6(&self) -> Result<Vec<(Ipv6Key, SourceState)>> {
        self.entries(MAP_SOURCES6)
    }

    fn entries<K: aya::Pod>(&self, name: &str) -> Result<Vec<(K, SourceState)>> {
        let map: HashMap<&MapData, K, SourceState> =
            HashMap::try_from(self.ebpf.map(name).context("sources map missing")?)?;
        Ok(map.iter().collect::<Result<_, _>>()?)
    }
}

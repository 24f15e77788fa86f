//! What the verifier makes of each program of each build, on the running kernel: the
//! instructions it walked (`verified_insns`), the program's size after translation and
//! after the JIT, its functions (one BTF function per subprogram the verifier saw, and
//! how many of them are global: verified once, on their own) and how long loading it
//! takes (`BPF_PROG_LOAD`: verification and JIT), read from the loaded programs.
//!
//! Each run loads every build's object afresh (maps as `shaper attach` makes them) and
//! times each program's load; the builds take turns, the first of a run alternating, so
//! drift in the machine's load touches both alike. Under emulation only one run is made,
//! and no time is given: the emulator runs the verifier tens of times slower than a CPU,
//! by a factor that varies with the host's load.

use std::{
    os::fd::{AsFd as _, BorrowedFd},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, anyhow};
use aya::{
    Ebpf,
    programs::{Program, ProgramInfo},
};
use serde::{Deserialize, Serialize};
use shaper_common::maps::{DEFAULT_MAX_SOURCES, PROG_TC, PROG_XDP};
use shaper_user::kernel;

use super::{
    bpf_info, btf,
    builds::{Build, single_rate},
    spread::Summary,
};

/// The programs measured: the XDP entry and the tc entry.
pub const PROGRAMS: [&str; 2] = [PROG_XDP, PROG_TC];

/// One BTF function of a loaded program.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Func {
    pub name: String,
    /// Global linkage: verified once, on its own; static ones are walked in every
    /// caller's state.
    pub global: bool,
    /// Its instructions after translation (what the kernel holds of it).
    #[serde(default)]
    pub insns: u32,
}

/// One program of one build, as the kernel loaded it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProgramFigures {
    /// [`Build::label`].
    pub build: String,
    pub program: String,
    /// Instructions the verifier processed (5.16 and later; `None` before).
    pub verified_insns: Option<u32>,
    pub xlated_bytes: Option<u32>,
    pub jited_bytes: u32,
    /// The program's func_info, in instruction order (the entry first).
    pub funcs: Vec<Func>,
    /// `BPF_PROG_LOAD`'s wall time, ms, over the runs; `None` when not measured.
    pub load_ms: Option<Summary>,
}

impl ProgramFigures {
    pub fn global_funcs(&self) -> usize {
        self.funcs.iter().filter(|f| f.global).count()
    }
}

/// What one program's load gave.
struct Loaded {
    elapsed: Duration,
    info: ProgramInfo,
    funcs: Vec<Func>,
}

/// Loads program `name` of a loaded object into the kernel, timed, and reads it back.
fn load_program(ebpf: &mut Ebpf, name: &str) -> Result<Loaded> {
    let prog = ebpf
        .program_mut(name)
        .with_context(|| format!("program {name} missing from the object"))?;
    let load_err = |e| anyhow!(kernel::load_error(e)).context(format!("loading {name}"));
    let start = Instant::now();
    let (elapsed, info, fd): (Duration, ProgramInfo, BorrowedFd<'_>) = match prog {
        Program::Xdp(p) => {
            p.load().map_err(load_err)?;
            (start.elapsed(), p.info()?, p.fd()?.as_fd())
        }
        Program::SchedClassifier(p) => {
            p.load().map_err(load_err)?;
            (start.elapsed(), p.info()?, p.fd()?.as_fd())
        }
        _ => anyhow::bail!("program {name} is neither XDP nor tc"),
    };
    let funcs = functions(fd, info.size_translated().unwrap_or(0))
        .with_context(|| format!("the functions of {name}"))?;
    Ok(Loaded {
        elapsed,
        info,
        funcs,
    })
}

/// The functions of the loaded program `fd` (of `xlated_bytes` after translation), in
/// instruction order, the entry first: what the kernel reports of each.
pub fn functions(fd: BorrowedFd<'_>, xlated_bytes: u32) -> Result<Vec<Func>> {
    let (records, btf_id) = bpf_info::func_info(fd)?;
    let names = btf::funcs(&bpf_info::btf(btf_id)?)?;
    let ends = records
        .iter()
        .skip(1)
        .map(|&(off, _)| off)
        .chain([xlated_bytes / 8]);
    records
        .iter()
        .zip(ends)
        .map(|(&(off, id), end)| {
            let f = names
                .get(id)
                .with_context(|| format!("func_info names BTF type {id}, no function"))?;
            Ok(Func {
                name: f.name.clone(),
                global: f.global,
                insns: end.saturating_sub(off),
            })
        })
        .collect()
}

/// Every program of every build: figures from the first run, load times over `runs`
/// (`None` when `timed` is false: one run, no time given).
pub fn measure(builds: &[&Build], runs: usize, timed: bool) -> Result<Vec<ProgramFigures>> {
    let runs = if timed { runs.max(1) } else { 1 };
    let mut figures: Vec<ProgramFigures> = Vec::new();
    let mut times = vec![Vec::with_capacity(runs); builds.len() * PROGRAMS.len()];
    for run in 0..runs {
        for i in 0..builds.len() {
            // The first build of a run alternates.
            let b = (i + run) % builds.len();
            let build = builds[b];
            let mut ebpf = build.load(single_rate(DEFAULT_MAX_SOURCES))?;
            for (p, &name) in PROGRAMS.iter().enumerate() {
                let loaded = load_program(&mut ebpf, name)
                    .with_context(|| format!("the build of {}", build.label))?;
                times[b * PROGRAMS.len() + p].push(loaded.elapsed.as_secs_f64() * 1e3);
                if run == 0 {
                    figures.push(ProgramFigures {
                        build: build.label.clone(),
                        program: name.to_owned(),
                        verified_insns: loaded.info.verified_instruction_count(),
                        xlated_bytes: loaded.info.size_translated(),
                        jited_bytes: loaded.info.size_jitted(),
                        funcs: loaded.funcs,
                        load_ms: None,
                    });
                }
            }
        }
    }
    // In the order of `builds`, then of PROGRAMS.
    figures.sort_by_key(|f| {
        let b = builds.iter().position(|b| b.label == f.build);
        let p = PROGRAMS.iter().position(|&p| p == f.program);
        (b, p)
    });
    if timed {
        for (f, t) in figures.iter_mut().zip(times) {
            f.load_ms = Some(Summary::of(t));
        }
    }
    Ok(figures)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    /// Read back from the loaded programs: the verifier's count, both sizes, and a
    /// function record for every subprogram, the entry's first and global.
    #[test]
    #[ignore = "loads programs: run as root by `cargo xtask test`"]
    fn figures_of_the_loaded_programs() -> Result<()> {
        let today = Build::today(Path::new("shaper"));
        let figures = measure(&[&today], 1, true)?;
        assert_eq!(figures.len(), PROGRAMS.len());
        for (f, name) in figures.iter().zip(PROGRAMS) {
            assert_eq!((f.build.as_str(), f.program.as_str()), ("today", name));
            assert!(f.verified_insns.is_some_and(|n| n > 0), "{f:?}");
            assert!(
                f.xlated_bytes.is_some_and(|n| n > 0) && f.jited_bytes > 0,
                "{f:?}"
            );
            let entry = f.funcs.first().expect("the entry");
            assert_eq!((entry.name.as_str(), entry.global), (name, true), "{f:?}");
            assert!(
                entry.insns > 0
                    && f.funcs.iter().map(|g| g.insns * 8).sum::<u32>()
                        == f.xlated_bytes.unwrap_or(0),
                "the functions' shares add up to the program: {f:?}"
            );
            let load = f.load_ms.as_ref().expect("timed");
            assert_eq!(load.runs.len(), 1);
            assert!(load.min > 0.0);
        }
        Ok(())
    }
}

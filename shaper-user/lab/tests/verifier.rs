//! The verifier's work stays within budget: each entry point's processed instruction count
//! (what the verifier walked, every path of every function, as the kernel reports it in
//! `bpf_prog_info.verified_insns`) is at most [`BUDGET`], a quarter of the kernel's limit of
//! a million. The kernel refuses anything over its limit before this test could see it, so
//! the limit itself proves nothing; the budget fails as soon as complexity creeps back (the
//! programs walked 938k and 970k before they were cut into global functions, each verified
//! once). Run on every kernel of the matrix, where the count differs. It prints each
//! function the kernel reports (its BTF linkage and its share of the translated program):
//! a global one is verified once on its own, a static one in every caller's state.

use anyhow::Result;
use std::os::fd::AsFd;

use aya::programs::{SchedClassifier, Xdp};
use shaper_common::maps::{DEFAULT_MAX_SOURCES, PROG_TC, PROG_XDP};
use shaper_lab::bench::programs::functions;
use shaper_user::object;

/// A quarter of `BPF_COMPLEXITY_LIMIT_INSNS`.
const BUDGET: u32 = 250_000;

#[test]
#[ignore = "loads programs: run as root by `cargo xtask test`"]
fn processed_instructions_within_the_budget() -> Result<()> {
    // As a plain `shaper attach` loads it: the second meter's per-key maps at their
    // smallest (which every kernel of the matrix must accept).
    let mut ebpf = object::load(object::Sizes {
        max_sources: DEFAULT_MAX_SOURCES,
        meter2: false,
        max_subscribers: shaper_common::maps::DEFAULT_MAX_SUBSCRIBERS,
        max_policies: shaper_common::maps::DEFAULT_MAX_POLICIES,
    })
    .inspect_err(log_tail)?;
    object::xdp_program(&mut ebpf, PROG_XDP).inspect_err(log_tail)?;
    object::tc_program(&mut ebpf).inspect_err(log_tail)?;
    let xdp: &Xdp = ebpf.program(PROG_XDP).unwrap().try_into()?;
    let tc: &SchedClassifier = ebpf.program(PROG_TC).unwrap().try_into()?;
    let mut over = Vec::new();
    for (name, info, fd) in [
        (PROG_XDP, xdp.info()?, xdp.fd()?.as_fd()),
        (PROG_TC, tc.info()?, tc.fd()?.as_fd()),
    ] {
        let insns = info.verified_instruction_count().unwrap_or(0);
        let xlated = info.size_translated().unwrap_or(0);
        println!(
            "{name}: {insns} instructions processed by the verifier (budget {BUDGET}), {xlated} bytes translated"
        );
        let funcs = functions(fd, xlated)?;
        for f in &funcs {
            println!(
                "  {:<24} {:<6} {:>6} instructions translated ({:.1}%)",
                f.name,
                if f.global { "global" } else { "static" },
                f.insns,
                f64::from(f.insns) * 800.0 / f64::from(xlated.max(1))
            );
        }
        // The pieces verified once are still global functions of their own: inlined or
        // made static, each would be walked again in every caller's state.
        assert!(
            funcs.iter().filter(|f| f.global).count() >= 4,
            "{name}: fewer than 4 global functions: {:?}",
            funcs
                .iter()
                .map(|f| (&f.name, f.global))
                .collect::<Vec<_>>()
        );
        assert!(
            insns > 0,
            "{name}: the kernel reported no verified instruction count"
        );
        if insns > BUDGET {
            over.push(format!("{name}: {insns}"));
        }
    }
    assert!(
        over.is_empty(),
        "over the verifier budget of {BUDGET} instructions: {}",
        over.join(", ")
    );
    Ok(())
}

/// Prints the last 40 lines of the verifier's log a refusal names (`its log is in PATH`):
/// the reason, which the one-line error leaves in the file (in a guest, out of reach).
fn log_tail(e: &impl std::error::Error) {
    let mut message = e.to_string();
    let mut source = e.source();
    while !message.contains("its log is in ") {
        let Some(e) = source else {
            return;
        };
        message = e.to_string();
        source = e.source();
    }
    let Some((_, path)) = message.split_once("its log is in ") else {
        return;
    };
    let log = std::fs::read_to_string(path.trim()).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    eprintln!("the verifier's log ({path}), its last 40 lines:");
    for line in &lines[lines.len().saturating_sub(40)..] {
        eprintln!("  {line}");
    }
}

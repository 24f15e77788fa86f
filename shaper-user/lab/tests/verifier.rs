//! The verifier accepts both entry points with room to spare: each one's processed
//! instruction count (what the verifier walked, every path) is printed and held under the
//! kernel's limit of a million. Run on every kernel of the matrix, where the count differs.

use anyhow::Result;
use aya::programs::{SchedClassifier, Xdp};
use shaper_common::maps::{DEFAULT_MAX_SOURCES, PROG_TC, PROG_XDP};
use shaper_user::object;

/// `BPF_COMPLEXITY_LIMIT_INSNS`.
const LIMIT: u32 = 1_000_000;

#[test]
#[ignore = "loads programs: run as root by `cargo xtask test`"]
fn processed_instructions_under_the_limit() -> Result<()> {
    let mut ebpf = object::load(DEFAULT_MAX_SOURCES)?;
    object::xdp_program(&mut ebpf, PROG_XDP)?;
    object::tc_program(&mut ebpf)?;
    let xdp: &Xdp = ebpf.program(PROG_XDP).unwrap().try_into()?;
    let tc: &SchedClassifier = ebpf.program(PROG_TC).unwrap().try_into()?;
    for (name, info) in [(PROG_XDP, xdp.info()?), (PROG_TC, tc.info()?)] {
        let insns = info.verified_instruction_count().unwrap_or(0);
        println!("{name}: {insns} instructions processed by the verifier");
        assert!(
            insns > 0,
            "{name}: the kernel reported no verified instruction count"
        );
        assert!(
            insns < LIMIT,
            "{name}: {insns} processed instructions, limit {LIMIT}"
        );
    }
    Ok(())
}

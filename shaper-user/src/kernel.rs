//! What the kernel must offer the XDP program, checked before anything is loaded, so that
//! an older kernel gets one line naming what it lacks instead of a verifier dump; and the
//! verifier's log kept in a file when it refuses the program all the same.
//!
//! Each feature is probed by loading the smallest XDP program that needs it (and nothing
//! else), as libbpf and bpftool probe: the kernel refuses it with EINVAL when it lacks
//! the feature. A probe refused for any other reason (no privileges, no memory) says
//! nothing about the feature and is not held against the kernel: the real load will say
//! what is wrong.

use std::{ffi::CStr, io, path::PathBuf};

use aya::programs::ProgramError;

/// The oldest kernel with every feature below.
pub const MINIMUM: &str = "5.18";

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("kernel {release} lacks {missing}; shaper needs {MINIMUM} or later")]
    Lacks { release: String, missing: String },
    #[error(
        "the kernel's verifier refused the program ({reason}); its log is in {}",
        log.display()
    )]
    Verifier { reason: String, log: PathBuf },
}

/// A feature the program needs: what it is, and the kernel that brought it.
struct Feature {
    name: &'static str,
    /// What the program names it by, if the name is not that.
    alias: Option<&'static str>,
    since: &'static str,
    /// The probe's instructions, and its `prog_flags`.
    probe: fn() -> (Vec<Insn>, u32),
}

impl Feature {
    /// "name (alias, since)".
    fn describe(&self) -> String {
        match self.alias {
            Some(alias) => format!("{} ({alias}, {})", self.name, self.since),
            None => format!("{} ({})", self.name, self.since),
        }
    }
}

/// `BPF_F_XDP_HAS_FRAGS`: the program handles multi-buffer frames (section `xdp.frags`).
const BPF_F_XDP_HAS_FRAGS: u32 = 1 << 5;
const XDP_PASS: i32 = 2;
/// `BPF_FUNC_xdp_get_buff_len`.
const XDP_GET_BUFF_LEN: i32 = 188;

const FEATURES: &[Feature] = &[
    Feature {
        name: "BPF atomic compare-and-exchange",
        alias: Some("BPF_CMPXCHG"),
        since: "5.12",
        probe: || {
            // *(u64 *)(r10 - 8) = 0; r0 = 0; r1 = 1; r0 = cmpxchg(r10 - 8, r0, r1)
            let cmpxchg = Insn::new(0xdb, 10, 1, -8, 0xf1);
            let insns = vec![
                Insn::mov(1, 0),
                Insn::new(0x7b, 10, 1, -8, 0),
                Insn::mov(0, 0),
                Insn::mov(1, 1),
                cmpxchg,
            ];
            (pass(insns), 0)
        },
    },
    Feature {
        name: "multi-buffer XDP",
        alias: Some("xdp.frags"),
        since: "5.18",
        probe: || (pass(Vec::new()), BPF_F_XDP_HAS_FRAGS),
    },
    Feature {
        name: "bpf_xdp_get_buff_len",
        alias: None,
        since: "5.18",
        // r1 is the context already.
        probe: || (pass(vec![Insn::new(0x85, 0, 0, 0, XDP_GET_BUFF_LEN)]), 0),
    },
];

/// Fails, naming every feature the running kernel lacks, if it lacks any.
pub fn check() -> Result<(), KernelError> {
    let missing: Vec<String> = FEATURES
        .iter()
        .filter(|f| {
            let (insns, flags) = (f.probe)();
            lacks(&insns, flags)
        })
        .map(Feature::describe)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(KernelError::Lacks {
        release: release(),
        missing: list(&missing),
    })
}

/// "a", "a and b", "a, b and c".
fn list(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}

/// The running kernel's release (`uname -r`).
pub fn release() -> String {
    // SAFETY: a zeroed utsname for uname to fill; its fields are NUL-terminated.
    unsafe {
        let mut u: libc::utsname = std::mem::zeroed();
        if libc::uname(&mut u) != 0 {
            return "(unknown)".to_owned();
        }
        CStr::from_ptr(u.release.as_ptr())
            .to_string_lossy()
            .into_owned()
    }
}

/// What became of loading the program: the verifier's refusal becomes one line, with its
/// log written to a file (`$TMPDIR/shaper-verifier-PID.log`).
pub fn load_error(e: ProgramError) -> Box<dyn std::error::Error + Send + Sync> {
    let ProgramError::LoadError {
        io_error,
        verifier_log,
    } = e
    else {
        return Box::new(e);
    };
    let log = verifier_log.to_string();
    // The verifier's last words before its statistics say why.
    let why = log
        .lines()
        .map(str::trim)
        .rfind(|l| {
            !l.is_empty() && !l.starts_with("processed ") && !l.starts_with("verification time")
        })
        .unwrap_or("no log");
    let reason = format!("{io_error}: {why}");
    let path = std::env::temp_dir().join(format!("shaper-verifier-{}.log", std::process::id()));
    match std::fs::write(&path, &log) {
        Ok(()) => Box::new(KernelError::Verifier { reason, log: path }),
        Err(e) => format!(
            "the kernel's verifier refused the program ({reason}); cannot write its log to {}: {e}",
            path.display()
        )
        .into(),
    }
}

/// `struct bpf_insn`.
#[repr(C)]
#[derive(Clone, Copy)]
struct Insn {
    code: u8,
    regs: u8,
    off: i16,
    imm: i32,
}

impl Insn {
    const fn new(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Self {
        Insn {
            code,
            regs: (src << 4) | dst,
            off,
            imm,
        }
    }

    /// `dst = imm` (BPF_ALU64 | BPF_MOV | BPF_K).
    const fn mov(dst: u8, imm: i32) -> Self {
        Insn::new(0xb7, dst, 0, 0, imm)
    }
}

/// `insns`, then `return XDP_PASS`.
fn pass(mut insns: Vec<Insn>) -> Vec<Insn> {
    insns.push(Insn::mov(0, XDP_PASS));
    insns.push(Insn::new(0x95, 0, 0, 0, 0));
    insns
}

/// `union bpf_attr` for BPF_PROG_LOAD, up to `expected_attach_type`.
#[repr(C)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_TYPE_XDP: u32 = 6;

/// Whether the kernel refuses `insns` as an XDP program with `prog_flags` as invalid.
fn lacks(insns: &[Insn], prog_flags: u32) -> bool {
    let license = c"GPL";
    let mut attr = ProgLoadAttr {
        prog_type: BPF_PROG_TYPE_XDP,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: 0,
        log_size: 0,
        log_buf: 0,
        kern_version: 0,
        prog_flags,
        prog_name: [0; 16],
        prog_ifindex: 0,
        expected_attach_type: 0,
    };
    // SAFETY: a BPF_PROG_LOAD attr whose pointers point to live buffers of the sizes given.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_LOAD,
            &mut attr as *mut ProgLoadAttr,
            size_of::<ProgLoadAttr>() as libc::c_uint,
        )
    };
    if fd >= 0 {
        // SAFETY: the descriptor the kernel just returned, owned by nothing else.
        unsafe { libc::close(fd as i32) };
        return false;
    }
    io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_missing_is_listed_in_one_sentence() {
        let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(list(&s(&["a"])), "a");
        assert_eq!(list(&s(&["a", "b"])), "a and b");
        assert_eq!(list(&s(&["a", "b", "c"])), "a, b and c");
        let e = KernelError::Lacks {
            release: "5.10.0-46-amd64".into(),
            missing: list(&FEATURES.iter().map(Feature::describe).collect::<Vec<_>>()),
        };
        assert_eq!(
            e.to_string(),
            "kernel 5.10.0-46-amd64 lacks BPF atomic compare-and-exchange (BPF_CMPXCHG, 5.12), \
             multi-buffer XDP (xdp.frags, 5.18) and bpf_xdp_get_buff_len (5.18); shaper needs \
             5.18 or later"
        );
    }

    #[test]
    fn a_verifier_refusal_is_one_line_and_its_log_a_file() {
        let log = "0: (b7) r0 = 0\n1: (95) exit\nR0 !read_ok\nprocessed 2 insns (limit 1000000)\n";
        let e = ProgramError::LoadError {
            io_error: io::Error::from_raw_os_error(libc::EACCES),
            verifier_log: aya_obj::VerifierLog::new(log.to_owned()),
        };
        let line = load_error(e).to_string();
        assert!(!line.contains('\n'), "{line}");
        assert!(line.contains("R0 !read_ok"), "{line}");
        let path = line.rsplit_once("its log is in ").unwrap().1;
        assert!(path.contains("shaper-verifier-"), "{line}");
        assert_eq!(std::fs::read_to_string(path).unwrap(), log);
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn the_minimum_is_the_newest_feature() {
        let newest = FEATURES
            .iter()
            .map(|f| {
                let (major, minor) = f.since.split_once('.').unwrap();
                (major.parse::<u32>().unwrap(), minor.parse::<u32>().unwrap())
            })
            .max()
            .unwrap();
        assert_eq!(format!("{}.{}", newest.0, newest.1), MINIMUM);
    }

    #[test]
    fn the_probes_are_valid_programs() {
        for f in FEATURES {
            let (insns, _) = (f.probe)();
            let last = insns.last().unwrap();
            assert_eq!(last.code, 0x95, "{}: ends with exit", f.name);
            assert!(
                insns
                    .iter()
                    .all(|i| i.regs & 0x0f <= 10 && i.regs >> 4 <= 10)
            );
        }
    }
}

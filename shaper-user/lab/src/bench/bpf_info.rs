//! What aya's `ProgramInfo` does not give, read with `bpf(2)` directly: the function
//! records of a loaded program (`bpf_prog_info.func_info`: one per subprogram the verifier
//! saw, naming its BTF function) and the BTF the program was loaded with (by its id).

use std::{
    io,
    os::fd::{AsFd as _, AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
};

use anyhow::{Context as _, Result, ensure};
use aya_obj::generated::{bpf_btf_info, bpf_cmd, bpf_func_info, bpf_prog_info};

/// `bpf_attr` for `BPF_OBJ_GET_INFO_BY_FD`.
#[repr(C)]
struct InfoByFd {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

/// `bpf_attr` for `BPF_BTF_GET_FD_BY_ID`.
#[repr(C)]
struct FdById {
    id: u32,
    next_id: u32,
    open_flags: u32,
}

fn bpf<T>(cmd: bpf_cmd, attr: &mut T) -> io::Result<i64> {
    // SAFETY: `attr` is the `bpf_attr` member `cmd` reads, of its size; the pointers in it
    // point at buffers that outlive the call, of the sizes given.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd as libc::c_int,
            std::ptr::from_mut(attr),
            size_of::<T>(),
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Fills `info` (a `bpf_*_info`, its buffers set up by the caller) for the object at `fd`.
fn info_by_fd<T>(fd: BorrowedFd<'_>, info: &mut T) -> io::Result<()> {
    let mut attr = InfoByFd {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: size_of::<T>() as u32,
        info: std::ptr::from_mut(info) as u64,
    };
    bpf(bpf_cmd::BPF_OBJ_GET_INFO_BY_FD, &mut attr).map(drop)
}

/// The first instruction and the BTF type id of each of a loaded program's functions (its
/// func_info, in instruction order: the entry first), and the id of the BTF they are in.
pub fn func_info(prog: BorrowedFd<'_>) -> Result<(Vec<(u32, u32)>, u32)> {
    // SAFETY: bpf_prog_info is plain integers; all zero asks for nothing but the counts.
    let mut info: bpf_prog_info = unsafe { std::mem::zeroed() };
    info_by_fd(prog, &mut info).context("BPF_OBJ_GET_INFO_BY_FD on the program")?;
    let n = info.nr_func_info;
    let mut records = vec![
        bpf_func_info {
            insn_off: 0,
            type_id: 0,
        };
        n as usize
    ];
    // SAFETY: as above.
    let mut info: bpf_prog_info = unsafe { std::mem::zeroed() };
    info.nr_func_info = n;
    info.func_info_rec_size = size_of::<bpf_func_info>() as u32;
    info.func_info = records.as_mut_ptr() as u64;
    info_by_fd(prog, &mut info).context("BPF_OBJ_GET_INFO_BY_FD on the program's func_info")?;
    ensure!(
        info.nr_func_info == n,
        "the program's func_info changed size ({n}, then {})",
        info.nr_func_info
    );
    Ok((
        records.iter().map(|r| (r.insn_off, r.type_id)).collect(),
        info.btf_id,
    ))
}

/// The BTF blob the kernel holds as `id`.
pub fn btf(id: u32) -> Result<Vec<u8>> {
    let mut attr = FdById {
        id,
        next_id: 0,
        open_flags: 0,
    };
    let fd = bpf(bpf_cmd::BPF_BTF_GET_FD_BY_ID, &mut attr)
        .with_context(|| format!("BPF_BTF_GET_FD_BY_ID {id}"))?;
    // SAFETY: the kernel just returned this descriptor, owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    // SAFETY: bpf_btf_info is plain integers; a zero size asks for the size only.
    let mut info: bpf_btf_info = unsafe { std::mem::zeroed() };
    info_by_fd(fd.as_fd(), &mut info).context("the size of BTF")?;
    let mut data = vec![0u8; info.btf_size as usize];
    let size = info.btf_size;
    // SAFETY: as above.
    let mut info: bpf_btf_info = unsafe { std::mem::zeroed() };
    info.btf = data.as_mut_ptr() as u64;
    info.btf_size = size;
    info_by_fd(fd.as_fd(), &mut info).with_context(|| format!("reading BTF {id}"))?;
    ensure!(info.btf_size == size, "BTF {id} changed size while read");
    Ok(data)
}

//! What a pinned XDP bpf_link is attached to.
//!
//! aya 0.14's `LinkInfo` does not expose the XDP link's interface, so this asks the kernel
//! directly (`BPF_OBJ_GET`, `BPF_OBJ_GET_INFO_BY_FD`). When its interface is unregistered
//! the kernel detaches the link and reports ifindex 0: the pins are then stale.

use std::{
    ffi::CString,
    io,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    path::Path,
};

const BPF_OBJ_GET: libc::c_long = 7;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;

/// `union bpf_attr` for BPF_OBJ_GET.
#[repr(C)]
struct ObjGetAttr {
    pathname: u64,
    bpf_fd: u32,
    file_flags: u32,
    path_fd: i32,
}

/// `union bpf_attr` for BPF_OBJ_GET_INFO_BY_FD.
#[repr(C)]
struct InfoAttr {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a bpf_attr prefix of the right shape for `cmd`, and any pointers
    // in it point to live buffers.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T,
            size_of::<T>() as libc::c_uint,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// The ifindex the XDP link pinned at `path` is attached to; 0 if its interface is gone.
pub fn xdp_link_ifindex(path: &Path) -> io::Result<u32> {
    let c = CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let mut get = ObjGetAttr {
        pathname: c.as_ptr() as u64,
        bpf_fd: 0,
        file_flags: 0,
        path_fd: 0,
    };
    let fd = bpf(BPF_OBJ_GET, &mut get)?;
    // SAFETY: the kernel just returned this descriptor to us.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    // struct bpf_link_info: type, id, prog_id (u32 each), then a union aligned to 8
    // whose `xdp` member starts with the ifindex.
    let mut info = [0u64; 32];
    let mut attr = InfoAttr {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: size_of_val(&info) as u32,
        info: info.as_mut_ptr() as u64,
    };
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr)?;
    Ok(info[2] as u32)
}

//! The few bpf(2) commands shaper needs that aya 0.14 does not offer: opening a pin as a
//! plain descriptor and pinning one, what a map, program or link is (`BPF_OBJ_GET_INFO_BY_FD`),
//! and switching a link's program only if it still runs the one expected
//! (`BPF_LINK_UPDATE` with `BPF_F_REPLACE`; aya's `Xdp::attach_to_link` does not compare),
//! and taking a link's program off its hook while the link stays (`BPF_LINK_DETACH`).

use std::{
    ffi::CString,
    io,
    os::fd::{AsFd as _, AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
    path::Path,
};

const BPF_OBJ_PIN: libc::c_long = 6;
const BPF_OBJ_GET: libc::c_long = 7;
const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_LINK_UPDATE: libc::c_long = 29;
const BPF_LINK_DETACH: libc::c_long = 34;
/// BPF_LINK_UPDATE: fail unless the link runs `old_prog_fd`'s program.
const BPF_F_REPLACE: u32 = 4;

/// `union bpf_attr` for BPF_OBJ_PIN and BPF_OBJ_GET. (Padding is spelled out: the kernel
/// refuses non-zero bytes past the fields a command reads.)
#[repr(C)]
struct ObjAttr {
    pathname: u64,
    bpf_fd: u32,
    file_flags: u32,
    path_fd: i32,
    _pad: u32,
}

/// `union bpf_attr` for BPF_OBJ_GET_INFO_BY_FD.
#[repr(C)]
struct InfoAttr {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

/// `union bpf_attr` for BPF_PROG_GET_FD_BY_ID.
#[repr(C)]
struct GetByIdAttr {
    id: u32,
    next_id: u32,
    open_flags: u32,
}

/// `union bpf_attr` for BPF_LINK_UPDATE.
#[repr(C)]
struct LinkUpdateAttr {
    link_fd: u32,
    new_prog_fd: u32,
    flags: u32,
    old_prog_fd: u32,
}

/// `union bpf_attr` for BPF_LINK_DETACH.
#[repr(C)]
struct LinkDetachAttr {
    link_fd: u32,
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

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
}

fn owned(fd: libc::c_long) -> OwnedFd {
    // SAFETY: the kernel just returned this descriptor to us, and nothing else owns it.
    unsafe { OwnedFd::from_raw_fd(fd as i32) }
}

/// How many pins this process has opened ([`obj_get`]): every pin shaper opens is opened
/// there. For the tests and the bench of a change ([`crate::change`]).
static PINS_OPENED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many pins this process has opened so far.
pub fn pins_opened() -> u64 {
    PINS_OPENED.load(std::sync::atomic::Ordering::Relaxed)
}

/// The object (map, program or link) pinned at `path`.
pub fn obj_get(path: &Path) -> io::Result<OwnedFd> {
    PINS_OPENED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let c = c_path(path)?;
    let mut attr = ObjAttr {
        pathname: c.as_ptr() as u64,
        bpf_fd: 0,
        file_flags: 0,
        path_fd: 0,
        _pad: 0,
    };
    bpf(BPF_OBJ_GET, &mut attr).map(owned)
}

/// Pins the object `fd` refers to at `path`.
pub fn obj_pin(fd: BorrowedFd<'_>, path: &Path) -> io::Result<()> {
    let c = c_path(path)?;
    let mut attr = ObjAttr {
        pathname: c.as_ptr() as u64,
        bpf_fd: fd.as_raw_fd() as u32,
        file_flags: 0,
        path_fd: 0,
        _pad: 0,
    };
    bpf(BPF_OBJ_PIN, &mut attr).map(drop)
}

/// Pins an object at `path` with `pin`, replacing what is pinned there in one step
/// (pinned beside it, then renamed over it): never a moment without a pin at `path`.
pub fn pin_over<E: Into<Box<dyn std::error::Error + Send + Sync>>>(
    path: &Path,
    pin: impl FnOnce(&Path) -> Result<(), E>,
) -> io::Result<()> {
    let mut beside = path.as_os_str().to_owned();
    beside.push(PIN_BESIDE);
    let beside = Path::new(&beside);
    match std::fs::remove_file(beside) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    pin(beside).map_err(io::Error::other)?;
    std::fs::rename(beside, path).inspect_err(|_| {
        let _ = std::fs::remove_file(beside);
    })
}

/// What [`pin_over`] appends to a pin's name for the pin it renames over it (bpffs
/// refuses names with a dot).
pub const PIN_BESIDE: &str = "_new";

/// Takes the program of the link `fd` off its hook; the link stays, holding nothing, as
/// the kernel leaves one whose interface is gone.
pub fn link_detach(fd: BorrowedFd<'_>) -> io::Result<()> {
    let mut attr = LinkDetachAttr {
        link_fd: fd.as_raw_fd() as u32,
    };
    bpf(BPF_LINK_DETACH, &mut attr).map(drop)
}

/// The kernel's `bpf_*_info` of the object `fd` refers to, as 64-bit words (the structs
/// are 8-byte aligned; the kernel fills what it has and zeroes nothing beyond).
fn info(fd: BorrowedFd<'_>) -> io::Result<[u64; 32]> {
    let mut info = [0u64; 32];
    let mut attr = InfoAttr {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: size_of_val(&info) as u32,
        info: info.as_mut_ptr() as u64,
    };
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr)?;
    Ok(info)
}

fn low(word: u64) -> u32 {
    word as u32
}

fn high(word: u64) -> u32 {
    (word >> 32) as u32
}

/// What the kernel says a map is: the fields libbpf checks before reusing a pinned map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapInfo {
    pub id: u32,
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub flags: u32,
}

/// `struct bpf_map_info` of the map pinned at `path`.
pub fn map_info(path: &Path) -> io::Result<MapInfo> {
    map_info_of(obj_get(path)?.as_fd())
}

/// `struct bpf_map_info` of the map `fd` refers to.
pub fn map_info_of(fd: BorrowedFd<'_>) -> io::Result<MapInfo> {
    // struct bpf_map_info: type, id, key_size, value_size, max_entries, map_flags (u32).
    let i = info(fd)?;
    Ok(MapInfo {
        map_type: low(i[0]),
        id: high(i[0]),
        key_size: low(i[1]),
        value_size: high(i[1]),
        max_entries: low(i[2]),
        flags: high(i[2]),
    })
}

/// The id of the program `fd` refers to.
pub fn prog_id(fd: BorrowedFd<'_>) -> io::Result<u32> {
    // struct bpf_prog_info: type, id (u32), ...
    Ok(high(info(fd)?[0]))
}

/// A descriptor of the loaded program `id`.
pub fn prog_by_id(id: u32) -> io::Result<OwnedFd> {
    let mut attr = GetByIdAttr {
        id,
        next_id: 0,
        open_flags: 0,
    };
    bpf(BPF_PROG_GET_FD_BY_ID, &mut attr).map(owned)
}

/// What a pinned XDP link runs, and where.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct XdpLinkInfo {
    pub id: u32,
    pub prog_id: u32,
    /// 0 once its interface is gone (the kernel detached it).
    pub ifindex: u32,
}

/// `struct bpf_link_info` of the XDP link `fd` refers to.
pub fn xdp_link_info(fd: BorrowedFd<'_>) -> io::Result<XdpLinkInfo> {
    // struct bpf_link_info: type, id, prog_id (u32 each), then a union aligned to 8
    // whose `xdp` member starts with the ifindex.
    let i = info(fd)?;
    Ok(XdpLinkInfo {
        id: high(i[0]),
        prog_id: low(i[1]),
        ifindex: low(i[2]),
    })
}

/// Makes the link `link` run `new_prog` instead of `old_prog`, in one step (each packet
/// sees one program or the other), or fails if it no longer runs `old_prog`.
pub fn replace_link_prog(
    link: BorrowedFd<'_>,
    new_prog: BorrowedFd<'_>,
    old_prog: BorrowedFd<'_>,
) -> io::Result<()> {
    let mut attr = LinkUpdateAttr {
        link_fd: link.as_raw_fd() as u32,
        new_prog_fd: new_prog.as_raw_fd() as u32,
        flags: BPF_F_REPLACE,
        old_prog_fd: old_prog.as_raw_fd() as u32,
    };
    bpf(BPF_LINK_UPDATE, &mut attr).map(drop)
}

const MEMBARRIER_CMD_GLOBAL: libc::c_int = 1;

/// Returns once no CPU still runs a program a link was switched away from before the
/// call. Programs run inside RCU read-side sections (softirq, with bottom halves off), and
/// `membarrier(MEMBARRIER_CMD_GLOBAL)` is `synchronize_rcu()`: every such section under
/// way when it was called has ended when it returns.
pub fn wait_for_running_programs() {
    // SAFETY: membarrier takes no pointers.
    let rc = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_GLOBAL, 0, 0) };
    if rc != 0 {
        // Refused on nohz_full kernels: a program runs for microseconds; this is
        // thousands of times as long.
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

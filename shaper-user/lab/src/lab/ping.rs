//! ICMPv6 echo over a link-local address, as `ping -6 -I IFACE fe80::...` sends it (the
//! lab's machines need no ping binary): a raw ICMPv6 socket made in a namespace, the
//! kernel filling in the checksum, the neighbour discovery before the first request left
//! to the kernel as for any other packet.

use std::{
    io,
    net::Ipv6Addr,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use shaper_user::netns;

const ECHO_REQUEST: u8 = 128;
const ECHO_REPLY: u8 = 129;

/// Sends `count` echo requests, `interval` apart, from namespace `ns` out of interface
/// `iface` to `dst`; how many were answered within `timeout` of their request.
pub fn ping6(
    ns: &str,
    iface: &str,
    dst: Ipv6Addr,
    count: u16,
    interval: Duration,
    timeout: Duration,
) -> Result<u16> {
    let iface_c = std::ffi::CString::new(iface)?;
    let (socket, index) = netns::run_in(ns, move || -> io::Result<(OwnedFd, u32)> {
        // SAFETY: plain system calls; the descriptor is owned at once.
        unsafe {
            let fd = libc::socket(
                libc::AF_INET6,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::IPPROTO_ICMPV6,
            );
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            let index = libc::if_nametoindex(iface_c.as_ptr());
            if index == 0 {
                return Err(io::Error::last_os_error());
            }
            Ok((OwnedFd::from_raw_fd(fd), index))
        }
    })?
    .context("cannot open a raw ICMPv6 socket")?;
    set_recv_timeout(&socket, Duration::from_millis(20))?;
    let id = (std::process::id() & 0xffff) as u16;
    let mut answered = 0;
    for seq in 0..count {
        let sent = Instant::now();
        send_echo(&socket, dst, index, id, seq)?;
        while sent.elapsed() < timeout {
            if receive_reply(&socket, id, seq)? {
                answered += 1;
                break;
            }
        }
        thread::sleep(interval.saturating_sub(sent.elapsed()));
    }
    Ok(answered)
}

fn set_recv_timeout(socket: &OwnedFd, timeout: Duration) -> Result<()> {
    let tv = libc::timeval {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_usec: timeout.subsec_micros() as libc::suseconds_t,
    };
    // SAFETY: `tv` lives across the call, its size given.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&raw const tv).cast(),
            size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error()).context("SO_RCVTIMEO");
    }
    Ok(())
}

fn send_echo(socket: &OwnedFd, dst: Ipv6Addr, scope: u32, id: u16, seq: u16) -> Result<()> {
    let mut msg = [0u8; 64];
    msg[0] = ECHO_REQUEST;
    msg[4..6].copy_from_slice(&id.to_be_bytes());
    msg[6..8].copy_from_slice(&seq.to_be_bytes());
    // SAFETY: an all-zero sockaddr_in6 is valid; fields set below.
    let mut to: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
    to.sin6_family = libc::AF_INET6 as libc::sa_family_t;
    to.sin6_addr.s6_addr = dst.octets();
    to.sin6_scope_id = scope;
    // SAFETY: `msg` and `to` live across the call, their sizes given.
    let rc = unsafe {
        libc::sendto(
            socket.as_raw_fd(),
            msg.as_ptr().cast(),
            msg.len(),
            0,
            (&raw const to).cast(),
            size_of::<libc::sockaddr_in6>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        let e = io::Error::last_os_error();
        // The neighbour's resolution failing (its queue full) is a lost request, as ping
        // counts it, not an error of the test.
        if !matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::ENOBUFS)) {
            return Err(e).context("sending an ICMPv6 echo request");
        }
    }
    Ok(())
}

/// Whether the next message (within the socket's timeout) is the reply to `seq`.
fn receive_reply(socket: &OwnedFd, id: u16, seq: u16) -> Result<bool> {
    let mut buf = [0u8; 1500];
    // SAFETY: `buf` lives across the call, its size given.
    let n = unsafe { libc::recv(socket.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted => {
                Ok(false)
            }
            _ => Err(e).context("receiving ICMPv6"),
        };
    }
    // A raw ICMPv6 socket receives the message from its ICMPv6 header on.
    let msg = &buf[..n as usize];
    Ok(msg.len() >= 8
        && msg[0] == ECHO_REPLY
        && msg[4..6] == id.to_be_bytes()
        && msg[6..8] == seq.to_be_bytes())
}

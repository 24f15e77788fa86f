//! Crafted frames through a [`Lab`], for encapsulations the lab's kernel cannot make itself
//! (this kernel has no 802.1Q VLAN devices and no PPPoE): a packet socket writes whole
//! Ethernet frames onto the tx veth, and a packet socket on the rx veth counts what the XDP
//! program there let through.
//!
//! A flow paced at up to [`REALTIME_MAX_FPS`] frames a second is sent by a real-time
//! (SCHED_FIFO) thread, so that it keeps its schedule whatever else the CPUs are busy
//! with: a flood sent flat out beside it, its softirq work, other processes. Without that,
//! on two CPUs, an over-limit flow's sender was held up for up to 140 ms at a time behind
//! a flood's sender, then sent its backlog at once; a policer rightly passes only a burst
//! of such a clump, so the flow got less than rate × time (−1.8% and −4.6% in 4 s), and a
//! test of the policer failed for the generator's sake. [`RawResult::max_gap_secs`] says
//! how long a flow went without a frame at worst. (This kernel does not preempt kernel
//! code, so a long system call of another process can still hold up a real-time thread
//! on a busy machine.) A paced flow's send refused for a full queue is retried for a
//! moment ([`FULL_QUEUE_RETRY`]): a flood keeps the veth's queue full, and 3% of a real
//! source's frames went missing before the limiter, in gaps of up to 34 ms.
//!
//! The last [`TAG_BYTES`] of every frame are overwritten with a marker and the flow's index,
//! so the receiver tells flows apart whatever the kernel does to the headers on the way (it
//! moves an outer VLAN tag out of the frame before packet sockets see it). The frames are
//! not delivered to any socket beyond that: the rx kernel has nowhere to send a tagged frame
//! and drops it after the packet socket has seen it.

use std::{
    io,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    sync::atomic::{AtomicBool, Ordering},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, ensure};

use super::{
    Lab,
    traffic::{
        DRAIN, Late, MAX_FRAME_BYTES, Pacing, RCVBUF_BYTES, RECEIVER_SLACK, RECV_TIMEOUT,
        START_DELAY, StopOnDrop, is_queue_full, join, pace, realtime_priority,
    },
};
use shaper_user::netns;

/// Bytes at the end of each frame that carry the marker and the flow index.
pub const TAG_BYTES: usize = 8;
const MARKER: [u8; 4] = *b"shRW";
/// Flows paced at up to this many frames a second are sent at real-time priority: their
/// sender sleeps most of the time (2000 frames/s of 1000 bytes take a few percent of a
/// CPU). Faster ones (a flood, sent flat out) are sent at normal priority: a real-time
/// thread that never sleeps would take its CPU from everything else.
pub const REALTIME_MAX_FPS: f64 = 20_000.0;
/// How long a paced flow's sender retries a send refused because the veth's queue is full
/// (a flood beside it keeps the queue full): as a host's own stack would hold the frame,
/// it goes out a little late instead of going missing before it reaches the limiter.
const FULL_QUEUE_RETRY: Duration = Duration::from_millis(1);

/// One stream of identical crafted frames.
#[derive(Debug, Clone)]
pub struct RawFlow {
    /// The whole frame from the destination MAC on, without FCS. Its last [`TAG_BYTES`]
    /// must be payload: they are overwritten.
    pub frame: Vec<u8>,
    /// Offered load, layer-2 bits per second.
    pub offered_bps: u64,
    /// Which sources the frames come from.
    pub sources: Sources,
    /// What its sender does when it wakes late: sends the overdue frames at once
    /// ([`Late::CatchUp`], the rate kept), or skips them ([`Late::Skip`], counted in
    /// [`RawResult::skipped_packets`]: no frames closer together than the rate has them,
    /// as a claim of what a rate of arrivals gets needs).
    pub late: Late,
}

/// Which sources a [`RawFlow`]'s frames come from. Beyond the frame's own, the source of
/// an untagged IPv4 frame counts up from the frame's own by one address per frame sent,
/// that of an untagged IPv6 frame by one /64 (shaper's default IPv6 key) per frame (a send
/// refused for a full queue is tried again from the same source).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sources {
    /// Every frame from the frame's own source.
    One,
    /// A pool of this many sources, in turn: the `k`th frame sent comes from the
    /// `k mod n`th (a warm start, new sources arriving, a flood of repeating addresses).
    Pool(u32),
    /// Each frame from a source never used before (a spoofed flood).
    Spoofed,
}

impl Sources {
    /// How many of `sent` frames came from the `i`th source (the frame's own is the 0th).
    pub fn frames_from(self, sent: u64, i: u32) -> u64 {
        match self {
            Self::One => {
                if i == 0 {
                    sent
                } else {
                    0
                }
            }
            Self::Pool(n) => {
                let n = u64::from(n);
                if u64::from(i) >= n {
                    0
                } else {
                    sent / n + u64::from(u64::from(i) < sent % n)
                }
            }
            Self::Spoofed => u64::from(u64::from(i) < sent),
        }
    }

    /// The source of the frame sent after `sent` others, as how many steps it is past the
    /// frame's own.
    fn index(self, sent: u64) -> u64 {
        match self {
            Self::One => 0,
            Self::Pool(n) => sent % u64::from(n.max(1)),
            Self::Spoofed => sent,
        }
    }
}

/// Where an untagged IPv4 frame holds its source address.
const IPV4_SRC_AT: usize = 14 + 12;
/// Where an untagged IPv6 frame holds its source address.
const IPV6_SRC_AT: usize = 14 + 8;

/// The source address of an untagged IP frame, which [`Sources`] steps through.
#[derive(Debug, Clone, Copy)]
enum SourceField {
    /// IPv4: steps of one address; the header checksum made right again.
    V4 { first: u32 },
    /// IPv6: steps of one /64 (no header checksum).
    V6 { first: u128 },
}

impl SourceField {
    /// The source field of `frame`, if it is an untagged IP frame long enough to hold one
    /// before its tag.
    fn of(frame: &[u8]) -> Option<Self> {
        let fits = |at: usize, len: usize| frame.len() >= at + len + TAG_BYTES;
        match frame.get(12..14)? {
            [0x08, 0x00] if fits(IPV4_SRC_AT, 4) => Some(Self::V4 {
                first: u32::from_be_bytes(frame[IPV4_SRC_AT..][..4].try_into().ok()?),
            }),
            [0x86, 0xdd] if fits(IPV6_SRC_AT, 16) => Some(Self::V6 {
                first: u128::from_be_bytes(frame[IPV6_SRC_AT..][..16].try_into().ok()?),
            }),
            _ => None,
        }
    }

    /// Writes into `frame` the source `index` steps past the first.
    fn write(self, frame: &mut [u8], index: u64) {
        match self {
            // Wraps after 2^32 frames, which no run sends.
            Self::V4 { first } => {
                let src = first.wrapping_add(index as u32).to_be_bytes();
                frame[IPV4_SRC_AT..][..4].copy_from_slice(&src);
                fix_ipv4_checksum(frame);
            }
            Self::V6 { first } => {
                let src = first.wrapping_add(u128::from(index) << 64).to_be_bytes();
                frame[IPV6_SRC_AT..][..16].copy_from_slice(&src);
            }
        }
    }
}

/// What one raw flow sent and what of it the rx veth's packet socket saw.
#[derive(Clone, PartialEq)]
pub struct RawResult {
    pub attempted_packets: u64,
    /// Overdue frames its sender skipped ([`Late::Skip`]), never sent.
    pub skipped_packets: u64,
    pub sent_packets: u64,
    pub received_packets: u64,
    /// When the kernel received the first and the last of them (the receive timestamps
    /// of the rx veth's packet socket, CLOCK_REALTIME in nanoseconds; 0 if none came), as
    /// [`super::FlowResult::first_received_ns`].
    pub first_received_ns: u64,
    pub last_received_ns: u64,
    pub frame_bytes: u32,
    /// From the pacing start to the last send.
    pub offered_secs: f64,
    /// The longest time the flow went without a frame sent, in seconds: the time between
    /// two of its frames, or its sender's tick (a millisecond at most), and a little more
    /// when it kept its schedule (see [`REALTIME_MAX_FPS`]).
    pub max_gap_secs: f64,
    /// Frames sent in each millisecond from the start: when a flow that could stall
    /// (a flood, at normal priority) offered what, for a model of what a limiter should
    /// make of it.
    pub per_ms: Vec<u32>,
    /// When each successful send was handed to the kernel, nanoseconds from the flows'
    /// common start, in order, when [`RawOptions::record_sends`] is set (empty otherwise),
    /// as [`super::FlowResult::send_offsets_ns`].
    pub send_offsets_ns: Vec<u64>,
}

impl std::fmt::Debug for RawResult {
    /// Every field but the thousands of [`RawResult::per_ms`], which it sums up.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawResult")
            .field("attempted_packets", &self.attempted_packets)
            .field("skipped_packets", &self.skipped_packets)
            .field("sent_packets", &self.sent_packets)
            .field("received_packets", &self.received_packets)
            .field("first_received_ns", &self.first_received_ns)
            .field("last_received_ns", &self.last_received_ns)
            .field("frame_bytes", &self.frame_bytes)
            .field("offered_secs", &self.offered_secs)
            .field("max_gap_secs", &self.max_gap_secs)
            .field(
                "per_ms",
                &format_args!(
                    "[{} ms, {} sent]",
                    self.per_ms.len(),
                    self.per_ms.iter().sum::<u32>()
                ),
            )
            .field(
                "send_offsets_ns",
                &format_args!("[{} recorded]", self.send_offsets_ns.len()),
            )
            .finish()
    }
}

impl RawResult {
    pub fn sent_l2_bytes(&self) -> u64 {
        self.sent_packets * u64::from(self.frame_bytes)
    }

    /// Bytes as sent (before the kernel stripped any tag) of the frames that arrived.
    pub fn received_l2_bytes(&self) -> u64 {
        self.received_packets * u64::from(self.frame_bytes)
    }
}

/// What [`run_raw`] measured.
#[derive(Debug, Clone, PartialEq)]
pub struct RawRun {
    /// One per flow, in the order of the flows.
    pub flows: Vec<RawResult>,
    /// Frames the receiving packet socket dropped because its buffer was full: the
    /// received counts are short by this many. Should be 0.
    pub receiver_drops: u64,
}

/// How [`run_raw_with`] runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RawOptions {
    /// Keep the time of every successful send ([`RawResult::send_offsets_ns`]).
    pub record_sends: bool,
}

/// Sends every flow for `duration` from the tx veth and counts, per flow, the frames the
/// rx veth passed up.
pub fn run_raw(lab: &Lab, flows: &[RawFlow], duration: Duration) -> Result<RawRun> {
    run_raw_with(lab, flows, duration, &RawOptions::default())
}

/// [`run_raw`] with [`RawOptions`]: every send's time recorded.
pub fn run_raw_with(
    lab: &Lab,
    flows: &[RawFlow],
    duration: Duration,
    options: &RawOptions,
) -> Result<RawRun> {
    let mut frames = Vec::with_capacity(flows.len());
    for (i, flow) in flows.iter().enumerate() {
        ensure!(
            (14 + TAG_BYTES..=MAX_FRAME_BYTES as usize).contains(&flow.frame.len()),
            "raw flow {i}: a {}-byte frame is outside {}..={MAX_FRAME_BYTES}",
            flow.frame.len(),
            14 + TAG_BYTES
        );
        ensure!(
            flow.sources == Sources::One || SourceField::of(&flow.frame).is_some(),
            "raw flow {i}: not an untagged IP frame long enough to change its source"
        );
        ensure!(
            flow.sources != Sources::Pool(0),
            "raw flow {i}: a pool of no sources"
        );
        let mut frame = flow.frame.clone();
        let at = frame.len() - TAG_BYTES;
        frame[at..at + 4].copy_from_slice(&MARKER);
        frame[at + 4..].copy_from_slice(&u32::try_from(i)?.to_be_bytes());
        frames.push(frame);
    }
    let receiver = open_packet_socket(lab.rx_ns(), lab.rx_iface(), true)?;
    let senders: Vec<OwnedFd> = flows
        .iter()
        .map(|_| open_packet_socket(lab.tx_ns(), lab.tx_iface(), false))
        .collect::<Result<_>>()?;

    let stop = AtomicBool::new(false);
    let start = Instant::now() + START_DELAY;
    let deadline = start + duration + DRAIN + RECEIVER_SLACK;
    let (sent, received) = thread::scope(|scope| {
        // Stops the counter however this block ends, a sender's panic included.
        let stop_guard = StopOnDrop(&stop);
        let counter = scope.spawn(|| count(&receiver, flows.len(), &stop, deadline));
        let handles: Vec<_> = senders
            .iter()
            .zip(&frames)
            .zip(flows)
            .map(|((fd, frame), flow)| {
                let frame_bytes = u32::try_from(frame.len()).expect("checked above");
                let fps = flow.offered_bps as f64 / 8.0 / f64::from(frame_bytes);
                let paced = fps <= REALTIME_MAX_FPS;
                scope.spawn(move || {
                    if paced {
                        realtime_priority().context("cannot make a paced sender real-time")?;
                    }
                    let mut frame = frame.clone();
                    let field = SourceField::of(&frame);
                    // Frames sent: the next one's source.
                    let mut n: u64 = 0;
                    let pacing = Pacing {
                        offered_bps: flow.offered_bps,
                        frame_bytes,
                        start,
                        duration,
                        late: flow.late,
                        record: options.record_sends,
                    };
                    pace(&pacing, || {
                        if let Some(field) = field.filter(|_| flow.sources != Sources::One) {
                            field.write(&mut frame, flow.sources.index(n));
                        }
                        let refused_at = Instant::now();
                        loop {
                            match send(fd, &frame) {
                                Err(e)
                                    if paced
                                        && is_queue_full(&e)
                                        && refused_at.elapsed() < FULL_QUEUE_RETRY =>
                                {
                                    std::hint::spin_loop();
                                }
                                Ok(()) => {
                                    n += 1;
                                    return Ok(());
                                }
                                refused => return refused,
                            }
                        }
                    })
                    .context("send failed")
                })
            })
            .collect();
        let sent: Vec<_> = handles.into_iter().map(join).collect();
        thread::sleep(DRAIN);
        drop(stop_guard);
        (sent, join(counter))
    });
    let (received, receiver_drops) = received?;
    let flows = sent
        .into_iter()
        .zip(&frames)
        .zip(received)
        .enumerate()
        .map(|(i, ((sent, frame), received))| {
            let sent = sent.with_context(|| format!("raw flow {i}"))?;
            Ok(RawResult {
                attempted_packets: sent.attempted,
                skipped_packets: sent.skipped,
                sent_packets: sent.packets,
                received_packets: received.packets,
                first_received_ns: received.first_ns,
                last_received_ns: received.last_ns,
                frame_bytes: u32::try_from(frame.len())?,
                offered_secs: sent.secs,
                max_gap_secs: sent.max_gap_secs,
                per_ms: sent.per_ms,
                send_offsets_ns: sent.send_offsets_ns,
            })
        })
        .collect::<Result<_>>()?;
    Ok(RawRun {
        flows,
        receiver_drops,
    })
}

/// Recomputes the header checksum of an untagged IPv4 frame's header after its source
/// changed, so that a router's IP stack takes the frame instead of dropping it as corrupt.
fn fix_ipv4_checksum(frame: &mut [u8]) {
    const IP: usize = 14;
    let hlen = usize::from(frame[IP] & 0x0f) * 4;
    if hlen < 20 || frame.len() < IP + hlen {
        return;
    }
    frame[IP + 10..IP + 12].fill(0);
    let mut sum: u32 = frame[IP..IP + hlen]
        .chunks_exact(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    let checksum = !(sum as u16);
    frame[IP + 10..IP + 12].copy_from_slice(&checksum.to_be_bytes());
}

/// A packet socket on `iface` in namespace `ns`: a receiving one sees every frame the
/// interface takes in, a sending one writes whole frames out of it (non-blocking).
fn open_packet_socket(ns: &str, iface: &str, receive: bool) -> Result<OwnedFd> {
    let iface = iface.to_owned();
    netns::run_in(ns, move || -> Result<OwnedFd> {
        let name = std::ffi::CString::new(iface.clone())?;
        // SAFETY: a NUL-terminated name.
        let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
        ensure!(ifindex != 0, "no interface {iface}");
        // Receivers take every protocol; senders take none (they only write).
        let protocol = if receive {
            (libc::ETH_P_ALL as u16).to_be()
        } else {
            0
        };
        // SAFETY: plain socket creation; the fd is owned right after.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, i32::from(protocol)) };
        if fd < 0 {
            return Err(io::Error::last_os_error()).context("cannot open a packet socket");
        }
        // SAFETY: `fd` is a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: all-zero is a valid sockaddr_ll; the fields set below make it a binding.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = protocol;
        addr.sll_ifindex = i32::try_from(ifindex)?;
        // SAFETY: the pointer and length describe `addr`.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&raw const addr).cast(),
                size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error())
                .with_context(|| format!("cannot bind a packet socket to {iface}"));
        }
        if receive {
            set_option(&fd, libc::SO_RCVBUFFORCE, &RCVBUF_BYTES)?;
            let timeout = libc::timeval {
                tv_sec: 0,
                tv_usec: libc::suseconds_t::try_from(RECV_TIMEOUT.as_micros())?,
            };
            set_option(&fd, libc::SO_RCVTIMEO, &timeout)?;
            set_option(&fd, libc::SO_TIMESTAMPNS, &1 as &libc::c_int)?;
        }
        Ok(fd)
    })?
}

fn set_option<T>(fd: &OwnedFd, name: libc::c_int, value: &T) -> Result<()> {
    // SAFETY: the pointer and length describe `value`; the fd is open.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            name,
            (value as *const T).cast(),
            size_of::<T>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error()).with_context(|| format!("setsockopt {name} failed"))
    }
}

fn send(fd: &OwnedFd, frame: &[u8]) -> io::Result<()> {
    // SAFETY: the pointer and length describe `frame`; the fd is open.
    let n = unsafe {
        libc::send(
            fd.as_raw_fd(),
            frame.as_ptr().cast(),
            frame.len(),
            libc::MSG_DONTWAIT,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// What arrived of one flow.
#[derive(Debug, Clone, Copy, Default)]
struct Arrivals {
    packets: u64,
    /// The kernel's receive timestamps of the first and last frame.
    first_ns: u64,
    last_ns: u64,
}

/// Counts frames carrying the marker per flow index until `stop` or `deadline`; frames the
/// interface itself sends (none in the lab) and frames without the marker are ignored.
/// Also returns how many frames the socket dropped meanwhile for want of buffer.
fn count(
    fd: &OwnedFd,
    flows: usize,
    stop: &AtomicBool,
    deadline: Instant,
) -> Result<(Vec<Arrivals>, u64)> {
    let mut counts = vec![Arrivals::default(); flows];
    let mut buf = vec![0u8; MAX_FRAME_BYTES as usize];
    // Room for the SCM_TIMESTAMPNS control message, u64-aligned as cmsghdr needs.
    // SAFETY: CMSG_SPACE only computes a size.
    let control_len = unsafe { libc::CMSG_SPACE(size_of::<libc::timespec>() as u32) } as usize;
    let mut control = vec![0u64; control_len.div_ceil(8)];
    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
        // SAFETY: all-zero is a valid sockaddr_ll for the kernel to fill.
        let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // SAFETY: all-zero is a valid msghdr; the fields set below describe our buffers.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_name = (&raw mut from).cast();
        msg.msg_namelen = size_of::<libc::sockaddr_ll>() as libc::socklen_t;
        msg.msg_iov = &raw mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = control_len;
        // SAFETY: the header points at live, writable memory of the given lengths (the
        // frame buffer, the address, the control buffer); the fd is open. SO_RCVTIMEO
        // bounds the wait.
        let n = unsafe { libc::recvmsg(fd.as_raw_fd(), &raw mut msg, 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::WouldBlock
                | io::ErrorKind::TimedOut
                | io::ErrorKind::Interrupted => continue,
                _ => return Err(e).context("packet socket receive failed"),
            }
        }
        let n = n.unsigned_abs();
        if from.sll_pkttype == libc::PACKET_OUTGOING || n < TAG_BYTES {
            continue;
        }
        let tag = &buf[n - TAG_BYTES..n];
        if tag[..4] != MARKER {
            continue;
        }
        let index = u32::from_be_bytes(tag[4..].try_into().expect("4 bytes")) as usize;
        if let Some(c) = counts.get_mut(index) {
            if let Some(ns) = super::traffic::received_ns(&msg) {
                if c.packets == 0 {
                    c.first_ns = ns;
                }
                c.last_ns = ns;
            }
            c.packets += 1;
        }
    }
    Ok((counts, socket_drops(fd)?))
}

/// Frames a packet socket dropped for want of buffer since it was opened (the kernel
/// resets the count on each read, and this is the only one).
fn socket_drops(fd: &OwnedFd) -> Result<u64> {
    let mut stats = libc::tpacket_stats {
        tp_packets: 0,
        tp_drops: 0,
    };
    let mut len = size_of::<libc::tpacket_stats>() as libc::socklen_t;
    // SAFETY: the pointer and length describe `stats`; the fd is open.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_PACKET,
            libc::PACKET_STATISTICS,
            (&raw mut stats).cast(),
            &raw mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error()).context("cannot read PACKET_STATISTICS");
    }
    Ok(u64::from(stats.tp_drops))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame;

    #[test]
    fn frames_are_counted_to_the_source_that_sent_them() {
        for sources in [
            Sources::One,
            Sources::Pool(1),
            Sources::Pool(3),
            Sources::Spoofed,
        ] {
            let mut counts = [0u64; 12];
            for sent in 0..10 {
                counts[sources.index(sent) as usize] += 1;
            }
            let expected: Vec<u64> = (0..12).map(|i| sources.frames_from(10, i)).collect();
            assert_eq!(counts.to_vec(), expected, "{sources:?}");
        }
        assert_eq!(
            (0..3)
                .map(|i| Sources::Pool(3).frames_from(10, i))
                .collect::<Vec<_>>(),
            [4, 3, 3]
        );
    }

    #[test]
    fn an_ipv6_source_steps_by_a_64() {
        let (dst, src) = (frame::DEFAULT_DST_V6, "2001:db8:0:7::11".parse().unwrap());
        let mut f = frame::ipv6_udp(src, dst, 40);
        let field = SourceField::of(&f).expect("an IPv6 frame");
        field.write(&mut f, 3);
        let stepped = "2001:db8:0:a::11".parse().unwrap();
        assert_eq!(f, frame::ipv6_udp(stepped, dst, 40));
    }

    #[test]
    fn a_spoofed_source_gets_a_valid_header_checksum() {
        let mut f = frame::ipv4_udp(std::net::Ipv4Addr::new(10, 64, 0, 0), 60);
        let reference = frame::ipv4_udp(std::net::Ipv4Addr::new(10, 64, 1, 2), 60);
        f[IPV4_SRC_AT..IPV4_SRC_AT + 4].copy_from_slice(&[10, 64, 1, 2]);
        fix_ipv4_checksum(&mut f);
        assert_eq!(f, reference);
    }

    #[test]
    #[ignore = "needs root: creates network namespaces (cargo xtask test)"]
    fn crafted_frames_arrive_counted_per_flow() {
        let lab = Lab::new("t-raw", 2).expect("create lab");
        let flows: Vec<RawFlow> = [(lab.sources()[0], 2_000_000), (lab.sources()[1], 1_000_000)]
            .iter()
            .map(|&(src, offered_bps)| RawFlow {
                sources: Sources::One,
                frame: frame::ipv4_udp(src, 500),
                offered_bps,
                late: Late::CatchUp,
            })
            .collect();
        let options = RawOptions { record_sends: true };
        let run = run_raw_with(&lab, &flows, Duration::from_secs(1), &options).expect("run_raw");
        assert_eq!(run.receiver_drops, 0);
        for (flow, r) in flows.iter().zip(&run.flows) {
            eprintln!("{r:?}");
            assert!(r.sent_packets > 0, "{r:?}");
            // Nothing limits them: every frame sent is seen at the rx veth.
            assert_eq!(r.received_packets, r.sent_packets, "{r:?}");
            // The send record: every frame sent is in it, and no gap is shorter than the
            // flow's frame interval allows (its sends are due 1/fps apart).
            assert_eq!(
                r.per_ms.iter().map(|&n| u64::from(n)).sum::<u64>(),
                r.sent_packets
            );
            // Every send's time, in order, in the millisecond that counted it.
            assert_eq!(r.send_offsets_ns.len() as u64, r.sent_packets, "{r:?}");
            assert!(r.send_offsets_ns.is_sorted(), "{r:?}");
            let mut per_ms = vec![0u32; r.per_ms.len()];
            for &ns in &r.send_offsets_ns {
                per_ms[(ns / 1_000_000) as usize] += 1;
            }
            assert_eq!(per_ms, r.per_ms);
            let interval = f64::from(r.frame_bytes) * 8.0 / flow.offered_bps as f64;
            assert!(r.max_gap_secs >= 0.9 * interval, "{r:?}");
            // At the rate asked, within 5%: over the whole send, or, on a loaded host whose
            // scheduler held the sender off at the end (no frame is due after the run's
            // end to catch up with), over the send less its longest gap.
            let sent_bits = r.sent_l2_bytes() as f64 * 8.0;
            let ratio = sent_bits / r.offered_secs / flow.offered_bps as f64;
            let active = (r.offered_secs - r.max_gap_secs).max(f64::MIN_POSITIVE);
            let ratio_active = sent_bits / active / flow.offered_bps as f64;
            assert!(
                ratio <= 1.05 && (ratio >= 0.95 || (0.95..=1.05).contains(&ratio_active)),
                "sent/offered {ratio} ({ratio_active} without the longest gap): {r:?}"
            );
        }
        // A frame too short for the tag is refused before anything is sent.
        let short = RawFlow {
            sources: Sources::One,
            frame: vec![0; 14],
            offered_bps: 1_000,
            late: Late::CatchUp,
        };
        assert!(run_raw(&lab, &[short], Duration::from_millis(10)).is_err());
    }
}

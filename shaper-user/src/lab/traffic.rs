//! Paced UDP load through a [`Lab`] and a receiver that counts what arrives per source.
//!
//! Plain std threads and sockets, no external tools: one sender thread per [`Flow`] in the
//! tx namespace and one counting receiver in the rx namespace. Sockets are created inside
//! their namespace (a socket stays in the namespace it was created in), then used from
//! ordinary threads.
//!
//! Rates and sizes are at layer 2, as the shaper counts them: a frame is the UDP payload
//! plus the UDP, IPv4 and Ethernet headers (42 bytes), without the FCS.

use std::{
    collections::HashMap,
    io,
    net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket},
    os::fd::AsRawFd as _,
    sync::atomic::{AtomicBool, Ordering},
    thread::{self, ScopedJoinHandle},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, ensure};
use serde::Serialize;

use super::Lab;
use crate::netns;

/// Ethernet (14) + IPv4 (20) + UDP (8) header bytes around each payload.
pub const L2_OVERHEAD: u32 = 14 + 20 + 8;
/// Smallest Ethernet frame without FCS.
pub const MIN_FRAME_BYTES: u32 = 60 + 4;
/// A 9000-byte jumbo MTU plus the Ethernet header.
pub const MAX_FRAME_BYTES: u32 = 9000 + 14;

/// Senders wake this often; each wake-up sends whatever became due since the last one.
const TICK: Duration = Duration::from_millis(1);
/// How long the receiver keeps counting after the last sender stopped (packets in flight).
const DRAIN: Duration = Duration::from_millis(300);
/// How often the receiver looks at its stop flag when no packets come.
const RECV_TIMEOUT: Duration = Duration::from_millis(50);
/// Room for bursts while the receiving thread is not scheduled (2 cores, kernel busy too).
const RCVBUF_BYTES: libc::c_int = 16 << 20;
/// Hard stop for the receiver beyond duration + DRAIN, should the stop flag never come.
const RECEIVER_SLACK: Duration = Duration::from_secs(10);

/// One source's offered load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flow {
    /// Sender address; must be one of [`Lab::sources`].
    pub src: Ipv4Addr,
    /// Offered load in layer-2 bits per second.
    pub offered_bps: u64,
    /// Layer-2 frame size including the 14-byte Ethernet header, without FCS
    /// ([`MIN_FRAME_BYTES`]..=[`MAX_FRAME_BYTES`]; above 1514 needs [`Lab::set_mtu`]).
    pub frame_bytes: u32,
}

/// What one flow sent and what of it arrived.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FlowResult {
    pub src: Ipv4Addr,
    pub sent_packets: u64,
    pub sent_l2_bytes: u64,
    pub received_packets: u64,
    pub received_l2_bytes: u64,
    /// How long the sender actually sent: from the start of its pacing clock to its last
    /// send. (Packet k is due at k intervals, so this is first-to-last send plus one
    /// interval, which makes `sent_bps` match the offered rate instead of overshooting it
    /// by one packet.)
    pub offered_secs: f64,
}

impl FlowResult {
    /// Layer-2 bits per second that left the sender.
    pub fn sent_bps(&self) -> f64 {
        bits_per_sec(self.sent_l2_bytes, self.offered_secs)
    }

    /// Layer-2 bits per second that reached the receiver, over the sending time.
    pub fn received_bps(&self) -> f64 {
        bits_per_sec(self.received_l2_bytes, self.offered_secs)
    }
}

fn bits_per_sec(bytes: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        bytes as f64 * 8.0 / secs
    } else {
        0.0
    }
}

/// Sends every flow for `duration` from the tx namespace to the receiver in the rx
/// namespace and counts what arrives. Results are in the order of `flows`.
///
/// Sends that fail with ENOBUFS or EAGAIN (queues full) count as not sent; the flow goes on.
pub fn run_udp(lab: &Lab, flows: &[Flow], duration: Duration) -> Result<Vec<FlowResult>> {
    validate(lab, flows)?;
    let receiver = open_receiver(lab)?;
    let port = receiver.local_addr()?.port();
    let dst = SocketAddrV4::new(lab.rx_addr(), port);
    let senders = open_senders(lab, flows, dst)?;

    let stop = AtomicBool::new(false);
    let deadline = Instant::now() + duration + DRAIN + RECEIVER_SLACK;
    let (sent, received) = thread::scope(|scope| {
        // Stops the receiver however this block ends, including a sender's panic being
        // re-raised below; otherwise the scope would wait for the receiver's deadline.
        let stop_guard = StopOnDrop(&stop);
        let receiver = scope.spawn(|| receive(&receiver, &stop, deadline));
        let handles: Vec<_> = senders
            .iter()
            .zip(flows)
            .map(|(socket, flow)| scope.spawn(move || send_paced(socket, flow, duration)))
            .collect();
        let sent: Vec<_> = handles.into_iter().map(join).collect();
        thread::sleep(DRAIN);
        drop(stop_guard);
        (sent, join(receiver))
    });
    let received = received?;

    flows
        .iter()
        .zip(sent)
        .map(|(flow, sent)| {
            let sent = sent.with_context(|| format!("sender {} failed", flow.src))?;
            let got = received.get(&flow.src).copied().unwrap_or_default();
            Ok(FlowResult {
                src: flow.src,
                sent_packets: sent.packets,
                sent_l2_bytes: sent.packets * u64::from(flow.frame_bytes),
                received_packets: got.packets,
                received_l2_bytes: got.l2_bytes,
                offered_secs: sent.secs,
            })
        })
        .collect()
}

fn validate(lab: &Lab, flows: &[Flow]) -> Result<()> {
    for (i, flow) in flows.iter().enumerate() {
        ensure!(
            (MIN_FRAME_BYTES..=MAX_FRAME_BYTES).contains(&flow.frame_bytes),
            "flow from {}: frame size {} bytes is outside {MIN_FRAME_BYTES}..={MAX_FRAME_BYTES} \
             (layer 2, Ethernet header included, no FCS)",
            flow.src,
            flow.frame_bytes
        );
        ensure!(
            lab.sources().contains(&flow.src),
            "flow source {} is not one of the lab's sources {:?}",
            flow.src,
            lab.sources()
        );
        // The receiver counts per source address, so two flows from one source would merge.
        ensure!(
            !flows[..i].iter().any(|f| f.src == flow.src),
            "two flows from {}; use one flow per source",
            flow.src
        );
    }
    Ok(())
}

/// Sets `stop` when dropped.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Joins a scoped thread, re-raising its panic here.
fn join<T>(handle: ScopedJoinHandle<'_, T>) -> T {
    handle
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// A UDP socket in the rx namespace on a free port of the receiver address.
fn open_receiver(lab: &Lab) -> Result<UdpSocket> {
    let addr = SocketAddrV4::new(lab.rx_addr(), 0);
    netns::run_in(lab.rx_ns(), move || -> Result<UdpSocket> {
        let socket = UdpSocket::bind(addr).with_context(|| format!("cannot bind {addr}"))?;
        // FORCE ignores net.core.rmem_max (we are root); a large buffer keeps the counts
        // exact while this thread waits for a CPU.
        set_int_option(
            &socket,
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            RCVBUF_BYTES,
        )
        .context("cannot set SO_RCVBUFFORCE")?;
        socket.set_read_timeout(Some(RECV_TIMEOUT))?;
        Ok(socket)
    })?
    .context("cannot open the receiver socket")
}

/// One non-blocking UDP socket per flow in the tx namespace, bound to the flow's source
/// and connected to `dst`.
fn open_senders(lab: &Lab, flows: &[Flow], dst: SocketAddrV4) -> Result<Vec<UdpSocket>> {
    let srcs: Vec<Ipv4Addr> = flows.iter().map(|f| f.src).collect();
    netns::run_in(lab.tx_ns(), move || -> Result<Vec<UdpSocket>> {
        srcs.iter()
            .map(|&src| open_sender(src, dst).with_context(|| format!("sender socket {src}")))
            .collect()
    })?
}

fn open_sender(src: Ipv4Addr, dst: SocketAddrV4) -> Result<UdpSocket> {
    let socket = UdpSocket::bind(SocketAddrV4::new(src, 0))?;
    // Never fragment: a frame larger than the MTU must fail (EMSGSIZE) instead of silently
    // turning into several frames the L2 byte count would not match.
    set_int_option(
        &socket,
        libc::IPPROTO_IP,
        libc::IP_MTU_DISCOVER,
        libc::IP_PMTUDISC_DO,
    )
    .context("cannot set IP_MTU_DISCOVER")?;
    socket.connect(dst)?;
    // Non-blocking, so a full queue shows up as EAGAIN (counted, skipped) instead of
    // stalling the pacing.
    socket.set_nonblocking(true)?;
    Ok(socket)
}

fn set_int_option(
    socket: &UdpSocket,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: the pointer and length describe `value`, which outlives the call, and the fd
    // is open for as long as `socket` is borrowed.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            level,
            name,
            (&raw const value).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Packets and layer-2 bytes received from one source.
#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    packets: u64,
    l2_bytes: u64,
}

/// Counts datagrams per source address until `stop` is set or `deadline` passes.
fn receive(
    socket: &UdpSocket,
    stop: &AtomicBool,
    deadline: Instant,
) -> Result<HashMap<Ipv4Addr, Counts>> {
    let mut counts: HashMap<Ipv4Addr, Counts> = HashMap::new();
    let mut buf = vec![0u8; 65536];
    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
        match socket.recv_from(&mut buf) {
            Ok((len, SocketAddr::V4(from))) => {
                let entry = counts.entry(*from.ip()).or_default();
                entry.packets += 1;
                entry.l2_bytes += len as u64 + u64::from(L2_OVERHEAD);
            }
            Ok((_, SocketAddr::V6(_))) => {}
            // The read timeout: go and look at the stop flag.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e).context("receiver: recv_from failed"),
        }
    }
    Ok(counts)
}

/// What one sender managed to send.
#[derive(Debug, Clone, Copy)]
struct Sent {
    packets: u64,
    /// Pacing start to last successful send.
    secs: f64,
}

/// Sends `flow` for `duration`: each tick sends the packets that became due since the
/// start, so after a stall it catches up by at most what the stall delayed.
fn send_paced(socket: &UdpSocket, flow: &Flow, duration: Duration) -> Result<Sent> {
    let payload = vec![0u8; (flow.frame_bytes - L2_OVERHEAD) as usize];
    let frames_per_sec = flow.offered_bps as f64 / 8.0 / f64::from(flow.frame_bytes);
    let start = Instant::now();
    // Attempts, not successes, drive the pacing: a dropped send is not retried later.
    let mut attempted: u64 = 0;
    let mut sent: u64 = 0;
    let mut last_send = start;
    loop {
        let elapsed = start.elapsed().min(duration);
        let due = (frames_per_sec * elapsed.as_secs_f64()).floor() as u64;
        while attempted < due {
            attempted += 1;
            match socket.send(&payload) {
                Ok(_) => {
                    sent += 1;
                    last_send = Instant::now();
                }
                Err(e) if is_queue_full(&e) => {}
                Err(e) => return Err(send_error(e, flow)),
            }
        }
        if elapsed >= duration {
            break;
        }
        thread::sleep(until_next_tick(start.elapsed()));
    }
    Ok(Sent {
        packets: sent,
        secs: if sent == 0 {
            0.0
        } else {
            (last_send - start).as_secs_f64()
        },
    })
}

/// Full socket or device queues: the packet is lost, the flow goes on.
fn is_queue_full(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock || e.raw_os_error() == Some(libc::ENOBUFS)
}

fn send_error(e: io::Error, flow: &Flow) -> anyhow::Error {
    let hint = if e.raw_os_error() == Some(libc::EMSGSIZE) {
        format!(
            " ({}-byte frames need an MTU of at least {}: Lab::set_mtu)",
            flow.frame_bytes,
            flow.frame_bytes - 14
        )
    } else {
        String::new()
    };
    anyhow::Error::new(e).context(format!("send from {} failed{hint}", flow.src))
}

/// Time left until the next multiple of [`TICK`] since the start.
fn until_next_tick(elapsed: Duration) -> Duration {
    let tick = TICK.as_nanos();
    let left = tick - elapsed.as_nanos() % tick;
    Duration::from_nanos(u64::try_from(left).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[ignore = "needs root: creates network namespaces (cargo xtask test)"]
    fn unshaped_flows_arrive_complete_at_the_offered_rate() {
        let lab = Lab::new("t-udp", 2).expect("create lab");
        let flows = [
            Flow {
                src: lab.sources()[0],
                offered_bps: 8_000_000,
                frame_bytes: 1000,
            },
            Flow {
                src: lab.sources()[1],
                offered_bps: 2_000_000,
                frame_bytes: 1000,
            },
        ];
        let results = run_udp(&lab, &flows, Duration::from_secs(2)).expect("run_udp");
        assert_eq!(results.len(), flows.len());
        for (flow, result) in flows.iter().zip(&results) {
            eprintln!(
                "{}: sent {} pkts {:.3} Mbit/s, received {} pkts {:.3} Mbit/s over {:.3} s",
                result.src,
                result.sent_packets,
                result.sent_bps() / 1e6,
                result.received_packets,
                result.received_bps() / 1e6,
                result.offered_secs
            );
            assert_eq!(result.src, flow.src);
            assert!(result.sent_packets > 0);
            assert_eq!(result.received_packets, result.sent_packets, "{result:?}");
            assert_eq!(result.received_l2_bytes, result.sent_l2_bytes, "{result:?}");
            let ratio = result.sent_bps() / flow.offered_bps as f64;
            assert!(
                (0.95..=1.05).contains(&ratio),
                "sent/offered = {ratio}: {result:?}"
            );
        }
    }

    #[test]
    #[ignore = "needs root: creates network namespaces (cargo xtask test)"]
    fn bad_flows_are_rejected() {
        let lab = Lab::new("t-udp-bad", 1).expect("create lab");
        let src = lab.sources()[0];
        let flow = |frame_bytes| Flow {
            src,
            offered_bps: 1_000_000,
            frame_bytes,
        };
        let short = Duration::from_millis(10);
        assert!(run_udp(&lab, &[flow(63)], short).is_err());
        assert!(run_udp(&lab, &[flow(MAX_FRAME_BYTES + 1)], short).is_err());
        assert!(run_udp(&lab, &[flow(1000), flow(1000)], short).is_err());
        let stranger = Flow {
            src: Ipv4Addr::new(198, 18, 0, 250),
            ..flow(1000)
        };
        assert!(run_udp(&lab, &[stranger], short).is_err());
        // Jumbo frames without raising the MTU fail clearly instead of fragmenting.
        let err = run_udp(&lab, &[flow(2000)], Duration::from_millis(50)).unwrap_err();
        assert!(format!("{err:#}").contains("MTU"), "{err:#}");
    }
}

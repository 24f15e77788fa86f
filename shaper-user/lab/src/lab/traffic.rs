//! Paced UDP load through a [`Lab`] and a receiver that counts what arrives per source.
//!
//! Plain std threads and sockets, no external tools: one sender thread per [`Flow`] in the
//! tx namespace and one counting receiver in the rx namespace. Sockets are created inside
//! their namespace (a socket stays in the namespace it was created in), then used from
//! ordinary threads.
//!
//! Rates and sizes are at layer 2, as the shaper counts them: a frame is the UDP payload
//! plus the UDP, IP and Ethernet headers (42 bytes over IPv4, 62 over IPv6), without the
//! FCS. One run is all IPv4 or all IPv6 (the lab's [`Lab::sources`] or [`Lab::sources6`]).
//!
//! [`run_udp`] is the simple form; [`run_udp_with`] adds, through [`RunOptions`], arrival
//! counts in fixed time bins per source, a longer drain for queueing limiters, and senders
//! pinned round-robin to the CPUs this process may use (a flow split over several sockets
//! when there are fewer flows than CPUs). On a veth, the receive path of a frame (XDP, the
//! receiver's IP stack) runs in softirq on the CPU that sent it, so spreading the senders
//! spreads the receive-side work too.

use std::{
    collections::{BTreeMap, HashMap},
    io,
    net::{IpAddr, SocketAddr, UdpSocket},
    os::fd::AsRawFd as _,
    sync::atomic::{AtomicBool, Ordering},
    thread::{self, ScopedJoinHandle},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, ensure};
use serde::Serialize;

use super::Lab;
use shaper_user::netns;

/// Ethernet (14) + IPv4 (20) + UDP (8) header bytes around each payload.
pub const L2_OVERHEAD: u32 = 14 + 20 + 8;
/// Ethernet (14) + IPv6 (40) + UDP (8) header bytes around each payload.
pub const L2_OVERHEAD_V6: u32 = 14 + 40 + 8;

/// Header bytes around a UDP payload from `src`.
pub fn l2_overhead(src: IpAddr) -> u32 {
    match src {
        IpAddr::V4(_) => L2_OVERHEAD,
        IpAddr::V6(_) => L2_OVERHEAD_V6,
    }
}
/// Smallest Ethernet frame without FCS.
pub const MIN_FRAME_BYTES: u32 = 60 + 4;
/// A 9000-byte jumbo MTU plus the Ethernet header.
pub const MAX_FRAME_BYTES: u32 = 9000 + 14;

/// Senders wake at most this far apart; each wake-up sends whatever became due since the
/// last one...
const MAX_TICK: Duration = Duration::from_millis(1);
/// ...and at most this many bytes' worth apart, so a fast flow arrives in small clumps: a
/// policer with a small burst (64 KiB is half a millisecond at 1 Gbit/s) meters the offered
/// rate, not the sender's wake-up rhythm. (A millisecond's sending at once would exceed such
/// a burst every time, and the policer would rightly drop more than the average calls for.)
const TICK_BYTES: f64 = 16_384.0;
/// The shortest wake-up interval (a sender faster than this sends in bigger clumps).
const MIN_TICK: Duration = Duration::from_micros(50);
/// How long the receiver keeps counting after the last sender stopped (packets in flight).
pub(crate) const DRAIN: Duration = Duration::from_millis(300);
/// How often the receiver looks at its stop flag when no packets come.
pub(crate) const RECV_TIMEOUT: Duration = Duration::from_millis(50);
/// Room for bursts while the receiving thread is not scheduled (2 cores, kernel busy too).
pub(crate) const RCVBUF_BYTES: libc::c_int = 64 << 20;
/// The senders' common pacing clock starts this long after the threads are spawned.
pub(crate) const START_DELAY: Duration = Duration::from_millis(20);
/// Datagrams the receiver takes per recvmmsg call.
const RECV_BATCH: usize = 64;
/// Largest UDP payload the receiver expects (a [`MAX_FRAME_BYTES`] frame).
const RECV_BUF_BYTES: usize = (MAX_FRAME_BYTES - L2_OVERHEAD) as usize;
/// Hard stop for the receiver beyond duration + DRAIN, should the stop flag never come.
pub(crate) const RECEIVER_SLACK: Duration = Duration::from_secs(10);

/// What a sender does when it wakes late (held up by the scheduler, by softirq work, or
/// behind other senders on its CPU) and frames are overdue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Late {
    /// Sends every overdue frame at once, back to back: the average rate is kept, but a
    /// late wake-up becomes a clump as long as the delay (at 100 Mbit/s, 10 ms late is
    /// 125 kB at once, twice a 64 KiB burst).
    #[default]
    CatchUp,
    /// Skips the overdue frames (counted in [`FlowResult::skipped_packets`], never sent) and
    /// sends only one tick's worth: the offered rate falls short when the sender is held
    /// up, but no clump is larger than a tick's frames.
    Skip,
}

/// One source's offered load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flow {
    /// Sender address; must be one of [`Lab::sources`] or [`Lab::sources6`].
    pub src: IpAddr,
    /// Offered load in layer-2 bits per second.
    pub offered_bps: u64,
    /// Layer-2 frame size including the 14-byte Ethernet header, without FCS
    /// ([`MIN_FRAME_BYTES`]..=[`MAX_FRAME_BYTES`]; above 1514 needs [`Lab::set_mtu`]).
    pub frame_bytes: u32,
}

/// What one flow sent and what of it arrived.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FlowResult {
    pub src: IpAddr,
    /// Sends tried: `sent_packets` plus the refused ones. Fewer than the pacing asked for
    /// when the sender could not keep up (it then sends as fast as it can until the
    /// duration is over).
    pub attempted_packets: u64,
    /// Frames the pacing skipped because the sender woke late ([`Late::Skip`]): never
    /// tried, not in `attempted_packets`.
    pub skipped_packets: u64,
    /// Sends that succeeded. A frame a qdisc drops still counts as sent (Linux UDP reports
    /// ENOBUFS from the device layer as success unless IP_RECVERR is set); a send refused
    /// because the socket's send buffer is full (EAGAIN: qdisc backpressure) does not.
    pub sent_packets: u64,
    pub sent_l2_bytes: u64,
    pub received_packets: u64,
    pub received_l2_bytes: u64,
    /// How long the sender actually sent: from the start of its pacing clock to its last
    /// send. (Packet k is due at k intervals, so this is first-to-last send plus one
    /// interval, which makes `sent_bps` match the offered rate instead of overshooting it
    /// by one packet.)
    pub offered_secs: f64,
    /// When the receiver got this source's last datagram, in seconds from the common start
    /// of the senders' pacing clock (0 if nothing arrived). Queued traffic arrives after the
    /// senders stop, so for a queueing limiter this is later than `offered_secs`.
    pub last_arrival_secs: f64,
    /// When the kernel received this source's first and last datagram (its receive
    /// timestamp, `SO_TIMESTAMPNS`: CLOCK_REALTIME in nanoseconds; 0 if nothing arrived).
    /// Taken in the softirq that ran the receiving interface's XDP program moments
    /// before, so their difference is the time over which the limiter passed the
    /// source's frames, whatever the sender's or the receiver's threads were doing.
    pub first_received_ns: u64,
    pub last_received_ns: u64,
    /// L2 bytes received per time bin from the common start, when [`RunOptions::bin`] is set
    /// (empty otherwise). Bins run to the end of the drain; trailing empty bins are kept.
    pub received_bins: Vec<u64>,
    /// What arrived by DSCP (the receiver reads each datagram's TOS or traffic class):
    /// frames a limiter marked arrive with its DSCP, the rest with the sender's (0).
    pub received_by_dscp: BTreeMap<u8, DscpCount>,
    /// When each successful send was handed to the kernel, nanoseconds from the common
    /// start, in order, when [`RunOptions::record_sends`] is set (empty otherwise).
    #[serde(skip)]
    pub send_offsets_ns: Vec<u64>,
}

/// Datagrams that arrived with one DSCP, their layer-2 bytes, and the kernel's receive
/// timestamps of the first and the last (as [`FlowResult::first_received_ns`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DscpCount {
    pub packets: u64,
    pub l2_bytes: u64,
    pub first_received_ns: u64,
    pub last_received_ns: u64,
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

    /// Seconds from the first datagram received to the last, by the kernel's receive
    /// timestamps ([`FlowResult::first_received_ns`]).
    pub fn received_span_secs(&self) -> f64 {
        self.last_received_ns.saturating_sub(self.first_received_ns) as f64 / 1e9
    }
}

fn bits_per_sec(bytes: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        bytes as f64 * 8.0 / secs
    } else {
        0.0
    }
}

/// How [`run_udp_with`] runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunOptions {
    /// Count received L2 bytes per source in bins of this width ([`FlowResult::received_bins`]).
    pub bin: Option<Duration>,
    /// How long the receiver keeps counting after the last sender stopped; queueing
    /// limiters deliver their backlog in this time.
    pub drain: Duration,
    /// Pin sender threads round-robin to the CPUs this process may run on (and run the
    /// receiver SCHED_FIFO so it keeps up) and, when there are fewer flows than CPUs, split
    /// each flow over several sockets (same source address, other ports, the rate shared
    /// out) so that one source can use every CPU.
    pub spread_cpus: bool,
    /// What a late sender does with overdue frames.
    pub late: Late,
    /// Keep the time of every successful send ([`FlowResult::send_offsets_ns`]).
    pub record_sends: bool,
}

impl Default for RunOptions {
    /// No bins, a 300 ms drain, senders where the scheduler puts them (as [`run_udp`]),
    /// late frames caught up, no send record.
    fn default() -> Self {
        RunOptions {
            bin: None,
            drain: DRAIN,
            spread_cpus: false,
            late: Late::CatchUp,
            record_sends: false,
        }
    }
}

/// What [`run_udp_with`] measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunReport {
    /// One per flow, in the order of the flows.
    pub flows: Vec<FlowResult>,
    /// Datagrams the receiving socket dropped because its buffer was full (UDP
    /// `RcvbufErrors` in the rx namespace over the run): received counts are short by this
    /// many. Should be 0.
    pub receiver_drops: u64,
    /// Frames lost in the lab's own path over the run, before any counting socket: each
    /// veth end's `tx_dropped` or `rx_dropped` on the way to the receiver (a peer's receive
    /// ring or backlog was full), and the machine-wide softnet backlog drops
    /// (`/proc/net/softnet_stat`).
    /// Not limiter drops (qdisc and XDP drops are not counted here). Should be 0; when it
    /// is not, the machine could not carry the offered load and the counts mean little.
    pub path_drops: u64,
    /// Sender threads used (more than the flows when a flow was split over CPUs).
    pub sender_threads: usize,
    /// The senders' common start, the origin of [`FlowResult::send_offsets_ns`]: what
    /// happened meanwhile (a command that changed a limit) is placed among the sends
    /// with the same clock.
    #[serde(skip)]
    pub start: Instant,
}

/// Sends every flow for `duration` from the tx namespace to the receiver in the rx
/// namespace and counts what arrives. Results are in the order of `flows`.
///
/// Sends that fail with ENOBUFS or EAGAIN (queues full) count as not sent; the flow goes on.
pub fn run_udp(lab: &Lab, flows: &[Flow], duration: Duration) -> Result<Vec<FlowResult>> {
    Ok(run_udp_with(lab, flows, duration, &RunOptions::default())?.flows)
}

/// [`run_udp`] with [`RunOptions`]: time bins, drain time, senders spread over CPUs.
pub fn run_udp_with(
    lab: &Lab,
    flows: &[Flow],
    duration: Duration,
    options: &RunOptions,
) -> Result<RunReport> {
    validate(lab, flows)?;
    if let Some(bin) = options.bin {
        ensure!(!bin.is_zero(), "the bin width must be above zero");
    }
    let receiver = open_receiver(lab, rx_addr_for(lab, flows)?)?;
    let dst = receiver.local_addr()?;
    let cpus = if options.spread_cpus {
        allowed_cpus()?
    } else {
        Vec::new()
    };
    // Sockets per flow: enough that every CPU gets a sender.
    let per_flow = if cpus.len() > flows.len() {
        cpus.len().div_ceil(flows.len())
    } else {
        1
    };
    let plan: Vec<(usize, Flow)> = flows
        .iter()
        .enumerate()
        .flat_map(|(i, flow)| {
            (0..per_flow).map(move |k| {
                // Share the rate out so the parts add up to the flow's rate exactly.
                let share = |k: usize| flow.offered_bps * k as u64 / per_flow as u64;
                let part = Flow {
                    offered_bps: share(k + 1) - share(k),
                    ..*flow
                };
                (i, part)
            })
        })
        .collect();
    let parts: Vec<Flow> = plan.iter().map(|&(_, part)| part).collect();
    let senders = open_senders(lab, &parts, dst)?;
    let drops_before = udp_rcvbuf_errors(lab)?;
    let path_before = path_drops(lab)?;

    let stop = AtomicBool::new(false);
    // A common pacing start a little ahead, so threads spawned later do not start with a
    // backlog to catch up on.
    let start = Instant::now() + START_DELAY;
    let deadline = start + duration + options.drain + RECEIVER_SLACK;
    let bin = options.bin;
    let (sent, received) = thread::scope(|scope| {
        // Stops the receiver however this block ends, including a sender's panic being
        // re-raised below; otherwise the scope would wait for the receiver's deadline.
        let stop_guard = StopOnDrop(&stop);
        let receiver = scope.spawn(|| {
            if options.spread_cpus {
                // Counting must not starve behind dozens of busy senders (the socket would
                // overflow and the count fall short). Best effort: the thread blocks when
                // nothing comes, and the kernel's RT throttling bounds it anyway; without
                // the privilege it counts at normal priority, and the drops it then
                // suffers are reported (`RunReport::receiver_drops`).
                if let Err(e) = realtime_priority() {
                    eprintln!("the receiver counts at normal priority: {e}");
                }
            }
            receive(&receiver, &stop, start, deadline, bin)
        });
        let handles: Vec<_> = senders
            .iter()
            .zip(&parts)
            .enumerate()
            .map(|(n, (socket, part))| {
                let cpu = (!cpus.is_empty()).then(|| cpus[n % cpus.len()]);
                let (late, record) = (options.late, options.record_sends);
                scope.spawn(move || {
                    if let Some(cpu) = cpu {
                        pin_to_cpu(cpu)?;
                    }
                    send_paced(socket, part, start, duration, late, record)
                })
            })
            .collect();
        let sent: Vec<_> = handles.into_iter().map(join).collect();
        thread::sleep(options.drain);
        drop(stop_guard);
        (sent, join(receiver))
    });
    let received = received?;
    let drops_after = udp_rcvbuf_errors(lab)?;
    let path_after = path_drops(lab)?;

    let mut results: Vec<FlowResult> = flows
        .iter()
        .map(|flow| FlowResult {
            src: flow.src,
            attempted_packets: 0,
            skipped_packets: 0,
            sent_packets: 0,
            sent_l2_bytes: 0,
            received_packets: 0,
            received_l2_bytes: 0,
            offered_secs: 0.0,
            last_arrival_secs: 0.0,
            first_received_ns: 0,
            last_received_ns: 0,
            received_bins: Vec::new(),
            received_by_dscp: BTreeMap::new(),
            send_offsets_ns: Vec::new(),
        })
        .collect();
    for (&(i, part), sent) in plan.iter().zip(sent) {
        let sent = sent.with_context(|| format!("sender {} failed", part.src))?;
        let r = &mut results[i];
        r.attempted_packets += sent.attempted;
        r.skipped_packets += sent.skipped;
        r.sent_packets += sent.packets;
        r.send_offsets_ns.extend_from_slice(&sent.send_offsets_ns);
        r.sent_l2_bytes += sent.packets * u64::from(part.frame_bytes);
        r.offered_secs = r.offered_secs.max(sent.secs);
    }
    for r in &mut results {
        // A flow split over several sockets: its parts' sends in one order.
        r.send_offsets_ns.sort_unstable();
        if let Some(got) = received.get(&r.src) {
            r.received_packets = got.packets;
            r.received_l2_bytes = got.l2_bytes;
            r.last_arrival_secs = got.last_arrival_secs;
            r.first_received_ns = got.first_received_ns;
            r.last_received_ns = got.last_received_ns;
            r.received_bins.clone_from(&got.bins);
            r.received_by_dscp.clone_from(&got.by_dscp);
        }
        if let Some(bin) = bin {
            // Every source gets the same number of bins, silent ones included.
            let total = duration + options.drain;
            let n = total.as_nanos().div_ceil(bin.as_nanos());
            let n = usize::try_from(n).unwrap_or(usize::MAX);
            if r.received_bins.len() < n {
                r.received_bins.resize(n, 0);
            }
        }
    }
    Ok(RunReport {
        flows: results,
        receiver_drops: drops_after.saturating_sub(drops_before),
        path_drops: path_after.saturating_sub(path_before),
        sender_threads: parts.len(),
        start,
    })
}

/// The CPUs this process may run on (its affinity mask).
fn allowed_cpus() -> Result<Vec<usize>> {
    // SAFETY: an all-zero cpu_set_t is a valid empty set; sched_getaffinity writes at most
    // the size we pass.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: the pointer and size describe `set`.
    let rc = unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &raw mut set) };
    if rc != 0 {
        return Err(io::Error::last_os_error()).context("sched_getaffinity failed");
    }
    let cpus: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `cpu` is below CPU_SETSIZE, the set's size.
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect();
    ensure!(!cpus.is_empty(), "this process may run on no CPU");
    Ok(cpus)
}

/// Makes the calling thread SCHED_FIFO at the lowest real-time priority: it runs as soon
/// as it wakes, ahead of every ordinary thread (busy senders, other processes), and is
/// held up only by interrupts and softirq work. Only for threads that sleep most of the
/// time: one that never sleeps would take its CPU from everything else.
pub(crate) fn realtime_priority() -> io::Result<()> {
    let param = libc::sched_param { sched_priority: 1 };
    // SAFETY: `param` is a valid sched_param for the call; pid 0 is the calling thread.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &raw const param) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Pins the calling thread to one CPU.
fn pin_to_cpu(cpu: usize) -> Result<()> {
    // SAFETY: an all-zero cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` came from the affinity mask, so it is below CPU_SETSIZE.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: the pointer and size describe `set`; pid 0 is the calling thread.
    let rc = unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &raw const set) };
    if rc != 0 {
        return Err(io::Error::last_os_error()).with_context(|| format!("cannot pin to CPU {cpu}"));
    }
    Ok(())
}

/// The counters [`RunReport::path_drops`] sums, now.
fn path_drops(lab: &Lab) -> Result<u64> {
    let dropped = |ns: &super::Netns, iface: &str, dir: &str| -> Result<u64> {
        let out = ns.ip_output(&["-s", "-j", "link", "show", "dev", iface])?;
        let links: serde_json::Value =
            serde_json::from_str(&out).context("cannot parse `ip -s -j link` output")?;
        links[0]["stats64"][dir]["dropped"]
            .as_u64()
            .with_context(|| format!("no {dir} dropped count for {iface}"))
    };
    let mut total = 0;
    for (ns, iface, dir) in lab.path_ends() {
        total += dropped(ns, iface, dir)?;
    }
    let softnet = std::fs::read_to_string("/proc/net/softnet_stat")
        .context("cannot read /proc/net/softnet_stat")?;
    // One line per CPU, hex columns; the second is packets dropped for a full backlog.
    let backlog: u64 = softnet
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter_map(|x| u64::from_str_radix(x, 16).ok())
        .sum();
    Ok(total + backlog)
}

/// UDP `RcvbufErrors` in the rx namespace (from `/proc/thread-self/net/snmp`, read by a
/// thread inside it).
fn udp_rcvbuf_errors(lab: &Lab) -> Result<u64> {
    let snmp = netns::run_in(lab.rx_ns(), || {
        std::fs::read_to_string("/proc/thread-self/net/snmp")
    })?
    .context("cannot read /proc/thread-self/net/snmp in the rx namespace")?;
    let mut udp = snmp.lines().filter(|l| l.starts_with("Udp: "));
    let (Some(names), Some(values)) = (udp.next(), udp.next()) else {
        anyhow::bail!("no Udp lines in /proc/net/snmp");
    };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(name, _)| *name == "RcvbufErrors")
        .context("no RcvbufErrors in /proc/net/snmp")?
        .1
        .parse()
        .context("bad RcvbufErrors value")
}

/// The receiver address of the flows' family (all flows must share one).
fn rx_addr_for(lab: &Lab, flows: &[Flow]) -> Result<IpAddr> {
    let v6 = flows.first().is_some_and(|f| f.src.is_ipv6());
    ensure!(
        flows.iter().all(|f| f.src.is_ipv6() == v6),
        "one run is all IPv4 or all IPv6 flows"
    );
    if v6 {
        lab.rx_addr6()
            .map(IpAddr::V6)
            .context("IPv6 flows need a lab with IPv6 (LabOptions::ipv6)")
    } else {
        Ok(IpAddr::V4(lab.rx_addr()))
    }
}

fn validate(lab: &Lab, flows: &[Flow]) -> Result<()> {
    rx_addr_for(lab, flows)?;
    for (i, flow) in flows.iter().enumerate() {
        ensure!(
            flow.frame_bytes >= l2_overhead(flow.src) && flow.frame_bytes >= MIN_FRAME_BYTES,
            "flow from {}: frame size {} bytes is below the {}-byte headers or the {MIN_FRAME_BYTES}-byte minimum",
            flow.src,
            flow.frame_bytes,
            l2_overhead(flow.src)
        );
        ensure!(
            (MIN_FRAME_BYTES..=MAX_FRAME_BYTES).contains(&flow.frame_bytes),
            "flow from {}: frame size {} bytes is outside {MIN_FRAME_BYTES}..={MAX_FRAME_BYTES} \
             (layer 2, Ethernet header included, no FCS)",
            flow.src,
            flow.frame_bytes
        );
        let known = match flow.src {
            IpAddr::V4(a) => lab.sources().contains(&a),
            IpAddr::V6(a) => lab.sources6().contains(&a),
        };
        ensure!(
            known,
            "flow source {} is not one of the lab's sources {:?} {:?}",
            flow.src,
            lab.sources(),
            lab.sources6()
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
pub(crate) struct StopOnDrop<'a>(pub(crate) &'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Joins a scoped thread, re-raising its panic here.
pub(crate) fn join<T>(handle: ScopedJoinHandle<'_, T>) -> T {
    handle
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// A UDP socket in the rx namespace on a free port of the receiver address `rx`.
fn open_receiver(lab: &Lab, rx: IpAddr) -> Result<UdpSocket> {
    let addr = SocketAddr::new(rx, 0);
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
        // The kernel's receive time of each datagram ([`FlowResult::first_received_ns`]).
        set_int_option(&socket, libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, 1)
            .context("cannot set SO_TIMESTAMPNS")?;
        // Each datagram's TOS or traffic class ([`FlowResult::received_by_dscp`]).
        let (level, name) = match rx {
            IpAddr::V4(_) => (libc::IPPROTO_IP, libc::IP_RECVTOS),
            IpAddr::V6(_) => (libc::IPPROTO_IPV6, libc::IPV6_RECVTCLASS),
        };
        set_int_option(&socket, level, name, 1).context("cannot ask for the TOS")?;
        socket.set_read_timeout(Some(RECV_TIMEOUT))?;
        Ok(socket)
    })?
    .context("cannot open the receiver socket")
}

/// One non-blocking UDP socket per flow in the tx namespace, bound to the flow's source
/// and connected to `dst`.
fn open_senders(lab: &Lab, flows: &[Flow], dst: SocketAddr) -> Result<Vec<UdpSocket>> {
    let srcs: Vec<IpAddr> = flows.iter().map(|f| f.src).collect();
    netns::run_in(lab.tx_ns(), move || -> Result<Vec<UdpSocket>> {
        srcs.iter()
            .map(|&src| open_sender(src, dst).with_context(|| format!("sender socket {src}")))
            .collect()
    })?
}

fn open_sender(src: IpAddr, dst: SocketAddr) -> Result<UdpSocket> {
    let socket = UdpSocket::bind(SocketAddr::new(src, 0))?;
    // Never fragment: a frame larger than the MTU must fail (EMSGSIZE) instead of silently
    // turning into several frames the L2 byte count would not match.
    let (level, name, value) = match src {
        IpAddr::V4(_) => (
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            libc::IP_PMTUDISC_DO,
        ),
        IpAddr::V6(_) => (
            libc::IPPROTO_IPV6,
            libc::IPV6_MTU_DISCOVER,
            libc::IPV6_PMTUDISC_DO,
        ),
    };
    set_int_option(&socket, level, name, value).context("cannot set the MTU discovery mode")?;
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

/// What arrived from one source.
#[derive(Debug, Default, Clone)]
struct Counts {
    packets: u64,
    l2_bytes: u64,
    /// Seconds from the pacing start to the last arrival.
    last_arrival_secs: f64,
    /// The kernel's receive timestamps of the first and last datagram.
    first_received_ns: u64,
    last_received_ns: u64,
    /// L2 bytes per bin, when binning.
    bins: Vec<u64>,
    by_dscp: BTreeMap<u8, DscpCount>,
}

/// Counts datagrams per source address until `stop` is set or `deadline` passes, taking
/// up to [`RECV_BATCH`] per system call (recvmmsg) so one thread keeps up with both CPUs'
/// worth of senders. Arrival times are when the batch was read, so they lag the kernel's
/// arrival by the time the batch waited in the socket (at most a batch's worth).
fn receive(
    socket: &UdpSocket,
    stop: &AtomicBool,
    start: Instant,
    deadline: Instant,
    bin: Option<Duration>,
) -> Result<HashMap<IpAddr, Counts>> {
    let mut counts: HashMap<IpAddr, Counts> = HashMap::new();
    let mut bufs = vec![0u8; RECV_BATCH * RECV_BUF_BYTES];
    // SAFETY (zeroed): all-zero is a valid value of these plain C structs.
    let mut addrs: Vec<libc::sockaddr_storage> = vec![unsafe { std::mem::zeroed() }; RECV_BATCH];
    let mut iovs: Vec<libc::iovec> = bufs
        .chunks_exact_mut(RECV_BUF_BYTES)
        .map(|chunk| libc::iovec {
            iov_base: chunk.as_mut_ptr().cast(),
            iov_len: chunk.len(),
        })
        .collect();
    // SAFETY: as above.
    let mut msgs: Vec<libc::mmsghdr> = vec![unsafe { std::mem::zeroed() }; RECV_BATCH];
    // Room for one SCM_TIMESTAMPNS control message (a timespec) and one of the TOS or
    // traffic class (an int at most) per datagram, u64-aligned as cmsghdr needs.
    // SAFETY: CMSG_SPACE only computes a size.
    let control_len = unsafe {
        libc::CMSG_SPACE(size_of::<libc::timespec>() as u32)
            + libc::CMSG_SPACE(size_of::<libc::c_int>() as u32)
    } as usize;
    let mut controls = vec![0u64; RECV_BATCH * control_len.div_ceil(8)];
    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
        let control_chunks = controls.chunks_exact_mut(control_len.div_ceil(8));
        for (((msg, iov), addr), control) in msgs
            .iter_mut()
            .zip(&mut iovs)
            .zip(&mut addrs)
            .zip(control_chunks)
        {
            msg.msg_hdr.msg_name = (&raw mut *addr).cast();
            msg.msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            msg.msg_hdr.msg_iov = &raw mut *iov;
            msg.msg_hdr.msg_iovlen = 1;
            msg.msg_hdr.msg_control = control.as_mut_ptr().cast();
            msg.msg_hdr.msg_controllen = control_len;
            msg.msg_len = 0;
        }
        // SAFETY: every header points at a live iovec over its own chunk of `bufs` and at
        // its own sockaddr_storage, all of which outlive the call; the fd is open. The socket's
        // read timeout bounds the wait for the first datagram (MSG_WAITFORONE).
        let n = unsafe {
            libc::recvmmsg(
                socket.as_raw_fd(),
                msgs.as_mut_ptr(),
                RECV_BATCH as libc::c_uint,
                libc::MSG_WAITFORONE,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.kind() {
                // The read timeout: go and look at the stop flag.
                io::ErrorKind::WouldBlock
                | io::ErrorKind::TimedOut
                | io::ErrorKind::Interrupted => {
                    continue;
                }
                _ => return Err(e).context("receiver: recvmmsg failed"),
            }
        }
        let at = start.elapsed().as_secs_f64();
        let bin_index = bin.map(|bin| {
            let since = Instant::now().saturating_duration_since(start);
            usize::try_from(since.as_nanos() / bin.as_nanos()).unwrap_or(usize::MAX)
        });
        for (msg, addr) in msgs.iter().zip(&addrs).take(n as usize) {
            let Some(src) = source_of(addr) else {
                continue;
            };
            let l2 = u64::from(msg.msg_len) + u64::from(l2_overhead(src));
            let entry = counts.entry(src).or_default();
            if let Some(ns) = received_ns(&msg.msg_hdr) {
                if entry.packets == 0 {
                    entry.first_received_ns = ns;
                }
                entry.last_received_ns = ns;
            }
            entry.packets += 1;
            entry.l2_bytes += l2;
            let by_dscp = entry
                .by_dscp
                .entry(received_tos(&msg.msg_hdr).unwrap_or(0) >> 2)
                .or_default();
            if let Some(ns) = received_ns(&msg.msg_hdr) {
                if by_dscp.packets == 0 {
                    by_dscp.first_received_ns = ns;
                }
                by_dscp.last_received_ns = ns;
            }
            by_dscp.packets += 1;
            by_dscp.l2_bytes += l2;
            entry.last_arrival_secs = at;
            if let Some(i) = bin_index {
                if entry.bins.len() <= i {
                    entry.bins.resize(i + 1, 0);
                }
                entry.bins[i] += l2;
            }
        }
    }
    Ok(counts)
}

/// The kernel's receive timestamp (`SCM_TIMESTAMPNS`) of a datagram recvmmsg filled in.
pub(crate) fn received_ns(hdr: &libc::msghdr) -> Option<u64> {
    // SAFETY: the header's control buffer is the one we gave it, and the kernel set
    // msg_controllen to what it wrote there; the CMSG macros stay within it.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(hdr);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_TIMESTAMPNS
            {
                let ts: libc::timespec = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast());
                return Some(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64);
            }
            cmsg = libc::CMSG_NXTHDR(hdr, cmsg);
        }
    }
    None
}

/// The TOS (IPv4) or traffic class (IPv6) of a datagram recvmmsg filled in, DSCP and ECN.
fn received_tos(hdr: &libc::msghdr) -> Option<u8> {
    // SAFETY: as in [`received_ns`].
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(hdr);
        while !cmsg.is_null() {
            match ((*cmsg).cmsg_level, (*cmsg).cmsg_type) {
                (libc::IPPROTO_IP, libc::IP_TOS) => return Some(*libc::CMSG_DATA(cmsg)),
                (libc::IPPROTO_IPV6, libc::IPV6_TCLASS) => {
                    let class: libc::c_int = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast());
                    return u8::try_from(class).ok();
                }
                _ => {}
            }
            cmsg = libc::CMSG_NXTHDR(hdr, cmsg);
        }
    }
    None
}

/// The address in a sockaddr the kernel filled in (IPv4 or IPv6), if it is one.
fn source_of(addr: &libc::sockaddr_storage) -> Option<IpAddr> {
    match i32::from(addr.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in, which it is large
            // and aligned enough for.
            let a = unsafe { &*(&raw const *addr).cast::<libc::sockaddr_in>() };
            Some(IpAddr::V4(u32::from_be(a.sin_addr.s_addr).into()))
        }
        libc::AF_INET6 => {
            // SAFETY: as above, for sockaddr_in6.
            let a = unsafe { &*(&raw const *addr).cast::<libc::sockaddr_in6>() };
            Some(IpAddr::V6(a.sin6_addr.s6_addr.into()))
        }
        _ => None,
    }
}

/// What one sender managed to send.
#[derive(Debug, Clone)]
pub(crate) struct Sent {
    pub attempted: u64,
    /// Overdue frames skipped ([`Late::Skip`]).
    pub skipped: u64,
    pub packets: u64,
    /// Pacing start to the start of the last successful send.
    pub secs: f64,
    /// The longest time without a successful send (from the start to the first, or
    /// between two): the sender's tick when it keeps its schedule, longer when it was held
    /// up or its sends were refused. A policer's bucket refills to the full burst in a gap
    /// of burst ÷ rate; a longer one costs an overloaded flow the difference.
    pub max_gap_secs: f64,
    /// Successful sends in each millisecond from the start (the last millisecond with
    /// one ends the list).
    pub per_ms: Vec<u32>,
    /// Nanoseconds from the start of each successful send, if asked for.
    pub send_offsets_ns: Vec<u64>,
}

/// Sends `flow` from `start` for `duration` on `socket` ([`pace`]).
fn send_paced(
    socket: &UdpSocket,
    flow: &Flow,
    start: Instant,
    duration: Duration,
    late: Late,
    record: bool,
) -> Result<Sent> {
    let payload = vec![0u8; (flow.frame_bytes - l2_overhead(flow.src)) as usize];
    let pacing = Pacing {
        offered_bps: flow.offered_bps,
        frame_bytes: flow.frame_bytes,
        start,
        duration,
        late,
        record,
    };
    pace(&pacing, || socket.send(&payload).map(drop)).map_err(|e| send_error(e, flow))
}

/// How [`pace`] sends: `frame_bytes`-byte frames at `offered_bps` (layer 2) from `start`
/// for `duration`, what it does when late, and whether it records each send's time.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pacing {
    pub offered_bps: u64,
    pub frame_bytes: u32,
    pub start: Instant,
    pub duration: Duration,
    pub late: Late,
    pub record: bool,
}

/// Calls `send` for `frame_bytes`-byte frames at `offered_bps` (layer 2) from `start` for
/// `duration`: each tick sends the packets that became due since the start
/// ([`Late::CatchUp`]: after a stall it catches up by what the stall delayed, in one
/// clump), or only one tick's worth of them ([`Late::Skip`]: the rest are skipped). A
/// sender that cannot keep up sends flat out, and still stops at `start + duration`. Full
/// queues ([`is_queue_full`]) count as attempted, not sent; any other error ends the flow.
pub(crate) fn pace(p: &Pacing, mut send: impl FnMut() -> io::Result<()>) -> io::Result<Sent> {
    /// How many sends between looks at the clock when behind.
    const CLOCK_EVERY: u64 = 32;
    let Pacing {
        offered_bps,
        frame_bytes,
        start,
        duration,
        late,
        record,
    } = *p;
    let frames_per_sec = offered_bps as f64 / 8.0 / f64::from(frame_bytes);
    let end = start + duration;
    let tick = tick_of(offered_bps);
    // Frames one tick carries: what a late sender under Late::Skip still sends at once.
    let per_tick = ((frames_per_sec * tick.as_secs_f64()).ceil() as u64).max(1);
    let mut skipped: u64 = 0;
    // Schedule position: frames attempted plus frames skipped.
    let mut next: u64 = 0;
    let mut offsets = Vec::new();
    exact_timers()?;
    thread::sleep(start.saturating_duration_since(Instant::now()));
    // Attempts, not successes, drive the pacing: a dropped send is not retried later.
    let mut attempted: u64 = 0;
    let mut sent: u64 = 0;
    let mut last_send = start;
    let mut max_gap = Duration::ZERO;
    let mut per_ms: Vec<u32> = Vec::new();
    loop {
        let elapsed = start.elapsed().min(duration);
        let due = (frames_per_sec * elapsed.as_secs_f64()).floor() as u64;
        if late == Late::Skip && due > next + per_tick {
            skipped += due - per_tick - next;
            next = due - per_tick;
        }
        while next < due {
            if next % CLOCK_EVERY == CLOCK_EVERY - 1 && Instant::now() >= end {
                break;
            }
            next += 1;
            attempted += 1;
            // When the frame is handed over: the call may return much later, after the
            // softirq work it set off (other frames' included) or a preemption.
            let at = Instant::now();
            match send() {
                Ok(()) => {
                    sent += 1;
                    max_gap = max_gap.max(at.saturating_duration_since(last_send));
                    let ms = usize::try_from(at.saturating_duration_since(start).as_millis())
                        .unwrap_or(usize::MAX);
                    if per_ms.len() <= ms {
                        per_ms.resize(ms + 1, 0);
                    }
                    per_ms[ms] += 1;
                    if record {
                        let ns = at.saturating_duration_since(start).as_nanos();
                        offsets.push(u64::try_from(ns).unwrap_or(u64::MAX));
                    }
                    last_send = at;
                }
                Err(e) if is_queue_full(&e) => {}
                Err(e) => return Err(e),
            }
        }
        if elapsed >= duration || Instant::now() >= end {
            break;
        }
        thread::sleep(until_next_tick(start.elapsed(), tick));
    }
    Ok(Sent {
        attempted,
        skipped,
        packets: sent,
        secs: if sent == 0 {
            0.0
        } else {
            last_send.saturating_duration_since(start).as_secs_f64()
        },
        max_gap_secs: max_gap.as_secs_f64(),
        per_ms,
        send_offsets_ns: offsets,
    })
}

/// Full socket or device queues: the packet is lost, the flow goes on.
pub(crate) fn is_queue_full(e: &io::Error) -> bool {
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

/// How far apart a sender of `offered_bps` wakes: [`TICK_BYTES`] at that rate, within
/// [`MIN_TICK`]..=[`MAX_TICK`].
fn tick_of(offered_bps: u64) -> Duration {
    let secs = TICK_BYTES * 8.0 / offered_bps.max(1) as f64;
    Duration::from_secs_f64(secs).clamp(MIN_TICK, MAX_TICK)
}

/// Time left until the next multiple of `tick` since the start.
fn until_next_tick(elapsed: Duration, tick: Duration) -> Duration {
    let tick = tick.as_nanos();
    let left = tick - elapsed.as_nanos() % tick;
    Duration::from_nanos(u64::try_from(left).unwrap_or(u64::MAX))
}

/// Lets the calling thread's sleeps end on time: the default timer slack (50 µs) is as long
/// as the shortest tick.
fn exact_timers() -> io::Result<()> {
    // SAFETY: PR_SET_TIMERSLACK takes one integer argument and affects only this thread.
    let rc = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    #[test]
    #[ignore = "needs root: creates network namespaces (cargo xtask test)"]
    fn unshaped_flows_arrive_complete_at_the_offered_rate() {
        flows_arrive_complete(&Lab::new("t-udp", 2).expect("create lab"));
    }

    #[test]
    #[ignore = "needs root: creates network namespaces (cargo xtask test)"]
    fn routed_flows_arrive_complete_at_the_offered_rate() {
        let lab = Lab::routed("t-udp-rt", 2).expect("create routed lab");
        assert_eq!(lab.rx_addr(), Ipv4Addr::new(198, 19, 0, 1));
        let (_, egress) = lab.egress();
        assert_ne!(
            egress,
            lab.tx_iface(),
            "a routed lab's egress is the router's"
        );
        flows_arrive_complete(&lab);
    }

    #[test]
    #[ignore = "needs root: creates network namespaces (cargo xtask test)"]
    fn ipv6_flows_arrive_complete_at_the_offered_rate() {
        let options = crate::lab::LabOptions {
            ipv6: true,
            ..Default::default()
        };
        let lab = Lab::with("t-udp6", 2, options).expect("create IPv6 lab");
        assert_eq!(lab.sources6().len(), 2);
        let srcs: Vec<IpAddr> = lab.sources6().iter().map(|&a| a.into()).collect();
        flows_from_arrive_complete(&lab, &srcs);
        // A run is one family: mixing is refused before anything is sent.
        let mixed = [
            Flow {
                src: srcs[0],
                offered_bps: 1_000_000,
                frame_bytes: 1000,
            },
            Flow {
                src: lab.sources()[1].into(),
                offered_bps: 1_000_000,
                frame_bytes: 1000,
            },
        ];
        assert!(run_udp(&lab, &mixed, Duration::from_millis(10)).is_err());
    }

    /// Two unshaped flows through `lab`: everything sent arrives, at the offered rate.
    fn flows_arrive_complete(lab: &Lab) {
        let srcs: Vec<IpAddr> = lab.sources().iter().map(|&a| a.into()).collect();
        flows_from_arrive_complete(lab, &srcs);
    }

    fn flows_from_arrive_complete(lab: &Lab, srcs: &[IpAddr]) {
        let flows = [
            Flow {
                src: srcs[0],
                offered_bps: 8_000_000,
                frame_bytes: 1000,
            },
            Flow {
                src: srcs[1],
                offered_bps: 2_000_000,
                frame_bytes: 1000,
            },
        ];
        let results = run_udp(lab, &flows, Duration::from_secs(2)).expect("run_udp");
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
        let src = lab.sources()[0].into();
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
            src: Ipv4Addr::new(198, 18, 0, 250).into(),
            ..flow(1000)
        };
        assert!(run_udp(&lab, &[stranger], short).is_err());
        // Jumbo frames without raising the MTU fail clearly instead of fragmenting.
        let err = run_udp(&lab, &[flow(2000)], Duration::from_millis(50)).unwrap_err();
        assert!(format!("{err:#}").contains("MTU"), "{err:#}");
    }
}

//! TCP through police and shape mode: iperf3 through the routed lab, held on the router's
//! egress towards the receiver (a router holding a customer's download), policed against
//! shaped at the same rate, shaped with and without ECN. Goodput, retransmits, the sender's
//! mean RTT and shaper's counters (shaped, CE marked, horizon drops, the delay histogram).
//!
//! Shared by `bench --only tcp` and tests/live_shape.rs (which asserts on the same runs).
//!
//! Routed, because a drop on the sender's own egress is no loss to TCP: the stack sees the
//! packet refused and sends it again later, without counting a retransmission (it shows
//! only as lost throughput). Shape mode needs sch_fq on the device; where the kernel has
//! none, the shape rows carry attach's refusal instead of figures.

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::Duration,
};

use anyhow::{Context as _, Result, bail, ensure};
use serde::Serialize;

use super::report::Machine;
use crate::{cli::AttachGuard, lab::Lab};

pub const EGRESS: &str = "egress";
/// What the flows are held to: a rate an emulated guest carries with room to spare.
pub const RATE_BPS: f64 = 4_000_000.0;
pub const RATE: &str = "4mbit";
pub const BURST: &str = "32k";
pub const SECS: u32 = 10;
/// A full-size TCP segment on the wire (Ethernet and IPv4 and TCP with timestamps) over
/// what iperf3 counts of it: shaper charges wire bytes, iperf3 reports payload.
pub const WIRE_OVER_PAYLOAD: f64 = 1514.0 / 1448.0;

/// `ip netns exec NS ARGS...`, its output.
pub fn exec(ns: &str, args: &[&str]) -> Result<String> {
    let out = Command::new("ip")
        .args(["netns", "exec", ns])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("run ip netns exec")?;
    ensure!(
        out.status.success(),
        "{args:?} in {ns}: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8(out.stdout)?)
}

/// A process killed (and reaped) when dropped: the iperf3 server.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What one iperf3 TCP run from tx to rx came to.
#[derive(Clone, Debug, Serialize)]
pub struct Tcp {
    /// Received payload, bits per second.
    pub goodput_bps: f64,
    pub retransmits: u64,
    /// The sender's mean smoothed RTT, microseconds: what the queue shaping keeps in fq
    /// adds to it.
    pub mean_rtt_us: u64,
}

/// Sets TCP's ECN (`net.ipv4.tcp_ecn`: 1 asks for it, 0 never) in both namespaces.
pub fn tcp_ecn(lab: &Lab, value: u32) -> Result<()> {
    for ns in [lab.tx_ns(), lab.rx_ns()] {
        exec(ns, &["sysctl", "-qw", &format!("net.ipv4.tcp_ecn={value}")])?;
    }
    Ok(())
}

/// One iperf3 TCP flow from the lab's first source to its receiver for [`SECS`].
pub fn iperf(lab: &Lab) -> Result<Tcp> {
    let _server = Killed(
        Command::new("ip")
            .args(["netns", "exec", lab.rx_ns(), "iperf3", "-s", "-1", "-p"])
            .arg("5299")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("run iperf3 -s")?,
    );
    // The server listens within a moment; the client retries the connection meanwhile.
    let rx = lab.rx_addr().to_string();
    let src = lab.sources()[0].to_string();
    let secs = SECS.to_string();
    let mut out = None;
    for _ in 0..50 {
        let o = Command::new("ip")
            .args([
                "netns",
                "exec",
                lab.tx_ns(),
                "iperf3",
                "-c",
                &rx,
                "-B",
                &src,
            ])
            .args(["-p", "5299", "-t", &secs, "-J"])
            .stdin(Stdio::null())
            .output()
            .context("run iperf3 -c")?;
        // iperf3 -J can exit 0 with only an "error" (connection refused while the server
        // starts): that is a retry too.
        let text = String::from_utf8(o.stdout)?;
        let refused = serde_json::from_str::<serde_json::Value>(&text)
            .map_or(true, |j| !j["error"].is_null());
        if o.status.success() && !refused {
            out = Some(text);
            break;
        }
        thread::sleep(Duration::from_millis(200));
    }
    let out = out.context("iperf3 -c never connected")?;
    let j: serde_json::Value = serde_json::from_str(&out).context("iperf3 -J is JSON")?;
    let end = &j["end"];
    Ok(Tcp {
        goodput_bps: end["sum_received"]["bits_per_second"]
            .as_f64()
            .with_context(|| {
                format!(
                    "no bits_per_second in iperf3's JSON (error: {})",
                    j["error"]
                )
            })?,
        retransmits: end["sum_sent"]["retransmits"]
            .as_u64()
            .context("retransmits")?,
        mean_rtt_us: end["streams"][0]["sender"]["mean_rtt"]
            .as_u64()
            .unwrap_or_default(),
    })
}

/// `stats -j`'s totals for the egress of the lab's router towards the receiver, with the
/// delay's percentiles and histogram as `shape_delay`.
pub fn totals(shaper: &Path, lab: &Lab) -> Result<serde_json::Value> {
    let (ns, iface) = lab.egress();
    let out = crate::cli::run(
        shaper,
        ns.name(),
        &["--direction", EGRESS, "-j", "stats", iface],
    )?;
    let v: serde_json::Value = serde_json::from_str(&out).context("stats -j is JSON")?;
    let mut t = v["totals"].clone();
    t["shape_delay"] = v["shape_delay"].clone();
    Ok(t)
}

/// A count from [`totals`], 0 when absent.
pub fn count(t: &serde_json::Value, key: &str) -> u64 {
    t[key].as_u64().unwrap_or_default()
}

/// Puts sch_fq at the root of the router's device towards the receiver; fails where the
/// kernel has no sch_fq.
pub fn add_fq(lab: &Lab) -> Result<()> {
    let (ns, iface) = lab.egress();
    exec(
        ns.name(),
        &["tc", "qdisc", "replace", "dev", iface, "root", "fq"],
    )?;
    Ok(())
}

/// A routed lab whose router's device towards the receiver has sch_fq as its root qdisc.
pub fn lab_with_fq(tag: &str) -> Result<Lab> {
    let lab = Lab::routed(tag, 1)?;
    add_fq(&lab)?;
    Ok(lab)
}

/// How the flow is held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Dropped at once over the limit (shaper's default).
    Police,
    /// `--mode shape`, TCP without ECN.
    Shape,
    /// `--mode shape`, TCP asking for ECN.
    ShapeEcn,
}

impl Mode {
    pub const ALL: [Mode; 3] = [Mode::Police, Mode::Shape, Mode::ShapeEcn];

    pub fn label(self) -> &'static str {
        match self {
            Mode::Police => "police",
            Mode::Shape => "shape",
            Mode::ShapeEcn => "shape+ECN",
        }
    }
}

/// One flow through one mode: what iperf3 saw, and shaper's totals and the text of a
/// scrape of its namespace (what `shaper run` serves on `/metrics`) before it detached.
#[derive(Clone, Debug)]
pub struct Run {
    pub tcp: Tcp,
    pub totals: serde_json::Value,
    pub scrape: String,
}

/// Attaches shaper on the router's egress towards the receiver in `mode` at [`RATE`] and
/// [`BURST`], runs one iperf3 flow, reads the totals and a scrape, and detaches. Police runs
/// without ECN.
pub fn measure(shaper: &Path, lab: &Lab, mode: Mode) -> Result<Run> {
    tcp_ecn(lab, u32::from(mode == Mode::ShapeEcn))?;
    let (ns, iface) = lab.egress();
    let mut guard = AttachGuard::toward(shaper, ns.name(), iface, EGRESS);
    let mut args = vec!["--rate", RATE, "--burst", BURST];
    if mode != Mode::Police {
        args.extend(["--mode", "shape"]);
    }
    guard.attach(&args)?;
    let tcp = iperf(lab)?;
    let totals = totals(shaper, lab)?;
    // Rendered inside the namespace, as `shaper -n NS run` does: a clsact attachment is
    // live if its filter is on the device there.
    let name = ns.name().to_owned();
    let scrape = shaper_user::netns::run_in(ns.name(), move || {
        shaper_user::metrics::render(
            Some(&name),
            &shaper_user::metrics::SourceCounter::default(),
            &shaper_user::metrics::Daemon::default(),
            0,
        )
        .map(|s| s.text)
    })?
    .context("scrape the attachment")?;
    guard.detach()?;
    Ok(Run {
        tcp,
        totals,
        scrape,
    })
}

/// One row of the bench.
#[derive(Clone, Debug, Serialize)]
pub struct TcpRow {
    pub mode: String,
    pub goodput_bps: Option<f64>,
    /// Goodput on the wire ([`WIRE_OVER_PAYLOAD`]) as a percentage of the rate.
    pub wire_pct_of_rate: Option<f64>,
    pub retransmits: Option<u64>,
    /// Only where time means something (not under emulation).
    pub mean_rtt_us: Option<u64>,
    pub shaped_packets: Option<u64>,
    pub ce_marked_packets: Option<u64>,
    pub horizon_dropped_packets: Option<u64>,
    pub dropped_packets: Option<u64>,
    /// Why there are no figures (shape refused without sch_fq, a failure).
    pub note: Option<String>,
}

/// Runs police, shape and shape+ECN one after the other in one routed lab (with sch_fq
/// where the kernel has it). `emulated`: the RTT is not kept (see [`write`]).
pub fn run(shaper: &Path, emulated: bool) -> Result<(Vec<TcpRow>, bool)> {
    let lab = Lab::routed("btcp", 1)?;
    let fq = add_fq(&lab).is_ok();
    let mut rows = Vec::new();
    for mode in Mode::ALL {
        println!("tcp: {} at {RATE} for {SECS} s ...", mode.label());
        let row = match measure(shaper, &lab, mode) {
            Ok(r) => {
                let t = &r.totals;
                TcpRow {
                    mode: mode.label().to_owned(),
                    goodput_bps: Some(r.tcp.goodput_bps),
                    wire_pct_of_rate: Some(
                        r.tcp.goodput_bps * WIRE_OVER_PAYLOAD / RATE_BPS * 100.0,
                    ),
                    retransmits: Some(r.tcp.retransmits),
                    mean_rtt_us: (!emulated).then_some(r.tcp.mean_rtt_us),
                    shaped_packets: Some(count(t, "shaped_packets")),
                    ce_marked_packets: Some(count(t, "ce_marked_packets")),
                    horizon_dropped_packets: Some(count(t, "horizon_dropped_packets")),
                    dropped_packets: Some(count(t, "dropped_packets")),
                    note: None,
                }
            }
            Err(e) => {
                let why = format!("{e:#}");
                let why = why.lines().next().unwrap_or_default().to_owned();
                TcpRow {
                    mode: mode.label().to_owned(),
                    goodput_bps: None,
                    wire_pct_of_rate: None,
                    retransmits: None,
                    mean_rtt_us: None,
                    shaped_packets: None,
                    ce_marked_packets: None,
                    horizon_dropped_packets: None,
                    dropped_packets: None,
                    note: Some(if fq || mode == Mode::Police {
                        format!("failed: {why}")
                    } else {
                        format!("refused (no sch_fq on this kernel): {why}")
                    }),
                }
            }
        };
        rows.push(row);
    }
    Ok((rows, fq))
}

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

/// The table, in Markdown.
pub fn table(rows: &[TcpRow]) -> String {
    let mut s = String::from(
        "| mode | goodput, Mbit/s | on the wire, % of 4 Mbit/s | retransmits | mean RTT | shaped pkts | CE marked | horizon drops | drops (all) | note |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.mode,
            r.goodput_bps
                .map_or_else(|| "-".to_owned(), |b| format!("{:.2}", b / 1e6)),
            r.wire_pct_of_rate
                .map_or_else(|| "-".to_owned(), |p| format!("{p:.1}")),
            opt(r.retransmits),
            r.mean_rtt_us.map_or_else(
                || "not measured fairly under emulation".to_owned(),
                |us| format!("{:.1} ms", us as f64 / 1000.0)
            ),
            opt(r.shaped_packets),
            opt(r.ce_marked_packets),
            opt(r.horizon_dropped_packets),
            opt(r.dropped_packets),
            r.note.as_deref().unwrap_or(""),
        );
    }
    s
}

/// Writes `out/results-tcp.md` and returns its path.
pub fn write(
    out: &Path,
    machine: &Machine,
    emulated: Option<&str>,
    fq: bool,
    rows: &[TcpRow],
) -> Result<PathBuf> {
    std::fs::create_dir_all(out).with_context(|| format!("create {}", out.display()))?;
    let path = out.join("results-tcp.md");
    let mut s = String::from("# TCP through police and shape mode\n\n");
    let _ = writeln!(
        s,
        "Written by `shaper-lab bench --only tcp` on {} (kernel {}, {} x {}), {} UTC, \
         at git revision {}.{}\n",
        machine.host,
        machine.kernel,
        machine.cpus,
        machine.cpu_model,
        machine.date_utc,
        machine.revision(),
        match emulated {
            Some(how) => format!(" Ran under emulation: {how}."),
            None => String::new(),
        }
    );
    let _ = writeln!(
        s,
        "One iperf3 TCP flow ({SECS} s, one stream, CUBIC) from a source through the routed \
         lab, held by shaper on the router's egress towards the receiver at {RATE} with a \
         {BURST} burst: policed (dropped over the limit), shaped (`--mode shape`: an \
         EDT departure time, held back by sch_fq), and shaped with TCP asking for ECN \
         (`net.ipv4.tcp_ecn=1` at both ends; police and shape without ECN run with 0). \
         The three rows run one after the other in one lab. Goodput is iperf3's received \
         payload; on the wire it is ×1514/1448 (a full segment's Ethernet, IP and TCP \
         headers), which is what shaper charges. Retransmits are the sender's count. \
         shaped/CE/horizon drops are shaper's own counters for the run. sch_fq {}.\n",
        if fq {
            "was the root qdisc of the router's egress device"
        } else {
            "is not in this kernel: shape mode is refused, and its rows say so"
        }
    );
    if emulated.is_some() {
        s.push_str(
            "No time figures: under emulation (QEMU TCG) every instruction runs tens of \
             times slower than on hardware, while the guest's clock keeps real time, so \
             a round-trip time measures the emulator, not the queue; the RTT inflation of \
             shaping is not measured fairly here and is left out (not even as a ratio: \
             the police RTT is itself mostly emulation cost, so the ratio would shrink or \
             grow with the host's load). Goodput at 4 Mbit/s and the counts do not depend \
             on how fast the CPU is, as long as the guest carries the rate: the shaped rows \
             show it does (their wire rate is rate x time + burst). The policed flow's lower \
             goodput is TCP's response to the drops, not the emulator: its losses are real \
             losses (retransmits), and the same drops would follow on hardware, though how \
             fast CUBIC recovers from them depends on the RTT, which is emulated here.\n\n",
        );
    }
    s.push_str(&table(rows));
    std::fs::write(&path, s).with_context(|| format!("write {}", path.display()))?;
    Ok(path)
}

/// `bench --only tcp`: runs the rows, prints them and writes `out/results-tcp.md`.
pub fn bench(shaper: &Path, out: &Path, emulated: Option<&str>) -> Result<()> {
    let machine = Machine::this();
    let (rows, fq) = run(shaper, emulated.is_some())?;
    print!("{}", table(&rows));
    if rows.iter().all(|r| r.goodput_bps.is_none()) {
        bail!("no row measured anything");
    }
    let path = write(out, &machine, emulated, fq, &rows)?;
    println!("wrote {}", path.display());
    Ok(())
}

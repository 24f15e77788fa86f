//! The second meter's per-packet rows (issue 24): a frame under a policy with an excess
//! rate that is green, yellow (its DSCP rewritten) or red, and a frame checked by the
//! packet-rate meter, each set against the single-rate pass of a known source
//! (`pass_existing`) measured in the same runs, on the same object, by the same loop
//! method ([`super::per_packet`]).
//!
//! A row is worth something only if every frame of it had the row's colour. The cells are
//! set so that it must (GCRA at the extremes of its range):
//!
//! - green: the committed rate the fastest there is with a burst no run exhausts; the
//!   excess meter there but never reached;
//! - yellow: the committed cell the slowest there is (one byte a second) with a burst of
//!   one frame, so it refills a 64-byte frame's worth in 64 s; the excess meter the
//!   fastest, with a burst no run exhausts;
//! - red: both cells the slowest, each with a burst of one frame;
//! - packet rate, pass: the byte rate open, the packet meter the fastest there is;
//!   refused: one packet a second (the slowest there is), a burst of one. Its cell refills
//!   a packet a second, so a timed loop that outlasts the cell's backlog (a run slowed past
//!   a second on a loaded machine) passes a frame: the row's check allows exactly the
//!   frames the cell's refills allow ([`refills_allow`]), read from the cell before and
//!   after the loop.
//!
//! Before each timed loop the key is primed ([`prime`]): frames are sent one at a time
//! until one gets the row's colour (a cell that refilled while other cases ran gives a
//! green or a yellow first), which also makes the key's cells before the clock runs. A
//! yellow priming frame's bytes are checked: DSCP rewritten, ECN kept, an IPv4 header's
//! checksum valid. After the loop, the kernel's own counters must show every frame of it
//! with the row's colour, but for the refused row's refills ([`measure`]); a row that
//! fails this fails the bench.
//!
//! In the loop the kernel runs the program on one buffer, so from the second run on a
//! yellow frame already carries the DSCP it is given: the rewrite does the same work all
//! the same (`shaper_remark_xdp` never skips a frame that has it: it writes the byte and
//! updates the checksum either way).
//!
//! Only today's build has a second meter: the rows are not measured on the baseline. Only
//! the XDP program is measured, as for every per-packet row: the tc program's remark (with
//! the skb helpers) is not.

use std::net::{Ipv4Addr, Ipv6Addr};

use anyhow::{Context as _, Result, bail, ensure};
use aya::{
    Ebpf,
    maps::{HashMap, MapData},
    programs::{TestRun as _, TestRunOptions, Xdp},
};
use serde::Serialize;
use shaper_common::{
    config::{MAX_PACKET_RATE, Meter2Limits},
    gcra::{MAX_RATE_BPS, MIN_RATE_BPS, ticks_from_ns},
    maps::{Config, Counters, Ipv4Key, MAP_METER2, Meter2, Meter2Cells, PROG_XDP},
};
use shaper_user::watch::monotonic_ns;

use super::spread::Summary;
use crate::{
    frame::{self, DEFAULT_DST_V6, ETH_HLEN},
    testrun::{self, XDP_DROP, XDP_PASS},
};

/// What every frame of a row must become.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Colour {
    /// Passed untouched, the committed cell charged.
    Green,
    /// Passed with its DSCP rewritten, the excess cell charged.
    Yellow,
    /// Dropped: neither cell had room.
    Red,
    /// Dropped by the packet-rate meter.
    PacketRefused,
}

impl Colour {
    /// The XDP verdict of a frame of this colour.
    pub fn verdict(self) -> u32 {
        match self {
            Colour::Green | Colour::Yellow => XDP_PASS,
            Colour::Red | Colour::PacketRefused => XDP_DROP,
        }
    }

    /// The colour every one of `n` frames had, from what the global counters counted of
    /// them (`before`, `after`); `None` if they were not all alike, or counted otherwise.
    pub fn of(before: &Counters, after: &Counters, n: u64) -> Option<Colour> {
        let d = |f: fn(&Counters) -> u64| f(after).wrapping_sub(f(before));
        let passed = d(|c| c.outcomes.passed_packets);
        let dropped = d(|c| c.outcomes.dropped_packets);
        let yellow = d(|c| c.meter2.yellow_packets);
        let refused = d(|c| c.meter2.packet_rate_refused_packets);
        let other = d(|c| c.outcomes.would_drop_packets + c.untracked_packets);
        match (passed, dropped, yellow, refused, other) {
            (p, 0, 0, 0, 0) if p == n => Some(Colour::Green),
            (p, 0, y, 0, 0) if p == n && y == n => Some(Colour::Yellow),
            (0, d, 0, 0, 0) if d == n => Some(Colour::Red),
            (0, d, 0, r, 0) if d == n && r == n => Some(Colour::PacketRefused),
            _ => None,
        }
    }
}

/// The DSCP yellow frames are given (cs1, as the worked example marks them).
pub const EXCESS_DSCP: u8 = 8;
/// Bytes of every frame, as the single-rate rows' (64).
const FRAME_BYTES: usize = 64;
/// A burst no run exhausts.
const ENDLESS: u64 = 1 << 40;

/// One row: a frame of its own source, the settings that give it its colour.
pub struct Case {
    pub id: &'static str,
    pub name: &'static str,
    pub colour: Colour,
    pub frame: Vec<u8>,
    pub config: Config,
}

/// Settings of a byte rate and burst with a second meter.
fn settings(rate_bps: u64, burst: u64, meter2: Meter2Limits) -> Result<Config> {
    Ok(Config {
        meter2: Meter2::new(&meter2).map_err(|e| anyhow::anyhow!("{e}"))?,
        ..testrun::config(rate_bps, burst)?
    })
}

fn excess(rate_bps: u64, burst: u64) -> Meter2Limits {
    Meter2Limits {
        excess_rate_bps: rate_bps,
        excess_burst_bytes: burst,
        excess_dscp: EXCESS_DSCP,
        ..Meter2Limits::default()
    }
}

fn packets(rate: u64, burst: u64) -> Meter2Limits {
    Meter2Limits {
        packet_rate: rate,
        packet_burst: burst,
        ..Meter2Limits::default()
    }
}

/// The id of the green IPv4 row, and of the yellow one: their ratio is issue 24's bound.
pub const GREEN: &str = "colour_green";
pub const YELLOW: &str = "colour_yellow";
pub const GREEN6: &str = "colour_green_v6";
pub const YELLOW6: &str = "colour_yellow_v6";
/// Issue 24: a yellow frame's rewrite costs at most this many green passes.
pub const YELLOW_BOUND: f64 = 1.25;

/// Every row, each its own source (198.18.20.0/24, 2001:db8:20::/64: no other case's).
pub fn cases() -> Result<Vec<Case>> {
    let one = FRAME_BYTES as u64;
    let green = settings(MAX_RATE_BPS, ENDLESS, excess(MIN_RATE_BPS, one))?;
    let yellow = settings(MIN_RATE_BPS, one, excess(MAX_RATE_BPS, ENDLESS))?;
    let red = settings(MIN_RATE_BPS, one, excess(MIN_RATE_BPS, one))?;
    // ECT(0), so that a yellow frame's ECN bits are seen kept.
    let v4 = |host: u8| {
        frame::with_ecn(
            &frame::ipv4_udp(Ipv4Addr::new(198, 18, 20, host), FRAME_BYTES),
            ECT0,
        )
    };
    // 14 + 40 + 8 + 2 bytes: as long as the IPv4 frames.
    let v6 = |host: u16| {
        ipv6_with_ecn(frame::ipv6_udp(
            Ipv6Addr::new(0x2001, 0xdb8, 0x20, 0, 0, 0, 0, host),
            DEFAULT_DST_V6,
            FRAME_BYTES - 62,
        ))
    };
    let case = |id, name, colour, frame, config| Case {
        id,
        name,
        colour,
        frame,
        config,
    };
    Ok(vec![
        case(
            GREEN,
            "second meter: green (within the committed rate), excess meter set",
            Colour::Green,
            v4(1),
            green,
        ),
        case(
            YELLOW,
            "second meter: yellow (over the committed rate, within the excess), DSCP rewritten, IPv4 checksum updated",
            Colour::Yellow,
            v4(2),
            yellow,
        ),
        case(
            "colour_red",
            "second meter: red (over both rates), dropped",
            Colour::Red,
            v4(3),
            red,
        ),
        case(
            "packet_rate_pass",
            "packet-rate meter: pass (checked beside the byte rate)",
            Colour::Green,
            v4(4),
            settings(MAX_RATE_BPS, ENDLESS, packets(MAX_PACKET_RATE, ENDLESS))?,
        ),
        case(
            "packet_rate_refused",
            "packet-rate meter: refused (over the packet rate), dropped",
            Colour::PacketRefused,
            v4(5),
            settings(MAX_RATE_BPS, ENDLESS, packets(1, 1))?,
        ),
        case(
            GREEN6,
            "second meter: green, IPv6",
            Colour::Green,
            v6(6),
            green,
        ),
        case(
            YELLOW6,
            "second meter: yellow, IPv6, traffic class rewritten",
            Colour::Yellow,
            v6(7),
            yellow,
        ),
    ])
}

/// ECN's ECT(0) codepoint.
const ECT0: u8 = 2;

/// An untagged IPv6 frame with ECT(0) in its traffic class.
fn ipv6_with_ecn(mut f: Vec<u8>) -> Vec<u8> {
    f[ETH_HLEN + 1] = (f[ETH_HLEN + 1] & !0x30) | ECT0 << 4;
    f
}

/// Runs the XDP program `repeat` times on `frame`: the last run's verdict, the bytes it
/// passed on and the kernel's mean ns a run.
fn run(ebpf: &Ebpf, frame: &[u8], repeat: u32) -> Result<(u32, Vec<u8>, f64)> {
    let prog: &Xdp = ebpf
        .program(PROG_XDP)
        .context("program missing")?
        .try_into()?;
    let mut out = vec![0u8; frame.len()];
    let mut opts = TestRunOptions::new();
    opts.data_in = Some(frame);
    opts.data_out = Some(&mut out);
    opts.repeat = repeat;
    let result = prog.test_run(opts).context("BPF_PROG_TEST_RUN")?;
    Ok((result.return_value, out, result.duration.as_nanos() as f64))
}

/// Runs the XDP program once on `frame`: its verdict and the bytes it passed on.
fn run_once(ebpf: &Ebpf, frame: &[u8]) -> Result<(u32, Vec<u8>)> {
    let (verdict, out, _) = run(ebpf, frame, 1)?;
    Ok((verdict, out))
}

/// Sends `case`'s frame, one at a time, until one has the case's colour (at most three:
/// a green and a yellow may come first); the key's cells exist afterwards. A yellow
/// frame's bytes are checked ([`remarked`]).
pub fn prime(ebpf: &Ebpf, case: &Case) -> Result<()> {
    let mut seen = Vec::new();
    for _ in 0..3 {
        let before = testrun::counters(ebpf)?;
        let (verdict, out) = run_once(ebpf, &case.frame)?;
        let colour = Colour::of(&before, &testrun::counters(ebpf)?, 1);
        ensure!(
            colour.is_some_and(|c| c.verdict() == verdict),
            "{}: a frame counted as {colour:?} got verdict {verdict}",
            case.id
        );
        if colour == Some(case.colour) {
            if case.colour == Colour::Yellow {
                remarked(&case.frame, &out, EXCESS_DSCP)
                    .with_context(|| format!("{}: the yellow frame as passed on", case.id))?;
            }
            return Ok(());
        }
        seen.extend(colour);
    }
    bail!(
        "{}: no frame was {:?} in three (they were {seen:?})",
        case.id,
        case.colour
    )
}

/// `case`'s timed loop: primes its key ([`prime`]), runs its frame `repeat` times in the
/// kernel and checks every frame's colour ([`check`]; of the packet-rate refused row, the
/// frames its cell's refills let through, [`refills_allow`]); returns the kernel's mean
/// ns a frame.
pub fn measure(ebpf: &Ebpf, case: &Case, repeat: u32) -> Result<f64> {
    prime(ebpf, case)?;
    let before = testrun::counters(ebpf)?;
    let refused = case.colour == Colour::PacketRefused;
    let tat0 = if refused { packet_tat(ebpf, case)? } else { 0 };
    let start = ticks_from_ns(monotonic_ns());
    let (verdict, _, ns) = run(ebpf, &case.frame, repeat)?;
    let end = ticks_from_ns(monotonic_ns());
    let after = testrun::counters(ebpf)?;
    let n = u64::from(repeat);
    if !refused {
        ensure!(
            verdict == case.colour.verdict(),
            "{}: returned {verdict} instead of {}",
            case.id,
            case.colour.verdict()
        );
        check(case, &before, &after, n)?;
        return Ok(ns);
    }
    // Every frame refused by the packet rate, but those passed (green) on a refill.
    let passed = after.outcomes.passed_packets - before.outcomes.passed_packets;
    let mut but_passes = before;
    but_passes.outcomes.passed_packets += passed;
    let tat1 = packet_tat(ebpf, case)?;
    let period = case.config.meter2.packets.cost(1, u32::MAX);
    ensure!(
        Colour::of(&but_passes, &after, n - passed) == Some(Colour::PacketRefused)
            && refills_allow(passed, tat0, tat1, start, end, period)
            && (verdict == XDP_DROP || passed > 0 && verdict == XDP_PASS),
        "{}: of the {n} timed frames, {}, the last {verdict}, which the packet cell's \
         refills do not allow: its TAT {tat0} before, {tat1} after, a packet every {period} \
         ticks, the loop from {start} to {end}",
        case.id,
        counted(&before, &after)
    );
    Ok(ns)
}

/// Whether `passed` frames of a timed loop run from `start` to `end` (ticks of the
/// program's clock, read just outside it) are what a packet meter of burst one, a packet
/// every `period` ticks, lets through, its cell's TAT `tat0` before the loop and `tat1`
/// after. With a burst of one a frame passes only once the cell has drained (its TAT not
/// ahead of now), and moves the TAT to a period after itself. So: none passed if the cell
/// was never charged (`tat1 == tat0`), and then it had not drained at the start (else the
/// first frame would have passed); otherwise each pass came at or after the previous
/// TAT, a period at least after the pass before it (`tat1 ≥ tat0 + passed × period`), and
/// the last within the loop (`start ≤ tat1 − period ≤ end`).
pub fn refills_allow(passed: u64, tat0: u64, tat1: u64, start: u64, end: u64, period: u64) -> bool {
    if passed == 0 {
        return tat1 == tat0 && tat0 > start;
    }
    let last = tat1.wrapping_sub(period);
    passed
        .checked_mul(period)
        .and_then(|p| tat0.checked_add(p))
        .is_some_and(|least| tat1 >= least)
        && (start..=end).contains(&last)
}

/// The TAT of the packet cell of `case`'s key (an IPv4 frame's source, keyed as the
/// sources map is), in ticks.
fn packet_tat(ebpf: &Ebpf, case: &Case) -> Result<u64> {
    let map: HashMap<&MapData, Ipv4Key, Meter2Cells> =
        HashMap::try_from(ebpf.map(MAP_METER2).context("second meter's map missing")?)?;
    let ip = ETH_HLEN + 12;
    let source = Ipv4Addr::new(
        case.frame[ip],
        case.frame[ip + 1],
        case.frame[ip + 2],
        case.frame[ip + 3],
    );
    let cells = map
        .get(&testrun::key(source), 0)
        .with_context(|| format!("{}: no second-meter cells for {source}", case.id))?;
    Ok(cells.packets.tat)
}

/// Checks that `n` frames, counted from `before` to `after`, all had `case`'s colour.
pub fn check(case: &Case, before: &Counters, after: &Counters, n: u64) -> Result<()> {
    ensure!(
        Colour::of(before, after, n) == Some(case.colour),
        "{}: not every one of the {n} timed frames was {:?} (counted: {})",
        case.id,
        case.colour,
        counted(before, after),
    );
    Ok(())
}

/// What the counters counted from `before` to `after`, for a message.
fn counted(before: &Counters, after: &Counters) -> String {
    format!(
        "{} passed, {} dropped, {} yellow, {} refused by the packet rate",
        after.outcomes.passed_packets - before.outcomes.passed_packets,
        after.outcomes.dropped_packets - before.outcomes.dropped_packets,
        after.meter2.yellow_packets - before.meter2.yellow_packets,
        after.meter2.packet_rate_refused_packets - before.meter2.packet_rate_refused_packets,
    )
}

/// Whether `out` is the Ethernet frame `sent` with its IP packet's DSCP set to `dscp`: ECN
/// kept, everything else the same, an IPv4 header's checksum valid (summed afresh).
fn remarked(sent: &[u8], out: &[u8], dscp: u8) -> Result<()> {
    let ip = ETH_HLEN;
    let mut want = sent.to_vec();
    match sent[ip] >> 4 {
        4 => {
            want[ip + 1] = dscp << 2 | (sent[ip + 1] & 3);
            want[ip + 10..ip + 12].copy_from_slice(&out[ip + 10..ip + 12]);
            ensure!(
                frame::ecn_of(out).1,
                "IPv4 header checksum does not verify: {:02x?}",
                &out[ip..ip + 20]
            );
        }
        6 => {
            let tc = (sent[ip] & 0x0f) << 4 | sent[ip + 1] >> 4;
            let tc = dscp << 2 | (tc & 3);
            want[ip] = 0x60 | tc >> 4;
            want[ip + 1] = tc << 4 | (sent[ip + 1] & 0x0f);
        }
        v => bail!("IP version {v}"),
    }
    ensure!(
        out == want,
        "passed on {out:02x?}, not {want:02x?} (DSCP {dscp})"
    );
    Ok(())
}

/// The rows' costs set against the single-rate pass and, for yellow, against green: each
/// ratio taken run by run (the same runs measured both), then summarised.
#[derive(Clone, Debug, Serialize)]
pub struct ColourResults {
    /// The case every row is set against (`pass_existing`).
    pub single_rate: &'static str,
    pub rows: Vec<ColourRow>,
    /// Yellow IPv4 over green IPv4 (issue 24's bound, [`YELLOW_BOUND`]), and the same of
    /// IPv6.
    pub yellow_over_green: Summary,
    pub yellow_over_green_v6: Summary,
    pub bound: f64,
    /// Whether the median of `yellow_over_green` is within `bound`.
    pub within_bound: bool,
    /// What was not measured, and why.
    pub not_measured: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ColourRow {
    pub id: &'static str,
    pub case: &'static str,
    pub colour: Colour,
    /// ns/packet, each run's.
    pub ns: Summary,
    /// Over the single-rate pass, run by run.
    pub over_single_rate: Summary,
}

/// The results of `cases`, measured `samples` (ns/packet, one a run, in `cases`' order),
/// against the single-rate pass's `single_rate` of the same runs.
pub fn results(single_rate: &[f64], cases: &[Case], samples: &[Vec<f64>]) -> ColourResults {
    let base = Summary::of(single_rate.to_vec());
    let of = |id: &str| {
        cases
            .iter()
            .zip(samples)
            .find(|(c, _)| c.id == id)
            .map(|(_, s)| Summary::of(s.clone()))
            .expect("every colour case is measured")
    };
    let rows: Vec<ColourRow> = cases
        .iter()
        .zip(samples)
        .map(|(c, s)| {
            let ns = Summary::of(s.clone());
            ColourRow {
                id: c.id,
                case: c.name,
                colour: c.colour,
                over_single_rate: ns.ratio_to(&base),
                ns,
            }
        })
        .collect();
    let yellow_over_green = of(YELLOW).ratio_to(&of(GREEN));
    ColourResults {
        single_rate: "pass_existing",
        rows,
        within_bound: yellow_over_green.median <= YELLOW_BOUND,
        yellow_over_green,
        yellow_over_green_v6: of(YELLOW6).ratio_to(&of(GREEN6)),
        bound: YELLOW_BOUND,
        not_measured: vec![
            "the tc program (its remark goes through the skb helpers): the per-packet bench \
             runs the XDP program only, for every row"
                .to_owned(),
            "the baseline build: it has no second meter".to_owned(),
        ],
    }
}

/// The headline of the rows, one line each.
pub fn summary_lines(r: &ColourResults) -> Vec<String> {
    let range = |s: &Summary| format!("{:.2}× ({:.2}–{:.2})", s.median, s.min, s.max);
    let mut lines = vec![format!(
        "yellow (DSCP rewritten) against green, IPv4: {} run by run, issue 24's bound {:.2}×: {}; IPv6: {}",
        range(&r.yellow_over_green),
        r.bound,
        if r.within_bound { "within" } else { "OVER" },
        range(&r.yellow_over_green_v6),
    )];
    for row in &r.rows {
        lines.push(format!(
            "{}: {:.1} ns, {} the single-rate pass",
            row.case,
            row.ns.median,
            range(&row.over_single_rate)
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use shaper_common::{gcra::TICKS_PER_SEC, maps::Meter2Counts};

    use super::*;

    fn counted(passed: u64, dropped: u64, yellow: u64, refused: u64) -> Counters {
        let mut c = Counters::default();
        c.outcomes.passed_packets = passed;
        c.outcomes.dropped_packets = dropped;
        c.meter2 = Meter2Counts {
            yellow_packets: yellow,
            packet_rate_refused_packets: refused,
            ..Meter2Counts::default()
        };
        c
    }

    /// A run is of one colour only if every frame of it was; anything else is none.
    #[test]
    fn a_run_has_a_colour_only_if_every_frame_had_it() {
        let before = counted(5, 5, 5, 5);
        let of = |p: u64, d: u64, y: u64, r: u64| {
            Colour::of(&before, &counted(5 + p, 5 + d, 5 + y, 5 + r), 10)
        };
        assert_eq!(of(10, 0, 0, 0), Some(Colour::Green));
        assert_eq!(of(10, 0, 10, 0), Some(Colour::Yellow));
        assert_eq!(of(0, 10, 0, 0), Some(Colour::Red));
        assert_eq!(of(0, 10, 0, 10), Some(Colour::PacketRefused));
        // One green among yellows, one yellow among greens, a red among greens.
        assert_eq!(of(10, 0, 9, 0), None);
        assert_eq!(of(10, 0, 1, 0), None);
        assert_eq!(of(9, 1, 0, 0), None);
        assert_eq!(of(0, 10, 0, 9), None);
        let mut monitor = counted(5 + 10, 5, 5, 5);
        monitor.outcomes.would_drop_packets = 1;
        assert_eq!(Colour::of(&before, &monitor, 10), None);
    }

    #[test]
    fn a_remarked_frame_is_checked_byte_for_byte() {
        let sent = frame::ipv4_udp(Ipv4Addr::new(198, 18, 20, 1), 64);
        let sent = frame::with_ecn(&sent, ECT0);
        let mut out = sent.clone();
        // DSCP 8, ECT(0) kept; the checksum patched by hand (RFC 1624 on word 0).
        let ip = ETH_HLEN;
        let old = u16::from_be_bytes([out[ip], out[ip + 1]]);
        out[ip + 1] = 8 << 2 | ECT0;
        let new = u16::from_be_bytes([out[ip], out[ip + 1]]);
        let check = u16::from_be_bytes([out[ip + 10], out[ip + 11]]);
        let sum = u32::from(!check) + u32::from(!old) + u32::from(new);
        let sum = (sum & 0xffff) + (sum >> 16);
        let check = !((sum & 0xffff) + (sum >> 16)) as u16;
        out[ip + 10..ip + 12].copy_from_slice(&check.to_be_bytes());
        remarked(&sent, &out, 8).unwrap();
        // The ECN bits lost, a stale checksum, another DSCP, the frame passed untouched.
        let mut lost_ecn = out.clone();
        lost_ecn[ip + 1] = 8 << 2;
        assert!(remarked(&sent, &lost_ecn, 8).is_err());
        let mut stale = out.clone();
        stale[ip + 10..ip + 12].copy_from_slice(&sent[ip + 10..ip + 12]);
        assert!(remarked(&sent, &stale, 8).is_err());
        assert!(remarked(&sent, &out, 10).is_err());
        assert!(remarked(&sent, &sent, 8).is_err());

        let sent6 = ipv6_with_ecn(frame::ipv6_udp(Ipv6Addr::LOCALHOST, DEFAULT_DST_V6, 2));
        let mut out6 = sent6.clone();
        // Traffic class 8 << 2 | ECT(0) across bytes 0 and 1, the flow label kept.
        let tc = 8 << 2 | ECT0;
        out6[ip] = 0x60 | tc >> 4;
        out6[ip + 1] = (tc << 4) | (sent6[ip + 1] & 0x0f);
        remarked(&sent6, &out6, 8).unwrap();
        assert!(remarked(&sent6, &sent6, 8).is_err());
    }

    /// The refused row's cell: one packet a second exactly (no sub-tick remainder to
    /// dither), a burst of one.
    #[test]
    fn the_refused_row_refills_a_packet_a_second() {
        let refused = cases()
            .unwrap()
            .into_iter()
            .find(|c| c.colour == Colour::PacketRefused)
            .unwrap();
        let packets = refused.config.meter2.packets;
        assert_eq!(packets.cost(1, u32::MAX), TICKS_PER_SEC);
        assert_eq!(packets.cost(1, 0), TICKS_PER_SEC);
        assert_eq!(packets.tau_ticks, TICKS_PER_SEC);
    }

    /// What a packet meter of burst one lets through a loop, from its cell's TAT before and
    /// after: one frame too many, or a pass before the cell drained, is refused.
    #[test]
    fn refills_allow_what_the_cell_allows() {
        let t = TICKS_PER_SEC;
        // The loop from 10 s to 10.001 s, the cell full until 10.5 s: nothing passes.
        let (start, end) = (10 * t, 10 * t + t / 1000);
        assert!(refills_allow(
            0,
            10 * t + t / 2,
            10 * t + t / 2,
            start,
            end,
            t
        ));
        // A frame passed all the same (the TAT moved by a period from the pass).
        assert!(!refills_allow(1, 10 * t + t / 2, 11 * t, start, end, t));
        assert!(!refills_allow(
            1,
            10 * t + t / 2,
            11 * t + t / 2,
            start,
            end,
            t
        ));
        // The cell drained before the loop: its first frame must pass.
        assert!(!refills_allow(0, 9 * t, 9 * t, start, end, t));
        assert!(refills_allow(1, 9 * t, start + 1 + t, start, end, t));
        // A loop of 2.5 s from 10 s, the cell drained at 10.5 s: passes at 10.5 s and
        // 11.5 s, not a third.
        let end = 12 * t + t / 2;
        let tat0 = 10 * t + t / 2;
        assert!(refills_allow(1, tat0, tat0 + t, start, end, t));
        assert!(refills_allow(2, tat0, tat0 + 2 * t, start, end, t));
        assert!(!refills_allow(3, tat0, tat0 + 2 * t, start, end, t));
        // A pass after the loop's end, or a cell that moved with nothing passed.
        assert!(!refills_allow(2, tat0, end + 2 * t, start, end, t));
        assert!(!refills_allow(0, tat0, tat0 + t, start, end, t));
    }

    #[test]
    fn ratios_are_paired_run_by_run() {
        let cases = cases().unwrap();
        let samples: Vec<Vec<f64>> = cases
            .iter()
            .map(|c| match c.id {
                YELLOW => vec![12.0, 30.0],
                _ => vec![10.0, 20.0],
            })
            .collect();
        let r = results(&[5.0, 10.0], &cases, &samples);
        assert_eq!(r.yellow_over_green.runs, [1.2, 1.5]);
        assert!(!r.within_bound, "median 1.35 is over 1.25");
        assert_eq!(r.rows[0].over_single_rate.runs, [2.0, 2.0]);
        assert_eq!(r.rows.len(), cases.len());
    }
}

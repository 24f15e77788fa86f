//! The second meter in the real kernel through BPF_PROG_TEST_RUN: RFC 4115's colour-blind
//! two-rate three-colour marker (green passed untouched, yellow passed with its DSCP
//! rewritten, red dropped) and the packet-rate limit, on the XDP and the tc program.
//!
//! The rates are the slowest there are (8 bit/s, one byte a second; one packet a second),
//! so a cell refills less than a frame's worth while a test runs: what a bucket lets
//! through is its burst, exactly. Yellow frames are compared byte for byte with the frame
//! as it should be, its header checksum computed afresh (not incrementally, as the
//! programs do), under every encapsulation the parser reads; and XDP and tc must write the
//! same bytes.

#[expect(dead_code, reason = "not every helper is used here")]
mod common;

use std::{
    net::{Ipv4Addr, Ipv6Addr},
    time::{Duration, Instant},
};

use aya::{
    Ebpf,
    programs::{SchedClassifier, TestRun as _, TestRunOptions, Xdp},
};
use shaper_common::{
    config::Meter2Limits,
    dscp::DSCP_LE,
    gcra::MIN_RATE_BPS,
    maps::{Admission, Config, Counters, MODE_MONITOR, Meter2, PROG_TC, PROG_XDP},
};
use shaper_lab::{
    frame::{
        self, DEFAULT_DST_V4, DEFAULT_DST_V6, ETH_HLEN, ETH_P_8021AD, ETH_P_8021Q, ETH_P_IP,
        ETH_P_IPV6, Fragment, IPPROTO_UDP, PPP_IP, PPP_IPV6,
    },
    testrun,
};
use shaper_user::object;

/// Bytes of every frame.
const FRAME: usize = 100;
/// Committed and excess bursts: ten and five frames.
const CBS: u64 = 10 * FRAME as u64;
const EBS: u64 = 5 * FRAME as u64;
/// `TC_ACT_UNSPEC` and `TC_ACT_SHOT`; `struct __sk_buff`'s size and `gso_segs`.
const TC_ACT_UNSPEC: i32 = -1;
const TC_ACT_SHOT: i32 = 2;
const SKB_SIZE: usize = 192;
const GSO_SEGS_AT: usize = 164;

/// The interface's settings with a second meter as `m` asks.
fn config(cbs: u64, m: Meter2Limits) -> Config {
    Config {
        meter2: Meter2::new(&m).unwrap(),
        ..testrun::config(MIN_RATE_BPS, cbs).unwrap()
    }
}

fn excess(ebs: u64, dscp: u8) -> Meter2Limits {
    Meter2Limits {
        excess_rate_bps: MIN_RATE_BPS,
        excess_burst_bytes: ebs,
        excess_dscp: dscp,
        ..Meter2Limits::default()
    }
}

/// Both programs loaded over the same maps, configured.
fn load(config: &Config) -> Ebpf {
    let mut ebpf = object::load(object::Sizes::full(1024)).unwrap();
    object::xdp_program(&mut ebpf, PROG_XDP).unwrap();
    object::tc_program(&mut ebpf).unwrap();
    object::configure(&mut ebpf, config).unwrap();
    ebpf
}

/// A verdict, and the bytes the program passed on.
#[derive(Debug, PartialEq, Eq)]
enum Out {
    Pass(Vec<u8>),
    Drop,
}

fn xdp(ebpf: &Ebpf, f: &[u8]) -> Out {
    let prog: &Xdp = ebpf.program(PROG_XDP).unwrap().try_into().unwrap();
    let mut data_out = vec![0u8; f.len()];
    let mut opts = TestRunOptions::new();
    opts.data_in = Some(f);
    opts.data_out = Some(&mut data_out);
    match prog
        .test_run(opts)
        .expect("test_run of the XDP program")
        .return_value
    {
        testrun::XDP_PASS => Out::Pass(data_out),
        testrun::XDP_DROP => Out::Drop,
        v => panic!("XDP verdict {v}"),
    }
}

fn tc(ebpf: &Ebpf, f: &[u8]) -> Out {
    let prog: &SchedClassifier = ebpf.program(PROG_TC).unwrap().try_into().unwrap();
    let mut ctx_in = [0u8; SKB_SIZE];
    ctx_in[GSO_SEGS_AT..GSO_SEGS_AT + 4].copy_from_slice(&1u32.to_ne_bytes());
    let mut ctx_out = [0u8; SKB_SIZE];
    let mut data_out = vec![0u8; f.len()];
    let mut opts = TestRunOptions::new();
    opts.data_in = Some(f);
    opts.data_out = Some(&mut data_out);
    opts.ctx_in = Some(&ctx_in);
    opts.ctx_out = Some(&mut ctx_out);
    match prog
        .test_run(opts)
        .expect("test_run of the tc program")
        .return_value as i32
    {
        TC_ACT_UNSPEC => Out::Pass(data_out),
        TC_ACT_SHOT => Out::Drop,
        v => panic!("tc verdict {v}"),
    }
}

/// RFC 1071's checksum of `bytes`.
fn checksum(bytes: &[u8]) -> u16 {
    let mut sum: u32 = bytes
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)])))
        .sum();
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// An IPv4 UDP packet from `src` of `tos`, its checksum valid.
fn ipv4(src: Ipv4Addr, tos: u8, len: usize) -> Vec<u8> {
    let mut ip = frame::ipv4(
        src,
        DEFAULT_DST_V4,
        &[],
        IPPROTO_UDP,
        Fragment::default(),
        &frame::udp(len - 28),
    );
    ip[1] = tos;
    ip[10..12].fill(0);
    let c = checksum(&ip[..20]);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    ip
}

/// An IPv6 UDP packet from `src` of traffic class `tc` (flow label 0xabcde).
fn ipv6(src: Ipv6Addr, tc: u8, len: usize) -> Vec<u8> {
    let mut ip = frame::ipv6(src, DEFAULT_DST_V6, IPPROTO_UDP, &frame::udp(len - 48));
    ip[0] = 0x60 | tc >> 4;
    ip[1] = (tc << 4) | 0x0a;
    ip
}

/// `packet` as the expected yellow: DSCP `dscp`, ECN kept, IPv4 checksum computed afresh.
fn remarked(packet: &[u8], dscp: u8) -> Vec<u8> {
    let mut p = packet.to_vec();
    if p[0] >> 4 == 4 {
        p[1] = dscp << 2 | (p[1] & 3);
        p[10..12].fill(0);
        let c = checksum(&p[..20]);
        p[10..12].copy_from_slice(&c.to_be_bytes());
    } else {
        let tc = (p[0] << 4 | p[1] >> 4) & 3 | dscp << 2;
        p[0] = 0x60 | tc >> 4;
        p[1] = (tc << 4) | (p[1] & 0x0f);
    }
    p
}

/// Every encapsulation the parser reads, of an IP packet: its frame.
fn encapsulations(ip: &[u8]) -> Vec<(&'static str, Vec<u8>)> {
    let v4 = ip[0] >> 4 == 4;
    let plain = frame::ethernet(if v4 { ETH_P_IP } else { ETH_P_IPV6 }, ip);
    let vlan = frame::with_vlan(&plain, ETH_P_8021Q, 7);
    let qinq = frame::with_vlan(&vlan, ETH_P_8021AD, 100);
    let pppoe = frame::pppoe_session(if v4 { PPP_IP } else { PPP_IPV6 }, ip);
    let pppoe_vlan = frame::with_vlan(&pppoe, ETH_P_8021Q, 9);
    vec![
        ("untagged", plain),
        ("vlan", vlan),
        ("qinq", qinq),
        ("pppoe", pppoe),
        ("vlan+pppoe", pppoe_vlan),
    ]
}

/// The frame `f` with its IP packet (at `at`) replaced by `ip`.
fn with_packet(f: &[u8], at: usize, ip: &[u8]) -> Vec<u8> {
    let mut g = f.to_vec();
    g[at..at + ip.len()].copy_from_slice(ip);
    g
}

#[test]
#[ignore = "needs root: loads programs into the kernel (cargo xtask test)"]
fn yellow_frames_are_remarked_alike_under_every_encapsulation_by_xdp_and_tc() {
    // One frame of committed burst (of the longest, 112 bytes; not two of the shortest,
    // 100): a key's first frame is green, the next yellow.
    let dscp = 8; // cs1
    let ebpf = load(&config(150, excess(EBS, dscp)));
    let mut source = 0u32;
    let mut next_v4 = || {
        source += 1;
        Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 1, 0)) + source)
    };
    let mut six = 0u16;
    let mut next_v6 = || {
        six += 1;
        Ipv6Addr::new(0x2001, 0xdb8, 7, six, 0, 0, 0, 1)
    };
    // EF with ECT(1), AF41 with CE, CS0 with Not-ECT; IPv6 EF with ECT(0).
    for tos in [0xb9u8, 0x8b, 0x00] {
        for program in ["xdp", "tc"] {
            let src = next_v4();
            let ip = ipv4(src, tos, FRAME - ETH_HLEN);
            check(&ebpf, program, &ip, dscp);
        }
    }
    for program in ["xdp", "tc"] {
        let ip = ipv6(next_v6(), 0xba, FRAME - ETH_HLEN);
        check(&ebpf, program, &ip, dscp);
    }
    let c = testrun::counters(&ebpf).unwrap();
    // 4 packets x 2 programs x 5 encapsulations, each key's frame green, then yellow.
    assert_eq!(c.meter2.yellow_packets, 40, "{:?}", c.meter2);
    assert_eq!(c.outcomes.passed_packets, 80);
    assert_eq!(c.outcomes.dropped_packets, 0);

    /// Runs every encapsulation of `ip` through `program`, each from a key of its own,
    /// twice: green, then yellow.
    fn check(ebpf: &Ebpf, program: &str, ip: &[u8], dscp: u8) {
        let run = |f: &[u8]| {
            if program == "xdp" {
                xdp(ebpf, f)
            } else {
                tc(ebpf, f)
            }
        };
        for (i, (name, f)) in encapsulations(ip).into_iter().enumerate() {
            let at = f.len() - ip.len();
            // Each encapsulation its own key: a byte of the source moved on.
            let mut ip = ip.to_vec();
            if ip[0] >> 4 == 4 {
                ip[14] += 10 * i as u8;
                ip[10..12].fill(0);
                let c = checksum(&ip[..20]);
                ip[10..12].copy_from_slice(&c.to_be_bytes());
            } else {
                ip[12] += i as u8;
            }
            let f = with_packet(&f, at, &ip);
            assert_eq!(
                run(&f),
                Out::Pass(f.clone()),
                "{program} {name}: green untouched"
            );
            let want = with_packet(&f, at, &remarked(&ip, dscp));
            let Out::Pass(got) = run(&f) else {
                panic!("{program} {name}: yellow dropped");
            };
            assert_eq!(got, want, "{program} {name}: yellow remarked");
            if ip[0] >> 4 == 4 {
                assert_eq!(checksum(&got[at..at + 20]), 0, "{program} {name}: checksum");
            }
        }
    }
}

/// A key offered far more than CIR + EIR gets CBS green, EBS yellow, the rest red, exactly
/// (the rates refill less than a frame while it runs), counted so globally and in its own
/// cells; in monitor mode the red are would-drops and the yellow are not rewritten.
#[test]
#[ignore = "needs root: loads programs into the kernel (cargo xtask test)"]
fn a_key_over_both_rates_gets_its_bursts_green_and_yellow_and_the_rest_red() {
    for monitor in [false, true] {
        let mut c = config(CBS, excess(EBS, DSCP_LE));
        if monitor {
            c.mode = MODE_MONITOR;
        }
        let ebpf = load(&c);
        let ip = ipv4(Ipv4Addr::new(198, 18, 2, 1), 0, FRAME - ETH_HLEN);
        let f = frame::ethernet(ETH_P_IP, &ip);
        let yellow = frame::ethernet(ETH_P_IP, &remarked(&ip, DSCP_LE));
        let (mut green, mut marked, mut red) = (0, 0, 0);
        let sent = 40;
        for i in 0..sent {
            let run = if i % 2 == 0 {
                xdp(&ebpf, &f)
            } else {
                tc(&ebpf, &f)
            };
            match run {
                Out::Pass(out) if out == f => green += 1,
                Out::Pass(out) if out == yellow => marked += 1,
                Out::Pass(out) => panic!("frame {i} passed altered: {out:x?}"),
                Out::Drop => red += 1,
            }
        }
        let counters: Counters = testrun::counters(&ebpf).unwrap();
        let (cbs, ebs) = (CBS / FRAME as u64, EBS / FRAME as u64);
        if monitor {
            // Nothing dropped, nothing rewritten: what would have been is counted.
            assert_eq!((green, marked, red), (sent, 0, 0));
            assert_eq!(counters.outcomes.would_drop_packets, sent - cbs - ebs);
        } else {
            assert_eq!((green, marked, red), (cbs, ebs, sent - cbs - ebs));
            assert_eq!(counters.outcomes.dropped_packets, red);
        }
        assert_eq!(
            counters.outcomes.passed_packets,
            cbs + ebs,
            "monitor {monitor}"
        );
        assert_eq!(counters.meter2.yellow_packets, ebs, "monitor {monitor}");
        assert_eq!(counters.meter2.yellow_bytes, ebs * FRAME as u64);
        assert_eq!(counters.meter2.packet_rate_refused_packets, 0);
    }
}

/// Keys refused a cell (new-source admission) share their policy's unadmitted cells, the
/// second meter's too: of 30 frames from 30 new keys, the committed burst's frames are
/// green and the excess burst's yellow once for them all, the rest red (a key admitted on
/// its first sighting is green in a cell of its own). Each key metered in an excess cell
/// of its own would pass every frame past the committed burst yellow. Both families.
#[test]
#[ignore = "needs root: loads programs into the kernel (cargo xtask test)"]
fn unadmitted_keys_share_one_excess_burst() {
    const SENT: u64 = 30;
    for v6 in [false, true] {
        let c = Config {
            admission: Admission::new(1, 1).unwrap(),
            ..config(CBS, excess(EBS, DSCP_LE))
        };
        let ebpf = load(&c);
        let (mut green, mut marked, mut red) = (0, 0, 0);
        for i in 0..SENT {
            let (ip, ethertype) = match v6 {
                false => (
                    ipv4(Ipv4Addr::new(198, 18, 3, i as u8), 0, FRAME - ETH_HLEN),
                    ETH_P_IP,
                ),
                true => {
                    let src = Ipv6Addr::new(0x2001, 0xdb8, 3, i as u16, 0, 0, 0, 1);
                    (ipv6(src, 0, FRAME - ETH_HLEN), ETH_P_IPV6)
                }
            };
            let f = frame::ethernet(ethertype, &ip);
            let yellow = frame::ethernet(ethertype, &remarked(&ip, DSCP_LE));
            match xdp(&ebpf, &f) {
                Out::Pass(out) if out == f => green += 1,
                Out::Pass(out) if out == yellow => marked += 1,
                Out::Pass(out) => panic!("frame {i} passed altered: {out:x?}"),
                Out::Drop => red += 1,
            }
        }
        let counters: Counters = testrun::counters(&ebpf).unwrap();
        let admitted = counters.new_sources;
        let (cbs, ebs) = (CBS / FRAME as u64, EBS / FRAME as u64);
        assert!(
            admitted < SENT - cbs - ebs,
            "IPv6 {v6}: {admitted} keys admitted"
        );
        assert_eq!(
            (green, marked, red),
            (cbs + admitted, ebs, SENT - cbs - ebs - admitted),
            "IPv6 {v6}: green, yellow and red of {SENT} new keys, {admitted} admitted"
        );
        let u = counters.unadmitted;
        assert_eq!(
            (u.passed_packets, u.dropped_packets),
            (cbs + ebs, red),
            "IPv6 {v6}: the unadmitted frames"
        );
        assert_eq!(counters.meter2.yellow_packets, ebs, "IPv6 {v6}");
    }
}

/// Over time: a key offered 3× CIR (EIR = CIR) for half a second gets what the two
/// buckets give of its frames as the kernel saw them, green and yellow each within two
/// frames (of about 5,000; CBS and EBS are 40), the rest red; offered 1.5× CIR, none red.
/// The kernel's clock is the one `Instant` reads (CLOCK_MONOTONIC) and it reads it inside
/// each test run, so each frame's time is known to lie between the moment before its run
/// and the moment after: the replay runs twice, every frame at the first and every frame
/// at the second, and the kernel's counts must lie between the two within two frames
/// (frames at a bucket's edge fall either side of it). On a quiet machine the two replays
/// agree or differ by a frame; with the CPUs loaded a run can be held for milliseconds
/// inside the call and they part (by 30 frames at load 5 on 2 CPUs, when the kernel sat
/// between them, 14 to 28 frames from the first alone). An excess burst half as big moves
/// 27. Frames are spaced at least their interval apart, never sent to catch up, so a
/// stalled test offers less, never a burst (the replays count what it did offer).
#[test]
#[ignore = "needs root: loads programs into the kernel (cargo xtask test)"]
fn a_key_offered_three_times_cir_gets_both_rates_and_at_one_and_a_half_no_red() {
    const RATE_BPS: u64 = 8_000_000;
    const BURST: u64 = 40 * FRAME as u64;
    for (times, src) in [(3.0, 1u8), (1.5, 2)] {
        let m = Meter2Limits {
            excess_rate_bps: RATE_BPS,
            excess_burst_bytes: BURST,
            excess_dscp: DSCP_LE,
            ..Meter2Limits::default()
        };
        let c = Config {
            meter2: Meter2::new(&m).unwrap(),
            ..testrun::config(RATE_BPS, BURST).unwrap()
        };
        let ebpf = load(&c);
        let ip = ipv4(Ipv4Addr::new(198, 18, 3, src), 0, FRAME - ETH_HLEN);
        let f = frame::ethernet(ETH_P_IP, &ip);
        let yellow = frame::ethernet(ETH_P_IP, &remarked(&ip, DSCP_LE));
        let interval = Duration::from_secs_f64(FRAME as f64 * 8.0 / (RATE_BPS as f64 * times));
        let start = Instant::now();
        // When each frame's test run began and ended, from `start`.
        let (mut before, mut after) = (Vec::new(), Vec::new());
        let (mut green, mut marked, mut red) = (0u64, 0u64, 0u64);
        let mut next = start;
        while start.elapsed() < Duration::from_millis(500) {
            while Instant::now() < next {
                std::hint::spin_loop();
            }
            let at = Instant::now();
            before.push(at.duration_since(start).as_nanos() as u64);
            let verdict = xdp(&ebpf, &f);
            after.push(start.elapsed().as_nanos() as u64);
            match verdict {
                Out::Pass(out) if out == f => green += 1,
                Out::Pass(out) if out == yellow => marked += 1,
                Out::Pass(out) => panic!("a frame passed altered: {out:x?}"),
                Out::Drop => red += 1,
            }
            next = at + interval;
        }
        let secs = before.last().copied().unwrap_or(0) as f64 / 1e9;
        let replay = |times: &[u64]| {
            common::replay_colour_at(
                times,
                FRAME as u64,
                (RATE_BPS, BURST),
                Some((RATE_BPS, BURST)),
                None,
            )
        };
        let (early, late) = (replay(&before), replay(&after));
        println!(
            "offered {times}x CIR: {} frames over {secs:.3} s ({:.2}x CIR): green {green} (replay {} to {}), yellow {marked} (replay {} to {}), red {red}",
            before.len(),
            before.len() as f64 * FRAME as f64 * 8.0 / secs / RATE_BPS as f64,
            early.0,
            late.0,
            early.1,
            late.1,
        );
        let within = |got: u64, a: u64, b: u64| got + 2 >= a.min(b) && got <= a.max(b) + 2;
        assert!(
            within(green, early.0, late.0),
            "{times}x: green {green}, replay {} to {}",
            early.0,
            late.0
        );
        assert!(
            within(marked, early.1, late.1),
            "{times}x: yellow {marked}, replay {} to {}",
            early.1,
            late.1
        );
        if times < 2.0 {
            assert_eq!(red, 0, "1.5x CIR with EIR = CIR: nothing is red");
        }
        // What the test could offer is timing, not function: an emulated guest offers less
        // than CIR here, and the replay says what that gets.
        let counters: Counters = testrun::counters(&ebpf).unwrap();
        assert_eq!(counters.meter2.yellow_packets, marked);
        assert_eq!(counters.outcomes.dropped_packets, red);
    }
}

/// A packet rate of one a second with a burst of five: five frames of a key pass, then
/// each is refused and counted as the packet rate's, however few bytes; another key has
/// its own five.
#[test]
#[ignore = "needs root: loads programs into the kernel (cargo xtask test)"]
fn the_packet_rate_passes_its_burst_and_refuses_the_rest() {
    let limits = Meter2Limits {
        packet_rate: 1,
        packet_burst: 5,
        ..Meter2Limits::default()
    };
    let c = Config {
        meter2: Meter2::new(&limits).unwrap(),
        ..testrun::open_config().unwrap()
    };
    let ebpf = load(&c);
    for (k, src) in [Ipv4Addr::new(198, 18, 3, 1), Ipv4Addr::new(198, 18, 3, 2)]
        .into_iter()
        .enumerate()
    {
        let f = frame::ipv4_udp(src, 60);
        let verdicts: Vec<bool> = (0..12)
            .map(|i| {
                let out = if i % 2 == 0 {
                    xdp(&ebpf, &f)
                } else {
                    tc(&ebpf, &f)
                };
                out == Out::Pass(f.clone())
            })
            .collect();
        assert_eq!(
            verdicts,
            [[true; 5].as_slice(), &[false; 7]].concat(),
            "key {k}"
        );
    }
    let counters = testrun::counters(&ebpf).unwrap();
    assert_eq!(counters.meter2.packet_rate_refused_packets, 14);
    assert_eq!(counters.meter2.packet_rate_refused_bytes, 14 * 60);
    assert_eq!(counters.outcomes.dropped_packets, 14);
    assert_eq!(counters.outcomes.passed_packets, 10);
    assert_eq!(counters.meter2.yellow_packets, 0);
}

/// A frame the byte meter refuses (red) gives its packet back: a key with a packet burst
/// of ten whose byte buckets hold three frames (committed only), or three and two
/// (committed and excess), sends twenty frames at once; those over the byte buckets are
/// red for the source's rate, never the packet rate's, since only the frames that passed
/// took a packet. (Kept, each red frame would take one: from the eleventh frame on, the
/// packet rate would refuse.)
#[test]
#[ignore = "needs root: loads programs into the kernel (cargo xtask test)"]
fn a_frame_red_for_its_bytes_gives_its_packet_back() {
    let packets = Meter2Limits {
        packet_rate: 1,
        packet_burst: 10,
        ..Meter2Limits::default()
    };
    let with_excess = Meter2Limits {
        excess_rate_bps: MIN_RATE_BPS,
        excess_burst_bytes: 2 * FRAME as u64,
        excess_dscp: DSCP_LE,
        ..packets
    };
    for (what, m, passing) in [
        ("committed only", packets, 3),
        ("committed and excess", with_excess, 5),
    ] {
        let ebpf = load(&config(3 * FRAME as u64, m));
        let f = frame::ethernet(
            ETH_P_IP,
            &ipv4(Ipv4Addr::new(198, 18, 4, 1), 0, FRAME - ETH_HLEN),
        );
        let sent = 20;
        let passed = (0..sent)
            .filter(|i| {
                let out = if i % 2 == 0 {
                    xdp(&ebpf, &f)
                } else {
                    tc(&ebpf, &f)
                };
                out != Out::Drop
            })
            .count() as u64;
        let counters: Counters = testrun::counters(&ebpf).unwrap();
        assert_eq!(passed, passing, "{what}");
        assert_eq!(counters.outcomes.dropped_packets, sent - passing, "{what}");
        assert_eq!(
            counters.meter2.packet_rate_refused_packets, 0,
            "{what}: frames red for their bytes kept the packet they took"
        );
    }
}

/// A prefix policy's yellow frames carry the policy's excess DSCP, not the interface's
/// (`policy::meter2`, which the remark reads by slot): a key of the policy and one of the
/// default, each green then yellow, in both families and both programs.
#[test]
#[ignore = "needs root: loads programs into the kernel (cargo xtask test)"]
fn a_prefix_policys_yellow_frames_carry_its_own_dscp() {
    use shaper_common::{config::PolicyLimits, maps::ACTION_LIMIT};
    use shaper_user::policy::{PolicySpec, PolicyTable, parse_prefix};

    let (default_dscp, policy_dscp) = (8, 10); // cs1, af11
    let mut ebpf = load(&config(150, excess(EBS, default_dscp)));
    let limits = PolicyLimits {
        action: ACTION_LIMIT,
        rate_bps: MIN_RATE_BPS,
        burst_bytes: 150,
        meter2: excess(EBS, policy_dscp),
        ..PolicyLimits::default()
    };
    let specs: Vec<PolicySpec> = ["198.18.9.0/24", "2001:db8:9::/48"]
        .iter()
        .map(|p| PolicySpec {
            prefix: parse_prefix(p).unwrap(),
            limits,
        })
        .collect();
    PolicyTable::take(&mut ebpf)
        .unwrap()
        .replace_all(&specs)
        .unwrap();
    let mut cases = Vec::new();
    for (i, program) in ["xdp", "tc"].into_iter().enumerate() {
        let i = i as u8 + 1;
        cases.extend([
            (
                program,
                ipv4(Ipv4Addr::new(198, 18, 9, i), 0, FRAME - ETH_HLEN),
                policy_dscp,
            ),
            (
                program,
                ipv4(Ipv4Addr::new(198, 18, 8, i), 0, FRAME - ETH_HLEN),
                default_dscp,
            ),
            (
                program,
                ipv6(
                    Ipv6Addr::new(0x2001, 0xdb8, 9, i.into(), 0, 0, 0, 1),
                    0,
                    FRAME - ETH_HLEN,
                ),
                policy_dscp,
            ),
            (
                program,
                ipv6(
                    Ipv6Addr::new(0x2001, 0xdb8, 8, i.into(), 0, 0, 0, 1),
                    0,
                    FRAME - ETH_HLEN,
                ),
                default_dscp,
            ),
        ]);
    }
    for (program, ip, dscp) in cases {
        let f = frame::ethernet(
            if ip[0] >> 4 == 4 {
                ETH_P_IP
            } else {
                ETH_P_IPV6
            },
            &ip,
        );
        let run = |f: &[u8]| {
            if program == "xdp" {
                xdp(&ebpf, f)
            } else {
                tc(&ebpf, f)
            }
        };
        assert_eq!(run(&f), Out::Pass(f.clone()), "{program} {ip:?}: green");
        let want = frame::ethernet(
            if ip[0] >> 4 == 4 {
                ETH_P_IP
            } else {
                ETH_P_IPV6
            },
            &remarked(&ip, dscp),
        );
        assert_eq!(run(&f), Out::Pass(want), "{program}: yellow as DSCP {dscp}");
    }
}

/// A monitoring prefix policy with a second meter (both its rates) passes every frame
/// untouched, yellow ones too (counted, not remarked), and counts as would-drop exactly
/// what the same policy enforced drops: three green, one yellow, then the packet rate
/// refuses the rest. In both families, on both programs.
#[test]
#[ignore = "needs root: loads programs into the kernel (cargo xtask test)"]
fn a_monitoring_policys_second_meter_counts_what_enforcing_would_drop_and_remarks_nothing() {
    use shaper_common::{
        config::PolicyLimits,
        maps::{ACTION_LIMIT, MODE_ENFORCE},
    };
    use shaper_user::policy::{PolicySpec, PolicyTable, parse_prefix};

    let mut ebpf = load(&config(100 * FRAME as u64, Meter2Limits::default()));
    let enforcing = PolicyLimits {
        action: ACTION_LIMIT,
        mode: MODE_ENFORCE,
        rate_bps: MIN_RATE_BPS,
        burst_bytes: 3 * FRAME as u64,
        meter2: Meter2Limits {
            packet_rate: 1,
            packet_burst: 4,
            ..excess(2 * FRAME as u64, 10)
        },
        ..PolicyLimits::default()
    };
    let monitoring = PolicyLimits {
        mode: MODE_MONITOR,
        ..enforcing
    };
    let prefixes = [
        ("198.18.11.0/24", monitoring),
        ("198.18.12.0/24", enforcing),
        ("2001:db8:11::/48", monitoring),
        ("2001:db8:12::/48", enforcing),
    ];
    let specs: Vec<PolicySpec> = prefixes
        .iter()
        .map(|&(p, limits)| PolicySpec {
            prefix: parse_prefix(p).unwrap(),
            limits,
        })
        .collect();
    let mut table = PolicyTable::take(&mut ebpf).unwrap();
    table.replace_all(&specs).unwrap();
    let installed = table.list().unwrap();
    let sent = 10;
    for (prefix, limits) in prefixes {
        // Host 1 of the prefix.
        let ip = match prefix.split('/').next().unwrap().parse().unwrap() {
            std::net::IpAddr::V6(a) => ipv6(Ipv6Addr::from(u128::from(a) | 1), 0, FRAME - ETH_HLEN),
            std::net::IpAddr::V4(a) => ipv4(Ipv4Addr::from(u32::from(a) | 1), 0, FRAME - ETH_HLEN),
        };
        let ether_type = if ip[0] >> 4 == 4 {
            ETH_P_IP
        } else {
            ETH_P_IPV6
        };
        let f = frame::ethernet(ether_type, &ip);
        let yellow = frame::ethernet(ether_type, &remarked(&ip, 10));
        let outs: Vec<Out> = (0..sent)
            .map(|i| {
                if i % 2 == 0 {
                    xdp(&ebpf, &f)
                } else {
                    tc(&ebpf, &f)
                }
            })
            .collect();
        let want: Vec<Out> = (0..sent)
            .map(|i| match (i, limits.mode) {
                (_, MODE_MONITOR) => Out::Pass(f.clone()),
                (0..3, _) => Out::Pass(f.clone()),
                (3, _) => Out::Pass(yellow.clone()),
                _ => Out::Drop,
            })
            .collect();
        assert_eq!(outs, want, "{prefix}");
        let slot = installed
            .iter()
            .find(|i| i.spec.prefix == parse_prefix(prefix).unwrap())
            .unwrap()
            .slot;
        let s = table.stats(slot).unwrap();
        let refused = if limits.mode == MODE_MONITOR {
            (s.outcomes.would_drop_packets, s.outcomes.dropped_packets)
        } else {
            (s.outcomes.dropped_packets, s.outcomes.would_drop_packets)
        };
        assert_eq!(refused, (6, 0), "{prefix}: refused, and of the other kind");
        assert_eq!(s.outcomes.passed_packets, 4, "{prefix}");
        assert_eq!(
            (
                s.meter2.yellow_packets,
                s.meter2.yellow_bytes,
                s.meter2.packet_rate_refused_packets,
                s.meter2.packet_rate_refused_bytes
            ),
            (1, FRAME as u64, 6, 6 * FRAME as u64),
            "{prefix}: yellow, and refused by the packet rate"
        );
    }
    let c = testrun::counters(&ebpf).unwrap();
    assert_eq!(
        (
            c.outcomes.passed_packets,
            c.outcomes.dropped_packets,
            c.outcomes.would_drop_packets
        ),
        (16, 12, 12)
    );
    assert_eq!(
        (
            c.meter2.yellow_packets,
            c.meter2.packet_rate_refused_packets
        ),
        (4, 24)
    );
    assert_eq!((c.ipv4_packets, c.ipv6_packets), (20, 20));
}

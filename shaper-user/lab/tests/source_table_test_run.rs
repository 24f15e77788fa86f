//! The per-source tables' buckets in the real kernel through BPF_PROG_TEST_RUN (issue 35):
//! a table of one bucket (`--max-sources 8`), so every key collides. Its eight ways fill;
//! a newcomer then takes the way of a key whose cell is idle (the key and its counters
//! leave), or, with none idle, is metered in its policy's shared unadmitted cell, as a
//! key refused by admission; and an IPv6 key that differs from a resident one only in its
//! low half, its tag the same, is a key of its own; two CPUs' first frames of one key both
//! land in its one cell. In a table of two buckets, a key whose two buckets differ is given
//! the room of either. IPv4 and IPv6 alike.

use std::{
    collections::{BTreeSet, HashMap},
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    sync::atomic::{AtomicU32, Ordering},
};

use shaper_common::{
    config::RateLimit,
    maps::{Config, Counters, KEY_BY_SRC, Outcomes, SourceState},
    sources::{SOURCE_WAYS, bucket_of, halves, hash_v4, hash_v6, join, second_bucket_of, tag_v6},
};
use shaper_lab::{
    bench::cpus::{online_cpus, pin_to_cpu},
    frame,
    testrun::{self, XDP_PASS},
};

/// 80 bit/s: a 100-byte frame keeps its key's cell busy (its TAT ahead of now) for 10 s,
/// far longer than a test takes, even in an emulated guest (at 8 kbit/s, 100 ms, a 6.1
/// guest saw the first key's cell idle again before the ninth key came).
const RATE_BPS: u64 = 80;
const BURST: u64 = 10_000;
const LEN: usize = 100;

#[derive(Clone, Copy, Debug)]
enum Family {
    V4,
    V6,
}

impl Family {
    fn addr(self, i: u32) -> IpAddr {
        match self {
            Self::V4 => IpAddr::V4(Ipv4Addr::from(0xC612_0000 + i)),
            Self::V6 => IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, i as u16, 0, 0, 0, 1)),
        }
    }

    fn frame(self, addr: IpAddr) -> Vec<u8> {
        match addr {
            IpAddr::V4(a) => frame::ipv4_udp(a, LEN),
            IpAddr::V6(a) => {
                let f = frame::ipv6_udp(a, Ipv6Addr::LOCALHOST, LEN - 62);
                assert_eq!(f.len(), LEN);
                f
            }
        }
    }
}

/// One bucket, /128 IPv6 keys, no admission: every new key asks for a way.
fn harness() -> testrun::Harness {
    harness_of(SOURCE_WAYS as u32)
}

/// [`harness`] with room for `max_sources` keys.
fn harness_of(max_sources: u32) -> testrun::Harness {
    let rate = RateLimit::new(RATE_BPS, BURST).unwrap();
    let config = Config::new(rate, KEY_BY_SRC, 32, 128, 0).unwrap();
    testrun::Harness::new(Some(&config), max_sources).expect("load")
}

fn send(h: &mut testrun::Harness, family: Family, addr: IpAddr) {
    assert_eq!(h.run(&family.frame(addr)).expect("test_run"), XDP_PASS);
}

/// Every tracked key of the family with its state.
fn tracked(h: &testrun::Harness, family: Family) -> Vec<(IpAddr, SourceState)> {
    match family {
        Family::V4 => h
            .sources()
            .unwrap()
            .into_iter()
            .map(|(k, s)| (IpAddr::V4(Ipv4Addr::from(k.to_ne_bytes())), s))
            .collect(),
        Family::V6 => h
            .sources6()
            .unwrap()
            .into_iter()
            .map(|(k, s)| (IpAddr::V6(Ipv6Addr::from(k)), s))
            .collect(),
    }
}

fn state_of(h: &testrun::Harness, family: Family, addr: IpAddr) -> Option<SourceState> {
    tracked(h, family)
        .into_iter()
        .find(|(a, _)| *a == addr)
        .map(|(_, s)| s)
}

/// One frame passed, nothing else.
fn one_passed() -> Outcomes {
    Outcomes {
        passed_packets: 1,
        passed_bytes: LEN as u64,
        ..Outcomes::default()
    }
}

/// Replaces the state of resident `addr` with an idle cell (its TAT at 0) and counters of
/// its own, as the program left it long ago.
fn make_idle(h: &testrun::Harness, family: Family, addr: IpAddr) {
    let mut state = state_of(h, family, addr).expect("resident");
    state.cell.tat = 0;
    state.outcomes.passed_packets = 1_000;
    let placed = match addr {
        IpAddr::V4(a) => h.seed_sources(&[(u32::from_ne_bytes(a.octets()), state)]),
        IpAddr::V6(a) => h.seed_sources6(&[(a.octets(), state)]),
    }
    .unwrap();
    assert_eq!((placed.placed, placed.full), (1, 0), "{family:?}");
}

fn counters(h: &testrun::Harness) -> Counters {
    h.counters().unwrap()
}

#[test]
#[ignore = "needs root: loads programs into the kernel (cargo xtask test)"]
fn a_full_bucket_gives_a_newcomer_an_idle_way_or_the_unadmitted_cell() {
    for family in [Family::V4, Family::V6] {
        println!("{family:?}");
        let mut h = harness();
        let ways = SOURCE_WAYS as u32;
        // The eight ways fill, one key each.
        for i in 0..ways {
            send(&mut h, family, family.addr(i));
        }
        let c = counters(&h);
        assert_eq!(c.new_sources, u64::from(ways), "{family:?}");
        assert_eq!(tracked(&h, family).len(), SOURCE_WAYS);
        for i in 0..ways {
            let s = state_of(&h, family, family.addr(i)).expect("tracked");
            assert_eq!(s.outcomes, one_passed(), "{family:?} key {i}");
        }
        // No way idle: the newcomer is metered as unadmitted, every resident kept.
        let newcomer = family.addr(100);
        send(&mut h, family, newcomer);
        let c = counters(&h);
        assert_eq!(c.new_sources, u64::from(ways), "{family:?}: no way for it");
        assert_eq!(c.unadmitted, one_passed(), "{family:?}");
        assert_eq!(c.outcomes.passed_packets, u64::from(ways), "{family:?}");
        assert!(state_of(&h, family, newcomer).is_none(), "{family:?}");
        assert_eq!(tracked(&h, family).len(), SOURCE_WAYS);
        // Key 3's cell idle: the newcomer's next frame takes its way; key 3 and its
        // counters leave, the others stay as they were.
        let idle = family.addr(3);
        make_idle(&h, family, idle);
        send(&mut h, family, newcomer);
        let c = counters(&h);
        assert_eq!(c.new_sources, u64::from(ways) + 1, "{family:?}");
        assert_eq!(
            c.unadmitted,
            one_passed(),
            "{family:?}: unadmitted once only"
        );
        assert_eq!(c.outcomes.passed_packets, u64::from(ways) + 1);
        assert!(state_of(&h, family, idle).is_none(), "{family:?}: evicted");
        assert_eq!(
            state_of(&h, family, newcomer).map(|s| s.outcomes),
            Some(one_passed()),
            "{family:?}: the newcomer's own fresh counters"
        );
        for i in (0..ways).filter(|&i| i != 3) {
            let s = state_of(&h, family, family.addr(i)).expect("kept");
            assert_eq!(s.outcomes, one_passed(), "{family:?} key {i}");
        }
        assert_eq!(tracked(&h, family).len(), SOURCE_WAYS);
        // The evicted key comes back to a full bucket with none idle: unadmitted.
        send(&mut h, family, idle);
        let c = counters(&h);
        assert_eq!(c.new_sources, u64::from(ways) + 1, "{family:?}");
        assert_eq!(c.unadmitted.passed_packets, 2, "{family:?}");
    }
}

/// The hash of `addr`'s key under `seed`, as the program computes it.
fn hash_of(addr: IpAddr, seed: u64) -> u64 {
    match addr {
        IpAddr::V4(a) => hash_v4(u32::from_ne_bytes(a.octets()), seed),
        IpAddr::V6(a) => {
            let [hi, lo] = halves(&a.octets());
            hash_v6(hi, lo, seed)
        }
    }
}

/// The keys of each bucket of the family's table, by bucket.
fn layout(h: &testrun::Harness, family: Family) -> Vec<BTreeSet<IpAddr>> {
    match family {
        Family::V4 => h
            .buckets()
            .unwrap()
            .into_iter()
            .map(|b| {
                b.into_iter()
                    .map(|k| IpAddr::V4(Ipv4Addr::from(k.to_ne_bytes())))
                    .collect()
            })
            .collect(),
        Family::V6 => h
            .buckets6()
            .unwrap()
            .into_iter()
            .map(|b| {
                b.into_iter()
                    .map(|k| IpAddr::V6(Ipv6Addr::from(k)))
                    .collect()
            })
            .collect(),
    }
}

/// What a table of two buckets should hold, and the counters: kept beside the program's.
struct Expected {
    family: Family,
    buckets: Vec<BTreeSet<IpAddr>>,
    new_sources: u64,
    unadmitted: u64,
}

impl Expected {
    /// Sends `addr`'s first frame, which should give it a way of bucket `to` (taking the
    /// way of idle `evicted` if there is one), or none; then checks the table and counters.
    fn send(
        &mut self,
        h: &mut testrun::Harness,
        addr: IpAddr,
        to: Option<usize>,
        evicted: Option<IpAddr>,
        what: &str,
    ) {
        let family = self.family;
        send(h, family, addr);
        match to {
            Some(b) => {
                if let Some(gone) = evicted {
                    assert!(self.buckets[b].remove(&gone), "{gone} not in bucket {b}");
                }
                self.buckets[b].insert(addr);
                self.new_sources += 1;
            }
            None => self.unadmitted += 1,
        }
        assert_eq!(layout(h, family), self.buckets, "{family:?} {addr}: {what}");
        let c = counters(h);
        assert_eq!(c.new_sources, self.new_sources, "{family:?} {addr}: {what}");
        assert_eq!(
            c.unadmitted.passed_packets, self.unadmitted,
            "{family:?} {addr}: {what}"
        );
        // The keys' own frames (the unadmitted cell's apart): one each given a way.
        assert_eq!(
            c.outcomes.passed_packets, self.new_sources,
            "{family:?} {addr}: {what}"
        );
        if to.is_some() {
            assert_eq!(
                state_of(h, family, addr).map(|s| s.outcomes),
                Some(one_passed()),
                "{family:?} {addr}: {what}"
            );
        }
    }
}

/// A table of two buckets. A new key whose two buckets differ takes a free way of the one
/// with more of them (its first on a tie), of its second when its first is full; with both
/// full, an idle way of its first, else of its second, else none (the unadmitted cell).
/// Keys of both orders of the two buckets; the table read bucket by bucket at each step.
#[test]
#[ignore = "needs root: loads programs into the kernel (cargo xtask test)"]
fn a_new_key_is_given_the_room_of_either_of_its_two_buckets() {
    for family in [Family::V4, Family::V6] {
        println!("{family:?}");
        let mut h = harness_of(2 * SOURCE_WAYS as u32);
        let seed = h.seed().unwrap();
        // Keys by their (first, second) buckets.
        let mut by: HashMap<(u32, u32), Vec<IpAddr>> = HashMap::new();
        for i in 0.. {
            let addr = family.addr(i);
            let hash = hash_of(addr, seed);
            let keys = by
                .entry((bucket_of(hash, 2), second_bucket_of(hash, 2)))
                .or_default();
            if keys.len() < SOURCE_WAYS {
                keys.push(addr);
            }
            if by.len() == 4 && by.values().all(|k| k.len() == SOURCE_WAYS) {
                break;
            }
        }
        let (only0, only1) = (&by[&(0, 0)], &by[&(1, 1)]);
        let (k01, k10) = (&by[&(0, 1)], &by[&(1, 0)]);
        let mut e = Expected {
            family,
            buckets: vec![BTreeSet::new(), BTreeSet::new()],
            new_sources: 0,
            unadmitted: 0,
        };
        // Free ways: its first bucket's on a tie, else those of the one with more.
        e.send(&mut h, k01[0], Some(0), None, "a tie: its first");
        e.send(&mut h, k01[1], Some(1), None, "its second has more free");
        e.send(&mut h, k10[0], Some(1), None, "a tie: its first");
        e.send(&mut h, k10[1], Some(0), None, "its second has more free");
        for &k in &only0[..6] {
            e.send(&mut h, k, Some(0), None, "its one bucket");
        }
        // Its first bucket full: its second's free way.
        e.send(&mut h, k01[2], Some(1), None, "its first full");
        e.send(&mut h, k10[2], Some(1), None, "its first has more free");
        for &k in &only1[..4] {
            e.send(&mut h, k, Some(1), None, "its one bucket");
        }
        // Both full, no cell idle: the unadmitted cell, every key kept.
        e.send(&mut h, k01[3], None, None, "both full, none idle");
        e.send(&mut h, k10[3], None, None, "both full, none idle");
        // An idle way in its second bucket only: that way.
        make_idle(&h, family, only1[0]);
        e.send(
            &mut h,
            k01[3],
            Some(1),
            Some(only1[0]),
            "its second's idle way",
        );
        make_idle(&h, family, only0[0]);
        e.send(
            &mut h,
            k10[3],
            Some(0),
            Some(only0[0]),
            "its second's idle way",
        );
        // Idle ways in each (two in bucket 0): its first's, the first of them.
        for &k in &[only0[1], only0[2], only1[1]] {
            make_idle(&h, family, k);
        }
        e.send(
            &mut h,
            k01[4],
            Some(0),
            Some(only0[1]),
            "its first's idle way",
        );
        e.send(
            &mut h,
            k10[4],
            Some(1),
            Some(only1[1]),
            "its first's idle way",
        );
        e.send(
            &mut h,
            k10[5],
            Some(0),
            Some(only0[2]),
            "its second's idle way",
        );
        e.send(&mut h, k01[5], None, None, "none idle again");
        e.send(&mut h, k10[6], None, None, "none idle again");
    }
}

/// Two IPv6 keys of the same high half, low halves differing, whose tags (31 bits of their
/// seeded hash) are equal: the lookup can tell them apart by their whole key only.
fn same_tag_pair(seed: u64) -> (Ipv6Addr, Ipv6Addr) {
    let hi = halves(&Ipv6Addr::new(0x2001, 0xdb8, 0, 1, 0, 0, 0, 0).octets())[0];
    let mut seen = HashMap::new();
    for lo in 1u64.. {
        let tag = tag_v6(hash_v6(hi, lo, seed));
        if let Some(other) = seen.insert(tag, lo) {
            let addr = |lo| Ipv6Addr::from(join([hi, lo]));
            return (addr(other), addr(lo));
        }
    }
    unreachable!()
}

#[test]
#[ignore = "needs root: loads programs into the kernel (cargo xtask test)"]
fn an_ipv6_key_differing_only_in_its_low_half_is_a_key_of_its_own() {
    let mut h = harness();
    let (resident, low) = same_tag_pair(h.seed().unwrap());
    let [r, l] = [resident, low].map(|a| halves(&a.octets()));
    assert_eq!(r[0], l[0]);
    assert_ne!(r[1], l[1]);
    let high = Ipv6Addr::new(0x2001, 0xdb8, 0, 2, 0, 0, 0, 1);
    let family = Family::V6;
    send(&mut h, family, IpAddr::V6(resident));
    send(&mut h, family, IpAddr::V6(resident));
    for other in [low, high] {
        send(&mut h, family, IpAddr::V6(other));
    }
    let c = counters(&h);
    assert_eq!(c.new_sources, 3);
    let two = Outcomes {
        passed_packets: 2,
        passed_bytes: 2 * LEN as u64,
        ..Outcomes::default()
    };
    assert_eq!(
        state_of(&h, family, IpAddr::V6(resident)).map(|s| s.outcomes),
        Some(two)
    );
    for other in [low, high] {
        assert_eq!(
            state_of(&h, family, IpAddr::V6(other)).map(|s| s.outcomes),
            Some(one_passed()),
            "{other}"
        );
    }
}

/// Two CPUs' first frames of the same new keys, in step (as two senders' first frames to
/// one destination): each key is given one way and both its frames are counted in its
/// cell, none in the unadmitted one. A CPU that finds the key's bucket locked by the other
/// (claiming the same key) waits for it, then finds the key there.
#[test]
#[ignore = "needs root: loads programs into the kernel (cargo xtask test)"]
fn two_cpus_first_frames_of_a_key_both_land_in_its_one_cell() {
    const KEYS: u32 = 2_000;
    assert!(online_cpus() >= 2, "two CPUs are needed to race");
    for family in [Family::V4, Family::V6] {
        let h = harness_of(1 << 16);
        let frames: Vec<_> = (0..KEYS).map(|i| family.frame(family.addr(i))).collect();
        let arrived = AtomicU32::new(0);
        let prog = h.program().unwrap();
        // Each CPU's frames that did not pass (counted, not unwrapped: a thread that
        // stopped would leave the other waiting at the next key forever).
        let not_passed: Vec<usize> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..2)
                .map(|cpu| {
                    let (frames, arrived) = (&frames, &arrived);
                    s.spawn(move || {
                        pin_to_cpu(cpu).unwrap();
                        let mut not_passed = 0;
                        for (i, f) in (1..).zip(frames) {
                            arrived.fetch_add(1, Ordering::SeqCst);
                            while arrived.load(Ordering::SeqCst) < 2 * i {
                                std::hint::spin_loop();
                            }
                            not_passed +=
                                usize::from(testrun::test_run_xdp(prog, f, 1, XDP_PASS).is_err());
                        }
                        not_passed
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        let c = counters(&h);
        assert_eq!(c.unadmitted, Outcomes::default(), "{family:?}");
        assert_eq!(c.new_sources, u64::from(KEYS), "{family:?}");
        let two = Outcomes {
            passed_packets: 2,
            passed_bytes: 2 * LEN as u64,
            ..Outcomes::default()
        };
        let tracked = tracked(&h, family);
        assert_eq!(tracked.len(), KEYS as usize, "{family:?}");
        for (addr, state) in tracked {
            assert_eq!(state.outcomes, two, "{addr}");
        }
        assert_eq!(not_passed, [0, 0], "{family:?}");
    }
}

/// `bpf_attr` for `BPF_MAP_CREATE`, as far as a plain map needs it.
#[repr(C)]
struct MapCreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
}

/// The kernel memory (fdinfo `memlock`) of an LRU hash map of `entries` keys of
/// `key_size` bytes to a [`SourceState`]: the per-source maps of layout 10 and before.
fn lru_memlock(key_size: u32, entries: u32) -> u64 {
    const BPF_MAP_CREATE: libc::c_long = 0;
    const BPF_MAP_TYPE_LRU_HASH: u32 = 9;
    let attr = MapCreateAttr {
        map_type: BPF_MAP_TYPE_LRU_HASH,
        key_size,
        value_size: size_of::<SourceState>() as u32,
        max_entries: entries,
        map_flags: 0,
    };
    // SAFETY: `attr` is a valid, initialised bpf_attr prefix of the size passed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_CREATE,
            &raw const attr,
            size_of::<MapCreateAttr>() as libc::c_uint,
        )
    };
    assert!(
        fd >= 0,
        "BPF_MAP_CREATE: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: the kernel just returned this descriptor, and nothing else owns it.
    let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as i32) };
    let map = aya::maps::MapData::from_fd(fd).unwrap();
    testrun::memlock_of(&map).unwrap()
}

/// Kernel memory a tracked source costs at a million of each family, as the kernel counts
/// it (fdinfo `memlock`): under 96 bytes, where an LRU hash map's entry cost 144 (IPv4) and
/// 152 (IPv6), measured beside it.
#[test]
#[ignore = "needs root: loads programs into the kernel (cargo xtask test)"]
fn a_tracked_source_costs_under_96_bytes_of_kernel_memory_at_a_million() {
    const MILLION: u32 = 1_000_000;
    let rate = RateLimit::new(RATE_BPS, BURST).unwrap();
    let config = Config::new(rate, KEY_BY_SRC, 32, 128, 0).unwrap();
    let h = testrun::Harness::new(Some(&config), MILLION).expect("load");
    let per_source = |bytes: u64| bytes as f64 / f64::from(MILLION);
    for (name, lru_key) in [
        (shaper_common::maps::MAP_SOURCES, 4),
        (shaper_common::maps::MAP_SOURCES6, 16),
    ] {
        let table = h.memlock(name).unwrap();
        let lru = lru_memlock(lru_key, MILLION);
        println!(
            "{name}: {table} bytes, {:.1} a source (LRU hash map: {lru} bytes, {:.1} a source)",
            per_source(table),
            per_source(lru)
        );
        assert!(per_source(table) < 96.0, "{name}: {table} bytes");
        assert!(table < lru, "{name}");
    }
}

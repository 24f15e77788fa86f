//! The map types' userspace helpers that the tests beside them left open, found by `cargo
//! xtask mutants` (docs/contributing/testing.md): the per-CPU sums every counter of `stats`,
//! `top` and the metrics goes through, the outcome totals, the unmetered kinds, and the
//! flags' readers.

use std::mem::{size_of, transmute_copy};

use shaper_common::maps::{
    Admission, Counters, METER2_EXCESS, METER2_PACKETS, Meter2, Outcomes, PerCpuSum, PolicyStats,
    TC_MODE_CLSACT, TC_MODE_CLSACT_OWN, TC_MODE_TCX, XDP_MODE_NATIVE, XDP_MODE_SKB, is_tc_mode,
    sum_per_cpu,
};

/// Word `i` of CPU `cpu`'s entry: different in every field and on every CPU, and no sum
/// equal to a difference or a product.
fn word(cpu: u64, i: usize) -> u64 {
    (cpu + 1) * 1000 + i as u64 + 3
}

/// Sums three CPUs' entries of `T` (`N` words) and checks every word of the total.
fn assert_sums_by_word<T: PerCpuSum + Copy, const N: usize>() {
    assert_eq!(size_of::<T>(), N * 8);
    let cpus = [0, 1, 2];
    let entries: [T; 3] = cpus.map(|cpu| {
        let words: [u64; N] = std::array::from_fn(|i| word(cpu, i));
        // SAFETY: `T` is `#[repr(C)]`, all `u64` (fields and arrays), with no padding (its
        // size is asserted beside it) and of N words (asserted above): every `[u64; N]` is
        // a valid `T`, and the other way round.
        unsafe { transmute_copy(&words) }
    });
    let total: T = sum_per_cpu(&entries);
    // SAFETY: as above.
    let words: [u64; N] = unsafe { transmute_copy(&total) };
    for (i, w) in words.iter().enumerate() {
        let want: u64 = cpus.iter().map(|&cpu| word(cpu, i)).sum();
        assert_eq!(*w, want, "word {i} of {}", std::any::type_name::<T>());
    }
}

#[test]
fn per_cpu_entries_add_up_field_by_field() {
    assert_sums_by_word::<Counters, { size_of::<Counters>() / 8 }>();
    assert_sums_by_word::<PolicyStats, { size_of::<PolicyStats>() / 8 }>();
}

#[test]
fn outcomes_total_every_fate() {
    let o = Outcomes {
        passed_packets: 1,
        passed_bytes: 100,
        dropped_packets: 20,
        dropped_bytes: 2_000,
        would_drop_packets: 300,
        would_drop_bytes: 30_000,
    };
    assert_eq!((o.packets(), o.bytes()), (321, 32_100));
}

#[test]
fn unmetered_frames_are_named_as_stats_names_them() {
    let c = Counters {
        not_ip_packets: 1,
        not_ip_bytes: 2,
        pppoe_other_packets: 3,
        pppoe_other_bytes: 4,
        vlan_too_deep_packets: 5,
        vlan_too_deep_bytes: 6,
        malformed_packets: 7,
        malformed_bytes: 8,
        ..Counters::default()
    };
    assert_eq!(
        c.unmetered(),
        [
            ("not_ip", 1, 2),
            ("pppoe_other", 3, 4),
            ("vlan_too_deep", 5, 6),
            ("malformed", 7, 8)
        ]
    );
}

#[test]
fn flags_read_as_they_are_set() {
    let tc: Vec<bool> = [
        0,
        XDP_MODE_NATIVE,
        XDP_MODE_SKB,
        TC_MODE_TCX,
        TC_MODE_CLSACT,
        TC_MODE_CLSACT_OWN,
    ]
    .map(is_tc_mode)
    .into();
    assert_eq!(tc, [false, false, false, true, true, true]);
    assert!(!Meter2::default().any());
    for meters in [METER2_EXCESS, METER2_PACKETS] {
        assert!(
            Meter2 {
                meters,
                ..Meter2::default()
            }
            .any()
        );
    }
    assert!(!Admission::default().limited());
    let admission = Admission::new(100, 100).unwrap();
    assert!(admission.limited());
}

//! Upgrades in place, with two real builds: an earlier `shaper` (built from its commit by
//! `cargo xtask test`, see `shaper_lab::old_builds`) attaches, and the `shaper` under test
//! upgrades the attachment with `attach` and the same settings.
//!
//! What must hold: the link is the same link and now runs the new program; every
//! source's state (its cell's TAT and scale, its cached policy, its counters) is the same
//! bytes after as before; the global and per-policy counters read by the new build are
//! what the old build read; traffic running through the upgrade is metered frame for
//! frame (counters balance against what was sent) and no source gets its burst again;
//! an upgrade that cannot be done is refused in one line and changes nothing; and one
//! killed at any point leaves the old or the new attachment whole.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    os::fd::AsFd as _,
    path::{Path, PathBuf},
    process::{Command, Output},
    thread,
    time::{Duration, Instant},
};

use aya::maps::{Array, Map, MapData, PerCpuArray};
use serde_json::Value;
use shaper_common::{
    layout::LAYOUT_VERSION,
    maps::{
        AdmissionCells, Cell, Counters, METER2_UNUSED_ENTRIES, PIN_FIRSTS, PIN_LAYOUT, PIN_METER2,
        PIN_METER2_6, PIN_SOURCES, PIN_SOURCES6, PIN_SUBSCRIBERS, SourceState, Subscriber,
        sum_per_cpu,
    },
};
use shaper_lab::{
    bins::old_shaper,
    cli::{self, AttachGuard},
    lab::{Flow, Lab, LabOptions, RunOptions, run_udp_with},
};
use shaper_user::{bpf, maps, pins::Attachment, subscriber::Entry};

/// The settings every test attaches with, and a policy the old build sets.
const RATE: &str = "2mbit";
const RATE_BPS: u64 = 2_000_000;
const BURST: &str = "128k";
const BURST_BYTES: u64 = 131_072;
const POLICY_RATE: &str = "1mbit";
const POLICY_RATE_BPS: u64 = 1_000_000;
const FRAME: u32 = 1_000;

/// `BIN -n NS ARGS...`.
fn run(bin: &Path, ns: &str, args: &[&str]) -> Output {
    Command::new(bin)
        .args(["-n", ns])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display()))
}

/// `BIN -n NS ARGS...`, which must succeed; its standard output.
fn run_ok(bin: &Path, ns: &str, args: &[&str]) -> String {
    cli::run(bin, ns, args).unwrap_or_else(|e| panic!("{e:#}"))
}

/// `BIN -n NS -j ARGS...` as JSON.
fn json(bin: &Path, ns: &str, args: &[&str]) -> Value {
    let mut all = vec!["-j"];
    all.extend_from_slice(args);
    serde_json::from_str(&run_ok(bin, ns, &all)).unwrap()
}

/// The one line a refused command printed (it must have failed with exactly one).
fn refusal(out: &Output, what: &str) -> String {
    assert!(!out.status.success(), "{what}: should have been refused");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{what}: one line expected: {stderr}");
    println!("{what}: {}", lines[0]);
    lines[0].to_owned()
}

fn new_shaper() -> PathBuf {
    shaper_lab::bins::shaper().to_path_buf()
}

/// An interface attached by an old build, with a prefix policy (its own rate and an
/// aggregate) set by that build for the third source; detached (by the new build, which
/// detaches any layout) when dropped.
struct OldAttachment<'a> {
    lab: &'a Lab,
    at: Attachment,
    layout: u32,
    /// Settings of its own beyond [`settings`] ([`unusual`]), asked for again by the
    /// upgrade.
    more: Vec<&'static str>,
    _detach: AttachGuard,
}

impl<'a> OldAttachment<'a> {
    fn new(lab: &'a Lab, layout: u32) -> Self {
        Self::with(lab, layout, Vec::new(), &[])
    }

    /// [`OldAttachment::new`] attached with `more` settings and its policy set with
    /// `policy_more`.
    fn with(
        lab: &'a Lab,
        layout: u32,
        more: Vec<&'static str>,
        policy_more: &[&'static str],
    ) -> Self {
        let old = old_shaper(layout);
        let (ns, iface) = (lab.rx_ns(), lab.rx_iface());
        let this = OldAttachment {
            lab,
            at: Attachment::new(iface, Some(ns)),
            layout,
            more,
            _detach: AttachGuard::new(&new_shaper(), ns, iface),
        };
        let mut attach = vec!["attach", iface];
        attach.extend(settings(layout));
        attach.extend(&this.more);
        run_ok(&old, ns, &attach);
        let prefix = format!("{}/32", lab.sources()[2]);
        let mut policy = vec![
            "policy",
            "set",
            iface,
            &prefix,
            "--rate",
            POLICY_RATE,
            "--burst",
            BURST,
            "--aggregate-rate",
            POLICY_RATE,
            "--aggregate-burst",
            BURST,
        ];
        policy.extend(policy_more);
        run_ok(&old, ns, &policy);
        this
    }

    fn old(&self) -> PathBuf {
        old_shaper(self.layout)
    }

    /// `attach` with the settings it has, by the build under test.
    fn upgrade(&self) -> Output {
        self.upgrade_with(&[])
    }

    /// [`Self::upgrade`] with `env` set.
    fn upgrade_with(&self, env: &[(&str, &str)]) -> Output {
        let mut attach = vec!["attach", self.lab.rx_iface()];
        attach.extend(settings(self.layout));
        attach.extend(&self.more);
        Command::new(new_shaper())
            .args(["-n", self.lab.rx_ns()])
            .args(&attach)
            .envs(env.iter().copied())
            .output()
            .expect("run shaper")
    }
}

/// The settings every test attaches with: the rate and burst, and from layout 2 on
/// (new-source admission) an admission every source passes, so that its cell is charged.
fn settings(layout: u32) -> Vec<&'static str> {
    let mut args = vec!["--rate", RATE, "--burst", BURST];
    if layout >= 2 {
        args.extend(["--new-sources", "100", "--new-sources-burst", "100"]);
    }
    args
}

/// Settings of layout `layout` that are none of the defaults and leave the test's traffic
/// metered as it is (the attachment's and its policy's), so that a decoder that drops one
/// is seen: a smaller source table, and from layout 5 on (shaping) an ECN threshold and a
/// horizon, unused in enforce mode; the policy's own new-source admission, which its one
/// source stays within, from layout 2 on.
fn unusual(layout: u32) -> (Vec<&'static str>, Vec<&'static str>) {
    let mut attach = vec!["--max-sources", "8192"];
    if layout >= 8 {
        attach.extend(["--max-subscribers", "64"]);
    }
    if layout >= 5 {
        attach.extend(["--ecn-threshold", "3ms", "--horizon", "40ms"]);
    }
    let policy = if layout >= 2 {
        vec!["--new-sources", "50", "--new-sources-burst", "60"]
    } else {
        Vec::new()
    };
    (attach, policy)
}

/// Asserts that every field of `old`'s row (an old build's `-j` output) but those in `skip`
/// has the same value in `new`'s, and that at least `at_least` were compared.
fn same_fields(what: &str, old: &Value, new: &Value, skip: &[&str], at_least: usize) {
    let mut compared = 0;
    for (key, value) in old.as_object().unwrap() {
        if skip.contains(&key.as_str()) {
            continue;
        }
        assert_eq!(
            Some(value),
            new.get(key),
            "{what}: {key} was {value}\nold: {old}\nnew: {new}"
        );
        compared += 1;
    }
    assert!(
        compared >= at_least,
        "{what}: only {compared} fields compared"
    );
}

/// Every cell the program keeps, read from the pinned maps (the same types in every
/// layout): each source's state in both families, and each policy slot's aggregate cell
/// and admission cells (the latter from layout 2 on) where they are not all zero.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Cells {
    v4: BTreeMap<Ipv4Addr, SourceState>,
    v6: BTreeMap<Ipv6Addr, SourceState>,
    aggregates: BTreeMap<u32, Cell>,
    admission: BTreeMap<u32, AdmissionCells>,
    /// The first-sighting allowance's cells (layout 6 on).
    firsts: BTreeMap<u32, Cell>,
}

fn cells(at: &Attachment) -> Cells {
    Cells {
        v4: maps::read_sources(at).unwrap().into_iter().collect(),
        v6: maps::read_sources6(at).unwrap().into_iter().collect(),
        aggregates: slots(&at.aggregates()),
        admission: if at.admission().exists() {
            slots(&at.admission())
        } else {
            BTreeMap::new()
        },
        firsts: if at.dir().join(PIN_FIRSTS).exists() {
            slots(&at.dir().join(PIN_FIRSTS))
        } else {
            BTreeMap::new()
        },
    }
}

/// The entries of the array map pinned at `pin` that are not all zero, by index.
fn slots<T: aya::Pod + Default + PartialEq>(pin: &Path) -> BTreeMap<u32, T> {
    let map = Map::from_map_data(MapData::from_pin(pin).unwrap()).unwrap();
    let array: Array<MapData, T> = Array::try_from(map).unwrap();
    (0..array.len())
        .map(|slot| (slot, array.get(&slot, 0).unwrap()))
        .filter(|(_, cell)| *cell != T::default())
        .collect()
}

/// Asserts that the cells after an upgrade are the cells before, map by map, and that
/// the comparison covered every kind: sources of both families, an aggregate and (from
/// layout 2 on) admission cells.
fn same_cells(what: &str, before: &Cells, after: &Cells, layout: u32) {
    assert_eq!(after.v4, before.v4, "{what}: IPv4 sources changed");
    assert_eq!(after.v6, before.v6, "{what}: IPv6 sources changed");
    assert_eq!(
        after.aggregates, before.aggregates,
        "{what}: aggregate cells changed"
    );
    assert_eq!(
        after.admission, before.admission,
        "{what}: admission cells changed"
    );
    assert_eq!(
        after.firsts, before.firsts,
        "{what}: first-sighting cells changed"
    );
    assert!(
        !before.v4.is_empty() && !before.v6.is_empty() && !before.aggregates.is_empty(),
        "{what}: nothing to compare: {before:?}"
    );
    assert_eq!(
        before.admission.is_empty(),
        layout < 2,
        "{what}: {before:?}"
    );
}

/// The id of the pinned link and of the program it runs.
fn link(at: &Attachment) -> (u32, u32) {
    let fd = bpf::obj_get(&at.link()).unwrap();
    let info = bpf::xdp_link_info(fd.as_fd()).unwrap();
    (info.id, info.prog_id)
}

/// What a build says of the interface: its `stats` totals and its `policy list` rows.
fn counters(bin: &Path, lab: &Lab) -> (Value, Value) {
    let stats = json(
        bin,
        lab.rx_ns(),
        &["stats", lab.rx_iface(), "--top", "1000"],
    );
    let policies = json(bin, lab.rx_ns(), &["policy", "list", lab.rx_iface()]);
    (stats["totals"].clone(), policies)
}

/// Asserts that every number the old build reported is the same in the new build's
/// report (the new one has more: counters the old layout did not keep), and that at least
/// `at_least` were compared.
fn same_numbers(what: &str, old: &Value, new: &Value, at_least: usize) {
    let old = old.as_object().unwrap();
    let mut compared = 0;
    for (key, value) in old.iter().filter(|(_, v)| v.is_u64()) {
        let Some(now) = new.get(key) else { continue };
        assert_eq!(value, now, "{what}: {key} was {value}, is {now}");
        compared += 1;
    }
    assert!(
        compared >= at_least,
        "{what}: only {compared} numbers in common: {old:?} / {new:?}"
    );
}

/// Traffic from the lab's sources: the first two and the third (under the policy) at four
/// times their limit, the fourth at half the rate.
fn flows(lab: &Lab) -> Vec<Flow> {
    let offered = [
        4 * RATE_BPS,
        4 * RATE_BPS,
        4 * POLICY_RATE_BPS,
        RATE_BPS / 2,
    ];
    lab.flows(&offered, FRAME)
}

/// Upgrades an attachment of pin layout `layout` with no traffic running, and checks that
/// everything is the same bytes after.
fn upgrade_keeps_every_cell_and_counter(layout: u32) {
    let options = LabOptions {
        ipv6: true,
        ..LabOptions::default()
    };
    // The fifth source sends only after the swap.
    let lab = Lab::with("upgr", 5, options).unwrap();
    let (more, policy_more) = unusual(layout);
    let old = OldAttachment::with(&lab, layout, more, &policy_more);
    if layout >= 8 {
        set_subscribers(&old);
    }
    // Some traffic first, so cells are charged and counters count: IPv4, then IPv6.
    charge_both_families(&lab);

    let status = &json(&new_shaper(), lab.rx_ns(), &["status", lab.rx_iface()])[0];
    assert_eq!(status["layout_version"], layout, "{status}");
    assert_eq!(status["rate_bits_per_sec"], RATE_BPS);
    // Every setting the old build shows of its attachment, as this build decodes it from
    // the old pins (the key counts aside: the lab's own IPv6 may add `::` at any time).
    const COUNTS: [&str; 3] = [
        "sources_tracked",
        "ipv4_sources_tracked",
        "ipv6_sources_tracked",
    ];
    let old_status = json(&old.old(), lab.rx_ns(), &["status", lab.rx_iface()])[0].clone();
    same_fields(
        "status before the upgrade",
        &old_status,
        status,
        &COUNTS,
        11,
    );
    let cells_before = cells(&old.at);
    let subscribers_before = (layout >= 8).then(|| {
        let list = json(
            &old.old(),
            lab.rx_ns(),
            &["subscriber", "list", lab.rx_iface()],
        );
        (subscriber_entries(&old.at), list)
    });
    let (old_totals, old_policies) = counters(&old.old(), &lab);
    let (link_id, old_prog) = link(&old.at);
    // Of the maps an older layout has (layout 7 made the first sightings', layout 8 the
    // second meter's, ...): those it lacks are made at the upgrade, at the room it had.
    let policy_room = |at: &Attachment| -> Vec<(&str, u32)> {
        shaper_common::layout::current()
            .maps
            .iter()
            .filter(|m| shaper_common::maps::SIZED_BY_POLICIES.contains(&m.name))
            .filter_map(|m| {
                let info = bpf::map_info(&at.dir().join(m.pin)).ok()?;
                Some((m.name, info.max_entries))
            })
            .collect()
    };
    let room_before = policy_room(&old.at);

    let out = old.upgrade();
    assert!(
        out.status.success(),
        "upgrade: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout);
    println!("{}", said.trim());
    assert!(said.starts_with("upgraded"), "{said}");

    let (link_after, new_prog) = link(&old.at);
    assert_eq!(link_after, link_id, "the same link, never detached");
    assert_ne!(new_prog, old_prog, "the link runs the new program");
    assert!(lab.xdp_attached().unwrap());
    // Every layout before 10 had 16,384 slots of each policy map, layout 10 its room
    // sized at attach: the room is kept.
    if layout < 10 {
        assert!(
            room_before.iter().all(|&(_, n)| n == 16_384),
            "{room_before:?}"
        );
    }
    let room_after = policy_room(&old.at);
    assert_eq!(
        room_after.len(),
        shaper_common::maps::SIZED_BY_POLICIES.len(),
        "{room_after:?}"
    );
    let room = room_before.first().map_or(16_384, |&(_, n)| n);
    assert!(
        room_after.iter().all(|&(_, n)| n == room),
        "the policy maps' room: {room_after:?}, {room_before:?} before"
    );
    let cells_after = cells(&old.at);
    // The lab's own IPv6 duplicate address detection sends from `::` (now and then twice
    // after the attach: the doorkeeper of layout 6 on then gives it a cell too).
    let v6 = cells_after
        .v6
        .keys()
        .filter(|a| !a.is_unspecified())
        .count();
    assert_eq!(
        (cells_after.v4.len(), v6),
        (4, 2),
        "IPv6 before {:?}, after {:?}",
        cells_before.v6.keys().collect::<Vec<_>>(),
        cells_after.v6.keys().collect::<Vec<_>>()
    );
    same_cells("upgrade", &cells_before, &cells_after, layout);
    if let Some((entries, list)) = &subscribers_before {
        same_subscribers(&old, entries, list);
    }
    let status = &json(&new_shaper(), lab.rx_ns(), &["status", lab.rx_iface()])[0];
    assert_eq!(status["layout_version"], LAYOUT_VERSION);
    assert_eq!(status["upgrade_interrupted"], false);
    // The second meter's per-key maps, new in layout 7, were made at their smallest: no
    // policy has a second meter.
    for pin in [PIN_METER2, PIN_METER2_6] {
        let info = bpf::map_info(&old.at.dir().join(pin)).unwrap();
        assert_eq!(info.max_entries, METER2_UNUSED_ENTRIES, "{pin}");
    }
    // The maps new in layout 5 (`shaper watch`'s) were made, empty: nobody watches.
    let (control, meter) = shaper_user::watch::read_control(&old.at).unwrap();
    assert_eq!((control.until, meter.cell.tat), (0, 0));
    assert!(
        shaper_user::watch::open_events(&old.at)
            .unwrap()
            .next()
            .is_none()
    );
    assert_eq!(
        (&status["rate_bits_per_sec"], &status["burst_bytes"]),
        (&RATE_BPS.into(), &BURST_BYTES.into())
    );
    // And as this build reads them from its own pins after the upgrade.
    let skip = [&COUNTS[..], &["layout_version"]].concat();
    same_fields("status after the upgrade", &old_status, status, &skip, 10);
    let (new_totals, new_policies) = counters(&new_shaper(), &lab);
    same_numbers("stats totals", &old_totals, &new_totals, 16);
    assert_eq!(new_policies.as_array().unwrap().len(), 2);
    for (old_row, new_row) in old_policies
        .as_array()
        .unwrap()
        .iter()
        .zip(new_policies.as_array().unwrap())
    {
        // Every field: the policy's settings (its mode, rates, admission) and its counts.
        same_fields("policy list", old_row, new_row, &[], 14);
    }
    // Nothing of the old pins or of the staging is left.
    assert!(!old.at.staging().exists());
    assert!(!old.at.upgrade_prog().exists());
    // Policies work as ever; a policy set again in the freed slot starts from zero, not
    // from what was carried for the slot's last policy.
    let prefix = format!("{}/32", lab.sources()[2]);
    run_ok(
        &new_shaper(),
        lab.rx_ns(),
        &["policy", "del", lab.rx_iface(), &prefix],
    );
    run_ok(
        &new_shaper(),
        lab.rx_ns(),
        &[
            "policy",
            "set",
            lab.rx_iface(),
            &prefix,
            "--rate",
            POLICY_RATE,
            "--burst",
            BURST,
        ],
    );
    let (_, policies) = counters(&new_shaper(), &lab);
    assert_eq!(policies[1]["passed_packets"], 0, "{policies}");
    assert_eq!(policies[1]["dropped_packets"], 0, "{policies}");
    new_keys_after_the_swap(&lab);
}

/// Subscribers set by the old build of `old` (layout 8 on): one of an IPv4 address (the
/// fourth source, which sends), one of an IPv6 /64 (the second IPv6 source's, which
/// sends) and an IPv4 /24, named, and one removed (a tombstone, which its probes go past).
fn set_subscribers(old: &OldAttachment) {
    let (ns, iface) = (old.lab.rx_ns(), old.lab.rx_iface());
    let v4 = format!("{}/32", old.lab.sources()[3]);
    let s = old.lab.sources6()[1].segments();
    let v6 = format!("{}/64", Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0));
    let set = |id: &str, name: &str, prefixes: &[&str], rate: &str| {
        let mut args = vec!["subscriber", "set", iface, id, "--name", name];
        for p in prefixes {
            args.extend(["--prefix", p]);
        }
        args.extend(["--rate", rate, "--burst", "64k"]);
        run_ok(&old.old(), ns, &args);
    };
    set("gone", "", &["10.98.0.0/24"], "5mbit");
    set("s-v4", "Four", &[&v4], "1500kbit");
    set("s-v6:a/b", "Six, and more", &[&v6, "10.99.0.0/24"], "3mbit");
    run_ok(&old.old(), ns, &["subscriber", "del", iface, "gone"]);
}

/// Every entry of `at`'s subscribers' table ever used (with entry 0's marker), as the
/// pins hold it: in layout 8 the entry itself, from layout 9 on the kernel's entry joined
/// with its record (its id and name), each record checked against its entry.
fn subscriber_entries(at: &Attachment) -> BTreeMap<u32, Entry> {
    use shaper_user::subscriber::record::{self, Records};
    let pin = at.dir().join(PIN_SUBSCRIBERS);
    // None before layout 8, or no room for any: none.
    let Ok(info) = bpf::map_info(&pin) else {
        return BTreeMap::new();
    };
    if info.max_entries <= 1 {
        return BTreeMap::new();
    }
    if info.value_size as usize == size_of::<Entry>() {
        return slots::<Entry>(&pin);
    }
    let records = Records::open(&record::path_of(at), info.id).unwrap();
    let all = records.read_run(0, info.max_entries).unwrap();
    slots::<Subscriber>(&pin)
        .into_iter()
        .map(|(i, s)| (i, record::join(i, &s, &all[i as usize]).unwrap()))
        .collect()
}

/// Asserts that the subscribers after an upgrade are those before: every entry ever used,
/// field by field (cells, counts, plan, prefixes counted, id and name; the tombstone and
/// the marker), and every field of each `subscriber list` row the old build gave.
fn same_subscribers(old: &OldAttachment, before: &BTreeMap<u32, Entry>, list: &Value) {
    let after = subscriber_entries(&old.at);
    assert_eq!(&after, before, "the subscribers' entries changed");
    // What was compared: the marker, a tombstone, two in use, both charged and counted.
    let in_use: Vec<&Entry> = before.values().filter(|e| e.in_use != 0).collect();
    assert_eq!((before.len(), in_use.len()), (4, 2), "{before:?}");
    assert!(
        in_use
            .iter()
            .all(|e| e.cell.tat != 0 && e.outcomes.passed_packets > 0),
        "{in_use:?}"
    );
    let new_list = json(
        &new_shaper(),
        old.lab.rx_ns(),
        &["subscriber", "list", old.lab.rx_iface()],
    );
    let (rows, new_rows) = (list.as_array().unwrap(), new_list.as_array().unwrap());
    assert_eq!(rows.len(), 2, "{list}");
    assert_eq!(rows.len(), new_rows.len(), "{new_list}");
    for (row, new_row) in rows.iter().zip(new_rows) {
        same_fields("subscriber list", row, new_row, &[], 10);
    }
    let v6 = &rows.iter().find(|r| r["id"] == "s-v6:a/b").unwrap()["prefixes"];
    assert!(v6.to_string().contains("::/64"), "{v6}");
}

/// Traffic after an upgrade from keys new to the table, of both families (an IPv4 source
/// and an IPv6 /64 that sent nothing before): each metered by the new program, every
/// frame once, what it passed what arrived, and no more than its limit.
fn new_keys_after_the_swap(lab: &Lab) {
    let before = counters(&new_shaper(), lab).0;
    // One run a family (the lab's sender sends one family a run).
    let mut results = Vec::new();
    for src in [IpAddr::from(lab.sources()[4]), lab.sources6()[2].into()] {
        let flow = Flow {
            src,
            offered_bps: 4 * RATE_BPS,
            frame_bytes: FRAME,
        };
        let report = run_udp_with(
            lab,
            &[flow],
            Duration::from_millis(300),
            &RunOptions::default(),
        )
        .unwrap();
        assert_eq!((report.path_drops, report.receiver_drops), (0, 0));
        results.push((flow, report.flows[0].clone()));
    }
    let stats = json(
        &new_shaper(),
        lab.rx_ns(),
        &["stats", lab.rx_iface(), "--top", "1000"],
    );
    let n = |v: &Value, key: &str| v[key].as_u64().unwrap();
    let unadmitted = n(&stats["totals"], "unadmitted_packets") - n(&before, "unadmitted_packets");
    let mut firsts = 0;
    for (flow, result) in &results {
        let key = match flow.src {
            IpAddr::V4(a) => a.to_string(),
            IpAddr::V6(a) => format!("{}/64", Ipv6Addr::from(u128::from(a) & !0 << 64)),
        };
        let r = stats["top_sources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["source"] == key)
            .unwrap_or_else(|| panic!("{key}, new after the upgrade, not in stats"));
        let metered = n(r, "passed_packets") + n(r, "dropped_packets");
        // Its first frame, if the doorkeeper metered it unadmitted, is in the totals only.
        let first = result.sent_packets - metered;
        let first_passed = result.received_packets - n(r, "passed_packets");
        assert!(
            first <= 1 && first_passed <= first,
            "{key}: {first} unmetered"
        );
        assert_eq!(
            n(r, "passed_bytes") + first_passed * u64::from(FRAME),
            result.received_l2_bytes,
            "{key}: what shaper passed is not what arrived"
        );
        // Limited: at most one burst and the rate over the time its frames arrived (a
        // sender slowed by emulation may not overload it: no drop is required).
        let most = BURST_BYTES as f64 + RATE_BPS as f64 / 8.0 * result.received_span_secs();
        assert!(
            result.received_l2_bytes as f64 <= most + f64::from(FRAME),
            "{key}: {} bytes passed, the limit allows {most:.0}",
            result.received_l2_bytes
        );
        firsts += first;
    }
    assert_eq!(firsts, unadmitted, "frames metered unadmitted");
}

#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn an_upgrade_from_layout_1_keeps_every_cell_and_counter() {
    upgrade_keeps_every_cell_and_counter(1);
}

#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn an_upgrade_from_layout_2_keeps_every_cell_and_counter() {
    upgrade_keeps_every_cell_and_counter(2);
}

#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn an_upgrade_from_layout_4_keeps_every_cell_and_counter() {
    upgrade_keeps_every_cell_and_counter(4);
}

#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn an_upgrade_from_layout_5_keeps_every_cell_and_counter() {
    upgrade_keeps_every_cell_and_counter(5);
}

#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn an_upgrade_from_layout_6_keeps_every_cell_and_counter() {
    upgrade_keeps_every_cell_and_counter(6);
}

#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn an_upgrade_from_layout_7_keeps_every_cell_and_counter() {
    upgrade_keeps_every_cell_and_counter(7);
}

#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn an_upgrade_from_layout_8_keeps_every_cell_counter_and_subscriber() {
    upgrade_keeps_every_cell_and_counter(8);
}

/// Layout 9's maps are all reused, its policy maps at their 16,384 slots.
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn an_upgrade_from_layout_9_keeps_every_cell_counter_and_subscriber() {
    upgrade_keeps_every_cell_and_counter(9);
}

/// Layout 10's per-source LRU hash maps: every key, its cell and counters, moved into the
/// tables of buckets (both families compared before and after).
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn an_upgrade_from_layout_10_moves_every_source_into_the_tables() {
    upgrade_keeps_every_cell_and_counter(10);
}

/// How long an upgrade in the middle of traffic is held after the sources' copy (the old
/// program still metering) and after the switch (the new one metering before the top-up):
/// were the copy not topped up before the switch, the new program would pass again what
/// the old one charged in the first hold, 100,000 bytes of a 2 Mbit/s source's.
const HOLD: Duration = Duration::from_millis(400);

/// The upgrade's two hold points ([`HOLD`]), each a file held while it exists.
struct Holds {
    dir: PathBuf,
}

impl Holds {
    const STEPS: [&str; 2] = ["upgrade-copied", "upgrade-switched"];

    fn new(layout: u32) -> Self {
        let dir = std::env::temp_dir().join(format!("shaper-upgt-{}-{layout}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for step in Self::STEPS {
            std::fs::write(dir.join(step), "").unwrap();
        }
        Self { dir }
    }

    /// `SHAPER_TEST_HOLD_AT`'s value.
    fn var(&self) -> String {
        Self::STEPS
            .map(|step| format!("{step}:{}", self.dir.join(step).display()))
            .join(",")
    }

    /// Lets each hold go [`HOLD`] after the upgrade reached it, in order.
    fn release(&self) {
        for step in Self::STEPS {
            let held = self.dir.join(format!("{step}.held"));
            let deadline = Instant::now() + Duration::from_secs(60);
            while !held.exists() {
                assert!(
                    Instant::now() < deadline,
                    "the upgrade never reached {step}"
                );
                thread::sleep(Duration::from_millis(5));
            }
            thread::sleep(HOLD);
            std::fs::remove_file(self.dir.join(step)).unwrap();
        }
    }
}

impl Drop for Holds {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Upgrades an attachment of pin layout `layout` in the middle of live traffic, held
/// [`HOLD`] between the copy of its sources and the switch, and again after the switch.
fn traffic_through_an_upgrade(layout: u32) {
    let lab = Lab::new("upgt", 4).unwrap();
    // The traffic lasts well beyond an upgrade, however long one takes on this machine
    // now (its verification is most of it, and a busy machine stretches it).
    let took = {
        let old = OldAttachment::new(&lab, layout);
        let start = Instant::now();
        assert!(old.upgrade().status.success());
        start.elapsed().as_secs_f64()
    };
    let secs = (4.0f64).max(3.0 * took + 1.0) + 2.0 * HOLD.as_secs_f64();
    println!(
        "an upgrade takes {:.0} ms here: {secs:.1} s of traffic",
        took * 1e3
    );
    let old = OldAttachment::new(&lab, layout);
    let flows = flows(&lab);
    let (report, upgraded_after) = thread::scope(|s| {
        let traffic = s.spawn(|| {
            run_udp_with(
                &lab,
                &flows,
                Duration::from_secs_f64(secs),
                &RunOptions::default(),
            )
        });
        let start = Instant::now();
        // Late enough that every overloaded bucket is drained, early enough that the
        // program is swapped while traffic runs (the verifier alone takes a while).
        thread::sleep(Duration::from_secs_f64(secs / 6.0));
        let holds = Holds::new(layout);
        let out = thread::scope(|s| {
            s.spawn(|| holds.release());
            old.upgrade_with(&[(shaper_user::crash::HOLD_AT_VAR, &holds.var())])
        });
        let upgraded_after = start.elapsed();
        assert!(
            out.status.success(),
            "upgrade: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        (traffic.join().unwrap().unwrap(), upgraded_after)
    });
    println!(
        "upgraded {:.3} s into {secs:.1} s of traffic",
        upgraded_after.as_secs_f64()
    );
    assert_eq!(
        (report.path_drops, report.receiver_drops),
        (0, 0),
        "frames were lost outside shaper: nothing can balance"
    );

    let stats = json(
        &new_shaper(),
        lab.rx_ns(),
        &["stats", lab.rx_iface(), "--top", "1000"],
    );
    let rows = stats["top_sources"].as_array().unwrap();
    let row = |src: IpAddr| {
        rows.iter()
            .find(|r| r["source"] == src.to_string())
            .unwrap_or_else(|| panic!("{src} not in stats"))
    };
    let n = |v: &Value, key: &str| v[key].as_u64().unwrap();
    let totals = &stats["totals"];
    // From layout 6 on, new-source admission's doorkeeper meters a key's first frame
    // unadmitted (in its policy's shared cell, not the key's): counted in the totals, not
    // in the key's row.
    let (mut unadmitted, mut unadmitted_passed) = (0, 0);
    for (flow, result) in flows.iter().zip(&report.flows) {
        let r = row(flow.src);
        let metered = n(r, "passed_packets") + n(r, "dropped_packets");
        let first = result.sent_packets - metered;
        let first_passed = result.received_packets - n(r, "passed_packets");
        // Every frame sent was metered once, by one program or the other.
        assert!(
            first <= u64::from(layout >= 6),
            "{}: {} frames sent and {metered} metered",
            flow.src,
            result.sent_packets
        );
        assert!(first_passed <= first);
        assert_eq!(
            n(r, "passed_bytes") + first_passed * u64::from(FRAME),
            result.received_l2_bytes,
            "{}: what shaper passed is not what arrived",
            flow.src
        );
        unadmitted += first;
        unadmitted_passed += first_passed;
    }
    assert_eq!(
        (unadmitted, unadmitted_passed),
        (
            n(totals, "unadmitted_packets"),
            n(totals, "unadmitted_passed_packets")
        ),
        "frames metered unadmitted"
    );
    // No bucket was refilled: an overloaded source got its rate over the time its frames
    // passed (by the kernel's receive timestamps of the first and the last) plus one
    // burst (from idle at the start), not two.
    for (flow, result, rate) in [
        (&flows[0], &report.flows[0], RATE_BPS),
        (&flows[1], &report.flows[1], RATE_BPS),
        (&flows[2], &report.flows[2], POLICY_RATE_BPS),
    ] {
        let span = result.received_span_secs();
        let expected = rate as f64 / 8.0 * span + BURST_BYTES as f64;
        let got = result.received_l2_bytes as f64;
        println!(
            "{}: received {got} bytes, rate x {span:.3} s + one burst is {expected:.0} ({:+.0} bytes; a refill would add {BURST_BYTES})",
            flow.src,
            got - expected,
        );
        // GCRA passes at most this and at least this less a frame gap (a millisecond at
        // these rates); a quarter of a burst is well clear of both, and of what the
        // old program charged in the first hold (100,000 bytes), which the new one would
        // pass again in the second were it not topped up before the switch.
        assert!(
            (got - expected).abs() < BURST_BYTES as f64 / 4.0,
            "{}: {:+.0} bytes from rate x time + one burst",
            flow.src,
            got - expected
        );
    }
    // Both programs metered the traffic: the old one until the swap (its counts were
    // carried over to the new counters, as the totals below show), the new one after.
    let live: PerCpuArray<MapData, Counters> = PerCpuArray::try_from(
        Map::from_map_data(MapData::from_pin(old.at.counters()).unwrap()).unwrap(),
    )
    .unwrap();
    let counters: Counters = sum_per_cpu(live.get(&0, 0).unwrap().iter());
    assert!(
        counters.outcomes.passed_packets > 0,
        "the new program metered nothing: the upgrade ended after the traffic"
    );
    let quiet = &report.flows[3];
    assert_eq!(quiet.received_packets, quiet.sent_packets);

    // The global counters (carried over from every older layout: they changed in each) balance
    // against every source's (what was metered unadmitted is counted apart, above).
    let sum = |key: &str| rows.iter().map(|r| n(r, key)).sum::<u64>();
    for key in [
        "passed_packets",
        "passed_bytes",
        "dropped_packets",
        "dropped_bytes",
    ] {
        assert_eq!(
            n(totals, key),
            sum(key),
            "totals {key} against the sources'"
        );
    }
    assert_eq!(n(totals, "unconfigured_packets"), 0);
    assert_eq!(n(totals, "untracked_packets"), 0);
    // The policy's counters too: its one source's.
    let policies = json(
        &new_shaper(),
        lab.rx_ns(),
        &["policy", "list", lab.rx_iface()],
    );
    let policy = &policies[1];
    let limited = row(flows[2].src);
    for key in ["passed_packets", "dropped_packets", "passed_bytes"] {
        assert_eq!(n(policy, key), n(limited, key), "policy {key}");
    }
    assert!(n(policy, "aggregate_refused_packets") == 0 || n(policy, "dropped_packets") > 0);
}

#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn traffic_through_an_upgrade_from_layout_1_is_all_metered_and_never_refilled() {
    traffic_through_an_upgrade(1);
}

#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn traffic_through_an_upgrade_from_layout_2_is_all_metered_and_never_refilled() {
    traffic_through_an_upgrade(2);
}

#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn traffic_through_an_upgrade_from_layout_4_is_all_metered_and_never_refilled() {
    traffic_through_an_upgrade(4);
}

#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn traffic_through_an_upgrade_from_layout_5_is_all_metered_and_never_refilled() {
    traffic_through_an_upgrade(5);
}

#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn traffic_through_an_upgrade_from_layout_6_is_all_metered_and_never_refilled() {
    traffic_through_an_upgrade(6);
}

#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn traffic_through_an_upgrade_from_layout_7_is_all_metered_and_never_refilled() {
    traffic_through_an_upgrade(7);
}

#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn traffic_through_an_upgrade_from_layout_10_is_all_metered_and_never_refilled() {
    traffic_through_an_upgrade(10);
}

/// The version recorded in an attachment's `layout` map, overwritten.
fn set_layout_version(at: &Attachment, version: u32) {
    let map = Map::from_map_data(MapData::from_pin(at.layout()).unwrap()).unwrap();
    let mut array: Array<MapData, u32> = Array::try_from(map).unwrap();
    array.set(0, version, 0).unwrap();
}

#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn upgrades_that_cannot_be_done_are_refused_in_one_line_and_change_nothing() {
    let lab = Lab::new("upgn", 4).unwrap();
    let (ns, iface) = (lab.rx_ns(), lab.rx_iface());
    let new = new_shaper();
    let old = OldAttachment::new(&lab, 1);
    let command = format!("shaper -n {ns} attach {iface} --rate {RATE} --burst {BURST}");

    // What needs today's layout says how to get it.
    let needs_today: [&[&str]; 5] = [
        &["stats", iface],
        &["policy", "list", iface],
        &["config", "show", iface],
        &["policy", "set", iface, "10.0.0.0/8", "--action", "pass"],
        &["policy", "del", iface, &format!("{}/32", lab.sources()[2])],
    ];
    for args in needs_today {
        let line = refusal(&run(&new, ns, args), &args.join(" "));
        assert!(
            line.contains("attached by an older shaper (pin layout 1") && line.contains(&command),
            "{line}"
        );
    }
    // An upgrade that would also change something.
    for (args, says) in [
        (
            vec!["attach", iface, "--rate", "4mbit", "--burst", BURST],
            "its settings as they are",
        ),
        (
            vec![
                "attach", iface, "--rate", RATE, "--burst", BURST, "--mode", "monitor",
            ],
            "its settings as they are",
        ),
        (
            vec![
                "attach",
                iface,
                "--rate",
                RATE,
                "--burst",
                BURST,
                "--max-sources",
                "1024",
            ],
            "detach first to make them smaller",
        ),
    ] {
        let line = refusal(&run(&new, ns, &args), &args.join(" "));
        assert!(line.contains(says), "{line}");
    }
    let file = std::env::temp_dir().join(format!("shaper-upgrade-{}.toml", std::process::id()));
    std::fs::write(
        &file,
        format!("[[interface]]\nname = \"{iface}\"\nrate = \"{RATE}\"\nburst = \"{BURST}\"\n"),
    )
    .unwrap();
    let line = refusal(
        &run(&new, ns, &["apply", "-f", file.to_str().unwrap()]),
        "apply",
    );
    std::fs::remove_file(&file).unwrap();
    assert!(line.contains(&command), "{line}");
    // Nothing changed: the old build still reads its attachment, as it was.
    let status = &json(&new, ns, &["status", iface])[0];
    assert_eq!(status["layout_version"], 1);
    assert_eq!(status["rate_bits_per_sec"], RATE_BPS);
    assert!(!old.at.staging().exists());
    let policies = json(&old.old(), ns, &["policy", "list", iface]);
    assert_eq!(policies.as_array().unwrap().len(), 2);

    // Pins that match no layout: one map of layout 1 missing.
    std::fs::remove_file(old.at.policy_stats()).unwrap();
    let line = refusal(
        &run(
            &new,
            ns,
            &["attach", iface, "--rate", RATE, "--burst", BURST],
        ),
        "pins of no known layout",
    );
    assert!(
        line.contains("match no layout") && line.contains("layout 1: no map 'policy_stats'"),
        "{line}"
    );
    run_ok(&new, ns, &["detach", iface]);

    // Pins of a newer layout than this build's.
    run_ok(
        &new,
        ns,
        &["attach", iface, "--rate", RATE, "--burst", BURST],
    );
    let at = Attachment::new(iface, Some(ns));
    set_layout_version(&at, LAYOUT_VERSION + 1);
    for args in [
        vec!["attach", iface, "--rate", RATE, "--burst", BURST],
        vec!["stats", iface],
        vec!["status", iface],
    ] {
        let line = refusal(&run(&new, ns, &args), &args.join(" "));
        assert!(
            line.contains(&format!("newer shaper (pin layout {}", LAYOUT_VERSION + 1)),
            "{line}"
        );
    }
    run_ok(&new, ns, &["detach", iface]);
    assert!(!at.dir().exists());
}

/// What a killed upgrade left, as `status` tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Left {
    /// The old attachment, untouched.
    Old,
    /// The new pins, the upgrade to be finished by the next attach.
    Interrupted,
    /// The upgrade had finished.
    New,
}

/// Starts an upgrade of `old` and kills it when `when` (polled every 100 µs) first holds,
/// or after `deadline`; says how long it ran, and what it printed if it ended by itself.
fn kill_upgrade(
    old: &OldAttachment,
    when: &dyn Fn(&Attachment) -> bool,
    deadline: Duration,
) -> String {
    let mut child = Command::new(new_shaper())
        .args(["-n", old.lab.rx_ns(), "attach", old.lab.rx_iface()])
        .args(["--rate", RATE, "--burst", BURST])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !when(&old.at) && start.elapsed() < deadline {
        if child.try_wait().unwrap().is_some() {
            let out = child.wait_with_output().unwrap();
            return format!(
                "ended by itself after {:.0} ms ({}): {}{}",
                start.elapsed().as_secs_f64() * 1e3,
                out.status,
                String::from_utf8_lossy(&out.stdout).trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        thread::sleep(Duration::from_micros(100));
    }
    let _ = child.kill();
    child.wait().unwrap();
    format!("killed after {:.0} ms", start.elapsed().as_secs_f64() * 1e3)
}

#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn a_killed_upgrade_leaves_the_old_or_the_new_attachment_whole() {
    killed_upgrade_leaves_the_old_or_the_new_attachment_whole(1);
}

/// From layout 8, whose subscribers' table is copied (not reused) and their ids and names
/// put in a file: each kill leaves the subscribers as they were (entries, ids, names, the
/// tombstone and the marker), read by the old build or the new.
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn a_killed_upgrade_from_layout_8_leaves_the_subscribers_whole() {
    killed_upgrade_leaves_the_old_or_the_new_attachment_whole(8);
}

/// Kills upgrades from `layout` at moments spread over them: each leaves the old
/// attachment whole or the new one (which the next `attach` finishes), keeping every cell,
/// counter and (from layout 8) subscriber.
fn killed_upgrade_leaves_the_old_or_the_new_attachment_whole(layout: u32) {
    // IPv6 sources for the subscribers' IPv6 prefix ([`set_subscribers`]).
    let options = LabOptions {
        ipv6: layout >= 8,
        ..LabOptions::default()
    };
    let lab = Lab::with("upgk", 4, options).unwrap();
    let (ns, iface) = (lab.rx_ns(), lab.rx_iface());
    let new = new_shaper();
    let attach_old = || {
        let room = match layout {
            8.. => vec!["--max-subscribers", "64"],
            _ => Vec::new(),
        };
        let old = OldAttachment::with(&lab, layout, room, &[]);
        if layout >= 8 {
            set_subscribers(&old);
        }
        old
    };
    // How long an upgrade takes here, to spread kills over it.
    let took = {
        let old = attach_old();
        let start = Instant::now();
        assert!(old.upgrade().status.success());
        start.elapsed()
    };
    println!("an upgrade takes {:.0} ms here", took.as_secs_f64() * 1e3);
    let staged = |at: &Attachment| at.staging().join("upgrade_prog").exists();
    let swapped = |at: &Attachment| at.upgrade_prog().exists();
    let never = |_: &Attachment| false;
    type When<'a> = (&'a str, &'a dyn Fn(&Attachment) -> bool, Duration);
    let mut kills: Vec<When> = vec![
        ("kill at once", &never, Duration::ZERO),
        ("kill once staged", &staged, took * 10),
        ("kill once the pins are swapped", &swapped, took * 10),
    ];
    // Over twice the calibrated time: the polling above slows a killed upgrade down.
    for i in 1..=8 {
        kills.push(("kill after a delay", &never, took * i / 4));
    }
    let mut left = BTreeMap::new();
    for (what, when, deadline) in kills {
        let old = attach_old();
        run_udp_with(
            &lab,
            &flows(&lab),
            Duration::from_millis(200),
            &RunOptions::default(),
        )
        .unwrap();
        let cells_before = cells(&old.at);
        let (totals_before, policies_before) = counters(&old.old(), &lab);
        let (link_id, old_prog) = link(&old.at);
        let subscribers_before = subscriber_entries(&old.at);

        let ran = kill_upgrade(&old, when, deadline);

        let status = &json(&new, ns, &["status", iface])[0];
        let (link_after, prog) = link(&old.at);
        assert_eq!(link_after, link_id, "{what}: the link was replaced");
        assert!(lab.xdp_attached().unwrap(), "{what}: nothing attached");
        let state = match (&status["layout_version"], &status["upgrade_interrupted"]) {
            (v, Value::Bool(false)) if *v == layout => {
                // The old attachment whole: the old program, and the old build reads it
                // all as before.
                assert_eq!(prog, old_prog, "{what}");
                let (totals, policies) = counters(&old.old(), &lab);
                same_numbers(what, &totals_before, &totals, 16);
                assert_eq!(policies, policies_before, "{what}");
                let subscribers = subscriber_entries(&old.at);
                assert_eq!(subscribers, subscribers_before, "{what}");
                Left::Old
            }
            (v, Value::Bool(true)) if *v == LAYOUT_VERSION => {
                // The new pins whole; reading waits for the upgrade to finish.
                let line = refusal(&run(&new, ns, &["stats", iface]), what);
                assert!(line.contains("interrupted"), "{line}");
                Left::Interrupted
            }
            (v, Value::Bool(false)) if *v == LAYOUT_VERSION => {
                assert_ne!(prog, old_prog, "{what}");
                Left::New
            }
            _ => panic!("{what}: status says {status}"),
        };
        println!("{what}: {ran}: {state:?}");
        *left.entry(state).or_insert(0) += 1;

        // Attach finishes the upgrade (or does it), keeping everything.
        let out = old.upgrade();
        assert!(
            out.status.success(),
            "{what}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(cells(&old.at), cells_before, "{what}: cells changed");
        let subscribers = subscriber_entries(&old.at);
        assert_eq!(
            subscribers, subscribers_before,
            "{what}: subscribers changed"
        );
        if layout >= 8 {
            assert_eq!(subscribers.len(), 4, "{what}: {subscribers:?}");
        }
        let (totals, policies) = counters(&new, &lab);
        same_numbers(what, &totals_before, &totals, 16);
        for (a, b) in policies_before
            .as_array()
            .unwrap()
            .iter()
            .zip(policies.as_array().unwrap())
        {
            same_numbers(what, a, b, 12);
        }
        let status = &json(&new, ns, &["status", iface])[0];
        assert_eq!(
            (&status["layout_version"], &status["upgrade_interrupted"]),
            (&LAYOUT_VERSION.into(), &false.into()),
            "{what}"
        );
        assert!(!old.at.staging().exists(), "{what}: staging left behind");
    }
    println!("left: {left:?}");
    assert!(
        left.contains_key(&Left::Old),
        "no kill left the old attachment"
    );
    assert!(
        left.contains_key(&Left::Interrupted),
        "no kill landed between the swap of the pins and the end"
    );
}

/// The egress pins are a directory inside the interface's (ingress) pin directory, which
/// an ingress upgrade swaps whole: they come back to where they were, and the egress
/// attachment goes on as it was. From the previous layout, the one build the kernel
/// matrix's guests have (the older layouts' upgrades swap the same way: the tests above).
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn an_ingress_upgrade_keeps_the_egress_attachment_beside_it() {
    let lab = Lab::new("upge", 3).unwrap();
    let old = OldAttachment::new(&lab, LAYOUT_VERSION - 1);
    let (ns, iface) = (lab.rx_ns(), lab.rx_iface());
    let mut egress = AttachGuard::toward(&new_shaper(), ns, iface, "egress");
    egress
        .attach(&["--rate", "8mbit", "--burst", "64k"])
        .unwrap();
    let show = ["--direction", "egress", "config", "show", iface];
    let before = run_ok(&new_shaper(), ns, &show);
    let out = old.upgrade();
    assert!(
        out.status.success(),
        "upgrade: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(run_ok(&new_shaper(), ns, &show), before);
    let status = json(
        &new_shaper(),
        ns,
        &["--direction", "egress", "status", iface],
    );
    assert_eq!(status[0]["interface_present"], true, "{status}");
    assert_eq!(status[0]["layout_version"], LAYOUT_VERSION, "{status}");
    let staging = old.at.staging();
    assert!(!staging.exists(), "{} left behind", staging.display());
    // No room for subscribers (the default): no file of their ids and names made.
    let records = shaper_user::subscriber::record::path_of(&old.at);
    assert!(!records.exists(), "{} made", records.display());
    egress.detach().unwrap();
    let status = json(&new_shaper(), ns, &["status", iface]);
    assert_eq!(status[0]["layout_version"], LAYOUT_VERSION, "{status}");
}

/// The id and size of every map pinned for `at`, by pin.
fn map_ids(at: &Attachment) -> BTreeMap<&'static str, (u32, u32)> {
    shaper_common::layout::current()
        .maps
        .iter()
        .map(|m| {
            let info = bpf::map_info(&at.dir().join(m.pin)).unwrap();
            (m.pin, (info.id, info.max_entries))
        })
        .collect()
}

/// The second meter's per-key maps are made at their smallest where no policy has a
/// second meter; `policy set` with one grows them in place: every other map is the same
/// map (its id), every cell the same bytes, the counters the same numbers, the link the
/// same link running a new program, and the maps now hold a key per source. A clsact
/// attachment (no link to switch) is refused in one line naming what to run, and an
/// attach that asks for a second meter makes them full size at once.
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn a_second_meter_grows_its_maps_in_place_keeping_every_cell() {
    let options = LabOptions {
        ipv6: true,
        ..LabOptions::default()
    };
    let lab = Lab::with("upgm", 4, options).unwrap();
    let (ns, iface) = (lab.rx_ns(), lab.rx_iface());
    let new = new_shaper();
    let at = Attachment::new(iface, Some(ns));
    let mut ingress = AttachGuard::new(&new, ns, iface);
    ingress.attach(&settings(LAYOUT_VERSION)).unwrap();
    let limited = format!("{}/32", lab.sources()[2]);
    let policy = [
        "--rate",
        POLICY_RATE,
        "--burst",
        BURST,
        "--aggregate-rate",
        POLICY_RATE,
        "--aggregate-burst",
        BURST,
    ];
    let set = |prefix: &str, policy: &[&str]| {
        let mut args = vec!["policy", "set", iface, prefix];
        args.extend_from_slice(policy);
        run_ok(&new, ns, &args)
    };
    set(&limited, &policy);
    // No aggregate: what is over the rate is the excess meter's to mark.
    let excess = [
        "--rate",
        POLICY_RATE,
        "--burst",
        BURST,
        "--excess-rate",
        "1mbit",
        "--excess-burst",
        BURST,
    ];
    run_udp_with(
        &lab,
        &flows(&lab),
        Duration::from_millis(500),
        &RunOptions::default(),
    )
    .unwrap();
    let v6: Vec<Flow> = lab.sources6()[..2]
        .iter()
        .map(|&src| Flow {
            src: src.into(),
            offered_bps: 4 * RATE_BPS,
            frame_bytes: FRAME,
        })
        .collect();
    run_udp_with(
        &lab,
        &v6,
        Duration::from_millis(300),
        &RunOptions::default(),
    )
    .unwrap();

    let ids_before = map_ids(&at);
    // The second meter's maps have a key for each source the table has room for.
    let cap = shaper_user::table::room(ids_before[PIN_SOURCES].1);
    for pin in [PIN_METER2, PIN_METER2_6] {
        assert_eq!(ids_before[pin].1, METER2_UNUSED_ENTRIES, "{pin} at attach");
    }
    let cells_before = cells(&at);
    let (totals_before, policies_before) = counters(&new, &lab);
    let (link_id, prog_before) = link(&at);

    let marked = format!("{}/32", lab.sources()[3]);
    println!("{}", set(&marked, &excess).trim());

    let ids_after = map_ids(&at);
    for (pin, (id, size)) in &ids_after {
        if [PIN_METER2, PIN_METER2_6].contains(pin) {
            assert_ne!(*id, ids_before[pin].0, "{pin}: not made anew");
            assert_eq!(*size, cap, "{pin}: not a key per source");
        } else if *pin != PIN_LAYOUT {
            assert_eq!(
                (*id, *size),
                ids_before[pin],
                "{pin}: not the same map after the second meter's maps grew"
            );
        }
    }
    same_cells("grow", &cells_before, &cells(&at), LAYOUT_VERSION);
    let (totals, policies) = counters(&new, &lab);
    same_numbers("stats totals", &totals_before, &totals, 16);
    for (a, b) in policies_before
        .as_array()
        .unwrap()
        .iter()
        .zip(policies.as_array().unwrap())
    {
        same_numbers("policy list", a, b, 12);
    }
    let (link_after, prog_after) = link(&at);
    assert_eq!(link_after, link_id, "the same link, never detached");
    assert_ne!(
        prog_after, prog_before,
        "the link runs a program on the new maps"
    );
    assert!(!at.staging().exists() && !at.upgrade_prog().exists());
    // The program on the new maps marks: the fourth source, over its rate, gets yellow.
    let over = [Flow {
        src: lab.sources()[3].into(),
        offered_bps: 4 * POLICY_RATE_BPS,
        frame_bytes: FRAME,
    }];
    run_udp_with(
        &lab,
        &over,
        Duration::from_millis(500),
        &RunOptions::default(),
    )
    .unwrap();
    let policies = json(&new, ns, &["policy", "list", iface]);
    let row = policies
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["prefix"] == marked.as_str())
        .unwrap();
    assert!(row["yellow_packets"].as_u64().unwrap() > 0, "{row}");
    // Set again: nothing grows twice.
    set(&marked, &excess);
    assert_eq!(map_ids(&at), ids_after);

    // clsact has no link: refused in one line, nothing changed.
    let mut egress = AttachGuard::toward(&new, ns, iface, "egress");
    egress
        .attach(&["--rate", "8mbit", "--burst", "64k", "--tc-mode", "clsact"])
        .unwrap();
    let out_at = Attachment::toward(iface, Some(ns), shaper_user::pins::Direction::Egress);
    let ids = map_ids(&out_at);
    let args = [
        "--direction",
        "egress",
        "policy",
        "set",
        iface,
        &marked,
        "--rate",
        "1mbit",
        "--burst",
        "64k",
        "--packet-rate",
        "1000",
        "--packet-burst",
        "100",
    ];
    let line = refusal(&run(&new, ns, &args), "a second meter on clsact");
    assert!(
        line.contains(&format!("shaper -n {ns} detach {iface} --direction egress")),
        "{line}"
    );
    assert_eq!(map_ids(&out_at), ids);
    let policies = json(
        &new,
        ns,
        &["--direction", "egress", "policy", "list", iface],
    );
    assert_eq!(policies.as_array().unwrap().len(), 1, "{policies}");
    egress.detach().unwrap();
    // Asked for at attach, the maps are made full size at once.
    let mut egress = AttachGuard::toward(&new, ns, iface, "egress");
    egress
        .attach(&[
            "--rate",
            "8mbit",
            "--burst",
            "64k",
            "--tc-mode",
            "clsact",
            "--excess-rate",
            "8mbit",
            "--excess-burst",
            "64k",
        ])
        .unwrap();
    let ids = map_ids(&out_at);
    let cap = shaper_user::table::room(ids[PIN_SOURCES].1);
    for pin in [PIN_METER2, PIN_METER2_6] {
        assert_eq!(ids[pin].1, cap, "{pin}");
    }
    egress.detach().unwrap();
}

/// An interface deleted and made again, its pins kept, attached again with a second
/// meter: linked again over its pins (the same sources map), then the second meter's
/// maps grown in place, and the default policy's second meter in force.
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn a_second_meter_asked_for_when_relinking_grows_the_maps_too() {
    let lab = Lab::new("upgl", 1).unwrap();
    let (ns, rx) = (lab.rx_ns(), lab.rx_netns());
    let new = new_shaper();
    let add = || {
        rx.ip(&[
            "link", "add", "shgr0", "type", "veth", "peer", "name", "shgr1",
        ])
        .unwrap();
        rx.ip(&["link", "set", "shgr0", "up"]).unwrap();
    };
    add();
    let mut guard = AttachGuard::new(&new, ns, "shgr0");
    guard.attach(&["--rate", RATE, "--burst", BURST]).unwrap();
    let at = Attachment::new("shgr0", Some(ns));
    let before = map_ids(&at);
    rx.ip(&["link", "del", "shgr0"]).unwrap();
    add();
    let said = guard
        .attach(&[
            "--rate",
            RATE,
            "--burst",
            BURST,
            "--excess-rate",
            RATE,
            "--excess-burst",
            BURST,
        ])
        .unwrap();
    assert!(said.starts_with("attached shgr0"), "{said}");
    assert!(said.contains("again over its pins"), "{said}");
    let after = map_ids(&at);
    assert_eq!(after[PIN_SOURCES], before[PIN_SOURCES], "not relinked");
    for pin in [PIN_METER2, PIN_METER2_6] {
        assert_eq!(
            after[pin].1,
            shaper_user::table::room(after[PIN_SOURCES].1),
            "{pin}"
        );
    }
    let status = &json(&new, ns, &["status", "shgr0"])[0];
    assert_eq!(status["interface_present"], true, "{status}");
    let policies = json(&new, ns, &["policy", "list", "shgr0"]);
    assert_eq!(policies[0]["excess_rate_bps"], RATE_BPS, "{policies}");
    assert!(!at.staging().exists() && !at.upgrade_prog().exists());
}

/// `attach` over an attachment made without a second meter, asking for one for the
/// default policy: updated in place, its second meter's maps grown, every other map kept.
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn a_second_meter_asked_for_by_attach_over_an_attachment_grows_the_maps() {
    let lab = Lab::new("upga", 1).unwrap();
    let (ns, iface) = (lab.rx_ns(), lab.rx_iface());
    let new = new_shaper();
    let at = Attachment::new(iface, Some(ns));
    let mut guard = AttachGuard::new(&new, ns, iface);
    guard.attach(&["--rate", RATE, "--burst", BURST]).unwrap();
    let before = map_ids(&at);
    let said = guard
        .attach(&[
            "--rate",
            RATE,
            "--burst",
            BURST,
            "--packet-rate",
            "1k",
            "--packet-burst",
            "100",
        ])
        .unwrap();
    assert!(said.starts_with("updated"), "{said}");
    let after = map_ids(&at);
    for (pin, ids) in &after {
        if [PIN_METER2, PIN_METER2_6].contains(pin) {
            assert_eq!(
                ids.1,
                shaper_user::table::room(after[PIN_SOURCES].1),
                "{pin}"
            );
        } else if *pin != PIN_LAYOUT {
            assert_eq!(*ids, before[pin], "{pin}");
        }
    }
    let policies = json(&new, ns, &["policy", "list", iface]);
    assert_eq!(policies[0]["packet_rate"], 1000, "{policies}");
}

/// Traffic from the lab's four IPv4 sources ([`flows`]), then from two IPv6 ones, so that
/// cells are charged and counters count in both tables.
fn charge_both_families(lab: &Lab) {
    let report = run_udp_with(
        lab,
        &flows(lab),
        Duration::from_millis(500),
        &RunOptions::default(),
    )
    .unwrap();
    assert!(report.flows.iter().all(|f| f.received_packets > 0));
    let v6: Vec<Flow> = lab.sources6()[..2]
        .iter()
        .map(|&src| Flow {
            src: src.into(),
            offered_bps: 4 * RATE_BPS,
            frame_bytes: FRAME,
        })
        .collect();
    let report =
        run_udp_with(lab, &v6, Duration::from_millis(300), &RunOptions::default()).unwrap();
    assert!(report.flows.iter().all(|f| f.received_packets > 0));
}

/// `attach` with a bigger `--max-sources` grows the per-source tables in place: the same
/// link runs a new program on new tables of the new size, every other map is the same map
/// (its id); every source of both families keeps its cell and counters (moved to its
/// bucket in the bigger table), the counters their numbers. The second meter's maps, made
/// for a policy's excess meter, are kept as they were, and not made anew (empty) when a
/// later policy asks for a second meter. A smaller size is refused in one line, changing
/// nothing.
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn the_source_tables_grow_in_place_keeping_every_cell() {
    let options = LabOptions {
        ipv6: true,
        ..LabOptions::default()
    };
    let lab = Lab::with("upgs", 4, options).unwrap();
    let (ns, iface) = (lab.rx_ns(), lab.rx_iface());
    let new = new_shaper();
    let at = Attachment::new(iface, Some(ns));
    let attach = |max_sources: &'static str| {
        let mut args = vec!["attach", iface];
        args.extend(settings(LAYOUT_VERSION));
        args.extend(["--max-sources", max_sources]);
        args
    };
    let mut ingress = AttachGuard::new(&new, ns, iface);
    ingress.attach(&attach("8")[2..]).unwrap();
    let excess = |prefix: &str| {
        let args = [
            "policy",
            "set",
            iface,
            prefix,
            "--rate",
            POLICY_RATE,
            "--burst",
            BURST,
            "--excess-rate",
            "1mbit",
            "--excess-burst",
            BURST,
        ];
        run_ok(&new, ns, &args);
    };
    excess(&format!("{}/32", lab.sources()[3]));
    let aggregate = format!("{}/32", lab.sources()[2]);
    run_ok(
        &new,
        ns,
        &[
            "policy",
            "set",
            iface,
            &aggregate,
            "--rate",
            POLICY_RATE,
            "--burst",
            BURST,
            "--aggregate-rate",
            POLICY_RATE,
            "--aggregate-burst",
            BURST,
        ],
    );
    charge_both_families(&lab);

    let ids_before = map_ids(&at);
    assert_eq!(ids_before[PIN_SOURCES].1, 1, "one bucket of eight ways");
    assert_eq!(
        ids_before[PIN_METER2].1, 8,
        "made for use, a key per source"
    );
    let cells_before = cells(&at);
    assert_eq!(cells_before.v4.len(), 4);
    let (totals_before, policies_before) = counters(&new, &lab);
    let (link_id, prog_before) = link(&at);

    let said = run_ok(&new, ns, &attach("4096"));
    println!("{}", said.trim());
    assert!(
        said.contains("source tables grown to 4096 keys a family"),
        "{said}"
    );
    let ids_after = map_ids(&at);
    for (pin, (id, size)) in &ids_after {
        if [PIN_SOURCES, PIN_SOURCES6].contains(pin) {
            assert_ne!(*id, ids_before[pin].0, "{pin}: not made anew");
            assert_eq!(*size, 512, "{pin}: not 4,096 ways");
        } else if *pin != PIN_LAYOUT {
            assert_eq!((*id, *size), ids_before[pin], "{pin}: not the same map");
        }
    }
    same_cells("growth", &cells_before, &cells(&at), LAYOUT_VERSION);
    let (totals, policies) = counters(&new, &lab);
    same_numbers("stats totals", &totals_before, &totals, 16);
    for (a, b) in policies_before
        .as_array()
        .unwrap()
        .iter()
        .zip(policies.as_array().unwrap())
    {
        same_numbers("policy list", a, b, 12);
    }
    let (link_after, prog_after) = link(&at);
    assert_eq!(link_after, link_id, "the same link, never detached");
    assert_ne!(prog_after, prog_before, "a program on the new tables");
    assert!(!at.staging().exists() && !at.upgrade_prog().exists());
    let status = &json(&new, ns, &["status", iface])[0];
    assert_eq!(status["max_sources"], 4096, "{status}");

    excess(&aggregate);
    for pin in [PIN_METER2, PIN_METER2_6] {
        assert_eq!(map_ids(&at)[pin], ids_after[pin], "{pin}: made anew");
    }
    let line = refusal(&run(&new, ns, &attach("1024")), "attach --max-sources 1024");
    assert!(line.contains("never shrink"), "{line}");
    assert_eq!(map_ids(&at), ids_after);
}

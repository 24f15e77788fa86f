//! Upgrading in place an attachment that an older shaper made.
//!
//! `shaper attach` on an interface whose pins have an older layout
//! (`shaper_common::layout`), asking for no change of settings, replaces the program
//! without detaching and carries everything over:
//!
//! 1. **Plan.** Each map of today's layout is *reused* when the old pins have it with the
//!    same layout (checked as libbpf checks a pinned map), or made anew. A new map of
//!    settings (config, policies, tries) is written from the old one, decoded into
//!    today's types; new counters start at zero and what the old ones counted is
//!    *carried* (below); a map new in this layout starts empty. Cells (sources,
//!    aggregates, admission) are only ever reused: if their layout changed, the upgrade
//!    is refused in one line, since a copy made while the old program still meters would
//!    lose what it charged meanwhile. The one exception: the per-source LRU maps of
//!    layouts 10 and before, whose keys are copied into today's tables last thing in step
//!    2, then *topped up* with what the old program charged since: just before step 4
//!    (so the new program's first frames meet cells stale by moments only) and after 5.
//! 2. **Stage.** The object is loaded on the reused maps and the new ones, and everything
//!    is pinned in `IFACE:new` (`pins::Attachment::staging`): the maps, the link (a second
//!    pin of the same link) and the new program (`upgrade_prog`). The old attachment is
//!    untouched: nothing it uses is written.
//! 3. **Swap the pins.** `renameat2(RENAME_EXCHANGE)` swaps the two directories in one
//!    step: `IFACE` now holds the new pins, `IFACE:new` the old ones.
//! 4. **Swap the program.** `BPF_LINK_UPDATE` (with `BPF_F_REPLACE`: only if the link
//!    still runs the old program) makes the link run the new program, in one step: every
//!    frame is metered by one program or the other, and a reused cell is the same memory
//!    for both, so no source is refilled.
//! 5. **Carry the counts.** Once no CPU still runs the old program (an RCU grace period,
//!    [`bpf::wait_for_running_programs`]), its counters are final; what they counted, with
//!    what earlier upgrades carried, is written to the carried maps, which readers add to
//!    the live counters. (A per-CPU counter cannot be added to from userspace while the
//!    program increments it; a map of its own can be written once.) A snapshot was written
//!    there in step 2, so the counters never read low meanwhile.
//! 6. **Clean up.** `upgrade_prog` is unpinned, then the old pins are removed.
//!
//! The egress pins of an interface are a directory inside its ingress pins, so the swap
//! of an ingress upgrade carries them to the staging directory; they are moved back
//! first thing in step 6 (and by the recovery of either direction, if killed between).
//!
//! A tc attachment through TCX is upgraded the same way (its link is a bpf_link); one
//! through clsact has no link to update and is refused in one line.
//!
//! Killed at any point, the host holds the old attachment whole (before step 3: the next
//! command removes `IFACE:new`) or the new one whole (after it: `upgrade_prog` in `IFACE`
//! says so, and the next `attach`, `policy set|del` or `apply` finishes steps 4 to 6 from
//! what is pinned; until then the old program, on the old maps, still meters every
//! frame).

mod decode;
mod layout1;
mod layout3;
mod layout4;
mod layout5;
mod layout6;
mod layout8;
mod pinned;

use std::{
    error::Error,
    ffi::CString,
    io,
    os::fd::AsFd as _,
    path::{Path, PathBuf},
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{
        Array, HashMap, MapData, MapError,
        lpm_trie::{Key, LpmTrie},
    },
};
use shaper_common::{
    layout::{self, Holds, LAYOUT_VERSION, Layout, MapLayout},
    maps::{
        Config, Counters, DEFAULT_MAX_SUBSCRIBERS, Ipv4Key, Ipv6Key, MAP_CONFIG,
        MAP_COUNTERS_CARRIED, MAP_POLICIES, MAP_POLICY_STATS_CARRIED, MAP_PREFIXES_V4,
        MAP_PREFIXES_V6, MAP_SOURCES, MAP_SOURCES6, MAP_SUBSCRIBERS, MAX_POLICIES, PIN_CONFIG,
        PIN_COUNTERS, PIN_COUNTERS_CARRIED, PIN_LAYOUT, PIN_LINK, PIN_METER2, PIN_METER2_6,
        PIN_POLICIES, PIN_POLICY_STATS, PIN_POLICY_STATS_CARRIED, PIN_PREFIXES_V4, PIN_PREFIXES_V6,
        PIN_SOURCES, PIN_SOURCES6, PIN_SUBSCRIBERS, PIN_UPGRADE_PROG, PROG_XDP, Policy,
        PolicyStats, SourceState, is_tc_mode,
    },
    sources::{source_buckets, source_room},
};

pub use decode::{Counts, DecodeError, Settings, read_counts, read_settings};
pub use pinned::{LayoutError, identify, layout_checks};

use crate::{
    bpf,
    object::{self, Sizes},
    pins::{self, Attachment},
    refill,
    units::{Rate, Size},
};

#[derive(Debug, thiserror::Error)]
pub enum UpgradeError {
    #[error(
        "{label} was attached by an older shaper (pin layout {from}; this one writes {LAYOUT_VERSION}): upgrade it in place with `{command}`, which keeps every source's bucket and the counters"
    )]
    Older {
        label: String,
        from: u32,
        command: String,
    },
    #[error(
        "{label} was attached by an older shaper (pin layout {from}): upgrade it first with its settings as they are (`{command}`), then change them"
    )]
    SettingsDiffer {
        label: String,
        from: u32,
        command: String,
    },
    #[error(
        "cannot upgrade {label} from pin layout {from}: the cells in its map '{pin}' changed layout and cannot be carried over; detach and attach again (which refills every source's bucket)"
    )]
    Cells {
        label: String,
        from: u32,
        pin: &'static str,
    },
    #[error(
        "cannot upgrade {label} in place: it is attached with clsact, which has no link to switch to the new program; detach and attach again (which refills every source's bucket)"
    )]
    Clsact { label: String },
    #[error(
        "cannot give {label} a second meter in place: it is attached with clsact, which has no link to switch to a program on maps big enough for one; detach it (`{command}`) and attach it again with the second meter (which refills every source's bucket)"
    )]
    Meter2Clsact { label: String, command: String },
    #[error(
        "cannot grow {label}'s source tables in place: it is attached with clsact, which has no link to switch to a program on bigger tables; detach it (`{command}`) and attach it again with the new --max-sources (which refills every source's bucket)"
    )]
    GrowClsact { label: String, command: String },
    #[error("an upgrade of {label} was interrupted: `{command}` finishes it")]
    Interrupted { label: String, command: String },
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error("cannot upgrade {label}")]
    Decode {
        label: String,
        source: Box<DecodeError>,
    },
    #[error("cannot upgrade {label}: cannot {what}")]
    Step {
        label: String,
        what: String,
        source: Box<dyn Error + Send + Sync>,
    },
}

/// Each counters map, and the map that carries what it counted across upgrades.
const CARRIED_FOR: [(&str, &str); 2] = [
    (PIN_COUNTERS, PIN_COUNTERS_CARRIED),
    (PIN_POLICY_STATS, PIN_POLICY_STATS_CARRIED),
];

/// [`step`] of an error already boxed.
fn step_boxed(
    at: &Attachment,
    what: &str,
) -> impl FnOnce(Box<dyn Error + Send + Sync>) -> UpgradeError {
    let label = at.label();
    let what = what.to_owned();
    move |source| UpgradeError::Step {
        label,
        what,
        source,
    }
}

fn step<E: Error + Send + Sync + 'static>(
    at: &Attachment,
    what: impl Into<String>,
) -> impl FnOnce(E) -> UpgradeError {
    let label = at.label();
    let what = what.into();
    move |e| UpgradeError::Step {
        label,
        what,
        source: Box::new(e),
    }
}

fn decode_err(at: &Attachment) -> impl FnOnce(DecodeError) -> UpgradeError {
    let label = at.label();
    move |source| UpgradeError::Decode {
        label,
        source: Box::new(source),
    }
}

/// The command that attaches `at` as `config` says: with no other flag, what upgrades an
/// older attachment in place.
fn attach_command(at: &Attachment, config: &Config) -> String {
    let netns = at
        .netns
        .as_ref()
        .map_or(String::new(), |ns| format!("-n {ns} "));
    format!(
        "shaper {netns}attach {}{} --rate {} --burst {}",
        at.iface,
        at.direction_flag(),
        Rate::from_bps(config.rate_bps),
        Size::from_bytes(config.burst_bytes)
    )
}

/// Succeeds if `at`'s pins have this shaper's layout; otherwise says what to run.
pub fn require_current(at: &Attachment) -> Result<(), UpgradeError> {
    let dir = at.dir();
    let l = identify(&dir, &at.label())?;
    let settings = || read_settings(&dir, l).map_err(decode_err(at));
    if at.upgrade_prog().exists() {
        return Err(UpgradeError::Interrupted {
            label: at.label(),
            command: attach_command(at, &settings()?.config),
        });
    }
    if l.version == LAYOUT_VERSION {
        return Ok(());
    }
    Err(UpgradeError::Older {
        label: at.label(),
        from: l.version,
        command: attach_command(at, &settings()?.config),
    })
}

/// [`require_current`] of pins already opened ([`crate::maps::Pinned`]), which looks at
/// no pin again: `version` is what their version map says (`None`: it could not be read)
/// and `found(pin)` what each pin of today's layout holds (`None`: nothing). Only pins
/// that are not today's are looked at again, to say why.
pub fn require_current_opened(
    at: &Attachment,
    version: Option<u32>,
    found: impl Fn(&str) -> Option<bpf::MapInfo>,
) -> Result<(), UpgradeError> {
    let mut mismatch = layout::current()
        .maps
        .iter()
        .find_map(|m| pinned::mismatch(m, found(m.pin)));
    if version != Some(LAYOUT_VERSION) {
        mismatch.get_or_insert_with(|| format!("its '{}' map says {version:?}", PIN_LAYOUT));
    }
    let Some(mismatch) = mismatch else {
        pinned::count_layout_check();
        if interrupted(at) {
            return require_current(at);
        }
        return Ok(());
    };
    require_current(at)?;
    // Today's layout when looked at again: changed while it was opened.
    Err(LayoutError::Unknown {
        label: at.label(),
        mismatch,
    }
    .into())
}

/// Whether an upgrade of `at` stopped after swapping the pins (see the module docs).
pub fn interrupted(at: &Attachment) -> bool {
    at.upgrade_prog().exists()
}

/// Finishes an upgrade of `at` that was killed after it swapped the pins, or removes what
/// one killed before left. The caller holds the host lock.
pub fn recover(at: &Attachment) -> Result<(), UpgradeError> {
    egress_home(at)?;
    if interrupted(at) {
        return finish(at, None);
    }
    if at.dir().exists() && at.staging().exists() {
        pins::remove_dir_of_pins(&at.staging()).map_err(step(at, "remove old staged pins"))?;
    }
    Ok(())
}

/// What becomes of each map of today's layout: reused (`true`) or made anew.
fn plan(at: &Attachment, from: &Layout) -> Result<Vec<(&'static MapLayout, bool)>, UpgradeError> {
    let mut plan = Vec::new();
    for m in layout::current().maps {
        let reuse = match (m.holds, from.map(m.pin)) {
            // The old pins keep their version until the swap.
            (Holds::Version, _) => false,
            (_, Some(old)) if old.holds_as(m) => true,
            // Layout 8's subscribers, their ids and names in their entries: copied.
            (Holds::Cells, Some(old))
                if m.pin == PIN_SUBSCRIBERS && old.value_size == layout8::ENTRY_BYTES =>
            {
                false
            }
            // Layout 10's and older per-source LRU hash maps: every key moved into the
            // tables of buckets (`move_sources`).
            (Holds::Cells, Some(old))
                if [PIN_SOURCES, PIN_SOURCES6].contains(&m.pin)
                    && old.map_type == layout::BPF_MAP_TYPE_LRU_HASH =>
            {
                false
            }
            (Holds::Cells, Some(_)) => {
                return Err(UpgradeError::Cells {
                    label: at.label(),
                    from: from.version,
                    pin: m.pin,
                });
            }
            _ => false,
        };
        plan.push((m, reuse));
    }
    // New counters need new carried maps: writing the old ones would change the old
    // attachment's counts before the swap.
    for (live, carried) in CARRIED_FOR {
        if plan.iter().any(|&(m, reuse)| m.pin == live && !reuse) {
            for entry in plan.iter_mut().filter(|(m, _)| m.pin == carried) {
                entry.1 = false;
            }
        }
    }
    Ok(plan)
}

/// Refuses an upgrade of `at` (pins of the older layout `from`, settings `current`) that
/// is asked for other settings too (`asked`, as the request resolves them over
/// `current`; `policies`: whether it names prefix policies): an upgrade changes nothing
/// else.
pub fn refuse_changes(
    at: &Attachment,
    from: &Layout,
    current: &Config,
    asked: &Config,
    policies: bool,
) -> Result<(), UpgradeError> {
    let as_is = Config {
        policy_gen: asked.policy_gen,
        prefixes_v4: asked.prefixes_v4,
        prefixes_v6: asked.prefixes_v6,
        ..*current
    };
    if *asked != as_is || policies {
        return Err(UpgradeError::SettingsDiffer {
            label: at.label(),
            from: from.version,
            command: attach_command(at, current),
        });
    }
    Ok(())
}

/// Upgrades `at`, whose pins have the older layout `from` and hold `settings` (their
/// per-source maps `cap` keys), in place (see the module docs). The caller holds the host
/// lock and has found the link live.
pub fn upgrade(
    at: &Attachment,
    from: &'static Layout,
    settings: &Settings,
    cap: u32,
) -> Result<(), UpgradeError> {
    if at.tc_prog().exists() {
        return Err(UpgradeError::Clsact { label: at.label() });
    }
    let plan = plan(at, from)?;
    let sizes = Sizes {
        max_sources: cap,
        meter2: settings.has_meter2(),
        max_subscribers: max_subscribers(at, from),
        max_policies: max_policies(at),
    };
    swap_in(at, from, settings, &plan, sizes)
}

/// Steps 2 to 6 (see the module docs): stages `plan` with new maps of `sizes`, swaps the
/// pins, then the program, and finishes.
fn swap_in(
    at: &Attachment,
    from: &Layout,
    settings: &Settings,
    plan: &[(&'static MapLayout, bool)],
    sizes: Sizes,
) -> Result<(), UpgradeError> {
    let staging = at.staging();
    let moved = match stage(at, from, settings, plan, sizes) {
        Ok(moved) => moved,
        Err(e) => {
            // Best effort: the old attachment was never touched.
            let _ = pins::remove_dir_of_pins(&staging);
            return Err(e);
        }
    };
    if let Err(e) = exchange(&staging, &at.dir()) {
        let _ = pins::remove_dir_of_pins(&staging);
        return Err(step(at, "swap the pins")(e));
    }
    finish(at, moved.as_ref())
}

/// Whether `at`'s second-meter maps have room for a key of each of its sources: false
/// where they were made small ([`object::Sizes`]) since no policy had a second meter.
pub fn meter2_room(at: &Attachment) -> Result<bool, UpgradeError> {
    let size = |pin: &str| -> Result<u32, UpgradeError> {
        Ok(bpf::map_info(&at.dir().join(pin))
            .map_err(step(at, format!("read map '{pin}'")))?
            .max_entries)
    };
    let cap = crate::table::room(size(PIN_SOURCES)?);
    Ok(
        object::meter2_room(size(PIN_METER2)?, cap)
            && object::meter2_room(size(PIN_METER2_6)?, cap),
    )
}

/// Makes room for a second meter on `at` (this build's pins, its link live; the caller
/// holds the host lock): if its second-meter maps are the small ones, grows them in
/// place, through the upgrade's steps with every map reused but those two, made anew at
/// the sources' size (empty: no key has a second-meter cell yet). Every cell, counter and
/// policy stays as it is; the program is switched to one on the new maps in one step.
/// Returns whether it grew them. Refused in one line on a clsact attachment (no link).
pub fn make_room_for_meter2(at: &Attachment) -> Result<bool, UpgradeError> {
    if meter2_room(at)? {
        return Ok(false);
    }
    if at.tc_prog().exists() {
        return Err(UpgradeError::Meter2Clsact {
            label: at.label(),
            command: detach_command(at),
        });
    }
    let current = layout::current();
    let settings = read_settings(&at.dir(), current).map_err(decode_err(at))?;
    let cap = sources_room(at)?;
    let sizes = Sizes {
        max_sources: cap,
        meter2: true,
        max_subscribers: max_subscribers(at, current),
        max_policies: max_policies(at),
    };
    swap_in(
        at,
        current,
        &settings,
        &plan_anew(&[PIN_METER2, PIN_METER2_6]),
        sizes,
    )?;
    Ok(true)
}

/// Grows `at`'s per-source tables (this build's pins, its link live; the caller holds the
/// host lock) to room for `max_sources` keys of each family, in place, through the
/// upgrade's steps with every map reused but the two tables, made anew at the new size:
/// every key moved with its cell and counters (`move_sources`), topped up with what the old
/// program charged since, just before the switch and after it. The second meter's per-key
/// maps keep their size. Returns whether it grew them: not if they have the room already.
/// Refused in one line on a clsact attachment (no link to switch).
pub fn grow_sources(at: &Attachment, max_sources: u32) -> Result<bool, UpgradeError> {
    let cap = sources_room(at)?;
    if source_room(source_buckets(max_sources)) <= cap {
        return Ok(false);
    }
    if at.tc_prog().exists() {
        return Err(UpgradeError::GrowClsact {
            label: at.label(),
            command: detach_command(at),
        });
    }
    let current = layout::current();
    let settings = read_settings(&at.dir(), current).map_err(decode_err(at))?;
    let sizes = Sizes {
        max_sources,
        meter2: false,
        max_subscribers: max_subscribers(at, current),
        max_policies: max_policies(at),
    };
    swap_in(
        at,
        current,
        &settings,
        &plan_anew(&[PIN_SOURCES, PIN_SOURCES6]),
        sizes,
    )?;
    Ok(true)
}

/// The keys `at`'s pinned per-source tables have room for.
fn sources_room(at: &Attachment) -> Result<u32, UpgradeError> {
    Ok(crate::table::room(
        bpf::map_info(&at.dir().join(PIN_SOURCES))
            .map_err(step(at, format!("read map '{PIN_SOURCES}'")))?
            .max_entries,
    ))
}

/// `shaper [-n NS] detach IFACE [--direction egress]` for `at`.
fn detach_command(at: &Attachment) -> String {
    let netns = at
        .netns
        .as_ref()
        .map_or(String::new(), |ns| format!("-n {ns} "));
    format!("shaper {netns}detach {}{}", at.iface, at.direction_flag())
}

/// The subscribers `at`'s pins (of layout `from`) have room for: none before layout 8.
pub fn max_subscribers(at: &Attachment, from: &Layout) -> u32 {
    if from.map(PIN_SUBSCRIBERS).is_none() {
        return DEFAULT_MAX_SUBSCRIBERS;
    }
    bpf::map_info(&at.dir().join(PIN_SUBSCRIBERS))
        .map_or(DEFAULT_MAX_SUBSCRIBERS, |i| i.max_entries.saturating_sub(1))
}

/// The policies `at`'s pins have room for ([`SIZED_BY_POLICIES`]'s size, less the
/// default's slot): every layout has the policies' array, 16,384 slots before
/// `--max-policies`.
pub fn max_policies(at: &Attachment) -> u32 {
    bpf::map_info(&at.dir().join(PIN_POLICIES))
        .map_or(MAX_POLICIES - 1, |i| i.max_entries.saturating_sub(1))
}

/// The plan of [`make_room_for_meter2`] and [`grow_sources`]: every map of today's layout
/// reused but the version (written anew, as always) and those pinned at `pins`.
fn plan_anew(pins: &[&str]) -> Vec<(&'static MapLayout, bool)> {
    layout::current()
        .maps
        .iter()
        .map(|m| {
            let anew = m.holds == Holds::Version || pins.contains(&m.pin);
            (m, !anew)
        })
        .collect()
}

/// Loads the object on the reused and new maps and pins all of it, the link and the new
/// program in the staging directory.
fn stage(
    at: &Attachment,
    from: &Layout,
    settings: &Settings,
    plan: &[(&'static MapLayout, bool)],
    sizes: Sizes,
) -> Result<Option<Moved>, UpgradeError> {
    let dir = at.dir();
    let staging = at.staging();
    pins::remove_dir_of_pins(&staging).map_err(step(at, "remove old staged pins"))?;
    pins::make_dirs(&staging).map_err(step(at, "make the staging directory"))?;
    let mut load = EbpfLoader::new();
    sizes.apply(&mut load);
    for &(m, reuse) in plan {
        // aya reuses the map pinned there, or creates the map and pins it there.
        let path = if reuse { &dir } else { &staging }.join(m.pin);
        load.map_pin_path(m.name, path);
    }
    let mut ebpf = load
        .load(object::EBPF_OBJECT)
        .map_err(step(at, "load the new program's maps"))?;
    let fresh = |pin: &str| plan.iter().any(|&(m, reuse)| m.pin == pin && !reuse);
    for &(m, _) in plan.iter().filter(|(_, reuse)| *reuse) {
        map_of(at, &ebpf, m.name)?
            .pin(staging.join(m.pin))
            .map_err(step(at, format!("pin map '{}' again", m.pin)))?;
    }
    write_settings(at, &mut ebpf, settings, &fresh)?;
    if fresh(PIN_SUBSCRIBERS) {
        write_subscribers(at, &ebpf, from)?;
    }
    object::write_layout_version(&mut ebpf).map_err(step(at, "write the layout version"))?;
    if fresh(PIN_COUNTERS) || fresh(PIN_POLICY_STATS) {
        // What the old counters have counted so far; exact once the old program is gone.
        let counts = read_counts(&dir, from, settings).map_err(decode_err(at))?;
        write_carried(at, &mut ebpf, &counts, &fresh)?;
    }
    let upgrade_prog = staging.join(PIN_UPGRADE_PROG);
    if is_tc_mode(settings.config.xdp_mode) {
        object::tc_program(&mut ebpf)
            .map_err(step(at, "load the new program"))?
            .pin(upgrade_prog)
    } else {
        object::xdp_program(&mut ebpf, PROG_XDP)
            .map_err(step(at, "load the new program"))?
            .pin(upgrade_prog)
    }
    .map_err(step(at, "pin the new program"))?;
    let link = bpf::obj_get(&at.link()).map_err(step(at, "open the pinned link"))?;
    bpf::obj_pin(link.as_fd(), &staging.join(PIN_LINK)).map_err(step(at, "pin the link again"))?;
    // Last, the program loaded and verified: the fewer frames the old program meters
    // between the copy and the switch, the less there is to top up after it.
    if fresh(PIN_SOURCES) || fresh(PIN_SOURCES6) {
        return move_sources(at, &ebpf, settings.config.trace_seed).map(Some);
    }
    Ok(None)
}

fn map_of<'a>(
    at: &Attachment,
    ebpf: &'a Ebpf,
    name: &str,
) -> Result<&'a aya::maps::Map, UpgradeError> {
    ebpf.map(name).ok_or_else(|| UpgradeError::Step {
        label: at.label(),
        what: format!("find map {name} in the object"),
        source: "missing".into(),
    })
}

fn typed<'a, T>(at: &Attachment, ebpf: &'a mut Ebpf, name: &str) -> Result<T, UpgradeError>
where
    T: TryFrom<&'a mut aya::maps::Map, Error = MapError>,
{
    let map = ebpf.map_mut(name).ok_or_else(|| UpgradeError::Step {
        label: at.label(),
        what: format!("find map {name} in the object"),
        source: "missing".into(),
    })?;
    T::try_from(map).map_err(step(at, format!("open map {name}")))
}

fn array<'a, T: aya::Pod>(
    at: &Attachment,
    ebpf: &'a mut Ebpf,
    name: &str,
) -> Result<Array<&'a mut MapData, T>, UpgradeError> {
    typed(at, ebpf, name)
}

/// Writes the settings into those of their maps that are new (`fresh`).
fn write_settings(
    at: &Attachment,
    ebpf: &mut Ebpf,
    settings: &Settings,
    fresh: &dyn Fn(&str) -> bool,
) -> Result<(), UpgradeError> {
    if fresh(PIN_CONFIG) {
        array::<Config>(at, ebpf, MAP_CONFIG)?
            .set(0, settings.config, 0)
            .map_err(step(at, "write the config"))?;
    }
    if fresh(PIN_POLICIES) {
        let mut policies = array::<Policy>(at, ebpf, MAP_POLICIES)?;
        for (slot, p) in &settings.policies {
            policies
                .set(*slot, p, 0)
                .map_err(step(at, format!("write policy slot {slot}")))?;
        }
    }
    if fresh(PIN_PREFIXES_V4) {
        let mut trie: LpmTrie<&mut MapData, Ipv4Key, u32> = typed(at, ebpf, MAP_PREFIXES_V4)?;
        for (slot, p) in settings.policies.iter().filter(|(_, p)| p.family == 4) {
            let addr = u32::from_ne_bytes([p.addr[0], p.addr[1], p.addr[2], p.addr[3]]);
            refill::refilled_map(|| trie.insert(&Key::new(p.prefix_len, addr), slot, 0))
                .map_err(step(at, "write the IPv4 prefixes"))?;
        }
    }
    if fresh(PIN_PREFIXES_V6) {
        let mut trie: LpmTrie<&mut MapData, Ipv6Key, u32> = typed(at, ebpf, MAP_PREFIXES_V6)?;
        for (slot, p) in settings.policies.iter().filter(|(_, p)| p.family == 6) {
            refill::refilled_map(|| trie.insert(&Key::new(p.prefix_len, p.addr), slot, 0))
                .map_err(step(at, "write the IPv6 prefixes"))?;
        }
    }
    Ok(())
}

/// Moves every key of the old pins' per-source LRU hash maps, cell and counters, into the
/// new tables of buckets, placed by hash under the attachment's `seed` as the program
/// looks for them. The keys whose cells are busy (their TAT ahead of now) are placed
/// first: should a key's two buckets be full (a few keys in a hundred of an LRU map
/// filled to its size), the one left out is one whose cell is idle, which a fresh cell
/// replaces without a difference but for its counters. What the old program charges
/// between this copy and the switch is added by [`top_up_sources`].
fn move_sources(at: &Attachment, ebpf: &Ebpf, seed: u64) -> Result<Moved, UpgradeError> {
    let dir = at.dir();
    let now = shaper_common::gcra::ticks_from_ns(crate::watch::monotonic_ns());
    let busy_first = |s: &SourceState| u8::from(s.cell.tat <= now);
    let read = |pin: &str| -> Result<aya::maps::Map, UpgradeError> {
        let path = dir.join(pin);
        let what = format!("open {}", path.display());
        let data = MapData::from_pin(&path).map_err(step(at, what.clone()))?;
        aya::maps::Map::from_map_data(data).map_err(step(at, what))
    };
    let new_table = |name: &str| -> Result<&MapData, UpgradeError> {
        match map_of(at, ebpf, name)? {
            aya::maps::Map::Array(data) => Ok(data),
            _ => Err(step_boxed(at, &format!("open the new {name}"))(
                "not an array".into(),
            )),
        }
    };
    let mut v4 = sources_v4(&read(PIN_SOURCES)?).map_err(step(at, "read the IPv4 sources"))?;
    v4.sort_by_key(|(_, s)| busy_first(s));
    let mut v6 = sources_v6(&read(PIN_SOURCES6)?).map_err(step(at, "read the IPv6 sources"))?;
    v6.sort_by_key(|(_, s)| busy_first(s));
    crate::table::write_v4(new_table(MAP_SOURCES)?, seed, &v4)
        .map_err(step(at, "move the IPv4 sources"))?;
    crate::table::write_v6(new_table(MAP_SOURCES6)?, seed, &v6)
        .map_err(step(at, "move the IPv6 sources"))?;
    Ok(Moved {
        seed,
        v4: v4.into_iter().collect(),
        v6: v6.into_iter().collect(),
    })
}

/// Every key of an old IPv4 per-source map with its state: an LRU hash map (layouts 10 and
/// before) or a table of buckets (smaller, before a growth).
fn sources_v4(map: &aya::maps::Map) -> Result<Vec<(Ipv4Key, SourceState)>, MapError> {
    match map {
        aya::maps::Map::Array(data) => crate::table::read_v4(data),
        aya::maps::Map::LruHashMap(data) => crate::maps::read_batched(data),
        _ => Err(MapError::InvalidMapType { map_type: 0 }),
    }
}

/// [`sources_v4`] for IPv6.
fn sources_v6(map: &aya::maps::Map) -> Result<Vec<(Ipv6Key, SourceState)>, MapError> {
    match map {
        aya::maps::Map::Array(data) => crate::table::read_v6(data),
        aya::maps::Map::LruHashMap(data) => crate::maps::read_batched(data),
        _ => Err(MapError::InvalidMapType { map_type: 0 }),
    }
}

/// The keys [`move_sources`] copied, as it copied them, for [`top_up_sources`].
pub struct Moved {
    seed: u64,
    v4: std::collections::HashMap<Ipv4Key, SourceState>,
    v6: std::collections::HashMap<Ipv6Key, SourceState>,
}

/// What the old program charged and counted since `moved` was read, added into the new
/// tables (`table::top_up_v4`); returns the old maps as read now, for the next top-up. Once
/// just before the switch, so that the new program's first frames meet cells stale by the
/// switch's moments only (not by the whole stage since the copy), and once after it, for
/// those moments. The old pins are in the staging directory by then.
fn top_up_sources(at: &Attachment, moved: &Moved) -> Result<Moved, UpgradeError> {
    let (old_dir, new_dir) = (at.staging(), at.dir());
    let open_map = |path: PathBuf| -> Result<aya::maps::Map, UpgradeError> {
        let what = format!("open {}", path.display());
        let data = MapData::from_pin(&path).map_err(step(at, what.clone()))?;
        aya::maps::Map::from_map_data(data).map_err(step(at, what))
    };
    let (old4, old6) = (
        open_map(old_dir.join(PIN_SOURCES))?,
        open_map(old_dir.join(PIN_SOURCES6))?,
    );
    let (new4, new6) = (
        open_map(new_dir.join(PIN_SOURCES))?,
        open_map(new_dir.join(PIN_SOURCES6))?,
    );
    let data = |m: &aya::maps::Map| -> Option<MapData> {
        match m {
            aya::maps::Map::Array(d) => {
                let fd = d.fd().as_fd().try_clone_to_owned().ok()?;
                MapData::from_fd(fd).ok()
            }
            _ => None,
        }
    };
    let missing = || step_boxed(at, "top up the moved sources")("not the maps expected".into());
    let (new4, new6) = (
        data(&new4).ok_or_else(missing)?,
        data(&new6).ok_or_else(missing)?,
    );
    let final4 = sources_v4(&old4).map_err(step(at, "read the old IPv4 sources"))?;
    let final6 = sources_v6(&old6).map_err(step(at, "read the old IPv6 sources"))?;
    crate::table::top_up_v4(&new4, moved.seed, &final4, &moved.v4)
        .map_err(step(at, "top up the IPv4 sources"))?;
    crate::table::top_up_v6(&new6, moved.seed, &final6, &moved.v6)
        .map_err(step(at, "top up the IPv6 sources"))?;
    Ok(Moved {
        seed: moved.seed,
        v4: final4.into_iter().collect(),
        v6: final6.into_iter().collect(),
    })
}

/// Writes the subscribers of the old pins (of layout `from`) into their new map, and
/// their ids and names into the records: the new map's if the old pins have none.
fn write_subscribers(at: &Attachment, ebpf: &Ebpf, from: &Layout) -> Result<(), UpgradeError> {
    let new_pin = at.staging().join(PIN_SUBSCRIBERS);
    match from.map(PIN_SUBSCRIBERS) {
        Some(old) if old.value_size == layout8::ENTRY_BYTES => {
            let old: Array<MapData, crate::subscriber::Entry> =
                open_pin(at, &at.dir().join(PIN_SUBSCRIBERS))?;
            let aya::maps::Map::Array(new) = map_of(at, ebpf, MAP_SUBSCRIBERS)? else {
                return Err(step_boxed(at, "open the new subscribers' map")(
                    "not an array".into(),
                ));
            };
            layout8::copy(at, &old, new, &new_pin).map_err(step_boxed(at, "copy the subscribers"))
        }
        // None before layout 8: no room for any, no records.
        _ => {
            crate::subscriber::record::forget(at);
            Ok(())
        }
    }
}

/// Writes `counts` into the carried maps of the counters that are new (`fresh`).
fn write_carried(
    at: &Attachment,
    ebpf: &mut Ebpf,
    counts: &Counts,
    fresh: &dyn Fn(&str) -> bool,
) -> Result<(), UpgradeError> {
    if fresh(PIN_COUNTERS) {
        array::<Counters>(at, ebpf, MAP_COUNTERS_CARRIED)?
            .set(0, counts.counters, 0)
            .map_err(step(at, "write the carried counters"))?;
    }
    if fresh(PIN_POLICY_STATS) {
        let mut carried: HashMap<&mut MapData, u32, PolicyStats> =
            typed(at, ebpf, MAP_POLICY_STATS_CARRIED)?;
        for (slot, stats) in &counts.policy_stats {
            refill::refilled_map(|| carried.insert(slot, stats, 0))
                .map_err(step(at, "write the carried policy counters"))?;
        }
    }
    Ok(())
}

/// Swaps two directories in one step.
fn exchange(a: &Path, b: &Path) -> io::Result<()> {
    let c = |p: &Path| {
        CString::new(p.as_os_str().as_encoded_bytes())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
    };
    let (a, b) = (c(a)?, c(b)?);
    // SAFETY: two NUL-terminated paths.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Steps 4 to 6 (see the module docs), from what is pinned: `at` holds the new pins and
/// `upgrade_prog`, its staging directory the old pins.
/// `moved`: the sources an upgrade from LRU maps copied (`stage`), topped up once the old
/// program is gone; `None` when finishing an interrupted upgrade (the copy is lost with
/// the process that made it: what was charged between it and the switch stays behind).
fn finish(at: &Attachment, moved: Option<&Moved>) -> Result<(), UpgradeError> {
    egress_home(at)?;
    let link = bpf::obj_get(&at.link()).map_err(step(at, "open the pinned link"))?;
    let new_prog =
        bpf::obj_get(&at.upgrade_prog()).map_err(step(at, "open the new program's pin"))?;
    let running = bpf::xdp_link_info(link.as_fd())
        .map_err(step(at, "read what the link runs"))?
        .prog_id;
    let new_id = bpf::prog_id(new_prog.as_fd()).map_err(step(at, "read the new program"))?;
    crate::crash::hold("upgrade-copied");
    let moved = moved.map(|m| top_up_sources(at, m)).transpose()?;
    if running != new_id {
        let old_prog = bpf::prog_by_id(running).map_err(step(at, "open the old program"))?;
        bpf::replace_link_prog(link.as_fd(), new_prog.as_fd(), old_prog.as_fd())
            .map_err(step(at, "switch the link to the new program"))?;
    }
    bpf::wait_for_running_programs();
    carry(at)?;
    crate::crash::hold("upgrade-switched");
    if let Some(moved) = &moved {
        top_up_sources(at, moved)?;
    }
    if layout8::is_layout8(&at.staging()) && !layout8::is_layout8(&at.dir()) {
        let old = open_pin(at, &at.staging().join(PIN_SUBSCRIBERS))?;
        let mut new = open_pin(at, &at.dir().join(PIN_SUBSCRIBERS))?;
        layout8::top_up(&old, &mut new).map_err(step_boxed(at, "carry the subscribers' cells"))?;
    }
    std::fs::remove_file(at.upgrade_prog()).map_err(step(at, "unpin the new program"))?;
    pins::remove_dir_of_pins(&at.staging()).map_err(step(at, "remove the old pins"))
}

/// Moves the interface's egress pins back where they belong if an ingress upgrade's
/// swap carried them to its staging directory (see the module docs).
fn egress_home(at: &Attachment) -> Result<(), UpgradeError> {
    match at.egress_in_staging() {
        Some((moved, home)) => {
            std::fs::rename(moved, home).map_err(step(at, "move the egress pins back"))
        }
        None => Ok(()),
    }
}

/// Step 5: what the old counters counted, into the carried maps of those that were made
/// anew. An assignment, so doing it twice (after a kill) changes nothing.
fn carry(at: &Attachment) -> Result<(), UpgradeError> {
    let staging = at.staging();
    let id = |dir: &Path, pin: &str| -> Result<u32, UpgradeError> {
        Ok(bpf::map_info(&dir.join(pin))
            .map_err(step(at, format!("read map '{pin}'")))?
            .id)
    };
    let mut fresh = Vec::new();
    for (live, _) in CARRIED_FOR {
        if id(&staging, live)? != id(&at.dir(), live)? {
            fresh.push(live);
        }
    }
    if fresh.is_empty() {
        return Ok(());
    }
    let old = identify(&staging, &at.label())?;
    let settings = read_settings(&staging, old).map_err(decode_err(at))?;
    let counts = read_counts(&staging, old, &settings).map_err(decode_err(at))?;
    if fresh.contains(&PIN_COUNTERS) {
        let mut carried: Array<MapData, Counters> = open_pin(at, &at.counters_carried())?;
        carried
            .set(0, counts.counters, 0)
            .map_err(step(at, "write the carried counters"))?;
    }
    if fresh.contains(&PIN_POLICY_STATS) {
        let mut carried: HashMap<MapData, u32, PolicyStats> =
            open_pin(at, &at.policy_stats_carried())?;
        for (slot, stats) in &counts.policy_stats {
            refill::refilled_map(|| carried.insert(slot, stats, 0))
                .map_err(step(at, "write the carried policy counters"))?;
        }
    }
    Ok(())
}

fn open_pin<T>(at: &Attachment, path: &PathBuf) -> Result<T, UpgradeError>
where
    T: TryFrom<aya::maps::Map, Error = MapError>,
{
    let what = format!("open {}", path.display());
    let data = MapData::from_pin(path).map_err(step(at, what.clone()))?;
    let map = aya::maps::Map::from_map_data(data).map_err(step(at, what.clone()))?;
    T::try_from(map).map_err(step(at, what))
}

/// The layout of `at`'s pins, and its settings read as today's types: for `status`,
/// which shows older attachments too.
pub fn settings_of(at: &Attachment) -> Result<(&'static Layout, Settings), UpgradeError> {
    let l = identify(&at.dir(), &at.label())?;
    let settings = read_settings(&at.dir(), l).map_err(decode_err(at))?;
    Ok((l, settings))
}

#[cfg(test)]
mod tests {
    use shaper_common::{
        layout::{LAYOUTS, SIZED_AT_ATTACH},
        maps::{
            PIN_ADMISSION, PIN_AGGREGATES, PIN_EVENTS, PIN_FIRSTS, PIN_LAYOUT, PIN_METER2,
            PIN_METER2_6, PIN_METER2_SHARED, PIN_POLICIES, PIN_POLICY_STATS,
            PIN_POLICY_STATS_CARRIED, PIN_SOURCES, PIN_SOURCES6, PIN_TRACES, PIN_WATCH,
        },
    };

    use super::*;

    /// An upgrade is asked for with the settings as they are: the policy generation and
    /// the prefix counts the request resolves are not settings, so they alone never refuse
    /// it; another rate does, and so do prefix policies named with it.
    #[test]
    fn an_upgrade_is_refused_other_settings_but_not_the_resolved_prefixes() {
        let at = Attachment::new("eth0", None);
        let from = LAYOUTS.iter().find(|l| l.version == 5).unwrap();
        let current = Config {
            rate_bps: 10_000_000,
            burst_bytes: 65_536,
            ..Config::default()
        };
        let resolved = Config {
            policy_gen: current.policy_gen + 3,
            prefixes_v4: current.prefixes_v4 + 2,
            prefixes_v6: current.prefixes_v6 + 1,
            ..current
        };
        assert!(refuse_changes(&at, from, &current, &resolved, false).is_ok());
        let faster = Config {
            rate_bps: 20_000_000,
            ..resolved
        };
        assert!(refuse_changes(&at, from, &current, &faster, false).is_err());
        assert!(refuse_changes(&at, from, &current, &current, true).is_err());
    }

    /// The object file `attach` loads against the newest layout: a map added, resized or
    /// retyped in the kernel program fails here until `shaper_common::layout` has a new
    /// layout (and with it, an upgrade path).
    #[test]
    fn the_object_file_has_the_newest_layout() {
        let object = aya_obj::Object::parse(object::EBPF_OBJECT).expect("the object parses");
        let newest = layout::current();
        // The program's read-only globals (`SHAPER_SOURCE_BUCKETS`), set at each load and
        // never pinned.
        let pinned = |name: &String| !name.starts_with('.');
        let mut names: Vec<&String> = object.maps.keys().filter(|n| pinned(n)).collect();
        names.sort();
        assert_eq!(
            names.len(),
            newest.maps.len(),
            "the object's maps {names:?} are not those of layout {}",
            newest.version
        );
        for (name, map) in object.maps.iter().filter(|(n, _)| pinned(n)) {
            let m = newest
                .maps
                .iter()
                .find(|m| m.name == name)
                .unwrap_or_else(|| panic!("map {name} is in no layout: add a layout"));
            let entries = if m.max_entries == SIZED_AT_ATTACH {
                SIZED_AT_ATTACH
            } else {
                map.max_entries()
            };
            assert_eq!(
                (
                    map.map_type(),
                    map.key_size(),
                    map.value_size(),
                    entries,
                    map.map_flags()
                ),
                (m.map_type, m.key_size, m.value_size, m.max_entries, m.flags),
                "map {name} differs from layout {}: a changed map needs a new layout",
                newest.version
            );
        }
    }

    fn reused(from: u32) -> Vec<&'static str> {
        let at = Attachment::new("eth0", None);
        let from = layout::layout(from).unwrap();
        let mut pins: Vec<&str> = plan(&at, from)
            .unwrap()
            .into_iter()
            .filter(|(_, reuse)| *reuse)
            .map(|(m, _)| m.pin)
            .collect();
        pins.sort_unstable();
        pins
    }

    #[test]
    fn an_upgrade_reuses_every_map_whose_layout_is_unchanged() {
        // Layout 1's config, policies and counters changed; admission is new; the tries
        // are sized for subscribers since layout 8. Every layout before 11 has its sources
        // in LRU hash maps, whose keys are moved into new tables.
        assert_eq!(reused(1), [PIN_AGGREGATES]);
        let all_but = |not: &[&str]| {
            let mut pins: Vec<&str> = layout::current()
                .maps
                .iter()
                .map(|m| m.pin)
                .filter(|p| !not.contains(p) && ![PIN_SOURCES, PIN_SOURCES6].contains(p))
                .collect();
            pins.sort_unstable();
            pins
        };
        // Every layout before 6 lacks the traces and the first-sighting cells, and its
        // config, policies, counters and policy counters (and so what carries them)
        // changed since (the doorkeeper's seed, allowance and sightings, the shaping
        // delays' sum; the second meter's settings, counts and cells).
        let changed = [
            PIN_PREFIXES_V4,
            PIN_PREFIXES_V6,
            PIN_SUBSCRIBERS,
            PIN_METER2,
            PIN_METER2_6,
            PIN_METER2_SHARED,
            PIN_LAYOUT,
            PIN_CONFIG,
            PIN_POLICIES,
            PIN_COUNTERS,
            PIN_COUNTERS_CARRIED,
            PIN_POLICY_STATS,
            PIN_POLICY_STATS_CARRIED,
            PIN_TRACES,
            PIN_FIRSTS,
        ];
        // Layouts 2 to 4 lack the events and their control (`shaper watch`) too.
        let watch = [PIN_EVENTS, PIN_WATCH];
        for from in 2..=4 {
            assert_eq!(
                reused(from),
                all_but(&[&changed[..], &watch].concat()),
                "layout {from}"
            );
        }
        assert!(reused(2).contains(&PIN_ADMISSION));
        assert_eq!(reused(5), all_but(&changed));
        // Layout 6 lacks the second meter's maps; its settings, policies, counters and
        // policy counters grew by the second meter's fields.
        assert_eq!(
            reused(6),
            all_but(&[
                PIN_PREFIXES_V4,
                PIN_PREFIXES_V6,
                PIN_SUBSCRIBERS,
                PIN_METER2,
                PIN_METER2_6,
                PIN_METER2_SHARED,
                PIN_LAYOUT,
                PIN_CONFIG,
                PIN_POLICIES,
                PIN_COUNTERS,
                PIN_COUNTERS_CARRIED,
                PIN_POLICY_STATS,
                PIN_POLICY_STATS_CARRIED,
            ])
        );
        // Layout 7 lacks the subscribers, and its tries were sized for prefix policies
        // alone: they are written anew from its policies.
        assert_eq!(
            reused(7),
            all_but(&[
                PIN_PREFIXES_V4,
                PIN_PREFIXES_V6,
                PIN_SUBSCRIBERS,
                PIN_LAYOUT
            ])
        );
        // Layout 8's subscribers' entries held their ids and names: copied into a new map.
        assert_eq!(reused(8), all_but(&[PIN_SUBSCRIBERS, PIN_LAYOUT]));
        // Layout 9's maps of one entry per policy slot (16,384 each) are kept at their
        // size: today's are sized at attach.
        assert_eq!(reused(9), all_but(&[PIN_LAYOUT]));
        assert_eq!(reused(10), all_but(&[PIN_LAYOUT]));
        // Today's own tables are reused.
        assert!(reused(LAYOUT_VERSION).contains(&PIN_SOURCES));
        assert!(reused(LAYOUT_VERSION).contains(&PIN_SOURCES6));
        // Growing the second meter's maps reuses every map but those two (and the
        // version): every cell, counter and policy stays.
        let kept = |anew: &[&str]| -> Vec<&str> {
            let mut kept: Vec<&str> = plan_anew(anew)
                .into_iter()
                .filter(|(_, reuse)| *reuse)
                .map(|(m, _)| m.pin)
                .collect();
            kept.retain(|p| ![PIN_SOURCES, PIN_SOURCES6].contains(p));
            kept.sort_unstable();
            kept
        };
        assert_eq!(
            kept(&[PIN_METER2, PIN_METER2_6]),
            all_but(&[PIN_METER2, PIN_METER2_6, PIN_LAYOUT])
        );
        // Growing the source tables reuses every map but those two (and the version).
        let grown = plan_anew(&[PIN_SOURCES, PIN_SOURCES6]);
        assert!(
            grown.iter().all(
                |(m, reuse)| *reuse != [PIN_SOURCES, PIN_SOURCES6, PIN_LAYOUT].contains(&m.pin)
            )
        );
        // The version is always written anew.
        assert!(!reused(LAYOUT_VERSION).contains(&PIN_LAYOUT));
    }

    /// The second meter's per-key maps are sized at load: a small one is still the layout.
    #[test]
    fn a_small_second_meter_map_is_of_the_layout() {
        for pin in [PIN_METER2, PIN_METER2_6] {
            let m = layout::current().map(pin).unwrap();
            assert_eq!(m.max_entries, SIZED_AT_ATTACH, "{pin}");
            assert!(m.matches(
                m.map_type,
                m.key_size,
                m.value_size,
                shaper_common::maps::METER2_UNUSED_ENTRIES,
                m.flags
            ));
        }
    }

    #[test]
    fn an_upgrade_that_cannot_carry_cells_is_refused() {
        let sources = layout::current().map(PIN_SOURCES).unwrap();
        let other = MapLayout {
            value_size: sources.value_size - 8,
            ..*sources
        };
        let maps: Vec<MapLayout> = layout::current()
            .maps
            .iter()
            .map(|m| if m.pin == PIN_SOURCES { other } else { *m })
            .collect();
        let older = Layout {
            version: LAYOUTS.len() as u32,
            maps: maps.leak(),
        };
        let e = plan(&Attachment::new("eth0", None), &older).unwrap_err();
        assert!(
            matches!(
                e,
                UpgradeError::Cells {
                    pin: PIN_SOURCES,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("detach and attach again"), "{e}");
    }

    /// Counters made anew get carried maps made anew too, even where the carried map's
    /// layout did not change (writing the old one would change the old attachment's
    /// counts before the swap); unchanged counters keep theirs.
    #[test]
    fn new_counters_get_new_carried_maps() {
        let changed = |pin: &str| {
            let maps: Vec<MapLayout> = layout::current()
                .maps
                .iter()
                .map(|m| MapLayout {
                    value_size: m.value_size - u32::from(m.pin == pin) * 8,
                    ..*m
                })
                .collect();
            let older = Layout {
                version: LAYOUTS.len() as u32,
                maps: maps.leak(),
            };
            let mut fresh: Vec<&str> = plan(&Attachment::new("eth0", None), &older)
                .unwrap()
                .into_iter()
                .filter(|(_, reuse)| !*reuse)
                .map(|(m, _)| m.pin)
                .collect();
            fresh.sort_unstable();
            fresh
        };
        assert_eq!(changed(""), [PIN_LAYOUT]);
        assert_eq!(
            changed(PIN_COUNTERS),
            [PIN_COUNTERS, PIN_COUNTERS_CARRIED, PIN_LAYOUT]
        );
        assert_eq!(
            changed(PIN_POLICY_STATS),
            [PIN_LAYOUT, PIN_POLICY_STATS, PIN_POLICY_STATS_CARRIED]
        );
    }

    /// The swap of step 3 (see the module docs): two directories change places in one
    /// step, and a missing one is an error, not a half-done swap.
    #[test]
    fn exchange_swaps_two_directories() {
        let root = std::env::temp_dir().join(format!("shaper-exchange-{}", std::process::id()));
        let (a, b) = (root.join("a"), root.join("b"));
        for (dir, name) in [(&a, "old"), (&b, "new")] {
            std::fs::create_dir_all(dir).unwrap();
            std::fs::write(dir.join(name), name).unwrap();
        }
        let swap = exchange(&a, &b);
        let swapped = (a.join("new").exists(), b.join("old").exists());
        let missing = exchange(&a, &root.join("c"));
        std::fs::remove_dir_all(&root).unwrap();
        swap.unwrap();
        assert_eq!(swapped, (true, true));
        assert_eq!(
            missing.unwrap_err().kind(),
            io::ErrorKind::NotFound,
            "exchanging with a missing directory"
        );
    }

    #[test]
    fn the_upgrade_command_spells_the_settings() {
        let config = Config::per_source(8_000_000, 65_536).unwrap();
        assert_eq!(
            attach_command(&Attachment::new("eth0", None), &config),
            "shaper attach eth0 --rate 8mbit --burst 64k"
        );
        assert_eq!(
            attach_command(&Attachment::new("veth1", Some("lab")), &config),
            "shaper -n lab attach veth1 --rate 8mbit --burst 64k"
        );
    }
}

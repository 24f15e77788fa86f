//! Writes the benchmark report: `results.md`, `results.json` and SVG plots in one directory.
//!
//! Ratios to a baseline measured in the same run are the headline; absolute figures are
//! context (they depend on the machine). Nothing is written for a part that was not
//! measured: results.md says it is missing and why.

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    time::{SystemTime, UNIX_EPOCH},
};

use anyhow::{Context as _, Result, anyhow};
use plotters::{
    prelude::*,
    style::text_anchor::{HPos, Pos, VPos},
};
use serde::Serialize;

use super::{
    AccuracyResults,
    flood::FloodRow,
    per_packet::{Method, PerPacketResults},
    scale::ScaleResults,
    spread::Summary,
};

/// Where the figures were measured.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct Machine {
    pub host: String,
    pub kernel: String,
    pub cpu_model: String,
    pub cpus: usize,
    /// ISO 8601, UTC, from the system clock.
    pub date_utc: String,
    /// The git revision of the working tree measured (`git rev-parse HEAD`), and whether
    /// it had changes outside `bench/` (the results themselves).
    pub git_revision: String,
    pub git_dirty: bool,
    /// SHA-256 of the kernel programs' sources measured (`current::kernel_sources`);
    /// absent from runs before it was recorded.
    #[serde(default)]
    pub kernel_sources_sha256: String,
    /// `/proc/loadavg`'s 1, 5 and 15-minute load averages when the run started and ended.
    pub loadavg_start: String,
    pub loadavg_end: String,
}

/// The first three fields of /proc/loadavg.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// `git rev-parse HEAD` and whether tracked files outside `bench/` differ from it, in the
/// current directory.
fn git_revision() -> (String, bool) {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .stderr(std::process::Stdio::null())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    let rev = git(&["rev-parse", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty = git(&[
        "status",
        "--porcelain",
        "--untracked-files=no",
        "--",
        ".",
        ":(exclude)bench",
    ])
    .is_some_and(|s| !s.is_empty());
    (rev, dirty)
}

impl Machine {
    /// The first line of a results file `shaper-lab bench --only ONLY` wrote: where, when,
    /// at which revision, and the load (at the end too, if it was read).
    pub fn written_by(&self, only: &str) -> String {
        let end = match self.loadavg_end.is_empty() {
            true => String::new(),
            false => format!(", {} at the end", self.loadavg_end),
        };
        format!(
            "Written by `shaper-lab bench --only {only}` on {} (kernel {}, {} x {}), {} UTC, \
             at git revision {}; load average {} at the start{end}.\n",
            self.host,
            self.kernel,
            self.cpus,
            self.cpu_model,
            self.date_utc,
            self.revision(),
            self.loadavg_start
        )
    }

    /// The revision as results name it: `abc123…`, `abc123… with uncommitted changes`.
    pub fn revision(&self) -> String {
        match self.git_dirty {
            true => format!("{} with uncommitted changes", self.git_revision),
            false => self.git_revision.clone(),
        }
    }

    /// Reads this machine's description from /proc and the clock.
    pub fn this() -> Self {
        let read = |path: &str| {
            std::fs::read_to_string(path)
                .map(|s| s.trim().to_owned())
                .ok()
        };
        let cpuinfo = read("/proc/cpuinfo").unwrap_or_default();
        let field = |name: &str| {
            cpuinfo.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == name).then(|| v.trim().to_owned())
            })
        };
        let processors = cpuinfo
            .lines()
            .filter(|l| l.split(':').next().is_some_and(|k| k.trim() == "processor"))
            .count();
        let (rev, dirty) = git_revision();
        Machine {
            host: read("/proc/sys/kernel/hostname").unwrap_or_else(|| "this machine".into()),
            kernel: read("/proc/sys/kernel/osrelease").unwrap_or_else(|| "unknown".into()),
            cpu_model: field("model name")
                .or_else(|| field("Model"))
                .or_else(|| field("cpu model"))
                .unwrap_or_else(|| "unknown".into()),
            cpus: if processors > 0 {
                processors
            } else {
                std::thread::available_parallelism().map_or(0, usize::from)
            },
            date_utc: utc_now(),
            git_revision: rev,
            git_dirty: dirty,
            kernel_sources_sha256:
                super::current::kernel_sources(&super::current::workspace_root())
                    .unwrap_or_else(|e| format!("unknown ({e})")),
            loadavg_start: loadavg(),
            loadavg_end: String::new(),
        }
    }
}

/// The system clock as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's civil_from_days.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// The accuracy part as the report sees it.
#[derive(Clone, Debug, Serialize)]
struct AccuracySection<'a> {
    /// "measured", or "missing" with the reason.
    status: &'static str,
    reason: Option<&'a str>,
    results: Option<&'a AccuracyResults>,
}

#[derive(Serialize)]
struct Json<'a> {
    machine: &'a Machine,
    quick: bool,
    /// Where the kernel figures of this run are (`results-kernels.json`, this kernel's
    /// entry), or why there are none.
    kernel: KernelSection<'a>,
    per_packet: &'a PerPacketResults,
    scale: &'a ScaleResults,
    accuracy: AccuracySection<'a>,
    flood: Option<&'a [FloodRow]>,
}

#[derive(Serialize)]
struct KernelSection<'a> {
    /// "measured", or "missing" with the reason.
    status: &'static str,
    reason: Option<&'a str>,
    results: &'static str,
}

/// Everything the report is made of.
pub struct Inputs<'a> {
    pub machine: &'a Machine,
    /// Whether this was a `--quick` run (too short for figures worth quoting).
    pub quick: bool,
    /// Why the kernel figures (results-kernels.*) were not measured; `None` if they were.
    pub kernel_missing: Option<&'a str>,
    pub per_packet: &'a PerPacketResults,
    pub scale: &'a ScaleResults,
    /// `None` when the accuracy part was not run or failed; `accuracy_missing` says why.
    pub accuracy: Option<&'a AccuracyResults>,
    pub accuracy_missing: Option<&'a str>,
    /// The spoofed flood; `None` when it was not run or failed (`flood_missing` says why).
    pub flood: Option<&'a [FloodRow]>,
    pub flood_missing: Option<&'a str>,
}

/// Writes results.md, results.json and the plots into `dir` (created if needed);
/// returns the files written.
pub fn write(dir: &Path, inputs: &Inputs<'_>) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut written = Vec::new();
    let mut plots = Vec::new();

    let path = dir.join("per_packet.svg");
    plot_per_packet(&path, inputs.per_packet)?;
    plots.push(path);
    let path = dir.join("scale.svg");
    plot_scale(&path, inputs.per_packet, inputs.scale)?;
    plots.push(path);
    if let Some(acc) = inputs.accuracy {
        if !acc.rows.is_empty() {
            let path = dir.join("accuracy.svg");
            plot_accuracy(&path, acc)?;
            plots.push(path);
        }
        let mut names = Vec::new();
        for s in &acc.series {
            let mut name = format!("timeseries-{}", file_safe(&s.limiter));
            if names.contains(&name) {
                name = format!("{name}-{}", s.rate_bps);
            }
            names.push(name.clone());
            let path = dir.join(format!("{name}.svg"));
            plot_series(&path, s)?;
            plots.push(path);
        }
    }

    let accuracy = AccuracySection {
        status: if inputs.accuracy.is_some() {
            "measured"
        } else {
            "missing"
        },
        reason: match inputs.accuracy {
            Some(_) => None,
            None => Some(inputs.accuracy_missing.unwrap_or("not run")),
        },
        results: inputs.accuracy,
    };
    let json = Json {
        machine: inputs.machine,
        quick: inputs.quick,
        kernel: KernelSection {
            status: if inputs.kernel_missing.is_some() {
                "missing"
            } else {
                "measured"
            },
            reason: inputs.kernel_missing,
            results: super::KERNELS_JSON,
        },
        per_packet: inputs.per_packet,
        scale: inputs.scale,
        accuracy,
        flood: inputs.flood,
    };
    let path = dir.join("results.json");
    let text = serde_json::to_string_pretty(&json)?;
    std::fs::write(&path, text + "\n").with_context(|| format!("writing {}", path.display()))?;
    written.push(path);

    let path = dir.join("results.md");
    let plot_names: Vec<String> = plots
        .iter()
        .filter_map(|p| p.file_name()?.to_str().map(str::to_owned))
        .collect();
    std::fs::write(&path, markdown(inputs, &plot_names))
        .with_context(|| format!("writing {}", path.display()))?;
    written.push(path);
    written.extend(plots);
    Ok(written)
}

fn file_safe(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect()
}

fn human_count(n: u32) -> String {
    match n {
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{}M", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{}K", n >> 10),
        n => n.to_string(),
    }
}

fn human_bps(bps: f64) -> String {
    match bps {
        b if b >= 1e9 => format!("{:.3} Gbit/s", b / 1e9),
        b if b >= 1e6 => format!("{:.3} Mbit/s", b / 1e6),
        b if b >= 1e3 => format!("{:.3} kbit/s", b / 1e3),
        b => format!("{b:.0} bit/s"),
    }
}

fn markdown(inputs: &Inputs<'_>, plots: &[String]) -> String {
    let (m, pp, scale) = (inputs.machine, inputs.per_packet, inputs.scale);
    let mut md = String::new();
    let w = &mut md;
    let _ = writeln!(w, "# shaper benchmark results\n");
    let _ = writeln!(
        w,
        "Measured by `cargo xtask bench{}` on **{}**: kernel **{}**, {} × {}, on {} (UTC), \
         at git revision **{}**. Load average (1, 5, 15 min) {} at the start, {} at the end.\n",
        if inputs.quick { " --quick" } else { "" },
        m.host,
        m.kernel,
        m.cpus,
        m.cpu_model,
        m.date_utc,
        m.revision(),
        m.loadavg_start,
        if m.loadavg_end.is_empty() {
            "not read"
        } else {
            &m.loadavg_end
        }
    );
    let _ = writeln!(
        w,
        "Kernel programs' sources: sha256 `{}` (`bench/stale.toml` lists later changes to them not measured here, and which figures they make stale).\n",
        m.kernel_sources_sha256
    );
    if inputs.quick {
        let _ = writeln!(
            w,
            "**This was a `--quick` run**: short measurements to check that the benchmark \
             works. Do not quote its figures.\n"
        );
    }
    let _ = writeln!(
        w,
        "Every figure is measured next to a baseline in the same run: ratios to that \
         baseline are the result, absolute times are context for this machine.\n"
    );

    // Headline.
    let _ = writeln!(w, "## Headline\n");
    let noop = pp.noop().ns_per_packet;
    let floor = pp.floor().map_or(f64::NAN, |f| f.ns_per_packet);
    for (id, what) in [
        ("pass_existing", "passing a packet of a known source"),
        ("drop_existing", "dropping a packet of a known source"),
        ("new_source", "the first packet of a new source"),
        (
            "new_source_evict",
            "a new source into a full table (an idle source's way taken)",
        ),
        ("cold_1m", "a known source drawn at random from 1M tracked"),
    ] {
        if let Some(c) = pp.case(id) {
            let _ = writeln!(
                w,
                "- {what}: **{:.2}× the floor**, {:.2}× a no-op XDP program ({:.1} ns against \
                 {:.1} ns and {:.1} ns; {:.1} Mpps per core)",
                c.ratio_to_floor,
                c.ratio_to_noop,
                c.ns_per_packet,
                floor,
                noop,
                c.packets_per_sec / 1e6
            );
        }
    }
    if let (Some(refused), Some(known)) = (
        pp.case("refused_newcomer_single"),
        pp.case("pass_known_in_full_map_single"),
    ) {
        // Run by run (the same runs measured both), for the spread.
        let per_run: Vec<f64> = refused
            .ns_per_packet_runs
            .iter()
            .zip(&known.ns_per_packet_runs)
            .map(|(r, k)| r / k)
            .collect();
        let (lo, hi) = per_run
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| {
                (lo.min(x), hi.max(x))
            });
        let _ = writeln!(
            w,
            "- a refused newcomer (a new source per frame, its first sighting: a trace left, \
             no cell) against a known source's pass, both drawn from the same full default \
             map: **{:.2}×** ({:.1} ns against {:.1} ns; {lo:.2}–{hi:.2}× run by run; issue \
             22's bound is 1.5×)",
            refused.ns_per_packet / known.ns_per_packet,
            refused.ns_per_packet,
            known.ns_per_packet,
        );
    }
    let yg = &pp.colour.yellow_over_green;
    let _ = writeln!(
        w,
        "- a yellow frame (over the committed rate, within the excess: DSCP rewritten, IPv4 \
         checksum updated) against a green one, both under a second meter: **{:.2}×** \
         ({:.2}–{:.2}× run by run; issue 24's bound is {:.2}×)",
        yg.median, yg.min, yg.max, pp.colour.bound
    );
    if let Some(sub) = &pp.subscriber {
        let (a, b) = (&sub.over_per_source, &sub.over_per_source_v6);
        let _ = writeln!(
            w,
            "- a known key's pass under a subscriber (its plan, its one bucket over all of \
             its prefixes) against a per-source pass on the same object: **{:.2}×** IPv4 \
             ({:.2}–{:.2}× run by run), **{:.2}×** IPv6 ({:.2}–{:.2}×); issue 31's target \
             is {:.1}×",
            a.median, a.min, a.max, b.median, b.min, b.max, sub.target
        );
        if let Some(m) = &sub.million {
            let r = &m.over_per_source;
            let _ = writeln!(
                w,
                "- a key of one of {} subscribers drawn at random against a per-source key \
                 drawn at random from as many on the same object (single shots, cold \
                 entries): **{:.2}×** ({:.2}–{:.2}× run by run; {:.1} ns against {:.1} ns); \
                 a key's first frame after a change of routes (its route looked up in the \
                 trie again): {:.2}× ({:.1} ns against {:.1} ns)",
                human_count(m.subscribers),
                r.median,
                r.min,
                r.max,
                m.subscriber_ns.median,
                m.per_source_ns.median,
                m.first_over_per_source.median,
                m.first_subscriber_ns.median,
                m.first_per_source_ns.median
            );
        }
    }
    if let Some(r) = scale.rows.last() {
        let _ = writeln!(
            w,
            "- kernel memory: **{:.0} bytes per tracked source** (both maps, IPv4 and IPv6, of {} entries each, as attach preallocates them: {:.1} MiB)",
            r.bytes_per_source,
            human_count(r.capacity),
            r.memlock_filled_bytes as f64 / (1 << 20) as f64
        );
    }
    if let Some(acc) = inputs.accuracy {
        // Rate error per rate and limiter (comparable runs only), the generator's reach
        // where it fell short, and softirq CPU per Mpkt of shaper against htb.
        for line in super::accuracy::summary_lines(acc) {
            let _ = writeln!(w, "- {line}");
        }
    } else {
        let _ = writeln!(w, "- rate accuracy: not measured in this run (see below)");
    }

    // Per-packet.
    let _ = writeln!(w, "\n## Per-packet cost\n");
    let _ = writeln!(
        w,
        "`BPF_PROG_TEST_RUN` on the loaded (not attached) programs, median of {} runs. \
         *Loop*: the kernel runs the program {} times on one frame and reports the mean, so \
         the source's map entry is hot. *Single*: one run per frame over {} distinct frames \
         per measurement (each a new source, or a known source in shuffled order), the \
         kernel's duration of each averaged; each reading carries the kernel's fixed cost \
         of timing one run, so these cases are given as the no-op's loop figure plus their \
         excess over a no-op measured the same way in the same run. The single-shot \
         measurement of a hot known source checks that method against the loop figure. \
         New sources are 64-byte frames from addresses never seen before; the eviction case \
         uses a {}-entry map kept full.\n\n\
         Two baselines, from the same run: a no-op XDP program, and the *floor*, a minimal \
         XDP program of the bench's own object (parse an untagged IPv4 frame, read the \
         clock, look the source up in an LRU hash map, one compare-and-swap on its value: \
         what any per-source meter must at least do). The floor is the headline: the \
         no-op's cost is mostly the kernel's fixed cost of running a program and moves \
         3× from one machine of this kind to another (7 ns on one, 26 ns on another), so a \
         ratio to it says more about the machine than about shaper.\n",
        pp.runs, pp.repeat, pp.frames_per_run, pp.eviction_map_entries
    );
    let _ = writeln!(
        w,
        "| case | method | ns/packet | × floor | × no-op | over no-op (ns) | Mpps per core |"
    );
    let _ = writeln!(w, "| --- | --- | ---: | ---: | ---: | ---: | ---: |");
    for c in &pp.cases {
        let method = match c.method {
            Method::Loop => format!("loop ×{}", c.packets_per_run),
            Method::Single => format!("single ×{}", c.packets_per_run),
        };
        let _ = writeln!(
            w,
            "| {} | {method} | {:.1} | {:.2} | {:.2} | {:+.1} | {:.1} |",
            c.case,
            c.ns_per_packet,
            c.ratio_to_floor,
            c.ratio_to_noop,
            c.over_noop_ns,
            c.packets_per_sec / 1e6
        );
    }
    for c in pp.cases.iter().filter(|c| c.note.is_some()) {
        let _ = writeln!(w, "\n{}: {}", c.case, c.note.as_deref().unwrap_or_default());
    }
    plot_link(
        w,
        plots,
        "per_packet.svg",
        "per-packet cost against the no-op",
    );
    colour_markdown(w, pp);
    versus_markdown(w, pp, inputs.kernel_missing);

    // Scale.
    let _ = writeln!(w, "\n## Scale\n");
    let _ = writeln!(
        w,
        "One source table per size, filled from userspace to its room. Memory is the \
         kernel's own accounting for the maps (`memlock` in `/proc/self/fdinfo`, as \
         `bpftool map show` prints it), summed over both per-source tables, IPv4 and IPv6, \
         which attach creates with room for `--max-sources` keys each (buckets of eight ways); they are preallocated, so \
         the figure is the same empty and full. *Known source, same key* is the loop method on one key ({} runs × {}); \
         *known source, random key* is the single-shot case over keys drawn from the whole \
         map.\n",
        scale.runs, scale.repeat
    );
    let _ = writeln!(
        w,
        "| tracked sources | entries after fill | memlock empty | memlock full | bytes per source | known source, same key: ns (× no-op) | known source, random key: ns (× no-op) |"
    );
    let _ = writeln!(w, "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for r in &scale.rows {
        // The cold-key case of this population (not the eviction case, whose map has the
        // same size as the smallest population).
        let cold = pp.cases.iter().find(|c| {
            c.method == Method::Single
                && c.id.starts_with("cold_")
                && c.tracked_sources == Some(r.capacity)
        });
        let cold = cold.map_or("not measured".to_owned(), |c| {
            format!("{:.1} ({:.2}×)", c.ns_per_packet, c.ratio_to_noop)
        });
        let _ = writeln!(
            w,
            "| {} | {} | {} | {} | {:.1} | {:.1} ({:.2}×) | {cold} |",
            human_count(r.capacity),
            r.entries,
            r.memlock_empty_bytes,
            r.memlock_filled_bytes,
            r.bytes_per_source,
            r.hot_pass_ns,
            r.hot_ratio_to_noop
        );
    }
    plot_link(
        w,
        plots,
        "scale.svg",
        "per-packet cost against tracked sources",
    );

    // Accuracy.
    let _ = writeln!(w, "\n## Rate accuracy and CPU cost\n");
    match inputs.accuracy {
        None => {
            let _ = writeln!(
                w,
                "Not measured in this run: {}. No figures are given for it.",
                inputs.accuracy_missing.unwrap_or("not run")
            );
        }
        Some(acc) => accuracy_markdown(w, acc, plots),
    }

    // Flood.
    let _ = writeln!(w, "\n## Under a spoofed flood\n");
    match inputs.flood {
        None => {
            let _ = writeln!(
                w,
                "Not measured in this run: {}.",
                inputs.flood_missing.unwrap_or("not run")
            );
        }
        Some(rows) => flood_markdown(w, rows),
    }
    md
}

fn flood_markdown(w: &mut String, rows: &[FloodRow]) {
    let _ = writeln!(
        w,
        "Three real sources (one at twice its 8 Mbit/s limit, two at half of it) and a flood \
         of 60-byte frames, each from a source address never used before, sent as fast as \
         one thread writes them, through the routed lab of the accuracy case: shaper, the nft \
         meter and hashlimit on the router's input veth, tbf and htb on its egress. The \
         receiver counts at its own veth, behind every limiter. The nft meter's set and \
         hashlimit's table hold {} entries, shaper's default map size. Burst 32 KiB \
         (hashlimit: at least a second of the rate, its minimum).\n\n\
         tbf and htb keep no state per source. tbf is one bucket: every source, real or \
         spoofed, shares its 8 Mbit/s, so the real sources lose in proportion to what the \
         flood offers. htb has the classes it was configured with, here one per real source, \
         and a default class (8 Mbit/s) that every other source shares: the configured \
         sources keep their rate, the flood gets the default class's, and a source nobody \
         configured (a new customer) shares it with the flood. Both queue on the router's \
         egress, so every flood frame is first received and routed.\n\n\
         shaper with no admission flag gives a new key a cell on its second sighting within \
         10 s, or on its first within a first-sighting allowance (a 64th of the admission \
         rate); a spoofed address is almost never seen twice. The rows below the peers are \
         shaper's default under other traffic beside the same real sources: floods from \
         pools of addresses that each repeat (each a source held to its rate), the pool of \
         1,000 under an aggregate on a policy for all of IPv4 (the remedy; it holds the real \
         sources too), and a warm start of {} sources, every one new, each sending a \
         1,000-byte frame a second.\n",
        super::peers::TABLE_ENTRIES,
        super::flood::WARM_SOURCES
    );
    let _ = writeln!(
        w,
        "| limiter | where | burst | flood frames sent | frames/s | flood frames that reach the receiver | under-limit real sources' loss | keys created | of them false admissions | flood sources' frames lost to admission, per source | NET_RX softirq per flood frame | all softirq per flood frame |"
    );
    let _ = writeln!(
        w,
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    let na = |v: Option<u64>| v.map_or("n/a".to_owned(), |k| k.to_string());
    for r in rows {
        let _ = writeln!(
            w,
            "| {} | {} | {} | {} | {:.0} | {:.1}% | {:.1}% | {} | {} | {} | {:.0} ns | {:.0} ns |",
            r.limiter,
            r.placement,
            r.burst_bytes,
            r.flood_sent_packets,
            r.flood_sent_per_sec,
            r.flood_passed_pct,
            r.real_loss_pct,
            na(r.keys_created),
            na(r.false_admissions),
            r.lost_per_source
                .map_or("n/a".to_owned(), |l| format!("{l:.3}")),
            r.net_rx_ns_per_flood_frame,
            r.softirq_ns_per_flood_frame
        );
    }
}

/// A time over runs: the median and the range, in ns.
fn ns_range(s: &Summary) -> String {
    format!("{:.1} ({:.1}–{:.1})", s.median, s.min, s.max)
}

/// A ratio over runs: the median in bold, and the range.
fn ratio_range(s: &Summary) -> String {
    format!("**{:.3}** ({:.3}–{:.3})", s.median, s.min, s.max)
}

/// The second meter's rows against the single-rate pass, and yellow against green.
fn colour_markdown(w: &mut String, pp: &PerPacketResults) {
    let c = &pp.colour;
    let _ = writeln!(w, "\n### The second meter: colours and the packet rate\n");
    let _ = writeln!(
        w,
        "Frames of a key whose policy has a second meter (an excess rate, RFC 4115's \
         two-rate three-colour marker; or a packet rate), loop method, each set against the \
         single-rate pass of a known source (*{}*) on the same object in the same runs: \
         the ratio is taken run by run, then its median and range. The cells are set so \
         every frame has the row's colour (green: the committed rate the fastest there is; \
         yellow: the committed cell one byte a second with a burst of one frame, the \
         excess the fastest; red: both one byte a second), primed before each timed loop, \
         and the kernel's counters checked after it: a frame of another colour fails the \
         run. Yellow frames are marked DSCP {} (cs1) with ECT(0) set, and the first of \
         each run is checked byte for byte (ECN kept, IPv4 checksum valid).\n",
        c.single_rate,
        super::colour::EXCESS_DSCP
    );
    let _ = writeln!(
        w,
        "| case | ns/packet (range) | × single-rate pass (range) |"
    );
    let _ = writeln!(w, "| --- | ---: | ---: |");
    for r in &c.rows {
        let _ = writeln!(
            w,
            "| {} | {} | {} |",
            r.case,
            ns_range(&r.ns),
            ratio_range(&r.over_single_rate)
        );
    }
    let _ = writeln!(
        w,
        "\nYellow against green, run by run: IPv4 {}, IPv6 {}; issue 24's bound is {:.2}× ({}).\n",
        ratio_range(&c.yellow_over_green),
        ratio_range(&c.yellow_over_green_v6),
        c.bound,
        if c.within_bound {
            "within it"
        } else {
            "over it"
        }
    );
    for why in &c.not_measured {
        let _ = writeln!(w, "- not measured: {why}");
    }
}

/// Today's build against the baseline: the per-packet table side by side, and where the
/// kernel figures are.
fn versus_markdown(w: &mut String, pp: &PerPacketResults, kernel_missing: Option<&str>) {
    let _ = writeln!(
        w,
        "\n## Before and after: today's build against the baseline\n"
    );
    match kernel_missing {
        None => {
            let _ = writeln!(
                w,
                "What the verifier makes of each program of both builds on this kernel \
                 (instructions walked, sizes, BTF functions, load time) and how long \
                 `shaper attach` takes with each, from this run: \
                 [{}]({}) (every kernel measured, one entry each).\n",
                super::KERNELS_MARKDOWN,
                super::KERNELS_MARKDOWN
            );
        }
        Some(why) => {
            let _ = writeln!(w, "Kernel figures: not measured in this run: {why}.\n");
        }
    }
    let Some(b) = &pp.baseline else {
        let _ = writeln!(
            w,
            "Per-packet cost of the baseline: not measured in this run: {}.",
            pp.baseline_missing.as_deref().unwrap_or("not run")
        );
        return;
    };
    let _ = writeln!(
        w,
        "Per-packet cost of both builds, measured in the same runs on the same frames \
         under the same settings, each case on one build then at once on the other \
         (which goes first alternating): baseline **{}** (commit {}) against today's. \
         ns/packet as in the table above, median of {} runs with their range; the ratio \
         today/baseline is taken run by run, then its median and range. Below 1: today's \
         is faster.\n",
        b.label, b.commit, pp.runs
    );
    let _ = writeln!(
        w,
        "| case | {}: ns/packet (range) | today: ns/packet (range) | today / {} (range) |",
        b.label, b.label
    );
    let _ = writeln!(w, "| --- | ---: | ---: | ---: |");
    for v in &b.versus {
        let _ = writeln!(
            w,
            "| {} | {} | {} | {} |",
            v.case,
            ns_range(&v.baseline_ns),
            ns_range(&v.today_ns),
            ratio_range(&v.ratio)
        );
    }
    for c in b.cases.iter().filter(|c| c.note.is_some()) {
        let _ = writeln!(
            w,
            "\n{} ({}): {}",
            c.case,
            b.label,
            c.note.as_deref().unwrap_or_default()
        );
    }
}

fn plot_link(w: &mut String, plots: &[String], name: &str, alt: &str) {
    if plots.iter().any(|p| p == name) {
        let _ = writeln!(w, "\n![{alt}]({name})");
    }
}

fn limiters(acc: &AccuracyResults) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for r in &acc.rows {
        if !out.contains(&r.limiter) {
            out.push(r.limiter.clone());
        }
    }
    out
}

fn accuracy_markdown(w: &mut String, acc: &AccuracyResults, plots: &[String]) {
    let _ = writeln!(
        w,
        "Delivered layer-2 bytes against what the limit allows (rate × time + burst), in \
         the namespace lab. Error = (delivered − expected) / expected.\n\n\
         *Exact bytes*: what an exact limiter of the row's kind delivers of the same sends, \
         replayed frame by frame on the send times the run recorded: GCRA at the row's rate \
         and burst for the policers (per source), a token bucket of the row's burst behind a \
         FIFO of the row's queue for tbf (one, over every source) and htb (one per source). \
         *From exact* = (delivered − exact) / exact: how far the limiter is from doing \
         exactly what it was told. *Exact's error* = (exact − expected) / expected: how far \
         exact itself is from rate × time + burst (a policer passes whole frames; a queue \
         delivers its backlog).\n"
    );
    if acc.rows.is_empty() {
        let _ = writeln!(w, "No accuracy rows were measured.");
    } else {
        let _ = writeln!(
            w,
            "shaper, the nft meter and hashlimit sit on the router's input veth (the same \
             device); tbf and htb, which queue, on the router's egress. *shaper egress* \
             (`--direction egress --key src`: shaper's tc program, TCX on this kernel) and \
             *nft egress* (the same nft meter in the netdev family's egress hook, which runs \
             just before tc egress on every frame the device sends, forwarded or not; inet \
             `output` never sees forwarded traffic and `postrouting` runs in the IP stack, \
             before the device) sit on that same egress device, per source as everything \
             else here. A run *measures the \
             limiter* when its sources offered at least 1.5× the limit, no send was refused and \
             nothing was lost outside the limiter; a configuration is *comparable* when every \
             limiter's run of it does, and the headline averages each limiter over the same \
             comparable configurations. The rows of 9000-byte frames ran with the lab's MTU \
             9000 (jumbo frames): the generator cannot offer twice 1 Gbit/s from one source \
             in smaller ones.\n"
        );
        let _ = writeln!(
            w,
            "| limiter | behaviour | rate | burst | frame | sources | offered per source | delivered bytes | expected bytes | error | exact bytes | from exact | exact's error | seconds | comparable | note |"
        );
        let _ = writeln!(
            w,
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |"
        );
        for r in &acc.rows {
            let _ = writeln!(
                w,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {:.0} | {:+.2}% | {} | {:+.2}% | {:+.2}% | {:.1} | {} | {} |",
                r.limiter,
                r.behaviour,
                human_bps(r.rate_bps as f64),
                r.burst_bytes,
                r.frame_bytes,
                r.sources,
                human_bps(r.offered_bps_per_source),
                r.delivered_bytes,
                r.expected_bytes,
                r.error_pct,
                r.exact_bytes,
                r.from_exact_pct,
                r.exact_error_pct,
                r.seconds,
                match (r.config_comparable, r.comparable) {
                    (true, _) => "yes",
                    (false, true) => "no (another limiter's run is not)",
                    (false, false) => "no",
                },
                r.note.as_deref().unwrap_or("")
            );
        }
    }
    let _ = writeln!(
        w,
        "\nifb+htb (htb per source on an ifb for ingress), measured in earlier runs, is no \
         longer run: it matched htb within 0.01% in every comparable configuration and cost a \
         fifth of the sweep's time, which now goes to the nft meter and hashlimit."
    );
    for f in &acc.failed {
        let _ = writeln!(w, "\n**Not measured**: {f}");
    }
    if !acc.dropped.is_empty() {
        let _ = writeln!(
            w,
            "\nConfigurations not run, because the generator could not offer any limiter 1.5× \
             the limit (on this machine it reaches about 300k frames/s in all):\n"
        );
        for d in &acc.dropped {
            let _ = writeln!(w, "- {d}");
        }
    }
    plot_link(w, plots, "accuracy.svg", "error against rate per limiter");
    for p in plots.iter().filter(|p| p.starts_with("timeseries-")) {
        plot_link(w, plots, p, "delivered rate over time per source");
    }
    if !acc.cpu.is_empty() {
        let _ = writeln!(w, "\n### Softirq CPU per million packets\n");
        let _ = writeln!(
            w,
            "The same offered load through each limiter in the routed lab, once with a limit that \
             passes a few percent of it (*over*) and once with a limit far above it (*under*). \
             Softirq time is exact: two tracing programs on the kernel's `softirq_entry` and \
             `softirq_exit` tracepoints add up the time spent in every softirq on every CPU \
             (this kernel's `/proc/stat` softirq column is only sampled at the timer tick). It \
             covers the whole path of every packet from the senders' veth to the receiving socket, \
             so *none* is the floor and the excess over it is the limiter's own cost. Each run has \
             an XDP program on the router's input veth (the shaper, or a no-op one for the \
             others), since attaching XDP changes how a veth receives. Every limiter runs three \
             times, taking turns within each repetition; the headline gives the median and the \
             range (min–max) and shaper's ratio to each peer run by run: shaper (XDP) against \
             the ingress policers, htb and none; shaper egress (tc) against what sits on the \
             same egress device (nft egress, tbf, htb) and none.\n"
        );
        let _ = writeln!(
            w,
            "| limiter | load | run | limit per source | offered pps | packets | delivered | seconds | softirq ms | NET_RX ms | NET_TX ms | ms per Mpkt | note |"
        );
        let _ = writeln!(
            w,
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
        );
        for c in &acc.cpu {
            let _ = writeln!(
                w,
                "| {} | {} | {} | {} | {:.0} | {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {} |",
                c.limiter,
                c.load,
                c.rep + 1,
                human_bps(c.rate_bps_per_source as f64),
                c.offered_pps,
                c.packets,
                c.delivered_packets,
                c.seconds,
                c.softirq_ns as f64 / 1e6,
                c.net_rx_ns as f64 / 1e6,
                c.net_tx_ns as f64 / 1e6,
                c.softirq_ms_per_mpkt,
                c.note.as_deref().unwrap_or("")
            );
        }
    }
    if !acc.late.is_empty() {
        let _ = writeln!(w, "\n### Sources under their limit, and a late generator\n");
        let _ = writeln!(
            w,
            "Each source asks for less than its limit, but all of them together for more than \
             the lab carries, so the sender threads fall behind. With *catch-up* a late sender \
             sends every overdue frame at once when it runs again; with *skip* it drops the \
             overdue frames and sends only one tick's worth. The send times are recorded and \
             replayed through an exact policer (GCRA at the same rate and burst): its loss, and \
             the burst it would need to lose nothing, say what the traffic *as sent* asks of any \
             policer.\n"
        );
        let _ = writeln!(
            w,
            "| generator | sources | limit | burst | asked per source | sent per source | skipped | sent | received | shaper's loss | exact policer's loss | burst needed (worst source) | burst needed (median source) | note |"
        );
        let _ = writeln!(
            w,
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
        );
        for r in &acc.late {
            let _ = writeln!(
                w,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1}% | {:.1}% | {:.2} MiB | {:.2} MiB | {} |",
                r.late,
                r.sources,
                human_bps(r.rate_bps as f64),
                r.burst_bytes,
                human_bps(r.asked_bps_per_source),
                human_bps(r.sent_bps_per_source),
                r.skipped_packets,
                r.sent_packets,
                r.received_packets,
                r.shaper_loss_pct,
                r.exact_policer_loss_pct,
                r.burst_needed_max_bytes / f64::from(1u32 << 20),
                r.burst_needed_median_bytes / f64::from(1u32 << 20),
                r.note.as_deref().unwrap_or("")
            );
        }
        let find = |late: &str| acc.late.iter().find(|r| r.late == late);
        if let (Some(c), Some(k)) = (find("catch-up"), find("skip")) {
            let same = (c.shaper_loss_pct - c.exact_policer_loss_pct).abs() <= 5.0;
            let _ = writeln!(
                w,
                "\nWith catch-up, shaper lost {:.1}% of what was sent and an exact policer on the \
                 same send times {:.1}%; the worst source's clumps of overdue frames would need \
                 a {:.2} MiB burst to pass whole, against the {} bytes allowed. With skip, \
                 shaper lost {:.1}% ({:.1}% for the exact policer). {} How much is lost depends \
                 on how far the senders fall behind: in this run they reached {:.1} Mbit/s per \
                 source of the {:.1} asked.",
                c.shaper_loss_pct,
                c.exact_policer_loss_pct,
                c.burst_needed_max_bytes / f64::from(1u32 << 20),
                c.burst_bytes,
                k.shaper_loss_pct,
                k.exact_policer_loss_pct,
                if same {
                    "shaper drops what an exact policer drops of the frames as sent, so the \
                     loss of sources under their limit comes from the generator's catch-up \
                     clumps (over the limit as sent), not from shaper, and nothing between \
                     the senders and shaper added to it."
                } else {
                    "shaper's loss and the exact policer's differ by more than 5 points in \
                     this run, so the generator's clumps do not explain all of it."
                },
                c.sent_bps_per_source / 1e6,
                c.asked_bps_per_source / 1e6
            );
        }
    }
    if !acc.duration.is_empty() {
        let _ = writeln!(
            w,
            "\n### Excess over the limit as the measuring time grows\n"
        );
        let _ = writeln!(
            w,
            "One source offering twice the limit through each policer on the router's input \
             veth, for longer and longer. The excess is delivered − (rate × time + the burst \
             asked for). A policer that meters exactly has a small excess that does not grow; a \
             fixed excess in bytes shows up as a percentage that shrinks with the time measured.\n"
        );
        let _ = writeln!(
            w,
            "| limiter | rate | burst asked | burst given | seconds | offered | delivered bytes | expected bytes | excess bytes | excess |"
        );
        let _ = writeln!(
            w,
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
        );
        for d in &acc.duration {
            let _ = writeln!(
                w,
                "| {} | {} | {} | {} | {:.1} | {} | {} | {:.0} | {:.0} | {:+.1}% |",
                d.limiter,
                human_bps(d.rate_bps as f64),
                d.burst_asked_bytes,
                d.burst_given_bytes,
                d.seconds,
                human_bps(d.offered_bps),
                d.delivered_bytes,
                d.expected_bytes,
                d.excess_bytes,
                d.excess_pct
            );
        }
        let mut names: Vec<&str> = Vec::new();
        for d in &acc.duration {
            if !names.contains(&d.limiter.as_str()) {
                names.push(&d.limiter);
            }
        }
        for name in names {
            let rows: Vec<_> = acc.duration.iter().filter(|d| d.limiter == name).collect();
            let excess: Vec<f64> = rows.iter().map(|d| d.excess_bytes).collect();
            let (lo, hi) = excess
                .iter()
                .fold((f64::MAX, f64::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)));
            let rate = rows[0].rate_bps as f64 / 8.0;
            let _ = writeln!(
                w,
                "\n{name}: excess {:.2}–{:.2} MB over {}–{:.0} s, about {:.2} s of the rate beyond \
                 the burst asked for{}.",
                lo / 1e6,
                hi / 1e6,
                rows.first().map_or(0.0, |d| d.seconds.round()),
                rows.last().map_or(0.0, |d| d.seconds),
                (lo + hi) / 2.0 / rate,
                if rows[0].burst_given_bytes > rows[0].burst_asked_bytes {
                    format!(
                        " (it was given a {}-byte burst, its smallest)",
                        rows[0].burst_given_bytes
                    )
                } else {
                    String::new()
                }
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// plots

const FONT: &str = "sans-serif";

fn plot_err<E: std::fmt::Display>(path: &Path) -> impl FnOnce(E) -> anyhow::Error + '_ {
    move |e| anyhow!("drawing {}: {e}", path.display())
}

/// Horizontal bars, one per case, the no-op first and grey.
fn plot_per_packet(path: &Path, pp: &PerPacketResults) -> Result<()> {
    let n = pp.cases.len();
    let height = 80 + 34 * n as u32;
    let root = SVGBackend::new(path, (1000, height)).into_drawing_area();
    let err = || plot_err(path);
    root.fill(&WHITE).map_err(err())?;
    let max = pp.cases.iter().map(|c| c.ns_per_packet).fold(1.0, f64::max);
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "shaper per-packet cost (BPF_PROG_TEST_RUN) against a no-op XDP program",
            (FONT, 18),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(8)
        .build_cartesian_2d(0f64..max * 2.2, 0f64..n as f64)
        .map_err(err())?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .disable_y_axis()
        .x_desc("ns per packet")
        .draw()
        .map_err(err())?;
    let label = TextStyle::from((FONT, 13).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    for (i, c) in pp.cases.iter().enumerate() {
        let y = (n - 1 - i) as f64;
        let color = if c.id.starts_with("noop") {
            RGBColor(150, 150, 150)
        } else if c.method == Method::Single {
            RGBColor(221, 132, 82)
        } else {
            RGBColor(76, 114, 176)
        };
        let v = c.ns_per_packet.max(0.0);
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(0.0, y + 0.15), (v, y + 0.85)],
                color.filled(),
            )))
            .map_err(err())?;
        chart
            .draw_series(std::iter::once(Text::new(
                format!(
                    "{:.1} ns  {:.2}×  {}",
                    c.ns_per_packet, c.ratio_to_noop, c.case
                ),
                (v + max * 0.02, y + 0.5),
                label.clone(),
            )))
            .map_err(err())?;
    }
    root.present().map_err(err())?;
    Ok(())
}

/// ns per packet against tracked sources (log), same key and random key, with the no-op.
fn plot_scale(path: &Path, pp: &PerPacketResults, scale: &ScaleResults) -> Result<()> {
    let root = SVGBackend::new(path, (900, 480)).into_drawing_area();
    let err = || plot_err(path);
    root.fill(&WHITE).map_err(err())?;
    let hot: Vec<(f64, f64)> = scale
        .rows
        .iter()
        .map(|r| (f64::from(r.capacity), r.hot_pass_ns))
        .collect();
    let cold: Vec<(f64, f64)> = pp
        .cases
        .iter()
        .filter(|c| c.method == Method::Single && c.id.starts_with("cold_"))
        .filter_map(|c| Some((f64::from(c.tracked_sources?), c.ns_per_packet)))
        .collect();
    let noop: Vec<(f64, f64)> = scale
        .rows
        .iter()
        .map(|r| (f64::from(r.capacity), r.hot_noop_ns))
        .collect();
    let xs = hot.iter().chain(&cold).map(|p| p.0);
    let (xmin, xmax) = xs.fold((f64::MAX, 1.0f64), |(lo, hi), x| (lo.min(x), hi.max(x)));
    let xmin = if xmin > xmax { 1.0 } else { xmin };
    let ymax = hot
        .iter()
        .chain(&cold)
        .chain(&noop)
        .map(|p| p.1)
        .fold(1.0, f64::max);
    let mut chart = ChartBuilder::on(&root)
        .caption("per-packet cost against tracked sources", (FONT, 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d((xmin / 2.0..xmax * 2.0).log_scale(), 0f64..ymax * 1.3)
        .map_err(err())?;
    chart
        .configure_mesh()
        .x_desc("tracked sources (map filled to capacity)")
        .y_desc("ns per packet")
        .x_label_formatter(&|x| human_count(x.round() as u32))
        .draw()
        .map_err(err())?;
    for (data, name, color) in [
        (
            &cold,
            "pass, known source, random key (single shot)",
            RGBColor(221, 132, 82),
        ),
        (
            &hot,
            "pass, known source, same key (loop)",
            RGBColor(76, 114, 176),
        ),
        (&noop, "no-op XDP program (loop)", RGBColor(150, 150, 150)),
    ] {
        if data.is_empty() {
            continue;
        }
        chart
            .draw_series(LineSeries::new(data.iter().copied(), color.stroke_width(2)).point_size(4))
            .map_err(err())?
            .label(name)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(err())?;
    root.present().map_err(err())?;
    Ok(())
}

/// Error % against rate (log), one line per limiter.
fn plot_accuracy(path: &Path, acc: &AccuracyResults) -> Result<()> {
    let root = SVGBackend::new(path, (900, 480)).into_drawing_area();
    let err = || plot_err(path);
    root.fill(&WHITE).map_err(err())?;
    let rates = acc.rows.iter().map(|r| r.rate_bps as f64);
    let (xmin, xmax) = rates.fold((f64::MAX, 1.0f64), |(lo, hi), x| (lo.min(x), hi.max(x)));
    let xmin = if xmin > xmax { 1.0 } else { xmin.max(1.0) };
    let emax = acc
        .rows
        .iter()
        .filter(|r| r.config_comparable)
        .map(|r| r.error_pct.abs())
        .filter(|e| e.is_finite())
        .fold(1.0, f64::max);
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "delivered against rate × time + burst, per limiter (comparable runs)",
            (FONT, 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(
            (xmin / 2.0..xmax * 2.0).log_scale(),
            -emax * 1.2..emax * 1.2,
        )
        .map_err(err())?;
    chart
        .configure_mesh()
        .x_desc("rate limit (bit/s)")
        .y_desc("error %")
        .x_label_formatter(&|x| human_bps(*x))
        .draw()
        .map_err(err())?;
    chart
        .draw_series(LineSeries::new(
            [(xmin / 2.0, 0.0), (xmax * 2.0, 0.0)],
            BLACK.stroke_width(1),
        ))
        .map_err(err())?;
    for (i, limiter) in limiters(acc).into_iter().enumerate() {
        let mut points: Vec<(f64, f64)> = acc
            .rows
            .iter()
            .filter(|r| r.limiter == limiter && r.config_comparable && r.error_pct.is_finite())
            .map(|r| (r.rate_bps as f64, r.error_pct))
            .collect();
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)).point_size(4))
            .map_err(err())?
            .label(limiter)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(err())?;
    root.present().map_err(err())?;
    Ok(())
}

/// Delivered rate per source in each bin, with the limit as a dashed reference.
fn plot_series(path: &Path, s: &super::TimeSeries) -> Result<()> {
    let root = SVGBackend::new(path, (900, 480)).into_drawing_area();
    let err = || plot_err(path);
    root.fill(&WHITE).map_err(err())?;
    let bin_s = f64::from(s.bin_ms) / 1000.0;
    let bins = s.per_source.iter().map(|(_, v)| v.len()).max().unwrap_or(0);
    let xmax = (bins as f64 * bin_s).max(bin_s);
    let ymax = s
        .per_source
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .filter(|v| v.is_finite())
        .fold(s.rate_bps as f64, f64::max)
        / 1e6;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "{}: delivered rate per source, {} ms bins, limit {}",
                s.limiter,
                s.bin_ms,
                human_bps(s.rate_bps as f64)
            ),
            (FONT, 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(0f64..xmax, 0f64..ymax * 1.15)
        .map_err(err())?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc("Mbit/s delivered")
        .draw()
        .map_err(err())?;
    let limit = s.rate_bps as f64 / 1e6;
    chart
        .draw_series(DashedLineSeries::new(
            [(0.0, limit), (xmax, limit)],
            8,
            6,
            BLACK.stroke_width(1),
        ))
        .map_err(err())?
        .label("limit")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 18, y)], BLACK.stroke_width(1)));
    for (i, (src, values)) in s.per_source.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let points = values
            .iter()
            .enumerate()
            .filter(|(_, v)| v.is_finite())
            .map(|(b, v)| ((b as f64 + 0.5) * bin_s, v / 1e6));
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(err())?
            .label(src.to_string())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(err())?;
    root.present().map_err(err())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;
    use crate::bench::{
        AccuracyRow, CpuCost, TimeSeries,
        per_packet::{BaselineResults, CaseResult, Versus},
        scale::ScaleRow,
    };

    fn case(id: &'static str, method: Method, ns: f64, tracked: Option<u32>) -> CaseResult {
        CaseResult {
            id,
            case: id,
            method,
            packets_per_run: 10,
            tracked_sources: tracked,
            measured_ns_median: ns,
            measured_ns_runs: vec![ns],
            over_noop_ns: ns - 10.0,
            ns_per_packet: ns,
            ratio_to_noop: ns / 10.0,
            ratio_to_floor: ns / 20.0,
            ns_per_packet_runs: vec![ns],
            packets_per_sec: 1e9 / ns,
            note: None,
        }
    }

    /// Every colour row at 30 ns but yellow (IPv4) at 33, against a single-rate pass of 25.
    fn colour_fixture() -> crate::bench::colour::ColourResults {
        use crate::bench::colour;
        let cases = colour::cases().unwrap();
        let samples: Vec<Vec<f64>> = cases
            .iter()
            .map(|c| vec![if c.id == colour::YELLOW { 33.0 } else { 30.0 }])
            .collect();
        colour::results(&[25.0], &cases, &samples)
    }

    fn fixtures() -> (Machine, PerPacketResults, ScaleResults, AccuracyResults) {
        let pp = PerPacketResults {
            repeat: 10,
            runs: 1,
            frames_per_run: 10,
            eviction_map_entries: 1024,
            cases: vec![
                case("noop", Method::Loop, 10.0, None),
                case("pass_existing", Method::Loop, 25.0, None),
                case("new_source", Method::Single, 90.0, None),
                case("cold_1k", Method::Single, 30.0, Some(1024)),
                case("cold_1m", Method::Single, 60.0, Some(1 << 20)),
                case("pass_known_in_full_map_single", Method::Single, 80.0, None),
                case("refused_newcomer_single", Method::Single, 100.0, None),
            ],
            baseline: Some(BaselineResults {
                label: "0123abc".into(),
                commit: "0123abcdef".into(),
                cases: vec![case("pass_existing", Method::Loop, 50.0, None)],
                versus: vec![Versus {
                    id: "pass_existing",
                    case: "pass_existing",
                    baseline_ns: Summary::of(vec![50.0]),
                    today_ns: Summary::of(vec![25.0]),
                    ratio: Summary::of(vec![0.5]),
                }],
            }),
            baseline_missing: None,
            colour: colour_fixture(),
            subscriber: None,
        };
        let row = |capacity: u32| ScaleRow {
            capacity,
            entries: capacity,
            memlock_empty_bytes: u64::from(capacity) * 100,
            memlock_filled_bytes: u64::from(capacity) * 100,
            bytes_per_source: 100.0,
            fill_secs: 0.1,
            hot_pass_ns: 25.0,
            hot_noop_ns: 10.0,
            hot_ratio_to_noop: 2.5,
        };
        let scale = ScaleResults {
            repeat: 10,
            runs: 1,
            rows: vec![row(1024), row(1 << 20)],
        };
        let acc_row = |limiter: &str, rate_bps: u64, error_pct: f64| AccuracyRow {
            limiter: limiter.into(),
            behaviour: "drops".into(),
            rate_bps,
            burst_bytes: 65_536,
            frame_bytes: 1000,
            sources: 4,
            offered_bps_per_source: 2.0 * rate_bps as f64,
            delivered_bytes: 1000,
            expected_bytes: 1000.0,
            error_pct,
            exact_bytes: 1000,
            from_exact_pct: error_pct,
            exact_error_pct: 0.0,
            seconds: 5.0,
            note: None,
            comparable: true,
            config_comparable: true,
        };
        let series = |limiter: &str| TimeSeries {
            limiter: limiter.into(),
            rate_bps: 10_000_000,
            bin_ms: 100,
            per_source: (0..3)
                .map(|i| {
                    let v = (0..50)
                        .map(|b| 9e6 + f64::from(i * 100_000 + b * 1000))
                        .collect();
                    (Ipv4Addr::new(198, 18, 0, 11 + i as u8).into(), v)
                })
                .collect(),
        };
        let acc = AccuracyResults {
            rows: vec![
                acc_row("shaper", 1_000_000, 0.2),
                acc_row("shaper", 10_000_000, -0.1),
                acc_row("tbf", 1_000_000, -3.0),
                acc_row("tbf", 10_000_000, 1.5),
            ],
            series: vec![series("shaper"), series("tbf"), series("ifb+htb")],
            dropped: vec!["1 Gbit/s with 64-byte frames: too fast".into()],
            late: Vec::new(),
            duration: Vec::new(),
            failed: Vec::new(),
            cpu: vec![CpuCost {
                limiter: "shaper".into(),
                rep: 0,
                load: "over".into(),
                rate_bps_per_source: 1_000_000,
                offered_pps: 1e5,
                packets: 500_000,
                delivered_packets: 20_000,
                seconds: 5.0,
                softirq_ns: 1_000_000,
                net_rx_ns: 900_000,
                net_tx_ns: 0,
                softirq_ms_per_mpkt: 2.0,
                lab_lost_packets: 0,
                note: None,
            }],
        };
        let machine = Machine {
            host: "host".into(),
            kernel: "6.1.0".into(),
            cpu_model: "cpu".into(),
            cpus: 2,
            date_utc: utc_now(),
            git_revision: "0123abc".into(),
            git_dirty: false,
            kernel_sources_sha256: "abc".into(),
            loadavg_start: "0.1 0.2 0.3".into(),
            loadavg_end: String::new(),
        };
        (machine, pp, scale, acc)
    }

    fn tempdir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("shaper-report-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn writes_every_file_with_accuracy() {
        let (machine, pp, scale, acc) = fixtures();
        let dir = tempdir("full");
        let inputs = Inputs {
            machine: &machine,
            quick: true,
            kernel_missing: None,
            per_packet: &pp,
            scale: &scale,
            accuracy: Some(&acc),
            accuracy_missing: None,
            flood: None,
            flood_missing: Some("not run"),
        };
        let files = write(&dir, &inputs).unwrap();
        let names: Vec<_> = files
            .iter()
            .map(|p| p.file_name().unwrap().to_str().unwrap().to_owned())
            .collect();
        for want in [
            "results.md",
            "results.json",
            "per_packet.svg",
            "scale.svg",
            "accuracy.svg",
            "timeseries-shaper.svg",
            "timeseries-tbf.svg",
            "timeseries-ifb-htb.svg",
        ] {
            assert!(
                names.iter().any(|n| n == want),
                "{want} missing from {names:?}"
            );
        }
        for f in &files {
            let text = std::fs::read_to_string(f).unwrap();
            if f.extension().is_some_and(|e| e == "svg") {
                assert!(text.starts_with("<svg"), "{}", f.display());
                assert!(text.trim_end().ends_with("</svg>"), "{}", f.display());
            }
        }
        let md = std::fs::read_to_string(dir.join("results.md")).unwrap();
        assert!(md.contains("6.1.0") && md.contains("| shaper | drops |"));
        // Both builds side by side, the ratio run by run.
        assert!(
            md.contains(
                "| pass_existing | 50.0 (50.0–50.0) | 25.0 (25.0–25.0) | **0.500** (0.500–0.500) |"
            ),
            "{md}"
        );
        assert!(md.contains("results-kernels.md"));
        // The refused newcomer against the known source's pass, with issue 22's bound.
        assert!(
            md.contains("no cell) against a known source's pass, both drawn from the same full default map: **1.25×** (100.0 ns against 80.0 ns; 1.25–1.25× run by run"),
            "{md}"
        );
        // The second meter's rows against the single-rate pass, yellow against green.
        assert!(
            md.contains(
                "(over both rates), dropped | 30.0 (30.0–30.0) | **1.200** (1.200–1.200) |"
            ),
            "{md}"
        );
        assert!(
            md.contains("checksum updated) against a green one, both under a second meter: **1.10×** (1.10–1.10× run by run; issue 24's bound is 1.25×)"),
            "{md}"
        );
        assert!(md.contains("IPv4 **1.100** (1.100–1.100), IPv6 **1.000** (1.000–1.000);"));
        assert!(md.contains("- not measured: the tc program"));
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("results.json")).unwrap())
                .unwrap();
        assert_eq!(json["accuracy"]["status"], "measured");
        assert_eq!(json["per_packet"]["colour"]["within_bound"], true);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn says_so_when_accuracy_is_missing() {
        let (machine, pp, scale, _) = fixtures();
        let dir = tempdir("missing");
        let inputs = Inputs {
            machine: &machine,
            quick: false,
            kernel_missing: Some("no baseline build"),
            per_packet: &pp,
            scale: &scale,
            accuracy: None,
            accuracy_missing: Some("it failed: no iperf3"),
            flood: None,
            flood_missing: None,
        };
        let files = write(&dir, &inputs).unwrap();
        assert_eq!(files.len(), 4, "{files:?}");
        let md = std::fs::read_to_string(dir.join("results.md")).unwrap();
        assert!(md.contains("Not measured in this run: it failed: no iperf3"));
        assert!(md.contains("Kernel figures: not measured in this run: no baseline build."));
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("results.json")).unwrap())
                .unwrap();
        assert_eq!(json["accuracy"]["status"], "missing");
        assert!(json["accuracy"]["results"].is_null());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn utc_date_is_iso() {
        let d = utc_now();
        assert_eq!(d.len(), 20, "{d}");
        assert!(d.starts_with("20") && d.ends_with('Z'));
    }
}

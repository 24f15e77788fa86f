//! `cargo xtask test --kernel 6.1|6.12|all`: the kernel tests under Debian 12's own kernels,
//! each booted in a QEMU guest that runs on this machine's files.
//!
//! For each kernel series the newest Debian package (`linux-image-6.1.0-N-amd64`,
//! `linux-image-6.12.N+deb12-amd64`, generic rather than `-cloud`: the cloud kernels have no
//! 9p) is fetched with `apt-get download` into `target/kernels/` and unpacked there with
//! `dpkg-deb -x` (nothing is installed). A busybox initramfs built into `target/vm/` loads
//! the modules the guest needs to reach its files (virtio, 9p, overlay), mounts this
//! machine's `/` read-only over 9p with a tmpfs overlay on top, the work tree read-write
//! over a second 9p share (so the test binaries built here are there at the same paths),
//! and switches root into it. The test binaries then run as they would here, one after the
//! other, and the guest powers off. The guest's console is this command's output.
//!
//! QEMU emulates the CPU (TCG): this machine's KVM cannot run a stock kernel. So the guests
//! run the kernel tests whose outcome does not depend on time ([`SUITES`] says which and
//! why); the timing ones stay on the host.

use std::{
    fs,
    io::{BufRead as _, BufReader, Write as _},
    path::{Path, PathBuf},
    process::{Command, ExitCode, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::{
    apt, cmd, host,
    phases::{Phases, minutes},
    tally::Tally,
    workspace,
};

/// A guest that has not powered off after this long is killed, and its kernel fails.
const GUEST_TIMEOUT: Duration = Duration::from_secs(25 * 60);

/// A Debian kernel series: its packages are `<prefix><N><suffix>[-unsigned]`.
pub struct Series {
    /// What `--kernel` calls it.
    pub name: &'static str,
    prefix: &'static str,
    suffix: &'static str,
    /// The Debian release whose apt has it, if not this machine's (Debian 12).
    release: Option<&'static apt::Release>,
    /// The only test files it runs, if not every guest suite.
    only: Option<&'static [&'static str]>,
}

/// The kernels `--kernel all` runs, oldest first. 5.10 is Debian 11's, older than shaper
/// supports: it runs only the test that attach refuses it in one line. 6.1 is Debian 12's
/// own kernel; 6.12 is the newer one Debian 12 carries (the next stable's).
pub const SERIES: &[Series] = &[
    Series {
        name: "5.10",
        prefix: "linux-image-5.10.0-",
        suffix: "-amd64",
        release: Some(&apt::BULLSEYE),
        only: Some(&["tests/kernel_support.rs"]),
    },
    Series {
        name: "6.1",
        prefix: "linux-image-6.1.0-",
        suffix: "-amd64",
        release: None,
        only: None,
    },
    Series {
        name: "6.12",
        prefix: "linux-image-6.12.",
        suffix: "+deb12-amd64",
        release: None,
        only: None,
    },
];

/// Where a test file of the lab package (`workspace::LAB_DIR`) runs. Every kernel test runs
/// on the host (`cargo xtask test`) but those of [`Place::GuestOnly`]; the guests run what
/// differs from kernel to kernel, and nothing twice that is the same on every kernel.
enum Place {
    /// On the host, and in every guest: every kernel test of the file.
    Guests,
    /// On the host; in every guest only the tests `run` names, each with what it checks
    /// that differs from kernel to kernel (verifier acceptance, a load or attach path, a
    /// kernel feature, an upgrade's link update and pin exchange). The file's other tests
    /// run the same program and the same userspace on any kernel, or time something: the
    /// host run covers them once.
    SomeInGuests {
        run: &'static [(&'static str, &'static str)],
    },
    /// Only on the host (`cargo xtask test`).
    Host,
    /// Only in the guests: it needs what the host kernel lacks. The host run skips its
    /// `tests` (every test of the file, by name).
    GuestOnly { tests: &'static [&'static str] },
}

/// One test target of the lab package, by its source file.
struct Suite {
    /// The file, relative to the lab package.
    file: &'static str,
    place: Place,
    /// Why it runs in the guests, or why not.
    why: &'static str,
}

/// Every test file of the lab package, and whether the guests run its kernel tests (`--ignored
/// --test-threads=1`, as on the host). A new test file must be added here (a host test
/// checks). In: what checks what a kernel accepts and how the program behaves on it, with
/// no dependence on time. Out: what measures time (rates, accuracy): under emulation the
/// guest's clock is right but everything runs tens of times slower than on hardware, so
/// offered rates and deadlines mean nothing there.
const SUITES: &[Suite] = &[
    Suite {
        file: "tests/test_run.rs",
        place: Place::Guests,
        why: "verifier acceptance (every test loads the program) and verdicts and counters \
              through BPF_PROG_TEST_RUN; rates are slow enough that run time does not matter",
    },
    Suite {
        file: "tests/source_table_test_run.rs",
        place: Place::SomeInGuests {
            run: &[
                (
                    "a_full_bucket_gives_a_newcomer_an_idle_way_or_the_unadmitted_cell",
                    "the tables' claims (bucket locks, compare-and-swap) on each kernel",
                ),
                (
                    "an_ipv6_key_differing_only_in_its_low_half_is_a_key_of_its_own",
                    "the IPv6 lookup's whole-key compare on each kernel",
                ),
            ],
        },
        why: "the per-source tables' buckets through BPF_PROG_TEST_RUN: ways filled, an idle \
              way reclaimed, a full bucket's newcomer unadmitted, IPv6 keys told apart, and \
              the kernel memory a source costs at a million (host)",
    },
    Suite {
        file: "tests/verifier.rs",
        place: Place::Guests,
        why: "each entry point's processed instruction count, printed and held under the \
              verifier's budget: it differs from kernel to kernel",
    },
    Suite {
        file: "tests/parse_golden.rs",
        place: Place::SomeInGuests {
            run: &[
                (
                    "golden_frames_are_classified_keyed_and_charged_in_full",
                    "every encapsulation through the kernel's own test_run frame setup",
                ),
                (
                    "jumbo_frames_are_charged_in_full",
                    "multi-buffer (xdp.frags) frames: the kernel's frags support",
                ),
            ],
        },
        why: "golden frames of every encapsulation and every truncation through \
              BPF_PROG_TEST_RUN, including multi-buffer (xdp.frags) jumbo frames",
    },
    Suite {
        file: "tests/fuzz.rs",
        place: Place::Host,
        why: "fuzzed frames through BPF_PROG_TEST_RUN: the same program's parser on every \
              kernel (its acceptance is test_run.rs's and verifier.rs's)",
    },
    Suite {
        file: "tests/policy_test_run.rs",
        place: Place::SomeInGuests {
            run: &[(
                "longest_prefix_wins_across_nested_prefixes",
                "the kernel's LPM trie lookups",
            )],
        },
        why: "prefix policies (LPM tries, monitor, aggregates, rescaling) through \
              BPF_PROG_TEST_RUN",
    },
    Suite {
        file: "tests/admission_test_run.rs",
        place: Place::SomeInGuests {
            run: &[(
                "a_spoofed_flood_under_the_default_admission_gets_under_1_percent_of_the_table",
                "the default admission against the kernel's LRU hash under a flood",
            )],
        },
        why: "new-source admission through BPF_PROG_TEST_RUN; its bounds are computed from \
              the time the run took, so a slow guest only loosens them",
    },
    Suite {
        file: "tests/cli.rs",
        place: Place::SomeInGuests {
            run: &[
                (
                    "native_refused_and_auto_falls_back_to_skb",
                    "native and generic XDP attach on veth, dummy and bridge devices",
                ),
                (
                    "unprivileged_is_refused",
                    "what the kernel refuses without CAP_BPF and CAP_NET_ADMIN",
                ),
                (
                    "the_units_capabilities_suffice",
                    "that the unit's capabilities are enough on this kernel",
                ),
            ],
        },
        why: "attach, re-attach, detach and every refusal, with native and generic XDP on \
              veth, dummy and bridge devices",
    },
    Suite {
        file: "tests/apply.rs",
        place: Place::SomeInGuests {
            run: &[(
                "apply_then_show_round_trips",
                "apply's attach and policies read back from this kernel's maps",
            )],
        },
        why: "apply and config show round trips and all-or-nothing refusals: no traffic",
    },
    Suite {
        file: "tests/kernel_support.rs",
        place: Place::Guests,
        why: "what the program needs of the kernel: attach works where it is there, and is \
              refused in one line naming what is missing where it is not (the only suite \
              the 5.10 guest runs)",
    },
    Suite {
        file: "tests/live_vlan.rs",
        place: Place::GuestOnly {
            tests: &["tagged_frames_on_vlan_devices_are_metered_by_source"],
        },
        why: "real 802.1Q and 802.1ad devices (the host kernel has no 8021q): tagged frames \
              metered by source, checked against rate x time + burst as a bound only",
    },
    Suite {
        file: "tests/stale_pins.rs",
        place: Place::Guests,
        why: "attach over pins left by a deleted interface: no traffic",
    },
    Suite {
        file: "tests/faults.rs",
        place: Place::Host,
        why: "faults (deleted interface or namespace, full map, no bpffs, the lock, kills, \
              no privileges) are handled by userspace on the pins; the kills are timed \
              against the command and repeated dozens of times, minutes under emulation",
    },
    Suite {
        file: "tests/upgrade.rs",
        place: Place::SomeInGuests {
            run: &[
                (
                    "an_upgrade_from_layout_10_moves_every_source_into_the_tables",
                    "BPF_LINK_UPDATE and RENAME_EXCHANGE on bpffs, the new program over the \
                     old maps (from the previous layout: decoding earlier ones is userspace), \
                     the sources moved into mappable arrays and topped up through mmap",
                ),
                (
                    "a_second_meter_grows_its_maps_in_place_keeping_every_cell",
                    "the same steps with every map reused but the second meter's, and the \
                     smallest LRU hash each kernel makes",
                ),
                (
                    "an_ingress_upgrade_keeps_the_egress_attachment_beside_it",
                    "the tc attachment (TCX or clsact) untouched by an XDP link update",
                ),
            ],
        },
        why: "upgrades in place from earlier builds (BPF_LINK_UPDATE, RENAME_EXCHANGE on \
              bpffs) and refusals: the cells and counters compared, no rates",
    },
    Suite {
        file: "tests/live_egress.rs",
        place: Place::SomeInGuests {
            run: &[
                (
                    "a_tso_send_is_charged_its_wire_bytes_on_every_hook",
                    "GSO packets as each kernel hands them to tc egress, tc ingress and XDP",
                ),
                (
                    "clsact_is_added_only_if_absent_and_removed_only_if_shaper_added_it",
                    "the clsact attach path (6.1 has no TCX)",
                ),
                (
                    "tcx_where_the_kernel_has_it",
                    "TCX on 6.6 and later, clsact before",
                ),
                (
                    "egress_has_its_own_settings_and_round_trips_through_apply",
                    "the tc program loaded and attached through apply",
                ),
                (
                    "attach_refuses_shape_without_fq_in_one_line",
                    "the fq probe against each kernel's qdiscs",
                ),
            ],
        },
        why: "the tc program: TCX (6.6 and later) and clsact, the qdiscs left as found, \
              egress settings through apply, and a TSO send charged its wire bytes on tc \
              egress, tc ingress and XDP (exact byte counts, no rates)",
    },
    Suite {
        file: "tests/colour_test_run.rs",
        place: Place::SomeInGuests {
            run: &[
                (
                    "yellow_frames_are_remarked_alike_under_every_encapsulation_by_xdp_and_tc",
                    "yellow frames' DSCP rewritten by XDP and by tc (bpf_l3_csum_replace and \
                     bpf_skb_store_bytes on each kernel), the second meter's global \
                     functions verified",
                ),
                (
                    "a_key_over_both_rates_gets_its_bursts_green_and_yellow_and_the_rest_red",
                    "its bursts counted exactly at the slowest rates, and monitor mode",
                ),
                (
                    "the_packet_rate_passes_its_burst_and_refuses_the_rest",
                    "the packet-rate meter's burst and refusals",
                ),
                (
                    "a_frame_red_for_its_bytes_gives_its_packet_back",
                    "the packet token given back on red",
                ),
            ],
        },
        why: "the second meter through BPF_PROG_TEST_RUN; the test over time (3x and 1.5x \
              CIR) paces test runs by the clock: host only",
    },
    Suite {
        file: "tests/shape_test_run.rs",
        place: Place::Guests,
        why: "shape mode's departure stamps, CE marks and horizon drops through \
              BPF_PROG_TEST_RUN of the tc program (bpf_skb_set_tstamp and \
              bpf_skb_ecn_set_ce on each kernel), bounded by the clock around each run",
    },
    Suite {
        file: "tests/live_shape.rs",
        place: Place::GuestOnly {
            tests: &[
                "shaped_tcp_is_held_to_the_rate_and_policed_tcp_is_dropped",
                "ecn_capable_flows_held_past_the_threshold_are_marked",
            ],
        },
        why: "shape mode needs sch_fq, which this machine's kernel lacks and the guests \
              have as a module: TCP policed is dropped, shaped is held to the rate (an \
              upper bound) and marked CE with ECN; no timing",
    },
    Suite {
        file: "tests/watch.rs",
        place: Place::SomeInGuests {
            run: &[(
                "watch_reports_a_source_over_its_limit_and_none_under_it",
                "the BPF ring buffer and its reader on each kernel",
            )],
        },
        why: "shaper watch: the ring buffer and the lease (events of a source over its \
              limit, none of one under it, none while nobody watches)",
    },
    Suite {
        file: "tests/live_rate.rs",
        place: Place::Host,
        why: "rate accuracy of live traffic",
    },
    Suite {
        file: "tests/live_colour.rs",
        place: Place::Host,
        why: "the second meter's rates on live traffic, counted by DSCP at the receiver \
              against rate x the kernel's receive window + burst",
    },
    Suite {
        file: "tests/contention.rs",
        place: Place::Host,
        why: "one key from every CPU, through test_run and live over a veth with a queue \
              per CPU; its bound is rate x elapsed, so it needs a real clock",
    },
    Suite {
        file: "tests/live_flood.rs",
        place: Place::Host,
        why: "rates and admission under a live spoofed flood, against the clock",
    },
    Suite {
        file: "tests/live_encap.rs",
        place: Place::Host,
        why: "rate accuracy of live traffic (IPv6, VLAN, /24 keys, jumbo frames)",
    },
    Suite {
        file: "tests/live_policy.rs",
        place: Place::Host,
        why: "rates of live traffic under policies, and rate changes mid-traffic",
    },
    Suite {
        file: "tests/bench_accuracy.rs",
        place: Place::Host,
        why: "a benchmark: rate accuracy and CPU cost",
    },
    Suite {
        file: "tests/bench_quick.rs",
        place: Place::Host,
        why: "a benchmark: per-packet cost and live rates",
    },
    Suite {
        file: "src/lib.rs",
        place: Place::Host,
        why: "the lab's own kernel tests check that traffic arrives at the offered rate",
    },
    Suite {
        file: "tests/daemon.rs",
        place: Place::Host,
        why: "shaper run: reloads checked with live rates, and signals and readiness with \
              deadlines",
    },
    Suite {
        file: "tests/api.rs",
        place: Place::Host,
        why: "shaper run's local API over its Unix socket, with curl: userspace over the \
              same maps on any kernel",
    },
    Suite {
        file: "tests/metrics.rs",
        place: Place::Host,
        why: "shaper run's listeners (/top apart from /metrics) and a scrape's cost at a \
              full table, held to 50 ms: a time",
    },
    Suite {
        file: "tests/kubelet.rs",
        place: Place::Host,
        why: "shaper run against a ConfigMap volume's ..data swaps: the reloads are awaited \
              with deadlines, as daemon.rs's are",
    },
    Suite {
        file: "tests/prometheus.rs",
        place: Place::Host,
        why: "a Prometheus server scraping shaper run every second: its samples awaited \
              with deadlines",
    },
    Suite {
        file: "tests/image.rs",
        place: Place::Host,
        why: "the container image under podman (and the DaemonSet's pod under podman kube \
              play): podman, and a rate held by live traffic",
    },
    Suite {
        file: "tests/systemd.rs",
        place: Place::Host,
        why: "systemd as PID 1 in systemd-nspawn on the host's kernel, and a rate held \
              after systemctl stop",
    },
    Suite {
        file: "tests/top.rs",
        place: Place::Host,
        why: "shaper top: rates read from live traffic, checked against what was offered",
    },
    Suite {
        file: "tests/explain.rs",
        place: Place::Host,
        why: "no kernel tests (host tests only)",
    },
    Suite {
        file: "tests/example_config.rs",
        place: Place::Host,
        why: "no kernel tests (host tests only)",
    },
];

/// Modules the guest loads before the tests (from the kernel's own package, with modprobe):
/// veth for the namespace lab, dummy and bridge for the interfaces without native XDP that
/// cli.rs and apply.rs attach to, 8021q for live_vlan.rs's VLAN devices, sch_ingress
/// (clsact) and cls_bpf for the tc program's clsact mode, sch_fq for shape mode. (The
/// kernel would also load them on demand.)
const TEST_MODULES: &[&str] = &[
    "veth",
    "dummy",
    "bridge",
    "8021q",
    "sch_ingress",
    "cls_bpf",
    "sch_fq",
];

/// Modules the initramfs loads to reach the guest's files (with what they depend on).
const BOOT_MODULES: &[&str] = &["virtio_pci", "9pnet_virtio", "9p", "overlay"];

/// What one kernel's run came to.
struct KernelResult {
    series: &'static str,
    release: String,
    package: String,
    tally: Tally,
    /// Per suite, in the order run.
    suites: Vec<(String, SuiteResult)>,
    wall: Duration,
    /// Why the run did not complete, if it did not.
    error: Option<String>,
}

#[derive(Default)]
struct SuiteResult {
    passed: u64,
    failed: u64,
    failed_tests: Vec<String>,
    /// The binary's exit status, once it has ended.
    exit: Option<i32>,
    /// When its begin marker reached the console (this machine's clock), and how long it
    /// ran once it has ended.
    began: Option<Instant>,
    took: Option<Duration>,
}

/// Runs the guest suites under each kernel of `series`, the guests side by side (each is
/// mostly one emulated CPU running one test at a time; the kernels are fetched first, one
/// at a time, as apt wants); `extra` goes to every test binary after our own arguments (a
/// filter, say). Each guest's console lines are printed as they come, after its name.
/// Prints each kernel's results and returns the total; fails only when nothing could run
/// at all.
pub fn run(
    series: &[&'static Series],
    extra: &[String],
    phases: &mut Phases,
) -> Result<(Tally, ExitCode)> {
    print_plan();
    let suites = phases.time("build (kernel matrix)", build_suites)?;
    let kernels: Vec<Result<Kernel>> = series.iter().map(|s| fetch(s)).collect();
    let results: Vec<KernelResult> = thread::scope(|scope| {
        let guests: Vec<_> = series
            .iter()
            .zip(kernels)
            .map(|(series, kernel)| {
                let suites = &suites;
                scope.spawn(move || {
                    let start = Instant::now();
                    let run = kernel.and_then(|kernel| run_kernel(series, kernel, suites, extra));
                    let mut result = run.unwrap_or_else(|err| KernelResult {
                        series: series.name,
                        release: String::new(),
                        package: String::new(),
                        tally: Tally::default(),
                        suites: Vec::new(),
                        wall: Duration::ZERO,
                        error: Some(format!("{err:#}")),
                    });
                    result.wall = start.elapsed();
                    result
                })
            })
            .collect();
        guests
            .into_iter()
            .map(|guest| guest.join().expect("a guest's thread panicked"))
            .collect()
    });
    for result in &results {
        print_kernel(result);
        phases.record(
            &format!("guest {} (beside the others)", result.series),
            result.wall,
            result.error.is_none() && result.tally.failed == 0,
        );
    }

    println!();
    println!("kernel matrix:");
    let mut total = Tally::default();
    let mut ok = true;
    for result in &results {
        total.passed += result.tally.passed;
        total.failed += result.tally.failed;
        // A kernel that could not run its tests (no package, no boot) fails one, so that
        // the summary line never says 0 failed when something did.
        if result.error.is_some() && result.tally.failed == 0 {
            total.failed += 1;
        }
        ok &= result.error.is_none() && result.tally.failed == 0;
        let verdict = match &result.error {
            Some(err) => format!("did not complete: {err}"),
            None if result.tally.failed == 0 => "ok".to_owned(),
            None => "FAILED".to_owned(),
        };
        println!(
            "  {:<5} {:<24} {:>4} passed {:>3} failed  {:>7}  {verdict}",
            result.series,
            result.release,
            result.tally.passed,
            result.tally.failed,
            minutes(result.wall),
        );
    }
    Ok((
        total,
        if ok {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        },
    ))
}

/// `cargo xtask bench --kernel ...`: runs `executable args...` (shaper-lab) in a guest of
/// each series, from the work tree's root (shared read-write, so what it writes lands
/// here); fails if it fails under any of them.
pub fn run_command(
    series: &[&'static Series],
    name: &str,
    executable: &Path,
    args: Vec<String>,
) -> Result<ExitCode> {
    let command = GuestSuite {
        name: name.to_owned(),
        executable: executable.to_owned(),
        dir: workspace::root().to_path_buf(),
        args,
        skip: Vec::new(),
    };
    let mut ok = true;
    for series in series {
        let start = Instant::now();
        let kernel = fetch(series)?;
        let mut result = run_kernel(series, kernel, std::slice::from_ref(&command), &[])?;
        result.wall = start.elapsed();
        print_kernel(&result);
        ok &= result.error.is_none() && result.tally.failed == 0 && !result.suites.is_empty();
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// A test binary to run in the guests.
struct GuestSuite {
    name: String,
    executable: PathBuf,
    /// Where cargo would run it: its package's directory.
    dir: PathBuf,
    /// What it is run with before the skips and the caller's arguments: libtest's
    /// `--ignored --test-threads=1` for a test binary.
    args: Vec<String>,
    /// The tests it skips (`--skip NAME`, which skips every test whose name contains NAME):
    /// those of [`Place::SomeInGuests`] the guests do not run.
    skip: Vec<String>,
}

/// Builds the test binaries here (the guests only run them) and picks the guest suites.
fn build_suites() -> Result<Vec<GuestSuite>> {
    cmd::run(&mut workspace::build_bins())?;
    let mut cargo = workspace::cargo();
    // The compiler's errors are rendered to the terminal (plain JSON would leave only
    // "could not compile" there); the artifacts' JSON (stdout) is read here.
    cargo.args([
        "test",
        "--workspace",
        "--no-run",
        "--message-format=json-render-diagnostics",
    ]);
    let line = cmd::display(&cargo);
    println!("$ {line}");
    let output = cargo
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("could not start `{line}`"))?;
    if !output.status.success() {
        bail!("`{line}` failed ({})", output.status);
    }
    let out = String::from_utf8_lossy(&output.stdout);
    let package_dir = workspace::root().join(workspace::LAB_DIR);
    let mut found = Vec::new();
    for line in out.lines() {
        if json_string(line, "reason").as_deref() != Some("compiler-artifact") {
            continue;
        }
        let (Some(src), Some(executable)) = (
            json_string(line, "src_path"),
            json_string(line, "executable"),
        ) else {
            continue;
        };
        let Ok(file) = Path::new(&src).strip_prefix(&package_dir) else {
            continue;
        };
        let Some(suite) = SUITES.iter().find(|s| Path::new(s.file) == file) else {
            continue;
        };
        let skip = match suite.place {
            Place::Guests | Place::GuestOnly { .. } => Vec::new(),
            Place::SomeInGuests { run } => not_run(suite.file, Path::new(&executable), run)?,
            Place::Host => continue,
        };
        let name = file
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        found.push(GuestSuite {
            name,
            executable: PathBuf::from(executable),
            dir: package_dir.clone(),
            args: vec!["--ignored".to_owned(), "--test-threads=1".to_owned()],
            skip,
        });
    }
    // In the table's order, whatever order cargo finished them in.
    let order = |s: &GuestSuite| {
        SUITES
            .iter()
            .position(|suite| Path::new(suite.file).file_stem() == Some(s.name.as_ref()))
    };
    found.sort_by_key(order);
    let expected = SUITES
        .iter()
        .filter(|s| !matches!(s.place, Place::Host))
        .count();
    if found.len() != expected {
        let names: Vec<&str> = found.iter().map(|s| s.name.as_str()).collect();
        bail!(
            "cargo built {} of the {expected} guest test suites ({})",
            found.len(),
            names.join(", ")
        );
    }
    Ok(found)
}

/// The kernel tests of the test binary `executable` (of `file`) that are not in `run`, for the
/// guests to skip; fails if `run` names a test the binary does not have.
fn not_run(file: &str, executable: &Path, run: &[(&str, &str)]) -> Result<Vec<String>> {
    let listed = cmd::stdout(Command::new(executable).args(["--ignored", "--list"]))?;
    let tests = kernel_tests(&listed);
    for (test, _) in run {
        if !tests.contains(test) {
            bail!("vm::SUITES runs {test} of {file} in the guests, but it has no such kernel test");
        }
    }
    let skip: Vec<String> = tests
        .into_iter()
        .filter(|test| !run.iter().any(|(name, _)| name == test))
        .map(str::to_owned)
        .collect();
    // libtest's --skip matches parts of names (--exact would make the caller's filter exact
    // too): no skipped name may be part of a name the guests run.
    for test in &skip {
        if let Some((name, _)) = run.iter().find(|(name, _)| name.contains(test.as_str())) {
            bail!("{file}: skipping {test} in the guests would skip {name} too: rename one");
        }
    }
    Ok(skip)
}

/// The test names of libtest's `--list` output (`name: test` lines).
fn kernel_tests(listed: &str) -> Vec<&str> {
    listed
        .lines()
        .filter_map(|line| line.strip_suffix(": test"))
        .collect()
}

/// The string value of the first `"key":"..."` in a line of cargo's JSON output, unescaped.
/// (Cargo writes compact JSON, and the keys we read occur once per artifact line; this
/// keeps xtask free of a JSON dependency.)
pub fn json_string(line: &str, key: &str) -> Option<String> {
    let start = line.find(&format!("\"{key}\":\""))? + key.len() + 4;
    let mut value = String::new();
    let mut chars = line[start..].chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => return Some(value),
            '\\' => match chars.next()? {
                'n' => value.push('\n'),
                't' => value.push('\t'),
                'u' => {
                    let hex: String = chars.by_ref().take(4).collect();
                    value.push(char::from_u32(u32::from_str_radix(&hex, 16).ok()?)?);
                }
                other => value.push(other),
            },
            c => value.push(c),
        }
    }
    None
}

/// An unpacked kernel package.
struct Kernel {
    package: String,
    /// Where it is unpacked: `boot/` and `lib/modules/<release>/` are under it.
    root: PathBuf,
    release: String,
}

impl Kernel {
    fn vmlinuz(&self) -> PathBuf {
        self.root
            .join("boot")
            .join(format!("vmlinuz-{}", self.release))
    }

    fn modules(&self) -> PathBuf {
        self.root.join("lib/modules").join(&self.release)
    }
}

fn run_kernel(
    series: &'static Series,
    kernel: Kernel,
    suites: &[GuestSuite],
    extra: &[String],
) -> Result<KernelResult> {
    println!();
    println!("=== kernel {} ===", series.name);
    let suites: Vec<&GuestSuite> = suites
        .iter()
        .filter(|s| {
            series.only.is_none_or(|only| {
                only.iter()
                    .any(|f| Path::new(f).file_stem() == Some(s.name.as_ref()))
            })
        })
        .collect();
    let dir = workspace::target_dir().join("vm").join(series.name);
    fs::create_dir_all(&dir).with_context(|| format!("could not create {}", dir.display()))?;
    let initramfs = dir.join("initramfs.cpio");
    let busybox = busybox()?;
    let stage2 = stage2_script(&kernel, &busybox, &suites, extra);
    write_initramfs(&kernel, &busybox, &stage2, &initramfs)?;

    let log_path = dir.join("console.log");
    let mut result = KernelResult {
        series: series.name,
        release: kernel.release.clone(),
        package: kernel.package.clone(),
        tally: Tally::default(),
        suites: Vec::new(),
        wall: Duration::ZERO,
        error: None,
    };
    let mut qemu = qemu_command(&kernel, &initramfs);
    result.error = run_guest(&mut qemu, series.name, &log_path, &mut result)?;
    // A binary that failed without a failing test (a crash, a panic outside a test, a
    // libtest usage error), or did not finish, counts as one failure.
    for (_, suite) in &mut result.suites {
        if suite.failed == 0 && suite.exit != Some(0) {
            suite.failed = 1;
            result.tally.failed += 1;
        }
    }
    Ok(result)
}

/// Finds the newest package of `series` apt knows, downloads and unpacks it (once: both stay
/// in `target/kernels/`), and indexes its modules with depmod.
fn fetch(series: &Series) -> Result<Kernel> {
    let apt = apt::options(series.release)?;
    let mut package = newest_package(series, &apt)?;
    if package.is_none() {
        // apt's lists may be missing or old (a fresh container has none).
        cmd::run(Command::new("apt-get").args(&apt).arg("update"))?;
        package = newest_package(series, &apt)?;
    }
    let Some(package) = package else {
        bail!(
            "apt knows no package {}N{}[-unsigned]",
            series.prefix,
            series.suffix
        );
    };
    let cache = workspace::target_dir().join("kernels");
    fs::create_dir_all(&cache).with_context(|| format!("could not create {}", cache.display()))?;
    let root = cache.join(&package);
    let done = root.join(".unpacked");
    if !done.exists() {
        let deb = match find_deb(&cache, &package)? {
            Some(deb) => deb,
            None => {
                let mut get = Command::new("apt-get");
                get.args(&apt)
                    .args(["download", &package])
                    .current_dir(&cache);
                cmd::run(&mut get)?;
                find_deb(&cache, &package)?
                    .with_context(|| format!("apt-get download left no {package}_*.deb"))?
            }
        };
        if root.exists() {
            fs::remove_dir_all(&root)
                .with_context(|| format!("could not remove {}", root.display()))?;
        }
        cmd::run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root))?;
        let release = release_of(&root)?;
        cmd::run(Command::new(depmod()?).arg("-b").arg(&root).arg(&release))?;
        fs::write(&done, "").with_context(|| format!("could not write {}", done.display()))?;
    }
    let release = release_of(&root)?;
    let kernel = Kernel {
        package,
        root,
        release,
    };
    if !kernel.vmlinuz().exists() {
        bail!("{} has no {}", kernel.package, kernel.vmlinuz().display());
    }
    println!("kernel {}: {}", kernel.release, kernel.root.display());
    Ok(kernel)
}

/// The newest `<prefix>N<suffix>` package in apt's lists (the unsigned one if both are).
fn newest_package(series: &Series, apt: &[String]) -> Result<Option<String>> {
    let names = cmd::stdout(
        Command::new("apt-cache")
            .args(apt)
            .args(["pkgnames", series.prefix]),
    )?;
    Ok(names
        .lines()
        .filter_map(|name| package_rank(series, name).map(|rank| (rank, name)))
        .max()
        .map(|(_, name)| name.to_owned()))
}

/// `(N, unsigned)` for a package name of `series`, `None` for any other name (`-cloud-`,
/// `-rt-`, `-dbg`, meta-packages).
fn package_rank(series: &Series, name: &str) -> Option<(u32, bool)> {
    let rest = name.strip_prefix(series.prefix)?;
    let digits = rest.find(|c: char| !c.is_ascii_digit())?;
    let abi: u32 = rest[..digits].parse().ok()?;
    match rest[digits..].strip_prefix(series.suffix)? {
        "" => Some((abi, false)),
        "-unsigned" => Some((abi, true)),
        _ => None,
    }
}

fn find_deb(dir: &Path, package: &str) -> Result<Option<PathBuf>> {
    let prefix = format!("{package}_");
    for entry in fs::read_dir(dir).with_context(|| format!("could not read {}", dir.display()))? {
        let name = entry?.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(&prefix) && name.ends_with(".deb") {
            return Ok(Some(dir.join(&*name)));
        }
    }
    Ok(None)
}

/// The one release under `<root>/lib/modules`.
fn release_of(root: &Path) -> Result<String> {
    let dir = root.join("lib/modules");
    let mut releases = Vec::new();
    for entry in fs::read_dir(&dir).with_context(|| format!("could not read {}", dir.display()))? {
        releases.push(entry?.file_name().to_string_lossy().into_owned());
    }
    match releases.as_slice() {
        [release] => Ok(release.clone()),
        _ => bail!("{} holds {releases:?}, not one release", dir.display()),
    }
}

fn depmod() -> Result<PathBuf> {
    host::find_program("depmod").context("no depmod (kmod): run `cargo xtask setup`")
}

/// The module files `BOOT_MODULES` need, dependencies first, each once.
fn boot_modules(kernel: &Kernel) -> Result<Vec<PathBuf>> {
    let modprobe = host::find_program("modprobe").context("no modprobe (kmod)")?;
    let out = cmd::stdout(
        Command::new(modprobe)
            .arg("-d")
            .arg(&kernel.root)
            .args(["-S", &kernel.release, "-a", "--show-depends"])
            .args(BOOT_MODULES),
    )?;
    let mut modules: Vec<PathBuf> = Vec::new();
    for line in out.lines() {
        // `insmod /path/to/mod.ko[.xz] [params]`, or `builtin name`.
        if let Some(path) = line
            .strip_prefix("insmod ")
            .and_then(|rest| rest.split_whitespace().next())
        {
            let path = PathBuf::from(path);
            if !modules.contains(&path) {
                modules.push(path);
            }
        }
    }
    Ok(modules)
}

/// A module file's contents, decompressed: busybox's insmod reads plain ELF only.
fn module_bytes(path: &Path) -> Result<Vec<u8>> {
    let name = path.to_string_lossy();
    if name.ends_with(".ko") {
        return fs::read(path).with_context(|| format!("could not read {name}"));
    }
    let tool: &[&str] = if name.ends_with(".ko.xz") {
        &["busybox", "xzcat"]
    } else if name.ends_with(".ko.gz") {
        &["busybox", "zcat"]
    } else if name.ends_with(".ko.zst") {
        &["zstd", "-dc"]
    } else {
        bail!("{name}: not a module file this knows how to read");
    };
    let output = Command::new(tool[0])
        .args(&tool[1..])
        .arg(path)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("could not start {}", tool.join(" ")))?;
    if !output.status.success() {
        bail!("{} {name} failed ({})", tool.join(" "), output.status);
    }
    Ok(output.stdout)
}

/// Quotes `word` for sh.
fn sh_quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// The marker the guest scripts put in front of what they report on the console.
const MARK: &str = "@@shaper-vm:";

/// The initramfs's /init (busybox sh): modules, the guest's root (this machine's `/`
/// read-only under a tmpfs overlay, the work tree read-write), then the tests' script as
/// the new root's first process.
fn init_script(modules: &[String]) -> String {
    let work = workspace::root().to_string_lossy().into_owned();
    let newroot_work = sh_quote(&format!("/newroot{work}"));
    let modules = modules.join(" ");
    format!(
        r#"#!/bin/busybox sh
/bin/busybox mkdir -p /bin /proc /sys /dev
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
fail() {{
    echo "{MARK} init failed: $*"
    poweroff -f
}}
for m in {modules}; do
    insmod /modules/$m || fail "insmod $m"
done
# 9p with a large message size and the page cache: the test binaries are large, and the
# host does not change these files while the guest runs.
opts=trans=virtio,version=9p2000.L,msize=512000,cache=loose
mkdir -p /hostroot /ovl /newroot
mount -t 9p -o ro,$opts hostroot /hostroot || fail "mount the host's root"
mount -t tmpfs -o mode=0755 ovl /ovl
mkdir -p /ovl/upper /ovl/work
mount -t overlay -o lowerdir=/hostroot,upperdir=/ovl/upper,workdir=/ovl/work overlay /newroot \
    || fail "mount the overlay"
mkdir -p {newroot_work}
mount -t 9p -o $opts worktree {newroot_work} || fail "mount the work tree"
mount -t proc proc /newroot/proc
mount -t sysfs sysfs /newroot/sys
mount -t bpf bpf /newroot/sys/fs/bpf
mount -t devtmpfs devtmpfs /newroot/dev
mkdir -p /newroot/dev/pts /newroot/dev/shm
mount -t devpts devpts /newroot/dev/pts
mount -t tmpfs -o mode=1777 tmpfs /newroot/dev/shm
mount -t tmpfs -o mode=0755 tmpfs /newroot/run
mount -t tmpfs -o mode=1777 tmpfs /newroot/tmp
cp /stage2 /newroot/run/shaper-vm.sh
umount /proc /sys /dev
exec switch_root /newroot /bin/sh /run/shaper-vm.sh
"#
    )
}

/// The script the guest runs in its new root (this machine's files, with its `sh`): the
/// kernel's modules in place, loopback up, each suite, then power off.
fn stage2_script(
    kernel: &Kernel,
    busybox: &Path,
    suites: &[&GuestSuite],
    extra: &[String],
) -> String {
    let mut script = format!(
        r#"#!/bin/sh
# The kernel tests in a guest of `cargo xtask test --kernel`; PID 1 of the guest.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
say() {{ echo "{MARK} $*"; }}
mkdir -p /lib/modules/{release}
mount --bind {modules} /lib/modules/{release}
ip link set lo up
modprobe -a {test_modules} || say "modprobe {test_modules} failed"
say kernel "$(uname -r)"
# From here on the kernel log holds what the tests made the kernel say.
dmesg --clear
"#,
        release = sh_quote(&kernel.release),
        modules = sh_quote(&kernel.modules().to_string_lossy()),
        test_modules = TEST_MODULES.join(" "),
    );
    for suite in suites {
        let mut words = vec![
            "exec".to_owned(),
            sh_quote(&suite.executable.to_string_lossy()),
        ];
        words.extend(suite.args.iter().map(|arg| sh_quote(arg)));
        for test in &suite.skip {
            words.push("--skip".to_owned());
            words.push(sh_quote(test));
        }
        words.extend(extra.iter().map(|arg| sh_quote(arg)));
        script.push_str(&format!(
            "say begin {name}\n(cd {dir} && {command})\nsay end {name} $?\n",
            name = suite.name,
            dir = sh_quote(&suite.dir.to_string_lossy()),
            command = words.join(" "),
        ));
    }
    // busybox's poweroff -f powers off there and then (the reboot system call); the sysrq
    // one is asynchronous, and PID 1 must not exit before it has happened.
    script.push_str(&format!(
        r#"say done
# Warnings and errors the kernel logged while the tests ran (the console shows only the
# worst): a verifier, driver or lockdep complaint lands here.
log=$(dmesg --level=emerg,alert,crit,err,warn | tail -n 50)
if [ -n "$log" ]; then
    say kernel log, warnings and worse, during the tests:
    echo "$log"
fi
sync
exec {busybox} poweroff -f
"#,
        busybox = sh_quote(&busybox.to_string_lossy()),
    ));
    script
}

/// This machine's busybox, which must be static: the initramfs has no libraries.
fn busybox() -> Result<PathBuf> {
    let busybox = host::find_program("busybox").context("no busybox: run `cargo xtask setup`")?;
    if !host::is_static_elf(&busybox)? {
        bail!(
            "{} is not statically linked: install busybox-static (`cargo xtask setup`)",
            busybox.display()
        );
    }
    Ok(busybox)
}

fn write_initramfs(kernel: &Kernel, busybox: &Path, stage2: &str, path: &Path) -> Result<()> {
    let mut cpio = Cpio::default();
    for dir in ["bin", "dev", "proc", "sys", "modules"] {
        cpio.dir(dir);
    }
    cpio.char_device("dev/console", 5, 1);
    cpio.file(
        "bin/busybox",
        0o755,
        &fs::read(busybox).with_context(|| format!("could not read {}", busybox.display()))?,
    );
    let mut names = Vec::new();
    for (i, module) in boot_modules(kernel)?.iter().enumerate() {
        let file = module
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let stem = file.split(".ko").next().unwrap_or(&file);
        let name = format!("{i:02}-{stem}.ko");
        cpio.file(&format!("modules/{name}"), 0o644, &module_bytes(module)?);
        names.push(name);
    }
    cpio.file("init", 0o755, init_script(&names).as_bytes());
    cpio.file("stage2", 0o755, stage2.as_bytes());
    fs::write(path, cpio.finish()).with_context(|| format!("could not write {}", path.display()))
}

/// A cpio archive in the "newc" format, the one the kernel unpacks as an initramfs.
#[derive(Default)]
struct Cpio {
    out: Vec<u8>,
    inode: u32,
}

impl Cpio {
    fn dir(&mut self, name: &str) {
        self.entry(name, 0o040_755, (0, 0), &[]);
    }

    fn file(&mut self, name: &str, perm: u32, data: &[u8]) {
        self.entry(name, 0o100_000 | perm, (0, 0), data);
    }

    fn char_device(&mut self, name: &str, major: u32, minor: u32) {
        self.entry(name, 0o020_600, (major, minor), &[]);
    }

    fn entry(&mut self, name: &str, mode: u32, (major, minor): (u32, u32), data: &[u8]) {
        self.inode += 1;
        let size = u32::try_from(data.len()).expect("initramfs files are under 4 GiB");
        let name_size = u32::try_from(name.len() + 1).expect("short names");
        let nlink = if mode & 0o170_000 == 0o040_000 { 2 } else { 1 };
        // magic, ino, mode, uid, gid, nlink, mtime, filesize, devmajor, devminor,
        // rdevmajor, rdevminor, namesize, check
        let fields = [
            self.inode, mode, 0, 0, nlink, 0, size, 0, 0, major, minor, name_size, 0,
        ];
        self.out.extend_from_slice(b"070701");
        for field in fields {
            self.out
                .extend_from_slice(format!("{field:08x}").as_bytes());
        }
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(0);
        self.pad();
        self.out.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.out.len().is_multiple_of(4) {
            self.out.push(0);
        }
    }

    fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, (0, 0), &[]);
        self.out
    }
}

fn qemu_command(kernel: &Kernel, initramfs: &Path) -> Command {
    let share = |path: &Path, tag: &str, readonly: bool| {
        let mut spec = format!(
            "local,path={},mount_tag={tag},security_model=none,multidevs=remap",
            path.display()
        );
        if readonly {
            spec.push_str(",readonly=on");
        }
        spec
    };
    let mut qemu = Command::new("qemu-system-x86_64");
    qemu.args(["-accel", "tcg,thread=multi", "-cpu", "max", "-smp", "2"])
        .args(["-m", "2G", "-no-reboot", "-nic", "none"])
        .args(["-display", "none", "-monitor", "none", "-serial", "stdio"])
        .arg("-kernel")
        .arg(kernel.vmlinuz())
        .arg("-initrd")
        .arg(initramfs)
        .args(["-append", "console=ttyS0 quiet panic=-1"])
        .arg("-virtfs")
        .arg(share(Path::new("/"), "hostroot", true))
        .arg("-virtfs")
        .arg(share(workspace::root(), "worktree", false));
    qemu
}

/// Runs the guest, echoing its console (each line after `[name]`: guests run side by
/// side) and keeping it in `log_path`, and counts its tests into `result` (what ran is
/// counted however the guest ends). Returns why the guest did not get to the end of its
/// script, if it did not: one still running after [`GUEST_TIMEOUT`] is killed.
fn run_guest(
    qemu: &mut Command,
    name: &str,
    log_path: &Path,
    result: &mut KernelResult,
) -> Result<Option<String>> {
    let line = cmd::display(qemu);
    println!("$ {line}");
    let mut log = fs::File::create(log_path)
        .with_context(|| format!("could not create {}", log_path.display()))?;
    let mut child = qemu
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("could not start `{line}`"))?;
    let stdout = child.stdout.take().context("no stdout")?;
    let (send, lines) = mpsc::channel();
    let reader = thread::spawn(move || {
        let mut stdout = BufReader::new(stdout);
        let mut buf = Vec::new();
        // Bytes, not UTF-8 lines: a console can carry anything.
        while stdout.read_until(b'\n', &mut buf).is_ok_and(|n| n > 0) {
            let text = String::from_utf8_lossy(&buf);
            let text = text.trim_end_matches(['\n', '\r']).to_owned();
            buf.clear();
            if send.send(text).is_err() {
                break;
            }
        }
    });

    let deadline = Instant::now() + GUEST_TIMEOUT;
    let mut console = Console::default();
    let timed_out = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(text) => {
                println!("[{name}] {text}");
                writeln!(log, "{text}").ok();
                console.read(&text, result);
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break false,
            Err(mpsc::RecvTimeoutError::Timeout) => break true,
        }
    };
    if timed_out {
        child.kill().ok();
        child.wait().ok();
        reader.join().ok();
        return Ok(Some(format!(
            "the guest was still running after {} and was killed (console: {})",
            minutes(GUEST_TIMEOUT),
            log_path.display()
        )));
    }
    // The console closed: QEMU is exiting. Give it a moment, then make sure.
    let exit_deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if Instant::now() > exit_deadline {
            child.kill().ok();
            child.wait().ok();
            break None;
        }
        thread::sleep(Duration::from_millis(100));
    };
    reader.join().ok();
    Ok(match status {
        Some(status) if !status.success() => Some(format!("`{line}` failed ({status})")),
        None => Some("QEMU closed its console but did not exit: killed".to_owned()),
        Some(_) if !console.done => Some(format!(
            "the guest stopped before the tests ended (console: {})",
            log_path.display()
        )),
        Some(_) => None,
    })
}

/// What the guest's console has said so far.
#[derive(Default)]
struct Console {
    /// The suite running now.
    current: Option<String>,
    done: bool,
}

impl Console {
    fn read(&mut self, line: &str, result: &mut KernelResult) {
        // libtest colours its output on the guest's console, which is a terminal.
        let line = &strip_ansi(line);
        // The marker may follow a stray kernel message on the same line.
        if let Some(at) = line.find(MARK) {
            let words: Vec<&str> = line[at + MARK.len()..].split_whitespace().collect();
            match words.as_slice() {
                ["begin", name] => {
                    self.current = Some((*name).to_owned());
                    result.suites.push((
                        (*name).to_owned(),
                        SuiteResult {
                            began: Some(Instant::now()),
                            ..SuiteResult::default()
                        },
                    ));
                }
                ["end", name, code] => {
                    if let Some((_, suite)) = result.suites.iter_mut().find(|(n, _)| n == name) {
                        suite.exit = code.parse().ok();
                        suite.took = suite.began.map(|began| began.elapsed());
                    }
                    self.current = None;
                }
                ["done"] => self.done = true,
                _ => {}
            }
            return;
        }
        let Some(current) = &self.current else {
            return;
        };
        let Some((_, suite)) = result.suites.iter_mut().find(|(n, _)| n == current) else {
            return;
        };
        if let Some(counts) = Tally::of_result_line(line) {
            suite.passed += counts.passed;
            suite.failed += counts.failed;
            result.tally.passed += counts.passed;
            result.tally.failed += counts.failed;
        } else if let Some(test) = line
            .strip_prefix("test ")
            .and_then(|rest| rest.strip_suffix(" ... FAILED"))
        {
            suite.failed_tests.push(test.to_owned());
        }
    }
}

fn print_kernel(result: &KernelResult) {
    println!();
    println!(
        "kernel {} ({} from {}): {} passed, {} failed in {}",
        result.series,
        result.release,
        result.package,
        result.tally.passed,
        result.tally.failed,
        minutes(result.wall)
    );
    let mut failures = Vec::new();
    for (name, suite) in &result.suites {
        let took = suite.took.map(minutes).unwrap_or_default();
        println!(
            "  {name:<20} {:>3} passed {:>3} failed  {took:>7}",
            suite.passed, suite.failed
        );
        failures.extend(
            suite
                .failed_tests
                .iter()
                .map(|test| format!("{name}: {test}")),
        );
        match suite.exit {
            Some(0) => {}
            Some(code) if suite.failed_tests.is_empty() => failures.push(format!(
                "{name}: the test binary exited with {code}, no test reported failing"
            )),
            Some(_) => {}
            None => failures.push(format!("{name}: did not finish")),
        }
    }
    if failures.is_empty() && result.error.is_none() {
        println!("  failed on this kernel: none");
    } else if !failures.is_empty() {
        println!("  failed on this kernel:");
        for failure in failures {
            println!("    {failure}");
        }
    }
    if let Some(err) = &result.error {
        println!("  error: {err}");
    }
}

/// `line` without ANSI escape sequences (`ESC [ ... letter`).
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            if chars.next() == Some('[') {
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// What the guests run and what they leave to the host, and why.
fn print_plan() {
    println!("kernel tests in the guests ({}):", workspace::LAB_DIR);
    for suite in SUITES {
        match suite.place {
            Place::Guests => println!("  {} (every test): {}", suite.file, suite.why),
            Place::SomeInGuests { run } => {
                println!("  {}: {}", suite.file, suite.why);
                for (test, why) in run {
                    println!("    {test}: {why}");
                }
                println!("    (its other tests: the host run, once)");
            }
            Place::GuestOnly { .. } => println!("  {} (guests only): {}", suite.file, suite.why),
            Place::Host => {}
        }
    }
    println!("left to the host (timing means nothing under emulation, or no kernel tests):");
    for suite in SUITES {
        if let Place::Host = suite.place {
            println!("  {}: {}", suite.file, suite.why);
        }
    }
}

/// The tests only the guests run ([`Place::GuestOnly`]), for the host run to skip.
pub fn guest_only_tests() -> impl Iterator<Item = &'static str> {
    SUITES
        .iter()
        .flat_map(|s| match s.place {
            Place::GuestOnly { tests } => tests,
            _ => &[],
        })
        .copied()
}

/// The series `--kernel` names.
pub fn series_named(name: &str) -> Option<&'static Series> {
    SERIES.iter().find(|s| s.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_test_file_is_placed() {
        let dir = workspace::root().join(workspace::LAB_DIR).join("tests");
        let mut files: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "rs"))
            .map(|p| format!("tests/{}", p.file_name().unwrap().to_string_lossy()))
            .collect();
        files.sort();
        for file in &files {
            assert!(
                SUITES.iter().any(|s| s.file == file),
                "{file} is not in vm::SUITES: say whether the kernel matrix runs it"
            );
        }
        for suite in SUITES {
            assert!(
                workspace::root()
                    .join(workspace::LAB_DIR)
                    .join(suite.file)
                    .exists(),
                "vm::SUITES names {}, which does not exist",
                suite.file
            );
        }
    }

    #[test]
    fn guest_only_files_list_every_test() {
        for suite in SUITES {
            let Place::GuestOnly { tests } = suite.place else {
                continue;
            };
            let path = workspace::root().join(workspace::LAB_DIR).join(suite.file);
            let text = fs::read_to_string(path).unwrap();
            assert_eq!(
                text.matches("#[test]").count(),
                tests.len(),
                "{}",
                suite.file
            );
            for test in tests {
                assert!(
                    text.contains(&format!("fn {test}(")),
                    "{}: {test}",
                    suite.file
                );
            }
        }
        assert!(guest_only_tests().count() > 0);
    }

    #[test]
    fn the_tests_some_files_run_in_the_guests_are_theirs() {
        for suite in SUITES {
            let Place::SomeInGuests { run } = suite.place else {
                continue;
            };
            let path = workspace::root().join(workspace::LAB_DIR).join(suite.file);
            let text = fs::read_to_string(path).unwrap();
            assert!(!run.is_empty(), "{}: Place::Host runs none", suite.file);
            for (test, why) in run {
                assert!(
                    text.contains(&format!("fn {test}(")),
                    "{}: {test}",
                    suite.file
                );
                assert!(!why.is_empty());
            }
        }
    }

    #[test]
    fn listed_tests() {
        let listed = "a_test: test\nmod_x::b: test\na_bench: bench\n\n2 tests, 1 benchmark\n";
        assert_eq!(kernel_tests(listed), ["a_test", "mod_x::b"]);
    }

    #[test]
    fn package_names() {
        let (old, new) = (series_named("6.1").unwrap(), series_named("6.12").unwrap());
        assert_eq!(
            package_rank(old, "linux-image-6.1.0-56-amd64-unsigned"),
            Some((56, true))
        );
        assert_eq!(
            package_rank(old, "linux-image-6.1.0-9-amd64"),
            Some((9, false))
        );
        assert_eq!(package_rank(old, "linux-image-6.1.0-56-cloud-amd64"), None);
        assert_eq!(package_rank(old, "linux-image-6.1.0-56-rt-amd64"), None);
        assert_eq!(package_rank(old, "linux-image-6.1.0-56-amd64-dbg"), None);
        assert_eq!(
            package_rank(new, "linux-image-6.12.117+deb12-amd64-unsigned"),
            Some((117, true))
        );
        assert_eq!(package_rank(new, "linux-image-6.12-amd64"), None);
        let bullseye = series_named("5.10").unwrap();
        assert_eq!(
            package_rank(bullseye, "linux-image-5.10.0-46-amd64"),
            Some((46, false))
        );
        assert_eq!(
            package_rank(bullseye, "linux-image-5.10.0-46-cloud-amd64"),
            None
        );
        assert_eq!(
            package_rank(new, "linux-image-6.12.117+deb12-cloud-amd64"),
            None
        );
    }

    #[test]
    fn json_strings() {
        let line = r#"{"reason":"compiler-artifact","target":{"name":"cli","src_path":"/w/a \"b\"\\c.rs"},"executable":"/w/t/cli-1"}"#;
        assert_eq!(json_string(line, "reason").unwrap(), "compiler-artifact");
        assert_eq!(json_string(line, "src_path").unwrap(), r#"/w/a "b"\c.rs"#);
        assert_eq!(json_string(line, "executable").unwrap(), "/w/t/cli-1");
        assert_eq!(json_string(line, "missing"), None);
        // `"executable":null` is not a string.
        assert_eq!(json_string(r#"{"executable":null}"#, "executable"), None);
    }

    #[test]
    fn cpio_entries_are_aligned() {
        let mut cpio = Cpio::default();
        cpio.dir("bin");
        cpio.file("bin/x", 0o755, b"hello");
        let out = cpio.finish();
        assert!(out.len().is_multiple_of(4));
        assert!(out.starts_with(b"070701"));
        // A 110-byte header and "bin\0", padded to a multiple of 4.
        let second = 116;
        assert_eq!(&out[second..second + 6], b"070701");
        assert!(out.windows(10).any(|w| w == b"TRAILER!!!"));
    }

    #[test]
    fn console_counts_per_suite() {
        let mut result = KernelResult {
            series: "6.1",
            release: String::new(),
            package: String::new(),
            tally: Tally::default(),
            suites: Vec::new(),
            wall: Duration::ZERO,
            error: None,
        };
        let mut console = Console::default();
        for line in [
            "@@shaper-vm: begin cli",
            "test missing_bpffs_is_refused ... \x1b[31mFAILED\x1b[m",
            "test result: \x1b[31mFAILED\x1b[m. 6 passed; 1 failed; 0 ignored; 0 measured; 1 filtered out",
            "[   12.3] random kernel line @@shaper-vm: end cli 101",
            "test result: ok. 9 passed; 0 failed",
            "@@shaper-vm: done",
        ] {
            console.read(line, &mut result);
        }
        assert!(console.done);
        assert_eq!(
            result.tally,
            Tally {
                passed: 6,
                failed: 1
            }
        );
        let (name, cli) = &result.suites[0];
        assert_eq!(name, "cli");
        assert_eq!((cli.passed, cli.failed, cli.exit), (6, 1, Some(101)));
        assert_eq!(cli.failed_tests, ["missing_bpffs_is_refused"]);
    }
}

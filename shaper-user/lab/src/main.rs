//! `shaper-lab`: try shaper on a throwaway two-namespace network (see `shaper_lab::lab`).
//!
//! * `demo` attaches shaper, drives four sources at different loads and shows what got
//!   through per source.
//! * `lab` builds the network and waits, for experimenting by hand.
//! * `bench` measures per-packet cost, scale and rate accuracy, and writes the report.
//! * `fuzz` runs fuzzed frames through the program with BPF_PROG_TEST_RUN.
//!
//! Needs root (it creates network namespaces, or loads programs). Everything it creates is removed on exit,
//! including after an error or Ctrl-C.

use std::{
    io::BufRead as _,
    path::{Path, PathBuf},
    process::ExitCode,
    sync::atomic::{AtomicBool, Ordering},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};
use clap::{Args, Parser, Subcommand};
use shaper_lab::{
    bench::builds::Build,
    cli::AttachGuard,
    lab::{Flow, FlowResult, Lab, run_udp},
};
use shaper_user::units::{Rate, Size, human_rate};

#[derive(Debug, Parser)]
#[command(about = "Try shaper on a throwaway pair of network namespaces (needs root)")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Attach shaper, send from four sources at 2x, 5x, 0.9x and 0.5x the limit, show the
    /// result per source, then detach and remove everything.
    Demo(DemoArgs),
    /// Build the lab, print its names and commands to try, and wait for Enter or Ctrl-C.
    Lab(LabArgs),
    /// Benchmarks: per-packet cost against a no-op XDP program, memory and cost as sources
    /// grow, rate accuracy against tc; writes results.md, results.json and SVG plots.
    Bench(Box<BenchArgs>),
    /// Run random and mutated frames of every encapsulation through the XDP program
    /// (BPF_PROG_TEST_RUN, no interface) and check every verdict and counter.
    Fuzz(FuzzArgs),
}

#[derive(Debug, Args)]
struct FuzzArgs {
    /// Frames to run
    #[arg(long, default_value_t = 10_000_000)]
    frames: u64,
    /// Seed of the frame generator (decimal or 0x hex) [default: from the clock]
    #[arg(long, value_parser = parse_seed)]
    seed: Option<u64>,
}

fn parse_seed(s: &str) -> Result<u64, String> {
    match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    }
    .map_err(|e| format!("{s}: {e}"))
}

#[derive(Debug, Args)]
struct BenchArgs {
    /// The shaper command, for the lab benchmarks [default: next to this executable]
    #[arg(long)]
    shaper: Option<PathBuf>,
    /// A short smoke run: fewer repetitions, frames and seconds (figures not worth quoting).
    #[arg(long)]
    quick: bool,
    /// Where to write results.md, results.json and the plots (created if needed)
    #[arg(long, default_value = "bench")]
    out: PathBuf,
    /// Runs of the program per loop measurement [default: 1000000, 10000 with --quick]
    #[arg(long)]
    repeat: Option<u32>,
    /// Measurements per case; the median is reported [default: 7, 5 with --quick]
    #[arg(long)]
    runs: Option<usize>,
    /// Investigate: run only these lab benchmarks, print them, write nothing (but `tcp`
    /// and `provision`, which write results-tcp.md and results-provision.md under --out,
    /// and `kernel`, which records this kernel in results-kernels.json and .md and
    /// rewrites the docs' kernel table)
    #[arg(long, value_enum, value_delimiter = ',')]
    only: Vec<LabPart>,
    /// The baseline's release build (its `shaper` and kernel object), measured next to
    /// today's [default: target/old-shaper/COMMIT/release, which `cargo xtask bench` builds]
    #[arg(long)]
    baseline: Option<PathBuf>,
    /// The workspace whose docs (README.md, docs/) hold the generated kernel table to
    /// rewrite from the results [`cargo xtask bench` passes it; default: none rewritten]
    #[arg(long)]
    docs: Option<PathBuf>,
    /// Says the run is under emulation (how, e.g. "QEMU TCG"): `tcp` then gives no time
    /// figures (`cargo xtask bench --kernel` passes it)
    #[arg(long)]
    emulated: Option<String>,
    /// With `--only sweep`: only these limits per source (tc units, repeatable)
    #[arg(long)]
    rate: Vec<Rate>,
    /// With `--only sweep`: only these frame sizes, bytes (repeatable)
    #[arg(long)]
    frame: Vec<u32>,
    /// With `--only sweep`: only these numbers of sources (repeatable)
    #[arg(long)]
    sources: Vec<usize>,
    /// With `--only provision`: another `shaper` (a release build of an earlier commit)
    /// timed after today's in the same run, its rows labelled with its file's name
    #[arg(long)]
    provision_against: Option<PathBuf>,
    /// With `--only coa`: CoA-Requests a second [default: 1000]
    #[arg(long)]
    coa_rate: Option<u32>,
    /// With `--only coa`: how long to send them, seconds [default: 60, 5 with --quick]
    #[arg(long)]
    coa_seconds: Option<u64>,
    /// With `--only coa`: subscribers [default: 100000, 10000 with --quick]
    #[arg(long)]
    coa_subscribers: Option<u32>,
    /// With `--only coa`: Disconnect-Requests sent one at a time after the CoAs, each
    /// timed [default: 20]
    #[arg(long)]
    coa_disconnects: Option<u32>,
    /// With `--only coa` or `accounting`: each window the daemon's CPU is read over,
    /// seconds [default: 60, 10 with --quick]
    #[arg(long)]
    accounting_seconds: Option<u64>,
    /// With `--only coa` or `accounting`: the windows [default: 3, 2 with --quick]
    #[arg(long)]
    accounting_windows: Option<u32>,
    /// With `--only coa` or `accounting`: another `shaper` (a release build of an earlier
    /// commit) measured after today's in the same run, its rows labelled with its file's
    /// name
    #[arg(long)]
    accounting_against: Option<PathBuf>,
}

/// The benchmarks `--only` picks from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum LabPart {
    /// The programs of both builds on this kernel: verified instructions, sizes, BTF
    /// functions, load time, `shaper attach` time; writes results-kernels.*
    Kernel,
    /// Per-packet cost (test_run) of both builds, without the cold-key cases that need
    /// filled maps
    PerPacket,
    /// Rate accuracy against the incumbents
    Sweep,
    /// Delivered rate over time per source
    Series,
    /// Softirq CPU per million packets
    Cpu,
    /// A live spoofed flood: shaper with and without new-source admission, the nft meter, hashlimit, tbf, htb
    Flood,
    /// Sources under their limit through shaper, the generator catching up late frames or skipping them
    Late,
    /// One overloaded source through shaper, nft and hashlimit for 3, 5 and 10 s
    Duration,
    /// iperf3 TCP policed, shaped and shaped with ECN (shape needs sch_fq); writes results-tcp.md
    Tcp,
    /// RADIUS CoA-Requests to `shaper run` at 1,000 a second for 60 s against 100,000
    /// subscribers (10,000 for 5 s with --quick): latency, losses, scrapes meanwhile; then
    /// `accounting`
    Coa,
    /// RADIUS accounting's CPU at 100,000 subscribers, interim 300 s, against the same
    /// daemon without (10,000 with --quick); writes results-accounting.md (`coa` runs it too)
    Accounting,
    /// Whole commands at 16,383 prefix policies and at 1,000,000 subscribers (10,000 with
    /// --quick): apply from nothing, one change; writes results-provision.md
    Provision,
}

#[derive(Debug, Args)]
struct DemoArgs {
    /// The shaper command [default: `shaper` next to this executable]
    #[arg(long)]
    shaper: Option<PathBuf>,
    /// Per-source rate limit, in tc syntax (bits per second: 10mbit, 500kbit)
    #[arg(long, default_value = "10mbit")]
    rate: Rate,
    /// Per-source burst, in tc syntax (bytes: 64k, 1514b)
    #[arg(long, default_value = "64k")]
    burst: Size,
    /// How long the sources send
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=300))]
    seconds: u64,
}

#[derive(Debug, Args)]
struct LabArgs {
    /// Number of sender addresses (198.18.0.11, .12, ...)
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=200))]
    sources: u64,
    /// Remove the lab by itself after this many seconds
    #[arg(long, default_value_t = 3600)]
    timeout_secs: u64,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Cmd::Demo(args) => install_stop_handlers().and_then(|()| demo(&args)),
        Cmd::Lab(args) => install_stop_handlers().and_then(|()| lab(&args)),
        Cmd::Bench(args) => bench(&args),
        Cmd::Fuzz(args) => fuzz(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("shaper-lab: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Set by Ctrl-C, SIGTERM or (in `lab`) Enter. The signals are caught rather than left to
/// kill the process so the namespaces' Drop guards get to run.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop_signal(_signal: libc::c_int) {
    // Only an atomic store: that is async-signal-safe.
    STOP.store(true, Ordering::Relaxed);
}

fn install_stop_handlers() -> Result<()> {
    let handler = on_stop_signal as extern "C" fn(libc::c_int);
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler is a plain function that only stores to an atomic.
        let previous = unsafe { libc::signal(signal, handler as libc::sighandler_t) };
        if previous == libc::SIG_ERR {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("cannot install a handler for signal {signal}"));
        }
    }
    Ok(())
}

fn stop_requested() -> bool {
    STOP.load(Ordering::Relaxed)
}

// ---------------------------------------------------------------------------------------
// demo

/// Each demo source's offered load as a multiple of the limit: two overloaded, two not
/// (0.9 rather than 1.0 so that one stays clearly below the limit).
const DEMO_LOADS: [f64; 4] = [2.0, 5.0, 0.9, 0.5];
const DEMO_FRAME_BYTES: u32 = 1000;

fn demo(args: &DemoArgs) -> Result<()> {
    let shaper = match &args.shaper {
        Some(path) => path.clone(),
        None => default_shaper()?,
    };
    let rate_bps = args.rate.bits_per_sec();
    let duration = Duration::from_secs(args.seconds);
    print_demo_header(args);

    let lab = Lab::new("demo", DEMO_LOADS.len())?;
    println!(
        "lab: sources in netns {} ({}), receiver {} in netns {} ({})",
        lab.tx_ns(),
        lab.tx_iface(),
        lab.rx_addr(),
        lab.rx_ns(),
        lab.rx_iface()
    );
    // Declared after `lab`, so it detaches before the namespaces go away.
    let mut attachment = AttachGuard::new(&shaper, lab.rx_ns(), lab.rx_iface());
    let (rate, burst) = (args.rate.to_string(), args.burst.to_string());
    attachment.attach(&["--rate", &rate, "--burst", &burst])?;
    ensure!(
        lab.xdp_attached()?,
        "`shaper attach` succeeded but no XDP program is on {}",
        lab.rx_iface()
    );
    println!("shaper attached to {}: XDP program present", lab.rx_iface());

    let flows = lab.flows(
        &DEMO_LOADS.map(|load| (rate_bps as f64 * load).round() as u64),
        DEMO_FRAME_BYTES,
    );
    println!("sending for {} s ...\n", args.seconds);
    let results = run_udp(&lab, &flows, duration)?;
    if stop_requested() {
        bail!("interrupted");
    }
    print_demo_table(&results, rate_bps, args.burst.bytes());

    println!("\n$ shaper -n {} stats {}", lab.rx_ns(), lab.rx_iface());
    print!("{}", attachment.run(&["stats", lab.rx_iface()])?);

    demo_policies(&attachment, &lab, &flows, args)?;
    attachment.detach()?;
    println!("\nshaper detached; removing the lab");
    Ok(())
}

/// The second act: prefix policies set while attached, the same traffic again.
fn demo_policies(
    attachment: &AttachGuard,
    lab: &Lab,
    flows: &[Flow],
    args: &DemoArgs,
) -> Result<()> {
    let iface = lab.rx_iface();
    let (rate, burst) = (args.rate.to_string(), args.burst.to_string());
    let [dry_run, exempt, capped, ..] = lab.sources() else {
        bail!("the demo lab has fewer than three sources");
    };
    let (dry_run, exempt, capped) = (dry_run.to_string(), exempt.to_string(), capped.to_string());
    let half = Rate::from_bps(args.rate.bits_per_sec() / 2).to_string();
    println!("\nNow prefix policies, set while attached (no detach, no gap):");
    let policies: [&[&str]; 3] = [
        &[&exempt, "--action", "pass"],
        &[
            &dry_run, "--rate", &rate, "--burst", &burst, "--mode", "monitor",
        ],
        &[&capped, "--rate", &half, "--burst", &burst],
    ];
    for policy in policies {
        let mut cmd = vec!["policy", "set", iface];
        cmd.extend_from_slice(policy);
        println!("$ shaper -n {} {}", lab.rx_ns(), cmd.join(" "));
        print!("{}", attachment.run(&cmd)?);
    }
    println!("sending the same traffic for {} s ...\n", args.seconds);
    let results = run_udp(lab, flows, Duration::from_secs(args.seconds))?;
    if stop_requested() {
        bail!("interrupted");
    }
    println!(
        "{:<13} {:>13} {:>13}  policy",
        "source", "offered", "received"
    );
    for r in &results {
        let src = r.src.to_string();
        let policy = if src == exempt {
            "exempt: never limited"
        } else if src == dry_run {
            "monitor: nothing dropped, would-drops counted"
        } else if src == capped {
            "half the default rate"
        } else {
            "the default"
        };
        println!(
            "{:<13} {:>13} {:>13}  {policy}",
            src,
            human_rate(r.sent_bps().round() as u64),
            human_rate(r.received_bps().round() as u64),
        );
    }
    println!("\n$ shaper -n {} policy list {iface}", lab.rx_ns());
    print!("{}", attachment.run(&["policy", "list", iface])?);
    Ok(())
}

fn print_demo_header(args: &DemoArgs) {
    println!(
        "shaper demo: a per-source rate limit of {} (burst {})",
        args.rate, args.burst
    );
    println!(
        "Four sources send UDP in {DEMO_FRAME_BYTES}-byte frames to one receiver for {} s, \
         offering {} the limit.",
        args.seconds,
        DEMO_LOADS.map(|l| format!("{l}x")).join(", ")
    );
    println!(
        "The limit applies to each source separately; rates count layer-2 frame bytes \
         (Ethernet header included, no FCS)."
    );
    println!(
        "Expected: an overloaded source gets about rate + burst / seconds; the others get \
         what they offer.\n"
    );
}

fn print_demo_table(results: &[FlowResult], rate_bps: u64, burst_bytes: u64) {
    println!(
        "{:<13} {:>13} {:>13} {:>13} {:>13} {:>10}",
        "source", "offered", "received", "expected", "limit", "recv/limit"
    );
    for r in results {
        // The burst is a one-off allowance on top of the rate, spread over the run.
        let cap = rate_bps as f64 + (burst_bytes * 8) as f64 / r.offered_secs.max(f64::EPSILON);
        let expected = r.sent_bps().min(cap);
        println!(
            "{:<13} {:>13} {:>13} {:>13} {:>13} {:>9.1}%",
            r.src.to_string(),
            human_rate(r.sent_bps().round() as u64),
            human_rate(r.received_bps().round() as u64),
            human_rate(expected.round() as u64),
            human_rate(rate_bps),
            r.received_bps() / rate_bps as f64 * 100.0
        );
    }
}

/// The `shaper` built next to this executable (`target/<profile>/`).
fn default_shaper() -> Result<PathBuf> {
    shaper_lab::bins::locate().context("pass --shaper PATH")
}

/// The shaper command the bench drives: `--shaper`, or [`default_shaper`].
fn bench_shaper(args: &BenchArgs) -> Result<PathBuf> {
    args.shaper.clone().map_or_else(default_shaper, Ok)
}

/// The baseline build (`--baseline`, or where `cargo xtask bench` builds it).
fn baseline(args: &BenchArgs) -> Result<Build> {
    let dir = match &args.baseline {
        Some(dir) => dir.clone(),
        None => shaper_lab::bins::baseline_dir()?,
    };
    Build::baseline(&dir)
}

/// The programs of both builds on this kernel, recorded in results-kernels.* (and the
/// docs' table); returns what was written.
fn bench_kernel(args: &BenchArgs, baseline: &Build, today: &Build) -> Result<Vec<PathBuf>> {
    use shaper_lab::bench::kernels;

    println!(
        "the programs of {} (baseline) and today's build on this kernel{} ...",
        baseline.label,
        if args.emulated.is_some() {
            " (emulated: no times)"
        } else {
            ""
        }
    );
    let opts = kernels::Options::new(args.quick, args.emulated.clone());
    let run = kernels::run(baseline, today, &opts)?;
    print!(
        "{}",
        kernels::markdown(&kernels::AllKernels {
            kernels: vec![run.clone()]
        })
    );
    kernels::write(&args.out, run, args.docs.as_deref())
}

// ---------------------------------------------------------------------------------------
// lab

fn lab(args: &LabArgs) -> Result<()> {
    let sources = usize::try_from(args.sources).context("--sources")?;
    let lab = Lab::new("lab", sources)?;
    print_lab_guide(&lab);

    // Enter on stdin also ends the wait; end of input does not (so it can run detached).
    thread::spawn(|| {
        let mut line = String::new();
        if matches!(std::io::stdin().lock().read_line(&mut line), Ok(n) if n > 0) {
            STOP.store(true, Ordering::Relaxed);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(args.timeout_secs);
    while !stop_requested() && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(100));
    }
    if !stop_requested() {
        println!("timeout ({} s) reached", args.timeout_secs);
    }
    println!(
        "removing the lab (namespaces {} and {})",
        lab.tx_ns(),
        lab.rx_ns()
    );
    Ok(())
}

fn print_lab_guide(lab: &Lab) {
    let (tx, rx, rx_if) = (lab.tx_ns(), lab.rx_ns(), lab.rx_iface());
    let sources = lab.sources();
    let first = sources[0];
    let last = sources[sources.len() - 1];
    println!("lab ready:");
    println!(
        "  receiver: netns {rx}, interface {rx_if}, address {}/24",
        lab.rx_addr()
    );
    println!(
        "  senders:  netns {tx}, interface {}, addresses {first} .. {last}",
        lab.tx_iface()
    );
    println!("\ntry:");
    println!("  shaper -n {rx} attach {rx_if} --rate 10mbit --burst 64k");
    println!(
        "  ip netns exec {tx} ping -c 3 -I {first} {}",
        lab.rx_addr()
    );
    println!("  shaper -n {rx} stats {rx_if}");
    println!("  shaper -n {rx} detach {rx_if}    # before leaving: pins outlive the lab");
    println!("\npress Enter or Ctrl-C to remove the lab");
}

fn fuzz(args: &FuzzArgs) -> Result<()> {
    use shaper_lab::fuzz;

    let seed = args.seed.unwrap_or_else(fuzz::clock_seed);
    println!(
        "fuzz: {} frames, seed {seed:#018x} (replay with --seed {seed:#x})",
        args.frames
    );
    let start = Instant::now();
    let report = fuzz::run(args.frames, seed, |done| {
        if done % 1_000_000 == 0 {
            println!("  {done} frames, {:.0} s", start.elapsed().as_secs_f64());
        }
    })?;
    for line in report.lines() {
        println!("{line}");
    }
    println!("fuzz: every verdict XDP_PASS or XDP_DROP; every frame and byte counted once");
    Ok(())
}

fn bench(args: &BenchArgs) -> Result<()> {
    use shaper_lab::bench::{per_packet, population, report, scale};

    if !args.only.is_empty() {
        return bench_only(args);
    }
    ensure!(
        args.rate.is_empty() && args.frame.is_empty() && args.sources.is_empty(),
        "--rate, --frame and --sources need --only sweep"
    );
    let mut opts = per_packet::Options::new(args.quick);
    if let Some(repeat) = args.repeat {
        opts.repeat = repeat;
    }
    if let Some(runs) = args.runs {
        opts.runs = runs;
    }
    ensure!(opts.runs > 0, "--runs must be at least 1");
    ensure!(opts.repeat > 0, "--repeat must be at least 1");
    let machine = report::Machine::this();
    println!(
        "shaper bench on {} (kernel {}, {} x {}){}",
        machine.host,
        machine.kernel,
        machine.cpus,
        machine.cpu_model,
        if args.quick { ", --quick" } else { "" }
    );
    // The programs of both builds first, while no filled map holds memory.
    let shaper = bench_shaper(args);
    let today = Build::today(shaper.as_deref().unwrap_or(Path::new("shaper")));
    let baseline = baseline(args);
    let kernel_missing = match (&baseline, &shaper) {
        (Err(e), _) => Some(format!("{e:#}")),
        (_, Err(e)) => Some(format!("{e:#}")),
        (Ok(baseline), Ok(_)) => match bench_kernel(args, baseline, &today) {
            Ok(written) => {
                for path in written {
                    println!("wrote {}", path.display());
                }
                None
            }
            Err(e) => {
                eprintln!("shaper-lab: the kernel figures failed: {e:#}");
                Some(format!("the kernel figures failed: {e:#}"))
            }
        },
    };

    // One CPU for the BPF_PROG_TEST_RUN figures: each and its baseline see the same core.
    let affinity = pin_to_current_cpu();
    println!(
        "filling maps of {} sources ...",
        population::SIZES.map(|n| n.to_string()).join(", ")
    );
    let mut populations = scale::populations(&today)?;
    // The per-packet cases write settings: only a baseline today's types can configure.
    let configurable = baseline
        .as_ref()
        .map_err(|e| anyhow::anyhow!("{e:#}"))
        .and_then(|b| b.configurable().map(|()| b));
    let mut baseline_populations = match &configurable {
        Ok(b) => scale::populations(b)?,
        Err(_) => Vec::new(),
    };
    println!(
        "scale: memory and cost on a known source, repeat {}",
        opts.repeat
    );
    let scale_results = scale::run(&mut populations, opts.repeat, opts.runs)?;
    println!(
        "per-packet cost, today's build{}: repeat {} (loop), {} frames (single shot), median of {} runs",
        configurable
            .as_ref()
            .map_or(String::new(), |b| format!(" and {}", b.label)),
        opts.repeat,
        opts.frames,
        opts.runs
    );
    let mut per_packet = per_packet::run(
        &opts,
        per_packet::Subject {
            build: &today,
            populations: &mut populations,
        },
        configurable.as_ref().ok().map(|b| per_packet::Subject {
            build: b,
            populations: &mut baseline_populations,
        }),
    )?;
    per_packet.baseline_missing = configurable.as_ref().err().map(|e| format!("{e:#}"));
    drop(populations);
    drop(baseline_populations);
    // The lab benchmarks need every CPU back (traffic threads, softirq accounting).
    restore_affinity(affinity);
    print_per_packet(&per_packet);
    for r in &scale_results.rows {
        println!(
            "{:>8} sources: {:>11} bytes memlock, {:>6.1} bytes/source, known key {:.1} ns ({:.2}x no-op)",
            r.capacity,
            r.memlock_filled_bytes,
            r.bytes_per_source,
            r.hot_pass_ns,
            r.hot_ratio_to_noop
        );
    }

    let (accuracy, accuracy_missing) = bench_accuracy(args);
    let (flood, flood_missing) = bench_flood(args);
    let mut machine = machine;
    machine.loadavg_end = report::loadavg();
    let written = report::write(
        &args.out,
        &report::Inputs {
            machine: &machine,
            quick: args.quick,
            kernel_missing: kernel_missing.as_deref(),
            per_packet: &per_packet,
            scale: &scale_results,
            accuracy: accuracy.as_ref(),
            accuracy_missing: accuracy_missing.as_deref(),
            flood: flood.as_deref(),
            flood_missing: flood_missing.as_deref(),
        },
    )?;
    println!("\nwrote:");
    for path in written {
        println!("  {}", path.display());
    }
    Ok(())
}

/// `bench --only ...`: the chosen benchmarks, printed as they run; nothing written.
fn bench_only(args: &BenchArgs) -> Result<()> {
    use shaper_lab::bench::{accuracy, per_packet};

    if args.only.contains(&LabPart::Kernel) {
        let shaper = bench_shaper(args)?;
        for path in bench_kernel(args, &baseline(args)?, &Build::today(&shaper))? {
            println!("wrote {}", path.display());
        }
    }
    if args.only.contains(&LabPart::PerPacket) {
        let mut opts = per_packet::Options::new(args.quick);
        opts.repeat = args.repeat.unwrap_or(opts.repeat);
        opts.runs = args.runs.unwrap_or(opts.runs);
        ensure!(
            opts.runs > 0 && opts.repeat > 0,
            "--runs and --repeat must be at least 1"
        );
        // No shaper command runs here: only the objects are needed.
        let today = Build::today(Path::new("shaper"));
        // Without a baseline, today's build alone (as the full run does).
        let baseline = baseline(args)
            .and_then(|b| b.configurable().map(|()| b))
            .inspect_err(|e| println!("no baseline measured: {e:#}"))
            .ok();
        let affinity = pin_to_current_cpu();
        let results = per_packet::run(
            &opts,
            per_packet::Subject {
                build: &today,
                populations: &mut [],
            },
            baseline.as_ref().map(|build| per_packet::Subject {
                build,
                populations: &mut [],
            }),
        )?;
        restore_affinity(affinity);
        print_per_packet(&results);
    }
    if args
        .only
        .iter()
        .all(|p| matches!(p, LabPart::Kernel | LabPart::PerPacket))
    {
        return Ok(());
    }
    // The rest drive the shaper command.
    let shaper = bench_shaper(args)?;
    if args.only.contains(&LabPart::Flood) {
        for line in
            shaper_lab::bench::flood::summary_lines(&shaper_lab::bench::flood::run(&shaper)?)
        {
            println!("{line}");
        }
    }
    if args.only.contains(&LabPart::Tcp) {
        shaper_lab::bench::tcp::bench(&shaper, &args.out, args.emulated.as_deref())?;
    }
    if args.only.contains(&LabPart::Coa) {
        use shaper_lab::bench::coa;
        let mut opts = coa::Options::new(args.quick);
        opts.rate = args.coa_rate.unwrap_or(opts.rate);
        opts.seconds = args.coa_seconds.unwrap_or(opts.seconds);
        opts.subscribers = args.coa_subscribers.unwrap_or(opts.subscribers);
        opts.disconnects = args.coa_disconnects.unwrap_or(opts.disconnects);
        ensure!(
            opts.rate > 0 && opts.seconds > 0 && opts.subscribers > 0,
            "--coa-rate, --coa-seconds and --coa-subscribers must be at least 1"
        );
        let results = coa::run(&shaper, &opts)?;
        for line in coa::summary_lines(&results) {
            println!("{line}");
        }
        for path in coa::write(&args.out, &results)? {
            println!("wrote {}", path.display());
        }
    }
    if args.only.contains(&LabPart::Coa) || args.only.contains(&LabPart::Accounting) {
        bench_accounting(args, &shaper)?;
    }
    if args.only.contains(&LabPart::Provision) {
        use shaper_lab::bench::provision;
        // Labelled by its file's name (`shaper-079fa56`), the build the rows compare with.
        let label = args
            .provision_against
            .as_deref()
            .and_then(Path::file_name)
            .map(|name| name.to_string_lossy().into_owned());
        let other = label.as_deref().zip(args.provision_against.as_deref());
        let results = provision::run(&shaper, other, &provision::Options::new(args.quick))?;
        print!("{}", provision::table(&results));
        for path in provision::write(&args.out, &results)? {
            println!("wrote {}", path.display());
        }
    }
    if args.only.iter().all(|p| {
        matches!(
            p,
            LabPart::Kernel
                | LabPart::PerPacket
                | LabPart::Flood
                | LabPart::Tcp
                | LabPart::Coa
                | LabPart::Accounting
                | LabPart::Provision
        )
    }) {
        return Ok(());
    }

    let opts = accuracy::AccuracyOptions {
        shaper,
        quick: args.quick,
        seconds: 3.0,
        only: Some(accuracy::Only {
            rates_bps: args.rate.iter().map(|r| r.bits_per_sec()).collect(),
            frames: args.frame.clone(),
            sources: args.sources.clone(),
            no_sweep: !args.only.contains(&LabPart::Sweep),
            series: args.only.contains(&LabPart::Series),
            cpu: args.only.contains(&LabPart::Cpu),
            late: args.only.contains(&LabPart::Late),
            duration: args.only.contains(&LabPart::Duration),
        }),
    };
    let results = accuracy::run(&opts)?;
    for line in accuracy::summary_lines(&results) {
        println!("{line}");
    }
    Ok(())
}

/// RADIUS accounting's CPU (`--only coa` or `accounting`): results-accounting.*.
fn bench_accounting(args: &BenchArgs, shaper: &Path) -> Result<()> {
    use shaper_lab::bench::accounting;
    let mut opts = accounting::Options::new(args.quick);
    opts.subscribers = args.coa_subscribers.unwrap_or(opts.subscribers);
    opts.seconds = args.accounting_seconds.unwrap_or(opts.seconds);
    opts.windows = args.accounting_windows.unwrap_or(opts.windows);
    ensure!(
        opts.seconds > 0 && opts.windows > 0 && opts.subscribers > 0,
        "--accounting-seconds, --accounting-windows and --coa-subscribers must be at least 1"
    );
    let others: Vec<(String, PathBuf)> = args
        .accounting_against
        .iter()
        .map(|p| {
            let name = p.file_name().map_or_else(
                || p.display().to_string(),
                |n| n.to_string_lossy().into_owned(),
            );
            (name, p.clone())
        })
        .collect();
    let results = accounting::run(shaper, &others, &opts)?;
    for line in accounting::summary_lines(&results) {
        println!("{line}");
    }
    for path in accounting::write(&args.out, &results)? {
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// The spoofed flood, or why there is none (reported in results.md, as for accuracy).
fn bench_flood(
    args: &BenchArgs,
) -> (
    Option<Vec<shaper_lab::bench::flood::FloodRow>>,
    Option<String>,
) {
    use shaper_lab::bench::flood;

    let shaper = match bench_shaper(args) {
        Ok(path) => path,
        Err(e) => return (None, Some(format!("{e:#}"))),
    };
    println!("\nspoofed flood ...");
    match flood::run(&shaper) {
        Ok(rows) => {
            for line in flood::summary_lines(&rows) {
                println!("{line}");
            }
            (Some(rows), None)
        }
        Err(e) => {
            eprintln!("shaper-lab: the flood benchmark failed: {e:#}");
            (None, Some(format!("the flood benchmark failed: {e:#}")))
        }
    }
}

/// The accuracy benchmarks, or why there are none: their failure is reported in
/// results.md rather than aborting the figures already measured.
fn bench_accuracy(
    args: &BenchArgs,
) -> (Option<shaper_lab::bench::AccuracyResults>, Option<String>) {
    use shaper_lab::bench::accuracy;

    // The shaper command is needed only by the accuracy benchmarks.
    let shaper = match bench_shaper(args) {
        Ok(path) => path,
        Err(e) => return (None, Some(format!("{e:#}"))),
    };
    println!("\nrate accuracy and CPU cost in the namespace lab ...");
    let opts = accuracy::AccuracyOptions {
        shaper,
        quick: args.quick,
        // Sending time of each run; quick mode shortens it further by itself.
        seconds: 3.0,
        only: None,
    };
    match accuracy::run(&opts) {
        Ok(results) => {
            for line in accuracy::summary_lines(&results) {
                println!("{line}");
            }
            (Some(results), None)
        }
        Err(e) => {
            eprintln!("shaper-lab: the accuracy benchmarks failed: {e:#}");
            (None, Some(format!("the accuracy benchmarks failed: {e:#}")))
        }
    }
}

fn print_per_packet(results: &shaper_lab::bench::per_packet::PerPacketResults) {
    println!(
        "{:<70} {:>10} {:>9} {:>9} {:>14} {:>13}",
        "case", "ns/packet", "x floor", "x no-op", "Mpps per core", "spread (ns)"
    );
    for r in &results.cases {
        // Over the runs, as measured (a constant offset for single shots, so the same
        // width as the reported figure's).
        let (lo, hi) = r
            .measured_ns_runs
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)));
        println!(
            "{:<70} {:>10.1} {:>9.2} {:>9.2} {:>14.2} {:>13.1}",
            r.case,
            r.ns_per_packet,
            r.ratio_to_floor,
            r.ratio_to_noop,
            r.packets_per_sec / 1e6,
            hi - lo
        );
        if let Some(note) = &r.note {
            println!("    note: {note}");
        }
    }
    println!("\nthe second meter (today's build), run by run:");
    for line in shaper_lab::bench::colour::summary_lines(&results.colour) {
        println!("  {line}");
    }
    if let Some(m) = results.subscriber.as_ref().and_then(|s| s.million.as_ref()) {
        let r = &m.over_per_source;
        println!(
            "\nsubscribers: a key of one of {} drawn at random, {:.1} ns, against a per-source \
             key drawn from as many, {:.1} ns: {:.2}× ({:.2}–{:.2}×) run by run; a key's \
             first frame after a change of routes: {:.1} ns against {:.1} ns, {:.2}×",
            m.subscribers,
            m.subscriber_ns.median,
            m.per_source_ns.median,
            r.median,
            r.min,
            r.max,
            m.first_subscriber_ns.median,
            m.first_per_source_ns.median,
            m.first_over_per_source.median
        );
    }
    match (&results.baseline, &results.baseline_missing) {
        (Some(b), _) => {
            println!(
                "\n{:<70} {:>10} {:>10} {:>10} {:>14}",
                "case (ns/packet, median)", b.label, "today", "today/base", "ratio spread"
            );
            for v in &b.versus {
                println!(
                    "{:<70} {:>10.1} {:>10.1} {:>10.3} {:>6.3}–{:<6.3}",
                    v.case,
                    v.baseline_ns.median,
                    v.today_ns.median,
                    v.ratio.median,
                    v.ratio.min,
                    v.ratio.max
                );
            }
        }
        (None, Some(why)) => println!("\nno baseline measured: {why}"),
        (None, None) => {}
    }
}

/// Keeps this thread on the CPU it is on and returns the affinity it had (best effort: a
/// failure only costs stability).
fn pin_to_current_cpu() -> Option<libc::cpu_set_t> {
    // SAFETY: sched_getcpu has no preconditions; the cpu_set_t values are zeroed plain
    // data, filled by the kernel or the libc helpers, and outlive the calls that use them.
    unsafe {
        let mut previous: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut previous) != 0 {
            return None;
        }
        let cpu = libc::sched_getcpu();
        if cpu < 0 {
            return None;
        }
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu as usize, &mut set);
        if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
            eprintln!("shaper-lab: warning: cannot pin to CPU {cpu}; figures may be noisier");
            return None;
        }
        Some(previous)
    }
}

fn restore_affinity(previous: Option<libc::cpu_set_t>) {
    if let Some(set) = previous {
        // SAFETY: `set` is a valid cpu_set_t read from the kernel.
        if unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) } != 0 {
            eprintln!("shaper-lab: warning: cannot restore the CPU affinity");
        }
    }
}

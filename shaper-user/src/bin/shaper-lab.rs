//! `shaper-lab`: try shaper on a throwaway two-namespace network (see `shaper_user::lab`).
//!
//! * `demo` attaches shaper, drives four sources at different loads and shows what got
//!   through per source.
//! * `lab` builds the network and waits, for experimenting by hand.
//! * `bench` is reserved for the benchmarks.
//!
//! Needs root (it creates network namespaces). Everything it creates is removed on exit,
//! including after an error or Ctrl-C.

use std::{
    io::BufRead as _,
    path::{Path, PathBuf},
    process::{Command, ExitCode},
    sync::atomic::{AtomicBool, Ordering},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};
use clap::{Args, Parser, Subcommand};
use shaper_user::{
    lab::{Flow, FlowResult, Lab, ns::run_command, run_udp},
    units::{Rate, Size, human_rate},
};

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
    /// Per-packet cost of the program next to a no-op XDP program (BPF_PROG_TEST_RUN).
    Bench(BenchArgs),
}

#[derive(Debug, Args)]
struct BenchArgs {
    /// The shaper command (for the lab benchmarks to come) [default: next to this executable]
    #[arg(long)]
    shaper: Option<PathBuf>,
    /// A short smoke run: fewer repetitions.
    #[arg(long)]
    quick: bool,
    /// Runs of the program per measurement [default: 1000000, 10000 with --quick]
    #[arg(long)]
    repeat: Option<u32>,
    /// Measurements per case; the median is reported.
    #[arg(long, default_value_t = 5)]
    runs: usize,
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
    let mut attachment = Attachment::new(&shaper, &lab);
    attachment.attach(args.rate, args.burst)?;
    ensure!(
        lab.xdp_attached()?,
        "`shaper attach` succeeded but no XDP program is on {}",
        lab.rx_iface()
    );
    println!("shaper attached to {}: XDP program present", lab.rx_iface());

    let flows: Vec<Flow> = lab
        .sources()
        .iter()
        .zip(DEMO_LOADS)
        .map(|(&src, load)| Flow {
            src,
            offered_bps: (rate_bps as f64 * load).round() as u64,
            frame_bytes: DEMO_FRAME_BYTES,
        })
        .collect();
    println!("sending for {} s ...\n", args.seconds);
    let results = run_udp(&lab, &flows, duration)?;
    if stop_requested() {
        bail!("interrupted");
    }
    print_demo_table(&results, rate_bps, args.burst.bytes());

    println!("\n$ shaper -n {} stats {}", lab.rx_ns(), lab.rx_iface());
    print!("{}", attachment.run(&["stats", lab.rx_iface()])?);
    attachment.detach()?;
    println!("\nshaper detached; removing the lab");
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
    let exe = std::env::current_exe().context("cannot find this executable's path")?;
    let path = exe.with_file_name("shaper");
    ensure!(
        path.is_file(),
        "no shaper command at {} (build it with `cargo build -p shaper-user`, or pass --shaper PATH)",
        path.display()
    );
    Ok(path)
}

/// shaper on the lab's rx veth: detaches when dropped, so an error or panic after
/// `attach` (or a half-done attach) does not leave programs or pins behind.
struct Attachment<'a> {
    shaper: &'a Path,
    lab: &'a Lab,
    /// Still to detach (cleared by an explicit [`Attachment::detach`]).
    armed: bool,
    /// `attach` succeeded, so a failing detach is worth a warning.
    attached: bool,
}

impl<'a> Attachment<'a> {
    fn new(shaper: &'a Path, lab: &'a Lab) -> Self {
        Attachment {
            shaper,
            lab,
            armed: true,
            attached: false,
        }
    }

    /// Runs `shaper -n RXNS ARGS...` and returns its standard output.
    fn run(&self, args: &[&str]) -> Result<String> {
        run_command(
            Command::new(self.shaper)
                .args(["-n", self.lab.rx_ns()])
                .args(args),
        )
    }

    fn attach(&mut self, rate: Rate, burst: Size) -> Result<()> {
        let (rate, burst) = (rate.to_string(), burst.to_string());
        let iface = self.lab.rx_iface();
        self.run(&["attach", iface, "--rate", &rate, "--burst", &burst])?;
        self.attached = true;
        Ok(())
    }

    fn detach(mut self) -> Result<()> {
        self.armed = false;
        self.run(&["detach", self.lab.rx_iface()]).map(drop)
    }
}

impl Drop for Attachment<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // After a failed attach there may be nothing to detach, so only complain when
        // something was attached.
        if let Err(e) = self.run(&["detach", self.lab.rx_iface()])
            && self.attached
        {
            eprintln!("shaper-lab: warning: detach failed: {e:#}");
        }
    }
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

fn bench(args: &BenchArgs) -> Result<()> {
    let repeat = args
        .repeat
        .unwrap_or(if args.quick { 10_000 } else { 1_000_000 });
    ensure!(args.runs > 0, "--runs must be at least 1");
    println!(
        "per-packet cost, BPF_PROG_TEST_RUN, repeat {repeat}, median of {} runs",
        args.runs
    );
    let results = shaper_user::bench::per_packet::per_packet(repeat, args.runs)?;
    let baseline = results[0].median_ns_per_packet;
    println!(
        "{:<38} {:>10} {:>9} {:>14}",
        "case", "ns/packet", "x no-op", "Mpps per core"
    );
    for r in &results {
        println!(
            "{:<38} {:>10.1} {:>9.2} {:>14.2}",
            r.case,
            r.median_ns_per_packet,
            r.median_ns_per_packet / baseline,
            r.packets_per_sec() / 1e6
        );
    }
    Ok(())
}

//! What the kernel tests that drive the `shaper` binary share: [`shaper_lab::cli`] with
//! the panics a test wants (running it, attaching with a guard that detaches, reading
//! `stats -j`, the binary as nobody can run it), and the tolerance of live measurements.

//!
//! Not every test file uses every helper: those that do not say so where they declare
//! the module (`#[expect(dead_code, ...)]`).

use std::{
    fs,
    path::PathBuf,
    process::{Command, Output, Stdio},
};

use shaper_lab::{
    bins::shaper as shaper_bin,
    cli::{self, AttachGuard, NobodyBinary, Stats},
    lab::{FlowResult, raw::RawResult, traffic::DscpCount},
};

/// Runs `shaper -n NS ARGS...` (standard input closed).
pub fn shaper(ns: &str, args: &[&str]) -> Output {
    Command::new(shaper_bin())
        .args(["-n", ns])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run shaper")
}

/// Runs `shaper -n NS ARGS...`, which must succeed (else panics with its error line);
/// returns its standard output.
pub fn shaper_ok(ns: &str, args: &[&str]) -> String {
    let out = shaper(ns, args);
    assert!(
        out.status.success(),
        "shaper {args:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("shaper's output is UTF-8")
}

/// A guard that detaches shaper from `iface` in `ns` on drop, attaching nothing: for
/// tests that attach (or try to) through the command themselves.
pub fn guard(ns: &str, iface: &str) -> AttachGuard {
    AttachGuard::new(shaper_bin(), ns, iface)
}

/// Attaches shaper (`attach IFACE --rate RATE --burst BURST`), panicking with its error
/// line if it fails; detached again when the guard drops.
pub fn attach(ns: &str, iface: &str, rate: &str, burst: &str) -> AttachGuard {
    attach_with(ns, iface, rate, burst, &[])
}

/// [`attach`] with more options (`--prefix-v4 24`, ...).
pub fn attach_with(ns: &str, iface: &str, rate: &str, burst: &str, more: &[&str]) -> AttachGuard {
    attach_toward(ns, iface, "ingress", rate, burst, more)
}

/// [`attach_with`] for one direction of `iface` (`ingress` or `egress`).
pub fn attach_toward(
    ns: &str,
    iface: &str,
    direction: &'static str,
    rate: &str,
    burst: &str,
    more: &[&str],
) -> AttachGuard {
    let mut guard = AttachGuard::toward(shaper_bin(), ns, iface, direction);
    let mut args = vec!["--rate", rate, "--burst", burst];
    args.extend_from_slice(more);
    if let Err(e) = guard.attach(&args) {
        panic!("{e:#}");
    }
    guard
}

/// `stats -j` of `iface` in `ns`, every key listed; panics with the error if it fails.
pub fn stats(ns: &str, iface: &str) -> Stats {
    stats_toward(ns, iface, "ingress")
}

/// [`stats`] of one direction of `iface` (`ingress` or `egress`).
pub fn stats_toward(ns: &str, iface: &str, direction: &str) -> Stats {
    cli::stats_toward(shaper_bin(), ns, iface, direction).unwrap_or_else(|e| panic!("{e:#}"))
}

/// The shaper binary where `nobody` can run it ([`NobodyBinary`]).
pub fn nobody_binary() -> NobodyBinary {
    NobodyBinary::new(shaper_bin()).unwrap_or_else(|e| panic!("{e:#}"))
}

// ---------------------------------------------------------------------------------------
// Tolerances

/// How far a live measurement may stray from what the limit gives: half the burst's
/// share of the expected bytes. Tighter than the burst, so a burst missing, halved or
/// given twice fails the check; the tests choose bursts, rates and windows where that is
/// well clear of what their timing can hold (see [`limit_gives`]).
pub fn tolerance(expected: f64, burst: f64) -> f64 {
    0.5 * burst / expected
}

/// What a limiter passes of a key overloaded from a full bucket: the burst at once, then
/// `rate_bps` over the time it passed the key's frames, from the first to the last, by
/// the kernel's receive timestamps of `flows` (all of the one key; the receiving
/// interface's softirq stamps them moments after its XDP program passed them, so no
/// thread's scheduling moves the window). GCRA passes at most this, and at least this
/// less the bytes of one gap between the key's frames.
pub fn limit_gives<R: Received>(rate_bps: u64, burst: u64, flows: &[&R]) -> f64 {
    let first = flows.iter().map(|f| f.received_ns().0).min().unwrap_or(0);
    let last = flows.iter().map(|f| f.received_ns().1).max().unwrap_or(0);
    assert!(first > 0, "nothing received: no window to measure");
    rate_bps as f64 / 8.0 * (last - first) as f64 / 1e9 + burst as f64
}

/// What GCRA buckets pass of frames as they were sent: `flows` run with their sends
/// recorded ([`Recorded`]), each flow a key of its own held to `per_key` (rate in bit/s,
/// burst in bytes) if given, and all of them also through one bucket of `aggregate` if
/// given (a frame either bucket refuses is charged to neither); every bucket full at the
/// first frame. Returns the bytes passed per flow.
///
/// The kernel saw each frame moments after its send: a replay of the real sends, stalls
/// of the senders included (a sender that stops for longer than its bucket takes to
/// fill loses tokens, here as in the kernel), so a test compares the kernel's exact
/// counts with it however loaded the machine was. Written here in nanoseconds and f64,
/// apart from shaper-common's fixed-point arithmetic, which it checks.
pub fn replay<R: Recorded>(
    flows: &[&R],
    per_key: Option<(u64, u64)>,
    aggregate: Option<(u64, u64)>,
) -> Vec<u64> {
    let mut frames: Vec<(u64, usize)> = Vec::new();
    for (i, flow) in flows.iter().enumerate() {
        frames.extend(flow.send_offsets().iter().map(|&t| (t, i)));
    }
    frames.sort_unstable();
    let bytes: Vec<u64> = flows.iter().map(|f| f.frame_bytes()).collect();
    let mut keys: Vec<Option<Bucket>> = flows
        .iter()
        .map(|_| per_key.map(|(rate, burst)| Bucket::new(rate, burst)))
        .collect();
    let mut shared = aggregate.map(|(rate, burst)| Bucket::new(rate, burst));
    let mut passed = vec![0; flows.len()];
    for (t, i) in frames {
        let t = t as f64;
        let own = keys[i].as_ref().map(|b| b.admit(t, bytes[i]));
        let all = shared.as_ref().map(|b| b.admit(t, bytes[i]));
        if own.is_some_and(|tat| tat.is_none()) || all.is_some_and(|tat| tat.is_none()) {
            continue;
        }
        if let (Some(b), Some(Some(tat))) = (keys[i].as_mut(), own) {
            b.tat = tat;
        }
        if let (Some(b), Some(Some(tat))) = (shared.as_mut(), all) {
            b.tat = tat;
        }
        passed[i] += bytes[i];
    }
    passed
}

/// What one key's bucket passes of `flow`'s recorded sends, as [`replay`] does, when its
/// limit (rate in bit/s, burst in bytes) is `first` and then changes to each of `changes`
/// at its offset (nanoseconds, from the origin of the send offsets, in order). As the
/// kernel does (`shaper_common::rescale`), the first frame at or after a change carries
/// the bucket over to the new limit: its backlog in bytes kept, capped at the new burst,
/// never refilled; an idle bucket left as it is. Returns the bytes passed.
pub fn replay_changes<R: Recorded>(
    flow: &R,
    first: (u64, u64),
    changes: &[(u64, (u64, u64))],
) -> u64 {
    let bytes = flow.frame_bytes();
    let mut bucket = Bucket::new(first.0, first.1);
    let mut changes = changes.iter().peekable();
    let mut passed = 0;
    for &t in flow.send_offsets() {
        while let Some(&(_, (rate, burst))) = changes.next_if(|&&(at, _)| at <= t) {
            bucket.carry_over(t as f64, rate, burst);
        }
        if let Some(tat) = bucket.admit(t as f64, bytes) {
            bucket.tat = tat;
            passed += bytes;
        }
    }
    passed
}

/// A flow whose sends were recorded: [`shaper_lab::lab::RunOptions::record_sends`] (UDP) or
/// [`shaper_lab::lab::raw::RawOptions::record_sends`] (crafted frames).
pub trait Recorded {
    /// When each frame was sent, nanoseconds from the flows' common start, in order; panics
    /// if the sends were not recorded.
    fn send_offsets(&self) -> &[u64];
    /// The layer-2 bytes of each of its frames.
    fn frame_bytes(&self) -> u64;
}

impl Recorded for FlowResult {
    fn send_offsets(&self) -> &[u64] {
        assert_eq!(
            self.send_offsets_ns.len() as u64,
            self.sent_packets,
            "{}: run with RunOptions::record_sends",
            self.src
        );
        &self.send_offsets_ns
    }

    fn frame_bytes(&self) -> u64 {
        self.sent_l2_bytes / self.sent_packets.max(1)
    }
}

impl Recorded for RawResult {
    fn send_offsets(&self) -> &[u64] {
        assert_eq!(
            self.send_offsets_ns.len() as u64,
            self.sent_packets,
            "run with RawOptions::record_sends: {self:?}"
        );
        &self.send_offsets_ns
    }

    fn frame_bytes(&self) -> u64 {
        u64::from(self.frame_bytes)
    }
}

/// What a key's second meter passes of its frames as they were sent, as [`replay`] does
/// for one bucket: `flow` (run with `record_sends`, one key) through its committed bucket
/// `committed` (rate in bit/s, burst in bytes), then, for a frame it refuses, the excess
/// bucket `excess` if given (RFC 4115's colour-blind marker: the two are independent);
/// and a frame passes only if the packet bucket `packets` (frames a second, frames at
/// once) if given lets it too, which is charged only for frames that pass. Every bucket
/// full at the first frame. Returns the frames passed green and yellow.
pub fn replay_colour(
    flow: &FlowResult,
    committed: (u64, u64),
    excess: Option<(u64, u64)>,
    packets: Option<(u64, u64)>,
) -> (u64, u64) {
    let offsets = flow.send_offsets();
    replay_colour_at(offsets, flow.frame_bytes(), committed, excess, packets)
}

/// [`replay_colour`] of `bytes`-byte frames of one key seen at `offsets_ns` (from any
/// origin, in order).
pub fn replay_colour_at(
    offsets_ns: &[u64],
    bytes: u64,
    committed: (u64, u64),
    excess: Option<(u64, u64)>,
    packets: Option<(u64, u64)>,
) -> (u64, u64) {
    let mut green = Bucket::new(committed.0, committed.1);
    let mut yellow = excess.map(|(rate, burst)| Bucket::new(rate, burst));
    // A packet costs what a byte costs at 8 × the packet rate (as the kernel counts it).
    let mut count = packets.map(|(rate, burst)| Bucket::new(8 * rate, burst));
    let (mut greens, mut yellows) = (0, 0);
    for &t in offsets_ns {
        let t = t as f64;
        let packet = match count.as_ref().map(|b| b.admit(t, 1)) {
            Some(None) => continue,
            Some(Some(tat)) => Some(tat),
            None => None,
        };
        if let Some(tat) = green.admit(t, bytes) {
            green.tat = tat;
            greens += 1;
        } else if let Some(tat) = yellow.as_ref().and_then(|b| b.admit(t, bytes)) {
            yellow.as_mut().unwrap().tat = tat;
            yellows += 1;
        } else {
            continue;
        }
        if let (Some(b), Some(tat)) = (count.as_mut(), packet) {
            b.tat = tat;
        }
    }
    (greens, yellows)
}

/// One GCRA bucket: its theoretical arrival time, the time one byte costs and how far
/// ahead of now the time may run (the burst's cost), in nanoseconds.
struct Bucket {
    tat: f64,
    ns_per_byte: f64,
    tau: f64,
}

impl Bucket {
    fn new(rate_bps: u64, burst: u64) -> Self {
        let ns_per_byte = 8e9 / rate_bps as f64;
        Self {
            tat: f64::NEG_INFINITY,
            ns_per_byte,
            tau: burst as f64 * ns_per_byte,
        }
    }

    /// Carries the bucket over to a limit of `rate_bps` and `burst` at `t`, as the kernel
    /// does (`shaper_common::rescale`): a backlog (a time ahead of `t`) kept in bytes,
    /// capped at the new burst; an idle bucket left as it is.
    fn carry_over(&mut self, t: f64, rate_bps: u64, burst: u64) {
        let new = Self::new(rate_bps, burst);
        let tat = if self.tat > t {
            t + ((self.tat - t) * new.ns_per_byte / self.ns_per_byte).min(new.tau)
        } else {
            self.tat
        };
        *self = Self { tat, ..new };
    }

    /// The bucket's time after passing a frame of `bytes` at `t`, if it conforms.
    fn admit(&self, t: f64, bytes: u64) -> Option<f64> {
        let tat = self.tat.max(t) + bytes as f64 * self.ns_per_byte;
        // A picosecond for f64's rounding of a burst of whole frames.
        (tat - t <= self.tau + 1e-3).then_some(tat)
    }
}

/// A flow's kernel receive timestamps: its first and last frame's.
pub trait Received {
    fn received_ns(&self) -> (u64, u64);
}

impl Received for FlowResult {
    fn received_ns(&self) -> (u64, u64) {
        (self.first_received_ns, self.last_received_ns)
    }
}

impl Received for DscpCount {
    fn received_ns(&self) -> (u64, u64) {
        (self.first_received_ns, self.last_received_ns)
    }
}

impl Received for RawResult {
    fn received_ns(&self) -> (u64, u64) {
        (self.first_received_ns, self.last_received_ns)
    }
}

/// Asserts that `got` is within [`tolerance`] of `expected`, printing the error against
/// it; returns the error.
pub fn assert_near(what: &str, got: f64, expected: f64, burst: f64) -> f64 {
    let err = (got - expected) / expected;
    let tol = tolerance(expected, burst);
    println!(
        "{what}: {got:.0} against {expected:.0}: {:+.3}% (tolerance ±{:.2}%)",
        err * 100.0,
        tol * 100.0
    );
    assert!(
        err.abs() <= tol,
        "{what}: {got:.0} is {:+.3}% from {expected:.0}, beyond ±{:.2}%",
        err * 100.0,
        tol * 100.0
    );
    err
}

/// Asserts that `got`, the bytes a limit of `rate_bps` and `burst` passed of `flows` (one
/// key's), is within a quarter of the burst of `replayed`, what GCRA passes of the same
/// sends ([`replay`]: the kernel met them moments later, which moves a frame or two), so
/// that a burst halved or missing fails; and no further above what the limit gives over
/// the kernel's own receive times ([`limit_gives`]) than [`tolerance`], its bound
/// whatever the senders did.
pub fn assert_limited<R: Received>(
    what: &str,
    got: u64,
    replayed: u64,
    (rate_bps, burst): (u64, u64),
    flows: &[&R],
) {
    let off = got as f64 - replayed as f64;
    println!("{what}: {got} against {replayed} replayed ({off:+.0} bytes, burst {burst})");
    assert!(
        off.abs() <= burst as f64 / 4.0,
        "{what}: {got} is {off:+.0} bytes from {replayed}, what the limit passes of the \
         same sends, beyond a quarter of the {burst}-byte burst"
    );
    let bound = limit_gives(rate_bps, burst, flows);
    let over = got as f64 - bound;
    println!("{what}: {got} against the bound {bound:.0} over the receive times");
    assert!(
        over <= tolerance(bound, burst as f64) * bound,
        "{what}: {got} is {over:.0} bytes over {bound:.0}, rate x received span + burst"
    );
}

/// Asserts that the command failed with exactly one line on stderr, and returns that line.
pub fn error_line(out: &Output, what: &str) -> String {
    assert!(
        !out.status.success(),
        "{what}: expected a failure, but it succeeded; stdout: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert!(
        lines.len() == 1 && !lines[0].trim().is_empty(),
        "{what}: expected one line on stderr, got {}: {stderr:?}",
        lines.len(),
    );
    eprintln!("{what}: {}", lines[0]);
    lines[0].to_owned()
}

/// A file in the temporary directory, removed on drop.
pub struct TempFile(pub PathBuf);

impl TempFile {
    pub fn new(tag: &str, text: &str) -> Self {
        let path =
            std::env::temp_dir().join(format!("shaper-test-{tag}-{}.toml", std::process::id()));
        fs::write(&path, text).unwrap();
        Self(path)
    }

    pub fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Err(e) = fs::remove_file(&self.0) {
            // A warning, not a panic: this may run while unwinding.
            eprintln!("warning: cannot remove {}: {e}", self.0.display());
        }
    }
}

//! shaper's kernel programs.
//!
//! # Theory of operation
//! `shaper_xdp` runs on every frame an interface receives; `shaper_tc` on every packet
//! a tc hook (TCX, or clsact's `cls_bpf`) sees, on egress or ingress. Both are thin
//! wrappers: each says what its hook saw (the linear bytes, the length from the Ethernet
//! header, the GSO segment count) and maps the verdict to its return code, and everything
//! else is one shared path (`entry`). It parses Ethernet, up to two
//! VLAN tags, PPPoE sessions, and the fixed IPv4 or IPv6 header with one bounds-checked
//! cursor (`parse`); anything else passes untouched and is counted by kind. An IP frame's
//! key is its source (or, as configured, destination) address masked to a prefix
//! (`key`); the program finds the key's GCRA cell in the table of buckets `SHAPER_SOURCES`
//! (IPv4) or `SHAPER_SOURCES6` (IPv6) (`sources`), giving it a way on first sight.
//!
//! The key's policy (`policy`) is the longest prefix in the LPM tries `SHAPER_PREFIX4` /
//! `SHAPER_PREFIX6` that covers it, naming a slot of `SHAPER_POLICIES`, or the interface's
//! default (`SHAPER_CONFIG`). The slot is cached in the key's state with the policies'
//! generation, so the tries are searched only for new keys and after a policy change. A
//! policy passes (exempt), drops (blocked) or limits: the shared arithmetic
//! (`shaper_common::gcra`) decides whether the frame's bytes fit the key's cell and, if
//! the policy has an aggregate, the prefix's shared cell in `SHAPER_AGGS`; a frame must
//! fit both and is charged to both or neither. In monitor mode nothing is dropped and what
//! would have been is counted instead.
//!
//! A key new to the table gets a cell only if its policy's new-source admission lets it
//! (`meter`): on its second sighting (`trace`, the doorkeeper: a spoofed address is
//! almost never seen twice), and within a GCRA cell per policy, or the interface's, that
//! counts creations at N keys a second. A key refused one is *unadmitted*: nothing is inserted, and its frame is metered
//! in the policy's one shared cell for unadmitted frames at the per-source limit
//! (`SHAPER_ADMIT`), so a flood of spoofed sources gets what one source gets and cannot
//! churn the table.
//!
//! A cell is a 64-bit TAT that every CPU updates with a bounded compare-and-swap loop
//! (`cell`), so all CPUs meter one bucket per key, and the scale of the limit it is
//! expressed in: when a policy's rate changes, the cell is carried over with its backlog
//! in bytes intact (`shaper_common::rescale`), never refilled. Per-key counters are
//! atomic adds, per-policy and global ones per-CPU arrays; the entry point looks this
//! CPU's global counters up once per frame and hands them down.
//!
//! # Verified in pieces
//! The verifier walks every path of a program, and a function inlined into several places
//! is walked once per place and per state reaching it. So what is rare on the per-packet
//! path is cut out into global BPF functions (`#[no_mangle]`, `#[inline(never)]`:
//! bpf-linker keeps their BTF linkage global), which the verifier checks once each, with
//! any arguments of their types, whoever calls them:
//!
//! | function | what | called from |
//! | --- | --- | --- |
//! | `shaper_admit` | new-source admission: the doorkeeper's trace (`trace`) and the admission rate | the meter, for a key not in the table whose policy limits admission |
//! | `shaper_find4`, `shaper_find6` | a key's way in its two buckets (`sources`): one scalar, so the meter is one path for the verifier whichever way matched | the meter, every IP frame |
//! | `shaper_claim4`, `shaper_claim6` | a way given to a new key under its buckets' locks: free, else idle, else none | the meter, for a key not in the table that admission lets in |
//! | `shaper_room4`, `shaper_room6` | a bucket's free and idle ways, one scalar | the claims |
//! | `shaper_retry` | a compare-and-swap's tries after the first lost | wherever a cell is charged, when another CPU charged it between the read and the swap |
//! | `shaper_carry_over` | a cell's backlog carried over to a new rate | wherever a cell is charged, when its scale is not its limit's |
//! | `shaper_sample` | a refused frame's event for `shaper watch` | the meter, only while someone watches |
//! | `shaper_meter2` | the second meter: RFC 4115's excess rate (green, yellow, red) and the packet rate | the meter, only for a key whose policy has one (one byte of the rule tested otherwise) |
//! | `shaper_meter2_prepare` | a key's second cells made, its cells carried over to new rates | the meter, when `shaper_meter2` finds them not ready |
//! | `shaper_remark_xdp`, `shaper_remark_tc` | a yellow frame's DSCP rewritten (IPv4 checksum per RFC 1624, IPv6 traffic class) | the entry point, for a yellow frame |
//!
//! What is common stays in the program, inlined: parse, key, and a known key's meter and
//! decision (`meter::meter`, `cell::decide`, one copy for both families, and one for the
//! cells of new keys), so a known key's frame makes no BPF-to-BPF call (a call and its return cost more than the arithmetic
//! they would save, above all where the return goes through a mitigation of speculative
//! execution). The parse paths (VLAN tags, PPPoE, IPv4 options) converge once the key is
//! read, so the verifier walks the meter about once per family. The calls nest at most
//! three deep (entry, a global function, retry or carry-over), within the 512 bytes of
//! stack the kernel allows a chain of calls. A global function takes
//! scalars and pointers to memory (a map value, or the caller's stack), each maybe null
//! as far as the verifier knows, and returns one scalar: a packed `outcome::Metered`.
//!
//! A frame costs its whole length: Ethernet header to end of payload, every buffer of a
//! multi-buffer (jumbo) frame included, no FCS — what tc counts. A GSO packet (tc only)
//! costs what it puts on the wire: its length plus, for each segment after the first, the
//! Ethernet, IP and transport headers that segment repeats.
//!
//! This object holds only what `shaper attach` loads. The benchmark's programs (the no-op
//! baseline, the floor, the softirq clock) are a second object, `bench/main.rs`.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

mod cell;
mod entry;
mod key;
mod maps;
mod meter;
mod meter2;
mod outcome;
mod parse;
mod policy;
mod sources;
mod tc;
mod trace;
mod watch;
mod xdp;

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[cfg(target_arch = "bpf")]
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";

/// The host build of this crate exists only so the workspace builds and lints as one.
#[cfg(not(target_arch = "bpf"))]
fn main() {}

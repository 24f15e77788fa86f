//! shaper's test lab, never shipped: what the kernel integration tests (`tests/`), the
//! fuzzer, the benchmarks and `cargo xtask demo` are made of. The product (`shaper-user`)
//! knows nothing of it.
//!
//! - `lab`: throwaway network namespaces joined by veth pairs, and the traffic generators
//!   (UDP sockets, packet sockets for crafted and spoofed frames).
//! - `frame`: builders of every encapsulation the parser reads.
//! - `testrun`: the one `BPF_PROG_TEST_RUN` harness, over the product's object and the
//!   bench object's no-op.
//! - `fuzz`: random and mutated frames through the program.
//! - `bench`: `cargo xtask bench`.
//! - `bins`: where the `shaper` binary under test is, and `old_builds`: the earlier
//!   builds the upgrade tests start from.
//! - `cli`: running that binary in a lab's namespace, and a guard that detaches on drop;
//!   `daemon`: running it as `shaper run`.

pub mod bench;
pub mod bins;
pub mod cli;
pub mod daemon;
pub mod frame;
pub mod fuzz;
pub mod lab;
pub mod old_builds;
pub mod rng;
pub mod testrun;

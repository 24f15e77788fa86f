//! How long a whole `shaper attach` takes, as an operator types it, for each build: the
//! command run in a lab namespace on its veth, timed from start to exit (loading the
//! object, the feature probes, verification, pinning, attaching), then detached, untimed.
//! The builds take turns, the first of a run alternating; each direction (ingress: the
//! XDP program; egress: the tc program) is timed on its own.

use std::time::Instant;

use anyhow::Result;
use serde::{Deserialize, Serialize};

use super::{builds::Build, spread::Summary};
use crate::{cli::AttachGuard, lab::Lab};

/// What every attach asks for: the README's first example.
pub const ARGS: [&str; 4] = ["--rate", "10mbit", "--burst", "64k"];
/// The directions timed, each with the hook `attach` picks for it by default.
pub const DIRECTIONS: [(&str, &str); 2] = [("ingress", "xdp"), ("egress", "tc")];

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AttachTiming {
    /// [`Build::label`].
    pub build: String,
    pub direction: String,
    pub hook: String,
    /// Wall time of `shaper attach`, ms.
    pub ms: Summary,
}

/// `runs` attaches (and detaches) of each build in each direction.
pub fn measure(builds: &[&Build], runs: usize) -> Result<Vec<AttachTiming>> {
    let lab = Lab::new("battach", 1)?;
    let mut times = vec![Vec::with_capacity(runs); builds.len() * DIRECTIONS.len()];
    for run in 0..runs {
        for (d, (direction, _)) in DIRECTIONS.iter().enumerate() {
            for i in 0..builds.len() {
                let b = (i + run) % builds.len();
                let mut guard =
                    AttachGuard::toward(&builds[b].shaper, lab.rx_ns(), lab.rx_iface(), direction);
                let start = Instant::now();
                guard.attach(&ARGS)?;
                let ms = start.elapsed().as_secs_f64() * 1e3;
                guard.detach()?;
                times[b * DIRECTIONS.len() + d].push(ms);
            }
        }
    }
    let mut out = Vec::new();
    for (b, build) in builds.iter().enumerate() {
        for (d, (direction, hook)) in DIRECTIONS.iter().enumerate() {
            out.push(AttachTiming {
                build: build.label.clone(),
                direction: (*direction).to_owned(),
                hook: (*hook).to_owned(),
                ms: Summary::of(std::mem::take(&mut times[b * DIRECTIONS.len() + d])),
            });
        }
    }
    Ok(out)
}

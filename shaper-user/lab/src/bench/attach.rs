//! How long a whole `shaper attach` takes, as an operator types it, for each build: the
//! command run in a lab namespace on its veth, timed from start to exit (loading the
//! object, the feature probes, verification, pinning, attaching), then detached, untimed.
//! The builds take turns, the first of a run alternating; each direction (ingress: the
//! XDP program; egress: the tc program) is timed on its own. Before the first run's detach,
//! the kernel memory the attachment holds before any traffic is read: each pinned map's
//! `memlock`, the kernel's own accounting of it.

use std::{os::fd::AsRawFd as _, path::Path, time::Instant};

use anyhow::{Context as _, Result};
use serde::{Deserialize, Serialize};
use shaper_user::pins::{Attachment, Direction};

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
    /// The attachment's maps before any traffic: each pin and its `memlock` bytes.
    #[serde(default)]
    pub maps: Vec<(String, u64)>,
}

impl AttachTiming {
    /// The kernel memory of the attachment's maps, bytes (0: not measured).
    pub fn memlock_bytes(&self) -> u64 {
        self.maps.iter().map(|(_, bytes)| bytes).sum()
    }
}

/// Each map pinned in `dir` (programs and links left out) and its `memlock` bytes, largest
/// first.
fn maps_memory(dir: &Path) -> Result<Vec<(String, u64)>> {
    let mut maps = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if !path.is_file() {
            continue;
        }
        let fd = shaper_user::bpf::obj_get(&path)?;
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd()))?;
        // A map's fdinfo names its type; a program's and a link's have a memlock too.
        if !info.lines().any(|l| l.starts_with("map_type:")) {
            continue;
        }
        let bytes: u64 = info
            .lines()
            .find_map(|l| l.strip_prefix("memlock:"))
            .with_context(|| format!("no memlock of {}", path.display()))?
            .trim()
            .parse()?;
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        maps.push((name.into_owned(), bytes));
    }
    maps.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    Ok(maps)
}

/// `runs` attaches (and detaches) of each build in each direction.
pub fn measure(builds: &[&Build], runs: usize) -> Result<Vec<AttachTiming>> {
    let lab = Lab::new("battach", 1)?;
    let mut times = vec![Vec::with_capacity(runs); builds.len() * DIRECTIONS.len()];
    let mut memory = vec![Vec::new(); builds.len() * DIRECTIONS.len()];
    for run in 0..runs {
        for (d, (direction, _)) in DIRECTIONS.iter().enumerate() {
            for i in 0..builds.len() {
                let b = (i + run) % builds.len();
                let mut guard =
                    AttachGuard::toward(&builds[b].shaper, lab.rx_ns(), lab.rx_iface(), direction);
                let start = Instant::now();
                guard.attach(&ARGS)?;
                let ms = start.elapsed().as_secs_f64() * 1e3;
                if run == 0 {
                    let direction = match *direction {
                        "egress" => Direction::Egress,
                        _ => Direction::Ingress,
                    };
                    let at = Attachment::toward(lab.rx_iface(), Some(lab.rx_ns()), direction);
                    memory[b * DIRECTIONS.len() + d] = maps_memory(&at.dir())?;
                }
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
                maps: std::mem::take(&mut memory[b * DIRECTIONS.len() + d]),
            });
        }
    }
    Ok(out)
}

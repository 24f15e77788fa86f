//! Frames by colour, as RFC 4115's marker and MEF 10.4's bandwidth profile name them, for
//! `stats`, `top`, `policy list` and `/metrics`: one definition, from what the kernel counts.
//!
//! Every metered frame is one colour:
//!
//! - **green**: passed unmarked (within the committed rate and burst, or passed by a
//!   policy that meters nothing, untracked frames included): passed minus yellow;
//! - **yellow**: passed by the excess meter, its DSCP rewritten (monitor mode: counted,
//!   left alone): the kernel's count of them (`Meter2Counts`, `Meter2Cells`);
//! - **red**: refused, dropped or would-drop in monitor mode, whatever refused it (the
//!   committed and excess meters both, the packet rate, the prefix's aggregate, a block):
//!   dropped plus would drop.
//!
//! So green + yellow + red is every frame metered, and a policy without an excess rate has
//! no yellow. The frames of unadmitted keys (new-source admission), counted apart from
//! the passed and dropped of their interface and policy, are in the colours of both: the
//! kernel counts their yellow frames with the others. Of the red frames, those the packet
//! rate refused are counted apart too (`packet_rate_refused_*`).

use std::{collections::HashMap, net::Ipv4Addr, path::Path};

use aya::maps::MapData;
use serde::Serialize;
use shaper_common::maps::{
    Config, Ipv4Key, Ipv6Key, Meter2Cells, Outcomes, PIN_METER2, PIN_METER2_6,
};

use crate::{maps::KeyNet, pins::Attachment};

/// Frames and bytes by colour (see the module docs); JSON `green_packets`, `green_bytes`,
/// `yellow_packets`, ... (flatten it into a row).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Colours {
    pub green_packets: u64,
    pub green_bytes: u64,
    pub yellow_packets: u64,
    pub yellow_bytes: u64,
    pub red_packets: u64,
    pub red_bytes: u64,
}

impl Colours {
    /// The colours of the frames counted in `outcomes` (a key's; or an interface's or a
    /// policy's, and their unadmitted frames'), of which `yellow` (packets, bytes) passed
    /// yellow. A yellow count above the passed one (a key's two entries evicted apart, or a
    /// frame the kernel counted twice in the race its docs tell) leaves green at zero.
    pub fn new(outcomes: &[&Outcomes], yellow: (u64, u64)) -> Self {
        let sum = |f: fn(&Outcomes) -> u64| outcomes.iter().map(|o| f(o)).sum::<u64>();
        Self {
            green_packets: sum(|o| o.passed_packets).saturating_sub(yellow.0),
            green_bytes: sum(|o| o.passed_bytes).saturating_sub(yellow.1),
            yellow_packets: yellow.0,
            yellow_bytes: yellow.1,
            red_packets: sum(|o| o.dropped_packets + o.would_drop_packets),
            red_bytes: sum(|o| o.dropped_bytes + o.would_drop_bytes),
        }
    }
}

/// The yellow frames and bytes of every key that has second-meter cells (a key of a
/// policy with an excess rate or a packet rate), as networks of the configured prefixes.
/// Empty when the attachment has no such maps.
pub fn yellow_by_key(
    at: &Attachment,
    config: &Config,
) -> Result<HashMap<KeyNet, (u64, u64)>, aya::maps::MapError> {
    let mut out = HashMap::new();
    read_cells::<Ipv4Key>(&at.dir().join(PIN_METER2), |key, cells| {
        let net = KeyNet::of_key(Ipv4Addr::from(key.to_ne_bytes()).into(), config);
        out.insert(net, (cells.yellow_packets, cells.yellow_bytes));
    })?;
    read_cells::<Ipv6Key>(&at.dir().join(PIN_METER2_6), |key, cells| {
        let net = KeyNet::of_key(std::net::Ipv6Addr::from(key).into(), config);
        out.insert(net, (cells.yellow_packets, cells.yellow_bytes));
    })?;
    Ok(out)
}

/// Calls `f` with each entry of the pinned map at `path`, if there is one.
fn read_cells<K: aya::Pod>(
    path: &Path,
    mut f: impl FnMut(K, Meter2Cells),
) -> Result<(), aya::maps::MapError> {
    if !path.exists() {
        return Ok(());
    }
    // In batches, as the source maps are read (`maps::read_keys`): a key-by-key walk
    // starts again when an evicted key is under it.
    let map = MapData::from_pin(path)?;
    for (key, cells) in crate::maps::read_batched::<K, Meter2Cells>(&map)? {
        f(key, cells);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn green_is_passed_less_yellow_and_red_every_refusal() {
        let own = Outcomes {
            passed_packets: 10,
            passed_bytes: 10_000,
            dropped_packets: 3,
            dropped_bytes: 3_000,
            would_drop_packets: 2,
            would_drop_bytes: 2_000,
        };
        let unadmitted = Outcomes {
            passed_packets: 5,
            passed_bytes: 5_000,
            dropped_packets: 1,
            dropped_bytes: 1_000,
            ..Outcomes::default()
        };
        let c = Colours::new(&[&own, &unadmitted], (4, 4_000));
        assert_eq!(
            c,
            Colours {
                green_packets: 11,
                green_bytes: 11_000,
                yellow_packets: 4,
                yellow_bytes: 4_000,
                red_packets: 6,
                red_bytes: 6_000,
            }
        );
        // Every frame is one colour.
        let all = own.packets() + unadmitted.packets();
        assert_eq!(c.green_packets + c.yellow_packets + c.red_packets, all);
        // More yellow than passed (entries evicted apart): no green, never a wrap.
        assert_eq!(Colours::new(&[&own], (20, 0)).green_packets, 0);
        assert_eq!(
            serde_json::to_string(&Colours::default()).unwrap(),
            r#"{"green_packets":0,"green_bytes":0,"yellow_packets":0,"yellow_bytes":0,"red_packets":0,"red_bytes":0}"#
        );
    }
}

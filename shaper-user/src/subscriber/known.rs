//! The subscribers' routes of an attachment as the last batch left them ([`Known`]), kept
//! in a root-only file beside the lock so that the next batch finds each subscriber's
//! prefixes without reading the tries (two million routes at a million subscribers, read
//! key by key in the kernel: seconds).
//!
//! It is a copy, never the state: trusted only while the tries are as they were when it
//! was written. Every change of a route moves the policy generation on (a subscriber's
//! prefixes, a policy, a rollback of either: `PolicyTable::subscribers_routed`,
//! `bump_generation`), so the file records the generation and the ids of the maps it
//! describes (the subscribers' table and both tries: a new attachment or an upgrade's new
//! maps have new ids), and is read only if both match. Anything else (no file, another
//! generation, a file cut short) reads the tries, as without it. A batch trusts it only
//! for subscribers whose prefixes it keeps, each one's count checked against its entry
//! (`Subscriber::in_use`).

use std::{
    fs,
    io::{self, Read as _},
    net::{Ipv4Addr, Ipv6Addr},
    path::PathBuf,
};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use shaper_common::maps::{PIN_PREFIXES_V4, PIN_PREFIXES_V6, PIN_SUBSCRIBERS};

use crate::{maps::Pinned, pins::Attachment};

/// Where the files live: on tmpfs beside the lock and the journal (gone at a reboot, as
/// the pins are).
pub const KNOWN_DIR: &str = "/run/shaper.routes";

const MAGIC: &[u8; 8] = b"shrout1\n";

/// The file of one attachment's subscribers' routes, and what it must have been written
/// against to be trusted.
#[derive(Clone, Debug)]
pub struct Known {
    path: PathBuf,
    /// The ids of the subscribers' table and of the IPv4 and IPv6 tries.
    maps: [u32; 3],
}

/// The file of attachment `at`.
pub fn path_of(at: &Attachment) -> PathBuf {
    let netns = at.netns.as_deref().unwrap_or("-");
    PathBuf::from(KNOWN_DIR).join(format!("{netns}.{}.{}", at.iface, at.direction.name()))
}

/// Removes the file of `at` (its attachment is gone), if there is one.
pub fn forget(at: &Attachment) {
    let _ = fs::remove_file(path_of(at));
    crate::rows::forget(at);
    super::record::forget(at);
    super::prefixes::forget(at);
}

/// The ids of the subscribers' table and of the IPv4 and IPv6 tries `pinned` opened.
pub fn map_ids(pinned: &Pinned) -> Option<[u32; 3]> {
    let id = |pin| pinned.info(pin).map(|i| i.id);
    Some([
        id(PIN_SUBSCRIBERS)?,
        id(PIN_PREFIXES_V4)?,
        id(PIN_PREFIXES_V6)?,
    ])
}

impl Known {
    /// The file of the attachment `pinned` opened, for its maps as opened.
    pub fn of(pinned: &Pinned) -> Option<Self> {
        Some(Self {
            path: path_of(pinned.at()),
            maps: map_ids(pinned)?,
        })
    }

    fn header(&self, generation: u32) -> [u8; 24] {
        let mut h = [0u8; 24];
        h[..8].copy_from_slice(MAGIC);
        h[8..12].copy_from_slice(&generation.to_le_bytes());
        for (k, id) in self.maps.iter().enumerate() {
            h[12 + 4 * k..16 + 4 * k].copy_from_slice(&id.to_le_bytes());
        }
        h
    }

    /// The routes (prefix, subscriber index) saved at policy generation `generation` for
    /// these maps; `None` if there are none such.
    pub fn load(&self, generation: u32) -> Option<Vec<(IpNet, u32)>> {
        if !crate::owned::check_dir_of(&self.path).unwrap_or(false) {
            return None;
        }
        // The header first: a file of another generation is not read on.
        let mut f = crate::owned::open_private_to_read(&self.path).ok()?;
        let mut header = [0u8; 24];
        f.read_exact(&mut header).ok()?;
        if header != self.header(generation) {
            return None;
        }
        let mut body = Vec::new();
        f.read_to_end(&mut body).ok()?;
        decode(&body)
    }

    /// Saves `routes` (prefix, subscriber index) as those of policy generation
    /// `generation`: written beside, then renamed over (a reader finds the old file or the
    /// new one whole), root-only.
    pub fn save(
        &self,
        generation: u32,
        routes: impl Iterator<Item = (IpNet, u32)>,
    ) -> io::Result<()> {
        let mut out = self.header(generation).to_vec();
        for (net, index) in routes {
            out.extend_from_slice(&index.to_le_bytes());
            out.push(net.prefix_len());
            match net {
                IpNet::V4(n) => out.extend_from_slice(&n.addr().octets()),
                IpNet::V6(n) => {
                    // The family in the length's top bit.
                    *out.last_mut().unwrap_or(&mut 0) |= 0x80;
                    out.extend_from_slice(&n.addr().octets());
                }
            }
        }
        crate::owned::save_private(&self.path, &out)
    }

    /// Whether its directory is there, root's and written by no one else, not a symlink
    /// (what it says decides what a batch writes).
    /// Removes the file: what it says is not to be trusted any more.
    pub fn drop_file(&self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// The routes of a file's body; `None` if it is cut short or malformed.
fn decode(mut body: &[u8]) -> Option<Vec<(IpNet, u32)>> {
    let mut routes = Vec::with_capacity(body.len() / 12);
    while !body.is_empty() {
        let (head, rest) = body.split_at_checked(5)?;
        let index = u32::from_le_bytes(head[..4].try_into().ok()?);
        let (v6, len) = (head[4] & 0x80 != 0, head[4] & 0x7f);
        let (net, rest) = match v6 {
            false => {
                let (a, rest) = rest.split_at_checked(4)?;
                let a: [u8; 4] = a.try_into().ok()?;
                (IpNet::V4(Ipv4Net::new(Ipv4Addr::from(a), len).ok()?), rest)
            }
            true => {
                let (a, rest) = rest.split_at_checked(16)?;
                let a: [u8; 16] = a.try_into().ok()?;
                (IpNet::V6(Ipv6Net::new(Ipv6Addr::from(a), len).ok()?), rest)
            }
        };
        routes.push((net, index));
        body = rest;
    }
    Some(routes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What is saved is loaded back at the same generation and maps, and nothing at
    /// another generation, for other maps, or from a file cut short.
    #[test]
    fn routes_come_back_only_for_their_generation_and_maps() {
        let dir = std::env::temp_dir().join(format!("shaper-known-{}", std::process::id()));
        // Made by the save, 0700.
        let _ = fs::remove_dir_all(&dir);
        let known = Known {
            path: dir.join("k"),
            maps: [7, 8, 9],
        };
        let net = |s: &str| s.parse::<IpNet>().unwrap();
        let routes = vec![
            (net("100.64.0.1/32"), 3),
            (net("fdd7:b724:0:100::/56"), 3),
            (net("10.0.0.0/8"), 1_000_000),
            (net("::/0"), 2),
        ];
        let body = |k: &Known| {
            let mut out = Vec::new();
            fs::File::open(&k.path)
                .unwrap()
                .read_to_end(&mut out)
                .unwrap();
            out
        };
        known.save(5, routes.iter().copied()).unwrap();
        assert_eq!(known.load(5).unwrap(), routes);
        assert!(known.load(6).is_none());
        let other = Known {
            maps: [7, 8, 10],
            ..known.clone()
        };
        assert!(other.load(5).is_none());
        let whole = body(&known);
        fs::write(&known.path, &whole[..whole.len() - 3]).unwrap();
        assert!(known.load(5).is_none());
        fs::remove_dir_all(&dir).unwrap();
    }
}

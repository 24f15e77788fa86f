//! Each subscriber's prefixes by its index ([`PrefixFile`]), so that a single change (a
//! removal, a change of prefixes) finds the prefixes of one subscriber without reading the
//! tries (two million routes at a million subscribers, read key by key: a second and more).
//!
//! A root-only file of fixed records beside the ids' ([`super::record`]), one a
//! subscriber's index (record 0 is the header), written in place by every change that
//! writes a subscriber's routes (`SubscriberTable::set_among`, `del`, `write_batch`,
//! `restore`), made anew at attach and removed at detach. An attachment without it (made
//! before it, or the file deleted) gains it at its next change; the subscribers no change
//! has written since have no record.
//!
//! It is a copy, never the state: a record is trusted only if its prefixes are distinct,
//! as many as the subscriber's entry counts (`Subscriber::in_use`), and each one is a
//! route of the tries to that subscriber (one exact lookup each). Since a subscriber's
//! routes are as many as its entry counts, such a record is all of them, whatever wrote
//! it. Anything else (no file, no record, a record cut short, malformed, of another
//! subscriber, more prefixes than fit in one) reads the tries, as without it.

use std::{
    fs::{self, File},
    io,
    net::{Ipv4Addr, Ipv6Addr},
    os::unix::fs::FileExt as _,
    path::{Path, PathBuf},
};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use crate::pins::Attachment;

/// Bytes a record: its count of prefixes, then each one packed (a byte of its length,
/// [`V6`] added for an IPv6 one, then the bytes of its address the length covers: 5 for an
/// IPv4 /32, 8 for an IPv6 /56, 17 for a /128). A subscriber's prefixes that do not fit
/// (more than 12 IPv4 /32s, or 3 IPv6 /128s) get no record (count 0).
pub const RECORD: usize = 64;

/// Added to an IPv6 prefix's length in its first byte (an IPv4 one's is 0 to 32).
const V6: u8 = 64;

/// Record 0's first bytes.
const MAGIC: &[u8; 8] = b"shsubpf1";

/// Where the records of attachment `at` are: beside its routes' file.
pub fn path_of(at: &Attachment) -> PathBuf {
    let mut p = super::known::path_of(at).into_os_string();
    p.push(".prefixes");
    PathBuf::from(p)
}

/// Makes the records of `at` anew (its pins just made: no subscriber), if it has room for
/// any; removes any left otherwise. A copy: if it cannot be made, changes read the tries.
pub fn make(at: &Attachment) {
    let pin = at.dir().join(shaper_common::maps::PIN_SUBSCRIBERS);
    let room = crate::bpf::map_info(&pin).is_ok_and(|info| info.max_entries > 1);
    if !room || PrefixFile::create(&path_of(at)).is_err() {
        forget(at);
    }
}

/// Removes the records of `at` (its attachment is gone), if there are any.
pub fn forget(at: &Attachment) {
    let _ = fs::remove_file(path_of(at));
}

/// One subscriber's record: `prefixes` packed, or none (count 0) if they do not fit.
pub fn encode(prefixes: &[IpNet]) -> [u8; RECORD] {
    let mut r = [0u8; RECORD];
    let mut at = 1;
    for p in prefixes {
        let bytes = p.prefix_len().div_ceil(8) as usize;
        if at + 1 + bytes > RECORD || prefixes.len() > usize::from(u8::MAX) {
            return [0; RECORD];
        }
        let family = if p.addr().is_ipv6() { V6 } else { 0 };
        r[at] = p.prefix_len() + family;
        match p.addr() {
            std::net::IpAddr::V4(a) => {
                r[at + 1..at + 1 + bytes].copy_from_slice(&a.octets()[..bytes])
            }
            std::net::IpAddr::V6(a) => {
                r[at + 1..at + 1 + bytes].copy_from_slice(&a.octets()[..bytes])
            }
        }
        at += 1 + bytes;
    }
    r[0] = prefixes.len() as u8;
    r
}

/// The prefixes of a record: `None` if it has none (count 0), or is malformed (cut short,
/// a length past its family's, an address with bits past its length, a prefix twice).
pub fn decode(r: &[u8]) -> Option<Vec<IpNet>> {
    let (&n, mut rest) = r.split_first()?;
    if n == 0 {
        return None;
    }
    let mut out: Vec<IpNet> = Vec::with_capacity(n.into());
    for _ in 0..n {
        let (&head, tail) = rest.split_first()?;
        let (v6, len) = match head {
            0..=32 => (false, head),
            V6.. => (true, head - V6),
            _ => return None,
        };
        let (addr, tail) = tail.split_at_checked(len.div_ceil(8) as usize)?;
        let net = net_of(v6, len, addr)?;
        if net != net.trunc() || out.contains(&net) {
            return None;
        }
        out.push(net);
        rest = tail;
    }
    Some(out)
}

/// The prefix of `len` bits whose address starts with `addr` (the rest zero).
fn net_of(v6: bool, len: u8, addr: &[u8]) -> Option<IpNet> {
    if v6 {
        let mut a = [0u8; 16];
        a.get_mut(..addr.len())?.copy_from_slice(addr);
        Ipv6Net::new(Ipv6Addr::from(a), len).ok().map(IpNet::V6)
    } else {
        let mut a = [0u8; 4];
        a.get_mut(..addr.len())?.copy_from_slice(addr);
        Ipv4Net::new(Ipv4Addr::from(a), len).ok().map(IpNet::V4)
    }
}

/// An attachment's records, open.
#[derive(Debug)]
pub struct PrefixFile {
    file: File,
}

impl PrefixFile {
    fn header() -> [u8; RECORD] {
        let mut h = [0u8; RECORD];
        h[..MAGIC.len()].copy_from_slice(MAGIC);
        h
    }

    /// Makes the records at `path` anew (none yet): root-only, in a root-only directory.
    pub fn create(path: &Path) -> io::Result<Self> {
        crate::owned::make_dir_of(path)?;
        let file = crate::owned::create_private(path)?;
        file.write_all_at(&Self::header(), 0)?;
        drop(file);
        Self::open(path).ok_or_else(|| io::Error::other("made, then not found"))
    }

    /// The records at `path`; `None` if there are none, or they are not root's alone, or
    /// not shaper's.
    pub fn open(path: &Path) -> Option<Self> {
        let file = crate::owned::open_private_existing(path).ok()?;
        let f = Self { file };
        (f.read_raw(0)? == Self::header()).then_some(f)
    }

    /// Record `index` as it is in the file (`None` past its end).
    fn read_raw(&self, index: u32) -> Option<[u8; RECORD]> {
        let mut r = [0u8; RECORD];
        self.file
            .read_exact_at(&mut r, u64::from(index) * RECORD as u64)
            .ok()?;
        Some(r)
    }

    /// The prefixes record `index` holds, if it holds any (to be checked: see the module
    /// docs).
    pub fn read(&self, index: u32) -> Option<Vec<IpNet>> {
        decode(&self.read_raw(index)?)
    }

    /// Writes record `index`: `prefixes` (none: the subscriber is gone).
    pub fn write(&self, index: u32, prefixes: &[IpNet]) -> io::Result<()> {
        self.file
            .write_all_at(&encode(prefixes), u64::from(index) * RECORD as u64)
    }

    /// Writes many records (sorted here), each run of consecutive indices in one write.
    pub fn write_many(&self, records: &mut [(u32, [u8; RECORD])]) -> io::Result<()> {
        records.sort_unstable_by_key(|(i, _)| *i);
        let mut k = 0;
        while k < records.len() {
            let start = records[k].0;
            let mut bytes = Vec::new();
            while k < records.len() && records[k].0 == start + (bytes.len() / RECORD) as u32 {
                bytes.extend_from_slice(&records[k].1);
                k += 1;
            }
            self.file
                .write_all_at(&bytes, u64::from(start) * RECORD as u64)?;
        }
        Ok(())
    }

    /// Writes every record, `records` (by index, from 1) and none past them: the file
    /// whole, in one write.
    pub fn write_all(&self, records: &[(u32, [u8; RECORD])], len: u32) -> io::Result<()> {
        let mut bytes = vec![0u8; len.max(1) as usize * RECORD];
        bytes[..RECORD].copy_from_slice(&Self::header());
        for (i, r) in records.iter().filter(|(i, _)| (1..len).contains(i)) {
            let at = *i as usize * RECORD;
            bytes[at..at + RECORD].copy_from_slice(r);
        }
        self.file.set_len(0)?;
        self.file.write_all_at(&bytes, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nets(s: &[&str]) -> Vec<IpNet> {
        s.iter().map(|p| p.parse().unwrap()).collect()
    }

    /// What fits comes back as written, of both families and any length; what does not
    /// fit is no record.
    #[test]
    fn a_record_decodes_to_what_it_encoded() {
        for set in [
            nets(&["100.64.0.1/32", "fdd7:b724:0:100::/56"]),
            nets(&["0.0.0.0/0", "::/0", "10.0.0.0/8", "2001:db8::/32"]),
            nets(&["2001:db8::1/128", "2001:db8::2/128", "2001:db8::3/128"]),
            (1..=12)
                .map(|i| format!("100.64.0.{i}/32").parse().unwrap())
                .collect(),
        ] {
            assert_eq!(decode(&encode(&set)).as_ref(), Some(&set), "{set:?}");
        }
        for too_many in [
            nets(&[
                "2001:db8::1/128",
                "2001:db8::2/128",
                "2001:db8::3/128",
                "2001:db8::4/128",
            ]),
            (1..=13)
                .map(|i| format!("100.64.0.{i}/32").parse().unwrap())
                .collect(),
        ] {
            assert_eq!(encode(&too_many), [0; RECORD]);
            assert_eq!(decode(&encode(&too_many)), None);
        }
        assert_eq!(decode(&encode(&[])), None);
    }

    /// A malformed record is none: cut short, a length past its family's, host bits, a
    /// prefix twice.
    #[test]
    fn a_malformed_record_is_none() {
        let good = encode(&nets(&["100.64.0.1/32", "fdd7::/56"]));
        assert!(decode(&good).is_some());
        assert_eq!(decode(&good[..10]), None, "cut short");
        let mut more = good;
        more[0] = 3;
        assert_eq!(decode(&more[..14]), None, "a count past its prefixes");
        let mut long = good;
        long[1] = 33;
        assert_eq!(decode(&long), None, "an IPv4 /33");
        long[1] = V6 + 129;
        assert_eq!(decode(&long), None, "an IPv6 /129");
        let mut host = encode(&nets(&["198.51.100.8/29"]));
        host[5] = 9;
        assert_eq!(decode(&host), None, "198.51.100.9/29");
        let twice = encode(&nets(&["10.0.0.0/24", "10.0.0.0/24"]));
        assert_eq!(decode(&twice), None, "twice");
    }

    /// Records come back from the file by index; none from another file, a record never
    /// written, or past the end.
    #[test]
    fn records_come_back_by_index() {
        let dir = std::env::temp_dir().join(format!("shaper-prefixes-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let path = dir.join("p.prefixes");
        let f = PrefixFile::create(&path).unwrap();
        let a = nets(&["100.64.0.1/32", "fdd7::/56"]);
        let b = nets(&["198.51.100.8/29"]);
        f.write(3, &a).unwrap();
        f.write_many(&mut [(9, encode(&b)), (7, encode(&a)), (8, encode(&b))])
            .unwrap();
        let f = PrefixFile::open(&path).unwrap();
        assert_eq!(f.read(3), Some(a.clone()));
        assert_eq!(f.read(7), Some(a.clone()));
        assert_eq!(f.read(9), Some(b.clone()));
        for none in [0, 1, 4, 10, 1000] {
            assert_eq!(f.read(none), None, "{none}");
        }
        f.write(7, &[]).unwrap();
        assert_eq!(f.read(7), None);
        f.write_all(&[(2, encode(&b))], 4).unwrap();
        assert_eq!((f.read(2), f.read(3), f.read(9)), (Some(b), None, None));
        fs::write(&path, b"not shaper's").unwrap();
        assert!(PrefixFile::open(&path).is_none());
        fs::remove_file(&path).unwrap();
        assert!(PrefixFile::open(&path).is_none());
        fs::remove_dir_all(&dir).unwrap();
    }
}

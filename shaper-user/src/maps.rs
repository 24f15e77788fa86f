//! Reading an attachment's pinned maps, for `status`, `stats` and the checks of an update,
//! and opening them once for a change ([`Pinned`]). (Writes go through
//! [`crate::policy::PolicyTable`], which keeps the policy generation.)

use std::{
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::Path,
};

use std::os::fd::{AsFd as _, OwnedFd};

use aya::maps::{Array, Map, MapData, MapError, PerCpuArray};
use shaper_common::{
    keys::{v4_per_address, v6_per_address},
    layout,
    maps::{
        Config, Counters, Ipv4Key, Ipv6Key, PIN_CONFIG, PIN_LAYOUT, PIN_METER2, PIN_METER2_6,
        PIN_POLICIES, PIN_SOURCES, PIN_SUBSCRIBERS, PerCpuSum, SourceState, sum_per_cpu,
    },
};

use crate::{
    bpf,
    pins::Attachment,
    refill, table,
    upgrade::{self, UpgradeError},
};

#[derive(Debug, thiserror::Error)]
pub enum PinnedMapError {
    #[error("cannot open pinned map {path}")]
    Open { path: String, source: MapError },
    #[error("cannot read pinned map {path}")]
    Read { path: String, source: MapError },
    #[error(transparent)]
    Layout(#[from] UpgradeError),
}

fn open(path: &Path) -> Result<Map, PinnedMapError> {
    let open_err = |source| PinnedMapError::Open {
        path: path.display().to_string(),
        source,
    };
    let fd = bpf::obj_get(path).map_err(|e| open_err(obj_get_err(e)))?;
    let data = MapData::from_fd(fd).map_err(open_err)?;
    Map::from_map_data(data).map_err(open_err)
}

/// A pin that could not be opened, as aya says it.
fn obj_get_err(io_error: std::io::Error) -> MapError {
    MapError::SyscallError(aya::sys::SyscallError {
        call: "BPF_OBJ_GET",
        io_error,
    })
}

/// An attachment's pinned maps, opened once and their layout checked once: what a change
/// ([`crate::change`]) reads and writes through (its [`crate::policy::PolicyTable`] is
/// made of these maps, by descriptor), and what a command that reads several maps can
/// read through. While it lives, no pin of its maps need be opened again.
pub struct Pinned {
    at: Attachment,
    /// Each pin of today's layout that is there, opened, with what the kernel says it is.
    maps: Vec<(&'static str, OwnedFd, bpf::MapInfo)>,
}

impl Pinned {
    /// Opens each pin of `at`'s maps once; refused unless they have this shaper's layout
    /// (checked once, on what was opened: [`upgrade::require_current_opened`]).
    pub fn open(at: &Attachment) -> Result<Self, PinnedMapError> {
        let mut maps = Vec::new();
        for m in layout::current().maps {
            let path = at.dir().join(m.pin);
            let open_err = |e| PinnedMapError::Open {
                path: path.display().to_string(),
                source: obj_get_err(e),
            };
            let fd = match bpf::obj_get(&path) {
                Ok(fd) => fd,
                // The layout check names what is missing.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(open_err(e)),
            };
            let info = bpf::map_info_of(fd.as_fd()).map_err(open_err)?;
            maps.push((m.pin, fd, info));
        }
        let pinned = Self {
            at: at.clone(),
            maps,
        };
        let version = pinned.version();
        upgrade::require_current_opened(at, version, |pin| pinned.info(pin))?;
        Ok(pinned)
    }

    pub fn at(&self) -> &Attachment {
        &self.at
    }

    /// What the kernel says of the map pinned as `pin`, if it is there.
    pub fn info(&self, pin: &str) -> Option<bpf::MapInfo> {
        self.maps.iter().find(|m| m.0 == pin).map(|m| m.2)
    }

    /// The map pinned as `pin`, on a descriptor of its own (a copy of the one opened: the
    /// pin is not opened again).
    pub fn data(&self, pin: &str) -> Result<MapData, PinnedMapError> {
        let path = self.at.dir().join(pin);
        let open_err = |source| PinnedMapError::Open {
            path: path.display().to_string(),
            source,
        };
        let fd = self
            .maps
            .iter()
            .find(|m| m.0 == pin)
            .ok_or_else(|| open_err(obj_get_err(std::io::ErrorKind::NotFound.into())))?
            .1
            .try_clone()
            .map_err(|e| open_err(obj_get_err(e)))?;
        MapData::from_fd(fd).map_err(open_err)
    }

    /// The map pinned as `pin`, typed.
    pub fn map<T: TryFrom<Map, Error = MapError>>(&self, pin: &str) -> Result<T, PinnedMapError> {
        let path = self.at.dir().join(pin);
        let open_err = |source| PinnedMapError::Open {
            path: path.display().to_string(),
            source,
        };
        let map = Map::from_map_data(self.data(pin)?).map_err(open_err)?;
        T::try_from(map).map_err(open_err)
    }

    /// What the version map says.
    fn version(&self) -> Option<u32> {
        let array: Array<MapData, u32> = self.map(PIN_LAYOUT).ok()?;
        array.get(&0, 0).ok()
    }

    /// The settings entry.
    pub fn config(&self) -> Result<Config, PinnedMapError> {
        let array: Array<MapData, Config> = self.map(PIN_CONFIG)?;
        array.get(&0, 0).map_err(read_err(&self.at.config()))
    }

    /// The keys each per-source table has room for (`--max-sources` at attach time,
    /// rounded up to whole buckets: [`table::room`]).
    pub fn sources_capacity(&self) -> u32 {
        self.info(PIN_SOURCES)
            .map_or(0, |i| table::room(i.max_entries))
    }

    /// The subscribers the attachment has room for (`--max-subscribers` at attach time;
    /// index 0 of the map is never one).
    pub fn subscriber_room(&self) -> u32 {
        self.info(PIN_SUBSCRIBERS)
            .map_or(0, |i| i.max_entries.saturating_sub(1))
    }

    /// The prefix policies and plans the pinned policy maps have room for (slot 0 is the
    /// default's).
    pub fn policy_room(&self) -> u32 {
        self.info(PIN_POLICIES)
            .map_or(0, |i| i.max_entries.saturating_sub(1))
    }

    /// Whether the second-meter maps have room for a key of each source (see
    /// [`upgrade::meter2_room`]).
    pub fn meter2_room(&self) -> bool {
        let size = |pin| self.info(pin).map_or(0, |i| i.max_entries);
        let cap = self.sources_capacity();
        [PIN_METER2, PIN_METER2_6]
            .into_iter()
            .all(|pin| crate::object::meter2_room(size(pin), cap))
    }
}

fn read_err(path: &Path) -> impl FnOnce(MapError) -> PinnedMapError + '_ {
    move |source| PinnedMapError::Read {
        path: path.display().to_string(),
        source,
    }
}

/// The attachment's policy entry; refused unless its pins have this shaper's layout.
pub fn read_config(at: &Attachment) -> Result<Config, PinnedMapError> {
    Pinned::open(at)?.config()
}

/// The global counters, summed over CPUs, with what upgrades carried over from earlier
/// programs added.
pub fn read_counters(at: &Attachment) -> Result<Counters, PinnedMapError> {
    let path = at.counters();
    let array: PerCpuArray<MapData, Counters> =
        PerCpuArray::try_from(open(&path)?).map_err(read_err(&path))?;
    let per_cpu = array.get(&0, 0).map_err(read_err(&path))?;
    let mut counters: Counters = sum_per_cpu(per_cpu.iter());
    let path = at.counters_carried();
    let carried: Array<MapData, Counters> =
        Array::try_from(open(&path)?).map_err(read_err(&path))?;
    counters.add(&carried.get(&0, 0).map_err(read_err(&path))?);
    Ok(counters)
}

/// The keys each per-source table has room for (`--max-sources` at attach time, rounded
/// up to whole buckets: [`table::room`]).
pub fn sources_capacity(at: &Attachment) -> Result<u32, PinnedMapError> {
    let path = at.sources();
    let map = open(&path)?;
    // An older layout's LRU hash map (before an upgrade moves its keys): its entries.
    if let Map::LruHashMap(data) = &map {
        return Ok(data.info().map_err(read_err(&path))?.max_entries());
    }
    let data = array_data(&map, &path)?;
    Ok(table::room(
        data.info().map_err(read_err(&path))?.max_entries(),
    ))
}

/// Every tracked IPv4 key with its cell and counters.
pub fn read_sources(at: &Attachment) -> Result<Vec<(Ipv4Addr, SourceState)>, PinnedMapError> {
    let path = at.sources();
    let map = open(&path)?;
    // An older layout's LRU hash map (`status` shows older attachments, an upgrade
    // compares), or today's table.
    let all = match &map {
        Map::LruHashMap(data) => read_batched(data),
        _ => table::read_v4(array_data(&map, &path)?),
    }
    .map_err(read_err(&path))?;
    Ok(all
        .into_iter()
        .map(|(k, s)| (Ipv4Addr::from(k.to_ne_bytes()), s))
        .collect())
}

/// Every tracked IPv6 key with its cell and counters.
pub fn read_sources6(at: &Attachment) -> Result<Vec<(Ipv6Addr, SourceState)>, PinnedMapError> {
    let path = at.sources6();
    let map = open(&path)?;
    let all = match &map {
        Map::LruHashMap(data) => read_batched(data),
        _ => table::read_v6(array_data(&map, &path)?),
    }
    .map_err(read_err(&path))?;
    Ok(all
        .into_iter()
        .map(|(k, s)| (Ipv6Addr::from(k), s))
        .collect())
}

/// Places IPv4 and IPv6 keys with their states in `at`'s tables where the program looks
/// for them ([`table::write_v4`]: for tables no program is writing, a warm start or a
/// test). Returns how many were placed and how many found their buckets full.
pub fn write_sources(
    at: &Attachment,
    v4: &[(Ipv4Key, SourceState)],
    v6: &[(Ipv6Key, SourceState)],
) -> Result<table::Placed, PinnedMapError> {
    let seed = read_config(at)?.trace_seed;
    let (p4, p6) = (at.sources(), at.sources6());
    let (m4, m6) = (open(&p4)?, open(&p6)?);
    let a = table::write_v4(array_data(&m4, &p4)?, seed, v4).map_err(read_err(&p4))?;
    let b = table::write_v6(array_data(&m6, &p6)?, seed, v6).map_err(read_err(&p6))?;
    Ok(table::Placed {
        placed: a.placed + b.placed,
        full: a.full + b.full,
    })
}

/// The map data of a (LRU) hash map, or the error that names `path`.
pub fn hash_data<'a>(map: &'a Map, path: &Path) -> Result<&'a MapData, PinnedMapError> {
    match map {
        Map::LruHashMap(data) | Map::HashMap(data) => Ok(data),
        _ => Err(PinnedMapError::Open {
            path: path.display().to_string(),
            source: MapError::InvalidMapType { map_type: 0 },
        }),
    }
}

/// The map data of an array map, or the error that names `path`.
pub fn array_data<'a>(map: &'a Map, path: &Path) -> Result<&'a MapData, PinnedMapError> {
    match map {
        Map::Array(data) => Ok(data),
        _ => Err(PinnedMapError::Open {
            path: path.display().to_string(),
            source: MapError::InvalidMapType { map_type: 0 },
        }),
    }
}

/// How many keys each per-source table holds (IPv4, IPv6), read in batches of buckets
/// ([`table::each_v4`]): a few syscalls for the whole table. It still reads every bucket:
/// the daemon counts in the background ([`crate::metrics::SourceCounter`]), never in a
/// scrape.
pub fn count_sources(at: &Attachment) -> Result<(u64, u64), PinnedMapError> {
    let (p4, p6) = (at.sources(), at.sources6());
    let (m4, m6) = (open(&p4)?, open(&p6)?);
    let (mut n4, mut n6) = (0, 0);
    table::each_v4(array_data(&m4, &p4)?, |_, _| n4 += 1).map_err(read_err(&p4))?;
    table::each_v6(array_data(&m6, &p6)?, |_, _| n6 += 1).map_err(read_err(&p6))?;
    Ok((n4, n6))
}

/// Every entry of a hash or array map, [`BATCH`] at a time (`BPF_MAP_LOOKUP_BATCH`):
/// an array of 16,384 policies is read in 2 syscalls rather than 16,384.
pub fn read_batched<K: aya::Pod, V: aya::Pod>(map: &MapData) -> Result<Vec<(K, V)>, MapError> {
    read_batched_where(map, |_| true)
}

/// [`read_batched`], keeping only the entries whose value's bytes `keep` accepts: the
/// others are never copied out of the call's buffer (a scrape reads the 16,384 slots of
/// 272 bytes of each attachment's policies for the few in use).
pub fn read_batched_where<K: aya::Pod, V: aya::Pod>(
    map: &MapData,
    keep: impl Fn(&[u8]) -> bool,
) -> Result<Vec<(K, V)>, MapError> {
    let mut entries = Vec::new();
    each_batched_where(map, keep, |k, v| entries.push((k, v)))?;
    Ok(entries)
}

/// [`read_batched_where`] handing each entry kept to `f` as it is read, nothing collected
/// (RADIUS accounting's scan of 100,000 subscribers every few seconds keeps none).
pub fn each_batched_where<K: aya::Pod, V: aya::Pod>(
    map: &MapData,
    keep: impl Fn(&[u8]) -> bool,
    mut f: impl FnMut(K, V),
) -> Result<(), MapError> {
    let (ks, vs) = (size_of::<K>(), size_of::<V>());
    batch::each(map, ks, vs, |n, keys, values| {
        for i in 0..n {
            let value = &values[i * vs..(i + 1) * vs];
            if !keep(value) {
                continue;
            }
            // SAFETY: the kernel wrote `n` keys of `ks` bytes and `n` values of `vs`
            // bytes; K and V are plain data of those sizes (`Pod`), read unaligned.
            let (k, v) = unsafe {
                (
                    keys.as_ptr().add(i * ks).cast::<K>().read_unaligned(),
                    value.as_ptr().cast::<V>().read_unaligned(),
                )
            };
            f(k, v);
        }
    })
    .map_err(batch_err)
}

/// Writes `entries` to a hash or array map or a prefix trie, [`BATCH`] a call
/// (`BPF_MAP_UPDATE_BATCH`, which prefix tries have from Linux 5.13), in order: a million
/// routes in a hundred calls. A call the kernel's allocator refuses for want of a refill
/// ([`refill::refilled`]) goes on from the entry it stopped at. On an error some of them may be
/// written (the caller's journal puts them back).
pub fn write_batched<K: aya::Pod, V: aya::Pod>(
    map: &MapData,
    entries: &[(K, V)],
) -> Result<(), MapError> {
    let (ks, vs) = (size_of::<K>(), size_of::<V>());
    let mut keys = Vec::with_capacity(BATCH as usize * ks);
    let mut values = Vec::with_capacity(BATCH as usize * vs);
    for chunk in entries.chunks(BATCH as usize) {
        keys.clear();
        values.clear();
        for (k, v) in chunk {
            // SAFETY: K and V are plain data (`Pod`) of these sizes.
            unsafe {
                keys.extend_from_slice(std::slice::from_raw_parts((k as *const K).cast(), ks));
                values.extend_from_slice(std::slice::from_raw_parts((v as *const V).cast(), vs));
            }
        }
        refill::resumed(chunk.len(), |done, left| {
            batch::update(map, left, &keys[done * ks..], &values[done * vs..])
        })
        .map_err(|io_error| {
            MapError::SyscallError(aya::sys::SyscallError {
                call: "BPF_MAP_UPDATE_BATCH",
                io_error,
            })
        })?;
    }
    Ok(())
}

/// Every entry of a per-CPU array or hash map of `K` to `V`, its values summed over CPUs,
/// read in batches ([`BATCH`] entries a call) as [`read_batched`].
pub fn read_batched_summed<K: aya::Pod, V: aya::Pod + PerCpuSum>(
    map: &MapData,
) -> Result<Vec<(K, V)>, MapError> {
    let cpus = aya::util::nr_cpus().map_err(|(_, io_error)| batch_err(io_error))?;
    // The kernel copies each CPU's value padded to 8 bytes.
    let (ks, vs) = (size_of::<K>(), size_of::<V>().next_multiple_of(8));
    let mut entries = Vec::new();
    batch::each(map, ks, vs * cpus, |n, keys, values| {
        for i in 0..n {
            let mut total = V::default();
            for cpu in 0..cpus {
                // SAFETY: the kernel wrote `n` keys of `ks` bytes and `n` values of
                // `cpus` copies of `vs` bytes each; K and V are plain data (`Pod`), read
                // unaligned.
                let v = unsafe {
                    values
                        .as_ptr()
                        .add((i * cpus + cpu) * vs)
                        .cast::<V>()
                        .read_unaligned()
                };
                total.add(&v);
            }
            // SAFETY: as above.
            let k = unsafe { keys.as_ptr().add(i * ks).cast::<K>().read_unaligned() };
            entries.push((k, total));
        }
    })
    .map_err(batch_err)?;
    Ok(entries)
}

/// Entries `start..start + count` of an array map of `V` (`start` at least 1: the
/// kernel's cursor is the key before it), in one `BPF_MAP_LOOKUP_BATCH` call: fewer where
/// the array ends first.
pub fn read_run<V: aya::Pod>(map: &MapData, start: u32, count: u32) -> Result<Vec<V>, MapError> {
    let vs = size_of::<V>();
    let mut values = Vec::with_capacity(count as usize);
    batch::run(map, start - 1, count, vs, |n, bytes| {
        for i in 0..n {
            // SAFETY: the kernel wrote `n` values of `vs` bytes; V is plain data of that
            // size (`Pod`), read unaligned.
            values.push(unsafe { bytes.as_ptr().add(i * vs).cast::<V>().read_unaligned() });
        }
    })
    .map_err(batch_err)?;
    Ok(values)
}

/// The key after `key` in `map`'s order (`BPF_MAP_GET_NEXT_KEY`; `None`: its first),
/// written into `next`: `false` if there is none.
pub fn next_key(map: &MapData, key: Option<&[u8]>, next: &mut [u8]) -> Result<bool, MapError> {
    batch::next_key(map, key, next).map_err(|io_error| {
        MapError::SyscallError(aya::sys::SyscallError {
            call: "BPF_MAP_GET_NEXT_KEY",
            io_error,
        })
    })
}

fn batch_err(io_error: std::io::Error) -> MapError {
    MapError::SyscallError(aya::sys::SyscallError {
        call: "BPF_MAP_LOOKUP_BATCH",
        io_error,
    })
}

/// Entries read per `BPF_MAP_LOOKUP_BATCH` call.
pub const BATCH: u32 = 8192;

mod batch {
    //! `BPF_MAP_LOOKUP_BATCH` and `BPF_MAP_UPDATE_BATCH`, which aya does not wrap: the
    //! entries of a hash or array map or a prefix trie, a bucket at a time, into buffers
    //! of the caller's, and entries written from them.

    use std::os::fd::{AsFd as _, AsRawFd as _};

    use aya::maps::MapData;

    /// The `batch` member of the kernel's `union bpf_attr` (linux/bpf.h).
    #[repr(C)]
    #[derive(Default)]
    struct BatchAttr {
        in_batch: u64,
        out_batch: u64,
        keys: u64,
        values: u64,
        count: u32,
        map_fd: u32,
        elem_flags: u64,
        flags: u64,
    }

    const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
    const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;
    const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;

    fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> std::io::Result<()> {
        // SAFETY: `attr` is the `union bpf_attr` member of `cmd`, whose pointers name
        // buffers the caller keeps alive and sized as the map's keys and values.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                cmd,
                std::ptr::from_mut(attr),
                size_of::<T>() as libc::c_uint,
            )
        };
        if ret < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Writes the `n` entries whose keys and values lie end to end in `keys` and
    /// `values` (any existing entry replaced): how many it wrote, and the call's result.
    pub fn update(
        map: &MapData,
        n: usize,
        keys: &[u8],
        values: &[u8],
    ) -> (usize, std::io::Result<()>) {
        let mut attr = BatchAttr {
            keys: keys.as_ptr() as u64,
            values: values.as_ptr() as u64,
            count: n as u32,
            map_fd: map.fd().as_fd().as_raw_fd() as u32,
            ..BatchAttr::default()
        };
        // The kernel only reads the buffers, and writes how many it wrote into `count`,
        // on an error too.
        let result = bpf(BPF_MAP_UPDATE_BATCH, &mut attr);
        let written = (attr.count as usize).min(n);
        (written, result)
    }

    /// `count` values of an array map (of `value_size` bytes) after key `after`, in one
    /// call: `f(n, values)`, fewer where the array ends.
    pub fn run(
        map: &MapData,
        after: u32,
        count: u32,
        value_size: usize,
        f: impl FnOnce(usize, &[u8]),
    ) -> std::io::Result<()> {
        let n = count as usize;
        let mut keys = vec![0u8; n * 4];
        let mut values = vec![0u8; n * value_size];
        let cursor = after.to_ne_bytes();
        let mut next = [0u8; 8];
        let mut attr = BatchAttr {
            in_batch: cursor.as_ptr() as u64,
            out_batch: next.as_mut_ptr() as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count,
            map_fd: map.fd().as_fd().as_raw_fd() as u32,
            ..BatchAttr::default()
        };
        let result = bpf(BPF_MAP_LOOKUP_BATCH, &mut attr);
        let got = (attr.count as usize).min(n);
        f(got, &values[..got * value_size]);
        match result {
            Err(e) if e.raw_os_error() != Some(libc::ENOENT) => Err(e),
            _ => Ok(()),
        }
    }

    /// The `BPF_MAP_GET_NEXT_KEY` member of `union bpf_attr`.
    #[repr(C)]
    struct NextKeyAttr {
        map_fd: u32,
        pad: u32,
        key: u64,
        next_key: u64,
    }

    /// The key after `key` (`None`: the first) into `next`: `false` where there is none.
    pub fn next_key(map: &MapData, key: Option<&[u8]>, next: &mut [u8]) -> std::io::Result<bool> {
        let mut attr = NextKeyAttr {
            map_fd: map.fd().as_fd().as_raw_fd() as u32,
            pad: 0,
            key: key.map_or(0, |k| k.as_ptr() as u64),
            next_key: next.as_mut_ptr() as u64,
        };
        match bpf(BPF_MAP_GET_NEXT_KEY, &mut attr) {
            Ok(()) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Calls `f(n, keys, values)` for each batch of `n` entries read, [`super::BATCH`]
    /// at a time, until the map has no more.
    pub fn each(
        map: &MapData,
        key_size: usize,
        value_size: usize,
        mut f: impl FnMut(usize, &[u8], &[u8]),
    ) -> std::io::Result<()> {
        let n = super::BATCH as usize;
        let mut keys = vec![0u8; n * key_size];
        let mut values = vec![0u8; n * value_size];
        // The kernel's cursor: opaque; a u32 bucket for hash maps, the last key read for
        // the generic walk of arrays and prefix tries (20 bytes for an IPv6 trie).
        let mut cursor = vec![0u8; key_size.max(8)];
        let mut next = vec![0u8; key_size.max(8)];
        let fd = map.fd().as_fd().as_raw_fd();
        let mut first = true;
        loop {
            let mut attr = BatchAttr {
                in_batch: if first { 0 } else { cursor.as_ptr() as u64 },
                out_batch: next.as_mut_ptr() as u64,
                keys: keys.as_mut_ptr() as u64,
                values: values.as_mut_ptr() as u64,
                count: n as u32,
                map_fd: fd as u32,
                ..BatchAttr::default()
            };
            // SAFETY: the attribute names buffers of `n` keys and values of the map's
            // sizes and two cursors of the key's size (at least 8 bytes), all alive
            // across the call; the kernel writes no more than that.
            let ret = unsafe {
                libc::syscall(
                    libc::SYS_bpf,
                    BPF_MAP_LOOKUP_BATCH,
                    &raw mut attr,
                    size_of::<BatchAttr>() as libc::c_uint,
                )
            };
            // On every return, `count` says how many entries were copied.
            let got = (attr.count as usize).min(n);
            f(got, &keys[..got * key_size], &values[..got * value_size]);
            if ret < 0 {
                let error = std::io::Error::last_os_error();
                // ENOENT: the walk is over.
                if error.raw_os_error() == Some(libc::ENOENT) {
                    return Ok(());
                }
                return Err(error);
            }
            cursor.copy_from_slice(&next);
            first = false;
        }
    }
}

/// A tracked key as an operator reads it: the address, or the network when keys are
/// masked to a shorter prefix (`198.51.100.0/24`, `2001:db8:1:2::/64`). A link-local,
/// unspecified or multicast address is always a key of its own (`shaper_common::keys`),
/// shown alone (`fe80::1`, `ff02::1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KeyNet {
    pub addr: IpAddr,
    pub prefix: u32,
}

impl KeyNet {
    /// A key as the program made it under `config`: masked to the configured prefix of
    /// its family, or the whole address if it is one keyed by itself.
    pub fn of_key(addr: IpAddr, config: &Config) -> Self {
        let prefix = match addr {
            IpAddr::V4(a) if v4_per_address(a.octets()) => 32,
            IpAddr::V4(_) => config.prefix_v4,
            IpAddr::V6(a) if v6_per_address(&a.octets()) => 128,
            IpAddr::V6(_) => config.prefix_v6,
        };
        Self { addr, prefix }
    }
}

impl fmt::Display for KeyNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let full = if self.addr.is_ipv4() { 32 } else { 128 };
        if self.prefix >= full {
            write!(f, "{}", self.addr)
        } else {
            write!(f, "{}/{}", self.addr, self.prefix)
        }
    }
}

/// Every tracked key of both families, as networks of the configured prefixes.
pub fn read_all_keys(
    at: &Attachment,
    config: &Config,
) -> Result<Vec<(KeyNet, SourceState)>, PinnedMapError> {
    let v4 = read_sources(at)?
        .into_iter()
        .map(|(a, s)| (KeyNet::of_key(a.into(), config), s));
    let v6 = read_sources6(at)?
        .into_iter()
        .map(|(a, s)| (KeyNet::of_key(a.into(), config), s));
    Ok(v4.chain(v6).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn networks_print_with_a_prefix_only_when_aggregated() {
        let net = |addr: &str, prefix| KeyNet {
            addr: addr.parse().unwrap(),
            prefix,
        };
        assert_eq!(net("198.51.100.7", 32).to_string(), "198.51.100.7");
        assert_eq!(net("198.51.100.0", 24).to_string(), "198.51.100.0/24");
        assert_eq!(net("2001:db8::", 64).to_string(), "2001:db8::/64");
        assert_eq!(net("2001:db8::1", 128).to_string(), "2001:db8::1");
    }

    #[test]
    fn link_local_unspecified_and_multicast_keys_are_whole_addresses() {
        let mut config = Config::per_source(8_000, 3_000).unwrap();
        config.prefix_v4 = 24;
        let key = |addr: &str| KeyNet::of_key(addr.parse().unwrap(), &config).to_string();
        assert_eq!(key("2001:db8::"), "2001:db8::/64");
        assert_eq!(key("fe80::1"), "fe80::1");
        assert_eq!(key("ff02::1"), "ff02::1");
        assert_eq!(key("::"), "::");
        assert_eq!(key("198.51.100.0"), "198.51.100.0/24");
        assert_eq!(key("0.0.0.0"), "0.0.0.0");
        assert_eq!(key("224.0.0.251"), "224.0.0.251");
        assert_eq!(key("169.254.1.2"), "169.254.1.2");
    }
}

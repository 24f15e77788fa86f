//! The kernel programs: the object build.rs embeds, loaded with its per-source maps sized
//! as asked, the handles of its programs, and what a freshly loaded object is given before
//! anything sees it (its settings, its layout version).
//!
//! Everything here works on a loaded object, pinned nowhere: attaching it
//! ([`crate::attach`]), upgrading to it ([`crate::upgrade`]) and the lab's `test_run`
//! harness build on it.

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, MapData},
    programs::{SchedClassifier, Xdp},
};
use shaper_common::{
    layout::LAYOUT_VERSION,
    maps::{
        Config, DEFAULT_MAX_SUBSCRIBERS, GLOBAL_SOURCE_BUCKETS, MAP_CONFIG, MAP_LAYOUT,
        MAP_PREFIXES_V4, MAP_PREFIXES_V6, MAP_SUBSCRIBERS, MAX_POLICIES, METER2_PER_KEY,
        METER2_UNUSED_ENTRIES, PROG_TC, SIZED_BY_POLICIES, SIZED_BY_SOURCES, policy_entries,
        subscriber_entries, trie_entries,
    },
    sources::{source_buckets, source_room},
};

use crate::kernel::{self, KernelError};

/// The kernel programs, built by build.rs.
pub static EBPF_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/shaper-ebpf"));

/// Names an object file loaded in place of [`EBPF_OBJECT`], in debug builds only (the
/// tests'; a release build ignores it): `cargo xtask mutants --scope kernel` builds each
/// mutant of shaper-ebpf and runs the already built tests and `shaper` against it, rather
/// than relinking every test binary for each (about 5 s a mutant against 18).
pub const OBJECT_VAR: &str = "SHAPER_TEST_OBJECT";

/// The object [`load_with`] loads: [`EBPF_OBJECT`], or in a debug build the file
/// [`OBJECT_VAR`] names (read once, kept for the process's life).
#[cfg(debug_assertions)]
fn object() -> Result<&'static [u8], ObjectError> {
    use std::sync::OnceLock;
    static OVERRIDE: OnceLock<Result<Option<&'static [u8]>, String>> = OnceLock::new();
    let read = || {
        let Some(path) = std::env::var_os(OBJECT_VAR) else {
            return Ok(None);
        };
        let bytes = std::fs::read(&path)
            .map_err(|e| format!("cannot read {} ({OBJECT_VAR}): {e}", path.display()))?;
        // ELF parsing wants the alignment `include_bytes_aligned!` gives: copied into u64s.
        let mut words = vec![0u64; bytes.len().div_ceil(8)];
        for (word, chunk) in words.iter_mut().zip(bytes.chunks(8)) {
            let mut ne = [0u8; 8];
            ne[..chunk.len()].copy_from_slice(chunk);
            *word = u64::from_ne_bytes(ne);
        }
        let words: &'static [u64] = Vec::leak(words);
        // SAFETY: the u64s' memory, as bytes, leaked so 'static; the length within it.
        let all = unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), bytes.len()) };
        Ok(Some(all))
    };
    match OVERRIDE.get_or_init(read) {
        Ok(found) => Ok(found.unwrap_or(EBPF_OBJECT)),
        Err(e) => Err(ObjectError::load(e.clone())),
    }
}

#[cfg(not(debug_assertions))]
#[inline(always)]
fn object() -> Result<&'static [u8], ObjectError> {
    Ok(EBPF_OBJECT)
}

#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    #[error("cannot load the kernel programs")]
    Load(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error(transparent)]
    Kernel(#[from] KernelError),
}

impl ObjectError {
    /// A step of loading (or of taking what was loaded) that failed with `e`.
    pub fn load(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self::Load(e.into())
    }
}

/// How big the per-key maps of a loaded object are made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sizes {
    /// Keys of each family (`--max-sources`).
    pub max_sources: u32,
    /// Whether the second meter's per-key maps get as many ([`METER2_PER_KEY`]): where a
    /// policy has a second meter; otherwise they take [`METER2_UNUSED_ENTRIES`].
    pub meter2: bool,
    /// Subscribers (`--max-subscribers`): the size of `SHAPER_SUBS`, and the prefix tries'
    /// room for their prefixes.
    pub max_subscribers: u32,
    /// Prefix policies and plans (`--max-policies`): the size of [`SIZED_BY_POLICIES`].
    pub max_policies: u32,
}

/// The first pin layout whose per-source tables are arrays of buckets (before it: LRU hash
/// maps of a key an entry).
pub const SOURCE_TABLES_LAYOUT: u32 = 11;

impl Sizes {
    /// Every per-key map `max_sources` keys, and room for every policy slot there may be
    /// (for test runs, which set any policy in any slot).
    pub fn full(max_sources: u32) -> Self {
        Self {
            max_sources,
            meter2: true,
            max_subscribers: DEFAULT_MAX_SUBSCRIBERS,
            max_policies: MAX_POLICIES - 1,
        }
    }

    /// The size of each of the second meter's per-key maps.
    pub fn meter2_entries(self) -> u32 {
        if self.meter2 {
            source_room(source_buckets(self.max_sources))
        } else {
            METER2_UNUSED_ENTRIES
        }
    }

    /// Sizes `loader`'s per-key maps (those it makes: a map reused from a pin keeps its
    /// size).
    pub fn apply(self, loader: &mut EbpfLoader<'_>) {
        self.apply_as(loader, true);
    }

    /// [`Sizes::apply`] for an object whose per-source tables are arrays of buckets
    /// (`tables`: pin layout 11 on), or LRU hash maps of a key an entry (an older build's,
    /// which the bench loads beside today's).
    pub fn apply_as(self, loader: &mut EbpfLoader<'_>, tables: bool) {
        if !tables {
            for name in SIZED_BY_SOURCES {
                loader.map_max_entries(name, self.max_sources);
            }
            let meter2 = if self.meter2 {
                self.max_sources
            } else {
                METER2_UNUSED_ENTRIES
            };
            for name in METER2_PER_KEY {
                loader.map_max_entries(name, meter2);
            }
        } else {
            let buckets = source_buckets(self.max_sources);
            for name in SIZED_BY_SOURCES {
                loader.map_max_entries(name, buckets);
            }
            // The loader keeps a reference for its lifetime: four bytes leaked a load (an
            // attach, an upgrade, a test's harness).
            let buckets: &'static u32 = Box::leak(Box::new(buckets));
            loader.override_global(GLOBAL_SOURCE_BUCKETS, buckets, true);
            for name in METER2_PER_KEY {
                loader.map_max_entries(name, self.meter2_entries());
            }
        }
        for name in SIZED_BY_POLICIES {
            loader.map_max_entries(name, policy_entries(self.max_policies));
        }
        loader.map_max_entries(MAP_SUBSCRIBERS, subscriber_entries(self.max_subscribers));
        for name in [MAP_PREFIXES_V4, MAP_PREFIXES_V6] {
            loader.map_max_entries(name, trie_entries(self.max_subscribers));
        }
    }
}

/// Whether a second meter's per-key map of `size` entries has room for the keys of tables
/// of room `cap`: made at their size (or bigger), or made for use before the tables grew
/// (`upgrade::grow_sources` keeps it as it is), not at [`METER2_UNUSED_ENTRIES`].
pub fn meter2_room(size: u32, cap: u32) -> bool {
    size >= cap || size > METER2_UNUSED_ENTRIES
}

/// Loads the object with its per-key maps sized as asked, on a kernel that has what the
/// program needs.
pub fn load(sizes: Sizes) -> Result<Ebpf, ObjectError> {
    load_with(EbpfLoader::new(), sizes)
}

/// Loads the object as `loader` says (maps reused from pins, say), its per-key maps sized
/// as asked, on a kernel that has what the program needs.
pub fn load_with(mut loader: EbpfLoader<'_>, sizes: Sizes) -> Result<Ebpf, ObjectError> {
    kernel::check()?;
    sizes.apply(&mut loader);
    loader.load(object()?).map_err(ObjectError::load)
}

/// The XDP program `name` of a loaded object, loaded into the kernel.
pub fn xdp_program<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut Xdp, ObjectError> {
    let prog: &mut Xdp = ebpf
        .program_mut(name)
        .ok_or_else(|| ObjectError::load(format!("program {name} missing from the object")))?
        .try_into()
        .map_err(ObjectError::load)?;
    prog.load()
        .map_err(|e| ObjectError::Load(kernel::load_error(e)))?;
    Ok(prog)
}

/// The tc classifier of a loaded object, loaded into the kernel.
pub fn tc_program(ebpf: &mut Ebpf) -> Result<&mut SchedClassifier, ObjectError> {
    let prog: &mut SchedClassifier = ebpf
        .program_mut(PROG_TC)
        .ok_or_else(|| ObjectError::load(format!("program {PROG_TC} missing from the object")))?
        .try_into()
        .map_err(ObjectError::load)?;
    prog.load()
        .map_err(|e| ObjectError::Load(kernel::load_error(e)))?;
    Ok(prog)
}

/// Writes `config` into a freshly loaded object's settings map.
pub fn configure(ebpf: &mut Ebpf, config: &Config) -> Result<(), ObjectError> {
    write_first(ebpf, MAP_CONFIG, *config)
}

/// Records this build's layout version in a freshly loaded object's version map.
pub fn write_layout_version(ebpf: &mut Ebpf) -> Result<(), ObjectError> {
    write_first(ebpf, MAP_LAYOUT, LAYOUT_VERSION)
}

/// Writes `value` into entry 0 of the array map `name`.
fn write_first<T: aya::Pod>(ebpf: &mut Ebpf, name: &str, value: T) -> Result<(), ObjectError> {
    let map = ebpf
        .map_mut(name)
        .ok_or_else(|| ObjectError::load(format!("map {name} missing")))?;
    let mut array: Array<&mut MapData, T> = Array::try_from(map).map_err(ObjectError::load)?;
    array.set(0, value, 0).map_err(ObjectError::load)
}

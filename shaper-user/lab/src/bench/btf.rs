//! The functions a program's BTF names, and their linkage: how the bench tells the pieces
//! the verifier checks once (global functions, verified on their own since 5.6) from the
//! static ones it walks again in every caller.
//!
//! Only as much of the BTF format as that needs (`Documentation/bpf/btf.rst`): the header,
//! each type's common part and the size of what follows it (to step to the next type),
//! and the string section. Types are numbered from 1 in the order they appear.

use std::collections::BTreeMap;

use anyhow::{Context as _, Result, bail, ensure};

const MAGIC: u16 = 0xeb9f;
const KIND_FUNC: u32 = 12;
/// `btf_func_linkage`: the linkage of a `BTF_KIND_FUNC` is in its `vlen`.
const LINKAGE_GLOBAL: u32 = 1;

/// A `BTF_KIND_FUNC` type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Func {
    pub name: String,
    /// `BTF_FUNC_GLOBAL`: verified once, on its own, whatever its callers.
    pub global: bool,
}

/// The functions of one BTF blob, by type id.
#[derive(Debug, Default)]
pub struct Funcs(BTreeMap<u32, Func>);

impl Funcs {
    pub fn get(&self, type_id: u32) -> Option<&Func> {
        self.0.get(&type_id)
    }
}

fn u32_at(data: &[u8], at: usize) -> Result<u32> {
    let bytes = data
        .get(at..at + 4)
        .with_context(|| format!("BTF ends before byte {}", at + 4))?;
    Ok(u32::from_ne_bytes(bytes.try_into()?))
}

/// Bytes that follow a type's 12-byte common part, by kind.
fn trailing(kind: u32, vlen: usize) -> Result<usize> {
    Ok(match kind {
        // PTR, FWD, TYPEDEF, VOLATILE, CONST, RESTRICT, FUNC, FLOAT, TYPE_TAG
        2 | 7..=12 | 16 | 18 => 0,
        // INT, VAR, DECL_TAG
        1 | 14 | 17 => 4,
        // ARRAY
        3 => 12,
        // STRUCT, UNION, DATASEC, ENUM64
        4 | 5 | 15 | 19 => 12 * vlen,
        // ENUM, FUNC_PROTO
        6 | 13 => 8 * vlen,
        kind => bail!("unknown BTF kind {kind}"),
    })
}

/// The functions of the BTF blob `data` (in this machine's byte order, as the kernel gives
/// it and as a little-endian object has it here).
pub fn funcs(data: &[u8]) -> Result<Funcs> {
    let magic = data
        .get(..2)
        .map(|b| u16::from_ne_bytes([b[0], b[1]]))
        .context("BTF shorter than its magic")?;
    ensure!(magic == MAGIC, "not BTF (magic {magic:#x})");
    let hdr_len = u32_at(data, 4)? as usize;
    let (type_off, type_len) = (u32_at(data, 8)? as usize, u32_at(data, 12)? as usize);
    let (str_off, str_len) = (u32_at(data, 16)? as usize, u32_at(data, 20)? as usize);
    let types = hdr_len + type_off..hdr_len + type_off + type_len;
    let strings = data
        .get(hdr_len + str_off..hdr_len + str_off + str_len)
        .context("BTF string section out of bounds")?;
    ensure!(types.end <= data.len(), "BTF type section out of bounds");
    let name = |off: u32| -> Result<String> {
        let s = strings
            .get(off as usize..)
            .with_context(|| format!("BTF name offset {off} out of bounds"))?;
        let end = s.iter().position(|&b| b == 0).unwrap_or(s.len());
        Ok(String::from_utf8_lossy(&s[..end]).into_owned())
    };
    let mut out = BTreeMap::new();
    let mut at = types.start;
    let mut id = 1;
    while at < types.end {
        let name_off = u32_at(data, at)?;
        let info = u32_at(data, at + 4)?;
        let kind = (info >> 24) & 0x1f;
        let vlen = (info & 0xffff) as usize;
        if kind == KIND_FUNC {
            out.insert(
                id,
                Func {
                    name: name(name_off)?,
                    global: vlen as u32 == LINKAGE_GLOBAL,
                },
            );
        }
        at += 12 + trailing(kind, vlen).with_context(|| format!("BTF type {id}"))?;
        id += 1;
    }
    ensure!(at == types.end, "BTF types overrun their section");
    Ok(Funcs(out))
}

#[cfg(test)]
mod tests {
    use shaper_common::maps::{PROG_TC, PROG_XDP};

    use super::*;

    /// The product's object, read by aya-obj (which keeps its BTF's type numbering):
    /// the function record of each entry point names a global function of its name (an
    /// entry is an exported symbol), and every function has a name.
    #[test]
    fn the_objects_entry_points_are_global_functions() {
        let object = aya_obj::Object::parse(shaper_user::object::EBPF_OBJECT).unwrap();
        let btf = object.btf.as_ref().expect("the object has BTF").to_bytes();
        let funcs = funcs(&btf).unwrap();
        for entry in [PROG_XDP, PROG_TC] {
            let prog = &object.programs[entry];
            let function = &object.functions[&(prog.section_index, prog.address)];
            let type_id = function.func_info.func_info[0].type_id;
            assert_eq!(
                funcs.get(type_id),
                Some(&Func {
                    name: entry.to_owned(),
                    global: true
                }),
                "{entry}'s function record"
            );
        }
        assert!(funcs.0.values().all(|f| !f.name.is_empty()));
        // The pieces the verifier checks once are global functions of their own (see
        // shaper-ebpf's theory of operation), and type ids number every type, not only the
        // functions.
        for piece in [
            "shaper_admit",
            "shaper_sight",
            "shaper_find4",
            "shaper_find6",
            "shaper_claim4",
            "shaper_claim6",
            "shaper_room4",
            "shaper_room6",
            "shaper_retry",
            "shaper_carry_over",
            "shaper_sample",
        ] {
            assert!(
                funcs.0.values().any(|f| f.name == piece && f.global),
                "{piece} is not a global function"
            );
        }
        let (&last, _) = funcs.0.last_key_value().unwrap();
        assert!(last as usize > funcs.0.len());
    }

    #[test]
    fn refuses_what_is_not_btf() {
        assert!(funcs(b"").is_err());
        assert!(funcs(&[0u8; 24]).is_err());
        // A header whose type section runs past the end.
        let mut hdr = Vec::new();
        for v in [u32::from(MAGIC) | (1 << 16), 24, 0, 100, 100, 0] {
            hdr.extend_from_slice(&v.to_ne_bytes());
        }
        assert!(funcs(&hdr).is_err());
    }
}

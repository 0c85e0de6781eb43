//! A minimal reader of kernel BTF (/sys/kernel/btf/vmlinux): byte offsets of struct members by
//! path, e.g. `task_struct.thread_info.cpu`, looking through anonymous struct/union members.
//!
//! This is "CO-RE by hand": the eBPF programs cannot carry relocations (Rust/aya has none for
//! field accesses), so userspace resolves the few task_struct offsets the migration program
//! needs and hands them over in `ProgConfig`. Pure over a byte slice; aya-obj keeps member
//! offsets private, hence this reader.

const MAGIC: u16 = 0xeb9f;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_TYPE_TAG: u32 = 18;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BtfError {
    #[error("not BTF data (bad header)")]
    BadHeader,
    #[error("truncated BTF type section at byte {0}")]
    Truncated(usize),
    #[error("unknown BTF kind {kind} at type {id}")]
    UnknownKind { id: u32, kind: u32 },
    #[error("no struct `{0}` in BTF")]
    NoStruct(String),
    #[error("no member `{member}` in `{parent}`")]
    NoMember { parent: String, member: String },
}

#[derive(Clone, Copy, Debug)]
struct TypeRec {
    name_off: u32,
    info: u32,
    size_or_type: u32,
    /// Byte position of the trailing data.
    data: usize,
}

impl TypeRec {
    fn kind(&self) -> u32 {
        (self.info >> 24) & 0x1f
    }
    fn vlen(&self) -> usize {
        (self.info & 0xffff) as usize
    }
    fn kflag(&self) -> bool {
        self.info >> 31 == 1
    }
}

/// Parsed BTF: type records (id 1 at index 0) over the borrowed bytes.
pub struct Btf<'a> {
    data: &'a [u8],
    strings: &'a [u8],
    types: Vec<TypeRec>,
}

fn u32_at(d: &[u8], at: usize) -> Option<u32> {
    d.get(at..at + 4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

impl<'a> Btf<'a> {
    /// Parses little-endian BTF.
    pub fn parse(data: &'a [u8]) -> Result<Btf<'a>, BtfError> {
        if data.len() < 24 || u16::from_le_bytes([data[0], data[1]]) != MAGIC {
            return Err(BtfError::BadHeader);
        }
        let hdr = |i: usize| u32_at(data, 4 + 4 * i).ok_or(BtfError::BadHeader);
        let (hdr_len, type_off, type_len, str_off, str_len) =
            (hdr(0)?, hdr(1)?, hdr(2)?, hdr(3)?, hdr(4)?);
        let ts = hdr_len as usize + type_off as usize;
        let te = ts + type_len as usize;
        let ss = hdr_len as usize + str_off as usize;
        let strings = data
            .get(ss..ss + str_len as usize)
            .ok_or(BtfError::BadHeader)?;
        if te > data.len() {
            return Err(BtfError::BadHeader);
        }
        let mut types = Vec::new();
        let mut at = ts;
        while at < te {
            let rec = (|| {
                Some(TypeRec {
                    name_off: u32_at(data, at)?,
                    info: u32_at(data, at + 4)?,
                    size_or_type: u32_at(data, at + 8)?,
                    data: at + 12,
                })
            })()
            .ok_or(BtfError::Truncated(at))?;
            let v = rec.vlen();
            let extra = match rec.kind() {
                1 | 14 | 17 => 4,          // INT, VAR, DECL_TAG
                2 | 7..=12 | 16 | 18 => 0, // PTR, FWD, TYPEDEF, VOLATILE, CONST, RESTRICT, FUNC, FLOAT, TYPE_TAG
                3 => 12,                   // ARRAY
                4 | 5 | 15 | 19 => 12 * v, // STRUCT, UNION, DATASEC, ENUM64
                6 | 13 => 8 * v,           // ENUM, FUNC_PROTO
                kind => {
                    return Err(BtfError::UnknownKind {
                        id: types.len() as u32 + 1,
                        kind,
                    })
                }
            };
            at = rec.data + extra;
            if at > te {
                return Err(BtfError::Truncated(rec.data));
            }
            types.push(rec);
        }
        Ok(Btf {
            data,
            strings,
            types,
        })
    }

    fn name(&self, off: u32) -> &str {
        let s = self.strings.get(off as usize..).unwrap_or(&[]);
        let end = s.iter().position(|&b| b == 0).unwrap_or(s.len());
        std::str::from_utf8(&s[..end]).unwrap_or("")
    }

    fn ty(&self, id: u32) -> Option<&TypeRec> {
        id.checked_sub(1).and_then(|i| self.types.get(i as usize))
    }

    /// Follows typedef/const/volatile/restrict/type_tag to the underlying type id.
    fn strip(&self, mut id: u32) -> u32 {
        for _ in 0..32 {
            match self.ty(id) {
                Some(t)
                    if matches!(
                        t.kind(),
                        KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG
                    ) =>
                {
                    id = t.size_or_type
                }
                _ => break,
            }
        }
        id
    }

    fn struct_id(&self, name: &str) -> Option<u32> {
        self.types
            .iter()
            .position(|t| {
                matches!(t.kind(), KIND_STRUCT | KIND_UNION)
                    && t.vlen() > 0
                    && self.name(t.name_off) == name
            })
            .map(|i| i as u32 + 1)
    }

    /// (byte offset, type id) of member `name` of struct/union `id`, searching anonymous
    /// members depth-first.
    fn member(&self, id: u32, name: &str, depth: u32) -> Option<(u32, u32)> {
        let t = self.ty(id)?;
        if !matches!(t.kind(), KIND_STRUCT | KIND_UNION) || depth > 8 {
            return None;
        }
        for i in 0..t.vlen() {
            let at = t.data + 12 * i;
            let (m_name, m_type, m_off) = (
                u32_at(self.data, at)?,
                u32_at(self.data, at + 4)?,
                u32_at(self.data, at + 8)?,
            );
            let bits = if t.kflag() { m_off & 0xff_ffff } else { m_off };
            if m_name == 0 {
                if let Some((o, ty)) = self.member(self.strip(m_type), name, depth + 1) {
                    return Some((bits / 8 + o, ty));
                }
            } else if self.name(m_name) == name {
                return Some((bits / 8, m_type));
            }
        }
        None
    }

    /// Byte offset of `path` ("struct.member.member…") from the start of the struct.
    pub fn offset_of(&self, path: &str) -> Result<u32, BtfError> {
        let mut parts = path.split('.');
        let root = parts.next().unwrap_or("");
        let mut id = self
            .struct_id(root)
            .ok_or_else(|| BtfError::NoStruct(root.into()))?;
        let mut parent = root.to_string();
        let mut total = 0;
        for m in parts {
            let (off, ty) =
                self.member(self.strip(id), m, 0)
                    .ok_or_else(|| BtfError::NoMember {
                        parent: parent.clone(),
                        member: m.into(),
                    })?;
            total += off;
            id = ty;
            parent = m.to_string();
        }
        Ok(total)
    }

    /// First path of `candidates` that resolves.
    pub fn offset_of_any(&self, candidates: &[&str]) -> Result<u32, BtfError> {
        let mut last = BtfError::NoStruct(String::new());
        for c in candidates {
            match self.offset_of(c) {
                Ok(o) => return Ok(o),
                Err(e) => last = e,
            }
        }
        Err(last)
    }
}

/// The task_struct offsets the migration program needs, in `ProgConfig` order:
/// (cgroups, css_set.dfl_cgrp, cgroup.kn, kernfs_node.id, task cpu).
pub fn task_offsets(btf: &Btf) -> Result<[u32; 5], BtfError> {
    Ok([
        btf.offset_of("task_struct.cgroups")?,
        btf.offset_of("css_set.dfl_cgrp")?,
        btf.offset_of("cgroup.kn")?,
        btf.offset_of("kernfs_node.id")?,
        btf.offset_of_any(&["task_struct.thread_info.cpu", "task_struct.cpu"])?,
    ])
}

/// The offsets the cpu-clock sampler reads its CPU's run-queue length through, in
/// `ProgConfig` order: `task_struct.se.cfs_rq`, `cfs_rq.rq`, `rq.nr_running`. `cfs_rq.rq`
/// exists only with CONFIG_FAIR_GROUP_SCHED (every distribution kernel with cgroups has it).
pub fn runq_offsets(btf: &Btf) -> Result<[u32; 3], BtfError> {
    Ok([
        btf.offset_of("task_struct.se.cfs_rq")?,
        btf.offset_of("cfs_rq.rq")?,
        btf.offset_of("rq.nr_running")?,
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds a BTF blob: `struct inner { int a; int cpu; }` and
    /// `struct outer { long x; union { int y; struct inner in; }; const inner *p; }`
    /// (the anonymous union at byte 8, `p` at 16).
    fn blob() -> Vec<u8> {
        let strings = b"\0int\0a\0cpu\0inner\0outer\0x\0y\0in\0p\0long\0".to_vec();
        let s = |name: &str| -> u32 {
            let pat = format!("\0{name}\0");
            strings
                .windows(pat.len())
                .position(|w| w == pat.as_bytes())
                .unwrap() as u32
                + 1
        };
        let mut t: Vec<u32> = Vec::new();
        // 1: int
        t.extend([s("int"), 1 << 24, 4, 32]);
        // 2: long
        t.extend([s("long"), 1 << 24, 8, 64]);
        // 3: struct inner { int a @0; int cpu @32 }
        t.extend([s("inner"), (4 << 24) | 2, 8]);
        t.extend([s("a"), 1, 0, s("cpu"), 1, 32]);
        // 4: anonymous union { int y; struct inner in; }
        t.extend([0, (5 << 24) | 2, 8]);
        t.extend([s("y"), 1, 0, s("in"), 3, 0]);
        // 5: const struct inner
        t.extend([0, 10 << 24, 3]);
        // 6: ptr to 5
        t.extend([0, 2 << 24, 5]);
        // 7: struct outer { long x @0; union @64; ptr p @128 }
        t.extend([s("outer"), (4 << 24) | 3, 24]);
        t.extend([s("x"), 2, 0, 0, 4, 64, s("p"), 6, 128]);
        let types: Vec<u8> = t.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut out = Vec::new();
        out.extend(MAGIC.to_le_bytes());
        out.extend([1u8, 0]);
        for v in [
            24u32,
            0,
            types.len() as u32,
            types.len() as u32,
            strings.len() as u32,
        ] {
            out.extend(v.to_le_bytes());
        }
        out.extend(types);
        out.extend(strings);
        out
    }

    fn check(path: &str, want: Result<u32, BtfError>) {
        let data = blob();
        let btf = Btf::parse(&data).unwrap();
        assert_eq!(btf.offset_of(path), want, "{path}");
    }

    #[test]
    fn member_offsets_through_anonymous_unions() {
        for (path, want) in [
            ("outer.x", Ok(0)),
            ("outer.y", Ok(8)),
            ("outer.in", Ok(8)),
            ("outer.in.cpu", Ok(12)),
            ("outer.p", Ok(16)),
            ("inner.cpu", Ok(4)),
            ("nope.x", Err(BtfError::NoStruct("nope".into()))),
            (
                "outer.zz",
                Err(BtfError::NoMember {
                    parent: "outer".into(),
                    member: "zz".into(),
                }),
            ),
        ] {
            check(path, want);
        }
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        assert_eq!(Btf::parse(b"").err(), Some(BtfError::BadHeader));
        let mut d = blob();
        d.truncate(40);
        assert!(Btf::parse(&d).is_err());
        let mut d = blob();
        d[24 + 4 + 3] = 0x1f; // first type's kind byte
        assert!(matches!(Btf::parse(&d), Err(BtfError::UnknownKind { .. })));
    }

    /// On a kernel with BTF, the offsets the migration program needs resolve and look sane.
    #[test]
    fn running_kernel_task_offsets() {
        let Ok(data) = std::fs::read("/sys/kernel/btf/vmlinux") else {
            eprintln!("SKIP: no /sys/kernel/btf/vmlinux");
            return;
        };
        let btf = Btf::parse(&data).unwrap();
        let offs = task_offsets(&btf).unwrap();
        assert!(offs.iter().all(|&o| o < 16384), "{offs:?}");
        assert!(offs[0] > 0 && offs[2] > 0, "{offs:?}");
    }
}

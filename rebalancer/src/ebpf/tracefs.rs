//! tracefs: finding (or mounting) it, and parsing event `format` files into field offsets and
//! `__print_symbolic` value names. The parsers are pure; tests run on format text captured on
//! 6.1 and 6.18, whose layouts differ (e.g. sched_migrate_task's `comm`).
use std::path::{Path, PathBuf};

use super::EbpfError;

/// Where tracefs is usually found.
pub const CANDIDATES: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// One `field:` line of a format file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    pub name: String,
    pub offset: u32,
    pub size: u32,
    pub signed: bool,
}

/// A parsed format file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Format {
    pub fields: Vec<Field>,
    pub print_fmt: String,
}

impl Format {
    pub fn field(&self, name: &str) -> Option<&Field> {
        self.fields.iter().find(|f| f.name == name)
    }

    /// Offset of `name`, checked to have `size` bytes.
    pub fn offset(&self, name: &str, size: u32) -> Option<u32> {
        self.field(name)
            .filter(|f| f.size == size && f.offset > 0)
            .map(|f| f.offset)
    }
}

/// Parses the text of an `events/<cat>/<name>/format` file.
pub fn parse_format(text: &str) -> Format {
    let mut out = Format::default();
    for line in text.lines() {
        let line = line.trim();
        if let Some(pf) = line.strip_prefix("print fmt:") {
            out.print_fmt = pf.trim().to_string();
            continue;
        }
        let Some(rest) = line.strip_prefix("field:") else {
            continue;
        };
        let mut parts = rest.split(';').map(str::trim);
        let decl = parts.next().unwrap_or("");
        let mut offset = None;
        let mut size = None;
        let mut signed = false;
        for p in parts {
            if let Some(v) = p.strip_prefix("offset:") {
                offset = v.parse().ok();
            } else if let Some(v) = p.strip_prefix("size:") {
                size = v.parse().ok();
            } else if let Some(v) = p.strip_prefix("signed:") {
                signed = v == "1";
            }
        }
        // "unsigned long succeeded", "char prev_comm[16]", "__data_loc char[] comm"
        let last = decl.rsplit([' ', '*']).next().unwrap_or("");
        let name = last.split('[').next().unwrap_or("");
        if let (false, Some(offset), Some(size)) = (name.is_empty(), offset, size) {
            out.fields.push(Field {
                name: name.to_string(),
                offset,
                size,
                signed,
            });
        }
    }
    out
}

/// The `{value, "name"}` pairs of `__print_symbolic(REC-><field>, …)` in a print fmt. A value
/// that is an unresolved enum name (older kernels print `MR_SYSCALL`) takes its position in the
/// list, which is the enum's order.
pub fn print_symbolic(print_fmt: &str, field: &str) -> Vec<(u32, String)> {
    let needle = format!("__print_symbolic(REC->{field},");
    let Some(start) = print_fmt.find(&needle) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut rest = &print_fmt[start + needle.len()..];
    let mut index = 0u32;
    loop {
        let rest_trim = rest.trim_start();
        let Some(body) = rest_trim.strip_prefix('{') else {
            break;
        };
        let Some(end) = body.find('}') else { break };
        let pair = &body[..end];
        if let Some((v, name)) = pair.split_once(',') {
            let v = v.trim();
            let value = crate::config::parse_u64(v)
                .and_then(|x| u32::try_from(x).ok())
                .unwrap_or(index);
            out.push((value, name.trim().trim_matches('"').to_string()));
        }
        index += 1;
        rest = body[end + 1..].trim_start();
        match rest.strip_prefix(',') {
            Some(r) => rest = r,
            None => break,
        }
    }
    out
}

/// A mounted tracefs (its root holds `events/`).
#[derive(Clone, Debug)]
pub struct Tracefs {
    pub root: PathBuf,
}

impl Tracefs {
    /// Finds tracefs in the usual places, mounting it at /sys/kernel/tracing if absent.
    pub fn find_or_mount() -> Result<Tracefs, EbpfError> {
        for c in CANDIDATES {
            if Path::new(c).join("events").is_dir() {
                return Ok(Tracefs { root: c.into() });
            }
        }
        let target = c"/sys/kernel/tracing";
        // SAFETY: valid NUL-terminated strings, null data.
        let rc = unsafe {
            libc::mount(
                c"tracefs".as_ptr(),
                target.as_ptr(),
                c"tracefs".as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        if rc != 0 {
            return Err(EbpfError::Tracefs {
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(Tracefs {
            root: CANDIDATES[0].into(),
        })
    }

    /// Reads and parses `events/<category>/<name>/format`.
    pub fn format(&self, category: &str, name: &str) -> Result<Format, EbpfError> {
        let path = self
            .root
            .join("events")
            .join(category)
            .join(name)
            .join("format");
        let text = std::fs::read_to_string(&path).map_err(|source| EbpfError::Io {
            path: path.clone(),
            source,
        })?;
        Ok(parse_format(&text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIG_618: &str = include_str!("fixtures/6.18/sched_migrate_task.format");
    const MIG_61: &str = include_str!("fixtures/6.1/sched_migrate_task.format");
    const MM_618: &str = include_str!("fixtures/6.18/mm_migrate_pages.format");
    const MM_61: &str = include_str!("fixtures/6.1/mm_migrate_pages.format");
    const MOVE_618: &str = include_str!("fixtures/6.18/sched_move_numa.format");
    const SWAP_618: &str = include_str!("fixtures/6.18/sched_swap_numa.format");

    fn check(text: &str, field: &str, size: u32, want: Option<u32>) {
        let f = parse_format(text);
        assert_eq!(f.offset(field, size), want, "{field} in {text:.40}");
    }

    #[test]
    fn offsets_differ_between_kernels() {
        for (text, field, size, want) in [
            (MIG_618, "pid", 4, Some(12)),
            (MIG_618, "orig_cpu", 4, Some(20)),
            (MIG_618, "dest_cpu", 4, Some(24)),
            (MIG_61, "pid", 4, Some(24)),
            (MIG_61, "orig_cpu", 4, Some(32)),
            (MIG_61, "dest_cpu", 4, Some(36)),
            (MIG_61, "comm", 16, Some(8)),
            (MIG_618, "comm", 4, Some(8)),
            (MM_618, "succeeded", 8, Some(8)),
            (MM_618, "reason", 4, Some(60)),
            (MM_61, "reason", 4, Some(52)),
            (MOVE_618, "dst_nid", 4, Some(32)),
            (SWAP_618, "dst_nid", 4, Some(44)),
            // wrong size or absent: refused
            (MM_618, "succeeded", 4, None),
            (MIG_618, "nope", 4, None),
            (MIG_618, "common_type", 2, None),
        ] {
            check(text, field, size, want);
        }
    }

    #[test]
    fn print_symbolic_numeric_and_enum_names() {
        let r618 = print_symbolic(&parse_format(MM_618).print_fmt, "reason");
        assert_eq!(r618.len(), 10);
        assert_eq!(r618[5], (5, "numa_misplaced".to_string()));
        assert_eq!(r618[9], (9, "damon".to_string()));
        let r61 = print_symbolic(&parse_format(MM_61).print_fmt, "reason");
        assert_eq!(r61.len(), 9);
        assert_eq!(r61[3], (3, "syscall_or_cpuset".to_string()));
        assert_eq!(r61[8], (8, "demotion".to_string()));
        assert!(print_symbolic("garbage", "reason").is_empty());
        assert!(print_symbolic("__print_symbolic(REC->reason, {", "reason").is_empty());
    }

    #[test]
    fn garbage_is_empty_not_a_panic() {
        for text in [
            "",
            "field:",
            "field:int x;\toffset:zz;\tsize:4;",
            "\u{0}\u{1}field",
        ] {
            assert!(parse_format(text).fields.is_empty(), "{text:?}");
        }
    }
}

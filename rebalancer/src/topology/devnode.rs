//! A container's device node (type and major:minor, as the runtime's OCI spec lists it) → the
//! PCI device behind it and that device's NUMA node, read below the sysfs root passed in.
//!
//! The kernel links every character device that has a device model entry at
//! `/sys/dev/char/M:m`, and that entry's `device` link at its parent device: for a GPU's
//! `/dev/dri/renderD128`, an NVMe controller's `/dev/nvme0`, an RDMA `uverbs` node, the PCI
//! function itself (`…/0000:41:00.0`), whose `numa_node` says where it is attached (-1: the
//! firmware did not say). Only that direct parent is taken: a `device` link to something that
//! is not a PCI function (a USB interface, a platform device) is not walked up, because the
//! PCI bridge above a USB hub says nothing useful about where the device's data goes.
//!
//! Not resolved, each with its reason ([`Resolution`]): block devices (storage reached through
//! the block layer; kubelet aligns only device-plugin devices), a node without a sysfs entry
//! (NVIDIA's proprietary `/dev/nvidia*` nodes, which the driver registers without a device
//! model entry) or without a `device` link (virtual devices: `/dev/null`, `/dev/fuse`,
//! `/dev/kvm`), and other node types (FIFOs).

use std::path::Path;

/// One device node of a container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DevNode {
    /// OCI device type: `c` / `u` (character, unbuffered character), `b` (block), `p` (FIFO).
    pub kind: String,
    pub major: i64,
    pub minor: i64,
    /// The path inside the container (for logs only).
    pub path: String,
}

/// What a device node resolved to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// A PCI function; `node` None when its `numa_node` is -1 or absent.
    Pci { address: String, node: Option<u32> },
    /// Not resolved, and why.
    Unresolved(&'static str),
}

/// Whether `s` is a PCI address as sysfs names functions: `dddd:bb:dd.f` in hex.
fn is_pci_address(s: &str) -> bool {
    let b = s.as_bytes();
    let hex = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_hexdigit);
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && hex(0..4)
        && hex(5..7)
        && hex(8..10)
        && hex(11..12)
}

/// Resolves `dev` below `sysfs_root` (standing for `/sys`).
pub fn resolve(sysfs_root: &Path, dev: &DevNode) -> Resolution {
    match dev.kind.as_str() {
        "c" | "u" => {}
        "b" => return Resolution::Unresolved("block device (not a topology-aligned device)"),
        _ => return Resolution::Unresolved("not a character device"),
    }
    if dev.major < 0 || dev.minor < 0 {
        return Resolution::Unresolved("negative major or minor");
    }
    let entry = sysfs_root.join(format!("dev/char/{}:{}", dev.major, dev.minor));
    if std::fs::symlink_metadata(&entry).is_err() {
        return Resolution::Unresolved("no sysfs entry for this major:minor");
    }
    let Ok(target) = std::fs::canonicalize(entry.join("device")) else {
        return Resolution::Unresolved("no device link (a virtual device)");
    };
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if !is_pci_address(&name) {
        return Resolution::Unresolved("its device is not a PCI function");
    }
    let node = std::fs::read_to_string(target.join("numa_node"))
        .ok()
        .and_then(|s| s.trim().parse::<i64>().ok())
        .and_then(|n| u32::try_from(n).ok());
    Resolution::Pci {
        address: name.to_ascii_lowercase(),
        node,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn dev(kind: &str, major: i64, minor: i64) -> DevNode {
        DevNode {
            kind: kind.into(),
            major,
            minor,
            path: "/dev/x".into(),
        }
    }

    /// A sysfs tree: PCI functions under devices/pci0000:00 with their numa_node, and
    /// dev/char entries linking to them the way the kernel lays them out (the entry itself a
    /// link to the class device, whose `device` link names the parent).
    fn tree() -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        let bus = r.join("devices/pci0000:00");
        for (addr, node) in [
            ("0000:41:00.0", Some("1\n")),
            ("0000:42:00.0", Some("-1\n")),
            ("0000:43:00.0", None),
        ] {
            std::fs::create_dir_all(bus.join(addr)).unwrap();
            if let Some(n) = node {
                std::fs::write(bus.join(addr).join("numa_node"), n).unwrap();
            }
        }
        let usb = bus.join("0000:00:14.0/usb1/1-1/1-1:1.0");
        std::fs::create_dir_all(&usb).unwrap();
        std::fs::create_dir_all(r.join("dev/char")).unwrap();
        std::fs::create_dir_all(r.join("dev/block")).unwrap();
        let class = |name: &str, parent: Option<&Path>| {
            let d = r.join("devices/virtual/class").join(name);
            std::fs::create_dir_all(&d).unwrap();
            if let Some(p) = parent {
                symlink(p, d.join("device")).unwrap();
            }
            d
        };
        let link = |majmin: &str, d: &Path| {
            symlink(d, r.join("dev/char").join(majmin)).unwrap();
        };
        link(
            "226:128",
            &class(
                "renderD128",
                Some(Path::new("../../../pci0000:00/0000:41:00.0")),
            ),
        );
        link(
            "226:129",
            &class("renderD129", Some(&bus.join("0000:42:00.0"))),
        );
        link(
            "226:130",
            &class("renderD130", Some(&bus.join("0000:43:00.0"))),
        );
        link("1:3", &class("null", None));
        link("189:1", &class("usbdev", Some(&usb)));
        // the block device with a char device's numbers resolves to nothing
        symlink(
            class("nvme0n1", Some(&bus.join("0000:41:00.0"))),
            r.join("dev/block/226:128"),
        )
        .unwrap();
        t
    }

    #[test]
    fn char_devices_resolve_to_their_pci_function_and_its_node() {
        let t = tree();
        let r = t.path();
        let pci = |a: &str, n: Option<u32>| Resolution::Pci {
            address: a.into(),
            node: n,
        };
        let cases: &[(DevNode, Resolution)] = &[
            // a relative device link, as the kernel writes them
            (dev("c", 226, 128), pci("0000:41:00.0", Some(1))),
            (dev("u", 226, 128), pci("0000:41:00.0", Some(1))),
            // numa_node -1: a PCI function whose node the firmware did not give
            (dev("c", 226, 129), pci("0000:42:00.0", None)),
            // no numa_node file at all: the same
            (dev("c", 226, 130), pci("0000:43:00.0", None)),
            (
                dev("b", 226, 128),
                Resolution::Unresolved("block device (not a topology-aligned device)"),
            ),
            (
                dev("p", 0, 0),
                Resolution::Unresolved("not a character device"),
            ),
            (
                dev("c", 195, 0),
                Resolution::Unresolved("no sysfs entry for this major:minor"),
            ),
            (
                dev("c", 1, 3),
                Resolution::Unresolved("no device link (a virtual device)"),
            ),
            (
                dev("c", 189, 1),
                Resolution::Unresolved("its device is not a PCI function"),
            ),
            (
                dev("c", -1, 3),
                Resolution::Unresolved("negative major or minor"),
            ),
        ];
        for (d, want) in cases {
            assert_eq!(resolve(r, d), *want, "{d:?}");
        }
        // a sysfs root without dev/char (an old fixture) resolves nothing, and fails nothing
        let empty = tempfile::tempdir().unwrap();
        assert!(matches!(
            resolve(empty.path(), &dev("c", 226, 128)),
            Resolution::Unresolved(_)
        ));
    }

    #[test]
    fn pci_addresses_are_recognised_exactly() {
        for (s, want) in [
            ("0000:41:00.0", true),
            ("0000:c1:1f.7", true),
            ("0000:41:00", false),
            ("usb1", false),
            ("1-1:1.0", false),
            ("0000:41:00.0x", false),
            ("000g:41:00.0", false),
        ] {
            assert_eq!(is_pci_address(s), want, "{s}");
        }
    }
}

//! Reads a [`Topology`] from a sysfs tree whose root is passed in (it stands for `/sys`).
//!
//! Files read, relative to the root (everything else is ignored, so a fixture holds only these):
//! - `devices/system/cpu/{online,present|possible}`; per CPU `cpuN/topology/{physical_package_id,
//!   die_id?,core_id,thread_siblings_list|core_cpus_list,cluster_id?,cluster_cpus_list?}` and
//!   `cpuN/cache/index*/{level,shared_cpu_list}` (the L3 is the index whose level is 3,
//!   whatever its number).
//! - `devices/system/node/online` (else the `nodeN` directories); per node `nodeN/{cpulist,meminfo,distance}`,
//!   `nodeN/hugepages/hugepages-*/{nr_hugepages,free_hugepages}` and the `nodeN/cpuM` links
//!   (only their names: they give the node of an offline CPU, which `cpulist` omits).
//! - `bus/pci/devices/*/{class,numa_node,vendor?,device?}`.
//!
//! What real kernels do, and how it is handled:
//! - An offline CPU has no `topology/` or `cache/` directory (both are torn down at hot-unplug):
//!   it is listed with `online = false`, its node from the `nodeN/cpuM` links (created for every
//!   present CPU whose node is online) or `None`, `siblings = {itself}`, `l3 = None`, and
//!   socket/die/core 0 — meaningless for an offline CPU, so consumers filter on `online`.
//! - `die_id` exists only on x86/s390 and newer kernels; without it die = socket.
//! - `cluster_id` / `cluster_cpus_list` (CPU clusters: cores sharing an L2 or an L3 tag, e.g.
//!   Kunpeng 920's four-core clusters) exist on arm64 and on x86 from Linux 5.16. Without them,
//!   with `cluster_id` -1 (firmware that describes no cluster), or with a cluster no wider than
//!   the CPU's own core (x86 without shared L2s), the CPU has no cluster (`None`).
//!   `physical_package_id` is -1 on some arm64 firmware; that reads as socket 0.
//! - `nodeN/distance` holds one value per *online* node in ascending id order
//!   (`drivers/base/node.c: node_read_distance`, `for_each_online_node`), separated by a space
//!   that the kernel prints before every entry but node 0's — so a row starts with a space when
//!   node 0 is offline. The row is mapped by id into the order of `Topology::nodes`.
//! - Without `devices/system/node` (a kernel without CONFIG_NUMA) node 0 is synthesised with
//!   every online CPU, memory 0 (unknown: /proc is not below a sysfs root) and distance [10].
//! - Required files that are missing or malformed are errors naming the file. PCI files are
//!   optional: a device whose files cannot be read or parsed is skipped with a warning, because
//!   one odd device must not stop discovery of the machine.
use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
};

use super::{Cpu, DeviceClass, HugePages, Node, PciDevice, Topology};
use crate::cpuset::CpuSet;

#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error("cannot read {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Malformed { path: PathBuf, message: String },
}

fn malformed(path: &Path, message: impl Into<String>) -> TopologyError {
    TopologyError::Malformed {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

fn read_string(path: &Path) -> Result<String, TopologyError> {
    fs::read_to_string(path).map_err(|source| TopologyError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Reads a file if it exists; `Ok(None)` only for "not found".
fn read_optional(path: &Path) -> Result<Option<String>, TopologyError> {
    match fs::read_to_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(TopologyError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

fn parse_cpulist(path: &Path, text: &str) -> Result<CpuSet, TopologyError> {
    CpuSet::parse(text).map_err(|e| malformed(path, e.to_string()))
}

fn read_cpulist(path: &Path) -> Result<CpuSet, TopologyError> {
    parse_cpulist(path, &read_string(path)?)
}

fn parse_int<T: std::str::FromStr>(path: &Path, text: &str) -> Result<T, TopologyError> {
    let t = text.trim();
    t.parse()
        .map_err(|_| malformed(path, format!("expected an integer, found {t:?}")))
}

fn read_int<T: std::str::FromStr>(path: &Path) -> Result<T, TopologyError> {
    parse_int(path, &read_string(path)?)
}

/// Reads the first of `names` that exists below `dir`; error naming the first when none does.
fn read_first(dir: &Path, names: &[&str]) -> Result<(PathBuf, String), TopologyError> {
    for name in names {
        let p = dir.join(name);
        if let Some(s) = read_optional(&p)? {
            return Ok((p, s));
        }
    }
    let p = dir.join(names[0]);
    Err(TopologyError::Io {
        source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"),
        path: p,
    })
}

/// Ids of the directory entries named `<prefix><number>` (e.g. `node3`, `cpu12`, `index0`).
fn numbered_entries(dir: &Path, prefix: &str) -> Result<Vec<u32>, TopologyError> {
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(TopologyError::Io {
                path: dir.to_path_buf(),
                source,
            })
        }
    };
    let mut ids = Vec::new();
    for entry in rd {
        let entry = entry.map_err(|source| TopologyError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(prefix)) else {
            continue;
        };
        if !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit()) {
            if let Ok(id) = rest.parse() {
                ids.push(id);
            }
        }
    }
    ids.sort_unstable();
    Ok(ids)
}

/// Reads the topology below `root` (a directory standing for `/sys`).
pub fn read(root: &Path) -> Result<Topology, TopologyError> {
    let cpu_dir = root.join("devices/system/cpu");
    let node_dir = root.join("devices/system/node");

    let online = read_cpulist(&cpu_dir.join("online"))?;
    let (present_path, present_text) = read_first(&cpu_dir, &["present", "possible"])?;
    // An online CPU is present by definition; the union guards against a trimmed tree.
    let present = parse_cpulist(&present_path, &present_text)?.union(&online);

    let mut nodes = if node_dir.is_dir() {
        read_nodes(&node_dir)?
    } else {
        Vec::new()
    };
    // Node of each present CPU: online CPUs from the cpulists, offline ones from the links.
    let mut node_of: BTreeMap<u32, u32> = BTreeMap::new();
    for (n, links) in &nodes {
        for c in links.iter().chain(n.cpus.iter()) {
            node_of.insert(c, n.id);
        }
    }
    let mut nodes: Vec<Node> = nodes.drain(..).map(|(n, _)| n).collect();
    if nodes.is_empty() {
        nodes.push(Node {
            id: 0,
            cpus: online.clone(),
            memory_total_bytes: 0,
            memory_free_bytes: 0,
            hugepages: BTreeMap::new(),
            distances: vec![10],
        });
        for c in online.iter() {
            node_of.insert(c, 0);
        }
    }

    let mut cpus = Vec::with_capacity(present.len());
    for id in present.iter() {
        let node = node_of.get(&id).copied();
        if online.contains(id) {
            cpus.push(read_cpu(&cpu_dir.join(format!("cpu{id}")), id, node)?);
        } else {
            cpus.push(Cpu {
                id,
                node,
                socket: 0,
                die: 0,
                core: 0,
                l3: None,
                cluster: None,
                online: false,
                siblings: std::iter::once(id).collect(),
            });
        }
    }

    let devices = read_pci(&root.join("bus/pci/devices"))?;
    Ok(Topology {
        nodes,
        cpus,
        devices,
    })
}

/// Reads every online node; returns each with the CPU ids of its `cpuN` links.
fn read_nodes(node_dir: &Path) -> Result<Vec<(Node, CpuSet)>, TopologyError> {
    // The online mask is the kernel's own order for distance rows. Without it, the nodeN
    // directories are the online nodes (the kernel registers a node device only when the
    // node comes online); `possible` would over-count, so it is not used.
    let online_path = node_dir.join("online");
    let ids: Vec<u32> = match read_optional(&online_path)? {
        Some(s) => parse_cpulist(&online_path, &s)?.iter().collect(),
        None => numbered_entries(node_dir, "node")?,
    };
    let mut out = Vec::with_capacity(ids.len());
    for &id in &ids {
        let dir = node_dir.join(format!("node{id}"));
        let cpus = read_cpulist(&dir.join("cpulist"))?;
        let links: CpuSet = numbered_entries(&dir, "cpu")?.into_iter().collect();
        let meminfo_path = dir.join("meminfo");
        let (total_kb, free_kb) = parse_meminfo(&meminfo_path, &read_string(&meminfo_path)?)?;
        let hugepages = read_hugepages(&dir.join("hugepages"))?;
        let dist_path = dir.join("distance");
        let row = parse_distance_row(&dist_path, &read_string(&dist_path)?, &ids, &ids)?;
        out.push((
            Node {
                id,
                cpus,
                memory_total_bytes: total_kb * 1024,
                memory_free_bytes: free_kb * 1024,
                hugepages,
                distances: row,
            },
            links,
        ));
    }
    Ok(out)
}

/// Parses one `nodeN/distance` row, whose entries follow `kernel_order` (the online node ids,
/// ascending), into the order of `wanted` (the ids of `Topology::nodes`).
pub fn parse_distance_row(
    path: &Path,
    text: &str,
    kernel_order: &[u32],
    wanted: &[u32],
) -> Result<Vec<u32>, TopologyError> {
    let values: Vec<u32> = text
        .split_whitespace()
        .map(|t| {
            t.parse::<u32>()
                .map_err(|_| malformed(path, format!("distance {t:?} is not a number")))
        })
        .collect::<Result<_, _>>()?;
    if values.len() != kernel_order.len() {
        return Err(malformed(
            path,
            format!(
                "{} distance(s) for {} online node(s)",
                values.len(),
                kernel_order.len()
            ),
        ));
    }
    let by_id: BTreeMap<u32, u32> = kernel_order.iter().copied().zip(values).collect();
    wanted
        .iter()
        .map(|id| {
            by_id
                .get(id)
                .copied()
                .ok_or_else(|| malformed(path, format!("no distance to node {id}")))
        })
        .collect()
}

/// `(MemTotal, MemFree)` in kB from a node's meminfo ("Node 0 MemTotal:  65536000 kB").
pub fn parse_meminfo(path: &Path, text: &str) -> Result<(u64, u64), TopologyError> {
    let mut total = None;
    let mut free = None;
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let (Some("Node"), Some(_), Some(key), Some(val)) =
            (it.next(), it.next(), it.next(), it.next())
        else {
            continue;
        };
        let slot = match key {
            "MemTotal:" => &mut total,
            "MemFree:" => &mut free,
            _ => continue,
        };
        *slot = Some(val.parse::<u64>().map_err(|_| {
            malformed(
                path,
                format!(
                    "{} value {val:?} is not a number",
                    key.trim_end_matches(':')
                ),
            )
        })?);
    }
    match (total, free) {
        (Some(t), Some(f)) => Ok((t, f)),
        _ => Err(malformed(path, "no MemTotal/MemFree line")),
    }
}

fn read_hugepages(dir: &Path) -> Result<BTreeMap<String, HugePages>, TopologyError> {
    let mut out = BTreeMap::new();
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        // Memory-less nodes and kernels without hugetlbfs have no hugepages directory.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(source) => {
            return Err(TopologyError::Io {
                path: dir.to_path_buf(),
                source,
            })
        }
    };
    for entry in rd {
        let entry = entry.map_err(|source| TopologyError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let name = entry.file_name();
        let Some(size) = name.to_str().and_then(|n| n.strip_prefix("hugepages-")) else {
            continue;
        };
        let d = entry.path();
        out.insert(
            size.to_string(),
            HugePages {
                total: read_int(&d.join("nr_hugepages"))?,
                free: read_int(&d.join("free_hugepages"))?,
            },
        );
    }
    Ok(out)
}

fn read_cpu(dir: &Path, id: u32, node: Option<u32>) -> Result<Cpu, TopologyError> {
    let topo = dir.join("topology");
    let pkg_path = topo.join("physical_package_id");
    let socket = read_int::<i64>(&pkg_path)?.max(0) as u32;
    let die = match read_optional(&topo.join("die_id"))? {
        Some(s) => parse_int::<i64>(&topo.join("die_id"), &s)?.max(0) as u32,
        None => socket,
    };
    let core = read_int::<i64>(&topo.join("core_id"))?.max(0) as u32;
    let (sib_path, sib_text) = read_first(&topo, &["thread_siblings_list", "core_cpus_list"])?;
    let mut siblings = parse_cpulist(&sib_path, &sib_text)?;
    siblings.insert(id);
    let cluster = read_cluster(&topo, &siblings)?;
    Ok(Cpu {
        id,
        node,
        socket,
        die,
        core,
        l3: read_l3(&dir.join("cache"))?,
        cluster,
        online: true,
        siblings,
    })
}

/// Smallest CPU of this CPU's cluster (see the module header for when there is none).
fn read_cluster(topo: &Path, siblings: &CpuSet) -> Result<Option<u32>, TopologyError> {
    let id_path = topo.join("cluster_id");
    if let Some(s) = read_optional(&id_path)? {
        if parse_int::<i64>(&id_path, &s)? < 0 {
            return Ok(None);
        }
    }
    let list_path = topo.join("cluster_cpus_list");
    let Some(text) = read_optional(&list_path)? else {
        return Ok(None);
    };
    let cpus = parse_cpulist(&list_path, &text)?;
    if cpus.is_subset(siblings) {
        return Ok(None);
    }
    Ok(cpus.first())
}

/// Smallest CPU sharing this CPU's level-3 cache, or `None` without one (VMs, small SoCs).
fn read_l3(cache: &Path) -> Result<Option<u32>, TopologyError> {
    for idx in numbered_entries(cache, "index")? {
        let d = cache.join(format!("index{idx}"));
        if read_int::<u32>(&d.join("level"))? == 3 {
            let p = d.join("shared_cpu_list");
            return Ok(read_cpulist(&p)?.first());
        }
    }
    Ok(None)
}

/// Coarse class from a PCI class code (`0xCCSSPP`: class, subclass, programming interface).
pub fn classify_pci(class: u32) -> DeviceClass {
    match (class >> 16, class) {
        (0x03 | 0x12, _) => DeviceClass::Gpu,
        (0x02, _) => DeviceClass::Nic,
        (_, 0x01_08_02) => DeviceClass::Nvme,
        _ => DeviceClass::Other,
    }
}

fn read_pci(dir: &Path) -> Result<Vec<PciDevice>, TopologyError> {
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(TopologyError::Io {
                path: dir.to_path_buf(),
                source,
            })
        }
    };
    let mut out = Vec::new();
    for entry in rd {
        let Ok(entry) = entry else { continue };
        let address = entry.file_name().to_string_lossy().into_owned();
        // Optional files: a device that cannot be read is skipped with a warning (see header).
        match read_pci_device(&entry.path(), &address) {
            Ok(d) => out.push(d),
            Err(e) => tracing::warn!(device = %address, error = %e, "skipping PCI device"),
        }
    }
    out.sort_by(|a, b| a.address.cmp(&b.address));
    Ok(out)
}

fn read_pci_device(dir: &Path, address: &str) -> Result<PciDevice, TopologyError> {
    let class_path = dir.join("class");
    let class_text = read_string(&class_path)?;
    let class_hex = class_text.trim();
    let class = u32::from_str_radix(class_hex.trim_start_matches("0x"), 16)
        .map_err(|_| malformed(&class_path, format!("class {class_hex:?} is not hex")))?;
    let node = match read_optional(&dir.join("numa_node"))? {
        Some(s) => {
            let n: i64 = parse_int(&dir.join("numa_node"), &s)?;
            u32::try_from(n).ok()
        }
        None => None,
    };
    let id = |name: &str| -> Result<Option<String>, TopologyError> {
        Ok(read_optional(&dir.join(name))?.map(|s| s.trim().to_string()))
    };
    Ok(PciDevice {
        address: address.to_string(),
        class: classify_pci(class),
        node,
        vendor: id("vendor")?,
        device: id("device")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_classes() {
        for (code, want) in [
            (0x030000, DeviceClass::Gpu),
            (0x030200, DeviceClass::Gpu),
            (0x120000, DeviceClass::Gpu),
            (0x020000, DeviceClass::Nic),
            (0x020700, DeviceClass::Nic),
            (0x010802, DeviceClass::Nvme),
            (0x010801, DeviceClass::Other),
            (0x060400, DeviceClass::Other),
            (0xffff00, DeviceClass::Other),
        ] {
            assert_eq!(classify_pci(code), want, "{code:#08x}");
        }
    }

    #[test]
    fn distance_rows_follow_kernel_order_and_leading_space() {
        let p = Path::new("node1/distance");
        // Node 0 offline: the kernel prints " 10 20" (a space before every id but 0).
        assert_eq!(
            parse_distance_row(p, " 10 20\n", &[1, 3], &[1, 3]).unwrap(),
            vec![10, 20]
        );
        // Re-ordered into a different `wanted` order.
        assert_eq!(
            parse_distance_row(p, "10 21 31\n", &[0, 2, 5], &[5, 0, 2]).unwrap(),
            vec![31, 10, 21]
        );
        let err = parse_distance_row(p, "10 x1\n", &[0, 1], &[0, 1]).unwrap_err();
        assert!(err.to_string().contains("node1/distance"), "{err}");
        let err = parse_distance_row(p, "10\n", &[0, 1], &[0, 1]).unwrap_err();
        assert!(err.to_string().contains("1 distance(s) for 2"), "{err}");
    }

    #[test]
    fn meminfo_lines() {
        let p = Path::new("meminfo");
        let text = "Node 3 MemTotal:       65536000 kB\nNode 3 MemFree:        1024 kB\n\
                    Node 3 MemUsed:        65534976 kB\nNode 3 HugePages_Total:     0\n";
        assert_eq!(parse_meminfo(p, text).unwrap(), (65536000, 1024));
        assert!(parse_meminfo(p, "Node 0 MemTotal: 12 kB\n").is_err());
        assert!(parse_meminfo(p, "Node 0 MemTotal: x kB\nNode 0 MemFree: 1 kB\n").is_err());
    }

    #[test]
    fn clusters_read_from_topology_files() {
        let dir = tempfile::tempdir().unwrap();
        let t = dir.path();
        let put = |name: &str, text: &str| std::fs::write(t.join(name), text).unwrap();
        let sib: CpuSet = [4].into_iter().collect();
        // no files: no cluster (kernels before 5.16 on x86)
        assert_eq!(read_cluster(t, &sib).unwrap(), None);
        // Kunpeng 920: four cores per cluster
        put("cluster_id", "1\n");
        put("cluster_cpus_list", "4-7\n");
        assert_eq!(read_cluster(t, &sib).unwrap(), Some(4));
        // firmware without clusters
        put("cluster_id", "-1\n");
        assert_eq!(read_cluster(t, &sib).unwrap(), None);
        // x86 without a shared L2: the cluster is the core itself
        put("cluster_id", "8\n");
        put("cluster_cpus_list", "4,68\n");
        let sib: CpuSet = [4, 68].into_iter().collect();
        assert_eq!(read_cluster(t, &sib).unwrap(), None);
        put("cluster_cpus_list", "4-x\n");
        let err = read_cluster(t, &sib).unwrap_err();
        assert!(err.to_string().contains("cluster_cpus_list"), "{err}");
        put("cluster_id", "one\n");
        assert!(read_cluster(t, &sib).is_err());
    }

    proptest::proptest! {
        #[test]
        fn row_and_meminfo_parsers_never_panic(text in "[ -~\\n]{0,200}") {
            let p = Path::new("f");
            let _ = parse_distance_row(p, &text, &[0, 1, 2], &[2, 0, 1]);
            let _ = parse_meminfo(p, &text);
        }
    }
}

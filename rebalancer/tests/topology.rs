//! Topology discovery on the sysfs fixtures in tests/fixtures/sysfs (see gen_fixtures.py and
//! capture-sysfs.sh there), and on malformed copies of them.
use std::path::{Path, PathBuf};

use rebalancer::{
    cpuset::CpuSet,
    topology::{sysfs, DeviceClass, Topology},
};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/sysfs")
        .join(name)
}

/// What a fixture must show. `l3_groups` are the online CPUs sharing each L3, `devices` are
/// (address, class, node).
struct Want<'a> {
    nodes: &'a [u32],
    node_cpus: &'a [&'a str],
    cpus: usize,
    online: usize,
    distances: &'a [&'a [u32]],
    siblings: &'a [(u32, &'a str)],
    l3_groups: &'a [&'a str],
    devices: &'a [(&'a str, DeviceClass, Option<u32>)],
}

fn l3_groups(t: &Topology) -> Vec<String> {
    let mut groups: std::collections::BTreeMap<u32, CpuSet> = Default::default();
    for c in t.cpus.iter().filter(|c| c.online) {
        if let Some(l3) = c.l3 {
            groups.entry(l3).or_default().insert(c.id);
        }
    }
    groups.values().map(|s| s.to_string()).collect()
}

fn check(name: &str, w: Want) -> Topology {
    let t = sysfs::read(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e:#}"));
    let ids: Vec<u32> = t.node_ids().collect();
    assert_eq!(ids, w.nodes, "{name}: node ids");
    let node_cpus: Vec<String> = t.nodes.iter().map(|n| n.cpus.to_string()).collect();
    assert_eq!(node_cpus, w.node_cpus, "{name}: node cpus");
    assert_eq!(t.cpus.len(), w.cpus, "{name}: cpu count");
    assert_eq!(t.online_cpus().len(), w.online, "{name}: online cpus");
    let rows: Vec<Vec<u32>> = t.nodes.iter().map(|n| n.distances.clone()).collect();
    assert_eq!(rows, w.distances, "{name}: distances");
    for &(cpu, sib) in w.siblings {
        assert_eq!(
            t.cpu(cpu).unwrap().siblings.to_string(),
            sib,
            "{name}: siblings of {cpu}"
        );
    }
    assert_eq!(l3_groups(&t), w.l3_groups, "{name}: L3 groups");
    let devs: Vec<(&str, DeviceClass, Option<u32>)> = t
        .devices
        .iter()
        .map(|d| (d.address.as_str(), d.class, d.node))
        .collect();
    assert_eq!(devs, w.devices, "{name}: devices");
    // Every online CPU of a node's cpulist says it is on that node.
    for n in &t.nodes {
        for c in n.cpus.iter() {
            assert_eq!(t.node_of_cpu(c), Some(n.id), "{name}: node of cpu {c}");
        }
        assert!(
            n.memory_free_bytes <= n.memory_total_bytes,
            "{name}: node {} memory",
            n.id
        );
    }
    // The JSON shape of `rebalancer topology --json`.
    let v = serde_json::to_value(&t).unwrap();
    for key in [
        "id",
        "cpus",
        "memory_total_bytes",
        "memory_free_bytes",
        "hugepages",
        "distances",
    ] {
        assert!(v["nodes"][0].get(key).is_some(), "{name}: nodes[].{key}");
    }
    for key in [
        "id", "node", "socket", "die", "core", "l3", "online", "siblings",
    ] {
        assert!(v["cpus"][0].get(key).is_some(), "{name}: cpus[].{key}");
    }
    t
}

#[test]
fn this_machine() {
    let t = check(
        "this-machine",
        Want {
            nodes: &[0],
            node_cpus: &["0-1"],
            cpus: 2,
            online: 2,
            distances: &[&[10]],
            siblings: &[(0, "0"), (1, "1")],
            l3_groups: &["0-1"],
            devices: &[
                ("0000:00:00.0", DeviceClass::Other, None),
                ("0000:00:01.0", DeviceClass::Other, None),
                ("0000:00:02.0", DeviceClass::Other, None),
                ("0000:00:03.0", DeviceClass::Nic, None),
                ("0000:00:04.0", DeviceClass::Other, None),
                ("0000:00:05.0", DeviceClass::Other, None),
            ],
        },
    );
    assert!(t.nodes[0].memory_total_bytes > 1 << 30);
    assert_eq!(t.nodes[0].hugepages.len(), 2);
}

#[test]
fn intel_snc() {
    let t = check(
        "intel-snc",
        Want {
            nodes: &[0, 1, 2, 3],
            node_cpus: &[
                "0-2,5-6,10-12,15-16,40-42,45-46,50-52,55-56",
                "3-4,7-9,13-14,17-19,43-44,47-49,53-54,57-59",
                "20-22,25-26,30-32,35-36,60-62,65-66,70-72,75-76",
                "23-24,27-29,33-34,37-39,63-64,67-69,73-74,77-79",
            ],
            cpus: 80,
            online: 80,
            distances: &[
                &[10, 11, 21, 21],
                &[11, 10, 21, 21],
                &[21, 21, 10, 11],
                &[21, 21, 11, 10],
            ],
            siblings: &[(0, "0,40"), (59, "19,59"), (20, "20,60")],
            // One L3 per socket, spanning both SNC nodes.
            l3_groups: &["0-19,40-59", "20-39,60-79"],
            devices: &[
                ("0000:17:00.0", DeviceClass::Nic, Some(0)),
                ("0000:85:00.0", DeviceClass::Nvme, Some(2)),
            ],
        },
    );
    let c = t.cpu(79).unwrap();
    assert_eq!((c.socket, c.die, c.core, c.node), (1, 1, 29, Some(3)));
    assert_eq!(t.nodes[1].hugepages["2048kB"].free, 499);
}

#[test]
fn epyc_nps4() {
    let far = |n: u32| -> Vec<u32> {
        (0..8)
            .map(|o| {
                if o == n {
                    10
                } else if o / 4 == n / 4 {
                    12
                } else {
                    32
                }
            })
            .collect()
    };
    let rows: Vec<Vec<u32>> = (0..8).map(far).collect();
    let row_refs: Vec<&[u32]> = rows.iter().map(|r| r.as_slice()).collect();
    let node_cpus: Vec<String> = (0..8)
        .map(|n| format!("{}-{},{}-{}", n * 8, n * 8 + 7, 64 + n * 8, 64 + n * 8 + 7))
        .collect();
    let node_refs: Vec<&str> = node_cpus.iter().map(|s| s.as_str()).collect();
    let l3: Vec<String> = (0..16)
        .map(|x| format!("{}-{},{}-{}", x * 4, x * 4 + 3, 64 + x * 4, 64 + x * 4 + 3))
        .collect();
    let l3_refs: Vec<&str> = l3.iter().map(|s| s.as_str()).collect();
    let t = check(
        "epyc-nps4",
        Want {
            nodes: &[0, 1, 2, 3, 4, 5, 6, 7],
            node_cpus: &node_refs,
            cpus: 128,
            online: 128,
            distances: &row_refs,
            siblings: &[(0, "0,64"), (127, "63,127")],
            l3_groups: &l3_refs,
            devices: &[("0000:c1:00.0", DeviceClass::Nic, Some(1))],
        },
    );
    assert_eq!(t.cpu(100).unwrap().l3, Some(36));
    assert_eq!(t.distance(3, 4), 32);
}

#[test]
fn kunpeng920() {
    let t = check(
        "kunpeng920",
        Want {
            nodes: &[0, 1, 2, 3],
            node_cpus: &["0-23", "24-47", "48-71", "72-95"],
            cpus: 96,
            online: 96,
            distances: &[
                &[10, 12, 20, 22],
                &[12, 10, 22, 24],
                &[20, 22, 10, 12],
                &[22, 24, 12, 10],
            ],
            siblings: &[(0, "0"), (95, "95")],
            l3_groups: &["0-23", "24-47", "48-71", "72-95"],
            devices: &[
                ("0000:7d:00.0", DeviceClass::Nic, Some(0)),
                ("0000:bd:00.0", DeviceClass::Nic, Some(2)),
            ],
        },
    );
    // No die_id on arm64: die = socket.
    let c = t.cpu(50).unwrap();
    assert_eq!((c.socket, c.die), (1, 1));
    assert_eq!(t.nodes[0].hugepages.len(), 4);
    // CPU clusters of four cores (topology/cluster_cpus_list), keyed by their first CPU.
    let mut clusters: std::collections::BTreeMap<u32, CpuSet> = Default::default();
    for c in &t.cpus {
        clusters
            .entry(c.cluster.expect("every Kunpeng CPU has a cluster"))
            .or_default()
            .insert(c.id);
    }
    assert_eq!(clusters.len(), 24);
    assert_eq!(clusters[&48].to_string(), "48-51");
    assert!(clusters
        .iter()
        .all(|(k, s)| s.len() == 4 && s.first() == Some(*k)));
}

#[test]
fn machines_without_cluster_files_have_no_clusters() {
    for name in [
        "intel-snc",
        "epyc-nps4",
        "gpu-nic",
        "small-snc",
        "cxl-offline",
    ] {
        let t = sysfs::read(&fixture(name)).unwrap();
        assert!(t.cpus.iter().all(|c| c.cluster.is_none()), "{name}");
    }
}

#[test]
fn cxl_offline() {
    let t = check(
        "cxl-offline",
        Want {
            nodes: &[0, 2],
            node_cpus: &["0-6,8-13", ""],
            cpus: 16,
            online: 13,
            distances: &[&[10, 24], &[26, 10]],
            // The kernel drops offline CPUs from sibling masks.
            siblings: &[(6, "6"), (5, "5,13"), (14, "14")],
            l3_groups: &["0-6,8-13"],
            devices: &[("0000:0d:00.0", DeviceClass::Other, Some(2))],
        },
    );
    let off: Vec<(u32, Option<u32>, bool)> = t
        .cpus
        .iter()
        .filter(|c| !c.online)
        .map(|c| (c.id, c.node, c.l3.is_some()))
        .collect();
    // 7 and 14 keep their node through the node0/cpuN links; 15's node is offline: no link.
    assert_eq!(
        off,
        vec![(7, Some(0), false), (14, Some(0), false), (15, None, false)]
    );
    assert_eq!(t.nodes[1].memory_total_bytes, 256 << 30);
    assert_eq!(t.distance(0, 2), 24);
    assert_eq!(t.distance(2, 0), 26);
}

#[test]
fn gpu_nic() {
    check(
        "gpu-nic",
        Want {
            nodes: &[0, 1],
            node_cpus: &["0-7,16-23", "8-15,24-31"],
            cpus: 32,
            online: 32,
            distances: &[&[10, 21], &[21, 10]],
            siblings: &[(3, "3,19")],
            l3_groups: &["0-7,16-23", "8-15,24-31"],
            devices: &[
                ("0000:00:00.0", DeviceClass::Other, None),
                ("0000:02:00.0", DeviceClass::Gpu, None),
                ("0000:03:00.0", DeviceClass::Nvme, Some(0)),
                ("0000:ca:00.0", DeviceClass::Gpu, Some(1)),
                ("0000:cb:00.0", DeviceClass::Gpu, Some(1)),
                ("0000:cc:00.0", DeviceClass::Nic, Some(1)),
                ("0000:cc:00.1", DeviceClass::Nic, Some(1)),
            ],
        },
    );
}

/// Copies a fixture into a tempdir (following symlinks for files, recreating links as links).
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let (src, dst) = (e.path(), to.join(e.file_name()));
        let ft = e.file_type().unwrap();
        if ft.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&src).unwrap(), &dst).unwrap();
        } else if ft.is_dir() {
            copy_tree(&src, &dst);
        } else {
            std::fs::copy(&src, &dst).unwrap();
        }
    }
}

/// Breaks one file of a fixture copy (`None` removes it), checks the error names it, restores
/// the file, and returns the error text. One copy per fixture serves every case.
fn broken(copies: &mut Copies, name: &str, rel: &str, content: Option<&str>) -> String {
    let root = copies.entry(name.to_string()).or_insert_with(|| {
        let dir = tempfile::tempdir().unwrap();
        copy_tree(&fixture(name), dir.path());
        dir
    });
    let p = root.path().join(rel);
    let original = std::fs::read(&p).unwrap();
    match content {
        Some(c) => std::fs::write(&p, c).unwrap(),
        None => std::fs::remove_file(&p).unwrap(),
    }
    let result = sysfs::read(root.path());
    std::fs::write(&p, original).unwrap();
    let text = format!("{:#}", result.expect_err(rel));
    assert!(text.contains(rel), "error {text:?} should name {rel}");
    text
}

type Copies = std::collections::HashMap<String, tempfile::TempDir>;

#[test]
fn malformed_files_are_errors_naming_the_file() {
    let c = &mut Copies::new();
    // (fixture, file, new content or None to delete, text the error must also hold)
    let table: &[(&str, &str, Option<&str>, &str)] = &[
        (
            "gpu-nic",
            "devices/system/node/node1/cpulist",
            Some("8-15,24-\n"),
            "cpulist",
        ),
        (
            "gpu-nic",
            "devices/system/node/node1/distance",
            Some("21 1x\n"),
            "\"1x\"",
        ),
        (
            "gpu-nic",
            "devices/system/node/node1/distance",
            Some("21\n"),
            "1 distance(s) for 2",
        ),
        (
            "gpu-nic",
            "devices/system/node/node1/meminfo",
            None,
            "cannot read",
        ),
        (
            "gpu-nic",
            "devices/system/node/node1/meminfo",
            Some("Node 1 MemTot"),
            "MemTotal",
        ),
        (
            "gpu-nic",
            "devices/system/node/node1/hugepages/hugepages-2048kB/nr_hugepages",
            Some(""),
            "integer",
        ),
        (
            "cxl-offline",
            "devices/system/cpu/cpu5/topology/core_id",
            None,
            "cannot read",
        ),
        (
            "cxl-offline",
            "devices/system/cpu/cpu5/topology/physical_package_id",
            Some("x\n"),
            "integer",
        ),
        (
            "cxl-offline",
            "devices/system/cpu/cpu9/cache/index3/shared_cpu_list",
            Some("0-6,8-"),
            "cpulist",
        ),
        (
            "cxl-offline",
            "devices/system/cpu/online",
            Some("0-6,8-13,\n"),
            "cpulist",
        ),
        (
            "cxl-offline",
            "devices/system/cpu/online",
            None,
            "cannot read",
        ),
    ];
    for &(name, rel, content, also) in table {
        let e = broken(c, name, rel, content);
        assert!(
            e.contains(also),
            "{name} {rel}: {e:?} should mention {also:?}"
        );
    }
}

#[test]
fn a_bad_optional_pci_file_skips_only_that_device() {
    let dir = tempfile::tempdir().unwrap();
    copy_tree(&fixture("gpu-nic"), dir.path());
    std::fs::write(
        dir.path().join("bus/pci/devices/0000:ca:00.0/numa_node"),
        "one\n",
    )
    .unwrap();
    let t = sysfs::read(dir.path()).unwrap();
    assert_eq!(t.devices.len(), 6);
    assert!(t.devices.iter().all(|d| d.address != "0000:ca:00.0"));
}

#[test]
fn non_numa_kernel_gets_a_synthetic_node_0() {
    let dir = tempfile::tempdir().unwrap();
    copy_tree(&fixture("gpu-nic"), dir.path());
    std::fs::remove_dir_all(dir.path().join("devices/system/node")).unwrap();
    let t = sysfs::read(dir.path()).unwrap();
    assert_eq!(t.nodes.len(), 1);
    assert_eq!(t.nodes[0].cpus.len(), 32);
    assert_eq!(t.nodes[0].distances, vec![10]);
    assert!(t.cpus.iter().all(|c| c.node == Some(0)));
}

#[test]
fn older_kernel_without_die_id_or_thread_siblings_list() {
    let dir = tempfile::tempdir().unwrap();
    copy_tree(&fixture("gpu-nic"), dir.path());
    let topo = dir.path().join("devices/system/cpu/cpu29/topology");
    std::fs::remove_file(topo.join("die_id")).unwrap();
    std::fs::remove_file(topo.join("thread_siblings_list")).unwrap();
    let t = sysfs::read(dir.path()).unwrap();
    let c = t.cpu(29).unwrap();
    assert_eq!((c.socket, c.die), (1, 1));
    assert_eq!(c.siblings.to_string(), "13,29"); // from core_cpus_list
}

#[test]
fn l3_is_found_by_level_not_index_number() {
    let dir = tempfile::tempdir().unwrap();
    copy_tree(&fixture("gpu-nic"), dir.path());
    let cache = dir.path().join("devices/system/cpu/cpu30/cache");
    std::fs::rename(cache.join("index3"), cache.join("index7")).unwrap();
    std::fs::write(cache.join("index2/level"), "3\n").unwrap();
    std::fs::write(cache.join("index2/shared_cpu_list"), "28-31\n").unwrap();
    std::fs::write(cache.join("index7/level"), "4\n").unwrap();
    let t = sysfs::read(dir.path()).unwrap();
    assert_eq!(t.cpu(30).unwrap().l3, Some(28));
}

#[test]
fn real_sys_reads_when_present() {
    if !Path::new("/sys/devices/system/cpu/online").exists() {
        println!("SKIP: no /sys on this machine");
        return;
    }
    let t = sysfs::read(Path::new("/sys")).unwrap();
    assert!(!t.nodes.is_empty());
    assert!(!t.online_cpus().is_empty());
}

#[test]
fn cli_prints_every_fixture_as_table_and_json() {
    let exe = env!("CARGO_BIN_EXE_rebalancer");
    for (name, nodes) in [
        ("this-machine", 1),
        ("intel-snc", 4),
        ("epyc-nps4", 8),
        ("kunpeng920", 4),
        ("cxl-offline", 2),
        ("gpu-nic", 2),
    ] {
        let root = fixture(name);
        let out = std::process::Command::new(exe)
            .args(["topology", "--json", "--sysfs-root"])
            .arg(&root)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["nodes"].as_array().unwrap().len(), nodes, "{name}");
        let out = std::process::Command::new(exe)
            .args(["topology", "--sysfs-root"])
            .arg(&root)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{name}");
        assert!(
            text.starts_with(&format!("{nodes} NUMA node(s)")),
            "{name}: {text}"
        );
        // Only the Kunpeng fixture has CPU clusters (six per node).
        assert_eq!(
            text.contains("CPU clusters node 0: 6, node 1: 6, node 2: 6, node 3: 6"),
            name == "kunpeng920",
            "{name}: {text}"
        );
        assert_eq!(
            v["cpus"][0].get("cluster").is_some(),
            name == "kunpeng920",
            "{name}: JSON cluster field"
        );
    }
    // A missing root is an error naming the file, not a panic.
    let out = std::process::Command::new(exe)
        .args(["topology", "--sysfs-root", "/nonexistent-sysfs"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("/nonexistent-sysfs/devices/system/cpu/online"),
        "{err}"
    );
}

/// Every file below `dir` as (relative path, content or link target).
fn tree(dir: &Path) -> std::collections::BTreeMap<PathBuf, String> {
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let rel = e.path().strip_prefix(dir).unwrap().to_path_buf();
            let ft = e.file_type().unwrap();
            if ft.is_symlink() {
                out.insert(
                    rel,
                    format!("-> {}", std::fs::read_link(e.path()).unwrap().display()),
                );
            } else if ft.is_dir() {
                stack.push(e.path());
            } else {
                out.insert(rel, std::fs::read_to_string(e.path()).unwrap());
            }
        }
    }
    out
}

#[test]
fn generator_reproduces_the_committed_fixtures() {
    let script = fixture("../gen_fixtures.py");
    let out = tempfile::tempdir().unwrap();
    let status = std::process::Command::new("python3")
        .arg(&script)
        .arg(out.path())
        .output();
    let Ok(status) = status else {
        println!("SKIP: python3 not available");
        return;
    };
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    for name in [
        "intel-snc",
        "epyc-nps4",
        "kunpeng920",
        "cxl-offline",
        "gpu-nic",
    ] {
        assert!(
            tree(&out.path().join(name)) == tree(&fixture(name)),
            "{name}: gen_fixtures.py output differs from the committed fixture"
        );
    }
}

#[test]
fn capture_script_copies_what_the_reader_needs() {
    // cxl-offline: the odd parts (offline CPUs, a dangling node link, a CPU-less node).
    let script = fixture("../capture-sysfs.sh");
    let out = tempfile::tempdir().unwrap();
    let dest = out.path().join("copy");
    let st = std::process::Command::new("sh")
        .arg(&script)
        .arg(&dest)
        .arg(fixture("cxl-offline"))
        .output()
        .unwrap();
    assert!(
        st.status.success(),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
    let original = sysfs::read(&fixture("cxl-offline")).unwrap();
    assert_eq!(
        original,
        sysfs::read(&dest).unwrap(),
        "captured copy differs"
    );
}

#[test]
fn without_node_online_the_node_directories_are_used() {
    let dir = tempfile::tempdir().unwrap();
    copy_tree(&fixture("cxl-offline"), dir.path());
    std::fs::remove_file(dir.path().join("devices/system/node/online")).unwrap();
    let t = sysfs::read(dir.path()).unwrap();
    assert_eq!(t.node_ids().collect::<Vec<_>>(), vec![0, 2]);
    assert_eq!(t.distance(2, 0), 26);
}

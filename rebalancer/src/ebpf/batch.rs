//! Batched reads of per-CPU hash maps: `BPF_MAP_LOOKUP_BATCH` (Linux 5.6+) through the map's
//! fd, one syscall per chunk of entries instead of one get_next_key + one lookup per entry
//! (aya 0.14 has no API for batch operations). [`read_percpu`] returns `Ok(None)` when the
//! kernel does not know the command, so the caller falls back to aya's per-entry iteration.
//! The decoding of the kernel's buffers is pure ([`decode`]) and unit-tested.

use std::{io, mem::size_of, os::fd::AsRawFd, os::fd::BorrowedFd};

use aya::Pod;

/// `enum bpf_cmd`: BPF_MAP_LOOKUP_BATCH.
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
/// The kernel's internal ENOTSUPP (not in libc).
const ENOTSUPP: i32 = 524;
/// Entries asked for per syscall (grown when a hash bucket holds more than that).
const CHUNK: usize = 4096;

/// The `batch` member of `union bpf_attr` (BPF_MAP_*_BATCH commands).
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

/// Size of one CPU's slot of a per-CPU value: the kernel rounds each up to 8 bytes.
pub const fn percpu_stride<V>() -> usize {
    size_of::<V>().div_ceil(8) * 8
}

/// Decodes `n` keys and per-CPU values (`ncpus` slots of [`percpu_stride`] bytes each) from
/// the kernel's buffers.
pub fn decode<K: Pod, V: Pod>(
    keys: &[u8],
    values: &[u8],
    n: usize,
    ncpus: usize,
) -> Vec<(K, Vec<V>)> {
    let (ks, vs) = (size_of::<K>(), percpu_stride::<V>());
    let n = n
        .min(keys.len() / ks.max(1))
        .min(values.len() / (vs * ncpus).max(1));
    (0..n)
        .map(|i| {
            // SAFETY: K and V are Pod (any bit pattern is valid); the reads are in bounds by
            // the `n` computed above and unaligned reads need no alignment.
            let k = unsafe { std::ptr::read_unaligned(keys[i * ks..].as_ptr().cast::<K>()) };
            let vals = (0..ncpus)
                .map(|c| {
                    let off = (i * ncpus + c) * vs;
                    unsafe { std::ptr::read_unaligned(values[off..].as_ptr().cast::<V>()) }
                })
                .collect();
            (k, vals)
        })
        .collect()
}

/// Entries of a per-CPU map: each key with its value on every possible CPU.
pub type PerCpuEntries<K, V> = Vec<(K, Vec<V>)>;

/// Every entry of the per-CPU hash map behind `fd` (key type `K`, per-CPU value type `V`,
/// `ncpus` = possible CPUs), by batches. `Ok(None)`: the kernel has no batch lookup for it.
pub fn read_percpu<K: Pod, V: Pod>(
    fd: BorrowedFd<'_>,
    ncpus: usize,
) -> io::Result<Option<PerCpuEntries<K, V>>> {
    let (ks, vs) = (size_of::<K>(), percpu_stride::<V>() * ncpus.max(1));
    let mut chunk = CHUNK;
    let mut keys = vec![0u8; chunk * ks];
    let mut values = vec![0u8; chunk * vs];
    let mut out = Vec::new();
    let mut token_in = 0u64;
    let mut token_out = 0u64;
    let mut first = true;
    loop {
        let mut attr = BatchAttr {
            in_batch: if first {
                0
            } else {
                std::ptr::addr_of!(token_in) as u64
            },
            out_batch: std::ptr::addr_of_mut!(token_out) as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: chunk as u32,
            map_fd: fd.as_raw_fd() as u32,
            ..BatchAttr::default()
        };
        // SAFETY: attr points at buffers of `chunk` keys and values, alive for the call; the
        // kernel writes at most `count` entries and the token.
        let r = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_LOOKUP_BATCH,
                std::ptr::addr_of_mut!(attr),
                size_of::<BatchAttr>() as u32,
            )
        };
        let err = (r < 0).then(io::Error::last_os_error);
        let n = attr.count as usize;
        match err.as_ref().and_then(io::Error::raw_os_error) {
            None => {}
            Some(libc::ENOENT) => {
                out.extend(decode::<K, V>(&keys, &values, n, ncpus));
                return Ok(Some(out));
            }
            Some(libc::ENOSPC) if n == 0 && chunk < (1 << 22) => {
                // One hash bucket holds more entries than `chunk`: ask for more at once.
                chunk *= 4;
                keys.resize(chunk * ks, 0);
                values.resize(chunk * vs, 0);
                continue;
            }
            Some(libc::EINVAL) | Some(libc::EOPNOTSUPP) | Some(ENOTSUPP) if first => {
                return Ok(None)
            }
            Some(_) => return Err(err.unwrap_or_else(|| io::Error::other("bpf"))),
        }
        out.extend(decode::<K, V>(&keys, &values, n, ncpus));
        token_in = token_out;
        first = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rebalancer_common::{CgEvents, CgNodeKey};

    fn bytes<T: Pod>(t: &T) -> Vec<u8> {
        // SAFETY: Pod values are plain bytes.
        unsafe { std::slice::from_raw_parts((t as *const T).cast::<u8>(), size_of::<T>()) }.to_vec()
    }

    #[test]
    fn decodes_keys_and_padded_per_cpu_slots() {
        assert_eq!(percpu_stride::<u64>(), 8);
        assert_eq!(percpu_stride::<[u8; 12]>(), 16);
        assert_eq!(percpu_stride::<CgEvents>() % 8, 0);
        let key = |id, node| CgNodeKey {
            cgroup_id: id,
            node,
            _pad: 0,
        };
        let (k1, k2) = (key(7, 1), key(9, 0));
        let keys = [bytes(&k1), bytes(&k2), vec![0xff; size_of::<CgNodeKey>()]].concat();
        // Two entries × 3 CPUs of u64, then garbage beyond `n`.
        let values: Vec<u8> = [1u64, 2, 3, 10, 20, 30, 99, 99, 99]
            .iter()
            .flat_map(|v| v.to_ne_bytes())
            .collect();
        let got = decode::<CgNodeKey, u64>(&keys, &values, 2, 3);
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].0.cgroup_id, got[0].0.node), (7, 1));
        assert_eq!(got[0].1, vec![1, 2, 3]);
        assert_eq!((got[1].0.cgroup_id, got[1].0.node), (9, 0));
        assert_eq!(got[1].1, vec![10, 20, 30]);
        // A count larger than the buffers is clamped, never read past them.
        assert_eq!(decode::<CgNodeKey, u64>(&keys, &values, 100, 3).len(), 3);
        assert_eq!(
            decode::<CgNodeKey, u64>(&keys, &values[..47], 100, 3).len(),
            1
        );
        // A 12-byte value occupies a 16-byte slot per CPU.
        let v12: Vec<u8> = (0u8..32).collect();
        let got = decode::<CgNodeKey, [u8; 12]>(&keys, &v12, 1, 2);
        assert_eq!(got[0].1[0], core::array::from_fn(|i| i as u8));
        assert_eq!(got[0].1[1], core::array::from_fn(|i| 16 + i as u8));
    }
}

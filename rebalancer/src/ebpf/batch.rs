//! Batched reads of hash maps: `BPF_MAP_LOOKUP_BATCH` (Linux 5.6+) through the map's fd, one
//! syscall per chunk of entries instead of one get_next_key + one lookup per entry (aya 0.14
//! has no API for batch operations). [`read_hash`] returns `Ok(None)` when the kernel does not
//! know the command, so the caller falls back to aya's per-entry iteration, which can return a
//! key twice (the kernel restarts from the first bucket when the current key was evicted):
//! [`last_per_key`] keeps one value per key. The decoding of the kernel's buffers is pure
//! ([`decode`]) and unit-tested.

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

/// Decodes `n` keys and values (`size_of::<V>()` bytes each, as the kernel copies a shared
/// hash map's values) from the kernel's buffers.
pub fn decode<K: Pod, V: Pod>(keys: &[u8], values: &[u8], n: usize) -> Vec<(K, V)> {
    let (ks, vs) = (size_of::<K>(), size_of::<V>());
    let n = n.min(keys.len() / ks.max(1)).min(values.len() / vs.max(1));
    (0..n)
        .map(|i| {
            // SAFETY: K and V are Pod (any bit pattern is valid); the reads are in bounds by
            // the `n` computed above and unaligned reads need no alignment.
            let k = unsafe { std::ptr::read_unaligned(keys[i * ks..].as_ptr().cast::<K>()) };
            let v = unsafe { std::ptr::read_unaligned(values[i * vs..].as_ptr().cast::<V>()) };
            (k, v)
        })
        .collect()
}

/// One entry per key, the last one read winning (a key read twice was read again after an
/// eviction restarted the walk: the later value is the newer).
pub fn last_per_key<K: Ord + Copy, V>(entries: Vec<(K, V)>) -> Vec<(K, V)> {
    let last: std::collections::BTreeMap<K, V> = entries.into_iter().collect();
    last.into_iter().collect()
}

/// Every entry of the (shared, not per-CPU) hash map behind `fd`, by batches. `Ok(None)`: the
/// kernel has no batch lookup for it.
pub fn read_hash<K: Pod, V: Pod>(fd: BorrowedFd<'_>) -> io::Result<Option<Vec<(K, V)>>> {
    let (ks, vs) = (size_of::<K>(), size_of::<V>());
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
                out.extend(decode::<K, V>(&keys, &values, n));
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
        out.extend(decode::<K, V>(&keys, &values, n));
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
    fn decodes_keys_and_values_and_never_reads_past_the_buffers() {
        let key = |id, node| CgNodeKey {
            cgroup_id: id,
            node,
            _pad: 0,
        };
        let (k1, k2) = (key(7, 1), key(9, 0));
        let keys = [bytes(&k1), bytes(&k2), vec![0xff; size_of::<CgNodeKey>()]].concat();
        let values: Vec<u8> = [1u64, 10, 99]
            .iter()
            .flat_map(|v| v.to_ne_bytes())
            .collect();
        let got = decode::<CgNodeKey, u64>(&keys, &values, 2);
        assert_eq!(got, vec![(k1, 1), (k2, 10)]);
        // A count larger than the buffers is clamped, never read past them.
        assert_eq!(decode::<CgNodeKey, u64>(&keys, &values, 100).len(), 3);
        assert_eq!(decode::<CgNodeKey, u64>(&keys, &values[..15], 100).len(), 1);
        // Values are packed at their own size (a shared map's value is not padded).
        let ev = CgEvents {
            migrations: 3,
            local_events: 5,
            ..CgEvents::default()
        };
        let evs = [bytes(&ev), bytes(&CgEvents::default())].concat();
        let got = decode::<CgNodeKey, CgEvents>(&keys, &evs, 2);
        assert_eq!(got, vec![(k1, ev), (k2, CgEvents::default())]);
    }

    #[test]
    fn a_key_read_twice_is_counted_once_with_its_last_value() {
        let got = last_per_key(vec![(3u64, 30u64), (1, 10), (3, 31), (2, 20), (1, 11)]);
        assert_eq!(got, vec![(1, 11), (2, 20), (3, 31)]);
    }
}

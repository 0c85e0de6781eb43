//! One daemon per state directory: an exclusive `flock(2)` on `<state_dir>/lock`, taken before
//! anything else at start-up (before the listeners, the AutoNUMA switch, the checkpoint) and held
//! until the process exits. The lock file holds the holder's pid, so a second daemon names it.
//! The kernel drops the lock when the holder dies, even by SIGKILL: there is no stale state.

use std::{
    fs::File,
    io::{Read, Seek, Write},
    os::unix::fs::{DirBuilderExt, OpenOptionsExt},
    os::unix::io::AsRawFd,
    path::{Path, PathBuf},
};

pub const LOCK_FILE: &str = "lock";

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("another rebalancer ({holder}) is running on state directory {dir}: it holds {path}; refusing to start a second daemon (two would write the same cpusets)")]
    Held {
        dir: PathBuf,
        path: PathBuf,
        holder: String,
    },
    #[error("cannot lock {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Held for the daemon's lifetime; dropping it (or exiting) releases the lock.
#[derive(Debug)]
pub struct InstanceLock {
    _file: File,
    pub path: PathBuf,
}

/// Takes the lock of `state_dir` (created 0700 if missing) or says who holds it.
pub fn acquire(state_dir: &Path) -> Result<InstanceLock, LockError> {
    let path = state_dir.join(LOCK_FILE);
    let io = |source| LockError::Io {
        path: path.clone(),
        source,
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(state_dir)
        .map_err(io)?;
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&path)
        .map_err(io)?;
    // SAFETY: flock on an fd we own.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(io(e));
        }
        let mut s = String::new();
        let _ = f.read_to_string(&mut s);
        let holder =
            (s.trim().parse::<u32>()).map_or("a process".into(), |pid| format!("pid {pid}"));
        return Err(LockError::Held {
            dir: state_dir.to_path_buf(),
            path,
            holder,
        });
    }
    f.set_len(0).map_err(io)?;
    f.rewind().map_err(io)?;
    writeln!(f, "{}", std::process::id()).map_err(io)?;
    Ok(InstanceLock { _file: f, path })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_the_same_dir_is_refused_naming_the_holder() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("state");
        let first = acquire(&dir).unwrap();
        // flock locks belong to the open file description: a second open in this process
        // conflicts exactly as a second daemon would.
        let err = acquire(&dir).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("pid {}", std::process::id())),
            "{msg}"
        );
        assert!(msg.contains("refusing to start a second daemon"), "{msg}");
        drop(first);
        acquire(&dir).expect("released with its holder");
    }
}

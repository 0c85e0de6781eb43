//! Reads a [`Topology`] from a sysfs tree whose root is passed in (stands for `/sys`).
use std::path::{Path, PathBuf};

use super::Topology;

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

/// Reads the topology below `root` (a directory standing for `/sys`).
pub fn read(root: &Path) -> Result<Topology, TopologyError> {
    // Placeholder until the sysfs reader lands (issue 2).
    Err(TopologyError::Malformed {
        path: root.to_path_buf(),
        message: "sysfs reader not written yet".into(),
    })
}

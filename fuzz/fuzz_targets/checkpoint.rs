//! The checkpoint loader on arbitrary bytes: an error or the data, never a panic; what loads
//! saves and loads back equal.
#![no_main]
use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use rebalancer::{checkpoint, daemon::Persisted};

thread_local! {
    static DIR: tempfile::TempDir = tempfile::tempdir().expect("temp dir");
}

fuzz_target!(|data: &[u8]| {
    DIR.with(|d| {
        let path = d.path().join(checkpoint::FILE_NAME);
        std::fs::write(&path, data).unwrap();
        // the daemon's state type, and a generic one that reaches the checksum path more often
        if let Ok(Some(a)) = checkpoint::load::<Persisted>(d.path()) {
            // (a checkpoint holds only JSON-representable floats, so the round trip is exact)
            checkpoint::save(d.path(), &a).unwrap();
            let back = checkpoint::load::<Persisted>(d.path()).unwrap();
            assert_eq!(back.as_ref(), Some(&a));
            std::fs::write(&path, data).unwrap();
        }
        if let Ok(Some(v)) = checkpoint::load::<BTreeMap<String, serde_json::Value>>(d.path()) {
            checkpoint::save(d.path(), &v).unwrap();
            let back = checkpoint::load::<BTreeMap<String, serde_json::Value>>(d.path()).unwrap();
            assert_eq!(back.as_ref(), Some(&v));
        }
    });
});

//! The Memory Manager case parser of `rebalancer hints memory` (one JSON case) and the
//! operation it runs.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rebalancer::placement::memory_case;

fuzz_target!(|data: &[u8]| {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    match memory_case::parse_case(&v) {
        Ok(case) => {
            let _ = memory_case::outcome_json(&case.evaluate());
        }
        Err(e) => {
            let _ = memory_case::error_line(0, &e);
        }
    }
});

//! The hint-merge case parser of `rebalancer hints` (one JSON case) and the merge it feeds.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rebalancer::placement::merge_case;

fuzz_target!(|data: &[u8]| {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    match merge_case::parse_case(&v) {
        Ok(case) => {
            let d = case.decide();
            let _ = merge_case::decision_json(&d);
        }
        Err(e) => {
            let _ = merge_case::error_json(0, &e);
        }
    }
});

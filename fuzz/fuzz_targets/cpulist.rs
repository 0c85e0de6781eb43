//! Kernel cpulist parsing (`CpuSet::parse`): never a panic, and parse ∘ format ∘ parse = parse.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rebalancer::cpuset::CpuSet;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(set) = CpuSet::parse(&text) {
        let formatted = set.to_cpulist();
        let again = CpuSet::parse(&formatted)
            .unwrap_or_else(|e| panic!("formatted {formatted:?} does not parse: {e}"));
        assert_eq!(again, set, "round trip of {text:?} via {formatted:?}");
        assert_eq!(again.len(), set.iter().count());
        // the JSON form (int array) round-trips too
        let json = serde_json::to_string(&set).unwrap();
        let back: CpuSet = serde_json::from_str(&json).unwrap();
        assert_eq!(back, set);
    }
});

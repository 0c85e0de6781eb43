//! The TOML config loader (`Config::parse`: deserialise + validate). A config that loads must
//! also give a usable reserved-CPU set.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rebalancer::config::Config;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(c) = Config::parse(&text, "fuzz.toml") {
        let _ = c.reserved_cpus();
    }
});

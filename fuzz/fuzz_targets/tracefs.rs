//! tracefs `events/<cat>/<name>/format` parsing and print-fmt symbol tables.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rebalancer::ebpf::tracefs;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let f = tracefs::parse_format(&text);
    for field in &f.fields {
        let _ = f.offset(&field.name, field.size);
        let _ = tracefs::print_symbolic(&f.print_fmt, &field.name);
    }
    let _ = tracefs::print_symbolic(&text, "type");
});

//! Building this crate needs the `bpf-linker` binary; rebuild when it changes.
fn main() {
    match which::which("bpf-linker") {
        Ok(p) => println!("cargo:rerun-if-changed={}", p.display()),
        Err(e) => panic!("bpf-linker not found ({e}); run `cargo xtask setup`"),
    }
}

//! CRI's `api.proto` (Debian's golang-github-kubernetes-cri-api-dev 0.32.3, its gogoproto
//! options removed) compiled with protox (no protoc needed); client stubs only.
fn main() -> anyhow::Result<()> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/proto");
    println!("cargo:rerun-if-changed={dir}/api.proto");
    let fds = protox::compile(["api.proto"], [dir])?;
    tonic_prost_build::configure()
        .build_server(false)
        .compile_fds(fds)?;
    Ok(())
}

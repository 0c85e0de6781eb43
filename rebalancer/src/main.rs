//! The `rebalancer` binary: parses the command line and hands over to `rebalancer::cli`.
fn main() -> std::process::ExitCode {
    rebalancer::cli::main()
}

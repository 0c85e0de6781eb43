//! One module per CLI subcommand: its clap arguments and the code that runs it (I/O at the edge,
//! the work in the library modules).
pub mod admit;
pub mod hints;
pub mod plan;
pub mod probe;
pub mod run;
pub mod sample;
pub mod simulate;
pub mod top;
pub mod topology;
pub mod uninstall;

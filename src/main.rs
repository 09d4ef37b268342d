//! The `tokensaver` binary: the command line lives in the library ([`tokensaver::cli`]).

use std::process::ExitCode;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    tokensaver::cli::main()
}

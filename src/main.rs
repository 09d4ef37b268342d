//! The `tokensaver` binary: the command line lives in the library ([`tokensaver::cli`]).

use std::process::ExitCode;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    no_transparent_huge_pages();
    tokensaver::cli::main()
}

/// mimalloc asks for transparent huge pages on its arenas (`MADV_HUGEPAGE`), so each first
/// touch of a fresh 2 MiB region zeroes all of it inside one page fault, on the request that
/// touched it: as the answer store and the gate's tables fill, one request in about a thousand
/// at concurrency 1 waited milliseconds in `clear_page` (`benches/load/tail-profile.sh`,
/// docs/performance.md). Without them the p99.9 at concurrency 1 halves and the median does
/// not move. What mimalloc's own `MIMALLOC_ALLOW_THP=0` does, for the whole process.
fn no_transparent_huge_pages() {
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_THP_DISABLE sets a flag on this process's memory map; no pointers.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}

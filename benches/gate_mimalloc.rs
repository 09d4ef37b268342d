//! The gate benchmark (`gate.rs`) with mimalloc, the `tokensaver` binary's global allocator,
//! in both arms: `cargo bench --bench gate_mimalloc`.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "gate.rs"]
mod gate;

fn main() {
    gate::run("gate_mimalloc");
}

//! Build identity for the economics evidence: BLAKE3 over the sources this binary is built
//! from (`src/**`, the workspace crates `crates/**` — the mock provider included, whose
//! replies the simulated evidence records —, `Cargo.toml`, `Cargo.lock`,
//! `config/prices-builtin.toml`), exported as
//! `TOKENSAVER_SOURCE_BLAKE3`. Evidence recorded by one build is stale for another whose
//! sources differ (SPEC §6): unlike a commit id it needs no git and ignores uncommitted noise
//! outside the crate, and unlike a binary hash it does not change when the same sources are
//! rebuilt.

use std::path::{Path, PathBuf};

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            files(&p, out);
        } else {
            out.push(p);
        }
    }
}

fn main() {
    let mut all = Vec::new();
    files(Path::new("src"), &mut all);
    files(Path::new("crates"), &mut all);
    for f in ["Cargo.toml", "Cargo.lock", "config/prices-builtin.toml"] {
        all.push(PathBuf::from(f));
    }
    all.sort();
    let mut h = blake3::Hasher::new();
    for p in &all {
        let name = p.to_string_lossy().replace('\\', "/");
        let bytes = std::fs::read(p).unwrap_or_default();
        h.update(&(name.len() as u64).to_le_bytes());
        h.update(name.as_bytes());
        h.update(&(bytes.len() as u64).to_le_bytes());
        h.update(&bytes);
    }
    println!(
        "cargo:rustc-env=TOKENSAVER_SOURCE_BLAKE3={}",
        h.finalize().to_hex()
    );
    for p in [
        "src",
        "crates",
        "Cargo.toml",
        "Cargo.lock",
        "config/prices-builtin.toml",
    ] {
        println!("cargo:rerun-if-changed={p}");
    }
}

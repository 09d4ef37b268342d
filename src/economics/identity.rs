//! What an evidence file was recorded with, so that a summary can tell when it no longer
//! describes this gate (SPEC §6, "any mismatch makes it stale"):
//!
//! * the **build**: BLAKE3 of the crate's sources, computed by `build.rs` at compile time
//!   ([`SOURCE_BLAKE3`]); the same sources rebuilt give the same id, any edit another;
//! * the **gate config**: BLAKE3 of the treatment's effective gate policy ([`gate_policy`]):
//!   everything in a config that can change a decision or a price, and nothing that only
//!   places the gate (listeners, data dir, upstream URLs, key secrets);
//! * the **methodology**: BLAKE3 of `methodology.json`'s bytes;
//! * every **task**: BLAKE3 of its directory (task.json, check, setup, workspace);
//! * the **harness**: BLAKE3 of the scripts that drove the clients.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::model::{BuildInfo, TreatmentKeyDecl};
use crate::config::Config;

/// BLAKE3 of the sources this binary was built from (`build.rs`).
pub const SOURCE_BLAKE3: &str = env!("TOKENSAVER_SOURCE_BLAKE3");

/// The harness's files, relative to the repository root: what `economics run` drives the
/// clients with.
pub const HARNESS_FILES: [&str; 4] = [
    "scripts/economics_harness.py",
    "scripts/economics_tap.py",
    "tests/agents/clients.py",
    "tests/agents/sdk_agent.py",
];

/// This build.
pub fn build(commit: Option<String>) -> BuildInfo {
    BuildInfo {
        source_blake3: SOURCE_BLAKE3.to_string(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        commit,
    }
}

/// BLAKE3 (hex) of a file's bytes.
pub fn file_blake3(path: &Path) -> std::io::Result<String> {
    Ok(blake3::hash(&std::fs::read(path)?).to_hex().to_string())
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
        if matches!(name.as_deref(), Some("__pycache__" | ".DS_Store")) {
            continue;
        }
        if p.is_dir() {
            walk(&p, out)?;
        } else {
            out.push(p);
        }
    }
    Ok(())
}

/// BLAKE3 (hex) over every file under `dir` (sorted relative paths, each path and content
/// length-prefixed, `__pycache__` left out): a task directory's identity.
pub fn dir_blake3(dir: &Path) -> std::io::Result<String> {
    let mut files = Vec::new();
    walk(dir, &mut files)?;
    let mut rel: Vec<(String, PathBuf)> = files
        .into_iter()
        .map(|p| {
            let r = p
                .strip_prefix(dir)
                .map(|r| r.to_string_lossy().replace('\\', "/"))
                .unwrap_or_default();
            (r, p)
        })
        .collect();
    rel.sort();
    let mut h = blake3::Hasher::new();
    for (name, p) in rel {
        let bytes = std::fs::read(&p)?;
        h.update(&(name.len() as u64).to_le_bytes());
        h.update(name.as_bytes());
        h.update(&(bytes.len() as u64).to_le_bytes());
        h.update(&bytes);
    }
    Ok(h.finalize().to_hex().to_string())
}

/// BLAKE3 over the harness's files under `root` (each length-prefixed, in
/// [`HARNESS_FILES`] order); `None` when one is missing (a deployed gate without the scripts).
pub fn harness_blake3(root: &Path) -> Option<String> {
    let mut h = blake3::Hasher::new();
    for f in HARNESS_FILES {
        let bytes = std::fs::read(root.join(f)).ok()?;
        h.update(&(f.len() as u64).to_le_bytes());
        h.update(f.as_bytes());
        h.update(&(bytes.len() as u64).to_le_bytes());
        h.update(&bytes);
    }
    Some(h.finalize().to_hex().to_string())
}

/// The repository root an economics directory sits in (`<root>/corpus/economics`), if the
/// harness is there.
pub fn repo_root(economics_dir: &Path) -> Option<PathBuf> {
    let abs = std::fs::canonicalize(economics_dir).ok()?;
    let root = abs.parent()?.parent()?.to_path_buf();
    root.join(HARNESS_FILES[0]).is_file().then_some(root)
}

/// The treatment's effective gate policy: scoring (weights, saturation, bands, downgrade
/// limits, findings thresholds), the treatment key's profile, attendance and budget, the price
/// table (built-in and config), the downgrade map, and the limits that change what is stored
/// or answered. Listeners, directories, upstreams and secrets are left out: they place the
/// gate, they do not change its decisions. `Err` names a profile the config does not define.
pub fn gate_policy(config: &Config, key: &TreatmentKeyDecl) -> anyhow::Result<Value> {
    let profile = match &key.profile {
        None => Value::Null,
        Some(name) => {
            let s = config.profiles.get(name).ok_or_else(|| {
                anyhow::anyhow!(
                    "the treatment key's profile {name:?} is not a [profiles.{name}] of the config"
                )
            })?;
            json!({"name": name, "saturation": s})
        }
    };
    Ok(json!({
        "v": 1,
        "gate": config.gate,
        "treatment_key": {
            "profile": profile,
            "human": key.human,
            "budget_micro_usd_per_day": key.budget_micro_usd_per_day,
        },
        "prices": config.prices,
        "downgrade": config.downgrade,
        "limits": {
            "max_body_bytes": config.max_body_bytes,
            "answer_store_bytes": config.answer_store_bytes,
            "hold_ttl_ms": config.hold_ttl_ms,
            "reservation_ttl_ms": config.reservation_ttl_ms,
        },
    }))
}

/// BLAKE3 (hex) of [`gate_policy`]'s canonical JSON (keys sorted, compact).
pub fn gate_policy_blake3(config: &Config, key: &TreatmentKeyDecl) -> anyhow::Result<String> {
    let v = gate_policy(config, key)?;
    Ok(
        blake3::hash(tokensaver_mock_script::canonical_text(&v).as_bytes())
            .to_hex()
            .to_string(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> TreatmentKeyDecl {
        TreatmentKeyDecl {
            profile: Some("agent".into()),
            human: false,
            budget_micro_usd_per_day: None,
        }
    }

    #[test]
    fn the_policy_hash_ignores_placement_and_sees_decisions() {
        let base =
            "[profiles.agent.saturation]\nsize = 1000000\nask = 128000\ndepth = 400\ntools = 128\n";
        let a = Config::parse(base).unwrap();
        let placed = Config::parse(&format!(
            "[listen]\nproxy = \"127.0.0.1:1\"\n[data]\ndir = \"/elsewhere\"\n{base}"
        ))
        .unwrap();
        let h = |c: &Config| gate_policy_blake3(c, &key()).unwrap();
        assert_eq!(h(&a), h(&placed), "listeners and directories do not count");
        let mut tuned = a.clone();
        tuned.gate.weights.loop_ += 0.01;
        assert_ne!(h(&a), h(&tuned), "a weight counts");
        let mut profile = a.clone();
        if let Some(s) = profile.profiles.get_mut("agent") {
            s.depth += 1;
        }
        assert_ne!(h(&a), h(&profile), "the treatment key's profile counts");
        let none = TreatmentKeyDecl {
            profile: Some("missing".into()),
            ..key()
        };
        assert!(gate_policy(&a, &none).is_err());
    }
}

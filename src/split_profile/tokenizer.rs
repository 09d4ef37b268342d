//! The tokenizer this build applies: `tiktoken-rs` `cl100k_base`, special-token spellings
//! counted as ordinary text (`encode_ordinary`, i.e. an empty allowed-special set).

use std::sync::OnceLock;

use tiktoken_rs::CoreBPE;

/// The `tiktoken-rs` version in Cargo.lock (a test checks it).
pub const TIKTOKEN_RS_VERSION: &str = "0.7.0";

/// SHA-256 of the `cl100k_base.tiktoken` data `tiktoken-rs` 0.7.0 embeds — the same data the
/// criteria pin. Tests recompute it from the crate's decoder and from the registry file.
pub const CL100K_DATA_SHA256: &str =
    "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7";

/// The reference package the corpus was derived with (npm), and its data's SHA-256.
pub const REFERENCE_PACKAGE: &str = "gpt-tokenizer";
pub const REFERENCE_VERSION: &str = "4.0.0";

/// The tokenizer identity string, in the criteria's `id` form.
pub fn tokenizer_id() -> String {
    format!("cl100k_base/tiktoken-rs@{TIKTOKEN_RS_VERSION}/data-sha256:{CL100K_DATA_SHA256}")
}

static BPE: OnceLock<Option<CoreBPE>> = OnceLock::new();

fn bpe() -> Option<&'static CoreBPE> {
    BPE.get_or_init(|| tiktoken_rs::cl100k_base().ok()).as_ref()
}

/// Build the encoder now (it takes tens of milliseconds); returns whether it is available.
pub fn warm_up() -> bool {
    bpe().is_some()
}

/// The cl100k_base token count of `text`, special-token spellings as ordinary text.
/// `None` only if the encoder could not be built.
pub fn count(text: &str) -> Option<u64> {
    if text.is_empty() {
        return Some(0);
    }
    bpe().map(|b| b.encode_ordinary(text).len() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;
    use sha2::{Digest, Sha256};

    #[test]
    fn special_token_spellings_are_ordinary_text() {
        assert!(count("<|endoftext|>").unwrap() > 1);
        assert!(count("\"<|im_start|>\"").unwrap() > 1);
        assert_eq!(count(""), Some(0));
        assert_eq!(count("\"\""), Some(1));
    }

    /// The data hash recomputed from tiktoken-rs itself: every rank's bytes, in the
    /// `.tiktoken` line format (`base64 rank`), hashed.
    #[test]
    fn cl100k_data_sha256_recomputed_from_the_crate() {
        let bpe = tiktoken_rs::cl100k_base().unwrap();
        let mut hasher = Sha256::new();
        for rank in 0..100_256u32 {
            let bytes = bpe._decode_native_and_split(vec![rank]).next().unwrap();
            let line = format!(
                "{} {rank}\n",
                base64::engine::general_purpose::STANDARD.encode(bytes)
            );
            hasher.update(line.as_bytes());
        }
        let hex: String = hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(hex, CL100K_DATA_SHA256);
    }

    /// Cargo.lock resolves tiktoken-rs to the version /criteria names.
    #[test]
    fn cargo_lock_has_the_named_tiktoken_rs_version() {
        let lock =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.lock")).unwrap();
        let entry = lock
            .split("[[package]]")
            .find(|p| p.contains("name = \"tiktoken-rs\""))
            .unwrap();
        assert!(
            entry.contains(&format!("version = \"{TIKTOKEN_RS_VERSION}\"")),
            "{entry}"
        );
    }

    /// When the crate's source is in the local cargo registry, its data file hashes to the pin.
    #[test]
    fn registry_data_file_hashes_to_the_pin_when_present() {
        let home = std::env::var("CARGO_HOME")
            .map(std::path::PathBuf::from)
            .or_else(|_| std::env::var("HOME").map(|h| std::path::Path::new(&h).join(".cargo")));
        let Ok(home) = home else { return };
        let Ok(indexes) = std::fs::read_dir(home.join("registry/src")) else {
            return;
        };
        let mut checked = 0;
        for index in indexes.flatten() {
            let file = index.path().join(format!(
                "tiktoken-rs-{TIKTOKEN_RS_VERSION}/assets/cl100k_base.tiktoken"
            ));
            if let Ok(bytes) = std::fs::read(&file) {
                let hex: String = Sha256::digest(&bytes)
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect();
                assert_eq!(hex, CL100K_DATA_SHA256, "{}", file.display());
                checked += 1;
            }
        }
        eprintln!("registry data files checked: {checked}");
    }
}

//! Receipts: signing and checking live in the gate core (`tokensaver_core::receipt`); here is
//! what touches the disk, the signing key's files in the data dir.

use std::fs;
use std::io::Write;
use std::path::Path;

use ed25519_dalek::SigningKey;

pub use tokensaver_core::receipt::*;

const SIGNING_KEY_FILE: &str = "receipt-signing.key";
/// Earlier public keys, one base64 public key per line.
const EARLIER_KEYS_FILE: &str = "receipt-earlier-keys.txt";

#[derive(Debug, thiserror::Error)]
pub enum ReceiptError {
    #[error("receipt signing key file is unreadable or malformed")]
    KeyFile,
    #[error("could not write the receipt signing key file")]
    KeyWrite,
}

/// Load the signing key from the data dir, creating it (mode 0600) on first start.
pub fn load_or_create(data_dir: &Path) -> Result<ReceiptSigner, ReceiptError> {
    fs::create_dir_all(data_dir).map_err(|_| ReceiptError::KeyWrite)?;
    let path = data_dir.join(SIGNING_KEY_FILE);
    let seed = if path.exists() {
        let text = fs::read_to_string(&path).map_err(|_| ReceiptError::KeyFile)?;
        parse_hex32(text.trim()).ok_or(ReceiptError::KeyFile)?
    } else {
        let key = SigningKey::generate(&mut rand::rngs::OsRng);
        write_private(&path, &hex::encode(key.to_bytes()))?;
        key.to_bytes()
    };
    let earlier = fs::read_to_string(data_dir.join(EARLIER_KEYS_FILE)).unwrap_or_default();
    Ok(ReceiptSigner::from_seed(seed).with_earlier_keys(&earlier))
}

/// Load an existing signing key (no key is created: a verifier must not invent one).
pub fn load(data_dir: &Path) -> Result<ReceiptSigner, ReceiptError> {
    if !data_dir.join(SIGNING_KEY_FILE).exists() {
        return Err(ReceiptError::KeyFile);
    }
    load_or_create(data_dir)
}

fn write_private(path: &Path, contents: &str) -> Result<(), ReceiptError> {
    let mut options = fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(path).map_err(|_| ReceiptError::KeyWrite)?;
    file.write_all(contents.as_bytes())
        .map_err(|_| ReceiptError::KeyWrite)?;
    file.sync_all().map_err(|_| ReceiptError::KeyWrite)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_file_is_created_private_and_reloaded() {
        let dir = tempfile::tempdir().unwrap();
        let a = load_or_create(dir.path()).unwrap();
        let b = load_or_create(dir.path()).unwrap();
        assert_eq!(a.kid(), b.kid());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(dir.path().join(SIGNING_KEY_FILE))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let env = a.sign(b"x");
        assert!(b.verify(&env).is_ok());
    }
}

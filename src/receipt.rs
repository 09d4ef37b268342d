//! Ed25519 receipts: every decision is signed, and anyone holding the public key can check it.
//!
//! The envelope is `{"body": base64 of the exact signed bytes, "sig": base64 signature,
//! "kid": key id}`. The signing key lives in the data dir (generated on first start, 0600);
//! earlier public keys stay verifiable so old receipts keep their worth after a rotation.

use std::fs;
use std::io::Write;
use std::path::Path;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use ed25519_dalek::{Signature, Signer, SigningKey, Verifier, VerifyingKey};
use serde::{Deserialize, Serialize};

const SIGNING_KEY_FILE: &str = "receipt-signing.key";
const EARLIER_KEYS_FILE: &str = "receipt-earlier-keys.txt";

#[derive(Debug, thiserror::Error)]
pub enum ReceiptError {
    #[error("receipt signing key file is unreadable or malformed")]
    KeyFile,
    #[error("could not write the receipt signing key file")]
    KeyWrite,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("envelope is not valid JSON of the form {{body, sig, kid}}")]
    Malformed,
    #[error("envelope body or signature is not valid base64")]
    Encoding,
    #[error("no known receipt key has this kid")]
    UnknownKid,
    #[error("signature does not match the body")]
    BadSignature,
}

/// A signed receipt as it travels: the exact body bytes, the signature, the key id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Envelope {
    pub body: String,
    pub sig: String,
    pub kid: String,
}

impl Envelope {
    /// The signed bytes, decoded (no signature check).
    pub fn body_bytes(&self) -> Result<Vec<u8>, VerifyError> {
        B64.decode(&self.body).map_err(|_| VerifyError::Encoding)
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The envelope as base64 JSON, the form carried in the `x-tokensaver-receipt` header.
    pub fn to_header_value(&self) -> String {
        B64.encode(self.to_json())
    }

    pub fn from_header_value(value: &str) -> Result<Self, VerifyError> {
        let json = B64
            .decode(value.trim())
            .map_err(|_| VerifyError::Encoding)?;
        serde_json::from_slice(&json).map_err(|_| VerifyError::Malformed)
    }
}

/// BLAKE3 (hex) of the exact signed body bytes: the id `/record` and the ledger use.
pub fn decision_id(body: &[u8]) -> String {
    blake3::hash(body).to_hex().to_string()
}

#[derive(Debug, Clone, Serialize)]
pub struct PublicKeyInfo {
    pub kid: String,
    pub alg: &'static str,
    pub public_key: String,
    pub current: bool,
}

pub struct ReceiptSigner {
    signing: SigningKey,
    kid: String,
    earlier: Vec<(String, VerifyingKey)>,
}

/// A key id names a public key: the first 16 hex digits of its BLAKE3 hash.
fn kid_of(key: &VerifyingKey) -> String {
    let hex = blake3::hash(key.as_bytes()).to_hex();
    format!("ed25519-{}", &hex.as_str()[..16])
}

impl ReceiptSigner {
    pub fn from_seed(seed: [u8; 32]) -> Self {
        let signing = SigningKey::from_bytes(&seed);
        let kid = kid_of(&signing.verifying_key());
        Self {
            signing,
            kid,
            earlier: Vec::new(),
        }
    }

    /// Load the signing key from the data dir, creating it (mode 0600) on first start.
    pub fn load_or_create(data_dir: &Path) -> Result<Self, ReceiptError> {
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
        let mut signer = Self::from_seed(seed);
        signer.earlier = load_earlier_keys(&data_dir.join(EARLIER_KEYS_FILE));
        Ok(signer)
    }

    /// Load an existing signing key (no key is created: a verifier must not invent one).
    pub fn load(data_dir: &Path) -> Result<Self, ReceiptError> {
        if !data_dir.join(SIGNING_KEY_FILE).exists() {
            return Err(ReceiptError::KeyFile);
        }
        Self::load_or_create(data_dir)
    }

    pub fn kid(&self) -> &str {
        &self.kid
    }

    pub fn sign(&self, body: &[u8]) -> Envelope {
        let sig = self.signing.sign(body);
        Envelope {
            body: B64.encode(body),
            sig: B64.encode(sig.to_bytes()),
            kid: self.kid.clone(),
        }
    }

    /// Check an envelope against the current and earlier keys; returns the signed bytes.
    pub fn verify(&self, envelope: &Envelope) -> Result<Vec<u8>, VerifyError> {
        let current = self.signing.verifying_key();
        let key = if envelope.kid == self.kid {
            current
        } else {
            self.earlier
                .iter()
                .find(|(kid, _)| *kid == envelope.kid)
                .map(|(_, key)| *key)
                .ok_or(VerifyError::UnknownKid)?
        };
        let body = envelope.body_bytes()?;
        let sig_bytes = B64
            .decode(&envelope.sig)
            .map_err(|_| VerifyError::Encoding)?;
        let sig = Signature::from_slice(&sig_bytes).map_err(|_| VerifyError::Encoding)?;
        key.verify(&body, &sig)
            .map_err(|_| VerifyError::BadSignature)?;
        Ok(body)
    }

    pub fn verify_json(&self, json: &[u8]) -> Result<Vec<u8>, VerifyError> {
        let envelope: Envelope =
            serde_json::from_slice(json).map_err(|_| VerifyError::Malformed)?;
        self.verify(&envelope)
    }

    pub fn public_keys(&self) -> Vec<PublicKeyInfo> {
        let mut keys = vec![PublicKeyInfo {
            kid: self.kid.clone(),
            alg: "Ed25519",
            public_key: B64.encode(self.signing.verifying_key().as_bytes()),
            current: true,
        }];
        keys.extend(self.earlier.iter().map(|(kid, key)| PublicKeyInfo {
            kid: kid.clone(),
            alg: "Ed25519",
            public_key: B64.encode(key.as_bytes()),
            current: false,
        }));
        keys
    }
}

/// Earlier public keys, one `base64-public-key` per line; their kids are derived, not trusted.
fn load_earlier_keys(path: &Path) -> Vec<(String, VerifyingKey)> {
    let Ok(text) = fs::read_to_string(path) else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|line| {
            let bytes = B64.decode(line.trim()).ok()?;
            let arr: [u8; 32] = bytes.try_into().ok()?;
            let key = VerifyingKey::from_bytes(&arr).ok()?;
            Some((kid_of(&key), key))
        })
        .collect()
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

/// Exactly 64 hex digits → 32 bytes.
pub fn parse_hex32(text: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    hex::decode_to_slice(text, &mut out).ok()?;
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips() {
        assert_eq!(hex::encode([0x00, 0x0f, 0xa0, 0xff, 0x5c]), "000fa0ff5c");
        let bytes: [u8; 32] = std::array::from_fn(|i| (i * 37) as u8);
        let hex = hex::encode(bytes);
        let expected: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, expected);
        assert_eq!(parse_hex32(&hex), Some(bytes));
    }

    #[test]
    fn sign_then_verify_round_trips_and_tampering_fails() {
        let signer = ReceiptSigner::from_seed([7; 32]);
        let env = signer.sign(br#"{"verdict":"ALLOW"}"#);
        assert_eq!(signer.verify(&env).unwrap(), br#"{"verdict":"ALLOW"}"#);
        let mut forged = env.clone();
        forged.body = B64.encode(br#"{"verdict":"SERVE"}"#);
        assert_eq!(signer.verify(&forged), Err(VerifyError::BadSignature));
        let mut unknown = env.clone();
        unknown.kid = "ed25519-0000000000000000".into();
        assert_eq!(signer.verify(&unknown), Err(VerifyError::UnknownKid));
        let header = env.to_header_value();
        assert_eq!(Envelope::from_header_value(&header).unwrap(), env);
    }

    #[test]
    fn key_file_is_created_private_and_reloaded() {
        let dir = tempfile::tempdir().unwrap();
        let a = ReceiptSigner::load_or_create(dir.path()).unwrap();
        let b = ReceiptSigner::load_or_create(dir.path()).unwrap();
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

//! API keys: how they are made, stored and recognised.
//!
//! A key is 32 random bytes from the OS (256 bits), written `alk_` + base64url. The
//! configuration stores only `sha256:<hex>` of the key. A fast, unsalted hash is the right tool
//! here and a password hash (argon2, bcrypt) is not: those slow hashes exist to make guessing
//! *low-entropy* secrets expensive, but nobody can enumerate 2^256 keys at any speed, so the
//! slowness would buy nothing and would cost every request tens of milliseconds (and hand an
//! attacker a cheap way to burn our CPU). Salt guards against precomputed tables of likely
//! passwords, which cannot exist for uniformly random keys. SHA-256 is preimage-resistant, so a
//! leaked configuration or store does not reveal usable keys.
//!
//! Recognising a key is one hash and one map lookup by digest: timing can tell an attacker
//! something about the digest of the key they sent, never about a valid key.

use std::collections::HashMap;
use std::sync::Arc;

use base64::Engine as _;
use sha2::{Digest, Sha256};

use crate::tenant::Tenant;

/// The prefix of every key, so that leaked keys are easy to recognise in logs and scanners.
pub const KEY_PREFIX: &str = "alk_";

/// A new random API key.
pub fn new_key() -> String {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).expect("the OS random number generator is unavailable");
    format!(
        "{KEY_PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    )
}

/// The digest a key is stored and looked up by.
pub fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// The configuration form of a key's digest: `sha256:<hex>`.
pub fn hash_line(key: &str) -> String {
    format!("sha256:{}", hex(&digest(key)))
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Parses `sha256:<64 hex digits>`.
pub fn parse_hash(text: &str) -> Option<[u8; 32]> {
    let hex_digits = text.strip_prefix("sha256:")?;
    if hex_digits.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex_digits.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Who is calling: a tenant and which of its keys.
#[derive(Clone, Debug)]
pub struct Principal {
    pub tenant: Arc<Tenant>,
    pub key_name: String,
}

impl Principal {
    /// Whether this caller may see and act on a resource of `tenant`.
    pub fn may_access(&self, tenant: &str) -> bool {
        self.tenant.admin || self.tenant.name == tenant
    }
}

/// Every configured key, by digest.
#[derive(Default, Debug)]
pub struct KeyRegistry {
    by_digest: HashMap<[u8; 32], Principal>,
}

impl KeyRegistry {
    pub fn new(tenants: &[Arc<Tenant>]) -> KeyRegistry {
        let mut by_digest = HashMap::new();
        for tenant in tenants {
            for (name, digest) in &tenant.keys {
                by_digest.insert(
                    *digest,
                    Principal {
                        tenant: Arc::clone(tenant),
                        key_name: name.clone(),
                    },
                );
            }
        }
        KeyRegistry { by_digest }
    }

    /// The principal holding `key`, if any.
    pub fn recognise(&self, key: &str) -> Option<&Principal> {
        self.by_digest.get(&digest(key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_random_and_hash_lines_parse_back() {
        let (a, b) = (new_key(), new_key());
        assert_ne!(a, b);
        assert!(a.starts_with(KEY_PREFIX) && a.len() == KEY_PREFIX.len() + 43);
        assert_eq!(parse_hash(&hash_line(&a)), Some(digest(&a)));
        assert_eq!(parse_hash("sha256:zz"), None);
        assert_eq!(parse_hash(&"sha256:".repeat(2)), None);
    }
}

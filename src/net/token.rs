//! Join tokens: what `gpuq token create` prints and `gpuq join` consumes.
//!
//! Printed form: `gpuq1-<id>.<secret>.<ca_fingerprint>`, as kubeadm's tokens
//! plus the CA hash kubeadm passes separately. `id` (6 lowercase letters or
//! digits) names the token in the state and in logs; `secret` (32 letters or
//! digits from the OS RNG, about 190 bits) proves the holder was given it; the
//! fingerprint (hex SHA-256 of the CA certificate) lets the joining daemon
//! authenticate the server before it sends the secret. The state keeps only the
//! SHA-256 of the secret; compare hashes with [`hashes_equal`], which takes the
//! same time wherever they differ.

use std::fmt;
use std::str::FromStr;

use rand::distributions::{Alphanumeric, Distribution, Uniform};
use rand::rngs::OsRng;
use sha2::{Digest, Sha256};

/// The prefix of every printed token; the digit is the token format version.
pub const TOKEN_PREFIX: &str = "gpuq1-";
/// Length of a token id.
pub const ID_LEN: usize = 6;
/// Length of a token secret.
pub const SECRET_LEN: usize = 32;
/// Length of a hex SHA-256 fingerprint.
pub const FINGERPRINT_LEN: usize = 64;

const ID_ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";

/// Why a string is not a join token. Messages never repeat the secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// Nothing was given.
    #[error("the join token is empty; pass the token printed by `gpuq token create`")]
    Empty,
    /// The string does not start with `gpuq1-`.
    #[error(
        "this is not a gpuq join token: it should start with {TOKEN_PREFIX:?}; \
         pass the token printed by `gpuq token create`"
    )]
    WrongPrefix,
    /// Fewer or more than three dot-separated parts.
    #[error(
        "the join token should be {TOKEN_PREFIX}<id>.<secret>.<ca-fingerprint> but has \
         {found} dot-separated part(s); it was probably cut when copied"
    )]
    MissingPart {
        /// How many parts were found.
        found: usize,
    },
    /// The id part is malformed.
    #[error("the join token's id {id:?} should be {ID_LEN} lowercase letters or digits")]
    BadId {
        /// The id found.
        id: String,
    },
    /// The secret part is malformed.
    #[error(
        "the join token's secret should be {SECRET_LEN} letters or digits, but it has {len} \
         character(s) or other characters; it was probably cut when copied"
    )]
    BadSecret {
        /// The secret's length.
        len: usize,
    },
    /// The fingerprint part is malformed.
    #[error(
        "the join token's CA fingerprint should be {FINGERPRINT_LEN} hex digits, but it is \
         {len} character(s){}; it was probably cut when copied",
        if *.hex { "" } else { " and not all hex" }
    )]
    BadFingerprint {
        /// The fingerprint's length.
        len: usize,
        /// Whether every character is a hex digit.
        hex: bool,
    },
}

/// A join token: public id, secret, and the CA fingerprint to pin.
#[derive(Clone, PartialEq, Eq)]
pub struct JoinToken {
    /// Public id, as stored in `model::TokenRecord::id`.
    pub id: String,
    /// The secret; only its hash is ever stored.
    pub secret: String,
    /// Hex SHA-256 of the cluster CA certificate (lowercase).
    pub ca_fingerprint: String,
}

impl fmt::Debug for JoinToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JoinToken")
            .field("id", &self.id)
            .field("secret", &"<redacted>")
            .field("ca_fingerprint", &self.ca_fingerprint)
            .finish()
    }
}

impl JoinToken {
    /// A fresh token pinning the CA with hex SHA-256 `ca_fingerprint`.
    pub fn generate(ca_fingerprint: &str) -> Result<JoinToken, TokenError> {
        let ca_fingerprint = check_fingerprint(ca_fingerprint)?;
        let id_chars = Uniform::from(0..ID_ALPHABET.len());
        let id = id_chars
            .sample_iter(OsRng)
            .take(ID_LEN)
            .map(|i| char::from(ID_ALPHABET[i]))
            .collect();
        let secret = Alphanumeric
            .sample_iter(OsRng)
            .take(SECRET_LEN)
            .map(char::from)
            .collect();
        Ok(JoinToken {
            id,
            secret,
            ca_fingerprint,
        })
    }

    /// Parses the printed form (surrounding whitespace is ignored).
    pub fn parse(text: &str) -> Result<JoinToken, TokenError> {
        let text = text.trim();
        if text.is_empty() {
            return Err(TokenError::Empty);
        }
        let rest = text
            .strip_prefix(TOKEN_PREFIX)
            .ok_or(TokenError::WrongPrefix)?;
        let parts: Vec<&str> = rest.split('.').collect();
        let [id, secret, fingerprint] = parts[..] else {
            return Err(TokenError::MissingPart { found: parts.len() });
        };
        if id.len() != ID_LEN || !id.bytes().all(|b| ID_ALPHABET.contains(&b)) {
            return Err(TokenError::BadId { id: id.to_string() });
        }
        if secret.len() != SECRET_LEN || !secret.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(TokenError::BadSecret {
                len: secret.chars().count(),
            });
        }
        let ca_fingerprint = check_fingerprint(fingerprint)?;
        Ok(JoinToken {
            id: id.to_string(),
            secret: secret.to_string(),
            ca_fingerprint,
        })
    }

    /// Hex SHA-256 of the secret: what the state stores.
    pub fn secret_sha256(&self) -> String {
        secret_sha256(&self.secret)
    }
}

impl fmt::Display for JoinToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{TOKEN_PREFIX}{}.{}.{}",
            self.id, self.secret, self.ca_fingerprint
        )
    }
}

impl FromStr for JoinToken {
    type Err = TokenError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        JoinToken::parse(s)
    }
}

fn check_fingerprint(fingerprint: &str) -> Result<String, TokenError> {
    let hex = fingerprint.bytes().all(|b| b.is_ascii_hexdigit());
    if fingerprint.len() != FINGERPRINT_LEN || !hex {
        return Err(TokenError::BadFingerprint {
            len: fingerprint.chars().count(),
            hex,
        });
    }
    Ok(fingerprint.to_ascii_lowercase())
}

/// The prefix of an API (bearer) token; the digit is its format version.
pub const API_TOKEN_PREFIX: &str = "gpuqapi1-";

/// An API token as printed: `gpuqapi1-<id>.<secret>`, id and secret as a
/// join token's. It carries no CA fingerprint: its holder reaches the
/// server over HTTPS, checked with the cluster CA it is given.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiToken {
    pub id: String,
    pub secret: String,
}

impl fmt::Debug for ApiToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApiToken")
            .field("id", &self.id)
            .field("secret", &"<redacted>")
            .finish()
    }
}

impl ApiToken {
    /// A fresh token from the OS's random numbers.
    pub fn generate() -> ApiToken {
        let id_chars = Uniform::from(0..ID_ALPHABET.len());
        ApiToken {
            id: id_chars
                .sample_iter(OsRng)
                .take(ID_LEN)
                .map(|i| char::from(ID_ALPHABET[i]))
                .collect(),
            secret: Alphanumeric
                .sample_iter(OsRng)
                .take(SECRET_LEN)
                .map(char::from)
                .collect(),
        }
    }

    /// Parses the printed form; `None` when it is not one.
    pub fn parse(text: &str) -> Option<ApiToken> {
        let (id, secret) = text
            .trim()
            .strip_prefix(API_TOKEN_PREFIX)?
            .split_once('.')?;
        let id_ok = id.len() == ID_LEN && id.bytes().all(|b| ID_ALPHABET.contains(&b));
        let secret_ok =
            secret.len() == SECRET_LEN && secret.bytes().all(|b| b.is_ascii_alphanumeric());
        (id_ok && secret_ok).then(|| ApiToken {
            id: id.to_string(),
            secret: secret.to_string(),
        })
    }

    /// Hex SHA-256 of the secret: what the state stores.
    pub fn secret_sha256(&self) -> String {
        secret_sha256(&self.secret)
    }
}

impl fmt::Display for ApiToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{API_TOKEN_PREFIX}{}.{}", self.id, self.secret)
    }
}

/// Hex SHA-256 of a token secret.
pub fn secret_sha256(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// Compares two hashes in time that depends only on their lengths (which are public).
pub fn hashes_equal(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    const FP: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn generated_token_round_trips_through_its_printed_form() {
        let token = JoinToken::generate(FP).expect("generate");
        assert_eq!(token.id.len(), ID_LEN);
        assert_eq!(token.secret.len(), SECRET_LEN);
        let printed = token.to_string();
        assert!(printed.starts_with("gpuq1-"));
        assert_eq!(
            JoinToken::parse(&format!("  {printed}\n")),
            Ok(token.clone())
        );
        assert_eq!(printed.parse::<JoinToken>(), Ok(token));
    }

    #[test]
    fn two_tokens_differ() {
        let a = JoinToken::generate(FP).expect("a");
        let b = JoinToken::generate(FP).expect("b");
        assert_ne!(a.secret, b.secret);
    }

    #[test]
    fn uppercase_fingerprint_is_normalised() {
        let token = JoinToken::generate(&FP.to_uppercase()).expect("generate");
        assert_eq!(token.ca_fingerprint, FP);
    }

    #[test]
    fn each_malformation_has_its_own_reason() {
        let secret = "a".repeat(SECRET_LEN);
        let cases: Vec<(String, TokenError)> = vec![
            ("".into(), TokenError::Empty),
            (
                format!("gpuq2-abc123.{secret}.{FP}"),
                TokenError::WrongPrefix,
            ),
            (format!("abc123.{secret}.{FP}"), TokenError::WrongPrefix),
            (
                format!("gpuq1-abc123.{secret}"),
                TokenError::MissingPart { found: 2 },
            ),
            (
                format!("gpuq1-abc123.{secret}.{FP}.x"),
                TokenError::MissingPart { found: 4 },
            ),
            (
                format!("gpuq1-ABC123.{secret}.{FP}"),
                TokenError::BadId {
                    id: "ABC123".into(),
                },
            ),
            (
                format!("gpuq1-abc12.{secret}.{FP}"),
                TokenError::BadId { id: "abc12".into() },
            ),
            (
                format!("gpuq1-abc123.short.{FP}"),
                TokenError::BadSecret { len: 5 },
            ),
            (
                format!("gpuq1-abc123.{}.{FP}", "-".repeat(SECRET_LEN)),
                TokenError::BadSecret { len: SECRET_LEN },
            ),
            (
                format!("gpuq1-abc123.{secret}.{}", &FP[..63]),
                TokenError::BadFingerprint { len: 63, hex: true },
            ),
            (
                format!("gpuq1-abc123.{secret}.{}z", &FP[..63]),
                TokenError::BadFingerprint {
                    len: 64,
                    hex: false,
                },
            ),
        ];
        for (text, want) in cases {
            assert_eq!(JoinToken::parse(&text), Err(want), "{text}");
        }
    }

    #[test]
    fn errors_and_debug_never_show_the_secret() {
        let token = JoinToken::generate(FP).expect("generate");
        assert!(!format!("{token:?}").contains(&token.secret));
        let cut = format!("gpuq1-{}.{}", token.id, token.secret);
        let err = JoinToken::parse(&cut).unwrap_err().to_string();
        assert!(!err.contains(&token.secret), "{err}");
    }

    #[test]
    fn secret_hash_matches_only_the_same_secret() {
        let token = JoinToken::generate(FP).expect("generate");
        let stored = token.secret_sha256();
        assert_eq!(stored.len(), 64);
        assert!(hashes_equal(&stored, &secret_sha256(&token.secret)));
        assert!(!hashes_equal(&stored, &secret_sha256("something else")));
        assert!(!hashes_equal(&stored, &stored[..63]));
    }
}

//! Bearer tokens at rest: how strong a token must be, and the salted hash the configuration
//! keeps of it (`auth.tokens[].hash`, what `quotad hash-token` prints).
//!
//! The hash is argon2id in PHC form. Its 16-byte salt begins with the first two bytes of the
//! token's SHA-256: an unknown token is run through argon2 only for the entries whose salt
//! starts as its digest does, one in 65,536 of them, so a caller who sends random tokens
//! cannot make the service spend an argon2 run on each. Those 16 bits leave a 128-bit token
//! 112 bits that nobody can guess.

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;
use sha2::{Digest, Sha256};

/// The least a token may carry, in bits, as [`entropy_bits`] counts them.
pub const MIN_TOKEN_BITS: f64 = 128.0;

/// A conservative estimate of a token's entropy: the bits of the smallest alphabet that holds
/// it (decimal or hex digits, one case of letters, letters and digits, URL-safe base64, or
/// printable ASCII) for each character, counting only characters that start a 6-character run
/// not seen before in it, so that `aaaa...` or a word repeated counts for little.
pub fn entropy_bits(token: &str) -> f64 {
    let bytes = token.as_bytes();
    let all = |f: fn(&u8) -> bool| bytes.iter().all(f);
    let alphabet: f64 = if all(u8::is_ascii_digit) {
        10.0
    } else if all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
        || all(|b| b.is_ascii_digit() || (b'A'..=b'F').contains(b))
    {
        16.0
    } else if all(u8::is_ascii_lowercase) || all(u8::is_ascii_uppercase) {
        26.0
    } else if all(u8::is_ascii_alphanumeric) {
        62.0
    } else if all(|b| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'_') {
        64.0
    } else {
        95.0
    };
    const RUN: usize = 6;
    let counted = if bytes.len() < RUN {
        bytes.len()
    } else {
        let runs: std::collections::HashSet<&[u8]> = bytes.windows(RUN).collect();
        runs.len() + RUN - 1
    };
    counted as f64 * alphabet.log2()
}

/// How many characters of a token zxcvbn reads as words (English words, names, common
/// passwords; l33t spellings and reversed ones too), of how many it reads. zxcvbn's estimate
/// of a long string saturates (at 2^64 guesses) and then reads it all as random, so each part
/// between separators (space and `-_./:,;+`) is read on its own, in pieces of at most [`PIECE`] characters.
fn word_chars(token: &str) -> (usize, usize) {
    use zxcvbn::matching::patterns::MatchPattern;
    const PIECE: usize = 16;
    let chars: Vec<char> = token.chars().take(256).collect();
    let mut words = 0;
    for part in chars.split(|c| " -_./:,;+".contains(*c)) {
        for piece in part.chunks(PIECE) {
            let piece: String = piece.iter().collect();
            words += zxcvbn::zxcvbn(&piece, &[])
                .sequence()
                .iter()
                .filter(|m| matches!(m.pattern, MatchPattern::Dictionary(_)))
                .map(|m| m.token.chars().count())
                .filter(|&n| n >= 3)
                .sum::<usize>();
        }
    }
    (words, chars.len())
}

/// Refuses a token weaker than [`MIN_TOKEN_BITS`], or one that is half words or more (a
/// passphrase of a few words counts many characters and few guesses), saying how to make one.
pub fn check_strength(token: &str) -> Result<(), String> {
    const HOW: &str = "`openssl rand -hex 32` makes one";
    let bits = entropy_bits(token);
    if bits < MIN_TOKEN_BITS {
        return Err(format!(
            "a token needs at least {MIN_TOKEN_BITS} bits of entropy; this one has about {bits:.0} \
             ({HOW})"
        ));
    }
    let (words, read) = word_chars(token);
    if words * 2 >= read {
        return Err(format!(
            "a token must be random, not words: {words} of its {read} characters read as \
             dictionary words or common passwords ({HOW})"
        ));
    }
    Ok(())
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// The salted hash of a token (argon2id, PHC string), with the salt's lookup prefix.
pub fn hash(token: &str) -> String {
    let mut salt = [0u8; 16];
    rand::fill(&mut salt[2..]);
    salt[..2].copy_from_slice(&digest(token)[..2]);
    let salt = SaltString::encode_b64(&salt).expect("16 bytes is a valid salt");
    Argon2::default()
        .hash_password(token.as_bytes(), &salt)
        .expect("argon2 with its default parameters hashes any input")
        .to_string()
}

/// A configured hash, parsed once: its PHC string and its salt's lookup prefix.
#[derive(Clone, Debug)]
pub struct TokenHash {
    phc: String,
    prefix: [u8; 2],
}

impl TokenHash {
    /// Parses what [`hash`] printed; other argon2 hashes are refused, since their salt does
    /// not carry the prefix.
    pub fn parse(phc: &str) -> Result<TokenHash, String> {
        let parsed = PasswordHash::new(phc)
            .map_err(|e| format!("not a PHC string ({e}); use what `quotad hash-token` prints"))?;
        if parsed.algorithm.as_str() != "argon2id" {
            return Err("must be argon2id, as `quotad hash-token` prints".into());
        }
        let mut buf = [0u8; 64];
        let salt = parsed
            .salt
            .and_then(|s| s.decode_b64(&mut buf).ok())
            .filter(|s| s.len() == 16)
            .ok_or("its salt is not the 16 bytes `quotad hash-token` makes")?;
        Ok(TokenHash {
            phc: phc.to_owned(),
            prefix: [salt[0], salt[1]],
        })
    }

    /// Whether `token` could be this hash's without running argon2 (`sha` is its SHA-256).
    pub fn may_match(&self, sha: &[u8; 32]) -> bool {
        sha[..2] == self.prefix
    }

    /// Runs argon2: tens of milliseconds, so callers keep what verified.
    pub fn verify(&self, token: &str) -> bool {
        PasswordHash::new(&self.phc).is_ok_and(|h| {
            Argon2::default()
                .verify_password(token.as_bytes(), &h)
                .is_ok()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weak_tokens_are_refused_and_random_ones_pass() {
        for weak in [
            "",
            "s3cret",
            "change-me-admin-token",
            "0123456789abcdef0123456789abcde",
            &"a".repeat(200),
            &"password".repeat(20),
            "0123456789abcdef0123456789abcdef",
            "correct-horse-battery-staple",
            "quotad-admin-token-prod",
            "P@ssw0rd-Welcome1-Summer2024!",
        ] {
            assert!(check_strength(weak).is_err(), "{weak:?} passed");
        }
        for strong in [
            "5f0c2a9e8b7d6c5f4a3b2c1d0e9f8a7b",
            "Xk3pQ9vLm2Rt7wYz4Bn8Cd5Fg", // 25 letters and digits: 149 bits
            "k9-Qx_2mZ7pL4vR8nT3wY6bC1",
        ] {
            assert!(check_strength(strong).is_ok(), "{strong:?} refused");
        }
    }

    /// Random tokens of 128 bits and more, in each alphabet quotad's docs suggest, pass: words
    /// that random characters spell by chance are never half of them.
    #[test]
    fn random_tokens_are_never_taken_for_words() {
        const HEX: &[u8] = b"0123456789abcdef";
        const URL: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        for n in 0..2000 {
            let (alphabet, len) = if n % 2 == 0 { (HEX, 32) } else { (URL, 22) };
            let mut raw = [0u8; 64];
            rand::fill(&mut raw[..len]);
            let t: String = raw[..len]
                .iter()
                .map(|b| alphabet[*b as usize % alphabet.len()] as char)
                .collect();
            assert!(
                check_strength(&t).is_ok(),
                "{t:?}: {:?}",
                check_strength(&t)
            );
        }
    }

    #[test]
    fn a_hash_verifies_its_token_only_and_is_salted() {
        let token = "5f0c2a9e8b7d6c5f4a3b2c1d0e9f8a7b";
        let (a, b) = (hash(token), hash(token));
        assert_ne!(a, b, "two hashes of one token must differ by their salt");
        let h = TokenHash::parse(&a).unwrap();
        assert!(h.may_match(&digest(token)));
        assert!(h.verify(token));
        assert!(!h.verify("5f0c2a9e8b7d6c5f4a3b2c1d0e9f8a7c"));
        assert!(TokenHash::parse("$argon2i$v=19$m=16,t=2,p=1$c2FsdHNhbHQ$aGFzaA").is_err());
        assert!(TokenHash::parse("deadbeef").is_err());
    }
}

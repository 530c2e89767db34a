//! The job secret's strength rule, and a fresh secret for
//! `granary secret new`.
//!
//! The entropy of a string cannot be measured from the string itself, so
//! Granary credits a secret with an estimate that is exact for nothing and
//! generous to nothing but random key material (`docs/configuration.md`,
//! "The job secret"):
//!
//! 0. A secret with whitespace inside (after the file's trailing
//!    whitespace is dropped) is refused outright: it is a phrase, and a
//!    phrase of words holds far fewer bits than its length suggests.
//! 1. Trailing `=` (base64 padding) is not counted.
//! 2. The *alphabet* is the first of these that holds every byte: decimal
//!    digits (log2 10 ≈ 3.32 bits a character); hexadecimal digits of one
//!    case (4); digits and letters of one case (log2 36 ≈ 5.17); letters,
//!    digits and `+ / - _` (6, as base64); printable ASCII (`!` to `~`,
//!    log2 94 ≈ 6.55); anything else (8).
//! 3. *H* is the Shannon entropy of the secret's byte frequencies,
//!    −Σ p log2 p over the distinct bytes.
//! 4. A byte is *counted* unless it is the third or later of a run with one
//!    constant step (`aaaa`, `abcd`, `9753`: each run counts its first two
//!    bytes), or it ends three bytes that already occurred earlier in the
//!    secret (`passwordpassword` counts the first `password` and `pa`).
//! 5. The estimate is `counted × min(alphabet bits, H)`; a secret is
//!    accepted when it is at least [`MIN_SECRET_BITS`].
//!
//! A fresh secret ([`generate`]) is [`GENERATED_SECRET_BYTES`] bytes of the
//! kernel's random number generator, written as lowercase hexadecimal:
//! it is credited about 225 bits, never fewer than 128.

use std::fmt;

/// The fewest estimated bits a job secret may hold.
pub const MIN_SECRET_BITS: f64 = 128.0;

/// Random bytes in a secret from [`generate`].
pub const GENERATED_SECRET_BYTES: usize = 32;

/// Why a job secret is refused: its estimate falls short, or it is a
/// phrase.
#[derive(Debug, Clone, PartialEq)]
pub struct WeakSecret {
    /// The estimate, in bits (0 for a phrase).
    pub bits: f64,
    /// Whether it has whitespace inside.
    pub phrase: bool,
}

impl fmt::Display for WeakSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.phrase {
            f.write_str(
                "is too weak: it has whitespace inside, and a phrase of words holds far fewer \
                 bits than its length suggests",
            )?;
        } else {
            write!(
                f,
                "is too weak: about {:.0} bits by Granary's estimate, at least \
                 {MIN_SECRET_BITS:.0} needed",
                self.bits
            )?;
        }
        f.write_str(
            " (docs/configuration.md, \"The job secret\"); make one with \
             `granary secret new PATH` and set peers.secret_file = PATH",
        )
    }
}

impl std::error::Error for WeakSecret {}

/// Bits per character of the first alphabet holding every byte of `s`.
fn alphabet_bits(s: &[u8]) -> f64 {
    let all = |f: &dyn Fn(u8) -> bool| s.iter().all(|&b| f(b));
    if all(&|b| b.is_ascii_digit()) {
        10f64.log2()
    } else if all(&|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        || all(&|b| b.is_ascii_digit() || (b'A'..=b'F').contains(&b))
    {
        4.0
    } else if all(&|b| b.is_ascii_digit() || b.is_ascii_lowercase())
        || all(&|b| b.is_ascii_digit() || b.is_ascii_uppercase())
    {
        36f64.log2()
    } else if all(&|b| b.is_ascii_alphanumeric() || b"+/-_".contains(&b)) {
        6.0
    } else if all(&|b| b.is_ascii_graphic()) {
        94f64.log2()
    } else {
        8.0
    }
}

/// The Shannon entropy of the byte frequencies of `s`, in bits per byte.
fn shannon_bits(s: &[u8]) -> f64 {
    let mut counts = [0u32; 256];
    for &b in s {
        counts[b as usize] += 1;
    }
    let n = s.len() as f64;
    counts
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let c = f64::from(c);
            c / n * (n / c).log2()
        })
        .sum()
}

/// How many bytes of `s` are counted (rule 4 of the module's list).
fn counted_bytes(s: &[u8]) -> usize {
    let step = |i: usize| i16::from(s[i]) - i16::from(s[i - 1]);
    let mut seen = std::collections::HashSet::new();
    (0..s.len())
        .filter(|&i| {
            if i < 2 {
                return true;
            }
            let run = step(i) == step(i - 1);
            let repeated = !seen.insert(&s[i - 2..=i]);
            !run && !repeated
        })
        .count()
}

/// Whether `secret` has whitespace inside (rule 0).
fn is_phrase(secret: &[u8]) -> bool {
    secret.trim_ascii().iter().any(|b| b.is_ascii_whitespace())
}

/// The estimated bits of `secret` (the module's rule; 0 for a phrase).
pub fn estimated_bits(secret: &[u8]) -> f64 {
    if is_phrase(secret) {
        return 0.0;
    }
    let end = secret.iter().rposition(|&b| b != b'=').map_or(0, |i| i + 1);
    let s = &secret[..end];
    if s.is_empty() {
        return 0.0;
    }
    counted_bytes(s) as f64 * alphabet_bits(s).min(shannon_bits(s))
}

/// Accepts `secret` when it is no phrase and its estimate reaches
/// [`MIN_SECRET_BITS`].
pub fn check(secret: &[u8]) -> Result<(), WeakSecret> {
    let bits = estimated_bits(secret);
    if bits >= MIN_SECRET_BITS {
        Ok(())
    } else {
        Err(WeakSecret {
            bits,
            phrase: is_phrase(secret),
        })
    }
}

/// A fresh job secret: [`GENERATED_SECRET_BYTES`] bytes from the kernel's
/// random number generator, as lowercase hexadecimal (no newline).
pub fn generate() -> std::io::Result<String> {
    let mut b = [0u8; GENERATED_SECRET_BYTES];
    getrandom::fill(&mut b).map_err(std::io::Error::other)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_secrets_are_64_hex_digits_and_always_pass() {
        let mut lowest = f64::MAX;
        let mut seen = std::collections::HashSet::new();
        for _ in 0..5000 {
            let s = generate().unwrap();
            assert_eq!(s.len(), 2 * GENERATED_SECRET_BYTES);
            assert!(s
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
            lowest = lowest.min(estimated_bits(s.as_bytes()));
            assert!(seen.insert(s), "two equal secrets");
        }
        // About 225 bits on average; the lowest of 5000 stays far above the bar.
        assert!(lowest >= 160.0, "lowest estimate {lowest}");
    }

    #[test]
    fn weak_secrets_are_refused() {
        for weak in [
            &b"x"[..],
            b"s",
            b"password",
            b"aaaaaaaaaaaaaaaa",
            b"0123456789abcdef0123456789abcdef",
            b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789",
            b"passwordpasswordpasswordpasswordpasswordpasswordpasswordpassword",
            b"correct horse battery staple",
            b"the quick brown fox jumps over the lazy dog",
            b"correct-horse-battery-staple-battery-horse",
            b"Tr0ub4dor&3",
            b"the-job-secret",
            b"cluster-bench-job-secret",
            b"================",
            b"",
            // 16 random bytes as 32 hex digits: the estimate cannot tell
            // them from a chosen string and asks for more.
            b"5f0c8e1d9a3b47c2e6d1f0a98b7c3e25",
            &[0u8; 64],
        ] {
            let e = check(weak).unwrap_err();
            assert!(e.bits < MIN_SECRET_BITS, "{weak:?}: {}", e.bits);
        }
        let msg = check(b"password").unwrap_err().to_string();
        assert!(msg.contains("granary secret new PATH"), "{msg}");
        assert!(
            !msg.contains("password"),
            "the secret is never printed: {msg}"
        );
    }

    #[test]
    fn the_rule_by_parts() {
        assert!((alphabet_bits(b"0123") - 10f64.log2()).abs() < 1e-9);
        assert_eq!(alphabet_bits(b"09af"), 4.0);
        assert_eq!(alphabet_bits(b"09AF"), 4.0);
        assert!((alphabet_bits(b"09aF") - 6.0).abs() < 1e-9, "mixed case");
        assert!((alphabet_bits(b"z9") - 36f64.log2()).abs() < 1e-9);
        assert_eq!(alphabet_bits(b"aZ+/-_"), 6.0);
        assert!((alphabet_bits(b"a~b!") - 94f64.log2()).abs() < 1e-9);
        // Whitespace inside: a phrase, refused whatever its length.
        let phrase = b"the quick brown fox jumps over the lazy dog";
        assert_eq!(estimated_bits(phrase), 0.0);
        assert!(check(phrase)
            .unwrap_err()
            .to_string()
            .contains("whitespace inside"));
        assert!(estimated_bits(b" q7Zk\n") > 0.0, "only inside");
        assert_eq!(alphabet_bits(&[0xff, b'a']), 8.0);
        assert_eq!(shannon_bits(b"aaaa"), 0.0);
        assert!((shannon_bits(b"abab") - 1.0).abs() < 1e-9);
        assert!((shannon_bits(b"abcd") - 2.0).abs() < 1e-9);
        // Runs of one step count their first two bytes.
        assert_eq!(counted_bytes(b"aaaaaa"), 2);
        assert_eq!(counted_bytes(b"abcdef"), 2);
        assert_eq!(counted_bytes(b"97531"), 2);
        assert_eq!(counted_bytes(b"azby"), 4);
        // Three bytes already seen are not counted again.
        assert_eq!(counted_bytes(b"passwordpassword"), 10);
        assert_eq!(counted_bytes(b"kqbzkqb"), 6);
        // Padding is not counted.
        assert_eq!(estimated_bits(b"q7Zk=="), estimated_bits(b"q7Zk"));
    }

    #[test]
    fn random_key_material_in_other_forms_passes() {
        // 32 random bytes as base64 (`openssl rand -base64 32`), and raw.
        for s in [
            &b"3q2+7wAbRk9Yh0mXc1v4ZPn8eLsUaKdTg6iQfBjyWOo="[..],
            &[
                0x8c, 0x11, 0xf3, 0x5a, 0x02, 0xde, 0x97, 0x4b, 0x60, 0xaa, 0x3f, 0xc8, 0x19, 0x75,
                0xe4, 0x2d, 0xb6, 0x0e, 0x53, 0x81, 0xfa, 0x6c, 0x27, 0x9d, 0x44, 0xe1, 0x38, 0xbf,
                0x05, 0x72, 0xcd, 0x96,
            ],
        ] {
            assert!(check(s).is_ok(), "{s:?}: {}", estimated_bits(s));
        }
    }
}

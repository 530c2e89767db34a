//! A raw AEAD: one record of the channel's largest size sealed and opened
//! in place with aws-lc-rs, the channel's key type and nonce encoding.

use aws_lc_rs::aead::{
    Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, CHACHA20_POLY1305, NONCE_LEN,
};
use granary_peer::channel::{Protection, Suite, MAX_RECORD_PLAINTEXT};

use super::scenario::pattern;
use super::Result;

/// One record sealed and opened in place, as the channel's records are.
pub struct RawAead {
    pub key: LessSafeKey,
    pub suite: Suite,
    pub protection: Protection,
    pub buf: Vec<u8>,
    pub n: u64,
}

impl RawAead {
    pub fn new(suite: Suite, protection: Protection) -> Result<RawAead> {
        let alg = match suite {
            Suite::Aes256Gcm => &AES_256_GCM,
            Suite::ChaCha20Poly1305 => &CHACHA20_POLY1305,
        };
        let key = UnboundKey::new(alg, &[0x5a; 32]).map_err(|_| "AEAD key")?;
        let mut r = RawAead {
            key: LessSafeKey::new(key),
            suite,
            protection,
            buf: pattern(MAX_RECORD_PLAINTEXT, 3),
            n: 0,
        };
        // Sealed and opened once, it must come back as it was.
        let before = r.buf.clone();
        r.step()?;
        if r.buf != before {
            return Err(format!("raw {suite:?} {protection:?}: opened bytes differ").into());
        }
        Ok(r)
    }

    /// The channel's nonce encoding (Noise's `CipherState`).
    pub fn nonce(&self) -> Nonce {
        let mut b = [0u8; NONCE_LEN];
        match self.suite {
            Suite::Aes256Gcm => b[4..].copy_from_slice(&self.n.to_be_bytes()),
            Suite::ChaCha20Poly1305 => b[4..].copy_from_slice(&self.n.to_le_bytes()),
        }
        Nonce::assume_unique_for_key(b)
    }

    pub fn step(&mut self) -> Result<u64> {
        let fail = |_| "raw AEAD failed";
        match self.protection {
            Protection::Encrypted => {
                let tag = self
                    .key
                    .seal_in_place_separate_tag(self.nonce(), Aad::empty(), &mut self.buf)
                    .map_err(fail)?;
                self.key
                    .open_in_place_separate_tag(
                        self.nonce(),
                        Aad::empty(),
                        tag.as_ref(),
                        &mut self.buf,
                    )
                    .map_err(fail)?;
            }
            Protection::Authenticated => {
                let tag = self
                    .key
                    .seal_in_place_separate_tag(self.nonce(), Aad::from(&self.buf[..]), &mut [])
                    .map_err(fail)?;
                self.key
                    .open_in_place_separate_tag(
                        self.nonce(),
                        Aad::from(&self.buf[..]),
                        tag.as_ref(),
                        &mut [],
                    )
                    .map_err(fail)?;
            }
        }
        self.n += 1;
        Ok(self.buf.len() as u64)
    }
}

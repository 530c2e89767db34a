//! The secure channel under every peer connection: a Noise handshake keyed
//! by the job secret, then authenticated (and by default encrypted)
//! records. Sans-IO: [`crate::conn::Conn`] feeds it bytes and sends what
//! it returns.
//!
//! # Handshake
//!
//! The pattern is Noise `NNpsk0` (no static keys; the pre-shared key is
//! mixed in before the first message), with X25519, SHA-256 and the AEAD
//! the dialer proposes:
//!
//! ```text
//! protocol name  Noise_NNpsk0_25519_AESGCM_SHA256       (suite 1)
//!                Noise_NNpsk0_25519_ChaChaPoly_SHA256   (suite 2)
//! psk            SHA-256("granary-peer-psk-v2\0" || job secret)
//! prologue       "granary-peer-v2\0" || preamble (8 bytes)
//!
//! dialer → listener   preamble                        8 bytes, in clear:
//!                       "GRNY", version 2, suite, protection, 0
//!                     u16 BE length, message 1        -> psk, e   + hello (encrypted)
//! listener → dialer   u16 BE length, message 2        <- e, ee    + hello (encrypted)
//! both                records (below)
//! ```
//!
//! The hellos (`crate::frame::Hello` frames) are the handshake payloads, so
//! they travel encrypted and authenticated by the pre-shared key. Because
//! the preamble is the prologue, changing its suite or protection in
//! flight makes the handshake fail.
//!
//! What this gives:
//!
//! * Mutual authentication bound to the channel: both transport keys come
//!   from the Noise chaining key, which mixes the pre-shared key and both
//!   ephemeral keys. A relay or a splice of two connections holds neither
//!   key and can only pass ciphertext along or break it.
//! * Forward secrecy: the `ee` Diffie-Hellman of two ephemeral keys that are
//!   never stored; a secret leaked later does not open recorded traffic.
//! * No guessing oracle for strangers: the listener answers nothing until
//!   message 1 has authenticated under the pre-shared key, so a stranger who
//!   dials a listener learns nothing it could test guesses against. (A tap
//!   on the path sees message 1, which is why the secret must carry at
//!   least 128 bits of entropy.)
//!
//! # Records
//!
//! After the handshake each direction has its own key (Noise `Split()`:
//! the first for dialer to listener) and a 64-bit counter starting at 0.
//! Every record is
//!
//! ```text
//! u16 BE length L (17 ..= 65535), then L bytes:
//!   protection 1 (encrypted):      ENCRYPT(k, n, ad = "", plaintext)          = ciphertext || tag
//!   protection 2 (authenticated):  plaintext || ENCRYPT(k, n, ad = plaintext, "")  (the tag alone)
//! ```
//!
//! with `ENCRYPT` and the nonce encoding of the suite exactly as in Noise's
//! `CipherState` (AES-GCM: 4 zero bytes and `n` big-endian; ChaCha20-Poly1305:
//! 4 zero bytes and `n` little-endian). Plaintexts are 1 to
//! [`MAX_RECORD_PLAINTEXT`] bytes of the frame stream. A record that fails
//! its tag closes the connection. The counter never wraps: a connection
//! that would reach 2^64 - 1 records closes first.

use std::fmt;

use aws_lc_rs::aead::{
    Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, CHACHA20_POLY1305, NONCE_LEN,
};
use sha2::{Digest, Sha256};
use snow::params::NoiseParams;
use snow::resolvers::{BoxedCryptoResolver, CryptoResolver, DefaultResolver};
use snow::types::{Cipher, Dh, Hash, Random};

/// The first bytes a dialer sends.
pub const MAGIC: [u8; 4] = *b"GRNY";
/// The channel version in the preamble.
pub const CHANNEL_VERSION: u8 = 2;
/// Bytes of the preamble.
pub const PREAMBLE_LEN: usize = 8;
/// Longest handshake message accepted (both carry a hello of at most
/// ~600 bytes).
pub const MAX_HANDSHAKE_MESSAGE: usize = 1024;
/// Bytes of an AEAD tag.
pub const TAG_LEN: usize = 16;
/// Longest record body (Noise's message limit).
pub const MAX_RECORD: usize = 65535;
/// Most plaintext bytes of one record.
pub const MAX_RECORD_PLAINTEXT: usize = MAX_RECORD - TAG_LEN;
/// Bytes of the length before every handshake message and record.
pub const LEN_PREFIX: usize = 2;

const PSK_LABEL: &[u8] = b"granary-peer-psk-v2\0";
const PROLOGUE_LABEL: &[u8] = b"granary-peer-v2\0";

/// The AEAD of a channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Suite {
    /// AES-256-GCM: fastest where the CPU has AES and carry-less multiply
    /// instructions.
    Aes256Gcm = 1,
    /// ChaCha20-Poly1305: fastest elsewhere.
    ChaCha20Poly1305 = 2,
}

impl Suite {
    /// Both suites, in code order.
    pub const ALL: [Suite; 2] = [Suite::Aes256Gcm, Suite::ChaCha20Poly1305];

    /// The suite this CPU runs fastest: AES-256-GCM when it has AES and
    /// carry-less multiplication instructions (x86-64 AES-NI and PCLMULQDQ,
    /// AArch64 AES and PMULL), ChaCha20-Poly1305 otherwise.
    pub fn fastest_here() -> Suite {
        if hardware_aes() {
            Suite::Aes256Gcm
        } else {
            Suite::ChaCha20Poly1305
        }
    }

    /// The code in the preamble.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// The suite of a preamble code.
    pub fn from_code(c: u8) -> Option<Suite> {
        Suite::ALL.into_iter().find(|s| s.code() == c)
    }

    /// The name used in the configuration and in logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Suite::Aes256Gcm => "aes-256-gcm",
            Suite::ChaCha20Poly1305 => "chacha20-poly1305",
        }
    }

    fn noise_name(self) -> &'static str {
        match self {
            Suite::Aes256Gcm => "Noise_NNpsk0_25519_AESGCM_SHA256",
            Suite::ChaCha20Poly1305 => "Noise_NNpsk0_25519_ChaChaPoly_SHA256",
        }
    }

    fn nonce(self, n: u64) -> Nonce {
        let mut b = [0u8; NONCE_LEN];
        match self {
            Suite::Aes256Gcm => b[4..].copy_from_slice(&n.to_be_bytes()),
            Suite::ChaCha20Poly1305 => b[4..].copy_from_slice(&n.to_le_bytes()),
        }
        Nonce::assume_unique_for_key(b)
    }
}

#[cfg(target_arch = "x86_64")]
fn hardware_aes() -> bool {
    std::arch::is_x86_feature_detected!("aes") && std::arch::is_x86_feature_detected!("pclmulqdq")
}

#[cfg(target_arch = "aarch64")]
fn hardware_aes() -> bool {
    std::arch::is_aarch64_feature_detected!("aes")
        && std::arch::is_aarch64_feature_detected!("pmull")
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn hardware_aes() -> bool {
    false
}

/// What the records protect.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Protection {
    /// Every record authenticated and encrypted (`peers.encryption = "on"`).
    Encrypted = 1,
    /// Every record authenticated, sent in clear (`peers.encryption =
    /// "off"`, for trusted fabrics).
    Authenticated = 2,
}

impl Protection {
    /// The code in the preamble.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// The protection of a preamble code.
    pub fn from_code(c: u8) -> Option<Protection> {
        [Protection::Encrypted, Protection::Authenticated]
            .into_iter()
            .find(|p| p.code() == c)
    }
}

/// Why the channel refused bytes or could not be set up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChannelError {
    /// The first bytes are not a preamble of this protocol.
    BadPreamble,
    /// The dialer speaks another channel version.
    Version(u8),
    /// The dialer proposed an unknown suite.
    UnknownSuite(u8),
    /// The dialer's protection is not this side's.
    ProtectionMismatch {
        /// What the dialer asked for (its code).
        theirs: u8,
    },
    /// A handshake message of the wrong size.
    HandshakeLength(usize),
    /// A handshake message did not authenticate: the other side does not
    /// hold the job secret, or bytes were changed on the way.
    Handshake,
    /// The handshake payload is not a hello.
    BadHello,
    /// A record length out of range.
    RecordLength(usize),
    /// A record failed its tag.
    Unauthentic,
    /// The record counter would wrap.
    Exhausted,
    /// The Noise library refused its own parameters (a bug).
    Internal,
}

impl fmt::Display for ChannelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChannelError::BadPreamble => write!(f, "not a Granary peer channel"),
            ChannelError::Version(v) => {
                write!(
                    f,
                    "channel version {v}, this agent speaks {CHANNEL_VERSION}"
                )
            }
            ChannelError::UnknownSuite(s) => write!(f, "unknown cipher suite {s}"),
            ChannelError::ProtectionMismatch { theirs } => write!(
                f,
                "the dialer asked for {} records; this agent's peers.encryption differs",
                if *theirs == Protection::Encrypted.code() {
                    "encrypted"
                } else {
                    "authenticated-only"
                }
            ),
            ChannelError::HandshakeLength(n) => write!(f, "handshake message of {n} bytes"),
            ChannelError::Handshake => write!(
                f,
                "handshake did not authenticate (another job secret, or bytes changed on the way)"
            ),
            ChannelError::BadHello => write!(f, "handshake payload is not a hello"),
            ChannelError::RecordLength(n) => write!(f, "record of {n} bytes"),
            ChannelError::Unauthentic => write!(f, "a record failed its authentication tag"),
            ChannelError::Exhausted => write!(f, "record counter exhausted"),
            ChannelError::Internal => write!(f, "channel set-up failed"),
        }
    }
}

impl std::error::Error for ChannelError {}

/// The pre-shared key of a job secret.
pub fn psk_of(secret: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(PSK_LABEL);
    h.update(secret);
    h.finalize().into()
}

/// The dialer's first bytes, in clear.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Preamble {
    /// The AEAD of the channel.
    pub suite: Suite,
    /// What the records protect.
    pub protection: Protection,
}

impl Preamble {
    /// The 8 bytes on the wire.
    pub fn encode(&self) -> [u8; PREAMBLE_LEN] {
        let mut b = [0u8; PREAMBLE_LEN];
        b[..4].copy_from_slice(&MAGIC);
        b[4] = CHANNEL_VERSION;
        b[5] = self.suite.code();
        b[6] = self.protection.code();
        b
    }

    /// Parses and checks a preamble against this side's protection.
    pub fn decode(b: &[u8; PREAMBLE_LEN], ours: Protection) -> Result<Preamble, ChannelError> {
        if b[..4] != MAGIC || b[7] != 0 {
            return Err(ChannelError::BadPreamble);
        }
        if b[4] != CHANNEL_VERSION {
            return Err(ChannelError::Version(b[4]));
        }
        let suite = Suite::from_code(b[5]).ok_or(ChannelError::UnknownSuite(b[5]))?;
        let protection = Protection::from_code(b[6]).ok_or(ChannelError::BadPreamble)?;
        if protection != ours {
            return Err(ChannelError::ProtectionMismatch { theirs: b[6] });
        }
        Ok(Preamble { suite, protection })
    }

    fn prologue(&self) -> Vec<u8> {
        let mut p = PROLOGUE_LABEL.to_vec();
        p.extend_from_slice(&self.encode());
        p
    }
}

/// Randomness for the ephemeral key, handed in by the caller (the core
/// reads no randomness of its own). Fails if asked for more.
struct Entropy(Option<[u8; 32]>);

impl Random for Entropy {
    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), snow::Error> {
        match self.0.take() {
            Some(e) if dest.len() <= e.len() => {
                dest.copy_from_slice(&e[..dest.len()]);
                Ok(())
            }
            _ => Err(snow::Error::Rng),
        }
    }
}

/// The library's own primitives, with the caller's randomness.
struct Resolver {
    entropy: std::sync::Mutex<Option<[u8; 32]>>,
}

impl CryptoResolver for Resolver {
    fn resolve_rng(&self) -> Option<Box<dyn Random>> {
        let e = self.entropy.lock().ok()?.take();
        Some(Box::new(Entropy(e)))
    }
    fn resolve_dh(&self, choice: &snow::params::DHChoice) -> Option<Box<dyn Dh>> {
        DefaultResolver.resolve_dh(choice)
    }
    fn resolve_hash(&self, choice: &snow::params::HashChoice) -> Option<Box<dyn Hash>> {
        DefaultResolver.resolve_hash(choice)
    }
    fn resolve_cipher(&self, choice: &snow::params::CipherChoice) -> Option<Box<dyn Cipher>> {
        DefaultResolver.resolve_cipher(choice)
    }
}

/// One side of the Noise handshake.
pub struct Handshake {
    state: snow::HandshakeState,
    suite: Suite,
    protection: Protection,
}

impl fmt::Debug for Handshake {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Handshake")
            .field("suite", &self.suite)
            .field("protection", &self.protection)
            .field("initiator", &self.state.is_initiator())
            .finish()
    }
}

impl Handshake {
    /// The dialer's side; `entropy` must be fresh randomness (it becomes
    /// the ephemeral private key).
    pub fn initiator(
        preamble: Preamble,
        psk: &[u8; 32],
        entropy: [u8; 32],
    ) -> Result<Handshake, ChannelError> {
        Handshake::build(preamble, psk, entropy, true)
    }

    /// The listener's side, once the dialer's preamble checked out.
    pub fn responder(
        preamble: Preamble,
        psk: &[u8; 32],
        entropy: [u8; 32],
    ) -> Result<Handshake, ChannelError> {
        Handshake::build(preamble, psk, entropy, false)
    }

    fn build(
        preamble: Preamble,
        psk: &[u8; 32],
        entropy: [u8; 32],
        initiator: bool,
    ) -> Result<Handshake, ChannelError> {
        let params: NoiseParams = preamble
            .suite
            .noise_name()
            .parse()
            .map_err(|_| ChannelError::Internal)?;
        let resolver: BoxedCryptoResolver = Box::new(Resolver {
            entropy: std::sync::Mutex::new(Some(entropy)),
        });
        let prologue = preamble.prologue();
        let b = snow::Builder::with_resolver(params, resolver)
            .psk(0, psk)
            .and_then(|b| b.prologue(&prologue))
            .map_err(|_| ChannelError::Internal)?;
        let state = if initiator {
            b.build_initiator()
        } else {
            b.build_responder()
        }
        .map_err(|_| ChannelError::Internal)?;
        Ok(Handshake {
            state,
            suite: preamble.suite,
            protection: preamble.protection,
        })
    }

    /// Writes this side's next handshake message with `payload`, length
    /// prefix included, onto `out`.
    pub fn write(&mut self, payload: &[u8], out: &mut Vec<u8>) -> Result<(), ChannelError> {
        let mut msg = [0u8; MAX_HANDSHAKE_MESSAGE];
        let n = self
            .state
            .write_message(payload, &mut msg)
            .map_err(|_| ChannelError::Internal)?;
        out.extend_from_slice(&(n as u16).to_be_bytes());
        out.extend_from_slice(&msg[..n]);
        Ok(())
    }

    /// Reads the other side's handshake message (without its length
    /// prefix); returns its payload.
    pub fn read(&mut self, message: &[u8]) -> Result<Vec<u8>, ChannelError> {
        if message.len() > MAX_HANDSHAKE_MESSAGE {
            return Err(ChannelError::HandshakeLength(message.len()));
        }
        let mut payload = [0u8; MAX_HANDSHAKE_MESSAGE];
        let n = self
            .state
            .read_message(message, &mut payload)
            .map_err(|_| ChannelError::Handshake)?;
        Ok(payload[..n].to_vec())
    }

    /// Once both messages went: the record keys of each direction.
    pub fn finish(mut self) -> Result<Records, ChannelError> {
        if !self.state.is_handshake_finished() {
            return Err(ChannelError::Internal);
        }
        let (dialer_key, listener_key) = self.state.dangerously_get_raw_split();
        let (send, recv) = if self.state.is_initiator() {
            (dialer_key, listener_key)
        } else {
            (listener_key, dialer_key)
        };
        Ok(Records {
            send: Direction::new(self.suite, &send)?,
            recv: Direction::new(self.suite, &recv)?,
            protection: self.protection,
        })
    }
}

/// One direction's key and counter.
struct Direction {
    key: LessSafeKey,
    suite: Suite,
    n: u64,
}

impl Direction {
    fn new(suite: Suite, key: &[u8; 32]) -> Result<Direction, ChannelError> {
        let alg = match suite {
            Suite::Aes256Gcm => &AES_256_GCM,
            Suite::ChaCha20Poly1305 => &CHACHA20_POLY1305,
        };
        let key = UnboundKey::new(alg, key).map_err(|_| ChannelError::Internal)?;
        Ok(Direction {
            key: LessSafeKey::new(key),
            suite,
            n: 0,
        })
    }

    fn next_nonce(&mut self) -> Result<Nonce, ChannelError> {
        if self.n == u64::MAX {
            return Err(ChannelError::Exhausted);
        }
        let nonce = self.suite.nonce(self.n);
        self.n += 1;
        Ok(nonce)
    }
}

/// The record layer of an established channel (see the module
/// documentation).
pub struct Records {
    send: Direction,
    recv: Direction,
    protection: Protection,
}

impl fmt::Debug for Records {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Records")
            .field("suite", &self.send.suite)
            .field("protection", &self.protection)
            .field("sent", &self.send.n)
            .field("received", &self.recv.n)
            .finish()
    }
}

impl Records {
    /// The suite in use.
    pub fn suite(&self) -> Suite {
        self.send.suite
    }

    /// The protection in use.
    pub fn protection(&self) -> Protection {
        self.protection
    }

    /// Seals `plain` (any length) into records appended to `out`.
    pub fn seal(&mut self, plain: &[u8], out: &mut Vec<u8>) -> Result<(), ChannelError> {
        for chunk in plain.chunks(MAX_RECORD_PLAINTEXT) {
            self.seal_with(chunk.len(), out, |dst| dst.copy_from_slice(chunk))?;
        }
        Ok(())
    }

    /// Appends one record of `len` plaintext bytes (1 ..=
    /// [`MAX_RECORD_PLAINTEXT`]) that `fill` writes in place, so that a
    /// payload is copied once, from its extent into the record.
    pub fn seal_with(
        &mut self,
        len: usize,
        out: &mut Vec<u8>,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<(), ChannelError> {
        if len == 0 || len > MAX_RECORD_PLAINTEXT {
            return Err(ChannelError::RecordLength(len));
        }
        let nonce = self.send.next_nonce()?;
        let start = out.len();
        out.extend_from_slice(&((len + TAG_LEN) as u16).to_be_bytes());
        out.resize(start + LEN_PREFIX + len, 0);
        let body = &mut out[start + LEN_PREFIX..];
        fill(body);
        let tag = match self.protection {
            Protection::Encrypted => {
                self.send
                    .key
                    .seal_in_place_separate_tag(nonce, Aad::empty(), body)
            }
            Protection::Authenticated => {
                self.send
                    .key
                    .seal_in_place_separate_tag(nonce, Aad::from(&*body), &mut [])
            }
        }
        .map_err(|_| ChannelError::Internal)?;
        out.extend_from_slice(tag.as_ref());
        Ok(())
    }

    /// Writes one record of `plain` (1 ..= [`MAX_RECORD_PLAINTEXT`] bytes)
    /// at the start of `out`, sealed straight from `plain` (encrypted
    /// records are encrypted from it in one pass, with no copy first);
    /// returns the record's length, `LEN_PREFIX + plain.len() + TAG_LEN`.
    /// `out` must be at least that long; it is otherwise left as it is.
    pub fn seal_into(&mut self, plain: &[u8], out: &mut [u8]) -> Result<usize, ChannelError> {
        let len = plain.len();
        if len == 0 || len > MAX_RECORD_PLAINTEXT {
            return Err(ChannelError::RecordLength(len));
        }
        let total = LEN_PREFIX + len + TAG_LEN;
        let Some(rec) = out.get_mut(..total) else {
            return Err(ChannelError::RecordLength(total));
        };
        let nonce = self.send.next_nonce()?;
        let (prefix, body) = rec.split_at_mut(LEN_PREFIX);
        prefix.copy_from_slice(&((len + TAG_LEN) as u16).to_be_bytes());
        let (data, tag) = body.split_at_mut(len);
        let sealed = match self.protection {
            Protection::Encrypted => {
                self.send
                    .key
                    .seal_out_of_place_scatter(nonce, Aad::empty(), plain, data, &[], tag)
            }
            Protection::Authenticated => {
                data.copy_from_slice(plain);
                self.send
                    .key
                    .seal_in_place_separate_tag(nonce, Aad::from(plain), &mut [])
                    .map(|t| tag.copy_from_slice(t.as_ref()))
            }
        };
        sealed.map_err(|_| ChannelError::Internal)?;
        Ok(total)
    }

    /// The length of the record starting at `buf` (its body, after the
    /// prefix), once the prefix is there.
    pub fn record_len(buf: &[u8]) -> Result<Option<usize>, ChannelError> {
        let Some(p) = buf.get(..LEN_PREFIX) else {
            return Ok(None);
        };
        let n = usize::from(u16::from_be_bytes([p[0], p[1]]));
        if n <= TAG_LEN {
            return Err(ChannelError::RecordLength(n));
        }
        Ok(Some(n))
    }

    /// Opens one record body (`L` bytes after the prefix) in place; the
    /// plaintext is its first `L - 16` bytes.
    pub fn open(&mut self, body: &mut [u8]) -> Result<usize, ChannelError> {
        let n = body
            .len()
            .checked_sub(TAG_LEN)
            .filter(|&n| n > 0)
            .ok_or(ChannelError::RecordLength(body.len()))?;
        let (data, tag) = body.split_at_mut(n);
        self.open_split(data, tag)?;
        Ok(n)
    }

    /// Opens one record body (`L` bytes after the prefix) into `out`, which
    /// must be exactly `L - 16` bytes: an encrypted record is decrypted
    /// straight into it (a payload into its extent, with no copy after),
    /// an authenticated one checked and copied. `body` is left as it was;
    /// on failure `out` holds unspecified bytes.
    pub fn open_into(&mut self, body: &[u8], out: &mut [u8]) -> Result<(), ChannelError> {
        let n = body
            .len()
            .checked_sub(TAG_LEN)
            .filter(|&n| n > 0 && n == out.len())
            .ok_or(ChannelError::RecordLength(body.len()))?;
        let (data, tag) = body.split_at(n);
        let nonce = self.recv.next_nonce()?;
        let ok = match self.protection {
            Protection::Encrypted => self
                .recv
                .key
                .open_separate_gather(nonce, Aad::empty(), data, tag, out)
                .is_ok(),
            Protection::Authenticated => {
                let ok = self
                    .recv
                    .key
                    .open_in_place_separate_tag(nonce, Aad::from(data), tag, &mut [])
                    .is_ok();
                if ok {
                    out.copy_from_slice(data);
                }
                ok
            }
        };
        if ok {
            Ok(())
        } else {
            Err(ChannelError::Unauthentic)
        }
    }

    /// Opens a record whose plaintext-sized part `data` and tag were read
    /// into separate places (a payload read straight into its extent).
    pub fn open_split(&mut self, data: &mut [u8], tag: &[u8]) -> Result<(), ChannelError> {
        let Ok(tag) = <[u8; TAG_LEN]>::try_from(tag) else {
            return Err(ChannelError::RecordLength(data.len() + tag.len()));
        };
        let nonce = self.recv.next_nonce()?;
        let ok = match self.protection {
            Protection::Encrypted => self
                .recv
                .key
                .open_in_place_separate_tag(nonce, Aad::empty(), &tag, data)
                .is_ok(),
            Protection::Authenticated => self
                .recv
                .key
                .open_in_place_separate_tag(nonce, Aad::from(&*data), &tag, &mut [])
                .is_ok(),
        };
        if ok {
            Ok(())
        } else {
            Err(ChannelError::Unauthentic)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(
        suite: Suite,
        protection: Protection,
        s1: &[u8],
        s2: &[u8],
    ) -> Result<(Records, Records), ChannelError> {
        let pre = Preamble { suite, protection };
        let mut i = Handshake::initiator(pre, &psk_of(s1), [1; 32])?;
        let mut wire = pre.encode().to_vec();
        i.write(b"hello from the dialer", &mut wire)?;
        let got = Preamble::decode(wire[..8].try_into().unwrap(), protection)?;
        let mut r = Handshake::responder(got, &psk_of(s2), [2; 32])?;
        assert_eq!(r.read(&wire[10..])?, b"hello from the dialer");
        let mut back = Vec::new();
        r.write(b"hello from the listener", &mut back)?;
        assert_eq!(i.read(&back[2..])?, b"hello from the listener");
        Ok((i.finish()?, r.finish()?))
    }

    #[test]
    fn both_suites_and_protections_carry_bytes_both_ways() {
        for suite in Suite::ALL {
            for prot in [Protection::Encrypted, Protection::Authenticated] {
                let (mut a, mut b) = pair(suite, prot, b"secret", b"secret").unwrap();
                let msg: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
                let mut wire = Vec::new();
                a.seal(&msg, &mut wire).unwrap();
                // Encrypted records do not show the plaintext; authenticated ones do.
                let shown = wire.windows(64).any(|w| w == &msg[1000..1064]);
                assert_eq!(
                    shown,
                    prot == Protection::Authenticated,
                    "{suite:?} {prot:?}"
                );
                let mut got = Vec::new();
                let mut at = 0;
                while at < wire.len() {
                    let n = Records::record_len(&wire[at..]).unwrap().unwrap();
                    let body = &mut wire[at + 2..at + 2 + n];
                    let p = b.open(body).unwrap();
                    got.extend_from_slice(&body[..p]);
                    at += 2 + n;
                }
                assert_eq!(got, msg);
                // And back.
                let mut wire = Vec::new();
                b.seal(b"answer", &mut wire).unwrap();
                let p = a.open(&mut wire[2..]).unwrap();
                assert_eq!(&wire[2..2 + p], b"answer");
            }
        }
    }

    #[test]
    fn another_secret_fails_at_the_listener() {
        let pre = Preamble {
            suite: Suite::Aes256Gcm,
            protection: Protection::Encrypted,
        };
        let mut i = Handshake::initiator(pre, &psk_of(b"one"), [1; 32]).unwrap();
        let mut wire = Vec::new();
        i.write(b"hi", &mut wire).unwrap();
        let mut r = Handshake::responder(pre, &psk_of(b"two"), [2; 32]).unwrap();
        assert_eq!(r.read(&wire[2..]), Err(ChannelError::Handshake));
    }

    #[test]
    fn flipped_bits_and_replayed_or_reordered_records_fail() {
        for prot in [Protection::Encrypted, Protection::Authenticated] {
            let (mut a, mut b) = pair(Suite::ChaCha20Poly1305, prot, b"k", b"k").unwrap();
            let mut r1 = Vec::new();
            a.seal(b"first record", &mut r1).unwrap();
            let mut r2 = Vec::new();
            a.seal(b"second record", &mut r2).unwrap();
            // Out of order: the counter says record 0, this is record 1.
            let mut x = r2.clone();
            assert_eq!(b.open(&mut x[2..]), Err(ChannelError::Unauthentic));
            let (_, mut b) = pair(Suite::ChaCha20Poly1305, prot, b"k", b"k").unwrap();
            let mut x = r1.clone();
            x[5] ^= 1;
            assert_eq!(b.open(&mut x[2..]), Err(ChannelError::Unauthentic));
        }
    }

    #[test]
    fn the_preamble_is_checked() {
        let pre = Preamble {
            suite: Suite::Aes256Gcm,
            protection: Protection::Encrypted,
        };
        let b = pre.encode();
        assert_eq!(Preamble::decode(&b, Protection::Encrypted), Ok(pre));
        assert_eq!(
            Preamble::decode(&b, Protection::Authenticated),
            Err(ChannelError::ProtectionMismatch { theirs: 1 })
        );
        let mut v = b;
        v[4] = 1;
        assert_eq!(
            Preamble::decode(&v, Protection::Encrypted),
            Err(ChannelError::Version(1))
        );
        let mut s = b;
        s[5] = 9;
        assert_eq!(
            Preamble::decode(&s, Protection::Encrypted),
            Err(ChannelError::UnknownSuite(9))
        );
        let mut m = b;
        m[0] = b'X';
        assert_eq!(
            Preamble::decode(&m, Protection::Encrypted),
            Err(ChannelError::BadPreamble)
        );
    }

    #[test]
    fn a_changed_preamble_breaks_the_handshake() {
        // An attacker flips the suite in flight: the prologue differs.
        let pre = Preamble {
            suite: Suite::Aes256Gcm,
            protection: Protection::Authenticated,
        };
        let mut i = Handshake::initiator(pre, &psk_of(b"k"), [1; 32]).unwrap();
        let mut wire = Vec::new();
        i.write(b"hi", &mut wire).unwrap();
        let forged = Preamble {
            suite: Suite::Aes256Gcm,
            protection: Protection::Encrypted,
        };
        let mut r = Handshake::responder(forged, &psk_of(b"k"), [2; 32]).unwrap();
        assert_eq!(r.read(&wire[2..]), Err(ChannelError::Handshake));
    }

    #[test]
    fn seal_with_fills_in_place_and_checks_the_length() {
        let (mut a, mut b) = pair(Suite::Aes256Gcm, Protection::Encrypted, b"k", b"k").unwrap();
        let mut out = Vec::new();
        assert_eq!(
            a.seal_with(0, &mut out, |_| {}),
            Err(ChannelError::RecordLength(0))
        );
        assert_eq!(
            a.seal_with(MAX_RECORD_PLAINTEXT + 1, &mut out, |_| {}),
            Err(ChannelError::RecordLength(MAX_RECORD_PLAINTEXT + 1))
        );
        a.seal_with(5, &mut out, |d| d.copy_from_slice(b"abcde"))
            .unwrap();
        assert_eq!(out.len(), 2 + 5 + TAG_LEN);
        // Opened with the tag apart, as a payload read into its extent is.
        let mut data = out[2..7].to_vec();
        b.open_split(&mut data, &out[7..]).unwrap();
        assert_eq!(data, b"abcde");
    }

    #[test]
    fn records_sealed_and_opened_out_of_place_match_the_in_place_ones() {
        for suite in Suite::ALL {
            for prot in [Protection::Encrypted, Protection::Authenticated] {
                let (mut a, mut b) = pair(suite, prot, b"k", b"k").unwrap();
                let (mut a2, mut b2) = pair(suite, prot, b"k", b"k").unwrap();
                let plain: Vec<u8> = (0..MAX_RECORD_PLAINTEXT).map(|i| (i * 31) as u8).collect();
                for len in [1, 1000, MAX_RECORD_PLAINTEXT] {
                    let msg = &plain[..len];
                    // The same bytes on the wire as `seal`.
                    let mut want = Vec::new();
                    a.seal(msg, &mut want).unwrap();
                    let mut out = vec![0xee; want.len() + 5];
                    let n = a2.seal_into(msg, &mut out).unwrap();
                    assert_eq!(n, want.len());
                    assert_eq!(&out[..n], &want[..], "{suite:?} {prot:?} {len}");
                    assert!(out[n..].iter().all(|&x| x == 0xee), "past the record");
                    // Opened straight into another buffer, the body unchanged.
                    let mut got = vec![0; len];
                    b.open_into(&out[2..n], &mut got).unwrap();
                    assert_eq!(got, msg);
                    assert_eq!(&out[..n], &want[..]);
                    let p = b2.open(&mut want[2..]).unwrap();
                    assert_eq!(&want[2..2 + p], msg);
                }
                // A flipped bit fails, a wrong size is refused before the
                // counter moves, and too short an output is refused.
                let mut out = vec![0; 100];
                let n = a.seal_into(b"abc", &mut out).unwrap();
                out[3] ^= 1;
                let mut got = [0u8; 3];
                assert_eq!(
                    b.open_into(&out[2..n], &mut [0u8; 2]),
                    Err(ChannelError::RecordLength(n - 2))
                );
                assert_eq!(
                    b.open_into(&out[2..n], &mut got),
                    Err(ChannelError::Unauthentic)
                );
                assert_eq!(
                    a.seal_into(b"abc", &mut [0u8; 20]),
                    Err(ChannelError::RecordLength(21))
                );
                assert_eq!(
                    a.seal_into(b"", &mut out),
                    Err(ChannelError::RecordLength(0))
                );
            }
        }
    }

    #[test]
    fn fastest_here_follows_the_cpu() {
        let s = Suite::fastest_here();
        assert_eq!(s == Suite::Aes256Gcm, hardware_aes());
    }
}

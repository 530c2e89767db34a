//! A session's checkpointable state: where the loader stands in its plan,
//! as bytes to save beside a training checkpoint and open from later, in
//! another process, against the same or a restarted agent.
//!
//! The state holds
//!
//! * the **committed position**: the batches of the plan the loader took
//!   with `next_batch` (not what the agent prefetched), as the index of the
//!   next batch counted across the session's epochs;
//! * the **plan's inputs**: dataset, seed, first epoch and epoch count,
//!   batch size, rank and world size, `drop_last`, the worker split, and
//!   the locality digest when the session ran the locality-aware
//!   assignment;
//! * the **provenance**: the dataset's catalog id as the agent reported it
//!   when the session opened (fingerprint over every sample's name, size
//!   and ETag, mtime or CRC-32C, and a difference sketch).
//!
//! Opening from it ([`SessionOptions::from_state`]) costs what any open
//! costs: the agent starts the plan at the batch (`first_batch`), nothing
//! is replayed. The agent refuses the open with `DatasetChanged`, naming
//! the dataset and the changed objects, when its catalog is not the state's,
//! unless the options accept a changed dataset.
//!
//! Encoding (little-endian), `docs/c-api.md` "Session state":
//!
//! ```text
//! "GRNYSTv1"  dataset(u16 len, bytes)  seed u64  first_epoch u32
//! epoch_count u32  batch_size u32  rank u32  world_size u32  drop_last u8
//! worker u32  workers u32  locality (u8 0|1, 32 bytes if 1)
//! next_batch u64  catalog (u8 0|1; if 1: fingerprint u64, u16 len, sketch)
//! crc32c u32 (of everything before it)
//! ```

use granary_shm::handshake::{CatalogCheck, CatalogId, MAX_DATASET_NAME, MAX_SKETCH};
use granary_shm::ErrorCode;

use crate::error::{Error, Result};
use crate::options::SessionOptions;

/// The first bytes of every state.
const MAGIC: &[u8; 8] = b"GRNYSTv1";

/// Where a session stands and what it was opened with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionState {
    /// The options the plan is made from (`first_batch` is the committed
    /// position: the next batch to hand out, counted across the epochs).
    pub options: SessionOptions,
    /// The dataset's catalog when the session opened (`None` from an agent
    /// that does not report it).
    pub catalog: Option<CatalogId>,
}

fn invalid(why: impl Into<String>) -> Error {
    Error::new(
        ErrorCode::InvalidArgument,
        format!("session state: {}", why.into()),
    )
}

struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.rest.len() < n {
            return Err(invalid("truncated"));
        }
        let (a, b) = self.rest.split_at(n);
        self.rest = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Result<u32> {
        let mut a = [0u8; 4];
        a.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(a))
    }
    fn u64(&mut self) -> Result<u64> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
    fn flag(&mut self, what: &str) -> Result<bool> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(invalid(format!("{what}: flag byte {b}"))),
        }
    }
}

impl SessionState {
    /// The state's bytes (the module's encoding).
    pub fn to_bytes(&self) -> Vec<u8> {
        let o = &self.options;
        let mut out = Vec::with_capacity(128);
        out.extend_from_slice(MAGIC);
        let name = &o.dataset.as_bytes()[..o.dataset.len().min(MAX_DATASET_NAME)];
        out.extend_from_slice(&(name.len() as u16).to_le_bytes());
        out.extend_from_slice(name);
        out.extend_from_slice(&o.seed.to_le_bytes());
        for v in [
            o.first_epoch,
            o.epoch_count,
            o.batch_size,
            o.rank,
            o.world_size,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.push(u8::from(o.drop_last));
        out.extend_from_slice(&o.worker.to_le_bytes());
        out.extend_from_slice(&o.workers.to_le_bytes());
        match &o.locality {
            Some(d) => {
                out.push(1);
                out.extend_from_slice(d);
            }
            None => out.push(0),
        }
        out.extend_from_slice(&o.first_batch.to_le_bytes());
        match &self.catalog {
            Some(c) => {
                let n = c.sketch.len().min(MAX_SKETCH);
                out.push(1);
                out.extend_from_slice(&c.fingerprint.to_le_bytes());
                out.extend_from_slice(&(n as u16).to_le_bytes());
                out.extend_from_slice(&c.sketch[..n]);
            }
            None => out.push(0),
        }
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Decodes a state; `InvalidArgument` naming what is wrong when the
    /// bytes are not one (another format, truncated, a bad checksum).
    pub fn from_bytes(bytes: &[u8]) -> Result<SessionState> {
        if bytes.len() < MAGIC.len() + 4 || &bytes[..MAGIC.len()] != MAGIC {
            return Err(invalid("not a Granary session state (bad magic)"));
        }
        let (body, crc) = bytes.split_at(bytes.len() - 4);
        let crc = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
        if crc32c::crc32c(body) != crc {
            return Err(invalid("checksum mismatch (the bytes were changed or cut)"));
        }
        let mut r = Reader {
            rest: &body[MAGIC.len()..],
        };
        let n = usize::from(r.u16()?);
        let dataset = std::str::from_utf8(r.take(n)?)
            .map_err(|_| invalid("dataset name is not UTF-8"))?
            .to_owned();
        let mut o = SessionOptions::new(dataset);
        o.seed = r.u64()?;
        o.first_epoch = r.u32()?;
        o.epoch_count = r.u32()?;
        o.batch_size = r.u32()?;
        o.rank = r.u32()?;
        o.world_size = r.u32()?;
        o.drop_last = r.flag("drop_last")?;
        o.worker = r.u32()?;
        o.workers = r.u32()?;
        if r.flag("locality")? {
            let mut d = [0u8; 32];
            d.copy_from_slice(r.take(32)?);
            o.locality = Some(d);
        }
        o.first_batch = r.u64()?;
        let catalog = if r.flag("catalog")? {
            let fingerprint = r.u64()?;
            let n = usize::from(r.u16()?);
            if n > MAX_SKETCH {
                return Err(invalid(format!("a {n}-byte sketch")));
            }
            Some(CatalogId {
                fingerprint,
                sketch: r.take(n)?.to_vec(),
            })
        } else {
            None
        };
        if !r.rest.is_empty() {
            return Err(invalid(format!("{} unexpected bytes", r.rest.len())));
        }
        Ok(SessionState {
            options: o,
            catalog,
        })
    }
}

impl SessionOptions {
    /// Options that open the session a saved state describes, at its
    /// committed position, refused by the agent when the dataset changed
    /// since (`DatasetChanged`) unless `accept_changed`. Client-side
    /// settings (timeouts, the CRC check, rings, the view) keep their
    /// defaults; set them on the result.
    pub fn from_state(state: &[u8], accept_changed: bool) -> Result<SessionOptions> {
        let s = SessionState::from_bytes(state)?;
        let mut o = s.options;
        o.catalog_check = s.catalog.map(|expected| CatalogCheck {
            expected,
            accept_changed,
        });
        Ok(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> SessionState {
        let mut o = SessionOptions::new("imagenet");
        o.seed = 42;
        o.first_epoch = 3;
        o.epoch_count = 2;
        o.batch_size = 256;
        o.rank = 1;
        o.world_size = 4;
        o.drop_last = true;
        o.worker = 1;
        o.workers = 3;
        o.locality = Some([7; 32]);
        o.first_batch = 123;
        SessionState {
            options: o,
            catalog: Some(CatalogId {
                fingerprint: 0xfeed,
                sketch: vec![1, 2, 3],
            }),
        }
    }

    #[test]
    fn round_trips() {
        let s = sample();
        assert_eq!(SessionState::from_bytes(&s.to_bytes()), Ok(s.clone()));
        let mut bare = s;
        bare.catalog = None;
        bare.options.locality = None;
        assert_eq!(SessionState::from_bytes(&bare.to_bytes()), Ok(bare));
    }

    #[test]
    fn every_changed_or_cut_byte_is_refused() {
        let b = sample().to_bytes();
        for i in 0..b.len() {
            let mut c = b.clone();
            c[i] ^= 0x40;
            let e = SessionState::from_bytes(&c).expect_err("changed byte");
            assert_eq!(e.code(), ErrorCode::InvalidArgument);
            assert!(
                SessionState::from_bytes(&b[..i]).is_err(),
                "cut at {i} accepted"
            );
        }
    }

    #[test]
    fn options_from_state_carry_the_position_and_the_check() {
        let b = sample().to_bytes();
        let o = SessionOptions::from_state(&b, false).expect("decodes");
        assert_eq!(o.first_batch, 123);
        assert_eq!((o.worker, o.workers), (1, 3));
        let c = o.catalog_check.expect("checked");
        assert_eq!(c.expected.fingerprint, 0xfeed);
        assert!(!c.accept_changed);
        let e = SessionOptions::from_state(b"not a state at all", false).expect_err("garbage");
        assert!(e.to_string().contains("bad magic"), "{e}");
    }
}

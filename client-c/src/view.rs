//! The job's membership view as loaders build it: each rank asks its agent
//! who it is ([`crate::Client::peer_identity`]), the job gathers the
//! answers (in Python through its `torch.distributed` process group), and
//! every rank hands the same view to its agent when it opens a session
//! ([`crate::SessionOptions::view`]).

use granary_peer::view::{Member, View};
use granary_shm::ErrorCode;

use crate::error::{Error, Result};

/// One agent of a job, as it described itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ViewMember {
    /// Its stable node id.
    pub id: String,
    /// `HOST:PORT` its peers reach it at.
    pub addr: String,
    /// Bytes of its arena kept for the job.
    pub capacity: u64,
}

/// The canonical encoding of the view of job `job_id` at `epoch` (a
/// relaunch hands in a higher epoch) with `members` (in any order; the same
/// node listed twice with the same address and capacity counts once).
///
/// Errors: `GRANARY_E_INVALID_ARGUMENT` for an empty job id or member list,
/// a node listed twice with different addresses or capacities, or names
/// longer than 255 bytes.
pub fn encode_view(job_id: &str, epoch: u64, members: &[ViewMember]) -> Result<Vec<u8>> {
    let mut ms: Vec<ViewMember> = members.to_vec();
    ms.sort_by(|a, b| a.id.cmp(&b.id));
    ms.dedup();
    let view = View::new(
        job_id,
        epoch,
        ms.into_iter()
            .map(|m| Member::new(m.id, m.addr, m.capacity)),
    )
    .map_err(|e| Error::new(ErrorCode::InvalidArgument, format!("view: {e}")))?;
    Ok(view.encode())
}

/// The digest of an encoded view (SHA-256 of its canonical bytes), as the
/// agent reports it.
pub fn view_digest(encoded: &[u8]) -> Result<[u8; 32]> {
    View::decode(encoded)
        .map(|v| v.digest().0)
        .map_err(|e| Error::new(ErrorCode::InvalidArgument, format!("view: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(id: &str, addr: &str, capacity: u64) -> ViewMember {
        ViewMember {
            id: id.into(),
            addr: addr.into(),
            capacity,
        }
    }

    #[test]
    fn the_encoding_ignores_order_and_repeats_and_refuses_conflicts() {
        let a = encode_view("j", 3, &[m("b", "h2:1", 5), m("a", "h1:1", 5)]).unwrap();
        let b = encode_view(
            "j",
            3,
            &[m("a", "h1:1", 5), m("b", "h2:1", 5), m("a", "h1:1", 5)],
        )
        .unwrap();
        assert_eq!(a, b);
        assert_eq!(view_digest(&a).unwrap(), view_digest(&b).unwrap());
        let c = encode_view("j", 4, &[m("a", "h1:1", 5), m("b", "h2:1", 5)]).unwrap();
        assert_ne!(view_digest(&a).unwrap(), view_digest(&c).unwrap());
        let e = encode_view("j", 3, &[m("a", "h1:1", 5), m("a", "h9:1", 5)]).unwrap_err();
        assert_eq!(e.code(), ErrorCode::InvalidArgument);
        assert!(encode_view("", 3, &[m("a", "h1:1", 5)]).is_err());
        assert!(encode_view("j", 3, &[]).is_err());
        assert!(view_digest(b"not a view").is_err());
    }
}

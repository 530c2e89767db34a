//! The job's membership view as loaders build it: each rank asks its agent
//! who it is ([`crate::Client::peer_identity`]), the job gathers the
//! answers (in Python through its `torch.distributed` process group), and
//! every rank hands the same view to its agent when it opens a session
//! ([`crate::SessionOptions::view`]).

use granary_peer::assign::Layout;
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

/// The canonical encoding of a job's rank layout for the locality-aware
/// assignment: `node_of_rank[r]` is the node id (a member of the encoded
/// view `view`) rank `r` runs on. With `workers` sessions per rank (e.g.
/// DataLoader workers), session rank `r · workers + w` runs where rank `r`
/// does, as the sessions are numbered.
///
/// Errors: `GRANARY_E_INVALID_ARGUMENT` for a malformed view, a node id
/// that is not in the view, no ranks, `workers` 0 or a layout of more than
/// `u32::MAX` session ranks.
pub fn encode_layout(view: &[u8], node_of_rank: &[&str], workers: u32) -> Result<Vec<u8>> {
    let bad = |why: String| Error::new(ErrorCode::InvalidArgument, why);
    let view = View::decode(view).map_err(|e| bad(format!("view: {e}")))?;
    if workers == 0 {
        return Err(bad("workers: must be at least 1".into()));
    }
    let total = (node_of_rank.len() as u64) * u64::from(workers);
    if total > u64::from(u32::MAX) {
        return Err(bad(format!(
            "{total} session ranks: at most {} are allowed",
            u32::MAX
        )));
    }
    let mut nodes = Vec::with_capacity(total as usize);
    for (rank, id) in node_of_rank.iter().enumerate() {
        let v = view.index_of(id).ok_or_else(|| {
            bad(format!(
                "rank {rank} runs on node {id:?}, which is not in the view of job {:?}",
                view.job_id()
            ))
        })?;
        nodes.extend(std::iter::repeat_n(v as u32, workers as usize));
    }
    Layout::new(view.len() as u32, nodes)
        .map(|l| l.encode())
        .map_err(|e| bad(format!("layout: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_name_view_members_and_expand_workers() {
        let view = encode_view("j", 1, &[m("b", "h2:1", 5), m("a", "h1:1", 5)]).unwrap();
        let bytes = encode_layout(&view, &["b", "a", "b"], 2).unwrap();
        let layout = Layout::decode(&bytes).unwrap();
        assert_eq!(layout.nodes(), 2);
        assert_eq!(layout.world_size(), 6);
        // Members are sorted by id: a is 0, b is 1.
        assert_eq!(layout.ranks_of(1), &[0, 1, 4, 5]);
        assert_eq!(layout.ranks_of(0), &[2, 3]);
        let e = encode_layout(&view, &["a", "c"], 1).unwrap_err();
        assert!(e.message().contains("rank 1 runs on node \"c\""), "{e}");
        assert!(encode_layout(&view, &["a"], 0).is_err());
        assert!(encode_layout(&view, &[], 1).is_err());
        assert!(encode_layout(b"junk", &["a"], 1).is_err());
    }

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

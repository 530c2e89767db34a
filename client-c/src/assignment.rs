//! The locality-aware assignment as loaders use it: the job's rank layout
//! ([`encode_layout`]), and the rule by which a job decides its mode from
//! every rank's [`AssignmentInfo`] ([`agree`]).
//!
//! The locality order is only correct when every rank uses it with the
//! same inputs (otherwise a step loses some samples and repeats others), so
//! the job agrees first: every rank asks its agent
//! ([`crate::Client::assignment`]), the answers are gathered (in Python
//! through the job's process group), and every rank opens with
//! `locality = Some(digest)` only when [`agree`] says so, else in exact
//! order. [`agree`] is a pure function of the gathered answers, so every
//! rank reaches the same decision.

use granary_peer::assign::Layout;
use granary_peer::view::View;
use granary_shm::handshake::AssignmentInfo;
use granary_shm::ErrorCode;

use crate::error::{Error, Result};

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

/// What a job decided from its ranks' answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Agreement {
    /// Every rank can run the locality-aware assignment with these inputs.
    Locality([u8; 32]),
    /// Exact order, and why (for the job's log).
    Exact(String),
}

/// The job's decision from `infos[r]`, rank `r`'s answer: locality when
/// every rank has it with one digest, else exact order with a reason that
/// names the first rank that differs.
pub fn agree(infos: &[AssignmentInfo]) -> Agreement {
    let Some(first) = infos.first() else {
        return Agreement::Exact("no rank answered".into());
    };
    if let Some((r, i)) = infos.iter().enumerate().find(|(_, i)| !i.locality) {
        return Agreement::Exact(format!(
            "rank {r} cannot run the locality-aware assignment: {}",
            i.note
        ));
    }
    if let Some((r, i)) = infos
        .iter()
        .enumerate()
        .find(|(_, i)| i.digest != first.digest)
    {
        return Agreement::Exact(format!(
            "rank {r}'s inputs (digest {}…) differ from rank 0's ({}…): \
             the ranks disagree on the seed, epochs, batch size, view, layout or dataset",
            hex6(&i.digest),
            hex6(&first.digest)
        ));
    }
    Agreement::Locality(first.digest)
}

fn hex6(d: &[u8; 32]) -> String {
    d[..6].iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{encode_view, ViewMember};

    #[test]
    fn layouts_name_view_members_and_expand_workers() {
        let members: Vec<ViewMember> = [("b", "h2:1"), ("a", "h1:1")]
            .into_iter()
            .map(|(id, addr)| ViewMember {
                id: id.into(),
                addr: addr.into(),
                capacity: 5,
            })
            .collect();
        let view = encode_view("j", 1, &members).unwrap();
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

    #[test]
    fn the_job_agrees_only_on_one_digest_everywhere() {
        let yes = |d: u8| AssignmentInfo {
            locality: true,
            digest: [d; 32],
            note: String::new(),
        };
        assert_eq!(agree(&[yes(1), yes(1)]), Agreement::Locality([1; 32]));
        let Agreement::Exact(why) = agree(&[yes(1), yes(1), yes(2)]) else {
            panic!("a differing digest agreed");
        };
        assert!(
            why.starts_with("rank 2's inputs (digest 020202020202…)"),
            "{why}"
        );
        let no = AssignmentInfo {
            locality: false,
            digest: [0; 32],
            note: "no peers".into(),
        };
        let Agreement::Exact(why) = agree(&[yes(1), no]) else {
            panic!("an unavailable rank agreed");
        };
        assert_eq!(
            why,
            "rank 1 cannot run the locality-aware assignment: no peers"
        );
        assert!(matches!(agree(&[]), Agreement::Exact(_)));
    }
}

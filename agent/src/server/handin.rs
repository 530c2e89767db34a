//! Views and rank layouts handed in chunk by chunk, bounded per uid.
//!
//! A loader hands in its job's membership view (`ViewChunk`) and its rank
//! layout (`LayoutChunk`) in pieces of at most `VIEW_CHUNK` bytes
//! (`docs/peers.md`, "Views handed in at session open"). Each connection
//! reassembles its hand-ins under these rules:
//!
//! * views are taken only with `peers.membership = "session"`, and with
//!   `"dns"` only from the agent's own process (its resolver, `peers::dns`);
//!   layouts only with peers on: otherwise every chunk is refused as it
//!   arrives and nothing is buffered;
//! * a view may announce no more bytes than the longest encoding of a view
//!   of `peers.max_members` members (and at most `MAX_VIEW_BYTES`);
//! * the bytes announced by the hand-ins in progress of one uid, over all of
//!   its connections, stay within `peers.handin_bytes_per_uid`: a hand-in
//!   that would pass it is refused (`Busy`) at its first chunk, before
//!   anything of it is buffered. A hand-in counts from its first chunk until
//!   its last one arrives, it is refused, or its connection ends; what it
//!   buffers never exceeds what it announced.
//!
//! A refused hand-in is answered once, at the chunk that is refused; the
//! rest of its chunks are dropped as they arrive, and the next chunk at
//! offset 0 starts a new hand-in.

use crate::config::{Membership, MembershipSetting, PeersConfig};
use granary_shm::handshake::{ErrorReply, ViewAssembler, ViewChunk, MAX_VIEW_BYTES};
use granary_shm::ErrorCode;
use std::collections::HashMap;

/// The rules of [`Intake::push`], from `[peers]`.
#[derive(Debug, Clone)]
pub(crate) struct Rules {
    membership: Membership,
    /// `"dns"`: views come from the agent's own resolver only.
    dns: bool,
    max_members: u32,
    /// The most bytes a view may announce.
    max_view_bytes: u32,
    per_uid: u64,
}

impl Rules {
    pub(crate) fn new(peers: &PeersConfig) -> Rules {
        let longest = granary_peer::view::max_encoded_len(peers.max_members as usize);
        Rules {
            membership: peers.membership,
            dns: peers.membership_setting == MembershipSetting::Dns,
            max_members: peers.max_members,
            max_view_bytes: u32::try_from(longest)
                .unwrap_or(u32::MAX)
                .min(MAX_VIEW_BYTES),
            per_uid: peers.handin_bytes_per_uid.bytes(),
        }
    }
}

/// Bytes announced by each uid's hand-ins in progress.
#[derive(Debug, Default)]
pub(crate) struct Budget {
    used: HashMap<u32, u64>,
}

impl Budget {
    /// Bytes `uid`'s hand-ins in progress announced.
    pub(crate) fn used(&self, uid: u32) -> u64 {
        self.used.get(&uid).copied().unwrap_or(0)
    }

    fn release(&mut self, uid: u32, bytes: u64) {
        if bytes == 0 {
            return;
        }
        if let Some(u) = self.used.get_mut(&uid) {
            *u = u.saturating_sub(bytes);
            if *u == 0 {
                self.used.remove(&uid);
            }
        }
    }
}

/// What is handed in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    View,
    Layout,
}

/// What became of a chunk.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// More chunks are due.
    Pending,
    /// The hand-in is complete.
    Done(Vec<u8>),
    /// The hand-in is refused: answer this once. The reason is the
    /// `reason` label of its count.
    Refused(&'static str, ErrorReply),
    /// A chunk of a hand-in refused before: dropped.
    Dropped,
}

/// One connection's hand-in of one kind.
#[derive(Debug)]
pub(crate) struct Intake {
    kind: Kind,
    asm: ViewAssembler,
    /// Bytes the hand-in in progress announced, counted in its uid's budget.
    charged: u64,
    /// The rest of a refused hand-in is being dropped.
    dropping: bool,
    /// The connection is the agent's own process (its DNS resolver).
    from_agent: bool,
}

impl Intake {
    pub(crate) fn new(kind: Kind) -> Intake {
        Intake {
            kind,
            asm: match kind {
                Kind::View => ViewAssembler::default(),
                Kind::Layout => ViewAssembler::for_layout(),
            },
            charged: 0,
            dropping: false,
            from_agent: false,
        }
    }

    /// The intake of a connection from the agent's own process (the
    /// kernel's `SO_PEERCRED` pid is the agent's): the only one a `"dns"`
    /// agent takes views from.
    pub(crate) fn of_agent(mut self, yes: bool) -> Intake {
        self.from_agent = yes;
        self
    }

    /// Bytes held for the hand-in in progress.
    #[cfg(test)]
    pub(crate) fn pending(&self) -> usize {
        self.asm.pending()
    }

    /// Takes a chunk from a loader of `uid` (see the module documentation).
    pub(crate) fn push(
        &mut self,
        c: ViewChunk,
        uid: u32,
        rules: &Rules,
        budget: &mut Budget,
    ) -> Outcome {
        let last = u64::from(c.offset) + c.bytes.len() as u64 >= u64::from(c.total);
        if self.dropping && c.offset != 0 {
            self.dropping = !last;
            return Outcome::Dropped;
        }
        self.dropping = false;
        if let Some((reason, reply)) = self.check(&c, uid, rules, budget) {
            self.abandon(uid, budget);
            self.dropping = !last;
            return Outcome::Refused(reason, reply);
        }
        let out = self.asm.push(c);
        if self.asm.pending() == 0 {
            // Complete, or refused and started over: no longer in progress.
            budget.release(uid, std::mem::take(&mut self.charged));
        }
        match out {
            Ok(Some(bytes)) => Outcome::Done(bytes),
            Ok(None) => Outcome::Pending,
            Err(reply) => {
                self.dropping = !last;
                Outcome::Refused("malformed", reply)
            }
        }
    }

    /// Why chunk `c` is refused before it is buffered, if it is: the
    /// membership, the view's size, the uid's budget (charged here when a
    /// hand-in starts).
    fn check(
        &mut self,
        c: &ViewChunk,
        uid: u32,
        rules: &Rules,
        budget: &mut Budget,
    ) -> Option<(&'static str, ErrorReply)> {
        let refuse = |code, message: String| ErrorReply { code, message };
        let mode = match rules.membership {
            Membership::Off => "off",
            Membership::Static => "static",
            Membership::Slurm => "slurm",
            Membership::Session => "session",
        };
        match self.kind {
            Kind::View if rules.dns && !self.from_agent => {
                return Some((
                    "membership",
                    refuse(
                        ErrorCode::InvalidArgument,
                        "this agent's view comes from the DNS records of peers.dns_name \
                         (peers.membership = \"dns\"); it takes no view from loaders"
                            .into(),
                    ),
                ));
            }
            Kind::View if rules.membership != Membership::Session => {
                let why = if rules.membership == Membership::Off {
                    "peers are off on this agent (peers.membership = \"off\"); the session reads the store".to_string()
                } else {
                    format!(
                        "this agent's view comes from its configuration (peers.membership = \"{mode}\"); \
                         it takes no view from loaders"
                    )
                };
                return Some(("membership", refuse(ErrorCode::InvalidArgument, why)));
            }
            Kind::Layout if rules.membership == Membership::Off => {
                return Some((
                    "membership",
                    refuse(
                        ErrorCode::InvalidArgument,
                        "peers are off on this agent (peers.membership = \"off\"): a rank layout has no use here"
                            .into(),
                    ),
                ));
            }
            Kind::View if c.total > rules.max_view_bytes => {
                return Some((
                    "max_members",
                    refuse(
                        ErrorCode::InvalidArgument,
                        format!(
                            "view: {} bytes announced, more than a view of peers.max_members ({}) members \
                             can take ({} bytes)",
                            c.total, rules.max_members, rules.max_view_bytes
                        ),
                    ),
                ));
            }
            _ => {}
        }
        // A hand-in starts: its announced bytes count in its uid's budget.
        if self.charged == 0 && self.asm.pending() == 0 && c.offset == 0 {
            let total = u64::from(c.total);
            let used = budget.used(uid);
            if used + total > rules.per_uid {
                let what = match self.kind {
                    Kind::View => "view",
                    Kind::Layout => "layout",
                };
                return Some((
                    "handin_bytes",
                    refuse(
                        ErrorCode::Busy,
                        format!(
                            "{what} of {total} bytes refused: the loaders of uid {uid} are handing in \
                             {used} bytes already, and peers.handin_bytes_per_uid is {}; try again \
                             once they are done",
                            rules.per_uid
                        ),
                    ),
                ));
            }
            *budget.used.entry(uid).or_default() += total;
            self.charged = total;
        }
        None
    }

    /// Forgets the hand-in in progress (its connection ended, or it was
    /// refused): its bytes leave the uid's budget.
    pub(crate) fn abandon(&mut self, uid: u32, budget: &mut Budget) {
        budget.release(uid, std::mem::take(&mut self.charged));
        self.asm = match self.kind {
            Kind::View => ViewAssembler::default(),
            Kind::Layout => ViewAssembler::for_layout(),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use granary_shm::handshake::VIEW_CHUNK;

    fn rules(membership: &str, extra: &str) -> Rules {
        let cfg = crate::config::Config::from_toml_str(&format!(
            "[peers]\nmembership = \"{membership}\"\nsecret = \"c5c64913cdf6c5268fb4da6deb8e09a0d04bcf1ff53244dbd5dd0c9bddaead23\"\njob_id = \"j\"\nnode_id = \"a\"\n\
             {}{extra}\n[[dataset]]\nname = \"d\"\nroot = \"/tmp\"\n",
            if membership == "static" {
                "members = [{ id = \"a\", addr = \"h:1\" }]\n"
            } else {
                ""
            }
        ))
        .unwrap();
        Rules::new(&cfg.peers)
    }

    fn bytes(n: usize) -> Vec<u8> {
        (0..n).map(|i| i as u8).collect()
    }

    /// Pushes every chunk of `b`; the outcomes.
    fn hand_in(i: &mut Intake, b: &[u8], uid: u32, r: &Rules, budget: &mut Budget) -> Vec<Outcome> {
        ViewChunk::split(b)
            .into_iter()
            .map(|c| i.push(c, uid, r, budget))
            .collect()
    }

    #[test]
    fn chunks_under_static_or_off_membership_are_refused_once_and_never_buffered() {
        for (membership, kinds) in [
            ("static", &[Kind::View][..]),
            ("slurm", &[Kind::View][..]),
            ("off", &[Kind::View, Kind::Layout][..]),
        ] {
            let r = rules(membership, "");
            for &kind in kinds {
                let mut budget = Budget::default();
                let mut i = Intake::new(kind);
                let out = hand_in(&mut i, &bytes(3 * VIEW_CHUNK + 5), 1000, &r, &mut budget);
                assert_eq!(out.len(), 4);
                match &out[0] {
                    Outcome::Refused("membership", e) => {
                        assert_eq!(e.code, ErrorCode::InvalidArgument);
                        assert!(e.message.contains(membership), "{}", e.message);
                    }
                    other => panic!("{membership} {kind:?}: {other:?}"),
                }
                assert!(
                    out[1..].iter().all(|o| *o == Outcome::Dropped),
                    "{membership} {kind:?}: answered once: {out:?}"
                );
                assert_eq!(i.pending(), 0, "nothing buffered");
                assert_eq!(i.asm.allocated(), 0, "nothing allocated");
                assert_eq!(budget.used(1000), 0);
                // The next hand-in is answered again.
                let again = hand_in(&mut i, &bytes(10), 1000, &r, &mut budget);
                assert!(matches!(again[..], [Outcome::Refused("membership", _)]));
            }
        }
        // A layout is taken under static membership (locality needs it).
        let r = rules("static", "");
        let mut i = Intake::new(Kind::Layout);
        let out = hand_in(
            &mut i,
            &bytes(VIEW_CHUNK + 1),
            7,
            &r,
            &mut Budget::default(),
        );
        assert_eq!(out.last(), Some(&Outcome::Done(bytes(VIEW_CHUNK + 1))));
    }

    #[test]
    fn a_dns_agent_takes_views_from_its_own_process_only() {
        let cfg = crate::config::Config::from_toml_str(
            "[peers]\nmembership = \"dns\"\ndns_name = \"granary-peers\"\n\
             secret = \"c5c64913cdf6c5268fb4da6deb8e09a0d04bcf1ff53244dbd5dd0c9bddaead23\"\n\
             [[dataset]]\nname = \"d\"\nroot = \"/tmp\"\n",
        )
        .unwrap();
        let r = Rules::new(&cfg.peers);
        let view = bytes(VIEW_CHUNK + 3);
        // A loader's view: refused at its first chunk, naming DNS, nothing
        // buffered.
        let mut budget = Budget::default();
        let mut loader = Intake::new(Kind::View);
        let out = hand_in(&mut loader, &view, 1000, &r, &mut budget);
        match &out[0] {
            Outcome::Refused("membership", e) => {
                assert_eq!(e.code, ErrorCode::InvalidArgument);
                assert!(e.message.contains("peers.dns_name"), "{}", e.message);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(out[1], Outcome::Dropped);
        assert_eq!(loader.pending(), 0);
        assert_eq!(budget.used(1000), 0);
        // The agent's own resolver: taken whole.
        let mut own = Intake::new(Kind::View).of_agent(true);
        let out = hand_in(&mut own, &view, 1000, &r, &mut budget);
        assert_eq!(out.last(), Some(&Outcome::Done(view.clone())));
        // Under "session" a loader's view is taken as before.
        let r = rules("session", "");
        let mut loader = Intake::new(Kind::View);
        let out = hand_in(&mut loader, &view, 1000, &r, &mut Budget::default());
        assert_eq!(out.last(), Some(&Outcome::Done(view)));
    }

    #[test]
    fn a_view_larger_than_max_members_can_take_is_refused_at_its_first_chunk() {
        let r = rules("session", "max_members = 2");
        let longest = granary_peer::view::max_encoded_len(2);
        let mut budget = Budget::default();
        let mut i = Intake::new(Kind::View);
        let out = hand_in(&mut i, &bytes(longest + 1), 0, &r, &mut budget);
        assert!(
            matches!(&out[0], Outcome::Refused("max_members", e) if e.message.contains("peers.max_members (2)")),
            "{:?}",
            out[0]
        );
        assert!(out[1..].iter().all(|o| *o == Outcome::Dropped));
        assert_eq!((i.pending(), budget.used(0)), (0, 0));
        let out = hand_in(&mut i, &bytes(longest), 0, &r, &mut budget);
        assert_eq!(out.last(), Some(&Outcome::Done(bytes(longest))));
    }

    #[test]
    fn one_uid_hands_in_at_most_its_bound_over_all_its_connections() {
        // 64 KiB per uid: two hand-ins of 30 KiB at once, not three.
        let r = rules("session", "handin_bytes_per_uid = \"64KiB\"");
        let size = 30 << 10;
        let b = bytes(size);
        let chunks = ViewChunk::split(&b);
        let mut budget = Budget::default();
        let mut conns: Vec<Intake> = (0..3).map(|_| Intake::new(Kind::View)).collect();
        // Every connection parks a partial view (its first chunk).
        let first: Vec<Outcome> = conns
            .iter_mut()
            .map(|i| i.push(chunks[0].clone(), 1000, &r, &mut budget))
            .collect();
        assert_eq!(first[0], Outcome::Pending);
        assert_eq!(first[1], Outcome::Pending);
        match &first[2] {
            Outcome::Refused("handin_bytes", e) => {
                assert_eq!(e.code, ErrorCode::Busy);
                assert!(e.message.contains("uid 1000"), "{}", e.message);
                assert!(
                    e.message.contains("peers.handin_bytes_per_uid"),
                    "{}",
                    e.message
                );
            }
            other => panic!("the third hand-in: {other:?}"),
        }
        assert_eq!(budget.used(1000), 2 * size as u64);
        assert_eq!(conns[2].pending(), 0, "the refused one buffered nothing");
        // Its remaining chunks are dropped without another answer.
        for c in &chunks[1..] {
            assert_eq!(
                conns[2].push(c.clone(), 1000, &r, &mut budget),
                Outcome::Dropped
            );
        }
        // Another uid has its own budget, a layout shares the uid's.
        let mut other = Intake::new(Kind::View);
        assert_eq!(
            other.push(chunks[0].clone(), 1001, &r, &mut budget),
            Outcome::Pending
        );
        let mut layout = Intake::new(Kind::Layout);
        assert!(matches!(
            layout.push(chunks[0].clone(), 1000, &r, &mut budget),
            Outcome::Refused("handin_bytes", _)
        ));
        // A finished hand-in gives its bytes back; a closed connection too.
        let mut done = None;
        for c in &chunks[1..] {
            if let Outcome::Done(v) = conns[0].push(c.clone(), 1000, &r, &mut budget) {
                done = Some(v);
            }
        }
        assert_eq!(done, Some(b.clone()));
        assert_eq!(budget.used(1000), size as u64);
        conns[1].abandon(1000, &mut budget);
        assert_eq!(budget.used(1000), 0);
        assert_eq!(budget.used(1001), size as u64);
        // Now the refused connection's next hand-in goes through.
        let out = hand_in(&mut conns[2], &b, 1000, &r, &mut budget);
        assert_eq!(out.last(), Some(&Outcome::Done(b)));
        assert_eq!(budget.used(1000), 0);
    }

    #[test]
    fn a_malformed_hand_in_is_answered_once_and_gives_its_bytes_back() {
        let r = rules("session", "");
        let b = bytes(3 * VIEW_CHUNK);
        let chunks = ViewChunk::split(&b);
        let mut budget = Budget::default();
        let mut i = Intake::new(Kind::View);
        assert_eq!(
            i.push(chunks[0].clone(), 5, &r, &mut budget),
            Outcome::Pending
        );
        assert_eq!(budget.used(5), b.len() as u64);
        // The third chunk before the second.
        assert!(matches!(
            i.push(chunks[2].clone(), 5, &r, &mut budget),
            Outcome::Refused("malformed", _)
        ));
        assert_eq!((i.pending(), budget.used(5)), (0, 0));
        // That was its last chunk: the next one is looked at again.
        assert!(matches!(
            i.push(chunks[1].clone(), 5, &r, &mut budget),
            Outcome::Refused("malformed", _)
        ));
        assert_eq!(
            i.push(chunks[2].clone(), 5, &r, &mut budget),
            Outcome::Dropped
        );
        let out = hand_in(&mut i, &b, 5, &r, &mut budget);
        assert_eq!(out.last(), Some(&Outcome::Done(b)));
    }
}

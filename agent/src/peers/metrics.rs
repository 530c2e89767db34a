//! The peer tier's metrics: where samples came from (arena, peer, store),
//! what was asked of peers and what they answered, what this agent served,
//! and each peer's state and round trip. Registered with the agent's other
//! metrics (`docs/operations.md` lists them).

use super::transport::LinkTransport;
use crate::metrics::primitives::{Counter, Gauge};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Labels of one series: `[(name, value)]`.
pub type Labels = Vec<(String, String)>;

/// Upper bounds (seconds) of the round-trip histogram.
const RTT_BUCKETS: [f64; 10] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.05, 0.25,
];

fn rtt_histogram() -> Histogram {
    Histogram::new(RTT_BUCKETS)
}

/// The peer tier's counters.
#[derive(Debug)]
pub struct PeerMetrics {
    /// Samples a session needed, by where they came from: `arena` (already
    /// here or being read here), `peer`, `store`.
    pub tier_samples: Family<Labels, Counter>,
    /// Bytes brought in, by tier (`peer`, `store`).
    pub tier_bytes: Family<Labels, Counter>,
    /// Requests sent to peers.
    pub gets_sent: Counter,
    /// Requests that came back without the block, by reason (a miss
    /// reason, `corrupt` or `connection`): each was read from the store.
    pub gets_failed: Family<Labels, Counter>,
    /// Blocks that failed their CRC check.
    pub crc_failures: Counter,
    /// Requests also sent to the store because the block had not begun to
    /// arrive within `peers.hedge_after_ms`.
    pub hedged: Counter,
    /// Blocks that arrived after their hedge's store read began: dropped.
    pub late_discarded: Counter,
    /// Cancels sent for requests handed to the store (hedged, or of a peer
    /// found slow), so that the owner drops what it has not begun to send.
    pub cancels_sent: Counter,
    /// Store reads of kept samples not started because every peer request
    /// waiting for them was cancelled.
    pub reads_not_started: Counter,
    /// Blocks served to peers.
    pub served: Counter,
    /// Bytes served to peers.
    pub served_bytes: Counter,
    /// Peers' requests answered with a miss, by reason.
    pub served_misses: Family<Labels, Counter>,
    /// 1 while an authenticated connection to the peer is up.
    pub peer_up: Family<Labels, Gauge>,
    /// 1 for the transport carrying blocks to the peer (`tcp`, `rdma`,
    /// `rdma-fallback`), 0 for the others.
    pub peer_transport: Family<Labels, Gauge>,
    /// 1 while the requester finds the peer slow (its samples are read
    /// from the store; `docs/peers.md`, "Slow peers").
    pub peer_slow: Family<Labels, Gauge>,
    /// Round trips to each peer, from keepalives.
    pub rtt: Family<Labels, Histogram, fn() -> Histogram>,
    /// Views handed in by loaders, by outcome: `installed` (it became the
    /// agent's view), `joined` (it was the agent's view already),
    /// `refused` (with a `reason`: `uid`, `max_members`, `membership`,
    /// `handin_bytes`, `malformed`, `other`).
    pub views: Family<Labels, Counter>,
    /// Sessions ended because a newer view of their job was installed.
    pub sessions_ended_by_view: Counter,
    /// The epoch of the view the agent holds (0 without one).
    pub view_epoch: Gauge,
    /// Samples of the batches this agent's sessions planned, by `mode`
    /// (`exact`, `locality`) and `placement` (`local`: kept here, `peer`:
    /// kept by another node, `uncached`: kept by none).
    pub assigned: Family<Labels, Counter>,
    /// Connections, blocks and requests refused or cut off by the tier's
    /// bounds and checks, by reason (`docs/security.md`).
    pub rejected: Family<Labels, Counter>,
    /// Samples of an owner whose connection dropped, by what became of
    /// them (`peers.owner_grace_ms`): `parked` (each wait), `returned`
    /// (asked again once the owner was back, restarted), `expired` (the
    /// grace ended), `blocked` (a loader waited on it for
    /// `peers.owner_grace_blocked_ms`), `rejoined` (the owner came back as
    /// it was: its connection had failed); the last three read from the
    /// store.
    pub grace: Family<Labels, Counter>,
    /// Handles on the `tier` series, updated without locks.
    pub arena_samples: Counter,
    /// See `arena_samples`.
    pub peer_samples: Counter,
    /// See `arena_samples`.
    pub store_samples: Counter,
    /// See `arena_samples`.
    pub peer_bytes: Counter,
    /// See `arena_samples`.
    pub store_bytes: Counter,
}

impl Default for PeerMetrics {
    fn default() -> Self {
        let tier_samples: Family<Labels, Counter> = Family::default();
        let tier_bytes: Family<Labels, Counter> = Family::default();
        let handle =
            |f: &Family<Labels, Counter>, tier: &str| f.get_or_create(&label("tier", tier)).clone();
        PeerMetrics {
            arena_samples: handle(&tier_samples, "arena"),
            peer_samples: handle(&tier_samples, "peer"),
            store_samples: handle(&tier_samples, "store"),
            peer_bytes: handle(&tier_bytes, "peer"),
            store_bytes: handle(&tier_bytes, "store"),
            tier_samples,
            tier_bytes,
            gets_sent: Counter::default(),
            gets_failed: Family::default(),
            crc_failures: Counter::default(),
            hedged: Counter::default(),
            late_discarded: Counter::default(),
            cancels_sent: Counter::default(),
            reads_not_started: Counter::default(),
            served: Counter::default(),
            served_bytes: Counter::default(),
            served_misses: Family::default(),
            peer_up: Family::default(),
            peer_transport: Family::default(),
            peer_slow: Family::default(),
            rtt: Family::new_with_constructor(rtt_histogram),
            views: Family::default(),
            sessions_ended_by_view: Counter::default(),
            view_epoch: Gauge::default(),
            assigned: Family::default(),
            rejected: Family::default(),
            grace: Family::default(),
        }
    }
}

/// `[(name, value)]` labels.
pub fn label(name: &str, value: &str) -> Labels {
    vec![(name.to_string(), value.to_string())]
}

/// Counts one in `family`'s series labelled `name` = `value`.
fn count_one(family: &Family<Labels, Counter>, name: &str, value: &str) {
    family.get_or_create(&label(name, value)).inc();
}

/// The labels of the views refused for `reason`.
fn refused(reason: &str) -> Labels {
    let mut l = label("outcome", "refused");
    l.push(("reason".to_string(), reason.to_string()));
    l
}

impl PeerMetrics {
    /// Counts a request that failed for `reason`.
    pub fn get_failed(&self, reason: &str) {
        count_one(&self.gets_failed, "reason", reason);
    }

    /// Counts something refused or cut off, for `reason`.
    pub fn reject(&self, reason: &str) {
        count_one(&self.rejected, "reason", reason);
    }

    /// Counts a miss this agent answered, for `reason`.
    pub fn served_miss(&self, reason: &str) {
        count_one(&self.served_misses, "reason", reason);
    }

    /// Counts a view handed in, by `outcome`.
    pub fn view(&self, outcome: &str) {
        count_one(&self.views, "outcome", outcome);
    }

    /// Counts a view refused, for `reason`.
    pub fn view_refused(&self, reason: &str) {
        self.views.get_or_create(&refused(reason)).inc();
    }

    /// Views refused for `reason` so far.
    pub fn views_refused(&self, reason: &str) -> u64 {
        self.views.get_or_create(&refused(reason)).get()
    }

    /// Counts the `[local, peer, uncached]` samples a `mode` session just
    /// planned.
    pub(crate) fn count_assigned(&self, mode: &str, placed: [u64; 3]) {
        use crate::planner::placement::{LOCAL, PEER, UNCACHED};
        for (at, placement) in [(LOCAL, "local"), (PEER, "peer"), (UNCACHED, "uncached")] {
            if placed[at] > 0 {
                self.assigned
                    .get_or_create(&vec![
                        ("mode".to_string(), mode.to_string()),
                        ("placement".to_string(), placement.to_string()),
                    ])
                    .inc_by(placed[at]);
            }
        }
    }

    /// Counts samples of a dropped owner, by `outcome`.
    pub fn grace(&self, outcome: &str, n: u64) {
        if n > 0 {
            self.grace
                .get_or_create(&label("outcome", outcome))
                .inc_by(n);
        }
    }

    /// Samples of a dropped owner counted under `outcome` so far.
    pub fn grace_count(&self, outcome: &str) -> u64 {
        self.grace.get_or_create(&label("outcome", outcome)).get()
    }

    /// Records whether the connection to `peer` is up.
    pub fn set_up(&self, peer: &str, up: bool) {
        self.peer_up
            .get_or_create(&label("peer", peer))
            .set(u64::from(up));
    }

    /// Records the transport carrying blocks to `peer` (`None`: the peer
    /// left the view, every series of it reads 0).
    pub fn set_transport(&self, peer: &str, transport: Option<LinkTransport>) {
        for t in LinkTransport::ALL {
            self.peer_transport
                .get_or_create(&vec![
                    ("peer".to_string(), peer.to_string()),
                    ("transport".to_string(), t.as_str().to_string()),
                ])
                .set(u64::from(Some(t) == transport));
        }
    }

    /// Records whether the requester finds `peer` slow.
    pub fn set_slow(&self, peer: &str, slow: bool) {
        self.peer_slow
            .get_or_create(&label("peer", peer))
            .set(u64::from(slow));
    }

    /// Records a round trip to `peer`.
    pub fn observe_rtt(&self, peer: &str, secs: f64) {
        self.rtt.get_or_create(&label("peer", peer)).observe(secs);
    }

    /// Registers every series with `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "granary_tier_samples",
            "Samples sessions needed, by where they came from (arena, peer, store).",
            self.tier_samples.clone(),
        );
        registry.register(
            "granary_tier_bytes",
            "Bytes brought into the arena, by tier (peer, store).",
            self.tier_bytes.clone(),
        );
        registry.register(
            "granary_assigned_samples",
            "Samples of the batches planned here, by assignment mode and by where they are kept \
             (local, peer, uncached); in locality mode, peer / all is the moved fraction.",
            self.assigned.clone(),
        );
        registry.register(
            "granary_peer_gets",
            "Samples asked of peers.",
            self.gets_sent.clone(),
        );
        registry.register(
            "granary_peer_gets_failed",
            "Samples asked of peers that did not come, by reason; each was read from the store.",
            self.gets_failed.clone(),
        );
        registry.register(
            "granary_peer_crc_failures",
            "Blocks from peers that failed their CRC check.",
            self.crc_failures.clone(),
        );
        registry.register(
            "granary_peer_hedged",
            "Samples asked of a peer and read from the store as well (late).",
            self.hedged.clone(),
        );
        registry.register(
            "granary_peer_late_discarded",
            "Blocks from peers dropped because the store read had begun.",
            self.late_discarded.clone(),
        );
        registry.register(
            "granary_peer_cancels",
            "Cancels sent to peers for requests read from the store instead (hedged, or the peer found slow).",
            self.cancels_sent.clone(),
        );
        registry.register(
            "granary_peer_reads_not_started",
            "Store reads of kept samples not started because every peer request waiting for them was cancelled.",
            self.reads_not_started.clone(),
        );
        registry.register(
            "granary_peer_served",
            "Blocks served to peers.",
            self.served.clone(),
        );
        registry.register(
            "granary_peer_served_bytes",
            "Bytes served to peers.",
            self.served_bytes.clone(),
        );
        registry.register(
            "granary_peer_served_misses",
            "Peers' requests answered with a miss, by reason.",
            self.served_misses.clone(),
        );
        registry.register(
            "granary_peer_up",
            "1 while an authenticated connection to the peer is up.",
            self.peer_up.clone(),
        );
        registry.register(
            "granary_peer_slow",
            "1 while the requester finds the peer slow: its samples are read from the store.",
            self.peer_slow.clone(),
        );
        registry.register(
            "granary_peer_transport",
            "1 for the transport carrying blocks to the peer (tcp, rdma, rdma-fallback).",
            self.peer_transport.clone(),
        );
        registry.register(
            "granary_peer_views",
            "Membership views handed in by loaders, by outcome (installed, joined, refused) and, refused, by reason.",
            self.views.clone(),
        );
        registry.register(
            "granary_peer_sessions_ended_by_view",
            "Sessions ended because a newer view of their job was installed.",
            self.sessions_ended_by_view.clone(),
        );
        registry.register(
            "granary_peer_view_epoch",
            "Epoch of the membership view this agent holds (0: none).",
            self.view_epoch.clone(),
        );
        registry.register(
            "granary_peer_rejected",
            "Peer connections, blocks and requests refused or cut off by the tier's bounds and \
             checks, by reason.",
            self.rejected.clone(),
        );
        registry.register(
            "granary_peer_grace",
            "Samples of an owner whose connection dropped, by outcome: parked (a wait for it), \
             returned (asked again once it was back, restarted), expired, blocked and rejoined \
             (read from the store).",
            self.grace.clone(),
        );
        registry.register(
            "granary_peer_rtt_seconds",
            "Round trips to each peer (keepalives).",
            self.rtt.clone(),
        );
    }
}

//! The conformance suite over the RDMA driver on the fake NIC: one
//! requester and several owners, each a host on one fabric.

use std::collections::BTreeMap;

use granary_rdma::conformance::{self, ErrorKind, Fault, Outcome, Ran, Transport};
use granary_rdma::driver::{Driver, DriverConfig, Event, Extent, PeerStatus};
use granary_rdma::fake::{Fabric, FakeNic};
use granary_rdma::verbs::{Access, WcStatus};

const ARENA: u64 = 4 << 20;
/// The requester's peer id on each owner.
const REQUESTER: u32 = 1000;

struct FakeRdma {
    fabric: Fabric,
    clock: u64,
    requester: Driver<FakeNic>,
    owners: Vec<Driver<FakeNic>>,
    dead: Vec<bool>,
    /// Owners held, to die once they have served what reached them.
    dying: Vec<bool>,
    /// Requester side: request -> extent.
    extents: BTreeMap<u64, Extent>,
    next_extent: u64,
    /// Owner side bump allocator for staging blocks.
    next_src: Vec<u64>,
    /// What the requester's arena must hold where `known`: a canary
    /// pattern at first, then each block delivered; an extent a get named
    /// is unknown until its block is delivered.
    expected: Vec<u8>,
    known: Vec<bool>,
    refused: Vec<Outcome>,
    cfg: DriverConfig,
}

impl FakeRdma {
    fn new(owners: usize, cfg: DriverConfig, seed: u64) -> FakeRdma {
        let fabric = Fabric::new(seed);
        let requester = Driver::new(fabric.add_host(), ARENA, cfg).expect("requester driver");
        let owners: Vec<_> = (0..owners)
            .map(|_| Driver::new(fabric.add_host(), ARENA, cfg).expect("owner driver"))
            .collect();
        let n = owners.len();
        let expected: Vec<u8> = (0..ARENA).map(|i| (i % 251) as u8 ^ 0xa5).collect();
        let mut requester = requester;
        requester.write_arena(0, &expected).expect("canary");
        let mut t = FakeRdma {
            fabric,
            clock: 1,
            requester,
            owners,
            dead: vec![false; n],
            dying: vec![false; n],
            extents: BTreeMap::new(),
            next_extent: 0,
            next_src: vec![0; n],
            expected,
            known: vec![true; ARENA as usize],
            refused: Vec::new(),
            cfg,
        };
        for o in 0..n {
            t.connect(o).expect("first connection");
        }
        t
    }

    /// The queue pair setup, as the TCP connection would carry it: each
    /// side's parameters travel as bytes.
    fn connect(&mut self, owner: usize) -> Result<(), String> {
        let mut ev = Vec::new();
        let a = self
            .requester
            .prepare(owner as u32, self.clock, &mut ev)
            .map_err(|e| e.to_string())?
            .encode();
        let b = self.owners[owner]
            .prepare(REQUESTER, self.clock, &mut ev)
            .map_err(|e| e.to_string())?
            .encode();
        let a = granary_rdma::SetupParams::decode(&a).map_err(|e| e.to_string())?;
        let b = granary_rdma::SetupParams::decode(&b).map_err(|e| e.to_string())?;
        self.requester
            .connect(owner as u32, &b, self.clock, &mut ev)
            .map_err(|e| e.to_string())?;
        self.owners[owner]
            .connect(REQUESTER, &a, self.clock, &mut ev)
            .map_err(|e| e.to_string())?;
        Ok(())
    }

    fn alloc(next: &mut u64, len: u64) -> u64 {
        if *next + len > ARENA {
            *next = 0;
        }
        let at = *next;
        *next += len.div_ceil(64) * 64;
        at
    }

    fn on_requester_event(&mut self, e: Event, out: &mut Vec<Outcome>) {
        match e {
            Event::Landed {
                request,
                extent,
                len,
                header,
                ..
            } => {
                assert_eq!(self.extents.remove(&request), Some(extent));
                let mut bytes = vec![0u8; len as usize];
                self.requester
                    .read_arena(extent.offset, &mut bytes)
                    .expect("extent inside the arena");
                let at = extent.offset as usize;
                self.expected[at..at + bytes.len()].copy_from_slice(&bytes);
                self.known[at..at + bytes.len()].fill(true);
                out.push(Outcome::Delivered {
                    request,
                    header,
                    bytes,
                });
            }
            Event::Fallback { request, .. } | Event::Answered { request, .. } => {
                self.extents.remove(&request);
                out.push(Outcome::Fallback { request });
            }
            Event::PeerDown { .. } | Event::Control { .. } => {}
            other => panic!("requester got an owner event: {other:?}"),
        }
    }

    fn on_owner_event(&mut self, o: usize, e: Event) {
        if let Event::GetReceived {
            peer,
            request,
            len,
            frame,
        } = e
        {
            let sample = u64::from_le_bytes(frame[..8].try_into().expect("get frame"));
            let bytes = conformance::payload(sample);
            assert_eq!(bytes.len() as u32, len, "extent sized for the block");
            let at = FakeRdma::alloc(&mut self.next_src[o], bytes.len() as u64);
            let d = &mut self.owners[o];
            d.write_arena(at, &bytes).expect("stage block");
            let src = Extent {
                offset: at,
                len: bytes.len() as u32,
            };
            let mut ev = Vec::new();
            // A refusal here means the queue pair just went down: the
            // requester falls back on its own.
            let _ = d.serve(
                peer,
                request,
                src,
                &conformance::header(sample, &bytes),
                self.clock,
                &mut ev,
            );
        }
    }
}

impl Transport for FakeRdma {
    fn owners(&self) -> usize {
        self.owners.len()
    }

    fn credit_limit(&self) -> usize {
        usize::from(self.cfg.recv_depth)
    }

    fn get(&mut self, owner: usize, request: u64, sample: u64) {
        let len = conformance::sample_len(sample) as u64;
        // At least 64 bytes between extents, which no get names.
        let at = FakeRdma::alloc(&mut self.next_extent, len + 64);
        let extent = Extent {
            offset: at,
            len: len as u32,
        };
        self.known[at as usize..(at + len) as usize].fill(false);
        let mut ev = Vec::new();
        match self.requester.get(
            owner as u32,
            request,
            extent,
            &sample.to_le_bytes(),
            self.clock,
            &mut ev,
        ) {
            Ok(()) => {
                self.extents.insert(request, extent);
            }
            Err(_) => self.refused.push(Outcome::Fallback { request }),
        }
        for e in ev {
            let mut out = Vec::new();
            self.on_requester_event(e, &mut out);
            self.refused.extend(out);
        }
    }

    fn step(&mut self, dt_ns: u64, out: &mut Vec<Outcome>) {
        self.clock += dt_ns;
        out.append(&mut self.refused);
        // Probe owners whose backoff is over.
        for o in 0..self.owners.len() {
            if let PeerStatus::Down { retry_at } = self.requester.status(o as u32) {
                if !self.dead[o] && self.clock >= retry_at {
                    let _ = self.connect(o);
                }
            }
        }
        let mut ev = Vec::new();
        self.requester
            .poll(self.clock, &mut ev)
            .expect("requester poll");
        for e in ev.drain(..) {
            self.on_requester_event(e, out);
        }
        for o in 0..self.owners.len() {
            if self.dead[o] {
                continue;
            }
            self.owners[o]
                .poll(self.clock, &mut ev)
                .expect("owner poll");
            for e in std::mem::take(&mut ev) {
                self.on_owner_event(o, e);
            }
            if self.dying[o] {
                self.fabric.kill(o + 1);
                self.dead[o] = true;
            }
        }
    }

    fn inject(&mut self, fault: Fault) -> bool {
        let host = |owner: usize| owner + 1;
        match fault {
            Fault::CorruptNextBlock { owner } => self.fabric.corrupt_next_write(host(owner)),
            Fault::KillOwner { owner } => {
                // Held: what it posts from now on never executes; it dies
                // after its next poll.
                self.fabric.hold(host(owner), true);
                self.dying[owner] = true;
            }
            Fault::ErrorCompletion { owner, kind } => {
                let status = match kind {
                    ErrorKind::RetryExceeded => WcStatus::RetryExceeded,
                    ErrorKind::ReceiverNotReady => WcStatus::RnrRetryExceeded,
                    ErrorKind::RemoteAccess => WcStatus::RemoteAccess,
                    ErrorKind::Flushed => WcStatus::Flushed,
                };
                self.fabric.inject(host(owner), None, None, status);
            }
            Fault::StrayWrite { owner, shift } => self.fabric.shift_next_write(host(owner), shift),
            Fault::StaleKeyWrite { owner } => return self.fabric.replay_last_write(host(owner)),
        }
        true
    }

    fn memory_as_delivered(&mut self) -> Option<bool> {
        let mut mem = vec![0u8; ARENA as usize];
        self.requester.read_arena(0, &mut mem).expect("the arena");
        Some(
            mem.iter()
                .zip(&self.expected)
                .zip(&self.known)
                .all(|((m, e), k)| !k || m == e),
        )
    }

    fn flow_control_violations(&self) -> u64 {
        self.fabric.stats().count(WcStatus::RnrRetryExceeded)
    }

    fn retry_after_ns(&self) -> u64 {
        self.cfg.backoff_initial_ns
    }

    fn transfer_timeout_ns(&self) -> u64 {
        self.cfg.transfer_timeout_ns
    }
}

fn cfg() -> DriverConfig {
    DriverConfig {
        transfer_timeout_ns: 200_000_000,
        ..DriverConfig::default()
    }
}

#[test]
fn many_in_flight() {
    let mut t = FakeRdma::new(3, cfg(), 1);
    let tally = conformance::many_in_flight(&mut t);
    assert!(tally.fallback.is_empty());
    let st = t.fabric.stats();
    assert_eq!(st.writes, 300, "one RDMA write per block");
}

#[test]
fn out_of_order_across_queue_pairs() {
    let mut reordered = 0;
    for seed in 1..6 {
        let mut t = FakeRdma::new(3, cfg(), seed);
        reordered += u32::from(conformance::out_of_order(&mut t));
    }
    assert!(reordered > 0, "the fabric interleaves queue pairs");
}

#[test]
fn credits_exhausted() {
    for depth in [2u16, 3, 4, 7] {
        let mut t = FakeRdma::new(
            1,
            DriverConfig {
                recv_depth: depth,
                send_depth: depth,
                ..cfg()
            },
            u64::from(depth),
        );
        conformance::credits_exhausted(&mut t);
    }
}

#[test]
fn corrupted_block() {
    let mut t = FakeRdma::new(1, cfg(), 7);
    assert_eq!(conformance::corrupted_block(&mut t), Ran::Yes);
}

#[test]
fn peer_loss_mid_transfer() {
    let mut t = FakeRdma::new(2, cfg(), 9);
    assert_eq!(conformance::peer_loss_mid_transfer(&mut t), Ran::Yes);
    assert_eq!(
        t.fabric.stats().writes,
        10 + 1,
        "writes after the loss never landed"
    );
    assert!(matches!(t.requester.status(0), PeerStatus::Down { .. }));
}

#[test]
fn each_error_completion() {
    for (i, kind) in ErrorKind::ALL.into_iter().enumerate() {
        let mut t = FakeRdma::new(1, cfg(), 20 + i as u64);
        assert_eq!(
            conformance::error_completion(&mut t, kind),
            Ran::Yes,
            "{kind:?}"
        );
        assert_eq!(t.fabric.stats().injected, 1, "{kind:?} fired once");
    }
}

#[test]
fn driver_never_registers_remote_read_and_arena_once() {
    let t = FakeRdma::new(2, cfg(), 3);
    for host in 0..3 {
        let regions = t.fabric.regions(host);
        assert_eq!(regions.len(), 2, "arena and message buffers, once");
        assert!(
            regions
                .iter()
                .all(|r| !r.access.contains(Access::REMOTE_WRITE)),
            "no region's own key lets a peer write: {regions:?}"
        );
        let bindable: Vec<_> = regions
            .iter()
            .filter(|r| r.access.contains(Access::MW_BIND))
            .collect();
        assert_eq!(bindable.len(), 1, "windows are bound to the arena only");
        assert_eq!(bindable[0].len, ARENA);
    }
}

/// Fewer windows than gets: gets wait for a window and all arrive; the
/// requester never holds more windows than allowed.
#[test]
fn windows_exhausted() {
    for windows in [1u16, 2, 5] {
        let mut t = FakeRdma::new(
            1,
            DriverConfig {
                windows_per_peer: windows,
                recv_depth: 4,
                send_depth: 4,
                ..cfg()
            },
            u64::from(windows),
        );
        conformance::credits_exhausted(&mut t);
        let (held, bound) = t.fabric.windows(0);
        assert_eq!((held, bound), (usize::from(windows), 0), "all unbound");
    }
}

/// A block written one byte before its extent, one byte past it, 1 MiB
/// away or past the end of the arena: a remote access error, nothing
/// written anywhere, the request falls back, the link comes back.
#[test]
fn an_owner_cannot_write_outside_the_extent() {
    for (i, shift) in [-1i64, 1, 1 << 20, ARENA as i64].into_iter().enumerate() {
        let mut t = FakeRdma::new(2, cfg(), 40 + i as u64);
        let before = t.fabric.stats();
        assert_eq!(
            conformance::write_outside_extent(&mut t, shift),
            Ran::Yes,
            "shift {shift}"
        );
        let after = t.fabric.stats();
        assert_eq!(
            after.count(WcStatus::RemoteAccess),
            before.count(WcStatus::RemoteAccess) + 1,
            "shift {shift}: the stray write was refused"
        );
        assert_eq!(after.writes, 3 + 5, "shift {shift}: only the good blocks");
    }
}

/// The owner replays its last write, changed, after the get ended: the
/// window was invalidated before the block was reported, so it fails and
/// the block stays as delivered.
#[test]
fn a_key_is_dead_after_its_get() {
    let mut t = FakeRdma::new(1, cfg(), 50);
    assert_eq!(conformance::write_with_a_dead_key(&mut t), Ran::Yes);
    let st = t.fabric.stats();
    assert_eq!(st.count(WcStatus::RemoteAccess), 1, "the replay refused");
    assert_eq!(st.writes, 1 + 5, "only the good blocks landed");
    assert!(st.invalidates >= 6, "one invalidate per block: {st:?}");
}

//! One simulated agent: a consumer, a requester, an owner serving its keep
//! set, all over the crate's real connection and serving code.

use std::collections::{BTreeMap, BTreeSet};

use super::{store_bytes, Ev, Queue, Shared, SimError, SIM_FINGERPRINT};
use crate::block::block_crc;
use crate::conn::{Conn, ConnConfig, Event, Transmit};
use crate::frame::{micros, DataHeader, Get, MissReason};
use crate::request::{Outcome, Requester, RequesterConfig, Sample, Via, Why};
use crate::serve::{Admit, Availability, Cancelled, ConnId, Reply, ServeConfig, Server};

const SECRET: &[u8] = b"sim-job-secret";

/// Where a delivered sample came from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Source {
    Local,
    Peer,
    Store,
}

struct Link {
    peer: usize,
    conn: Conn,
    /// A block whose payload is arriving, and whether its claim was taken
    /// (false: the store has the sample; the bytes are dropped).
    rx: Option<(DataHeader, Vec<u8>, bool)>,
}

#[derive(Clone, Copy, Default)]
struct StoreRead {
    owner: bool,
    consumer: bool,
}

/// What one link said, gathered before acting on it.
enum LinkEv {
    Established,
    Credit,
    Request(Get),
    Block(DataHeader, Vec<u8>),
    Discarded(u64),
    Miss(u64, MissReason),
    Cancel(u64),
    Closed,
}

pub(super) struct Agent {
    node: usize,
    inc: u64,
    /// Kept samples in the arena: sample -> block CRC.
    arena: BTreeMap<u64, u32>,
    links: BTreeMap<u64, Link>,
    by_peer: BTreeMap<usize, u64>,
    server: Server,
    /// The agent's requester: the same as the agent's engine drives.
    requester: Requester<u64>,
    /// Each request in flight: its link, and its get while it waits for
    /// the link's handshake or credit.
    on_link: BTreeMap<u64, (u64, Option<Get>)>,
    want: BTreeSet<u64>,
    received: Vec<u64>,
    store: BTreeMap<u64, StoreRead>,
    owner_read: BTreeSet<u64>,
}

impl Agent {
    pub(super) fn new(node: usize, inc: u64, members: usize, cfg: &super::SimConfig) -> Agent {
        Agent {
            node,
            inc,
            arena: BTreeMap::new(),
            links: BTreeMap::new(),
            by_peer: BTreeMap::new(),
            server: Server::new(ServeConfig::default()),
            requester: Requester::new(
                RequesterConfig {
                    hedge_after: cfg.hedge_after,
                    // As the agent sets it (a quarter of the hedge delay).
                    slow_floor: cfg.hedge_after / 4,
                    probe_every: 50 * cfg.latency,
                    ..RequesterConfig::default()
                },
                members,
            ),
            on_link: BTreeMap::new(),
            want: BTreeSet::new(),
            received: Vec::new(),
            store: BTreeMap::new(),
            owner_read: BTreeSet::new(),
        }
    }

    pub(super) fn node(&self) -> usize {
        self.node
    }

    pub(super) fn incarnation(&self) -> u64 {
        self.inc
    }

    pub(super) fn step_done(&self) -> bool {
        self.want.is_empty()
    }

    pub(super) fn missing(&self) -> usize {
        self.want.len()
    }

    pub(super) fn take_received(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.received)
    }

    pub(super) fn links(&self) -> Vec<(usize, u64)> {
        self.links.iter().map(|(&id, l)| (l.peer, id)).collect()
    }

    /// The consumer's state, which outlives the agent process.
    pub(super) fn pending_plan(&mut self) -> (BTreeSet<u64>, Vec<u64>) {
        (
            std::mem::take(&mut self.want),
            std::mem::take(&mut self.received),
        )
    }

    pub(super) fn keep_plan(&mut self, (want, received): (BTreeSet<u64>, Vec<u64>)) {
        self.want = want;
        self.received = received;
    }

    pub(super) fn start_step(&mut self, plan: &[u64], q: &mut Queue, sh: &mut Shared) {
        self.want = plan.iter().copied().collect();
        self.received.clear();
        if sh.down[self.node] {
            return;
        }
        self.resume(false, q, sh);
    }

    /// Fetches everything the consumer still wants.
    /// `recovering`: after a restart, reads replace ones the old
    /// incarnation had in flight, so they count as fallbacks.
    pub(super) fn resume(&mut self, recovering: bool, q: &mut Queue, sh: &mut Shared) {
        let want: Vec<u64> = self.want.iter().copied().collect();
        for s in want {
            self.fetch(s, recovering, q, sh);
        }
        self.flush_all(q, sh);
    }

    fn fetch(&mut self, s: u64, recovering: bool, q: &mut Queue, sh: &mut Shared) {
        if self.arena.contains_key(&s) {
            self.deliver(s, Source::Local, sh);
            return;
        }
        let owner = sh.dir.owner(s).unwrap_or(self.node);
        let kept = sh.dir.is_kept(s);
        if owner == self.node {
            self.read_store(s, kept, true, recovering && !kept, q, sh);
        } else if kept {
            self.request_peer(owner, s, q, sh);
        } else {
            self.read_store(s, false, true, recovering, q, sh);
        }
    }

    fn deliver(&mut self, s: u64, src: Source, sh: &mut Shared) {
        if self.want.remove(&s) {
            self.received.push(s);
            let e = sh.epoch as usize;
            let r = &mut sh.report;
            match src {
                Source::Local => r.local_hits[e] += 1,
                Source::Peer => r.peer_hits[e] += 1,
                Source::Store => r.store_hits[e] += 1,
            }
        } else if src == Source::Peer {
            sh.report.late_discarded += 1;
        }
    }

    fn read_store(
        &mut self,
        s: u64,
        owner: bool,
        consumer: bool,
        fallback: bool,
        q: &mut Queue,
        sh: &mut Shared,
    ) {
        if let Some(r) = self.store.get_mut(&s) {
            r.owner |= owner;
            r.consumer |= consumer;
            return;
        }
        if owner {
            if !self.owner_read.insert(s) {
                sh.fail(SimError::DoubleOwnerRead {
                    node: self.node,
                    sample: s,
                });
            }
            sh.owner_reads += 1;
        }
        if fallback {
            sh.epoch_fallbacks += 1;
            sh.report.fallbacks += 1;
        }
        sh.report.store_reads[sh.epoch as usize] += 1;
        self.store.insert(s, StoreRead { owner, consumer });
        q.at(
            q.now + sh.cfg.store_latency,
            Ev::Store {
                node: self.node,
                inc: self.inc,
                sample: s,
            },
        );
    }

    pub(super) fn on_store(&mut self, s: u64, q: &mut Queue, sh: &mut Shared) {
        let Some(r) = self.store.remove(&s) else {
            return;
        };
        let len = sh.sizes[s as usize];
        if r.owner {
            let crc = block_crc(SIM_FINGERPRINT, s, &store_bytes(s, len));
            self.arena.insert(s, crc);
            self.server
                .loaded(SIM_FINGERPRINT, s, Ok((len, crc)), q.now);
        }
        if r.consumer {
            self.deliver(s, Source::Store, sh);
        }
        self.serve(q, sh);
    }

    fn conn_config(&self, sh: &Shared) -> ConnConfig {
        let mut c = ConnConfig::new(
            sh.view.job_id(),
            sh.view.members()[self.node].id.clone(),
            sh.view.digest().0,
            self.inc,
            SECRET,
        );
        c.handshake_timeout = 100_000_000;
        c.idle_timeout = 300_000_000;
        c.keepalive = 50_000_000;
        c
    }

    fn request_peer(&mut self, peer: usize, s: u64, q: &mut Queue, sh: &mut Shared) {
        if !self.requester.ask(peer, q.now) {
            // Found slow: its samples come from the store meanwhile.
            sh.report.slow_routed += 1;
            self.read_store(s, false, true, true, q, sh);
            return;
        }
        let link = match self.by_peer.get(&peer) {
            Some(&l) => l,
            None => {
                let mut cfg = self.conn_config(sh);
                cfg.expected_peer = Some(sh.view.members()[peer].id.clone());
                let nonce = sh.rng.nonce();
                let Ok(conn) = Conn::dial(cfg, nonce, q.now) else {
                    self.read_store(s, false, true, true, q, sh);
                    return;
                };
                let id = sh.next_link;
                sh.next_link += 1;
                self.links.insert(
                    id,
                    Link {
                        peer,
                        conn,
                        rx: None,
                    },
                );
                self.by_peer.insert(peer, id);
                id
            }
        };
        let want = Sample {
            fingerprint: SIM_FINGERPRINT,
            sample: s,
            length: sh.sizes[s as usize],
        };
        let (get, _) = self.requester.start(s, peer, want, Via::Tcp, q.now);
        self.on_link.insert(get.request, (link, Some(get)));
        self.send_unsent(link, q, sh);
    }

    /// Sends the requests waiting for `link` to be established.
    fn send_unsent(&mut self, link: u64, q: &mut Queue, sh: &mut Shared) {
        let Some(l) = self.links.get_mut(&link) else {
            return;
        };
        if !l.conn.is_established() {
            return;
        }
        for (lk, unsent) in self.on_link.values_mut() {
            if *lk != link {
                continue;
            }
            let Some(get) = *unsent else { continue };
            if l.conn.credit() == 0 {
                // Waits for credit; the hedge timer still runs.
                break;
            }
            if l.conn.send_get(get, q.now).is_ok() {
                *unsent = None;
                sh.report.requests[sh.epoch as usize] += 1;
            }
        }
    }

    /// Acts on what became of a get: a verified block is delivered, any
    /// other end reads the store (when the consumer still wants it).
    fn on_outcome(
        &mut self,
        o: Outcome<u64>,
        bytes: Option<&[u8]>,
        q: &mut Queue,
        sh: &mut Shared,
    ) {
        match o {
            Outcome::Landed { token: s, .. } => {
                self.on_link
                    .retain(|_, (_, g)| g.is_none_or(|g| g.sample != s));
                let len = sh.sizes[s as usize];
                if bytes.is_some_and(|b| b != store_bytes(s, len).as_slice()) {
                    sh.fail(SimError::WrongBytes {
                        node: self.node,
                        sample: s,
                    });
                }
                self.deliver(s, Source::Peer, sh);
            }
            Outcome::Store { token: s, why, .. } => {
                match why {
                    Why::Miss(_) => sh.report.misses += 1,
                    Why::Corrupt => sh.report.crc_failures += 1,
                    Why::Hedged => sh.report.hedged += 1,
                    Why::Slow => sh.report.slow_routed += 1,
                    Why::Lost => {}
                }
                if self.want.contains(&s) {
                    self.read_store(s, false, true, true, q, sh);
                }
            }
            // The simulator has no RDMA.
            Outcome::Retry { get, .. } => {
                if let Some(o) = self.requester.lost(get.request) {
                    self.on_outcome(o, None, q, sh);
                }
            }
        }
    }

    pub(super) fn on_bytes(
        &mut self,
        from: usize,
        link: u64,
        data: &[u8],
        q: &mut Queue,
        sh: &mut Shared,
    ) {
        if !self.links.contains_key(&link) {
            let cfg = self.conn_config(sh);
            let nonce = sh.rng.nonce();
            let Ok(conn) = Conn::accept(cfg, nonce, q.now) else {
                return;
            };
            self.links.insert(
                link,
                Link {
                    peer: from,
                    conn,
                    rx: None,
                },
            );
            self.by_peer.entry(from).or_insert(link);
        }
        if let Some(l) = self.links.get_mut(&link) {
            l.conn.handle_input(data, q.now);
        }
        self.process(link, q, sh);
    }

    pub(super) fn on_reset(&mut self, link: u64, q: &mut Queue, sh: &mut Shared) {
        if self.links.contains_key(&link) {
            self.link_closed(link, q, sh);
        }
    }

    pub(super) fn on_tick(&mut self, q: &mut Queue, sh: &mut Shared) {
        let ids: Vec<u64> = self.links.keys().copied().collect();
        for id in ids {
            if let Some(l) = self.links.get_mut(&id) {
                l.conn.handle_timeout(q.now);
            }
            self.process(id, q, sh);
        }
        let mut ended = Vec::new();
        self.requester.poll(q.now, &mut ended);
        for c in self.requester.take_cancels() {
            // Only a get that went out is cancelled at its owner.
            if let Some(&(link, None)) = self.on_link.get(&c.request) {
                if let Some(l) = self.links.get_mut(&link) {
                    if l.conn.send_cancel(c.request).is_ok() {
                        sh.report.cancels += 1;
                    }
                }
            }
        }
        for o in ended {
            if let Outcome::Store { token, .. } | Outcome::Landed { token, .. } = &o {
                let t = *token;
                self.on_link
                    .retain(|_, (_, g)| g.is_none_or(|g| g.sample != t));
            }
            self.on_outcome(o, None, q, sh);
        }
        self.on_link
            .retain(|r, _| self.requester.pending(*r).is_some());
        self.serve(q, sh);
        self.flush_all(q, sh);
    }

    /// Gathers what link `id` has to say, then acts on it.
    fn process(&mut self, id: u64, q: &mut Queue, sh: &mut Shared) {
        let mut evs = Vec::new();
        if let Some(l) = self.links.get_mut(&id) {
            loop {
                if let Some((hdr, mut buf, keep)) = l.rx.take() {
                    while let Some(p) = l.conn.payload() {
                        buf.extend_from_slice(p);
                    }
                    if l.conn.payload_remaining() > 0 {
                        l.rx = Some((hdr, buf, keep));
                        break;
                    }
                    evs.push(if keep {
                        LinkEv::Block(hdr, buf)
                    } else {
                        LinkEv::Discarded(hdr.request)
                    });
                }
                match l.conn.poll_event() {
                    None => break,
                    Some(Event::Established { .. }) => evs.push(LinkEv::Established),
                    Some(Event::Credit(_)) => evs.push(LinkEv::Credit),
                    Some(Event::Request(g)) => evs.push(LinkEv::Request(g)),
                    Some(Event::Data(h)) => {
                        // The first byte needs the claim: once the store
                        // has the sample, the block is dropped.
                        let keep = self
                            .requester
                            .pending(h.request)
                            .is_some_and(|p| p.claim.receive());
                        l.rx = Some((h, Vec::new(), keep));
                    }
                    Some(Event::Miss {
                        request, reason, ..
                    }) => evs.push(LinkEv::Miss(request, reason)),
                    Some(Event::Cancel(r)) => evs.push(LinkEv::Cancel(r)),
                    Some(Event::Rtt(_) | Event::RdmaSetup(_) | Event::JobStatus(_)) => {}
                    Some(Event::Closed(_)) => evs.push(LinkEv::Closed),
                }
            }
        }
        for ev in evs {
            match ev {
                LinkEv::Established | LinkEv::Credit => self.send_unsent(id, q, sh),
                LinkEv::Request(g) => self.on_request(id, g, q, sh),
                LinkEv::Block(h, bytes) => {
                    self.on_link.remove(&h.request);
                    let crc = crc32c::crc32c(&bytes);
                    match self.requester.data(h.request, &h, crc, q.now) {
                        Some(o) => self.on_outcome(o, Some(&bytes), q, sh),
                        None => {
                            self.requester.discarded(h.request, q.now);
                            sh.report.late_discarded += 1;
                        }
                    }
                }
                LinkEv::Discarded(request) => {
                    self.on_link.remove(&request);
                    self.requester.discarded(request, q.now);
                    sh.report.late_discarded += 1;
                }
                LinkEv::Miss(req, reason) => {
                    self.on_link.remove(&req);
                    if let Some(o) = self.requester.miss(req, reason, q.now) {
                        self.on_outcome(o, None, q, sh);
                    }
                }
                LinkEv::Cancel(r) => {
                    // Dropped unless its block is being sent; the miss
                    // returns the request's credit. (The simulated store
                    // read, if one started, still lands in the arena.)
                    if let Some(c) = self.server.cancel(id as ConnId, r) {
                        let (Cancelled::Queued(get) | Cancelled::Waiting { get, .. }) = c;
                        if let Some(l) = self.links.get_mut(&id) {
                            let _ =
                                l.conn
                                    .send_miss(get.request, get.sample, MissReason::Cancelled);
                        }
                        sh.report.cancelled += 1;
                    }
                }
                LinkEv::Closed => {
                    // Let the goodbye go out first.
                    self.flush(id, q, sh);
                    self.link_closed(id, q, sh);
                }
            }
        }
        self.serve(q, sh);
        self.flush(id, q, sh);
    }

    fn on_request(&mut self, link: u64, g: Get, q: &mut Queue, sh: &mut Shared) {
        let s = g.sample;
        let avail = if g.fingerprint != SIM_FINGERPRINT || s >= sh.sizes.len() as u64 {
            Availability::Absent(MissReason::UnknownDataset)
        } else if sh.dir.owner(s) != Some(self.node) {
            Availability::Absent(MissReason::NotOwner)
        } else if !sh.dir.is_kept(s) {
            Availability::Absent(MissReason::NotKept)
        } else if let Some(&crc) = self.arena.get(&s) {
            Availability::Ready {
                length: sh.sizes[s as usize],
                crc,
            }
        } else if self.store.get(&s).is_some_and(|r| r.owner) {
            Availability::Loading
        } else {
            Availability::Kept
        };
        if self.server.request(link as ConnId, g, avail, q.now) == Admit::StartRead {
            self.read_store(s, true, false, false, q, sh);
        }
    }

    /// Turns the server's answers into frames.
    fn serve(&mut self, q: &mut Queue, sh: &mut Shared) {
        let mut touched = BTreeSet::new();
        while let Some(r) = self.server.poll(q.now) {
            let (link, res) = match r {
                Reply::Send {
                    conn,
                    get,
                    crc,
                    store_wait,
                } => (
                    conn,
                    self.links.get_mut(&conn).map(|l| {
                        l.conn.send_data(DataHeader {
                            request: get.request,
                            sample: get.sample,
                            length: get.length,
                            crc,
                            store_wait_us: micros(store_wait),
                        })
                    }),
                ),
                Reply::Miss { conn, get, reason } => (
                    conn,
                    self.links
                        .get_mut(&conn)
                        .map(|l| l.conn.send_miss(get.request, get.sample, reason)),
                ),
            };
            if let (Reply::Send { get, .. }, Some(Err(_)) | None) = (r, &res) {
                self.server.sent(link, get.request);
            }
            touched.insert(link);
        }
        for l in touched {
            self.flush(l, q, sh);
        }
    }

    fn flush_all(&mut self, q: &mut Queue, sh: &mut Shared) {
        let ids: Vec<u64> = self.links.keys().copied().collect();
        for id in ids {
            self.flush(id, q, sh);
        }
    }

    /// Moves what link `id` has to write onto the simulated network.
    fn flush(&mut self, id: u64, q: &mut Queue, sh: &mut Shared) {
        let Some(l) = self.links.get_mut(&id) else {
            return;
        };
        let mut data = Vec::new();
        let mut payloads = Vec::new();
        while let Some(t) = l.conn.poll_transmit() {
            match t {
                Transmit::Bytes(b) => data.extend_from_slice(&b),
                Transmit::Payload(h) => {
                    payloads.push(h.request);
                    let mut bytes = store_bytes(h.sample, h.length);
                    let f = sh.cfg.faults;
                    if !bytes.is_empty() && sh.rng.below(1000) < u64::from(f.corrupt_per_mille) {
                        let i = sh.rng.below(bytes.len() as u64) as usize;
                        bytes[i] ^= 1 << sh.rng.below(8);
                    } else if sh.rng.below(1000) < u64::from(f.misroute_per_mille) {
                        let other = (h.sample + 1) % sh.sizes.len() as u64;
                        bytes = store_bytes(other, h.length);
                    }
                    if l.conn.seal_payload_from(&bytes, &mut data).is_err() {
                        // Cannot happen for a payload just handed out.
                        sh.fail(SimError::WrongBytes {
                            node: self.node,
                            sample: h.sample,
                        });
                    }
                }
            }
        }
        let peer = l.peer;
        for request in payloads {
            self.server.sent(id, request);
        }
        if data.is_empty() {
            return;
        }
        sh.report.messages[sh.epoch as usize] += 1;
        sh.report.peer_bytes[sh.epoch as usize] += data.len() as u64;
        if sh.cut_between(self.node, peer) {
            return;
        }
        q.at(
            q.now + sh.link_latency(self.node),
            Ev::Bytes {
                from: self.node,
                to: peer,
                link: id,
                data,
            },
        );
    }

    fn link_closed(&mut self, id: u64, q: &mut Queue, sh: &mut Shared) {
        let Some(l) = self.links.remove(&id) else {
            return;
        };
        if self.by_peer.get(&l.peer) == Some(&id) {
            self.by_peer.remove(&l.peer);
        }
        self.server.conn_closed(id);
        sh.report.conns_closed += 1;
        let lost: Vec<u64> = self
            .on_link
            .iter()
            .filter(|(_, (link, _))| *link == id)
            .map(|(&r, _)| r)
            .collect();
        for r in lost {
            self.on_link.remove(&r);
            if let Some(o) = self.requester.lost(r) {
                self.on_outcome(o, None, q, sh);
            }
        }
    }
}

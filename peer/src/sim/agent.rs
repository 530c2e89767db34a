//! One simulated agent: a consumer, a requester, an owner serving its keep
//! set, all over the crate's real connection and serving code.

use std::collections::{BTreeMap, BTreeSet};

use super::{store_bytes, Ev, Queue, Shared, SimError, SIM_FINGERPRINT};
use crate::block::{block_crc, BlockCrc};
use crate::conn::{Conn, ConnConfig, Event, Nanos, Transmit};
use crate::frame::{DataHeader, Get, MissReason};
use crate::serve::{Admit, Availability, ConnId, Reply, ServeConfig, Server};

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
    /// A block whose payload is arriving.
    rx: Option<(DataHeader, Vec<u8>)>,
}

struct Pending {
    sample: u64,
    link: u64,
    since: Nanos,
    sent: bool,
    hedged: bool,
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
    Miss(u64),
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
    pending: BTreeMap<u64, Pending>,
    next_req: u64,
    want: BTreeSet<u64>,
    received: Vec<u64>,
    store: BTreeMap<u64, StoreRead>,
    owner_read: BTreeSet<u64>,
}

impl Agent {
    pub(super) fn new(node: usize, inc: u64) -> Agent {
        Agent {
            node,
            inc,
            arena: BTreeMap::new(),
            links: BTreeMap::new(),
            by_peer: BTreeMap::new(),
            server: Server::new(ServeConfig::default()),
            pending: BTreeMap::new(),
            next_req: 1,
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
            self.server.loaded(SIM_FINGERPRINT, s, Ok((len, crc)));
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
        let req = self.next_req;
        self.next_req += 1;
        self.pending.insert(
            req,
            Pending {
                sample: s,
                link,
                since: q.now,
                sent: false,
                hedged: false,
            },
        );
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
        for (&req, p) in self.pending.iter_mut() {
            if p.link != link || p.sent {
                continue;
            }
            if l.conn.credit() == 0 {
                // Waits for credit; the hedge timer still runs.
                break;
            }
            let get = Get {
                request: req,
                fingerprint: SIM_FINGERPRINT,
                sample: p.sample,
                length: sh.sizes[p.sample as usize],
                due: q.now + sh.cfg.hedge_after,
            };
            if l.conn.send_get(get, q.now).is_ok() {
                p.sent = true;
                p.since = q.now;
                sh.report.requests[sh.epoch as usize] += 1;
            }
        }
    }

    /// Stops waiting on a peer for request `req`: reads the store instead.
    fn give_up(&mut self, req: u64, q: &mut Queue, sh: &mut Shared) {
        if let Some(p) = self.pending.remove(&req) {
            if !p.hedged && self.want.contains(&p.sample) {
                self.read_store(p.sample, false, true, true, q, sh);
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
        let late: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| !p.hedged && q.now >= p.since + sh.cfg.hedge_after)
            .map(|(&r, _)| r)
            .collect();
        for r in late {
            let Some(p) = self.pending.get_mut(&r) else {
                continue;
            };
            p.hedged = true;
            let s = p.sample;
            if self.want.contains(&s) {
                sh.report.hedged += 1;
                self.read_store(s, false, true, true, q, sh);
            }
        }
        self.serve(q, sh);
        self.flush_all(q, sh);
    }

    /// Gathers what link `id` has to say, then acts on it.
    fn process(&mut self, id: u64, q: &mut Queue, sh: &mut Shared) {
        let mut evs = Vec::new();
        if let Some(l) = self.links.get_mut(&id) {
            loop {
                if let Some((hdr, mut buf)) = l.rx.take() {
                    while let Some(p) = l.conn.payload() {
                        buf.extend_from_slice(p);
                    }
                    if l.conn.payload_remaining() > 0 {
                        l.rx = Some((hdr, buf));
                        break;
                    }
                    evs.push(LinkEv::Block(hdr, buf));
                }
                match l.conn.poll_event() {
                    None => break,
                    Some(Event::Established { .. }) => evs.push(LinkEv::Established),
                    Some(Event::Credit(_)) => evs.push(LinkEv::Credit),
                    Some(Event::Request(g)) => evs.push(LinkEv::Request(g)),
                    Some(Event::Data(h)) => l.rx = Some((h, Vec::new())),
                    Some(Event::Miss { request, .. }) => evs.push(LinkEv::Miss(request)),
                    Some(Event::Rtt(_) | Event::RdmaSetup(_)) => {}
                    Some(Event::Closed(_)) => evs.push(LinkEv::Closed),
                }
            }
        }
        for ev in evs {
            match ev {
                LinkEv::Established | LinkEv::Credit => self.send_unsent(id, q, sh),
                LinkEv::Request(g) => self.on_request(id, g, q, sh),
                LinkEv::Block(h, bytes) => self.on_block(h, &bytes, q, sh),
                LinkEv::Miss(req) => {
                    sh.report.misses += 1;
                    self.give_up(req, q, sh);
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
        if self.server.request(link as ConnId, g, avail) == Admit::StartRead {
            self.read_store(s, true, false, false, q, sh);
        }
    }

    fn on_block(&mut self, h: DataHeader, bytes: &[u8], q: &mut Queue, sh: &mut Shared) {
        let Some(p) = self.pending.remove(&h.request) else {
            sh.report.late_discarded += 1;
            return;
        };
        let len = sh.sizes[p.sample as usize];
        let mut c = BlockCrc::new(SIM_FINGERPRINT, p.sample, len);
        c.update(bytes);
        if c.finish(h.crc).is_ok() {
            if bytes != store_bytes(p.sample, len).as_slice() {
                sh.fail(SimError::WrongBytes {
                    node: self.node,
                    sample: p.sample,
                });
            }
            self.deliver(p.sample, Source::Peer, sh);
        } else {
            sh.report.crc_failures += 1;
            if !p.hedged && self.want.contains(&p.sample) {
                self.read_store(p.sample, false, true, true, q, sh);
            }
        }
    }

    /// Turns the server's answers into frames.
    fn serve(&mut self, q: &mut Queue, sh: &mut Shared) {
        let mut touched = BTreeSet::new();
        while let Some(r) = self.server.poll(q.now) {
            let (link, res) = match r {
                Reply::Send { conn, get, crc } => (
                    conn,
                    self.links.get_mut(&conn).map(|l| {
                        l.conn.send_data(DataHeader {
                            request: get.request,
                            sample: get.sample,
                            length: get.length,
                            crc,
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
            .pending
            .iter()
            .filter(|(_, p)| p.link == id)
            .map(|(&r, _)| r)
            .collect();
        for r in lost {
            self.give_up(r, q, sh);
        }
    }
}

//! The owner's serving queue: which answer goes out next.
//!
//! * Requests for samples the owner does not serve (not owner, not kept,
//!   evicted, ...) get an immediate miss; the requester reads the store.
//! * Requests for samples in the arena wait in a queue ordered by due time
//!   (earliest first, then arrival).
//! * Requests for samples whose store read is in flight at the owner wait
//!   for that read (single flight) and are answered when it lands; the
//!   first request for a kept sample not yet read asks the caller to start
//!   the one read ([`Admit::StartRead`]).
//! * Sends are bounded twice: at most [`ServeConfig::max_in_flight`] over
//!   all connections, shared fairly: each connection with something to
//!   send may have `max_in_flight / (connections with something to send)`
//!   in flight (at least one), and never more than
//!   [`ServeConfig::per_conn_window`]. Connections that stop reading
//!   therefore cannot hold every slot. A transmission ends when the caller
//!   reports it written ([`Server::sent`]).
//! * A connection may have at most [`ServeConfig::max_queued_per_conn`]
//!   requests queued or waiting, and its requests admitted (queued,
//!   waiting for a read, or being sent) may cover at most
//!   [`ServeConfig::max_pinned_bytes_per_conn`] bytes (the caller pins
//!   them); more get [`MissReason::Overloaded`].
//! * With [`ServeConfig::late_grace`] set, a request still queued that long
//!   after its due time is answered [`MissReason::Late`] instead of sent
//!   (the requester has read the store by then).
//! * A request its requester cancelled ([`Server::cancel`]) leaves the
//!   queue, or stops waiting for its store read, unless its block is being
//!   sent; the caller answers it with [`MissReason::Cancelled`] and, when
//!   no request waits for the read any more, may leave that read unstarted.
//!
//! The server never sees bytes: the caller turns [`Reply`]s into
//! [`crate::conn::Conn::send_data`] / `send_miss` calls.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};

use crate::conn::Nanos;
use crate::frame::{Get, MissReason};

/// The caller's name for a connection.
pub type ConnId = u64;

/// What the owner knows of a requested sample when the request arrives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Availability {
    /// In the arena, `length` bytes with block CRC `crc`.
    Ready {
        /// Bytes of the sample.
        length: u64,
        /// Its block CRC.
        crc: u32,
    },
    /// Kept by this owner, not in the arena: needs a store read (unless one
    /// is already in flight here).
    Kept,
    /// A store read of it is already in flight (started outside this queue);
    /// report it with [`Server::loaded`].
    Loading,
    /// Not served; answer with this miss.
    Absent(MissReason),
}

/// What [`Server::request`] did with a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    /// Queued for sending.
    Queued,
    /// Waiting for a store read already in flight.
    Waiting,
    /// Waiting; the caller must start the store read of this sample now and
    /// report it with [`Server::loaded`].
    StartRead,
    /// Answered with a miss (see [`Server::poll`]).
    Missed(MissReason),
}

/// An answer to send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reply {
    /// Send the block: a data header, then the payload from the arena.
    /// Call [`Server::sent`] once written.
    Send {
        /// Connection.
        conn: ConnId,
        /// The request answered (with its dataset, sample, length, due).
        get: Get,
        /// The block CRC.
        crc: u32,
        /// How long the request waited for the sample's store read here
        /// (0 when the sample was in the arena): it goes in the data
        /// header.
        store_wait: Nanos,
    },
    /// Send a miss.
    Miss {
        /// Connection.
        conn: ConnId,
        /// The request answered.
        get: Get,
        /// Why.
        reason: MissReason,
    },
}

/// What [`Server::cancel`] took back; the caller answers the request with
/// a [`MissReason::Cancelled`] miss and releases its pin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cancelled {
    /// It was queued to send: its block will not be.
    Queued(Get),
    /// It waited for a store read; `last` when no request waits for that
    /// read any more (the caller need not start it, if it has not yet).
    Waiting {
        /// The request.
        get: Get,
        /// No other request waits for the read.
        last: bool,
    },
}

/// Limits of a [`Server`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServeConfig {
    /// Transmissions in flight over all connections.
    pub max_in_flight: usize,
    /// Transmissions in flight per connection.
    pub per_conn_window: usize,
    /// Requests queued or waiting per connection before misses.
    pub max_queued_per_conn: usize,
    /// Answer [`MissReason::Late`] to requests queued this long past due.
    pub late_grace: Option<Nanos>,
    /// Bytes of one connection's admitted requests (queued, waiting or
    /// being sent); one request is always admitted, whatever its size.
    pub max_pinned_bytes_per_conn: u64,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            max_in_flight: 64,
            per_conn_window: 16,
            max_queued_per_conn: 4096,
            late_grace: None,
            max_pinned_bytes_per_conn: u64::MAX,
        }
    }
}

/// A block queued to send: (due, arrival order, get, block CRC, how long
/// it waited for the store read here).
type Queued = (Nanos, u64, GetKey, u32, Nanos);

/// A request waiting for a store read: (connection, get, when it arrived).
type Waiter = (ConnId, Get, Nanos);

#[derive(Debug, Default)]
struct ConnQueue {
    /// Blocks to send, earliest due first.
    ready: BinaryHeap<Reverse<Queued>>,
    waiting: usize,
    in_flight: usize,
    /// Bytes of its requests admitted and not yet answered or written.
    pinned: u64,
    /// Its transmissions in flight: request id, bytes.
    sending: HashMap<u64, u64>,
}

/// [`Get`] in an orderable form for the heap.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct GetKey {
    request: u64,
    fingerprint: u64,
    sample: u64,
    length: u64,
    due: u64,
}

impl From<Get> for GetKey {
    fn from(g: Get) -> Self {
        GetKey {
            request: g.request,
            fingerprint: g.fingerprint,
            sample: g.sample,
            length: g.length,
            due: g.due,
        }
    }
}

impl From<GetKey> for Get {
    fn from(g: GetKey) -> Self {
        Get {
            request: g.request,
            fingerprint: g.fingerprint,
            sample: g.sample,
            length: g.length,
            due: g.due,
        }
    }
}

/// The owner's serving queue. See the module documentation.
#[derive(Debug)]
pub struct Server {
    cfg: ServeConfig,
    conns: BTreeMap<ConnId, ConnQueue>,
    /// Store reads in flight: (fingerprint, sample) -> requests waiting.
    loads: HashMap<(u64, u64), Vec<Waiter>>,
    misses: VecDeque<Reply>,
    in_flight: usize,
    arrivals: u64,
}

impl Server {
    /// An empty queue with these limits (zeros are raised to one).
    pub fn new(cfg: ServeConfig) -> Server {
        Server {
            cfg: ServeConfig {
                max_in_flight: cfg.max_in_flight.max(1),
                per_conn_window: cfg.per_conn_window.max(1),
                max_queued_per_conn: cfg.max_queued_per_conn.max(1),
                late_grace: cfg.late_grace,
                max_pinned_bytes_per_conn: cfg.max_pinned_bytes_per_conn,
            },
            conns: BTreeMap::new(),
            loads: HashMap::new(),
            misses: VecDeque::new(),
            in_flight: 0,
            arrivals: 0,
        }
    }

    /// Transmissions in flight over all connections.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Store reads this queue is waiting for.
    pub fn loads_in_flight(&self) -> usize {
        self.loads.len()
    }

    /// Takes in a request from connection `conn` at `now`, with what the
    /// caller knows of the sample.
    pub fn request(&mut self, conn: ConnId, get: Get, avail: Availability, now: Nanos) -> Admit {
        let q = self.conns.entry(conn).or_default();
        let over_bytes = q.pinned > 0
            && q.pinned.saturating_add(get.length) > self.cfg.max_pinned_bytes_per_conn;
        if q.ready.len() + q.waiting >= self.cfg.max_queued_per_conn || over_bytes {
            return self.miss(conn, get, MissReason::Overloaded);
        }
        if !matches!(avail, Availability::Absent(_)) {
            q.pinned += get.length;
        }
        let key = (get.fingerprint, get.sample);
        // Single flight: a read in flight serves every request for it.
        if let Some(w) = self.loads.get_mut(&key) {
            w.push((conn, get, now));
            q.waiting += 1;
            return Admit::Waiting;
        }
        match avail {
            Availability::Ready { length, crc } => {
                if length != get.length {
                    q.pinned -= get.length;
                    return self.miss(conn, get, MissReason::LengthMismatch);
                }
                self.arrivals += 1;
                q.ready
                    .push(Reverse((get.due, self.arrivals, get.into(), crc, 0)));
                Admit::Queued
            }
            Availability::Kept | Availability::Loading => {
                q.waiting += 1;
                self.loads.insert(key, vec![(conn, get, now)]);
                if avail == Availability::Kept {
                    Admit::StartRead
                } else {
                    Admit::Waiting
                }
            }
            Availability::Absent(reason) => self.miss(conn, get, reason),
        }
    }

    fn miss(&mut self, conn: ConnId, get: Get, reason: MissReason) -> Admit {
        self.misses.push_back(Reply::Miss { conn, get, reason });
        Admit::Missed(reason)
    }

    /// A store read landed at `now`: `Ok((length, crc))` when the sample is
    /// now in the arena, `Err(reason)` when it will not be served. Waiting
    /// requests move to the send queue (or get the miss), each with how
    /// long it waited for the read ([`Reply::Send`]'s `store_wait`).
    /// Unknown reads are ignored.
    pub fn loaded(
        &mut self,
        fingerprint: u64,
        sample: u64,
        result: Result<(u64, u32), MissReason>,
        now: Nanos,
    ) {
        let Some(waiters) = self.loads.remove(&(fingerprint, sample)) else {
            return;
        };
        for (conn, get, arrived) in waiters {
            let Some(q) = self.conns.get_mut(&conn) else {
                continue;
            };
            q.waiting -= 1;
            match result {
                Ok((length, crc)) if length == get.length => {
                    self.arrivals += 1;
                    let wait = now.saturating_sub(arrived);
                    q.ready
                        .push(Reverse((get.due, self.arrivals, get.into(), crc, wait)));
                }
                Ok(_) => {
                    q.pinned -= get.length;
                    self.misses.push_back(Reply::Miss {
                        conn,
                        get,
                        reason: MissReason::LengthMismatch,
                    })
                }
                Err(reason) => {
                    q.pinned -= get.length;
                    self.misses.push_back(Reply::Miss { conn, get, reason })
                }
            }
        }
    }

    /// The next answer to send, if any may go now: misses first, then the
    /// earliest-due queued block whose connection has window left, while
    /// the total in flight is under the cap.
    pub fn poll(&mut self, now: Nanos) -> Option<Reply> {
        if let Some(m) = self.misses.pop_front() {
            return Some(m);
        }
        if self.in_flight >= self.cfg.max_in_flight {
            return None;
        }
        let active = self
            .conns
            .values()
            .filter(|q| !q.ready.is_empty() || q.in_flight > 0)
            .count()
            .max(1);
        let window = self
            .cfg
            .per_conn_window
            .min((self.cfg.max_in_flight / active).max(1));
        let (&conn, _) = self
            .conns
            .iter()
            .filter(|(_, q)| q.in_flight < window)
            .filter_map(|(c, q)| q.ready.peek().map(|Reverse(top)| (c, (top.0, top.1))))
            .min_by_key(|(_, k)| *k)?;
        let q = self.conns.get_mut(&conn)?;
        let Reverse((due, _, key, crc, store_wait)) = q.ready.pop()?;
        let get = Get::from(key);
        if self
            .cfg
            .late_grace
            .is_some_and(|g| now > due.saturating_add(g))
        {
            q.pinned -= get.length;
            return Some(Reply::Miss {
                conn,
                get,
                reason: MissReason::Late,
            });
        }
        q.in_flight += 1;
        q.sending.insert(get.request, get.length);
        self.in_flight += 1;
        Some(Reply::Send {
            conn,
            get,
            crc,
            store_wait,
        })
    }

    /// The transmission of request `request` to `conn` has been written
    /// (or abandoned). Unknown ones are ignored.
    pub fn sent(&mut self, conn: ConnId, request: u64) {
        if let Some(q) = self.conns.get_mut(&conn) {
            if let Some(len) = q.sending.remove(&request) {
                q.in_flight -= 1;
                q.pinned -= len;
                self.in_flight -= 1;
            }
        }
    }

    /// Request `request` of `conn` is cancelled by its requester: taken out
    /// of the send queue or off its store read's waiters. `None` when it is
    /// not here (unknown, answered already, or its block is being sent: the
    /// block is the answer).
    pub fn cancel(&mut self, conn: ConnId, request: u64) -> Option<Cancelled> {
        let q = self.conns.get_mut(&conn)?;
        if q.sending.contains_key(&request) {
            return None;
        }
        let queued = q
            .ready
            .iter()
            .find(|Reverse(x)| x.2.request == request)
            .map(|Reverse(x)| Get::from(x.2));
        if let Some(get) = queued {
            q.ready.retain(|Reverse(x)| x.2.request != request);
            q.pinned -= get.length;
            return Some(Cancelled::Queued(get));
        }
        let key = self.loads.iter().find_map(|(k, w)| {
            w.iter()
                .any(|(c, g, _)| *c == conn && g.request == request)
                .then_some(*k)
        })?;
        let waiters = self.loads.get_mut(&key)?;
        let at = waiters
            .iter()
            .position(|(c, g, _)| *c == conn && g.request == request)?;
        let (_, get, _) = waiters.remove(at);
        let last = waiters.is_empty();
        if last {
            self.loads.remove(&key);
        }
        q.waiting -= 1;
        q.pinned -= get.length;
        Some(Cancelled::Waiting { get, last })
    }

    /// Bytes of `conn`'s requests admitted and not yet answered or written.
    pub fn pinned_bytes(&self, conn: ConnId) -> u64 {
        self.conns.get(&conn).map_or(0, |q| q.pinned)
    }

    /// Forgets everything of a closed connection (its transmissions no
    /// longer count; store reads in flight still land for the others).
    pub fn conn_closed(&mut self, conn: ConnId) {
        if let Some(q) = self.conns.remove(&conn) {
            self.in_flight -= q.in_flight;
        }
        for w in self.loads.values_mut() {
            w.retain(|(c, _, _)| *c != conn);
        }
        self.misses.retain(|r| match r {
            Reply::Send { conn: c, .. } | Reply::Miss { conn: c, .. } => *c != conn,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(request: u64, sample: u64, due: Nanos) -> Get {
        Get {
            request,
            fingerprint: 1,
            sample,
            length: 10,
            due,
        }
    }

    const READY: Availability = Availability::Ready { length: 10, crc: 7 };

    fn drain(s: &mut Server, now: Nanos) -> Vec<Reply> {
        std::iter::from_fn(|| s.poll(now)).collect()
    }

    #[test]
    fn earliest_due_first_across_connections() {
        let mut s = Server::new(ServeConfig::default());
        s.request(1, get(1, 1, 300), READY, 0);
        s.request(2, get(2, 2, 100), READY, 0);
        s.request(1, get(3, 3, 200), READY, 0);
        s.request(2, get(4, 4, 200), READY, 0);
        let order: Vec<u64> = drain(&mut s, 0)
            .iter()
            .map(|r| match r {
                Reply::Send { get, .. } => get.request,
                Reply::Miss { .. } => panic!("{r:?}"),
            })
            .collect();
        assert_eq!(order, [2, 3, 4, 1]);
        assert_eq!(s.in_flight(), 4);
    }

    #[test]
    fn a_cancelled_request_leaves_the_queue_unless_its_block_is_being_sent() {
        let mut s = Server::new(ServeConfig::default());
        for r in 1..=3 {
            s.request(1, get(r, r, r), READY, 0);
        }
        assert!(matches!(s.poll(0), Some(Reply::Send { get, .. }) if get.request == 1));
        assert_eq!(s.pinned_bytes(1), 30);
        // Being sent: the block is the answer.
        assert_eq!(s.cancel(1, 1), None);
        assert_eq!(s.cancel(1, 3), Some(Cancelled::Queued(get(3, 3, 3))));
        assert_eq!(s.pinned_bytes(1), 20);
        // Unknown, cancelled already, or another connection's.
        assert_eq!(s.cancel(1, 3), None);
        assert_eq!(s.cancel(2, 2), None);
        assert_eq!(s.cancel(1, 99), None);
        let left: Vec<u64> = drain(&mut s, 0)
            .iter()
            .map(|r| match r {
                Reply::Send { get, .. } => get.request,
                Reply::Miss { .. } => panic!("{r:?}"),
            })
            .collect();
        assert_eq!(left, [2], "the cancelled request is not sent");
        s.sent(1, 1);
        s.sent(1, 2);
        assert_eq!((s.in_flight(), s.pinned_bytes(1)), (0, 0));
    }

    #[test]
    fn cancelling_the_last_waiter_of_a_store_read_says_so() {
        let mut s = Server::new(ServeConfig::default());
        assert_eq!(
            s.request(1, get(1, 5, 0), Availability::Kept, 0),
            Admit::StartRead
        );
        assert_eq!(
            s.request(2, get(1, 5, 0), Availability::Kept, 0),
            Admit::Waiting
        );
        assert_eq!(
            s.cancel(1, 1),
            Some(Cancelled::Waiting {
                get: get(1, 5, 0),
                last: false
            })
        );
        assert_eq!(
            s.cancel(2, 1),
            Some(Cancelled::Waiting {
                get: get(1, 5, 0),
                last: true
            }),
            "no one waits for the read: it need not start"
        );
        assert_eq!(s.loads_in_flight(), 0);
        assert_eq!((s.pinned_bytes(1), s.pinned_bytes(2)), (0, 0));
        // The read, if it ran after all, answers no one.
        s.loaded(1, 5, Ok((10, 7)), 5);
        assert!(drain(&mut s, 5).is_empty());
        // A new request for the sample starts a read again.
        assert_eq!(
            s.request(1, get(2, 5, 0), Availability::Kept, 6),
            Admit::StartRead
        );
    }

    #[test]
    fn absent_samples_miss_at_once() {
        let mut s = Server::new(ServeConfig::default());
        s.request(1, get(1, 1, 0), READY, 0);
        assert_eq!(
            s.request(
                1,
                get(2, 2, 0),
                Availability::Absent(MissReason::NotKept),
                0
            ),
            Admit::Missed(MissReason::NotKept)
        );
        assert_eq!(
            s.request(
                1,
                get(3, 3, 0),
                Availability::Ready { length: 11, crc: 0 },
                0
            ),
            Admit::Missed(MissReason::LengthMismatch)
        );
        let r = drain(&mut s, 0);
        assert!(matches!(
            r[0],
            Reply::Miss {
                reason: MissReason::NotKept,
                ..
            }
        ));
        assert!(matches!(
            r[1],
            Reply::Miss {
                reason: MissReason::LengthMismatch,
                ..
            }
        ));
        assert!(matches!(r[2], Reply::Send { .. }));
    }

    #[test]
    fn single_flight_waits_for_the_read() {
        let mut s = Server::new(ServeConfig::default());
        assert_eq!(
            s.request(1, get(1, 5, 10), Availability::Kept, 0),
            Admit::StartRead
        );
        assert_eq!(
            s.request(2, get(2, 5, 5), Availability::Kept, 0),
            Admit::Waiting
        );
        assert_eq!(s.request(3, get(3, 5, 5), READY, 0), Admit::Waiting);
        assert_eq!(s.loads_in_flight(), 1);
        assert!(drain(&mut s, 0).is_empty());
        s.loaded(1, 5, Ok((10, 99)), 0);
        let r = drain(&mut s, 0);
        assert_eq!(r.len(), 3);
        assert!(r.iter().all(|x| matches!(x, Reply::Send { crc: 99, .. })));
        // A read that fails answers every waiter with its reason.
        assert_eq!(
            s.request(1, get(4, 6, 0), Availability::Loading, 0),
            Admit::Waiting
        );
        assert_eq!(
            s.request(2, get(5, 6, 0), Availability::Kept, 0),
            Admit::Waiting
        );
        s.loaded(1, 6, Err(MissReason::StoreError), 0);
        let r = drain(&mut s, 0);
        assert_eq!(r.len(), 2);
        assert!(r.iter().all(|x| matches!(
            x,
            Reply::Miss {
                reason: MissReason::StoreError,
                ..
            }
        )));
    }

    #[test]
    fn windows_and_cap_bound_transmissions() {
        let mut s = Server::new(ServeConfig {
            max_in_flight: 3,
            per_conn_window: 2,
            ..ServeConfig::default()
        });
        for r in 0..5 {
            s.request(1, get(r, r, r), READY, 0);
            s.request(2, get(10 + r, r, 100 + r), READY, 0);
        }
        let r = drain(&mut s, 0);
        // Connection 1 fills its window of 2; connection 2 gets the third.
        // Two connections share 3 slots: one each (3 / 2), the third waits.
        assert_eq!(r.len(), 2);
        let to2 = r
            .iter()
            .filter(|x| matches!(x, Reply::Send { conn: 2, .. }))
            .count();
        assert_eq!(to2, 1);
        assert_eq!(s.poll(0), None);
        s.sent(1, 0);
        assert!(matches!(s.poll(0), Some(Reply::Send { conn: 1, .. })));
        assert_eq!(s.poll(0), None);
        s.conn_closed(1);
        assert_eq!(s.in_flight(), 1);
        // Alone now, connection 2 may have its whole window.
        assert!(matches!(s.poll(0), Some(Reply::Send { conn: 2, .. })));
        assert_eq!(s.in_flight(), 2);
        assert_eq!(s.poll(0), None);
    }

    #[test]
    fn connections_that_do_not_read_cannot_take_every_slot() {
        // Six connections whose blocks are never written (their peers do
        // not read) and one that reads: the reader still gets its share.
        let mut s = Server::new(ServeConfig {
            max_in_flight: 64,
            per_conn_window: 16,
            ..ServeConfig::default()
        });
        for c in 1..=6 {
            for r in 0..100 {
                s.request(c, get(r, r, 0), READY, 0);
            }
        }
        let stuck = drain(&mut s, 0).len();
        assert!(stuck <= 64);
        for r in 0..100 {
            s.request(7, get(r, r, 0), READY, 0);
        }
        let mut served = 0;
        for _ in 0..100 {
            match s.poll(0) {
                Some(Reply::Send { conn: 7, get, .. }) => {
                    served += 1;
                    s.sent(7, get.request);
                }
                Some(other) => panic!("a stuck connection got more: {other:?}"),
                None => break,
            }
        }
        assert_eq!(served, 100, "the reading connection was starved");
    }

    #[test]
    fn pinned_bytes_per_connection_are_capped() {
        let mut s = Server::new(ServeConfig {
            max_pinned_bytes_per_conn: 25,
            ..ServeConfig::default()
        });
        assert_eq!(s.request(1, get(1, 1, 0), READY, 0), Admit::Queued);
        assert_eq!(
            s.request(1, get(2, 2, 0), Availability::Kept, 0),
            Admit::StartRead
        );
        assert_eq!(
            s.request(1, get(3, 3, 0), READY, 0),
            Admit::Missed(MissReason::Overloaded)
        );
        assert_eq!(s.pinned_bytes(1), 20);
        // Another connection has its own budget.
        assert_eq!(s.request(2, get(4, 4, 0), READY, 0), Admit::Queued);
        // Written blocks and failed reads give bytes back.
        let sent: Vec<Reply> = drain(&mut s, 0);
        assert!(sent
            .iter()
            .any(|r| matches!(r, Reply::Send { conn: 1, .. })));
        s.sent(1, 1);
        s.loaded(1, 2, Err(MissReason::StoreError), 0);
        assert_eq!(s.pinned_bytes(1), 0);
        // One request is admitted whatever its size.
        let big = Get {
            length: 1000,
            ..get(5, 5, 0)
        };
        assert_eq!(
            s.request(
                1,
                big,
                Availability::Ready {
                    length: 1000,
                    crc: 0
                },
                0
            ),
            Admit::Queued
        );
    }

    #[test]
    fn overload_and_lateness_miss() {
        let mut s = Server::new(ServeConfig {
            max_queued_per_conn: 2,
            late_grace: Some(50),
            ..ServeConfig::default()
        });
        s.request(1, get(1, 1, 0), READY, 0);
        s.request(1, get(2, 2, 1000), READY, 0);
        assert_eq!(
            s.request(1, get(3, 3, 0), READY, 0),
            Admit::Missed(MissReason::Overloaded)
        );
        let r = drain(&mut s, 100);
        assert!(matches!(
            r[0],
            Reply::Miss {
                reason: MissReason::Overloaded,
                ..
            }
        ));
        assert!(matches!(
            r[1],
            Reply::Miss {
                reason: MissReason::Late,
                get: Get { request: 1, .. },
                ..
            }
        ));
        assert!(matches!(
            r[2],
            Reply::Send {
                get: Get { request: 2, .. },
                ..
            }
        ));
    }

    #[test]
    fn closed_connection_leaves_the_read_for_others() {
        let mut s = Server::new(ServeConfig::default());
        s.request(1, get(1, 5, 0), Availability::Kept, 0);
        s.request(2, get(2, 5, 0), Availability::Kept, 0);
        s.conn_closed(1);
        s.loaded(1, 5, Ok((10, 1)), 0);
        let r = drain(&mut s, 0);
        assert_eq!(r.len(), 1);
        assert!(matches!(r[0], Reply::Send { conn: 2, .. }));
    }
}

//! A DNS responder for tests, on UDP: one name, whose A records are a set
//! the test changes while it runs; queries of any other type of that name
//! (AAAA) get an empty answer, any other name `NXDOMAIN`, anything that is no single-question
//! query `FORMERR` (or nothing, when too short to answer). TTL 0, so
//! nothing is cached. Written here because the few lines of RFC 1035 a
//! test needs do not justify a DNS server crate in the dependency tree
//! (docs/testing.md).

use granary_testkit::worker::Worker;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The responder; stopped when dropped.
pub struct DnsStub {
    records: Arc<Mutex<Vec<Ipv4Addr>>>,
    queries: Arc<AtomicU64>,
    _thread: Worker,
}

impl DnsStub {
    /// Answers for `name` (case-insensitive, without the trailing dot) on
    /// `addr`, with `records` as its A records for now.
    pub fn start(addr: SocketAddr, name: &str, records: &[Ipv4Addr]) -> std::io::Result<DnsStub> {
        let sock = UdpSocket::bind(addr)?;
        sock.set_read_timeout(Some(Duration::from_millis(50)))?;
        let records = Arc::new(Mutex::new(records.to_vec()));
        let queries = Arc::new(AtomicU64::new(0));
        let (r, q) = (Arc::clone(&records), Arc::clone(&queries));
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        let thread = Worker::spawn("dns-stub", move |s| {
            let mut buf = [0u8; 512];
            while !s.load(Ordering::Relaxed) {
                let Ok((n, from)) = sock.recv_from(&mut buf) else {
                    continue;
                };
                q.fetch_add(1, Ordering::Relaxed);
                let now = r.lock().unwrap().clone();
                if let Some(reply) = answer(&buf[..n], &name, &now) {
                    let _ = sock.send_to(&reply, from);
                }
            }
        });
        Ok(DnsStub {
            records,
            queries,
            _thread: thread,
        })
    }

    /// Replaces the name's A records.
    pub fn set(&self, records: &[Ipv4Addr]) {
        *self.records.lock().unwrap() = records.to_vec();
    }

    /// Queries received so far.
    pub fn queries(&self) -> u64 {
        self.queries.load(Ordering::Relaxed)
    }
}

const TYPE_A: u16 = 1;
const CLASS_IN: u16 = 1;

/// The reply to the query `q` (RFC 1035 §4.1), `None` when it is too short
/// to carry an id.
pub fn answer(q: &[u8], name: &str, records: &[Ipv4Addr]) -> Option<Vec<u8>> {
    if q.len() < 12 {
        return None;
    }
    let be = |i: usize| u16::from_be_bytes([q[i], q[i + 1]]);
    let header = |rcode: u16, answers: u16, question: bool| {
        let mut h = Vec::with_capacity(12);
        h.extend_from_slice(&q[..2]); // id
        let rd = be(2) & 0x0100;
        h.extend_from_slice(&(0x8080 | rd | rcode).to_be_bytes()); // QR, RA, RD as asked
        h.extend_from_slice(&u16::from(question).to_be_bytes());
        h.extend_from_slice(&answers.to_be_bytes());
        h.extend_from_slice(&[0, 0, 0, 0]);
        h
    };
    // One question, not a response, a standard query.
    if be(2) & 0x8000 != 0 || (be(2) >> 11) & 0xf != 0 || be(4) != 1 {
        return Some(header(1, 0, false));
    }
    let mut i = 12;
    let mut labels = Vec::new();
    loop {
        let len = usize::from(*q.get(i)?);
        i += 1;
        if len == 0 {
            break;
        }
        if len > 63 || i + len > q.len() {
            return Some(header(1, 0, false));
        }
        labels.push(String::from_utf8_lossy(&q[i..i + len]).to_ascii_lowercase());
        i += len;
    }
    if i + 4 > q.len() {
        return Some(header(1, 0, false));
    }
    let (qtype, qclass) = (be(i), be(i + 2));
    let question = &q[12..i + 4];
    if labels.join(".") != name || qclass != CLASS_IN {
        let mut r = header(3, 0, true);
        r.extend_from_slice(question);
        return Some(r);
    }
    let found: &[Ipv4Addr] = if qtype == TYPE_A { records } else { &[] };
    let mut r = header(0, found.len() as u16, true);
    r.extend_from_slice(question);
    for ip in found {
        r.extend_from_slice(&[0xc0, 12]); // the name: a pointer to the question's
        r.extend_from_slice(&TYPE_A.to_be_bytes());
        r.extend_from_slice(&CLASS_IN.to_be_bytes());
        r.extend_from_slice(&0u32.to_be_bytes()); // TTL
        r.extend_from_slice(&4u16.to_be_bytes());
        r.extend_from_slice(&ip.octets());
    }
    Some(r)
}

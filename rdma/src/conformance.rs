//! A conformance suite for peer transports, generic over [`Transport`]:
//! the same cases run over the RDMA driver on the fake NIC (this crate's
//! tests) and can run over the TCP transport.
//!
//! A harness behind [`Transport`] owns one requester and one or more
//! owners. Owners serve [`payload`]`(sample)` with the header made by
//! [`header`]; the suite checks every block against its header's CRC,
//! bound to (dataset, sample, length) as the peer protocol's block CRC
//! is, so a flipped bit or a block for another sample is caught by the
//! requester. Every case checks that each request is resolved exactly
//! once: delivered and verified, or fallen back.
//!
//! Two cases play an owner that writes where it was not asked to: outside
//! the extent its get named, and into an extent again after its get
//! ended. The requester's memory must be as the suite saw it: each block
//! delivered still in its extent, and every byte outside the extents its
//! gets named as it was before ([`Transport::memory_as_delivered`]).

use std::collections::BTreeMap;

/// The dataset fingerprint the suite uses.
pub const FINGERPRINT: u64 = 0x6772_616e_6172_7931;

/// Bytes of a header made by [`header`].
pub const HEADER_LEN: usize = 20;

/// An error completion a harness can inject, as the verbs name them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// Transport retries exhausted.
    RetryExceeded,
    /// Receiver not ready, retries exhausted.
    ReceiverNotReady,
    /// Remote access error.
    RemoteAccess,
    /// Work request flushed after a queue pair error.
    Flushed,
}

impl ErrorKind {
    /// Every kind.
    pub const ALL: [ErrorKind; 4] = [
        ErrorKind::RetryExceeded,
        ErrorKind::ReceiverNotReady,
        ErrorKind::RemoteAccess,
        ErrorKind::Flushed,
    ];
}

/// A fault to inject.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The next block an owner sends has one bit flipped on the way.
    CorruptNextBlock {
        /// The owner.
        owner: usize,
    },
    /// The owner dies mid-transfer: it takes the requests already sent to
    /// it and starts answering them, but nothing it sends arrives.
    KillOwner {
        /// The owner.
        owner: usize,
    },
    /// The owner's next outgoing transfer completes with this error.
    ErrorCompletion {
        /// The owner.
        owner: usize,
        /// The error.
        kind: ErrorKind,
    },
    /// The owner writes its next block `shift` bytes away from the extent
    /// the get named (with whatever key or handle that get gave it).
    StrayWrite {
        /// The owner.
        owner: usize,
        /// Bytes from the extent's start (negative: before it).
        shift: i64,
    },
    /// The owner writes the last block it delivered once more, changed, to
    /// the same extent with the same key or handle, after the requester
    /// was told of the delivery.
    StaleKeyWrite {
        /// The owner.
        owner: usize,
    },
}

/// How one request ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A block arrived: its header and the bytes in the extent.
    Delivered {
        /// The request.
        request: u64,
        /// The header frame as received.
        header: Vec<u8>,
        /// The bytes written into the requester's extent.
        bytes: Vec<u8>,
    },
    /// The transport gave up on it: the caller retries elsewhere.
    Fallback {
        /// The request.
        request: u64,
    },
}

impl Outcome {
    fn request(&self) -> u64 {
        match self {
            Outcome::Delivered { request, .. } | Outcome::Fallback { request } => *request,
        }
    }
}

/// The transport under test, with its owners.
pub trait Transport {
    /// Number of owners (at least 1).
    fn owners(&self) -> usize;
    /// Most requests the requester may have in flight to one owner before
    /// the transport's flow control holds the rest back.
    fn credit_limit(&self) -> usize;
    /// Asks `owner` for `sample` (the owner serves [`payload`] and
    /// [`header`]). A refusal shows up as a [`Outcome::Fallback`].
    fn get(&mut self, owner: usize, request: u64, sample: u64);
    /// Lets both ends work for `dt_ns` of time; appends outcomes.
    fn step(&mut self, dt_ns: u64, out: &mut Vec<Outcome>);
    /// Injects a fault; false if this transport has no such fault.
    fn inject(&mut self, fault: Fault) -> bool;
    /// Flow control violations seen (a send with no receive posted).
    fn flow_control_violations(&self) -> u64;
    /// Time after which a failed owner is tried again (ns).
    fn retry_after_ns(&self) -> u64;
    /// Time after which an unanswered request is given up (ns).
    fn transfer_timeout_ns(&self) -> u64;
    /// Whether the requester's memory is as the suite saw it: every block
    /// delivered still in its extent as delivered, and every byte outside
    /// the extents the requester's gets named as it was before the first
    /// get. `None` when the harness cannot look.
    fn memory_as_delivered(&mut self) -> Option<bool> {
        None
    }
}

/// Whether a case ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ran {
    /// It ran and passed.
    Yes,
    /// The transport cannot inject the fault it needs.
    Unsupported,
}

/// Length of a sample's block: 1 byte to about 20 KiB, varied.
pub fn sample_len(sample: u64) -> usize {
    1 + ((sample.wrapping_mul(2_654_435_761) >> 7) % 20_000) as usize
}

/// The block of a sample.
pub fn payload(sample: u64) -> Vec<u8> {
    let mut x = sample.wrapping_mul(granary_base::hash::GAMMA) | 1;
    (0..sample_len(sample))
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// CRC-32C over (fingerprint, sample, length) then the bytes.
pub fn block_crc(sample: u64, bytes: &[u8]) -> u32 {
    let mut id = [0u8; 24];
    id[..8].copy_from_slice(&FINGERPRINT.to_le_bytes());
    id[8..16].copy_from_slice(&sample.to_le_bytes());
    id[16..].copy_from_slice(&(bytes.len() as u64).to_le_bytes());
    crc32c::crc32c_append(crc32c::crc32c(&id), bytes)
}

/// The data header an owner sends for `sample`: `u64 sample, u64 length,
/// u32 crc`.
pub fn header(sample: u64, bytes: &[u8]) -> Vec<u8> {
    let mut h = Vec::with_capacity(HEADER_LEN);
    h.extend_from_slice(&sample.to_le_bytes());
    h.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
    h.extend_from_slice(&block_crc(sample, bytes).to_le_bytes());
    h
}

/// Parses a header: `(sample, length, crc)`.
pub fn parse_header(h: &[u8]) -> Option<(u64, u64, u32)> {
    if h.len() != HEADER_LEN {
        return None;
    }
    let sample = u64::from_le_bytes(h[..8].try_into().ok()?);
    let len = u64::from_le_bytes(h[8..16].try_into().ok()?);
    let crc = u32::from_le_bytes(h[16..].try_into().ok()?);
    Some((sample, len, crc))
}

/// Whether a delivered block verifies as `sample`.
pub fn verifies(sample: u64, header: &[u8], bytes: &[u8]) -> bool {
    parse_header(header).is_some_and(|(s, len, crc)| {
        s == sample && len == bytes.len() as u64 && block_crc(sample, bytes) == crc
    })
}

/// What a case saw, per request.
#[derive(Debug, Default)]
pub struct Tally {
    /// Requests issued: request -> sample.
    pub issued: BTreeMap<u64, u64>,
    /// Delivered and verified.
    pub good: Vec<u64>,
    /// Delivered but failing verification.
    pub corrupt: Vec<u64>,
    /// Fell back.
    pub fallback: Vec<u64>,
    /// Order in which requests resolved.
    pub order: Vec<u64>,
}

impl Tally {
    fn record(&mut self, o: Outcome) {
        let request = o.request();
        let sample = *self
            .issued
            .get(&request)
            .unwrap_or_else(|| panic!("outcome for request {request} never issued"));
        assert!(
            !self.order.contains(&request),
            "request {request} resolved twice"
        );
        self.order.push(request);
        match o {
            Outcome::Delivered { header, bytes, .. } => {
                if verifies(sample, &header, &bytes) {
                    self.good.push(request);
                } else {
                    self.corrupt.push(request);
                }
            }
            Outcome::Fallback { .. } => self.fallback.push(request),
        }
    }

    /// Whether every issued request resolved.
    pub fn complete(&self) -> bool {
        self.order.len() == self.issued.len()
    }
}

fn issue<T: Transport>(t: &mut T, tally: &mut Tally, owner: usize, sample: u64) {
    let request = tally.issued.len() as u64 + 1000 * (owner as u64 + 1) + (sample << 20);
    tally.issued.insert(request, sample);
    t.get(owner, request, sample);
}

/// Asks owner 0 for `samples` and checks every one is delivered: where a
/// fault scenario starts from.
fn delivered_by_owner_0<T: Transport>(t: &mut T, samples: std::ops::Range<u64>) -> Tally {
    let mut tally = Tally::default();
    let n = samples.end - samples.start;
    for s in samples {
        issue(t, &mut tally, 0, s);
    }
    drain(t, &mut tally, STEP_NS, 1000);
    assert_eq!(tally.good.len() as u64, n);
    tally
}

/// Steps in `dt_ns` increments until every request resolved or `budget`
/// steps passed.
fn drain<T: Transport>(t: &mut T, tally: &mut Tally, dt_ns: u64, budget: usize) {
    let mut out = Vec::new();
    for _ in 0..budget {
        t.step(dt_ns, &mut out);
        for o in out.drain(..) {
            tally.record(o);
        }
        if tally.complete() {
            return;
        }
    }
    panic!(
        "{} of {} requests unresolved after {budget} steps",
        tally.issued.len() - tally.order.len(),
        tally.issued.len()
    );
}

const STEP_NS: u64 = 1_000_000;

/// Steps enough for a stuck request to time out, and then some.
fn patience<T: Transport>(t: &T) -> usize {
    (t.transfer_timeout_ns() / STEP_NS) as usize * 2 + 1000
}

/// Many gets in flight at once to every owner: all arrive and verify.
pub fn many_in_flight<T: Transport>(t: &mut T) -> Tally {
    let mut tally = Tally::default();
    for s in 0..300u64 {
        issue(t, &mut tally, (s as usize) % t.owners(), s);
    }
    drain(t, &mut tally, STEP_NS, 1000);
    assert_eq!(
        tally.good.len(),
        300,
        "all delivered and verified: {tally:?}"
    );
    assert_eq!(t.flow_control_violations(), 0);
    tally
}

/// Gets to several owners complete in whatever order the transport
/// gives; each still matches its own request. Returns whether the
/// completion order differed from the issue order.
pub fn out_of_order<T: Transport>(t: &mut T) -> bool {
    assert!(t.owners() >= 2, "this case needs two owners or more");
    let mut tally = Tally::default();
    // Long blocks to owner 0, short ones to the others.
    for i in 0..60u64 {
        let owner = (i as usize) % t.owners();
        issue(t, &mut tally, owner, i * 7 + owner as u64);
    }
    drain(t, &mut tally, STEP_NS, 1000);
    assert_eq!(
        tally.good.len(),
        60,
        "all delivered and verified: {tally:?}"
    );
    let issued: Vec<u64> = tally.issued.keys().copied().collect();
    let mut resolved = tally.order.clone();
    resolved.sort_unstable();
    assert_eq!(resolved, issued);
    tally.order != tally.issued.keys().copied().collect::<Vec<_>>()
}

/// Far more gets than credits: flow control holds the rest back, nothing
/// overruns the receiver, all arrive.
pub fn credits_exhausted<T: Transport>(t: &mut T) {
    let n = (t.credit_limit() * 8).max(16) as u64;
    let mut tally = Tally::default();
    for s in 0..n {
        issue(t, &mut tally, 0, 10_000 + s);
    }
    drain(t, &mut tally, STEP_NS, 5000);
    assert_eq!(tally.good.len() as u64, n, "all delivered: {tally:?}");
    assert_eq!(t.flow_control_violations(), 0, "receiver overrun");
}

/// One block is corrupted on the way: the requester's CRC check catches
/// exactly that one; the others verify.
pub fn corrupted_block<T: Transport>(t: &mut T) -> Ran {
    let mut tally = Tally::default();
    issue(t, &mut tally, 0, 77);
    drain(t, &mut tally, STEP_NS, 1000);
    if !t.inject(Fault::CorruptNextBlock { owner: 0 }) {
        return Ran::Unsupported;
    }
    issue(t, &mut tally, 0, 78);
    drain(t, &mut tally, STEP_NS, 1000);
    for s in 79..90 {
        issue(t, &mut tally, 0, s);
    }
    drain(t, &mut tally, STEP_NS, 1000);
    assert_eq!(
        tally.corrupt.len(),
        1,
        "exactly one corrupt block: {tally:?}"
    );
    assert_eq!(tally.issued[&tally.corrupt[0]], 78);
    assert_eq!(tally.good.len(), 12);
    Ran::Yes
}

/// An owner dies with requests in flight (it has received them and
/// started sending when it goes): each resolves exactly once (delivered
/// before the loss, or fallen back), none is lost or corrupt, and later
/// gets to it fall back at once.
pub fn peer_loss_mid_transfer<T: Transport>(t: &mut T) -> Ran {
    let mut tally = delivered_by_owner_0(t, 500..510);
    for s in 10..40 {
        issue(t, &mut tally, 0, 500 + s);
    }
    if !t.inject(Fault::KillOwner { owner: 0 }) {
        return Ran::Unsupported;
    }
    let p = patience(t);
    drain(t, &mut tally, STEP_NS, p);
    assert!(
        !tally.fallback.is_empty(),
        "in-flight requests fell back: {tally:?}"
    );
    assert!(tally.corrupt.is_empty(), "nothing corrupt: {tally:?}");
    issue(t, &mut tally, 0, 900);
    drain(t, &mut tally, STEP_NS, 10);
    assert_eq!(
        tally.fallback.last(),
        tally.order.last(),
        "dead owner refused"
    );
    if t.owners() > 1 {
        issue(t, &mut tally, 1, 901);
        drain(t, &mut tally, STEP_NS, 1000);
        assert_eq!(
            tally.good.last(),
            tally.order.last(),
            "other owners unaffected"
        );
    }
    Ran::Yes
}

/// An error completion on the owner's next transfer: the requests in
/// flight on that link fall back, the rest verify, and after the backoff
/// the link works again.
pub fn error_completion<T: Transport>(t: &mut T, kind: ErrorKind) -> Ran {
    let mut tally = delivered_by_owner_0(t, 2000..2005);
    if !t.inject(Fault::ErrorCompletion { owner: 0, kind }) {
        return Ran::Unsupported;
    }
    for s in 0..20 {
        issue(t, &mut tally, 0, 3000 + s);
    }
    let p = patience(t);
    drain(t, &mut tally, STEP_NS, p);
    assert!(
        !tally.fallback.is_empty(),
        "{kind:?}: requests fell back: {tally:?}"
    );
    assert!(
        tally.corrupt.is_empty(),
        "{kind:?}: nothing corrupt: {tally:?}"
    );
    // Refused while backing off.
    let before = tally.fallback.len();
    issue(t, &mut tally, 0, 4000);
    drain(t, &mut tally, STEP_NS, 10);
    assert_eq!(
        tally.fallback.len(),
        before + 1,
        "{kind:?}: refused during backoff"
    );
    // Usable again after it.
    blocks_go_through_again(t, &mut tally, 5000, 10);
    Ran::Yes
}

/// An owner writes its next block `shift` bytes away from the extent the
/// get named: the write fails (or is refused), that request falls back,
/// nothing is written outside the extents the requester named and no
/// delivered block changes, and afterwards blocks go through again.
pub fn write_outside_extent<T: Transport>(t: &mut T, shift: i64) -> Ran {
    let mut tally = delivered_by_owner_0(t, 7000..7003);
    match t.memory_as_delivered() {
        None => return Ran::Unsupported,
        Some(ok) => assert!(ok, "memory as delivered before the fault"),
    }
    if !t.inject(Fault::StrayWrite { owner: 0, shift }) {
        return Ran::Unsupported;
    }
    issue(t, &mut tally, 0, 7100);
    let stray = *tally.issued.keys().last().expect("just issued");
    let p = patience(t);
    drain(t, &mut tally, STEP_NS, p);
    assert!(
        tally.fallback.contains(&stray),
        "shift {shift}: the stray block fell back: {tally:?}"
    );
    assert!(tally.corrupt.is_empty(), "shift {shift}: {tally:?}");
    assert_eq!(
        t.memory_as_delivered(),
        Some(true),
        "shift {shift}: nothing written outside the extents named"
    );
    blocks_go_through_again(t, &mut tally, 7200, 5);
    assert_eq!(t.memory_as_delivered(), Some(true), "shift {shift}");
    Ran::Yes
}

/// After a block was delivered, its owner writes the extent again with
/// the key or handle of that get: it does not land, and the block stays
/// as delivered; afterwards blocks go through again.
pub fn write_with_a_dead_key<T: Transport>(t: &mut T) -> Ran {
    let mut tally = delivered_by_owner_0(t, 7300..7301);
    match t.memory_as_delivered() {
        None => return Ran::Unsupported,
        Some(ok) => assert!(ok, "memory as delivered before the fault"),
    }
    if !t.inject(Fault::StaleKeyWrite { owner: 0 }) {
        return Ran::Unsupported;
    }
    let mut out = Vec::new();
    for _ in 0..10 {
        t.step(STEP_NS, &mut out);
    }
    assert!(out.is_empty(), "nothing was in flight: {out:?}");
    assert_eq!(
        t.memory_as_delivered(),
        Some(true),
        "the delivered block is unchanged"
    );
    blocks_go_through_again(t, &mut tally, 7400, 5);
    assert_eq!(t.memory_as_delivered(), Some(true));
    Ran::Yes
}

/// Once the owner may be tried again, `n` blocks from it verify.
fn blocks_go_through_again<T: Transport>(t: &mut T, tally: &mut Tally, first: u64, n: u64) {
    let mut out = Vec::new();
    t.step(t.retry_after_ns() + STEP_NS, &mut out);
    for o in out.drain(..) {
        tally.record(o);
    }
    let good = tally.good.len();
    for s in first..first + n {
        issue(t, tally, 0, s);
    }
    let p = patience(t);
    drain(t, tally, STEP_NS, p);
    assert_eq!(
        tally.good.len(),
        good + n as usize,
        "blocks go through: {tally:?}"
    );
}

//! An in-memory fake NIC: several hosts in one process joined by a
//! [`Fabric`], each host a [`FakeNic`] implementing [`Verbs`].
//!
//! Regions are memory of the fake's own ([`Verbs::register`]) or memory
//! the caller mapped, registered in place ([`Verbs::register_mapped`]: the
//! agent's arena), which RDMA writes then land in.
//!
//! It executes work requests against registered regions with the checks a
//! real RC queue pair makes: local keys and bounds (local protection
//! error), remote keys, bounds and rights (remote access error, which
//! also breaks the responder's queue pair), a send with no receive posted
//! (receiver not ready, retries exhausted), a receive buffer too small
//! (local length error), a dead or disconnected peer (retry exceeded).
//! An error completion moves the queue pair to ERROR and flushes every
//! outstanding work request, as the verbs do.
//!
//! Memory windows (type 2) follow the same rules as on a NIC: a bind is a
//! send-queue work request, executed in order, that needs an unbound
//! window, a region registered with [`Access::MW_BIND`] (and local write
//! for a remote-write window) and a non-empty span inside it (else a
//! memory-window bind error). An RDMA write naming a window's rkey lands
//! only if the window is bound with remote write, through the very queue
//! pair the write arrives on, and the whole write lies inside the bound
//! span; a window never bound, invalidated (a local invalidate executed)
//! or deallocated, or a write reaching one byte outside, is a remote
//! access error and writes nothing. A window bound through a queue pair
//! that is destroyed stays bound, naming a queue pair that no longer
//! exists, until it is invalidated or deallocated.
//!
//! Work requests run when any host polls: the fabric picks queue pairs in
//! a seeded pseudo-random order, one work request at a time, so
//! completions interleave across queue pairs while each queue pair's own
//! work requests complete in post order. Faults can be injected: an error
//! status on the next matching work request, a flipped bit in the next
//! RDMA write a host makes, the next RDMA write a host makes shifted to
//! another address, the last RDMA write a host made replayed, a host
//! held (its work requests wait) or killed (it never answers again).

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use granary_shm::arena::ArenaSlice;

use crate::verbs::{
    Access, Endpoint, Mr, MwId, Opcode, QpCaps, QpId, QpState, RemoteAddr, Sge, Transition, Verbs,
    VerbsError, WcStatus, WindowSpan, WorkCompletion,
};

/// Index of a host on a [`Fabric`].
pub type HostId = usize;

const PAGE: u64 = 4096;
/// Most memory windows a host may hold at once (a NIC's `max_mw`).
pub const MAX_MW: usize = 1 << 16;
/// High byte of every window rkey (regions' rkeys have 0x7a).
const MW_KEY: u32 = 0x3c00_0000;

/// The bytes behind a region: the fake's own, or memory the caller
/// mapped and registered in place ([`Verbs::register_mapped`]), which
/// RDMA writes then land in.
#[derive(Debug)]
enum Mem {
    Owned(Vec<u8>),
    Mapped(ArenaSlice),
}

impl Mem {
    /// `len` bytes at `off` (in bounds: checked by the caller).
    fn read(&self, off: usize, len: usize) -> Vec<u8> {
        match self {
            Mem::Owned(v) => v[off..off + len].to_vec(),
            Mem::Mapped(s) => s
                .read_at(off, len)
                .expect("bounds checked against the region"),
        }
    }

    /// Stores `data` at `off` (in bounds: checked by the caller).
    fn write(&mut self, off: usize, data: &[u8]) {
        match self {
            Mem::Owned(v) => v[off..off + data.len()].copy_from_slice(data),
            Mem::Mapped(s) => {
                let n = s.copy_at(off, data);
                debug_assert_eq!(n, data.len(), "bounds checked against the region");
            }
        }
    }
}

#[derive(Debug)]
struct Region {
    mr: Mr,
    mem: Mem,
}

#[derive(Clone, Copy, Debug)]
enum SendOp {
    Send,
    Write(RemoteAddr),
    Bind {
        mw: u32,
        region: u32,
        span: WindowSpan,
        rkey: u32,
    },
    Invalidate {
        rkey: u32,
    },
}

impl SendOp {
    fn opcode(&self) -> Opcode {
        match self {
            SendOp::Send => Opcode::Send,
            SendOp::Write(_) => Opcode::Write,
            SendOp::Bind { .. } => Opcode::Bind,
            SendOp::Invalidate { .. } => Opcode::LocalInvalidate,
        }
    }
}

/// A window bound to a span of a region through a queue pair.
#[derive(Clone, Copy, Debug)]
struct Binding {
    qpn: u32,
    region: u32,
    span: WindowSpan,
    rkey: u32,
}

#[derive(Clone, Copy, Debug)]
struct FakeMw {
    /// The low byte of the rkey the next bind posted gives.
    next_tag: u8,
    bound: Option<Binding>,
}

#[derive(Clone, Copy, Debug)]
struct SendWr {
    wr_id: u64,
    sge: Sge,
    op: SendOp,
}

#[derive(Clone, Copy, Debug)]
struct RecvWr {
    wr_id: u64,
    sge: Sge,
}

#[derive(Debug)]
struct FakeQp {
    state: QpState,
    caps: QpCaps,
    psn: u32,
    remote: Option<Endpoint>,
    sq: VecDeque<SendWr>,
    rq: VecDeque<RecvWr>,
}

#[derive(Clone, Copy, Debug)]
struct Injected {
    qp: Option<QpId>,
    op: Option<Opcode>,
    status: WcStatus,
}

#[derive(Debug)]
struct Host {
    lid: u16,
    gid: [u8; 16],
    alive: bool,
    held: bool,
    regions: Vec<Region>,
    windows: BTreeMap<u32, FakeMw>,
    next_mw: u32,
    qps: BTreeMap<u32, FakeQp>,
    next_qpn: u32,
    cq: VecDeque<WorkCompletion>,
    faults: VecDeque<Injected>,
    corrupt_next_write: bool,
    shift_next_write: Option<i64>,
    /// The last RDMA write this host executed: its queue pair and request.
    last_write: Option<(u32, SendWr)>,
}

/// Counters of what the fabric did, for tests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FabricStats {
    /// Sends delivered.
    pub sends: u64,
    /// RDMA writes landed.
    pub writes: u64,
    /// Window binds executed.
    pub binds: u64,
    /// Local invalidates executed.
    pub invalidates: u64,
    /// Error completions the fabric produced itself (not injected, not
    /// flushed by an injected one's queue pair error), by status.
    pub errors: Vec<(WcStatus, u64)>,
    /// Faults injected and fired.
    pub injected: u64,
}

impl FabricStats {
    /// How many completions had `status`.
    pub fn count(&self, status: WcStatus) -> u64 {
        self.errors
            .iter()
            .find(|(s, _)| *s == status)
            .map_or(0, |(_, n)| *n)
    }

    fn bump(&mut self, status: WcStatus) {
        match self.errors.iter_mut().find(|(s, _)| *s == status) {
            Some((_, n)) => *n += 1,
            None => self.errors.push((status, 1)),
        }
    }
}

#[derive(Debug)]
struct Inner {
    hosts: Vec<Host>,
    rng: u64,
    stats: FabricStats,
}

/// The fabric joining fake hosts. Cloning gives another handle to it.
#[derive(Clone, Debug)]
pub struct Fabric {
    inner: Arc<Mutex<Inner>>,
}

impl Default for Fabric {
    fn default() -> Fabric {
        Fabric::new(0x5eed)
    }
}

impl Fabric {
    /// An empty fabric whose work-request interleaving follows `seed`.
    pub fn new(seed: u64) -> Fabric {
        Fabric {
            inner: Arc::new(Mutex::new(Inner {
                hosts: Vec::new(),
                rng: seed | 1,
                stats: FabricStats::default(),
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves plain data behind: keep
        // using it.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds a host and returns its NIC.
    pub fn add_host(&self) -> FakeNic {
        let mut inner = self.lock();
        let id = inner.hosts.len();
        let mut gid = [0u8; 16];
        gid[..8].copy_from_slice(&0xfe80_0000_0000_0000u64.to_be_bytes());
        gid[8..].copy_from_slice(&(id as u64 + 1).to_be_bytes());
        inner.hosts.push(Host {
            lid: id as u16 + 1,
            gid,
            alive: true,
            held: false,
            regions: Vec::new(),
            windows: BTreeMap::new(),
            next_mw: 0,
            qps: BTreeMap::new(),
            next_qpn: 0x100,
            cq: VecDeque::new(),
            faults: VecDeque::new(),
            corrupt_next_write: false,
            shift_next_write: None,
            last_write: None,
        });
        FakeNic {
            fabric: self.clone(),
            host: id,
        }
    }

    /// The next work request of `host` matching `qp` (any when `None`) and
    /// `op` (any send-queue operation when `None`) completes with
    /// `status` instead of executing, and its queue pair fails.
    pub fn inject(&self, host: HostId, qp: Option<QpId>, op: Option<Opcode>, status: WcStatus) {
        if let Some(h) = self.lock().hosts.get_mut(host) {
            h.faults.push_back(Injected { qp, op, status });
        }
    }

    /// Flips one bit in the bytes of the next RDMA write `host` makes
    /// (whether it then lands or not).
    pub fn corrupt_next_write(&self, host: HostId) {
        if let Some(h) = self.lock().hosts.get_mut(host) {
            h.corrupt_next_write = true;
        }
    }

    /// The next RDMA write `host` makes goes `shift` bytes away from the
    /// address it was posted with (same rkey): a peer writing outside the
    /// span it was given.
    pub fn shift_next_write(&self, host: HostId, shift: i64) {
        if let Some(h) = self.lock().hosts.get_mut(host) {
            h.shift_next_write = Some(shift);
        }
    }

    /// `host` posts the last RDMA write it executed once more, on the same
    /// queue pair, to the same address with the same rkey, with one bit of
    /// its bytes flipped (so that landing would show): a peer writing with
    /// a key after the get that gave it ended. False when there is no such
    /// write or its queue pair is no longer ready to send.
    pub fn replay_last_write(&self, host: HostId) -> bool {
        let mut inner = self.lock();
        let Some(h) = inner.hosts.get_mut(host) else {
            return false;
        };
        let Some((qpn, wr)) = h.last_write else {
            return false;
        };
        let Some(q) = h.qps.get_mut(&qpn).filter(|q| q.state == QpState::Rts) else {
            return false;
        };
        q.sq.push_back(wr);
        h.corrupt_next_write = true;
        true
    }

    /// While held, `host`'s posted work requests wait.
    pub fn hold(&self, host: HostId, held: bool) {
        if let Some(h) = self.lock().hosts.get_mut(host) {
            h.held = held;
        }
    }

    /// `host` is gone: it never executes or answers again; peers sending
    /// to it get retry-exceeded completions.
    pub fn kill(&self, host: HostId) {
        if let Some(h) = self.lock().hosts.get_mut(host) {
            h.alive = false;
        }
    }

    /// The regions `host` registered.
    pub fn regions(&self, host: HostId) -> Vec<Mr> {
        self.lock()
            .hosts
            .get(host)
            .map(|h| h.regions.iter().map(|r| r.mr).collect())
            .unwrap_or_default()
    }

    /// Memory windows `host` holds: allocated, and of those bound.
    pub fn windows(&self, host: HostId) -> (usize, usize) {
        self.lock().hosts.get(host).map_or((0, 0), |h| {
            let bound = h.windows.values().filter(|w| w.bound.is_some()).count();
            (h.windows.len(), bound)
        })
    }

    /// Live queue pairs of `host`.
    pub fn qp_count(&self, host: HostId) -> usize {
        self.lock().hosts.get(host).map_or(0, |h| h.qps.len())
    }

    /// Counters so far.
    pub fn stats(&self) -> FabricStats {
        self.lock().stats.clone()
    }
}

impl Inner {
    fn next_rand(&mut self) -> u64 {
        // xorshift64*
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn complete(&mut self, host: HostId, wc: WorkCompletion) {
        if wc.status != WcStatus::Success {
            self.stats.bump(wc.status);
        }
        self.hosts[host].cq.push_back(wc);
    }

    /// Moves a queue pair to ERROR and flushes its queues.
    fn fail_qp(&mut self, host: HostId, qpn: u32) {
        let Some(qp) = self.hosts[host].qps.get_mut(&qpn) else {
            return;
        };
        qp.state = QpState::Error;
        let sq: Vec<SendWr> = qp.sq.drain(..).collect();
        let rq: Vec<RecvWr> = qp.rq.drain(..).collect();
        for wr in sq {
            let opcode = wr.op.opcode();
            self.complete(host, wc(wr.wr_id, qpn, opcode, WcStatus::Flushed, 0));
        }
        for wr in rq {
            self.complete(host, wc(wr.wr_id, qpn, Opcode::Recv, WcStatus::Flushed, 0));
        }
    }

    /// Runs posted work requests until none can run.
    fn progress(&mut self) {
        loop {
            let ready: Vec<(HostId, u32)> = self
                .hosts
                .iter()
                .enumerate()
                .filter(|(_, h)| h.alive && !h.held)
                .flat_map(|(i, h)| {
                    h.qps
                        .iter()
                        .filter(|(_, q)| q.state == QpState::Rts && !q.sq.is_empty())
                        .map(move |(n, _)| (i, *n))
                })
                .collect();
            if ready.is_empty() {
                return;
            }
            let pick = ready[(self.next_rand() % ready.len() as u64) as usize];
            self.execute_one(pick.0, pick.1);
        }
    }

    fn local_bytes(&self, host: HostId, sge: Sge, need: Access) -> Option<(usize, usize)> {
        let h = &self.hosts[host];
        let (i, r) = h
            .regions
            .iter()
            .enumerate()
            .find(|(_, r)| r.mr.lkey == sge.lkey)?;
        if !r.mr.access.contains(need) {
            return None;
        }
        let start = sge.addr.checked_sub(r.mr.addr)?;
        let end = start.checked_add(u64::from(sge.len))?;
        (end <= r.mr.len).then_some((i, start as usize))
    }

    fn execute_one(&mut self, host: HostId, qpn: u32) {
        let qp = self.hosts[host]
            .qps
            .get_mut(&qpn)
            .expect("picked a live qp");
        let wr = qp.sq.pop_front().expect("picked a non-empty queue");
        let remote = qp.remote;
        let opcode = wr.op.opcode();
        let fail = |inner: &mut Inner, status: WcStatus| {
            inner.complete(host, wc(wr.wr_id, qpn, opcode, status, 0));
            inner.fail_qp(host, qpn);
        };
        // Injected faults first.
        let faults = &mut self.hosts[host].faults;
        if let Some(pos) = faults
            .iter()
            .position(|f| f.qp.is_none_or(|q| q.0 == qpn) && f.op.is_none_or(|o| o == opcode))
        {
            let f = faults.remove(pos).expect("position is in range");
            // Injected: counted apart from the fabric's own errors.
            self.stats.injected += 1;
            self.hosts[host]
                .cq
                .push_back(wc(wr.wr_id, qpn, opcode, f.status, 0));
            return self.fail_qp(host, qpn);
        }
        // Window binds and invalidates are local: no packet leaves.
        match wr.op {
            SendOp::Bind {
                mw,
                region,
                span,
                rkey,
            } => {
                if !self.bind(host, qpn, mw, region, span, rkey) {
                    return fail(self, WcStatus::MwBind);
                }
                self.stats.binds += 1;
                return self.complete(host, wc(wr.wr_id, qpn, Opcode::Bind, WcStatus::Success, 0));
            }
            SendOp::Invalidate { rkey } => {
                let h = &mut self.hosts[host];
                let Some(w) = h
                    .windows
                    .values_mut()
                    .find(|w| w.bound.is_some_and(|b| b.rkey == rkey))
                else {
                    return fail(self, WcStatus::MwBind);
                };
                w.bound = None;
                self.stats.invalidates += 1;
                return self.complete(
                    host,
                    wc(wr.wr_id, qpn, Opcode::LocalInvalidate, WcStatus::Success, 0),
                );
            }
            SendOp::Send | SendOp::Write(_) => {}
        }
        let Some((src_region, src_off)) = self.local_bytes(host, wr.sge, Access::NONE) else {
            return fail(self, WcStatus::LocalProtection);
        };
        let Some(remote) = remote else {
            return fail(self, WcStatus::RetryExceeded);
        };
        let Some(dst) = self.hosts.iter().position(|h| h.gid == remote.gid) else {
            return fail(self, WcStatus::RetryExceeded);
        };
        let dst_alive = self.hosts[dst].alive;
        let connected = self.hosts[dst].qps.get(&remote.qp_num).is_some_and(|q| {
            matches!(q.state, QpState::Rtr | QpState::Rts)
                && q.remote
                    .is_some_and(|e| e.qp_num == qpn && e.gid == self.hosts[host].gid)
        });
        if !dst_alive || !connected {
            return fail(self, WcStatus::RetryExceeded);
        }
        let len = wr.sge.len as usize;
        let mut bytes = self.hosts[host].regions[src_region].mem.read(src_off, len);
        match wr.op {
            SendOp::Write(mut raddr) => {
                // Faults apply to the next write, whether it lands or not.
                if let Some(shift) = self.hosts[host].shift_next_write.take() {
                    raddr.addr = raddr.addr.wrapping_add_signed(shift);
                }
                if std::mem::take(&mut self.hosts[host].corrupt_next_write) && !bytes.is_empty() {
                    let i = (self.next_rand() % bytes.len() as u64) as usize;
                    bytes[i] ^= 1 << (self.next_rand() % 8);
                }
                let Some(t) = self.write_target(dst, remote.qp_num, raddr, len as u64) else {
                    fail(self, WcStatus::RemoteAccess);
                    self.fail_qp(dst, remote.qp_num);
                    return;
                };
                self.hosts[host].last_write = Some((qpn, wr));
                let r = &mut self.hosts[dst].regions[t];
                let off = (raddr.addr - r.mr.addr) as usize;
                r.mem.write(off, &bytes);
                self.stats.writes += 1;
                self.complete(host, wc(wr.wr_id, qpn, Opcode::Write, WcStatus::Success, 0));
            }
            SendOp::Send => {
                let dqp = self.hosts[dst]
                    .qps
                    .get_mut(&remote.qp_num)
                    .expect("checked connected");
                let Some(rwr) = dqp.rq.pop_front() else {
                    return fail(self, WcStatus::RnrRetryExceeded);
                };
                let recv =
                    |status, byte_len| wc(rwr.wr_id, remote.qp_num, Opcode::Recv, status, byte_len);
                // The receive buffer must be writable and hold the message;
                // otherwise the receiver's queue pair fails as well.
                let landing = match self.local_bytes(dst, rwr.sge, Access::LOCAL_WRITE) {
                    None => Err(WcStatus::LocalProtection),
                    Some(_) if (rwr.sge.len as usize) < len => Err(WcStatus::LocalLength),
                    Some(at) => Ok(at),
                };
                let (r, off) = match landing {
                    Ok(at) => at,
                    Err(status) => {
                        self.complete(dst, recv(status, 0));
                        self.fail_qp(dst, remote.qp_num);
                        return fail(self, WcStatus::RemoteInvalidRequest);
                    }
                };
                self.hosts[dst].regions[r].mem.write(off, &bytes);
                self.stats.sends += 1;
                self.complete(dst, recv(WcStatus::Success, len as u32));
                self.complete(host, wc(wr.wr_id, qpn, Opcode::Send, WcStatus::Success, 0));
            }
            SendOp::Bind { .. } | SendOp::Invalidate { .. } => unreachable!("handled above"),
        }
    }

    /// Executes a bind of window `mw` of `host` through queue pair `qpn`:
    /// false (a bind error) unless the window is unbound and the region
    /// allows binds over a non-empty span inside it.
    fn bind(
        &mut self,
        host: HostId,
        qpn: u32,
        mw: u32,
        region: u32,
        span: WindowSpan,
        rkey: u32,
    ) -> bool {
        let h = &mut self.hosts[host];
        let Some(r) = h.regions.iter().find(|r| r.mr.id == region) else {
            return false;
        };
        let mr = r.mr;
        let inside = span.addr >= mr.addr
            && span
                .addr
                .checked_add(span.len)
                .is_some_and(|end| end <= mr.addr + mr.len);
        let rights = mr.access.contains(Access::MW_BIND)
            && (!span.access.contains(Access::REMOTE_WRITE)
                || mr.access.contains(Access::LOCAL_WRITE));
        let Some(w) = h.windows.get_mut(&mw) else {
            return false;
        };
        if w.bound.is_some() || span.len == 0 || !inside || !rights {
            return false;
        }
        w.bound = Some(Binding {
            qpn,
            region,
            span,
            rkey,
        });
        true
    }

    /// Where an RDMA write of `len` bytes to `raddr`, arriving on `dst`'s
    /// queue pair `qpn`, lands: the region, if the key is a region's with
    /// remote write and the write lies inside it, or a window bound through
    /// `qpn` with remote write whose span holds the whole write.
    fn write_target(&self, dst: HostId, qpn: u32, raddr: RemoteAddr, len: u64) -> Option<usize> {
        let d = &self.hosts[dst];
        let inside = |addr: u64, size: u64| {
            raddr.addr >= addr
                && raddr
                    .addr
                    .checked_add(len)
                    .is_some_and(|end| end <= addr + size)
        };
        if let Some(i) = d.regions.iter().position(|r| {
            r.mr.rkey == raddr.rkey
                && r.mr.access.contains(Access::REMOTE_WRITE)
                && inside(r.mr.addr, r.mr.len)
        }) {
            return Some(i);
        }
        let b = d
            .windows
            .values()
            .filter_map(|w| w.bound)
            .find(|b| b.rkey == raddr.rkey)?;
        if b.qpn != qpn
            || !b.span.access.contains(Access::REMOTE_WRITE)
            || !inside(b.span.addr, b.span.len)
        {
            return None;
        }
        d.regions.iter().position(|r| r.mr.id == b.region)
    }
}

fn wc(wr_id: u64, qpn: u32, opcode: Opcode, status: WcStatus, byte_len: u32) -> WorkCompletion {
    WorkCompletion {
        wr_id,
        qp: QpId(qpn),
        opcode,
        status,
        byte_len,
    }
}

/// One host's NIC on a [`Fabric`].
#[derive(Clone, Debug)]
pub struct FakeNic {
    fabric: Fabric,
    host: HostId,
}

impl FakeNic {
    /// This host's index on the fabric.
    pub fn host(&self) -> HostId {
        self.host
    }

    /// The fabric.
    pub fn fabric(&self) -> &Fabric {
        &self.fabric
    }

    fn with_host<T>(
        &self,
        f: impl FnOnce(&mut Host) -> Result<T, VerbsError>,
    ) -> Result<T, VerbsError> {
        let mut inner = self.fabric.lock();
        let h = &mut inner.hosts[self.host];
        if !h.alive {
            return Err(VerbsError::NoDevice("host killed".into()));
        }
        f(h)
    }

    fn region(h: &Host, mr: &Mr, addr: u64, len: usize) -> Result<(usize, usize), VerbsError> {
        let i = h
            .regions
            .iter()
            .position(|r| r.mr.id == mr.id)
            .ok_or(VerbsError::UnknownMr(mr.id))?;
        let r = &h.regions[i].mr;
        let start = addr.checked_sub(r.addr).ok_or(VerbsError::OutOfBounds)?;
        let end = start
            .checked_add(len as u64)
            .ok_or(VerbsError::OutOfBounds)?;
        if end > r.len {
            return Err(VerbsError::OutOfBounds);
        }
        Ok((i, start as usize))
    }

    /// Adds a region at the next free (fake) address, a page past the
    /// last one.
    fn add_region(h: &mut Host, len: u64, access: Access, mem: Mem) -> Mr {
        let id = h.regions.len() as u32;
        let addr = h.regions.last().map_or(0x10_0000, |r| {
            (r.mr.addr + r.mr.len).div_ceil(PAGE) * PAGE + PAGE
        });
        let mr = Mr {
            id,
            addr,
            len,
            lkey: 0x1000 + id,
            rkey: 0x7a00_0000 | (id << 8) | (h.lid as u32 & 0xff),
            access,
        };
        h.regions.push(Region { mr, mem });
        mr
    }

    /// Posts `op` on `qp`'s send queue; window binds and invalidates carry
    /// no data (an empty scatter entry).
    fn post_sq(
        &mut self,
        qp: QpId,
        wr_id: u64,
        sge: Option<Sge>,
        op: SendOp,
    ) -> Result<(), VerbsError> {
        let opcode = op.opcode();
        let sge = sge.unwrap_or(Sge {
            addr: 0,
            len: 0,
            lkey: 0,
        });
        let wr = SendWr { wr_id, sge, op };
        self.post_to(qp, wr_id, opcode, |q| {
            (q.state == QpState::Rts).then_some((&mut q.sq, q.caps.max_send_wr, wr))
        })
    }

    /// Posts a work request to one of `qp`'s queues. `queue` gives the
    /// queue, its limit and the request when the queue pair's state takes
    /// posts on it; a queue pair in the error state flushes the request at
    /// once (a `Flushed` completion with `wr_id` and `opcode`).
    fn post_to<W>(
        &mut self,
        qp: QpId,
        wr_id: u64,
        opcode: Opcode,
        queue: impl FnOnce(&mut FakeQp) -> Option<(&mut VecDeque<W>, u32, W)>,
    ) -> Result<(), VerbsError> {
        let mut inner = self.fabric.lock();
        let host = self.host;
        let h = &mut inner.hosts[host];
        if !h.alive {
            return Err(VerbsError::NoDevice("host killed".into()));
        }
        let q = h.qps.get_mut(&qp.0).ok_or(VerbsError::UnknownQp(qp))?;
        let state = q.state;
        if let Some((queue, cap, wr)) = queue(q) {
            if queue.len() >= cap as usize {
                return Err(VerbsError::QueueFull(qp));
            }
            queue.push_back(wr);
            return Ok(());
        }
        if state != QpState::Error {
            return Err(VerbsError::BadState { qp, state });
        }
        inner.complete(host, wc(wr_id, qp.0, opcode, WcStatus::Flushed, 0));
        Ok(())
    }
}

impl Verbs for FakeNic {
    fn register(&mut self, len: u64, access: Access) -> Result<Mr, VerbsError> {
        if len == 0 || len > 1 << 40 {
            return Err(VerbsError::Invalid("region length"));
        }
        let size = usize::try_from(len).map_err(|_| VerbsError::Invalid("region length"))?;
        self.with_host(|h| {
            Ok(FakeNic::add_region(
                h,
                len,
                access,
                Mem::Owned(vec![0; size]),
            ))
        })
    }

    fn register_mapped(&mut self, mem: ArenaSlice, access: Access) -> Result<Mr, VerbsError> {
        if mem.is_empty() {
            return Err(VerbsError::Invalid("region length"));
        }
        let len = mem.len() as u64;
        self.with_host(|h| Ok(FakeNic::add_region(h, len, access, Mem::Mapped(mem))))
    }

    fn write_local(&mut self, mr: &Mr, addr: u64, data: &[u8]) -> Result<(), VerbsError> {
        self.with_host(|h| {
            let (i, off) = FakeNic::region(h, mr, addr, data.len())?;
            h.regions[i].mem.write(off, data);
            Ok(())
        })
    }

    fn read_local(&self, mr: &Mr, addr: u64, out: &mut [u8]) -> Result<(), VerbsError> {
        self.with_host(|h| {
            let (i, off) = FakeNic::region(h, mr, addr, out.len())?;
            out.copy_from_slice(&h.regions[i].mem.read(off, out.len()));
            Ok(())
        })
    }

    fn create_qp(&mut self, caps: QpCaps) -> Result<QpId, VerbsError> {
        if caps.max_send_wr == 0 || caps.max_recv_wr == 0 {
            return Err(VerbsError::Invalid("queue depth 0"));
        }
        self.with_host(|h| {
            let qpn = h.next_qpn;
            h.next_qpn += 1;
            h.qps.insert(
                qpn,
                FakeQp {
                    state: QpState::Reset,
                    caps,
                    psn: (qpn * 7919) & 0xff_ffff,
                    remote: None,
                    sq: VecDeque::new(),
                    rq: VecDeque::new(),
                },
            );
            Ok(QpId(qpn))
        })
    }

    fn endpoint(&self, qp: QpId) -> Result<Endpoint, VerbsError> {
        self.with_host(|h| {
            let q = h.qps.get(&qp.0).ok_or(VerbsError::UnknownQp(qp))?;
            Ok(Endpoint {
                qp_num: qp.0,
                lid: h.lid,
                gid: h.gid,
                psn: q.psn,
            })
        })
    }

    fn modify_qp(&mut self, qp: QpId, to: Transition) -> Result<(), VerbsError> {
        self.with_host(|h| {
            let q = h.qps.get_mut(&qp.0).ok_or(VerbsError::UnknownQp(qp))?;
            let bad = VerbsError::BadState { qp, state: q.state };
            match (q.state, to) {
                (QpState::Reset, Transition::Init) => q.state = QpState::Init,
                (QpState::Init, Transition::Rtr { remote, .. }) => {
                    q.remote = Some(remote);
                    q.state = QpState::Rtr;
                }
                (QpState::Rtr, Transition::Rts { .. }) => q.state = QpState::Rts,
                _ => return Err(bad),
            }
            Ok(())
        })
    }

    fn qp_state(&self, qp: QpId) -> Result<QpState, VerbsError> {
        self.with_host(|h| {
            h.qps
                .get(&qp.0)
                .map(|q| q.state)
                .ok_or(VerbsError::UnknownQp(qp))
        })
    }

    fn destroy_qp(&mut self, qp: QpId) -> Result<(), VerbsError> {
        self.with_host(|h| {
            h.qps.remove(&qp.0).ok_or(VerbsError::UnknownQp(qp))?;
            // Completions already queued for it are dropped, as a real
            // destroy leaves nothing to poll.
            h.cq.retain(|c| c.qp != qp);
            Ok(())
        })
    }

    fn post_send(&mut self, qp: QpId, wr_id: u64, local: Sge) -> Result<(), VerbsError> {
        self.post_sq(qp, wr_id, Some(local), SendOp::Send)
    }

    fn post_write(
        &mut self,
        qp: QpId,
        wr_id: u64,
        local: Sge,
        remote: RemoteAddr,
    ) -> Result<(), VerbsError> {
        self.post_sq(qp, wr_id, Some(local), SendOp::Write(remote))
    }

    fn post_recv(&mut self, qp: QpId, wr_id: u64, local: Sge) -> Result<(), VerbsError> {
        self.post_to(qp, wr_id, Opcode::Recv, |q| {
            matches!(q.state, QpState::Init | QpState::Rtr | QpState::Rts).then_some((
                &mut q.rq,
                q.caps.max_recv_wr,
                RecvWr { wr_id, sge: local },
            ))
        })
    }

    fn alloc_mw(&mut self) -> Result<MwId, VerbsError> {
        self.with_host(|h| {
            if h.windows.len() >= MAX_MW {
                return Err(VerbsError::Invalid("too many memory windows"));
            }
            // Ids wrap within the key's 16 bits, skipping those in use.
            let id = (0..MAX_MW as u32)
                .map(|i| (h.next_mw + i) % MAX_MW as u32)
                .find(|i| !h.windows.contains_key(i))
                .expect("fewer than MAX_MW windows");
            h.next_mw = (id + 1) % MAX_MW as u32;
            h.windows.insert(
                id,
                FakeMw {
                    next_tag: 0,
                    bound: None,
                },
            );
            Ok(MwId(id))
        })
    }

    fn dealloc_mw(&mut self, mw: MwId) -> Result<(), VerbsError> {
        self.with_host(|h| {
            h.windows
                .remove(&mw.0)
                .map(|_| ())
                .ok_or(VerbsError::UnknownMw(mw))
        })
    }

    fn post_bind(
        &mut self,
        qp: QpId,
        wr_id: u64,
        mw: MwId,
        mr: &Mr,
        span: WindowSpan,
    ) -> Result<u32, VerbsError> {
        let rkey = self.with_host(|h| {
            if !h.regions.iter().any(|r| r.mr.id == mr.id) {
                return Err(VerbsError::UnknownMr(mr.id));
            }
            let w = h.windows.get_mut(&mw.0).ok_or(VerbsError::UnknownMw(mw))?;
            w.next_tag = w.next_tag.wrapping_add(1);
            Ok(MW_KEY | (mw.0 << 8) | u32::from(w.next_tag))
        })?;
        let bind = SendOp::Bind {
            mw: mw.0,
            region: mr.id,
            span,
            rkey,
        };
        self.post_sq(qp, wr_id, None, bind)?;
        Ok(rkey)
    }

    fn post_invalidate(&mut self, qp: QpId, wr_id: u64, rkey: u32) -> Result<(), VerbsError> {
        self.post_sq(qp, wr_id, None, SendOp::Invalidate { rkey })
    }

    fn poll_cq(&mut self, max: usize, out: &mut Vec<WorkCompletion>) -> Result<usize, VerbsError> {
        let mut inner = self.fabric.lock();
        if !inner.hosts[self.host].alive {
            return Err(VerbsError::NoDevice("host killed".into()));
        }
        inner.progress();
        let cq = &mut inner.hosts[self.host].cq;
        let n = max.min(cq.len());
        out.extend(cq.drain(..n));
        Ok(n)
    }
}

//! The fake NIC's checks and error completions, at the verbs level.

use granary_rdma::fake::{Fabric, FakeNic};
use granary_rdma::verbs::{
    Access, Mr, Mtu, MwId, Opcode, QpCaps, QpId, QpState, QpTiming, RemoteAddr, Sge, Transition,
    Verbs, VerbsError, WcStatus, WindowSpan, WorkCompletion,
};

const TIMING: QpTiming = QpTiming {
    mtu: Mtu::M4096,
    timeout: 14,
    retry_cnt: 7,
    rnr_retry: 6,
    min_rnr_timer: 12,
};
const CAPS: QpCaps = QpCaps {
    max_send_wr: 16,
    max_recv_wr: 16,
};

struct Pair {
    fabric: Fabric,
    a: FakeNic,
    b: FakeNic,
    qa: QpId,
    qb: QpId,
}

/// Connects a new queue pair of `a` to a new one of `b`, both in RTS.
fn connect(a: &mut FakeNic, b: &mut FakeNic) -> (QpId, QpId) {
    let qa = a.create_qp(CAPS).unwrap();
    let qb = b.create_qp(CAPS).unwrap();
    let (ea, eb) = (a.endpoint(qa).unwrap(), b.endpoint(qb).unwrap());
    for (nic, qp, remote) in [(&mut *a, qa, eb), (&mut *b, qb, ea)] {
        assert_eq!(nic.qp_state(qp).unwrap(), QpState::Reset);
        nic.modify_qp(qp, Transition::Init).unwrap();
        nic.modify_qp(
            qp,
            Transition::Rtr {
                remote,
                timing: TIMING,
            },
        )
        .unwrap();
        nic.modify_qp(qp, Transition::Rts { timing: TIMING })
            .unwrap();
        assert_eq!(nic.qp_state(qp).unwrap(), QpState::Rts);
    }
    (qa, qb)
}

fn pair() -> Pair {
    let fabric = Fabric::new(42);
    let mut a = fabric.add_host();
    let mut b = fabric.add_host();
    let (qa, qb) = connect(&mut a, &mut b);
    Pair {
        fabric,
        a,
        b,
        qa,
        qb,
    }
}

impl Pair {
    /// A 4 KiB region each end registers for local writes: (a's, b's).
    fn local_regions(&mut self) -> (Mr, Mr) {
        let a = self.a.register(4096, Access::LOCAL_WRITE).unwrap();
        (a, self.b.register(4096, Access::LOCAL_WRITE).unwrap())
    }
}

fn sge(mr: &Mr, off: u64, len: u32) -> Sge {
    Sge {
        addr: mr.addr + off,
        len,
        lkey: mr.lkey,
    }
}

fn poll(nic: &mut FakeNic) -> Vec<WorkCompletion> {
    let mut out = Vec::new();
    nic.poll_cq(1000, &mut out).unwrap();
    out
}

#[test]
fn write_then_send_lands_in_order() {
    let mut p = pair();
    let src = p.a.register(4096, Access::LOCAL_WRITE).unwrap();
    let dst =
        p.b.register(4096, Access::LOCAL_WRITE.union(Access::REMOTE_WRITE))
            .unwrap();
    p.a.write_local(&src, src.addr, b"payload!header").unwrap();
    p.b.post_recv(p.qb, 7, sge(&dst, 1024, 64)).unwrap();
    let remote = RemoteAddr {
        addr: dst.addr + 100,
        rkey: dst.rkey,
    };
    p.a.post_write(p.qa, 1, sge(&src, 0, 8), remote).unwrap();
    p.a.post_send(p.qa, 2, sge(&src, 8, 6)).unwrap();
    let wa = poll(&mut p.a);
    assert_eq!(
        wa.iter()
            .map(|w| (w.wr_id, w.opcode, w.status))
            .collect::<Vec<_>>(),
        vec![
            (1, Opcode::Write, WcStatus::Success),
            (2, Opcode::Send, WcStatus::Success)
        ]
    );
    let wb = poll(&mut p.b);
    assert_eq!(wb.len(), 1);
    assert_eq!((wb[0].wr_id, wb[0].byte_len), (7, 6));
    let mut got = [0u8; 8];
    p.b.read_local(&dst, dst.addr + 100, &mut got).unwrap();
    assert_eq!(&got, b"payload!");
    let mut hdr = [0u8; 6];
    p.b.read_local(&dst, dst.addr + 1024, &mut hdr).unwrap();
    assert_eq!(&hdr, b"header");
}

#[test]
fn region_without_remote_write_rejects_writes_and_breaks_both_ends() {
    let mut p = pair();
    let (src, dst) = p.local_regions();
    p.b.post_recv(p.qb, 9, sge(&dst, 0, 64)).unwrap();
    let remote = RemoteAddr {
        addr: dst.addr,
        rkey: dst.rkey,
    };
    p.a.post_write(p.qa, 1, sge(&src, 0, 8), remote).unwrap();
    p.a.post_send(p.qa, 2, sge(&src, 0, 8)).unwrap();
    let wa = poll(&mut p.a);
    assert_eq!(wa[0].status, WcStatus::RemoteAccess);
    assert_eq!(wa[1].status, WcStatus::Flushed, "later work is flushed");
    assert_eq!(p.a.qp_state(p.qa).unwrap(), QpState::Error);
    assert_eq!(p.b.qp_state(p.qb).unwrap(), QpState::Error);
    let wb = poll(&mut p.b);
    assert_eq!(wb[0].status, WcStatus::Flushed, "the receive is flushed");
}

#[test]
fn bad_rkey_and_out_of_bounds_are_remote_access_errors() {
    for (delta_addr, delta_key) in [(0u64, 1u32), (4090, 0)] {
        let mut p = pair();
        let src = p.a.register(4096, Access::LOCAL_WRITE).unwrap();
        let dst =
            p.b.register(4096, Access::LOCAL_WRITE.union(Access::REMOTE_WRITE))
                .unwrap();
        let remote = RemoteAddr {
            addr: dst.addr + delta_addr,
            rkey: dst.rkey + delta_key,
        };
        p.a.post_write(p.qa, 1, sge(&src, 0, 8), remote).unwrap();
        assert_eq!(poll(&mut p.a)[0].status, WcStatus::RemoteAccess);
    }
}

#[test]
fn bad_lkey_is_a_local_protection_error() {
    let mut p = pair();
    let src = p.a.register(4096, Access::LOCAL_WRITE).unwrap();
    let mut s = sge(&src, 0, 8);
    s.lkey += 99;
    p.a.post_send(p.qa, 1, s).unwrap();
    assert_eq!(poll(&mut p.a)[0].status, WcStatus::LocalProtection);
    let s = sge(&src, 4095, 8);
    let mut p = pair();
    let src2 = p.a.register(4096, Access::LOCAL_WRITE).unwrap();
    assert_eq!(src2.lkey, src.lkey);
    p.a.post_send(p.qa, 1, s).unwrap();
    assert_eq!(poll(&mut p.a)[0].status, WcStatus::LocalProtection);
}

#[test]
fn send_without_receive_is_receiver_not_ready() {
    let mut p = pair();
    let src = p.a.register(4096, Access::LOCAL_WRITE).unwrap();
    p.a.post_send(p.qa, 1, sge(&src, 0, 8)).unwrap();
    assert_eq!(poll(&mut p.a)[0].status, WcStatus::RnrRetryExceeded);
    assert_eq!(p.fabric.stats().count(WcStatus::RnrRetryExceeded), 1);
}

#[test]
fn short_receive_is_a_length_error() {
    let mut p = pair();
    let (src, dst) = p.local_regions();
    p.b.post_recv(p.qb, 3, sge(&dst, 0, 4)).unwrap();
    p.a.post_send(p.qa, 1, sge(&src, 0, 8)).unwrap();
    assert_eq!(poll(&mut p.a)[0].status, WcStatus::RemoteInvalidRequest);
    assert_eq!(poll(&mut p.b)[0].status, WcStatus::LocalLength);
}

#[test]
fn dead_peer_is_retry_exceeded() {
    let mut p = pair();
    let src = p.a.register(4096, Access::LOCAL_WRITE).unwrap();
    p.fabric.kill(p.b.host());
    p.a.post_send(p.qa, 1, sge(&src, 0, 8)).unwrap();
    assert_eq!(poll(&mut p.a)[0].status, WcStatus::RetryExceeded);
    assert!(matches!(
        p.b.poll_cq(1, &mut Vec::new()),
        Err(VerbsError::NoDevice(_))
    ));
}

#[test]
fn injected_errors_fire_once_on_the_matching_request() {
    for status in [
        WcStatus::RetryExceeded,
        WcStatus::RnrRetryExceeded,
        WcStatus::RemoteAccess,
        WcStatus::Flushed,
    ] {
        let mut p = pair();
        let (src, dst) = p.local_regions();
        for i in 0..3 {
            p.b.post_recv(p.qb, i, sge(&dst, 64 * i, 64)).unwrap();
        }
        p.fabric
            .inject(p.a.host(), Some(p.qa), Some(Opcode::Send), status);
        p.a.post_send(p.qa, 1, sge(&src, 0, 8)).unwrap();
        p.a.post_send(p.qa, 2, sge(&src, 0, 8)).unwrap();
        let wa = poll(&mut p.a);
        assert_eq!(wa[0].status, status);
        assert_eq!(wa[1].status, WcStatus::Flushed);
        assert_eq!(p.fabric.stats().injected, 1);
        // Posting to the failed queue pair completes flushed at once.
        p.a.post_send(p.qa, 3, sge(&src, 0, 8)).unwrap();
        assert_eq!(poll(&mut p.a)[0].status, WcStatus::Flushed);
    }
}

#[test]
fn state_machine_and_queue_limits() {
    let fabric = Fabric::new(1);
    let mut a = fabric.add_host();
    let src = a.register(4096, Access::LOCAL_WRITE).unwrap();
    let qp = a.create_qp(CAPS).unwrap();
    assert!(matches!(
        a.post_send(qp, 1, sge(&src, 0, 8)),
        Err(VerbsError::BadState { .. })
    ));
    assert!(matches!(
        a.modify_qp(qp, Transition::Rts { timing: TIMING }),
        Err(VerbsError::BadState { .. })
    ));
    a.modify_qp(qp, Transition::Init).unwrap();
    for i in 0..16 {
        a.post_recv(qp, i, sge(&src, 0, 8)).unwrap();
    }
    assert_eq!(
        a.post_recv(qp, 99, sge(&src, 0, 8)),
        Err(VerbsError::QueueFull(qp))
    );
    assert_eq!(
        a.write_local(&src, src.addr + 4090, &[0; 8]),
        Err(VerbsError::OutOfBounds)
    );
    a.destroy_qp(qp).unwrap();
    assert_eq!(a.qp_state(qp), Err(VerbsError::UnknownQp(qp)));
}

#[test]
fn queue_pairs_interleave_but_each_keeps_its_order() {
    let fabric = Fabric::new(7);
    let mut a = fabric.add_host();
    let mut peers: Vec<FakeNic> = (0..3).map(|_| fabric.add_host()).collect();
    let src = a.register(4096, Access::LOCAL_WRITE).unwrap();
    let mut qps = Vec::new();
    for b in peers.iter_mut() {
        let (qa, qb) = connect(&mut a, b);
        let dst = b.register(4096, Access::LOCAL_WRITE).unwrap();
        for i in 0..10 {
            b.post_recv(qb, i, sge(&dst, 0, 64)).unwrap();
        }
        qps.push(qa);
    }
    for i in 0..10u64 {
        for (k, qa) in qps.iter().enumerate() {
            a.post_send(*qa, (k as u64) << 8 | i, sge(&src, 0, 8))
                .unwrap();
        }
    }
    let wa = poll(&mut a);
    assert_eq!(wa.len(), 30);
    assert!(wa.iter().all(|w| w.status == WcStatus::Success));
    for qa in &qps {
        let ids: Vec<u64> = wa
            .iter()
            .filter(|w| w.qp == *qa)
            .map(|w| w.wr_id & 0xff)
            .collect();
        assert_eq!(
            ids,
            (0..10).collect::<Vec<_>>(),
            "post order within a queue pair"
        );
    }
    let issue_order: Vec<u64> = (0..10u64)
        .flat_map(|i| (0..3u64).map(move |k| k << 8 | i))
        .collect();
    let got: Vec<u64> = wa.iter().map(|w| w.wr_id).collect();
    assert_ne!(got, issue_order, "queue pairs interleave");
}

/// Memory the caller mapped, registered in place: RDMA writes land in it
/// (the caller reads them with its own loads), sends read from it, and
/// the same key, bounds and rights checks apply as to the fake's own
/// regions.
#[test]
fn mapped_memory_is_written_in_place_with_the_same_checks() {
    use granary_shm::arena::Arena;
    let mut p = pair();
    let arena_a = Arena::heap(1 << 16).unwrap();
    let arena_b = Arena::heap(1 << 16).unwrap();
    arena_a.write_at(4096 + 10, b"from a's arena").unwrap();
    let src =
        p.a.register_mapped(arena_a.slice(4096, 8192).unwrap(), Access::LOCAL_WRITE)
            .unwrap();
    let rw = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);
    // b registers the upper half of its arena only.
    let dst =
        p.b.register_mapped(arena_b.slice(32768, 32768).unwrap(), rw)
            .unwrap();
    assert_eq!(dst.len, 32768);
    let remote = RemoteAddr {
        addr: dst.addr + 500,
        rkey: dst.rkey,
    };
    p.a.post_write(p.qa, 1, sge(&src, 10, 14), remote).unwrap();
    assert_eq!(poll(&mut p.a)[0].status, WcStatus::Success);
    assert_eq!(
        arena_b.read_at(32768 + 500, 14).unwrap(),
        b"from a's arena",
        "the write landed in b's own mapping"
    );
    assert!(arena_b.read_at(0, 32768).unwrap().iter().all(|&b| b == 0));
    let mut via_nic = [0u8; 14];
    p.b.read_local(&dst, dst.addr + 500, &mut via_nic).unwrap();
    assert_eq!(&via_nic, b"from a's arena");
    p.b.write_local(&dst, dst.addr, b"local").unwrap();
    assert_eq!(arena_b.read_at(32768, 5).unwrap(), b"local");
    assert_eq!(
        p.b.write_local(&dst, dst.addr + 32766, b"abc"),
        Err(VerbsError::OutOfBounds)
    );
    // Past the registered half: a remote access error, nothing written.
    let remote = RemoteAddr {
        addr: dst.addr + 32760,
        rkey: dst.rkey,
    };
    p.a.post_write(p.qa, 2, sge(&src, 10, 14), remote).unwrap();
    assert_eq!(poll(&mut p.a)[0].status, WcStatus::RemoteAccess);
    assert_eq!(p.b.qp_state(p.qb).unwrap(), QpState::Error);
    assert!(arena_b.read_at(32760, 8).unwrap().iter().all(|&b| b == 0));
    // Without remote write, a mapped region is no target either.
    let mut p = pair();
    let ro =
        p.b.register_mapped(arena_b.slice(0, 4096).unwrap(), Access::LOCAL_WRITE)
            .unwrap();
    let src =
        p.a.register_mapped(arena_a.slice(4096, 4096).unwrap(), Access::NONE)
            .unwrap();
    let remote = RemoteAddr {
        addr: ro.addr,
        rkey: ro.rkey,
    };
    p.a.post_write(p.qa, 3, sge(&src, 10, 4), remote).unwrap();
    assert_eq!(poll(&mut p.a)[0].status, WcStatus::RemoteAccess);
    assert!(arena_b.read_at(0, 4).unwrap().iter().all(|&b| b == 0));
    let empty =
        p.a.register_mapped(arena_a.slice(0, 0).unwrap(), Access::NONE);
    assert!(matches!(empty, Err(VerbsError::Invalid(_))));
}

/// b's arena (local write + window binds, filled with 0x11) with a window
/// bound through b's queue pair to 100 bytes at offset 1000, and a's
/// source of 0xee bytes.
struct Bound {
    p: Pair,
    src: Mr,
    arena: Mr,
    mw: MwId,
    rkey: u32,
}

const CANARY: u8 = 0x11;
const AT: u64 = 1000;
const LEN: u64 = 100;

fn bound() -> Bound {
    let mut p = pair();
    let src = p.a.register(4096, Access::LOCAL_WRITE).unwrap();
    p.a.write_local(&src, src.addr, &[0xee; 4096]).unwrap();
    let arena =
        p.b.register(8192, Access::LOCAL_WRITE.union(Access::MW_BIND))
            .unwrap();
    p.b.write_local(&arena, arena.addr, &[CANARY; 8192])
        .unwrap();
    let mw = p.b.alloc_mw().unwrap();
    let span = WindowSpan {
        addr: arena.addr + AT,
        len: LEN,
        access: Access::REMOTE_WRITE,
    };
    let rkey = p.b.post_bind(p.qb, 50, mw, &arena, span).unwrap();
    assert_ne!(rkey, arena.rkey, "a window has a key of its own");
    let wb = poll(&mut p.b);
    assert_eq!(
        wb.iter()
            .map(|w| (w.wr_id, w.opcode, w.status))
            .collect::<Vec<_>>(),
        vec![(50, Opcode::Bind, WcStatus::Success)]
    );
    assert_eq!(p.fabric.windows(p.b.host()), (1, 1));
    Bound {
        p,
        src,
        arena,
        mw,
        rkey,
    }
}

impl Bound {
    /// a writes `len` bytes of 0xee at `off` of b's arena with `rkey`.
    fn write(&mut self, off: i64, len: u32, rkey: u32) -> WcStatus {
        let remote = RemoteAddr {
            addr: (self.arena.addr + AT).wrapping_add_signed(off - AT as i64),
            rkey,
        };
        self.p
            .a
            .post_write(self.p.qa, 1, sge(&self.src, 0, len), remote)
            .unwrap();
        let wa = poll(&mut self.p.a);
        assert_eq!(wa.len(), 1);
        wa[0].status
    }

    /// b's arena bytes.
    fn arena(&self) -> Vec<u8> {
        let mut out = vec![0u8; 8192];
        self.p
            .b
            .read_local(&self.arena, self.arena.addr, &mut out)
            .unwrap();
        out
    }
}

/// A window admits a write that lies wholly inside its span, through the
/// queue pair it was bound through.
#[test]
fn a_bound_window_admits_writes_inside_its_span() {
    let mut b = bound();
    let rkey = b.rkey;
    assert_eq!(b.write(AT as i64, LEN as u32, rkey), WcStatus::Success);
    assert_eq!(b.write(AT as i64 + 60, 40, rkey), WcStatus::Success);
    let mem = b.arena();
    assert!(mem[AT as usize..(AT + LEN) as usize]
        .iter()
        .all(|&x| x == 0xee));
    assert_eq!(mem[AT as usize - 1], CANARY, "the byte before untouched");
    assert_eq!(mem[(AT + LEN) as usize], CANARY, "the byte after untouched");
    assert_eq!(b.p.fabric.stats().writes, 2);
}

/// Every write that reaches outside the window, or names the region's own
/// key, is a remote access error that writes nothing at all (not even its
/// part inside the span) and breaks both queue pairs.
#[test]
fn writes_outside_the_window_are_remote_access_errors_and_write_nothing() {
    // (offset, length, use the region's own key)
    let cases: [(i64, u32, bool); 6] = [
        (AT as i64 - 1, LEN as u32, false),
        (AT as i64 + 1, LEN as u32, false),
        (AT as i64, LEN as u32 + 1, false),
        (AT as i64 + 4000, 8, false),
        (-((1 << 20) as i64), 8, false),
        (AT as i64, LEN as u32, true),
    ];
    for (i, (off, len, region_key)) in cases.into_iter().enumerate() {
        let mut b = bound();
        let rkey = if region_key { b.arena.rkey } else { b.rkey };
        assert_eq!(b.write(off, len, rkey), WcStatus::RemoteAccess, "case {i}");
        assert!(
            b.arena().iter().all(|&x| x == CANARY),
            "case {i}: nothing written"
        );
        assert_eq!(b.p.fabric.stats().writes, 0, "case {i}");
        assert_eq!(b.p.b.qp_state(b.p.qb).unwrap(), QpState::Error, "case {i}");
    }
}

/// Once invalidated, deallocated or bound anew, a window's old key names
/// nothing: a write with it fails and writes nothing.
#[test]
fn a_key_dies_with_its_binding() {
    for how in ["invalidate", "dealloc", "rebind"] {
        let mut b = bound();
        let (old, mw) = (b.rkey, b.mw);
        assert_eq!(b.write(AT as i64, 10, old), WcStatus::Success, "{how}");
        match how {
            "invalidate" => {
                b.p.b.post_invalidate(b.p.qb, 60, old).unwrap();
                let wb = poll(&mut b.p.b);
                assert_eq!(
                    (wb[0].opcode, wb[0].status),
                    (Opcode::LocalInvalidate, WcStatus::Success)
                );
                assert_eq!(b.p.fabric.windows(b.p.b.host()), (1, 0));
            }
            "dealloc" => {
                b.p.b.dealloc_mw(mw).unwrap();
                assert_eq!(b.p.fabric.windows(b.p.b.host()), (0, 0));
                assert_eq!(b.p.b.dealloc_mw(mw), Err(VerbsError::UnknownMw(mw)));
            }
            _ => {
                b.p.b.post_invalidate(b.p.qb, 60, old).unwrap();
                let span = WindowSpan {
                    addr: b.arena.addr + AT,
                    len: LEN,
                    access: Access::REMOTE_WRITE,
                };
                let new = b.p.b.post_bind(b.p.qb, 61, mw, &b.arena, span).unwrap();
                assert_ne!(new, old, "a new key for each bind");
                assert!(poll(&mut b.p.b)
                    .iter()
                    .all(|w| w.status == WcStatus::Success));
            }
        }
        b.p.a.write_local(&b.src, b.src.addr, &[0x77; 10]).unwrap();
        assert_eq!(b.write(AT as i64, 10, old), WcStatus::RemoteAccess, "{how}");
        let mem = b.arena();
        assert!(
            mem[AT as usize..AT as usize + 10]
                .iter()
                .all(|&x| x == 0xee),
            "{how}: the bytes written before the key died stay"
        );
    }
}

/// A window bound through one queue pair is no key for a peer on another.
#[test]
fn a_window_serves_only_the_queue_pair_it_was_bound_through() {
    let mut b = bound();
    let mut c = b.p.fabric.add_host();
    let (qc, _) = connect(&mut c, &mut b.p.b);
    let src = c.register(4096, Access::LOCAL_WRITE).unwrap();
    let remote = RemoteAddr {
        addr: b.arena.addr + AT,
        rkey: b.rkey,
    };
    c.post_write(qc, 1, sge(&src, 0, 10), remote).unwrap();
    assert_eq!(poll(&mut c)[0].status, WcStatus::RemoteAccess);
    assert!(b.arena().iter().all(|&x| x == CANARY));
    // The peer it was bound for still can.
    let rkey = b.rkey;
    assert_eq!(b.write(AT as i64, 10, rkey), WcStatus::Success);
}

/// A bind needs an unbound window, a region registered for binds (with
/// local write for a remote-write window) and a non-empty span inside it;
/// otherwise it completes with a bind error and the queue pair fails.
#[test]
fn binds_are_checked() {
    let fabric = Fabric::new(3);
    let mut b = fabric.add_host();
    let mut a = fabric.add_host();
    let no_bind = b.register(4096, Access::LOCAL_WRITE).unwrap();
    let bind_only = b.register(4096, Access::MW_BIND).unwrap();
    let ok = b
        .register(4096, Access::LOCAL_WRITE.union(Access::MW_BIND))
        .unwrap();
    let span = |mr: &Mr, off: u64, len: u64| WindowSpan {
        addr: mr.addr + off,
        len,
        access: Access::REMOTE_WRITE,
    };
    let cases = [
        (no_bind, span(&no_bind, 0, 64)),
        (bind_only, span(&bind_only, 0, 64)),
        (ok, span(&ok, 4000, 97)),
        (ok, span(&ok, 0, 0)),
    ];
    for (i, (mr, sp)) in cases.into_iter().enumerate() {
        let (qb, _) = connect(&mut b, &mut a);
        let mw = b.alloc_mw().unwrap();
        b.post_bind(qb, 1, mw, &mr, sp).unwrap();
        b.post_send(qb, 2, sge(&ok, 0, 8)).unwrap();
        let wb = poll(&mut b);
        assert_eq!(wb[0].status, WcStatus::MwBind, "case {i}");
        assert_eq!(wb[1].status, WcStatus::Flushed, "case {i}");
        assert_eq!(b.qp_state(qb).unwrap(), QpState::Error, "case {i}");
    }
    // A window already bound must be invalidated before it is bound again.
    let (qb, _) = connect(&mut b, &mut a);
    let mw = b.alloc_mw().unwrap();
    b.post_bind(qb, 1, mw, &ok, span(&ok, 0, 64)).unwrap();
    b.post_bind(qb, 2, mw, &ok, span(&ok, 64, 64)).unwrap();
    let wb = poll(&mut b);
    assert_eq!(
        wb.iter().map(|w| w.status).collect::<Vec<_>>(),
        vec![WcStatus::Success, WcStatus::MwBind]
    );
    assert_eq!(
        b.post_bind(qb, 3, MwId(999), &ok, span(&ok, 0, 8)),
        Err(VerbsError::UnknownMw(MwId(999)))
    );
}

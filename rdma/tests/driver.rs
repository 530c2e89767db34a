//! Driver behaviour beyond the conformance suite: guards on the caller's
//! input, misses and control frames, backoff, and a hostile peer.

use granary_rdma::driver::{
    Driver, DriverConfig, DriverError, Event, Extent, FailReason, PeerStatus,
};
use granary_rdma::fake::{Fabric, FakeNic};
use granary_rdma::msg::Msg;
use granary_rdma::setup::SetupParams;
use granary_rdma::verbs::{
    Access, Mr, Mtu, Opcode, QpCaps, QpId, QpTiming, RemoteAddr, Sge, Transition, Verbs, WcStatus,
    WorkCompletion,
};

const A: u32 = 1; // a's name for b
const B: u32 = 2; // b's name for a

fn cfg() -> DriverConfig {
    DriverConfig {
        recv_depth: 8,
        send_depth: 8,
        ..DriverConfig::default()
    }
}

fn connected(fabric: &Fabric) -> (Driver<FakeNic>, Driver<FakeNic>) {
    let mut a = Driver::new(fabric.add_host(), 1 << 20, cfg()).unwrap();
    let mut b = Driver::new(fabric.add_host(), 1 << 20, cfg()).unwrap();
    let mut ev = Vec::new();
    let pa = a.prepare(A, 0, &mut ev).unwrap();
    let pb = b.prepare(B, 0, &mut ev).unwrap();
    a.connect(A, &pb, 0, &mut ev).unwrap();
    b.connect(B, &pa, 0, &mut ev).unwrap();
    assert!(ev.is_empty());
    (a, b)
}

/// A driver whose setups time out after 10 ns and whose backoff doubles
/// from 100 ns up to `backoff_max_ns`.
fn backing_off(fabric: &Fabric, backoff_max_ns: u64) -> Driver<FakeNic> {
    let c = DriverConfig {
        backoff_initial_ns: 100,
        backoff_max_ns,
        setup_timeout_ns: 10,
        ..cfg()
    };
    Driver::new(fabric.add_host(), 1 << 20, c).unwrap()
}

fn pump(a: &mut Driver<FakeNic>, b: &mut Driver<FakeNic>, now: u64) -> (Vec<Event>, Vec<Event>) {
    let (mut ea, mut eb) = (Vec::new(), Vec::new());
    for _ in 0..4 {
        a.poll(now, &mut ea).unwrap();
        b.poll(now, &mut eb).unwrap();
    }
    (ea, eb)
}

#[test]
fn caller_input_is_checked() {
    let fabric = Fabric::default();
    let (mut a, mut b) = connected(&fabric);
    let mut ev = Vec::new();
    let big = Extent {
        offset: (1 << 20) - 10,
        len: 11,
    };
    assert_eq!(
        a.get(A, 1, big, b"g", 0, &mut ev),
        Err(DriverError::OutOfArena(big))
    );
    assert_eq!(
        a.get(99, 1, Extent { offset: 0, len: 8 }, b"g", 0, &mut ev),
        Err(DriverError::NotConnected(99))
    );
    let e = Extent { offset: 0, len: 8 };
    a.get(A, 1, e, b"g", 0, &mut ev).unwrap();
    assert_eq!(
        a.get(A, 1, e, b"g", 0, &mut ev),
        Err(DriverError::DuplicateRequest(1))
    );
    assert!(matches!(
        a.get(A, 2, e, &vec![0; 5000], 0, &mut ev),
        Err(DriverError::MessageTooLong(_))
    ));
    let (_, eb) = pump(&mut a, &mut b, 0);
    assert!(matches!(
        eb[..],
        [Event::GetReceived {
            request: 1,
            len: 8,
            ..
        }]
    ));
    let src = Extent { offset: 0, len: 9 };
    assert_eq!(
        b.serve(B, 1, src, b"h", 0, &mut ev),
        Err(DriverError::TooLong { len: 9, extent: 8 })
    );
    assert_eq!(
        b.serve(B, 7, Extent { offset: 0, len: 1 }, b"h", 0, &mut ev),
        Err(DriverError::UnknownRequest(7))
    );
    b.serve(B, 1, Extent { offset: 0, len: 8 }, b"h", 0, &mut ev)
        .unwrap();
    assert_eq!(
        b.serve(B, 1, Extent { offset: 0, len: 8 }, b"h", 0, &mut ev),
        Err(DriverError::UnknownRequest(1)),
        "served only once"
    );
    let (ea, eb) = pump(&mut a, &mut b, 0);
    assert!(matches!(
        ea[..],
        [Event::Landed {
            request: 1,
            len: 8,
            ..
        }]
    ));
    assert_eq!(
        eb,
        vec![Event::Served {
            peer: B,
            request: 1
        }]
    );
    assert!(ev.is_empty());
}

#[test]
fn misses_and_control_frames_pass_through() {
    let fabric = Fabric::default();
    let (mut a, mut b) = connected(&fabric);
    let mut ev = Vec::new();
    a.get(
        A,
        5,
        Extent {
            offset: 64,
            len: 100,
        },
        b"get5",
        0,
        &mut ev,
    )
    .unwrap();
    a.send_control(A, b"ping", 0, &mut ev).unwrap();
    let (_, eb) = pump(&mut a, &mut b, 0);
    assert_eq!(eb.len(), 2);
    assert_eq!(
        eb[1],
        Event::Control {
            peer: B,
            frame: b"ping".to_vec()
        }
    );
    b.answer(B, 5, b"miss", 0, &mut ev).unwrap();
    b.send_control(B, b"pong", 0, &mut ev).unwrap();
    let (ea, _) = pump(&mut a, &mut b, 0);
    // The miss is reported once the window bound to its extent is
    // invalidated, which may be after a control frame received later.
    assert_eq!(ea.len(), 2, "{ea:?}");
    assert!(ea.contains(&Event::Answered {
        peer: A,
        request: 5,
        frame: b"miss".to_vec()
    }));
    assert!(ea.contains(&Event::Control {
        peer: A,
        frame: b"pong".to_vec()
    }));
    assert_eq!(fabric.windows(0), (1, 0), "its window unbound, kept");
    assert_eq!(
        a.status(A),
        PeerStatus::Up {
            in_flight: 0,
            credits: 8
        }
    );
}

#[test]
fn backoff_doubles_up_to_its_cap_and_close_does_not_back_off() {
    let fabric = Fabric::default();
    let mut a = backing_off(&fabric, 350);
    let mut ev = Vec::new();
    let mut now = 0;
    let mut waits = Vec::new();
    for _ in 0..4 {
        a.prepare(A, now, &mut ev).unwrap();
        assert_eq!(a.status(A), PeerStatus::Connecting);
        now += 11; // setup times out
        a.poll(now, &mut ev).unwrap();
        let Some(Event::PeerDown {
            reason: FailReason::Timeout,
            retry_at,
            ..
        }) = ev.pop()
        else {
            panic!("setup timeout: {ev:?}");
        };
        assert!(matches!(
            a.prepare(A, now, &mut ev),
            Err(DriverError::BackingOff { .. })
        ));
        waits.push(retry_at - now);
        now = retry_at;
    }
    assert_eq!(waits, vec![100, 200, 350, 350]);
    a.prepare(A, now, &mut ev).unwrap();
    a.close(A, now, &mut ev);
    assert_eq!(a.status(A), PeerStatus::Idle);
    a.prepare(A, now, &mut ev).expect("no backoff after close");
    // Every queue pair made was destroyed but the last.
    assert_eq!(fabric.qp_count(0), 1);
}

#[test]
fn in_flight_gets_fall_back_when_the_queue_pair_is_closed() {
    let fabric = Fabric::default();
    let (mut a, mut b) = connected(&fabric);
    let mut ev = Vec::new();
    for r in 0..20 {
        a.get(
            A,
            r,
            Extent {
                offset: r * 64,
                len: 64,
            },
            b"g",
            0,
            &mut ev,
        )
        .unwrap();
    }
    pump(&mut a, &mut b, 0);
    a.close(A, 0, &mut ev);
    let fell: Vec<u64> = ev
        .iter()
        .filter_map(|e| match e {
            Event::Fallback {
                request,
                reason: FailReason::Closed,
                ..
            } => Some(*request),
            _ => None,
        })
        .collect();
    assert_eq!(fell, (0..20).collect::<Vec<_>>());
    assert!(matches!(ev.last(), Some(Event::PeerDown { .. })));
    // The owner's queue pair now points at nothing: its answer fails and
    // its pending gets are dropped for the owner to release.
    let mut eb = Vec::new();
    b.serve(B, 0, Extent { offset: 0, len: 64 }, b"h", 0, &mut eb)
        .unwrap();
    for _ in 0..3 {
        b.poll(0, &mut eb).unwrap();
    }
    let aborted = eb
        .iter()
        .filter(|e| matches!(e, Event::ServeAborted { .. }))
        .count();
    assert_eq!(aborted, 20);
    assert!(matches!(
        eb.last(),
        Some(Event::PeerDown {
            reason: FailReason::Completion(_),
            ..
        })
    ));
}

/// Timing of the raw side's queue pair.
const RAW_TIMING: QpTiming = QpTiming {
    mtu: Mtu::M4096,
    timeout: 14,
    retry_cnt: 7,
    rnr_retry: 6,
    min_rnr_timer: 12,
};

/// A driver (a) connected through queue pair `qp` of a host (raw) that
/// speaks raw verbs; raw's memory is `buf`.
struct RawLink {
    fabric: Fabric,
    a: Driver<FakeNic>,
    raw: FakeNic,
    qp: QpId,
    buf: Mr,
}

/// A new driver (a) of a fabric with `seed` connected to a raw host: raw's
/// queue pair has `caps`, its memory is `buf_len` bytes, `on_init` runs on
/// raw once its queue pair is in INIT, and raw offers `recv_depth`
/// receives of 4096 bytes. a's events go to `ev`.
fn raw_link(
    seed: u64,
    caps: QpCaps,
    buf_len: u64,
    recv_depth: u16,
    on_init: impl FnOnce(&mut FakeNic, QpId, &Mr),
    ev: &mut Vec<Event>,
) -> RawLink {
    let fabric = Fabric::new(seed);
    let mut a = Driver::new(fabric.add_host(), 1 << 20, cfg()).unwrap();
    let mut raw = fabric.add_host();
    let pa = a.prepare(A, 0, ev).unwrap();
    let qp = raw.create_qp(caps).unwrap();
    let buf = raw.register(buf_len, Access::LOCAL_WRITE).unwrap();
    raw.modify_qp(qp, Transition::Init).unwrap();
    on_init(&mut raw, qp, &buf);
    let pr = SetupParams {
        endpoint: raw.endpoint(qp).unwrap(),
        mtu: Mtu::M4096,
        recv_depth,
        slot_size: 4096,
    };
    a.connect(A, &SetupParams::decode(&pr.encode()).unwrap(), 0, ev)
        .unwrap();
    let timing = RAW_TIMING;
    raw.modify_qp(
        qp,
        Transition::Rtr {
            remote: pa.endpoint,
            timing,
        },
    )
    .unwrap();
    raw.modify_qp(qp, Transition::Rts { timing }).unwrap();
    RawLink {
        fabric,
        a,
        raw,
        qp,
        buf,
    }
}

/// A driver connected to a peer that speaks raw verbs, with one get in
/// flight; the peer sends `bytes` as one message. Returns the driver's
/// events.
fn hostile(seed: u64, bytes: &[u8]) -> (Vec<Event>, PeerStatus) {
    let mut ev = Vec::new();
    let caps = QpCaps {
        max_send_wr: 4,
        max_recv_wr: 4,
    };
    let RawLink {
        mut a,
        mut raw,
        qp,
        buf,
        ..
    } = raw_link(seed, caps, 8192, 4, |_, _, _| {}, &mut ev);
    a.get(A, 1, Extent { offset: 0, len: 16 }, b"g", 0, &mut ev)
        .unwrap();
    for r in 0..4 {
        raw.post_recv(
            qp,
            r,
            Sge {
                addr: buf.addr + 4096,
                len: 1024,
                lkey: buf.lkey,
            },
        )
        .unwrap();
    }
    raw.write_local(&buf, buf.addr, bytes).unwrap();
    raw.post_send(
        qp,
        9,
        Sge {
            addr: buf.addr,
            len: bytes.len() as u32,
            lkey: buf.lkey,
        },
    )
    .unwrap();
    for _ in 0..3 {
        a.poll(0, &mut ev).unwrap();
    }
    (ev, a.status(A))
}

/// Whatever malformed message a peer sends, the driver tears the queue
/// pair down and falls back; it never panics.
#[test]
fn hostile_peer_messages_tear_down_cleanly() {
    let mut bad_data = Vec::new();
    Msg::Data {
        request: 12345,
        len: 8,
        frame: b"h",
    }
    .encode(0, &mut bad_data);
    let mut too_long = Vec::new();
    Msg::Data {
        request: 1,
        len: 4096,
        frame: b"h",
    }
    .encode(0, &mut too_long);
    let mut overflow = Vec::new();
    Msg::Credit.encode(u16::MAX, &mut overflow);
    let cases: Vec<Vec<u8>> = vec![
        vec![],
        vec![0xff; 40],
        bad_data,
        too_long,
        overflow,
        vec![1, 9, 0, 0, 0, 0, 0, 0],
    ];
    for (i, bytes) in cases.into_iter().enumerate() {
        let (ev, status) = hostile(i as u64 + 1, &bytes);
        let fell: Vec<&FailReason> = ev
            .iter()
            .filter_map(|e| match e {
                Event::Fallback {
                    request: 1, reason, ..
                } => Some(reason),
                _ => None,
            })
            .collect();
        assert!(
            matches!(fell[..], [FailReason::Protocol(_)]),
            "case {i}: {ev:?}"
        );
        assert!(matches!(status, PeerStatus::Down { .. }), "case {i}");
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
    /// Arbitrary bytes from a peer: the get either stays in flight (the
    /// message was well-formed and harmless), lands as announced, or falls
    /// back exactly once; never a panic.
    #[test]
    fn arbitrary_peer_bytes_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64)) {
        let (ev, status) = hostile(5, &bytes);
        let resolved = ev
            .iter()
            .filter(|e| matches!(e, Event::Fallback { request: 1, .. } | Event::Landed { request: 1, .. } | Event::Answered { request: 1, .. }))
            .count();
        proptest::prop_assert!(resolved <= 1);
        if resolved == 0 {
            let up = matches!(status, PeerStatus::Up { in_flight: 1, .. });
            proptest::prop_assert!(up, "{:?}", ev);
        }
    }
}

/// Once a get has fallen back, its extent cannot be written any more: the
/// queue pair was destroyed before the fallback was reported, so a late
/// write from the owner fails instead of landing in a reused extent.
#[test]
fn nothing_lands_after_a_fallback() {
    let fabric = Fabric::default();
    let (mut a, mut b) = connected(&fabric);
    let mut ev = Vec::new();
    let e = Extent {
        offset: 128,
        len: 64,
    };
    a.get(A, 1, e, b"g", 0, &mut ev).unwrap();
    let (_, eb) = pump(&mut a, &mut b, 0);
    assert!(matches!(eb[..], [Event::GetReceived { request: 1, .. }]));
    b.write_arena(0, &[0xab; 64]).unwrap();
    fabric.hold(1, true); // the owner is slow
    b.serve(B, 1, Extent { offset: 0, len: 64 }, b"h", 0, &mut ev)
        .unwrap();
    let late = cfg().transfer_timeout_ns + 1;
    let mut ea = Vec::new();
    a.poll(late, &mut ea).unwrap();
    assert!(matches!(
        ea[..],
        [
            Event::Fallback {
                request: 1,
                reason: FailReason::Timeout,
                ..
            },
            Event::PeerDown { .. }
        ]
    ));
    fabric.hold(1, false);
    let mut eb = Vec::new();
    for _ in 0..3 {
        b.poll(late, &mut eb).unwrap();
    }
    assert!(eb.contains(&Event::ServeAborted {
        peer: B,
        request: 1
    }));
    assert_eq!(fabric.stats().writes, 0);
    let mut got = [0u8; 64];
    a.read_arena(e.offset, &mut got).unwrap();
    assert_eq!(got, [0; 64], "the extent was not written");
}

/// Both arenas registered in place: a get names an extent of the
/// requester's own mapping, the owner's block is read from its own
/// mapping, and the bytes land where the requester reads them. Dropping a
/// driver destroys its queue pairs.
#[test]
fn arenas_registered_in_place_carry_blocks_between_mappings() {
    use granary_shm::arena::Arena;
    let fabric = Fabric::default();
    let (arena_a, arena_b) = (Arena::heap(1 << 20).unwrap(), Arena::heap(1 << 20).unwrap());
    let whole = |a: &Arena| a.slice(0, a.size() as usize).unwrap();
    let mut a = Driver::with_arena(fabric.add_host(), whole(&arena_a), cfg()).unwrap();
    let mut b = Driver::with_arena(fabric.add_host(), whole(&arena_b), cfg()).unwrap();
    assert_eq!(a.arena().len, 1 << 20);
    let mut ev = Vec::new();
    let pa = a.prepare(A, 0, &mut ev).unwrap();
    let pb = b.prepare(B, 0, &mut ev).unwrap();
    a.connect(A, &pb, 0, &mut ev).unwrap();
    b.connect(B, &pa, 0, &mut ev).unwrap();
    let block: Vec<u8> = (0..3000u32).map(|i| (i * 7) as u8).collect();
    arena_b.write_at(65536, &block).unwrap();
    let e = Extent {
        offset: 200_000,
        len: 3000,
    };
    a.get(A, 1, e, b"g", 0, &mut ev).unwrap();
    let (_, eb) = pump(&mut a, &mut b, 0);
    assert!(matches!(eb[..], [Event::GetReceived { request: 1, .. }]));
    let src = Extent {
        offset: 65536,
        len: 3000,
    };
    b.serve(B, 1, src, b"h", 0, &mut ev).unwrap();
    let (ea, _) = pump(&mut a, &mut b, 0);
    assert!(
        ea.iter()
            .any(|x| matches!(x, Event::Landed { request: 1, extent, .. } if *extent == e)),
        "{ea:?}"
    );
    assert_eq!(arena_a.read_at(200_000, 3000).unwrap(), block);
    assert!(arena_a.read_at(0, 200_000).unwrap().iter().all(|&x| x == 0));
    assert_eq!(fabric.qp_count(0), 1);
    drop(a);
    assert_eq!(fabric.qp_count(0), 0, "the driver's queue pair is gone");
}

/// A peer's own offer is answered even while backing off (the peer is
/// ready again); the backoff still doubles on the next failure.
#[test]
fn a_peer_offer_lifts_the_refusal_but_not_the_backoff() {
    let fabric = Fabric::default();
    let mut a = backing_off(&fabric, 1000);
    let mut ev = Vec::new();
    a.prepare(A, 0, &mut ev).unwrap();
    a.poll(11, &mut ev).unwrap();
    assert_eq!(a.status(A), PeerStatus::Down { retry_at: 111 });
    assert!(a.prepare(A, 20, &mut ev).is_err(), "backing off");
    a.peer_offered(A);
    a.prepare(A, 20, &mut ev)
        .expect("answering the peer's offer");
    assert_eq!(a.status(A), PeerStatus::Connecting);
    a.poll(31, &mut ev).unwrap();
    assert_eq!(
        a.status(A),
        PeerStatus::Down { retry_at: 231 },
        "the wait doubled"
    );
}

/// A driver (the requester, a) connected to an owner that speaks raw
/// verbs and does whatever it likes with the keys it is given.
struct RawOwner {
    fabric: Fabric,
    a: Driver<FakeNic>,
    raw: FakeNic,
    qp: QpId,
    /// Raw's memory: bytes to send from at 0, receives from 4096 on.
    buf: Mr,
    now: u64,
}

/// What a get told the owner.
#[derive(Debug)]
struct Told {
    addr: u64,
    rkey: u32,
    len: u32,
}

const CANARY: u8 = 0x5a;
const RECVS: u64 = 8;

impl RawOwner {
    fn new(seed: u64) -> RawOwner {
        let caps = QpCaps {
            max_send_wr: 16,
            max_recv_wr: RECVS as u32,
        };
        let post_recvs = |raw: &mut FakeNic, qp, buf: &Mr| {
            for r in 0..RECVS {
                raw.post_recv(qp, r, Self::recv_sge(buf, r)).unwrap();
            }
        };
        let mut ev = Vec::new();
        let RawLink {
            fabric,
            mut a,
            raw,
            qp,
            buf,
        } = raw_link(seed, caps, 65536, RECVS as u16, post_recvs, &mut ev);
        a.write_arena(0, &vec![CANARY; 1 << 20]).unwrap();
        RawOwner {
            fabric,
            a,
            raw,
            qp,
            buf,
            now: 0,
        }
    }

    fn recv_sge(buf: &Mr, r: u64) -> Sge {
        Sge {
            addr: buf.addr + 4096 + r * 4096,
            len: 4096,
            lkey: buf.lkey,
        }
    }

    /// Runs both sides; returns raw's completions, appends a's events.
    fn run(&mut self, ev: &mut Vec<Event>) -> Vec<WorkCompletion> {
        let mut wcs = Vec::new();
        for _ in 0..3 {
            self.a.poll(self.now, ev).unwrap();
            self.raw.poll_cq(64, &mut wcs).unwrap();
        }
        wcs
    }

    /// a asks for a block into `extent`: what the owner is told.
    fn get(&mut self, request: u64, extent: Extent) -> Told {
        let mut ev = Vec::new();
        self.a
            .get(A, request, extent, b"g", self.now, &mut ev)
            .unwrap();
        let wcs = self.run(&mut ev);
        assert!(ev.is_empty(), "{ev:?}");
        let recv = wcs
            .iter()
            .find(|w| w.opcode == Opcode::Recv)
            .expect("the get arrived");
        assert_eq!(recv.status, WcStatus::Success);
        let mut bytes = vec![0u8; recv.byte_len as usize];
        let at = Self::recv_sge(&self.buf, recv.wr_id).addr;
        self.raw.read_local(&self.buf, at, &mut bytes).unwrap();
        let (msg, _) = Msg::decode(&bytes).unwrap();
        let Msg::Get {
            request: got,
            addr,
            rkey,
            len,
            ..
        } = msg
        else {
            panic!("not a get: {msg:?}");
        };
        assert_eq!(got, request);
        Told { addr, rkey, len }
    }

    /// Raw writes `len` bytes of `byte` at `addr` with `rkey`; returns the
    /// write's status and what a reported meanwhile.
    fn write(&mut self, addr: u64, rkey: u32, len: u32, byte: u8) -> (WcStatus, Vec<Event>) {
        self.raw
            .write_local(&self.buf, self.buf.addr, &vec![byte; len as usize])
            .unwrap();
        let local = Sge {
            addr: self.buf.addr,
            len,
            lkey: self.buf.lkey,
        };
        self.raw
            .post_write(self.qp, 77, local, RemoteAddr { addr, rkey })
            .unwrap();
        let mut ev = Vec::new();
        let wcs = self.run(&mut ev);
        let w = wcs
            .iter()
            .find(|w| w.wr_id == 77)
            .expect("the write completed");
        (w.status, ev)
    }

    /// Raw sends `msg`; returns what a reported.
    fn send(&mut self, msg: Msg<'_>) -> Vec<Event> {
        let mut bytes = Vec::new();
        msg.encode(0, &mut bytes);
        self.raw
            .write_local(&self.buf, self.buf.addr + 2048, &bytes)
            .unwrap();
        let local = Sge {
            addr: self.buf.addr + 2048,
            len: bytes.len() as u32,
            lkey: self.buf.lkey,
        };
        self.raw.post_send(self.qp, 78, local).unwrap();
        let mut ev = Vec::new();
        self.run(&mut ev);
        ev
    }

    fn arena(&self, offset: u64, len: usize) -> Vec<u8> {
        let mut out = vec![0u8; len];
        self.a.read_arena(offset, &mut out).unwrap();
        out
    }
}

const EXTENT: Extent = Extent {
    offset: 8192,
    len: 100,
};

/// The key in a get is a window's over exactly the extent: an owner
/// writing one byte before it, one byte past it, far from it, or with the
/// arena's own key gets a remote access error and writes nothing, the
/// bytes around the extent included; the get falls back and the window
/// is gone with the queue pair.
#[test]
fn an_owner_cannot_write_outside_the_extent_a_get_named() {
    for case in 0..5 {
        let mut o = RawOwner::new(case + 1);
        let told = o.get(1, EXTENT);
        let start = o.a.arena().addr + EXTENT.offset;
        assert_eq!((told.addr, told.len), (start, EXTENT.len));
        assert_ne!(told.rkey, o.a.arena().rkey, "not the arena's key");
        assert_eq!(o.fabric.windows(0), (1, 1), "one window, bound");
        let (addr, rkey, len) = match case {
            0 => (start - 1, told.rkey, told.len),
            1 => (start + 1, told.rkey, told.len),
            2 => (start, told.rkey, told.len + 1),
            3 => (start + 200_000, told.rkey, 8),
            _ => (start, o.a.arena().rkey, told.len),
        };
        let (status, ev) = o.write(addr, rkey, len, 0xee);
        assert_eq!(status, WcStatus::RemoteAccess, "case {case}");
        assert!(
            ev.iter()
                .any(|e| matches!(e, Event::Fallback { request: 1, .. })),
            "case {case}: {ev:?}"
        );
        assert!(
            o.arena(0, 1 << 20).iter().all(|&x| x == CANARY),
            "case {case}: not one byte written"
        );
        assert_eq!(o.fabric.stats().writes, 0, "case {case}");
        assert_eq!(o.fabric.windows(0).1, 0, "case {case}: no window bound");
    }
}

/// Inside the extent the owner's write lands and the block is reported;
/// by then its window is invalidated, so the same key writes nothing
/// more. The same for a get answered with a miss, and for one that timed
/// out (the queue pair destroyed, its window deallocated).
#[test]
fn a_key_is_dead_once_its_get_ended() {
    // Landed.
    let mut o = RawOwner::new(1);
    let told = o.get(1, EXTENT);
    let (status, ev) = o.write(told.addr, told.rkey, told.len, 0xee);
    assert_eq!((status, ev.len()), (WcStatus::Success, 0));
    let ev = o.send(Msg::Data {
        request: 1,
        len: told.len,
        frame: b"h",
    });
    assert!(
        matches!(
            ev[..],
            [Event::Landed {
                request: 1,
                len: 100,
                ..
            }]
        ),
        "{ev:?}"
    );
    assert_eq!(o.fabric.stats().invalidates, 1, "invalidated before Landed");
    assert_eq!(o.fabric.windows(0), (1, 0));
    let (status, _) = o.write(told.addr, told.rkey, told.len, 0x33);
    assert_eq!(status, WcStatus::RemoteAccess, "the key died with the get");
    assert_eq!(o.arena(EXTENT.offset, 100), vec![0xee; 100]);
    assert_eq!(o.arena(EXTENT.offset - 1, 1), vec![CANARY]);
    assert_eq!(o.arena(EXTENT.offset + 100, 1), vec![CANARY]);

    // Answered with a miss.
    let mut o = RawOwner::new(2);
    let told = o.get(2, EXTENT);
    let ev = o.send(Msg::Answer {
        request: 2,
        frame: b"miss",
    });
    assert!(
        matches!(ev[..], [Event::Answered { request: 2, .. }]),
        "{ev:?}"
    );
    let (status, _) = o.write(told.addr, told.rkey, told.len, 0x33);
    assert_eq!(status, WcStatus::RemoteAccess);
    assert!(o.arena(0, 1 << 20).iter().all(|&x| x == CANARY));

    // Timed out.
    let mut o = RawOwner::new(3);
    let told = o.get(3, EXTENT);
    o.now = cfg().transfer_timeout_ns + 1;
    let mut ev = Vec::new();
    o.a.poll(o.now, &mut ev).unwrap();
    assert!(
        matches!(
            ev[..],
            [
                Event::Fallback {
                    request: 3,
                    reason: FailReason::Timeout,
                    ..
                },
                Event::PeerDown { .. }
            ]
        ),
        "{ev:?}"
    );
    assert_eq!(o.fabric.windows(0), (0, 0), "its window deallocated");
    let (status, _) = o.write(told.addr, told.rkey, told.len, 0x33);
    assert_ne!(status, WcStatus::Success);
    assert!(o.arena(0, 1 << 20).iter().all(|&x| x == CANARY));
}

/// An owner answering a get twice is a protocol error: the queue pair
/// goes down and the get falls back; it is never reported landed.
#[test]
fn a_second_answer_tears_the_queue_pair_down() {
    let mut o = RawOwner::new(4);
    let told = o.get(1, EXTENT);
    o.write(told.addr, told.rkey, told.len, 0xee);
    // Two Data messages back to back, the second before the invalidate
    // the first started has completed.
    for (i, at) in [2048u64, 3072].into_iter().enumerate() {
        let mut bytes = Vec::new();
        Msg::Data {
            request: 1,
            len: told.len,
            frame: b"h",
        }
        .encode(0, &mut bytes);
        o.raw.write_local(&o.buf, o.buf.addr + at, &bytes).unwrap();
        let local = Sge {
            addr: o.buf.addr + at,
            len: bytes.len() as u32,
            lkey: o.buf.lkey,
        };
        o.raw.post_send(o.qp, 80 + i as u64, local).unwrap();
    }
    let mut ev = Vec::new();
    o.run(&mut ev);
    assert!(
        matches!(
            ev[..],
            [
                Event::Fallback {
                    request: 1,
                    reason: FailReason::Protocol(_),
                    ..
                },
                Event::PeerDown { .. }
            ]
        ),
        "{ev:?}"
    );
    assert_eq!(o.fabric.windows(0), (0, 0), "its window deallocated");
}

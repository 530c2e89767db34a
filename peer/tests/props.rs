//! Property tests of what agents must agree on and what they parse.

use granary_peer::block::{block_crc, verify};
use granary_peer::conn::{Conn, ConnConfig, Event, Transmit};
use granary_peer::frame::{
    decode_frame, DataHeader, Decoded, Decoder, Frame, Get, GoodbyeReason, Hello, MissReason, Want,
};
use granary_peer::keep::Directory;
use granary_peer::owner::{Owners, WEIGHT_GRANULE};
use granary_peer::view::{Member, View};
use proptest::prelude::*;

fn members(caps: &[u64]) -> Vec<Member> {
    caps.iter()
        .enumerate()
        .map(|(i, &c)| Member::new(format!("node{i:03}"), format!("10.0.0.{i}:7420"), c))
        .collect()
}

fn capacity() -> impl Strategy<Value = u64> {
    prop_oneof![1u64..WEIGHT_GRANULE, 1u64..(8 * WEIGHT_GRANULE)]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn removing_a_node_moves_only_its_samples(
        caps in prop::collection::vec(capacity(), 2..12),
        gone in any::<prop::sample::Index>(),
        fp in any::<u64>(),
    ) {
        let full = View::new("job", 1, members(&caps)).unwrap();
        let gone = gone.index(full.len());
        let rest = View::new(
            "job",
            2,
            full.members().iter().enumerate().filter(|(i, _)| *i != gone).map(|(_, m)| m.clone()),
        ).unwrap();
        let (fo, ro) = (Owners::new(&full), Owners::new(&rest));
        let mut moved_from_gone = 0;
        for s in 0..2000u64 {
            let before = &full.members()[fo.owner(fp, s)].id;
            let after = &rest.members()[ro.owner(fp, s)].id;
            if fo.owner(fp, s) == gone {
                moved_from_gone += 1;
                prop_assert_ne!(before, after);
            } else {
                prop_assert_eq!(before, after, "sample {} moved off a live node", s);
            }
        }
        prop_assert!(moved_from_gone > 0 || caps.len() > 8, "the removed node owned nothing");
    }

    #[test]
    fn keep_set_fits_the_budget(
        caps in prop::collection::vec(1u64..1000, 1..8),
        sizes in prop::collection::vec(0u64..5000, 0..3000),
        budgets_seed in prop::collection::vec(0u64..2_000_000, 8),
        fp in any::<u64>(),
    ) {
        let view = View::new("job", 0, members(&caps)).unwrap();
        let budgets = &budgets_seed[..view.len()];
        let d = Directory::compute(&view, fp, &sizes, budgets).unwrap();
        for (m, budget) in budgets.iter().enumerate() {
            let mut sum = 0u64;
            for s in d.keep_set(m) {
                prop_assert_eq!(d.owner(s), Some(m));
                sum += sizes[s as usize];
            }
            prop_assert_eq!(sum, d.kept_bytes(m));
            prop_assert!(sum <= *budget);
            // Greedy fill: every owned sample left out is bigger than what
            // is left of the budget.
            for s in 0..sizes.len() as u64 {
                if d.owner(s) == Some(m) && !d.is_kept(s) {
                    prop_assert!(sizes[s as usize] > budget - sum);
                }
            }
        }
    }

    #[test]
    fn same_directory_whatever_the_member_order(
        caps in prop::collection::vec(capacity(), 1..10),
        perm_seed in any::<u64>(),
        fp in any::<u64>(),
    ) {
        let ms = members(&caps);
        let mut shuffled = ms.clone();
        // Deterministic Fisher-Yates from the seed.
        let mut x = perm_seed | 1;
        for i in (1..shuffled.len()).rev() {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            shuffled.swap(i, (x % (i as u64 + 1)) as usize);
        }
        let a = View::new("job", 3, ms).unwrap();
        let b = View::new("job", 3, shuffled).unwrap();
        prop_assert_eq!(a.digest(), b.digest());
        let sizes: Vec<u64> = (0..500).map(|i| 100 + i % 7).collect();
        let budgets: Vec<u64> = a.members().iter().map(|m| m.capacity % 20_000).collect();
        let da = Directory::compute(&a, fp, &sizes, &budgets).unwrap();
        let db = Directory::compute(&b, fp, &sizes, &budgets).unwrap();
        prop_assert_eq!(da.digest(), db.digest());
        for s in 0..500 {
            prop_assert_eq!(da.owner(s), db.owner(s));
            prop_assert_eq!(da.is_kept(s), db.is_kept(s));
        }
    }

    #[test]
    fn frames_round_trip(f in frame()) {
        let b = f.to_bytes().unwrap();
        let (back, used) = decode_frame(&b).unwrap().unwrap();
        prop_assert_eq!(used, b.len());
        prop_assert_eq!(back.to_bytes().unwrap(), b);
        prop_assert_eq!(back, f);
    }

    #[test]
    fn arbitrary_bytes_never_panic_the_decoder(
        data in prop::collection::vec(any::<u8>(), 0..600),
        piece in 1usize..40,
    ) {
        if let Ok(Some((f, used))) = decode_frame(&data) {
            prop_assert_eq!(f.to_bytes().unwrap(), &data[..used]);
        }
        let whole = stream(&data, data.len().max(1));
        let pieces = stream(&data, piece);
        prop_assert_eq!(whole, pieces);
    }

    #[test]
    fn valid_frames_with_noise_decode_in_any_pieces(
        fs in prop::collection::vec(frame(), 1..6),
        piece in 1usize..64,
    ) {
        let mut wire = Vec::new();
        for f in &fs {
            f.encode(&mut wire).unwrap();
            if let Frame::Data(d) = f {
                wire.extend(std::iter::repeat_n(0xAB, d.length as usize));
            }
        }
        let (got, err, _) = stream(&wire, piece);
        prop_assert_eq!(err, None);
        prop_assert_eq!(got, fs);
    }

    #[test]
    fn stranger_bytes_never_establish_serve_or_get_an_answer(
        data in prop::collection::vec(any::<u8>(), 0..400),
        real_preamble in any::<bool>(),
        piece in 1usize..64,
    ) {
        // A listener fed anything but a dialer holding the secret: never
        // established, never an event but Closed, never one byte written.
        let cfg = ConnConfig::new("job", "me", [1; 32], 1, b"secret".to_vec());
        let mut c = Conn::accept(cfg, [2; 32], 0).unwrap();
        let mut input = Vec::new();
        if real_preamble {
            let stranger = ConnConfig::new("job", "them", [1; 32], 1, b"not the secret".to_vec());
            let mut d = Conn::dial(stranger, [3; 32], 0).unwrap();
            while let Some(t) = d.poll_transmit() {
                if let Transmit::Bytes(b) = t {
                    input.extend_from_slice(&b);
                }
            }
        }
        input.extend_from_slice(&data);
        for chunk in input.chunks(piece) {
            c.handle_input(chunk, 1);
            while let Some(e) = c.poll_event() {
                prop_assert!(
                    matches!(e, Event::Closed(_)),
                    "unauthenticated bytes produced {:?}", e
                );
            }
        }
        prop_assert!(!c.is_established());
        prop_assert!(c.poll_transmit().is_none(), "the listener answered a stranger");
    }

    #[test]
    fn block_crc_binds_identity(
        payload in prop::collection::vec(any::<u8>(), 1..300),
        fp in any::<u64>(),
        sample in any::<u64>(),
        other in any::<u64>(),
    ) {
        let c = block_crc(fp, sample, &payload);
        prop_assert!(verify(fp, sample, payload.len() as u64, &payload, c).is_ok());
        if other != sample {
            prop_assert!(verify(fp, other, payload.len() as u64, &payload, c).is_err());
        }
        if other != fp {
            prop_assert!(verify(other, sample, payload.len() as u64, &payload, c).is_err());
        }
        let cut = &payload[..payload.len() - 1];
        prop_assert!(verify(fp, sample, cut.len() as u64, cut, c).is_err());
    }
}

/// Frames and payloads from a decoder fed `piece` bytes at a time, until
/// the first error (payload bytes are dropped; frames are checked).
fn stream(data: &[u8], piece: usize) -> (Vec<Frame>, Option<granary_peer::frame::FrameError>, u64) {
    let mut d = Decoder::new();
    let mut frames = Vec::new();
    let mut payload = 0u64;
    for chunk in data.chunks(piece) {
        d.feed(chunk);
        loop {
            match d.next_item() {
                Ok(Some(Decoded::Frame(f))) => frames.push(f),
                Ok(Some(Decoded::Payload(p))) => payload += p.len() as u64,
                Ok(None) => break,
                Err(e) => return (frames, Some(e), payload),
            }
        }
    }
    (frames, None, payload)
}

fn id() -> impl Strategy<Value = String> {
    "[a-z0-9.-]{1,40}"
}

fn frame() -> impl Strategy<Value = Frame> {
    let get = (
        any::<u64>(),
        any::<u64>(),
        any::<u64>(),
        any::<u64>(),
        any::<u64>(),
    )
        .prop_map(|(request, fingerprint, sample, length, due)| Get {
            request,
            fingerprint,
            sample,
            length,
            due,
        });
    let want = (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>()).prop_map(
        |(request, sample, length, due)| Want {
            request,
            sample,
            length,
            due,
        },
    );
    prop_oneof![
        (any::<u16>(), id(), id(), any::<[u8; 32]>(), any::<u64>(),).prop_map(
            |(version, job_id, node_id, view_digest, incarnation)| Frame::Hello(Hello {
                version,
                job_id,
                node_id,
                view_digest,
                incarnation,
            })
        ),
        get.prop_map(Frame::Get),
        (any::<u64>(), prop::collection::vec(want, 1..40))
            .prop_map(|(fingerprint, items)| Frame::GetMany { fingerprint, items }),
        (
            any::<u64>(),
            any::<u64>(),
            0u64..200,
            any::<u32>(),
            any::<u32>()
        )
            .prop_map(|(request, sample, length, crc, store_wait_us)| Frame::Data(
                DataHeader {
                    request,
                    sample,
                    length,
                    crc,
                    store_wait_us,
                }
            )),
        (
            any::<u64>(),
            any::<u64>(),
            prop::sample::select(MissReason::ALL.to_vec())
        )
            .prop_map(|(request, sample, reason)| Frame::Miss {
                request,
                sample,
                reason
            }),
        (1u32..).prop_map(Frame::Credit),
        any::<u64>().prop_map(Frame::Ping),
        any::<u64>().prop_map(Frame::Pong),
        any::<u64>().prop_map(Frame::Cancel),
        prop::sample::select(GoodbyeReason::ALL.to_vec()).prop_map(Frame::Goodbye),
        prop::collection::vec(any::<u8>(), 1..=granary_peer::frame::MAX_RDMA_SETUP)
            .prop_map(Frame::RdmaSetup),
    ]
}

/// One bracket range: (low, count, width).
fn range() -> impl Strategy<Value = (u64, u64, usize)> {
    (0u64..200, 1u64..6, 1usize..5)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn host_lists_expand_like_scontrol(
        elems in prop::collection::vec(
            ("[a-z]{1,6}", prop::collection::vec(range(), 0..3), "(-[a-z]{1,3})?"),
            1..4,
        ),
    ) {
        let mut list = Vec::new();
        let mut want = Vec::new();
        for (prefix, ranges, suffix) in &elems {
            if ranges.is_empty() {
                list.push(format!("{prefix}{suffix}"));
                want.push(format!("{prefix}{suffix}"));
                continue;
            }
            let body: Vec<String> = ranges
                .iter()
                .map(|&(lo, n, w)| {
                    if n == 1 {
                        format!("{lo:0w$}")
                    } else {
                        format!("{lo:0w$}-{:0w$}", lo + n - 1)
                    }
                })
                .collect();
            list.push(format!("{prefix}[{}]{suffix}", body.join(",")));
            for &(lo, n, w) in ranges {
                for v in lo..lo + n {
                    want.push(format!("{prefix}{v:0w$}{suffix}"));
                }
            }
        }
        let got = granary_peer::view::expand_hostlist(&list.join(",")).unwrap();
        prop_assert_eq!(got, want);
    }
}

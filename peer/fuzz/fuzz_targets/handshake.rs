//! Fuzzes the connection handshake. Arbitrary bytes (after an optional
//! well-formed hello from a peer that does not know the secret) must never
//! panic a connection, never establish it, and never produce a request or
//! a block: nothing is served before authentication. Then the same bytes
//! are fed to an established connection, which must not panic either and
//! may only ever be closed by them, never establish twice.
#![no_main]

use granary_peer::conn::{Conn, ConnConfig, Event, Transmit};
use granary_peer::frame::{Frame, Hello};
use libfuzzer_sys::fuzz_target;

fn cfg(node: &str, secret: &[u8]) -> ConnConfig {
    ConnConfig::new("job", node, [7; 32], 1, secret.to_vec())
}

fn pump(from: &mut Conn, to: &mut Conn) {
    while let Some(t) = from.poll_transmit() {
        if let Transmit::Bytes(b) = t {
            to.handle_input(&b, 1);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let (flags, rest) = data.split_first().map_or((0, data), |(f, r)| (*f, r));
    let mut c = Conn::new(cfg("me", b"secret"), [1; 32], 0).expect("valid config");
    if flags & 1 == 1 {
        let hello = Frame::Hello(Hello {
            version: 1,
            job_id: "job".into(),
            node_id: "them".into(),
            view_digest: [7; 32],
            incarnation: 2,
            nonce: [2; 32],
        });
        c.handle_input(&hello.to_bytes().expect("hello encodes"), 1);
    }
    let piece = 1 + usize::from(flags >> 1) % 17;
    for chunk in rest.chunks(piece) {
        c.handle_input(chunk, 2);
        while let Some(e) = c.poll_event() {
            assert!(
                matches!(e, Event::Closed(_)),
                "unauthenticated bytes gave {e:?}"
            );
        }
    }
    assert!(!c.is_established());
    c.handle_timeout(u64::MAX);
    assert!(c.is_closed());

    // An established pair, then the same bytes as if from the peer.
    let mut a = Conn::new(cfg("a", b"k"), [3; 32], 0).expect("valid config");
    let mut b = Conn::new(cfg("b", b"k"), [4; 32], 0).expect("valid config");
    for _ in 0..3 {
        pump(&mut a, &mut b);
        pump(&mut b, &mut a);
    }
    assert!(a.is_established());
    while a.poll_event().is_some() {}
    a.handle_input(rest, 3);
    loop {
        while a.payload().is_some() {}
        let left = a.payload_remaining();
        if left > 0 {
            a.payload_direct(left, 3).expect("nothing buffered");
        }
        match a.poll_event() {
            Some(Event::Established { .. }) => panic!("established twice"),
            Some(_) => {}
            None if a.payload_remaining() == 0 => break,
            None => {}
        }
    }
    while a.poll_transmit().is_some() {}
});

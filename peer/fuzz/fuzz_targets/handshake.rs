//! Fuzzes the channel handshake. Arbitrary bytes, after an optional
//! preamble and first message from a dialer that does not hold the secret,
//! must never panic a listener, never establish it, never make it write a
//! byte (a stranger gets no answer to test guesses against), and never
//! produce a request or a block. The same bytes fed to a dialer after its
//! first message must not establish it either.
#![no_main]

use granary_peer::conn::{Conn, ConnConfig, Event, Transmit};
use libfuzzer_sys::fuzz_target;

fn cfg(node: &str, secret: &[u8]) -> ConnConfig {
    ConnConfig::new("job", node, [7; 32], 1, secret.to_vec())
}

fn wire(c: &mut Conn) -> Vec<u8> {
    let mut w = Vec::new();
    while let Some(t) = c.poll_transmit() {
        if let Transmit::Bytes(b) = t {
            w.extend_from_slice(&b);
        }
    }
    w
}

fn only_closed(c: &mut Conn) {
    while let Some(e) = c.poll_event() {
        assert!(
            matches!(e, Event::Closed(_)),
            "unauthenticated bytes gave {e:?}"
        );
    }
}

fuzz_target!(|data: &[u8]| {
    let (flags, rest) = data.split_first().map_or((0, data), |(f, r)| (*f, r));
    let piece = 1 + usize::from(flags >> 2) % 61;

    // A listener.
    let mut l = Conn::accept(cfg("me", b"secret"), [1; 32], 0).expect("valid config");
    let mut input = Vec::new();
    if flags & 1 == 1 {
        let mut stranger = Conn::dial(cfg("them", b"guess"), [2; 32], 0).expect("valid config");
        input = wire(&mut stranger);
        if flags & 2 == 2 {
            // Keep the real preamble, fuzz what follows.
            input.truncate(8);
        }
    }
    input.extend_from_slice(rest);
    for chunk in input.chunks(piece) {
        l.handle_input(chunk, 2);
        only_closed(&mut l);
    }
    assert!(!l.is_established());
    assert!(wire(&mut l).is_empty(), "the listener answered a stranger");
    l.handle_timeout(u64::MAX);
    assert!(l.is_closed());

    // A dialer whose answer is the fuzzed bytes.
    let mut d = Conn::dial(cfg("me", b"secret"), [3; 32], 0).expect("valid config");
    wire(&mut d);
    for chunk in rest.chunks(piece) {
        d.handle_input(chunk, 2);
        only_closed(&mut d);
    }
    assert!(!d.is_established());
});

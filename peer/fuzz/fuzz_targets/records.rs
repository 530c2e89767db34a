//! Fuzzes an established channel. The input drives two things:
//! * raw bytes on the wire after the handshake (forged records): they must
//!   never panic, never produce an event but `Closed`, and close the
//!   connection unless they are an incomplete record;
//! * plaintext sealed by the real peer (frames inside authentic records):
//!   whatever the frames, the connection never panics and never
//!   establishes twice; payloads are taken as they come, by `payload()` or
//!   by `payload_into` into a destination of a fuzzed size.
#![no_main]

use granary_peer::conn::{Conn, ConnConfig, Event, Transmit};
use libfuzzer_sys::fuzz_target;

fn cfg(node: &str) -> ConnConfig {
    ConnConfig::new("job", node, [7; 32], 1, b"k".to_vec())
}

fn pump(from: &mut Conn, to: &mut Conn) {
    while let Some(t) = from.poll_transmit() {
        match t {
            Transmit::Bytes(b) => to.handle_input(&b, 1),
            Transmit::Payload(h) => {
                let mut w = Vec::new();
                from.seal_payload_from(&vec![0; h.length as usize], &mut w)
                    .expect("a payload just handed out seals");
                to.handle_input(&w, 1);
            }
        }
    }
}

fn pair() -> (Conn, Conn) {
    let mut a = Conn::dial(cfg("a"), [3; 32], 0).expect("valid config");
    let mut b = Conn::accept(cfg("b"), [4; 32], 0).expect("valid config");
    for _ in 0..3 {
        pump(&mut a, &mut b);
        pump(&mut b, &mut a);
    }
    assert!(a.is_established() && b.is_established());
    while a.poll_event().is_some() {}
    while b.poll_event().is_some() {}
    (a, b)
}

fn drain(c: &mut Conn, into: Option<usize>) {
    let mut dst = vec![0u8; into.unwrap_or(0)];
    loop {
        match into {
            None => while c.payload().is_some() {},
            Some(_) => while c.payload_into(&mut dst) > 0 {},
        }
        match c.poll_event() {
            Some(Event::Established { .. }) => panic!("established twice"),
            Some(_) => {}
            None => break,
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let (flags, rest) = data.split_first().map_or((0, data), |(f, r)| (*f, r));
    let (mut a, mut b) = pair();
    if flags & 1 == 0 {
        // Forged wire bytes.
        a.handle_input(rest, 2);
        while let Some(e) = a.poll_event() {
            assert!(matches!(e, Event::Closed(_)), "forged bytes gave {e:?}");
        }
    } else {
        // Frames the real peer seals: its own records carry the fuzzed
        // plaintext, as a buggy or hostile member's would.
        b.inject_plaintext_for_fuzzing(rest);
        pump(&mut b, &mut a);
        let into = (flags & 2 != 0).then_some(usize::from(flags >> 2) * 1031 + 1);
        drain(&mut a, into);
    }
    while a.poll_transmit().is_some() {
        if a.payload_to_seal() > 0 {
            break;
        }
    }
});

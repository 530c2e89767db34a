//! Fuzzes the session handshake codec: `decode_frame` on one datagram and
//! the streaming `Decoder` fed in pieces. Nothing may panic; whatever
//! decodes re-encodes to the same bytes (the encoding is canonical) and
//! decodes again to the same message; feeding a stream whole or in pieces
//! yields the same messages and the same error.
#![no_main]

use granary_shm::handshake::{decode_frame, encode_to_vec, Decoder, Message, ProtocolError};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(msg) = decode_frame(data) {
        let bytes = encode_to_vec(&msg);
        assert_eq!(bytes, data, "re-encoding {msg:?} changed the frame");
        assert_eq!(decode_frame(&bytes), Ok(msg));
    }

    let piece = 1 + data.first().map_or(0, |b| usize::from(*b) % 23);
    let whole = stream(data, data.len().max(1));
    let pieces = stream(data, piece);
    assert_eq!(
        whole, pieces,
        "feeding whole or in {piece}-byte pieces differs"
    );
    for msg in &whole.0 {
        assert_eq!(decode_frame(&encode_to_vec(msg)).as_ref(), Ok(msg));
    }
});

/// Feeds `data` to a fresh decoder `piece` bytes at a time, collecting
/// messages until the first error; returns the messages, the error and the
/// bytes left pending.
fn stream(data: &[u8], piece: usize) -> (Vec<Message>, Option<ProtocolError>, usize) {
    let mut d = Decoder::new();
    let mut msgs = Vec::new();
    for chunk in data.chunks(piece) {
        d.feed(chunk);
        loop {
            match d.next_message() {
                Ok(Some(m)) => msgs.push(m),
                Ok(None) => break,
                Err(e) => {
                    assert_eq!(d.next_message(), Err(e), "errors are sticky");
                    return (msgs, Some(e), 0);
                }
            }
        }
    }
    let pending = d.pending();
    (msgs, None, pending)
}

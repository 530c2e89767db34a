//! Fuzzes the peer frame codec: `decode_frame` on one buffer and the
//! streaming `Decoder` fed in pieces. Nothing may panic; whatever decodes
//! re-encodes to the same bytes (the encoding is canonical); feeding a
//! stream whole or in pieces yields the same frames, the same payload bytes
//! and the same error.
#![no_main]

use granary_peer::frame::{decode_frame, Decoded, Decoder, Frame, FrameError};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(Some((frame, used))) = decode_frame(data) {
        let bytes = frame.to_bytes().expect("a decoded frame encodes");
        assert_eq!(
            bytes,
            &data[..used],
            "re-encoding {frame:?} changed the frame"
        );
        assert_eq!(decode_frame(&bytes), Ok(Some((frame, used))));
    }

    let piece = 1 + data.first().map_or(0, |b| usize::from(*b) % 29);
    let whole = stream(data, data.len().max(1));
    let pieces = stream(data, piece);
    assert_eq!(
        whole, pieces,
        "feeding whole or in {piece}-byte pieces differs"
    );
});

/// Frames, payload bytes and the first error from a decoder fed `piece`
/// bytes at a time.
fn stream(data: &[u8], piece: usize) -> (Vec<Frame>, Vec<u8>, Option<FrameError>) {
    let mut d = Decoder::new();
    let mut frames = Vec::new();
    let mut payload = Vec::new();
    for chunk in data.chunks(piece) {
        d.feed(chunk);
        loop {
            match d.next_item() {
                Ok(Some(Decoded::Frame(f))) => frames.push(f),
                Ok(Some(Decoded::Payload(p))) => payload.extend_from_slice(p),
                Ok(None) => break,
                Err(e) => {
                    assert_eq!(d.next_item(), Err(e), "errors are sticky");
                    return (frames, payload, Some(e));
                }
            }
        }
    }
    (frames, payload, None)
}

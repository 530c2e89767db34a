//! The channel on one thread: a requester and an owner, established,
//! moving blocks as the agent's TCP transport does, the wire bytes handed
//! over through each side's input buffer; and the hand-over copies alone.

use granary_peer::channel::{Protection, Suite};
use granary_peer::conn::{Conn, Event, Transmit};
use granary_peer::frame::{DataHeader, Get};

use super::scenario::{conn_config, pattern, Api, SEAL_CHUNK};
use super::Result;

/// The block a requester is receiving.
pub struct Landing {
    pub api: Api,
    /// Bytes of the current block received so far, while one is landing.
    pub got: Option<usize>,
    /// The current block's length.
    pub len: usize,
    /// Blocks wholly received.
    pub done: u64,
    /// Where the current block lands in the destination arena.
    pub base: usize,
}

impl Landing {
    pub fn new(api: Api) -> Landing {
        Landing {
            api,
            got: None,
            len: 0,
            done: 0,
            base: 0,
        }
    }
}

/// What a requester does with what it was handed: payload bytes into the
/// destination, events taken. As `handle_events` in the agent.
pub fn drain(conn: &mut Conn, landing: &mut Landing, dst: &mut [u8]) -> Result<()> {
    loop {
        if let Some(got) = landing.got.as_mut() {
            let extent = &mut dst[landing.base..landing.base + landing.len];
            match landing.api {
                Api::Copying => {
                    while let Some(piece) = conn.payload() {
                        extent[*got..*got + piece.len()].copy_from_slice(piece);
                        *got += piece.len();
                    }
                }
                Api::Direct => loop {
                    let n = conn.payload_into(&mut extent[*got..]);
                    if n == 0 {
                        break;
                    }
                    *got += n;
                },
            }
            if conn.payload_remaining() > 0 {
                return Ok(());
            }
            landing.got = None;
            landing.done += 1;
        }
        match conn.poll_event() {
            None => return Ok(()),
            Some(Event::Data(h)) => {
                if landing.base + h.length as usize > dst.len() {
                    return Err("a block longer than its extent".into());
                }
                landing.len = h.length as usize;
                landing.got = Some(0);
            }
            Some(Event::Credit(_) | Event::Established { .. }) => {}
            Some(Event::Closed(c)) => return Err(format!("requester: closed: {c:?}").into()),
            Some(e) => return Err(format!("unexpected event {e:?}").into()),
        }
    }
}

/// Hands wire bytes to `to` through its input buffer, one buffer's worth
/// at a time, a requester draining after each (as the agent's reads do;
/// an owner's events are taken by the caller). Each piece's offset and
/// length go to `log` when one is given.
pub fn hand_over(
    bytes: &[u8],
    to: &mut Conn,
    mut requester: Option<(&mut Landing, &mut [u8])>,
    mut log: Option<&mut Vec<(usize, usize)>>,
) -> Result<()> {
    let mut at = 0;
    while at < bytes.len() {
        let buf = to.input_buffer();
        let n = buf.len().min(bytes.len() - at);
        if n == 0 {
            return Err("the connection takes no input".into());
        }
        buf[..n].copy_from_slice(&bytes[at..at + n]);
        to.input_written(n, 0);
        if let Some(l) = log.as_deref_mut() {
            l.push((at, n));
        }
        at += n;
        if let Some((landing, dst)) = requester.as_mut() {
            drain(to, landing, dst)?;
        }
    }
    Ok(())
}

/// Seals the payload `src` of the block just handed out, `SEAL_CHUNK` at a
/// time into the reused buffer `sealed`, handing each chunk's records to
/// `emit` (as `write_payload` in the agent).
pub fn seal_block(
    conn: &mut Conn,
    api: Api,
    src: &[u8],
    sealed: &mut Vec<u8>,
    mut emit: impl FnMut(&[u8]) -> Result<()>,
) -> Result<()> {
    let len = src.len() as u64;
    let mut at = 0;
    while at < len {
        let n = (len - at).min(SEAL_CHUNK);
        match api {
            Api::Copying => {
                sealed.clear();
                conn.seal_payload(n, sealed, |off, d| {
                    let off = off as usize;
                    d.copy_from_slice(&src[off..off + d.len()]);
                })?;
                emit(sealed)?;
            }
            Api::Direct => {
                let need = Conn::sealed_len(SEAL_CHUNK as usize);
                if sealed.len() < need {
                    sealed.resize(need, 0);
                }
                let piece = &src[at as usize..(at + n) as usize];
                let w = conn.seal_payload_into(piece, sealed)?;
                emit(&sealed[..w])?;
            }
        }
        at += n;
    }
    Ok(())
}

/// A requester and an owner, established, on this thread.
pub struct ChannelPair {
    pub requester: Conn,
    pub owner: Conn,
    pub api: Api,
    pub size: usize,
    /// Source and destination arenas: `extents` blocks each.
    pub src: Vec<u8>,
    pub dst: Vec<u8>,
    pub extents: usize,
    /// The owner's reused sealing buffer.
    pub sealed: Vec<u8>,
    pub landing: Landing,
    pub next: u64,
}

impl ChannelPair {
    pub fn new(
        suite: Suite,
        protection: Protection,
        size: usize,
        arena: usize,
        api: Api,
    ) -> Result<ChannelPair> {
        let mut requester = Conn::dial(conn_config("requester", suite, protection), [1; 32], 0)?;
        let mut owner = Conn::accept(conn_config("owner", suite, protection), [2; 32], 0)?;
        let mut landing = Landing::new(api);
        for _ in 0..4 {
            while let Some(t) = requester.poll_transmit() {
                let Transmit::Bytes(b) = t else {
                    return Err("payload during the handshake".into());
                };
                hand_over(&b, &mut owner, None, None)?;
            }
            while let Some(t) = owner.poll_transmit() {
                let Transmit::Bytes(b) = t else {
                    return Err("payload during the handshake".into());
                };
                hand_over(&b, &mut requester, Some((&mut landing, &mut [])), None)?;
            }
        }
        if !requester.is_established() || !owner.is_established() {
            return Err("the channel did not come up".into());
        }
        if requester.channel() != Some((suite, protection)) {
            return Err(format!("channel is {:?}", requester.channel()).into());
        }
        let extents = (arena / size).max(1);
        let mut p = ChannelPair {
            requester,
            owner,
            api,
            size,
            src: pattern(size * extents, size as u64),
            dst: vec![0; size * extents],
            extents,
            sealed: Vec::new(),
            landing,
            next: 0,
        };
        // Every extent once, checked byte for byte.
        for _ in 0..extents {
            p.step(None)?;
        }
        if p.src != p.dst {
            return Err(format!(
                "{suite:?} {protection:?} {size} {api:?}: the blocks received differ from those sent"
            )
            .into());
        }
        Ok(p)
    }

    /// One block: get, data header, payload sealed from the source extent,
    /// opened into the destination extent. The hand-over pieces of the
    /// payload's records go to `log` when one is given.
    pub fn step(&mut self, mut log: Option<&mut Vec<(usize, usize)>>) -> Result<u64> {
        let ChannelPair {
            requester,
            owner,
            api,
            size,
            src,
            dst,
            extents,
            sealed,
            landing,
            next,
        } = self;
        let request = *next;
        *next += 1;
        let extent = (request % *extents as u64) as usize * *size;
        requester.send_get(
            Get {
                request,
                fingerprint: 1,
                sample: request,
                length: *size as u64,
                due: 1_000_000_000,
            },
            0,
        )?;
        while let Some(t) = requester.poll_transmit() {
            let Transmit::Bytes(b) = t else {
                return Err("the requester sends no payload".into());
            };
            hand_over(&b, owner, None, None)?;
        }
        while let Some(e) = owner.poll_event() {
            match e {
                Event::Request(g) => owner.send_data(DataHeader {
                    request: g.request,
                    sample: g.sample,
                    length: g.length,
                    crc: 0,
                    store_wait_us: 0,
                })?,
                Event::Credit(_) | Event::Established { .. } => {}
                e => return Err(format!("owner: unexpected event {e:?}").into()),
            }
        }
        let done = landing.done;
        landing.base = extent;
        while let Some(t) = owner.poll_transmit() {
            match t {
                Transmit::Bytes(b) => {
                    hand_over(&b, requester, Some((&mut *landing, &mut dst[..])), None)?
                }
                Transmit::Payload(h) => {
                    let src = &src[extent..extent + h.length as usize];
                    seal_block(owner, *api, src, sealed, |records| {
                        hand_over(
                            records,
                            requester,
                            Some((&mut *landing, &mut dst[..])),
                            log.as_deref_mut(),
                        )
                    })?;
                }
            }
        }
        if landing.done != done + 1 || landing.got.is_some() {
            return Err("a block did not arrive whole".into());
        }
        Ok(*size as u64)
    }
}

/// The copies that stand in for the socket reads of one block's payload,
/// alone: the same pieces, from a buffer as large as the sealing buffer into
/// one as large as the input buffer.
pub struct Handover {
    pub pieces: Vec<(usize, usize)>,
    pub wire: Vec<u8>,
    pub buf: Vec<u8>,
    pub size: usize,
}

impl Handover {
    pub fn new(pair: &mut ChannelPair) -> Result<Handover> {
        let mut pieces = Vec::new();
        pair.step(Some(&mut pieces))?;
        let wire_len = pieces.iter().map(|&(a, n)| a + n).max().unwrap_or(0);
        let room = pieces.iter().map(|&(_, n)| n).max().unwrap_or(0);
        Ok(Handover {
            pieces,
            wire: pattern(wire_len, 9),
            buf: vec![0; 2 * room],
            size: pair.size,
        })
    }

    pub fn step(&mut self) -> u64 {
        for &(at, n) in &self.pieces {
            self.buf[..n].copy_from_slice(&self.wire[at..at + n]);
        }
        std::hint::black_box(&mut self.buf);
        self.size as u64
    }
}

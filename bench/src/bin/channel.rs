//! Cost of the peer channel: bytes/s per core of blocks moved through an established `Conn` pair (seal, open, copies) beside the raw AEAD's (one seal and one open of a record), per suite and protection; and over loopback TCP.
//!
//! Everything in the main part runs on one thread and is timed with that
//! thread's CPU clock (`CLOCK_THREAD_CPUTIME_ID`), so the figures are bytes
//! per second per core.
//!
//! * **Raw AEAD** (`raw`): one record of 65,519 plaintext bytes (the
//!   channel's largest, `MAX_RECORD_PLAINTEXT`) sealed in place and opened in
//!   place with aws-lc-rs, the channel's key type and nonce encoding: what a
//!   record crossing costs in pure cryptography. Encrypted: `ENCRYPT(k, n,
//!   ad = "", data)`; authenticated: the tag-only form `ENCRYPT(k, n, ad =
//!   data, "")`.
//! * **Channel**: a requester (`Conn::dial`) and an owner (`Conn::accept`)
//!   on one thread, established, moving blocks as the agent's TCP transport
//!   does (`agent/src/peers/net/`): the requester sends a get; the owner
//!   answers with `send_data` and seals the payload 256 KiB at a time into
//!   one reused buffer; the wire bytes are handed to the other side through
//!   `input_buffer`/`input_written` (a copy, standing in for the socket's
//!   read), and the requester lands the payload in the destination extent.
//!   Gets and credit frames cross too. Two call paths: *copying*
//!   (`seal_payload` with a fill closure copying from the source, and
//!   `payload()` copied out: the agent's calls today) and *direct*
//!   (`seal_payload_into` encrypting straight from the source,
//!   `payload_into` opening records straight into the destination). Every
//!   block's bytes are checked before the timed rounds.
//! * **Hand-over** (`handover`): the copies that stand in for the socket
//!   reads alone, the same pieces from the same buffer sizes. A real
//!   transport pays them in the kernel with or without a channel, so the
//!   channel's own cost is `channel − handover` (per byte, paired by round);
//!   the channel's figure with them is printed too.
//!
//! Contenders run in rounds; each round runs every contender for about
//! `--ms` of CPU time, the order rotating from round to round; the figures
//! are medians over rounds. Goal: the channel's own bytes/s per core ≥ 0.8 ×
//! the raw AEAD's, for the suite the agent picks here
//! (`Suite::fastest_here()`) with encrypted records, at every block size,
//! judged on the direct calls (`goal`); the copying calls' verdict is
//! printed beside it (`goal_copying`).
//!
//! After the rounds, unless `--no-tcp`: the same blocks over a loopback TCP
//! connection, owner and requester on two threads, for the picked suite
//! (encrypted with both call paths, authenticated with the direct calls)
//! and plain TCP (no channel: the extent written, read
//! straight into the destination); bytes per CPU second of both threads
//! together. Reported apart, not part of the goal.

use aws_lc_rs::aead::{
    Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, CHACHA20_POLY1305, NONCE_LEN,
};
use granary_bench::cli::Args;
use granary_bench::report::{median, Goal, Json};
use granary_bench::sys;
use granary_peer::channel::{Protection, Suite, MAX_RECORD_PLAINTEXT};
use granary_peer::conn::{Conn, ConnConfig, Event, Transmit};
use granary_peer::frame::{DataHeader, Get};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::ExitCode;
use std::time::{Duration, Instant};

type Error = Box<dyn std::error::Error + Send + Sync>;
type Result<T> = std::result::Result<T, Error>;

const USAGE: &str = "\
usage: bench/run channel [options]
  --rounds N        rounds of every contender (default 7)
  --ms N            CPU milliseconds per contender per round (default 300)
  --sizes LIST      block sizes in bytes (default 112640,1048576: 110 KiB, 1 MiB)
  --arena-mib N     source and destination arenas of N MiB each, the block's
                    extent moving through them (default 0: one extent, hot in cache)
  --tcp-mib N       MiB moved per loopback TCP run (default 512)
  --tcp-rounds N    rounds of the TCP runs (default 3)
  --depth N         requests in flight over TCP (default 4)
  --no-tcp          skip the loopback TCP runs
  --quiet-s N       wait up to N s for a quiet machine first (default 10)
  --only LIST       these suite/protection pairs only, comma-separated (e.g.
                    aes-256-gcm/encrypted; for profiling: the goal is judged
                    only when the picked suite's encrypted pair is among them)
  --api NAME        the channel's call path: direct, copying or both (default
                    both; the goal is judged on the direct calls)
  --quick           a small run (3 rounds of 20 ms, 16 MiB over TCP, no wait)";

/// Bytes of a payload sealed per `seal_payload` call, as the agent's
/// transport does (`SEAL_CHUNK` in `agent/src/peers/net/conn/write.rs`).
const SEAL_CHUNK: u64 = 256 * 1024;
/// The goal: the channel's own bytes/s per core over the raw AEAD's.
const GOAL: f64 = 0.8;
/// CPU time of the calibration run of each contender.
const CALIBRATE: Duration = Duration::from_millis(30);
const PROTECTIONS: [Protection; 2] = [Protection::Encrypted, Protection::Authenticated];

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("channel: {e}");
            ExitCode::FAILURE
        }
    }
}

struct Opts {
    rounds: usize,
    budget: Duration,
    sizes: Vec<usize>,
    arena: usize,
    tcp_bytes: u64,
    tcp_rounds: usize,
    depth: usize,
    tcp: bool,
    quiet: Duration,
    only: Vec<(Suite, Protection)>,
    apis: Vec<Api>,
}

impl Opts {
    fn parse() -> Result<Opts> {
        let a = Args::parse(std::env::args().skip(1), &["no-tcp", "quick"], USAGE)?;
        let quick = a.flag("quick");
        let o = Opts {
            rounds: a.u64("rounds", if quick { 3 } else { 7 })? as usize,
            budget: Duration::from_millis(a.u64("ms", if quick { 20 } else { 300 })?),
            sizes: a
                .list("sizes", &[110 * 1024, 1024 * 1024])?
                .into_iter()
                .map(|s| s as usize)
                .collect(),
            arena: a.u64("arena-mib", 0)? as usize * 1024 * 1024,
            tcp_bytes: a.u64("tcp-mib", if quick { 16 } else { 512 })? * 1024 * 1024,
            tcp_rounds: a.u64("tcp-rounds", if quick { 1 } else { 3 })? as usize,
            depth: a.u64("depth", 4)? as usize,
            tcp: !a.flag("no-tcp"),
            quiet: Duration::from_secs(a.u64("quiet-s", if quick { 0 } else { 10 })?),
            only: match a.string("only", "").as_str() {
                "" => Suite::ALL
                    .into_iter()
                    .flat_map(|s| PROTECTIONS.map(|p| (s, p)))
                    .collect(),
                list => list
                    .split(',')
                    .map(parse_pair)
                    .collect::<Result<Vec<_>>>()?,
            },
            apis: match a.string("api", "both").as_str() {
                "both" => Api::ALL.to_vec(),
                "direct" => vec![Api::Direct],
                "copying" => vec![Api::Copying],
                x => return Err(format!("--api: {x}: not direct, copying or both").into()),
            },
        };
        if o.rounds == 0 || o.sizes.is_empty() || o.sizes.contains(&0) || o.depth == 0 {
            return Err(format!("--rounds, --sizes and --depth must be positive\n{USAGE}").into());
        }
        if o.sizes.iter().any(|&s| s > 1 << 30) {
            return Err("block sizes above 1 GiB are not frames of the protocol".into());
        }
        Ok(o)
    }
}

/// `suite/protection`, as `--only` takes it.
fn parse_pair(s: &str) -> Result<(Suite, Protection)> {
    let (suite, prot) = s
        .trim()
        .split_once('/')
        .ok_or_else(|| format!("--only: {s}: not suite/protection"))?;
    let suite = Suite::ALL
        .into_iter()
        .find(|x| x.as_str() == suite)
        .ok_or_else(|| format!("--only: unknown suite {suite}"))?;
    let prot = PROTECTIONS
        .into_iter()
        .find(|p| prot_name(*p) == prot)
        .ok_or_else(|| format!("--only: unknown protection {prot}"))?;
    Ok((suite, prot))
}

fn suite_name(s: Suite) -> &'static str {
    s.as_str()
}

fn prot_name(p: Protection) -> &'static str {
    match p {
        Protection::Encrypted => "encrypted",
        Protection::Authenticated => "authenticated",
    }
}

fn size_name(size: usize) -> String {
    if size.is_multiple_of(1024 * 1024) {
        format!("{} MiB", size / (1024 * 1024))
    } else if size.is_multiple_of(1024) {
        format!("{} KiB", size / 1024)
    } else {
        format!("{size} B")
    }
}

/// Bytes every block of the run starts from: not all equal, not compressible
/// by accident.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(granary_base::GAMMA) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

// ---------------------------------------------------------------------------
// Raw AEAD

/// One record sealed and opened in place, as the channel's records are.
struct RawAead {
    key: LessSafeKey,
    suite: Suite,
    protection: Protection,
    buf: Vec<u8>,
    n: u64,
}

impl RawAead {
    fn new(suite: Suite, protection: Protection) -> Result<RawAead> {
        let alg = match suite {
            Suite::Aes256Gcm => &AES_256_GCM,
            Suite::ChaCha20Poly1305 => &CHACHA20_POLY1305,
        };
        let key = UnboundKey::new(alg, &[0x5a; 32]).map_err(|_| "AEAD key")?;
        let mut r = RawAead {
            key: LessSafeKey::new(key),
            suite,
            protection,
            buf: pattern(MAX_RECORD_PLAINTEXT, 3),
            n: 0,
        };
        // Sealed and opened once, it must come back as it was.
        let before = r.buf.clone();
        r.step()?;
        if r.buf != before {
            return Err(format!("raw {suite:?} {protection:?}: opened bytes differ").into());
        }
        Ok(r)
    }

    /// The channel's nonce encoding (Noise's `CipherState`).
    fn nonce(&self) -> Nonce {
        let mut b = [0u8; NONCE_LEN];
        match self.suite {
            Suite::Aes256Gcm => b[4..].copy_from_slice(&self.n.to_be_bytes()),
            Suite::ChaCha20Poly1305 => b[4..].copy_from_slice(&self.n.to_le_bytes()),
        }
        Nonce::assume_unique_for_key(b)
    }

    fn step(&mut self) -> Result<u64> {
        let fail = |_| "raw AEAD failed";
        match self.protection {
            Protection::Encrypted => {
                let tag = self
                    .key
                    .seal_in_place_separate_tag(self.nonce(), Aad::empty(), &mut self.buf)
                    .map_err(fail)?;
                self.key
                    .open_in_place_separate_tag(
                        self.nonce(),
                        Aad::empty(),
                        tag.as_ref(),
                        &mut self.buf,
                    )
                    .map_err(fail)?;
            }
            Protection::Authenticated => {
                let tag = self
                    .key
                    .seal_in_place_separate_tag(self.nonce(), Aad::from(&self.buf[..]), &mut [])
                    .map_err(fail)?;
                self.key
                    .open_in_place_separate_tag(
                        self.nonce(),
                        Aad::from(&self.buf[..]),
                        tag.as_ref(),
                        &mut [],
                    )
                    .map_err(fail)?;
            }
        }
        self.n += 1;
        Ok(self.buf.len() as u64)
    }
}

// ---------------------------------------------------------------------------
// The channel on one thread

fn conn_config(node: &str, suite: Suite, protection: Protection) -> ConnConfig {
    let mut c = ConnConfig::new(
        "bench-channel",
        node,
        [7; 32],
        1,
        b"granary channel benchmark secret, 32+ bytes".to_vec(),
    );
    c.suite = suite;
    c.protection = protection;
    c
}

/// Which calls move a payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Api {
    /// The owner seals with `seal_payload`, its fill closure copying from
    /// the source into a cleared `Vec`; the requester copies `payload()`
    /// into the destination (what `agent/src/peers/net/` calls today).
    Copying,
    /// The owner seals with `seal_payload_into`, encrypting straight from
    /// the source into a reused buffer; the requester opens each payload
    /// record straight into the destination with `payload_into`.
    Direct,
}

impl Api {
    const ALL: [Api; 2] = [Api::Direct, Api::Copying];

    fn name(self) -> &'static str {
        match self {
            Api::Copying => "copying",
            Api::Direct => "direct",
        }
    }

    fn calls(self) -> &'static str {
        match self {
            Api::Copying => "seal_payload + payload(), as the agent calls today",
            Api::Direct => "seal_payload_into + payload_into",
        }
    }
}

/// The block a requester is receiving.
struct Landing {
    api: Api,
    /// Bytes of the current block received so far, while one is landing.
    got: Option<usize>,
    /// The current block's length.
    len: usize,
    /// Blocks wholly received.
    done: u64,
    /// Where the current block lands in the destination arena.
    base: usize,
}

impl Landing {
    fn new(api: Api) -> Landing {
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
fn drain(conn: &mut Conn, landing: &mut Landing, dst: &mut [u8]) -> Result<()> {
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
fn hand_over(
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
fn seal_block(
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
struct ChannelPair {
    requester: Conn,
    owner: Conn,
    api: Api,
    size: usize,
    /// Source and destination arenas: `extents` blocks each.
    src: Vec<u8>,
    dst: Vec<u8>,
    extents: usize,
    /// The owner's reused sealing buffer.
    sealed: Vec<u8>,
    landing: Landing,
    next: u64,
}

impl ChannelPair {
    fn new(
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
    fn step(&mut self, mut log: Option<&mut Vec<(usize, usize)>>) -> Result<u64> {
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
struct Handover {
    pieces: Vec<(usize, usize)>,
    wire: Vec<u8>,
    buf: Vec<u8>,
    size: usize,
}

impl Handover {
    fn new(pair: &mut ChannelPair) -> Result<Handover> {
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

    fn step(&mut self) -> u64 {
        for &(at, n) in &self.pieces {
            self.buf[..n].copy_from_slice(&self.wire[at..at + n]);
        }
        std::hint::black_box(&mut self.buf);
        self.size as u64
    }
}

// ---------------------------------------------------------------------------
// Rounds

enum Work {
    Raw(RawAead),
    Channel(Box<ChannelPair>),
    Handover(Handover),
}

impl Work {
    fn step(&mut self) -> Result<u64> {
        match self {
            Work::Raw(r) => r.step(),
            Work::Channel(c) => c.step(None),
            Work::Handover(h) => Ok(h.step()),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Raw,
    Channel(usize, Api),
    Handover(usize),
}

struct Contender {
    suite: Suite,
    protection: Protection,
    kind: Kind,
    work: Work,
    iters: u64,
    /// CPU nanoseconds per payload byte, one per round.
    ns_per_byte: Vec<f64>,
    /// CPU time over wall time, one per round.
    cpu_share: Vec<f64>,
}

impl Contender {
    fn label(&self) -> String {
        let what = match self.kind {
            Kind::Raw => "raw AEAD".to_owned(),
            Kind::Channel(s, api) => format!("channel {} {}", size_name(s), api.name()),
            // The same copies whatever the suite and protection.
            Kind::Handover(s) => return format!("hand-over copies {}", size_name(s)),
        };
        format!(
            "{} {} {what}",
            suite_name(self.suite),
            prot_name(self.protection)
        )
    }

    /// Runs steps until `CALIBRATE` of CPU time went, and sets the
    /// iterations of a round from it.
    fn calibrate(&mut self, budget: Duration) -> Result<()> {
        let t = sys::own_cpu();
        let mut n = 0u64;
        while sys::own_cpu() - t < CALIBRATE {
            self.work.step()?;
            n += 1;
        }
        let per = (sys::own_cpu() - t).as_secs_f64() / n as f64;
        self.iters = ((budget.as_secs_f64() / per).ceil() as u64).max(1);
        Ok(())
    }

    fn measure(&mut self) -> Result<()> {
        let wall = Instant::now();
        let cpu = sys::own_cpu();
        let mut bytes = 0;
        for _ in 0..self.iters {
            bytes += self.work.step()?;
        }
        let cpu = sys::own_cpu() - cpu;
        let wall = wall.elapsed();
        self.ns_per_byte
            .push(cpu.as_nanos() as f64 / bytes.max(1) as f64);
        self.cpu_share
            .push(cpu.as_secs_f64() / wall.as_secs_f64().max(1e-9));
        Ok(())
    }
}

/// MB/s per core from nanoseconds per byte.
fn mb_s(ns_per_byte: f64) -> f64 {
    1e3 / ns_per_byte
}

// ---------------------------------------------------------------------------
// Loopback TCP

#[derive(Clone, Copy, Debug)]
enum TcpKind {
    Plain,
    Channel(Protection, Api),
}

impl TcpKind {
    fn label(self, suite: Suite) -> String {
        match self {
            TcpKind::Plain => "plain TCP".to_owned(),
            TcpKind::Channel(p, api) => {
                format!("{} {} {}", suite_name(suite), prot_name(p), api.name())
            }
        }
    }

    fn key(self) -> String {
        match self {
            TcpKind::Plain => "plain".to_owned(),
            TcpKind::Channel(p, api) => format!("{}_{}", prot_name(p), api.name()),
        }
    }
}

struct TcpRun {
    /// Payload bytes per CPU second of both threads.
    bytes_per_cpu_s: f64,
    /// Payload bytes per wall second.
    bytes_per_s: f64,
    /// CPU seconds of the owner and of the requester.
    cpu: (f64, f64),
}

fn owner_channel(
    mut stream: TcpStream,
    cfg: ConnConfig,
    api: Api,
    size: usize,
    blocks: u64,
) -> Result<Duration> {
    let src = pattern(size, 11);
    let mut conn = Conn::accept(cfg, [2; 32], 0)?;
    let mut sealed = Vec::new();
    let mut served = 0;
    let mut start = None;
    loop {
        while let Some(t) = conn.poll_transmit() {
            match t {
                Transmit::Bytes(b) => stream.write_all(&b)?,
                Transmit::Payload(h) => seal_block(
                    &mut conn,
                    api,
                    &src[..h.length as usize],
                    &mut sealed,
                    |r| Ok(stream.write_all(r)?),
                )?,
            }
        }
        if served == blocks {
            break;
        }
        let buf = conn.input_buffer();
        let n = stream.read(buf)?;
        conn.input_written(n, 0);
        if n == 0 {
            return Err("owner: the requester hung up".into());
        }
        while let Some(e) = conn.poll_event() {
            match e {
                Event::Established { .. } => start = Some(sys::own_cpu()),
                Event::Request(g) => {
                    conn.send_data(DataHeader {
                        request: g.request,
                        sample: g.sample,
                        length: g.length,
                        crc: 0,
                        store_wait_us: 0,
                    })?;
                    served += 1;
                }
                Event::Credit(_) => {}
                e => return Err(format!("owner: unexpected event {e:?}").into()),
            }
        }
    }
    Ok(sys::own_cpu() - start.ok_or("owner: never established")?)
}

fn requester_channel(
    mut stream: TcpStream,
    cfg: ConnConfig,
    api: Api,
    size: usize,
    blocks: u64,
    depth: usize,
) -> Result<(Duration, Vec<u8>)> {
    let mut conn = Conn::dial(cfg, [1; 32], 0)?;
    let mut dst = vec![0u8; size];
    let mut landing = Landing::new(api);
    let mut asked = 0u64;
    let mut start = None;
    loop {
        while let Some(t) = conn.poll_transmit() {
            let Transmit::Bytes(b) = t else {
                return Err("the requester sends no payload".into());
            };
            stream.write_all(&b)?;
        }
        if landing.done == blocks {
            break;
        }
        let buf = conn.input_buffer();
        let n = stream.read(buf)?;
        conn.input_written(n, 0);
        if n == 0 {
            return Err("requester: the owner hung up".into());
        }
        if start.is_none() && conn.is_established() {
            start = Some(sys::own_cpu());
        }
        drain(&mut conn, &mut landing, &mut dst)?;
        let in_flight = asked - landing.done;
        for _ in in_flight..depth as u64 {
            if asked == blocks || conn.credit() == 0 {
                break;
            }
            conn.send_get(
                Get {
                    request: asked,
                    fingerprint: 1,
                    sample: asked,
                    length: size as u64,
                    due: 1_000_000_000,
                },
                0,
            )?;
            asked += 1;
        }
    }
    Ok((
        sys::own_cpu() - start.ok_or("requester: never established")?,
        dst,
    ))
}

fn owner_plain(mut stream: TcpStream, size: usize, blocks: u64) -> Result<Duration> {
    let src = pattern(size, 11);
    let start = sys::own_cpu();
    let mut get = [0u8; 8];
    for _ in 0..blocks {
        stream.read_exact(&mut get)?;
        stream.write_all(&(size as u64).to_le_bytes())?;
        stream.write_all(&src)?;
    }
    Ok(sys::own_cpu() - start)
}

fn requester_plain(
    mut stream: TcpStream,
    size: usize,
    blocks: u64,
    depth: usize,
) -> Result<(Duration, Vec<u8>)> {
    let start = sys::own_cpu();
    let mut dst = vec![0u8; size];
    let mut asked = 0u64;
    let mut head = [0u8; 8];
    for done in 0..blocks {
        while asked < blocks && asked - done < depth as u64 {
            stream.write_all(&asked.to_le_bytes())?;
            asked += 1;
        }
        stream.read_exact(&mut head)?;
        if u64::from_le_bytes(head) != size as u64 {
            return Err("plain TCP: wrong length".into());
        }
        stream.read_exact(&mut dst)?;
    }
    Ok((sys::own_cpu() - start, dst))
}

fn tcp_run(kind: TcpKind, suite: Suite, size: usize, bytes: u64, depth: usize) -> Result<TcpRun> {
    let blocks = (bytes / size as u64).max(1);
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let owner =
        std::thread::Builder::new()
            .name("owner".into())
            .spawn(move || -> Result<Duration> {
                let (s, _) = listener.accept()?;
                s.set_nodelay(true)?;
                match kind {
                    TcpKind::Plain => owner_plain(s, size, blocks),
                    TcpKind::Channel(p, api) => {
                        owner_channel(s, conn_config("owner", suite, p), api, size, blocks)
                    }
                }
            })?;
    let stream = TcpStream::connect(addr)?;
    stream.set_nodelay(true)?;
    let wall = Instant::now();
    let requested = std::thread::Builder::new()
        .name("requester".into())
        .spawn(move || match kind {
            TcpKind::Plain => requester_plain(stream, size, blocks, depth),
            TcpKind::Channel(p, api) => requester_channel(
                stream,
                conn_config("requester", suite, p),
                api,
                size,
                blocks,
                depth,
            ),
        })?
        .join()
        .map_err(|_| "requester thread panicked")?;
    let wall = wall.elapsed();
    let owner_cpu = owner.join().map_err(|_| "owner thread panicked")??;
    let (requester_cpu, dst) = requested?;
    if dst != pattern(size, 11) {
        return Err(format!("{}: the last block differs", kind.label(suite)).into());
    }
    let total = (blocks * size as u64) as f64;
    let cpu = (owner_cpu.as_secs_f64(), requester_cpu.as_secs_f64());
    Ok(TcpRun {
        bytes_per_cpu_s: total / (cpu.0 + cpu.1),
        bytes_per_s: total / wall.as_secs_f64(),
        cpu,
    })
}

// ---------------------------------------------------------------------------

fn cpu_flags() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let flags: Vec<&str> = info
        .lines()
        .find(|l| l.starts_with("flags") || l.starts_with("Features"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.split_whitespace().collect())
        .unwrap_or_default();
    let want = [
        "aes",
        "pclmulqdq",
        "vaes",
        "vpclmulqdq",
        "avx2",
        "avx512f",
        "pmull",
    ];
    let have: Vec<&str> = want.into_iter().filter(|w| flags.contains(w)).collect();
    if have.is_empty() {
        "none of aes/pclmulqdq/vaes/avx2/avx512f/pmull".to_owned()
    } else {
        have.join(" ")
    }
}

fn run() -> Result<()> {
    let o = Opts::parse()?;
    let picked = Suite::fastest_here();
    println!(
        "channel: CPU {} ({}); Suite::fastest_here() = {}",
        sys::cpu_model(),
        cpu_flags(),
        suite_name(picked)
    );
    if !o.quiet.is_zero() {
        let (waited, quiet) = sys::wait_quiet(o.quiet);
        println!(
            "channel: {} after {:.0} s",
            if quiet {
                "machine quiet (under 0.2 busy cores for 2 s)"
            } else {
                "machine NOT quiet, measuring anyway (thread CPU time)"
            },
            waited.as_secs_f64()
        );
    }
    let regime_before = sys::regime();
    println!("channel: before: {regime_before}");

    // Contenders.
    let mut cs: Vec<Contender> = Vec::new();
    let mut add = |suite, protection, kind, work| {
        cs.push(Contender {
            suite,
            protection,
            kind,
            work,
            iters: 1,
            ns_per_byte: Vec::new(),
            cpu_share: Vec::new(),
        })
    };
    for (i, &(suite, p)) in o.only.iter().enumerate() {
        add(suite, p, Kind::Raw, Work::Raw(RawAead::new(suite, p)?));
        for &size in &o.sizes {
            for (k, &api) in o.apis.iter().enumerate() {
                let mut pair = ChannelPair::new(suite, p, size, o.arena, api)?;
                // The hand-over copies are the same for every suite,
                // protection and call path (the records have the same
                // lengths): measured once per size.
                if i == 0 && k == 0 {
                    add(
                        suite,
                        p,
                        Kind::Handover(size),
                        Work::Handover(Handover::new(&mut pair)?),
                    );
                }
                add(
                    suite,
                    p,
                    Kind::Channel(size, api),
                    Work::Channel(Box::new(pair)),
                );
            }
        }
    }
    for c in &mut cs {
        c.calibrate(o.budget)?;
    }
    println!(
        "channel: {} contenders, {} rounds of about {} ms CPU each, order rotating; every block checked byte for byte before",
        cs.len(),
        o.rounds,
        o.budget.as_millis()
    );
    let t0 = Instant::now();
    for r in 0..o.rounds {
        let n = cs.len();
        for i in 0..n {
            cs[(r + i) % n].measure()?;
        }
        println!(
            "  round {}/{} done at {:.1} s",
            r + 1,
            o.rounds,
            t0.elapsed().as_secs_f64()
        );
    }

    // Figures.
    let find = |suite: Suite, p: Protection, kind: Kind| {
        cs.iter().find(|c| {
            c.kind == kind
                && (matches!(kind, Kind::Handover(_)) || (c.suite == suite && c.protection == p))
        })
    };
    let med = |c: &Contender| median(&c.ns_per_byte);
    println!(
        "\nCPU time per byte, median of {} rounds (MB/s per core, ns per byte; the rounds' range; CPU over wall time):",
        o.rounds
    );
    for c in &cs {
        let m = med(c);
        let lo = c.ns_per_byte.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = c.ns_per_byte.iter().copied().fold(0.0, f64::max);
        println!(
            "  {:<56} {:>8.0} MB/s  {:.4} ns/B  ({:.0}–{:.0}; {:.2})",
            c.label(),
            mb_s(m),
            m,
            mb_s(hi),
            mb_s(lo),
            median(&c.cpu_share)
        );
    }

    /// One call path at every size: the channel's own MB/s per core, with
    /// the hand-over copies, and the ratio to the raw AEAD.
    #[derive(Clone)]
    struct Path {
        own: Vec<f64>,
        with: Vec<f64>,
        ratio: Vec<f64>,
    }
    struct Row {
        suite: Suite,
        protection: Protection,
        raw: f64,
        /// Per call path, in `Api::ALL` order.
        paths: Vec<Path>,
    }
    let mut rows = Vec::new();
    for &(suite, p) in &o.only {
        let raw = med(find(suite, p, Kind::Raw).ok_or("no raw contender")?);
        let mut row = Row {
            suite,
            protection: p,
            raw: mb_s(raw),
            paths: Vec::new(),
        };
        for api in Api::ALL {
            let mut path = Path {
                own: Vec::new(),
                with: Vec::new(),
                ratio: Vec::new(),
            };
            if !o.apis.contains(&api) {
                let nan = vec![f64::NAN; o.sizes.len()];
                row.paths.push(Path {
                    own: nan.clone(),
                    with: nan.clone(),
                    ratio: nan,
                });
                continue;
            }
            for &size in &o.sizes {
                let ch = find(suite, p, Kind::Channel(size, api)).ok_or("no channel contender")?;
                let ho = find(suite, p, Kind::Handover(size)).ok_or("no hand-over contender")?;
                // Paired by round: the channel's own time per byte.
                let own: Vec<f64> = ch
                    .ns_per_byte
                    .iter()
                    .zip(&ho.ns_per_byte)
                    .map(|(c, h)| c - h)
                    .collect();
                let own = median(&own);
                path.own.push(mb_s(own));
                path.with.push(mb_s(med(ch)));
                path.ratio.push(raw / own);
            }
            row.paths.push(path);
        }
        rows.push(row);
    }

    for (k, api) in Api::ALL.into_iter().enumerate() {
        if !o.apis.contains(&api) {
            continue;
        }
        println!(
            "\nThe channel's own MB/s per core (hand-over copies taken out), {} calls ({}), against the raw AEAD's:",
            api.name(),
            api.calls()
        );
        let mut head = format!("  {:<18} {:<14} {:>9}", "suite", "protection", "raw AEAD");
        for &s in &o.sizes {
            head.push_str(&format!(
                " {:>16} {:>6} {:>15}",
                format!("channel {}", size_name(s)),
                "ratio",
                "with hand-over"
            ));
        }
        println!("{head}");
        for r in &rows {
            let path = &r.paths[k];
            let mut line = format!(
                "  {:<18} {:<14} {:>9.0}",
                suite_name(r.suite),
                prot_name(r.protection),
                r.raw
            );
            for i in 0..o.sizes.len() {
                line.push_str(&format!(
                    " {:>16.0} {:>6.3} {:>15.0}",
                    path.own[i], path.ratio[i], path.with[i]
                ));
            }
            if r.suite == picked && r.protection == Protection::Encrypted && api == Api::Direct {
                line.push_str("   <- goal");
            }
            println!("{line}");
        }
    }

    let raw_of = |s: Suite| {
        rows.iter()
            .find(|r| r.suite == s && r.protection == Protection::Encrypted)
            .map_or(f64::NAN, |r| r.raw)
    };
    let measured: Vec<Suite> = Suite::ALL
        .into_iter()
        .filter(|s| !raw_of(*s).is_nan())
        .collect();
    let fastest = measured
        .iter()
        .copied()
        .max_by(|a, b| raw_of(*a).total_cmp(&raw_of(*b)));
    let pick_verdict = match fastest {
        _ if measured.len() < 2 => "not compared (one suite measured)",
        Some(f) if f == picked => "yes",
        _ => "NO",
    };
    println!(
        "\nSuite::fastest_here() picks {}; the faster raw AEAD (encrypted) measured here: {} ({}): the pick is the faster one: {pick_verdict}",
        suite_name(picked),
        fastest.map_or("?", suite_name),
        measured
            .iter()
            .map(|s| format!("{} {:.0} MB/s", suite_name(*s), raw_of(*s)))
            .collect::<Vec<_>>()
            .join(", "),
    );
    let nan_path = Path {
        own: vec![f64::NAN; o.sizes.len()],
        with: vec![f64::NAN; o.sizes.len()],
        ratio: vec![f64::NAN; o.sizes.len()],
    };
    let goal_row = rows
        .iter()
        .find(|r| r.suite == picked && r.protection == Protection::Encrypted);
    let goal_raw = goal_row.map_or(f64::NAN, |r| r.raw);
    let path_of = |api: Api| {
        let k = Api::ALL.iter().position(|a| *a == api).unwrap_or(0);
        goal_row.map_or(nan_path.clone(), |r| r.paths[k].clone())
    };
    let direct = path_of(Api::Direct);
    let copying = path_of(Api::Copying);
    let lowest = |p: &Path| {
        if p.ratio.iter().any(|r| r.is_nan()) {
            f64::NAN
        } else {
            p.ratio.iter().copied().fold(f64::INFINITY, f64::min)
        }
    };
    let ratio = lowest(&direct);
    let met = Goal::at_least("goal", GOAL).verdict(ratio);
    let copying_lowest = lowest(&copying);
    let met_copying = Goal::at_least("goal_copying", GOAL).verdict(copying_lowest);
    let show = |p: &Path| {
        p.own
            .iter()
            .zip(&p.ratio)
            .zip(&o.sizes)
            .map(|((v, r), s)| format!("{v:.0} MB/s ({}, ratio {r:.3})", size_name(*s)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!(
        "result: {} encrypted, raw AEAD {goal_raw:.0} MB/s per core; channel, direct calls: {}: lowest ratio {ratio:.3} (goal ≥ {GOAL}: {met}); copying calls (the agent's today): {}: lowest {copying_lowest:.3} ({met_copying})",
        suite_name(picked),
        show(&direct),
        show(&copying),
    );

    // Loopback TCP.
    let mut tcp_json = Json::default();
    if o.tcp {
        println!(
            "\nLoopback TCP, owner and requester threads, {} MiB per run, {} in flight, {} rounds (MB per CPU second of both threads; MB/s wall):",
            o.tcp_bytes / (1024 * 1024),
            o.depth,
            o.tcp_rounds
        );
        let kinds: Vec<TcpKind> = [
            TcpKind::Plain,
            TcpKind::Channel(Protection::Encrypted, Api::Direct),
            TcpKind::Channel(Protection::Encrypted, Api::Copying),
            TcpKind::Channel(Protection::Authenticated, Api::Direct),
        ]
        .into_iter()
        .filter(|k| match k {
            TcpKind::Plain => true,
            TcpKind::Channel(_, api) => o.apis.contains(api),
        })
        .collect();
        for &size in &o.sizes {
            let mut per: Vec<Vec<TcpRun>> = kinds.iter().map(|_| Vec::new()).collect();
            for r in 0..o.tcp_rounds {
                for i in 0..kinds.len() {
                    let k = (r + i) % kinds.len();
                    per[k].push(tcp_run(kinds[k], picked, size, o.tcp_bytes, o.depth)?);
                }
            }
            let mut plain_cpu = f64::NAN;
            for (k, runs) in kinds.iter().zip(&per) {
                let of = |f: fn(&TcpRun) -> f64| median(&runs.iter().map(f).collect::<Vec<_>>());
                let cpu_rate = of(|r| r.bytes_per_cpu_s);
                let wall_rate = of(|r| r.bytes_per_s);
                if matches!(k, TcpKind::Plain) {
                    plain_cpu = cpu_rate;
                }
                println!(
                    "  {:<8} {:<40} {:>7.0} MB/s per core {:>7.0} MB/s wall  (CPU owner {:.2} s, requester {:.2} s; {:.2} × plain TCP per core)",
                    size_name(size),
                    k.label(picked),
                    cpu_rate / 1e6,
                    wall_rate / 1e6,
                    of(|r| r.cpu.0),
                    of(|r| r.cpu.1),
                    cpu_rate / plain_cpu
                );
                tcp_json
                    .num(
                        &format!("{}_{size}_mb_s_per_core", k.key()),
                        cpu_rate / 1e6,
                        0,
                    )
                    .num(&format!("{}_{size}_mb_s_wall", k.key()), wall_rate / 1e6, 0);
            }
        }
    }
    let regime_after = sys::regime();
    println!("channel: after: {regime_after}");

    let mut all = Json::default();
    for r in &rows {
        let mut j = Json::default();
        j.num("raw_mb_s", r.raw, 0);
        for (api, p) in Api::ALL.iter().zip(&r.paths) {
            let n = api.name();
            j.nums(&format!("{n}_mb_s"), &p.own, 0)
                .nums(&format!("{n}_with_handover_mb_s"), &p.with, 0)
                .nums(&format!("{n}_ratio"), &p.ratio, 3);
        }
        all.raw(
            &format!("{}/{}", suite_name(r.suite), prot_name(r.protection)),
            &j.line(),
        );
    }
    let sizes: Vec<f64> = o.sizes.iter().map(|&s| s as f64).collect();
    let mut j = Json::bench("channel");
    j.str("suite", suite_name(picked))
        .num("raw_mb_s", goal_raw, 0)
        .nums("channel_mb_s", &direct.own, 0)
        .num("ratio", ratio, 3)
        .str("goal", met)
        .nums("ratios", &direct.ratio, 3)
        .nums("copying_mb_s", &copying.own, 0)
        .nums("copying_ratios", &copying.ratio, 3)
        .str("goal_copying", met_copying)
        .nums("sizes", &sizes, 0)
        .str("fastest_measured", fastest.map_or("?", suite_name))
        .str("pick_is_fastest", pick_verdict)
        .raw("all", &all.line())
        .raw("tcp", &tcp_json.line())
        .int("rounds", o.rounds as u64)
        .int("ms_per_round", o.budget.as_millis() as u64)
        .int("arena_bytes", o.arena as u64)
        .str("cpu", &sys::cpu_model())
        .str("cpu_flags", &cpu_flags())
        .str("regime_before", &regime_before)
        .str("regime_after", &regime_after);
    println!("{}", j.line());
    Ok(())
}

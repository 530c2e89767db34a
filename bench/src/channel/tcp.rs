//! The same blocks over a loopback TCP connection, owner and requester on
//! two threads: the channel, or plain TCP (the extent written, read
//! straight into the destination).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use granary_peer::channel::{Protection, Suite};
use granary_peer::conn::{Conn, ConnConfig, Event, Transmit};
use granary_peer::frame::{DataHeader, Get};

use super::pair::{drain, seal_block, Landing};
use super::scenario::size_name;
use super::scenario::{conn_config, pattern, prot_name, suite_name, Api};
use super::{Config, Result};
use crate::report::{median, Json};
use crate::sys;

#[derive(Clone, Copy, Debug)]
pub enum TcpKind {
    Plain,
    Channel(Protection, Api),
}

impl TcpKind {
    pub fn label(self, suite: Suite) -> String {
        match self {
            TcpKind::Plain => "plain TCP".to_owned(),
            TcpKind::Channel(p, api) => {
                format!("{} {} {}", suite_name(suite), prot_name(p), api.name())
            }
        }
    }

    pub fn key(self) -> String {
        match self {
            TcpKind::Plain => "plain".to_owned(),
            TcpKind::Channel(p, api) => format!("{}_{}", prot_name(p), api.name()),
        }
    }
}

pub struct TcpRun {
    /// Payload bytes per CPU second of both threads.
    pub bytes_per_cpu_s: f64,
    /// Payload bytes per wall second.
    pub bytes_per_s: f64,
    /// CPU seconds of the owner and of the requester.
    pub cpu: (f64, f64),
}

pub fn owner_channel(
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
        receive(&mut conn, &mut stream, "owner: the requester hung up")?;
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

/// Reads what `stream` has into `conn`'s input; the error `hung_up` when
/// the peer closed the connection.
fn receive(conn: &mut Conn, stream: &mut TcpStream, hung_up: &str) -> Result<()> {
    let n = stream.read(conn.input_buffer())?;
    conn.input_written(n, 0);
    if n == 0 {
        return Err(hung_up.into());
    }
    Ok(())
}

pub fn requester_channel(
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
        receive(&mut conn, &mut stream, "requester: the owner hung up")?;
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

pub fn owner_plain(mut stream: TcpStream, size: usize, blocks: u64) -> Result<Duration> {
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

pub fn requester_plain(
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

pub fn tcp_run(
    kind: TcpKind,
    suite: Suite,
    size: usize,
    bytes: u64,
    depth: usize,
) -> Result<TcpRun> {
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

/// The loopback TCP runs at every size, printed; their figures as the
/// result line's `tcp` object.
pub fn runs(o: &Config, picked: Suite) -> Result<Json> {
    let mut tcp_json = Json::default();
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
    Ok(tcp_json)
}

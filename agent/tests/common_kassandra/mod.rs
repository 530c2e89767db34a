//! A CQL v4 server written independently of Granary and of the `scylla`
//! driver: the [`kassandra`](https://crates.io/crates/kassandra) crate's
//! in-memory emulator (its own parser, planner and storage), served on a
//! free loopback port by a thin wrapper (this module) on a thread of its
//! own. It is an emulator, not ScyllaDB or Cassandra.
//!
//! The wrapper does what the crate's own node binary does — read frames,
//! answer `OPTIONS`, `STARTUP` and `REGISTER` itself, hand `QUERY`,
//! `PREPARE`, `EXECUTE` and `BATCH` to one `KassandraSession` behind a
//! mutex — plus three fixes, each for something the emulator does not do
//! as a cluster would:
//!
//! * its `system.local` row carries the token `"hello"`, not a Murmur3
//!   token: set to `'0'` at start (one node owning the ring);
//! * a schema change is answered `Void` instead of `SCHEMA_CHANGE`, so the
//!   driver does not await schema agreement, whose reads of `system_schema`
//!   (`WHERE keyspace_name IN ?`) the emulator cannot prepare (it finds no
//!   bind marker in `IN ?`);
//! * Granary's schema check (`SELECT … FROM system_schema.columns WHERE
//!   keyspace_name = 'ks'`) gets no row from the emulator, though a scan
//!   of the table shows them: the wrapper answers it from that scan.
#![allow(dead_code)]

use futures_util::{SinkExt, StreamExt};
use granary_testkit::worker::Worker;
use kassandra::cql::value::CqlValue;
use kassandra::frame::request::query::Query;
use kassandra::frame::request::Request;
use kassandra::frame::response::result::QueryResult;
use kassandra::frame::response::{error::Error, Response};
use kassandra::frame::{request_stream, response_sink};
use kassandra::KassandraSession;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// A running emulator; stopped on drop.
pub struct Kassandra {
    /// Where it listens (127.0.0.1, a free port).
    pub addr: SocketAddr,
    requests: Arc<AtomicU64>,
    _thread: Worker,
}

impl Kassandra {
    /// Starts an empty emulator.
    pub fn start() -> Kassandra {
        let mut session = KassandraSession::new();
        let fix = "INSERT INTO system.local (key, tokens) VALUES ('local', ['0'])";
        session
            .process(Query::simple(fix).expect("the token fix parses"))
            .expect("the token fix runs");

        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(AtomicU64::new(0));
        let r = requests.clone();
        let thread = Worker::spawn("kassandra", move |s| serve(listener, session, s, r));
        Kassandra {
            addr,
            requests,
            _thread: thread,
        }
    }

    /// Requests answered so far.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }
}

fn serve(
    listener: std::net::TcpListener,
    session: KassandraSession,
    stop: Arc<AtomicBool>,
    requests: Arc<AtomicU64>,
) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let local = tokio::task::LocalSet::new();
    let session = Arc::new(Mutex::new(session));
    local.block_on(&rt, async move {
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        while !stop.load(Ordering::SeqCst) {
            let accepted =
                tokio::time::timeout(std::time::Duration::from_millis(100), listener.accept())
                    .await;
            let Ok(Ok((stream, _))) = accepted else {
                continue;
            };
            let (session, requests) = (session.clone(), requests.clone());
            tokio::task::spawn_local(client(stream, session, requests));
        }
    });
}

async fn client(
    mut stream: tokio::net::TcpStream,
    session: Arc<Mutex<KassandraSession>>,
    requests: Arc<AtomicU64>,
) {
    let (mut read, mut write) = stream.split();
    let mut frames = request_stream(&mut read);
    let mut sink = response_sink(&mut write);
    while let Some(Ok((frame, opcode, data))) = frames.next().await {
        requests.fetch_add(1, Ordering::Relaxed);
        let response = if frame.version.is_unsupported() {
            Response::unsupported_version()
        } else {
            match Request::deserialize(opcode, &data, frame.flags) {
                Ok(req) => answer(&session, req),
                Err(e) => Response::Error(e),
            }
        };
        if sink.send((response, frame.stream)).await.is_err() {
            break;
        }
    }
}

/// The keyspace of Granary's schema check (`SELECT table_name,
/// column_name, kind, type FROM system_schema.columns WHERE keyspace_name =
/// 'ks'`), which the emulator answers with no rows: a `WHERE` on the
/// partition key of `system_schema.columns` finds nothing there, though the
/// rows exist.
fn schema_columns_of(query: &str) -> Option<&str> {
    let rest = query.strip_prefix(
        "SELECT table_name, column_name, kind, type FROM system_schema.columns WHERE keyspace_name = '",
    )?;
    rest.strip_suffix('\'')
}

/// The schema check's answer, from a scan of `system_schema.columns`
/// (which the emulator serves) filtered to `ks`.
fn columns_of_keyspace(k: &mut KassandraSession, ks: &str) -> Result<QueryResult, Error> {
    let scan =
        "SELECT keyspace_name, table_name, column_name, kind, type FROM system_schema.columns";
    let QueryResult::Rows(mut rows) = k.process(Query::simple(scan)?)? else {
        return Err(Error::new(
            kassandra::error::DbError::ServerError,
            "system_schema.columns: no rows result",
        ));
    };
    let want = Some(CqlValue::Text(ks.to_owned()));
    rows.rows.retain(|r| r.columns.first() == Some(&want));
    for r in &mut rows.rows {
        r.columns.remove(0);
    }
    rows.metadata.col_specs.remove(0);
    Ok(QueryResult::Rows(rows))
}

fn answer(session: &Mutex<KassandraSession>, req: Request<'_>) -> Response {
    let result = |r: Result<QueryResult, Error>| match r {
        // One node is always in agreement with itself: a schema change is
        // answered as done, so the driver does not wait for agreement
        // (which reads system_schema with `IN ?` filters the emulator
        // cannot prepare).
        Ok(QueryResult::SchemaChange(_)) => Response::Result(QueryResult::Void),
        Ok(res) => Response::Result(res),
        Err(e) => Response::Error(e),
    };
    let mut k = session.lock().unwrap();
    match req {
        Request::StartUp(_) | Request::Register { .. } => Response::Ready,
        Request::Options => Response::options(),
        Request::Query(q) => match schema_columns_of(q.raw_query) {
            Some(ks) => result(columns_of_keyspace(&mut k, ks)),
            None => result(k.process(q)),
        },
        Request::Prepare(q) => result(k.prepare(q)),
        Request::Execute(e) => result(k.execute(e)),
        Request::Batch(b) => result(k.process_batch(b)),
        Request::AuthResponse => Response::Error(Error::new(
            kassandra::error::DbError::ProtocolError,
            "no authentication here",
        )),
    }
}

//! Test support for the CQL suites: a fake cluster made of `scylla-proxy`
//! nodes in dry mode (no database behind them) whose rules answer the
//! driver with forged CQL v4 frames, and the frame-forging helpers.
//!
//! What a node answers:
//!
//! * `OPTIONS` → `SUPPORTED` (no ScyllaDB sharding options: one shard);
//!   `STARTUP` → `READY`, or `AUTHENTICATE` when the cluster has a password,
//!   then `AUTH_RESPONSE` → `AUTH_SUCCESS` for the right PLAIN credentials
//!   and an authentication error for others; `REGISTER` → `READY`.
//! * The topology queries: `system.local` (this node: host id, address,
//!   `dc1`/`r1`, its one token) and `system.peers` (the other nodes).
//! * The schema queries of the driver's minimal schema fetch:
//!   `system_schema.keyspaces` (the keyspace, SimpleStrategy RF 1),
//!   `system_schema.scylla_tables`, `.tables`, `.views`,
//!   `.scylla_keyspaces` (no rows).
//! * Granary's schema check (`system_schema.columns`), the paged metadata
//!   scan (`SELECT id, label, size FROM ks.metadata`, pages honoured with a
//!   4-byte offset as paging state), `PREPARE` of the read (bound `id
//!   uuid` is partition key 0, result `data blob`) and `EXECUTE` (a row with
//!   the blob, or no row).
//! * Anything else: a `SERVER_ERROR` naming it, and it is recorded in
//!   [`FakeCluster::unexpected`], so a driver change shows up as a clear
//!   failure.
//!
//! Every node of a cluster listens on the same free port of its own
//! loopback address (`127.x.y.z`, from `scylla_proxy`'s allocator), since
//! the driver connects to peers on the contact point's port.

use bytes::{BufMut, Bytes, BytesMut};
use granary_agent::source::cql::CqlSettings;
use scylla_proxy::{
    Condition, Node, Proxy, Reaction, RequestFrame, RequestOpcode, RequestReaction, RequestRule,
    ResponseFrame, ResponseOpcode, RunningProxy,
};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use uuid::Uuid;

/// Keyspace of the fake dataset.
pub const KS: &str = "ds";

/// A CQL column type, as written in result metadata.
#[derive(Debug, Clone)]
pub enum Ty {
    BigInt,
    Blob,
    Boolean,
    Int,
    Uuid,
    Text,
    Inet,
    List(Box<Ty>),
    Set(Box<Ty>),
    Map(Box<Ty>, Box<Ty>),
}

impl Ty {
    fn put(&self, b: &mut BytesMut) {
        match self {
            Ty::BigInt => b.put_u16(0x0002),
            Ty::Blob => b.put_u16(0x0003),
            Ty::Boolean => b.put_u16(0x0004),
            Ty::Int => b.put_u16(0x0009),
            Ty::Uuid => b.put_u16(0x000C),
            Ty::Text => b.put_u16(0x000D),
            Ty::Inet => b.put_u16(0x0010),
            Ty::List(e) => {
                b.put_u16(0x0020);
                e.put(b);
            }
            Ty::Set(e) => {
                b.put_u16(0x0022);
                e.put(b);
            }
            Ty::Map(k, v) => {
                b.put_u16(0x0021);
                k.put(b);
                v.put(b);
            }
        }
    }
}

/// A cell value, serialized; `None` is null.
pub type Cell = Option<Vec<u8>>;

pub fn text(s: &str) -> Cell {
    Some(s.as_bytes().to_vec())
}
pub fn int(v: i32) -> Cell {
    Some(v.to_be_bytes().to_vec())
}
pub fn bigint(v: i64) -> Cell {
    Some(v.to_be_bytes().to_vec())
}
pub fn uuid(u: Uuid) -> Cell {
    Some(u.as_bytes().to_vec())
}
pub fn boolean(v: bool) -> Cell {
    Some(vec![u8::from(v)])
}
pub fn inet(ip: IpAddr) -> Cell {
    Some(match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    })
}
pub fn blob(b: &[u8]) -> Cell {
    Some(b.to_vec())
}
/// A `set<text>` (or `list<text>`) value.
pub fn text_set(items: &[&str]) -> Cell {
    let mut b = BytesMut::new();
    b.put_i32(items.len() as i32);
    for i in items {
        b.put_i32(i.len() as i32);
        b.put_slice(i.as_bytes());
    }
    Some(b.to_vec())
}
/// A `map<text, text>` value.
pub fn text_map(items: &[(&str, &str)]) -> Cell {
    let mut b = BytesMut::new();
    b.put_i32(items.len() as i32);
    for (k, v) in items {
        b.put_i32(k.len() as i32);
        b.put_slice(k.as_bytes());
        b.put_i32(v.len() as i32);
        b.put_slice(v.as_bytes());
    }
    Some(b.to_vec())
}

fn put_string(b: &mut BytesMut, s: &str) {
    b.put_u16(s.len() as u16);
    b.put_slice(s.as_bytes());
}

fn put_cell(b: &mut BytesMut, c: &Cell) {
    match c {
        None => b.put_i32(-1),
        Some(v) => {
            b.put_i32(v.len() as i32);
            b.put_slice(v);
        }
    }
}

/// Result metadata: global table spec, columns, optional paging state.
fn put_metadata(b: &mut BytesMut, table: (&str, &str), cols: &[(&str, Ty)], paging: Option<&[u8]>) {
    let mut flags = 0x0001;
    if paging.is_some() {
        flags |= 0x0002;
    }
    b.put_i32(flags);
    b.put_i32(cols.len() as i32);
    if let Some(p) = paging {
        b.put_i32(p.len() as i32);
        b.put_slice(p);
    }
    put_string(b, table.0);
    put_string(b, table.1);
    for (name, ty) in cols {
        put_string(b, name);
        ty.put(b);
    }
}

/// A `RESULT` of kind Rows answering `req`.
pub fn rows_frame(
    req: &RequestFrame,
    table: (&str, &str),
    cols: &[(&str, Ty)],
    rows: &[Vec<Cell>],
    paging: Option<&[u8]>,
) -> ResponseFrame {
    let mut b = BytesMut::new();
    b.put_i32(0x0002);
    put_metadata(&mut b, table, cols, paging);
    b.put_i32(rows.len() as i32);
    for r in rows {
        assert_eq!(r.len(), cols.len(), "row width");
        for c in r {
            put_cell(&mut b, c);
        }
    }
    ResponseFrame::new(
        req.params.for_response(),
        ResponseOpcode::Result,
        b.freeze(),
    )
}

/// A `RESULT` of kind Void.
pub fn void_frame(req: &RequestFrame) -> ResponseFrame {
    ResponseFrame::new(
        req.params.for_response(),
        ResponseOpcode::Result,
        Bytes::from_static(&[0, 0, 0, 1]),
    )
}

/// A `RESULT` of kind Prepared: `bind` are the bound columns, of which
/// `pk` are the partition key (by position), `result` the returned ones.
pub fn prepared_frame(
    req: &RequestFrame,
    id: &[u8],
    table: (&str, &str),
    bind: &[(&str, Ty)],
    pk: &[u16],
    result: &[(&str, Ty)],
) -> ResponseFrame {
    let mut b = BytesMut::new();
    b.put_i32(0x0004);
    b.put_u16(id.len() as u16);
    b.put_slice(id);
    b.put_i32(0x0001);
    b.put_i32(bind.len() as i32);
    b.put_i32(pk.len() as i32);
    for i in pk {
        b.put_u16(*i);
    }
    put_string(&mut b, table.0);
    put_string(&mut b, table.1);
    for (name, ty) in bind {
        put_string(&mut b, name);
        ty.put(&mut b);
    }
    put_metadata(&mut b, table, result, None);
    ResponseFrame::new(
        req.params.for_response(),
        ResponseOpcode::Result,
        b.freeze(),
    )
}

/// An `ERROR` frame.
pub fn error_frame(req: &RequestFrame, err: scylla::errors::DbError, msg: &str) -> ResponseFrame {
    ResponseFrame::forged_error(req.params, err, Some(msg)).expect("error frame")
}

fn read_u16(b: &[u8], at: &mut usize) -> u16 {
    let v = u16::from_be_bytes([b[*at], b[*at + 1]]);
    *at += 2;
    v
}

fn read_i32(b: &[u8], at: &mut usize) -> i32 {
    let v = i32::from_be_bytes(b[*at..*at + 4].try_into().unwrap());
    *at += 4;
    v
}

fn read_value(b: &[u8], at: &mut usize) -> Cell {
    let n = read_i32(b, at);
    if n < 0 {
        return None;
    }
    let v = b[*at..*at + n as usize].to_vec();
    *at += n as usize;
    Some(v)
}

/// The statement text of a `QUERY` or `PREPARE` body.
pub fn statement_text(req: &RequestFrame) -> String {
    let b = &req.body;
    let n = i32::from_be_bytes(b[0..4].try_into().unwrap()) as usize;
    String::from_utf8_lossy(&b[4..4 + n]).into_owned()
}

/// Query parameters of a `QUERY` (after its text) or an `EXECUTE` (after
/// its id): bound values, page size, paging state.
#[derive(Debug, Default)]
pub struct Params {
    pub values: Vec<Cell>,
    pub page_size: Option<i32>,
    pub paging_state: Option<Vec<u8>>,
}

fn read_params(b: &[u8], mut at: usize) -> Params {
    let _consistency = read_u16(b, &mut at);
    let flags = b[at];
    at += 1;
    let mut p = Params::default();
    if flags & 0x01 != 0 {
        let n = read_u16(b, &mut at);
        for _ in 0..n {
            if flags & 0x40 != 0 {
                let l = read_u16(b, &mut at) as usize;
                at += l;
            }
            p.values.push(read_value(b, &mut at));
        }
    }
    if flags & 0x04 != 0 {
        p.page_size = Some(read_i32(b, &mut at));
    }
    if flags & 0x08 != 0 {
        p.paging_state = read_value(b, &mut at);
    }
    p
}

/// The parameters of a `QUERY`.
pub fn query_params(req: &RequestFrame) -> Params {
    let n = i32::from_be_bytes(req.body[0..4].try_into().unwrap()) as usize;
    read_params(&req.body, 4 + n)
}

/// The statement id and parameters of an `EXECUTE`.
pub fn execute_params(req: &RequestFrame) -> (Vec<u8>, Params) {
    let b = &req.body;
    let n = u16::from_be_bytes([b[0], b[1]]) as usize;
    (b[2..2 + n].to_vec(), read_params(b, 2 + n))
}

/// One sample of the fake dataset.
#[derive(Debug, Clone)]
pub struct Sample {
    pub id: Uuid,
    pub label: i32,
    /// What the metadata table says.
    pub size: i64,
    /// The data row's blob (`None`: no data row).
    pub data: Option<Vec<u8>>,
    /// Whether the metadata table has a row for it.
    pub listed: bool,
    /// The metadata row's `crc` (`None`: null).
    pub crc: Option<i32>,
}

/// The fake dataset's tables.
#[derive(Debug, Clone)]
pub struct Tables {
    pub data_table: String,
    pub metadata_table: String,
    /// Type of the metadata table's `size` column; `None`: no such column.
    pub size_type: Option<&'static str>,
    /// Type of the metadata table's `crc` column; `None`: no such column.
    pub crc_type: Option<&'static str>,
    pub samples: Vec<Sample>,
}

impl Tables {
    /// No sample: what `granary ingest` starts from.
    pub fn empty() -> Tables {
        let mut t = Tables::generated(0, 1);
        t.samples.clear();
        t
    }

    /// The sample with id `id`, added (unlisted, no data) if missing.
    fn sample_mut(&mut self, id: Uuid) -> &mut Sample {
        match self.samples.iter().position(|s| s.id == id) {
            Some(i) => &mut self.samples[i],
            None => {
                self.samples.push(Sample {
                    id,
                    label: 0,
                    size: 0,
                    data: None,
                    listed: false,
                    crc: None,
                });
                self.samples.last_mut().unwrap()
            }
        }
    }

    /// `n` samples with deterministic ids, labels `i % classes` and contents
    /// (sizes 1 to ~3000 bytes), in tables `data` and `metadata`.
    pub fn generated(n: usize, classes: i32) -> Tables {
        let samples = (0..n)
            .map(|i| {
                let id = Uuid::new_v5(&Uuid::NAMESPACE_OID, format!("sample-{i}").as_bytes());
                let len = 1 + (id.as_bytes()[0] as usize * 11 + i) % 3000;
                let data: Vec<u8> = (0..len)
                    .map(|j| (j as u8).wrapping_mul(31) ^ id.as_bytes()[j % 16])
                    .collect();
                Sample {
                    id,
                    label: i as i32 % classes,
                    size: len as i64,
                    crc: Some(i32::from_ne_bytes(crc32c::crc32c(&data).to_ne_bytes())),
                    data: Some(data),
                    listed: true,
                }
            })
            .collect();
        Tables {
            data_table: "data".into(),
            metadata_table: "metadata".into(),
            size_type: Some("int"),
            crc_type: None,
            samples,
        }
    }
}

/// Credentials a fake cluster demands.
#[derive(Debug, Clone)]
pub struct Credentials {
    pub user: String,
    pub password: String,
}

/// What every node shares.
pub struct Shared {
    pub tables: Mutex<Tables>,
    pub credentials: Option<Credentials>,
    pub nodes: Vec<(IpAddr, Uuid, i64)>,
    /// Requests no rule knew, as `opcode: statement`.
    pub unexpected: Mutex<Vec<String>>,
    /// EXECUTEs of the read received, per node: the bound ids.
    pub reads: Mutex<Vec<Vec<Uuid>>>,
}

/// A running fake cluster.
pub struct FakeCluster {
    pub runtime: tokio::runtime::Runtime,
    proxy: Option<RunningProxy>,
    pub addrs: Vec<SocketAddr>,
    pub shared: Arc<Shared>,
}

impl FakeCluster {
    /// One node serving `tables`.
    pub fn start(tables: Tables) -> FakeCluster {
        FakeCluster::start_with(tables, 1, None)
    }

    /// `nodes` nodes serving `tables`, each owning one token of an evenly
    /// split ring, with password authentication when `credentials` is set.
    pub fn start_with(
        tables: Tables,
        nodes: usize,
        credentials: Option<Credentials>,
    ) -> FakeCluster {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let ips: Vec<IpAddr> = (0..nodes)
            .map(|_| scylla_proxy::get_exclusive_local_address())
            .collect();
        let port = {
            let l = std::net::TcpListener::bind((ips[0], 0)).expect("bind a loopback port");
            l.local_addr().unwrap().port()
        };
        let step = (u64::MAX / nodes as u64) as i64;
        let node_info: Vec<(IpAddr, Uuid, i64)> = ips
            .iter()
            .enumerate()
            .map(|(i, ip)| {
                let host_id =
                    Uuid::from_u128(0x6772_616e_6172_7900_0000_0000_0000_0000 + i as u128);
                // Node i owns the tokens up to and including its own.
                let token = i64::MIN.wrapping_add(step.wrapping_mul(i as i64 + 1));
                (*ip, host_id, token)
            })
            .collect();
        let shared = Arc::new(Shared {
            tables: Mutex::new(tables),
            credentials,
            nodes: node_info,
            unexpected: Mutex::new(Vec::new()),
            reads: Mutex::new(vec![Vec::new(); nodes]),
        });
        let addrs: Vec<SocketAddr> = ips.iter().map(|ip| SocketAddr::new(*ip, port)).collect();
        let proxy_nodes: Vec<Node> = addrs
            .iter()
            .enumerate()
            .map(|(i, a)| Node::new_dry_mode(*a, Some(node_rules(&shared, i))))
            .collect();
        let proxy = runtime
            .block_on(Proxy::new(proxy_nodes).run())
            .expect("start the fake cluster");
        FakeCluster {
            runtime,
            proxy: Some(proxy),
            addrs,
            shared,
        }
    }

    /// Settings pointing at the first node, for keyspace [`KS`] and the
    /// cluster's table names, with a short timeout and fast retries.
    pub fn settings(&self) -> CqlSettings {
        let mut s = CqlSettings::new(vec![self.addrs[0].to_string()], KS);
        let t = self.shared.tables.lock().unwrap();
        s.data_table = t.data_table.clone();
        s.metadata_table = t.metadata_table.clone();
        s.request_timeout = std::time::Duration::from_secs(5);
        s.retries = 4;
        s
    }

    /// Puts `rules` in front of node `node`'s rules.
    pub fn prepend_rules(&mut self, node: usize, rules: Vec<RequestRule>) {
        self.proxy.as_mut().unwrap().running_nodes[node].prepend_request_rules(rules);
    }

    /// Requests no rule knew.
    pub fn unexpected(&self) -> Vec<String> {
        self.shared.unexpected.lock().unwrap().clone()
    }

    /// EXECUTEs of the read received by each node.
    pub fn reads(&self) -> Vec<Vec<Uuid>> {
        self.shared.reads.lock().unwrap().clone()
    }

    /// The number of EXECUTEs of the read received, all nodes together.
    pub fn read_count(&self) -> usize {
        self.reads().iter().map(Vec::len).sum()
    }
}

impl Drop for FakeCluster {
    fn drop(&mut self) {
        if let Some(p) = self.proxy.take() {
            let _ = self.runtime.block_on(p.finish());
        }
    }
}

/// A rule answering requests that match `cond` with `f`.
pub fn forge(
    cond: Condition,
    f: impl Fn(RequestFrame) -> ResponseFrame + Send + Sync + 'static,
) -> RequestRule {
    RequestRule(cond, RequestReaction::forge_response(Arc::new(f)))
}

/// The same, answering after `delay`.
pub fn forge_after(
    delay: std::time::Duration,
    cond: Condition,
    f: impl Fn(RequestFrame) -> ResponseFrame + Send + Sync + 'static,
) -> RequestRule {
    RequestRule(
        cond,
        RequestReaction::forge_response_with_delay(delay, Arc::new(f)),
    )
}

/// Requests with opcode `op`.
pub fn op(op: RequestOpcode) -> Condition {
    Condition::RequestOpcode(op)
}

/// Requests whose body contains `s`.
pub fn body_has(s: &[u8]) -> Condition {
    Condition::BodyContainsCaseSensitive(s.to_vec().into_boxed_slice())
}

/// Queries whose text contains `s`.
pub fn query_has(s: &str) -> Condition {
    op(RequestOpcode::Query).and(body_has(s.as_bytes()))
}

/// EXECUTEs of the read binding `id`.
pub fn read_of(id: Uuid) -> Condition {
    op(RequestOpcode::Execute).and(body_has(id.as_bytes()))
}

/// The bound id of an EXECUTE of the read.
fn bound_id(p: &Params) -> Option<Uuid> {
    p.values
        .first()
        .and_then(|v| v.as_deref())
        .and_then(|b| Uuid::from_slice(b).ok())
}

/// The read's answer for `req` (an EXECUTE) from `shared`'s tables: the
/// row's blob, or no row.
pub fn read_answer(shared: &Shared, req: &RequestFrame) -> ResponseFrame {
    let (_, p) = execute_params(req);
    let t = shared.tables.lock().unwrap();
    let rows = read_rows(&t, &p);
    let table = t.data_table.clone();
    drop(t);
    rows_frame(req, (KS, &table), &[("data", Ty::Blob)], &rows, None)
}

fn read_rows(t: &Tables, p: &Params) -> Vec<Vec<Cell>> {
    let id = bound_id(p).unwrap_or_default();
    t.samples
        .iter()
        .filter(|s| s.id == id)
        .filter_map(|s| s.data.as_ref().map(|d| vec![blob(d)]))
        .collect()
}

type Cols = Vec<(&'static str, Ty)>;
type TableOf = Box<dyn Fn(&Tables) -> (String, String) + Send + Sync>;
type Answer =
    Box<dyn Fn(&Shared, usize, &Params) -> (Vec<Vec<Cell>>, Option<Vec<u8>>) + Send + Sync>;

/// A statement the fake nodes know, found by a piece of its text.
struct Stmt {
    key: &'static str,
    table: TableOf,
    bind: Cols,
    pk: Vec<u16>,
    result: Box<dyn Fn(&str) -> Cols + Send + Sync>,
    answer: Answer,
    /// Answered with a Void result (writes, schema changes).
    void: bool,
}

fn node_cols(local: bool) -> Cols {
    let mut c = vec![
        ("host_id", Ty::Uuid),
        ("rpc_address", Ty::Inet),
        ("data_center", Ty::Text),
        ("rack", Ty::Text),
        ("tokens", Ty::Set(Box::new(Ty::Text))),
    ];
    if local {
        c.push(("cluster_name", Ty::Text));
    }
    c
}

fn node_row(n: &(IpAddr, Uuid, i64), local: bool) -> Vec<Cell> {
    let token = n.2.to_string();
    let mut r = vec![
        uuid(n.1),
        inet(n.0),
        text("dc1"),
        text("r1"),
        text_set(&[&token]),
    ];
    if local {
        r.push(text("fake"));
    }
    r
}

fn fixed(ks: &'static str, t: &'static str) -> TableOf {
    Box::new(move |_| (ks.to_owned(), t.to_owned()))
}

fn cols(c: Cols) -> Box<dyn Fn(&str) -> Cols + Send + Sync> {
    Box::new(move |_| c.clone())
}

fn no_rows() -> Answer {
    Box::new(|_, _, _| (Vec::new(), None))
}

/// The bound values of a schema read for some keyspaces.
fn ks_in() -> Cols {
    vec![("keyspace_name", Ty::List(Box::new(Ty::Text)))]
}

/// A read of `system_schema.TABLE` (its statement containing `key`) for some
/// keyspaces, with text columns `columns`, answered with no rows.
fn no_rows_of_keyspace(key: &'static str, table: &'static str, columns: &[&'static str]) -> Stmt {
    Stmt {
        key,
        table: fixed("system_schema", table),
        bind: ks_in(),
        pk: vec![],
        result: cols(columns.iter().map(|&c| (c, Ty::Text)).collect()),
        answer: no_rows(),
        void: false,
    }
}

/// Every statement the fake nodes answer, in matching order.
fn statements() -> Vec<Stmt> {
    vec![
        Stmt {
            key: "FROM system.peers",
            table: fixed("system", "peers"),
            bind: vec![],
            pk: vec![],
            result: cols(node_cols(false)),
            answer: Box::new(|sh, me, _| {
                let rows = sh
                    .nodes
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| *i != me)
                    .map(|(_, n)| node_row(n, false))
                    .collect();
                (rows, None)
            }),
            void: false,
        },
        Stmt {
            key: "FROM system.local",
            table: fixed("system", "local"),
            bind: vec![],
            pk: vec![],
            result: cols(node_cols(true)),
            answer: Box::new(|sh, me, _| (vec![node_row(&sh.nodes[me], true)], None)),
            void: false,
        },
        Stmt {
            key: "FROM system_schema.keyspaces",
            table: fixed("system_schema", "keyspaces"),
            bind: ks_in(),
            pk: vec![],
            result: cols(vec![
                ("keyspace_name", Ty::Text),
                (
                    "replication",
                    Ty::Map(Box::new(Ty::Text), Box::new(Ty::Text)),
                ),
                ("durable_writes", Ty::Boolean),
            ]),
            answer: Box::new(|_, _, _| {
                let row = vec![
                    text(KS),
                    text_map(&[
                        ("class", "org.apache.cassandra.locator.SimpleStrategy"),
                        ("replication_factor", "1"),
                    ]),
                    boolean(true),
                ];
                (vec![row], None)
            }),
            void: false,
        },
        no_rows_of_keyspace(
            "FROM system_schema.scylla_tables",
            "scylla_tables",
            &["keyspace_name", "table_name", "partitioner"],
        ),
        no_rows_of_keyspace(
            "FROM system_schema.tables",
            "tables",
            &["keyspace_name", "table_name"],
        ),
        no_rows_of_keyspace(
            "FROM system_schema.views",
            "views",
            &["keyspace_name", "view_name", "base_table_name"],
        ),
        Stmt {
            key: "FROM system_schema.scylla_keyspaces",
            table: fixed("system_schema", "scylla_keyspaces"),
            bind: ks_in(),
            pk: vec![],
            result: Box::new(|text_of| {
                let mut c = vec![("keyspace_name", Ty::Text), ("initial_tablets", Ty::Int)];
                if text_of.contains("consistency") {
                    c.push(("consistency", Ty::Text));
                }
                c
            }),
            answer: no_rows(),
            void: false,
        },
        // Granary's schema check.
        Stmt {
            key: "FROM system_schema.columns",
            table: fixed("system_schema", "columns"),
            bind: vec![],
            pk: vec![],
            result: cols(vec![
                ("table_name", Ty::Text),
                ("column_name", Ty::Text),
                ("kind", Ty::Text),
                ("type", Ty::Text),
            ]),
            answer: Box::new(|sh, _, _| {
                let t = sh.tables.lock().unwrap();
                let col = |table: &str, name: &str, kind: &str, ty: &str| {
                    vec![text(table), text(name), text(kind), text(ty)]
                };
                let mut rows = vec![
                    col(&t.data_table, "id", "partition_key", "uuid"),
                    col(&t.data_table, "label", "regular", "int"),
                    col(&t.data_table, "data", "regular", "blob"),
                    col(&t.metadata_table, "id", "partition_key", "uuid"),
                    col(&t.metadata_table, "label", "regular", "int"),
                ];
                if let Some(ty) = t.size_type {
                    rows.push(col(&t.metadata_table, "size", "regular", ty));
                }
                if let Some(ty) = t.crc_type {
                    rows.push(col(&t.metadata_table, "crc", "regular", ty));
                }
                (rows, None)
            }),
            void: false,
        },
        // The metadata scan, paged: the paging state is the next row's
        // offset; with or without the `crc` column.
        metadata_scan(false),
        metadata_scan(true),
        // The read.
        Stmt {
            key: "SELECT data FROM",
            table: Box::new(|t| (KS.to_owned(), t.data_table.clone())),
            bind: vec![("id", Ty::Uuid)],
            pk: vec![0],
            result: cols(vec![("data", Ty::Blob)]),
            answer: Box::new(|sh, me, p| {
                if let Some(u) = bound_id(p) {
                    sh.reads.lock().unwrap()[me].push(u);
                }
                let t = sh.tables.lock().unwrap();
                (read_rows(&t, p), None)
            }),
            void: false,
        },
        // What `granary ingest` sends. Schema changes are answered as when
        // everything exists already (Void), so the driver has no schema
        // agreement to wait for.
        Stmt {
            key: "CREATE ",
            table: fixed(KS, ""),
            bind: vec![],
            pk: vec![],
            result: cols(vec![]),
            answer: no_rows(),
            void: true,
        },
        Stmt {
            key: "(id, label, data) VALUES",
            table: Box::new(|t| (KS.to_owned(), t.data_table.clone())),
            bind: vec![("id", Ty::Uuid), ("label", Ty::Int), ("data", Ty::Blob)],
            pk: vec![0],
            result: cols(vec![]),
            answer: Box::new(|sh, _, p| {
                let id = bound_id(p).expect("id bound");
                let mut t = sh.tables.lock().unwrap();
                let s = t.sample_mut(id);
                s.data = p.values[2].clone();
                (Vec::new(), None)
            }),
            void: true,
        },
        Stmt {
            key: "ALTER TABLE ",
            table: fixed(KS, ""),
            bind: vec![],
            pk: vec![],
            result: cols(vec![]),
            answer: Box::new(|sh, _, _| {
                sh.tables.lock().unwrap().crc_type = Some("int");
                (Vec::new(), None)
            }),
            void: true,
        },
        Stmt {
            key: "(id, label, size, crc) VALUES",
            table: Box::new(|t| (KS.to_owned(), t.metadata_table.clone())),
            bind: vec![
                ("id", Ty::Uuid),
                ("label", Ty::Int),
                ("size", Ty::Int),
                ("crc", Ty::Int),
            ],
            pk: vec![0],
            result: cols(vec![]),
            answer: Box::new(|sh, _, p| {
                let id = bound_id(p).expect("id bound");
                let int_of =
                    |v: &Cell| i32::from_be_bytes(v.as_deref().unwrap().try_into().unwrap());
                let mut t = sh.tables.lock().unwrap();
                let s = t.sample_mut(id);
                s.label = int_of(&p.values[1]);
                s.size = i64::from(int_of(&p.values[2]));
                s.crc = Some(int_of(&p.values[3]));
                s.listed = true;
                (Vec::new(), None)
            }),
            void: true,
        },
    ]
}

/// The metadata scan; `crc`: the one that reads the `crc` column too.
fn metadata_scan(crc: bool) -> Stmt {
    Stmt {
        key: if crc {
            "SELECT id, label, size, crc FROM"
        } else {
            "SELECT id, label, size FROM"
        },
        table: Box::new(|t| (KS.to_owned(), t.metadata_table.clone())),
        bind: vec![],
        pk: vec![],
        result: Box::new(move |text_of| {
            let big = text_of.contains("bigint");
            let mut c = vec![
                ("id", Ty::Uuid),
                ("label", Ty::Int),
                ("size", if big { Ty::BigInt } else { Ty::Int }),
            ];
            if crc {
                c.push(("crc", Ty::Int));
            }
            c
        }),
        answer: Box::new(move |sh, _, p| {
            let t = sh.tables.lock().unwrap();
            let from = p
                .paging_state
                .as_deref()
                .map(|s| u32::from_be_bytes(s.try_into().unwrap()) as usize)
                .unwrap_or(0);
            let page = p.page_size.filter(|&n| n > 0).unwrap_or(i32::MAX) as usize;
            let listed: Vec<&Sample> = t.samples.iter().filter(|s| s.listed).collect();
            let to = from.saturating_add(page).min(listed.len());
            let big = t.size_type == Some("bigint");
            let rows = listed[from..to]
                .iter()
                .map(|s| {
                    let size = if big {
                        bigint(s.size)
                    } else {
                        int(s.size as i32)
                    };
                    let mut row = vec![uuid(s.id), int(s.label), size];
                    if crc {
                        row.push(s.crc.and_then(int));
                    }
                    row
                })
                .collect();
            let next = (to < listed.len()).then(|| (to as u32).to_be_bytes().to_vec());
            (rows, next)
        }),
        void: false,
    }
}

/// The statement id handed out for statement `i` of [`statements`].
fn stmt_id(i: usize) -> Vec<u8> {
    format!("stmt-{i:04}").into_bytes()
}

fn stmt_of_id(id: &[u8]) -> Option<usize> {
    std::str::from_utf8(id)
        .ok()?
        .strip_prefix("stmt-")?
        .parse()
        .ok()
}

/// The metadata-scan result columns depend on the table's size type, which
/// the statement text does not say: a text to feed `result` with.
fn result_hint(stmt: &Stmt, text_of: &str, t: &Tables) -> String {
    if stmt.key.starts_with("SELECT id, label, size") && t.size_type == Some("bigint") {
        format!("{text_of} bigint")
    } else {
        text_of.to_owned()
    }
}

fn answer(
    sh: &Shared,
    stmts: &[Stmt],
    me: usize,
    i: usize,
    text_of: &str,
    req: &RequestFrame,
    p: &Params,
) -> ResponseFrame {
    let st = &stmts[i];
    let (table, result) = {
        let t = sh.tables.lock().unwrap();
        ((st.table)(&t), (st.result)(&result_hint(st, text_of, &t)))
    };
    let (rows, paging) = (st.answer)(sh, me, p);
    if st.void {
        return void_frame(req);
    }
    rows_frame(req, (&table.0, &table.1), &result, &rows, paging.as_deref())
}

fn unexpected(sh: &Shared, req: &RequestFrame, what: String) -> ResponseFrame {
    sh.unexpected
        .lock()
        .unwrap()
        .push(format!("{:?}: {what}", req.opcode));
    error_frame(
        req,
        scylla::errors::DbError::ServerError,
        "not forged by the test",
    )
}

fn node_rules(shared: &Arc<Shared>, me: usize) -> Vec<RequestRule> {
    let stmts = Arc::new(statements());
    let texts: Arc<Mutex<HashMap<usize, String>>> = Arc::new(Mutex::new(HashMap::new()));
    let find = |stmts: &[Stmt], text_of: &str| stmts.iter().position(|s| text_of.contains(s.key));
    let mut rules = Vec::new();
    rules.push(forge(op(RequestOpcode::Options), |req| {
        let mut options = HashMap::new();
        options.insert("CQL_VERSION".to_owned(), vec!["3.4.5".to_owned()]);
        options.insert("COMPRESSION".to_owned(), vec![]);
        ResponseFrame::forged_supported(req.params, &options).unwrap()
    }));
    let sh = shared.clone();
    rules.push(forge(op(RequestOpcode::Startup), move |req| {
        if sh.credentials.is_some() {
            let mut b = BytesMut::new();
            put_string(&mut b, "org.apache.cassandra.auth.PasswordAuthenticator");
            ResponseFrame::new(
                req.params.for_response(),
                ResponseOpcode::Authenticate,
                b.freeze(),
            )
        } else {
            ResponseFrame::forged_ready(req.params)
        }
    }));
    let sh = shared.clone();
    rules.push(forge(op(RequestOpcode::AuthResponse), move |req| {
        let c = sh.credentials.as_ref().expect("credentials");
        let mut want = vec![0u8];
        want.extend_from_slice(c.user.as_bytes());
        want.push(0);
        want.extend_from_slice(c.password.as_bytes());
        let mut at = 0;
        let token = read_value(&req.body, &mut at).unwrap_or_default();
        if token == want {
            ResponseFrame::new(
                req.params.for_response(),
                ResponseOpcode::AuthSuccess,
                Bytes::from_static(&[0xff, 0xff, 0xff, 0xff]),
            )
        } else {
            error_frame(
                &req,
                scylla::errors::DbError::AuthenticationError,
                "Username and/or password are incorrect",
            )
        }
    }));
    rules.push(forge(op(RequestOpcode::Register), |req| {
        ResponseFrame::forged_ready(req.params)
    }));
    let (sh, st, tx) = (shared.clone(), stmts.clone(), texts.clone());
    rules.push(forge(op(RequestOpcode::Prepare), move |req| {
        let text_of = statement_text(&req);
        let Some(i) = find(&st, &text_of) else {
            return unexpected(&sh, &req, text_of);
        };
        tx.lock().unwrap().insert(i, text_of.clone());
        let s = &st[i];
        let (table, result) = {
            let t = sh.tables.lock().unwrap();
            ((s.table)(&t), (s.result)(&result_hint(s, &text_of, &t)))
        };
        prepared_frame(
            &req,
            &stmt_id(i),
            (&table.0, &table.1),
            &s.bind,
            &s.pk,
            &result,
        )
    }));
    let (sh, st, tx) = (shared.clone(), stmts.clone(), texts.clone());
    rules.push(forge(op(RequestOpcode::Execute), move |req| {
        let (id, p) = execute_params(&req);
        // A node that never saw the PREPARE (another node did) still knows
        // the statement by its id.
        let known = stmt_of_id(&id).filter(|&i| i < st.len()).map(|i| {
            let text_of = tx.lock().unwrap().get(&i).cloned();
            (i, text_of.unwrap_or_else(|| st[i].key.to_owned()))
        });
        match known {
            Some((i, text_of)) => answer(&sh, &st, me, i, &text_of, &req, &p),
            None => {
                sh.unexpected.lock().unwrap().push(format!(
                    "EXECUTE of unknown id {}",
                    String::from_utf8_lossy(&id)
                ));
                error_frame(
                    &req,
                    scylla::errors::DbError::Unprepared {
                        statement_id: id.into(),
                    },
                    "unknown id",
                )
            }
        }
    }));
    let (sh, st) = (shared.clone(), stmts.clone());
    rules.push(forge(op(RequestOpcode::Query), move |req| {
        let text_of = statement_text(&req);
        match find(&st, &text_of) {
            Some(i) => answer(&sh, &st, me, i, &text_of, &req, &query_params(&req)),
            None => unexpected(&sh, &req, text_of),
        }
    }));
    let sh = shared.clone();
    rules.push(forge(Condition::True, move |req| {
        unexpected(&sh, &req, String::new())
    }));
    rules
}

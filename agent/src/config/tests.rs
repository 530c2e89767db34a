//! Unit tests of the configuration: parsing, errors and rules.
use super::*;
use serde::Deserialize;
use std::time::Duration;

const MINIMAL: &str = "[[dataset]]\nname = \"d\"\nroot = \"/data\"\n";

fn fs(cfg: &Config, i: usize) -> &FsConfig {
    match &cfg.datasets[i] {
        DatasetConfig::Fs(d) => d,
        other => panic!("dataset {i} is not fs: {other:?}"),
    }
}

fn s3(cfg: &Config, i: usize) -> &S3Config {
    match &cfg.datasets[i] {
        DatasetConfig::S3(d) => d,
        other => panic!("dataset {i} is not s3: {other:?}"),
    }
}

fn cql(cfg: &Config, i: usize) -> &CqlConfig {
    match &cfg.datasets[i] {
        DatasetConfig::Cql(d) => d,
        other => panic!("dataset {i} is not cql: {other:?}"),
    }
}

fn parse_err(s: &str) -> ConfigError {
    Config::from_toml_str(s).expect_err("config should be rejected")
}

fn invalid_fields(s: &str) -> Vec<String> {
    parse_err(s)
        .problems()
        .iter()
        .map(|p| p.field.clone())
        .collect()
}

#[test]
fn default_toml_parses_validates_and_matches_defaults() {
    let mut cfg = Config::from_toml_str(Config::default_toml()).unwrap();
    let example = std::mem::take(&mut cfg.datasets);
    assert_eq!(cfg, Config::default());
    assert_eq!(
        example,
        [DatasetConfig::Fs(FsConfig {
            name: "imagenet".to_owned(),
            order: DeliveryOrder::Strict,
            retry: RetryOverride::default(),
            prepare: None,
            root: Some("/var/lib/granary/datasets/imagenet/train".into()),
            manifest: None,
            direct_io: None,
            format: ShardFormat::Files,
            label_field: None,
            sample_field: None,
            wids_index: None,
        })]
    );
}

#[test]
fn documented_default_file_matches() {
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/configuration.md"
    ))
    .unwrap();
    let block = doc
        .split("## The default file")
        .nth(1)
        .and_then(|s| s.split("```toml\n").nth(1))
        .and_then(|s| s.split("```").next())
        .expect("docs/configuration.md has a default file block");
    assert_eq!(block, Config::default_toml());
}

#[test]
fn minimal_config_gets_defaults() {
    let cfg = Config::from_toml_str(MINIMAL).unwrap();
    assert_eq!(cfg.arena.size, ByteSize(4 << 30));
    assert_eq!(cfg.arena.hugepages, HugePages::Try);
    assert!(cfg.arena.populate);
    assert_eq!(cfg.socket.path, Path::new("/run/granary/granary.sock"));
    assert_eq!(cfg.socket.mode, FileMode(0o660));
    assert_eq!(cfg.cache.policy, CachePolicy::Clairvoyant);
    assert_eq!(
        cfg.metrics.socket_addr(),
        Some("127.0.0.1:9464".parse().unwrap())
    );
    assert_eq!(cfg.datasets[0].kind(), SourceKind::Fs);
    assert_eq!(cfg.dataset("d").unwrap().order(), DeliveryOrder::Strict);
    assert_eq!(fs(&cfg, 0).root.as_deref(), Some(Path::new("/data")));
}

#[test]
fn sizes_parse() {
    let ok = |s: &str| ByteSize::parse(s).unwrap().bytes();
    assert_eq!(ok("2GiB"), 2 << 30);
    assert_eq!(ok("512MiB"), 512 << 20);
    assert_eq!(ok("512 mib"), 512 << 20);
    assert_eq!(ok("1.5G"), 3 << 29);
    assert_eq!(ok("4k"), 4096);
    assert_eq!(ok("1GB"), 1_000_000_000);
    assert_eq!(ok("123"), 123);
    assert_eq!(ok("7B"), 7);
    for bad in [
        "",
        "GiB",
        "1.2.3G",
        "2XB",
        "-1G",
        "0.3B",
        "99999999999TiB",
        "1.5",
    ] {
        assert!(ByteSize::parse(bad).is_err(), "{bad:?} should not parse");
    }
    assert_eq!(ByteSize(2 << 30).to_string(), "2 GiB");
    assert_eq!(ByteSize(1000).to_string(), "1000 B");
}

#[test]
fn size_accepts_integer_and_string() {
    let cfg = Config::from_toml_str(&format!("[arena]\nsize = 268435456\n{MINIMAL}")).unwrap();
    assert_eq!(cfg.arena.size.bytes(), 256 << 20);
    let cfg = Config::from_toml_str(&format!("[arena]\nsize = \"256MiB\"\n{MINIMAL}")).unwrap();
    assert_eq!(cfg.arena.size.bytes(), 256 << 20);
}

#[test]
fn bad_size_names_field_and_line() {
    let e = parse_err(&format!(
        "[arena]\nhugepages = \"off\"\nsize = \"2XB\"\n{MINIMAL}"
    ));
    match &e {
        ConfigError::Parse { field, line, .. } => {
            assert_eq!(field.as_deref(), Some("arena.size"));
            assert_eq!(*line, Some(3));
        }
        other => panic!("unexpected {other:?}"),
    }
    let msg = e.to_string();
    assert!(msg.contains("arena.size"), "{msg}");
    assert!(msg.contains("line 3"), "{msg}");
    assert!(msg.contains("2XB"), "{msg}");
    let e = parse_err(&format!("[arena]\nsize = -5\n{MINIMAL}"));
    assert_eq!(e.field(), Some("arena.size"));
}

#[test]
fn modes_parse() {
    let mode = |v: &str| {
        Config::from_toml_str(&format!("[socket]\nmode = {v}\n{MINIMAL}"))
            .map(|c| c.socket.mode.bits())
    };
    assert_eq!(mode("\"0660\"").unwrap(), 0o660);
    assert_eq!(mode("\"600\"").unwrap(), 0o600);
    assert_eq!(mode("\"0o666\"").unwrap(), 0o666);
    assert_eq!(mode("0o640").unwrap(), 0o640);
    assert_eq!(mode("432").unwrap(), 0o660);
    for bad in ["660", "\"0x1a\"", "\"0680\"", "\"\"", "\"7777\"", "-1"] {
        let e = mode(bad).expect_err(bad);
        assert_eq!(e.field(), Some("socket.mode"), "{bad}: {e}");
    }
    // Owner must be able to connect.
    assert_eq!(mode("\"0060\"").unwrap_err().field(), Some("socket.mode"));
}

#[test]
fn unknown_fields_are_rejected_with_position() {
    let e = parse_err(&format!("[prefetch]\nwindow_batchez = 4\n{MINIMAL}"));
    let msg = e.to_string();
    assert!(msg.contains("window_batchez"), "{msg}");
    assert!(msg.contains("line 2"), "{msg}");
    assert_eq!(e.field(), Some("prefetch.window_batchez"));
    let e = parse_err(&format!("[prefetc]\nwindow_batches = 4\n{MINIMAL}"));
    assert!(e.to_string().contains("prefetc"), "{e}");
    let e = parse_err(
        "[[dataset]]\nname = \"a\"\nroot = \"/a\"\n[[dataset]]\nname = \"b\"\nrot = \"/b\"\n",
    );
    assert_eq!(e.field(), Some("dataset[1].rot"));
}

#[test]
fn wrong_types_and_enum_values() {
    let e = parse_err(&format!("[prefetch]\nwindow_batches = \"many\"\n{MINIMAL}"));
    assert_eq!(e.field(), Some("prefetch.window_batches"));
    assert!(e.to_string().contains("line 2"), "{e}");
    let e = parse_err(&format!("[cache]\npolicy = \"fifo\"\n{MINIMAL}"));
    assert_eq!(e.field(), Some("cache.policy"));
    assert!(e.to_string().contains("fifo"), "{e}");
    let e = parse_err(&format!("[arena]\nhugepages = \"sometimes\"\n{MINIMAL}"));
    assert_eq!(e.field(), Some("arena.hugepages"));
    let cfg = Config::from_toml_str(&format!("[arena]\nhugepages = \"on\"\n{MINIMAL}")).unwrap();
    assert_eq!(cfg.arena.hugepages, HugePages::Try);
    let e = parse_err("[[dataset]]\nroot = \"/a\"\n");
    assert_eq!(e.field(), Some("dataset[0].name"));
    assert!(e.to_string().contains("missing field `name`"), "{e}");
    let e = parse_err("[[dataset]]\nname = \"a\"\nkind = \"nfs\"\nroot = \"/a\"\n");
    assert_eq!(e.field(), Some("dataset[0].kind"));
}

#[test]
fn syntax_errors_keep_line_and_column() {
    let e = parse_err("[arena\nsize = 1\n");
    match e {
        ConfigError::Parse { line, column, .. } => {
            assert_eq!(line, Some(1));
            assert!(column.is_some());
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn relations_are_validated() {
    let f = invalid_fields(&format!(
        "[prefetch]\ninitial_window = 32\nwindow_batches = 16\n{MINIMAL}"
    ));
    assert_eq!(f, ["prefetch.initial_window"]);
    let f = invalid_fields(&format!(
        "[prefetch]\nread_timeout_ms = 5000\n[sessions]\nclient_timeout_ms = 5000\nheartbeat_ms = 6000\n{MINIMAL}"
    ));
    assert_eq!(
        f,
        [
            "prefetch.read_timeout_ms",
            "prefetch.sample_deadline_ms",
            "sessions.heartbeat_ms"
        ]
    );
    let f = invalid_fields(&format!(
        "[sessions]\nready_ring_capacity = 48\nrelease_ring_capacity = 1\n{MINIMAL}"
    ));
    assert_eq!(
        f,
        [
            "sessions.ready_ring_capacity",
            "sessions.release_ring_capacity"
        ]
    );
    let f = invalid_fields(&format!(
        "[prefetch]\nmax_inflight_reads = 0\nwindow_batches = 0\n{MINIMAL}"
    ));
    assert_eq!(
        f,
        [
            "prefetch.window_batches",
            "prefetch.max_inflight_reads",
            "prefetch.initial_window"
        ]
    );
    let f = invalid_fields(&format!("[sessions]\nmax_sessions = 0\n{MINIMAL}"));
    assert_eq!(f, ["sessions.max_sessions"]);
    for bad in [0, 101] {
        let f = invalid_fields(&format!(
            "[sessions]\nmax_pinned_percent = {bad}\n{MINIMAL}"
        ));
        assert_eq!(f, ["sessions.max_pinned_percent"]);
    }
    for good in [1, 100] {
        let cfg = Config::from_toml_str(&format!(
            "[sessions]\nmax_pinned_percent = {good}\n{MINIMAL}"
        ))
        .unwrap();
        assert_eq!(cfg.sessions.max_pinned_percent, good);
    }
}

#[test]
fn arena_rules() {
    let f = invalid_fields(&format!("[arena]\nsize = \"32MiB\"\n{MINIMAL}"));
    assert_eq!(f, ["arena.size"]);
    let f = invalid_fields(&format!("[arena]\nsize = 300000000\n{MINIMAL}"));
    assert_eq!(f, ["arena.size"]);
    let e = parse_err(&format!(
        "[arena]\nsize = \"256MiB\"\n[prefetch]\nmax_inflight_reads = 512\n{MINIMAL}"
    ));
    assert_eq!(e.field(), Some("arena.size"));
    assert!(e.to_string().contains("max_inflight_reads"), "{e}");
    Config::from_toml_str(&format!(
        "[arena]\nsize = \"512MiB\"\n[prefetch]\nmax_inflight_reads = 512\n{MINIMAL}"
    ))
    .unwrap();
}

#[test]
fn socket_rules() {
    let long = "/x".repeat(60);
    let f = invalid_fields(&format!("[socket]\npath = \"{long}\"\n{MINIMAL}"));
    assert_eq!(f, ["socket.path"]);
    let f = invalid_fields(&format!(
        "[socket]\nmode = \"0600\"\nallowed_gids = [100]\n{MINIMAL}"
    ));
    assert_eq!(f, ["socket.mode"]);
    let cfg = Config::from_toml_str(&format!(
        "[socket]\nallowed_uids = [1001]\nallowed_gids = [100]\n{MINIMAL}"
    ))
    .unwrap();
    assert!(cfg.socket.allows(1000, 1000, 1000));
    assert!(cfg.socket.allows(1000, 1001, 5));
    assert!(cfg.socket.allows(1000, 7, 100));
    assert!(!cfg.socket.allows(1000, 7, 5));
    assert!(!SocketConfig::default().allows(1000, 0, 0));
}

#[test]
fn metrics_address() {
    let cfg = Config::from_toml_str(&format!("[metrics]\naddress = \"\"\n{MINIMAL}")).unwrap();
    assert_eq!(cfg.metrics.socket_addr(), None);
    let cfg =
        Config::from_toml_str(&format!("[metrics]\naddress = \"[::1]:9000\"\n{MINIMAL}")).unwrap();
    assert_eq!(cfg.metrics.socket_addr().unwrap().port(), 9000);
    let f = invalid_fields(&format!("[metrics]\naddress = \"localhost\"\n{MINIMAL}"));
    assert_eq!(f, ["metrics.address"]);
}

#[test]
fn dataset_rules() {
    assert_eq!(invalid_fields(""), ["dataset"]);
    let two = |a: &str, b: &str| {
        invalid_fields(&format!(
            "[[dataset]]\nname = \"{a}\"\nroot = \"/a\"\n[[dataset]]\nname = \"{b}\"\nroot = \"/b\"\n"
        ))
    };
    assert_eq!(two("x", "x"), ["dataset[1].name"]);
    assert_eq!(two("", "y"), ["dataset[0].name"]);
    assert_eq!(two("x", &"n".repeat(256)), ["dataset[1].name"]);
    assert_eq!(two("x", "tab\\there"), ["dataset[1].name"]);
    assert!(Config::from_toml_str(&format!(
        "[[dataset]]\nname = \"{}\"\nroot = \"/a\"\n",
        "n".repeat(255)
    ))
    .is_ok());
    let f = invalid_fields("[[dataset]]\nname = \"a\"\n");
    assert_eq!(f, ["dataset[0].root"]);
    let f = invalid_fields("[[dataset]]\nname = \"a\"\nroot = \"/a\"\nmanifest = \"/m\"\n");
    assert_eq!(f, ["dataset[0].manifest"]);
    let cfg = Config::from_toml_str("[[dataset]]\nname = \"a\"\nmanifest = \"/m.tsv\"\n").unwrap();
    assert_eq!(
        fs(&cfg, 0).location(),
        Some(DatasetLocation::Manifest(Path::new("/m.tsv")))
    );
}

#[test]
fn s3_dataset_rules() {
    const S3: &str = "[[dataset]]\nname = \"s\"\nkind = \"s3\"\n";
    let cfg = Config::from_toml_str(&format!("{S3}bucket = \"b\"\nprefix = \"\"\n")).unwrap();
    assert_eq!(cfg.datasets[0].kind(), SourceKind::S3);
    assert_eq!(s3(&cfg, 0).prefix.as_deref(), Some(""));
    assert!(s3(&cfg, 0).path_style);
    assert_eq!(s3(&cfg, 0).retries, 8);
    // A required key missing is named, with the line of its table.
    let e = parse_err(&format!("{MINIMAL}{S3}prefix = \"\"\n"));
    assert_eq!(e.field(), Some("dataset[1].bucket"));
    assert!(e.to_string().contains("line 4"), "{e}");
    assert_eq!(
        invalid_fields(&format!("{S3}bucket = \"b\"\n")),
        ["dataset[0].prefix"]
    );
    let f = invalid_fields(&format!(
        "{S3}bucket = \"b\"\nprefix = \"p\"\nmanifest = \"m.tsv\"\n"
    ));
    assert_eq!(f, ["dataset[0].manifest"]);
    let f = invalid_fields(&format!(
        "{S3}bucket = \"a/b\"\nprefix = \"p\"\nendpoint = \"http://127.0.0.1:8333\"\n"
    ));
    assert_eq!(f, ["dataset[0].bucket", "dataset[0].allow_http"]);
    Config::from_toml_str(&format!(
        "{S3}bucket = \"b\"\nprefix = \"p\"\nendpoint = \"http://127.0.0.1:8333\"\nallow_http = true\n"
    ))
    .unwrap();
    let f = invalid_fields(&format!(
        "{S3}bucket = \"b\"\nmanifest = \"k\"\nendpoint = \"s3.example.com\"\naccess_key_id = \"k\"\n"
    ));
    assert_eq!(f, ["dataset[0].endpoint", "dataset[0].secret_access_key"]);
    let f = invalid_fields(&format!(
        "{S3}bucket = \"b\"\nprefix = \"p\"\nrequest_timeout_ms = 60000\nretries = 1000\nmax_inflight = 0\n"
    ));
    assert_eq!(
        f,
        [
            "dataset[0].request_timeout_ms",
            "dataset[0].retries",
            "dataset[0].max_inflight"
        ]
    );
    let cfg = Config::from_toml_str(&format!(
        "{S3}bucket = \"b\"\nprefix = \"p\"\nmax_inflight = 1024\norder = \"relaxed\"\n"
    ))
    .unwrap();
    assert_eq!(s3(&cfg, 0).max_inflight, Some(1024));
    assert_eq!(cfg.datasets[0].order(), DeliveryOrder::Relaxed);
    let e = parse_err(&format!(
        "{S3}bucket = \"b\"\nprefix = \"p\"\norder = \"sorted\"\n"
    ));
    assert_eq!(e.field(), Some("dataset[0].order"));
    assert!(e.to_string().contains("line 6"), "{e}");
    let f = invalid_fields(&format!(
        "{S3}bucket = \"b\"\nprefix = \"p\"\nrequest_timeout_ms = 0\n"
    ));
    assert_eq!(f, ["dataset[0].request_timeout_ms"]);
    let e = parse_err(&format!(
        "{S3}bucket = \"b\"\nprefix = \"p\"\npathstyle = true\n"
    ));
    assert_eq!(e.field(), Some("dataset[0].pathstyle"));
    let e = parse_err(&format!(
        "{S3}bucket = \"b\"\nprefix = \"p\"\nretries = \"x\"\n"
    ));
    assert_eq!(e.field(), Some("dataset[0].retries"));
    assert!(e.to_string().contains("line 6"), "{e}");
}

#[test]
fn keys_of_another_kind_are_rejected_with_their_line() {
    // An S3 key on a filesystem dataset (kind left out, so fs).
    let e = parse_err(&format!(
        "{MINIMAL}[[dataset]]\nname = \"f\"\nroot = \"/d\"\nbucket = \"b\"\n"
    ));
    assert_eq!(e.field(), Some("dataset[1].bucket"));
    let msg = e.to_string();
    assert!(msg.contains("unknown field `bucket`"), "{msg}");
    assert!(msg.contains("line 7"), "{msg}");
    assert!(
        msg.contains("`root`"),
        "the message lists the keys of fs: {msg}"
    );
    match &e {
        ConfigError::Parse { line, column, .. } => {
            assert_eq!(*line, Some(7));
            assert_eq!(*column, Some(1));
        }
        other => panic!("unexpected {other:?}"),
    }
    // A remote key on a filesystem dataset, and fs / S3 keys on CQL ones.
    let cases = [
        ("[[dataset]]\nname = \"f\"\nkind = \"fs\"\nroot = \"/d\"\nretries = 2\n", "retries"),
        ("[[dataset]]\nname = \"f\"\nroot = \"/d\"\nkeyspace = \"k\"\n", "keyspace"),
        ("[[dataset]]\nname = \"c\"\nkind = \"cql\"\nhosts = [\"h\"]\nkeyspace = \"k\"\nroot = \"/d\"\n", "root"),
        ("[[dataset]]\nname = \"c\"\nkind = \"cql\"\nhosts = [\"h\"]\nkeyspace = \"k\"\nbucket = \"b\"\n", "bucket"),
        ("[[dataset]]\nname = \"s\"\nkind = \"s3\"\nbucket = \"b\"\nprefix = \"\"\nhosts = [\"h\"]\n", "hosts"),
        ("[[dataset]]\nname = \"s\"\nkind = \"s3\"\nbucket = \"b\"\nprefix = \"\"\nroot = \"/x\"\n", "root"),
    ];
    for (toml, key) in cases {
        let e = parse_err(toml);
        assert_eq!(e.field(), Some(format!("dataset[0].{key}").as_str()), "{e}");
        assert!(e.to_string().contains("unknown field"), "{e}");
    }
    // An unknown kind names the kinds there are.
    let e = parse_err("[[dataset]]\nname = \"a\"\nkind = \"nfs\"\nroot = \"/a\"\n");
    assert_eq!(e.field(), Some("dataset[0].kind"));
    let msg = e.to_string();
    assert!(
        msg.contains("nfs") && msg.contains("`s3`") && msg.contains("line 3"),
        "{msg}"
    );
}

#[test]
fn cql_dataset_rules() {
    const CQL: &str = "[[dataset]]\nname = \"c\"\nkind = \"cql\"\n";
    let cfg = Config::from_toml_str(&format!(
        "{CQL}hosts = [\"10.0.0.1:9042\", \"db\", \"[::1]:19042\"]\nkeyspace = \"imagenet\"\n\
         username = \"u\"\npassword = \"hunter2\"\ntls = true\ntls_ca_file = \"/ca.pem\"\n\
         connections_per_host = 4\nmax_inflight = 4096\nrequest_timeout_ms = 500\nretries = 3\n"
    ))
    .unwrap();
    let ds = cql(&cfg, 0);
    assert_eq!(cfg.datasets[0].kind(), SourceKind::Cql);
    assert_eq!(ds.max_inflight, 4096);
    assert_eq!(ds.data_table, "data");
    let dbg = format!("{ds:?}");
    assert!(!dbg.contains("hunter2"), "{dbg}");
    assert!(dbg.contains("<redacted>"), "{dbg}");
    // Required keys.
    assert_eq!(parse_err(CQL).field(), Some("dataset[0].hosts"));
    assert_eq!(
        parse_err(&format!("{CQL}hosts = [\"h\"]\n")).field(),
        Some("dataset[0].keyspace")
    );
    assert_eq!(
        invalid_fields(&format!("{CQL}hosts = []\nkeyspace = \"k\"\n")),
        ["dataset[0].hosts"]
    );
    let base = format!("{CQL}hosts = [\"h:9042\"]\nkeyspace = \"k\"\n");
    let f = invalid_fields(&format!(
        "{CQL}hosts = [\"h:0\", \"\", \"::1\", \"[::1\"]\nkeyspace = \"Bad-Name\"\n"
    ));
    assert_eq!(
        f,
        [
            "dataset[0].hosts[0]",
            "dataset[0].hosts[1]",
            "dataset[0].hosts[2]",
            "dataset[0].hosts[3]",
            "dataset[0].keyspace"
        ]
    );
    let f = invalid_fields(&format!(
        "{base}data_table = \"t\"\nmetadata_table = \"t\"\npassword = \"p\"\ntls_ca_file = \"/ca\"\n"
    ));
    assert_eq!(
        f,
        [
            "dataset[0].metadata_table",
            "dataset[0].username",
            "dataset[0].tls"
        ]
    );
    let f = invalid_fields(&format!(
        "{base}connections_per_host = 2\nconnections_per_shard = 0\nmax_inflight = 0\nretries = 101\n"
    ));
    assert_eq!(
        f,
        [
            "dataset[0].connections_per_shard",
            "dataset[0].connections_per_shard",
            "dataset[0].retries",
            "dataset[0].max_inflight"
        ]
    );
    let e = parse_err(&format!("{base}username = \"\"\n"));
    let msg = e.to_string();
    assert!(msg.contains("dataset[0].username"), "{msg}");
    assert!(msg.contains("(line 6)"), "{msg}");
}

#[test]
fn cql_hosts_and_names_parse() {
    assert_eq!(parse_cql_host("db1").unwrap(), ("db1".to_owned(), 9042));
    assert_eq!(
        parse_cql_host("10.0.0.1:19042").unwrap(),
        ("10.0.0.1".to_owned(), 19042)
    );
    assert_eq!(parse_cql_host("[::1]").unwrap(), ("::1".to_owned(), 9042));
    assert_eq!(
        parse_cql_host("[fe80::1]:7").unwrap(),
        ("fe80::1".to_owned(), 7)
    );
    for bad in ["", ":9042", "h:x", "h:70000", "::1", "[::1]x", "a b:1"] {
        assert!(parse_cql_host(bad).is_err(), "{bad:?} accepted");
    }
    assert!(is_cql_name("data_2"));
    for bad in ["", "Data", "2data", "_x", "a-b", &"a".repeat(49)] {
        assert!(!is_cql_name(bad), "{bad:?} accepted");
    }
}

#[test]
fn cql_tls_ca_file_is_resolved_against_the_config_folder() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("granary.toml");
    std::fs::write(
        &path,
        "[[dataset]]\nname = \"c\"\nkind = \"cql\"\nhosts = [\"h\"]\nkeyspace = \"k\"\ntls = true\ntls_ca_file = \"ca.pem\"\n",
    )
    .unwrap();
    let cfg = Config::load(&path).unwrap();
    assert_eq!(
        cql(&cfg, 0).tls_ca_file.as_deref(),
        Some(dir.path().join("ca.pem").as_path())
    );
}

#[test]
fn s3_manifest_keys_are_not_resolved_as_paths() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("granary.toml");
    std::fs::write(
        &path,
        "[[dataset]]\nname = \"s\"\nkind = \"s3\"\nbucket = \"b\"\nmanifest = \"idx/train.tsv\"\n",
    )
    .unwrap();
    let cfg = Config::load(&path).unwrap();
    assert_eq!(s3(&cfg, 0).manifest.as_deref(), Some("idx/train.tsv"));
}

#[test]
fn multiple_problems_are_all_reported() {
    let e = parse_err("[sessions]\nheartbeat_ms = 0\nmax_sessions = 0\n");
    assert_eq!(e.problems().len(), 3);
    let msg = e.to_string();
    assert!(msg.contains("3 problems"), "{msg}");
    assert!(msg.contains("sessions.heartbeat_ms"), "{msg}");
}

#[test]
fn load_resolves_relative_paths_and_names_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("granary.toml");
    std::fs::write(
        &path,
        "[socket]\npath = \"g.sock\"\n[[dataset]]\nname = \"a\"\nroot = \"data\"\n[[dataset]]\nname = \"b\"\nmanifest = \"/abs/m.tsv\"\n",
    )
    .unwrap();
    let cfg = Config::load(&path).unwrap();
    assert_eq!(cfg.socket.path, dir.path().join("g.sock"));
    assert_eq!(
        fs(&cfg, 0).root.as_deref(),
        Some(dir.path().join("data").as_path())
    );
    assert_eq!(
        fs(&cfg, 1).manifest.as_deref(),
        Some(Path::new("/abs/m.tsv"))
    );

    std::fs::write(&path, "[prefetch]\nwindow_batches = 0\n").unwrap();
    let msg = Config::load(&path).unwrap_err().to_string();
    assert!(msg.contains("granary.toml"), "{msg}");
    assert!(msg.contains("prefetch.window_batches"), "{msg}");

    let e = Config::load(dir.path().join("missing.toml")).unwrap_err();
    assert!(matches!(e, ConfigError::Io { .. }));
    assert!(e.to_string().contains("missing.toml"), "{e}");
}

#[test]
fn retry_settings_come_from_prefetch_and_the_dataset() {
    let cfg = Config::from_toml_str(&format!(
        "{MINIMAL}[[dataset]]\nname = \"r\"\nroot = \"/r\"\n[dataset.retry]\nread_retries = 5\nretry_backoff_max_ms = 300\n"
    ))
    .unwrap();
    let ms = Duration::from_millis;
    let plain = cfg.retry_for(&cfg.datasets[0]);
    assert_eq!(
        plain,
        RetrySettings {
            retries: 3,
            backoff: ms(100),
            backoff_max: ms(2000),
            deadline: ms(20_000),
        }
    );
    assert_eq!(plain, RetrySettings::default());
    let own = cfg.retry_for(&cfg.datasets[1]);
    assert_eq!(own.retries, 5);
    assert_eq!(own.backoff, ms(100));
    assert_eq!(own.backoff_max, ms(300));
    assert_eq!(own.deadline, ms(20_000));
}

#[test]
fn default_worst_case_of_a_failing_sample_is_well_under_a_minute() {
    // No retry starts after the deadline and an attempt lasts at most the
    // read timeout (the retry policy's tests check the policy itself).
    let cfg = Config::default();
    let r = RetrySettings::default();
    let worst = r.deadline + Duration::from_millis(cfg.prefetch.read_timeout_ms);
    assert!(worst <= Duration::from_secs(30), "{worst:?}");
    let p = crate::retry::RetryPolicy::new(&cfg, &r);
    assert!(p.worst_case() <= worst);
}

#[test]
fn retry_relations_are_validated() {
    let f = invalid_fields(&format!(
        "[prefetch]\nretry_backoff_ms = 500\nretry_backoff_max_ms = 100\nsample_deadline_ms = 5000\nread_retries = 101\n{MINIMAL}"
    ));
    assert_eq!(
        f,
        [
            "prefetch.read_retries",
            "prefetch.retry_backoff_max_ms",
            "prefetch.sample_deadline_ms"
        ]
    );
    let f = invalid_fields(&format!(
        "[prefetch]\nsample_deadline_ms = 60000\nretry_backoff_ms = 0\n{MINIMAL}"
    ));
    assert_eq!(
        f,
        ["prefetch.retry_backoff_ms", "prefetch.sample_deadline_ms"]
    );
    // A dataset's own table: checked with [prefetch]'s values filled in,
    // named with its line.
    let e = parse_err(&format!(
        "{MINIMAL}[dataset.retry]\nretry_backoff_max_ms = 50\nsample_deadline_ms = 1000\n"
    ));
    let fields: Vec<_> = e.problems().iter().map(|p| p.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "dataset[0].retry.retry_backoff_max_ms",
            "dataset[0].retry.sample_deadline_ms"
        ]
    );
    assert_eq!(e.problems()[0].line, Some(5));
    assert!(e.to_string().contains("(line 6)"), "{e}");
    let e = parse_err(&format!("{MINIMAL}[dataset.retry]\nretries = 2\n"));
    assert_eq!(e.field(), Some("dataset[0].retry.retries"));
}

#[test]
fn problems_carry_their_line() {
    let e = parse_err(&format!(
        "[prefetch]\nwindow_batches = 4\ninitial_window = 8\n{MINIMAL}"
    ));
    assert_eq!(e.problems()[0].line, Some(3));
    assert!(
        e.to_string().contains("`prefetch.initial_window` (line 3)"),
        "{e}"
    );
    // A problem with a key that is not written points at its table.
    let e = parse_err("[arena]\nsize = \"1GiB\"\n[[dataset]]\nname = \"d\"\n");
    assert_eq!(e.problems()[0].field, "dataset[0].root");
    assert_eq!(e.problems()[0].line, Some(3));
}

/// The default file with its left-out settings ("#key = value" lines, no
/// space after the '#') turned on.
pub(super) fn default_toml_with_every_key() -> String {
    Config::default_toml()
        .lines()
        .map(|l| match l.strip_prefix('#') {
            Some(rest) if !rest.is_empty() && !rest.starts_with([' ', '#']) => rest,
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn default_file_documents_every_field() {
    // Every key of every kind is in the default file, active or left out:
    // turned on, they parse (not validated: the examples are alternatives).
    let full = default_toml_with_every_key();
    let (cfg, doc) = document::parse(&full).unwrap_or_else(|e| panic!("{e}\n{full}"));
    let kinds: Vec<_> = cfg.datasets.iter().map(DatasetConfig::kind).collect();
    assert_eq!(
        kinds,
        [
            SourceKind::Fs,
            SourceKind::S3,
            SourceKind::Cql,
            SourceKind::Gcs,
            SourceKind::Azure
        ]
    );
    // Each kind's struct, fully written out, has every field set to
    // something other than its default (so no field is missing from the
    // file): Option fields are Some.
    let DatasetConfig::Fs(f) = &cfg.datasets[0] else {
        unreachable!()
    };
    assert!(f.root.is_some() && f.manifest.is_some());
    assert!(
        f.retry.read_retries.is_some()
            && f.retry.retry_backoff_ms.is_some()
            && f.retry.retry_backoff_max_ms.is_some()
            && f.retry.sample_deadline_ms.is_some()
    );
    let DatasetConfig::S3(s) = &cfg.datasets[1] else {
        unreachable!()
    };
    assert!(
        s.prefix.is_some()
            && s.manifest.is_some()
            && s.endpoint.is_some()
            && s.region.is_some()
            && s.access_key_id.is_some()
            && s.secret_access_key.is_some()
            && s.max_inflight.is_some()
    );
    let DatasetConfig::Cql(c) = &cfg.datasets[2] else {
        unreachable!()
    };
    assert!(
        c.username.is_some()
            && c.password.is_some()
            && c.tls_ca_file.is_some()
            && c.connections_per_host.is_some()
            && c.connections_per_shard.is_some()
    );
    let DatasetConfig::Gcs(g) = &cfg.datasets[3] else {
        unreachable!()
    };
    assert!(
        g.prefix.is_some()
            && g.manifest.is_some()
            && g.endpoint.is_some()
            && g.service_account_file.is_some()
            && g.max_inflight.is_some()
    );
    let DatasetConfig::Azure(a) = &cfg.datasets[4] else {
        unreachable!()
    };
    assert!(
        a.prefix.is_some()
            && a.manifest.is_some()
            && a.endpoint.is_some()
            && a.access_key.is_some()
            && a.sas_token.is_some()
            && a.max_inflight.is_some()
    );
    assert!(doc.paths().count() > 60);

    // Every key line has a comment above it (directly, or above the run of
    // key lines it belongs to).
    let lines: Vec<&str> = full.lines().collect();
    let raw: Vec<&str> = Config::default_toml().lines().collect();
    for (i, l) in lines.iter().enumerate() {
        let is_key = |l: &str| l.contains(" = ") && !l.starts_with('#');
        if !is_key(l) {
            continue;
        }
        let mut j = i;
        while j > 0 && (is_key(lines[j - 1]) || lines[j - 1].starts_with('[')) {
            j -= 1;
        }
        assert!(
            j > 0 && raw[j - 1].starts_with("# "),
            "line {}: `{l}` is not documented by a comment above it",
            i + 1
        );
    }
}

/// The keys of a struct as serde reads them (its field names, renamed),
/// caught from the `deserialize_struct` call its derived impl makes.
pub(super) fn fields_of<'de, T: Deserialize<'de>>() -> &'static [&'static str] {
    use serde::de::{Error as _, Visitor};
    struct Catch<'a>(&'a mut &'static [&'static str]);
    impl<'de> serde::Deserializer<'de> for Catch<'_> {
        type Error = serde::de::value::Error;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(Self::Error::custom("not a struct"))
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            *self.0 = fields;
            Err(Self::Error::custom("caught"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
            bytes byte_buf option unit unit_struct newtype_struct seq tuple
            tuple_struct map enum identifier ignored_any
        }
    }
    let mut fields: &'static [&'static str] = &[];
    let _ = T::deserialize(Catch(&mut fields));
    assert!(
        !fields.is_empty(),
        "{} is not a struct",
        std::any::type_name::<T>()
    );
    fields
}

/// Every configuration key the Rust types define, as `section.key` (the
/// dataset kinds as `dataset.fs.root`, `dataset.s3.bucket`, …, the retry
/// table as `dataset.retry.read_retries`).
pub(super) fn every_key() -> Vec<String> {
    let mut keys = Vec::new();
    let mut add = |prefix: &str, fields: &[&str]| {
        keys.extend(fields.iter().map(|f| format!("{prefix}.{f}")));
    };
    add("arena", fields_of::<ArenaConfig>());
    add("socket", fields_of::<SocketConfig>());
    add("prefetch", fields_of::<PrefetchConfig>());
    add("cache", fields_of::<CacheConfig>());
    add("sessions", fields_of::<SessionsConfig>());
    add("metrics", fields_of::<MetricsConfig>());
    add("peers", fields_of::<PeersConfig>());
    add("dataset.fs", fields_of::<FsConfig>());
    add("dataset.s3", fields_of::<S3Config>());
    add("dataset.cql", fields_of::<CqlConfig>());
    add("dataset.gcs", fields_of::<GcsConfig>());
    add("dataset.azure", fields_of::<AzureConfig>());
    add("dataset.retry", fields_of::<RetryOverride>());
    add("dataset.prepare", fields_of::<PrepareConfig>());
    add("mixture", fields_of::<super::MixtureConfig>());
    add("mixture.source", fields_of::<super::MixtureSource>());
    keys
}

#[test]
fn the_default_file_has_every_key_of_the_types() {
    assert_eq!(
        fields_of::<Config>(),
        [
            "arena", "socket", "prefetch", "cache", "sessions", "metrics", "peers", "dataset",
            "mixture"
        ]
    );
    // The default file's keys, with its left-out settings turned on, named
    // like every_key() names them.
    let full = default_toml_with_every_key();
    let (cfg, doc) = document::parse(&full).unwrap();
    let kind = |i: usize| cfg.datasets[i].kind().as_str();
    let mut in_file: Vec<String> = Vec::new();
    for path in doc.paths() {
        if let Some(rest) = path.strip_prefix("mixture[") {
            // mixture[i].key and mixture[i].source[j].key
            let key = rest.rsplit("].").next().unwrap_or_default();
            match (rest.contains(".source["), key.contains('[')) {
                (_, true) => {}
                (true, false) => {
                    in_file.push(format!("mixture.source.{key}"));
                    in_file.push("mixture.source".to_owned());
                }
                (false, false) if !key.starts_with("source") && rest.contains("].") => {
                    in_file.push(format!("mixture.{key}"))
                }
                _ => {}
            }
            continue;
        }
        let Some(rest) = path.strip_prefix("dataset[") else {
            if path.contains('.') && !path.contains('[') {
                in_file.push(path.to_owned());
            }
            continue;
        };
        let (i, key) = rest.split_once("].").unwrap_or((rest, ""));
        let i: usize = i.trim_end_matches(']').parse().unwrap();
        match key {
            "" | "kind" => {}
            k if k.contains('[') => {}
            k if k.starts_with("retry.") || k.starts_with("prepare.") => {
                in_file.push(format!("dataset.{k}"))
            }
            k => in_file.push(format!("dataset.{}.{k}", kind(i))),
        }
    }
    // The keys every kind shares are written out once, in the fs example
    // (the other kinds' examples say they take them too).
    let shared = ["order", "retry", "prepare"];
    let mut want: Vec<String> = every_key()
        .into_iter()
        .filter(|k| {
            ![
                "dataset.s3.",
                "dataset.cql.",
                "dataset.gcs.",
                "dataset.azure.",
            ]
            .iter()
            .any(|p| k.starts_with(p))
                || !shared.contains(&k.rsplit('.').next().unwrap_or_default())
        })
        .collect();
    want.sort();
    in_file.sort();
    in_file.dedup();
    assert_eq!(in_file, want, "keys of the default file vs the types");
}

#[test]
fn peers_are_off_by_default_and_bad_peer_settings_name_their_field() {
    let ds = "[[dataset]]\nname = \"d\"\nroot = \"/tmp\"\n";
    let cfg = Config::from_toml_str(ds).unwrap();
    assert!(!cfg.peers.enabled());
    let ok = format!(
        "[peers]\nmembership = \"static\"\njob_id = \"j\"\nnode_id = \"a\"\nsecret = \"c5c64913cdf6c5268fb4da6deb8e09a0d04bcf1ff53244dbd5dd0c9bddaead23\"\n\
         members = [{{ id = \"a\", addr = \"10.0.0.1:7170\" }}, {{ id = \"b\", addr = \"h:7170\", keep = \"1GiB\" }}]\n{ds}"
    );
    let cfg = Config::from_toml_str(&ok).unwrap();
    assert!(cfg.peers.enabled());
    assert_eq!(cfg.peers.members[1].keep.unwrap().bytes(), 1 << 30);
    let bad = format!(
        "[peers]\nmembership = \"static\"\nnode_id = \"zz\"\nkeep_percent = 95\nmax_requests = 0\n\
         listen = \"nowhere\"\nidle_timeout_ms = 100\n\
         members = [{{ id = \"a\", addr = \"10.0.0.1\" }}, {{ id = \"a\", addr = \"h:1\" }}]\n{ds}"
    );
    let fields = invalid_fields(&bad);
    for f in [
        "peers.secret",
        "peers.job_id",
        "peers.keep_percent",
        "peers.max_requests",
        "peers.listen",
        "peers.idle_timeout_ms",
        "peers.members[0].addr",
        "peers.members[1].id",
        "peers.node_id",
    ] {
        assert!(
            fields.iter().any(|x| x == f),
            "{f} not reported: {fields:?}"
        );
    }
    let slurm = format!(
        "[peers]\nmembership = \"slurm\"\nsecret_file = \"/x\"\nsecret = \"y\"\n\
         members = [{{ id = \"a\", addr = \"h:1\" }}]\n{ds}"
    );
    let fields = invalid_fields(&slurm);
    assert!(fields.contains(&"peers.secret".to_string()), "{fields:?}");
    assert!(fields.contains(&"peers.members".to_string()), "{fields:?}");
    // An unknown key is refused with its path.
    let e = parse_err(&format!("[peers]\nmembers_list = []\n{ds}"));
    assert!(e.to_string().contains("members_list"), "{e}");
}

#[test]
fn a_weak_inline_peer_secret_is_refused_with_how_to_make_one() {
    let ds = "[[dataset]]\nname = \"d\"\nroot = \"/tmp\"\n";
    for weak in ["x", "password", "aaaaaaaaaaaaaaaa", "the-job-secret"] {
        let e = parse_err(&format!(
            "[peers]\nmembership = \"session\"\nsecret = \"{weak}\"\n{ds}"
        ));
        let fields: Vec<_> = e.problems().iter().map(|p| p.field.clone()).collect();
        assert_eq!(fields, ["peers.secret"], "{e}");
        let msg = e.to_string();
        assert!(
            msg.contains("too weak") && msg.contains("granary secret new PATH"),
            "{msg}"
        );
        assert!(
            !msg.contains(&format!("\"{weak}\"")),
            "never printed: {msg}"
        );
    }
    let good = super::peer_secret::generate().unwrap();
    Config::from_toml_str(&format!(
        "[peers]\nmembership = \"session\"\nsecret = \"{good}\"\n{ds}"
    ))
    .unwrap();
    // With peers off, the secret is not judged.
    Config::from_toml_str(&format!("[peers]\nsecret = \"x\"\n{ds}")).unwrap();
}

#[test]
fn peers_transport_parses_and_rdma_needs_a_device() {
    let ds = "[[dataset]]\nname = \"d\"\nroot = \"/tmp\"\n";
    let peers =
        "[peers]\nmembership = \"static\"\njob_id = \"j\"\nnode_id = \"a\"\nsecret = \"c5c64913cdf6c5268fb4da6deb8e09a0d04bcf1ff53244dbd5dd0c9bddaead23\"\n\
                 members = [{ id = \"a\", addr = \"10.0.0.1:7170\" }]\n";
    assert_eq!(
        Config::default().peers.transport,
        TransportSetting::Auto,
        "auto by default"
    );
    for (text, want) in [
        ("auto", TransportSetting::Auto),
        ("tcp", TransportSetting::Tcp),
    ] {
        let cfg = Config::from_toml_str(&format!("{peers}transport = \"{text}\"\n{ds}")).unwrap();
        assert_eq!(cfg.peers.transport, want);
        assert_eq!(want.as_str(), text);
    }
    let e = parse_err(&format!("{peers}transport = \"infiniband\"\n{ds}"));
    assert!(e.to_string().contains("infiniband"), "{e}");
    // "rdma" writes payloads in clear: refused with encryption on, whatever
    // the host has.
    let e = parse_err(&format!("{peers}transport = \"rdma\"\n{ds}"));
    assert!(e.to_string().contains("peers.encryption = \"off\""), "{e}");
    // With encryption off it is a valid configuration; whether this host
    // has a device is the daemon's start-up check (`startup.rs`).
    let rdma = format!("{peers}transport = \"rdma\"\nencryption = \"off\"\n{ds}");
    let cfg = Config::from_toml_str(&rdma).unwrap();
    assert_eq!(cfg.peers.transport, TransportSetting::Rdma);
}

#[test]
fn peers_rdma_device_port_and_gid_index() {
    let ds = "[[dataset]]\nname = \"d\"\nroot = \"/tmp\"\n";
    let peers =
        "[peers]\nmembership = \"static\"\njob_id = \"j\"\nnode_id = \"a\"\nsecret = \"c5c64913cdf6c5268fb4da6deb8e09a0d04bcf1ff53244dbd5dd0c9bddaead23\"\n\
                 members = [{ id = \"a\", addr = \"10.0.0.1:7170\" }]\n";
    let d = Config::default().peers;
    assert_eq!(
        (d.rdma_device.as_str(), d.rdma_port, d.rdma_gid_index),
        ("", 1, 0)
    );
    let cfg = Config::from_toml_str(&format!(
        "{peers}rdma_device = \"mlx5_1\"\nrdma_port = 2\nrdma_gid_index = 3\n{ds}"
    ))
    .unwrap();
    let p = &cfg.peers;
    assert_eq!(
        (p.rdma_device.as_str(), p.rdma_port, p.rdma_gid_index),
        ("mlx5_1", 2, 3)
    );
    let e = parse_err(&format!("{peers}rdma_port = 0\n{ds}"));
    let fields: Vec<_> = e.problems().iter().map(|p| p.field.clone()).collect();
    assert_eq!(fields, ["peers.rdma_port"], "{e}");
    let e = parse_err(&format!("{peers}rdma_gid_index = 256\n{ds}"));
    assert!(e.to_string().contains("rdma_gid_index"), "{e}");
}

#[test]
fn peers_view_owners_member_bound_and_handin_bound() {
    let ds = "[[dataset]]\nname = \"d\"\nroot = \"/tmp\"\n";
    let d = Config::default().peers;
    assert!(
        d.view_uids.is_empty(),
        "only the agent's own uid by default"
    );
    assert_eq!(d.max_members, 4096);
    assert_eq!(d.handin_bytes_per_uid.bytes(), 16 << 20);
    assert!(d.may_install_views(0, 0), "the agent's own uid always may");
    assert!(!d.may_install_views(0, 1000));
    let session = "[peers]\nmembership = \"session\"\nsecret = \"c5c64913cdf6c5268fb4da6deb8e09a0d04bcf1ff53244dbd5dd0c9bddaead23\"\n";
    let cfg = Config::from_toml_str(&format!(
        "{session}view_uids = [1000, 1001]\nmax_members = 64\nhandin_bytes_per_uid = \"1MiB\"\n{ds}"
    ))
    .unwrap();
    let p = &cfg.peers;
    assert!(p.may_install_views(0, 1001) && p.may_install_views(0, 0));
    assert!(!p.may_install_views(0, 1002));
    assert_eq!(
        (p.max_members, p.handin_bytes_per_uid.bytes()),
        (64, 1 << 20)
    );
    for (bad, field) in [
        ("max_members = 0", "peers.max_members"),
        ("max_members = 65537", "peers.max_members"),
        (
            "handin_bytes_per_uid = \"4KiB\"",
            "peers.handin_bytes_per_uid",
        ),
    ] {
        let e = parse_err(&format!("{session}{bad}\n{ds}"));
        let fields: Vec<_> = e.problems().iter().map(|p| p.field.clone()).collect();
        assert_eq!(fields, [field], "{bad}: {e}");
    }
    let e = parse_err(&format!("{session}view_uids = [-1]\n{ds}"));
    assert!(e.to_string().contains("view_uids"), "{e}");
    // A static list longer than max_members.
    let e = parse_err(&format!(
        "[peers]\nmembership = \"static\"\njob_id = \"j\"\nnode_id = \"a\"\nsecret = \"c5c64913cdf6c5268fb4da6deb8e09a0d04bcf1ff53244dbd5dd0c9bddaead23\"\nmax_members = 1\n\
         members = [{{ id = \"a\", addr = \"h:1\" }}, {{ id = \"b\", addr = \"h:2\" }}]\n{ds}"
    ));
    let fields: Vec<_> = e.problems().iter().map(|p| p.field.clone()).collect();
    assert_eq!(fields, ["peers.members"], "{e}");
    assert!(e.to_string().contains("max_members"), "{e}");
}

#[test]
fn a_prepare_table_parses_with_its_defaults_and_its_rules_are_checked() {
    let cfg = Config::from_toml_str(&format!(
        "{MINIMAL}[dataset.prepare]\nresize = [224, 160]\n"
    ))
    .unwrap();
    let p = cfg.datasets[0].prepare().copied().unwrap();
    assert_eq!(p.resize, [224, 160]);
    assert_eq!(p.mode, ResizeMode::Crop);
    assert_eq!((p.threads, p.max_pixels), (2, 50_000_000));
    assert_eq!(p.max_input_bytes, ByteSize(32 << 20));
    assert_eq!(p.staging_bytes, ByteSize(64 << 20));
    assert_eq!(p.output_bytes(), 224 * 160 * 3);
    assert_eq!(
        Config::from_toml_str(MINIMAL).unwrap().datasets[0].prepare(),
        None
    );
    // The required key, and no unknown ones.
    assert!(Config::from_toml_str(&format!("{MINIMAL}[dataset.prepare]\nthreads = 2\n")).is_err());
    assert!(Config::from_toml_str(&format!(
        "{MINIMAL}[dataset.prepare]\nresize = [8, 8]\nsize = 3\n"
    ))
    .is_err());
    let f = invalid_fields(&format!(
        "{MINIMAL}[dataset.prepare]\nresize = [0, 9000]\nthreads = 0\nmax_pixels = 0\n\
         max_input_bytes = \"65MiB\"\n"
    ));
    assert_eq!(
        f,
        [
            "dataset[0].prepare.resize",
            "dataset[0].prepare.threads",
            "dataset[0].prepare.max_pixels",
            "dataset[0].prepare.max_input_bytes",
        ]
    );
    let f = invalid_fields(&format!(
        "{MINIMAL}[dataset.prepare]\nresize = [4, 4]\nmode = \"stretch\"\nthreads = 257\n"
    ));
    assert_eq!(f, ["dataset[0].prepare.threads"]);
}

#[test]
fn gcs_and_azure_dataset_rules() {
    const GCS: &str = "[[dataset]]\nname = \"g\"\nkind = \"gcs\"\n";
    const AZ: &str = "[[dataset]]\nname = \"a\"\nkind = \"azure\"\n";
    let cfg = Config::from_toml_str(&format!(
        "{GCS}bucket = \"b\"\nprefix = \"train\"\nservice_account_file = \"sa.json\"\n\
         {AZ}account = \"acct1\"\ncontainer = \"c\"\nmanifest = \"m.tsv\"\nsas_token = \"sv=1&sig=x\"\n"
    ))
    .unwrap();
    assert_eq!(cfg.datasets[0].kind(), SourceKind::Gcs);
    assert_eq!(cfg.datasets[1].kind(), SourceKind::Azure);
    let DatasetConfig::Gcs(g) = &cfg.datasets[0] else {
        unreachable!()
    };
    assert_eq!((g.retries, g.request_timeout_ms), (8, 10_000));
    assert!(!g.anonymous && !g.allow_http);
    // The retries stand for read_retries, as for S3.
    assert_eq!(cfg.retry_for(&cfg.datasets[1]).retries, 8);
    // The inline SAS token is a secret the file holds.
    assert_eq!(cfg.inline_secrets(), ["dataset[1].sas_token"]);
    assert!(!format!("{cfg:?}").contains("sig=x"));
    // Required keys, and the keys of other kinds, are parse errors.
    let e = parse_err(&format!("{AZ}container = \"c\"\nprefix = \"\"\n"));
    assert_eq!(e.field(), Some("dataset[0].account"));
    let e = parse_err(&format!(
        "{GCS}bucket = \"b\"\nprefix = \"\"\nregion = \"r\"\n"
    ));
    assert_eq!(e.field(), Some("dataset[0].region"));
    // The rules.
    assert_eq!(
        invalid_fields(&format!("{GCS}bucket = \"b/c\"\n")),
        ["dataset[0].bucket", "dataset[0].prefix"]
    );
    assert_eq!(
        invalid_fields(&format!(
            "{GCS}bucket = \"b\"\nprefix = \"\"\nendpoint = \"http://127.0.0.1:1\"\n"
        )),
        ["dataset[0].allow_http"]
    );
    assert_eq!(
        invalid_fields(&format!(
            "{AZ}account = \"a-b\"\ncontainer = \"c\"\nprefix = \"\"\naccess_key = \"k\"\nsas_token = \"s\"\n"
        )),
        ["dataset[0].account", "dataset[0].sas_token"]
    );
    assert_eq!(
        invalid_fields(&format!(
            "{AZ}account = \"a\"\ncontainer = \"c\"\nprefix = \"\"\naccess_key = \"k\"\nanonymous = true\nretries = 101\n"
        )),
        ["dataset[0].anonymous", "dataset[0].retries"]
    );
}

#[test]
fn format_and_label_field_are_checked() {
    let ok = Config::from_toml_str(
        "[[dataset]]\nname = \"w\"\nroot = \"/d\"\nformat = \"webdataset\"\nlabel_field = \"txt\"\n",
    )
    .unwrap();
    let settings = |format, label_field, sample_field| {
        Some(ShardSettings {
            format,
            label_field,
            sample_field,
            wids_index: match format {
                ShardFormat::Webdataset => WidsIndex::IfPresent("shardindex.json"),
                _ => WidsIndex::Off,
            },
        })
    };
    assert_eq!(
        ok.datasets[0].shards(),
        settings(ShardFormat::Webdataset, "txt", "sample")
    );
    let d = Config::from_toml_str("[[dataset]]\nname = \"f\"\nroot = \"/d\"\n").unwrap();
    assert_eq!(
        d.datasets[0].shards(),
        settings(ShardFormat::Files, "cls", "sample")
    );
    // mds and parquet: the label column defaults to "label", the sample
    // column to "sample".
    let m = Config::from_toml_str(
        "[[dataset]]\nname = \"m\"\nroot = \"/d\"\nformat = \"mds\"\n\
         [[dataset]]\nname = \"p\"\nkind = \"s3\"\nbucket = \"b\"\nprefix = \"p\"\n\
         format = \"parquet\"\nsample_field = \"jpg\"\nlabel_field = \"y\"\n",
    )
    .unwrap();
    assert_eq!(
        m.datasets[0].shards(),
        settings(ShardFormat::Mds, "label", "sample")
    );
    assert_eq!(
        m.datasets[1].shards(),
        settings(ShardFormat::Parquet, "y", "jpg")
    );
    assert_eq!(
        invalid_fields(
            "[[dataset]]\nname = \"w\"\nroot = \"/d\"\nformat = \"webdataset\"\nsample_field = \"x\"\n"
        ),
        ["dataset[0].sample_field"]
    );
    assert_eq!(
        invalid_fields(
            "[[dataset]]\nname = \"w\"\nroot = \"/d\"\nformat = \"mds\"\nsample_field = \"\"\n"
        ),
        ["dataset[0].sample_field"]
    );
    assert_eq!(
        invalid_fields(
            "[[dataset]]\nname = \"w\"\nroot = \"/d\"\nformat = \"parquet\"\ndirect_io = true\n"
        ),
        ["dataset[0].direct_io"]
    );
    assert_eq!(
        invalid_fields("[[dataset]]\nname = \"w\"\nmanifest = \"/m\"\nformat = \"webdataset\"\n"),
        ["dataset[0].manifest"]
    );
    assert_eq!(
        invalid_fields(
            "[[dataset]]\nname = \"w\"\nroot = \"/d\"\nformat = \"webdataset\"\ndirect_io = true\n"
        ),
        ["dataset[0].direct_io"]
    );
    assert_eq!(
        invalid_fields("[[dataset]]\nname = \"w\"\nroot = \"/d\"\nlabel_field = \"cls\"\n"),
        ["dataset[0].label_field"]
    );
    assert_eq!(
        invalid_fields(
            "[[dataset]]\nname = \"w\"\nroot = \"/d\"\nformat = \"webdataset\"\nlabel_field = \"a/b\"\n"
        ),
        ["dataset[0].label_field"]
    );
    let a = Config::from_toml_str(
        "[[dataset]]\nname = \"a\"\nroot = \"/d\"\nformat = \"arrow\"\nsample_field = \"image\"\n",
    )
    .unwrap();
    assert_eq!(
        a.datasets[0].shards(),
        settings(ShardFormat::Arrow, "label", "image")
    );
    assert_eq!(
        invalid_fields(
            "[[dataset]]\nname = \"w\"\nroot = \"/d\"\nformat = \"arrow\"\ndirect_io = true\n"
        ),
        ["dataset[0].direct_io"]
    );
    // wids_index: a webdataset dataset's shard list, by default
    // shardindex.json when present.
    let w = |line: &str| {
        let c = Config::from_toml_str(&format!(
            "[[dataset]]\nname = \"w\"\nroot = \"/d\"\nformat = \"webdataset\"\n{line}\n"
        ))
        .unwrap();
        format!("{:?}", c.datasets[0].shards().unwrap().wids_index)
    };
    assert_eq!(w(""), "IfPresent(\"shardindex.json\")");
    assert_eq!(w("wids_index = \"\""), "Off");
    assert_eq!(
        w("wids_index = \"meta/train.json\""),
        "Required(\"meta/train.json\")"
    );
    for bad in ["/abs.json", "../up.json", "a/../../b.json"] {
        assert_eq!(
            invalid_fields(&format!(
                "[[dataset]]\nname = \"w\"\nroot = \"/d\"\nformat = \"webdataset\"\nwids_index = \"{bad}\"\n"
            )),
            ["dataset[0].wids_index"],
            "{bad}"
        );
    }
    assert_eq!(
        invalid_fields(
            "[[dataset]]\nname = \"w\"\nroot = \"/d\"\nformat = \"mds\"\nwids_index = \"i.json\"\n"
        ),
        ["dataset[0].wids_index"]
    );
    let e = parse_err("[[dataset]]\nname = \"w\"\nroot = \"/d\"\nformat = \"lance\"\n").to_string();
    assert!(e.contains("lance") && e.contains("arrow"), "{e}");
    assert_eq!(
        invalid_fields(
            "[[dataset]]\nname = \"s\"\nkind = \"s3\"\nbucket = \"b\"\nmanifest = \"m.tsv\"\nformat = \"webdataset\"\n"
        ),
        ["dataset[0].manifest"]
    );
}

#[test]
fn mixtures_parse_and_bad_ones_name_their_field() {
    let ds = "[[dataset]]\nname = \"a\"\nroot = \"/a\"\n[[dataset]]\nname = \"b\"\nroot = \"/b\"\n";
    let ok = format!(
        "{ds}[[mixture]]\nname = \"m\"\nepoch_samples = 100\n\
         [[mixture.source]]\ndataset = \"a\"\nweight = 0.5\n\
         [[mixture.source]]\ndataset = \"b\"\nweight = 2\n\
         [[mixture]]\nname = \"n\"\n\
         [[mixture.source]]\ndataset = \"a\"\nrepeat = 4.0\n\
         [[mixture.source]]\ndataset = \"b\"\nchoose = 0.25\n"
    );
    let cfg = Config::from_toml_str(&ok).unwrap();
    assert_eq!(cfg.mixtures.len(), 2);
    assert!(cfg.mixtures[0].weighted() && !cfg.mixtures[1].weighted());
    assert_eq!(cfg.mixtures[0].source[1].weight, Some(2.0));
    assert_eq!(
        cfg.mixtures[1].source[1].choose,
        Some(super::Choose::Fraction(0.25))
    );
    let count = ok.replace("choose = 0.25", "choose = 1000");
    let cfg = Config::from_toml_str(&count).unwrap();
    assert_eq!(
        cfg.mixture("n").unwrap().source[1].choose,
        Some(super::Choose::Count(1000))
    );
    let mix = |body: &str| format!("{ds}[[mixture]]\n{body}");
    let src = |d: &str, extra: &str| format!("[[mixture.source]]\ndataset = \"{d}\"\n{extra}\n");
    for (body, field, words) in [
        (
            format!("name = \"m\"\n{}", src("c", "")),
            "mixture[0].source[0].dataset",
            "not a configured [[dataset]]",
        ),
        (
            format!(
                "name = \"m\"\n{}{}",
                src("a", "weight = 0.0"),
                src("b", "weight = 1.0")
            ),
            "mixture[0].source[0].weight",
            "above 0",
        ),
        (
            format!(
                "name = \"m\"\n{}{}",
                src("a", "weight = -1.0"),
                src("b", "weight = 1.0")
            ),
            "mixture[0].source[0].weight",
            "above 0",
        ),
        (
            format!("name = \"m\"\n{}{}", src("a", "weight = 1.0"), src("b", "")),
            "mixture[0].source[1].weight",
            "every source",
        ),
        (
            format!(
                "name = \"m\"\n{}{}",
                src("a", "weight = 1.0"),
                src("b", "weight = 1.0\nrepeat = 2.0")
            ),
            "mixture[0].source[1].repeat",
            "without weights",
        ),
        (
            format!("name = \"m\"\n{}", src("a", "repeat = 2.0\nchoose = 5")),
            "mixture[0].source[0].choose",
            "not both",
        ),
        (
            format!("name = \"m\"\n{}", src("a", "choose = 1.5")),
            "mixture[0].source[0].choose",
            "fraction in (0, 1]",
        ),
        (
            format!("name = \"m\"\n{}", src("a", "choose = 0")),
            "mixture[0].source[0].choose",
            "at least 1",
        ),
        (
            format!("name = \"m\"\n{}", src("a", "repeat = 0.0")),
            "mixture[0].source[0].repeat",
            "above 0",
        ),
        (
            format!("name = \"m\"\n{}{}", src("a", ""), src("a", "")),
            "mixture[0].source[1].dataset",
            "already a source",
        ),
        (
            format!("name = \"a\"\n{}", src("b", "")),
            "mixture[0].name",
            "name of a [[dataset]]",
        ),
        (
            format!("name = \"m\"\nepoch_samples = 10\n{}", src("b", "")),
            "mixture[0].epoch_samples",
            "sources with weights",
        ),
        (
            "name = \"m\"\n".to_string(),
            "mixture[0].source",
            "at least one",
        ),
    ] {
        let e = parse_err(&mix(&body));
        let p = e
            .problems()
            .iter()
            .find(|p| p.field == field)
            .unwrap_or_else(|| panic!("{field} not reported for:\n{body}\n{e}"));
        assert!(p.reason.contains(words), "{field}: {}", p.reason);
        assert!(p.line.is_some(), "{field} has a line");
    }
    // A mixture of a mixture.
    let e = parse_err(&format!(
        "{}[[mixture]]\nname = \"n\"\n{}",
        mix(&format!("name = \"m\"\n{}", src("a", ""))),
        src("m", "")
    ));
    assert!(e.to_string().contains("is a mixture"), "{e}");
}

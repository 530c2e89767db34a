//! Unit tests that need no server: settings, order, error classification.
//! The driver paths are tested against forged frames in
//! `agent/tests/cql_source.rs`.

use super::*;
use crate::config::Config;

fn dataset(extra: &str) -> DatasetConfig {
    let cfg = Config::from_toml_str(&format!(
        "[[dataset]]\nname = \"c\"\nkind = \"cql\"\nhosts = [\"127.0.0.1:19042\", \"db\"]\nkeyspace = \"ks\"\n{extra}"
    ))
    .unwrap();
    cfg.datasets[0].clone()
}

#[test]
fn settings_come_from_the_dataset_with_defaults() {
    let s = CqlSettings::from_dataset(&dataset("")).unwrap();
    assert_eq!(s.hosts, ["127.0.0.1:19042", "db"]);
    assert_eq!(s.keyspace, "ks");
    assert_eq!(s.data_table, "data");
    assert_eq!(s.metadata_table, "metadata");
    assert_eq!(s.pool, Pool::PerShard(1));
    assert_eq!(s.max_inflight, 2048);
    assert_eq!(s.request_timeout, Duration::from_secs(10));
    assert_eq!(s.retries, 8);
    assert_eq!(
        s.url_of(&Uuid::nil()),
        format!("cql://ks.data/{}", Uuid::nil())
    );
    let s = CqlSettings::from_dataset(&dataset(
        "data_table = \"blobs\"\nmetadata_table = \"index\"\nusername = \"u\"\npassword = \"pw\"\n\
         connections_per_host = 3\nmax_inflight = 64\nrequest_timeout_ms = 250\nretries = 2\n",
    ))
    .unwrap();
    assert_eq!(
        (s.data_ref(), s.metadata_ref()),
        ("ks.blobs".into(), "ks.index".into())
    );
    assert_eq!(s.pool, Pool::PerHost(3));
    assert_eq!(s.password.as_deref(), Some("pw"));
    let dbg = format!("{s:?}");
    assert!(!dbg.contains("pw\""), "{dbg}");
    assert!(dbg.contains("<redacted>"), "{dbg}");
    let o = s.fetch_options();
    assert_eq!(o.capacity, 64);
    assert_eq!(o.request_timeout, Duration::from_millis(250));
    assert_eq!(s.retries, 2);
}

#[test]
fn a_user_without_password_takes_it_from_the_environment_or_fails() {
    let mut s = CqlSettings::new(vec!["h".into()], "ks");
    s.username = Some("u".into());
    let e = s.check().unwrap_err().to_string();
    assert!(e.contains(PASSWORD_ENV), "{e}");
    s.fill_from_env(|k| (k == PASSWORD_ENV).then(|| "secret".to_owned()));
    assert_eq!(s.password.as_deref(), Some("secret"));
    s.check().unwrap();
    // A configured password is not replaced.
    s.password = Some("mine".into());
    s.fill_from_env(|_| Some("other".into()));
    assert_eq!(s.password.as_deref(), Some("mine"));
}

#[test]
fn bad_settings_are_refused_before_connecting() {
    let base = CqlSettings::new(vec!["h:9042".into()], "ks");
    type Change = Box<dyn Fn(&mut CqlSettings)>;
    let cases: Vec<(Change, &str)> = vec![
        (Box::new(|s| s.hosts.clear()), "hosts"),
        (Box::new(|s| s.hosts = vec!["h:0".into()]), "port"),
        (Box::new(|s| s.keyspace = "Ks".into()), "keyspace"),
        (Box::new(|s| s.data_table = "a;drop".into()), "data table"),
        (Box::new(|s| s.metadata_table = "data".into()), "both"),
        (
            Box::new(|s| s.password = Some("p".into())),
            "without a username",
        ),
        (
            Box::new(|s| s.tls_ca_file = Some("/ca".into())),
            "TLS is off",
        ),
        (Box::new(|s| s.request_timeout = Duration::ZERO), "timeout"),
        (Box::new(|s| s.max_inflight = 0), "max_inflight"),
        (Box::new(|s| s.pool = Pool::PerHost(0)), "pool"),
    ];
    for (change, needle) in cases {
        let mut s = base.clone();
        change(&mut s);
        let e = s.check().unwrap_err().to_string();
        assert!(e.contains(needle), "{needle:?} not in {e:?}");
        let e = CqlSource::connect(&s).unwrap_err().to_string();
        assert!(e.contains(needle), "{needle:?} not in {e:?}");
    }
    base.check().unwrap();
}

#[test]
fn a_missing_or_empty_ca_file_is_named() {
    let mut s = CqlSettings::new(vec!["h".into()], "ks");
    s.tls = true;
    s.tls_ca_file = Some("/nonexistent/ca.pem".into());
    let e = session::tls_config(&s).unwrap_err().to_string();
    assert!(e.contains("/nonexistent/ca.pem"), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("empty.pem");
    std::fs::write(&f, "not a certificate\n").unwrap();
    s.tls_ca_file = Some(f.clone());
    let e = session::tls_config(&s).unwrap_err().to_string();
    assert!(e.contains("holds no certificate"), "{e}");
    assert!(e.contains(&f.display().to_string()), "{e}");
}

#[test]
fn catalog_order_is_label_then_id_bytes_whatever_the_row_order() {
    let id = |b: u8| Uuid::from_bytes([b; 16]);
    let rows = vec![
        (id(9), 1, 10, None),
        (id(3), 0, 30, Some(3)),
        (id(1), 1, 11, None),
        (id(7), -1, 70, None),
        (id(2), 0, 20, Some(2)),
    ];
    let a = CqlCatalog::from_rows("ks.metadata", rows.clone()).unwrap();
    let mut reversed = rows;
    reversed.reverse();
    let b = CqlCatalog::from_rows("ks.metadata", reversed).unwrap();
    assert_eq!(a, b);
    let got: Vec<_> = a
        .entries()
        .iter()
        .map(|e| (e.sample_id, e.id, e.label, e.size))
        .collect();
    assert_eq!(
        got,
        [
            (0, id(7), -1, 70),
            (1, id(2), 0, 20),
            (2, id(3), 0, 30),
            (3, id(1), 1, 11),
            (4, id(9), 1, 10)
        ]
    );
    assert_eq!(a.total_bytes(), 141);
    assert_eq!(a.max_size(), 70);
    assert_eq!(a.get(3).map(|e| e.id), Some(id(1)));
    assert!(a.get(5).is_none());
    let e = CqlCatalog::from_rows("ks.metadata", [(id(1), 0, 1u64 << 32, None)]).unwrap_err();
    assert!(e.to_string().contains(&id(1).to_string()), "{e}");
}

#[test]
fn server_errors_are_classified() {
    use scylla::errors::DbError;
    use scylla::statement::Consistency;
    for db in [
        DbError::Overloaded,
        DbError::Unavailable {
            consistency: Consistency::One,
            required: 1,
            alive: 0,
        },
        DbError::ReadTimeout {
            consistency: Consistency::One,
            received: 0,
            required: 1,
            data_present: false,
        },
        DbError::IsBootstrapping,
        DbError::ServerError,
    ] {
        assert!(classify_db(&db).retryable, "{db:?}");
    }
    for db in [
        DbError::SyntaxError,
        DbError::Invalid,
        DbError::Unauthorized,
        DbError::AuthenticationError,
        DbError::ProtocolError,
    ] {
        assert!(!classify_db(&db).retryable, "{db:?}");
    }
    assert_eq!(
        classify_db(&DbError::Unauthorized).kind,
        io::ErrorKind::PermissionDenied
    );
    let t = classify(&ExecutionError::RequestTimeout(Duration::from_millis(5)));
    assert!(t.retryable);
    assert_eq!(t.kind, io::ErrorKind::TimedOut);
    assert!(
        !classify(&ExecutionError::LastAttemptError(
            RequestAttemptError::DbError(DbError::SyntaxError, "bad".into())
        ))
        .retryable
    );
}

#[test]
fn fetch_errors_say_whether_to_retry() {
    let e = |retryable| {
        io::Error::other(FetchError {
            target: format!("cql://ks.data/{}", Uuid::nil()),
            attempts: 3,
            retryable,
            message: "overloaded".into(),
        })
    };
    assert!(is_retryable(&e(true)));
    assert!(!is_retryable(&e(false)));
    let msg = e(true).to_string();
    assert!(
        msg.contains(&format!("cql://ks.data/{}", Uuid::nil())),
        "{msg}"
    );
    assert!(msg.contains("after 3 attempts"), "{msg}");
    assert!(fetch_error(&e(false)).is_some());
    assert!(is_retryable(&io::Error::from(io::ErrorKind::TimedOut)));
}

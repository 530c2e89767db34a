//! Session options are defined in Rust (`SessionOptions::new`, whose
//! defaults the C API's `granary_session_options_init` takes over). Two
//! mirrors are written by hand: the C struct's ctypes copy in
//! `python/granary/_lib.py` and the keyword defaults of the Python
//! package's `Session` (`python/granary/core.py`). This test reads both
//! files and `include/granary.h` (generated from the FFI types and checked
//! by `header.rs`) and fails, naming the field, when a mirror drifts: a
//! field added to the header but not to the ctypes struct (or in another
//! order), or a Python default that differs from the Rust one.

use granary::{SessionOptions, DEFAULT_OPEN_TIMEOUT};
use std::collections::BTreeMap;
use std::path::PathBuf;

fn read(rel: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The field names of `typedef struct NAME { … } NAME;` in the header.
fn header_fields(header: &str, name: &str) -> Vec<String> {
    let open = format!("typedef struct {name} {{");
    let start = header
        .find(&open)
        .unwrap_or_else(|| panic!("{name} not in granary.h"))
        + open.len();
    let end = start
        + header[start..]
            .find(&format!("}} {name};"))
            .expect("end of struct");
    let mut body = header[start..end].to_owned();
    while let Some(a) = body.find("/*") {
        let b = a + body[a..].find("*/").expect("comment end") + 2;
        body.replace_range(a..b, "");
    }
    body.split(';')
        .map(str::trim)
        .filter(|f| !f.is_empty())
        .map(|f| {
            let last = f.split_whitespace().last().expect("a field");
            last.trim_start_matches('*')
                .split('[')
                .next()
                .unwrap()
                .to_owned()
        })
        .collect()
}

/// The names of `_fields_` of `class NAME(ctypes.Structure)` in `_lib.py`.
fn ctypes_fields(lib: &str, name: &str) -> Vec<String> {
    let open = format!("class {name}(ctypes.Structure):");
    let start = lib
        .find(&open)
        .unwrap_or_else(|| panic!("{name} not in _lib.py"));
    let body = &lib[start..];
    let end = body.find("\n    ]").expect("end of _fields_");
    body[..end]
        .lines()
        .filter_map(|l| l.trim().strip_prefix("(\""))
        .map(|l| l.split('"').next().unwrap().to_owned())
        .collect()
}

/// `name: type = value` keyword defaults of the Python function whose
/// signature starts at `def_line`.
fn python_defaults(core: &str, def_line: &str) -> BTreeMap<String, String> {
    let start = core
        .find(def_line)
        .unwrap_or_else(|| panic!("{def_line} not in core.py"));
    let sig = &core[start..start + core[start..].find("):").expect("end of signature")];
    sig.lines()
        .filter_map(|l| {
            let l = l.trim().trim_end_matches(',');
            let (name, rest) = l.split_once(':')?;
            let (_, value) = rest.split_once('=')?;
            Some((name.trim().to_owned(), value.trim().to_owned()))
        })
        .collect()
}

/// The value of a module-level `NAME = value` of core.py.
fn python_constant(core: &str, name: &str) -> f64 {
    core.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} = ")))
        .unwrap_or_else(|| panic!("{name} not in core.py"))
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn the_ctypes_struct_names_the_headers_fields_in_order() {
    let header = read("include/granary.h");
    let lib = read("python/granary/_lib.py");
    for (c, py) in [
        ("granary_session_options", "SessionOptions"),
        ("granary_session_info", "SessionInfo"),
    ] {
        let h = header_fields(&header, c);
        let m = ctypes_fields(&lib, py);
        assert!(h.len() > 5, "{c}: read {h:?}");
        for (i, (a, b)) in h.iter().zip(&m).enumerate() {
            assert_eq!(
                a, b,
                "{c} field {i}: granary.h has {a}, _lib.py {py} has {b}"
            );
        }
        assert_eq!(h.len(), m.len(), "{c}: granary.h {h:?}, _lib.py {m:?}");
    }
}

#[test]
fn the_python_defaults_are_the_rust_defaults() {
    let core = read("python/granary/core.py");
    let rust = SessionOptions::new("d");
    let py_bool = |b: bool| if b { "True" } else { "False" }.to_owned();
    let resume = python_constant(&core, "DEFAULT_RESUME_TIMEOUT");
    let open = python_constant(&core, "DEFAULT_TIMEOUT");
    assert_eq!(
        Some(std::time::Duration::from_secs_f64(resume)),
        rust.resume_timeout,
        "DEFAULT_RESUME_TIMEOUT"
    );
    assert_eq!(
        std::time::Duration::from_secs_f64(open),
        DEFAULT_OPEN_TIMEOUT,
        "DEFAULT_TIMEOUT (the open timeout)"
    );
    let want: BTreeMap<&str, String> = [
        ("batch_size", rust.batch_size.to_string()),
        ("seed", rust.seed.to_string()),
        ("first_epoch", rust.first_epoch.to_string()),
        ("epochs", rust.epoch_count.to_string()),
        ("rank", rust.rank.to_string()),
        ("world_size", rust.world_size.to_string()),
        ("drop_last", py_bool(rust.drop_last)),
        ("ready_capacity", rust.ready_capacity.to_string()),
        ("release_capacity", rust.release_capacity.to_string()),
        ("view", "None".to_owned()),
        ("view_required", py_bool(rust.view_required)),
        ("layout", "None".to_owned()),
        ("locality", "None".to_owned()),
        ("verify_crc", py_bool(rust.verify_crc)),
        ("first_batch", rust.first_batch.to_string()),
        ("resume_timeout", "DEFAULT_RESUME_TIMEOUT".to_owned()),
        ("worker", rust.worker.to_string()),
        ("workers", rust.workers.to_string()),
        ("state", "None".to_owned()),
        ("accept_changed", "False".to_owned()),
    ]
    .into_iter()
    .collect();
    for def in [
        "def _options(",
        "    def __init__(\n        self,\n        client: \"Client\",",
    ] {
        let got = python_defaults(&core, def);
        for (name, value) in &want {
            assert_eq!(
                got.get(*name),
                Some(value),
                "core.py `{}`: the default of {name}",
                def.trim()
            );
        }
    }
}

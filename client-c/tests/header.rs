//! `include/granary.h` is generated from `src/ffi` by cbindgen and
//! committed. This test regenerates it in memory and fails if the committed
//! file differs; `GRANARY_BLESS=1` rewrites the file instead.

use std::path::{Path, PathBuf};

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn generate(dir: &Path) -> String {
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml"))
        .unwrap_or_else(|e| panic!("reading client-c/cbindgen.toml: {e}"));
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(dir.join("src/lib.rs"))
        .generate()
        .unwrap_or_else(|e| panic!("cbindgen could not generate the header: {e}"));
    let mut out = Vec::new();
    bindings.write(&mut out);
    String::from_utf8(out).expect("cbindgen writes UTF-8")
}

/// The first line where `a` and `b` differ, for the failure message.
fn first_difference(a: &str, b: &str) -> String {
    let mut al = a.lines();
    let mut bl = b.lines();
    let mut n = 1;
    loop {
        match (al.next(), bl.next()) {
            (Some(x), Some(y)) if x == y => n += 1,
            (None, None) => return "(only line endings differ)".into(),
            (x, y) => {
                return format!(
                    "line {n}:\n  committed: {}\n  generated: {}",
                    x.unwrap_or("<end of file>"),
                    y.unwrap_or("<end of file>")
                )
            }
        }
    }
}

#[test]
fn header_matches_the_sources() {
    let dir = crate_dir();
    let path = dir.join("include/granary.h");
    let generated = generate(&dir);

    if std::env::var_os("GRANARY_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(&path, &generated)
            .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        eprintln!("rewrote {}", path.display());
        return;
    }

    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "client-c/include/granary.h is out of date with client-c/src/ffi (first difference at {}).\n\
         Regenerate it with\n    GRANARY_BLESS=1 cargo test --release -p granary-client --test header\n\
         then review and commit the diff.",
        first_difference(&committed, &generated)
    );
}

#[test]
fn header_states_the_abi_version() {
    let dir = crate_dir();
    let generated = generate(&dir);
    let v = granary::ABI_VERSION;
    assert!(
        generated.contains(&format!("#define GRANARY_ABI_VERSION {v}")),
        "the header must define GRANARY_ABI_VERSION {v}"
    );
    assert!(
        generated.contains(&format!("ABI version {v} ")),
        "the header comment (client-c/cbindgen.toml) must name ABI version {v}"
    );
    // Opaque handles stay incomplete types.
    for handle in ["granary_client", "granary_session", "granary_batch"] {
        assert!(
            generated.contains(&format!("typedef struct {handle} {handle};")),
            "{handle} must be an opaque (incomplete) struct"
        );
    }
    for code in granary::ErrorCode::ALL {
        let name = match code {
            granary::ErrorCode::Ok => "GRANARY_OK".to_owned(),
            c => format!("GRANARY_E_{}", screaming(&format!("{c:?}"))),
        };
        assert!(
            generated.contains(&format!("{name} = {},", code.as_i32())),
            "the header must define {name} = {}",
            code.as_i32()
        );
    }
}

fn screaming(camel: &str) -> String {
    let mut out = String::new();
    for (i, ch) in camel.chars().enumerate() {
        if ch.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(ch.to_ascii_uppercase());
    }
    out
}

//! Links libgranary.so so that it exports its C API (`granary_*`) and no
//! symbol of a crate linked into it: crc-fast, for one, exports its own C
//! interface when another crate of the same build (object_store, in the
//! agent) turns that feature on. `--exclude-libs ALL` hides every symbol
//! that comes from an archive, which every dependency's rlib is.

fn main() {
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,--exclude-libs,ALL");
    }
}

//! Fuzzes the agent's configuration parser (`Config::from_toml_str`, which
//! also validates): any text given as a configuration file either parses
//! into a configuration or is refused with an error that says what is
//! wrong; nothing panics. The `agent::config::fuzz_tests` unit tests mutate
//! valid files and build token soups with a seeded generator; this target
//! explores by coverage.
#![no_main]

use granary_agent::config::Config;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Config::from_toml_str(text) {
        Ok(cfg) => {
            let _ = format!("{cfg:?}");
        }
        Err(e) => {
            assert!(!e.to_string().is_empty(), "an error without a message");
        }
    }
});

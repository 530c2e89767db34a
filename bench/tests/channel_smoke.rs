//! The channel benchmark's quick run as a test: every contender runs (raw
//! AEAD, the channel on one thread with both call paths, loopback TCP),
//! every block it moves is checked byte for byte before timing (the run
//! fails otherwise), and the last line is the result with a verdict.

use granary_bench::report::json_num;
use granary_bench::smoke::result_line;
use std::process::Command;

#[test]
fn the_quick_run_moves_every_block_intact_and_judges_the_goal() {
    let out = Command::new(env!("CARGO_BIN_EXE_channel"))
        .args([
            "--quick",
            "--rounds",
            "2",
            "--ms",
            "5",
            "--tcp-mib",
            "2",
            "--sizes",
            "70000,300000",
        ])
        .output()
        .expect("run the channel benchmark");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let last = result_line(&stdout, "channel");
    assert!(
        last.contains("\"goal\":\"met\"") || last.contains("\"goal\":\"NOT met\""),
        "the goal was not judged: {last}"
    );
    // AES-GCM and ChaCha20-Poly1305 differ several times over on any CPU:
    // the suite the agent picks must be the faster one measured.
    assert!(last.contains("\"pick_is_fastest\":\"yes\""), "{last}");
    for key in ["raw_mb_s", "ratio"] {
        let v = json_num(last, key).unwrap_or(f64::NAN);
        assert!(v > 0.0 && v.is_finite(), "{key} = {v}: {last}");
    }
    for key in [
        "plain_300000_mb_s_per_core",
        "encrypted_direct_300000_mb_s_per_core",
        "encrypted_copying_70000_mb_s_per_core",
        "authenticated_direct_70000_mb_s_per_core",
    ] {
        let v = json_num(last, key).unwrap_or(f64::NAN);
        assert!(v > 0.0 && v.is_finite(), "{key} = {v}: {last}");
    }
}

//! `[dataset.prepare]` end to end: an engine over a folder of JPEGs made
//! here serves every sample decoded and resized, bytes equal to an
//! in-process preparation of the file and checked by the loader's CRC; a
//! corrupt file reaches the loader as `DECODE` while the others are served;
//! two sessions over the dataset share one preparation of each sample.

mod common;

use common::*;
use granary::{ErrorCode, SessionOptions};
use granary_agent::config::{Config, ResizeMode};
use granary_agent::source::prepared::image::{prepare, Scratch, Spec};
use granary_testkit::agent_toml::head;
use granary_tools::synth::SynthSpec;
use std::collections::BTreeMap;
use std::time::Duration;

const H: u32 = 40;
const W: u32 = 56;
const FILES: usize = 48;
/// The corrupt file's id: a JPEG cut short after its header.
const CORRUPT: u64 = 17;
/// Not a JPEG at all.
const TEXT: u64 = 30;

fn jpeg(w: u16, h: u16, seed: u8) -> Vec<u8> {
    let mut rgb = Vec::new();
    for y in 0..h {
        for x in 0..w {
            rgb.push((x as u8).wrapping_mul(5).wrapping_add(seed));
            rgb.push((y as u8).wrapping_mul(3));
            rgb.push(((x / 8 + y / 8) % 2 * 200) as u8);
        }
    }
    let mut out = Vec::new();
    jpeg_encoder::Encoder::new(&mut out, 85)
        .encode(&rgb, w, h, jpeg_encoder::ColorType::Rgb)
        .unwrap();
    out
}

#[test]
fn an_agent_serves_prepared_jpegs_and_a_decode_error_per_bad_file() {
    let _wd = watchdog("prepared", 240);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(data.join("a")).unwrap();
    let mut files = Vec::new();
    for i in 0..FILES as u64 {
        let bytes = match i {
            CORRUPT => {
                let mut j = jpeg(90, 60, 1);
                j.truncate(40);
                j
            }
            TEXT => b"a text file that the catalog takes for a sample".to_vec(),
            _ => jpeg(
                64 + (i as u16 * 13) % 200,
                48 + (i as u16 * 7) % 150,
                i as u8,
            ),
        };
        std::fs::write(data.join(format!("a/{i:03}.jpg")), &bytes).unwrap();
        files.push(bytes);
    }
    let sock = dir.path().join("granary.sock");
    let toml = format!(
        r#"
{head}
[[dataset]]
name = "{DATASET}"
root = "{data}"
[dataset.prepare]
resize = [{H}, {W}]
threads = 3
max_input_bytes = "1MiB"
staging_bytes = "2MiB"
"#,
        head = head(
            "64MiB",
            &sock,
            "max_inflight_reads = 8\nread_retries = 1\nretry_backoff_ms = 5",
            ""
        ),
        data = data.display()
    );
    let cfg = Config::from_toml_str(&toml).expect("test config");
    let agent = TestAgent::start_custom(
        dir,
        data.clone(),
        sock,
        SynthSpec::new(&data),
        cfg,
        Vec::new(),
    );

    let spec = Spec {
        height: H,
        width: W,
        mode: ResizeMode::Crop,
        max_pixels: 50_000_000,
        simd: true,
    };
    let want: Vec<Option<Vec<u8>>> = files
        .iter()
        .map(|f| {
            let mut out = vec![0u8; spec.output_bytes()];
            prepare(f, &spec, &mut Scratch::default(), &mut out)
                .ok()
                .map(|()| out)
        })
        .collect();
    assert!(want[CORRUPT as usize].is_none() && want[TEXT as usize].is_none());

    // Two jobs over the dataset, one after the other, each two epochs.
    let client = agent.client();
    for job in 0..2u64 {
        let mut o = SessionOptions::new(DATASET);
        o.seed = 11 + job;
        o.batch_size = 8;
        o.epoch_count = 2;
        let mut s = client.open_session(&o).unwrap();
        // The agent tells the loader the samples' shape.
        assert_eq!(s.info().prepared, Some([H, W, 3]));
        let mut seen: BTreeMap<(u32, u64), u32> = BTreeMap::new();
        while let Some(b) = next_or_end(&mut s, Duration::from_secs(60), "next_batch") {
            let mut failed = false;
            for smp in b.samples() {
                *seen.entry((b.epoch(), smp.id())).or_default() += 1;
                match &want[smp.id() as usize] {
                    None => {
                        assert_eq!(smp.error(), Some(ErrorCode::Decode), "sample {}", smp.id());
                        assert_eq!(smp.len(), 0);
                        failed = true;
                    }
                    Some(bytes) => {
                        assert_eq!(smp.status(), 0, "sample {}", smp.id());
                        assert_eq!(smp.len(), (H * W * 3) as usize);
                        assert!(smp.checksum_matches(), "sample {}", smp.id());
                        assert!(smp.to_vec() == *bytes, "sample {} differs", smp.id());
                    }
                }
            }
            if failed {
                assert_eq!(b.error(), Some(ErrorCode::Io));
            } else {
                assert_eq!(b.status(), 0);
            }
            s.release(b).unwrap();
        }
        s.close().unwrap();
        assert_eq!(
            seen.len(),
            2 * FILES,
            "job {job}: every sample of both epochs"
        );
        assert!(seen.values().all(|&n| n == 1));
    }
    // Each good sample was read and prepared once for both jobs and both
    // epochs (the arena holds them all); each bad one failed once an epoch
    // at most (a failed sample is not cached).
    let reads = agent.metrics.reads_submitted.get();
    assert!(
        (FILES as u64..=FILES as u64 + 2 * 2 * 2).contains(&reads),
        "{reads} reads"
    );
    assert!(agent.metrics.read_errors.get() >= 2);
    let a = agent.wait_idle(Duration::from_secs(10));
    assert_eq!(a.in_flight, 0);
    agent.stop();
}

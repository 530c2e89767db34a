//! A `[[mixture]]` of an Azure dataset (on Azurite) and a GCS dataset (on
//! fake-gcs-server), both emulators started by the test (`common_cloud`),
//! weights 0.75/0.25 over two epochs of 160 samples: every batch of 32
//! takes 24 and 8, every sample's bytes are its dataset's, and each object
//! is read from its store once.

mod common;
mod common_cloud;

use common::{
    assert_two_source_batches, bytes_by_id, epochs, store_config, watchdog, TestAgent, RETRYING,
};
use common_cloud::{Emulator, Kind};

const FILES: u64 = 120;

#[test]
fn azure_and_gcs_in_one_mixture_give_exact_batches() {
    let _w = watchdog("azure_and_gcs_in_one_mixture_give_exact_batches", 240);
    let (az, gcs) = (
        Emulator::start(Kind::Azurite),
        Emulator::start(Kind::FakeGcs),
    );
    let dir = tempfile::tempdir().unwrap();
    let az_set = granary_testkit::dataset::synth_at(&dir.path().join("az"), FILES, 5, 4_000);
    let gcs_set = granary_testkit::dataset::synth_at(&dir.path().join("gcs"), FILES, 5, 3_000);
    assert_eq!(az.upload(&az_set.root, "train"), FILES);
    assert_eq!(gcs.upload(&gcs_set.root, "train"), FILES);
    let datasets = format!(
        "{}{}\n[[mixture]]\nname = \"mix\"\nepoch_samples = 160\n\
         [[mixture.source]]\ndataset = \"az\"\nweight = 0.75\n\
         [[mixture.source]]\ndataset = \"gcs\"\nweight = 0.25\n",
        az.table("az", "train", ""),
        gcs.table("gcs", "train", "")
    );
    let sock = dir.path().join("granary.sock");
    let cfg = store_config(&sock, "64MiB", RETRYING, &datasets);
    let agent = TestAgent::start_custom(
        dir,
        az_set.root.clone(),
        sock.clone(),
        az_set.clone(),
        cfg,
        Vec::new(),
    );
    let (az_bytes, gcs_bytes) = (bytes_by_id(&sock, "az"), bytes_by_id(&sock, "gcs"));
    assert_eq!(az_bytes.len(), FILES as usize);
    assert_eq!(gcs_bytes.len(), FILES as usize);
    let reads_before = agent.metrics.reads_submitted.get();
    assert_eq!(reads_before, 2 * FILES, "one GET per object so far");

    let mix = epochs(&sock, "mix", 2, || {});
    assert_eq!(mix.len(), 320, "two epochs of 160");
    assert_two_source_batches(&mix, FILES, (24, 8), &az_bytes, &gcs_bytes);
    let m = &agent.metrics;
    assert_eq!(m.read_errors.get(), 0);
    println!(
        "cloud mixture: {} store reads for the mixture's two epochs (its samples are cached under the mixture's own name)",
        m.reads_submitted.get() - reads_before
    );
    agent.stop();
}

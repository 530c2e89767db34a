//! How `bench/stall_train.py` is told to run each loader of `bench/run
//! stall`: the arguments that make its settings (docs/benchmarks.md has
//! them with their reasons). `bench/run latency` runs the per-sample ones
//! with the same arguments.

/// Every contender of `bench/run stall`, Granary's first.
pub const CONTENDERS: &[&str] = &[
    "granary",
    "granary_workers",
    "granary_w0",
    "granary_c",
    "boto3_w8",
    "boto3_w32",
    "boto3_threads",
    "s3torch_map",
    "s3torch_iter",
    "streaming",
    "litdata",
    "webdataset",
    "dali",
];

/// The contenders that run with `--decode` only (DALI is a decoder).
pub const DECODE_ONLY: &[&str] = &["dali"];

/// The `stall_train.py` arguments of contender `name`, if it is one of
/// its loaders (the C loader is not).
pub fn args(name: &str) -> Option<&'static [&'static str]> {
    Some(match name {
        // The default path (docs/python.md): the training process, fetched
        // ahead by `granary.cuda.prefetch`, no DataLoader worker.
        "granary" => &["--contender", "granary_main", "--workers", "0"],
        "granary_workers" => &["--contender", "granary", "--workers", "2"],
        "granary_w0" => &["--contender", "granary", "--workers", "0"],
        "boto3_w8" => &["--contender", "boto3", "--workers", "8"],
        "boto3_w32" => &["--contender", "boto3", "--workers", "32"],
        "boto3_threads" => &[
            "--contender",
            "boto3_threads",
            "--workers",
            "4",
            "--threads",
            "16",
        ],
        "s3torch_map" => &["--contender", "s3torch_map", "--workers", "8"],
        "s3torch_iter" => &["--contender", "s3torch_iter", "--workers", "8"],
        "streaming" => &["--contender", "streaming", "--workers", "8"],
        "litdata" => &["--contender", "litdata", "--workers", "8"],
        "webdataset" => &["--contender", "webdataset", "--workers", "8"],
        // DALI's own thread pool (`num_threads`), in the training process.
        "dali" => &["--contender", "dali", "--workers", "8"],
        _ => return None,
    })
}

/// With `--decode`, how contender `name` decodes and resizes its JPEGs
/// (`stall_train.py --decoder`): the way its own docs recommend
/// (`bench/stall_decode.py` has each with its reference). None: it does
/// not decode (`granary` reads samples the agent prepared; the C loader
/// does not run with `--decode`).
pub fn decoder(name: &str) -> Option<&'static str> {
    match name {
        "granary" | "granary_c" => None,
        // webdataset's README: `.decode("pil")` then torchvision transforms;
        // mosaicml-streaming: its image encodings decode with PIL, its
        // examples then apply torchvision transforms.
        "streaming" | "webdataset" => Some("pil"),
        "dali" => Some("dali"),
        // Granary without `prepare` (docs/python.md: torchvision's
        // `decode_jpeg`, as `granary.torch.decode_jpeg`), and the loaders
        // whose docs recommend no decoder of their own.
        _ => Some("torchvision"),
    }
}

/// The loaders that fetch each sample with its own request, which
/// `bench/run latency` can run against a store of plain files.
pub const PER_SAMPLE: &[&str] = &["boto3_threads", "s3torch_map", "s3torch_iter"];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_loader_names_its_script_contender_and_workers() {
        for &name in CONTENDERS.iter().filter(|&&n| n != "granary_c") {
            let a = args(name).unwrap_or_else(|| panic!("{name}"));
            assert_eq!(a[0], "--contender", "{name}");
            assert!(a.windows(2).any(|w| w[0] == "--workers"), "{name}");
        }
        assert_eq!(args("granary_c"), None, "the C loader is not a script");
        assert_eq!(args("boto3_w32").unwrap()[3], "32");
        assert!(PER_SAMPLE.iter().all(|n| args(n).is_some()));
    }

    #[test]
    fn every_decoding_loader_has_its_docs_decoder() {
        for &name in CONTENDERS {
            match decoder(name) {
                None => assert!(["granary", "granary_c"].contains(&name), "{name}"),
                Some(d) => assert!(["torchvision", "pil", "dali"].contains(&d), "{name}: {d}"),
            }
        }
        assert_eq!(decoder("webdataset"), Some("pil"));
        assert_eq!(decoder("streaming"), Some("pil"));
        assert_eq!(decoder("granary_workers"), Some("torchvision"));
        assert_eq!(decoder("dali"), Some("dali"));
        assert!(DECODE_ONLY.iter().all(|n| CONTENDERS.contains(n)));
    }
}

//! The sweep's pure parts: agent keys, sample headers, repeats' medians
//! and CPU accounting.

use granary_tools::synth;

use super::cpu::CpuUse;
use super::loaders::check_header;
use super::measure::median_point;
use super::point::Point;
use super::scenario::parse_keys;

#[test]
fn agent_keys_parse_into_sections() {
    let got = parse_keys("prefetch.read_retries = 5; dataset.max_inflight=64;").unwrap();
    assert_eq!(
        got,
        vec![
            ("prefetch".to_owned(), "read_retries = 5".to_owned()),
            ("dataset".to_owned(), "max_inflight = 64".to_owned()),
        ]
    );
    assert!(parse_keys("nosection=1").is_err());
    assert!(parse_keys("a.b").is_err());
    assert!(parse_keys("").unwrap().is_empty());
}

#[test]
fn headers_are_checked_against_the_catalog() {
    let mut spec = synth::SynthSpec::new("/nonexistent");
    spec.num_files = 10;
    spec.num_classes = 2;
    let mut buf = Vec::new();
    spec.render(7, &mut buf);
    let class = i32::try_from(spec.class_of(7)).unwrap();
    assert!(check_header(7, class, &buf).is_ok());
    assert!(check_header(6, class, &buf).is_err());
    assert!(check_header(7, class + 1, &buf).is_err());
    assert!(check_header(7, class, &buf[..buf.len() - 1]).is_err());
}

#[test]
fn repeats_keep_the_median_and_failures_count_lowest() {
    let at = |r: f64| Point {
        samples_per_s: r,
        ..Point::default()
    };
    let p = median_point(vec![at(30.0), at(10.0), at(20.0)]);
    assert_eq!(p.samples_per_s, 20.0);
    assert_eq!(p.repeats, vec![30.0, 10.0, 20.0]);
    // An even count keeps the lower middle; a failed repeat ranks last.
    let p = median_point(vec![
        at(30.0),
        Point::failed("x".into()),
        at(10.0),
        at(20.0),
    ]);
    assert_eq!(p.samples_per_s, 10.0);
    let p = median_point(vec![at(5.0)]);
    assert_eq!(p.samples_per_s, 5.0);
    assert!(p.repeats.is_empty());
    assert!(median_point(Vec::new()).error.is_some());
}

#[test]
fn cpu_per_sample_divides_cores_by_the_rate() {
    let u = CpuUse {
        store: 0.5,
        engine: 0.2,
        fetcher: 0.3,
        loader: 0.1,
        ..CpuUse::default()
    };
    let us = u.us_per_sample(1000.0);
    assert_eq!(us[0], ("store", 500.0));
    assert!((us[2].1 - 500.0).abs() < 1e-9);
    assert!((us[5].1 - 600.0).abs() < 1e-9);
    assert!(u.us_per_sample(0.0)[0].1.is_nan());
    // The light store's threads are part of this process: not "others".
    let inside = CpuUse {
        store: 0.5,
        store_in_process: true,
        own: 1.0,
        busy: 1.2,
        ..CpuUse::default()
    };
    assert!((inside.rest() - 0.2).abs() < 1e-9);
}

#[test]
fn contention_is_what_nobody_here_used() {
    let u = CpuUse {
        store: 1.0,
        own: 0.5,
        python: 0.2,
        busy: 2.0,
        ..CpuUse::default()
    };
    assert!((u.rest() - 0.3).abs() < 1e-9);
    let mut p = Point::failed("x".into());
    p.cpu = u;
    assert!(p.per_store_core().is_nan());
    p.samples_per_s = 2000.0;
    assert!((p.per_store_core() - 2000.0).abs() < 1e-9);
}

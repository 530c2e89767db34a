//! The relaunch checks and the options' rules.

use super::measure::check_steps;
use super::options::{Kind, Options, Opts};
use super::scenario::{planned_steps, relaunch_layout};

#[test]
fn relaunch_layouts_name_view_indices_of_members_sorted_by_id() {
    assert_eq!(relaunch_layout(&[0, 1, 2]), "0,1,2");
    // "n10" sorts before "n2".
    assert_eq!(relaunch_layout(&[2, 10, 0]), "2,1,0");
    let o = Options {
        scenarios: Some("relaunch".into()),
        relaunch_locality: true,
        ..Options::default()
    };
    assert!(Opts::parse(&o).unwrap().relaunch_locality);
}

fn opts(samples: u64) -> Opts {
    let o = Options {
        samples: Some(samples),
        scenarios: Some("relaunch".into()),
        ..Options::default()
    };
    Opts::parse(&o).unwrap()
}

/// The job-wide step hashes a relaunch delivers when it runs steps
/// `0..stop` with (w0, b0) and `from..` with (w1, b1).
fn delivered(o: &Opts, stop: usize, from: usize) -> Vec<(Vec<u64>, u32, u32)> {
    let mut before = planned_steps(o, 4, 24, 1);
    before.truncate(stop);
    let mut after = planned_steps(o, 3, 32, 1);
    for h in &mut after[..from] {
        *h = 0;
    }
    vec![(before, 4, 24), (after, 3, 32)]
}

#[test]
fn the_global_step_does_not_depend_on_the_world_size() {
    let o = opts(1200);
    assert_eq!(
        (o.world_in(Kind::Relaunch), o.batch_in(Kind::Relaunch)),
        (4, 24)
    );
    assert_eq!(o.global_batch(), 96);
    assert_eq!(planned_steps(&o, 4, 24, 1), planned_steps(&o, 3, 32, 1));
    let r = check_steps(&o, 1, 6, &delivered(&o, 6, 6));
    assert_eq!(r.steps, 13);
    assert_eq!(r.planner_differing, 0);
    assert_eq!((r.twice, r.missing, r.wrong_side), (0, 0, 0));
    assert_eq!((r.union_extra, r.union_missing, r.padding), (0, 0, 0));
}

#[test]
fn a_step_run_twice_or_skipped_is_reported() {
    let o = opts(1200);
    let r = check_steps(&o, 1, 6, &delivered(&o, 6, 5));
    assert_eq!((r.twice, r.missing, r.wrong_side), (1, 0, 1));
    let r = check_steps(&o, 1, 6, &delivered(&o, 5, 6));
    assert_eq!((r.twice, r.missing, r.wrong_side), (0, 1, 0));
}

#[test]
fn padding_shows_in_the_union() {
    // 1,201 is a multiple of neither 4 nor 3: both worlds pad, so the
    // last step differs between them and the union repeats samples.
    let o = opts(1201);
    let r = check_steps(&o, 1, 6, &delivered(&o, 6, 6));
    assert_eq!(r.padding, 2);
    assert_eq!(r.planner_differing, 1);
    assert_eq!((r.union_extra, r.union_missing), (2, 0));
}

#[test]
fn relaunch_needs_a_global_batch_the_old_world_divides() {
    let o = Options {
        batch: Some(30),
        scenarios: Some("relaunch".into()),
        ..Options::default()
    };
    assert!(Opts::parse(&o).is_err());
}

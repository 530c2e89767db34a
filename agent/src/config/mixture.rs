//! `[[mixture]]`: a dataset made of other datasets, each with its share of
//! every batch (`docs/mixtures.md`).
//!
//! A mixture names `[[dataset]]`s of any kind; loaders open it by its name
//! like a dataset. Each `[[mixture.source]]` sets its share one of two
//! ways, the same for every source of a mixture:
//!
//! * `weight`: the sources' weights divide each epoch of
//!   `epoch_samples` samples (default: the members' samples added up);
//! * `repeat` or `choose` (or neither: each sample once): a source's
//!   samples per epoch; the epoch is their sum, and each batch takes the
//!   sources in those proportions.

use serde::Deserialize;

/// Most sources in one mixture.
pub(crate) const MAX_MIXTURE_SOURCES: usize = 256;
/// Largest `repeat`.
pub(crate) const MAX_REPEAT: f64 = 1_000_000.0;

/// One `[[mixture]]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MixtureConfig {
    /// The name loaders open it by; unique among datasets and mixtures.
    pub name: String,
    /// Samples per epoch when the sources have weights (default: the
    /// members' samples added up). Not allowed with `repeat`/`choose`.
    #[serde(default)]
    pub epoch_samples: Option<u64>,
    /// `[[mixture.source]]`: the datasets it mixes, in order (a sample's
    /// id is its index in its dataset plus the samples of the sources
    /// before it).
    #[serde(default)]
    pub source: Vec<MixtureSource>,
}

// Weights are checked finite at validation; equality is only used to
// compare whole configurations.
impl Eq for MixtureConfig {}

/// One `[[mixture.source]]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MixtureSource {
    /// The `[[dataset]]` it takes samples from.
    pub dataset: String,
    /// Its share of every batch, relative to the other sources' weights.
    #[serde(default)]
    pub weight: Option<f64>,
    /// Upsampling (or downsampling below 1): each epoch takes
    /// `round(repeat × samples)` of its samples, every sample `repeat`
    /// times on average (whole passes, then part of one more).
    #[serde(default)]
    pub repeat: Option<f64>,
    /// Downsampling: each epoch takes this many of its samples (an
    /// integer), or this fraction of them (a number in (0, 1]), a
    /// different choice every epoch.
    #[serde(default)]
    pub choose: Option<Choose>,
}

/// `mixture[i].source[j].choose`.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum Choose {
    /// An integer: samples per epoch.
    Count(u64),
    /// A number in (0, 1]: the fraction of its samples per epoch.
    Fraction(f64),
}

impl MixtureConfig {
    /// Whether its sources set their shares by weight (else by
    /// `repeat`/`choose`).
    pub fn weighted(&self) -> bool {
        self.source.iter().any(|s| s.weight.is_some())
    }
}

/// The problems of `mixtures` against the configured `datasets`' names:
/// `(field, why)`, in order.
pub(super) fn problems(mixtures: &[MixtureConfig], datasets: &[&str]) -> Vec<(String, String)> {
    use super::dataset::MAX_DATASET_NAME_BYTES;
    let mut out = Vec::new();
    let mut names: Vec<&str> = Vec::new();
    for (i, m) in mixtures.iter().enumerate() {
        let mut bad = |key: String, why: String| out.push((format!("mixture[{i}]{key}"), why));
        let name = m.name.as_str();
        if name.is_empty() {
            bad(".name".into(), "must not be empty".into());
        } else if name.len() > MAX_DATASET_NAME_BYTES {
            bad(
                ".name".into(),
                format!(
                    "is {} bytes long; at most {MAX_DATASET_NAME_BYTES}",
                    name.len()
                ),
            );
        } else if name.chars().any(char::is_control) {
            bad(
                ".name".into(),
                format!("{name:?} contains control characters"),
            );
        } else if datasets.contains(&name) {
            bad(
                ".name".into(),
                format!("{name:?} is the name of a [[dataset]]: loaders open both by name"),
            );
        } else if names.contains(&name) {
            bad(
                ".name".into(),
                format!("{name:?} is used by an earlier mixture"),
            );
        }
        names.push(name);
        if m.source.is_empty() {
            bad(
                ".source".into(),
                "a mixture needs at least one [[mixture.source]]".into(),
            );
        } else if m.source.len() > MAX_MIXTURE_SOURCES {
            bad(
                ".source".into(),
                format!("{} sources; at most {MAX_MIXTURE_SOURCES}", m.source.len()),
            );
        }
        let weighted = m.weighted();
        match m.epoch_samples {
            Some(_) if !weighted => bad(
                ".epoch_samples".into(),
                "is for sources with weights; with repeat/choose the epoch is their sum".into(),
            ),
            Some(0) => bad(".epoch_samples".into(), "must be at least 1".into()),
            Some(n) if n > crate::planner::MAX_SAMPLES => bad(
                ".epoch_samples".into(),
                format!("{n} is above the planner's {}", crate::planner::MAX_SAMPLES),
            ),
            _ => {}
        }
        let mut seen: Vec<&str> = Vec::new();
        for (j, s) in m.source.iter().enumerate() {
            let field = |k: &str| format!(".source[{j}].{k}");
            let ds = s.dataset.as_str();
            if names.contains(&ds) && !datasets.contains(&ds) {
                bad(
                    field("dataset"),
                    format!("{ds:?} is a mixture; a mixture mixes [[dataset]]s only"),
                );
            } else if !datasets.contains(&ds) {
                let known = datasets.join(", ");
                bad(
                    field("dataset"),
                    format!("{ds:?} is not a configured [[dataset]] (they are: {known})"),
                );
            } else if seen.contains(&ds) {
                bad(
                    field("dataset"),
                    format!("{ds:?} is already a source of this mixture"),
                );
            }
            seen.push(ds);
            match s.weight {
                Some(w) if !(w.is_finite() && w > 0.0) => bad(
                    field("weight"),
                    format!("{w} is not a positive number: every weight must be above 0"),
                ),
                None if weighted => bad(
                    field("weight"),
                    "is missing: give every source of a mixture a weight, or none".into(),
                ),
                _ => {}
            }
            if weighted && (s.repeat.is_some() || s.choose.is_some()) {
                let key = if s.repeat.is_some() {
                    "repeat"
                } else {
                    "choose"
                };
                bad(
                    field(key),
                    "is for mixtures without weights: with weights, each source's share of \
                     mixture.epoch_samples is its weight's"
                        .into(),
                );
            }
            if s.repeat.is_some() && s.choose.is_some() {
                bad(field("choose"), "give repeat or choose, not both".into());
            }
            if let Some(r) = s.repeat {
                if !(r.is_finite() && r > 0.0 && r <= MAX_REPEAT) {
                    bad(
                        field("repeat"),
                        format!("{r} is not a number above 0 and at most {MAX_REPEAT}"),
                    );
                }
            }
            match s.choose {
                Some(Choose::Count(0)) => bad(field("choose"), "must be at least 1".into()),
                Some(Choose::Count(n)) if n > crate::planner::MAX_SAMPLES => bad(
                    field("choose"),
                    format!("{n} is above the planner's {}", crate::planner::MAX_SAMPLES),
                ),
                Some(Choose::Fraction(f)) if !(f.is_finite() && f > 0.0 && f <= 1.0) => bad(
                    field("choose"),
                    format!("{f} is neither a whole number of samples nor a fraction in (0, 1]"),
                ),
                _ => {}
            }
        }
    }
    out
}

//! `[dataset.prepare]`: a dataset's optional prepare stage. The agent
//! decodes every sample (a JPEG) and resizes it to one fixed shape, and
//! caches and serves the result (uint8 RGB, height × width × 3) instead of
//! the file's bytes. See docs/prepare.md.

use super::size::ByteSize;
use serde::Deserialize;

/// Largest side of `resize`, in pixels.
pub(crate) const MAX_PREPARED_SIDE: u32 = 8192;
/// Most worker threads of one dataset's prepare stage.
pub(crate) const MAX_PREPARE_THREADS: u32 = 256;

/// How a decoded image is brought to the output shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ResizeMode {
    /// The largest centred region of the image with the output's aspect
    /// ratio, resized to the output (torchvision's `Resize(min(h, w))`
    /// then `CenterCrop((h, w))`). The default.
    #[default]
    Crop,
    /// The whole image resized to the output, the aspect ratio not kept.
    Stretch,
}

impl ResizeMode {
    /// The name written in the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            ResizeMode::Crop => "crop",
            ResizeMode::Stretch => "stretch",
        }
    }
}

/// `[dataset.prepare]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrepareConfig {
    /// `dataset[i].prepare.resize` (required): the output's `[height,
    /// width]` in pixels, each 1..=8192. Every prepared sample is
    /// `height * width * 3` bytes.
    pub resize: [u32; 2],
    /// `dataset[i].prepare.mode`: `"crop"` (the default) or `"stretch"`.
    #[serde(default)]
    pub mode: ResizeMode,
    /// `dataset[i].prepare.threads`: decode and resize threads of this
    /// dataset, 1..=256. Default 2.
    #[serde(default = "default_threads")]
    pub threads: u32,
    /// `dataset[i].prepare.max_pixels`: a JPEG whose header announces more
    /// pixels (width × height) fails with `DECODE` before it is decoded.
    /// Default 50,000,000; at least 1.
    #[serde(default = "default_max_pixels")]
    pub max_pixels: u64,
    /// `dataset[i].prepare.max_input_bytes`: a file larger than this fails
    /// with `DECODE` without being read. Default "32MiB"; at most
    /// `staging_bytes`.
    #[serde(default = "default_max_input_bytes")]
    pub max_input_bytes: ByteSize,
    /// `dataset[i].prepare.staging_bytes`: memory for files read and not
    /// yet decoded (outside the arena). Default "64MiB", at least
    /// `max_input_bytes`.
    #[serde(default = "default_staging_bytes")]
    pub staging_bytes: ByteSize,
}

fn default_threads() -> u32 {
    2
}
fn default_max_pixels() -> u64 {
    50_000_000
}
fn default_max_input_bytes() -> ByteSize {
    ByteSize(32 << 20)
}
fn default_staging_bytes() -> ByteSize {
    ByteSize(64 << 20)
}

impl PrepareConfig {
    /// Bytes of one prepared sample: height × width × 3 (validation keeps
    /// it below 2^32).
    pub fn output_bytes(&self) -> u64 {
        u64::from(self.resize[0]) * u64::from(self.resize[1]) * 3
    }

    /// The settings' problems, as (key under `prepare.`, message).
    pub(crate) fn problems(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        let [h, w] = self.resize;
        if !(1..=MAX_PREPARED_SIDE).contains(&h) || !(1..=MAX_PREPARED_SIDE).contains(&w) {
            out.push((
                "resize",
                format!("[{h}, {w}]: each side must be 1..={MAX_PREPARED_SIDE} pixels"),
            ));
        }
        if !(1..=MAX_PREPARE_THREADS).contains(&self.threads) {
            out.push((
                "threads",
                format!("{} is not in 1..={MAX_PREPARE_THREADS}", self.threads),
            ));
        }
        if self.max_pixels == 0 {
            out.push(("max_pixels", "must be at least 1".to_owned()));
        }
        if self.max_input_bytes.bytes() == 0 {
            out.push(("max_input_bytes", "must be at least 1 byte".to_owned()));
        } else if self.max_input_bytes.bytes() > self.staging_bytes.bytes() {
            out.push((
                "max_input_bytes",
                format!(
                    "{} bytes is above staging_bytes = {} bytes: such a file could never be staged",
                    self.max_input_bytes.bytes(),
                    self.staging_bytes.bytes()
                ),
            ));
        }
        if self.staging_bytes.bytes() > 1 << 40 {
            out.push(("staging_bytes", "must be at most 1 TiB".to_owned()));
        }
        out
    }
}

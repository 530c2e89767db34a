//! One sample's preparation: a JPEG decoded (`zune-jpeg`) to RGB and
//! resized (`fast_image_resize`, bilinear with antialiasing) to the
//! dataset's fixed shape, written as uint8 height × width × 3 (HWC).
//!
//! Deterministic: the output depends on the input bytes and the settings
//! only. Both crates use integer arithmetic in their SIMD paths and pick
//! them at run time; `same_output_with_and_without_simd` checks on this
//! CPU that they give the bytes of the scalar paths (docs/prepare.md).

use crate::config::{PrepareConfig, ResizeMode};
use fast_image_resize::images::{Image, ImageRef};
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};
use std::fmt;
use zune_jpeg::zune_core::bytestream::ZCursor;
use zune_jpeg::zune_core::colorspace::ColorSpace;
use zune_jpeg::zune_core::options::DecoderOptions;
use zune_jpeg::JpegDecoder;

/// What one preparation needs to know: the output shape, the mode and the
/// limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spec {
    /// Output height in pixels.
    pub height: u32,
    /// Output width in pixels.
    pub width: u32,
    /// How the image is fitted to the output.
    pub mode: ResizeMode,
    /// Most pixels (width × height) a JPEG may announce.
    pub max_pixels: u64,
    /// Whether the decoder and the resizer may use the CPU's SIMD
    /// extensions (always, except in the test that compares both).
    pub simd: bool,
}

impl Spec {
    /// The spec of a `[dataset.prepare]`.
    pub fn from_config(p: &PrepareConfig) -> Spec {
        Spec {
            height: p.resize[0],
            width: p.resize[1],
            mode: p.mode,
            max_pixels: p.max_pixels,
            simd: true,
        }
    }

    /// Bytes of one output: height × width × 3.
    pub fn output_bytes(&self) -> usize {
        self.height as usize * self.width as usize * 3
    }

    /// What a prepared sample's version token carries besides the stored
    /// sample's: the output and how it was made, so that agents preparing
    /// a dataset differently do not share its samples (the peers'
    /// fingerprint, the warm restart's index).
    pub fn token(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"prep1:jpeg-rgb8:bilinear:");
        out.extend_from_slice(self.mode.as_str().as_bytes());
        out.extend_from_slice(&self.height.to_le_bytes());
        out.extend_from_slice(&self.width.to_le_bytes());
    }
}

/// Why a sample could not be prepared (reported as `DECODE`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PrepareError {
    /// The bytes are not a JPEG the decoder can read.
    Decode(String),
    /// The JPEG announces more pixels than `max_pixels`.
    TooManyPixels {
        /// Width from the header.
        width: usize,
        /// Height from the header.
        height: usize,
        /// The limit.
        max: u64,
    },
    /// The file is larger than `max_input_bytes`.
    TooLarge {
        /// The file's size.
        bytes: u64,
        /// The limit.
        max: u64,
    },
    /// The resizer refused (an internal error: the shapes are checked).
    Resize(String),
}

impl fmt::Display for PrepareError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PrepareError::Decode(e) => write!(f, "not a decodable JPEG: {e}"),
            PrepareError::TooManyPixels { width, height, max } => write!(
                f,
                "the JPEG is {width}x{height} pixels, more than prepare.max_pixels = {max}"
            ),
            PrepareError::TooLarge { bytes, max } => write!(
                f,
                "the file is {bytes} bytes, more than prepare.max_input_bytes = {max}"
            ),
            PrepareError::Resize(e) => write!(f, "resize failed: {e}"),
        }
    }
}

impl std::error::Error for PrepareError {}

/// One worker's reusable state: the decoded image's buffer and the
/// resizer's.
#[derive(Default)]
pub struct Scratch {
    decoded: Vec<u8>,
    resizer: Resizer,
}

impl fmt::Debug for Scratch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scratch")
            .field("decoded", &self.decoded.capacity())
            .finish()
    }
}

/// Decodes `jpeg` and writes it, resized to `spec`'s shape, into `out`
/// (exactly [`Spec::output_bytes`] long).
pub fn prepare(
    jpeg: &[u8],
    spec: &Spec,
    scratch: &mut Scratch,
    out: &mut [u8],
) -> Result<(), PrepareError> {
    assert_eq!(out.len(), spec.output_bytes(), "output of the wrong size");
    let options = DecoderOptions::default()
        .jpeg_set_out_colorspace(ColorSpace::RGB)
        .set_max_width(usize::from(u16::MAX))
        .set_max_height(usize::from(u16::MAX))
        .set_use_unsafe(spec.simd);
    let mut dec = JpegDecoder::new_with_options(ZCursor::new(jpeg), options);
    dec.decode_headers()
        .map_err(|e| PrepareError::Decode(e.to_string()))?;
    let info = dec
        .info()
        .ok_or_else(|| PrepareError::Decode("no header".to_owned()))?;
    let (w, h) = (usize::from(info.width), usize::from(info.height));
    if w == 0 || h == 0 {
        return Err(PrepareError::Decode(format!("{w}x{h} pixels")));
    }
    if (w as u64) * (h as u64) > spec.max_pixels {
        return Err(PrepareError::TooManyPixels {
            width: w,
            height: h,
            max: spec.max_pixels,
        });
    }
    let size = dec
        .output_buffer_size()
        .ok_or_else(|| PrepareError::Decode("image size overflows".to_owned()))?;
    if size != w * h * 3 {
        return Err(PrepareError::Decode(format!(
            "decodes to {size} bytes, not RGB {w}x{h}"
        )));
    }
    scratch.decoded.clear();
    scratch.decoded.resize(size, 0);
    dec.decode_into(&mut scratch.decoded)
        .map_err(|e| PrepareError::Decode(e.to_string()))?;

    let src = ImageRef::new(w as u32, h as u32, &scratch.decoded, PixelType::U8x3)
        .map_err(|e| PrepareError::Resize(e.to_string()))?;
    let mut dst = Image::from_slice_u8(spec.width, spec.height, out, PixelType::U8x3)
        .map_err(|e| PrepareError::Resize(e.to_string()))?;
    let mut opts = ResizeOptions::new().resize_alg(ResizeAlg::Convolution(FilterType::Bilinear));
    if spec.mode == ResizeMode::Crop {
        opts = opts.fit_into_destination(Some((0.5, 0.5)));
    }
    if !spec.simd {
        crate::sys::scalar_resizer(&mut scratch.resizer);
    }
    scratch
        .resizer
        .resize(&src, &mut dst, &opts)
        .map_err(|e| PrepareError::Resize(e.to_string()))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A `w`×`h` JPEG of a smooth pattern with sharp edges (quality 90,
    /// 4:2:0), as a camera would give.
    pub(crate) fn jpeg(w: u16, h: u16, seed: u8) -> Vec<u8> {
        let mut rgb = Vec::with_capacity(usize::from(w) * usize::from(h) * 3);
        for y in 0..h {
            for x in 0..w {
                let edge = if (x / 16 + y / 16) % 2 == 0 { 60 } else { 0 };
                rgb.push(
                    (x as u8)
                        .wrapping_mul(3)
                        .wrapping_add(seed)
                        .wrapping_add(edge),
                );
                rgb.push((y as u8).wrapping_mul(2).wrapping_add(edge));
                rgb.push(((x ^ y) as u8).wrapping_add(seed));
            }
        }
        let mut out = Vec::new();
        jpeg_encoder::Encoder::new(&mut out, 90)
            .encode(&rgb, w, h, jpeg_encoder::ColorType::Rgb)
            .unwrap();
        out
    }

    fn spec(h: u32, w: u32, mode: ResizeMode) -> Spec {
        Spec {
            height: h,
            width: w,
            mode,
            max_pixels: 50_000_000,
            simd: true,
        }
    }

    fn run(bytes: &[u8], s: &Spec) -> Result<Vec<u8>, PrepareError> {
        let mut out = vec![0u8; s.output_bytes()];
        prepare(bytes, s, &mut Scratch::default(), &mut out).map(|()| out)
    }

    #[test]
    fn the_same_bytes_give_the_same_output_twice_in_both_modes() {
        let j = jpeg(333, 250, 7);
        for mode in [ResizeMode::Crop, ResizeMode::Stretch] {
            let s = spec(64, 48, mode);
            let a = run(&j, &s).unwrap();
            // Another scratch, and one reused after another image.
            let mut scratch = Scratch::default();
            let mut b = vec![0u8; s.output_bytes()];
            prepare(&jpeg(500, 90, 1), &s, &mut scratch, &mut b).unwrap();
            prepare(&j, &s, &mut scratch, &mut b).unwrap();
            assert_eq!(a.len(), 64 * 48 * 3);
            assert_eq!(a, b, "{mode:?}");
            // Not a blank image.
            assert!(a.iter().any(|&v| v > 100) && a.iter().any(|&v| v < 50));
        }
    }

    #[test]
    fn crop_and_stretch_differ_and_a_same_size_stretch_is_the_decode() {
        let j = jpeg(320, 160, 3);
        let crop = run(&j, &spec(80, 80, ResizeMode::Crop)).unwrap();
        let stretch = run(&j, &spec(80, 80, ResizeMode::Stretch)).unwrap();
        assert_ne!(crop, stretch);
        // At the image's own size both modes are the decoded pixels.
        let same = run(&j, &spec(160, 320, ResizeMode::Stretch)).unwrap();
        let decoded = JpegDecoder::new_with_options(
            ZCursor::new(&j),
            DecoderOptions::default().jpeg_set_out_colorspace(ColorSpace::RGB),
        )
        .decode()
        .unwrap();
        assert_eq!(same, decoded);
        assert_eq!(run(&j, &spec(160, 320, ResizeMode::Crop)).unwrap(), decoded);
    }

    #[test]
    fn the_crop_keeps_the_centre() {
        // A wide image whose left and right quarters are red and its middle
        // green: the square crop is all green.
        let (w, h) = (400u16, 100u16);
        let mut rgb = Vec::new();
        for _ in 0..h {
            for x in 0..w {
                let mid = (150..250).contains(&x);
                rgb.extend_from_slice(if mid { &[0, 255, 0] } else { &[255, 0, 0] });
            }
        }
        let mut j = Vec::new();
        jpeg_encoder::Encoder::new(&mut j, 95)
            .encode(&rgb, w, h, jpeg_encoder::ColorType::Rgb)
            .unwrap();
        let out = run(&j, &spec(10, 10, ResizeMode::Crop)).unwrap();
        for px in out.chunks(3).skip(10).take(80) {
            assert!(px[1] > 200 && px[0] < 60, "{px:?}");
        }
        let out = run(&j, &spec(10, 40, ResizeMode::Stretch)).unwrap();
        assert!(out[0] > 200 && out[1] < 60, "{:?}", &out[..3]);
    }

    #[test]
    fn same_output_with_and_without_simd() {
        for (w, h, seed) in [(333, 250, 7), (64, 480, 2), (1000, 667, 9)] {
            let j = jpeg(w, h, seed);
            for mode in [ResizeMode::Crop, ResizeMode::Stretch] {
                let fast = spec(224, 224, mode);
                let scalar = Spec {
                    simd: false,
                    ..fast
                };
                assert_eq!(run(&j, &fast).unwrap(), run(&j, &scalar).unwrap());
            }
        }
    }

    #[test]
    fn grayscale_jpegs_come_out_rgb() {
        let gray: Vec<u8> = (0..64u32 * 32).map(|i| (i % 251) as u8).collect();
        let mut j = Vec::new();
        jpeg_encoder::Encoder::new(&mut j, 90)
            .encode(&gray, 64, 32, jpeg_encoder::ColorType::Luma)
            .unwrap();
        let out = run(&j, &spec(32, 64, ResizeMode::Stretch)).unwrap();
        for px in out.chunks(3) {
            assert!(px[0] == px[1] && px[1] == px[2], "{px:?}");
        }
    }

    #[test]
    fn corrupt_and_foreign_bytes_are_decode_errors() {
        let s = spec(32, 32, ResizeMode::Crop);
        let good = jpeg(100, 80, 5);
        let mut truncated = good[..good.len() / 3].to_vec();
        truncated.extend_from_slice(&[0xFF, 0xD9]);
        let mut bad_header = good.clone();
        bad_header[2..6].copy_from_slice(&[0xFF, 0xC0, 0xFF, 0xFF]);
        for (what, bytes) in [
            ("empty", Vec::new()),
            ("text", b"not a jpeg at all".to_vec()),
            ("png", b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec()),
            ("header only", good[..20].to_vec()),
            ("bad header", bad_header),
        ] {
            match run(&bytes, &s) {
                Err(PrepareError::Decode(_)) => {}
                other => panic!("{what}: {other:?}"),
            }
        }
        // A truncated scan either fails or decodes to something; it never
        // panics or writes outside the output.
        let _ = run(&truncated, &s);
    }

    #[test]
    fn an_image_over_max_pixels_is_refused_from_its_header() {
        let j = jpeg(300, 200, 1);
        let s = Spec {
            max_pixels: 300 * 200 - 1,
            ..spec(32, 32, ResizeMode::Crop)
        };
        assert_eq!(
            run(&j, &s),
            Err(PrepareError::TooManyPixels {
                width: 300,
                height: 200,
                max: 59_999
            })
        );
        assert!(run(
            &j,
            &Spec {
                max_pixels: 60_000,
                ..s
            }
        )
        .is_ok());
        // A header that announces 65535x65535 (a decompression bomb of a
        // few bytes) is refused before any pixel is allocated.
        let mut bomb = j.clone();
        let sof = bomb.windows(2).position(|w| w == [0xFF, 0xC0]).unwrap();
        bomb[sof + 5..sof + 9].copy_from_slice(&[0xFF, 0xFF, 0xFF, 0xFF]);
        match run(&bomb, &spec(32, 32, ResizeMode::Crop)) {
            Err(PrepareError::TooManyPixels {
                width: 65535,
                height: 65535,
                ..
            }) => {}
            other => panic!("{other:?}"),
        }
    }
}

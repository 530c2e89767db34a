//! Byte sizes written as an integer or a string with a unit (`"2GiB"`).

use serde::de::{self, Deserializer, Unexpected, Visitor};
use serde::Deserialize;
use std::fmt;

pub(crate) const KIB: u64 = 1 << 10;
pub(crate) const MIB: u64 = 1 << 20;
pub(crate) const GIB: u64 = 1 << 30;
pub(crate) const TIB: u64 = 1 << 40;

/// A byte count, written in TOML as an integer or as a string with a unit.
///
/// Units (case-insensitive): none or `B`; binary `K`/`KiB`, `M`/`MiB`,
/// `G`/`GiB`, `T`/`TiB`; decimal `KB`, `MB`, `GB`, `TB`. A fraction is
/// allowed when the result is a whole number of bytes (`"1.5GiB"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// The size in bytes.
    pub fn bytes(self) -> u64 {
        self.0
    }

    /// Parses `"2GiB"`, `"512 MiB"`, `"1.5G"`, `"1000000"`, ….
    pub fn parse(s: &str) -> Result<ByteSize, String> {
        let t = s.trim();
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let unit = unit.trim();
        let mult = match unit.to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kib" => KIB,
            "m" | "mib" => MIB,
            "g" | "gib" => GIB,
            "t" | "tib" => TIB,
            "kb" => 1_000,
            "mb" => 1_000_000,
            "gb" => 1_000_000_000,
            "tb" => 1_000_000_000_000,
            _ => {
                return Err(format!(
                    "unknown unit {unit:?} (use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)"
                ))
            }
        };
        let (int, frac) = match num.split_once('.') {
            Some((i, f)) => (i, f),
            None => (num, ""),
        };
        if int.is_empty() && frac.is_empty() {
            return Err("no number".to_owned());
        }
        if frac.contains('.') {
            return Err("more than one decimal point".to_owned());
        }
        if frac.len() > 18 {
            return Err("too many decimal places".to_owned());
        }
        let too_big = || "too large for 64 bits".to_owned();
        let int_v: u128 = if int.is_empty() {
            0
        } else {
            int.parse().map_err(|_| too_big())?
        };
        let frac_v: u128 = if frac.is_empty() {
            0
        } else {
            frac.parse().map_err(|_| too_big())?
        };
        let scale = 10u128.pow(frac.len() as u32);
        let frac_bytes = frac_v * u128::from(mult);
        if !frac_bytes.is_multiple_of(scale) {
            return Err("not a whole number of bytes".to_owned());
        }
        let total = int_v
            .checked_mul(u128::from(mult))
            .and_then(|v| v.checked_add(frac_bytes / scale))
            .ok_or_else(too_big)?;
        u64::try_from(total).map(ByteSize).map_err(|_| too_big())
    }
}

impl fmt::Display for ByteSize {
    /// Writes the largest binary unit that divides the size exactly.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        for (unit, name) in [(TIB, "TiB"), (GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")] {
            if b != 0 && b.is_multiple_of(unit) {
                return write!(f, "{} {name}", b / unit);
            }
        }
        write!(f, "{b} B")
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a byte count: an integer or a string such as \"2GiB\" or \"512MiB\"")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ByteSize, E> {
                u64::try_from(v)
                    .map(ByteSize)
                    .map_err(|_| E::invalid_value(Unexpected::Signed(v), &self))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ByteSize, E> {
                ByteSize::parse(v).map_err(|why| {
                    E::custom(format_args!(
                        "invalid size {v:?}: {why}; expected bytes as an integer or a string such as \"2GiB\" or \"512MiB\""
                    ))
                })
            }
        }
        d.deserialize_any(V)
    }
}

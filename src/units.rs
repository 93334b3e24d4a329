//! Byte sizes as people write them in configuration: `4096`, `"4k"`, `"512KiB"`, `"30g"`.
//! Suffixes are binary (k = 1024), as in fio.

use serde::{Deserialize, Deserializer};
use std::fmt;

/// A size in bytes that deserializes from an integer or a string with a suffix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct ByteSize(pub u64);

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_bytes(self.0))
    }
}

impl std::str::FromStr for ByteSize {
    type Err = SizeError;

    fn from_str(text: &str) -> Result<Self, SizeError> {
        parse_bytes(text).map(ByteSize)
    }
}

/// Why a text is not a size; each names the text as given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    /// No number where one was expected.
    #[error("'{0}' is not a size (examples: 4096, \"4k\", \"30g\")")]
    NotASize(String),
    /// A suffix other than b, k, m, g, t (and their -b, -ib forms).
    #[error("'{text}': unknown size suffix '{suffix}' (use k, m, g or t)")]
    UnknownSuffix {
        /// The text as given.
        text: String,
        /// The suffix found.
        suffix: String,
    },
    /// 2^64 bytes or more.
    #[error("'{0}' is too large (sizes end below 16 EiB)")]
    TooLarge(String),
    /// A fraction of a byte.
    #[error("'{0}' is not a whole number of bytes")]
    NotWhole(String),
    /// A number of bytes under [`SMALLEST_BARE`] without a unit: nearly always a size
    /// meant in KiB or MiB.
    #[error(
        "{0} without a unit is {0} bytes, less than a sector: write \"{0}k\" for {0} KiB (or \"{0}b\" if you mean bytes)"
    )]
    NoUnit(u64),
}

/// The smallest size a bare number (no unit) may give: a sector. Below it a size needs
/// its unit (`"4k"`, or `"4b"` for bytes), so that `size = 4` cannot mean 4-byte
/// requests by accident.
pub const SMALLEST_BARE: u64 = 512;

/// Parses `"4k"`, `"4KiB"`, `"1.5g"`, `"512"`. Binary multiples.
pub fn parse_bytes(text: &str) -> Result<u64, SizeError> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    let not_a_size = || SizeError::NotASize(text.to_string());
    let too_large = || SizeError::TooLarge(text.to_string());
    if num.is_empty() {
        return Err(not_a_size());
    }
    let mult: u64 = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        other => {
            return Err(SizeError::UnknownSuffix {
                text: text.to_string(),
                suffix: other.to_string(),
            });
        }
    };
    // Whole numbers exactly (a region's offset near 2^64 must not be rounded).
    if !num.contains('.') {
        let n: u64 = num.parse().map_err(|e: std::num::ParseIntError| {
            if *e.kind() == std::num::IntErrorKind::PosOverflow {
                too_large()
            } else {
                not_a_size()
            }
        })?;
        if suffix.trim().is_empty() && (1..SMALLEST_BARE).contains(&n) {
            return Err(SizeError::NoUnit(n));
        }
        return n.checked_mul(mult).ok_or_else(too_large);
    }
    let value: f64 = num.parse().map_err(|_| not_a_size())?;
    let bytes = value * mult as f64;
    // 2^64 itself does not fit (`u64::MAX as f64` is 2^64).
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(too_large());
    }
    if bytes.fract() != 0.0 {
        return Err(SizeError::NotWhole(text.to_string()));
    }
    Ok(bytes as u64)
}

/// Short human form: `4 KiB`, `1.5 GiB`.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if v.fract() == 0.0 {
        format!("{v} {}", UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(SizeVisitor)
    }
}

/// Reads a size from a number of bytes or a string with its unit; anything else is "a
/// size", not an untagged enum's "did not match any variant".
struct SizeVisitor;

impl serde::de::Visitor<'_> for SizeVisitor {
    type Value = ByteSize;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a size: a number of bytes (512 or more) or a string such as \"4k\" or \"30g\"")
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<ByteSize, E> {
        match v {
            v if (1..SMALLEST_BARE as i64).contains(&v) => {
                Err(E::custom(SizeError::NoUnit(v as u64)))
            }
            v if v >= 0 => Ok(ByteSize(v as u64)),
            v => Err(E::custom(format!("size {v} is negative"))),
        }
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<ByteSize, E> {
        match i64::try_from(v) {
            Ok(v) => self.visit_i64(v),
            Err(_) => Ok(ByteSize(v)),
        }
    }

    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<ByteSize, E> {
        parse_bytes(s).map(ByteSize).map_err(E::custom)
    }
}

/// A [`ByteSize`] field held as `u32` (an SLO's request size): the same forms, and a
/// size of 4 GiB or more refused.
pub fn size_u32<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    let ByteSize(bytes) = ByteSize::deserialize(d)?;
    u32::try_from(bytes)
        .map_err(|_| serde::de::Error::custom(format!("{} is 4 GiB or more", format_bytes(bytes))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_number_under_a_sector_needs_its_unit() {
        let e = parse_bytes("4").unwrap_err();
        assert_eq!(e, SizeError::NoUnit(4));
        assert_eq!(
            e.to_string(),
            "4 without a unit is 4 bytes, less than a sector: write \"4k\" for 4 KiB (or \"4b\" if you mean bytes)"
        );
        assert_eq!(parse_bytes("4b"), Ok(4));
        assert_eq!(parse_bytes("0"), Ok(0), "an offset of 0 needs no unit");
        assert_eq!(parse_bytes("511").unwrap_err(), SizeError::NoUnit(511));
        assert_eq!(parse_bytes("512"), Ok(512));
        let toml_int: Result<ByteSize, _> = toml::from_str::<toml::Table>("s = 256")
            .unwrap()
            .remove("s")
            .unwrap()
            .try_into();
        assert!(
            toml_int
                .unwrap_err()
                .to_string()
                .contains("256 without a unit")
        );
    }

    #[test]
    fn parses_common_forms() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("4k"), Ok(4096));
        assert_eq!(parse_bytes("4KiB"), Ok(4096));
        assert_eq!(parse_bytes("512 KB"), Ok(512 * 1024));
        assert_eq!(parse_bytes("1.5g"), Ok(3 << 29));
        assert_eq!(parse_bytes("30G"), Ok(30 << 30));
        assert!(
            parse_bytes("4q")
                .unwrap_err()
                .to_string()
                .contains("unknown size suffix")
        );
        assert!(
            parse_bytes("big")
                .unwrap_err()
                .to_string()
                .contains("not a size")
        );
        assert!(
            parse_bytes("0.3k")
                .unwrap_err()
                .to_string()
                .contains("whole number")
        );
        // Exact near 2^64, and 2^64 itself refused, not saturated.
        assert_eq!(parse_bytes("18446744073709547520"), Ok(u64::MAX - 4095));
        assert_eq!(parse_bytes("9223372036854775809"), Ok((1 << 63) + 1));
        assert_eq!(parse_bytes("16777215t"), Ok(u64::MAX - (1 << 40) + 1));
        assert!(
            parse_bytes("16777216t")
                .unwrap_err()
                .to_string()
                .contains("too large")
        );
        assert!(
            parse_bytes("18446744073709551616")
                .unwrap_err()
                .to_string()
                .contains("too large")
        );
        assert!(
            parse_bytes("16777216.0t")
                .unwrap_err()
                .to_string()
                .contains("too large")
        );
        assert!(
            parse_bytes("")
                .unwrap_err()
                .to_string()
                .contains("not a size")
        );
        // The error names its kind, for a caller to act on.
        assert_eq!(
            parse_bytes("4q"),
            Err(SizeError::UnknownSuffix {
                text: "4q".into(),
                suffix: "q".into()
            })
        );
        assert_eq!(parse_bytes("0.3k"), Err(SizeError::NotWhole("0.3k".into())));
    }

    #[test]
    fn formats_round_units() {
        assert_eq!(format_bytes(4096), "4 KiB");
        assert_eq!(format_bytes(3 << 29), "1.5 GiB");
        assert_eq!(format_bytes(100), "100 B");
    }
}

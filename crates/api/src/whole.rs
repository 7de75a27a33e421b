//! Integer fields of request bodies that accept every JSON number JSON Schema calls an
//! integer: `3` and `3.0` alike (JSON Schema's `"type": "integer"` is "a number with a zero
//! fractional part", so the OpenAPI document promises both). Fractions, negatives and values
//! out of the field's range are refused with serde's usual message.

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize};

/// A non-negative integer read from any integral JSON number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Whole(u64);

/// 2^64 as an f64: the first value past `u64::MAX`.
const TWO_POW_64: f64 = 18_446_744_073_709_551_616.0;

impl<'de> Deserialize<'de> for Whole {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Whole, D::Error> {
        struct WholeVisitor;

        impl Visitor<'_> for WholeVisitor {
            type Value = Whole;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a non-negative integer")
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Whole, E> {
                Ok(Whole(v))
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Whole, E> {
                u64::try_from(v)
                    .map(Whole)
                    .map_err(|_| E::invalid_value(de::Unexpected::Signed(v), &self))
            }

            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Whole, E> {
                if v.is_finite() && v.fract() == 0.0 && (0.0..TWO_POW_64).contains(&v) {
                    // Exact: checked above to be integral, non-negative and below 2^64.
                    Ok(Whole(v as u64))
                } else {
                    Err(E::invalid_value(de::Unexpected::Float(v), &self))
                }
            }
        }

        deserializer.deserialize_any(WholeVisitor)
    }
}

fn narrow<T: TryFrom<u64>, E: de::Error>(value: u64) -> Result<T, E> {
    T::try_from(value).map_err(|_| {
        E::invalid_value(
            de::Unexpected::Unsigned(value),
            &"an integer in the field's range",
        )
    })
}

/// `#[serde(deserialize_with = "whole::integer")]` for `u64`/`u32` fields.
pub fn integer<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<u64> + Serialize,
{
    narrow(Whole::deserialize(deserializer)?.0)
}

/// `#[serde(default, deserialize_with = "whole::optional")]` for `Option<u64>`/`Option<u32>`
/// fields (`null` is absent).
pub fn optional<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<u64> + Serialize,
{
    Option::<Whole>::deserialize(deserializer)?
        .map(|whole| narrow(whole.0))
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    struct Probe {
        #[serde(deserialize_with = "integer")]
        wide: u64,
        #[serde(default, deserialize_with = "optional")]
        narrow: Option<u32>,
    }

    fn parse(json: &str) -> Result<(u64, Option<u32>), String> {
        serde_json::from_str::<Probe>(json)
            .map(|p| (p.wide, p.narrow))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn test_integral_numbers_are_accepted_in_any_spelling() {
        assert_eq!(parse(r#"{"wide": 3}"#), Ok((3, None)));
        assert_eq!(parse(r#"{"wide": 3.0, "narrow": 7.0}"#), Ok((3, Some(7))));
        assert_eq!(parse(r#"{"wide": 1e3, "narrow": null}"#), Ok((1000, None)));
        assert_eq!(
            parse(r#"{"wide": 18446744073709551615}"#),
            Ok((u64::MAX, None))
        );
    }

    #[test]
    fn test_fractions_negatives_and_overflows_are_refused() {
        for json in [
            r#"{"wide": 3.5}"#,
            r#"{"wide": -1}"#,
            r#"{"wide": -1.0}"#,
            r#"{"wide": 18446744073709551616}"#,
            r#"{"wide": 1e300}"#,
            r#"{"wide": "3"}"#,
            r#"{"wide": 1, "narrow": 4294967296}"#,
        ] {
            assert!(parse(json).is_err(), "{json} was accepted");
        }
    }
}

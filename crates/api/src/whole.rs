//! Integer fields of request bodies that accept every JSON number JSON Schema calls an
//! integer: `3` and `3.0` alike (JSON Schema's `"type": "integer"` is "a number with a zero
//! fractional part", so the OpenAPI document promises both). Fractions, negatives and values
//! out of the field's range are refused with serde's usual message.

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize};

/// `#[serde(deserialize_with = "whole::object")]` for a field of a struct or tagged-enum
/// type: only a JSON object is one (serde would also read a struct from an array, and a
/// tagged enum's unit variant with other members beside its tag).
pub fn object<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    let value = serde_json::Value::deserialize(deserializer)?;
    if !value.is_object() {
        return Err(de::Error::invalid_type(
            de::Unexpected::Other("a JSON value that is not an object"),
            &"an object",
        ));
    }
    T::deserialize(value).map_err(de::Error::custom)
}

/// Whether every member of a policy document that its schema makes an object is a JSON
/// object (its sections, `process.syscalls`, egress rules, credentials and their endpoints):
/// serde would read those structs from arrays too.
pub fn policy_shape_ok(document: &serde_json::Value) -> bool {
    use serde_json::Value;
    let objects = |value: Option<&Value>| value.is_none_or(Value::is_object);
    let all_objects = |value: Option<&Value>| {
        value.is_none_or(|v| {
            v.as_array()
                .is_some_and(|items| items.iter().all(Value::is_object))
        })
    };
    let Some(map) = document.as_object() else {
        return false;
    };
    let sections = [
        "filesystem",
        "process",
        "resources",
        "network",
        "approvals",
        "audit",
    ];
    sections.iter().all(|key| objects(map.get(*key)))
        && objects(map.get("process").and_then(|p| p.get("syscalls")))
        && all_objects(map.get("network").and_then(|n| n.get("egress")))
        && all_objects(map.get("credentials"))
        && map
            .get("credentials")
            .and_then(Value::as_array)
            .is_none_or(|list| list.iter().all(|c| all_objects(c.get("endpoints"))))
}

/// `#[serde(deserialize_with = "whole::policy")]` for an optional policy document in a JSON
/// body: its struct members must be objects ([`policy_shape_ok`]).
pub fn policy<'de, D>(
    deserializer: D,
) -> Result<Option<Box<crate::policy::PolicyDocument>>, D::Error>
where
    D: Deserializer<'de>,
{
    let value = serde_json::Value::deserialize(deserializer)?;
    if value.is_null() {
        return Ok(None);
    }
    if !policy_shape_ok(&value) {
        return Err(de::Error::custom(
            "a policy document's sections, rules and credentials must be JSON objects",
        ));
    }
    serde_json::from_value(value)
        .map(Some)
        .map_err(de::Error::custom)
}

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

    #[derive(Debug, Deserialize)]
    struct Holder {
        #[serde(default, deserialize_with = "object")]
        inner: Inner,
        #[serde(default, deserialize_with = "policy")]
        policy: Option<Box<crate::policy::PolicyDocument>>,
    }

    #[derive(Debug, Default, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Inner {
        #[serde(default)]
        a: u32,
    }

    fn holder(json: &str) -> Result<Holder, String> {
        serde_json::from_str::<Holder>(json).map_err(|e| e.to_string())
    }

    #[test]
    fn test_object_fields_refuse_arrays_that_serde_would_read() {
        assert_eq!(holder(r#"{"inner": {"a": 2}}"#).map(|h| h.inner.a), Ok(2));
        assert!(
            serde_json::from_str::<Inner>("[2]").is_ok(),
            "serde reads arrays"
        );
        for json in [r#"{"inner": [2]}"#, r#"{"inner": 2}"#, r#"{"inner": null}"#] {
            assert!(holder(json).is_err(), "{json} was accepted");
        }
    }

    #[test]
    fn test_policy_fields_refuse_sections_that_are_not_objects() {
        let ok = holder(r#"{"policy": {"version": 1, "resources": {"memory": "1GiB"}}}"#);
        assert!(ok.is_ok_and(|h| h.policy.is_some()));
        assert!(holder(r#"{"policy": null}"#).is_ok_and(|h| h.policy.is_none()));
        for json in [
            r#"{"policy": {"version": 1, "resources": [null, null]}}"#,
            r#"{"policy": {"version": 1, "process": {"syscalls": []}}}"#,
            r#"{"policy": {"version": 1, "network": {"egress": [[]]}}}"#,
            r#"{"policy": [1]}"#,
        ] {
            let err = holder(json).expect_err(json);
            assert!(err.contains("must be JSON objects"), "{json}: {err}");
        }
    }
}

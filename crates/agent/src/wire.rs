//! Small proto3 JSON input helpers shared by the RPC handlers.

use serde::{Deserialize, Deserializer};

/// An unsigned integer field that proto3 JSON may send as a number or a decimal string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lenient(u64);

impl Lenient {
    pub fn get(&self) -> u64 {
        self.0
    }
}

impl<'de> Deserialize<'de> for Lenient {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Number(u64),
            Text(String),
        }
        match Raw::deserialize(deserializer)? {
            Raw::Number(n) => Ok(Lenient(n)),
            Raw::Text(t) => {
                t.trim().parse().map(Lenient).map_err(|_| {
                    serde::de::Error::custom(format!("'{t}' is not an unsigned integer"))
                })
            }
        }
    }
}

/// The string if it is set and not empty (proto3: an empty string is "not set").
pub fn non_empty(value: &Option<String>) -> Option<&str> {
    value.as_deref().filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lenient_integers_accept_numbers_and_strings() {
        let n: Lenient = serde_json::from_str("12").unwrap();
        let s: Lenient = serde_json::from_str("\"34\"").unwrap();
        assert_eq!((n.get(), s.get()), (12, 34));
        assert!(serde_json::from_str::<Lenient>("\"x\"").is_err());
        assert!(serde_json::from_str::<Lenient>("-1").is_err());
    }
}

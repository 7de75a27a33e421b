//! Parsers for the human-written values users type on command lines and in policy files.

/// Why a size, duration or CPU count could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnitError {
    #[error("empty value")]
    Empty,
    #[error("`{0}` is not a number followed by an optional unit")]
    NotANumber(String),
    #[error("unknown unit `{unit}` in `{value}` (expected one of {expected})")]
    UnknownUnit {
        value: String,
        unit: String,
        expected: &'static str,
    },
    #[error("`{0}` is too large")]
    Overflow(String),
    #[error("`{0}` must be greater than zero")]
    Zero(String),
}

const SIZE_UNITS: &str = "B, K, KB, KiB, M, MB, MiB, G, GB, GiB, T, TB, TiB";
const DURATION_UNITS: &str = "ms, s, m, h";

/// Splits `12.5MiB` into (`12.5`, `MiB`).
fn split_number(value: &str) -> Result<(&str, &str), UnitError> {
    let value = value.trim();
    if value.is_empty() {
        return Err(UnitError::Empty);
    }
    let end = value
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(value.len());
    let (number, unit) = value.split_at(end);
    if number.is_empty()
        || number.starts_with('.')
        || number.ends_with('.')
        || number.matches('.').count() > 1
    {
        return Err(UnitError::NotANumber(value.to_owned()));
    }
    Ok((number, unit.trim()))
}

/// Multiplies a decimal string by an integer scale without going through floating point, so that
/// `1.5GiB` is exact. Digits beyond what the scale can represent are truncated.
fn scale_decimal(number: &str, scale: u64, original: &str) -> Result<u64, UnitError> {
    let overflow = || UnitError::Overflow(original.to_owned());
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let whole: u64 = whole.parse().map_err(|_| overflow())?;
    let total = whole.checked_mul(scale).ok_or_else(overflow)?;
    // At most 18 fractional digits keep 10^digits within u128 alongside the scale.
    let fraction = &fraction[..fraction.len().min(18)];
    if fraction.is_empty() {
        return Ok(total);
    }
    let numerator: u128 = fraction.parse().map_err(|_| overflow())?;
    let denominator = 10u128.pow(u32::try_from(fraction.len()).map_err(|_| overflow())?);
    let part =
        u64::try_from(numerator * u128::from(scale) / denominator).map_err(|_| overflow())?;
    let total = total.checked_add(part).ok_or_else(overflow)?;
    Ok(total)
}

/// Parses a size such as `512MiB`, `2G`, `1.5GiB` or `4096` (bytes). Decimal units (`MB`) are
/// powers of 1000, binary units (`MiB`) and single letters (`M`) are powers of 1024, as in
/// `docker --memory`.
pub fn parse_size_bytes(value: &str) -> Result<u64, UnitError> {
    let (number, unit) = split_number(value)?;
    let scale: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "kb" => 1_000,
        "m" | "mib" => 1 << 20,
        "mb" => 1_000_000,
        "g" | "gib" => 1 << 30,
        "gb" => 1_000_000_000,
        "t" | "tib" => 1 << 40,
        "tb" => 1_000_000_000_000,
        _ => {
            return Err(UnitError::UnknownUnit {
                value: value.to_owned(),
                unit: unit.to_owned(),
                expected: SIZE_UNITS,
            });
        }
    };
    let bytes = scale_decimal(number, scale, value)?;
    if bytes == 0 {
        return Err(UnitError::Zero(value.to_owned()));
    }
    Ok(bytes)
}

/// Parses a duration such as `30s`, `500ms`, `2m`, `1h` or `1.5s`. A bare number is seconds.
pub fn parse_duration_ms(value: &str) -> Result<u64, UnitError> {
    let (number, unit) = split_number(value)?;
    let scale: u64 = match unit {
        "ms" => 1,
        "" | "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => {
            return Err(UnitError::UnknownUnit {
                value: value.to_owned(),
                unit: unit.to_owned(),
                expected: DURATION_UNITS,
            });
        }
    };
    let ms = scale_decimal(number, scale, value)?;
    if ms == 0 {
        return Err(UnitError::Zero(value.to_owned()));
    }
    Ok(ms)
}

/// Parses a CPU count such as `1.5` into thousandths of a CPU (`1500`).
pub fn parse_cpus_milli(value: &str) -> Result<u32, UnitError> {
    let (number, unit) = split_number(value)?;
    if !unit.is_empty() {
        return Err(UnitError::UnknownUnit {
            value: value.to_owned(),
            unit: unit.to_owned(),
            expected: "no unit (a number of CPUs such as 1.5)",
        });
    }
    let milli = scale_decimal(number, 1_000, value)?;
    if milli == 0 {
        return Err(UnitError::Zero(value.to_owned()));
    }
    u32::try_from(milli).map_err(|_| UnitError::Overflow(value.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_size_units_binary_and_decimal() {
        assert_eq!(parse_size_bytes("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size_bytes("512m"), Ok(512 << 20));
        assert_eq!(parse_size_bytes("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size_bytes("2GB"), Ok(2_000_000_000));
        assert_eq!(parse_size_bytes("4096"), Ok(4096));
        assert_eq!(parse_size_bytes(" 1k "), Ok(1024));
    }

    #[test]
    fn test_size_bad_input_is_named() {
        assert_eq!(parse_size_bytes(""), Err(UnitError::Empty));
        assert_eq!(
            parse_size_bytes("MiB"),
            Err(UnitError::NotANumber("MiB".into()))
        );
        assert_eq!(
            parse_size_bytes("1..2M"),
            Err(UnitError::NotANumber("1..2M".into()))
        );
        assert!(matches!(
            parse_size_bytes("12 parsecs"),
            Err(UnitError::UnknownUnit { .. })
        ));
        assert_eq!(parse_size_bytes("0"), Err(UnitError::Zero("0".into())));
        assert_eq!(
            parse_size_bytes("99999999999TiB"),
            Err(UnitError::Overflow("99999999999TiB".into()))
        );
        assert_eq!(
            parse_size_bytes("-5M"),
            Err(UnitError::NotANumber("-5M".into()))
        );
    }

    #[test]
    fn test_duration_units() {
        assert_eq!(parse_duration_ms("30s"), Ok(30_000));
        assert_eq!(parse_duration_ms("30"), Ok(30_000));
        assert_eq!(parse_duration_ms("250ms"), Ok(250));
        assert_eq!(parse_duration_ms("1.5s"), Ok(1_500));
        assert_eq!(parse_duration_ms("2m"), Ok(120_000));
        assert_eq!(parse_duration_ms("1h"), Ok(3_600_000));
        assert!(matches!(
            parse_duration_ms("3 days"),
            Err(UnitError::UnknownUnit { .. })
        ));
        assert_eq!(parse_duration_ms("0s"), Err(UnitError::Zero("0s".into())));
    }

    #[test]
    fn test_cpus_milli() {
        assert_eq!(parse_cpus_milli("1.5"), Ok(1_500));
        assert_eq!(parse_cpus_milli("0.25"), Ok(250));
        assert_eq!(parse_cpus_milli("2"), Ok(2_000));
        assert!(matches!(
            parse_cpus_milli("2cores"),
            Err(UnitError::UnknownUnit { .. })
        ));
        assert_eq!(parse_cpus_milli("0"), Err(UnitError::Zero("0".into())));
    }
}

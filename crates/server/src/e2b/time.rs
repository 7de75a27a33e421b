//! RFC 3339 timestamps, as E2B's JSON carries them (`startedAt`, `endAt`, the `startedAfter`
//! list filter), to and from Unix milliseconds. Proleptic Gregorian calendar, UTC.

/// Days since 1970-01-01 of a civil date (Howard Hinnant's `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month_index = (month + 9) % 12;
    let day_of_year = (153 * month_index + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The civil date of a day count since 1970-01-01.
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let days = days + 719_468;
    let era = days.div_euclid(146_097);
    let day_of_era = days - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// `2026-01-02T03:04:05.678Z`.
pub fn format_ms(unix_ms: u64) -> String {
    let ms = i64::try_from(unix_ms).unwrap_or(i64::MAX);
    let (days, ms_of_day) = (ms.div_euclid(86_400_000), ms.rem_euclid(86_400_000));
    let (year, month, day) = civil_from_days(days);
    let seconds = ms_of_day / 1000;
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        seconds / 3600,
        seconds / 60 % 60,
        seconds % 60,
        ms_of_day % 1000
    )
}

fn number(text: &str, digits: usize) -> Option<i64> {
    (text.len() == digits && text.bytes().all(|b| b.is_ascii_digit()))
        .then(|| text.parse().ok())
        .flatten()
}

/// Parses `YYYY-MM-DDTHH:MM:SS[.fraction][Z|±HH:MM]` (a missing zone means UTC, as Python's
/// `isoformat()` of a naive datetime) into Unix milliseconds; `None` if malformed.
pub fn parse_ms(text: &str) -> Option<i64> {
    let (date, time) = text.split_once(['T', 't', ' '])?;
    let mut parts = date.splitn(3, '-');
    let year = number(parts.next()?, 4)?;
    let month = number(parts.next()?, 2).filter(|m| (1..=12).contains(m))?;
    let day = number(parts.next()?, 2).filter(|d| (1..=31).contains(d))?;
    let (clock, offset_minutes) = if let Some(clock) = time.strip_suffix(['Z', 'z']) {
        (clock, 0)
    } else if let Some(at) = time.rfind(['+', '-']) {
        let (clock, zone) = time.split_at(at);
        let sign = if zone.starts_with('-') { -1 } else { 1 };
        let (hours, minutes) = zone[1..].split_once(':')?;
        let hours = number(hours, 2).filter(|h| *h <= 23)?;
        let minutes = number(minutes, 2).filter(|m| *m <= 59)?;
        (clock, sign * (hours * 60 + minutes))
    } else {
        (time, 0)
    };
    let (whole, fraction) = clock.split_once('.').unwrap_or((clock, ""));
    let mut hms = whole.splitn(3, ':');
    let hour = number(hms.next()?, 2).filter(|h| *h <= 23)?;
    let minute = number(hms.next()?, 2).filter(|m| *m <= 59)?;
    let second = number(hms.next()?, 2).filter(|s| *s <= 60)?;
    if !fraction.bytes().all(|b| b.is_ascii_digit()) || (clock.contains('.') && fraction.is_empty())
    {
        return None;
    }
    let millis = format!("{fraction:0<3}")[..3].parse::<i64>().ok()?;
    let days = days_from_civil(year, month, day);
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second - offset_minutes * 60;
    Some(seconds * 1000 + millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_formats_known_instants() {
        assert_eq!(format_ms(0), "1970-01-01T00:00:00.000Z");
        // date -u -d @1767225600 → 2026-01-01 00:00:00
        assert_eq!(format_ms(1_767_225_600_123), "2026-01-01T00:00:00.123Z");
        // A leap day, and the last millisecond of a day.
        assert_eq!(format_ms(951_868_799_999), "2000-02-29T23:59:59.999Z");
    }

    #[test]
    fn test_parses_what_it_formats_and_python_isoformat() {
        for ms in [0, 951_868_799_999, 1_767_225_600_123, 4_102_444_800_000] {
            assert_eq!(parse_ms(&format_ms(ms)), Some(i64::try_from(ms).unwrap()));
        }
        assert_eq!(
            parse_ms("2026-01-01T00:00:00+00:00"),
            Some(1_767_225_600_000)
        );
        assert_eq!(
            parse_ms("2026-01-01T02:00:00.5+02:00"),
            Some(1_767_225_600_500)
        );
        assert_eq!(
            parse_ms("2025-12-31T19:00:00.123456-05:00"),
            Some(1_767_225_600_123)
        );
        assert_eq!(parse_ms("2026-01-01T00:00:00"), Some(1_767_225_600_000));
        for bad in [
            "",
            "2026-01-01",
            "2026-13-01T00:00:00Z",
            "2026-01-01T24:00:00Z",
            "2026-01-01T00:00:00.Z",
            "2026-01-01T00:00:00+0200",
            "yesterday",
        ] {
            assert_eq!(parse_ms(bad), None, "{bad}");
        }
    }
}

//! The parsers of command-line values shared by the commands: durations, positions, lanes,
//! partitions ahead. Each refuses a bad value with a message that says what would work.

use std::time::Duration;

use ordo::Ordering;

/// A duration such as `30d`, `12h`, `45m`, `90s` or `1h 30m` (a bare number is seconds),
/// parsed with overflow checks: a value too large is an error, never a panic.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let parsed = if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        text.parse::<u64>()
            .map(Duration::from_secs)
            .map_err(|error| error.to_string())
    } else {
        humantime::parse_duration(text).map_err(|error| error.to_string())
    };
    parsed.map_err(|error| {
        format!("{text:?} is not a duration such as 30d, 12h, 45m or 90s: {error}")
    })
}

pub(crate) fn ahead_in_range(text: &str) -> Result<u32, String> {
    let ahead: u32 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a number of partitions"))?;
    if !(1..=ordo::MAX_AHEAD).contains(&ahead) {
        return Err(format!(
            "{ahead} is out of range: between 1 and {} partitions ahead (each partition costs every \
             query on ordo.events planning time; use larger partitions instead)",
            ordo::MAX_AHEAD
        ));
    }
    Ok(ahead)
}

/// A position as PostgreSQL stores it: a `bigint`, so at most `i64::MAX`.
pub(crate) fn parse_position(text: &str) -> Result<u64, String> {
    let value: u64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a position (a whole number, 0 or more)"))?;
    if i64::try_from(value).is_err() {
        return Err(format!(
            "{value} is beyond any position: positions are PostgreSQL bigints, at most {}",
            i64::MAX
        ));
    }
    Ok(value)
}

/// `--lane`: the lane's name, as ordo prints and stores it.
pub(crate) fn lane_parser() -> impl clap::builder::TypedValueParser<Value = Ordering> {
    use clap::builder::TypedValueParser;
    let lanes = [Ordering::Insert, Ordering::Commit];
    clap::builder::PossibleValuesParser::new(lanes.map(Ordering::as_str)).map(move |name| {
        lanes
            .into_iter()
            .find(|lane| lane.as_str() == name)
            .unwrap_or_default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units_and_refuse_overflow_without_panicking() {
        assert_eq!(parse_duration("30d"), Ok(Duration::from_secs(30 * 86_400)));
        assert_eq!(parse_duration("12h"), Ok(Duration::from_secs(12 * 3_600)));
        assert_eq!(parse_duration("45m"), Ok(Duration::from_secs(45 * 60)));
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5_400)));
        let overflow = parse_duration("999999999999999d");
        assert!(
            overflow
                .as_ref()
                .is_err_and(|e| e.contains("999999999999999d")),
            "{overflow:?}"
        );
        assert!(parse_duration("99999999999999999999999").is_err());
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn ahead_is_bounded() {
        assert_eq!(ahead_in_range("2"), Ok(2));
        assert_eq!(ahead_in_range("100"), Ok(ordo::MAX_AHEAD));
        assert!(ahead_in_range("0").is_err());
        let refused = ahead_in_range("300");
        assert!(
            refused
                .as_ref()
                .is_err_and(|e| e.contains("between 1 and 100")),
            "{refused:?}"
        );
    }
}

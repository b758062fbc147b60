//! Calendar dates to epoch milliseconds, for the timestamps read out of event bodies (syslog
//! headers, the `millis` serializer of `regex_extractor`). Proleptic Gregorian calendar, no
//! leap seconds, as Java's and Joda's.

/// A date and time of day with its offset from UTC, as read from text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DateTime {
    pub(crate) year: i64,
    /// 1 to 12.
    pub(crate) month: u32,
    /// 1 to the length of the month.
    pub(crate) day: u32,
    pub(crate) hour: u32,
    pub(crate) minute: u32,
    pub(crate) second: u32,
    pub(crate) millis: u32,
    /// Seconds east of UTC.
    pub(crate) offset_seconds: i64,
}

impl Default for DateTime {
    fn default() -> Self {
        Self {
            year: 1970,
            month: 1,
            day: 1,
            hour: 0,
            minute: 0,
            second: 0,
            millis: 0,
            offset_seconds: 0,
        }
    }
}

impl DateTime {
    /// Milliseconds since the epoch, or `None` if a field is out of its range.
    pub(crate) fn epoch_millis(&self) -> Option<i64> {
        if !(1..=12).contains(&self.month)
            || self.day == 0
            || self.day > days_in_month(self.year, self.month)
            || self.hour > 23
            || self.minute > 59
            // 60: a leap second, as syslog senders may write; counted as the next second.
            || self.second > 60
            || self.millis > 999
            || !(-9999..=99999).contains(&self.year)
        {
            return None;
        }
        let days = days_from_civil(self.year, self.month, self.day);
        let seconds = days * 86_400
            + i64::from(self.hour) * 3600
            + i64::from(self.minute) * 60
            + i64::from(self.second)
            - self.offset_seconds;
        Some(seconds * 1000 + i64::from(self.millis))
    }
}

fn is_leap(year: i64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

fn days_in_month(year: i64, month: u32) -> u32 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a date (H. Hinnant's `days_from_civil`).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = i64::from((month + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The year and month (1 to 12) of a moment in epoch milliseconds, in UTC.
pub(crate) fn year_month_of(epoch_millis: i64) -> (i64, u32) {
    let days = epoch_millis.div_euclid(86_400_000) + 719_468;
    let era = days.div_euclid(146_097);
    let doe = days - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month as u32)
}

/// Now, in epoch milliseconds.
pub(crate) fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// The month (1 to 12) of an English month name or its three-letter abbreviation, any case.
pub(crate) fn month_of_name(name: &str) -> Option<u32> {
    const MONTHS: [&str; 12] = [
        "january",
        "february",
        "march",
        "april",
        "may",
        "june",
        "july",
        "august",
        "september",
        "october",
        "november",
        "december",
    ];
    let name = name.to_ascii_lowercase();
    MONTHS
        .iter()
        .position(|m| *m == name || (name.len() == 3 && m.starts_with(&name)))
        .map(|i| i as u32 + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_moments() {
        let at = |year, month, day, hour, minute, second, millis, offset_seconds| {
            DateTime {
                year,
                month,
                day,
                hour,
                minute,
                second,
                millis,
                offset_seconds,
            }
            .epoch_millis()
        };
        assert_eq!(at(1970, 1, 1, 0, 0, 0, 0, 0), Some(0));
        assert_eq!(at(2003, 10, 11, 22, 14, 15, 3, 0), Some(1_065_910_455_003));
        // RFC 5424's example 2: 2003-08-24T05:14:15.000003-07:00
        assert_eq!(
            at(2003, 8, 24, 5, 14, 15, 0, -7 * 3600),
            Some(1_061_727_255_000)
        );
        assert_eq!(at(2024, 2, 29, 0, 0, 0, 0, 0), Some(1_709_164_800_000));
        assert_eq!(at(2023, 2, 29, 0, 0, 0, 0, 0), None);
        assert_eq!(at(2023, 13, 1, 0, 0, 0, 0, 0), None);
        assert_eq!(at(2023, 1, 1, 24, 0, 0, 0, 0), None);
    }

    #[test]
    fn year_and_month_of_a_moment() {
        assert_eq!(year_month_of(0), (1970, 1));
        assert_eq!(year_month_of(1_709_164_800_000), (2024, 2));
        assert_eq!(year_month_of(1_065_910_455_003), (2003, 10));
        assert_eq!(year_month_of(-1), (1969, 12));
    }

    #[test]
    fn month_names() {
        assert_eq!(month_of_name("Oct"), Some(10));
        assert_eq!(month_of_name("JANUARY"), Some(1));
        assert_eq!(month_of_name("Ja"), None);
        assert_eq!(month_of_name("Foo"), None);
    }
}

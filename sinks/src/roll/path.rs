//! Flume's path escapes: the `%`-sequences of the HDFS sink's `hdfs.path` and
//! `hdfs.filePrefix` (Flume's `BucketPath`), for the paths and names the `file_roll` and `s3`
//! sinks write.
//!
//! A template is parsed once, when the sink is configured, into literal text and escapes;
//! rendering an event appends each piece to one `String`.
//!
//! | Escape          | Renders                                                        |
//! |-----------------|----------------------------------------------------------------|
//! | `%{name}`       | the value of the event's header `name`; empty if it is missing |
//! | `%t`            | milliseconds since the epoch (never rounded, as in Flume)      |
//! | `%a` / `%A`     | weekday, `Mon` / `Monday`                                      |
//! | `%b` / `%B`     | month, `Jan` / `January`                                       |
//! | `%c`            | date and time, `Thu Mar 3 23:05:25 2005`                       |
//! | `%d` / `%e`     | day of the month, `01`..`31` / `1`..`31`                       |
//! | `%D`            | `%m/%d/%y`                                                     |
//! | `%H` / `%k`     | hour, `00`..`23` / `0`..`23`                                   |
//! | `%I`            | hour, `01`..`12`                                               |
//! | `%j`            | day of the year, `001`..`366`                                  |
//! | `%m` / `%n`     | month, `01`..`12` / `1`..`12`                                  |
//! | `%M`            | minute, `00`..`59`                                             |
//! | `%p`            | `AM` or `PM`                                                   |
//! | `%s`            | seconds since the epoch                                        |
//! | `%S`            | second, `00`..`59`                                             |
//! | `%y` / `%Y`     | year, `05` / `2005`                                            |
//! | `%z`            | offset from UTC, `+hhmm`                                       |
//! | `%[localhost]`  | the host's name                                                |
//! | `%[IP]`         | an IP address of the host                                      |
//! | `%[FQDN]`       | the host's fully qualified name                                |
//! | `%%`            | a literal `%`                                                  |
//!
//! Names of days and months are English whatever the locale (Flume follows the JVM's).
//!
//! The time is the event's `timestamp` header (milliseconds since the epoch, as Flume's
//! timestamp interceptor sets it), or the time of writing with `use_local_time`
//! (`hdfs.useLocalTimeStamp`). It is shown in the configured time zone (`hdfs.timeZone`) and,
//! with `round` (`hdfs.round`, `hdfs.roundValue`, `hdfs.roundUnit`), first rounded down on the
//! wall clock of that zone: to a multiple of `round` counted from midnight, or to midnight for
//! a day.
//!
//! The host escapes are resolved once, when the template is parsed.

use std::fmt::{self, Write as _};
use std::net::{IpAddr, ToSocketAddrs};
use std::time::Duration;

use ferry_core::Headers;
use jiff::civil::DateTime;
use jiff::tz::{AmbiguousOffset, Offset, TimeZone};
use jiff::{SignedDuration, Timestamp};

/// The header holding an event's time, as Flume names it.
const TIMESTAMP_HEADER: &str = "timestamp";

/// Milliseconds in a day: the longest rounding.
const DAY_MS: i64 = 86_400_000;

/// Time options of the escapes.
#[derive(Clone, Debug)]
pub(crate) struct TimeOptions {
    /// Use the time of writing instead of the event's `timestamp` header (Flume's
    /// `hdfs.useLocalTimeStamp`; default false).
    pub(crate) use_local_time: bool,
    /// Round the time down, on the wall clock of `time_zone`, to a multiple of this counted
    /// from midnight: `10m` gives `12:00`, `12:10`, ...; a day (or more) gives midnight
    /// (Flume's `hdfs.round`, `hdfs.roundValue` and `hdfs.roundUnit`; default none). Zero
    /// does not round. `%t` is never rounded, as in Flume.
    pub(crate) round: Option<Duration>,
    /// The time zone the escapes show the time in (Flume's `hdfs.timeZone`; default the
    /// system's).
    pub(crate) time_zone: TimeZone,
}

impl TimeOptions {
    /// The time zone named `name` (an IANA name such as `America/New_York`, or `UTC`), or the
    /// system's for `None`.
    pub(crate) fn parse_time_zone(name: Option<&str>) -> Result<TimeZone, String> {
        match name {
            None => Ok(TimeZone::system()),
            Some(name) => TimeZone::get(name).map_err(|err| format!("time zone `{name}`: {err}")),
        }
    }
}

/// Why an event's path cannot be rendered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PathError {
    /// The template reads the time, `use_local_time` is off and the event has no
    /// `timestamp` header.
    MissingTimestamp {
        /// The template, to name in the message.
        template: String,
    },
    /// The event's `timestamp` header (this value) is not milliseconds since the epoch.
    BadTimestamp(String),
}

impl fmt::Display for PathError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::MissingTimestamp { template } => write!(
                f,
                "the event has no `{TIMESTAMP_HEADER}` header (milliseconds since the epoch) \
                 for the time escapes of `{template}`; set `use_local_time: true` to use the \
                 time of writing"
            ),
            Self::BadTimestamp(value) => write!(
                f,
                "the event's `{TIMESTAMP_HEADER}` header `{value}` is not milliseconds since \
                 the epoch"
            ),
        }
    }
}

impl std::error::Error for PathError {}

/// A path with Flume's escapes, parsed once at configuration time and rendered per event.
#[derive(Clone, Debug)]
pub(crate) struct PathTemplate {
    /// The template as written, for messages.
    template: String,
    /// Literal text and escapes in order; adjacent literals are merged.
    pieces: Vec<Piece>,
    /// Whether a piece is a time escape.
    uses_time: bool,
    /// The length of a rendering with empty escapes, to size the output once.
    literal_len: usize,
}

/// One piece of a parsed template.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Piece {
    /// Text copied as is (including `%%` and the host escapes, resolved at parse time).
    Literal(String),
    /// `%{name}`: the value of a header.
    Header(String),
    /// A time escape.
    Time(TimeEscape),
}

/// The time escapes, each named for what it renders.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TimeEscape {
    /// `%t`: milliseconds since the epoch, not rounded.
    EpochMillis,
    /// `%a`: `Mon`.
    WeekdayShort,
    /// `%A`: `Monday`.
    WeekdayLong,
    /// `%b`: `Jan`.
    MonthShort,
    /// `%B`: `January`.
    MonthLong,
    /// `%c`: `Thu Mar 3 23:05:25 2005`.
    DateAndTime,
    /// `%d`: `01`..`31`.
    DayPadded,
    /// `%e`: `1`..`31`.
    Day,
    /// `%D`: `%m/%d/%y`.
    Date,
    /// `%H`: `00`..`23`.
    Hour24Padded,
    /// `%I`: `01`..`12`.
    Hour12Padded,
    /// `%j`: `001`..`366`.
    DayOfYear,
    /// `%k`: `0`..`23`.
    Hour24,
    /// `%m`: `01`..`12`.
    MonthPadded,
    /// `%n`: `1`..`12`.
    Month,
    /// `%M`: `00`..`59`.
    Minute,
    /// `%p`: `AM` or `PM`.
    AmPm,
    /// `%s`: seconds since the epoch.
    EpochSeconds,
    /// `%S`: `00`..`59`.
    Second,
    /// `%y`: `00`..`99`.
    Year2,
    /// `%Y`: `2005`.
    Year,
    /// `%z`: `+hhmm`.
    Offset,
}

impl TimeEscape {
    /// The time escape written `%<c>`, if there is one.
    fn from_char(c: char) -> Option<Self> {
        Some(match c {
            't' => Self::EpochMillis,
            'a' => Self::WeekdayShort,
            'A' => Self::WeekdayLong,
            'b' => Self::MonthShort,
            'B' => Self::MonthLong,
            'c' => Self::DateAndTime,
            'd' => Self::DayPadded,
            'e' => Self::Day,
            'D' => Self::Date,
            'H' => Self::Hour24Padded,
            'I' => Self::Hour12Padded,
            'j' => Self::DayOfYear,
            'k' => Self::Hour24,
            'm' => Self::MonthPadded,
            'n' => Self::Month,
            'M' => Self::Minute,
            'p' => Self::AmPm,
            's' => Self::EpochSeconds,
            'S' => Self::Second,
            'y' => Self::Year2,
            'Y' => Self::Year,
            'z' => Self::Offset,
            _ => return None,
        })
    }
}

/// The host escapes `%[...]`.
#[derive(Clone, Copy)]
enum HostEscape {
    /// `%[localhost]`.
    Name,
    /// `%[IP]`.
    Ip,
    /// `%[FQDN]`.
    Fqdn,
}

impl HostEscape {
    /// The host escape named `name`, in any case (as Flume).
    fn from_name(name: &str) -> Option<Self> {
        if name.eq_ignore_ascii_case("localhost") {
            Some(Self::Name)
        } else if name.eq_ignore_ascii_case("IP") {
            Some(Self::Ip)
        } else if name.eq_ignore_ascii_case("FQDN") {
            Some(Self::Fqdn)
        } else {
            None
        }
    }

    /// The value for this host.
    fn resolve(self) -> String {
        let name = host_name();
        match self {
            Self::Name => name,
            Self::Ip => host_ip(&name).to_string(),
            Self::Fqdn => host_fqdn(name),
        }
    }
}

impl PathTemplate {
    /// Parses `template`; an unknown escape, an unclosed `%{` or `%[` or a trailing `%` is an
    /// error naming the escape and its byte position.
    pub(crate) fn parse(template: &str) -> Result<Self, String> {
        let mut pieces = Vec::new();
        let mut literal = String::new();
        let mut pos = 0;
        while let Some(found) = template[pos..].find('%') {
            let at = pos + found;
            literal.push_str(&template[pos..at]);
            let Some(escape) = template[at + 1..].chars().next() else {
                return Err(format!(
                    "path `{template}`: the `%` at byte {at} ends the path; write `%%` for a \
                     literal `%`"
                ));
            };
            pos = at + 1 + escape.len_utf8();
            let piece = match escape {
                '%' => {
                    literal.push('%');
                    continue;
                }
                '{' | '[' => {
                    let close = if escape == '{' { '}' } else { ']' };
                    let Some(len) = template[pos..].find(close) else {
                        return Err(format!(
                            "path `{template}`: the `%{escape}` at byte {at} is not closed by \
                             `{close}`"
                        ));
                    };
                    let name = &template[pos..pos + len];
                    pos += len + 1;
                    if name.is_empty() {
                        return Err(format!(
                            "path `{template}`: the escape `%{escape}{close}` at byte {at} has \
                             no name"
                        ));
                    }
                    if escape == '[' {
                        let Some(host) = HostEscape::from_name(name) else {
                            return Err(format!(
                                "path `{template}`: unknown escape `%[{name}]` at byte {at}; \
                                 the host escapes are `%[localhost]`, `%[IP]` and `%[FQDN]`"
                            ));
                        };
                        literal.push_str(&host.resolve());
                        continue;
                    }
                    Piece::Header(name.to_owned())
                }
                other => match TimeEscape::from_char(other) {
                    Some(time) => Piece::Time(time),
                    None => {
                        return Err(format!(
                            "path `{template}`: unknown escape `%{other}` at byte {at}; write \
                             `%%` for a literal `%`"
                        ));
                    }
                },
            };
            if !literal.is_empty() {
                pieces.push(Piece::Literal(std::mem::take(&mut literal)));
            }
            pieces.push(piece);
        }
        literal.push_str(&template[pos..]);
        if !literal.is_empty() {
            pieces.push(Piece::Literal(literal));
        }
        let uses_time = pieces.iter().any(|piece| matches!(piece, Piece::Time(_)));
        let literal_len = pieces
            .iter()
            .map(|piece| match piece {
                Piece::Literal(text) => text.len(),
                _ => 0,
            })
            .sum();
        Ok(Self {
            template: template.to_owned(),
            pieces,
            uses_time,
            literal_len,
        })
    }

    /// Whether rendering reads the time (any time escape).
    #[cfg(test)]
    pub(crate) fn uses_time(&self) -> bool {
        self.uses_time
    }

    /// Whether the template has no escapes that depend on the event or the time, so every
    /// event renders the same path (`%%` and the host escapes are resolved at parse time).
    pub(crate) fn is_constant(&self) -> bool {
        self.pieces
            .iter()
            .all(|piece| matches!(piece, Piece::Literal(_)))
    }

    /// The text before the first escape that depends on the event or the time (all of it when
    /// the template [is constant](Self::is_constant)): how every rendering starts.
    pub(crate) fn literal_prefix(&self) -> &str {
        match self.pieces.first() {
            Some(Piece::Literal(text)) => text,
            _ => "",
        }
    }

    /// Renders the path of one event. `now_ms` is the time of writing in milliseconds since
    /// the epoch, used for the time escapes with `use_local_time`.
    pub(crate) fn render(
        &self,
        headers: &Headers,
        now_ms: i64,
        time: &TimeOptions,
    ) -> Result<String, PathError> {
        let when = if self.uses_time {
            Some(self.event_time(headers, now_ms, time)?)
        } else {
            None
        };
        // Room for the literals and a short value per escape: usually one allocation.
        let mut out = String::with_capacity(self.literal_len + 16 * self.pieces.len());
        for piece in &self.pieces {
            match (piece, &when) {
                (Piece::Literal(text), _) => out.push_str(text),
                (Piece::Header(name), _) => {
                    if let Some(value) = headers.get(name.as_str()) {
                        out.push_str(value);
                    }
                }
                (Piece::Time(escape), Some(when)) => when.push(*escape, &mut out),
                // `uses_time` is true whenever there is a time piece.
                (Piece::Time(_), None) => {}
            }
        }
        Ok(out)
    }

    /// The time the escapes of this event show.
    fn event_time(
        &self,
        headers: &Headers,
        now_ms: i64,
        time: &TimeOptions,
    ) -> Result<EventTime, PathError> {
        let (millis, exact) = if time.use_local_time {
            (now_ms, timestamp_saturating(now_ms))
        } else {
            let value =
                headers
                    .get(TIMESTAMP_HEADER)
                    .ok_or_else(|| PathError::MissingTimestamp {
                        template: self.template.clone(),
                    })?;
            let bad = || PathError::BadTimestamp(value.to_string());
            let millis = value.parse::<i64>().map_err(|_| bad())?;
            (
                millis,
                Timestamp::from_millisecond(millis).map_err(|_| bad())?,
            )
        };
        let shown = match time.round {
            Some(round) => round_down(exact, &time.time_zone, round),
            None => exact,
        };
        let offset = time.time_zone.to_offset(shown);
        Ok(EventTime {
            millis,
            shown,
            offset,
            civil: offset.to_datetime(shown),
        })
    }
}

/// The time of one event as its escapes show it.
struct EventTime {
    /// Milliseconds since the epoch, not rounded (for `%t`).
    millis: i64,
    /// The instant shown, rounded.
    shown: Timestamp,
    /// The offset of the time zone at `shown`.
    offset: Offset,
    /// The wall clock of the time zone at `shown`.
    civil: DateTime,
}

/// English weekday names from Monday.
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// English month names from January.
const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

impl EventTime {
    /// Appends `escape` to `out`.
    fn push(&self, escape: TimeEscape, out: &mut String) {
        let civil = self.civil;
        let hour = civil.hour();
        match escape {
            TimeEscape::EpochMillis => push_number(out, self.millis, 0),
            TimeEscape::WeekdayShort => out.push_str(&self.weekday()[..3]),
            TimeEscape::WeekdayLong => out.push_str(self.weekday()),
            TimeEscape::MonthShort => out.push_str(&self.month_name()[..3]),
            TimeEscape::MonthLong => out.push_str(self.month_name()),
            TimeEscape::DateAndTime => {
                self.push(TimeEscape::WeekdayShort, out);
                out.push(' ');
                self.push(TimeEscape::MonthShort, out);
                out.push(' ');
                self.push(TimeEscape::Day, out);
                out.push(' ');
                self.push(TimeEscape::Hour24Padded, out);
                out.push(':');
                self.push(TimeEscape::Minute, out);
                out.push(':');
                self.push(TimeEscape::Second, out);
                out.push(' ');
                self.push(TimeEscape::Year, out);
            }
            TimeEscape::DayPadded => push_number(out, civil.day().into(), 2),
            TimeEscape::Day => push_number(out, civil.day().into(), 0),
            TimeEscape::Date => {
                self.push(TimeEscape::MonthPadded, out);
                out.push('/');
                self.push(TimeEscape::DayPadded, out);
                out.push('/');
                self.push(TimeEscape::Year2, out);
            }
            TimeEscape::Hour24Padded => push_number(out, hour.into(), 2),
            TimeEscape::Hour12Padded => {
                let twelve = if hour % 12 == 0 { 12 } else { hour % 12 };
                push_number(out, twelve.into(), 2);
            }
            TimeEscape::DayOfYear => push_number(out, civil.day_of_year().into(), 3),
            TimeEscape::Hour24 => push_number(out, hour.into(), 0),
            TimeEscape::MonthPadded => push_number(out, civil.month().into(), 2),
            TimeEscape::Month => push_number(out, civil.month().into(), 0),
            TimeEscape::Minute => push_number(out, civil.minute().into(), 2),
            TimeEscape::AmPm => out.push_str(if hour < 12 { "AM" } else { "PM" }),
            TimeEscape::EpochSeconds => push_number(out, self.shown.as_second(), 0),
            TimeEscape::Second => push_number(out, civil.second().into(), 2),
            TimeEscape::Year2 => push_number(out, i64::from(civil.year()).rem_euclid(100), 2),
            TimeEscape::Year => push_number(out, civil.year().into(), 4),
            TimeEscape::Offset => {
                let seconds = self.offset.seconds();
                out.push(if seconds < 0 { '-' } else { '+' });
                let minutes = i64::from(seconds.unsigned_abs() / 60);
                push_number(out, minutes / 60, 2);
                push_number(out, minutes % 60, 2);
            }
        }
    }

    /// The English name of the weekday.
    fn weekday(&self) -> &'static str {
        let index = usize::try_from(self.civil.weekday().to_monday_zero_offset()).unwrap_or(0);
        WEEKDAYS[index % WEEKDAYS.len()]
    }

    /// The English name of the month.
    fn month_name(&self) -> &'static str {
        let index = usize::try_from(self.civil.month() - 1).unwrap_or(0);
        MONTHS[index % MONTHS.len()]
    }
}

/// Appends `n` in decimal, zero-padded to `width` digits.
fn push_number(out: &mut String, n: i64, width: usize) {
    // Writing to a `String` cannot fail.
    let _ = write!(out, "{n:0width$}");
}

/// `millis` as a timestamp, clamped to the range jiff supports (a clock cannot be outside
/// it, but the time of writing is not worth an error).
fn timestamp_saturating(millis: i64) -> Timestamp {
    let clamped = millis.clamp(
        Timestamp::MIN.as_millisecond(),
        Timestamp::MAX.as_millisecond(),
    );
    Timestamp::from_millisecond(clamped).unwrap_or(Timestamp::UNIX_EPOCH)
}

/// `exact` rounded down on the wall clock of `tz` to a multiple of `round` counted from
/// midnight (to midnight for a day or more).
///
/// The rounded wall-clock time can be missing or doubled around a change of offset. Doubled
/// (clocks went back), it is the later occurrence that is not after `exact`. Missing (clocks
/// went forward past it), it is the first instant after the gap, as a day without a
/// midnight starts at the end of its gap. Either way the result is never after `exact`.
fn round_down(exact: Timestamp, tz: &TimeZone, round: Duration) -> Timestamp {
    let step = i64::try_from(round.as_millis()).map_or(DAY_MS, |ms| ms.min(DAY_MS));
    if step == 0 {
        return exact;
    }
    let civil = tz.to_datetime(exact);
    let of_day = ((i64::from(civil.hour()) * 60 + i64::from(civil.minute())) * 60
        + i64::from(civil.second()))
        * 1000
        + i64::from(civil.millisecond());
    let Ok(floor) = civil.checked_sub(SignedDuration::from_millis(of_day % step)) else {
        return exact;
    };
    let floor = floor.with().subsec_nanosecond(0).build().unwrap_or(floor);
    let ambiguous = tz.to_ambiguous_timestamp(floor);
    let offset = ambiguous.offset();
    let (Ok(earlier), Ok(later)) = (ambiguous.earlier(), ambiguous.later()) else {
        return exact;
    };
    match offset {
        AmbiguousOffset::Gap { .. } => {
            // `later` reads `floor` with the offset before the gap: it lies in the gap's
            // span of instants, at or after the transition that opened it.
            let just_after = later
                .checked_add(SignedDuration::from_nanos(1))
                .unwrap_or(later);
            tz.preceding(just_after)
                .next()
                .map_or(later, |transition| transition.timestamp())
                .min(exact)
        }
        AmbiguousOffset::Fold { .. } | AmbiguousOffset::Unambiguous { .. } => {
            if later <= exact {
                later
            } else {
                earlier
            }
        }
    }
}

/// The host's name, as the kernel knows it; `localhost` if it cannot be read.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .or_else(|| {
            std::env::var("HOSTNAME")
                .ok()
                .filter(|name| !name.is_empty())
        })
        .unwrap_or_else(|| "localhost".to_owned())
}

/// An address of the host: the first non-loopback IPv4 address the host's name resolves to,
/// else the first address, else `127.0.0.1`. This asks the system's resolver (`/etc/hosts`
/// first, as a rule), once, when the template is parsed.
fn host_ip(name: &str) -> IpAddr {
    let addresses: Vec<IpAddr> = (name, 0)
        .to_socket_addrs()
        .map(|addrs| addrs.map(|addr| addr.ip()).collect())
        .unwrap_or_default();
    addresses
        .iter()
        .find(|ip| ip.is_ipv4() && !ip.is_loopback())
        .or_else(|| addresses.first())
        .copied()
        .unwrap_or(IpAddr::from([127, 0, 0, 1]))
}

/// The host's fully qualified name: `name` if it has a dot; else the canonical (first) name
/// of the `/etc/hosts` line that lists `name`, if that has a dot; else `name` with the
/// kernel's domain name; else `name`.
fn host_fqdn(name: String) -> String {
    if name.contains('.') {
        return name;
    }
    if let Ok(hosts) = std::fs::read_to_string("/etc/hosts") {
        let canonical = hosts.lines().find_map(|line| {
            let line = line.split('#').next().unwrap_or_default();
            let mut names = line.split_whitespace().skip(1);
            let first = names.next()?;
            let listed = first.eq_ignore_ascii_case(&name)
                || names.any(|alias| alias.eq_ignore_ascii_case(&name));
            (listed && first.contains('.')).then(|| first.to_owned())
        });
        if let Some(canonical) = canonical {
            return canonical;
        }
    }
    match std::fs::read_to_string("/proc/sys/kernel/domainname") {
        Ok(domain) if !domain.trim().is_empty() && domain.trim() != "(none)" => {
            format!("{name}.{}", domain.trim())
        }
        _ => name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2005-03-03T23:05:25.678Z, a Thursday: Flume's `%c` example.
    const THU: i64 = 1_109_891_125_678;
    /// 2005-03-03T23:17:25.678Z.
    const LATE: i64 = 1_109_891_845_678;

    fn zone(name: &str) -> TimeZone {
        TimeOptions::parse_time_zone(Some(name)).expect("a known zone")
    }

    fn options(zone_name: &str, round: Option<Duration>) -> TimeOptions {
        TimeOptions {
            use_local_time: false,
            round,
            time_zone: zone(zone_name),
        }
    }

    fn at(millis: i64) -> Headers {
        [("timestamp".to_owned(), millis.to_string())]
            .into_iter()
            .collect()
    }

    fn render(template: &str, headers: &Headers, time: &TimeOptions) -> String {
        PathTemplate::parse(template)
            .expect("a valid template")
            .render(headers, 0, time)
            .expect("renders")
    }

    const EVERY_TIME_ESCAPE: &str =
        "%t|%a|%A|%b|%B|%c|%d|%e|%D|%H|%I|%j|%k|%m|%n|%M|%p|%s|%S|%y|%Y|%z";

    #[test]
    fn renders_every_time_escape_in_utc() {
        assert_eq!(
            render(EVERY_TIME_ESCAPE, &at(THU), &options("UTC", None)),
            "1109891125678|Thu|Thursday|Mar|March|Thu Mar 3 23:05:25 2005|03|3|03/03/05|23|11|\
             062|23|03|3|05|PM|1109891125|25|05|2005|+0000"
        );
    }

    #[test]
    fn renders_every_time_escape_in_new_york() {
        assert_eq!(
            render(
                EVERY_TIME_ESCAPE,
                &at(THU),
                &options("America/New_York", None)
            ),
            "1109891125678|Thu|Thursday|Mar|March|Thu Mar 3 18:05:25 2005|03|3|03/03/05|18|06|\
             062|18|03|3|05|PM|1109891125|25|05|2005|-0500"
        );
    }

    #[test]
    fn renders_the_other_names_and_the_twelve_hour_clock() {
        let utc = options("UTC", None);
        let names = "%a %A %b %B %I%p %k";
        // 2024-07-08T00:30Z, a Monday; 2024-01-13T12:30Z, a Saturday.
        assert_eq!(
            render(names, &at(1_720_398_600_000), &utc),
            "Mon Monday Jul July 12AM 0"
        );
        assert_eq!(
            render(names, &at(1_705_149_000_000), &utc),
            "Sat Saturday Jan January 12PM 12"
        );
        // The last day of a leap year, east of UTC: 2024-12-31T20:00Z is 21:00 in Paris.
        assert_eq!(
            render(
                "%j %Y %z",
                &at(1_735_675_200_000),
                &options("Europe/Paris", None)
            ),
            "366 2024 +0100"
        );
        assert_eq!(
            render("%z", &at(THU), &options("Asia/Kolkata", None)),
            "+0530"
        );
    }

    #[test]
    fn follows_the_offset_across_the_spring_forward_in_new_york() {
        let new_york = options("America/New_York", None);
        let template = "%Y-%m-%d %H:%M:%S %z";
        assert_eq!(
            render(template, &at(1_710_053_999_000), &new_york),
            "2024-03-10 01:59:59 -0500"
        );
        assert_eq!(
            render(template, &at(1_710_054_000_000), &new_york),
            "2024-03-10 03:00:00 -0400"
        );
    }

    #[test]
    fn rounds_down_to_ten_minutes_an_hour_and_a_day() {
        let template = "%Y-%m-%d %H:%M:%S %s %t";
        let minute = Duration::from_secs(60);
        for (round, expected) in [
            (10 * minute, "2005-03-03 23:10:00 1109891400 1109891845678"),
            (60 * minute, "2005-03-03 23:00:00 1109890800 1109891845678"),
            (
                24 * 60 * minute,
                "2005-03-03 00:00:00 1109808000 1109891845678",
            ),
        ] {
            assert_eq!(
                render(template, &at(LATE), &options("UTC", Some(round))),
                expected,
                "rounding to {round:?}"
            );
        }
    }

    #[test]
    fn rounds_on_the_wall_clock_of_the_time_zone() {
        let template = "%Y-%m-%d %H:%M %z %s";
        let day = Some(Duration::from_secs(86_400));
        assert_eq!(
            render(template, &at(LATE), &options("America/New_York", day)),
            "2005-03-03 00:00 -0500 1109826000"
        );
        // 2005-03-04 04:47 in India rounds to 04:00 there, 22:30 UTC.
        let hour = Some(Duration::from_secs(3600));
        assert_eq!(
            render(template, &at(LATE), &options("Asia/Kolkata", hour)),
            "2005-03-04 04:00 +0530 1109889000"
        );
    }

    #[test]
    fn rounding_in_the_repeated_hour_keeps_the_occurrence_of_the_event() {
        let template = "%H:%M %z %s";
        let hour = options("America/New_York", Some(Duration::from_secs(3600)));
        // 01:30 EDT, then 01:30 EST an hour later.
        assert_eq!(
            render(template, &at(1_730_611_800_000), &hour),
            "01:00 -0400 1730610000"
        );
        assert_eq!(
            render(template, &at(1_730_615_400_000), &hour),
            "01:00 -0500 1730613600"
        );
    }

    #[test]
    fn rounding_into_the_skipped_hour_gives_the_end_of_the_gap() {
        // 03:10 EDT rounds to 02:40 on the clock, which did not exist: the result is 03:00
        // EDT, not 02:40 read as EST (03:40 EDT, after the event).
        let forty_minutes = options("America/New_York", Some(Duration::from_secs(2400)));
        assert_eq!(
            render("%H:%M %z %s", &at(1_710_054_600_000), &forty_minutes),
            "03:00 -0400 1710054000"
        );
        // 2018-11-04 in São Paulo had no midnight: the day started at 01:00.
        let day = options("America/Sao_Paulo", Some(Duration::from_secs(86_400)));
        assert_eq!(
            render("%Y-%m-%d %H:%M %z %s", &at(1_541_340_000_000), &day),
            "2018-11-04 01:00 -0200 1541300400"
        );
    }

    #[test]
    fn a_round_of_zero_does_not_round() {
        let zero = options("UTC", Some(Duration::ZERO));
        assert_eq!(render("%H:%M:%S", &at(LATE), &zero), "23:17:25");
    }

    #[test]
    fn a_missing_header_renders_empty() {
        let headers: Headers = [("host".to_owned(), "web-1".to_owned())]
            .into_iter()
            .collect();
        let utc = options("UTC", None);
        assert_eq!(
            render("/logs/%{host}/%{region}/x", &headers, &utc),
            "/logs/web-1//x"
        );
        let template = PathTemplate::parse("/logs/%{host}").expect("valid");
        assert!(!template.uses_time());
        assert!(!template.is_constant());
    }

    #[test]
    fn a_missing_timestamp_is_an_error_naming_the_template() {
        let template = PathTemplate::parse("/logs/%Y").expect("valid");
        let err = template
            .render(&Headers::new(), THU, &options("UTC", None))
            .expect_err("no timestamp");
        assert_eq!(
            err,
            PathError::MissingTimestamp {
                template: "/logs/%Y".to_owned()
            }
        );
        assert_eq!(
            err.to_string(),
            "the event has no `timestamp` header (milliseconds since the epoch) for the time \
             escapes of `/logs/%Y`; set `use_local_time: true` to use the time of writing"
        );
    }

    #[test]
    fn a_timestamp_that_is_not_epoch_milliseconds_is_an_error() {
        let template = PathTemplate::parse("%Y").expect("valid");
        for value in ["2005-03-03", "", "1.5", "99999999999999999"] {
            let headers: Headers = [("timestamp".to_owned(), value.to_owned())]
                .into_iter()
                .collect();
            let err = template
                .render(&headers, THU, &options("UTC", None))
                .expect_err("a bad timestamp");
            assert_eq!(err, PathError::BadTimestamp(value.to_owned()));
            assert_eq!(
                err.to_string(),
                format!(
                    "the event's `timestamp` header `{value}` is not milliseconds since the \
                     epoch"
                )
            );
        }
    }

    #[test]
    fn local_time_is_the_time_of_writing_not_the_header() {
        let template = PathTemplate::parse("%H:%M %t").expect("valid");
        let local = TimeOptions {
            use_local_time: true,
            ..options("UTC", Some(Duration::from_secs(600)))
        };
        // 2024-07-08T00:30Z, with and without a timestamp header.
        let now = 1_720_398_600_000;
        for headers in [Headers::new(), at(THU)] {
            assert_eq!(
                template.render(&headers, now, &local).expect("renders"),
                "00:30 1720398600000"
            );
        }
    }

    #[test]
    fn a_template_without_escapes_renders_as_written() {
        let template = PathTemplate::parse("/var/log/ferry").expect("valid");
        assert!(template.is_constant());
        assert!(!template.uses_time());
        assert_eq!(
            template
                .render(&Headers::new(), 0, &options("UTC", None))
                .expect("renders"),
            "/var/log/ferry"
        );
    }

    #[test]
    fn a_double_percent_is_a_literal_percent() {
        let template = PathTemplate::parse("100%%/%%{host}/%%").expect("valid");
        assert!(template.is_constant());
        assert_eq!(
            template
                .render(&Headers::new(), 0, &options("UTC", None))
                .expect("renders"),
            "100%/%{host}/%"
        );
        assert_eq!(render("%%%Y%%", &at(THU), &options("UTC", None)), "%2005%");
    }

    #[test]
    fn host_escapes_are_resolved_at_parse_time() {
        let template = PathTemplate::parse("%[localhost]|%[IP]|%[FQDN]|%[fqdn]").expect("valid");
        assert!(template.is_constant());
        let rendered = template
            .render(&Headers::new(), 0, &options("UTC", None))
            .expect("renders");
        let parts: Vec<&str> = rendered.split('|').collect();
        assert_eq!(parts.len(), 4);
        assert_eq!(parts[0], host_name());
        assert!(!parts[0].is_empty());
        assert!(parts[1].parse::<IpAddr>().is_ok(), "{rendered}");
        assert!(parts[2].starts_with(parts[0]), "{rendered}");
        assert_eq!(parts[2], parts[3]);
    }

    #[test]
    fn unknown_and_unfinished_escapes_are_errors_naming_them() {
        for (template, expected) in [
            (
                "/logs/%q/x",
                "path `/logs/%q/x`: unknown escape `%q` at byte 6; write `%%` for a literal `%`",
            ),
            (
                "/logs/%{host",
                "path `/logs/%{host`: the `%{` at byte 6 is not closed by `}`",
            ),
            (
                "/a/%[ip",
                "path `/a/%[ip`: the `%[` at byte 3 is not closed by `]`",
            ),
            (
                "/a/%[host]",
                "path `/a/%[host]`: unknown escape `%[host]` at byte 3; the host escapes are \
                 `%[localhost]`, `%[IP]` and `%[FQDN]`",
            ),
            (
                "/a/%{}",
                "path `/a/%{}`: the escape `%{}` at byte 3 has no name",
            ),
            (
                "/é/%",
                "path `/é/%`: the `%` at byte 4 ends the path; write `%%` for a literal `%`",
            ),
            (
                "/é/%é",
                "path `/é/%é`: unknown escape `%é` at byte 4; write `%%` for a literal `%`",
            ),
        ] {
            assert_eq!(PathTemplate::parse(template).expect_err(template), expected);
        }
    }

    #[test]
    fn uses_time_only_with_a_time_escape() {
        for (template, uses_time) in [("%t", true), ("%{t}/%%t", false), ("a/%z", true)] {
            assert_eq!(
                PathTemplate::parse(template).expect("valid").uses_time(),
                uses_time,
                "{template}"
            );
        }
    }

    #[test]
    fn time_zones_are_parsed_by_name() {
        assert!(TimeOptions::parse_time_zone(None).is_ok());
        assert_eq!(
            TimeOptions::parse_time_zone(Some("UTC"))
                .expect("known")
                .iana_name(),
            Some("UTC")
        );
        let err = TimeOptions::parse_time_zone(Some("Mars/Olympus_Mons")).expect_err("unknown");
        assert!(err.starts_with("time zone `Mars/Olympus_Mons`: "), "{err}");
    }
}

//! `--reset-offsets` of `agent groups`: where the offsets move (`--to-earliest`,
//! `--to-datetime`, `--shift-by`, ...), the plan printed as Kafka's tool prints it, and the
//! commit with `--execute`.

use std::io::Write;

use anyhow::{Context, bail};
use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::{Offset, TopicPartitionList};

use super::super::REQUEST_TIMEOUT;
use super::{GroupsArgs, group_client, group_view};

/// Prints rows with columns padded to their widest cell plus one space, as Kafka's tools do.
fn print_table<const N: usize>(
    out: &mut impl Write,
    header: &[&str; N],
    rows: &[[String; N]],
) -> anyhow::Result<()> {
    let mut widths = header.map(str::len);
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    writeln!(out)?;
    let line = |cells: Vec<&str>| {
        let mut text = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == N {
                text.push_str(cell);
            } else {
                text.push_str(&format!("{cell:<w$} ", w = w));
            }
        }
        text
    };
    writeln!(out, "{}", line(header.to_vec()))?;
    for row in rows {
        writeln!(out, "{}", line(row.iter().map(String::as_str).collect()))?;
    }
    Ok(())
}

/// `--topic` values: `topic` or `topic:0,1`.
fn parse_topic_spec(spec: &str) -> anyhow::Result<(&str, Option<Vec<i32>>)> {
    match spec.rsplit_once(':') {
        Some((topic, list)) => {
            let only = list
                .split(',')
                .map(|p| {
                    p.trim()
                        .parse::<i32>()
                        .with_context(|| format!("--topic {spec}: `{p}` is not a partition number"))
                })
                .collect::<anyhow::Result<Vec<i32>>>()?;
            Ok((topic, Some(only)))
        }
        None => Ok((spec, None)),
    }
}

/// Where `--reset-offsets` moves a group's offsets to.
enum Target {
    Earliest,
    Latest,
    Offset(i64),
    Shift(i64),
    /// The first offset at or after this time (milliseconds since the epoch).
    Time(i64),
    Current,
}

fn target(args: &GroupsArgs) -> anyhow::Result<Target> {
    Ok(if args.to_earliest {
        Target::Earliest
    } else if args.to_latest {
        Target::Latest
    } else if let Some(n) = args.to_offset {
        Target::Offset(n)
    } else if let Some(n) = args.shift_by {
        Target::Shift(n)
    } else if let Some(text) = &args.to_datetime {
        Target::Time(parse_datetime(text)?)
    } else if let Some(text) = &args.by_duration {
        let back = parse_duration(text)?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .context("the clock is before 1970")?;
        Target::Time(now.saturating_sub(back).as_millis() as i64)
    } else if args.to_current {
        Target::Current
    } else {
        bail!(
            "--reset-offsets needs one of --to-earliest, --to-latest, --to-offset, --shift-by, \
             --to-datetime, --by-duration, --to-current"
        )
    })
}

/// Resets the offsets of each of `groups` that has no active member; an active one is
/// refused with Kafka's message and the others still reset.
pub(super) fn reset(
    args: &GroupsArgs,
    groups: &[String],
    out: &mut impl Write,
) -> anyhow::Result<()> {
    if args.topic.is_empty() && !args.all_topics {
        bail!("One of the reset scopes should be defined: --all-topics, --topic.");
    }
    let target = target(args)?;
    let mut rows = Vec::new();
    for group in groups {
        let state = group_view(&args.cluster, group)?.state;
        if state != "Empty" && state != "Dead" {
            writeln!(
                out,
                "\nError: Assignments can only be reset if the group '{group}' is inactive, \
                 but the current state is {state}."
            )?;
            continue;
        }
        reset_group(args, group, &target, &mut rows)?;
    }
    if !args.execute && !args.dry_run {
        eprintln!(
            "WARN: No action will be performed as the --execute option is missing. \
             You should add the --dry-run option explicitly if you are scripting this command."
        );
    }
    if rows.is_empty() {
        return Ok(());
    }
    print_table(out, &["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"], &rows)
}

fn reset_group(
    args: &GroupsArgs,
    group: &str,
    target: &Target,
    rows: &mut Vec<[String; 4]>,
) -> anyhow::Result<()> {
    let consumer = group_client(&args.cluster, group)?;
    let metadata = consumer
        .fetch_metadata(None, REQUEST_TIMEOUT)
        .context("fetching metadata")?;
    let partitions_of = |topic: &str| -> Vec<i32> {
        metadata
            .topics()
            .iter()
            .find(|t| t.name() == topic)
            .map(|t| t.partitions().iter().map(|p| p.id()).collect())
            .unwrap_or_default()
    };
    let mut all = TopicPartitionList::new();
    for topic in metadata.topics() {
        for p in topic.partitions() {
            all.add_partition(topic.name(), p.id());
        }
    }
    let committed = consumer
        .committed_offsets(all, REQUEST_TIMEOUT)
        .context("reading the committed offsets")?;
    let committed_at = |topic: &str, p: i32| {
        committed
            .find_partition(topic, p)
            .and_then(|e| e.offset().to_raw())
            .filter(|o| *o >= 0)
    };
    let mut wanted: Vec<(String, i32)> = Vec::new();
    if args.all_topics {
        for e in committed.elements() {
            if committed_at(e.topic(), e.partition()).is_some() {
                wanted.push((e.topic().to_owned(), e.partition()));
            }
        }
    }
    for spec in &args.topic {
        let (topic, only) = parse_topic_spec(spec)?;
        let partitions = partitions_of(topic);
        if partitions.is_empty() {
            bail!("topic {topic} not found");
        }
        if let Some(only) = &only
            && let Some(missing) = only.iter().find(|p| !partitions.contains(p))
        {
            bail!("topic {topic} has no partition {missing}");
        }
        for p in only.unwrap_or(partitions) {
            wanted.push((topic.to_owned(), p));
        }
    }
    wanted.sort();
    wanted.dedup();
    // --to-datetime and --by-duration: ListOffsets by timestamp.
    let by_time = match target {
        Target::Time(ms) => {
            let mut list = TopicPartitionList::new();
            for (topic, p) in &wanted {
                list.add_partition_offset(topic, *p, Offset::Offset(*ms))?;
            }
            Some(
                consumer
                    .offsets_for_times(list, REQUEST_TIMEOUT)
                    .context("looking up offsets by timestamp")?,
            )
        }
        _ => None,
    };
    let mut plan = TopicPartitionList::new();
    for (topic, p) in &wanted {
        let (topic, p) = (topic.as_str(), *p);
        let (low, high) = consumer
            .fetch_watermarks(topic, p, REQUEST_TIMEOUT)
            .with_context(|| format!("offsets of {topic}-{p}"))?;
        let new = match target {
            Target::Earliest => low,
            Target::Latest => high,
            Target::Offset(n) => (*n).clamp(low, high),
            Target::Shift(shift) => {
                let current = committed_at(topic, p).with_context(|| {
                    format!(
                        "Cannot shift offset for partition {topic}-{p} since there is no \
                         current committed offset"
                    )
                })?;
                current.saturating_add(*shift).clamp(low, high)
            }
            // No record at or after the time: the log end, as Kafka.
            Target::Time(_) => by_time
                .as_ref()
                .and_then(|l| l.find_partition(topic, p))
                .and_then(|e| e.offset().to_raw())
                .filter(|o| *o >= 0)
                .unwrap_or(high),
            Target::Current => committed_at(topic, p).unwrap_or(high),
        };
        plan.add_partition_offset(topic, p, Offset::Offset(new))?;
        rows.push([
            group.to_owned(),
            topic.to_owned(),
            p.to_string(),
            new.to_string(),
        ]);
    }
    if args.execute && plan.count() > 0 {
        consumer
            .commit(&plan, CommitMode::Sync)
            .with_context(|| format!("committing the new offsets of group {group}"))?;
    }
    Ok(())
}

/// Days from 1970-01-01 to a proleptic Gregorian date.
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Kafka's `--to-datetime`: `YYYY-MM-DDTHH:mm:SS.sss`, then `Z`, `+hh:mm`, `-hh:mm`, `+hhmm`
/// or nothing (UTC); gives milliseconds since the epoch.
fn parse_datetime(text: &str) -> anyhow::Result<i64> {
    let bad = || {
        anyhow::anyhow!(
            "--to-datetime {text}: expected YYYY-MM-DDTHH:mm:SS.sss, optionally followed by Z \
             or a zone offset such as +02:00"
        )
    };
    let b = text.as_bytes();
    if b.len() < 23 || !text.is_char_boundary(23) {
        return Err(bad());
    }
    let (main, zone) = text.split_at(23);
    let shape = "dddd-dd-ddTdd:dd:dd.ddd";
    if !main.bytes().zip(shape.bytes()).all(|(c, s)| {
        if s == b'd' {
            c.is_ascii_digit()
        } else {
            c == s
        }
    }) {
        return Err(bad());
    }
    let num = |r: std::ops::Range<usize>| main[r].parse::<i64>().map_err(|_| bad());
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second, milli) = (num(11..13)?, num(14..16)?, num(17..19)?, num(20..23)?);
    let month_days = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let max_day = match month {
        2 if leap => 29,
        1..=12 => month_days[(month - 1) as usize],
        _ => return Err(bad()),
    };
    if day < 1 || day > max_day || hour > 23 || minute > 59 || second > 59 {
        return Err(bad());
    }
    let offset_minutes = match zone {
        "" | "Z" => 0,
        _ => {
            let (sign, rest) = match zone.split_at_checked(1) {
                Some(("+", rest)) => (1, rest),
                Some(("-", rest)) => (-1, rest),
                _ => return Err(bad()),
            };
            let digits: String = rest.chars().filter(|c| *c != ':').collect();
            let ok_shape = matches!(rest.len(), 2 | 4) && !rest.contains(':')
                || rest.len() == 5 && rest.as_bytes()[2] == b':';
            if !ok_shape || !digits.bytes().all(|c| c.is_ascii_digit()) {
                return Err(bad());
            }
            let hours: i64 = digits[..2].parse().map_err(|_| bad())?;
            let minutes: i64 = if digits.len() == 4 {
                digits[2..].parse().map_err(|_| bad())?
            } else {
                0
            };
            if hours > 18 || minutes > 59 {
                return Err(bad());
            }
            sign * (hours * 60 + minutes)
        }
    };
    let days = days_from_civil(year, month, day);
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second - offset_minutes * 60;
    Ok(seconds * 1000 + milli)
}

/// Kafka's `--by-duration`: an ISO-8601 duration `PnDTnHnMnS` (each part optional, seconds
/// may have a fraction).
fn parse_duration(text: &str) -> anyhow::Result<std::time::Duration> {
    let bad = || {
        anyhow::anyhow!(
            "--by-duration {text}: expected an ISO-8601 duration PnDTnHnMnS, e.g. PT30M or P1DT2H"
        )
    };
    let rest = text
        .strip_prefix('P')
        .or_else(|| text.strip_prefix('p'))
        .ok_or_else(bad)?;
    let (days_part, time_part) = match rest.split_once(['T', 't']) {
        Some((d, t)) => {
            if t.is_empty() {
                return Err(bad());
            }
            (d, Some(t))
        }
        None => (rest, None),
    };
    let mut millis: u128 = 0;
    let mut any = false;
    if !days_part.is_empty() {
        let n = days_part
            .strip_suffix(['D', 'd'])
            .and_then(|n| n.parse::<u64>().ok())
            .ok_or_else(bad)?;
        millis += u128::from(n) * 86_400_000;
        any = true;
    }
    if let Some(mut t) = time_part {
        let mut last_unit = 0;
        while !t.is_empty() {
            let end = t
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .ok_or_else(bad)?;
            let (number, tail) = t.split_at(end);
            let unit = tail.chars().next().ok_or_else(bad)?.to_ascii_uppercase();
            let (rank, scale) = match unit {
                'H' => (1, 3_600_000.0),
                'M' => (2, 60_000.0),
                'S' => (3, 1000.0),
                _ => return Err(bad()),
            };
            if rank <= last_unit || number.is_empty() || (unit != 'S' && number.contains('.')) {
                return Err(bad());
            }
            last_unit = rank;
            let value: f64 = number.parse().map_err(|_| bad())?;
            millis += (value * scale) as u128;
            any = true;
            t = &tail[1..];
        }
    }
    if !any {
        return Err(bad());
    }
    Ok(std::time::Duration::from_millis(
        u64::try_from(millis).map_err(|_| bad())?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kafkas_datetimes_and_durations() {
        assert_eq!(parse_datetime("1970-01-01T00:00:00.000").unwrap(), 0);
        assert_eq!(parse_datetime("1970-01-01T00:00:01.500Z").unwrap(), 1500);
        assert_eq!(
            parse_datetime("2024-02-29T12:30:00.000").unwrap(),
            1_709_209_800_000
        );
        assert_eq!(
            parse_datetime("2024-02-29T14:30:00.000+02:00").unwrap(),
            1_709_209_800_000
        );
        assert_eq!(
            parse_datetime("2024-02-29T10:00:00.000-0230").unwrap(),
            1_709_209_800_000
        );
        for bad in [
            "2023-02-29T00:00:00.000",
            "2024-13-01T00:00:00.000",
            "2024-01-01 00:00:00.000",
            "2024-01-01T00:00:00",
            "2024-01-01T00:00:00.000+2",
            "2024-01-01T00:00:00.000Q",
            "2024-01-01T24:00:00.000",
            "",
            "2024-01-01T00:00:00.00é",
        ] {
            assert!(parse_datetime(bad).is_err(), "{bad}");
        }
        let d = |s: &str| parse_duration(s).unwrap().as_millis();
        assert_eq!(d("PT1H"), 3_600_000);
        assert_eq!(d("P1DT2H3M4.5S"), 93_784_500);
        assert_eq!(d("PT30M"), 1_800_000);
        assert_eq!(d("P2D"), 172_800_000);
        for bad in ["", "P", "PT", "1H", "PT1X", "PT1M1H", "P1H", "PTH", "P1.5D"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}

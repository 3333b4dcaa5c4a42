//! When a cron job fires: a [`Schedule`] as stored (every N seconds, or a cron expression of 5
//! or 6 fields in a named time zone), checked and compiled once into a [`CompiledSchedule`] whose
//! next-fire times come from `croner` with `chrono-tz` zones. An expression croner refuses is an
//! error that names the bad field and word.

use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use serde::{Deserialize, Serialize};

use super::{MAX_EVERY_SECONDS, MAX_EXPRESSION_CHARS, MAX_KEY_CHARS, MIN_EVERY_SECONDS};

/// When a job fires, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Schedule {
    /// Every `seconds` seconds.
    Every {
        /// The interval.
        seconds: u64,
    },
    /// On a cron expression read in an IANA time zone.
    Cron {
        /// The expression as given.
        expression: String,
        /// The zone, e.g. `Europe/Berlin` or `UTC`.
        timezone: String,
    },
}

impl Schedule {
    /// Checks this schedule and prepares it for computing firings. Errors name what is wrong
    /// (for an expression, the field) and say what to write instead.
    pub fn compile(&self) -> Result<CompiledSchedule, String> {
        match self {
            Schedule::Every { seconds } => {
                if !(MIN_EVERY_SECONDS..=MAX_EVERY_SECONDS).contains(seconds) {
                    return Err(format!(
                        "every_seconds must be between {MIN_EVERY_SECONDS} and {MAX_EVERY_SECONDS} (one year), not {seconds}"
                    ));
                }
                Ok(CompiledSchedule::Every(Duration::from_secs(*seconds)))
            }
            Schedule::Cron {
                expression,
                timezone,
            } => {
                let zone = parse_timezone(timezone)?;
                let cron = parse_expression(expression)?;
                Ok(CompiledSchedule::Cron(Box::new(cron), zone))
            }
        }
    }

    /// The schedule in words, e.g. `every 60 s` or `cron 0 9 * * MON-FRI`.
    pub fn describe(&self) -> String {
        match self {
            Schedule::Every { seconds } => format!("every {seconds} s"),
            Schedule::Cron { expression, .. } => format!("cron {expression}"),
        }
    }

    /// The time zone the schedule is read in.
    pub fn timezone(&self) -> &str {
        match self {
            Schedule::Every { .. } => "UTC",
            Schedule::Cron { timezone, .. } => timezone,
        }
    }
}

/// A checked schedule that computes firings.
#[derive(Debug, Clone)]
pub enum CompiledSchedule {
    /// A fixed interval.
    Every(Duration),
    /// A parsed expression and its zone.
    Cron(Box<Cron>, Tz),
}

impl CompiledSchedule {
    /// The first firing strictly after `after`, or `None` if there is none (an expression that
    /// matches no date before the year 5000, or a time past chrono's range).
    pub fn next_fire(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match self {
            CompiledSchedule::Every(interval) => {
                after.checked_add_signed(chrono::Duration::from_std(*interval).ok()?)
            }
            CompiledSchedule::Cron(cron, zone) => cron
                .find_next_occurrence(&after.with_timezone(zone), false)
                .ok()
                .map(|fire| fire.with_timezone(&Utc)),
        }
    }
}

/// The first firing of `schedule` strictly after `after`; `None` if the schedule is invalid or
/// never fires again.
pub fn next_fire(schedule: &Schedule, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
    schedule.compile().ok()?.next_fire(after)
}

fn parse_timezone(name: &str) -> Result<Tz, String> {
    if name.chars().count() > MAX_KEY_CHARS {
        return Err(format!(
            "the time zone name is longer than {MAX_KEY_CHARS} characters; use an IANA name such as Europe/Berlin or UTC"
        ));
    }
    Tz::from_str(name).map_err(|_| {
        format!(
            "unknown time zone `{name}`: use an IANA name such as Europe/Berlin, America/New_York or UTC (names are case-sensitive)"
        )
    })
}

/// The names of the fields of a 5-field expression; a 6-field one has `second` in front.
const FIELD_NAMES: [&str; 5] = ["minute", "hour", "day-of-month", "month", "day-of-week"];

fn parser() -> CronParser {
    CronParser::builder()
        .seconds(Seconds::Optional)
        .year(Year::Disallowed)
        .build()
}

/// Parses a cron expression of 5 or 6 fields (or an `@daily`-style nickname). On an error, finds
/// the first field croner refuses on its own (the others replaced by `*`) and names it.
fn parse_expression(expression: &str) -> Result<Cron, String> {
    let trimmed = expression.trim();
    if trimmed.chars().count() > MAX_EXPRESSION_CHARS {
        return Err(format!(
            "the cron expression is longer than {MAX_EXPRESSION_CHARS} characters"
        ));
    }
    let fields: Vec<&str> = trimmed.split_whitespace().collect();
    let nickname = fields.len() == 1 && fields[0].starts_with('@');
    if !nickname && !(5..=6).contains(&fields.len()) {
        return Err(format!(
            "the cron expression `{trimmed}` has {} field{}; write 5 (minute hour day-of-month month day-of-week, e.g. \"0 9 * * MON-FRI\") or 6 (with seconds first, e.g. \"*/10 * * * * *\")",
            fields.len(),
            if fields.len() == 1 { "" } else { "s" }
        ));
    }
    let names: Vec<&str> = if fields.len() == 6 {
        std::iter::once("second").chain(FIELD_NAMES).collect()
    } else {
        FIELD_NAMES.to_vec()
    };
    if !nickname {
        for (field, name) in fields.iter().zip(&names) {
            check_field_words(field, name, trimmed)?;
        }
    }
    let error = match parser().parse(trimmed) {
        Ok(cron) => {
            // A valid pattern that matches no date at all (e.g. `0 0 30 2 *`) never fires.
            if cron.find_next_occurrence(&Utc::now(), false).is_err() {
                return Err(format!(
                    "the cron expression `{trimmed}` never fires (no date matches it); check the day-of-month and month fields"
                ));
            }
            return Ok(cron);
        }
        Err(error) => error,
    };
    if nickname {
        return Err(format!(
            "the cron expression `{trimmed}` is not valid: {error}; the nicknames are @yearly, @monthly, @weekly, @daily and @hourly"
        ));
    }
    for (index, field) in fields.iter().enumerate() {
        let alone: Vec<&str> = (0..fields.len())
            .map(|other| if other == index { *field } else { "*" })
            .collect();
        if let Err(field_error) = parser().parse(&alone.join(" ")) {
            return Err(format!(
                "the {} field `{field}` of the cron expression `{trimmed}` is not valid: {field_error}",
                names[index]
            ));
        }
    }
    Err(format!(
        "the cron expression `{trimmed}` is not valid: {error}"
    ))
}

/// Month names.
const MONTHS: [&str; 12] = [
    "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
];
/// Day names.
const DAYS: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];

/// Refuses a word that does not belong in its field. croner replaces month and day names
/// anywhere in the expression, so `MON` in the month field would silently mean January.
fn check_field_words(field: &str, name: &str, expression: &str) -> Result<(), String> {
    let upper = field.to_ascii_uppercase();
    for word in upper
        .split(|c: char| !c.is_ascii_alphabetic())
        .filter(|word| !word.is_empty())
    {
        let allowed = match name {
            "month" => MONTHS.contains(&word),
            "day-of-week" => DAYS.contains(&word) || word == "L",
            "day-of-month" => matches!(word, "L" | "W" | "LW"),
            _ => false,
        };
        if !allowed {
            let hint = match name {
                "month" => "months are 1-12 or JAN-DEC",
                "day-of-week" => "days are 0-7 (0 and 7 are Sunday) or SUN-SAT, with # and L",
                "day-of-month" => "days are 1-31, with L (last) and W (nearest weekday)",
                _ => "this field takes numbers, *, ranges (a-b), steps (/n) and lists (a,b)",
            };
            return Err(format!(
                "the {name} field `{field}` of the cron expression `{expression}` is not valid: `{word}` does not belong there ({hint})"
            ));
        }
    }
    Ok(())
}

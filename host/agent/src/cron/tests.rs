//! The cron service on real files in temp dirs: adding, firing once per due time, the store's
//! failures, and the time zones.

use super::*;

fn utc(text: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(text)
        .unwrap()
        .with_timezone(&Utc)
}

fn cron_in(expression: &str, timezone: &str) -> CompiledSchedule {
    Schedule::Cron {
        expression: expression.to_string(),
        timezone: timezone.to_string(),
    }
    .compile()
    .unwrap()
}

/// The next `count` firings strictly after `after`, as RFC 3339 UTC times.
fn firings(expression: &str, timezone: &str, after: &str, count: usize) -> Vec<String> {
    let schedule = cron_in(expression, timezone);
    let mut at = utc(after);
    let mut out = Vec::new();
    for _ in 0..count {
        at = schedule.next_fire(at).unwrap();
        out.push(at.to_rfc3339_opts(SecondsFormat::Secs, true));
    }
    out
}

fn error_of(expression: &str) -> String {
    Schedule::Cron {
        expression: expression.to_string(),
        timezone: "UTC".to_string(),
    }
    .compile()
    .unwrap_err()
}

#[test]
fn last_day_of_month_handles_short_months_and_leap_years() {
    assert_eq!(
        firings("0 0 L * *", "UTC", "2025-01-15T00:00:00Z", 3),
        [
            "2025-01-31T00:00:00Z",
            "2025-02-28T00:00:00Z",
            "2025-03-31T00:00:00Z"
        ]
    );
    assert_eq!(
        firings("0 0 L 2 *", "UTC", "2027-06-01T00:00:00Z", 2),
        ["2028-02-29T00:00:00Z", "2029-02-28T00:00:00Z"]
    );
}

#[test]
fn leap_day_waits_for_the_next_leap_year() {
    assert_eq!(
        firings("0 12 29 2 *", "UTC", "2025-03-01T00:00:00Z", 2),
        ["2028-02-29T12:00:00Z", "2032-02-29T12:00:00Z"]
    );
}

#[test]
fn weekdays_skip_the_weekend() {
    // 2026-11-27 is a Friday.
    assert_eq!(
        firings("0 9 * * MON-FRI", "UTC", "2026-11-27T18:00:00Z", 2),
        ["2026-11-30T09:00:00Z", "2026-12-01T09:00:00Z"]
    );
}

#[test]
fn nth_weekday_of_the_month() {
    // Second Mondays: 2026-12-14, 2027-01-11, 2027-02-08.
    assert_eq!(
        firings("0 9 * * 1#2", "UTC", "2026-12-01T00:00:00Z", 3),
        [
            "2026-12-14T09:00:00Z",
            "2027-01-11T09:00:00Z",
            "2027-02-08T09:00:00Z"
        ]
    );
    // Last Friday: 2026-12-25.
    assert_eq!(
        firings("0 9 * * 5#L", "UTC", "2026-12-01T00:00:00Z", 1),
        ["2026-12-25T09:00:00Z"]
    );
}

#[test]
fn nearest_weekday_moves_off_weekends_within_the_month() {
    // 2026-08-15 is a Saturday -> Friday the 14th; 2026-11-15 is a Sunday -> Monday the 16th;
    // 2026-09-15 is a Tuesday -> itself.
    assert_eq!(
        firings("0 0 15W * *", "UTC", "2026-08-01T00:00:00Z", 4),
        [
            "2026-08-14T00:00:00Z",
            "2026-09-15T00:00:00Z",
            "2026-10-15T00:00:00Z",
            "2026-11-16T00:00:00Z"
        ]
    );
    // 2026-08-01 is a Saturday: 1W stays in August, on Monday the 3rd.
    assert_eq!(
        firings("0 0 1W 8 *", "UTC", "2026-07-01T00:00:00Z", 1),
        ["2026-08-03T00:00:00Z"]
    );
}

#[test]
fn six_fields_have_seconds_first() {
    assert_eq!(
        firings("*/20 * * * * *", "UTC", "2026-01-01T00:00:05Z", 3),
        [
            "2026-01-01T00:00:20Z",
            "2026-01-01T00:00:40Z",
            "2026-01-01T00:01:00Z"
        ]
    );
    assert_eq!(
        firings("30 15 10 * * *", "UTC", "2026-01-01T12:00:00Z", 1),
        ["2026-01-02T10:15:30Z"]
    );
}

#[test]
fn named_months_ranges_and_lists() {
    assert_eq!(
        firings("0 8 1 JAN-MAR *", "UTC", "2026-02-15T00:00:00Z", 3),
        [
            "2026-03-01T08:00:00Z",
            "2027-01-01T08:00:00Z",
            "2027-02-01T08:00:00Z"
        ]
    );
    assert_eq!(
        firings("0,30 8-9 * * SAT,sun", "UTC", "2026-11-27T00:00:00Z", 5),
        [
            "2026-11-28T08:00:00Z",
            "2026-11-28T08:30:00Z",
            "2026-11-28T09:00:00Z",
            "2026-11-28T09:30:00Z",
            "2026-11-29T08:00:00Z"
        ]
    );
}

#[test]
fn named_zone_follows_standard_and_summer_time() {
    // 09:00 in Berlin is 08:00 UTC in winter and 07:00 UTC in summer.
    assert_eq!(
        firings("0 9 * * *", "Europe/Berlin", "2026-03-28T12:00:00Z", 2),
        ["2026-03-29T07:00:00Z", "2026-03-30T07:00:00Z"]
    );
    assert_eq!(
        firings("0 9 * * *", "Europe/Berlin", "2026-10-24T12:00:00Z", 2),
        ["2026-10-25T08:00:00Z", "2026-10-26T08:00:00Z"]
    );
}

#[test]
fn spring_forward_runs_a_skipped_time_at_the_end_of_the_gap() {
    // On 2026-03-29 Berlin clocks jump from 02:00 CET to 03:00 CEST, so 02:30 does not exist.
    // croner runs a fixed-time job that falls into the gap at the first instant after it:
    // 03:00 CEST = 01:00 UTC. The days around it run at 02:30 local as usual.
    assert_eq!(
        firings("30 2 * * *", "Europe/Berlin", "2026-03-27T12:00:00Z", 4),
        [
            "2026-03-28T01:30:00Z",
            "2026-03-29T01:00:00Z",
            "2026-03-30T00:30:00Z",
            "2026-03-31T00:30:00Z"
        ]
    );
}

#[test]
fn fall_back_runs_a_repeated_time_once() {
    // On 2026-10-25 Berlin clocks go back from 03:00 CEST to 02:00 CET, so 02:30 happens
    // twice (00:30 and 01:30 UTC). A fixed-time job runs once, at the earlier instant.
    assert_eq!(
        firings("30 2 * * *", "Europe/Berlin", "2026-10-24T12:00:00Z", 2),
        ["2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"]
    );
    // An interval job runs on every real instant: both 02:30s happen within the hour.
    assert_eq!(
        firings("*/30 * * * *", "Europe/Berlin", "2026-10-24T23:45:00Z", 5),
        [
            "2026-10-25T00:00:00Z",
            "2026-10-25T00:30:00Z",
            "2026-10-25T01:00:00Z",
            "2026-10-25T01:30:00Z",
            "2026-10-25T02:00:00Z"
        ]
    );
}

#[test]
fn every_seconds_counts_from_the_given_time() {
    let schedule = Schedule::Every { seconds: 90 }.compile().unwrap();
    assert_eq!(
        schedule.next_fire(utc("2026-01-01T00:00:00Z")),
        Some(utc("2026-01-01T00:01:30Z"))
    );
    assert!(Schedule::Every { seconds: 0 }.compile().is_err());
    assert!(
        Schedule::Every {
            seconds: MAX_EVERY_SECONDS + 1
        }
        .compile()
        .is_err()
    );
}

#[test]
fn invalid_expressions_name_the_field() {
    for (expression, field) in [
        ("61 * * * *", "the minute field `61`"),
        ("0 24 * * *", "the hour field `24`"),
        ("0 0 32 * *", "the day-of-month field `32`"),
        ("0 0 * 13 *", "the month field `13`"),
        ("0 0 * FOO *", "the month field `FOO`"),
        ("0 9 * * MOX", "the day-of-week field `MOX`"),
        ("0 9 * * 1#6", "the day-of-week field `1#6`"),
        ("60 0 9 * * *", "the second field `60`"),
        ("0 0 1 MON *", "the month field `MON`"),
        ("0 0 * * JAN", "the day-of-week field `JAN`"),
        ("0 0 LX * *", "the day-of-month field `LX`"),
    ] {
        let error = error_of(expression);
        assert!(error.contains(field), "{expression}: {error}");
    }
    assert!(error_of("0 9 * *").contains("has 4 fields"));
    assert!(error_of("0 0 9 * * * 2026").contains("has 7 fields"));
    assert!(error_of("").contains("has 0 fields"));
    assert!(error_of("0 0 30 2 *").contains("never fires"));
    assert!(error_of(&"1,".repeat(200)).contains("longer than"));
}

#[test]
fn unknown_time_zones_are_refused() {
    for zone in ["Mars/Olympus", "europe/berlin", "", "../../etc/passwd"] {
        let error = Schedule::Cron {
            expression: "0 9 * * *".to_string(),
            timezone: zone.to_string(),
        }
        .compile()
        .unwrap_err();
        assert!(error.contains("unknown time zone"), "{zone}: {error}");
    }
}

#[test]
fn two_processes_on_one_state_directory_see_each_others_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let chat = CronService::open(dir.path(), MessageBus::new(), CronOptions::default()).unwrap();
    let cli = CronService::open(dir.path(), MessageBus::new(), CronOptions::default()).unwrap();
    let request = |message: &str| JobRequest {
        every_seconds: Some(3600),
        cron: None,
        timezone: None,
        message: message.to_string(),
        name: None,
        session: Some("main".to_string()),
    };
    let first = cli.add(request("from the command line")).unwrap();
    let second = chat.add(request("from the chat")).unwrap();
    assert_ne!(first.id, second.id, "ids are taken under the file's lock");
    assert_eq!(cli.list().len(), 2);
    chat.remove(&first.id).unwrap();
    let left = cli.list();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].message, "from the chat");
}

//! The redactor against real secrets: every form a value can take in text, streams cut at any
//! byte, and the values it must leave alone.

use super::*;

const KEY: &str = "sk-live-4f9a2b7c";

fn redactor() -> Redactor {
    Redactor::new([("BRAVE_API_KEY", KEY)])
}

fn percent(value: &str, lower: bool) -> String {
    value
        .bytes()
        .map(|byte| {
            if byte.is_ascii_alphanumeric() {
                (byte as char).to_string()
            } else if lower {
                format!("%{byte:02x}")
            } else {
                format!("%{byte:02X}")
            }
        })
        .collect()
}

#[test]
fn the_raw_value_is_replaced_in_text_and_bytes() {
    let r = redactor();
    assert_eq!(
        r.redact(&format!("token={KEY}; again {KEY}.")),
        "token=[redacted: BRAVE_API_KEY]; again [redacted: BRAVE_API_KEY]."
    );
    assert_eq!(
        r.redact_bytes(format!("\x00\u{ff}{KEY}").as_bytes()),
        b"\x00\xc3\xbf[redacted: BRAVE_API_KEY]".to_vec()
    );
    assert_eq!(r.redact("nothing here"), "nothing here");
    assert!(r.contains(KEY.as_bytes()));
    assert!(!r.contains(b"sk-live-4f9a2b7"));
    // Neighbouring text is kept; a near miss is not replaced.
    assert_eq!(r.redact("sk-live-4f9a2b7d"), "sk-live-4f9a2b7d");
}

#[test]
fn percent_encoded_forms_are_replaced_in_either_case() {
    let value = "a/b+c=d&e f?g#h";
    let r = Redactor::new([("K", value)]);
    for encoded in [
        percent(value, false),
        percent(value, true),
        // A mix: some bytes left raw, as many encoders leave `/`.
        "a/b%2Bc%3dd%26e+f%3Fg%23h".to_string(),
        // Every byte encoded.
        value.bytes().map(|b| format!("%{b:02X}")).collect(),
    ] {
        assert_eq!(
            r.redact(&format!("?u={encoded}&x=1")),
            "?u=[redacted: K]&x=1",
            "{encoded}"
        );
    }
}

#[test]
fn json_escaped_forms_are_replaced() {
    let value = r#"pa"ss\wo/rd<1>"#;
    let r = Redactor::new([("PASSWORD", value)]);
    let escaped = serde_json::to_string(value).unwrap();
    assert_eq!(escaped, r#""pa\"ss\\wo/rd<1>""#);
    assert_eq!(r.redact(&escaped), r#""[redacted: PASSWORD]""#);
    // Other escapers: `\/`, and `\u00XX` for HTML-sensitive characters (as Go writes them).
    assert_eq!(
        r.redact(r#"{"k":"pa\"ss\\wo\/rd\u003c1\u003E"}"#),
        r#"{"k":"[redacted: PASSWORD]"}"#
    );
    // A value with nothing to escape is found raw inside JSON.
    let r = redactor();
    let body = serde_json::json!({"headers": {"X-Subscription-Token": KEY}}).to_string();
    assert_eq!(
        r.redact(&body),
        r#"{"headers":{"X-Subscription-Token":"[redacted: BRAVE_API_KEY]"}}"#
    );
}

#[test]
fn base64_forms_are_replaced_at_every_alignment() {
    let r = redactor();
    let exact = String::from_utf8(base64(KEY.as_bytes(), true)).unwrap();
    assert_eq!(
        r.redact(&format!("b64: {exact}!")),
        "b64: [redacted: BRAVE_API_KEY]!"
    );
    for prefix in ["", "u", "us", "user:"] {
        let credential = format!("{prefix}{KEY}@host");
        let encoded = String::from_utf8(base64(credential.as_bytes(), true)).unwrap();
        let redacted = r.redact(&format!("Basic {encoded}"));
        assert!(
            redacted.contains("[redacted: BRAVE_API_KEY]"),
            "{prefix}: {redacted}"
        );
        // What is left of the encoding is at most the characters shared with the neighbours.
        let kept = redacted.replace("[redacted: BRAVE_API_KEY]", "");
        assert!(kept.len() < "Basic ".len() + encoded.len() / 2, "{kept}");
    }
    // URL-safe base64 of a value whose encoding has `+` or `/`.
    let value = [0xfb_u8, 0xff, 0xbf, 0xfb, 0xff, 0xbf, 0xfb, 0xff, 0xbf];
    let r = Redactor::new([("BIN", value)]);
    let standard = base64(&value, true);
    assert!(standard.contains(&b'+') || standard.contains(&b'/'));
    let url_safe: Vec<u8> = standard
        .iter()
        .map(|&b| match b {
            b'+' => b'-',
            b'/' => b'_',
            o => o,
        })
        .collect();
    assert_eq!(r.redact_bytes(&standard), b"[redacted: BIN]".to_vec());
    assert_eq!(r.redact_bytes(&url_safe), b"[redacted: BIN]".to_vec());
}

#[test]
fn base64_matches_the_standard_encoding() {
    for (plain, encoded) in [
        ("", ""),
        ("f", "Zg=="),
        ("fo", "Zm8="),
        ("foo", "Zm9v"),
        ("foob", "Zm9vYg=="),
        ("fooba", "Zm9vYmE="),
        ("foobar", "Zm9vYmFy"),
    ] {
        assert_eq!(base64(plain.as_bytes(), true), encoded.as_bytes());
    }
}

#[test]
fn short_values_are_skipped_and_reported() {
    let r = Redactor::new([("SHORT", "abc"), ("EMPTY", ""), ("SEVEN", "1234567")]);
    assert!(r.is_empty());
    assert_eq!(r.skipped(), ["SHORT", "EMPTY", "SEVEN"]);
    assert_eq!(r.redact("abc 1234567"), "abc 1234567");
    let r = Redactor::new([("EIGHT", "12345678")]);
    assert_eq!(r.redact("x12345678x"), "x[redacted: EIGHT]x");
    assert!(r.skipped().is_empty());
}

#[test]
fn several_values_and_the_longest_match_win() {
    let r = Redactor::new([
        ("SHORTER", "abcdefgh"),
        ("LONGER", "abcdefghijkl"),
        ("DUPLICATE", "abcdefgh"),
    ]);
    assert_eq!(r.labels(), ["SHORTER", "LONGER"]);
    assert_eq!(
        r.redact("abcdefghijkl abcdefgh abcdefghij"),
        "[redacted: LONGER] [redacted: SHORTER] [redacted: SHORTER]ij"
    );
}

#[test]
fn merging_joins_values_and_skipped_labels() {
    let providers = Redactor::new([("ANTHROPIC_API_KEY", "sk-ant-0123456789"), ("X", "y")]);
    let network = Redactor::new([
        ("BRAVE_API_KEY", KEY),
        ("ALSO_ANTHROPIC", "sk-ant-0123456789"),
    ]);
    let both = providers.merged(&network);
    assert_eq!(both.labels(), ["ANTHROPIC_API_KEY", "BRAVE_API_KEY"]);
    assert_eq!(both.skipped(), ["X"]);
    assert_eq!(
        both.redact(&format!("{KEY} sk-ant-0123456789")),
        "[redacted: BRAVE_API_KEY] [redacted: ANTHROPIC_API_KEY]"
    );
    assert!(Redactor::default().merged(&Redactor::default()).is_empty());
}

#[test]
fn printing_shows_labels_only() {
    let shown = format!("{:?}", Redactor::new([("BRAVE_API_KEY", KEY), ("X", "y")]));
    assert!(!shown.contains(KEY), "{shown}");
    assert!(
        shown.contains("BRAVE_API_KEY") && shown.contains("skipped"),
        "{shown}"
    );
}

#[test]
fn header_names_are_checked_ignoring_case() {
    let r = redactor();
    assert_eq!(
        r.mentioned_ignoring_case(format!("x-{}", KEY.to_uppercase()).as_bytes()),
        Some("BRAVE_API_KEY")
    );
    assert_eq!(r.mentioned_ignoring_case(b"content-type"), None);
}

#[test]
fn tool_results_keep_their_kind() {
    let r = redactor();
    assert_eq!(
        r.redact_result(Ok(ToolOutput::text(format!("got {KEY}")))),
        Ok(ToolOutput::text("got [redacted: BRAVE_API_KEY]"))
    );
    for error in [
        ToolError::InvalidArgs(format!("bad {KEY}")),
        ToolError::Denied(format!("bad {KEY}")),
        ToolError::Failed(format!("bad {KEY}")),
    ] {
        let kind = error.kind();
        let scrubbed = r.redact_result(Err(error)).unwrap_err();
        assert_eq!(scrubbed.kind(), kind);
        assert_eq!(scrubbed.message(), "bad [redacted: BRAVE_API_KEY]");
    }
}

/// A body holding the value in several forms, next to bytes that start forms but do not
/// complete them.
fn tricky_body() -> Vec<u8> {
    let value = r#"k3y/"with"+%\odd"#;
    let mut body = Vec::new();
    body.extend_from_slice(b"%% \\ \\u00 start ");
    body.extend_from_slice(value.as_bytes());
    body.extend_from_slice(b" json ");
    body.extend_from_slice(serde_json::to_string(value).unwrap().as_bytes());
    body.extend_from_slice(b" pct ");
    body.extend_from_slice(percent(value, true).as_bytes());
    body.extend_from_slice(b" b64 ");
    body.extend_from_slice(&base64(format!("u:{value}").as_bytes(), true));
    body.extend_from_slice(b" near k3y/\"with\"+%\\od end ");
    body.extend_from_slice(value.as_bytes());
    body
}

fn tricky_redactor() -> Redactor {
    Redactor::new([("TRICKY", r#"k3y/"with"+%\odd"#), ("OTHER", "second-value")])
}

#[test]
fn every_two_chunk_split_gives_the_whole_body_result() {
    for (r, body) in [
        (redactor(), format!("before {KEY} after").into_bytes()),
        (tricky_redactor(), tricky_body()),
    ] {
        let whole = r.redact_bytes(&body);
        assert_eq!(
            whole
                .windows(8)
                .filter(|w| w.starts_with(b"[redacte"))
                .count(),
            if body.len() > 100 { 5 } else { 1 },
            "{}",
            String::from_utf8_lossy(&whole)
        );
        for split in 0..=body.len() {
            let mut stream = r.stream();
            let mut out = stream.push(&body[..split]);
            out.extend(stream.push(&body[split..]));
            out.extend(stream.finish());
            assert_eq!(out, whole, "split at {split}");
        }
    }
}

#[test]
fn ordinary_text_is_held_back_only_where_a_value_may_begin() {
    let r = tricky_redactor();
    let mut stream = r.stream();
    let out = stream.push(b"a plain sentence with no value in it, ");
    assert_eq!(stream.held(), 0, "{}", String::from_utf8_lossy(&out));
    // The start of a value (or of an escape) is held until it is decided.
    let out = stream.push(b"then k3y/\"wi");
    assert_eq!(out, b"then ");
    assert_eq!(stream.held(), "k3y/\"wi".len());
    // `s` may begin `second-value`, `\u` an escape.
    let out = stream.push(b"tness\\u");
    assert_eq!(out, b"k3y/\"witnes");
    assert_eq!(stream.held(), 3);
    assert_eq!(stream.finish(), b"s\\u");
}

#[test]
fn byte_by_byte_and_three_way_splits_give_the_whole_body_result() {
    let r = tricky_redactor();
    let body = tricky_body();
    let whole = r.redact_bytes(&body);
    let mut stream = r.stream();
    let mut out = Vec::new();
    for byte in &body {
        out.extend(stream.push(std::slice::from_ref(byte)));
        assert!(stream.held() < r.longest_match());
    }
    out.extend(stream.finish());
    assert_eq!(out, whole);
    for first in (0..body.len()).step_by(7) {
        for second in (first..=body.len()).step_by(5) {
            let mut stream = r.stream();
            let mut out = stream.push(&body[..first]);
            out.extend(stream.push(&body[first..second]));
            out.extend(stream.push(&[]));
            out.extend(stream.push(&body[second..]));
            out.extend(stream.finish());
            assert_eq!(out, whole, "splits at {first} and {second}");
        }
    }
}

#[test]
fn a_stream_without_values_passes_chunks_through() {
    let mut stream = Redactor::default().stream();
    assert_eq!(stream.push(b"abc"), b"abc");
    assert_eq!(stream.held(), 0);
    assert!(stream.finish().is_empty());
}

#[test]
fn a_value_cut_at_the_end_of_a_cut_body_is_replaced() {
    let r = redactor();
    for keep in 0..KEY.len() {
        let mut stream = r.stream();
        let mut out = stream.push(format!("head {}", &KEY[..keep]).as_bytes());
        out.extend(stream.finish_cut());
        let text = String::from_utf8(out).unwrap();
        if keep >= MIN_PARTIAL_BYTES {
            assert_eq!(text, "head [redacted: BRAVE_API_KEY]", "{keep}");
        } else {
            assert_eq!(text, format!("head {}", &KEY[..keep]), "{keep}");
        }
    }
    // A body that simply ends does not lose its last characters.
    let mut stream = r.stream();
    let mut out = stream.push(format!("head {}", &KEY[..10]).as_bytes());
    out.extend(stream.finish());
    assert_eq!(out, format!("head {}", &KEY[..10]).into_bytes());
}

#[test]
fn hostile_text_stays_linear_enough() {
    // Many ambiguous starts: every `%` and `\` begins a possible form.
    let r = Redactor::new([("BACKSLASHES", r"\\\\\\\\\\\\\\\\"), ("PCT", "%%%%%%%%%%")]);
    let body = r"\\%25%\u005c".repeat(20_000);
    let out = r.redact(&body);
    assert!(out.len() <= body.len() * 2);
}

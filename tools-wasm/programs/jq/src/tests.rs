//! Unit tests of the command line, the input checks, the output form and whole runs over
//! in-memory output (input from files in a temporary directory).

use super::*;

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn options(list: &[&str]) -> Options {
    match parse_args(&args(list)) {
        Ok(Command::Run(options)) => options,
        other => panic!("{list:?}: {other:?}"),
    }
}

/// Run jq with `list` over a file holding `input`; returns the status and the output.
fn jq(list: &[&str], input: &str) -> (i32, String) {
    let dir = std::env::temp_dir().join(format!(
        "clawcage-jq-test-{}-{}",
        std::process::id(),
        std::thread::current()
            .name()
            .unwrap_or("t")
            .replace("::", "-")
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("input.json");
    std::fs::write(&file, input).unwrap();
    let mut list = args(list);
    list.push(file.to_string_lossy().into_owned());
    let options = match parse_args(&list) {
        Ok(Command::Run(options)) => options,
        other => panic!("{list:?}: {other:?}"),
    };
    let mut out = Vec::new();
    let code = run(&options, &mut out).unwrap_or_else(|failure| match failure {
        Failure::Input(_) => 2,
        Failure::Compile(_) => 3,
    });
    std::fs::remove_dir_all(&dir).unwrap();
    (code, String::from_utf8(out).unwrap())
}

#[test]
fn options_combine_and_take_values() {
    let read = options(&[
        "-rc",
        "--arg",
        "n",
        "v",
        "--argjson",
        "j",
        "[1]",
        ".x",
        "a.json",
    ]);
    assert!(read.raw_output && read.compact && !read.slurp);
    assert_eq!(read.filter.as_deref(), Some(".x"));
    assert_eq!(read.files, ["a.json"]);
    assert_eq!(
        read.named,
        [
            ("n".to_string(), NamedValue::Text("v".to_string())),
            ("j".to_string(), NamedValue::Json("[1]".to_string()))
        ]
    );
    let read = options(&["-f", "prog.jq", "in.json", "--indent", "3", "-S", "--tab"]);
    assert_eq!(read.filter_file.as_deref(), Some("prog.jq"));
    assert_eq!(read.files, ["in.json"]);
    assert!(read.sort_keys);
    assert_eq!(read.indent.as_deref(), Some("\t"));
    let read = options(&["-n", "$ARGS", "--args", "a", "b"]);
    assert_eq!(read.positional.len(), 2);
    assert!(read.files.is_empty());
    assert!(options(&["-j", "."]).raw_output);
}

#[test]
fn bad_command_lines_are_refused() {
    for list in [
        &[][..],
        &["--arg", "x"],
        &["-Q", "."],
        &["--indent", "9", "."],
        &["--bogus"],
    ] {
        assert!(parse_args(&args(list)).is_err(), "{list:?}");
    }
    assert_eq!(parse_args(&args(&["--help"])), Ok(Command::Help));
}

#[test]
fn filters_select_map_and_format() {
    let input = r#"{"items":[{"name":"a","price":3},{"name":"b","price":10}]}"#;
    let (code, out) = jq(&["-c", ".items[] | select(.price > 5)"], input);
    assert_eq!((code, out.as_str()), (0, "{\"name\":\"b\",\"price\":10}\n"));
    let (_, out) = jq(&["-r", ".items | map(.name) | join(\",\")"], input);
    assert_eq!(out, "a,b\n");
    let (_, out) = jq(&["-r", ".items[] | [.name, .price] | @csv"], input);
    assert_eq!(out, "\"a\",3\n\"b\",10\n");
    let (_, out) = jq(&["-r", ".items[] | [.name, .price] | @tsv"], input);
    assert_eq!(out, "a\t3\nb\t10\n");
    let (_, out) = jq(
        &["--arg", "n", "b", ".items[] | select(.name == $n) | .price"],
        input,
    );
    assert_eq!(out, "10\n");
    let (_, out) = jq(
        &[
            "--argjson",
            "min",
            "4",
            "[.items[] | select(.price > $min)] | length",
        ],
        input,
    );
    assert_eq!(out, "1\n");
    let (_, out) = jq(
        &["-r", "\"\\(.items[0].name) costs \\(.items[0].price)\""],
        input,
    );
    assert_eq!(out, "a costs 3\n");
    let (_, out) = jq(&[".items | map(.price) | add / length"], input);
    assert_eq!(out, "6.5\n");
}

#[test]
fn pretty_output_matches_jq() {
    let (_, out) = jq(&["-S", "."], r#"{"b":[1,{}],"a":[]}"#);
    assert_eq!(out, "{\n  \"a\": [],\n  \"b\": [\n    1,\n    {}\n  ]\n}\n");
    let (_, out) = jq(&["-n", "-c", "[2.0 * 1, nan, 0.5]"], "");
    assert_eq!(out, "[2,null,0.5]\n");
}

#[test]
fn streams_slurp_and_null_input() {
    let (_, out) = jq(&["-c", "-s", "map(.a)"], "{\"a\":1} {\"a\":2}\n{}");
    assert_eq!(out, "[1,2,null]\n");
    let (_, out) = jq(&["-n", "[inputs | .a]", "-c"], "{\"a\":1}\n{\"a\":2}");
    assert_eq!(out, "[1,2]\n");
    let (_, out) = jq(&["-R", "-c", "."], "x\ny\n");
    assert_eq!(out, "\"x\"\n\"y\"\n");
}

#[test]
fn exit_statuses_follow_jq() {
    assert_eq!(jq(&["-e", ".missing"], "{}").0, 1);
    assert_eq!(jq(&["-e", ".a"], "{\"a\":1}").0, 0);
    assert_eq!(jq(&["-e", "empty"], "{}").0, 4);
    assert_eq!(jq(&[".a.b"], "{\"a\":\"text\"}").0, 5);
    assert_eq!(jq(&["-n", "error(\"x\")"], "").0, 5);
    assert_eq!(jq(&[".a |||"], "{}").0, 3);
    assert_eq!(jq(&["undefined_thing"], "{}").0, 3);
    assert_eq!(jq(&["-n", "halt_error(7)"], "").0, 7);
    // Invalid input: the values before the error are output, then status 2.
    let (code, out) = jq(&[".a"], "{\"a\":1} {\"a\":");
    assert_eq!((code, out.as_str()), (2, "1\n"));
}

#[test]
fn parse_errors_give_line_and_column() {
    let bytes = b"{\"a\":1,\n  }";
    let error = jaq_json::read::parse_single(bytes).unwrap_err();
    let message = describe_parse_error(bytes, "f.json", &error);
    assert!(
        message.starts_with("invalid JSON in f.json at line 2, column 3"),
        "{message}"
    );
}

#[test]
fn deep_nesting_is_refused_before_parsing() {
    let deep = "[".repeat(MAX_DEPTH + 1);
    let message = input::check_depth(deep.as_bytes(), "deep.json").unwrap_err();
    assert!(message.contains("nested deeper than"), "{message}");
    // Brackets inside strings do not count.
    let quoted = format!("\"{}\"", "[".repeat(MAX_DEPTH + 1));
    assert!(input::check_depth(quoted.as_bytes(), "q.json").is_ok());
    let fine = format!("{}{}", "[".repeat(100), "]".repeat(100));
    assert_eq!(jq(&["-c", "flatten"], &fine), (0, "[]\n".to_string()));
    assert_eq!(jq(&["."], &deep).0, 2);
}

#[test]
fn the_prelude_parses() {
    assert_eq!(prelude().len(), 6);
}

#[test]
fn line_and_column_count_from_one() {
    assert_eq!(line_and_column("ab\ncd", 4), (2, 2));
    assert_eq!(line_and_column("", 0), (1, 1));
}

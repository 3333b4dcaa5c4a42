//! Tests of the shell as a whole, without the WebAssembly host: word expansion and `$((...))`
//! through [`Shell`] with a recording [`Process`] (builtins and expansion run in the shell
//! itself; the host is asked only to run programs, which here record their arguments).

use std::time::Duration;

use super::Shell;
use crate::{Process, wit};

/// A host with one program, `args`, which prints nothing; every run's arguments and the files
/// it opens are recorded.
#[derive(Default)]
struct Recording {
    runs: Vec<Vec<String>>,
    files: Vec<(String, wit::OpenMode)>,
}

impl Process for Recording {
    fn programs(&mut self) -> Vec<String> {
        vec!["args".to_string()]
    }

    fn run(&mut self, pipeline: &wit::Pipeline) -> Result<wit::RunResult, wit::RunError> {
        self.runs
            .extend(pipeline.stages.iter().map(|stage| stage.args.clone()));
        self.files.extend(
            pipeline
                .files
                .iter()
                .map(|file| (file.path.clone(), file.mode)),
        );
        Ok(wit::RunResult {
            ends: pipeline
                .stages
                .iter()
                .map(|_| wit::StageEnd::Exited(0))
                .collect(),
            output: wit::CutOutput {
                head: Vec::new(),
                omitted: 0,
                tail: Vec::new(),
            },
            captured: Vec::new(),
            captured_truncated: false,
            timed_out: false,
            write_limit_reached: false,
        })
    }
}

const WORKSPACE: &str = "/nonexistent-clawcage-workspace";

fn env(vars: &[(&str, &str)]) -> Vec<(String, String)> {
    vars.iter()
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .collect()
}

/// The fields `word` expands into with the variables `vars`.
fn fields(vars: &[(&str, &str)], word: &str) -> Vec<String> {
    let mut host = Recording::default();
    let mut shell = Shell::new(
        &mut host,
        Some(WORKSPACE.to_string()),
        env(vars),
        Duration::from_secs(30),
    );
    shell
        .expand_fields(word)
        .unwrap_or_else(|stop| panic!("`{word}`: {stop:?}"))
}

/// `word` expanded into one string.
fn single(vars: &[(&str, &str)], word: &str) -> String {
    let mut host = Recording::default();
    let mut shell = Shell::new(
        &mut host,
        Some(WORKSPACE.to_string()),
        env(vars),
        Duration::from_secs(30),
    );
    shell
        .expand_single(word)
        .unwrap_or_else(|stop| panic!("`{word}`: {stop:?}"))
}

/// The text for the model (or the error) of `command`.
fn run(command: &str) -> Result<String, String> {
    let mut host = Recording::default();
    let mut shell = Shell::new(
        &mut host,
        Some(WORKSPACE.to_string()),
        Vec::new(),
        Duration::from_secs(30),
    );
    shell
        .run_command_line(command)
        .map_err(|error| error.to_string())
}

/// What the host was asked for by `command`, which must succeed.
fn recorded(command: &str) -> Recording {
    let mut host = Recording::default();
    let mut shell = Shell::new(
        &mut host,
        Some(WORKSPACE.to_string()),
        Vec::new(),
        Duration::from_secs(30),
    );
    let result = shell.run_command_line(command);
    assert!(result.is_ok(), "`{command}`: {result:?}");
    host
}

/// The arguments the program `args` got from `command`.
fn program_args(command: &str) -> Vec<String> {
    recorded(command).runs.concat()
}

#[test]
fn default_assign_and_alternative_values() {
    let vars = [("set", "v"), ("empty", "")];
    assert_eq!(single(&vars, "${unset:-d}"), "d");
    assert_eq!(single(&vars, "${empty:-d}"), "d");
    assert_eq!(single(&vars, "${empty-d}"), "");
    assert_eq!(single(&vars, "${unset-d}"), "d");
    assert_eq!(single(&vars, "${set:-d}"), "v");
    assert_eq!(single(&vars, "${set:+alt}"), "alt");
    assert_eq!(single(&vars, "${empty:+alt}"), "");
    assert_eq!(single(&vars, "${empty+alt}"), "alt");
    assert_eq!(single(&vars, "${unset:-$set$set}"), "vv");
    assert_eq!(
        run("echo ${x:=first} ${x:=second} $x"),
        Ok("first first first\n[exit status: 0]".to_string())
    );
    assert_eq!(
        run("x=; echo ${x=kept}.${x:=filled}"),
        Ok(".filled\n[exit status: 0]".to_string())
    );
}

#[test]
fn a_missing_value_with_colon_question_mark_stops_the_shell() {
    assert_eq!(
        run("echo ${x:?is required}; echo not reached"),
        Ok("sh: x: is required\n[exit status: 1]".to_string())
    );
    assert_eq!(
        run("x=1; echo ${x:?is required}"),
        Ok("1\n[exit status: 0]".to_string())
    );
}

#[test]
fn length_and_pattern_removal() {
    let vars = [("path", "dir/sub/file.tar.gz"), ("word", "héllo")];
    assert_eq!(single(&vars, "${#word}"), "5");
    assert_eq!(single(&vars, "${#unset}"), "0");
    assert_eq!(single(&vars, "${path%.*}"), "dir/sub/file.tar");
    assert_eq!(single(&vars, "${path%%.*}"), "dir/sub/file");
    assert_eq!(single(&vars, "${path#*/}"), "sub/file.tar.gz");
    assert_eq!(single(&vars, "${path##*/}"), "file.tar.gz");
    assert_eq!(single(&vars, "${path%.zip}"), "dir/sub/file.tar.gz");
    assert_eq!(single(&vars, "${path#dir/}"), "sub/file.tar.gz");
    // A quoted pattern matches literally.
    assert_eq!(single(&[("x", "a*b*")], "${x%\"*\"}"), "a*b");
    assert_eq!(single(&[("x", "a*b*")], "${x%*}"), "a*b*");
}

#[test]
fn unsupported_parameter_forms_are_refused() {
    for command in ["echo ${x/a/b}", "echo ${!x}", "echo ${x[1]}", "echo ${x^^}"] {
        let error = run(command).expect_err(command);
        assert!(error.contains("not supported"), "{command}: {error}");
    }
}

#[test]
fn tilde_expansion() {
    let vars = [("HOME", "/home/me"), ("OLDPWD", "/old")];
    assert_eq!(fields(&vars, "~"), ["/home/me"]);
    assert_eq!(fields(&vars, "~/a b"), ["/home/me/a b"]);
    assert_eq!(fields(&vars, "~+"), [WORKSPACE]);
    assert_eq!(fields(&vars, "~-"), ["/old"]);
    assert_eq!(fields(&vars, "~other/x"), ["~other/x"]);
    assert_eq!(fields(&vars, "'~'"), ["~"]);
    assert_eq!(fields(&vars, "a~"), ["a~"]);
    assert_eq!(fields(&[], "~"), ["~"]);
}

#[test]
fn quoting_keeps_fields_whole_and_removes_the_quotes() {
    let vars = [("x", "a  b"), ("empty", "")];
    assert_eq!(fields(&vars, "'a b'"), ["a b"]);
    assert_eq!(fields(&vars, "\"$x\""), ["a  b"]);
    assert_eq!(fields(&vars, "$x"), ["a", "b"]);
    assert_eq!(fields(&vars, "a\"b\"'c'"), ["abc"]);
    assert_eq!(fields(&vars, "\\$x"), ["$x"]);
    assert_eq!(fields(&vars, "'$x'"), ["$x"]);
    // In double quotes a backslash escapes only `$`, `` ` ``, `"`, `\` and a newline.
    assert_eq!(fields(&vars, "\"a\\nb\""), ["a\\nb"]);
    assert_eq!(fields(&vars, "\"a\\$x\\\"\""), ["a$x\""]);
    assert_eq!(fields(&vars, "a\\nb"), ["anb"]);
    assert_eq!(fields(&vars, "\"$empty\""), [""]);
    assert_eq!(fields(&vars, "''"), [""]);
    assert!(fields(&vars, "$empty").is_empty());
    assert!(fields(&vars, "$unset").is_empty());
}

#[test]
fn ansi_c_quoting() {
    assert_eq!(fields(&[], "$'a\\nb'"), ["a\nb"]);
    assert_eq!(fields(&[], "$'tab\\there'"), ["tab\there"]);
    assert_eq!(fields(&[], "$'it\\'s'"), ["it's"]);
    // An escaped backslash stays one backslash, and does not escape what follows it.
    assert_eq!(fields(&[], "$'\\\\n'"), ["\\n"]);
}

#[test]
fn unquoted_expansions_are_split_on_blanks() {
    let vars = [("x", " a  b\tc\n"), ("y", "1 2")];
    assert_eq!(fields(&vars, "$x"), ["a", "b", "c"]);
    assert_eq!(fields(&vars, "pre${y}post"), ["pre1", "2post"]);
    assert_eq!(fields(&vars, "\"$y\"$y"), ["1 21", "2"]);
    assert_eq!(fields(&vars, "$(echo one two)"), ["one", "two"]);
    assert_eq!(fields(&vars, "\"$(echo one two)\""), ["one two"]);
    assert_eq!(
        program_args("set -- 'a b' c; args $@ \"$1\" $#"),
        ["a", "b", "c", "a b", "2"]
    );
    assert_eq!(
        program_args("x='p q'; for w in $x r; do args $w; done"),
        ["p", "q", "r"]
    );
}

#[test]
fn a_glob_that_matches_nothing_stays_as_written() {
    assert_eq!(fields(&[], "*.nothing"), ["*.nothing"]);
    assert_eq!(fields(&[("p", "*")], "$p"), ["*"]);
    assert_eq!(fields(&[], "\"*\""), ["*"]);
}

#[test]
fn command_substitution_drops_trailing_newlines_and_keeps_no_state() {
    assert_eq!(single(&[], "[$(echo a; echo; echo)]"), "[a]");
    assert_eq!(
        run("x=1; y=$(x=2; echo $x); echo $x $y"),
        Ok("1 2\n[exit status: 0]".to_string())
    );
}

#[test]
fn arithmetic_expansion_through_the_shell() {
    assert_eq!(single(&[("n", "5")], "$((n * 2 + 1))"), "11");
    assert_eq!(single(&[("n", "5")], "$(($n-1))"), "4");
    assert_eq!(single(&[("n", "1+2")], "$(($n * 2))"), "5");
    assert_eq!(single(&[], "$(( (1 + 2) * $(echo 3) ))"), "9");
    assert_eq!(
        single(&[], "$((-(-9223372036854775807 - 1)))"),
        i64::MIN.to_string()
    );
    let error = run("echo $((1 / 0))").expect_err("division by zero");
    assert!(error.contains("division by zero"), "{error}");
    let error = run("echo $((1 +))").expect_err("syntax error");
    assert!(error.contains("bad arithmetic expression `1 +`"), "{error}");
    let error = run("echo $((i++))").expect_err("an assignment");
    assert!(error.contains("not supported"), "{error}");
}

#[test]
fn unset_variables_with_set_u_stop_the_shell() {
    assert_eq!(
        run("set -u; echo ${x:-ok}; echo $x; echo not reached"),
        Ok("ok\nsh: x: unbound variable\n[exit status: 1]".to_string())
    );
}

#[test]
fn deeply_nested_compound_commands_are_refused_before_parsing() {
    for (open, close) in [
        ("if true; then ", "; fi"),
        ("while false; do ", "; done"),
        ("for x in a; do ", "; done"),
        ("case a in a) ", ";; esac"),
    ] {
        let command = format!("{}echo deep{}", open.repeat(300), close.repeat(300));
        let error = run(&command).expect_err("too deep");
        assert!(error.contains("nested too deeply"), "{open}: {error}");
    }
    // Real nesting runs; keywords as plain words do not count.
    assert_eq!(
        run(
            "if true; then while false; do :; done; for x in a b; do case $x in b) echo $x;; esac; done; fi"
        ),
        Ok("b\n[exit status: 0]".to_string())
    );
    let words = vec!["if"; 100].join(" ");
    assert_eq!(
        run(&format!("echo {words}")),
        Ok(format!("{words}\n[exit status: 0]"))
    );
}

#[test]
fn arithmetic_reads_a_variables_expression_and_refuses_negative_exponents() {
    assert_eq!(
        run("x=1+2; y='x * 2'; echo $((x * 2)) $((y + 1))"),
        Ok("6 7\n[exit status: 0]".to_string())
    );
    let refused = run("echo $((2 ** -1))");
    assert!(
        format!("{refused:?}").contains("exponent less than 0"),
        "{refused:?}"
    );
    let looping = run("x='x + 1'; echo $((x))");
    assert!(
        format!("{looping:?}").contains("recursion level exceeded"),
        "{looping:?}"
    );
}

#[test]
fn hostile_arithmetic_in_a_command_line_is_an_error_not_a_crash() {
    for depth in [300, 5_000] {
        let command = format!("echo $(({}1{}))", "(".repeat(depth), ")".repeat(depth));
        let error = run(&command).expect_err("too deep");
        assert!(error.contains("nested too deeply"), "{error}");
    }
    let command = format!("echo $(({}))", vec!["1"; 100_000].join("+"));
    let error = run(&command).expect_err("too long");
    assert!(error.contains("too long"), "{error}");
    let command = format!("echo $((n * {}))", "9".repeat(10_000));
    let error = run(&command).expect_err("too big");
    assert!(error.contains("bad arithmetic expression"), "{error}");
    assert_eq!(
        run("echo $(()) $((  ))"),
        Ok("0 0\n[exit status: 0]".to_string())
    );
}

#[test]
fn a_redirection_alone_empties_the_file_it_writes_not_the_one_it_reads() {
    let mut host = Recording::default();
    let mut shell = Shell::new(
        &mut host,
        Some(WORKSPACE.to_string()),
        Vec::new(),
        Duration::from_secs(30),
    );
    let result = shell.run_command_line("< in.txt > out.txt");
    assert_eq!(result.ok().as_deref(), Some("[exit status: 0]"));
    assert_eq!(
        host.files,
        [(format!("{WORKSPACE}/out.txt"), wit::OpenMode::Truncate)]
    );
}

#[test]
fn read_keeps_lines_whole_with_an_empty_ifs_and_understands_its_options() {
    for (command, printed) in [
        // The idiom for reading lines exactly: spacing and backslashes kept.
        (
            "while IFS= read -r line; do echo \"[$line]\"; done <<'EOF'\n  a   b  \n\\t\\\\x\nEOF",
            "[  a   b  ]\n[\\t\\\\x]",
        ),
        // Without IFS= the ends are trimmed, the inner spacing of the last name kept.
        (
            "read -r first rest <<< '  one   two  three  '; echo \"<$first><$rest>\"",
            "<one><two  three>",
        ),
        // A prompt has no terminal to go to here; the name after it still gets the line.
        (
            "read -p 'Name: ' who <<< 'Ann'; echo \"hello $who\"",
            "hello Ann",
        ),
        (
            "IFS=: read -r user pass rest <<< 'root:x:0:0:/root'; echo \"$user $rest\"",
            "root 0:0:/root",
        ),
        ("read <<< '  as is  '; echo \"[$REPLY]\"", "[  as is  ]"),
    ] {
        assert_eq!(
            run(command),
            Ok(format!("{printed}\n[exit status: 0]")),
            "`{command}`"
        );
    }
    let refused = run("read -a list <<< 'a b'; echo \"status $?\"").unwrap();
    assert!(refused.contains("arrays are not supported"), "{refused}");
    assert!(refused.contains("status 2"), "{refused}");
}

#[test]
fn read_fails_at_the_end_and_an_unended_last_line_is_still_read() {
    // The last line without a newline sets the name and fails, as in any shell; the read at the
    // very end empties the name (so `while read l || [ -n "$l" ]` ends).
    assert_eq!(
        run(
            "echo -en 'a\\nb' | { read -r x; echo \"$?[$x]\"; read -r y; echo \"$?[$y]\"; read -r z; echo \"$?[$z]\"; }"
        ),
        Ok("0[a]\n1[b]\n1[]\n[exit status: 0]".to_string())
    );
    assert_eq!(
        run("read x <<< ''; echo \"$?[$x]\"; read y < /dev/null; echo \"$?[$y]\""),
        Ok("0[]\n1[]\n[exit status: 0]".to_string())
    );
}

/// The files `command` had the host open, with their modes.
fn opened_files(command: &str) -> Vec<(String, wit::OpenMode)> {
    recorded(command).files
}

#[test]
fn every_file_a_redirection_names_is_opened_not_only_the_last() {
    let file = |name: &str, mode| (format!("{WORKSPACE}/{name}"), mode);
    for command in ["echo hi > a > b", "{ echo hi; } > a > b", "> a > b"] {
        let opened = opened_files(command);
        assert!(
            opened.contains(&file("a", wit::OpenMode::Truncate))
                && opened.contains(&file("b", wit::OpenMode::Truncate)),
            "`{command}`: {opened:?}"
        );
    }
    let opened = opened_files("echo hi >> log > out 2> err");
    for (name, mode) in [
        ("log", wit::OpenMode::Append),
        ("out", wit::OpenMode::Truncate),
        ("err", wit::OpenMode::Truncate),
    ] {
        assert!(opened.contains(&file(name, mode)), "{name}: {opened:?}");
    }
    // What is only read is not written.
    let opened = opened_files("read x < in > out");
    assert!(
        !opened.contains(&file("in", wit::OpenMode::Truncate)),
        "{opened:?}"
    );
}

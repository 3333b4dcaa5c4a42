//! `awk` for clawcage's exec: POSIX awk (patterns and ranges, BEGIN/END, fields, associative
//! arrays, printf, the string functions, user functions, getline, `>`/`>>` redirection) with
//! options `-F FS`, `-v VAR=VALUE`, `-f PROGFILE` and `--`. The language itself is the
//! interpreter of the awk-rs crate (0.2.0, MIT/Apache-2.0, see LICENSE-MIT.awk-rs), carried here
//! with changes for the sandbox: no process can be started, so `system()`, `cmd | getline` and
//! `print | cmd` stop the program with a message saying so; `/dev/stdout` and `/dev/stderr` are
//! the standard streams; input files are opened when reached; invalid UTF-8 is read, not refused.
//! Exit status: the value of `exit N`, 2 for a syntax or runtime error.

mod ast;
mod error;
mod fmt;
mod interpreter;
mod lexer;
mod parser;
mod value;

use std::io::{self, BufWriter, Write};

use clawcage_program_support::{enter_working_directory, exit};

use crate::error::Error;
use crate::interpreter::Interpreter;
use crate::lexer::Lexer;
use crate::parser::Parser;

const USAGE: &str = "usage: awk [-F FS] [-v VAR=VALUE]... 'PROGRAM' [FILE | VAR=VALUE]...\n       \
                     awk [-F FS] [-v VAR=VALUE]... -f PROGFILE... [FILE | VAR=VALUE]...";

/// What the command line asks for.
#[derive(Debug, Default, PartialEq)]
struct Options {
    /// `-F`: the field separator, escapes already decoded.
    field_separator: Option<String>,
    /// `-v NAME=VALUE`, in order, escapes already decoded.
    assignments: Vec<(String, String)>,
    /// `-f FILE`, in order; when empty the first operand is the program text.
    program_files: Vec<String>,
    /// The program text given on the command line.
    program_text: Option<String>,
    /// The operands after the program: files, `-` and `VAR=VALUE` assignments.
    operands: Vec<String>,
}

/// What to do after reading the command line.
#[derive(Debug, PartialEq)]
enum Command {
    Run(Options),
    Help,
    Version,
}

/// Read the command line (without the program name). Options end at the first operand or `--`.
fn parse_args(args: &[String]) -> Result<Command, String> {
    let mut options = Options::default();
    let mut index = 0;
    while index < args.len() {
        let arg = args[index].as_str();
        // The option's value: the rest of this argument, or the next argument.
        let mut value_of = |flag: &str, rest: &str| -> Result<String, String> {
            if !rest.is_empty() {
                return Ok(rest.to_string());
            }
            index += 1;
            args.get(index)
                .cloned()
                .ok_or_else(|| format!("option {flag} needs a value\n{USAGE}"))
        };
        match arg {
            "--" => {
                index += 1;
                break;
            }
            "--help" | "-h" => return Ok(Command::Help),
            "--version" | "-V" => return Ok(Command::Version),
            "-" => break,
            _ if arg.starts_with("-F") => {
                let separator = value_of("-F", &arg[2..])?;
                // `-Ft` is a tab in POSIX awk; escapes such as `\t` are decoded.
                options.field_separator = Some(if separator == "t" {
                    "\t".to_string()
                } else {
                    lexer::unescape(&separator)
                });
            }
            _ if arg.starts_with("-v") => {
                let assignment = value_of("-v", &arg[2..])?;
                let Some((name, value)) = interpreter::operand_assignment(&assignment) else {
                    return Err(format!(
                        "-v {assignment}: expected NAME=VALUE with NAME a variable name"
                    ));
                };
                options
                    .assignments
                    .push((name.to_string(), lexer::unescape(value)));
            }
            _ if arg.starts_with("-f") => {
                let file = value_of("-f", &arg[2..])?;
                options.program_files.push(file);
            }
            _ if arg.starts_with('-') => {
                return Err(format!("unknown option {arg}\n{USAGE}"));
            }
            _ => break,
        }
        index += 1;
    }
    let mut rest = args[index.min(args.len())..].iter().cloned();
    if options.program_files.is_empty() {
        match rest.next() {
            Some(text) => options.program_text = Some(text),
            None => return Err(format!("no program given\n{USAGE}")),
        }
    }
    options.operands = rest.collect();
    Ok(Command::Run(options))
}

/// The program's source: its text, or its `-f` files joined by newlines.
fn program_source(options: &Options) -> Result<String, String> {
    if let Some(text) = &options.program_text {
        return Ok(text.clone());
    }
    let mut source = String::new();
    for file in &options.program_files {
        let text = std::fs::read_to_string(file).map_err(|error| {
            format!(
                "cannot read the program file {file}: {}",
                error::describe_io(&error)
            )
        })?;
        source.push_str(&text);
        source.push('\n');
    }
    Ok(source)
}

/// An error as awk users read it: syntax errors name the line and column.
fn describe(error: &Error) -> String {
    match error {
        Error::Lexer { message, location } | Error::Parser { message, location } => {
            format!("syntax error at {location}: {message}")
        }
        Error::Runtime { message } => message.clone(),
        Error::RuntimeWithLocation { message, location } => format!("{location}: {message}"),
        Error::Io(error) => error::describe_io(error),
        Error::Regex(error) => format!("invalid regular expression: {error}"),
    }
}

/// Parse and run the program; returns the exit status.
fn run(options: &Options, output: &mut impl Write) -> Result<i32, Error> {
    let source = program_source(options).map_err(Error::runtime)?;
    let tokens = Lexer::new(&source).tokenize()?;
    let program = Parser::new(tokens).parse()?;
    let mut interpreter = Interpreter::new(&program);
    if let Some(separator) = &options.field_separator {
        interpreter.set_fs(separator);
    }
    let mut argv = vec!["awk".to_string()];
    argv.extend(options.operands.iter().cloned());
    interpreter.set_args(argv);
    for (name, value) in &options.assignments {
        interpreter.set_variable(name, value);
    }
    interpreter.read_operands();
    interpreter.run(Vec::<io::Empty>::new(), output)
}

fn main() {
    enter_working_directory();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let options = match parse_args(&args) {
        Ok(Command::Run(options)) => options,
        Ok(Command::Help) => {
            println!("{USAGE}");
            exit(0);
        }
        Ok(Command::Version) => {
            println!("awk (clawcage, awk-rs 0.2.0 interpreter)");
            exit(0);
        }
        Err(message) => {
            eprintln!("awk: {message}");
            exit(2);
        }
    };
    let stdout = io::stdout();
    let mut output = BufWriter::with_capacity(64 * 1024, stdout.lock());
    let code = match run(&options, &mut output) {
        Ok(code) => code,
        Err(Error::Io(error)) if error.kind() == io::ErrorKind::BrokenPipe => 0,
        Err(error) => {
            let _ = output.flush();
            eprintln!("awk: {}", describe(&error));
            2
        }
    };
    let _ = output.flush();
    exit(code);
}

#[cfg(test)]
mod tests {
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

    /// Run `program` over `input` as the command line would, returning status and output.
    fn awk(list: &[&str], input: &str) -> (i32, String) {
        let options = options(list);
        let source = program_source(&options).unwrap();
        let tokens = Lexer::new(&source).tokenize().unwrap();
        let program = Parser::new(tokens).parse().unwrap();
        let mut interpreter = Interpreter::new(&program);
        if let Some(separator) = &options.field_separator {
            interpreter.set_fs(separator);
        }
        for (name, value) in &options.assignments {
            interpreter.set_variable(name, value);
        }
        let mut output = Vec::new();
        let code = interpreter
            .run(vec![input.as_bytes()], &mut output)
            .unwrap_or_else(|error| panic!("{list:?}: {}", describe(&error)));
        (code, String::from_utf8(output).unwrap())
    }

    fn awk_error(program: &str) -> String {
        let options = options(&[program]);
        match run(&options, &mut Vec::new()) {
            Ok(code) => panic!("{program} ran, status {code}"),
            Err(error) => describe(&error),
        }
    }

    #[test]
    fn options_and_operands_are_read() {
        let read = options(&[
            "-F,",
            "-v",
            "x=1",
            "-vy=a\\tb",
            "{print}",
            "a.txt",
            "n=2",
            "-",
        ]);
        assert_eq!(read.field_separator.as_deref(), Some(","));
        assert_eq!(
            read.assignments,
            [
                ("x".to_string(), "1".to_string()),
                ("y".to_string(), "a\tb".to_string())
            ]
        );
        assert_eq!(read.program_text.as_deref(), Some("{print}"));
        assert_eq!(read.operands, ["a.txt", "n=2", "-"]);

        let read = options(&["-F", "\\t", "-f", "p.awk", "-fq.awk", "--", "-x"]);
        assert_eq!(read.field_separator.as_deref(), Some("\t"));
        assert_eq!(read.program_files, ["p.awk", "q.awk"]);
        assert_eq!(read.program_text, None);
        assert_eq!(read.operands, ["-x"]);
        assert_eq!(
            options(&["-Ft", "1"]).field_separator.as_deref(),
            Some("\t")
        );
        // Options end at the program.
        assert_eq!(options(&["{print}", "-v"]).operands, ["-v"]);
    }

    #[test]
    fn bad_command_lines_are_refused_with_the_usage() {
        for list in [
            &[][..],
            &["-F"],
            &["-v", "1x=2", "p"],
            &["-q", "p"],
            &["-v"],
        ] {
            let error = parse_args(&args(list)).unwrap_err();
            assert!(!error.is_empty(), "{list:?}");
        }
        assert!(parse_args(&args(&["-Z"])).unwrap_err().contains("usage"));
        assert_eq!(parse_args(&args(&["--help"])), Ok(Command::Help));
    }

    #[test]
    fn sums_per_group_with_arrays_and_printf() {
        let input = "g,x,1\nh,y,2.5\ng,z,3\nh,w,4\n";
        let program = "{s[$1]+=$3} END{for(k in s) printf \"%s %.2f\\n\", k, s[k]}";
        let (code, out) = awk(&["-F,", program], input);
        let mut lines: Vec<&str> = out.lines().collect();
        lines.sort();
        assert_eq!((code, lines), (0, vec!["g 4.00", "h 6.50"]));
    }

    #[test]
    fn special_variables_can_be_set_with_v() {
        let (_, out) = awk(&["-F,", "-v", "OFS=-", "{$1=$1; print}"], "a,b,c\n");
        assert_eq!(out, "a-b-c\n");
        let (_, out) = awk(&["-v", "ORS=;", "{print}"], "a\nb\n");
        assert_eq!(out, "a;b;");
    }

    #[test]
    fn record_separators_other_than_newline() {
        let (_, out) = awk(&["BEGIN{RS=\";\"}{print NR\": \"$0}"], "a;b;c\n");
        assert_eq!(out, "1: a\n2: b\n3: c\n");
        let (_, out) = awk(&["BEGIN{RS=\"\"}{print NR\": \"$1}"], "a b\nc\n\n\nd\n");
        assert_eq!(out, "1: a\n2: d\n");
    }

    #[test]
    fn exit_runs_end_rules_and_sets_the_status() {
        assert_eq!(awk(&["BEGIN{exit 3}"], ""), (3, String::new()));
        let (code, out) = awk(&["{exit 4} END{print \"end\", NR}"], "a\nb\n");
        assert_eq!((code, out.as_str()), (4, "end 1\n"));
        assert_eq!(awk(&["BEGIN{exit 1} END{exit}"], "").0, 1);
    }

    #[test]
    fn printf_takes_a_parenthesised_argument_list() {
        let (_, out) = awk(&["BEGIN{printf(\"%s-%s\\n\", \"a\", \"b\")}"], "");
        assert_eq!(out, "a-b\n");
        let (_, out) = awk(&["BEGIN{print(\"a\", \"b\")}"], "");
        assert_eq!(out, "a b\n");
    }

    #[test]
    fn rules_may_be_separated_by_semicolons() {
        let (_, out) = awk(&["BEGIN{printf \"a\"}; END{print \"b\"}"], "");
        assert_eq!(out, "ab\n");
    }

    #[test]
    fn getline_in_begin_reads_the_main_input() {
        let (_, out) = awk(&["BEGIN{getline; print \"first:\" $0}"], "one\ntwo\n");
        assert_eq!(out, "first:one\n");
    }

    #[test]
    fn string_functions() {
        let program = r#"BEGIN{s="hello world"; n=split(s,a," "); print n, a[2];
            print substr(s,2,3), index(s,"o"), length(s), toupper("abc"), tolower("ABC");
            t=s; print gsub(/o/,"0",t), t; sub(/l+/,"[&]",s); print s;
            print match("foobar",/o+/), RSTART, RLENGTH; print sprintf("%05.1f|%-3s|%x", 3.14159, "a", 255)}"#;
        let (_, out) = awk(&[program], "");
        assert_eq!(
            out,
            "2 world\nell 5 11 ABC abc\n2 hell0 w0rld\nhe[ll]o world\n2 2 2\n003.1|a  |ff\n"
        );
    }

    #[test]
    fn user_functions_ranges_and_deletion() {
        let program = "function twice(x){return 2*x} NR==2,NR==3{print twice($1)} \
                       END{a[1];a[2];delete a[1]; print (1 in a), (2 in a), length(a)}";
        let (_, out) = awk(&[program], "1\n2\n3\n4\n");
        assert_eq!(out, "4\n6\n0 1 1\n");
    }

    #[test]
    fn arrays_pass_to_functions_by_reference() {
        let program = r#"
            function fill(arr, n,   i) { for (i = 1; i <= n; i++) arr[i] = i * i; inner(arr) }
            function inner(b) { b["seen"] = 1 }
            function same(a) { a["same"] = 1 }
            function scalar(x) { x = 9; return x }
            BEGIN { fill(sq, 3); print sq[1], sq[3], sq["seen"], length(sq);
                    a["x"]; same(a); print ("same" in a);
                    x = 1; print scalar(x), x, scalar(NR);
                    if ((1, 2) in m) print "no"; m[1, 2]; if ((1, 2) in m) print "yes" }"#;
        let (_, out) = awk(&[program], "");
        assert_eq!(out, "1 9 1 4\n1\n9 1 9\nyes\n");
    }

    #[test]
    fn bracket_expressions_follow_posix() {
        let (_, out) = awk(&["/[]x]/{print}"], "a]\nb\nx\n");
        assert_eq!(out, "a]\nx\n");
    }

    #[test]
    fn starting_processes_is_an_error_that_says_why() {
        for program in [
            "BEGIN{system(\"ls\")}",
            "BEGIN{\"date\" | getline d}",
            "BEGIN{print \"x\" | \"sort\"}",
        ] {
            let message = awk_error(program);
            assert!(
                message.contains("cannot start other programs"),
                "{program}: {message}"
            );
        }
    }

    #[test]
    fn syntax_errors_name_the_line() {
        let message = awk_error("BEGIN {\n x = \n}");
        assert!(message.starts_with("syntax error at line 2"), "{message}");
    }

    #[test]
    fn invalid_utf8_input_is_read() {
        let options = options(&["{print length($0)}"]);
        let source = program_source(&options).unwrap();
        let program = Parser::new(Lexer::new(&source).tokenize().unwrap())
            .parse()
            .unwrap();
        let mut interpreter = Interpreter::new(&program);
        let mut output = Vec::new();
        interpreter
            .run(vec![&b"a\xffb\n"[..]], &mut output)
            .unwrap();
        assert_eq!(output, b"3\n");
    }
}

//! `jq` for clawcage's exec: JSON filters with the jaq interpreter (jaq-core, jaq-std and
//! jaq-json). The filter comes from the command line or `-f FILE`; input is a stream of JSON
//! values from the files named (read in turn as one stream) or standard input. Options: `-r`,
//! `-j`, `-c`, `-n`, `-s`, `-e`, `-R`, `-S`, `--tab`, `--indent N`, `--arg`, `--argjson`,
//! `--slurpfile`, `--rawfile`, `--args`, `--jsonargs`; `-C`/`-M` are accepted and colour is never
//! used. Input nested deeper than [`MAX_DEPTH`] is refused before parsing (jq's own limit is
//! 10,000; the sandbox's stack for WebAssembly code holds about 1,500).
//! Exit status as jq: 0; 1 with `-e` when the last output is false or null; 2 for usage, I/O
//! and input parse errors; 3 for a filter that does not compile; 4 with `-e` when nothing was
//! output; 5 when the filter failed on an input (later inputs are still processed).

mod input;
mod output;

use std::cell::RefCell;
use std::io::{self, BufWriter, Write};

use clawcage_program_support::{enter_working_directory, exit};
use jaq_core::load::{Arena, File, Loader};
use jaq_core::native::v;
use jaq_core::{Compiler, DataT, Lut, ValT, Vars, data};
use jaq_json::Val;
use jaq_std::input::{HasInputs, Inputs, RcIter};

use crate::input::describe_parse_error;
use crate::output::Printer;

/// Inputs nested deeper than this are refused before parsing. Parsing, filtering, printing and
/// dropping a value recurse once per level, and the engine gives WebAssembly code a fixed native
/// stack: about 1,500 levels fit, so 1,000 leaves room for the filter's own recursion.
pub const MAX_DEPTH: usize = 1_000;

const USAGE: &str = "usage: jq [OPTIONS] FILTER [FILE...]\n       jq [OPTIONS] -f FILTER_FILE [FILE...]\n\
options: -r -j -c -n -s -e -R -S --tab --indent N --arg NAME VALUE --argjson NAME JSON\n\
         --slurpfile NAME FILE --rawfile NAME FILE --args --jsonargs";

/// What the command line asks for.
#[derive(Debug, Default, PartialEq)]
struct Options {
    filter: Option<String>,
    filter_file: Option<String>,
    files: Vec<String>,
    raw_output: bool,
    join_output: bool,
    compact: bool,
    null_input: bool,
    slurp: bool,
    exit_status: bool,
    raw_input: bool,
    sort_keys: bool,
    /// The indentation of pretty output: `None` is two spaces.
    indent: Option<String>,
    /// `--arg`, `--argjson`, `--slurpfile`, `--rawfile`, in order: the name and how to get it.
    named: Vec<(String, NamedValue)>,
    /// `--args` / `--jsonargs` operands, for `$ARGS.positional`.
    positional: Vec<NamedValue>,
}

/// Where a named argument's value comes from.
#[derive(Debug, PartialEq, Clone)]
enum NamedValue {
    Text(String),
    Json(String),
    SlurpFile(String),
    RawFile(String),
}

/// What to do after reading the command line.
#[derive(Debug, PartialEq)]
enum Command {
    Run(Options),
    Help,
    Version,
}

/// Read the command line (without the program name).
fn parse_args(args: &[String]) -> Result<Command, String> {
    let mut options = Options::default();
    let mut index = 0;
    // After `--args` / `--jsonargs`, operands after the filter are positional values.
    let mut positional_kind: Option<fn(String) -> NamedValue> = None;
    let mut options_done = false;
    let take = |index: &mut usize, count: usize, flag: &str| -> Result<Vec<String>, String> {
        let values = args.get(*index + 1..*index + 1 + count).ok_or_else(|| {
            format!(
                "{flag} needs {count} value{}\n{USAGE}",
                if count == 1 { "" } else { "s" }
            )
        })?;
        *index += count;
        Ok(values.to_vec())
    };
    while index < args.len() {
        let arg = args[index].as_str();
        if options_done || !arg.starts_with('-') || arg == "-" {
            if options.filter.is_none() && options.filter_file.is_none() {
                options.filter = Some(arg.to_string());
            } else if let Some(kind) = positional_kind {
                options.positional.push(kind(arg.to_string()));
            } else {
                options.files.push(arg.to_string());
            }
            index += 1;
            continue;
        }
        match arg {
            "--" => options_done = true,
            "-h" | "--help" => return Ok(Command::Help),
            "-V" | "--version" => return Ok(Command::Version),
            "--raw-output" => options.raw_output = true,
            "--join-output" => options.join_output = true,
            "--compact-output" => options.compact = true,
            "--null-input" => options.null_input = true,
            "--slurp" => options.slurp = true,
            "--exit-status" => options.exit_status = true,
            "--raw-input" => options.raw_input = true,
            "--sort-keys" => options.sort_keys = true,
            "--color-output" | "--monochrome-output" => {}
            "--tab" => options.indent = Some("\t".to_string()),
            "--indent" => {
                let value = take(&mut index, 1, "--indent")?.remove(0);
                let width: usize = value
                    .parse()
                    .ok()
                    .filter(|width| *width <= 7)
                    .ok_or_else(|| format!("--indent takes a number from 0 to 7, not {value}"))?;
                options.indent = Some(" ".repeat(width));
            }
            "--arg" | "--argjson" | "--slurpfile" | "--rawfile" => {
                let mut pair = take(&mut index, 2, arg)?;
                let value = pair.remove(1);
                let name = pair.remove(0);
                let value = match arg {
                    "--arg" => NamedValue::Text(value),
                    "--argjson" => NamedValue::Json(value),
                    "--slurpfile" => NamedValue::SlurpFile(value),
                    _ => NamedValue::RawFile(value),
                };
                options.named.push((name, value));
            }
            "--args" => positional_kind = Some(NamedValue::Text),
            "--jsonargs" => positional_kind = Some(NamedValue::Json),
            "--from-file" => {
                options.filter_file = Some(take(&mut index, 1, arg)?.remove(0));
            }
            _ if arg.starts_with("--") => return Err(format!("unknown option {arg}\n{USAGE}")),
            _ => {
                // Short options, possibly combined (`-rc`); `f` takes the next argument.
                for flag in arg[1..].chars() {
                    match flag {
                        'r' => options.raw_output = true,
                        'j' => {
                            options.raw_output = true;
                            options.join_output = true;
                        }
                        'c' => options.compact = true,
                        'n' => options.null_input = true,
                        's' => options.slurp = true,
                        'e' => options.exit_status = true,
                        'R' => options.raw_input = true,
                        'S' => options.sort_keys = true,
                        'C' | 'M' | 'a' => {}
                        'f' => options.filter_file = Some(take(&mut index, 1, "-f")?.remove(0)),
                        'h' => return Ok(Command::Help),
                        _ => return Err(format!("unknown option -{flag}\n{USAGE}")),
                    }
                }
            }
        }
        index += 1;
    }
    if options.join_output {
        options.raw_output = true;
    }
    if options.filter_file.is_some() {
        // With -f, the first operand was a file, not the filter.
        if let Some(first) = options.filter.take() {
            options.files.insert(0, first);
        }
    } else if options.filter.is_none() {
        return Err(format!("no filter given\n{USAGE}"));
    }
    Ok(Command::Run(options))
}

/// The kind of data the filter runs on: JSON values, with `input`/`inputs` reading the stream.
struct DataKind;

impl DataT for DataKind {
    type V<'a> = Val;
    type Data<'a> = &'a Data<'a>;
}

/// What native filters may read while the filter runs.
struct Data<'a> {
    lut: &'a Lut<DataKind>,
    inputs: Inputs<'a, Val>,
    /// The name of the file being read, for `input_filename`.
    filename: &'a RefCell<Val>,
}

impl<'a> data::HasLut<'a, DataKind> for &'a Data<'a> {
    fn lut(&self) -> &'a Lut<DataKind> {
        self.lut
    }
}

impl<'a> HasInputs<'a, Val> for &'a Data<'a> {
    fn inputs(&self) -> Inputs<'a, Val> {
        self.inputs
    }
}

/// Every native filter: jaq's core, standard library and JSON functions, plus `input`,
/// `inputs` and `input_filename`.
fn natives() -> impl Iterator<Item = jaq_core::native::Fun<DataKind>> {
    let run = jaq_core::native::run::<DataKind>;
    let inputs = jaq_std::input::funs::<DataKind>()
        .into_vec()
        .into_iter()
        .map(run);
    let input_filename = run(("input_filename", v(0), |cv| {
        let name = cv.0.data().filename.borrow().clone();
        Box::new(core::iter::once(Ok(name)))
    }));
    jaq_core::funs::<DataKind>()
        .chain(jaq_std::funs::<DataKind>())
        .chain(jaq_json::funs::<DataKind>())
        .chain(inputs)
        .chain([input_filename])
}

/// Why the program stops, and with which status.
#[derive(Debug)]
enum Failure {
    /// Usage, I/O or input errors: status 2.
    Input(String),
    /// The filter does not compile: status 3.
    Compile(String),
}

impl Failure {
    fn report(&self) -> i32 {
        match self {
            Failure::Input(message) => {
                eprintln!("jq: error: {message}");
                2
            }
            Failure::Compile(message) => {
                eprint!("{message}");
                3
            }
        }
    }
}

/// Line and column (both from 1) of byte `offset` in `text`.
fn line_and_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text.as_bytes()[..offset.min(text.len())];
    let line = before.iter().filter(|b| **b == b'\n').count() + 1;
    let line_start = before
        .iter()
        .rposition(|b| *b == b'\n')
        .map_or(0, |i| i + 1);
    let column = String::from_utf8_lossy(&before[line_start..])
        .chars()
        .count()
        + 1;
    (line, column)
}

/// Filters of jq that jaq's libraries do not define, written in jq.
const PRELUDE: &str = r#"
def @csv: if type != "array" then error("\(type) (\(tojson)) cannot be csv-formatted, only an array can be")
  else map(if type == "number" or type == "boolean" then tostring
    elif type == "string" then "\"" + (split("\"") | join("\"\"")) + "\""
    elif type == "null" then ""
    else error("\(type) (\(tojson)) is not valid in a csv row") end) | join(",") end;
def @tsv: if type != "array" then error("\(type) (\(tojson)) cannot be tsv-formatted, only an array can be")
  else map(if type == "number" or type == "boolean" then tostring
    elif type == "string" then split("\\") | join("\\\\") | split("\t") | join("\\t")
      | split("\n") | join("\\n") | split("\r") | join("\\r")
    elif type == "null" then ""
    else error("\(type) (\(tojson)) is not valid in a tsv row") end) | join("\t") end;
def IN(s): any(s == .; .);
def IN(src; s): any(src == s; .);
def INDEX(stream; idx_expr): reduce stream as $row ({}; .[$row | idx_expr | tostring] |= $row);
def INDEX(idx_expr): INDEX(.[]; idx_expr);
"#;

/// The definitions of [`PRELUDE`].
fn prelude() -> Vec<jaq_core::load::parse::Def<&'static str>> {
    jaq_core::load::parse(PRELUDE, |parser| parser.defs()).unwrap_or_default()
}

/// Compile `code` with the global variables `names` (without `$`), or say where it is wrong.
fn compile(code: &str, names: &[String]) -> Result<jaq_core::Filter<DataKind>, Failure> {
    use jaq_core::load::Error as LoadError;
    let defs = jaq_core::defs()
        .chain(jaq_std::defs())
        .chain(jaq_json::defs())
        .chain(prelude());
    let loader = Loader::new(defs);
    let arena = Arena::default();
    let at = |part: &str| {
        let span = jaq_core::load::span(code, part);
        let (line, column) = line_and_column(code, span.start);
        format!("line {line}, column {column}")
    };
    let modules = loader
        .load(&arena, File { code, path: () })
        .map_err(|errors| {
            let mut message = String::new();
            for (_, error) in errors {
                match error {
                    LoadError::Io(errors) => {
                        for (path, error) in errors {
                            message.push_str(&format!(
                                "jq: error: modules cannot be loaded ({path}): {error}\n"
                            ));
                        }
                    }
                    LoadError::Lex(errors) => {
                        for (expected, found) in errors {
                            message.push_str(&format!(
                                "jq: error: syntax error at {}: expected {}\n",
                                at(found),
                                expected.as_str()
                            ));
                        }
                    }
                    LoadError::Parse(errors) => {
                        for (expected, found) in errors {
                            let place = at(found);
                            let found = if found.is_empty() {
                                "the end of the filter".to_string()
                            } else {
                                format!("`{}`", found.chars().take(20).collect::<String>())
                            };
                            message.push_str(&format!(
                                "jq: error: syntax error at {place}: expected {}, found {found}\n",
                                expected.as_str()
                            ));
                        }
                    }
                }
            }
            Failure::Compile(format!("{message}jq: 1 compile error\n"))
        })?;
    jaq_core::load::import(&modules, |path| {
        let _ = path;
        Err("modules cannot be loaded here".to_string())
    })
    .map_err(|_| Failure::Compile("jq: error: modules cannot be loaded here\n".to_string()))?;
    let names: Vec<String> = names.iter().map(|name| format!("${name}")).collect();
    Compiler::default()
        .with_funs(natives())
        .with_global_vars(names.iter().map(|name| name.as_str()))
        .compile(modules)
        .map_err(|errors| {
            let mut message = String::new();
            for (_, errors) in errors {
                for (found, undefined) in errors {
                    message.push_str(&format!(
                        "jq: error: {found} is not defined ({}) at {}\n",
                        undefined.as_str(),
                        at(found)
                    ));
                }
            }
            Failure::Compile(format!("{message}jq: compile error\n"))
        })
}

/// The values of `--arg` and friends, `$ARGS` and `$ENV`, with their names.
fn global_values(options: &Options) -> Result<(Vec<String>, Vec<Val>), Failure> {
    let value_of = |value: &NamedValue, name: &str| -> Result<Val, Failure> {
        Ok(match value {
            NamedValue::Text(text) => Val::utf8_str(text.clone()),
            NamedValue::Json(text) => {
                jaq_json::read::parse_single(text.as_bytes()).map_err(|error| {
                    Failure::Input(format!("--argjson {name}: invalid JSON text: {error}"))
                })?
            }
            NamedValue::RawFile(path) => {
                let bytes = input::read_file(path).map_err(Failure::Input)?;
                Val::utf8_str(bytes)
            }
            NamedValue::SlurpFile(path) => {
                let bytes = input::read_file(path).map_err(Failure::Input)?;
                input::check_depth(&bytes, path).map_err(Failure::Input)?;
                let values: Result<Vec<Val>, String> = jaq_json::read::parse_many(&bytes)
                    .map(|value| value.map_err(|error| describe_parse_error(&bytes, path, &error)))
                    .collect();
                values.map_err(Failure::Input)?.into_iter().collect()
            }
        })
    };
    let mut names = Vec::new();
    let mut values = Vec::new();
    let mut named = Vec::new();
    for (name, value) in &options.named {
        let value = value_of(value, name)?;
        named.push((Val::utf8_str(name.clone()), value.clone()));
        names.push(name.clone());
        values.push(value);
    }
    let positional: Result<Vec<Val>, Failure> = options
        .positional
        .iter()
        .map(|value| value_of(value, "positional"))
        .collect();
    let key = |text: &str| Val::utf8_str(text.to_string());
    let arguments = Val::obj(
        [
            (key("positional"), positional?.into_iter().collect()),
            (key("named"), Val::obj(named.into_iter().collect())),
        ]
        .into_iter()
        .collect(),
    );
    names.push("ARGS".to_string());
    values.push(arguments);
    let environment = std::env::vars().map(|(name, value)| (key(&name), key(&value)));
    names.push("ENV".to_string());
    values.push(Val::obj(environment.collect()));
    Ok((names, values))
}

fn printer(options: &Options) -> Printer {
    let indent = if options.compact {
        None
    } else {
        Some(options.indent.clone().unwrap_or_else(|| "  ".to_string()))
    };
    Printer {
        // `--indent 0` is jq's compact layout.
        indent: indent.filter(|indent| !indent.is_empty()),
        sort_keys: options.sort_keys,
        raw: options.raw_output,
        join: options.join_output,
    }
}

/// Compile the filter, read the inputs and write the outputs; returns the exit status.
fn run(options: &Options, out: &mut dyn Write) -> Result<i32, Failure> {
    let code = match (&options.filter, &options.filter_file) {
        (_, Some(path)) => {
            let bytes = input::read_file(path).map_err(Failure::Input)?;
            String::from_utf8_lossy(&bytes).into_owned()
        }
        (Some(code), None) => code.clone(),
        (None, None) => return Err(Failure::Input(format!("no filter given\n{USAGE}"))),
    };
    let (names, values) = global_values(options)?;
    let filter = compile(&code, &names)?;

    let sources = input::load(&options.files)?;
    let filename = RefCell::new(Val::Null);
    let stream = input::Stream::new(&sources, options.raw_input, &filename);
    let failed_input: RefCell<Option<String>> = RefCell::new(None);
    let values_in: Box<dyn Iterator<Item = Result<Val, String>> + '_> = if options.slurp {
        Box::new(core::iter::once(input::slurp(stream, options.raw_input)))
    } else {
        Box::new(stream)
    };
    // An input parse error ends the stream; it is reported once the outputs so far are written.
    let values_in = values_in.map_while(|value| match value {
        Ok(value) => Some(Ok(value)),
        Err(message) => {
            *failed_input.borrow_mut() = Some(message);
            None
        }
    });
    let inputs = RcIter::new(Box::new(values_in) as Box<dyn Iterator<Item = Result<Val, String>>>);
    let data = Data {
        lut: &filter.lut,
        inputs: &inputs,
        filename: &filename,
    };
    let printer = printer(options);
    let mut last: Option<bool> = None;
    let mut filter_failed = false;
    let null =
        RcIter::new(Box::new(core::iter::once(Ok(Val::Null)))
            as Box<dyn Iterator<Item = Result<Val, String>>>);
    let top: Inputs<'_, Val> = if options.null_input { &null } else { &inputs };
    for value in top {
        let Ok(value) = value else { break };
        let ctx = jaq_core::Ctx::<DataKind>::new(&data, Vars::new(values.clone()));
        for output in filter.id.run((ctx, value)) {
            match output {
                Ok(output) => {
                    last = Some(output.as_bool());
                    if let Err(error) = printer.print(out, &output) {
                        return Err(Failure::Input(format!("cannot write the output: {error}")));
                    }
                }
                Err(exception) => match exception.get_err() {
                    Ok(error) => {
                        let _ = out.flush();
                        // A string error (`error("...")`) is shown as its text, as jq does.
                        let message = match error.into_val() {
                            Val::TStr(text) => String::from_utf8_lossy(&text).into_owned(),
                            other => other.to_string(),
                        };
                        eprintln!("jq: error (at {}): {message}", describe_place(&filename));
                        filter_failed = true;
                        break;
                    }
                    Err(exception) => {
                        // `halt` / `halt_error`: stop at once with its status.
                        let code = exception.get_halt().unwrap_or(5);
                        return Ok(code);
                    }
                },
            }
        }
    }
    let failed_input = failed_input.borrow_mut().take();
    if let Some(message) = failed_input {
        let _ = out.flush();
        eprintln!("jq: error: {message}");
        return Ok(2);
    }
    if filter_failed {
        return Ok(5);
    }
    Ok(match (options.exit_status, last) {
        (false, _) => 0,
        (true, None) => 4,
        (true, Some(true)) => 0,
        (true, Some(false)) => 1,
    })
}

/// The input being read when a filter failed, as jq names it.
fn describe_place(filename: &RefCell<Val>) -> String {
    match &*filename.borrow() {
        Val::TStr(name) => String::from_utf8_lossy(name).into_owned(),
        _ => "<stdin>".to_string(),
    }
}

/// Send jaq's `debug` and `stderr` messages to standard error, as jq prints them.
struct StderrLogger;

impl log::Log for StderrLogger {
    fn enabled(&self, _metadata: &log::Metadata) -> bool {
        true
    }

    fn log(&self, record: &log::Record) {
        let mut stderr = io::stderr().lock();
        let _ = match record.level() {
            log::Level::Error => write!(stderr, "{}", record.args()),
            level => writeln!(stderr, "[\"{level}:\",{}]", record.args()),
        };
    }

    fn flush(&self) {}
}

static LOGGER: StderrLogger = StderrLogger;

fn main() {
    enter_working_directory();
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(log::LevelFilter::Debug);
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let options = match parse_args(&args) {
        Ok(Command::Run(options)) => options,
        Ok(Command::Help) => {
            println!("{USAGE}");
            exit(0);
        }
        Ok(Command::Version) => {
            println!("jq (clawcage, jaq 3)");
            exit(0);
        }
        Err(message) => {
            eprintln!("jq: {message}");
            exit(2);
        }
    };
    let stdout = io::stdout();
    let mut out = BufWriter::with_capacity(64 * 1024, stdout.lock());
    let code = match run(&options, &mut out) {
        Ok(code) => code,
        Err(failure) => {
            let _ = out.flush();
            failure.report()
        }
    };
    let code = match out.flush() {
        Err(error) if error.kind() != io::ErrorKind::BrokenPipe => {
            eprintln!("jq: error: cannot write the output: {error}");
            2
        }
        _ => code,
    };
    exit(code);
}

#[cfg(test)]
mod tests;

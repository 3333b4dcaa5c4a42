//! Command-line parsing for `tar`, in GNU tar's three styles: old-style bundled letters
//! (`tar czf a.tgz dir`, where each letter that takes a value takes the next argument),
//! short clusters (`-xzf a.tgz`, `-fa.tar`) and long options (`--file=a.tar`, `--file a.tar`).
//! Options may come after operands; `--` ends them. `-C DIR` applies to the operands after it
//! when creating, and names the extraction directory when extracting.

/// What tar is asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// `-c`: write an archive of the operands.
    Create,
    /// `-x`: extract members.
    Extract,
    /// `-t`: list members.
    List,
}

/// A file operand with the `-C` directory in force where it was given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operand {
    /// The directory the name is relative to (`-C`), if any.
    pub directory: Option<String>,
    /// The file (create) or member (extract, list) as given.
    pub name: String,
}

/// Everything one `tar` run was asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TarOptions {
    /// The operation.
    pub operation: Operation,
    /// The archive file; `-` is standard input or output.
    pub archive: String,
    /// `-z`: gzip the archive (reading detects gzip by itself).
    pub gzip: bool,
    /// `-a`: gzip when the archive's name ends in `.gz` or `.tgz`.
    pub auto_compress: bool,
    /// `-v` given this many times.
    pub verbosity: u8,
    /// The last `-C`: where members are extracted.
    pub directory: Option<String>,
    /// `--strip-components N`.
    pub strip_components: usize,
    /// `-O`: extract file contents to standard output instead of files.
    pub to_stdout: bool,
    /// `-m`: do not restore modification times.
    pub touch: bool,
    /// `-k`: never replace an existing file.
    pub keep_old_files: bool,
    /// `--exclude PATTERN`, each a shell pattern.
    pub excludes: Vec<String>,
    /// Files to archive, or members to extract or list (all when empty).
    pub operands: Vec<Operand>,
}

/// The result of parsing: a run, or a request for help.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed {
    /// Do the operation.
    Run(TarOptions),
    /// `--help`.
    Help,
    /// `--version`.
    Version,
}

/// What `tar --help` prints.
pub const USAGE: &str = "\
usage: tar -c [-z] [-v] -f ARCHIVE [-C DIR] FILE...     create an archive
       tar -x [-v] -f ARCHIVE [-C DIR] [MEMBER...]      extract (gzip is detected)
       tar -t [-v] -f ARCHIVE [MEMBER...]               list
Options: -f ARCHIVE (- for standard input/output), -z gzip, -a gzip by suffix, -v verbose,
  -C DIR, --strip-components=N, -O to standard output, -k keep existing files,
  -m do not restore times, --exclude=PATTERN. Old style works too: tar czf a.tgz dir.
Members with absolute names or '..', and links leading outside the extraction directory,
are refused by name.";

/// The options tar knows, whatever their spelling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Opt {
    Create,
    Extract,
    List,
    File,
    Gzip,
    AutoCompress,
    Verbose,
    Directory,
    StripComponents,
    ToStdout,
    Touch,
    KeepOldFiles,
    Exclude,
    /// Accepted and without effect here (owners and permission bits do not exist under WASI).
    Ignored,
    Help,
    Version,
    /// Recognised, but not available; the text says why.
    Unsupported(&'static str),
}

impl Opt {
    fn takes_value(self) -> bool {
        matches!(
            self,
            Opt::File | Opt::Directory | Opt::StripComponents | Opt::Exclude
        )
    }
}

fn short_option(letter: char) -> Option<Opt> {
    Some(match letter {
        'c' => Opt::Create,
        'x' => Opt::Extract,
        't' => Opt::List,
        'f' => Opt::File,
        'z' => Opt::Gzip,
        'a' => Opt::AutoCompress,
        'v' => Opt::Verbose,
        'C' => Opt::Directory,
        'O' => Opt::ToStdout,
        'm' => Opt::Touch,
        'k' => Opt::KeepOldFiles,
        'o' | 'p' => Opt::Ignored,
        'j' => Opt::Unsupported("bzip2 compression (-j) is not available here; only gzip (-z)"),
        'J' => Opt::Unsupported("xz compression (-J) is not available here; only gzip (-z)"),
        'r' => Opt::Unsupported("appending (-r) is not supported; create a new archive with -c"),
        'u' => Opt::Unsupported("updating (-u) is not supported; create a new archive with -c"),
        'A' => Opt::Unsupported("concatenating (-A) is not supported"),
        'P' => Opt::Unsupported(
            "-P (absolute names) is not supported: members are always extracted inside the extraction directory",
        ),
        'h' => Opt::Unsupported("-h (follow symbolic links) is not supported"),
        _ => return None,
    })
}

fn long_option(name: &str) -> Option<Opt> {
    Some(match name {
        "create" => Opt::Create,
        "extract" | "get" => Opt::Extract,
        "list" => Opt::List,
        "file" => Opt::File,
        "gzip" | "gunzip" | "ungzip" => Opt::Gzip,
        "auto-compress" => Opt::AutoCompress,
        "verbose" => Opt::Verbose,
        "directory" => Opt::Directory,
        "strip-components" | "strip" => Opt::StripComponents,
        "to-stdout" => Opt::ToStdout,
        "touch" => Opt::Touch,
        "keep-old-files" => Opt::KeepOldFiles,
        "exclude" => Opt::Exclude,
        "no-same-owner"
        | "same-owner"
        | "no-same-permissions"
        | "same-permissions"
        | "preserve-permissions"
        | "numeric-owner"
        | "overwrite"
        | "no-overwrite-dir" => Opt::Ignored,
        "help" => Opt::Help,
        "version" => Opt::Version,
        "bzip2" => Opt::Unsupported("bzip2 compression is not available here; only gzip (-z)"),
        "xz" => Opt::Unsupported("xz compression is not available here; only gzip (-z)"),
        "append" | "update" | "concatenate" | "catenate" | "delete" => Opt::Unsupported(
            "changing an existing archive is not supported; create a new archive with -c",
        ),
        "absolute-names" => Opt::Unsupported(
            "--absolute-names is not supported: members are always extracted inside the extraction directory",
        ),
        "dereference" => Opt::Unsupported("--dereference is not supported"),
        _ => return None,
    })
}

/// Rewrites old-style arguments (`czf a.tgz dir`: a first argument without a dash) into
/// short options (`-c -z -f a.tgz dir`); other argument lists come back unchanged.
fn expand_old_style(args: &[String]) -> Vec<String> {
    let Some(first) = args.first() else {
        return Vec::new();
    };
    if first.is_empty() || first.starts_with('-') {
        return args.to_vec();
    }
    let mut expanded = Vec::new();
    let mut rest = args[1..].iter();
    for letter in first.chars() {
        expanded.push(format!("-{letter}"));
        if short_option(letter).is_some_and(Opt::takes_value)
            && let Some(value) = rest.next()
        {
            expanded.push(value.clone());
        }
    }
    expanded.extend(rest.cloned());
    expanded
}

/// `path` taken relative to `base` (a later relative `-C` is relative to the earlier one).
fn joined(base: Option<&str>, path: &str) -> String {
    match base {
        Some(base) if !path.starts_with('/') => format!("{}/{path}", base.trim_end_matches('/')),
        _ => path.to_string(),
    }
}

/// Parses tar's arguments (without the program name). The error is the message to print.
pub fn parse(args: &[String]) -> Result<Parsed, String> {
    let args = expand_old_style(args);
    let mut operation: Option<Operation> = None;
    let mut options = TarOptions {
        operation: Operation::List,
        archive: "-".to_string(),
        gzip: false,
        auto_compress: false,
        verbosity: 0,
        directory: None,
        strip_components: 0,
        to_stdout: false,
        touch: false,
        keep_old_files: false,
        excludes: Vec::new(),
        operands: Vec::new(),
    };
    let mut index = 0;
    let mut only_operands = false;
    while index < args.len() {
        let arg = &args[index];
        index += 1;
        if only_operands || arg == "-" || !arg.starts_with('-') {
            options.operands.push(Operand {
                directory: options.directory.clone(),
                name: arg.clone(),
            });
            continue;
        }
        if arg == "--" {
            only_operands = true;
            continue;
        }
        if let Some(long) = arg.strip_prefix("--") {
            let (name, inline_value) = match long.split_once('=') {
                Some((name, value)) => (name, Some(value.to_string())),
                None => (long, None),
            };
            let opt = long_option(name).ok_or_else(|| format!("unrecognized option '{arg}'"))?;
            let value = if opt.takes_value() {
                match inline_value {
                    Some(value) => Some(value),
                    None => {
                        let value = args
                            .get(index)
                            .cloned()
                            .ok_or_else(|| format!("option '--{name}' requires an argument"))?;
                        index += 1;
                        Some(value)
                    }
                }
            } else if inline_value.is_some() {
                return Err(format!("option '--{name}' doesn't allow an argument"));
            } else {
                None
            };
            if let Some(done) = apply(opt, value, &mut options, &mut operation)? {
                return Ok(done);
            }
            continue;
        }
        let letters: Vec<char> = arg[1..].chars().collect();
        let mut position = 0;
        while position < letters.len() {
            let letter = letters[position];
            position += 1;
            let opt =
                short_option(letter).ok_or_else(|| format!("invalid option -- '{letter}'"))?;
            let value = if opt.takes_value() {
                let attached: String = letters[position..].iter().collect();
                position = letters.len();
                if attached.is_empty() {
                    let value = args
                        .get(index)
                        .cloned()
                        .ok_or_else(|| format!("option requires an argument -- '{letter}'"))?;
                    index += 1;
                    Some(value)
                } else {
                    Some(attached)
                }
            } else {
                None
            };
            if let Some(done) = apply(opt, value, &mut options, &mut operation)? {
                return Ok(done);
            }
        }
    }
    options.operation = operation
        .ok_or_else(|| "You must specify one of the '-c', '-x' or '-t' options".to_string())?;
    if options.operation == Operation::Create && options.operands.is_empty() {
        return Err("Cowardly refusing to create an empty archive".to_string());
    }
    Ok(Parsed::Run(options))
}

/// Applies one option; `Some` ends parsing early (help, version).
fn apply(
    opt: Opt,
    value: Option<String>,
    options: &mut TarOptions,
    operation: &mut Option<Operation>,
) -> Result<Option<Parsed>, String> {
    let mut set_operation = |wanted: Operation| {
        if operation.is_some_and(|current| current != wanted) {
            return Err("You may not specify more than one of '-c', '-x' and '-t'".to_string());
        }
        *operation = Some(wanted);
        Ok(())
    };
    let value = value.unwrap_or_default();
    match opt {
        Opt::Create => set_operation(Operation::Create)?,
        Opt::Extract => set_operation(Operation::Extract)?,
        Opt::List => set_operation(Operation::List)?,
        Opt::File => options.archive = value,
        Opt::Gzip => options.gzip = true,
        Opt::AutoCompress => options.auto_compress = true,
        Opt::Verbose => options.verbosity = options.verbosity.saturating_add(1),
        Opt::Directory => options.directory = Some(joined(options.directory.as_deref(), &value)),
        Opt::StripComponents => {
            options.strip_components = value.parse().map_err(|_| {
                format!("Invalid number of elements for --strip-components: '{value}'")
            })?;
        }
        Opt::ToStdout => options.to_stdout = true,
        Opt::Touch => options.touch = true,
        Opt::KeepOldFiles => options.keep_old_files = true,
        Opt::Exclude => options.excludes.push(value),
        Opt::Ignored => {}
        Opt::Help => return Ok(Some(Parsed::Help)),
        Opt::Version => return Ok(Some(Parsed::Version)),
        Opt::Unsupported(why) => return Err(why.to_string()),
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_options(args: &[&str]) -> TarOptions {
        let args: Vec<String> = args.iter().map(|arg| arg.to_string()).collect();
        match parse(&args) {
            Ok(Parsed::Run(options)) => options,
            other => panic!("{args:?} parsed as {other:?}"),
        }
    }

    fn parse_error(args: &[&str]) -> String {
        let args: Vec<String> = args.iter().map(|arg| arg.to_string()).collect();
        parse(&args).unwrap_err()
    }

    fn names(options: &TarOptions) -> Vec<&str> {
        options.operands.iter().map(|op| op.name.as_str()).collect()
    }

    #[test]
    fn old_style_letters_take_their_values_in_order() {
        let options = run_options(&["czf", "a.tgz", "dir", "file"]);
        assert_eq!(options.operation, Operation::Create);
        assert!(options.gzip);
        assert_eq!(options.archive, "a.tgz");
        assert_eq!(names(&options), ["dir", "file"]);

        let options = run_options(&["xfC", "a.tar", "out", "member"]);
        assert_eq!(options.operation, Operation::Extract);
        assert_eq!(options.archive, "a.tar");
        assert_eq!(options.directory.as_deref(), Some("out"));
        assert_eq!(names(&options), ["member"]);

        let options = run_options(&["tvf", "-"]);
        assert_eq!(options.operation, Operation::List);
        assert_eq!(options.verbosity, 1);
        assert_eq!(options.archive, "-");
        assert!(options.operands.is_empty());
    }

    #[test]
    fn short_clusters_and_attached_values() {
        let options = run_options(&["-xzf", "a.tgz"]);
        assert_eq!(options.operation, Operation::Extract);
        assert!(options.gzip);
        assert_eq!(options.archive, "a.tgz");

        let options = run_options(&["-tfa.tar", "-vv"]);
        assert_eq!(options.archive, "a.tar");
        assert_eq!(options.verbosity, 2);

        let options = run_options(&["-x", "-f", "-", "-C", "out", "--strip-components", "2"]);
        assert_eq!(options.archive, "-");
        assert_eq!(options.directory.as_deref(), Some("out"));
        assert_eq!(options.strip_components, 2);
    }

    #[test]
    fn long_options_with_and_without_equals() {
        let options = run_options(&[
            "--create",
            "--gzip",
            "--file=x.tgz",
            "--directory",
            "src",
            "--exclude=*.log",
            ".",
        ]);
        assert_eq!(options.operation, Operation::Create);
        assert_eq!(options.archive, "x.tgz");
        assert_eq!(options.excludes, ["*.log"]);
        assert_eq!(
            options.operands,
            [Operand {
                directory: Some("src".into()),
                name: ".".into()
            }]
        );
        let options = run_options(&["--extract", "--file", "a", "--strip=1", "--no-same-owner"]);
        assert_eq!(options.strip_components, 1);
    }

    #[test]
    fn directory_applies_to_later_operands_and_accumulates() {
        let options = run_options(&["-cf", "a.tar", "one", "-C", "d", "two", "-C", "e", "three"]);
        let dirs: Vec<Option<&str>> = options
            .operands
            .iter()
            .map(|op| op.directory.as_deref())
            .collect();
        assert_eq!(dirs, [None, Some("d"), Some("d/e")]);
        assert_eq!(names(&options), ["one", "two", "three"]);
    }

    #[test]
    fn options_after_operands_and_double_dash() {
        let options = run_options(&["-cf", "a.tar", "dir", "-v", "--", "-odd-name"]);
        assert_eq!(options.verbosity, 1);
        assert_eq!(names(&options), ["dir", "-odd-name"]);
    }

    #[test]
    fn mistakes_are_reported() {
        assert!(parse_error(&["-f", "a.tar"]).contains("must specify one of"));
        assert!(parse_error(&["-cx", "-f", "a"]).contains("more than one"));
        assert!(parse_error(&["-cf", "a.tar"]).contains("empty archive"));
        assert_eq!(parse_error(&["-tq"]), "invalid option -- 'q'");
        assert_eq!(parse_error(&["-tf"]), "option requires an argument -- 'f'");
        assert_eq!(parse_error(&["--bogus"]), "unrecognized option '--bogus'");
        assert!(parse_error(&["-xjf", "a.tbz"]).contains("only gzip"));
        assert!(parse_error(&["-xPf", "a.tar"]).contains("inside the extraction directory"));
        assert!(parse_error(&["-x", "--strip-components=x"]).contains("Invalid number"));
        // An old-style bundle missing its value.
        assert!(parse_error(&["xf"]).contains("requires an argument"));
    }

    #[test]
    fn help_wins() {
        let args = vec!["--help".to_string()];
        assert_eq!(parse(&args), Ok(Parsed::Help));
    }
}

//! `gzip`, `gunzip` and `zcat`, after GNU gzip: `gzip FILE` writes `FILE.gz` and removes
//! `FILE` (`-k` keeps it), `gzip -d`/`gunzip FILE.gz` does the reverse, `-c` (and `zcat`)
//! writes to standard output, and with no files (or `-`) standard input goes to standard
//! output. Multi-member gzip data decompresses as one stream. Exit status 0, 1 on an error,
//! 2 on a warning (a file skipped: unknown suffix, output exists, a directory); a file that
//! fails leaves its input as it was and no partial output behind.

use std::fs::{self, File};
use std::io::{self, BufRead, BufReader, BufWriter, Read, Write};
use std::path::Path;
use std::time::UNIX_EPOCH;

use flate2::bufread::GzDecoder;
use flate2::{Compression, GzBuilder};

use crate::errors::describe;

/// Which of the three names the program was run as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Invocation {
    /// `gzip`: compress by default.
    Gzip,
    /// `gunzip`: `gzip -d`.
    Gunzip,
    /// `zcat`: `gzip -dc`.
    Zcat,
}

impl Invocation {
    fn name(self) -> &'static str {
        match self {
            Invocation::Gzip => "gzip",
            Invocation::Gunzip => "gunzip",
            Invocation::Zcat => "zcat",
        }
    }
}

/// Everything one run was asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
struct GzipOptions {
    decompress: bool,
    to_stdout: bool,
    keep: bool,
    force: bool,
    quiet: bool,
    verbose: bool,
    test: bool,
    level: u32,
    suffix: String,
    files: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Parsed {
    Run(GzipOptions),
    Help,
    Version,
}

const USAGE: &str = "\
usage: gzip [-cdfkqtv19] [-S SUFFIX] [FILE...]   (gunzip = gzip -d, zcat = gzip -dc)
  -c write to standard output and keep the files   -d decompress
  -k keep the input files   -f overwrite existing outputs   -t test compressed files
  -1 (fast) .. -9 (best) compression level   -S SUFFIX instead of .gz   -q quiet  -v verbose
With no FILE, or when FILE is -, standard input goes to standard output.";

fn parse(invocation: Invocation, args: &[String]) -> Result<Parsed, String> {
    let mut options = GzipOptions {
        decompress: invocation != Invocation::Gzip,
        to_stdout: invocation == Invocation::Zcat,
        keep: false,
        force: false,
        quiet: false,
        verbose: false,
        test: false,
        level: 6,
        suffix: ".gz".to_string(),
        files: Vec::new(),
    };
    let mut index = 0;
    let mut only_files = false;
    while index < args.len() {
        let arg = &args[index];
        index += 1;
        if only_files || arg == "-" || !arg.starts_with('-') {
            options.files.push(arg.clone());
            continue;
        }
        if arg == "--" {
            only_files = true;
            continue;
        }
        if let Some(long) = arg.strip_prefix("--") {
            let (name, value) = match long.split_once('=') {
                Some((name, value)) => (name, Some(value.to_string())),
                None => (long, None),
            };
            match name {
                "stdout" | "to-stdout" => options.to_stdout = true,
                "decompress" | "uncompress" => options.decompress = true,
                "keep" => options.keep = true,
                "force" => options.force = true,
                "quiet" | "silent" => options.quiet = true,
                "verbose" => options.verbose = true,
                "test" => options.test = true,
                "fast" => options.level = 1,
                "best" => options.level = 9,
                "name" | "no-name" => {}
                "suffix" => {
                    options.suffix = match value {
                        Some(value) => value,
                        None => {
                            let value = args
                                .get(index)
                                .cloned()
                                .ok_or("option '--suffix' requires an argument")?;
                            index += 1;
                            value
                        }
                    }
                }
                "help" => return Ok(Parsed::Help),
                "version" => return Ok(Parsed::Version),
                "recursive" => {
                    return Err(
                        "--recursive is not supported; name the files (find can list them)".into(),
                    );
                }
                _ => return Err(format!("unrecognized option '{arg}'")),
            }
            continue;
        }
        let letters: Vec<char> = arg[1..].chars().collect();
        let mut position = 0;
        while position < letters.len() {
            let letter = letters[position];
            position += 1;
            match letter {
                'c' => options.to_stdout = true,
                'd' => options.decompress = true,
                'k' => options.keep = true,
                'f' => options.force = true,
                'q' => options.quiet = true,
                'v' => options.verbose = true,
                't' => options.test = true,
                'n' | 'N' => {}
                '1'..='9' => options.level = letter.to_digit(10).unwrap_or(6),
                'h' => return Ok(Parsed::Help),
                'V' => return Ok(Parsed::Version),
                'S' => {
                    let attached: String = letters[position..].iter().collect();
                    position = letters.len();
                    options.suffix = if attached.is_empty() {
                        let value = args
                            .get(index)
                            .cloned()
                            .ok_or("option requires an argument -- 'S'")?;
                        index += 1;
                        value
                    } else {
                        attached
                    };
                }
                'r' => {
                    return Err(
                        "-r (recursive) is not supported; name the files (find can list them)"
                            .into(),
                    );
                }
                _ => return Err(format!("invalid option -- '{letter}'")),
            }
        }
    }
    if options.suffix.is_empty() {
        return Err("the suffix (-S) must not be empty".into());
    }
    if options.test {
        options.decompress = true;
    }
    if options.files.is_empty() {
        options.files.push("-".to_string());
    }
    Ok(Parsed::Run(options))
}

/// Runs gzip, gunzip or zcat with `args` (without the program name); the exit status.
pub fn run(invocation: Invocation, args: &[String]) -> i32 {
    let program = invocation.name();
    let options = match parse(invocation, args) {
        Ok(Parsed::Run(options)) => options,
        Ok(Parsed::Help) => {
            println!("{USAGE}");
            return 0;
        }
        Ok(Parsed::Version) => {
            println!("{program} (clawcage archive) {}", env!("CARGO_PKG_VERSION"));
            return 0;
        }
        Err(message) => {
            eprintln!("{program}: {message}\nTry '{program} --help' for more information.");
            return 1;
        }
    };
    let mut run = Run {
        program,
        options: &options,
        stdout: BufWriter::with_capacity(64 * 1024, io::stdout().lock()),
        status: 0,
    };
    for file in &options.files {
        if !run.one(file) {
            break;
        }
    }
    if let Err(error) = run.stdout.flush()
        && error.kind() != io::ErrorKind::BrokenPipe
    {
        eprintln!("{program}: stdout: {}", describe(&error));
        run.error();
    }
    run.status
}

struct Run<'a> {
    program: &'static str,
    options: &'a GzipOptions,
    stdout: BufWriter<io::StdoutLock<'static>>,
    status: i32,
}

/// Where a copy failed.
enum CopyError {
    /// Reading or decoding the input.
    Read(io::Error),
    /// Writing the output.
    Write(io::Error),
}

/// How decompression ended.
enum Decoded {
    Clean,
    /// Data that is not gzip followed the last member.
    TrailingGarbage,
}

impl Run<'_> {
    fn error(&mut self) {
        self.status = 1;
    }

    fn warning(&mut self) {
        if self.status == 0 {
            self.status = 2;
        }
    }

    /// Handles one operand; false when standard output closed and the run should stop.
    fn one(&mut self, file: &str) -> bool {
        if file == "-" {
            return self.stream();
        }
        let mut file = file.to_string();
        let mut metadata = fs::metadata(&file);
        // zcat and gunzip find `f.gz` when given `f`.
        if self.options.decompress
            && metadata.is_err()
            && !file.ends_with(&self.options.suffix)
            && let Ok(found) = fs::metadata(format!("{file}{}", self.options.suffix))
        {
            file = format!("{file}{}", self.options.suffix);
            metadata = Ok(found);
        }
        let metadata = match metadata {
            Ok(metadata) => metadata,
            Err(error) => {
                eprintln!("{}: {file}: {}", self.program, describe(&error));
                self.error();
                return true;
            }
        };
        if metadata.is_dir() {
            if !self.options.quiet {
                eprintln!("{}: {file} is a directory -- ignored", self.program);
            }
            self.warning();
            return true;
        }
        let input = match File::open(&file) {
            Ok(input) => input,
            Err(error) => {
                eprintln!("{}: {file}: {}", self.program, describe(&error));
                self.error();
                return true;
            }
        };
        let mtime = metadata
            .modified()
            .ok()
            .and_then(|time| time.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |since| since.as_secs());
        if self.options.to_stdout || self.options.test {
            return self.onto_stdout(input, &file, mtime);
        }
        let output_name = if self.options.decompress {
            match decompressed_name(&file, &self.options.suffix) {
                Some(name) => name,
                None => {
                    if !self.options.quiet {
                        eprintln!("{}: {file}: unknown suffix -- ignored", self.program);
                    }
                    self.warning();
                    return true;
                }
            }
        } else {
            if file.ends_with(&self.options.suffix) {
                if !self.options.quiet {
                    eprintln!(
                        "{}: {file} already has {} suffix -- unchanged",
                        self.program, self.options.suffix
                    );
                }
                self.warning();
                return true;
            }
            format!("{file}{}", self.options.suffix)
        };
        if let Ok(existing) = fs::symlink_metadata(&output_name) {
            if !self.options.force || existing.is_dir() {
                eprintln!(
                    "{}: {output_name} already exists; not overwritten",
                    self.program
                );
                self.warning();
                return true;
            }
            if let Err(error) = fs::remove_file(&output_name) {
                eprintln!("{}: {output_name}: {}", self.program, describe(&error));
                self.error();
                return true;
            }
        }
        let output = match File::options()
            .write(true)
            .create_new(true)
            .open(&output_name)
        {
            Ok(output) => output,
            Err(error) => {
                eprintln!("{}: {output_name}: {}", self.program, describe(&error));
                self.error();
                return true;
            }
        };
        let mut writer = CountingWriter::new(BufWriter::with_capacity(64 * 1024, output));
        let outcome = if self.options.decompress {
            decompress(input, &mut writer)
        } else {
            let base = Path::new(&file)
                .file_name()
                .map(|name| name.to_string_lossy().into_owned());
            compress(
                input,
                &mut writer,
                self.options.level,
                base.as_deref(),
                mtime,
            )
        };
        let written = writer.count;
        let flushed = writer
            .inner
            .into_inner()
            .map_err(|error| error.into_error());
        let outcome = match (outcome, flushed) {
            (Ok(decoded), Ok(output)) => {
                let _ = output.set_modified(UNIX_EPOCH + std::time::Duration::from_secs(mtime));
                Ok(decoded)
            }
            (Err(error), _) => Err(error),
            (Ok(_), Err(error)) => Err(CopyError::Write(error)),
        };
        match outcome {
            Ok(decoded) => {
                if matches!(decoded, Decoded::TrailingGarbage) {
                    self.trailing_garbage(&file);
                }
                if self.options.verbose {
                    let (smaller, larger) = if self.options.decompress {
                        (metadata.len(), written)
                    } else {
                        (written, metadata.len())
                    };
                    eprintln!(
                        "{file}:\t{:5.1}% -- replaced with {output_name}",
                        saving(smaller, larger)
                    );
                }
                if !self.options.keep
                    && let Err(error) = fs::remove_file(&file)
                {
                    eprintln!("{}: {file}: {}", self.program, describe(&error));
                    self.error();
                }
            }
            Err(error) => {
                let _ = fs::remove_file(&output_name);
                self.copy_failed(&file, &output_name, error);
            }
        }
        true
    }

    /// Standard input to standard output; false when standard output closed.
    fn stream(&mut self) -> bool {
        let stdin = io::stdin().lock();
        self.onto_stdout(stdin, "stdin", 0)
    }

    /// Compresses or decompresses `input` to standard output (or nowhere, with `-t`); false
    /// when standard output closed.
    fn onto_stdout(&mut self, input: impl Read, name: &str, mtime: u64) -> bool {
        let test = self.options.test;
        let mut sink = io::sink();
        let output: &mut dyn Write = if test { &mut sink } else { &mut self.stdout };
        let outcome = if self.options.decompress {
            decompress(input, output)
        } else {
            compress(
                input,
                output,
                self.options.level,
                None,
                if name == "stdin" { 0 } else { mtime },
            )
        };
        match outcome {
            Ok(decoded) => {
                if matches!(decoded, Decoded::TrailingGarbage) {
                    self.trailing_garbage(name);
                }
                if test && self.options.verbose {
                    eprintln!("{name}:\t OK");
                }
                true
            }
            Err(CopyError::Write(error)) if error.kind() == io::ErrorKind::BrokenPipe => false,
            Err(error) => {
                self.copy_failed(name, "stdout", error);
                true
            }
        }
    }

    fn trailing_garbage(&mut self, name: &str) {
        if !self.options.quiet {
            eprintln!(
                "{}: {name}: decompression OK, trailing garbage ignored",
                self.program
            );
        }
        self.warning();
    }

    fn copy_failed(&mut self, input: &str, output: &str, error: CopyError) {
        match error {
            CopyError::Read(error) => {
                let text = match error.kind() {
                    io::ErrorKind::UnexpectedEof => "unexpected end of file".to_string(),
                    _ => describe(&error),
                };
                eprintln!("{}: {input}: {text}", self.program);
            }
            CopyError::Write(error) => {
                eprintln!("{}: {output}: {}", self.program, describe(&error));
            }
        }
        self.error();
    }
}

/// The name `gunzip` writes `file` to: without its suffix (`.tgz` becomes `.tar`); `None`
/// when the name has no known suffix.
fn decompressed_name(file: &str, suffix: &str) -> Option<String> {
    let base_length = file.rsplit('/').next().map_or(file.len(), str::len);
    let strip = |ending: &str, replacement: &str| {
        (file.len() > ending.len()
            && base_length > ending.len()
            && file
                .to_ascii_lowercase()
                .ends_with(&ending.to_ascii_lowercase()))
        .then(|| format!("{}{replacement}", &file[..file.len() - ending.len()]))
    };
    strip(suffix, "")
        .or_else(|| strip(".tgz", ".tar"))
        .or_else(|| strip(".taz", ".tar"))
        .or_else(|| {
            [".gz", "-gz", ".z", "-z", "_z"]
                .iter()
                .find_map(|ending| strip(ending, ""))
        })
}

/// Percentage saved, as gzip -v prints it.
fn saving(compressed: u64, original: u64) -> f64 {
    if original == 0 {
        0.0
    } else {
        100.0 * (1.0 - compressed as f64 / original as f64)
    }
}

/// Compresses `input` into a gzip member on `output`.
fn compress(
    mut input: impl Read,
    output: &mut dyn Write,
    level: u32,
    name: Option<&str>,
    mtime: u64,
) -> Result<Decoded, CopyError> {
    let mut builder = GzBuilder::new().mtime(u32::try_from(mtime).unwrap_or(0));
    if let Some(name) = name {
        builder = builder.filename(name);
    }
    let mut encoder = builder.write(output, Compression::new(level));
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let count = match input.read(&mut buffer) {
            Ok(0) => break,
            Ok(count) => count,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(CopyError::Read(error)),
        };
        encoder
            .write_all(&buffer[..count])
            .map_err(CopyError::Write)?;
    }
    encoder.finish().map_err(CopyError::Write)?;
    Ok(Decoded::Clean)
}

/// Decompresses every gzip member of `input` onto `output`.
fn decompress(input: impl Read, output: &mut dyn Write) -> Result<Decoded, CopyError> {
    let mut reader = BufReader::with_capacity(64 * 1024, input);
    let mut members = 0u64;
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let start = reader.fill_buf().map_err(CopyError::Read)?;
        if start.is_empty() {
            if members == 0 {
                return Err(CopyError::Read(io::Error::from(
                    io::ErrorKind::UnexpectedEof,
                )));
            }
            return Ok(Decoded::Clean);
        }
        if !start.starts_with(&[0x1f, 0x8b]) {
            if members == 0 {
                return Err(CopyError::Read(io::Error::other("not in gzip format")));
            }
            return Ok(Decoded::TrailingGarbage);
        }
        let mut decoder = GzDecoder::new(&mut reader);
        loop {
            let count = match decoder.read(&mut buffer) {
                Ok(0) => break,
                Ok(count) => count,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                Err(error) => return Err(CopyError::Read(error)),
            };
            output
                .write_all(&buffer[..count])
                .map_err(CopyError::Write)?;
        }
        members += 1;
    }
}

/// A writer that counts the bytes through it.
struct CountingWriter<W> {
    inner: W,
    count: u64,
}

impl<W> CountingWriter<W> {
    fn new(inner: W) -> Self {
        Self { inner, count: 0 }
    }
}

impl<W: Write> Write for CountingWriter<W> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        let written = self.inner.write(bytes)?;
        self.count += written as u64;
        Ok(written)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(invocation: Invocation, args: &[&str]) -> GzipOptions {
        let args: Vec<String> = args.iter().map(|arg| arg.to_string()).collect();
        match parse(invocation, &args) {
            Ok(Parsed::Run(options)) => options,
            other => panic!("{args:?} parsed as {other:?}"),
        }
    }

    #[test]
    fn the_three_names_set_the_defaults() {
        let gzip = options(Invocation::Gzip, &["f"]);
        assert!(!gzip.decompress && !gzip.to_stdout);
        let gunzip = options(Invocation::Gunzip, &["f.gz"]);
        assert!(gunzip.decompress && !gunzip.to_stdout);
        let zcat = options(Invocation::Zcat, &[]);
        assert!(zcat.decompress && zcat.to_stdout);
        assert_eq!(zcat.files, ["-"]);
    }

    #[test]
    fn clusters_levels_and_suffixes() {
        let parsed = options(Invocation::Gzip, &["-dkc9", "a.gz", "-S", ".z", "b.z"]);
        assert!(parsed.decompress && parsed.keep && parsed.to_stdout);
        assert_eq!(parsed.level, 9);
        assert_eq!(parsed.suffix, ".z");
        assert_eq!(parsed.files, ["a.gz", "b.z"]);
        let parsed = options(Invocation::Gzip, &["--best", "--suffix=.gzip", "--", "-x"]);
        assert_eq!(parsed.level, 9);
        assert_eq!(parsed.suffix, ".gzip");
        assert_eq!(parsed.files, ["-x"]);
        let args = vec!["-Q".to_string()];
        assert_eq!(
            parse(Invocation::Gzip, &args),
            Err("invalid option -- 'Q'".to_string())
        );
    }

    #[test]
    fn decompressed_names() {
        assert_eq!(
            decompressed_name("a.txt.gz", ".gz").as_deref(),
            Some("a.txt")
        );
        assert_eq!(
            decompressed_name("dir/a.TGZ", ".gz").as_deref(),
            Some("dir/a.tar")
        );
        assert_eq!(decompressed_name("a.z", ".gz").as_deref(), Some("a"));
        assert_eq!(decompressed_name("a.txt", ".gz"), None);
        assert_eq!(decompressed_name(".gz", ".gz"), None);
        assert_eq!(decompressed_name("dir/.gz", ".gz"), None);
    }

    #[test]
    fn round_trip_multi_member_and_garbage() {
        let mut first = Vec::new();
        compress(&b"hello "[..], &mut first, 6, Some("a"), 0)
            .ok()
            .unwrap();
        let mut second = Vec::new();
        compress(&b"world"[..], &mut second, 1, None, 0)
            .ok()
            .unwrap();
        let joined = [first.clone(), second].concat();
        let mut out = Vec::new();
        assert!(matches!(
            decompress(&joined[..], &mut out),
            Ok(Decoded::Clean)
        ));
        assert_eq!(out, b"hello world");

        let with_garbage = [first.clone(), b"junk".to_vec()].concat();
        let mut out = Vec::new();
        assert!(matches!(
            decompress(&with_garbage[..], &mut out),
            Ok(Decoded::TrailingGarbage)
        ));

        let truncated = &first[..first.len() - 4];
        let mut out = Vec::new();
        assert!(matches!(
            decompress(truncated, &mut out),
            Err(CopyError::Read(_))
        ));
        assert!(matches!(
            decompress(&b"plain text"[..], &mut Vec::new()),
            Err(CopyError::Read(_))
        ));
        assert!(matches!(
            decompress(&b""[..], &mut Vec::new()),
            Err(CopyError::Read(_))
        ));
    }
}

//! `cmp`: compare two files byte by byte. Says where the first difference is (`a b differ:
//! byte 5, line 2`), or with `-l` lists every differing byte (offset and both values in octal),
//! with `-b` also shows the bytes, with `-s` says nothing; `-n N` compares at most N bytes. A
//! shorter file that is a prefix of the other is reported as `EOF on NAME`. Both files are
//! streamed, never read whole.

use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Write};

use crate::diff::describe_error;

const USAGE: &str = "usage: cmp [-l | -s] [-b] [-n LIMIT] FILE1 [FILE2]";

const SAME: i32 = 0;
const DIFFERENT: i32 = 1;
const TROUBLE: i32 = 2;

/// How much of each file is read at a time.
const CHUNK: usize = 64 * 1024;

#[derive(Debug, Default)]
struct Options {
    silent: bool,
    every_byte: bool,
    print_bytes: bool,
    limit: Option<u64>,
    operands: Vec<String>,
    help: bool,
}

/// Run `cmp` with `args` (the arguments after the program name); return the exit status.
pub fn main(args: &[String]) -> i32 {
    let options = match parse_args(args) {
        Ok(options) => options,
        Err(message) => {
            eprintln!("cmp: {message}\n{USAGE}");
            return TROUBLE;
        }
    };
    if options.help {
        println!("{USAGE}");
        return SAME;
    }
    let names: [&str; 2] = match options.operands.as_slice() {
        [one] => [one, "-"],
        [one, two] => [one, two],
        [] => {
            eprintln!("cmp: missing operand: give the two files to compare\n{USAGE}");
            return TROUBLE;
        }
        _ => {
            eprintln!(
                "cmp: extra operand: cmp compares exactly two files (byte offsets to skip are not supported)\n{USAGE}"
            );
            return TROUBLE;
        }
    };
    if names == ["-", "-"] {
        return SAME;
    }
    let open_or_report = |name: &str| {
        open(name).map_err(|error| eprintln!("cmp: {name}: {}", describe_error(&error)))
    };
    let Ok((first, first_size)) = open_or_report(names[0]) else {
        return TROUBLE;
    };
    let Ok((second, second_size)) = open_or_report(names[1]) else {
        return TROUBLE;
    };
    let stdout = io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let smaller = first_size
        .min(second_size)
        .min(options.limit.unwrap_or(u64::MAX));
    let result = compare(first, second, names, &options, smaller, &mut out);
    let flushed = out.flush();
    match result.and_then(|status| flushed.map(|()| status)) {
        Ok(status) => status,
        Err(error) if error.kind() == io::ErrorKind::BrokenPipe => DIFFERENT,
        Err(error) => {
            eprintln!("cmp: {}", describe_error(&error));
            TROUBLE
        }
    }
}

fn parse_args(args: &[String]) -> Result<Options, String> {
    let mut options = Options::default();
    let mut iter = args.iter();
    let mut only_operands = false;
    while let Some(arg) = iter.next() {
        if only_operands || arg == "-" || !arg.starts_with('-') {
            options.operands.push(arg.clone());
            continue;
        }
        match arg.as_str() {
            "--" => only_operands = true,
            "--silent" | "--quiet" => options.silent = true,
            "--verbose" => options.every_byte = true,
            "--print-bytes" => options.print_bytes = true,
            "--help" => options.help = true,
            long if long.starts_with("--bytes=") => {
                options.limit = Some(parse_limit(&long["--bytes=".len()..])?);
            }
            long if long.starts_with("--") => return Err(format!("unrecognized option '{long}'")),
            cluster => {
                let flags = &cluster[1..];
                for (index, flag) in flags.char_indices() {
                    match flag {
                        's' => options.silent = true,
                        'l' => options.every_byte = true,
                        'b' => options.print_bytes = true,
                        'n' => {
                            let rest = &flags[index + 1..];
                            let value = if rest.is_empty() {
                                iter.next()
                                    .ok_or("option '-n' needs a number of bytes")?
                                    .as_str()
                            } else {
                                rest
                            };
                            options.limit = Some(parse_limit(value)?);
                            break;
                        }
                        'i' => {
                            return Err("skipping bytes (-i) is not supported".to_string());
                        }
                        _ => return Err(format!("invalid option -- '{flag}'")),
                    }
                }
            }
        }
    }
    if options.silent && options.every_byte {
        return Err("options -l and -s are incompatible".to_string());
    }
    Ok(options)
}

fn parse_limit(text: &str) -> Result<u64, String> {
    text.parse()
        .map_err(|_| format!("invalid byte count '{text}': give a whole number"))
}

/// A buffered reader of `name` (`-` is standard input) and its size when known.
fn open(name: &str) -> io::Result<(Box<dyn BufRead>, u64)> {
    if name == "-" {
        return Ok((
            Box::new(BufReader::with_capacity(CHUNK, io::stdin())),
            u64::MAX,
        ));
    }
    let file = File::open(name)?;
    let meta = file.metadata()?;
    if meta.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::IsADirectory,
            "Is a directory",
        ));
    }
    Ok((Box::new(BufReader::with_capacity(CHUNK, file)), meta.len()))
}

/// Compare the two streams; print what `options` ask for; return the exit status.
fn compare(
    mut first: impl BufRead,
    mut second: impl BufRead,
    names: [&str; 2],
    options: &Options,
    smaller_size: u64,
    out: &mut impl Write,
) -> io::Result<i32> {
    let limit = options.limit.unwrap_or(u64::MAX);
    let width = if smaller_size == u64::MAX {
        1
    } else {
        smaller_size.max(1).to_string().len()
    };
    // Bytes found equal so far (or, with -l, compared so far), and the line the next byte is on.
    let mut offset: u64 = 0;
    let mut line: u64 = 1;
    let mut last_byte = None;
    let mut differed = false;
    while offset < limit {
        let (a, b) = (first.fill_buf()?, second.fill_buf()?);
        if a.is_empty() || b.is_empty() {
            if a.len() == b.len() {
                break;
            }
            if !options.silent {
                let shorter = if a.is_empty() { names[0] } else { names[1] };
                out.flush()?;
                if offset == 0 {
                    eprintln!("cmp: EOF on {shorter} which is empty");
                } else if options.every_byte {
                    eprintln!("cmp: EOF on {shorter} after byte {offset}");
                } else {
                    let last_line = if last_byte == Some(b'\n') {
                        line - 1
                    } else {
                        line
                    };
                    eprintln!("cmp: EOF on {shorter} after byte {offset}, line {last_line}");
                }
            }
            return Ok(DIFFERENT);
        }
        let room = usize::try_from(limit - offset).unwrap_or(usize::MAX);
        let count = a.len().min(b.len()).min(room);
        let (a, b) = (&a[..count], &b[..count]);
        if options.every_byte {
            for (index, (&x, &y)) in a.iter().zip(b).enumerate() {
                if x != y {
                    differed = true;
                    let at = offset + index as u64 + 1;
                    if options.print_bytes {
                        writeln!(
                            out,
                            "{at:>width$} {x:3o} {:<4} {y:3o} {}",
                            visible(x),
                            visible(y)
                        )?;
                    } else {
                        writeln!(out, "{at:>width$} {x:3o} {y:3o}")?;
                    }
                }
            }
        } else if let Some(index) = a.iter().zip(b).position(|(x, y)| x != y) {
            line += memchr::memchr_iter(b'\n', &a[..index]).count() as u64;
            if !options.silent {
                let at = offset + index as u64 + 1;
                write!(
                    out,
                    "{} {} differ: byte {at}, line {line}",
                    names[0], names[1]
                )?;
                if options.print_bytes {
                    let (x, y) = (a[index], b[index]);
                    write!(out, " is {x:3o} {} {y:3o} {}", visible(x), visible(y))?;
                }
                writeln!(out)?;
            }
            return Ok(DIFFERENT);
        }
        line += memchr::memchr_iter(b'\n', a).count() as u64;
        last_byte = a.last().copied();
        offset += count as u64;
        first.consume(count);
        second.consume(count);
    }
    Ok(if differed { DIFFERENT } else { SAME })
}

/// A byte as GNU cmp shows it: printable as itself, control bytes as `^X`, high bytes as `M-`.
fn visible(byte: u8) -> String {
    let (prefix, low) = if byte >= 0x80 {
        ("M-", byte - 0x80)
    } else {
        ("", byte)
    };
    match low {
        0x7f => format!("{prefix}^?"),
        0..=0x1f => format!("{prefix}^{}", char::from(low + 0x40)),
        _ => format!("{prefix}{}", char::from(low)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(a: &[u8], b: &[u8], args: &[&str]) -> (i32, String) {
        let options =
            parse_args(&args.iter().map(|arg| arg.to_string()).collect::<Vec<_>>()).unwrap();
        let mut out = Vec::new();
        let smaller = (a.len().min(b.len())) as u64;
        let status = compare(a, b, ["a", "b"], &options, smaller, &mut out).unwrap();
        (status, String::from_utf8(out).unwrap())
    }

    #[test]
    fn first_difference_is_located() {
        assert_eq!(run(b"same\n", b"same\n", &[]), (0, String::new()));
        assert_eq!(
            run(b"one\ntwo\n", b"one\ntwx\n", &[]),
            (1, "a b differ: byte 7, line 2\n".to_string())
        );
        assert_eq!(
            run(b"one\ntwo\n", b"one\ntwx\n", &["-s"]),
            (1, String::new())
        );
        assert_eq!(
            run(b"ab", b"ac", &["-b"]),
            (1, "a b differ: byte 2, line 1 is 142 b 143 c\n".to_string())
        );
    }

    #[test]
    fn every_difference_is_listed() {
        assert_eq!(
            run(b"abcdefghijkl", b"aXcdefghijkY", &["-l"]),
            (1, " 2 142 130\n12 154 131\n".to_string())
        );
    }

    #[test]
    fn a_prefix_is_a_difference_and_limits_hold() {
        assert_eq!(run(b"abc", b"abcdef", &[]).0, 1);
        assert_eq!(run(b"abcX", b"abcY", &["-n", "3"]).0, 0);
        assert_eq!(run(b"abcX", b"abcY", &["-n4"]).0, 1);
        assert!(parse_args(&["-l".into(), "-s".into()]).is_err());
    }

    #[test]
    fn bytes_are_shown_visibly() {
        assert_eq!(visible(b'a'), "a");
        assert_eq!(visible(1), "^A");
        assert_eq!(visible(0x7f), "^?");
        assert_eq!(visible(0xe1), "M-a");
    }
}

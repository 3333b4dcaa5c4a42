//! The `read` builtin as scripts use it: `read [-r] [-s] [-p PROMPT] [-t SECS] [-d DELIM]
//! [-n N | -N N] [NAME...]`. A record is read from standard input up to the delimiter (a newline
//! unless `-d` says otherwise; `-d ''` is the NUL byte that `find -print0` ends names with), or
//! `-n`/`-N` characters; without `-r` a backslash escapes the next character and a backslash at
//! the end of a line joins the next one. The record is split into the names by `$IFS` as a POSIX
//! shell does: leading and trailing IFS whitespace dropped, the last name getting the rest of the
//! record with its inner spacing kept, and with `IFS=` nothing split or dropped at all (so `while
//! IFS= read -r line` keeps each line exactly). With no name the record goes to `REPLY` whole.
//! There is no terminal here, so `-p`, `-s` and `-t` change nothing; `-a` (arrays) and `-u`
//! (another descriptor) are refused with a message.

use super::Stdin;

/// What `read`'s options asked for.
#[derive(Debug, Default, PartialEq)]
pub(super) struct ReadOptions {
    raw: bool,
    /// The byte a record ends at.
    delimiter: u8,
    /// Characters read at most (`-n`), or exactly (`-N`, which ignores the delimiter).
    limit: Option<usize>,
    exact: bool,
    pub(super) names: Vec<String>,
}

/// `read`'s arguments understood, or the message of a usage error.
pub(super) fn parse_read_args(args: &[String]) -> Result<ReadOptions, String> {
    let mut options = ReadOptions {
        delimiter: b'\n',
        ..ReadOptions::default()
    };
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        if arg == "--" {
            options.names.extend(rest.cloned());
            break;
        }
        let Some(flags) = arg.strip_prefix('-').filter(|flags| !flags.is_empty()) else {
            options.names.push(arg.clone());
            options.names.extend(rest.cloned());
            break;
        };
        for (at, flag) in flags.char_indices() {
            match flag {
                'r' => options.raw = true,
                's' | 'e' => {}
                'p' | 't' | 'd' | 'n' | 'N' | 'i' | 'u' | 'a' => {
                    let attached = &flags[at + flag.len_utf8()..];
                    let value = if attached.is_empty() {
                        rest.next()
                            .cloned()
                            .ok_or_else(|| format!("read: -{flag}: option requires an argument"))?
                    } else {
                        attached.to_string()
                    };
                    match flag {
                        'd' => options.delimiter = value.bytes().next().unwrap_or(0),
                        'n' | 'N' => {
                            options.limit = Some(value.parse().map_err(|_| {
                                format!("read: {value}: invalid number of characters")
                            })?);
                            options.exact = flag == 'N';
                        }
                        'u' => {
                            return Err(
                                "read: -u: reading another file descriptor is not supported here; redirect it to standard input (`read x < file`)"
                                    .to_string(),
                            );
                        }
                        'a' => {
                            return Err(
                                "read: -a: arrays are not supported here; read into names (`read a b c`)"
                                    .to_string(),
                            );
                        }
                        // -p (no terminal to prompt on), -t (input is all there), -i.
                        _ => {}
                    }
                    break;
                }
                other => return Err(format!("read: -{other}: invalid option")),
            }
        }
    }
    if let Some(bad) = options.names.iter().find(|name| !is_name(name)) {
        return Err(format!("read: `{bad}': not a valid identifier"));
    }
    Ok(options)
}

fn is_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|first| first == '_' || first.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

/// Reads one record from `stdin` as `options` say: its text (backslashes handled unless raw) and
/// whether it is whole (its delimiter came, or as many characters as asked; the last line of an
/// input without a newline is not, and `read` then fails as in any shell, after setting the
/// names), or `None` at the end of the input with nothing read.
pub(super) fn read_record(stdin: &Stdin, options: &ReadOptions) -> Option<(String, bool)> {
    let mut text = String::new();
    let mut read_any = false;
    let mut whole = false;
    loop {
        let left = options
            .limit
            .map(|limit| limit.saturating_sub(text.chars().count()));
        let delimiter = (!options.exact).then_some(options.delimiter);
        let Some((record, ended)) = stdin.read_until(delimiter, left) else {
            break;
        };
        read_any = true;
        if options.raw {
            text.push_str(&record);
        } else {
            let (unescaped, continued) = unescape_record(&record);
            text.push_str(&unescaped);
            // A backslash before the delimiter joins the next record (unless counting
            // characters).
            if continued && ended && options.limit.is_none() {
                continue;
            }
        }
        whole = ended || options.limit == Some(text.chars().count());
        break;
    }
    read_any.then_some((text, whole))
}

/// `record` with each backslash escape replaced by the character it escapes; whether it ended
/// in a lone backslash (a line continued).
fn unescape_record(record: &str) -> (String, bool) {
    let mut out = String::with_capacity(record.len());
    let mut chars = record.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some(escaped) => out.push(escaped),
                None => return (out, true),
            }
        } else {
            out.push(c);
        }
    }
    (out, false)
}

/// The values `count` names get from `record`, split by `ifs` (see the module's doc).
pub(super) fn split_record(record: &str, ifs: &str, count: usize) -> Vec<String> {
    let is_separator = |c: char| ifs.contains(c);
    let is_blank = |c: char| ifs.contains(c) && matches!(c, ' ' | '\t' | '\n');
    let mut values = Vec::with_capacity(count);
    let mut rest = record.trim_start_matches(is_blank);
    for position in 0..count {
        if position + 1 == count {
            values.push(rest.trim_end_matches(is_blank).to_string());
            break;
        }
        let end = rest.find(is_separator).unwrap_or(rest.len());
        values.push(rest[..end].to_string());
        // A field ends at IFS whitespace with at most one other IFS character within it.
        let mut after = rest[end..].trim_start_matches(is_blank);
        if let Some(first) = after.chars().next()
            && is_separator(first)
            && !is_blank(first)
            && end < rest.len()
        {
            after = after[first.len_utf8()..].trim_start_matches(is_blank);
        }
        rest = after;
    }
    values
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn options_are_understood_joined_or_apart() {
        let options = parse_read_args(&args(&["-rp", "Name: ", "who"])).unwrap();
        assert!(options.raw);
        assert_eq!(options.names, ["who"]);
        let options = parse_read_args(&args(&["-r", "-d", "", "-n3", "a", "b"])).unwrap();
        assert_eq!((options.delimiter, options.limit), (0, Some(3)));
        assert_eq!(options.names, ["a", "b"]);
        let options = parse_read_args(&args(&["-t", "5", "-s", "--", "-x"]));
        assert!(options.unwrap_err().contains("not a valid identifier"));
        assert!(
            parse_read_args(&args(&["-a", "list"]))
                .unwrap_err()
                .contains("arrays")
        );
        assert!(
            parse_read_args(&args(&["-u", "3", "x"]))
                .unwrap_err()
                .contains("-u")
        );
        assert!(
            parse_read_args(&args(&["-p"]))
                .unwrap_err()
                .contains("requires an argument")
        );
        assert!(
            parse_read_args(&args(&["-z"]))
                .unwrap_err()
                .contains("invalid option")
        );
        assert!(
            parse_read_args(&args(&["-n", "x"]))
                .unwrap_err()
                .contains("invalid number")
        );
        assert!(
            parse_read_args(&args(&["1x"]))
                .unwrap_err()
                .contains("not a valid")
        );
    }

    #[test]
    fn fields_split_by_ifs_and_the_last_keeps_its_spacing() {
        let blank = " \t\n";
        assert_eq!(split_record("  a  b   c  ", blank, 2), ["a", "b   c"]);
        assert_eq!(split_record("a", blank, 3), ["a", "", ""]);
        assert_eq!(split_record("  keep   inner  ", blank, 1), ["keep   inner"]);
        // IFS= : nothing split, nothing dropped.
        assert_eq!(split_record("  as is  ", "", 1), ["  as is  "]);
        assert_eq!(split_record("  as is  ", "", 2), ["  as is  ", ""]);
        // Other separators: one per field, empty fields kept, whitespace not in IFS kept.
        assert_eq!(split_record("root:x::0", ":", 4), ["root", "x", "", "0"]);
        assert_eq!(split_record("a : b", ": ", 2), ["a", "b"]);
        assert_eq!(split_record("a,b,c", ",", 2), ["a", "b,c"]);
        assert!(split_record("a b", blank, 0).is_empty());
    }

    #[test]
    fn records_end_at_the_delimiter_and_backslashes_escape_unless_raw() {
        let stdin = Stdin::bytes(b"one \\\ntwo\nx\\y\n".to_vec());
        let plain = parse_read_args(&[]).unwrap();
        let text = |read: Option<(String, bool)>| read.map(|(text, _)| text);
        assert_eq!(
            read_record(&stdin, &plain),
            Some(("one two".to_string(), true))
        );
        assert_eq!(text(read_record(&stdin, &plain)).as_deref(), Some("xy"));
        assert_eq!(read_record(&stdin, &plain), None);

        let stdin = Stdin::bytes(b"a\\b\nlast".to_vec());
        let raw = parse_read_args(&args(&["-r"])).unwrap();
        assert_eq!(text(read_record(&stdin, &raw)).as_deref(), Some("a\\b"));
        // The last line without its newline: read, but not whole.
        assert_eq!(read_record(&stdin, &raw), Some(("last".to_string(), false)));
        assert_eq!(read_record(&stdin, &raw), None);

        let stdin = Stdin::bytes(b"f 1\0f2\0".to_vec());
        let nul = parse_read_args(&args(&["-r", "-d", ""])).unwrap();
        assert_eq!(text(read_record(&stdin, &nul)).as_deref(), Some("f 1"));
        assert_eq!(read_record(&stdin, &nul), Some(("f2".to_string(), true)));

        let stdin = Stdin::bytes("héllo\nworld".as_bytes().to_vec());
        let two = parse_read_args(&args(&["-n", "2"])).unwrap();
        assert_eq!(read_record(&stdin, &two), Some(("hé".to_string(), true)));
        assert_eq!(text(read_record(&stdin, &two)).as_deref(), Some("ll"));
        assert_eq!(
            text(read_record(&stdin, &two)).as_deref(),
            Some("o"),
            "stops at the newline"
        );
        let exact = parse_read_args(&args(&["-N", "3"])).unwrap();
        assert_eq!(read_record(&stdin, &exact), Some(("wor".to_string(), true)));
        assert_eq!(read_record(&stdin, &exact), Some(("ld".to_string(), false)));
    }
}

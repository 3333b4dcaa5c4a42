//! How wasi-libc resolves a path against the preopened directories (its `make_absolute` and
//! `__wasilibc_find_abspath`), so that the walk opens a starting path beneath the same preopen
//! as the standard library does. Pure string work, tested on any target.

/// `path` made absolute on `cwd` as wasi-libc's `make_absolute` does: an absolute path as it
/// is, the empty path, `.` and `./` as the current directory, a leading `./` dropped, no other normalisation.
pub(super) fn make_absolute(path: &str, cwd: &str) -> String {
    if path.starts_with('/') {
        return path.to_string();
    }
    if path.is_empty() || path == "." || path == "./" {
        return cwd.to_string();
    }
    let path = path.strip_prefix("./").unwrap_or(path);
    if cwd.ends_with('/') {
        format!("{cwd}{path}")
    } else {
        format!("{cwd}/{path}")
    }
}

/// A preopen's name as wasi-libc keeps it: without leading `/` and `./`, `.` as the empty name.
fn strip_prefixes(mut name: &str) -> &str {
    loop {
        if let Some(rest) = name.strip_prefix('/') {
            name = rest;
        } else if let Some(rest) = name.strip_prefix("./") {
            name = rest;
        } else if name == "." {
            name = "";
        } else {
            return name;
        }
    }
}

/// Whether the preopen name `prefix` is a prefix of `path` in whole components (the empty name
/// is a prefix of every relative path; trailing slashes of the name do not count).
fn prefix_matches(prefix: &str, path: &str) -> bool {
    if !path.starts_with('/') && prefix.is_empty() {
        return true;
    }
    if !path.starts_with(prefix) {
        return false;
    }
    let end = prefix.trim_end_matches('/').len();
    matches!(path.as_bytes().get(end), None | Some(b'/'))
}

/// The index of the preopen among `names` that `absolute` lies beneath, and the path relative to
/// it, as wasi-libc's `__wasilibc_find_abspath` finds them.
pub(super) fn find_preopen<'a>(names: &[&str], absolute: &'a str) -> Option<(usize, &'a str)> {
    let path = absolute.trim_start_matches('/');
    let mut best: Option<(usize, usize)> = None;
    for (index, name) in names.iter().enumerate().rev() {
        let prefix = strip_prefixes(name);
        let longer = best.is_none_or(|(_, length)| prefix.len() > length);
        if longer && prefix_matches(prefix, path) {
            best = Some((index, prefix.len()));
        }
    }
    let (index, length) = best?;
    let relative = path.get(length..).unwrap_or("").trim_start_matches('/');
    Some((index, if relative.is_empty() { "." } else { relative }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_are_joined_on_the_working_directory() {
        assert_eq!(make_absolute("tree", "/w/src"), "/w/src/tree");
        assert_eq!(make_absolute("./tree", "/w/src"), "/w/src/tree");
        assert_eq!(make_absolute(".", "/w/src"), "/w/src");
        assert_eq!(make_absolute("./", "/w/src"), "/w/src");
        assert_eq!(make_absolute("", "/w/src"), "/w/src");
        assert_eq!(make_absolute("../x", "/w/src"), "/w/src/../x");
        assert_eq!(make_absolute("/etc", "/w/src"), "/etc");
        assert_eq!(make_absolute("tree", "/"), "/tree");
    }

    #[test]
    fn the_longest_preopen_name_wins_in_whole_components() {
        // As exec's programs get them: the workspace, then `.`, `..`, `../..` for /w/src/lib.
        let names = ["/w", ".", "..", "../.."];
        assert_eq!(
            find_preopen(&names, "/w/src/lib/a.rs"),
            Some((0, "src/lib/a.rs"))
        );
        assert_eq!(find_preopen(&names, "/w"), Some((0, ".")));
        assert_eq!(find_preopen(&names, "/w/"), Some((0, ".")));
        // Outside the workspace only the empty name of `.` is a prefix.
        assert_eq!(find_preopen(&names, "/etc/passwd"), Some((1, "etc/passwd")));
        assert_eq!(find_preopen(&names, "/"), Some((1, ".")));
        assert_eq!(find_preopen(&names, "/work/x"), Some((1, "work/x")));
        // `/w` is not a prefix of `/wx`, and trailing slashes of a name do not count.
        assert_eq!(find_preopen(&["/w/", "/wx"], "/wx/a"), Some((1, "a")));
        assert_eq!(find_preopen(&["/w/"], "/w/a"), Some((0, "a")));
        assert_eq!(find_preopen(&["/w"], "/v"), None);
        // Of two names of the same length, the one listed last.
        assert_eq!(find_preopen(&["/a", "/a"], "/a/b"), Some((1, "b")));
        assert_eq!(find_preopen(&["./x", "x"], "/x/y"), Some((1, "y")));
    }
}

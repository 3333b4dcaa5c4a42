//! The lines `tar -tv` (and `-xvv`, `-cvv`) print for a member, in GNU tar's layout:
//! `-rw-r--r-- owner/group  size YYYY-MM-DD HH:MM name`, with the owner/group and size column
//! widening as longer ones appear. Times are UTC (the sandbox has no time zone).

/// The kind of member a line describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A regular file.
    File,
    /// A directory.
    Directory,
    /// A symbolic link.
    Symlink,
    /// A hard link to an earlier member.
    HardLink,
    /// A character device.
    CharDevice,
    /// A block device.
    BlockDevice,
    /// A named pipe.
    Fifo,
    /// Anything else.
    Other,
}

/// What one listing line shows.
#[derive(Debug, Clone)]
pub struct Line<'a> {
    /// The member's kind.
    pub kind: Kind,
    /// Permission bits (the low 12 bits are used).
    pub mode: u32,
    /// Owner name, or the numeric id when the archive has no name.
    pub owner: String,
    /// Group name, or the numeric id.
    pub group: String,
    /// Size in bytes.
    pub size: u64,
    /// Modification time, seconds since 1970 (UTC).
    pub mtime: u64,
    /// The member's name.
    pub name: &'a str,
    /// A link's target.
    pub link_target: Option<&'a str>,
}

/// Formats listing lines, remembering the widest owner/group/size column so far.
pub struct Lister {
    column_width: usize,
}

impl Default for Lister {
    fn default() -> Self {
        Self { column_width: 18 }
    }
}

impl Lister {
    /// The line for `line`, without a newline.
    pub fn format(&mut self, line: &Line<'_>) -> String {
        let size = line.size.to_string();
        let used = line.owner.len() + 1 + line.group.len() + size.len();
        self.column_width = self.column_width.max(used);
        let padding = self.column_width - used + size.len();
        let mut text = format!(
            "{} {}/{} {size:>padding$} {} {}",
            mode_string(line.kind, line.mode),
            line.owner,
            line.group,
            timestamp(line.mtime),
            line.name,
        );
        match (line.kind, line.link_target) {
            (Kind::Symlink, Some(target)) => text.push_str(&format!(" -> {target}")),
            (Kind::HardLink, Some(target)) => text.push_str(&format!(" link to {target}")),
            _ => {}
        }
        text
    }
}

/// `drwxr-xr-x`-style text for a kind and permission bits.
pub fn mode_string(kind: Kind, mode: u32) -> String {
    let type_letter = match kind {
        Kind::File | Kind::Other => '-',
        Kind::Directory => 'd',
        Kind::Symlink => 'l',
        Kind::HardLink => 'h',
        Kind::CharDevice => 'c',
        Kind::BlockDevice => 'b',
        Kind::Fifo => 'p',
    };
    let mut text = String::with_capacity(10);
    text.push(type_letter);
    for (shift, special, special_letter) in [(6, 0o4000, 's'), (3, 0o2000, 's'), (0, 0o1000, 't')] {
        let bits = (mode >> shift) & 0o7;
        text.push(if bits & 0o4 != 0 { 'r' } else { '-' });
        text.push(if bits & 0o2 != 0 { 'w' } else { '-' });
        let execute = bits & 0o1 != 0;
        text.push(match (mode & special != 0, execute) {
            (true, true) => special_letter,
            (true, false) => special_letter.to_ascii_uppercase(),
            (false, true) => 'x',
            (false, false) => '-',
        });
    }
    text
}

/// `YYYY-MM-DD HH:MM` for seconds since 1970, UTC.
pub fn timestamp(seconds: u64) -> String {
    let days = seconds / 86_400;
    let in_day = seconds % 86_400;
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}",
        in_day / 3600,
        in_day % 3600 / 60
    )
}

/// The calendar date of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let day_of_era = z - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_read_like_ls() {
        assert_eq!(mode_string(Kind::File, 0o644), "-rw-r--r--");
        assert_eq!(mode_string(Kind::Directory, 0o755), "drwxr-xr-x");
        assert_eq!(mode_string(Kind::Symlink, 0o777), "lrwxrwxrwx");
        assert_eq!(mode_string(Kind::File, 0o4755), "-rwsr-xr-x");
        assert_eq!(mode_string(Kind::Directory, 0o1777), "drwxrwxrwt");
        assert_eq!(mode_string(Kind::File, 0o2640), "-rw-r-S---");
    }

    #[test]
    fn timestamps_are_utc_dates() {
        assert_eq!(timestamp(0), "1970-01-01 00:00");
        assert_eq!(timestamp(951_782_400), "2000-02-29 00:00");
        assert_eq!(timestamp(1_700_000_000), "2023-11-14 22:13");
    }

    #[test]
    fn lines_align_like_gnu_tar() {
        let mut lister = Lister::default();
        let line = Line {
            kind: Kind::File,
            mode: 0o644,
            owner: "user".into(),
            group: "group".into(),
            size: 1234,
            mtime: 0,
            name: "dir/file.txt",
            link_target: None,
        };
        assert_eq!(
            lister.format(&line),
            "-rw-r--r-- user/group     1234 1970-01-01 00:00 dir/file.txt"
        );
        let link = Line {
            kind: Kind::Symlink,
            mode: 0o777,
            size: 0,
            name: "l",
            link_target: Some("dir/file.txt"),
            ..line
        };
        assert!(lister.format(&link).ends_with("00:00 l -> dir/file.txt"));
    }
}

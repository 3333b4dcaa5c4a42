//! Applying one file's hunks to its text, in memory, the way GNU patch places them: each hunk
//! is looked for at its stated line (shifted by where the previous hunk landed), then ever
//! further above and below; when the exact lines are nowhere, up to `max_fuzz` lines of
//! leading and trailing context are let go. The outcome says where each hunk went (offset and
//! fuzz) or that it failed; the caller writes the text only when every hunk fitted.

use crate::lines::split_lines;

/// What a line of a hunk does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Context,
    Delete,
    Insert,
}

/// One hunk: its stated old and new ranges (1-based starts, as in `@@ -1,3 +1,4 @@`) and its
/// lines, each with its `\n` (a line marked "No newline at end of file" has none).
#[derive(Debug, Clone)]
pub struct Hunk {
    pub old_start: usize,
    pub old_len: usize,
    pub new_start: usize,
    pub new_len: usize,
    pub lines: Vec<(Role, Vec<u8>)>,
}

impl Hunk {
    /// The same hunk undoing itself (`patch -R`).
    pub fn reversed(&self) -> Hunk {
        Hunk {
            old_start: self.new_start,
            old_len: self.new_len,
            new_start: self.old_start,
            new_len: self.old_len,
            lines: self
                .lines
                .iter()
                .map(|(role, text)| {
                    let role = match role {
                        Role::Delete => Role::Insert,
                        Role::Insert => Role::Delete,
                        Role::Context => Role::Context,
                    };
                    (role, text.clone())
                })
                .collect(),
        }
    }

    /// The lines the hunk expects to find (context and deletions).
    fn before(&self) -> Vec<&[u8]> {
        self.lines
            .iter()
            .filter(|(role, _)| *role != Role::Insert)
            .map(|(_, text)| text.as_slice())
            .collect()
    }

    /// The lines the hunk leaves (context and insertions).
    fn after(&self) -> Vec<&[u8]> {
        self.lines
            .iter()
            .filter(|(role, _)| *role != Role::Delete)
            .map(|(_, text)| text.as_slice())
            .collect()
    }

    fn leading_context(&self) -> usize {
        self.lines
            .iter()
            .take_while(|(role, _)| *role == Role::Context)
            .count()
    }

    fn trailing_context(&self) -> usize {
        self.lines
            .iter()
            .rev()
            .take_while(|(role, _)| *role == Role::Context)
            .count()
    }
}

/// Where a hunk went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// Applied at the new-file line `line`, `offset` lines from where it said, with `fuzz`
    /// context lines let go.
    Applied {
        line: usize,
        offset: isize,
        fuzz: usize,
    },
    /// Nowhere: the hunk's lines are not in the file (the line it was looked for at).
    Failed { line: usize },
}

/// The result of applying a file's hunks: the new text (meaningful only when no hunk failed)
/// and each hunk's placement.
#[derive(Debug)]
pub struct Applied {
    pub text: Vec<u8>,
    pub placements: Vec<Placement>,
}

impl Applied {
    pub fn failures(&self) -> usize {
        self.placements
            .iter()
            .filter(|placement| matches!(placement, Placement::Failed { .. }))
            .count()
    }
}

/// Apply `hunks` in order to `text`, letting go of at most `max_fuzz` context lines at each end.
pub fn apply(text: &[u8], hunks: &[Hunk], max_fuzz: usize) -> Applied {
    let lines = split_lines(text);
    let mut output: Vec<&[u8]> = Vec::with_capacity(lines.len());
    // The first line of `lines` not yet copied or replaced.
    let mut cursor = 0;
    // How far the previous hunk landed from where it said (GNU carries it to the next hunk).
    let mut carried_offset: isize = 0;
    let mut placements = Vec::with_capacity(hunks.len());
    for hunk in hunks {
        let stated = stated_index(hunk);
        let guess = stated.saturating_add_signed(carried_offset);
        match locate(&lines, hunk, guess, cursor, max_fuzz) {
            Some(found) => {
                output.extend_from_slice(&lines[cursor..found.start]);
                let after = hunk.after();
                output.extend_from_slice(&after[found.front..after.len() - found.back]);
                cursor = found.start + found.length;
                // Where the whole hunk (with any context let go) begins, against where it said.
                let begins = found.start as isize - found.front as isize;
                let offset = begins - stated as isize;
                carried_offset = offset;
                placements.push(Placement::Applied {
                    line: hunk.new_start.saturating_add_signed(offset),
                    offset,
                    fuzz: found.fuzz,
                });
            }
            None => placements.push(Placement::Failed {
                line: hunk.new_start.saturating_add_signed(carried_offset),
            }),
        }
    }
    output.extend_from_slice(&lines[cursor.min(lines.len())..]);
    Applied {
        text: output.concat(),
        placements,
    }
}

/// The 0-based index of the first line a hunk's old range covers (for an empty range, the
/// index after the line it names).
fn stated_index(hunk: &Hunk) -> usize {
    if hunk.old_len == 0 {
        hunk.old_start
    } else {
        hunk.old_start.saturating_sub(1)
    }
}

struct Found {
    /// Index of the first matched line.
    start: usize,
    /// Matched lines.
    length: usize,
    /// Context lines let go at the front and at the back.
    front: usize,
    back: usize,
    fuzz: usize,
}

/// Find the hunk's expected lines at or after `cursor`, nearest to `guess` first, with the
/// least fuzz that works.
fn locate(
    lines: &[&[u8]],
    hunk: &Hunk,
    guess: usize,
    cursor: usize,
    max_fuzz: usize,
) -> Option<Found> {
    let before = hunk.before();
    let (leading, trailing) = (hunk.leading_context(), hunk.trailing_context());
    for fuzz in 0..=max_fuzz {
        let front = fuzz.min(leading);
        let back = fuzz.min(trailing);
        if fuzz > 0 && front + back == 0 {
            break;
        }
        if fuzz > leading.max(trailing) {
            break;
        }
        // A hunk that is all context would match anywhere once fuzzed away.
        if front + back >= before.len() && !before.is_empty() {
            break;
        }
        let wanted = &before[front..before.len() - back];
        let Some(last_start) = lines.len().checked_sub(wanted.len()) else {
            continue;
        };
        if cursor > last_start {
            continue;
        }
        let first_guess = guess.saturating_add(front).clamp(cursor, last_start);
        let fits = |start: usize| lines[start..start + wanted.len()] == *wanted;
        let below = first_guess..=last_start;
        let above = (cursor..first_guess).rev();
        if let Some(start) = interleave(below, above).find(|&start| fits(start)) {
            return Some(Found {
                start,
                length: wanted.len(),
                front,
                back,
                fuzz,
            });
        }
    }
    None
}

/// `first[0], second[0], first[1], second[1], ...`, then whatever is left of either.
fn interleave(
    mut first: impl Iterator<Item = usize>,
    mut second: impl Iterator<Item = usize>,
) -> impl Iterator<Item = usize> {
    let mut take_first = true;
    std::iter::from_fn(move || {
        let next = if take_first {
            first.next().or_else(|| second.next())
        } else {
            second.next().or_else(|| first.next())
        };
        take_first = !take_first;
        next
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hunk from unified-diff body lines (` ctx`, `-old`, `+new`), each given a newline.
    fn hunk(old_start: usize, new_start: usize, body: &[&str]) -> Hunk {
        let lines: Vec<(Role, Vec<u8>)> = body
            .iter()
            .map(|line| {
                let role = match &line[..1] {
                    " " => Role::Context,
                    "-" => Role::Delete,
                    _ => Role::Insert,
                };
                (role, format!("{}\n", &line[1..]).into_bytes())
            })
            .collect();
        let old_len = lines
            .iter()
            .filter(|(role, _)| *role != Role::Insert)
            .count();
        let new_len = lines
            .iter()
            .filter(|(role, _)| *role != Role::Delete)
            .count();
        Hunk {
            old_start,
            old_len,
            new_start,
            new_len,
            lines,
        }
    }

    fn numbered(count: usize) -> String {
        (1..=count).map(|n| format!("{n}\n")).collect()
    }

    #[test]
    fn a_hunk_applies_where_it_says() {
        let text = numbered(6);
        let applied = apply(
            text.as_bytes(),
            &[hunk(2, 2, &[" 2", " 3", "-4", "+four", " 5", " 6"])],
            2,
        );
        assert_eq!(applied.text, b"1\n2\n3\nfour\n5\n6\n");
        assert_eq!(
            applied.placements,
            vec![Placement::Applied {
                line: 2,
                offset: 0,
                fuzz: 0
            }]
        );
    }

    #[test]
    fn a_moved_hunk_applies_with_its_offset() {
        let text = format!("new a\nnew b\nnew c\n{}", numbered(6));
        let applied = apply(
            text.as_bytes(),
            &[hunk(2, 2, &[" 2", " 3", "-4", "+four"])],
            0,
        );
        assert_eq!(
            applied.placements,
            vec![Placement::Applied {
                line: 5,
                offset: 3,
                fuzz: 0
            }]
        );
        assert!(
            String::from_utf8(applied.text)
                .unwrap()
                .contains("3\nfour\n5\n")
        );
    }

    #[test]
    fn changed_context_needs_fuzz() {
        let text = "1\nTWO\n3\n4\n5\n";
        let the_hunk = hunk(1, 1, &[" 1", " 2", " 3", "-4", "+four", " 5"]);
        assert_eq!(
            apply(text.as_bytes(), std::slice::from_ref(&the_hunk), 0).failures(),
            1
        );
        let applied = apply(text.as_bytes(), &[the_hunk], 2);
        assert_eq!(applied.failures(), 0);
        assert_eq!(applied.text, b"1\nTWO\n3\nfour\n5\n");
        assert!(matches!(
            applied.placements[0],
            Placement::Applied { fuzz: 2, .. }
        ));
    }

    #[test]
    fn a_hunk_that_is_nowhere_fails() {
        let text = numbered(5);
        let applied = apply(
            text.as_bytes(),
            &[hunk(2, 2, &[" 2", "-nothing like this", "+x", " 3"])],
            2,
        );
        assert_eq!(applied.placements, vec![Placement::Failed { line: 2 }]);
    }

    #[test]
    fn creation_and_reversal() {
        let create = hunk(0, 1, &["+a", "+b"]);
        let applied = apply(b"", std::slice::from_ref(&create), 2);
        assert_eq!(applied.text, b"a\nb\n");
        let undone = apply(&applied.text, &[create.reversed()], 2);
        assert_eq!(undone.text, b"");
        assert_eq!(undone.failures(), 0);
    }

    #[test]
    fn later_hunks_follow_earlier_ones() {
        let text = numbered(20);
        let applied = apply(
            text.as_bytes(),
            &[
                hunk(2, 2, &[" 2", "+2.5", " 3"]),
                hunk(15, 16, &[" 15", "-16", " 17"]),
            ],
            0,
        );
        assert_eq!(applied.failures(), 0);
        let result = String::from_utf8(applied.text).unwrap();
        assert!(result.starts_with("1\n2\n2.5\n3\n"));
        assert!(result.contains("15\n17\n"));
    }

    #[test]
    fn all_context_hunks_do_not_fuzz_into_anything() {
        let text = numbered(3);
        let applied = apply(text.as_bytes(), &[hunk(1, 1, &[" x", " y"])], 2);
        assert_eq!(applied.failures(), 1);
    }
}

//! The checks every tar member's name passes before extraction writes anything, done on the
//! name alone (the file system is looked at later, in `extract`): a member name must be relative
//! and free of `..`; a symbolic link's target must be relative, may climb with `..` only at its
//! start and no higher than the extraction directory; a hard link's target is a member name and
//! passes the member checks. These rules keep every created link pointing inside the extraction
//! directory, however the links chain: a target that only climbs at its start and then descends
//! can never pass through another link and climb again.

use std::fmt;

/// Why a member is not extracted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The member name is empty or names only the extraction directory itself.
    EmptyName,
    /// The member name starts with `/`.
    AbsoluteName,
    /// The member name has a `..` component.
    ParentInName,
    /// A symbolic link's target is empty.
    EmptyLinkTarget,
    /// A symbolic link's target starts with `/`.
    AbsoluteLinkTarget(String),
    /// A symbolic link's target climbs above the extraction directory.
    LinkTargetOutside(String),
    /// A symbolic link's target has `..` after a name (`a/../b`), which could climb back through
    /// another link.
    LinkTargetClimbsBack(String),
    /// A hard link's target is not a safe member name.
    HardLinkTarget(String, Box<Refusal>),
    /// The member lies below a link that this extraction refused.
    BelowRefusedLink(String),
    /// A directory on the member's path is a symbolic link; writing through it could leave the
    /// extraction directory.
    ThroughSymlink(String),
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::EmptyName => write!(f, "the member has no name to extract to"),
            Refusal::AbsoluteName => write!(
                f,
                "the name is absolute (members are extracted only inside the extraction directory)"
            ),
            Refusal::ParentInName => write!(
                f,
                "the name contains '..' (members are extracted only inside the extraction directory)"
            ),
            Refusal::EmptyLinkTarget => write!(f, "the symbolic link has an empty target"),
            Refusal::AbsoluteLinkTarget(target) => {
                write!(f, "symbolic link target '{target}' is absolute")
            }
            Refusal::LinkTargetOutside(target) => write!(
                f,
                "symbolic link target '{target}' leads outside the extraction directory"
            ),
            Refusal::LinkTargetClimbsBack(target) => write!(
                f,
                "symbolic link target '{target}' has '..' after a name, which could lead outside the extraction directory"
            ),
            Refusal::HardLinkTarget(target, reason) => {
                let reason = match reason.as_ref() {
                    Refusal::AbsoluteName => "is absolute".to_string(),
                    Refusal::ParentInName => "contains '..'".to_string(),
                    Refusal::EmptyName => "is empty".to_string(),
                    other => other.to_string(),
                };
                write!(f, "hard link target '{target}' {reason}")
            }
            Refusal::BelowRefusedLink(link) => {
                write!(f, "it lies below '{link}', a link that was refused")
            }
            Refusal::ThroughSymlink(link) => write!(
                f,
                "'{link}' is a symbolic link, and extracting through it could write outside the extraction directory"
            ),
        }
    }
}

/// The components of a member name that extraction may write to, with `.` and empty
/// components dropped; refused when the name is absolute, has `..`, or names nothing.
pub fn member_components(name: &str) -> Result<Vec<&str>, Refusal> {
    if name.starts_with('/') {
        return Err(Refusal::AbsoluteName);
    }
    let components: Vec<&str> = name
        .split('/')
        .filter(|part| !part.is_empty() && *part != ".")
        .collect();
    if components.contains(&"..") {
        return Err(Refusal::ParentInName);
    }
    if components.is_empty() {
        return Err(Refusal::EmptyName);
    }
    Ok(components)
}

/// Checks a symbolic link target for a link at `link` (its components below the extraction
/// directory): relative, `..` only as a leading run, and no more of them than the link's
/// directory is deep.
pub fn check_symlink_target(link: &[&str], target: &str) -> Result<(), Refusal> {
    if target.is_empty() {
        return Err(Refusal::EmptyLinkTarget);
    }
    if target.starts_with('/') {
        return Err(Refusal::AbsoluteLinkTarget(target.to_string()));
    }
    let mut leading_parents = 0usize;
    let mut seen_name = false;
    for part in target
        .split('/')
        .filter(|part| !part.is_empty() && *part != ".")
    {
        if part == ".." {
            if seen_name {
                return Err(Refusal::LinkTargetClimbsBack(target.to_string()));
            }
            leading_parents += 1;
        } else {
            seen_name = true;
        }
    }
    let link_directory_depth = link.len().saturating_sub(1);
    if leading_parents > link_directory_depth {
        return Err(Refusal::LinkTargetOutside(target.to_string()));
    }
    Ok(())
}

/// The components of a hard link's target, which names an earlier member: the member checks
/// apply, reported as the target's fault.
pub fn hard_link_components(target: &str) -> Result<Vec<&str>, Refusal> {
    member_components(target)
        .map_err(|reason| Refusal::HardLinkTarget(target.to_string(), Box::new(reason)))
}

/// `components` with the first `count` removed (`--strip-components`); `None` when nothing is
/// left, and the member is then skipped.
pub fn strip_components<'a>(components: &[&'a str], count: usize) -> Option<Vec<&'a str>> {
    (components.len() > count).then(|| components[count..].to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names_split_into_components() {
        assert_eq!(member_components("a/b/c.txt"), Ok(vec!["a", "b", "c.txt"]));
        assert_eq!(member_components("./a//b/"), Ok(vec!["a", "b"]));
        assert_eq!(member_components("dir/"), Ok(vec!["dir"]));
        assert_eq!(member_components("..a/b..c"), Ok(vec!["..a", "b..c"]));
    }

    #[test]
    fn absolute_and_climbing_names_are_refused() {
        assert_eq!(member_components("/etc/passwd"), Err(Refusal::AbsoluteName));
        assert_eq!(member_components("//x"), Err(Refusal::AbsoluteName));
        assert_eq!(member_components("../evil"), Err(Refusal::ParentInName));
        assert_eq!(
            member_components("a/../../evil"),
            Err(Refusal::ParentInName)
        );
        assert_eq!(member_components("a/.."), Err(Refusal::ParentInName));
        assert_eq!(member_components("./.."), Err(Refusal::ParentInName));
        assert_eq!(member_components(""), Err(Refusal::EmptyName));
        assert_eq!(member_components("./"), Err(Refusal::EmptyName));
    }

    #[test]
    fn symlink_targets_stay_inside() {
        assert_eq!(check_symlink_target(&["link"], "file"), Ok(()));
        assert_eq!(check_symlink_target(&["a", "link"], "../b/c"), Ok(()));
        assert_eq!(check_symlink_target(&["a", "b", "link"], "../../c"), Ok(()));
        assert_eq!(check_symlink_target(&["link"], "./x/./y"), Ok(()));
        assert_eq!(
            check_symlink_target(&["link"], "/etc"),
            Err(Refusal::AbsoluteLinkTarget("/etc".into()))
        );
        assert_eq!(
            check_symlink_target(&["up"], ".."),
            Err(Refusal::LinkTargetOutside("..".into()))
        );
        assert_eq!(
            check_symlink_target(&["a", "link"], "../../x"),
            Err(Refusal::LinkTargetOutside("../../x".into()))
        );
        // `d/l -> ..` is inside, but `m -> d/l/..` would then lead out: `..` after a name is
        // refused whatever it seems to resolve to.
        assert_eq!(check_symlink_target(&["d", "l"], ".."), Ok(()));
        assert_eq!(
            check_symlink_target(&["m"], "d/l/.."),
            Err(Refusal::LinkTargetClimbsBack("d/l/..".into()))
        );
        assert_eq!(
            check_symlink_target(&["x"], ""),
            Err(Refusal::EmptyLinkTarget)
        );
    }

    #[test]
    fn hard_link_targets_are_member_names() {
        assert_eq!(hard_link_components("a/b"), Ok(vec!["a", "b"]));
        let refusal = hard_link_components("/etc/passwd").unwrap_err();
        assert_eq!(
            refusal.to_string(),
            "hard link target '/etc/passwd' is absolute"
        );
        let refusal = hard_link_components("x/../../y").unwrap_err();
        assert_eq!(
            refusal.to_string(),
            "hard link target 'x/../../y' contains '..'"
        );
    }

    #[test]
    fn stripping_components_skips_short_names() {
        assert_eq!(strip_components(&["a", "b", "c"], 1), Some(vec!["b", "c"]));
        assert_eq!(strip_components(&["a", "b"], 0), Some(vec!["a", "b"]));
        assert_eq!(strip_components(&["a"], 1), None);
        assert_eq!(strip_components(&["a"], 5), None);
    }
}

//! Environment grants: the host environment variables one component may read, by name and value.
//! A component's environment is empty unless a grant names variables here; the values are taken
//! from the host when the grant is made and never printed (`Debug` and [`EnvGrant::describe`]
//! show names only). Deciding *which* names may be granted — the operator's list, the refusal of
//! secrets — is the plugin layer's job (`plugin.rs`); this type only carries the result.

use std::fmt;

/// Names the sandbox sets itself; a grant may not override them.
pub const RESERVED_NAMES: &[&str] = &[
    "CLAWCAGE_WORKSPACE",
    "CLAWCAGE_WORKSPACE_MODE",
    "CLAWCAGE_TIME_LIMIT_MS",
    "PWD",
];

/// Host environment variables granted to a component: unique names, sorted, with their values.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct EnvGrant {
    vars: Vec<(String, String)>,
}

/// Why a variable cannot be granted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    /// Not a usable variable name.
    #[error(
        "{0:?} is not a valid environment variable name; use letters, digits and `_`, not starting with a digit"
    )]
    InvalidName(String),
    /// A name the sandbox sets itself.
    #[error("{0} is set by the sandbox itself and cannot be granted")]
    Reserved(String),
}

impl fmt::Debug for EnvGrant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.names()).finish()
    }
}

impl EnvGrant {
    /// No variables.
    pub fn none() -> Self {
        Self::default()
    }

    /// A grant of exactly these variables. Names must be valid and not reserved; a name given
    /// twice keeps its last value.
    pub fn new<N, V>(vars: impl IntoIterator<Item = (N, V)>) -> Result<Self, EnvError>
    where
        N: Into<String>,
        V: Into<String>,
    {
        let mut checked: Vec<(String, String)> = Vec::new();
        for (name, value) in vars {
            let name = name.into();
            check_name(&name)?;
            checked.retain(|(existing, _)| existing != &name);
            checked.push((name, value.into()));
        }
        checked.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(Self { vars: checked })
    }

    /// The granted names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.vars.iter().map(|(name, _)| name.as_str())
    }

    /// The granted variables with their values, sorted by name.
    pub fn vars(&self) -> &[(String, String)] {
        &self.vars
    }

    /// Whether nothing is granted.
    pub fn is_empty(&self) -> bool {
        self.vars.is_empty()
    }

    /// The variables both grants give with the same value: a child never sees a variable, or a
    /// value, its parent did not grant.
    pub fn narrowed_by(&self, other: &EnvGrant) -> EnvGrant {
        EnvGrant {
            vars: self
                .vars
                .iter()
                .filter(|pair| other.vars.contains(pair))
                .cloned()
                .collect(),
        }
    }

    /// `env A, B` or `no env`, names only.
    pub fn describe(&self) -> String {
        if self.vars.is_empty() {
            "no env".to_string()
        } else {
            format!("env {}", self.names().collect::<Vec<_>>().join(", "))
        }
    }
}

/// Refuses names that are empty, contain anything but ASCII letters, digits and `_`, start with a
/// digit, or are reserved for the sandbox.
pub fn check_name(name: &str) -> Result<(), EnvError> {
    let valid = !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        return Err(EnvError::InvalidName(name.to_string()));
    }
    if RESERVED_NAMES.contains(&name) {
        return Err(EnvError::Reserved(name.to_string()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_and_values_never_printed() {
        let grant = EnvGrant::new([("LANG", "C.UTF-8"), ("TZ", "hidden-value")]).unwrap();
        assert_eq!(grant.names().collect::<Vec<_>>(), ["LANG", "TZ"]);
        assert_eq!(grant.describe(), "env LANG, TZ");
        let debug = format!("{grant:?}");
        assert!(!debug.contains("hidden-value"), "{debug}");
        for bad in ["", "1ABC", "A=B", "A B", "A\0"] {
            assert!(matches!(
                EnvGrant::new([(bad, "x")]),
                Err(EnvError::InvalidName(_))
            ));
        }
        assert!(matches!(
            EnvGrant::new([("PWD", "/")]),
            Err(EnvError::Reserved(_))
        ));
    }

    #[test]
    fn narrowing_keeps_only_what_both_grant_with_the_same_value() {
        let parent = EnvGrant::new([("A", "1"), ("B", "2"), ("C", "3")]).unwrap();
        let child = EnvGrant::new([("B", "2"), ("C", "other"), ("D", "4")]).unwrap();
        let narrowed = parent.narrowed_by(&child);
        assert_eq!(narrowed.vars(), [("B".to_string(), "2".to_string())]);
        assert!(parent.narrowed_by(&EnvGrant::none()).is_empty());
    }
}

//! Word expansion: a simple command's words and assignments, parameters (`$X`, `${X:-word}`,
//! `${X#pattern}`, ...), tilde, quoting (`'...'`, `"..."`, `$'...'`), command substitution,
//! `$((...))`, then field splitting of unquoted results and globbing. The parts that need no
//! shell state are free functions (`split_fields`, `remove_affix`, `tilde`, `ansi_c`).

use brush_parser::ast;
use brush_parser::word::{
    Parameter, ParameterExpr, ParameterTestType, SpecialParameter, TildeExpr, WordPiece,
};

use super::parse::{check_supported, parse, unsupported};
use super::{Flow, Io, MAX_DEPTH, Prepared, Shell, Sink, Stdin, Stop, arithmetic};
use crate::glob::{self, PatternChar};

impl Shell<'_> {
    /// Expands a simple command's words, assignments and redirection list.
    pub(super) fn prepare(&mut self, simple: &ast::SimpleCommand) -> Flow<Prepared> {
        let mut assignments = Vec::new();
        let mut redirects = Vec::new();
        let mut words: Vec<&str> = Vec::new();
        for item in simple.prefix.iter().flat_map(|prefix| prefix.0.iter()) {
            match item {
                ast::CommandPrefixOrSuffixItem::AssignmentWord(assignment, _) => {
                    let name = match &assignment.name {
                        ast::AssignmentName::VariableName(name) => name.clone(),
                        ast::AssignmentName::ArrayElementName(..) => {
                            return Err(Stop::Refused(unsupported("arrays")));
                        }
                    };
                    let value = match &assignment.value {
                        ast::AssignmentValue::Scalar(word) => self.expand_single(&word.value)?,
                        ast::AssignmentValue::Array(_) => {
                            return Err(Stop::Refused(unsupported("arrays")));
                        }
                    };
                    let value = if assignment.append {
                        self.var(&name).unwrap_or_default() + &value
                    } else {
                        value
                    };
                    assignments.push((name, value));
                }
                ast::CommandPrefixOrSuffixItem::IoRedirect(redirect) => {
                    redirects.push(redirect.clone());
                }
                ast::CommandPrefixOrSuffixItem::Word(word) => words.push(&word.value),
                ast::CommandPrefixOrSuffixItem::ProcessSubstitution(..) => {
                    return Err(Stop::Refused(unsupported("process substitution <(...)")));
                }
            }
        }
        if let Some(name) = &simple.word_or_name {
            words.push(&name.value);
        }
        for item in simple.suffix.iter().flat_map(|suffix| suffix.0.iter()) {
            match item {
                ast::CommandPrefixOrSuffixItem::IoRedirect(redirect) => {
                    redirects.push(redirect.clone());
                }
                ast::CommandPrefixOrSuffixItem::Word(word)
                | ast::CommandPrefixOrSuffixItem::AssignmentWord(_, word) => {
                    words.push(&word.value)
                }
                ast::CommandPrefixOrSuffixItem::ProcessSubstitution(..) => {
                    return Err(Stop::Refused(unsupported("process substitution <(...)")));
                }
            }
        }
        let mut argv = Vec::new();
        for word in words {
            argv.extend(self.expand_fields(word)?);
        }
        Ok(Prepared {
            argv,
            assignments,
            redirects,
        })
    }

    /// Expands `word` into fields: parameters, command substitution, arithmetic, then field
    /// splitting of unquoted results and globbing.
    pub(super) fn expand_fields(&mut self, word: &str) -> Flow<Vec<String>> {
        let fields = split_fields(self.pieces(word)?);
        let mut result = Vec::new();
        for chars in fields {
            if glob::has_wildcards(&chars) {
                let matches = glob::expand(&chars, &self.cwd);
                if !matches.is_empty() {
                    result.extend(matches);
                    continue;
                }
            }
            result.push(chars.iter().map(|pc| pc.c).collect());
        }
        Ok(result)
    }

    /// Expands `word` into one string (no splitting, no globbing).
    pub(super) fn expand_single(&mut self, word: &str) -> Flow<String> {
        let pieces = self.pieces(word)?;
        Ok(pieces
            .into_iter()
            .map(|piece| match piece {
                Piece::Literal(text) | Piece::Quoted(text) | Piece::Split(text) => text,
            })
            .collect())
    }

    /// Expands `word` as a pattern (`case`): quoted parts match literally.
    pub(super) fn expand_pattern(&mut self, word: &str) -> Flow<Vec<PatternChar>> {
        let pieces = self.pieces(word)?;
        let mut chars = Vec::new();
        for piece in pieces {
            match piece {
                Piece::Literal(text) => chars.extend(glob::unquoted(&text)),
                Piece::Quoted(text) | Piece::Split(text) => {
                    chars.extend(text.chars().map(|c| PatternChar { c, literal: true }))
                }
            }
        }
        Ok(chars)
    }

    pub(super) fn expand_heredoc(&mut self, text: &str) -> Flow<String> {
        let options = brush_parser::ParserOptions::default();
        let pieces = brush_parser::word::parse_heredoc(text, &options)
            .map_err(|error| Stop::Refused(format!("cannot expand the here-document: {error}")))?;
        let mut out = Vec::new();
        for piece in pieces {
            self.piece(piece.piece, true, &mut out)?;
        }
        Ok(out
            .into_iter()
            .map(|piece| match piece {
                Piece::Literal(text) | Piece::Quoted(text) | Piece::Split(text) => text,
            })
            .collect())
    }

    fn pieces(&mut self, word: &str) -> Flow<Vec<Piece>> {
        let options = brush_parser::ParserOptions::default();
        let parsed = brush_parser::word::parse(word, &options)
            .map_err(|error| Stop::Refused(format!("cannot expand `{word}`: {error}")))?;
        let mut out = Vec::new();
        for piece in parsed {
            self.piece(piece.piece, false, &mut out)?;
        }
        Ok(out)
    }

    fn piece(&mut self, piece: WordPiece, quoted: bool, out: &mut Vec<Piece>) -> Flow<()> {
        let wrap = |text: String, split: bool| {
            if quoted {
                Piece::Quoted(text)
            } else if split {
                Piece::Split(text)
            } else {
                Piece::Literal(text)
            }
        };
        match piece {
            WordPiece::Text(text) => out.push(if quoted {
                Piece::Quoted(text)
            } else {
                Piece::Literal(text)
            }),
            WordPiece::SingleQuotedText(text) => out.push(Piece::Quoted(text)),
            WordPiece::AnsiCQuotedText(text) => out.push(Piece::Quoted(ansi_c(&text))),
            WordPiece::EscapeSequence(text) => {
                let unescaped = text.strip_prefix('\\').unwrap_or(&text).to_string();
                let unescaped = if unescaped == "\n" {
                    String::new()
                } else {
                    unescaped
                };
                out.push(Piece::Quoted(unescaped));
            }
            WordPiece::DoubleQuotedSequence(inner)
            | WordPiece::GettextDoubleQuotedSequence(inner) => {
                out.push(Piece::Quoted(String::new()));
                for piece in inner {
                    self.piece(piece.piece, true, out)?;
                }
            }
            WordPiece::TildeExpansion(expr) => {
                let text = tilde(expr, |name| self.var(name), &self.cwd).map_err(Stop::Refused)?;
                out.push(Piece::Quoted(text));
            }
            WordPiece::ParameterExpansion(expr) => {
                let text = self.parameter_expression(expr)?;
                out.push(wrap(text, true));
            }
            WordPiece::CommandSubstitution(script)
            | WordPiece::BackquotedCommandSubstitution(script) => {
                let text = self.command_substitution(&script)?;
                out.push(wrap(text, true));
            }
            WordPiece::ArithmeticExpression(expr) => {
                let expanded = self.expand_single(&expr.value)?;
                let value = match arithmetic::evaluate(&expanded, &|name| self.var(name)) {
                    Ok(value) => value,
                    Err(arithmetic::Error::Syntax(error)) => {
                        return Err(Stop::Refused(format!(
                            "bad arithmetic expression `{}`: {error}",
                            expr.value
                        )));
                    }
                    Err(arithmetic::Error::Refused(message)) => return Err(Stop::Refused(message)),
                };
                out.push(wrap(value.to_string(), true));
            }
        }
        Ok(())
    }

    fn command_substitution(&mut self, script: &str) -> Flow<String> {
        if self.depth >= MAX_DEPTH {
            return Err(Stop::Refused(
                "command substitutions are nested too deeply".to_string(),
            ));
        }
        let program = parse(script).map_err(Stop::Refused)?;
        check_supported(&program).map_err(Stop::Refused)?;
        self.captures.push(Vec::new());
        let level = self.captures.len() - 1;
        let saved = (self.vars.clone(), self.cwd.clone());
        self.depth += 1;
        let io = Io {
            stdin: Stdin::None,
            stdout: Sink::Capture(level),
            stderr: Sink::Main,
        };
        let result = self.run_program(&program, &io);
        self.depth -= 1;
        (self.vars, self.cwd) = saved;
        let captured = self.captures.pop().unwrap_or_default();
        match result {
            Ok(_) | Err(Stop::Exit(_)) => {}
            Err(other) => return Err(other),
        }
        let mut text = String::from_utf8_lossy(&captured).into_owned();
        while text.ends_with('\n') {
            text.pop();
        }
        Ok(text)
    }

    fn parameter(&self, parameter: &Parameter) -> Flow<Option<String>> {
        Ok(match parameter {
            Parameter::Named(name) => self.var(name),
            Parameter::Positional(index) => self.positional.get(*index as usize).cloned(),
            Parameter::Special(special) => Some(match special {
                SpecialParameter::LastExitStatus => self.status.to_string(),
                SpecialParameter::PositionalParameterCount => {
                    (self.positional.len().saturating_sub(1)).to_string()
                }
                SpecialParameter::AllPositionalParameters { .. } => self
                    .positional
                    .iter()
                    .skip(1)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(" "),
                SpecialParameter::ProcessId => "1".to_string(),
                SpecialParameter::ShellName => self.positional.first().cloned().unwrap_or_default(),
                SpecialParameter::CurrentOptionFlags => String::new(),
                SpecialParameter::LastBackgroundProcessId => String::new(),
            }),
            Parameter::NamedWithIndex { .. } | Parameter::NamedWithAllIndices { .. } => {
                return Err(Stop::Refused(unsupported("arrays")));
            }
        })
    }

    fn parameter_name(parameter: &Parameter) -> String {
        match parameter {
            Parameter::Named(name) => name.clone(),
            other => other.to_string(),
        }
    }

    fn parameter_expression(&mut self, expr: ParameterExpr) -> Flow<String> {
        match expr {
            ParameterExpr::Parameter {
                parameter,
                indirect: false,
            } => {
                let value = self.parameter(&parameter)?;
                if value.is_none() && self.nounset && matches!(parameter, Parameter::Named(_)) {
                    self.error(&format!(
                        "{}: unbound variable",
                        Self::parameter_name(&parameter)
                    ));
                    return Err(Stop::Exit(1));
                }
                Ok(value.unwrap_or_default())
            }
            ParameterExpr::UseDefaultValues {
                parameter,
                indirect: false,
                test_type,
                default_value,
            } => {
                let value = self.parameter(&parameter)?;
                if unset_or_null(&value, &test_type) {
                    self.expand_single(&default_value.unwrap_or_default())
                } else {
                    Ok(value.unwrap_or_default())
                }
            }
            ParameterExpr::AssignDefaultValues {
                parameter,
                indirect: false,
                test_type,
                default_value,
            } => {
                let value = self.parameter(&parameter)?;
                if unset_or_null(&value, &test_type) {
                    let new = self.expand_single(&default_value.unwrap_or_default())?;
                    if let Parameter::Named(name) = &parameter {
                        self.set_var(name, new.clone());
                    }
                    Ok(new)
                } else {
                    Ok(value.unwrap_or_default())
                }
            }
            ParameterExpr::UseAlternativeValue {
                parameter,
                indirect: false,
                test_type,
                alternative_value,
            } => {
                let value = self.parameter(&parameter)?;
                if unset_or_null(&value, &test_type) {
                    Ok(String::new())
                } else {
                    self.expand_single(&alternative_value.unwrap_or_default())
                }
            }
            ParameterExpr::IndicateErrorIfNullOrUnset {
                parameter,
                indirect: false,
                test_type,
                error_message,
            } => {
                let value = self.parameter(&parameter)?;
                if unset_or_null(&value, &test_type) {
                    let message = self.expand_single(
                        &error_message.unwrap_or_else(|| "parameter null or not set".to_string()),
                    )?;
                    self.error(&format!("{}: {message}", Self::parameter_name(&parameter)));
                    return Err(Stop::Exit(1));
                }
                Ok(value.unwrap_or_default())
            }
            ParameterExpr::ParameterLength {
                parameter,
                indirect: false,
            } => Ok(self
                .parameter(&parameter)?
                .unwrap_or_default()
                .chars()
                .count()
                .to_string()),
            ParameterExpr::RemoveSmallestSuffixPattern {
                parameter,
                indirect: false,
                pattern,
            } => self.remove_pattern(&parameter, pattern, true, false),
            ParameterExpr::RemoveLargestSuffixPattern {
                parameter,
                indirect: false,
                pattern,
            } => self.remove_pattern(&parameter, pattern, true, true),
            ParameterExpr::RemoveSmallestPrefixPattern {
                parameter,
                indirect: false,
                pattern,
            } => self.remove_pattern(&parameter, pattern, false, false),
            ParameterExpr::RemoveLargestPrefixPattern {
                parameter,
                indirect: false,
                pattern,
            } => self.remove_pattern(&parameter, pattern, false, true),
            _ => Err(Stop::Refused(unsupported("this form of ${...} expansion"))),
        }
    }

    /// `${X%PATTERN}`, `${X%%PATTERN}`, `${X#PATTERN}`, `${X##PATTERN}`.
    fn remove_pattern(
        &mut self,
        parameter: &Parameter,
        pattern: Option<String>,
        suffix: bool,
        largest: bool,
    ) -> Flow<String> {
        let value = self.parameter(parameter)?.unwrap_or_default();
        let pattern = self.expand_pattern(&pattern.unwrap_or_default())?;
        Ok(remove_affix(&value, &pattern, suffix, largest))
    }
}

/// Expansion results before splitting: literal text, quoted text, and unquoted expansion
/// results (split on whitespace).
enum Piece {
    Literal(String),
    Quoted(String),
    Split(String),
}

/// The text of `$'...'` with its escapes `\n`, `\t`, `\'` and `\\` replaced.
fn ansi_c(text: &str) -> String {
    unescape(text, |c| match c {
        'n' => Some('\n'),
        't' => Some('\t'),
        '\'' => Some('\''),
        '\\' => Some('\\'),
        _ => None,
    })
}

/// `text` with each backslash escape that `escape` knows (the character after the backslash)
/// replaced, left to right, so an escaped backslash never starts another escape (`\\n` is a
/// backslash and an `n`); an unknown escape stays as written.
pub(super) fn unescape(text: &str, escape: impl Fn(char) -> Option<char>) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, chars.peek().copied().and_then(&escape)) {
            ('\\', Some(replaced)) => {
                out.push(replaced);
                chars.next();
            }
            _ => out.push(c),
        }
    }
    out
}

/// Splits expansion results into fields: unquoted expansion results split on blanks (space,
/// tab, newline), literal and quoted text never; a quoted empty string still makes a field.
/// Literal text keeps its wildcards, everything else matches literally.
fn split_fields(pieces: Vec<Piece>) -> Vec<Vec<PatternChar>> {
    let mut fields = Vec::new();
    let mut current: Vec<PatternChar> = Vec::new();
    let mut quoted_any = false;
    let mut started = false;
    for piece in pieces {
        match piece {
            Piece::Literal(text) => {
                current.extend(text.chars().map(|c| PatternChar { c, literal: false }));
                started = true;
            }
            Piece::Quoted(text) => {
                current.extend(text.chars().map(|c| PatternChar { c, literal: true }));
                quoted_any = true;
                started = true;
            }
            Piece::Split(text) => {
                for c in text.chars() {
                    if c == ' ' || c == '\t' || c == '\n' {
                        if !current.is_empty() || quoted_any {
                            fields.push(std::mem::take(&mut current));
                            quoted_any = false;
                        }
                        started = false;
                    } else {
                        current.push(PatternChar { c, literal: true });
                        started = true;
                    }
                }
            }
        }
    }
    if started || !current.is_empty() || quoted_any {
        fields.push(current);
    }
    fields
}

/// Whether `${X:-...}` (`UnsetOrNull`) or `${X-...}` (`Unset`) takes the alternative branch.
fn unset_or_null(value: &Option<String>, test: &ParameterTestType) -> bool {
    match test {
        ParameterTestType::UnsetOrNull => value.as_deref().is_none_or(str::is_empty),
        ParameterTestType::Unset => value.is_none(),
    }
}

/// `value` without the shortest or longest (`largest`) suffix or prefix that matches `pattern`:
/// `${X%P}`, `${X%%P}`, `${X#P}`, `${X##P}`. Unchanged when nothing matches.
fn remove_affix(value: &str, pattern: &[PatternChar], suffix: bool, largest: bool) -> String {
    let chars: Vec<char> = value.chars().collect();
    let count = chars.len();
    let ascending: Vec<usize> = (0..=count).collect();
    let descending: Vec<usize> = (0..=count).rev().collect();
    if suffix {
        for &start in if largest { &ascending } else { &descending } {
            let tail: String = chars[start..].iter().collect();
            if glob::matches(pattern, &tail) {
                return chars[..start].iter().collect();
            }
        }
    } else {
        for &end in if largest { &descending } else { &ascending } {
            let head: String = chars[..end].iter().collect();
            if glob::matches(pattern, &head) {
                return chars[end..].iter().collect();
            }
        }
    }
    value.to_string()
}

/// A tilde prefix: `~` is `$HOME` (a literal `~` without one), `~+` the working directory `cwd`,
/// `~-` `$OLDPWD`; `~user` stays as written. The directory stack (`~N`) is refused.
fn tilde(
    expr: TildeExpr,
    var: impl Fn(&str) -> Option<String>,
    cwd: &str,
) -> Result<String, String> {
    Ok(match expr {
        TildeExpr::Home => var("HOME").unwrap_or_else(|| "~".to_string()),
        TildeExpr::WorkingDir => cwd.to_string(),
        TildeExpr::OldWorkingDir => var("OLDPWD").unwrap_or_default(),
        TildeExpr::UserHome(user) => format!("~{user}"),
        _ => return Err(unsupported("the directory stack (~N)")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(fields: Vec<Vec<PatternChar>>) -> Vec<String> {
        fields
            .iter()
            .map(|field| field.iter().map(|pc| pc.c).collect())
            .collect()
    }

    #[test]
    fn splitting_splits_only_expansion_results() {
        let pieces = vec![
            Piece::Literal("a b".to_string()),
            Piece::Split(" x\ty\n".to_string()),
            Piece::Quoted(" q ".to_string()),
        ];
        assert_eq!(text(split_fields(pieces)), ["a b", "x", "y", " q "]);
        assert_eq!(
            text(split_fields(vec![Piece::Split("   ".to_string())])),
            Vec::<String>::new()
        );
        assert_eq!(text(split_fields(vec![Piece::Quoted(String::new())])), [""]);
        assert_eq!(
            text(split_fields(vec![
                Piece::Split("1 ".to_string()),
                Piece::Literal("z".to_string()),
            ])),
            ["1", "z"]
        );
        assert!(split_fields(Vec::new()).is_empty());
    }

    #[test]
    fn only_literal_text_keeps_wildcards() {
        let fields = split_fields(vec![
            Piece::Literal("*".to_string()),
            Piece::Quoted("*".to_string()),
            Piece::Split("*".to_string()),
        ]);
        let literal: Vec<bool> = fields[0].iter().map(|pc| pc.literal).collect();
        assert_eq!(literal, [false, true, true]);
    }

    #[test]
    fn affix_removal_takes_the_shortest_or_longest_match() {
        let star_dot = glob::unquoted("*.");
        assert_eq!(
            remove_affix("a.b.c", &glob::unquoted(".*"), true, false),
            "a.b"
        );
        assert_eq!(
            remove_affix("a.b.c", &glob::unquoted(".*"), true, true),
            "a"
        );
        assert_eq!(remove_affix("a.b.c", &star_dot, false, false), "b.c");
        assert_eq!(remove_affix("a.b.c", &star_dot, false, true), "c");
        assert_eq!(remove_affix("abc", &glob::unquoted("x"), true, true), "abc");
        assert_eq!(remove_affix("", &glob::unquoted("*"), true, true), "");
        assert_eq!(remove_affix("abc", &glob::unquoted(""), false, true), "abc");
        assert_eq!(
            remove_affix("abc", &glob::unquoted("*"), false, false),
            "abc"
        );
        assert_eq!(remove_affix("abc", &glob::unquoted("*"), false, true), "");
        assert_eq!(
            remove_affix("ééx", &glob::unquoted("é"), false, false),
            "éx"
        );
    }

    #[test]
    fn unset_or_null_tests() {
        use ParameterTestType::{Unset, UnsetOrNull};
        assert!(unset_or_null(&None, &UnsetOrNull));
        assert!(unset_or_null(&Some(String::new()), &UnsetOrNull));
        assert!(!unset_or_null(&Some("x".to_string()), &UnsetOrNull));
        assert!(unset_or_null(&None, &Unset));
        assert!(!unset_or_null(&Some(String::new()), &Unset));
    }

    #[test]
    fn tilde_prefixes() {
        let var = |name: &str| match name {
            "HOME" => Some("/home/me".to_string()),
            _ => None,
        };
        assert_eq!(
            tilde(TildeExpr::Home, var, "/ws"),
            Ok("/home/me".to_string())
        );
        assert_eq!(tilde(TildeExpr::Home, |_| None, "/ws"), Ok("~".to_string()));
        assert_eq!(
            tilde(TildeExpr::WorkingDir, var, "/ws"),
            Ok("/ws".to_string())
        );
        assert_eq!(
            tilde(TildeExpr::OldWorkingDir, var, "/ws"),
            Ok(String::new())
        );
        assert_eq!(
            tilde(TildeExpr::UserHome("bob".to_string()), var, "/ws"),
            Ok("~bob".to_string())
        );
    }

    #[test]
    fn ansi_c_escapes_are_read_left_to_right() {
        assert_eq!(ansi_c("a\\nb\\tc"), "a\nb\tc");
        assert_eq!(ansi_c("it\\'s"), "it's");
        assert_eq!(ansi_c("\\\\n"), "\\n");
        assert_eq!(ansi_c("\\\\\\\\"), "\\\\");
        assert_eq!(ansi_c("\\q\\"), "\\q\\");
        assert_eq!(ansi_c(""), "");
    }
}

//! Parsing a command line with brush-parser, and refusing, before anything runs, the syntax this
//! shell does not support (background jobs, functions, coprocesses, `(( ))` commands) and text
//! nested so deeply — brackets, or compound commands (`if`, `while`, `until`, `for`, `case`) —
//! that brush-parser's recursion would overflow the stack.

use brush_parser::ast;

/// The message refusing `what` (a plural: "arrays", "coprocesses").
pub(super) fn unsupported(what: &str) -> String {
    format!("{what} are not supported by this shell")
}

/// The deepest nesting a command line may have. brush-parser recurses once or more for each
/// level of `(...)`, `{ ...; }`, `$(...)`, `${...}`, `$((...))` and of the compound commands
/// `if`, `while`, `until`, `for` and `case`, and some levels take kilobytes of stack (a brace
/// group about six in a release build): a hundred or so could overflow the WebAssembly stack,
/// which would end the tool with a trap instead of a message. Real command lines stay far below
/// this.
const MAX_NESTING: usize = 32;

/// Refuses `command` when it nests more deeply than brush-parser can parse safely (the planner
/// parses with it too).
pub(crate) fn check_nesting(command: &str) -> Result<(), String> {
    let nesting = nesting(command);
    if nesting > MAX_NESTING {
        return Err(format!(
            "the command line is nested too deeply ({nesting} levels of brackets and compound commands; at most {MAX_NESTING}); write it flatter"
        ));
    }
    Ok(())
}

/// Parses a command line.
pub(super) fn parse(command: &str) -> Result<ast::Program, String> {
    check_nesting(command)?;
    let options = brush_parser::ParserOptions::default();
    let mut parser = brush_parser::Parser::new(std::io::Cursor::new(command.as_bytes()), &options);
    parser
        .parse_program()
        .map_err(|error| format!("syntax error: {error}; check the quoting and the command line"))
}

/// An upper bound of how deeply `text` nests: the most brackets (`(`, `{`, `[`) and compound
/// commands (`if`, `while`, `until`, `for`, `select` and `case` in a command's place, closed by
/// `fi`, `done`, `esac`) open at once, counted without regard to quoting (a closer with nothing
/// of its kind open counts for nothing; the `)` ending a `case` pattern closes nothing).
fn nesting(text: &str) -> usize {
    /// What is open.
    #[derive(Clone, Copy, PartialEq, Eq)]
    enum Open {
        Bracket,
        Compound,
        Case,
    }
    let mut open: Vec<Open> = Vec::new();
    let mut deepest = 0;
    // Whether the next word stands where a command starts (where a keyword is a keyword).
    let mut command_place = true;
    let mut word = String::new();
    let end_word = |word: &mut String, command_place: &mut bool, open: &mut Vec<Open>| {
        if word.is_empty() || !*command_place {
            word.clear();
            return;
        }
        match word.as_str() {
            "if" | "while" | "until" | "for" | "select" => {
                open.push(Open::Compound);
                // A condition is a command; a loop variable is not.
                *command_place = matches!(word.as_str(), "if" | "while" | "until");
            }
            "case" => {
                open.push(Open::Case);
                *command_place = false;
            }
            "fi" | "done" => {
                if open.last() == Some(&Open::Compound) {
                    open.pop();
                }
                *command_place = false;
            }
            "esac" => {
                if open.last() == Some(&Open::Case) {
                    open.pop();
                }
                *command_place = false;
            }
            "then" | "do" | "else" | "elif" | "!" | "time" => *command_place = true,
            _ => *command_place = false,
        }
        word.clear();
    };
    for c in text.chars() {
        match c {
            '(' | '{' | '[' => {
                end_word(&mut word, &mut command_place, &mut open);
                open.push(Open::Bracket);
                command_place = true;
            }
            ')' | '}' | ']' => {
                end_word(&mut word, &mut command_place, &mut open);
                // A `case` pattern's `)` closes nothing; a command follows it.
                if open.last() == Some(&Open::Bracket) {
                    open.pop();
                }
                command_place = true;
            }
            ';' | '&' | '|' | '\n' => {
                end_word(&mut word, &mut command_place, &mut open);
                command_place = true;
            }
            c if c.is_whitespace() => end_word(&mut word, &mut command_place, &mut open),
            c => word.push(c),
        }
        deepest = deepest.max(open.len());
    }
    end_word(&mut word, &mut command_place, &mut open);
    deepest.max(open.len())
}

/// Refuses, before anything runs, syntax this shell does not support: background jobs,
/// functions, coprocesses.
pub(super) fn check_supported(program: &ast::Program) -> Result<(), String> {
    fn list(list: &ast::CompoundList) -> Result<(), String> {
        for ast::CompoundListItem(and_or, separator) in &list.0 {
            if matches!(separator, ast::SeparatorOperator::Async) {
                return Err(
                    "background jobs (`&`) are not supported by this shell: commands run one after another; remove the `&`"
                        .to_string(),
                );
            }
            pipeline(&and_or.first)?;
            for next in &and_or.additional {
                match next {
                    ast::AndOr::And(p) | ast::AndOr::Or(p) => pipeline(p)?,
                }
            }
        }
        Ok(())
    }
    fn pipeline(pipeline: &ast::Pipeline) -> Result<(), String> {
        for command in &pipeline.seq {
            match command {
                ast::Command::Function(_) => {
                    return Err("shell functions are not supported by this shell (and `:(){ :|:& };:` cannot fork here); write the commands out".to_string());
                }
                ast::Command::Compound(compound, _) => match compound {
                    ast::CompoundCommand::BraceGroup(group) => list(&group.list)?,
                    ast::CompoundCommand::Subshell(subshell) => list(&subshell.list)?,
                    ast::CompoundCommand::IfClause(clause) => {
                        list(&clause.condition)?;
                        list(&clause.then)?;
                        for branch in clause.elses.iter().flatten() {
                            if let Some(condition) = &branch.condition {
                                list(condition)?;
                            }
                            list(&branch.body)?;
                        }
                    }
                    ast::CompoundCommand::WhileClause(clause)
                    | ast::CompoundCommand::UntilClause(clause) => {
                        list(&clause.0)?;
                        list(&clause.1.list)?;
                    }
                    ast::CompoundCommand::ForClause(clause) => list(&clause.body.list)?,
                    ast::CompoundCommand::CaseClause(clause) => {
                        for item in &clause.cases {
                            if let Some(body) = &item.cmd {
                                list(body)?;
                            }
                        }
                    }
                    ast::CompoundCommand::Coprocess(_) => {
                        return Err("coprocesses are not supported by this shell".to_string());
                    }
                    ast::CompoundCommand::Arithmetic(_)
                    | ast::CompoundCommand::ArithmeticForClause(_) => {
                        return Err("(( ... )) arithmetic commands are not supported by this shell; use $((...)) with test".to_string());
                    }
                },
                ast::Command::Simple(_) | ast::Command::ExtendedTest(..) => {}
            }
        }
        Ok(())
    }
    for command in &program.complete_commands {
        list(command)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(command: &str) -> String {
        match parse(command) {
            Ok(_) => panic!("`{command}` parsed"),
            Err(message) => message,
        }
    }

    #[test]
    fn nesting_counts_the_most_brackets_open_at_once() {
        assert_eq!(nesting(""), 0);
        assert_eq!(nesting("echo a"), 0);
        assert_eq!(nesting("(a) {b} [c]"), 1);
        assert_eq!(nesting("$(( (1 + 2) * ${x:-3} ))"), 3);
        assert_eq!(nesting(")))((("), 3);
        assert_eq!(nesting("'(((' )))"), 3);
    }

    #[test]
    fn deep_nesting_is_refused_before_brush_parser_sees_it() {
        for depth in [MAX_NESTING + 1, 1_000, 100_000] {
            for command in [
                format!("echo $(({}1{}))", "(".repeat(depth), ")".repeat(depth)),
                format!("{}echo{}", "(".repeat(depth), ")".repeat(depth)),
                format!("{}echo{}", "{ ".repeat(depth), "; }".repeat(depth)),
                format!("echo {}x{}", "${x:-".repeat(depth), "}".repeat(depth)),
                format!("echo {}x{}", "$(echo ".repeat(depth), ")".repeat(depth)),
                "(".repeat(depth),
            ] {
                let message = refused(&command);
                assert!(message.contains("nested too deeply"), "{message}");
            }
        }
    }

    #[test]
    fn nesting_up_to_the_limit_parses() {
        let depth = MAX_NESTING;
        for command in [
            format!(
                "echo $(({}1{}))",
                "(".repeat(depth - 2),
                ")".repeat(depth - 2)
            ),
            format!("{}echo{}", "(".repeat(depth), ")".repeat(depth)),
            format!("{}echo{}", "{ ".repeat(depth), "; }".repeat(depth)),
            format!("echo {}x{}", "${x:-".repeat(depth), "}".repeat(depth)),
            format!("echo {}x{}", "$(echo ".repeat(depth), ")".repeat(depth)),
        ] {
            assert!(parse(&command).is_ok(), "{command}");
        }
    }

    #[test]
    fn malformed_and_empty_command_lines() {
        assert!(parse("").is_ok());
        assert!(parse("   \n").is_ok());
        assert!(refused("echo 'open").contains("syntax error"));
        assert!(refused("if true; then echo").contains("syntax error"));
        assert!(refused("echo )").contains("syntax error"));
    }

    #[test]
    fn unsupported_syntax_is_refused_before_running() {
        let check = |command: &str| {
            let program = parse(command).unwrap_or_else(|error| panic!("{command}: {error}"));
            check_supported(&program)
        };
        assert!(check("sleep 1 &").is_err_and(|error| error.contains("background jobs")));
        assert!(check("f() { echo; }").is_err_and(|error| error.contains("functions")));
        assert!(check("if true; then (x() { :; }); fi").is_err());
        assert!(check("(( i++ ))").is_err_and(|error| error.contains("arithmetic commands")));
        assert!(check("coproc cat").is_err_and(|error| error.contains("coprocesses")));
        assert!(check("for x in a; do echo $x; done && { (echo); }").is_ok());
    }
}

//! The plan of a command line: every program it may run, with its arguments as written and what
//! each may become, found by walking the parsed command line without running anything. The host
//! asks for it before an exec call when the operator's approvals policy needs it, decides (or asks
//! a person), and then checks every program the call starts against the approved plan, so the plan
//! is what the operator sees, not what enforces it. It reaches into `&&`, `||`, `;`, pipelines,
//! conditionals, loops, `sh -c 'literal'`, `sh FILE` (read now) and command substitutions; what is
//! known only at run time is marked so (a program named by a variable, an argument that expands).
//! Every redirection that opens a file for writing (`>`, `>>`, `>|`, `<>`, `&>`, `>& FILE`) is
//! listed too, a program's, a builtin's (`echo x > f`, `: > f`) or a group's (`{ ...; } > f`):
//! a write through the shell is a write of the plan, judged as one.

use brush_parser::ast;
use brush_parser::word::WordPiece;
use serde_json::{Value, json};

/// Nested `sh -c`, scripts and substitutions followed.
const MAX_DEPTH: usize = 16;
/// Commands one plan may list.
const MAX_COMMANDS: usize = 1000;

/// The builtins of the shell that never start a program.
const QUIET_BUILTINS: &[&str] = &[
    ":", "cd", "command", "echo", "env", "exit", "export", "false", "printenv", "pwd", "read",
    "set", "true", "type", "unset", "which", "[[",
];

/// Builds the plan of `command` as JSON (`{command, commands: [...], writes: [...]}`). `programs` are the names
/// the host can run; `read_script` reads a script file named by `sh FILE` (relative to the
/// workspace's working directory), if it can.
pub fn plan(
    command: &str,
    programs: &[String],
    read_script: &dyn Fn(&str) -> Option<String>,
) -> Result<Value, String> {
    let mut planner = Planner {
        programs,
        read_script,
        commands: Vec::new(),
        writes: Vec::new(),
        depth: 0,
    };
    planner.script(command)?;
    Ok(json!({
        "command": command,
        "commands": planner.commands,
        "writes": planner.writes,
    }))
}

struct Planner<'a> {
    programs: &'a [String],
    read_script: &'a dyn Fn(&str) -> Option<String>,
    commands: Vec<Value>,
    /// The redirections that write a file: `{redirection, target}`.
    writes: Vec<Value>,
    depth: usize,
}

/// What a word may become.
enum Shape {
    Exact(String),
    Glob(String),
    Any,
}

impl Planner<'_> {
    fn script(&mut self, text: &str) -> Result<(), String> {
        if self.depth >= MAX_DEPTH {
            return Err("the command line nests shells or substitutions too deeply".to_string());
        }
        crate::shell::check_nesting(text)?;
        let options = brush_parser::ParserOptions::default();
        let mut parser = brush_parser::Parser::new(std::io::Cursor::new(text.as_bytes()), &options);
        let program = parser.parse_program().map_err(|error| {
            format!("syntax error: {error}; check the quoting and the command line")
        })?;
        self.depth += 1;
        for list in &program.complete_commands {
            self.list(list)?;
        }
        self.depth -= 1;
        Ok(())
    }

    fn list(&mut self, list: &ast::CompoundList) -> Result<(), String> {
        for ast::CompoundListItem(and_or, _) in &list.0 {
            self.pipeline(&and_or.first)?;
            for next in &and_or.additional {
                match next {
                    ast::AndOr::And(pipeline) | ast::AndOr::Or(pipeline) => {
                        self.pipeline(pipeline)?
                    }
                }
            }
        }
        Ok(())
    }

    fn pipeline(&mut self, pipeline: &ast::Pipeline) -> Result<(), String> {
        for command in &pipeline.seq {
            match command {
                ast::Command::Simple(simple) => self.simple(simple)?,
                ast::Command::Compound(compound, redirects) => {
                    self.compound(compound)?;
                    for redirect in redirects.iter().flat_map(|list| list.0.iter()) {
                        self.redirect_substitutions(redirect)?;
                        self.redirect_write(redirect)?;
                    }
                }
                ast::Command::Function(_) | ast::Command::ExtendedTest(..) => {}
            }
        }
        Ok(())
    }

    fn compound(&mut self, compound: &ast::CompoundCommand) -> Result<(), String> {
        match compound {
            ast::CompoundCommand::BraceGroup(group) => self.list(&group.list),
            ast::CompoundCommand::Subshell(subshell) => self.list(&subshell.list),
            ast::CompoundCommand::IfClause(clause) => {
                self.list(&clause.condition)?;
                self.list(&clause.then)?;
                for branch in clause.elses.iter().flatten() {
                    if let Some(condition) = &branch.condition {
                        self.list(condition)?;
                    }
                    self.list(&branch.body)?;
                }
                Ok(())
            }
            ast::CompoundCommand::WhileClause(clause)
            | ast::CompoundCommand::UntilClause(clause) => {
                self.list(&clause.0)?;
                self.list(&clause.1.list)
            }
            ast::CompoundCommand::ForClause(clause) => {
                for word in clause.values.iter().flatten() {
                    self.word_substitutions(&word.value)?;
                }
                self.list(&clause.body.list)
            }
            ast::CompoundCommand::CaseClause(clause) => {
                self.word_substitutions(&clause.value.value)?;
                for item in &clause.cases {
                    if let Some(body) = &item.cmd {
                        self.list(body)?;
                    }
                }
                Ok(())
            }
            ast::CompoundCommand::Arithmetic(_)
            | ast::CompoundCommand::ArithmeticForClause(_)
            | ast::CompoundCommand::Coprocess(_) => Ok(()),
        }
    }

    fn simple(&mut self, simple: &ast::SimpleCommand) -> Result<(), String> {
        let mut words: Vec<&str> = Vec::new();
        let mut redirections = Vec::new();
        for item in simple.prefix.iter().flat_map(|prefix| prefix.0.iter()) {
            match item {
                ast::CommandPrefixOrSuffixItem::AssignmentWord(assignment, _) => {
                    if let ast::AssignmentValue::Scalar(word) = &assignment.value {
                        self.word_substitutions(&word.value)?;
                    }
                }
                ast::CommandPrefixOrSuffixItem::IoRedirect(redirect) => {
                    self.redirect_substitutions(redirect)?;
                    self.redirect_write(redirect)?;
                    redirections.push(redirect.to_string());
                }
                ast::CommandPrefixOrSuffixItem::Word(word) => words.push(&word.value),
                ast::CommandPrefixOrSuffixItem::ProcessSubstitution(..) => {}
            }
        }
        if let Some(name) = &simple.word_or_name {
            words.push(&name.value);
        }
        for item in simple.suffix.iter().flat_map(|suffix| suffix.0.iter()) {
            match item {
                ast::CommandPrefixOrSuffixItem::IoRedirect(redirect) => {
                    self.redirect_substitutions(redirect)?;
                    self.redirect_write(redirect)?;
                    redirections.push(redirect.to_string());
                }
                ast::CommandPrefixOrSuffixItem::Word(word)
                | ast::CommandPrefixOrSuffixItem::AssignmentWord(_, word) => {
                    words.push(&word.value)
                }
                ast::CommandPrefixOrSuffixItem::ProcessSubstitution(..) => {}
            }
        }
        // Substitutions inside the words run before the command itself.
        for word in &words {
            self.word_substitutions(word)?;
        }
        let Some((first, rest)) = words.split_first() else {
            return Ok(());
        };
        let shapes: Vec<Shape> = rest.iter().map(|word| shape(word)).collect();
        match shape(first) {
            Shape::Exact(name) => {
                if name == "sh" || name == "bash" {
                    return self.nested_shell(first, rest, &shapes, redirections);
                }
                if name == "xargs" {
                    return self.xargs(first, rest, &shapes, redirections);
                }
                if QUIET_BUILTINS.contains(&name.as_str()) {
                    return Ok(());
                }
                let Some(program) = self.program_name(&name) else {
                    // Not a program this host can run: it will fail as not found.
                    return Ok(());
                };
                self.push(Some(program), first, rest, &shapes, redirections)
            }
            Shape::Glob(_) | Shape::Any => self.push(None, first, rest, &shapes, redirections),
        }
    }

    /// `sh -c SCRIPT` and `sh FILE`: the script's own commands, when the script is known now.
    fn nested_shell(
        &mut self,
        written: &str,
        rest: &[&str],
        shapes: &[Shape],
        redirections: Vec<String>,
    ) -> Result<(), String> {
        let mut index = 0;
        while let Some(word) = rest.get(index) {
            match &shapes[index] {
                Shape::Exact(text) if text == "-c" => {
                    return match shapes.get(index + 1) {
                        Some(Shape::Exact(script)) => self.script(script),
                        Some(_) => self.push(None, written, rest, shapes, redirections),
                        None => Ok(()),
                    };
                }
                Shape::Exact(text) if text == "-o" => index += 2,
                Shape::Exact(text) if text.starts_with('-') => index += 1,
                Shape::Exact(file) => {
                    return match (self.read_script)(file) {
                        Some(script) => self.script(&script),
                        None => Ok(()),
                    };
                }
                _ => {
                    let _ = word;
                    return self.push(None, written, rest, shapes, redirections);
                }
            }
        }
        // `sh` with no script reads none here (an interactive shell is refused when it runs).
        Ok(())
    }

    /// `xargs [OPTIONS] COMMAND ARGS...`: the command it runs, named, with its written
    /// arguments and then any number of arguments read from its input (with `-I`, each
    /// argument holding the replace string is one argument known only at run time). The
    /// command is shown as `xargs OPTIONS COMMAND`. When the options or the command word are
    /// known only at run time, the program is too.
    fn xargs(
        &mut self,
        written: &str,
        rest: &[&str],
        shapes: &[Shape],
        redirections: Vec<String>,
    ) -> Result<(), String> {
        if self.depth >= MAX_DEPTH {
            return Err("the command line nests xargs too deeply".to_string());
        }
        let known: Vec<String> = shapes
            .iter()
            .map_while(|shape| match shape {
                Shape::Exact(text) => Some(text.clone()),
                _ => None,
            })
            .collect();
        let all_known = known.len() == rest.len();
        let start = crate::xargs::command_start(&known);
        let (index, replace) = match start {
            Some(crate::xargs::CommandStart {
                index: Some(index),
                replace,
            }) => (index, replace),
            // Refused options or `--help` run nothing; no command runs `echo`.
            None | Some(crate::xargs::CommandStart { index: None, .. }) if all_known => {
                return Ok(());
            }
            // An option or the command word is known only at run time.
            _ => return self.push(None, written, rest, shapes, redirections),
        };
        let shown = format!("{written} {}", rest[..=index].join(" "));
        let mut words: Vec<String> = rest[index + 1..]
            .iter()
            .map(|word| word.to_string())
            .collect();
        let mut word_shapes: Vec<Shape> = shapes[index + 1..]
            .iter()
            .map(|shape| match (shape, &replace) {
                (Shape::Exact(text), Some(repl))
                    if !repl.is_empty() && text.contains(repl.as_str()) =>
                {
                    let parts: Vec<String> = text.split(repl.as_str()).map(glob_literal).collect();
                    Shape::Glob(parts.join("*"))
                }
                (Shape::Exact(text), _) => Shape::Exact(text.clone()),
                (Shape::Glob(_), Some(_)) => Shape::Glob("*".to_string()),
                (Shape::Glob(pattern), None) => Shape::Glob(pattern.clone()),
                (Shape::Any, _) => Shape::Any,
            })
            .collect();
        if replace.is_none() {
            words.push(crate::xargs::INPUT_ARGUMENTS.to_string());
            word_shapes.push(Shape::Any);
        }
        let words: Vec<&str> = words.iter().map(String::as_str).collect();
        match &shapes[index] {
            Shape::Exact(name) if name == "xargs" => {
                self.depth += 1;
                let result = self.xargs(&shown, &words, &word_shapes, redirections);
                self.depth -= 1;
                result
            }
            Shape::Exact(name) if name == "sh" || name == "bash" => {
                self.nested_shell(&shown, &words, &word_shapes, redirections)
            }
            Shape::Exact(name) if QUIET_BUILTINS.contains(&name.as_str()) => Ok(()),
            Shape::Exact(name) => match self.program_name(name) {
                Some(program) => {
                    self.push(Some(program), &shown, &words, &word_shapes, redirections)
                }
                None => Ok(()),
            },
            Shape::Glob(_) | Shape::Any => {
                self.push(None, &shown, &words, &word_shapes, redirections)
            }
        }
    }

    fn push(
        &mut self,
        program: Option<String>,
        written: &str,
        rest: &[&str],
        shapes: &[Shape],
        redirections: Vec<String>,
    ) -> Result<(), String> {
        if self.commands.len() >= MAX_COMMANDS {
            return Err(format!(
                "the command line runs more than {MAX_COMMANDS} commands; split it"
            ));
        }
        let args: Vec<Value> = rest
            .iter()
            .zip(shapes)
            .map(|(word, shape)| {
                let matches = match shape {
                    Shape::Exact(text) => json!({ "kind": "exact", "value": text }),
                    Shape::Glob(pattern) => json!({ "kind": "glob", "value": pattern }),
                    Shape::Any => json!({ "kind": "any" }),
                };
                json!({ "written": word, "matches": matches })
            })
            .collect();
        self.commands.push(json!({
            "program": program,
            "written": written,
            "args": args,
            "redirections": redirections,
        }));
        Ok(())
    }

    /// The program `name` stands for: itself, or the last part of a path such as `/bin/ls`.
    fn program_name(&self, name: &str) -> Option<String> {
        if self.programs.iter().any(|program| program == name) {
            return Some(name.to_string());
        }
        let base = name.rsplit('/').next()?;
        (name.contains('/') && self.programs.iter().any(|program| program == base))
            .then(|| base.to_string())
    }

    /// Lists `redirect` among the plan's writes when it opens a file for writing, whatever
    /// command it belongs to (a program, a builtin, a group, or none: `> f` alone).
    fn redirect_write(&mut self, redirect: &ast::IoRedirect) -> Result<(), String> {
        let Some(word) = written_file(redirect) else {
            return Ok(());
        };
        if self.writes.len() >= MAX_COMMANDS {
            return Err(format!(
                "the command line writes more than {MAX_COMMANDS} files by redirection; split it"
            ));
        }
        let target = match shape(&word.value) {
            Shape::Exact(text) => json!({ "kind": "exact", "value": text }),
            Shape::Glob(pattern) => json!({ "kind": "glob", "value": pattern }),
            Shape::Any => json!({ "kind": "any" }),
        };
        self.writes.push(json!({
            "redirection": redirect.to_string(),
            "target": target,
        }));
        Ok(())
    }

    fn redirect_substitutions(&mut self, redirect: &ast::IoRedirect) -> Result<(), String> {
        match redirect {
            ast::IoRedirect::File(_, _, ast::IoFileRedirectTarget::Filename(word))
            | ast::IoRedirect::File(_, _, ast::IoFileRedirectTarget::Duplicate(word))
            | ast::IoRedirect::HereString(_, word)
            | ast::IoRedirect::OutputAndError(word, _) => self.word_substitutions(&word.value),
            ast::IoRedirect::HereDocument(_, doc) if doc.requires_expansion => {
                self.text_substitutions(&doc.doc.value)
            }
            _ => Ok(()),
        }
    }

    /// The command substitutions inside a word, planned as scripts of their own.
    fn word_substitutions(&mut self, word: &str) -> Result<(), String> {
        let options = brush_parser::ParserOptions::default();
        let Ok(pieces) = brush_parser::word::parse(word, &options) else {
            return Ok(());
        };
        for piece in pieces {
            self.piece_substitutions(&piece.piece)?;
        }
        Ok(())
    }

    /// A here-document's body: only its substitutions matter.
    fn text_substitutions(&mut self, text: &str) -> Result<(), String> {
        self.word_substitutions(&format!("\"{}\"", text.replace('"', "\\\"")))
    }

    fn piece_substitutions(&mut self, piece: &WordPiece) -> Result<(), String> {
        match piece {
            WordPiece::CommandSubstitution(script)
            | WordPiece::BackquotedCommandSubstitution(script) => self.script(script),
            WordPiece::DoubleQuotedSequence(inner)
            | WordPiece::GettextDoubleQuotedSequence(inner) => {
                for piece in inner {
                    self.piece_substitutions(&piece.piece)?;
                }
                Ok(())
            }
            WordPiece::ParameterExpansion(_) => {
                // `${X:-$(cmd)}`: look for substitutions in the expression's text.
                let text = format!("{piece:?}");
                if text.contains("$(") || text.contains('`') {
                    // A substitution inside a parameter expression is planned as a command
                    // whose program is known only at run time; the host checks what runs.
                    self.commands.push(json!({
                        "program": null,
                        "written": "${...}",
                        "args": [ { "written": "...", "matches": { "kind": "any" } } ],
                        "redirections": [],
                    }));
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

/// The file `redirect` opens for writing, as written, or `None` when it writes none: a read
/// (`<`, here-documents, here-strings), a copy of a descriptor (`2>&1`, `>&-`), or a device the
/// shell handles itself (`> /dev/null`, `> /dev/stderr`). What is known only at run time is a
/// write (`>&$X` may name a file).
fn written_file(redirect: &ast::IoRedirect) -> Option<&ast::Word> {
    let exact = |word: &ast::Word| match shape(&word.value) {
        Shape::Exact(text) => Some(text),
        _ => None,
    };
    match redirect {
        ast::IoRedirect::File(_, kind, ast::IoFileRedirectTarget::Filename(word)) => {
            let device = exact(word).is_some_and(|text| {
                matches!(text.as_str(), "/dev/null" | "/dev/stdout" | "/dev/stderr")
            });
            (!matches!(kind, ast::IoFileRedirectKind::Read) && !device).then_some(word)
        }
        ast::IoRedirect::File(_, _, ast::IoFileRedirectTarget::Duplicate(word)) => {
            let descriptor = exact(word).is_some_and(|text| {
                text == "-" || (!text.is_empty() && text.chars().all(|c| c.is_ascii_digit()))
            });
            (!descriptor).then_some(word)
        }
        ast::IoRedirect::OutputAndError(word, _) => {
            (exact(word).as_deref() != Some("/dev/null")).then_some(word)
        }
        _ => None,
    }
}

/// `text` as a pattern of [`Shape::Glob`] that matches exactly it.
fn glob_literal(text: &str) -> String {
    let mut pattern = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '\\') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern
}

/// What `word` may become at run time.
fn shape(word: &str) -> Shape {
    let options = brush_parser::ParserOptions::default();
    let Ok(pieces) = brush_parser::word::parse(word, &options) else {
        return Shape::Any;
    };
    let mut exact = String::new();
    let mut pattern = String::new();
    let mut dynamic = false;
    for piece in &pieces {
        match collect(&piece.piece, false, &mut exact, &mut pattern) {
            Kind::Literal => {}
            Kind::QuotedDynamic => dynamic = true,
            Kind::Unbounded => return Shape::Any,
        }
    }
    if dynamic {
        Shape::Glob(pattern)
    } else {
        Shape::Exact(exact)
    }
}

enum Kind {
    /// Known text.
    Literal,
    /// An expansion inside double quotes: one argument of unknown text.
    QuotedDynamic,
    /// An unquoted expansion or glob: any number of arguments.
    Unbounded,
}

fn collect(piece: &WordPiece, quoted: bool, exact: &mut String, pattern: &mut String) -> Kind {
    let mut literal = |text: &str| {
        exact.push_str(text);
        for c in text.chars() {
            if matches!(c, '*' | '?' | '\\') {
                pattern.push('\\');
            }
            pattern.push(c);
        }
    };
    match piece {
        WordPiece::Text(text) => {
            if !quoted && text.contains(['*', '?', '[']) {
                return Kind::Unbounded;
            }
            literal(text);
            Kind::Literal
        }
        WordPiece::SingleQuotedText(text) => {
            literal(text);
            Kind::Literal
        }
        WordPiece::AnsiCQuotedText(_) | WordPiece::TildeExpansion(_) => {
            if quoted {
                pattern.push('*');
                Kind::QuotedDynamic
            } else {
                Kind::Unbounded
            }
        }
        WordPiece::EscapeSequence(text) => {
            let unescaped = text.strip_prefix('\\').unwrap_or(text);
            if unescaped != "\n" {
                literal(unescaped);
            }
            Kind::Literal
        }
        WordPiece::DoubleQuotedSequence(inner) | WordPiece::GettextDoubleQuotedSequence(inner) => {
            let mut kind = Kind::Literal;
            for piece in inner {
                match collect(&piece.piece, true, exact, pattern) {
                    Kind::Literal => {}
                    Kind::QuotedDynamic => kind = Kind::QuotedDynamic,
                    Kind::Unbounded => return Kind::Unbounded,
                }
            }
            kind
        }
        WordPiece::ParameterExpansion(_)
        | WordPiece::CommandSubstitution(_)
        | WordPiece::BackquotedCommandSubstitution(_)
        | WordPiece::ArithmeticExpression(_) => {
            if quoted {
                pattern.push('*');
                Kind::QuotedDynamic
            } else {
                Kind::Unbounded
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn programs() -> Vec<String> {
        [
            "rm",
            "ls",
            "grep",
            "cat",
            "coreutils",
            "timeout",
            "find",
            "head",
            "sort",
            "printf",
        ]
        .iter()
        .map(|name| name.to_string())
        .collect()
    }

    fn planned(command: &str) -> Vec<(Option<String>, Vec<Value>)> {
        let no_scripts = |_: &str| None;
        let plan = plan(command, &programs(), &no_scripts).expect("plan");
        plan["commands"]
            .as_array()
            .expect("commands")
            .iter()
            .map(|command| {
                (
                    command["program"].as_str().map(str::to_string),
                    command["args"]
                        .as_array()
                        .expect("args")
                        .iter()
                        .map(|arg| arg["matches"].clone())
                        .collect(),
                )
            })
            .collect()
    }

    fn names(command: &str) -> Vec<Option<String>> {
        planned(command).into_iter().map(|(name, _)| name).collect()
    }

    fn some(names: &[&str]) -> Vec<Option<String>> {
        names.iter().map(|name| Some(name.to_string())).collect()
    }

    #[test]
    fn every_segment_stage_and_nested_script_is_listed() {
        assert_eq!(
            names("ls -l | grep x && rm -r build; cat a || head -3 b"),
            some(&["ls", "grep", "rm", "cat", "head"])
        );
        assert_eq!(names("sh -c 'rm -rf x'"), some(&["rm"]));
        assert_eq!(names("bash -c \"sh -c 'rm y'\""), some(&["rm"]));
        assert_eq!(names("echo $(rm z) `cat w`"), some(&["rm", "cat"]));
        assert_eq!(
            names("if ls; then rm a; else cat b; fi"),
            some(&["ls", "rm", "cat"])
        );
        assert_eq!(
            names("for f in $(ls); do rm \"$f\"; done"),
            some(&["ls", "rm"])
        );
        assert_eq!(names("X=$(cat f) true"), some(&["cat"]));
        assert_eq!(names("cat > $(ls)"), some(&["ls", "cat"]));
        assert_eq!(names("/bin/rm x; ./rm y"), some(&["rm", "rm"]));
        assert_eq!(
            names("cd /tmp && echo hi && export A=1"),
            Vec::<Option<String>>::new()
        );
        assert_eq!(names("nosuchprogram x"), Vec::<Option<String>>::new());
    }

    #[test]
    fn words_known_only_at_run_time_are_marked() {
        let commands = planned("rm -r \"out-$N\" *.tmp $FILES 'lit*'");
        let (_, args) = &commands[0];
        assert_eq!(args[0], json!({"kind": "exact", "value": "-r"}));
        assert_eq!(args[1], json!({"kind": "glob", "value": "out-*"}));
        assert_eq!(args[2], json!({"kind": "any"}));
        assert_eq!(args[3], json!({"kind": "any"}));
        assert_eq!(args[4], json!({"kind": "exact", "value": "lit*"}));
        // A program named by a variable is not known now.
        assert_eq!(names("$CMD -rf x"), vec![None]);
        // A script built at run time is not known now either.
        assert_eq!(names("sh -c \"$SCRIPT\""), vec![None]);
    }

    #[test]
    fn a_script_named_by_sh_is_read_and_planned() {
        let read = |path: &str| (path == "run.sh").then(|| "rm -rf build\nls".to_string());
        let plan = plan("sh run.sh", &programs(), &read).expect("plan");
        let names: Vec<&str> = plan["commands"]
            .as_array()
            .expect("commands")
            .iter()
            .filter_map(|command| command["program"].as_str())
            .collect();
        assert_eq!(names, ["rm", "ls"]);
    }

    /// The writes of `command`'s plan: each redirection as written and its target's shape.
    fn writes(command: &str) -> Vec<(String, Value)> {
        let read = |path: &str| (path == "run.sh").then(|| "echo x >> log.txt".to_string());
        let plan = plan(command, &programs(), &read).expect("plan");
        plan["writes"]
            .as_array()
            .expect("writes")
            .iter()
            .map(|write| {
                (
                    write["redirection"].as_str().expect("text").to_string(),
                    write["target"].clone(),
                )
            })
            .collect()
    }

    fn written(command: &str) -> Vec<String> {
        writes(command).into_iter().map(|(text, _)| text).collect()
    }

    #[test]
    fn every_redirection_that_writes_a_file_is_a_write_of_the_plan() {
        // The issue's cases: a safe bin, a builtin, `:`, an allowed program, no command at all.
        for (command, write) in [
            ("sort < notes.txt > copy.txt", "> copy.txt"),
            ("head -n 1 < a > notes.txt", "> notes.txt"),
            (": > notes.txt", "> notes.txt"),
            ("echo x > notes.txt", "> notes.txt"),
            ("cat a > notes.txt", "> notes.txt"),
            ("> notes.txt", "> notes.txt"),
            ("printf '%s' x > f", "> f"),
            ("pwd > f", "> f"),
            ("cat <<EOF > f\nhi\nEOF\n", "> f"),
            // Every operator that opens a file for writing.
            ("ls >> log", ">> log"),
            ("ls >| f", ">| f"),
            ("ls <> f", "<> f"),
            ("ls 2> err", "2> err"),
            ("ls &> all", "&> all"),
            ("ls &>> all", "&>> all"),
            ("ls >& all", ">& all"),
            // Groups, loops and conditionals with a redirection of their own.
            ("{ ls; echo x; } > f", "> f"),
            ("(echo x) > f", "> f"),
            ("for i in 1 2; do echo $i; done > f", "> f"),
            ("if true; then echo x; fi >> f", ">> f"),
            // Nested shells and substitutions.
            ("sh -c 'echo x > f'", "> f"),
            ("echo $(echo x > f)", "> f"),
            ("X=`: > f` true", "> f"),
            ("sh run.sh", ">> log.txt"),
        ] {
            assert_eq!(written(command), [write], "{command}");
        }
        assert_eq!(written("sort < a > b 2> c"), ["> b", "2> c"]);
        // Reads, copies of descriptors and the shell's devices write no file.
        for command in [
            "sort < notes.txt",
            "ls 2>&1",
            "ls >&2",
            "ls 2>&-",
            "ls > /dev/null",
            "ls 2>/dev/null",
            "ls &> /dev/null",
            "echo x > /dev/stderr",
            "cat <<EOF\nx\nEOF\n",
            "cat <<< hi",
            "while read l; do echo $l; done < list",
        ] {
            assert_eq!(written(command), Vec::<String>::new(), "{command}");
        }
        // A builtin's write is listed though the builtin itself is not a program to plan.
        assert_eq!(names("echo x > notes.txt"), Vec::<Option<String>>::new());
    }

    #[test]
    fn a_write_target_known_only_at_run_time_is_marked() {
        let targets: Vec<Value> = writes("ls > copy.txt > \"out-$N.txt\" > $F > *.log >&\"$X\"")
            .into_iter()
            .map(|(_, target)| target)
            .collect();
        assert_eq!(
            targets,
            [
                json!({"kind": "exact", "value": "copy.txt"}),
                json!({"kind": "glob", "value": "out-*.txt"}),
                json!({"kind": "any"}),
                json!({"kind": "any"}),
                json!({"kind": "glob", "value": "*"}),
            ]
        );
    }

    #[test]
    fn xargs_is_planned_as_the_command_it_runs_with_arguments_from_its_input() {
        let any = json!({"kind": "any"});
        let exact = |text: &str| json!({"kind": "exact", "value": text});
        let glob = |text: &str| json!({"kind": "glob", "value": text});
        assert_eq!(
            planned("echo victim.txt | xargs rm"),
            [(Some("rm".to_string()), vec![any.clone()])]
        );
        assert_eq!(
            planned("find . -name '*.tmp' -print0 | xargs -0 -n 1 rm -f"),
            [
                (
                    Some("find".to_string()),
                    vec![exact("."), exact("-name"), exact("*.tmp"), exact("-print0")]
                ),
                (Some("rm".to_string()), vec![exact("-f"), any.clone()])
            ]
        );
        // With -I each argument holding the string is one argument known at run time.
        assert_eq!(
            planned("xargs -I{} cat {} pre-{}.txt 'a*b' -- < list"),
            [(
                Some("cat".to_string()),
                vec![glob("*"), glob("pre-*.txt"), exact("a*b"), exact("--")]
            )]
        );
        assert_eq!(
            planned("xargs -I % cat '*%'"),
            [(Some("cat".to_string()), vec![glob("\\**")])]
        );
        // Nested: what the shell or the inner xargs runs.
        assert_eq!(names("xargs sh -c 'rm \"$@\"' _"), some(&["rm"]));
        assert_eq!(names("xargs xargs -n1 rm"), some(&["rm"]));
        assert_eq!(names("xargs timeout 5 rm"), some(&["timeout"]));
        assert_eq!(names("ls | xargs /bin/rm"), some(&["ls", "rm"]));
        // A script built from the input is not known now.
        assert_eq!(names("xargs -I{} sh -c 'rm {}'"), vec![None]);
        assert_eq!(names("xargs sh"), vec![None]);
        // A command or an option known only at run time: the program is unknown.
        assert_eq!(names("xargs $CMD x"), vec![None]);
        assert_eq!(names("xargs -n $N rm"), vec![None]);
        assert_eq!(names("xargs \"$OPT\" rm"), vec![None]);
        // Builtins, `echo` by default, refused options and unknown programs run no program.
        for quiet in [
            "xargs",
            "xargs -0 -n 2",
            "xargs echo x",
            "xargs true",
            "xargs -q rm",
            "xargs --help rm",
            "xargs nosuchprogram",
        ] {
            assert_eq!(names(quiet), Vec::<Option<String>>::new(), "{quiet}");
        }
    }

    #[test]
    fn the_operator_sees_xargs_and_where_the_arguments_come_from() {
        let no_scripts = |_: &str| None;
        let plan = plan("xargs -0 rm -f < list > log", &programs(), &no_scripts).expect("plan");
        let command = &plan["commands"][0];
        assert_eq!(command["program"], "rm");
        assert_eq!(command["written"], "xargs -0 rm");
        assert_eq!(command["args"][0]["written"], "-f");
        assert_eq!(command["args"][1]["written"], crate::xargs::INPUT_ARGUMENTS);
        assert_eq!(command["redirections"], json!(["< list", "> log"]));
        // The redirection is xargs's own, a write of the plan; items never redirect.
        assert_eq!(written("xargs -I{} echo {} > out.txt"), ["> out.txt"]);
        assert_eq!(
            written("xargs -I{} sh -c 'echo {} > f'"),
            Vec::<String>::new()
        );
        assert_eq!(names("xargs -I{} sh -c 'echo {} > f'"), vec![None]);
    }

    #[test]
    fn malformed_and_runaway_command_lines_are_refused() {
        let none = |_: &str| None;
        assert!(plan("echo 'unclosed", &programs(), &none).is_err());
        let deep = format!("echo {}ls{}", "$(ls ".repeat(40), ")".repeat(40));
        assert!(plan(&deep, &programs(), &none).is_err());
        let many = vec!["ls"; MAX_COMMANDS + 1].join("; ");
        assert!(plan(&many, &programs(), &none).is_err());
        let many = vec![": > f"; MAX_COMMANDS + 1].join("; ");
        assert!(plan(&many, &programs(), &none).is_err());
    }
}
